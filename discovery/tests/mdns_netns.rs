//! mDNS in network namespaces this test creates (never on the host's
//! interfaces): two namespaces joined by a veth pair.
//!
//! 1. A node listening on 127.0.0.1 with mDNS enabled sends nothing on the
//!    veth: a multicast listener on the other end counts zero mDNS packets.
//! 2. Control: the same node listening on its veth address is heard there.
//! 3. Two nodes with no bootstrap and no cache find each other by mDNS alone.
//!
//! Needs root and `ip netns`; prints a skip line otherwise. The test binary
//! re-executes itself inside a namespace (`ip netns exec`) for each role.

#![allow(clippy::unwrap_used)]

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use starling_discovery::{PeerState, Swarm, SwarmConfig, SwarmSecret};

const ROLE: &str = "STARLING_NETNS_ROLE";

fn main() {
    match std::env::var(ROLE).as_deref() {
        Ok("node") => child_node(),
        Ok("listen") => child_listen(),
        _ => parent(),
    }
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"))
}

/// Runs a swarm node; with EXPECT > 0 waits for that many alive peers.
fn child_node() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let listen: SocketAddr = env("LISTEN").parse().unwrap();
    let secret: SwarmSecret = env("SECRET").parse().unwrap();
    let expect: usize = env("EXPECT").parse().unwrap();
    let run_for = Duration::from_millis(env("RUN_MS").parse().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ok = rt.block_on(async move {
        let mut c = SwarmConfig::new(dir.path(), secret);
        c.listen = listen;
        c.mdns = true;
        c.name = format!("node-{listen}");
        let s = Swarm::start(c).await.unwrap();
        let start = Instant::now();
        let ok = loop {
            let alive = s
                .peers()
                .iter()
                .filter(|p| p.state == PeerState::Alive)
                .count();
            if expect > 0 && alive >= expect {
                // Stay up a little so the other side can see us alive too.
                tokio::time::sleep(Duration::from_secs(3)).await;
                break true;
            }
            if start.elapsed() > run_for {
                break expect == 0;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        println!("peers={:?}", s.peers());
        s.shutdown().await;
        ok
    });
    std::process::exit(if ok { 0 } else { 1 });
}

/// Joins the mDNS group on one address and counts packets for RUN_MS.
fn child_listen() {
    let iface: Ipv4Addr = env("IFACE").parse().unwrap();
    let run_for = Duration::from_millis(env("RUN_MS").parse().unwrap());
    let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 5353)).unwrap();
    sock.join_multicast_v4(&Ipv4Addr::new(224, 0, 0, 251), &iface)
        .unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let start = Instant::now();
    let mut count = 0;
    let mut buf = [0u8; 9000];
    while start.elapsed() < run_for {
        if sock.recv_from(&mut buf).is_ok() {
            count += 1;
        }
    }
    println!("mdns_packets={count}");
}

/// Namespaces and veth pair; removed on drop (also when the test fails).
struct Net {
    a: String,
    b: String,
    ip_a: Ipv4Addr,
    ip_b: Ipv4Addr,
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

impl Net {
    fn create() -> Result<Self, String> {
        let pid = std::process::id();
        let subnet = (pid % 250) as u8;
        let net = Self {
            a: format!("stl{pid}a"),
            b: format!("stl{pid}b"),
            ip_a: Ipv4Addr::new(10, 213, subnet, 1),
            ip_b: Ipv4Addr::new(10, 213, subnet, 2),
        };
        ip(&["netns", "add", &net.a])?;
        ip(&["netns", "add", &net.b])?;
        ip(&[
            "link", "add", "v0", "netns", &net.a, "type", "veth", "peer", "name", "v1", "netns",
            &net.b,
        ])?;
        for (ns, dev, addr) in [(&net.a, "v0", net.ip_a), (&net.b, "v1", net.ip_b)] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    fn spawn(&self, ns: &str, vars: &[(&str, String)]) -> std::process::Child {
        let exe = std::env::current_exe().unwrap();
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns]).arg(exe);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        cmd.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit());
        cmd.spawn().unwrap()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn packets_heard(net: &Net, node_listen: SocketAddr) -> usize {
    let secret = SwarmSecret::generate().to_string();
    let listener = net.spawn(
        &net.b,
        &[
            (ROLE, "listen".into()),
            ("IFACE", net.ip_b.to_string()),
            ("RUN_MS", "4000".into()),
        ],
    );
    std::thread::sleep(Duration::from_millis(300));
    let node = net.spawn(
        &net.a,
        &[
            (ROLE, "node".into()),
            ("LISTEN", node_listen.to_string()),
            ("SECRET", secret),
            ("EXPECT", "0".into()),
            ("RUN_MS", "3000".into()),
        ],
    );
    let node_out = node.wait_with_output().unwrap();
    assert!(
        node_out.status.success(),
        "node child failed: {}",
        stdout(&node_out)
    );
    let out = stdout(&listener.wait_with_output().unwrap());
    out.trim()
        .strip_prefix("mdns_packets=")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("listener output: {out:?}"))
}

fn parent() {
    let started = Instant::now();
    if Command::new("id")
        .arg("-u")
        .output()
        .map(|o| stdout(&o).trim() != "0")
        .unwrap_or(true)
    {
        println!("mdns_netns: skipped (needs root for network namespaces)");
        return;
    }
    let net = match Net::create() {
        Ok(n) => n,
        Err(e) => {
            println!("mdns_netns: skipped (cannot create network namespaces: {e})");
            return;
        }
    };
    let mut passed = 0;

    // 1. Loopback listener: nothing reaches the veth.
    let heard = packets_heard(&net, "127.0.0.1:0".parse().unwrap());
    assert_eq!(
        heard, 0,
        "a loopback-only node must not multicast on other interfaces"
    );
    println!("test loopback_node_is_silent_on_other_interfaces ... ok ({heard} packets)");
    passed += 1;

    // 2. Control: the listener does hear a node announcing on the veth.
    let heard = packets_heard(&net, SocketAddr::new(net.ip_a.into(), 0));
    assert!(
        heard > 0,
        "the listener must hear a node announcing on its interface"
    );
    println!("test lan_node_is_heard_on_its_interface ... ok ({heard} packets)");
    passed += 1;

    // 3. Discovery by mDNS alone.
    let secret = SwarmSecret::generate().to_string();
    let node = |ns: &str, addr: Ipv4Addr| {
        net.spawn(
            ns,
            &[
                (ROLE, "node".into()),
                ("LISTEN", SocketAddr::new(addr.into(), 0).to_string()),
                ("SECRET", secret.clone()),
                ("EXPECT", "1".into()),
                ("RUN_MS", "20000".into()),
            ],
        )
    };
    let (a, b) = (node(&net.a, net.ip_a), node(&net.b, net.ip_b));
    let (oa, ob) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert!(
        oa.status.success() && ob.status.success(),
        "mDNS discovery failed: {} / {}",
        stdout(&oa),
        stdout(&ob)
    );
    println!("test nodes_find_each_other_by_mdns_alone ... ok");
    passed += 1;

    drop(net);
    println!(
        "\n{passed} passed, 0 failed ({:.1}s)",
        started.elapsed().as_secs_f64()
    );
}
