//! Three nodes on a Linux bridge, in network namespaces this test creates
//! (never on the host's interfaces): one namespace holds bridge `br0`, three
//! node namespaces are joined to it by veth pairs with 10.77.0.1-3/24.
//!
//! 1. Nodes with mDNS only (no bootstrap, empty peer cache) see each other
//!    alive; each prints the time from its start to its first successful RPC
//!    with a peer it found by mDNS.
//! 2. Partition: node 3's bridge port goes down until both sides declare the
//!    other down; both sides publish records; the port comes back up and all
//!    three converge to the same record set.
//!
//! Needs root and `ip netns`; prints a skip line otherwise. The test binary
//! re-executes itself inside a node namespace (`ip netns exec`) and the
//! parent drives each node with lines on its stdin/stdout.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use starling_discovery::{PeerState, Request, Swarm, SwarmConfig, SwarmSecret};

const ROLE: &str = "STARLING_BRIDGE_ROLE";
const KIND: &str = "bridge-test";

fn main() {
    match std::env::var(ROLE).as_deref() {
        Ok("node") => child_node(),
        _ => parent(),
    }
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"))
}

fn alive(s: &Swarm) -> usize {
    s.peers()
        .iter()
        .filter(|p| p.state == PeerState::Alive)
        .count()
}

/// A node in its namespace, answering commands from the parent:
/// `alive N` / `down N` (wait until N peers are alive / down),
/// `publish TAG N`, `records N` (wait for N records, print a digest), `quit`.
fn child_node() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let listen: SocketAddr = env("LISTEN").parse().unwrap();
    let secret: SwarmSecret = env("SECRET").parse().unwrap();
    let name = env("NAME");
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let mut c = SwarmConfig::new(dir.path(), secret);
        c.listen = listen;
        c.mdns = true;
        c.name = name.clone();
        c.rejoin_interval = Duration::from_secs(1);
        c.sync_interval = Duration::from_secs(3);
        let started = Instant::now();
        let s = Swarm::start(c).await.unwrap();
        s.register_handler("ping", |_r: Request| async { Ok(b"pong".to_vec()) });
        // Time to the first successful RPC with a peer found by mDNS.
        let first_rpc = loop {
            let peers: Vec<_> = s
                .peers()
                .into_iter()
                .filter(|p| p.state == PeerState::Alive)
                .collect();
            let mut done = None;
            for p in peers {
                let r = s
                    .call_with_timeout(p.id, "ping", "x", vec![], Duration::from_secs(1))
                    .await;
                if r.as_deref().is_ok_and(|b| b == b"pong") {
                    done = Some(started.elapsed());
                    break;
                }
            }
            if let Some(d) = done {
                break Some(d);
            }
            if started.elapsed() > Duration::from_secs(20) {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        match first_rpc {
            Some(d) => println!("first_rpc_ms {:.1}", d.as_secs_f64() * 1e3),
            None => println!("first_rpc_ms none"),
        }
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            let line = line.unwrap();
            let words: Vec<&str> = line.split_whitespace().collect();
            let reply = match words.as_slice() {
                ["alive", n] | ["down", n] => {
                    let n: usize = n.parse().unwrap();
                    let want_down = words[0] == "down";
                    let t = Instant::now();
                    loop {
                        let down = s
                            .peers()
                            .iter()
                            .filter(|p| p.state == PeerState::Down)
                            .count();
                        let ok = if want_down { down >= n } else { alive(&s) >= n };
                        if ok {
                            break format!("ok {:.2}", t.elapsed().as_secs_f64());
                        }
                        if t.elapsed() > Duration::from_secs(30) {
                            break format!("timeout {:?}", s.peers());
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                ["publish", tag, n] => {
                    let n: usize = n.parse().unwrap();
                    for i in 0..n {
                        s.publish(KIND, format!("{name}-{tag}-{i}").into_bytes())
                            .await
                            .unwrap();
                    }
                    "ok".to_string()
                }
                ["records", n] => {
                    let n: usize = n.parse().unwrap();
                    let t = Instant::now();
                    loop {
                        let recs = s.records(KIND).unwrap();
                        if recs.len() >= n {
                            let mut ids: Vec<[u8; 32]> = recs.iter().map(|r| r.id().0).collect();
                            ids.sort();
                            let mut h = Sha256::new();
                            for id in &ids {
                                h.update(id);
                            }
                            break format!(
                                "ok {} {} {:.2}",
                                recs.len(),
                                hex::encode(&h.finalize()[..8]),
                                t.elapsed().as_secs_f64()
                            );
                        }
                        if t.elapsed() > Duration::from_secs(40) {
                            break format!("timeout {}", recs.len());
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                ["quit"] => break,
                _ => format!("error unknown command {line:?}"),
            };
            println!("{reply}");
        }
        s.shutdown().await;
    });
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Bridge namespace + node namespaces; all deleted on drop (also on panic).
struct Net {
    bridge: String,
    nodes: Vec<String>,
}

impl Net {
    fn create(n: usize) -> Result<Self, String> {
        let pid = std::process::id();
        let net = Self {
            bridge: format!("stb{pid}br"),
            nodes: (1..=n).map(|i| format!("stb{pid}n{i}")).collect(),
        };
        ip(&["netns", "add", &net.bridge])?;
        for ns in &net.nodes {
            ip(&["netns", "add", ns])?;
        }
        let br = net.bridge.as_str();
        ip(&[
            "-n",
            br,
            "link",
            "add",
            "br0",
            "type",
            "bridge",
            "mcast_snooping",
            "0",
        ])?;
        ip(&["-n", br, "link", "set", "br0", "up"])?;
        ip(&["-n", br, "link", "set", "lo", "up"])?;
        for (i, ns) in net.nodes.iter().enumerate() {
            let port = format!("p{}", i + 1);
            ip(&[
                "link", "add", &port, "netns", br, "type", "veth", "peer", "name", "eth0", "netns",
                ns,
            ])?;
            ip(&["-n", br, "link", "set", &port, "master", "br0"])?;
            ip(&["-n", br, "link", "set", &port, "up"])?;
            let addr = format!("10.77.0.{}/24", i + 1);
            ip(&["-n", ns, "addr", "add", &addr, "dev", "eth0"])?;
            ip(&["-n", ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    /// Sets node `i`'s (0-based) bridge port up or down.
    fn port(&self, i: usize, up: bool) {
        ip(&[
            "-n",
            &self.bridge,
            "link",
            "set",
            &format!("p{}", i + 1),
            if up { "up" } else { "down" },
        ])
        .unwrap();
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.nodes.iter().chain([&self.bridge]) {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// A node child process; killed on drop if still running.
struct Node {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Node {
    fn spawn(ns: &str, i: usize, secret: &str) -> Self {
        let exe = std::env::current_exe().unwrap();
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(exe)
            .env(ROLE, "node")
            .env("LISTEN", format!("10.77.0.{}:0", i + 1))
            .env("SECRET", secret)
            .env("NAME", format!("n{}", i + 1))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            stdin,
            stdout,
        }
    }

    fn line(&mut self) -> String {
        let mut s = String::new();
        self.stdout.read_line(&mut s).unwrap();
        s.trim().to_string()
    }

    fn send(&mut self, cmd: &str) {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Sends a command and returns the reply, which must start with "ok".
    fn ask(&mut self, cmd: &str) -> String {
        self.send(cmd);
        let reply = self.line();
        assert!(reply.starts_with("ok"), "{cmd:?} -> {reply:?}");
        reply
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

fn parent() {
    let started = Instant::now();
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    if !root {
        println!("netns_bridge: skipped (needs root for network namespaces)");
        return;
    }
    let net = match Net::create(3) {
        Ok(n) => n,
        Err(e) => {
            println!("netns_bridge: skipped (cannot create network namespaces: {e})");
            return;
        }
    };
    let secret = SwarmSecret::generate().to_string();
    let mut nodes: Vec<Node> = net
        .nodes
        .iter()
        .enumerate()
        .map(|(i, ns)| Node::spawn(ns, i, &secret))
        .collect();

    // 1. mDNS only: everyone sees everyone alive.
    let mut first_rpc = Vec::new();
    for n in &mut nodes {
        let l = n.line();
        let ms: f64 = l
            .strip_prefix("first_rpc_ms ")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no RPC with an mDNS-found peer: {l:?}"));
        first_rpc.push(ms);
    }
    for n in &mut nodes {
        n.ask("alive 2");
    }
    println!(
        "test three_nodes_find_each_other_by_mdns_on_a_bridge ... ok \
         (start -> first RPC with an mDNS-found peer: {first_rpc:?} ms)"
    );

    // 2. Partition node 3 away until both sides declare the other down.
    net.port(2, false);
    let cut = Instant::now();
    nodes[0].ask("down 1");
    nodes[1].ask("down 1");
    nodes[2].ask("down 2");
    let detected = cut.elapsed();
    nodes[0].ask("publish a 20");
    nodes[1].ask("publish b 20");
    nodes[2].ask("publish c 15");
    // Majority side has its 40 (pushed between 1 and 2); node 3 only its own.
    nodes[0].ask("records 40");
    nodes[2].ask("records 15");
    // Keep the cut until the QUIC connections are idle-closed, so that only
    // reconnection + reconciliation can carry the records across.
    std::thread::sleep(Duration::from_secs(11).saturating_sub(cut.elapsed()));
    net.port(2, true);
    let healed = Instant::now();
    let digests: Vec<String> = nodes
        .iter_mut()
        .map(|n| {
            let r = n.ask("records 55");
            let parts: Vec<&str> = r.split_whitespace().collect();
            assert_eq!(parts[1], "55", "exactly the 55 records: {r}");
            parts[2].to_string()
        })
        .collect();
    let converged = healed.elapsed();
    assert!(
        digests.iter().all(|d| *d == digests[0]),
        "record sets differ: {digests:?}"
    );
    for n in &mut nodes {
        n.ask("alive 2");
    }
    println!(
        "test partition_then_heal_converges ... ok (down detected after {:.1}s; \
         converged {:.1}s after link up; digest {})",
        detected.as_secs_f64(),
        converged.as_secs_f64(),
        digests[0]
    );
    for n in &mut nodes {
        n.send("quit");
    }
    for n in &mut nodes {
        let _ = n.child.wait();
    }
    drop(nodes);
    drop(net);
    println!(
        "\n2 passed, 0 failed ({:.1}s)",
        started.elapsed().as_secs_f64()
    );
}
