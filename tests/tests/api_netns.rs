//! The HTTP API off loopback, on an address of a network namespace this test creates
//! (never the host's interfaces): two namespaces joined by a veth pair, 10.79.0.1/24 and
//! 10.79.0.2/24. A node in the first serves its API on 10.79.0.1 with an API key; a client
//! in the second gets 401 without the key or with a wrong one (for the swarm secret behind
//! `/api/invite`, the peers and the OpenAI routes alike) and 200 with it. The same node
//! without a key refuses to start there.
//!
//! Needs root and `ip netns`; prints a skip line otherwise. The test binary re-executes
//! itself inside each namespace (`ip netns exec`); the node's process answers `quit` on
//! its stdin.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use starling_discovery::SwarmSecret;
use starling_node::daemon::{Node, StartOptions};

mod support;

const ROLE: &str = "STARLING_API_NETNS_ROLE";
const KEY: &str = "netns-test-key-0123456789abcdef";
const SERVER_IP: &str = "10.79.0.1";

fn main() {
    match std::env::var(ROLE).as_deref() {
        Ok("node") => node(),
        Ok("client") => client(),
        _ => parent(),
    }
}

/// In the server's namespace: a node whose API listens on the veth address with [`KEY`];
/// prints `nokey <error>` for the same node without a key, then `api ADDR`, and runs
/// until `quit`.
fn node() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let models = support::tiny_models(dir.path());
        let secret = SwarmSecret::generate().to_string();
        let mut c = support::loopback_config(dir.path(), "ada", &secret, None);
        c.api.listen = format!("{SERVER_IP}:0").parse().unwrap();
        let open = Node::start(
            c.clone(),
            StartOptions {
                models: Some(models.clone()),
                ..StartOptions::default()
            },
        )
        .await;
        match open {
            Ok(n) => {
                println!("nokey started");
                n.shutdown().await;
            }
            Err(e) => println!("nokey {}", format!("{e:#}").replace('\n', " ")),
        }
        c.api.keys = vec![KEY.to_owned()];
        let node = support::start(c, &models).await;
        println!("api {}", node.api_addr);
        for line in std::io::stdin().lock().lines() {
            if line.unwrap().trim() == "quit" {
                break;
            }
        }
        node.shutdown().await;
    });
}

/// In the client's namespace: `GET PATH` of `ADDR` with the `AUTH` header if set; prints
/// the status code.
fn client() {
    let addr: SocketAddr = std::env::var("ADDR").unwrap().parse().unwrap();
    let path = std::env::var("PATH_ASKED").unwrap();
    let auth = std::env::var("AUTH")
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    let status = answer
        .split_whitespace()
        .nth(1)
        .unwrap_or("none")
        .to_owned();
    println!("{status}");
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

/// The two namespaces; deleted on drop (also on panic).
struct Net {
    server: String,
    client: String,
}

impl Net {
    fn create() -> Result<Self, String> {
        let pid = std::process::id();
        let net = Self {
            server: format!("sta{pid}s"),
            client: format!("sta{pid}c"),
        };
        ip(&["netns", "add", &net.server])?;
        ip(&["netns", "add", &net.client])?;
        ip(&[
            "link",
            "add",
            "veth0",
            "netns",
            &net.server,
            "type",
            "veth",
            "peer",
            "name",
            "veth0",
            "netns",
            &net.client,
        ])?;
        for (ns, addr) in [(&net.server, "10.79.0.1/24"), (&net.client, "10.79.0.2/24")] {
            ip(&["-n", ns, "addr", "add", addr, "dev", "veth0"])?;
            ip(&["-n", ns, "link", "set", "veth0", "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.server]);
        let _ = ip(&["netns", "del", &self.client]);
    }
}

/// The node's process; killed on drop if still running.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// The status code the client namespace gets for `GET path` with `auth`.
fn status(net: &Net, addr: &str, path: &str, auth: Option<&str>) -> String {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &net.client])
        .arg(exe)
        .env(ROLE, "client")
        .env("ADDR", addr)
        .env("PATH_ASKED", path);
    if let Some(a) = auth {
        cmd.env("AUTH", a);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn parent() {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    if !root {
        println!("api_netns: skipped (needs root for network namespaces)");
        return;
    }
    let net = match Net::create() {
        Ok(n) => n,
        Err(e) => {
            println!("api_netns: skipped (cannot create network namespaces: {e})");
            return;
        }
    };
    let exe = std::env::current_exe().unwrap();
    let mut server = Server(
        Command::new("ip")
            .args(["netns", "exec", &net.server])
            .arg(exe)
            .env(ROLE, "node")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    // The node's lines, read on a thread so that a node that never starts fails the test
    // after a minute instead of hanging it.
    let out = BufReader::new(server.0.stdout.take().unwrap());
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for l in out.lines().map_while(Result::ok) {
            if lines_tx.send(l).is_err() {
                break;
            }
        }
    });
    let next_line = || {
        lines
            .recv_timeout(Duration::from_secs(60))
            .expect("the node's process said nothing for a minute")
    };
    let line = next_line();
    assert!(
        line.starts_with("nokey ") && line.contains("without an API key"),
        "a node without a key started off loopback: {line:?}"
    );
    println!("test a_node_without_a_key_refuses_to_serve_off_loopback ... ok");
    let line = next_line();
    let addr = line
        .strip_prefix("api ")
        .unwrap_or_else(|| panic!("no API address: {line:?}"))
        .trim()
        .to_owned();
    assert!(addr.starts_with(SERVER_IP), "{addr}");

    let bearer = format!("Bearer {KEY}");
    for path in ["/api/invite", "/api/peers", "/v1/models"] {
        assert_eq!(
            status(&net, &addr, path, None),
            "401",
            "{path} without a key"
        );
        assert_eq!(
            status(&net, &addr, path, Some("Bearer wrong-key-0123456789abcdef")),
            "401",
            "{path} with a wrong key"
        );
        assert_eq!(
            status(&net, &addr, path, Some(&bearer)),
            "200",
            "{path} with the key"
        );
    }
    println!("test off_loopback_the_api_answers_only_with_the_key ... ok");
    let mut stdin = server.0.stdin.take().unwrap();
    writeln!(stdin, "quit").unwrap();
    drop(stdin);
    let stopped = std::time::Instant::now();
    let code = loop {
        if let Some(code) = server.0.try_wait().unwrap() {
            break code;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(60),
            "the node's process did not stop within a minute of `quit`"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(code.success(), "the node's process failed: {code}");
    println!("api_netns: 2 passed, 0 failed");
}
