//! `starling up`, `peers` and `invite` as a person uses them: separate processes on
//! loopback (no mDNS), talking through the node API. Uses a tiny model the test writes.

mod api_support;

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use api_support::write_tiny_llama;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_starling");

fn free_udp() -> SocketAddr {
    UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("udp port")
}

fn free_tcp() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("tcp port")
}

struct Up {
    child: Child,
    api: SocketAddr,
    quic: SocketAddr,
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn up(home: &Path, data: &Path, model: &Path, name: &str, extra: &[String]) -> Up {
    let api = free_tcp();
    let quic = free_udp();
    let child = Command::new(BIN)
        .args(["--home", home.to_str().unwrap_or_default(), "up"])
        .args(["--data-dir", data.to_str().unwrap_or_default()])
        .args(["--name", name, "--no-mdns", "--embedding-model", "none"])
        .args(["--model", model.to_str().unwrap_or_default(), "--json"])
        .args(["--listen", &quic.to_string(), "--api", &api.to_string()])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn starling up");
    Up { child, api, quic }
}

fn cli(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run starling")
}

/// Polls `starling peers --json` on `api` until `want` alive peers are listed.
fn wait_peers(api: SocketAddr, want: usize) -> Vec<Value> {
    let t = Instant::now();
    loop {
        let out = cli(&["peers", "--api", &api.to_string(), "--json"]);
        if out.status.success() {
            let v: Vec<Value> = serde_json::from_slice(&out.stdout).expect("peers JSON");
            if v.iter().filter(|p| p["state"] == "alive").count() >= want {
                return v;
            }
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{api}: no {want} alive peers: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The swarm secret of the node at `api`, once it answers.
fn secret_of(api: SocketAddr) -> String {
    let t = Instant::now();
    loop {
        let out = cli(&["invite", "--api", &api.to_string(), "--secret"]);
        if out.status.success() {
            return String::from_utf8_lossy(&out.stdout).trim().to_owned();
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "node {api} never answered"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `starling memory add` on `api`; returns the new memory's id.
fn add_memory(api: SocketAddr, prompt: &str, answer: &str) -> String {
    let out = cli(&[
        "memory",
        "add",
        "--api",
        &api.to_string(),
        "--json",
        "--prompt",
        prompt,
        "--answer",
        answer,
    ]);
    assert!(
        out.status.success(),
        "memory add: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("memory add JSON");
    assert_eq!(v["added"], true, "{v}");
    v["memory"]["id"].as_str().expect("memory id").to_owned()
}

/// Polls `starling memory list --json` on `api` until every id of `want` is listed.
fn wait_memories(api: SocketAddr, want: &[&str]) {
    let t = Instant::now();
    loop {
        let out = cli(&["memory", "list", "--api", &api.to_string(), "--json"]);
        let have: Vec<String> = if out.status.success() {
            let v: Value = serde_json::from_slice(&out.stdout).expect("memory list JSON");
            v["memories"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|m| m["id"].as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        if want.iter().all(|w| have.iter().any(|h| h == w)) {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{api}: memories {want:?} not all listed; have {have:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Memories across three `starling up` processes: one added anywhere is listed
/// everywhere; a node killed with SIGKILL keeps what it had, and on restart gets what the
/// others added while it was gone (the partition heals); a memory acknowledged just before
/// SIGKILL is still there after restart.
#[test]
fn memories_replicate_survive_kill_9_and_converge_after_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = write_tiny_llama(dir.path(), "tiny", 256);
    let home = dir.path().join("home");
    let (da, db, dc) = (
        dir.path().join("a"),
        dir.path().join("b"),
        dir.path().join("c"),
    );
    let mut a = up(&home, &da, &model, "alice", &[]);
    let secret = secret_of(a.api);
    let join = |data: &Path, name: &str, boot: SocketAddr| {
        up(
            &home,
            data,
            &model,
            name,
            &[
                "--bootstrap".into(),
                boot.to_string(),
                "--swarm-secret".into(),
                secret.clone(),
            ],
        )
    };
    let mut b = join(&db, "bob", a.quic);
    let c = join(&dc, "cyra", a.quic);
    wait_peers(a.api, 2);
    wait_peers(b.api, 2);
    wait_peers(c.api, 2);

    let m1 = add_memory(a.api, "How long do soft boiled eggs cook?", "Six minutes.");
    for api in [a.api, b.api, c.api] {
        wait_memories(api, &[&m1]);
    }

    // Bob dies without a goodbye; the others keep writing.
    let _ = b.child.kill();
    let _ = b.child.wait();
    let m2 = add_memory(
        a.api,
        "What temperature proves bread dough?",
        "About 27 degrees.",
    );
    let m3 = add_memory(
        c.api,
        "How much salt goes in pasta water?",
        "About 10 g per litre.",
    );
    wait_memories(c.api, &[&m2, &m3]);

    // Back with the same data dir: what it had, plus what it missed.
    let b2 = up(&home, &db, &model, "bob", &[]);
    wait_memories(b2.api, &[&m1, &m2, &m3]);

    // An acknowledged add is durable: SIGKILL right after it loses nothing.
    let m4 = add_memory(
        a.api,
        "How long does rice rest after cooking?",
        "Ten minutes, covered.",
    );
    let _ = a.child.kill();
    let _ = a.child.wait();
    let a2 = up(&home, &da, &model, "alice", &[]);
    wait_memories(a2.api, &[&m1, &m2, &m3, &m4]);
    drop((b, c, b2, a2));
}

#[test]
fn two_nodes_by_hand_find_each_other_and_rejoin_from_cache() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = write_tiny_llama(dir.path(), "tiny", 256);
    let home = dir.path().join("home");
    let (da, db) = (dir.path().join("a"), dir.path().join("b"));

    let a = up(&home, &da, &model, "alice", &[]);
    // The second node needs the first one's secret: ask it, like a script would.
    let secret = secret_of(a.api);
    let mut b = up(
        &home,
        &db,
        &model,
        "bob",
        &[
            "--bootstrap".into(),
            a.quic.to_string(),
            "--swarm-secret".into(),
            secret.clone(),
        ],
    );
    let pa = wait_peers(a.api, 1);
    let pb = wait_peers(b.api, 1);
    assert_eq!(pa[0]["name"], "bob");
    assert_eq!(pb[0]["name"], "alice");
    assert_eq!(pb[0]["addr"], a.quic.to_string());

    let other = write_tiny_llama(dir.path(), "tiny2", 256);
    node_api_answers(a.api, &other);

    // Human-readable output lists the peer too.
    let out = cli(&["peers", "--api", &a.api.to_string()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("bob") && text.contains("alive"), "{text}");

    // A join code carries secret + address: a third node joins with it alone.
    let out = cli(&["invite", "--api", &a.api.to_string(), "--json"]);
    let inv: Value = serde_json::from_slice(&out.stdout).expect("invite JSON");
    let code = inv["code"].as_str().expect("code").to_owned();
    let c = up(
        &home,
        &dir.path().join("c"),
        &model,
        "carol",
        &["--join".into(), code],
    );
    wait_peers(c.api, 2);
    drop(c);

    // Restart b with no bootstrap and no secret flag: the stored secret and the peer
    // cache bring it back to a.
    let _ = b.child.kill();
    let _ = b.child.wait();
    let b2 = up(&home, &db, &model, "bob", &[]);
    let peers = wait_peers(b2.api, 1);
    assert!(peers
        .iter()
        .any(|p| p["name"] == "alice" && p["state"] == "alive"));
    drop(b);
}

#[test]
fn bad_config_and_no_node_are_clear_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, "[agent]\nmax_turns = \"many\"\n").expect("write");
    let out = cli(&["up", "--config", cfg.to_str().unwrap_or_default()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("max_turns"), "{err}");

    let nobody = free_tcp();
    let out = cli(&["peers", "--api", &nobody.to_string()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("starling up"), "{err}");
}

/// The node API, metrics and dashboard of a running node, with hostile inputs.
fn node_api_answers(api: SocketAddr, other_model: &Path) {
    let other_model = other_model.display().to_string();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async move {
        let c = reqwest::Client::new();
        let base = format!("http://{api}");
        let get = |path: &str| c.get(format!("{base}{path}")).send();
        let r = get("/").await.expect("dashboard");
        assert_eq!(r.status(), 200);
        assert!(r
            .text()
            .await
            .unwrap_or_default()
            .contains("<title>Starling"));
        let m = get("/metrics")
            .await
            .expect("metrics")
            .text()
            .await
            .unwrap_or_default();
        assert!(m.contains("starling_peers_up 1"), "{m}");
        assert!(
            m.contains("# TYPE starling_tokens_generated_total counter"),
            "{m}"
        );
        let t = Instant::now();
        loop {
            let cards: Value = get("/api/cards")
                .await
                .expect("cards")
                .json()
                .await
                .expect("json");
            if cards.as_array().map_or(0, Vec::len) >= 2 {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(30), "cards: {cards}");
            std::thread::sleep(Duration::from_millis(100));
        }
        let hits: Value = get("/api/cards?q=assistant&k=5")
            .await
            .expect("search")
            .json()
            .await
            .expect("json");
        assert!(hits[0]["score"].is_number(), "{hits}");
        for (path, status) in [
            ("/api/cards?k=0", 400),
            ("/api/groups/nope", 404),
            ("/api/nothing", 404),
        ] {
            assert_eq!(get(path).await.expect(path).status(), status, "{path}");
        }
        let post = |path: &str, body: &str| {
            c.post(format!("{base}{path}"))
                .header("content-type", "application/json")
                .body(body.to_owned())
                .send()
        };
        for (path, body, status) in [
            ("/api/tasks", r#"{"task": "   "}"#, 400),
            ("/api/tasks", r#"{"task": 5}"#, 400),
            ("/api/tasks", r#"{"task": "x", "evil": 1}"#, 400),
            ("/api/tasks", "{not json", 400),
            ("/api/human/h1", r#"{"answer": "yes"}"#, 404),
            ("/api/human/h1", r#"{"answer": ""}"#, 400),
        ] {
            let r = post(path, body).await.expect(path);
            assert_eq!(r.status(), status, "{path} {body}");
            let v: Value = r.json().await.expect("error body");
            assert!(v["error"]["message"].is_string(), "{v}");
        }
        let groups: Value = get("/api/groups")
            .await
            .expect("groups")
            .json()
            .await
            .expect("json");
        assert!(groups.is_array());
        // Tasks: listed from submission on; an unknown one cannot be cancelled, an ended
        // one is a conflict (the tiny model may finish before the cancel arrives).
        let submitted: Value = post("/api/tasks", r#"{"task": "Say hi."}"#)
            .await
            .expect("submit")
            .json()
            .await
            .expect("json");
        let id = submitted["group_id"].as_str().expect("group id").to_owned();
        let tasks: Value = get("/api/tasks")
            .await
            .expect("tasks")
            .json()
            .await
            .expect("json");
        assert_eq!(tasks[0]["group_id"], id.as_str(), "{tasks}");
        let delete = |path: String| c.delete(format!("{base}{path}")).send();
        let r = delete("/api/tasks/nope".into()).await.expect("delete");
        assert_eq!(r.status(), 404);
        let r = delete(format!("/api/tasks/{id}")).await.expect("delete");
        match r.status().as_u16() {
            200 => {
                let v: Value = r.json().await.expect("json");
                assert_eq!(v["state"], "cancelled", "{v}");
            }
            409 => {}
            other => panic!("cancel answered {other}"),
        }
        let state: Value = get(&format!("/api/tasks/{id}"))
            .await
            .expect("task")
            .json()
            .await
            .expect("json");
        assert!(
            state["state"] == "cancelled" || state["answer"].is_string(),
            "{state}"
        );
        // A task this node answers alone is a concluded group of one.
        let done: Value = post("/api/tasks", r#"{"task": "Say hello.", "wait": true}"#)
            .await
            .expect("submit")
            .json()
            .await
            .expect("json");
        let id = done["group_id"].as_str().expect("group id");
        let g: Value = get(&format!("/api/groups/{id}"))
            .await
            .expect("group")
            .json()
            .await
            .expect("json");
        assert_eq!(g["group"]["state"], "conclusion", "{g}");
        assert_eq!(g["group"]["goal"], "Say hello.", "{g}");
        assert_eq!(
            g["group"]["details"]["members"].as_array().map(Vec::len),
            Some(1),
            "{g}"
        );
        assert_eq!(
            g["group"]["details"]["conclusion"], done["answer"],
            "{g} {done}"
        );
        // Switching the active model: a bad one is refused and the old one stays.
        let put = |body: String| {
            c.put(format!("{base}/api/models/active"))
                .header("content-type", "application/json")
                .body(body)
                .send()
        };
        let r = put(r#"{"model": "/no/such/model.gguf"}"#.into())
            .await
            .expect("put");
        assert_eq!(r.status(), 400);
        let missing: Value = r.json().await.expect("json");
        // A file outside the model directories is refused the same way: the API does not
        // say whether it exists, nor what it starts with.
        let r = put(r#"{"model": "/etc/hostname"}"#.into())
            .await
            .expect("put");
        assert_eq!(r.status(), 400);
        let outside: Value = r.json().await.expect("json");
        assert_eq!(
            missing["error"]["message"], outside["error"]["message"],
            "{missing} {outside}"
        );
        let before: Value = get("/api/models/active")
            .await
            .expect("get")
            .json()
            .await
            .expect("json");
        assert_eq!(before["id"], "tiny", "{before}");
        let r = put(serde_json::json!({ "model": other_model }).to_string())
            .await
            .expect("put");
        assert_eq!(r.status(), 200);
        let after: Value = get("/api/models/active")
            .await
            .expect("get")
            .json()
            .await
            .expect("json");
        assert_eq!(after["id"], "tiny2", "{after}");
    });
}

/// Three `starling up` processes for the team tests: ada (asks; no documents) and bea and
/// cal, each with one document. A member marked human is a human proxy whose person never
/// answers: its tasks wait 4 s, then its documents answer.
struct Team {
    _dir: tempfile::TempDir,
    a: Up,
    b: Up,
    c: Up,
}

fn team(bea: (&str, bool), cal: (&str, bool)) -> Team {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = write_tiny_llama(dir.path(), "tiny", 2048);
    let home = dir.path().join("home");
    let config = |name: &str, doc: Option<&str>, human: bool| {
        let mut toml = String::from("[agent]\n");
        if let Some(text) = doc {
            let docs = dir.path().join(format!("{name}-docs"));
            std::fs::create_dir_all(&docs).expect("docs dir");
            std::fs::write(docs.join("harbour.md"), text).expect("doc");
            toml.push_str(&format!("docs = {:?}\n", docs.display().to_string()));
        }
        if human {
            toml.push_str("kind = \"human\"\nhuman_timeout_secs = 4\nhuman_fallback = \"model\"\n");
        }
        let path = dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, toml).expect("config");
        path.display().to_string()
    };
    let a = up(
        &home,
        &dir.path().join("ada"),
        &model,
        "ada",
        &["--config".into(), config("ada", None, false)],
    );
    let secret = secret_of(a.api);
    let join = |name: &str, (doc, human): (&str, bool)| {
        up(
            &home,
            &dir.path().join(name),
            &model,
            name,
            &[
                "--config".into(),
                config(name, Some(doc), human),
                "--bootstrap".into(),
                a.quic.to_string(),
                "--swarm-secret".into(),
                secret.clone(),
            ],
        )
    };
    let b = join("bea", bea);
    let c = join("cal", cal);
    for api in [a.api, b.api, c.api] {
        wait_peers(api, 2);
    }
    let t = Instant::now();
    while get_json(a.api, "/api/cards")
        .and_then(|v| v.as_array().map(Vec::len))
        .unwrap_or(0)
        < 3
    {
        assert!(t.elapsed() < Duration::from_secs(60), "cards never arrived");
        std::thread::sleep(Duration::from_millis(200));
    }
    Team { _dir: dir, a, b, c }
}

/// `GET path` on `api`: the JSON body of a success, `None` otherwise.
fn get_json(api: SocketAddr, path: &str) -> Option<Value> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        match reqwest::get(format!("http://{api}{path}")).await {
            Ok(r) if r.status().is_success() => r.json::<Value>().await.ok(),
            _ => None,
        }
    })
}

/// `POST /api/tasks` on `api` with `task` (waiting for the result with `wait`).
fn submit(api: SocketAddr, task: &str, wait: bool) -> Value {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        reqwest::Client::new()
            .post(format!("http://{api}/api/tasks"))
            .json(&serde_json::json!({ "task": task, "wait": wait }))
            .send()
            .await
            .expect("submit")
            .json()
            .await
            .expect("task JSON")
    })
}

/// Waits until the human proxy at `api` has a question for its person (its task started).
fn wait_for_person(api: SocketAddr) {
    let t = Instant::now();
    while get_json(api, "/api/human").is_none_or(|p| p.as_array().is_none_or(|a| a.is_empty())) {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{api} was never given its task"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn kill(node: &mut Up) {
    let _ = node.child.kill();
    let _ = node.child.wait();
}

/// Host failover: ada hosts a grounded task whose two facts are on bea and cal, and is
/// killed with SIGKILL while cal's part is still running (cal is a human proxy whose person
/// is asked first and does not answer for a few seconds). The member that succeeds ada
/// resumes the group from the log it recorded, and the task still concludes with both
/// facts, on both surviving nodes.
#[test]
fn a_group_whose_host_is_killed_still_concludes() {
    let Team { _dir, mut a, b, c } = team(
        (
            "# Quays\n\nQuay Nine at Port Ellery has a berth length of 214 metres.\n",
            false,
        ),
        (
            "# Pilots\n\nThe pilot on duty at Port Ellery this week is Morwenna Tregenza.\n",
            true,
        ),
    );
    let question =
        "How long is the berth at Quay Nine, and who is the pilot on duty at Port Ellery?";
    // The same task without a fault, for the cost of the failover.
    let t = Instant::now();
    let plain = submit(a.api, question, true);
    let plain_s = t.elapsed().as_secs_f64();
    assert!(
        plain["answer"].as_str().is_some_and(|a| a.contains("214")),
        "{plain}"
    );
    let submitted = submit(a.api, question, false);
    let group = submitted["group_id"].as_str().expect("group id").to_owned();
    // The group answers from the moment its id is handed out: forming, then the opening
    // turn (a discussion turn), then the sync assignment of the two sub-questions.
    let g = get_json(a.api, &format!("/api/groups/{group}"))
        .expect("the group of a task just submitted");
    assert!(
        ["forming", "discussion", "sync_task_assignment"]
            .contains(&g["group"]["state"].as_str().unwrap_or_default()),
        "{g}"
    );
    // cal's part has started (its person is being asked): the host dies now. The stored
    // group says where the chat stands (it is rewritten as the machine moves on).
    wait_for_person(c.api);
    let g = get_json(a.api, &format!("/api/groups/{group}")).expect("the group");
    assert_eq!(g["group"]["state"], "sync_task_assignment", "{g}");
    kill(&mut a);
    let killed = Instant::now();
    // Both survivors see the group concluded with both facts.
    for (name, api) in [("bea", b.api), ("cal", c.api)] {
        let path = format!("/api/groups/{group}");
        let detail = loop {
            if let Some(g) = get_json(api, &path).filter(|g| g["group"]["state"] == "conclusion") {
                break g;
            }
            assert!(
                killed.elapsed() < Duration::from_secs(90),
                "{name}: the group never concluded after its host was killed: {:?}",
                get_json(api, &path)
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        let messages = detail["messages"].as_array().expect("messages");
        let last = messages.last().expect("a message");
        assert_eq!(last["msg_type"], "conclude", "{name}: {detail}");
        let conclusion = last["content"].as_str().unwrap_or_default();
        assert!(
            conclusion.contains("214") && conclusion.contains("Morwenna Tregenza"),
            "{name}: {conclusion}"
        );
        // The handover is in the log, in the lost host's name.
        assert!(
            messages.iter().any(|m| m["msg_type"] == "member_left"
                && m["content"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("resumes")),
            "{name}: {detail}"
        );
        let seqs: Vec<u64> = messages.iter().filter_map(|m| m["seq"].as_u64()).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{name}: {seqs:?}");
    }
    eprintln!(
        "without a fault the task took {plain_s:.1} s; with the host killed it concluded on \
         both survivors {:.1} s after the kill",
        killed.elapsed().as_secs_f64()
    );
    // The successor answers for the task too.
    let answered = [b.api, c.api]
        .into_iter()
        .filter_map(|api| get_json(api, &format!("/api/tasks/{group}")))
        .filter(|r| r["answer"].as_str().is_some_and(|a| a.contains("214")))
        .count();
    assert_eq!(answered, 1, "exactly one survivor hosts the resumed group");
}

/// A member killed with SIGKILL as its task starts: its sub-question goes to the other
/// node holding the fact, and the answer still has it. bea's sentence matches more of the
/// question, so bea is asked first (a human proxy: its person is asked and does not answer
/// for a few seconds); cal says the same in other words.
#[test]
fn a_member_killed_as_its_task_starts_still_yields_its_fact_from_another_holder() {
    let Team { _dir, a, mut b, c } = team(
        (
            "# Harbour staff\n\nThe harbour master at Port Ellery is Morwenna Tregenza.\n",
            true,
        ),
        (
            "# Notes\n\nPort Ellery harbour office: Morwenna Tregenza is in charge.\n",
            false,
        ),
    );
    let question = "Who is the harbour master at Port Ellery?";
    let t = Instant::now();
    let plain = submit(a.api, question, true);
    let plain_s = t.elapsed().as_secs_f64();
    assert_eq!(plain["citations"][0]["node"], "bea", "{plain}");
    let submitted = submit(a.api, question, false);
    let group = submitted["group_id"].as_str().expect("group id").to_owned();
    wait_for_person(b.api);
    kill(&mut b);
    let killed = Instant::now();
    let path = format!("/api/tasks/{group}");
    let result = loop {
        if let Some(r) = get_json(a.api, &path).filter(|r| r["answer"].is_string()) {
            break r;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(90),
            "the task never ended after bea was killed: {:?}",
            get_json(a.api, &path)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        result["answer"]
            .as_str()
            .is_some_and(|a| a.contains("Morwenna Tregenza")),
        "{result}\n{:?}",
        get_json(a.api, &format!("/api/groups/{group}"))
    );
    assert_eq!(result["citations"][0]["node"], "cal", "{result}");
    eprintln!(
        "without a fault the task took {plain_s:.1} s; with bea killed it ended {:.1} s after the kill",
        killed.elapsed().as_secs_f64()
    );
    drop(c);
}
