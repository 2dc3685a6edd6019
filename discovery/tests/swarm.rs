//! Multi-node tests in one process: real QUIC sockets on 127.0.0.1 with
//! ephemeral ports, real TLS and signatures. Waits poll with deadlines.

#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use starling_discovery::admission::Admission;
use starling_discovery::codec::write_frame;
use starling_discovery::discover::{FilePeerCache, PeerCache};
use starling_discovery::metrics::Metrics;
use starling_discovery::transport::{Transport, TransportLimits};
use starling_discovery::wire::{MemberWire, RecordWire, StreamHeader, StreamKind, WIRE_VERSION};
use starling_discovery::{
    BootstrapPeer, CallError, Identity, JoinCode, MemRecordStore, NodeId, PeerState, Record,
    RecordStore, RpcError, RpcErrorCode, Swarm, SwarmConfig, SwarmEvent, SwarmSecret,
};
use tokio_util::sync::CancellationToken;

fn config(dir: &Path, secret: &SwarmSecret, name: &str) -> SwarmConfig {
    let mut c = SwarmConfig::new(dir, secret.clone());
    c.name = name.into();
    c.listen = "127.0.0.1:0".parse().unwrap();
    c.mdns = false;
    c.sync_interval = Duration::from_secs(2);
    c.rejoin_interval = Duration::from_millis(500);
    c.rpc_timeout = Duration::from_secs(5);
    c
}

fn boot(s: &Swarm) -> BootstrapPeer {
    BootstrapPeer {
        addr: s.local_addr(),
        node_id: Some(s.node_id()),
    }
}

/// Polls `check` until it holds or `within` passes.
async fn eventually<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return;
        }
        assert!(
            start.elapsed() < within,
            "timed out after {within:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn alive(s: &Swarm) -> Vec<NodeId> {
    s.peers()
        .into_iter()
        .filter(|p| p.state == PeerState::Alive)
        .map(|p| p.id)
        .collect()
}

async fn cluster(n: usize, secret: &SwarmSecret, dirs: &[tempfile::TempDir]) -> Vec<Swarm> {
    let first = Swarm::start(config(dirs[0].path(), secret, "n0"))
        .await
        .unwrap();
    let mut nodes = vec![first.clone()];
    for (i, dir) in dirs.iter().enumerate().take(n).skip(1) {
        let mut c = config(dir.path(), secret, &format!("n{i}"));
        // Alternate: address-only bootstrap and id@address bootstrap.
        c.bootstrap = vec![BootstrapPeer {
            addr: first.local_addr(),
            node_id: (i % 2 == 0).then(|| first.node_id()),
        }];
        nodes.push(Swarm::start(c).await.unwrap());
    }
    let all = nodes.clone();
    eventually(Duration::from_secs(20), "membership converges", || {
        let all = all.clone();
        async move { all.iter().all(|s| alive(s).len() == all.len() - 1) }
    })
    .await;
    nodes
}

fn dirs(n: usize) -> Vec<tempfile::TempDir> {
    (0..n).map(|_| tempfile::tempdir().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_membership_names_and_join_code() {
    let secret = SwarmSecret::generate();
    let d = dirs(4);
    let nodes = cluster(4, &secret, &d).await;
    // Names travel with membership.
    let names: Vec<String> = nodes[0].peers().into_iter().map(|p| p.name).collect();
    assert_eq!(names, vec!["n1", "n2", "n3"]);
    // A join code carries what a new node needs.
    let code: JoinCode = nodes[0].join_code().to_string().parse().unwrap();
    assert_eq!(code.node_id, nodes[0].node_id());
    let d5 = tempfile::tempdir().unwrap();
    let mut c = config(d5.path(), &code.secret, "joiner");
    c.bootstrap = code.bootstrap_peers();
    let joiner = Swarm::start(c).await.unwrap();
    eventually(Duration::from_secs(20), "joiner sees everyone", || {
        let j = joiner.clone();
        async move { alive(&j).len() == 4 }
    })
    .await;
    for n in nodes.iter().chain([&joiner]) {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_leave_and_crash_are_detected() {
    let secret = SwarmSecret::generate();
    let d = dirs(4);
    let nodes = cluster(3, &secret, &d).await;
    let mut events = nodes[0].events();

    // A node started on its own runtime, then killed with it: no goodbye.
    let (tx, rx) = std::sync::mpsc::channel();
    let (die_tx, die_rx) = std::sync::mpsc::channel::<()>();
    let cfg = {
        let mut c = config(d[3].path(), &secret, "crashy");
        c.bootstrap = vec![boot(&nodes[0])];
        c
    };
    let crash_thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let s = rt.block_on(Swarm::start(cfg)).unwrap();
        tx.send(s.node_id()).unwrap();
        // The runtime's workers keep the node running until told to die.
        die_rx.recv().unwrap();
        drop(rt); // every task and socket of this node vanishes, no goodbye
        drop(s);
    });
    let crashy = rx.recv().unwrap();
    eventually(Duration::from_secs(20), "crashy joins", || {
        let n = nodes.clone();
        async move { n.iter().all(|s| alive(s).contains(&crashy)) }
    })
    .await;
    die_tx.send(()).unwrap();
    crash_thread.join().unwrap();
    let started = Instant::now();
    eventually(Duration::from_secs(30), "crash detected as down", || {
        let n = nodes.clone();
        async move {
            n.iter().all(|s| {
                s.peers()
                    .iter()
                    .any(|p| p.id == crashy && p.state == PeerState::Down)
            })
        }
    })
    .await;
    eprintln!("crash detected after {:?}", started.elapsed());
    let mut saw_down = false;
    while let Ok(ev) = events.try_recv() {
        saw_down |= ev == SwarmEvent::PeerDown(crashy);
    }
    assert!(saw_down, "PeerDown event for the crashed node");

    // Graceful leave is seen quickly.
    let leaver = nodes[2].node_id();
    nodes[2].shutdown().await;
    eventually(Duration::from_secs(10), "leave detected", || {
        let a = nodes[0].clone();
        async move {
            a.peers()
                .iter()
                .any(|p| p.id == leaver && p.state == PeerState::Down)
        }
    })
    .await;
    nodes[0].shutdown().await;
    nodes[1].shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_node_rejoins_from_peer_cache_alone() {
    let secret = SwarmSecret::generate();
    let d = dirs(2);
    let nodes = cluster(2, &secret, &d).await;
    let b_id = nodes[1].node_id();
    nodes[1].shutdown().await;
    // Same data dir, no bootstrap, no mDNS: only the peer cache remains.
    let cached = FilePeerCache::in_dir(d[1].path()).load().unwrap();
    assert!(cached.iter().any(|p| p.id == nodes[0].node_id()));
    let b2 = Swarm::start(config(d[1].path(), &secret, "n1"))
        .await
        .unwrap();
    assert_eq!(b2.node_id(), b_id, "identity persists in the data dir");
    eventually(Duration::from_secs(20), "rejoined from cache", || {
        let (a, b) = (nodes[0].clone(), b2.clone());
        async move { alive(&b).contains(&a.node_id()) && alive(&a).contains(&b_id) }
    })
    .await;
    nodes[0].shutdown().await;
    b2.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpc_fan_out_errors_and_timeouts() {
    let secret = SwarmSecret::generate();
    let d = dirs(3);
    let nodes = cluster(3, &secret, &d).await;
    for n in &nodes[1..] {
        let me = n.name().to_owned();
        n.register_handler("echo", move |req: starling_discovery::Request| {
            let me = me.clone();
            async move {
                match req.method.as_str() {
                    "say" => {
                        Ok(format!("{me}:{}", String::from_utf8_lossy(&req.body)).into_bytes())
                    }
                    "slow" => {
                        tokio::time::sleep(Duration::from_secs(3)).await;
                        Ok(vec![])
                    }
                    "whoami" => Ok(req.from.to_string().into_bytes()),
                    other => Err(RpcError::new(RpcErrorCode::UnknownMethod, other)),
                }
            }
        });
    }
    let a = &nodes[0];
    let b = nodes[1].node_id();
    let out = a.call(b, "echo", "say", b"hi".to_vec()).await.unwrap();
    assert_eq!(out, b"n1:hi");
    // The handler learns the authenticated caller.
    let who = a.call(b, "echo", "whoami", vec![]).await.unwrap();
    assert_eq!(String::from_utf8(who).unwrap(), a.node_id().to_string());
    match a.call(b, "nope", "x", vec![]).await {
        Err(CallError::Remote(e)) => assert_eq!(e.code, RpcErrorCode::UnknownService),
        other => panic!("expected UnknownService, got {other:?}"),
    }
    match a.call(b, "echo", "zzz", vec![]).await {
        Err(CallError::Remote(e)) => assert_eq!(e.code, RpcErrorCode::UnknownMethod),
        other => panic!("expected UnknownMethod, got {other:?}"),
    }
    let t = Instant::now();
    let slow = a
        .call_with_timeout(b, "echo", "slow", vec![], Duration::from_millis(300))
        .await;
    assert!(matches!(slow, Err(CallError::Timeout)), "{slow:?}");
    assert!(t.elapsed() < Duration::from_secs(2));

    // Many concurrent calls on one connection (more than the in-flight bound).
    let calls = (0..200).map(|i| {
        let a = a.clone();
        async move { a.call(b, "echo", "say", format!("{i}").into_bytes()).await }
    });
    let results = futures::future::join_all(calls).await;
    assert!(results.iter().all(|r| r.is_ok()));

    let stranger = Identity::generate().node_id();
    let targets = [nodes[1].node_id(), nodes[2].node_id(), stranger];
    let res = a.fan_out(&targets, "echo", "say", b"all".to_vec()).await;
    assert_eq!(res.len(), 3);
    assert_eq!(res[0].1.as_ref().unwrap(), b"n1:all");
    assert_eq!(res[1].1.as_ref().unwrap(), b"n2:all");
    assert!(matches!(res[2].1, Err(CallError::Connect(_))));
    for n in &nodes {
        n.shutdown().await;
    }
}

/// Sends on its channel when dropped: tells the test that a handler's future was dropped.
struct DropSignal(tokio::sync::mpsc::UnboundedSender<()>);

impl Drop for DropSignal {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

/// Starts a long `work/hold` call from `a` to `b` in the background and returns it once its
/// handler runs.
async fn hold(
    a: &Swarm,
    b: NodeId,
    started: &mut tokio::sync::mpsc::UnboundedReceiver<()>,
) -> tokio::task::JoinHandle<Result<Vec<u8>, CallError>> {
    let a = a.clone();
    let call = tokio::spawn(async move {
        a.call_with_timeout(b, "work", "hold", vec![], Duration::from_secs(60))
            .await
    });
    tokio::time::timeout(Duration::from_secs(5), started.recv())
        .await
        .expect("handler started");
    call
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_its_caller_gives_up_on_stops_the_handler() {
    let secret = SwarmSecret::generate();
    let d = dirs(2);
    let nodes = cluster(2, &secret, &d).await;
    // Each call to `hold` says when it starts and when its future is dropped; it never
    // finishes by itself.
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel::<()>();
    let (dropped_tx, mut dropped) = tokio::sync::mpsc::unbounded_channel::<()>();
    nodes[1].register_handler("work", move |_req: starling_discovery::Request| {
        let started_tx = started_tx.clone();
        let dropped_tx = dropped_tx.clone();
        async move {
            let _guard = DropSignal(dropped_tx);
            let _ = started_tx.send(());
            std::future::pending::<()>().await;
            Ok(vec![])
        }
    });
    let a = nodes[0].clone();
    let b = nodes[1].node_id();
    let within = Duration::from_secs(5);

    // The caller's future is aborted (as when a task is cancelled).
    let call = hold(&a, b, &mut started).await;
    call.abort();
    tokio::time::timeout(within, dropped.recv())
        .await
        .expect("the handler is dropped when its caller aborts the call");

    // The caller's own timeout ends the work too.
    let r = a
        .call_with_timeout(b, "work", "hold", vec![], Duration::from_millis(300))
        .await;
    assert!(matches!(r, Err(CallError::Timeout)), "{r:?}");
    tokio::time::timeout(within, started.recv())
        .await
        .expect("handler started");
    tokio::time::timeout(within, dropped.recv())
        .await
        .expect("the handler is dropped when its caller times out");

    // The caller's node goes away.
    let call = hold(&a, b, &mut started).await;
    nodes[0].shutdown().await;
    tokio::time::timeout(Duration::from_secs(30), dropped.recv())
        .await
        .expect("the handler is dropped when its caller's node leaves");
    call.abort();
    nodes[1].shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_replicate_and_converge_after_partition() {
    let secret = SwarmSecret::generate();
    let d = dirs(3);
    let stores: Vec<Arc<MemRecordStore>> =
        (0..3).map(|_| Arc::new(MemRecordStore::new())).collect();
    let start = |i: usize, boot: Vec<BootstrapPeer>| {
        let mut c = config(d[i].path(), &secret, &format!("n{i}"));
        c.bootstrap = boot;
        let store: Arc<dyn RecordStore> = stores[i].clone();
        let cache = Arc::new(FilePeerCache::in_dir(d[i].path()));
        Swarm::start_with(c, store, cache)
    };
    let a = start(0, vec![]).await.unwrap();
    let b = start(1, vec![boot(&a)]).await.unwrap();
    let c = start(2, vec![boot(&a)]).await.unwrap();
    eventually(Duration::from_secs(20), "3 members", || {
        let v = [a.clone(), b.clone(), c.clone()];
        async move { v.iter().all(|s| alive(s).len() == 2) }
    })
    .await;

    let rec = a.publish("card", b"agent a".to_vec()).await.unwrap();
    eventually(Duration::from_secs(10), "pushed card arrives", || {
        let (b, c) = (b.clone(), c.clone());
        let id = rec.id();
        async move { b.record(&id).unwrap().is_some() && c.record(&id).unwrap().is_some() }
    })
    .await;
    assert_eq!(c.records("card").unwrap()[0].body(), b"agent a");

    // Partition C away (stopped), and let both sides write.
    c.shutdown().await;
    for i in 0..20 {
        a.publish("memory", format!("a{i}").into_bytes())
            .await
            .unwrap();
        b.publish("memory", format!("b{i}").into_bytes())
            .await
            .unwrap();
    }
    let c_identity = Identity::load_or_create(d[2].path()).unwrap();
    for i in 0..7 {
        let r = Record::sign(&c_identity, "memory", format!("c{i}").into_bytes()).unwrap();
        stores[2].insert(r).unwrap();
    }
    // Pushes run in the background: let A and B settle before measuring.
    eventually(Duration::from_secs(10), "A and B in sync", || {
        let s = stores.clone();
        async move { s[0].len().unwrap() == 41 && s[1].len().unwrap() == 41 }
    })
    .await;
    let a_before = a.metrics().records_accepted;
    // Heal: C restarts with the same data dir and store.
    let c2 = start(2, vec![]).await.unwrap();
    eventually(Duration::from_secs(30), "all stores converge", || {
        let s = stores.clone();
        async move {
            let i0 = s[0].index().unwrap();
            i0.len() == 1 + 40 + 7 && s[1].index().unwrap() == i0 && s[2].index().unwrap() == i0
        }
    })
    .await;
    // Only what was missing moved: C accepted exactly A's and B's 40 new
    // records, A exactly C's 7.
    assert_eq!(c2.metrics().records_accepted, 40);
    assert_eq!(a.metrics().records_accepted - a_before, 7);
    assert_eq!(c2.metrics().records_bad_signature, 0);
    for n in [&a, &b, &c2] {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_are_refused() {
    let secret = SwarmSecret::generate();
    let d = dirs(4);
    let a = Swarm::start(config(d[0].path(), &secret, "a"))
        .await
        .unwrap();

    // Wrong swarm secret.
    let wrong = Swarm::start(config(d[1].path(), &SwarmSecret::generate(), "wrong"))
        .await
        .unwrap();
    // Both sides learn why: the joiner is told its secret was refused.
    let e = wrong.join(&boot(&a)).await.unwrap_err().to_string();
    assert!(e.contains("refused this node's swarm secret"), "{e}");
    assert!(wrong
        .join(&BootstrapPeer {
            addr: a.local_addr(),
            node_id: None
        })
        .await
        .is_err());
    assert!(a.metrics().admission_refused >= 2);

    // Right secret, but the node at that address is not the one expected.
    let b = Swarm::start(config(d[2].path(), &secret, "b"))
        .await
        .unwrap();
    let imposter = BootstrapPeer {
        addr: a.local_addr(),
        node_id: Some(Identity::generate().node_id()),
    };
    assert!(b.join(&imposter).await.is_err());
    assert_eq!(a.metrics().admission_accepted, 0);

    // Allowlist: right secret, but not listed.
    let mut cfg = config(d[3].path(), &secret, "picky");
    cfg.allowlist = Some([a.node_id()].into_iter().collect());
    let picky = Swarm::start(cfg).await.unwrap();
    assert!(b.join(&boot(&picky)).await.is_err());
    assert_eq!(a.join(&boot(&picky)).await.unwrap(), picky.node_id());

    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(alive(&wrong).is_empty());
    assert!(!alive(&a).contains(&wrong.node_id()));
    assert!(!alive(&picky).contains(&b.node_id()));
    for n in [&a, &wrong, &b, &picky] {
        n.shutdown().await;
    }
}

/// A member that knows the secret but sends forged records and garbage frames.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_records_and_bad_frames_are_dropped() {
    let secret = SwarmSecret::generate();
    let d = dirs(1);
    let victim = Swarm::start(config(d[0].path(), &secret, "victim"))
        .await
        .unwrap();
    victim.register_handler("ping", |_req: starling_discovery::Request| async {
        Ok(b"pong".to_vec())
    });

    let evil = Identity::generate();
    let metrics = Arc::new(Metrics::default());
    let member = MemberWire {
        id: evil.node_id(),
        addr: "127.0.0.1:9".parse().unwrap(),
        generation: 1,
        name: "evil".into(),
    };
    let (transport, _rx) = Transport::bind(
        evil.clone(),
        "127.0.0.1:0".parse().unwrap(),
        Admission {
            secret: secret.clone(),
            allowlist: None,
        },
        TransportLimits::default(),
        metrics,
        member,
        CancellationToken::new(),
    )
    .unwrap();
    let pc = transport
        .connect_to(victim.node_id(), victim.local_addr())
        .await
        .unwrap();

    // A record claiming the victim as author, signed by the evil key.
    let mut forged = Record::sign(&evil, "card", b"i am the victim".to_vec())
        .unwrap()
        .to_wire();
    forged.author = victim.node_id();
    // And a genuine record of evil's with its body swapped.
    let mut tampered = Record::sign(&evil, "card", b"original".to_vec())
        .unwrap()
        .to_wire();
    tampered.body = b"swapped".to_vec();
    let genuine = Record::sign(&evil, "card", b"genuine".to_vec()).unwrap();
    let mut s = pc.conn.open_uni().await.unwrap();
    let header = StreamHeader {
        version: WIRE_VERSION,
        kind: StreamKind::Push,
    };
    write_frame(&mut s, &header, 1 << 20).await.unwrap();
    for w in [&forged, &tampered, &genuine.to_wire()] {
        write_frame::<RecordWire, _>(&mut s, w, 1 << 20)
            .await
            .unwrap();
    }
    s.finish().unwrap();
    eventually(Duration::from_secs(5), "records processed", || {
        let v = victim.clone();
        async move { v.metrics().records_bad_signature == 2 && v.metrics().records_accepted == 1 }
    })
    .await;
    assert_eq!(victim.records("card").unwrap(), vec![genuine]);

    // Garbage on a stream closes that stream only; the connection still works.
    let (mut send, mut recv) = pc.conn.open_bi().await.unwrap();
    send.write_all(&[0, 0, 0, 3, 0xff, 0xff, 0xff])
        .await
        .unwrap();
    let _ = send.finish();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        tokio::io::AsyncReadExt::read_to_end(&mut recv, &mut buf).await
    })
    .await
    .unwrap();
    assert!(read.is_err(), "stream is reset by the victim");
    // An oversized length prefix, too.
    let (mut send, _recv) = pc.conn.open_bi().await.unwrap();
    send.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
    eventually(Duration::from_secs(5), "bad frames counted", || {
        let v = victim.clone();
        async move { v.metrics().bad_frames >= 2 }
    })
    .await;
    let req = starling_discovery::wire::RpcRequest {
        service: "ping".into(),
        method: "x".into(),
        body: vec![],
    };
    let (mut send, mut recv) = pc.conn.open_bi().await.unwrap();
    write_frame(
        &mut send,
        &StreamHeader {
            version: WIRE_VERSION,
            kind: StreamKind::Rpc,
        },
        1 << 20,
    )
    .await
    .unwrap();
    write_frame(&mut send, &req, 1 << 20).await.unwrap();
    send.finish().unwrap();
    let resp: starling_discovery::wire::RpcResponse =
        starling_discovery::codec::expect_frame(&mut recv, 1 << 20)
            .await
            .unwrap();
    assert_eq!(
        resp,
        starling_discovery::wire::RpcResponse::Ok(b"pong".to_vec())
    );
    victim.shutdown().await;
    transport.close().await;
}
