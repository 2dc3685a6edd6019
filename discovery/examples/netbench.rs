//! Network benchmark of the swarm layer, on 127.0.0.1 only.
//!
//! ```text
//! cargo run --release -p starling-discovery --example netbench [-- --json] [--quick]
//! ```
//!
//! Measures, in one run:
//! - RPC round trip (small echo) vs a plain UDP echo round trip, p50/p99;
//! - connection setup (QUIC + TLS raw keys + admission) on a fresh endpoint;
//! - failure detection of a node killed without leaving (LAN preset);
//! - reconciliation of 10,000 records spread over 5 nodes: time to converge
//!   and bytes on the wire vs the size of the records each node lacked, plus
//!   the bytes of a reconciliation between two equal nodes.
//!
//! Bytes are read from the `lo` counters in `/proc/net/dev`, which belong to
//! the network namespace of this process. `benches/net/run.sh` runs the bench
//! in a namespace of its own so that nothing else shares that `lo`; the JSON
//! says whether the counters were isolated.

#![allow(clippy::unwrap_used)]

use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

use starling_discovery::admission::Admission;
use starling_discovery::codec::encode_frame;
use starling_discovery::metrics::Metrics;
use starling_discovery::transport::{Transport, TransportLimits};
use starling_discovery::wire::MemberWire;
use starling_discovery::{
    BootstrapPeer, Identity, NodeId, PeerState, Request, Swarm, SwarmConfig, SwarmSecret,
};
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

type Res<T> = Result<T, Box<dyn Error + Send + Sync>>;

struct Opts {
    json: bool,
    rpc_calls: usize,
    dials: usize,
    kill_runs: usize,
    records_per_node: usize,
    nodes: usize,
    body_len: usize,
}

fn opts() -> Opts {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    Opts {
        json: args.iter().any(|a| a == "--json"),
        rpc_calls: if quick { 300 } else { 2000 },
        dials: if quick { 10 } else { 50 },
        kill_runs: if quick { 1 } else { 3 },
        records_per_node: if quick { 200 } else { 2000 },
        nodes: 5,
        body_len: 200,
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn config(dir: &std::path::Path, secret: &SwarmSecret, name: &str) -> SwarmConfig {
    let mut c = SwarmConfig::new(dir, secret.clone());
    c.name = name.into();
    c.listen = "127.0.0.1:0".parse().unwrap();
    c.mdns = false;
    c.rpc_timeout = Duration::from_secs(5);
    c.rejoin_interval = Duration::from_millis(500);
    c
}

fn boot(s: &Swarm) -> BootstrapPeer {
    BootstrapPeer {
        addr: s.local_addr(),
        node_id: Some(s.node_id()),
    }
}

fn alive(s: &Swarm) -> usize {
    s.peers()
        .iter()
        .filter(|p| p.state == PeerState::Alive)
        .count()
}

/// Polls `check` every 5 ms until it holds; errors after `within`.
async fn wait_for(within: Duration, what: &str, mut check: impl FnMut() -> bool) -> Res<Duration> {
    let start = Instant::now();
    loop {
        if check() {
            return Ok(start.elapsed());
        }
        if start.elapsed() > within {
            return Err(format!("timed out after {within:?}: {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Bytes sent on `lo` (this process's network namespace).
fn lo_tx_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/net/dev").ok()?;
    let line = text.lines().find(|l| l.trim_start().starts_with("lo:"))?;
    let fields: Vec<&str> = line.split(':').nth(1)?.split_whitespace().collect();
    // rx: bytes packets errs drop fifo frame compressed multicast; tx: bytes ...
    fields.get(8)?.parse().ok()
}

/// True when `lo` is the only interface of this network namespace, i.e. the
/// bench runs in a namespace of its own and nothing else shares its `lo`.
fn own_netns() -> bool {
    std::fs::read_to_string("/proc/net/dev")
        .map(|t| {
            let ifaces: Vec<&str> = t
                .lines()
                .skip(2)
                .filter_map(|l| l.split(':').next())
                .map(str::trim)
                .collect();
            ifaces == ["lo"]
        })
        .unwrap_or(false)
}

struct Latency {
    p50: Duration,
    p99: Duration,
    n: usize,
}

fn latency(mut v: Vec<Duration>) -> Latency {
    v.sort();
    Latency {
        p50: percentile(&v, 0.50),
        p99: percentile(&v, 0.99),
        n: v.len(),
    }
}

async fn udp_echo(calls: usize) -> Res<Latency> {
    let server = UdpSocket::bind("127.0.0.1:0").await?;
    let server_addr = server.local_addr()?;
    let echo = tokio::spawn(async move {
        let mut buf = [0u8; 2048];
        while let Ok((n, from)) = server.recv_from(&mut buf).await {
            if buf[..n] == *b"stop" {
                break;
            }
            let _ = server.send_to(&buf[..n], from).await;
        }
    });
    let client = UdpSocket::bind("127.0.0.1:0").await?;
    client.connect(server_addr).await?;
    let msg = [7u8; 32];
    let mut buf = [0u8; 2048];
    let mut samples = Vec::with_capacity(calls);
    for i in 0..calls + calls / 10 {
        let t = Instant::now();
        client.send(&msg).await?;
        let n = tokio::time::timeout(Duration::from_secs(1), client.recv(&mut buf)).await??;
        let d = t.elapsed();
        if n != msg.len() {
            return Err("udp echo: short reply".into());
        }
        if i >= calls / 10 {
            samples.push(d);
        }
    }
    client.send(b"stop").await?;
    let _ = tokio::time::timeout(Duration::from_secs(1), echo).await;
    Ok(latency(samples))
}

async fn rpc_echo(a: &Swarm, b: &Swarm, calls: usize) -> Res<Latency> {
    b.register_handler("echo", |req: Request| async move { Ok(req.body.to_vec()) });
    let msg = vec![7u8; 32];
    let mut samples = Vec::with_capacity(calls);
    for i in 0..calls + calls / 10 {
        let t = Instant::now();
        let out = a.call(b.node_id(), "echo", "echo", msg.clone()).await?;
        let d = t.elapsed();
        if out != msg {
            return Err("rpc echo: wrong reply".into());
        }
        if i >= calls / 10 {
            samples.push(d);
        }
    }
    Ok(latency(samples))
}

/// Fresh endpoint and identity per dial; only the dial (QUIC + TLS +
/// admission exchange) is timed.
async fn connection_setup(target: &Swarm, secret: &SwarmSecret, dials: usize) -> Res<Latency> {
    let mut samples = Vec::with_capacity(dials);
    for i in 0..dials + 3 {
        let id = Identity::generate();
        let member = MemberWire {
            id: id.node_id(),
            addr: "127.0.0.1:9".parse()?,
            generation: 1,
            name: format!("dialer{i}"),
        };
        let cancel = CancellationToken::new();
        let (transport, _admitted) = Transport::bind(
            id,
            "127.0.0.1:0".parse()?,
            Admission {
                secret: secret.clone(),
                allowlist: None,
            },
            TransportLimits::default(),
            Arc::new(Metrics::default()),
            member,
            cancel.clone(),
        )?;
        let t = Instant::now();
        let pc = transport
            .connect_to(target.node_id(), target.local_addr())
            .await?;
        let d = t.elapsed();
        if pc.peer != target.node_id() {
            return Err("dialled the wrong node".into());
        }
        if i >= 3 {
            samples.push(d);
        }
        transport.close().await;
        cancel.cancel();
    }
    Ok(latency(samples))
}

struct Detection {
    suspect: Vec<Duration>,
    down: Vec<Duration>,
}

/// Starts a node on its own runtime, waits until the others see it, then
/// drops that runtime (no leave message) and times until both others report
/// it Suspect and Down.
async fn failure_detection(secret: &SwarmSecret, runs: usize) -> Res<Detection> {
    let dirs: Vec<tempfile::TempDir> = (0..2)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    let a = Swarm::start(config(dirs[0].path(), secret, "a")).await?;
    let mut cb = config(dirs[1].path(), secret, "b");
    cb.bootstrap = vec![boot(&a)];
    let b = Swarm::start(cb).await?;
    wait_for(Duration::from_secs(20), "a and b alive", || {
        alive(&a) == 1 && alive(&b) == 1
    })
    .await?;
    let mut out = Detection {
        suspect: Vec::new(),
        down: Vec::new(),
    };
    for run in 0..runs {
        let dir = tempfile::tempdir()?;
        let mut cv = config(dir.path(), secret, &format!("victim{run}"));
        cv.bootstrap = vec![boot(&a)];
        let (id_tx, id_rx) = std::sync::mpsc::channel::<Res<NodeId>>();
        let (die_tx, die_rx) = std::sync::mpsc::channel::<()>();
        let victim = std::thread::spawn(move || {
            let rt = match tokio::runtime::Runtime::new() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = id_tx.send(Err(e.into()));
                    return;
                }
            };
            match rt.block_on(Swarm::start(cv)) {
                Ok(s) => {
                    let _ = id_tx.send(Ok(s.node_id()));
                    let _ = die_rx.recv();
                    drop(rt); // every task and socket vanishes: a crash, no leave
                    drop(s);
                }
                Err(e) => {
                    let _ = id_tx.send(Err(e.into()));
                }
            }
        });
        let vid = tokio::task::spawn_blocking(move || id_rx.recv())
            .await?
            .map_err(|e| e.to_string())??;
        let state = |s: &Swarm| s.peers().iter().find(|p| p.id == vid).map(|p| p.state);
        wait_for(Duration::from_secs(20), "victim alive everywhere", || {
            state(&a) == Some(PeerState::Alive) && state(&b) == Some(PeerState::Alive)
        })
        .await?;
        // Let it settle into the probe rotation.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let _ = die_tx.send(());
        tokio::task::spawn_blocking(move || victim.join())
            .await?
            .map_err(|_| "victim thread panicked")?;
        let killed = Instant::now();
        let mut suspect_at = None;
        loop {
            let (sa, sb) = (state(&a), state(&b));
            if suspect_at.is_none()
                && (sa != Some(PeerState::Alive) || sb != Some(PeerState::Alive))
            {
                suspect_at = Some(killed.elapsed());
            }
            if sa == Some(PeerState::Down) && sb == Some(PeerState::Down) {
                break;
            }
            if killed.elapsed() > Duration::from_secs(40) {
                return Err("victim not declared down within 40 s".into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        out.down.push(killed.elapsed());
        out.suspect.push(suspect_at.unwrap_or_default());
    }
    a.shutdown().await;
    b.shutdown().await;
    Ok(out)
}

struct Reconcile {
    records: usize,
    converge: Duration,
    wire_bytes: Option<u64>,
    needed_bytes: u64,
    record_bytes_total: u64,
    duplicates: u64,
    equal_bytes: Option<u64>,
    equal_rounds: usize,
}

async fn reconciliation(secret: &SwarmSecret, o: &Opts) -> Res<Reconcile> {
    let dirs: Vec<tempfile::TempDir> = (0..o.nodes)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    let mut nodes = Vec::new();
    for (i, d) in dirs.iter().enumerate() {
        let mut c = config(d.path(), secret, &format!("r{i}"));
        // Only reconciliation on connect (and explicit calls) moves records.
        c.sync_interval = Duration::from_secs(3600);
        nodes.push(Swarm::start(c).await?);
    }
    // Each node writes its share while alone.
    let mut record_bytes_total = 0u64;
    for (i, n) in nodes.iter().enumerate() {
        for j in 0..o.records_per_node {
            let mut body = format!("node {i} record {j} ").into_bytes();
            body.resize(o.body_len, b'.');
            let r = n.publish("bench", body).await?;
            record_bytes_total += (encode_frame(&r.to_wire(), 1 << 20)?.len() - 4) as u64;
        }
    }
    let total = o.records_per_node * o.nodes;
    // Every node lacks everything but its own share.
    let needed_bytes = record_bytes_total * (o.nodes as u64 - 1);
    let before = lo_tx_bytes();
    let start = Instant::now();
    for n in &nodes[1..] {
        n.join(&boot(&nodes[0])).await?;
    }
    let all = nodes.clone();
    wait_for(
        Duration::from_secs(60),
        "all nodes hold every record",
        || {
            all.iter()
                .all(|n| n.records("bench").map(|r| r.len()).unwrap_or(0) == total)
        },
    )
    .await?;
    let converge = start.elapsed();
    // Let in-flight duplicates land before reading the counters.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let wire_bytes = match (before, lo_tx_bytes()) {
        (Some(b), Some(a)) => Some(a - b),
        _ => None,
    };
    let duplicates = nodes.iter().map(|n| n.metrics().records_duplicate).sum();

    // Two equal nodes: median over 5 explicit reconciliations.
    let mut equal = Vec::new();
    let mut equal_rounds = 0;
    for _ in 0..5 {
        let b0 = lo_tx_bytes();
        let stats = nodes[0].reconcile_with(nodes[1].node_id()).await?;
        let b1 = lo_tx_bytes();
        if stats.received != 0 || stats.sent != 0 {
            return Err(format!("equal nodes exchanged records: {stats:?}").into());
        }
        equal_rounds = stats.rounds;
        if let (Some(x), Some(y)) = (b0, b1) {
            equal.push(y - x);
        }
    }
    equal.sort();
    let equal_bytes = equal.get(equal.len() / 2).copied();
    for n in &nodes {
        n.shutdown().await;
    }
    Ok(Reconcile {
        records: total,
        converge,
        wire_bytes,
        needed_bytes,
        record_bytes_total,
        duplicates,
        equal_bytes,
        equal_rounds,
    })
}

fn median(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "ok"
    } else {
        "MISSED"
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let o = opts();
    let secret = SwarmSecret::generate();
    let isolated = own_netns();

    let udp = udp_echo(o.rpc_calls).await?;
    let dirs: Vec<tempfile::TempDir> = (0..2)
        .map(|_| tempfile::tempdir())
        .collect::<Result<_, _>>()?;
    let a = Swarm::start(config(dirs[0].path(), &secret, "a")).await?;
    let mut cb = config(dirs[1].path(), &secret, "b");
    cb.bootstrap = vec![boot(&a)];
    let b = Swarm::start(cb).await?;
    wait_for(Duration::from_secs(20), "a and b alive", || {
        alive(&a) == 1 && alive(&b) == 1
    })
    .await?;
    let rpc = rpc_echo(&a, &b, o.rpc_calls).await?;
    let setup = connection_setup(&b, &secret, o.dials).await?;
    a.shutdown().await;
    b.shutdown().await;

    let det = failure_detection(&secret, o.kill_runs).await?;
    let rec = reconciliation(&secret, &o).await?;

    let ratio_p50 = rpc.p50.as_secs_f64() / udp.p50.as_secs_f64();
    let down = median(&det.down);
    let suspect = median(&det.suspect);
    let bytes_ratio = rec.wire_bytes.map(|w| w as f64 / rec.needed_bytes as f64);

    if o.json {
        let v = serde_json::json!({
            "lo_counters_isolated": isolated,
            "targets": {
                "rpc_vs_udp_p50_ratio_max": 3.0,
                "connection_setup_p50_ms_max": 2.0,
                "failure_detection_down_s_max": 5.0,
                "reconciliation_converge_s_max": 5.0,
                "reconciliation_wire_vs_needed_max": 1.3,
                "equal_nodes_bytes_max": 2048,
            },
            "udp_echo_us": {"p50": us(udp.p50), "p99": us(udp.p99), "n": udp.n},
            "rpc_echo_us": {"p50": us(rpc.p50), "p99": us(rpc.p99), "n": rpc.n},
            "rpc_vs_udp_p50_ratio": ratio_p50,
            "connection_setup_ms": {"p50": ms(setup.p50), "p99": ms(setup.p99), "n": setup.n},
            "failure_detection_s": {
                "down_runs": det.down.iter().map(|d| d.as_secs_f64()).collect::<Vec<_>>(),
                "down_median": down.as_secs_f64(),
                "suspect_median": suspect.as_secs_f64(),
            },
            "reconciliation": {
                "records": rec.records,
                "nodes": o.nodes,
                "body_bytes": o.body_len,
                "converge_s": rec.converge.as_secs_f64(),
                "record_bytes_total": rec.record_bytes_total,
                "needed_bytes": rec.needed_bytes,
                "wire_bytes": rec.wire_bytes,
                "wire_vs_needed": bytes_ratio,
                "duplicate_records_received": rec.duplicates,
                "equal_nodes_bytes": rec.equal_bytes,
                "equal_nodes_rounds": rec.equal_rounds,
            },
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }

    println!("starling-discovery netbench (127.0.0.1; lo counters isolated: {isolated})");
    println!(
        "{:<44} {:>14} {:>14} {:>10}",
        "metric", "value", "target", ""
    );
    let row = |name: &str, value: String, target: &str, ok: Option<bool>| {
        println!(
            "{:<44} {:>14} {:>14} {:>10}",
            name,
            value,
            target,
            ok.map(verdict).unwrap_or("")
        );
    };
    row(
        &format!("UDP echo p50 / p99 (n={})", udp.n),
        format!("{:.0}/{:.0} us", us(udp.p50), us(udp.p99)),
        "",
        None,
    );
    row(
        &format!("RPC echo p50 / p99 (n={})", rpc.n),
        format!("{:.0}/{:.0} us", us(rpc.p50), us(rpc.p99)),
        "",
        None,
    );
    row(
        "RPC / UDP p50",
        format!("{ratio_p50:.2}x"),
        "<= 3x",
        Some(ratio_p50 <= 3.0),
    );
    row(
        &format!("connection setup p50 (n={})", setup.n),
        format!("{:.2} ms", ms(setup.p50)),
        "<= 2 ms",
        Some(setup.p50 <= Duration::from_millis(2)),
    );
    row(
        "connection setup p99",
        format!("{:.2} ms", ms(setup.p99)),
        "",
        None,
    );
    row(
        &format!("crash -> suspect, median of {}", det.suspect.len()),
        format!("{:.2} s", suspect.as_secs_f64()),
        "",
        None,
    );
    row(
        &format!("crash -> down everywhere, median of {}", det.down.len()),
        format!("{:.2} s", down.as_secs_f64()),
        "<= 5 s",
        Some(down <= Duration::from_secs(5)),
    );
    row(
        &format!("reconcile {} records / {} nodes", rec.records, o.nodes),
        format!("{:.2} s", rec.converge.as_secs_f64()),
        "<= 5 s",
        Some(rec.converge <= Duration::from_secs(5)),
    );
    row(
        "  records' size (each node lacked 4/5)",
        format!("{} B", rec.needed_bytes),
        "",
        None,
    );
    match (rec.wire_bytes, bytes_ratio) {
        (Some(w), Some(r)) => {
            row("  bytes on lo", format!("{w} B"), "", None);
            row(
                "  bytes on lo / records' size",
                format!("{r:.2}x"),
                "<= 1.3x",
                Some(r <= 1.3),
            );
        }
        _ => row("  bytes on lo", "n/a".into(), "", None),
    }
    row(
        "  duplicate records received",
        rec.duplicates.to_string(),
        "",
        None,
    );
    match rec.equal_bytes {
        Some(b) => row(
            &format!("equal nodes reconcile ({} rounds)", rec.equal_rounds),
            format!("{b} B"),
            "<= 2048 B",
            Some(b <= 2048),
        ),
        None => row("equal nodes reconcile", "n/a".into(), "", None),
    }
    Ok(())
}
