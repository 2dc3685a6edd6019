//! A model file whose chat template is crafted to exhaust memory, run through the real
//! `starling` binary (which installs the allocator that bounds a render,
//! `starling_models::budget`): a clear error, never an out-of-memory abort.

mod api_support;

use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use api_support::write_tiny_templated;
use serde_json::{json, Value};
use starling_models::testing::TinyArch;

const BIN: &str = env!("CARGO_BIN_EXE_starling");

/// Doubles a string forty times: little fuel, no output, a terabyte of memory.
const DOUBLING: &str = "{% set ns = namespace(s='x') %}{% for i in range(40) %}\
                        {% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}";

/// ChatML, but a conversation of more than four messages doubles a list forty times: the
/// load-time probe (three messages) passes, a longer request does not.
const LATER: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n\
                     {% endfor %}{% if messages | length > 4 %}{% set ns = namespace(l=[1]) %}\
                     {% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}\
                     {{ ns.l | length }}{% endif %}<|im_start|>assistant\n";

#[test]
fn generate_with_a_template_that_needs_a_terabyte_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = write_tiny_templated(dir.path(), "doubling", TinyArch::Llama, 256, DOUBLING);
    let out = Command::new(BIN)
        .args([
            "--home",
            dir.path().to_str().unwrap_or_default(),
            "generate",
        ])
        .args([
            "--model",
            model.to_str().unwrap_or_default(),
            "-n",
            "4",
            "hi",
        ])
        .output()
        .expect("run starling generate");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Exit code 1 with a message, not a signal (SIGABRT from a failed allocation).
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("chat template") && stderr.contains("memory"),
        "{stderr}"
    );
}

fn free_tcp() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("tcp port")
}

struct Serve(std::process::Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn chat(client: &reqwest::Client, api: SocketAddr, turns: usize) -> (u16, Value) {
    let messages: Vec<Value> = (0..turns)
        .map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": format!("turn {i}")}))
        .collect();
    let r = client
        .post(format!("http://{api}/v1/chat/completions"))
        .json(&json!({"model": "later", "messages": messages, "max_tokens": 2}))
        .send()
        .await
        .expect("chat request");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_a_template_past_its_memory_bound_with_400_and_keeps_running() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = write_tiny_templated(dir.path(), "later", TinyArch::Llama, 256, LATER);
    let api = free_tcp();
    let mut serve = Serve(
        Command::new(BIN)
            .args(["--home", dir.path().to_str().unwrap_or_default(), "serve"])
            .args(["--api", &api.to_string(), "--no-embeddings"])
            .args(["--model", model.to_str().unwrap_or_default()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn starling serve"),
    );
    let client = reqwest::Client::new();
    let started = Instant::now();
    loop {
        if let Ok(r) = client.get(format!("http://{api}/health")).send().await {
            if r.status().is_success() {
                break;
            }
        }
        assert!(
            serve.0.try_wait().expect("serve status").is_none(),
            "starling serve exited before answering"
        );
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "starling serve never answered /health"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A short conversation renders.
    let (status, body) = chat(&client, api, 1).await;
    assert_eq!(status, 200, "{body}");
    // Five messages make the template double a list: 400, in plain words.
    let (status, body) = chat(&client, api, 5).await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("memory"), "{body}");
    // The server is alive, and the template is refused from then on.
    assert!(serve.0.try_wait().expect("serve status").is_none());
    let health = client
        .get(format!("http://{api}/health"))
        .send()
        .await
        .expect("health");
    assert!(health.status().is_success());
    let (status, body) = chat(&client, api, 1).await;
    assert_eq!(status, 400, "{body}");
}
