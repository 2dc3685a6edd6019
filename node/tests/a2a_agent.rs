//! An A2A agent as a node's external agent (`[[agent.external]] a2a = "URL"`), against an
//! agent built with the official `a2a-sdk` server (tests/protocols/notes_a2a_server.py).
//! Ignored in a plain `cargo test` (it needs the a2a-sdk virtual environment);
//! `tests/protocols/run.sh` runs them with `STARLING_TEST_PYTHON` set to that environment's
//! python.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use starling_node::agent::tools::{ExternalAgent, ExternalTask, ToolError};
use starling_node::config::ExternalAgentConfig;

const PUMP_NOTE: &str =
    "Pump P-7 in the irrigation loop runs at 40 litres per minute and is inspected every Monday.";

/// The a2a-sdk agent, stopped when dropped.
struct Server {
    child: Child,
    url: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start(delay: &str) -> Self {
        let python = std::env::var("STARLING_TEST_PYTHON")
            .expect("STARLING_TEST_PYTHON: a python with a2a-sdk (tests/protocols/run.sh sets it)");
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/protocols/notes_a2a_server.py");
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("tasks.jsonl");
        let mut child = Command::new(python)
            .arg(script)
            .arg(&log)
            .args(["--delay", delay])
            .stdout(Stdio::piped())
            .spawn()
            .expect("python runs");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
            .to_owned();
        Self {
            child,
            url,
            log,
            _dir: dir,
        }
    }

    fn agent(&self, timeout_secs: u64) -> ExternalAgent {
        ExternalAgent::from_config(&ExternalAgentConfig {
            name: "station_notes".into(),
            description: String::new(),
            skills: Vec::new(),
            command: None,
            url: None,
            a2a: Some(self.url.clone()),
            ca_file: None,
            timeout_secs,
            max_output_bytes: 64 * 1024,
        })
        .unwrap()
    }

    fn logged(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

fn task(description: &str) -> ExternalTask {
    ExternalTask {
        task_id: "g1/t1".into(),
        description: description.into(),
        context: "Goal: keep the irrigation running.".into(),
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
#[ignore = "needs a2a-sdk: run by tests/protocols/run.sh"]
fn an_a2a_agent_gets_the_task_verbatim_and_its_answer_comes_back() {
    let server = Server::start("0");
    let q = "How often is pump P-7 inspected?";
    let got = rt().block_on(server.agent(30).run(&task(q))).unwrap();
    assert_eq!(got, PUMP_NOTE);
    let logged = server.logged();
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert_eq!(logged[0]["text"], q);
    assert_eq!(
        logged[0]["metadata"]["context"],
        "Goal: keep the irrigation running."
    );
}

#[test]
#[ignore = "needs a2a-sdk: run by tests/protocols/run.sh"]
fn a_long_a2a_task_is_polled_until_it_completes() {
    let server = Server::start("1.5");
    let got = rt()
        .block_on(
            server
                .agent(30)
                .run(&task("How often is pump P-7 inspected?")),
        )
        .unwrap();
    assert_eq!(got, PUMP_NOTE);
    // A task that fails at the agent is a failure here, with the agent's reason.
    let e = rt()
        .block_on(server.agent(30).run(&task("zzz qqq")))
        .unwrap_err();
    assert!(
        e.to_string().contains("TASK_STATE_FAILED") && e.to_string().contains("no note matches"),
        "{e}"
    );
}

#[test]
#[ignore = "needs a2a-sdk: run by tests/protocols/run.sh"]
fn a_long_a2a_task_past_its_timeout_is_cancelled_at_the_agent() {
    let server = Server::start("60");
    let runtime = rt();
    let agent = server.agent(2);
    let e = runtime
        .block_on(agent.run(&task("How often is pump P-7 inspected?")))
        .unwrap_err();
    assert!(matches!(e, ToolError::Timeout { secs: 2, .. }), "{e}");
    // The CancelTask runs on the agent's own task set: give it the runtime until the
    // server logs it.
    let start = Instant::now();
    let canceled = runtime.block_on(async {
        loop {
            if let Some(id) = server
                .logged()
                .iter()
                .find_map(|e| e.get("canceled").cloned())
            {
                return Some(id);
            }
            if start.elapsed() > Duration::from_secs(10) {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    assert!(
        canceled.is_some(),
        "no CancelTask within 10 s: {:?}",
        server.logged()
    );
}

#[test]
#[ignore = "needs a2a-sdk: run by tests/protocols/run.sh"]
fn a_missing_card_is_a_clear_error_and_a_card_url_works() {
    // The server's card is fine; a URL whose card is missing is not.
    let server = Server::start("0");
    let mut bad = ExternalAgentConfig {
        name: "nowhere".into(),
        description: String::new(),
        skills: Vec::new(),
        command: None,
        url: None,
        a2a: Some(format!("{}/missing", server.url)),
        ca_file: None,
        timeout_secs: 10,
        max_output_bytes: 64 * 1024,
    };
    let e = rt()
        .block_on(ExternalAgent::from_config(&bad).unwrap().run(&task("x")))
        .unwrap_err();
    assert!(e.to_string().contains("cannot read its agent card"), "{e}");
    bad.a2a = Some(format!("{}/.well-known/agent-card.json", server.url));
    let got = rt()
        .block_on(
            ExternalAgent::from_config(&bad)
                .unwrap()
                .run(&task("How often is pump P-7 inspected?")),
        )
        .unwrap();
    assert_eq!(got, PUMP_NOTE, "a card URL works as well as the base URL");
}
