//! The external-agent protocol of docs/agents.md, end to end: the example adapters in
//! examples/agents/ (a command and an HTTP service, Python standard library only) called
//! through `ExternalAgent` as a node calls them, and the JSON Schemas in docs/schemas/
//! checked against what the node sends and what the adapters answer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};
use starling_node::agent::tools::{ExternalAgent, ExternalTask, Progress, ToolError};
use starling_node::config::ExternalAgentConfig;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn schema(name: &str) -> jsonschema::Validator {
    let text = std::fs::read_to_string(root().join("docs/schemas").join(name)).expect("schema");
    let v: Value = serde_json::from_str(&text).expect("schema is JSON");
    jsonschema::validator_for(&v).expect("schema compiles")
}

fn agent(command: Option<Vec<String>>, url: Option<String>) -> ExternalAgent {
    ExternalAgent::from_config(&ExternalAgentConfig {
        name: "station_notes".into(),
        description: "Knows the station's maintenance notes.".into(),
        skills: Vec::new(),
        command,
        url,
        a2a: None,
        ca_file: None,
        timeout_secs: 30,
        max_output_bytes: 64 * 1024,
    })
    .expect("valid config")
}

fn python(args: &[&str]) -> Vec<String> {
    std::iter::once("python3")
        .chain(args.iter().copied())
        .map(str::to_owned)
        .collect()
}

fn notes_script() -> String {
    root()
        .join("examples/agents/notes_agent.py")
        .to_string_lossy()
        .into_owned()
}

fn task(description: &str) -> ExternalTask {
    ExternalTask {
        task_id: "g0123".into(),
        description: description.into(),
        context: "Goal: keep the station's greenhouse running.".into(),
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn the_task_a_node_sends_fits_the_documented_schema() {
    let v = schema("external-task.schema.json");
    let sent = serde_json::to_value(task("When is the next filter change?")).expect("JSON");
    assert!(v.is_valid(&sent), "{sent}");
    // The schema is no formality: a task without its description, or with a field the
    // node never sends, is refused.
    assert!(!v.is_valid(&json!({"task_id": "g", "context": ""})));
    assert!(!v.is_valid(&json!({"task_id": "g", "description": "x", "context": "", "x": 1})));
}

#[test]
fn the_command_example_answers_from_its_notes_and_fails_honestly() {
    let a = agent(Some(python(&[&notes_script()])), None);
    let got = rt()
        .block_on(a.run(&task(
            "When is the next air filter change in the north greenhouse?",
        )))
        .expect("answer");
    assert!(got.contains("12 June"), "{got}");
    let err = rt()
        .block_on(a.run(&task("zzz qqq")))
        .expect_err("nothing matches");
    match err {
        ToolError::External { reason, .. } => {
            assert!(reason.contains("no note matches"), "{reason}")
        }
        other => panic!("unexpected error: {other}"),
    }
}

#[test]
fn the_examples_answers_fit_the_reply_schema_and_so_do_the_nodes_refusals() {
    let v = schema("external-reply.schema.json");
    for description in ["How often is pump P-7 inspected?", "zzz qqq"] {
        let mut child = Command::new("python3")
            .arg(notes_script())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs");
        serde_json::to_writer(child.stdin.take().expect("stdin"), &task(description))
            .expect("write");
        let out = child.wait_with_output().expect("output");
        let reply: Value = serde_json::from_slice(&out.stdout).expect("reply is JSON");
        assert!(v.is_valid(&reply), "{reply}");
    }
    // What the node refuses, the schema refuses too: `ok` without a result.
    let empty = json!({"ok": true});
    assert!(!v.is_valid(&empty));
    let a = agent(Some(python(&["-c", "print('{\"ok\": true}')"])), None);
    let err = rt()
        .block_on(a.run(&task("anything")))
        .expect_err("no result");
    assert!(err.to_string().contains("no `result`"), "{err}");
}

/// The HTTP example, stopped when dropped.
struct Service(Child);

/// Starts the HTTP example with `args`; its URL and the rest of its output, line by line.
fn http_example(
    args: &[&str],
) -> (
    Service,
    String,
    std::io::Lines<BufReader<std::process::ChildStdout>>,
) {
    let script = root().join("examples/agents/http_agent.py");
    let mut child = Command::new("python3")
        .arg(&script)
        .args(["--port", "0"])
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let stdout = child.stdout.take().expect("stdout");
    let service = Service(child);
    let mut lines = BufReader::new(stdout).lines();
    let line = lines.next().expect("a ready line").expect("readable");
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .to_owned();
    assert!(
        url.starts_with("http://127.0.0.1:") || url.starts_with("https://127.0.0.1:"),
        "{url}"
    );
    (service, url, lines)
}

fn agent_with_timeout(url: &str, timeout_secs: u64) -> ExternalAgent {
    ExternalAgent::from_config(&ExternalAgentConfig {
        name: "station_notes".into(),
        description: String::new(),
        skills: Vec::new(),
        command: None,
        url: Some(url.into()),
        a2a: None,
        ca_file: None,
        timeout_secs,
        max_output_bytes: 64 * 1024,
    })
    .expect("valid config")
}

#[test]
fn a_long_task_is_submitted_then_polled_until_its_answer() {
    let (service, url, mut lines) = http_example(&["--delay", "1.5"]);
    let a = agent_with_timeout(&format!("{url}/"), 30);
    let reports = std::sync::Mutex::new(Vec::new());
    let report = |p: Progress| reports.lock().unwrap().push(p);
    let got = rt()
        .block_on(a.run_reporting(
            &task("How many litres does each nutrient tank hold?"),
            &report,
        ))
        .expect("answer");
    assert_eq!(
        got,
        "The hydroponic bay's nutrient tanks hold 220 litres each and are flushed every 14 days."
    );
    let submitted = lines.next().unwrap().unwrap();
    let id = submitted
        .strip_prefix("submitted ")
        .expect("submitted first");
    assert_eq!(lines.next().unwrap().unwrap(), format!("answered {id}"));
    // Where the task stood while the node waited: `working` on submission, then each
    // change of the agent's progress text, never the same report twice in a row.
    let reports = reports.into_inner().unwrap();
    assert_eq!(
        reports.first(),
        Some(&Progress {
            state: "working",
            text: None
        }),
        "{reports:?}"
    );
    assert!(
        reports[1..]
            .iter()
            .any(|p| p.text.as_deref().is_some_and(|t| t.ends_with(" s left"))),
        "{reports:?}"
    );
    assert!(reports.windows(2).all(|w| w[0] != w[1]), "{reports:?}");
    // What the example says while it works fits the reply schema.
    let v = schema("external-reply.schema.json");
    assert!(v.is_valid(&json!({"task_id": id, "status": "working", "progress": "1 s left"})));
    assert!(
        !v.is_valid(&json!({"status": "working"})),
        "a pending task needs its id"
    );
    drop(service);
}

#[test]
fn a_long_task_past_its_timeout_is_cancelled_at_the_agent() {
    let (service, url, mut lines) = http_example(&["--delay", "60"]);
    let a = agent_with_timeout(&url, 2);
    let runtime = rt();
    let started = std::time::Instant::now();
    let err = runtime
        .block_on(a.run(&task("How often is pump P-7 inspected?")))
        .expect_err("it takes a minute");
    assert!(matches!(err, ToolError::Timeout { secs: 2, .. }), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    // The DELETE runs on the agent's own task set: give it the runtime until it is seen.
    let submitted = lines.next().unwrap().unwrap();
    let id = submitted
        .strip_prefix("submitted ")
        .expect("submitted first")
        .to_owned();
    let canceled = std::thread::spawn(move || lines.next().unwrap().unwrap());
    runtime.block_on(async {
        for _ in 0..100 {
            if canceled.is_finished() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    });
    assert!(canceled.is_finished(), "no DELETE within 5 s");
    assert_eq!(canceled.join().unwrap(), format!("canceled {id}"));
    drop(service);
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_http_example_answers_a_post_from_the_node() {
    let (service, url, _) = http_example(&[]);
    let a = agent(None, Some(format!("{url}/")));
    let got = rt()
        .block_on(a.run(&task("How many litres does each nutrient tank hold?")))
        .expect("answer");
    assert!(got.contains("220 litres"), "{got}");
    drop(service);
}

/// An agent over HTTPS with a self-signed certificate: refused as an unknown issuer until
/// the entry's `ca_file` names the certificate; a `ca_file` that is no PEM is a clear error.
#[test]
fn an_https_agent_is_trusted_through_its_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("certificate");
    let cert_pem = dir.path().join("agent.pem");
    let key_pem = dir.path().join("agent.key");
    std::fs::write(&cert_pem, cert.cert.pem()).unwrap();
    std::fs::write(&key_pem, cert.signing_key.serialize_pem()).unwrap();
    let (service, url, _) = http_example(&[
        "--cert",
        cert_pem.to_str().unwrap(),
        "--key",
        key_pem.to_str().unwrap(),
    ]);
    assert!(url.starts_with("https://"), "{url}");
    let config = |ca_file: Option<PathBuf>| ExternalAgentConfig {
        name: "station_notes".into(),
        description: String::new(),
        skills: Vec::new(),
        command: None,
        url: Some(format!("{url}/")),
        a2a: None,
        ca_file,
        timeout_secs: 30,
        max_output_bytes: 64 * 1024,
    };
    let question = task("How many litres does each nutrient tank hold?");

    let trusted = ExternalAgent::from_config(&config(Some(cert_pem))).expect("valid config");
    let got = rt().block_on(trusted.run(&question)).expect("answer");
    assert!(got.contains("220 litres"), "{got}");

    let untrusted = ExternalAgent::from_config(&config(None)).expect("valid config");
    let e = rt()
        .block_on(untrusted.run(&question))
        .expect_err("an unknown issuer")
        .to_string();
    assert!(e.contains("station_notes"), "{e}");
    assert!(e.to_lowercase().contains("certificate"), "{e}");

    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "not a certificate").unwrap();
    let Err(e) = ExternalAgent::from_config(&config(Some(not_pem))) else {
        panic!("a ca_file without a certificate is refused");
    };
    assert!(e.to_string().contains("holds no PEM certificate"), "{e}");
    drop(service);
}
