//! An A2A agent as a node's external agent (`[[agent.external]] a2a = "URL"`): the node is
//! an A2A 1.0 client over the JSON-RPC binding.
//!
//! The agent card is read from `URL/.well-known/agent-card.json` (or from `URL` itself when
//! it names the card) on first use; its JSON-RPC interface of protocol 1.0 is the endpoint.
//! A task is one `SendMessage` (`returnImmediately`) with the task text as the message's
//! one text part (the group's goal, if any, in the message's `metadata.context`). The answer is the text parts
//! of the reply `message`, or of the task's artifacts (its status message when it has no
//! artifact). A task still `SUBMITTED` or `WORKING` is polled with `GetTask` (after 0.5 s,
//! doubling to 5 s); one that passes the call's deadline gets a `CancelTask`.
//!
//! Written here rather than taken from a crate: A2A has no official Rust SDK, the
//! community ones pull in a server, gRPC or SQL stacks, and the client side needs three
//! small JSON-RPC calls. `tests/protocols` checks it against the official `a2a-sdk` server.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{json, Value};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use super::with_causes;

/// The A2A protocol version this client speaks.
pub const A2A_VERSION: &str = "1.0";
/// Where an agent's card is, under its base URL.
pub const CARD_PATH: &str = "/.well-known/agent-card.json";

/// Why an A2A call failed (the text becomes the external agent's error).
#[derive(Debug, thiserror::Error)]
pub enum A2aError {
    /// The deadline passed.
    #[error("no answer in time")]
    Timeout,
    /// Anything else, said for people.
    #[error("{0}")]
    Failed(String),
}

fn failed(s: impl Into<String>) -> A2aError {
    A2aError::Failed(s.into())
}

/// What became of a task at the agent.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Its answer.
    Answer(String),
    /// Still running: poll `GetTask` with this id.
    Running(String),
}

/// A remote A2A agent.
#[derive(Debug)]
pub struct A2aAgent {
    card_url: String,
    client: reqwest::Client,
    endpoint: OnceCell<String>,
    max_output: usize,
    next_id: AtomicU64,
}

impl A2aAgent {
    /// An agent whose card is at `url` (its base URL, or the card's own URL).
    pub fn new(url: &str, client: reqwest::Client, max_output: usize) -> Self {
        let card_url = if url.ends_with(".json") {
            url.to_owned()
        } else {
            format!("{}{CARD_PATH}", url.trim_end_matches('/'))
        };
        Self {
            card_url,
            client,
            endpoint: OnceCell::new(),
            max_output,
            next_id: AtomicU64::new(1),
        }
    }

    /// The JSON-RPC endpoint, from the card (read once).
    async fn endpoint(&self, deadline: Instant) -> Result<&str, A2aError> {
        self.endpoint
            .get_or_try_init(|| async {
                let card = self
                    .send(self.client.get(&self.card_url), deadline)
                    .await
                    .map_err(|e| match e {
                        A2aError::Failed(why) => {
                            failed(format!("cannot read its agent card: {why}"))
                        }
                        t => t,
                    })?;
                jsonrpc_endpoint(&card).map_err(failed)
            })
            .await
            .map(String::as_str)
    }

    /// Sends the task; its answer, or the id of the task still running.
    pub async fn send_message(
        &self,
        text: &str,
        context: &str,
        deadline: Instant,
    ) -> Result<Outcome, A2aError> {
        let mut message = json!({
            "messageId": format!("starling-{:016x}", rand::random::<u64>()),
            "role": "ROLE_USER",
            "parts": [{"text": text}],
        });
        if !context.trim().is_empty() {
            message["metadata"] = json!({ "context": context });
        }
        // Not held open while the agent works: a task that is still running comes back
        // at once and is polled (IoA's submit / poll contract).
        let params = json!({
            "message": message,
            "configuration": { "returnImmediately": true },
        });
        let result = self.call("SendMessage", params, deadline).await?;
        outcome(&result).map_err(failed)
    }

    /// Asks how the task `id` stands.
    pub async fn get_task(&self, id: &str, deadline: Instant) -> Result<Outcome, A2aError> {
        let result = self.call("GetTask", json!({ "id": id }), deadline).await?;
        let task = result.get("task").unwrap_or(&result);
        task_outcome(task).map_err(failed)
    }

    /// The `CancelTask` request for `id`, ready to send (the endpoint must be known: it
    /// is once a task was sent).
    pub fn cancel_request(&self, id: &str) -> Option<reqwest::Request> {
        let endpoint = self.endpoint.get()?;
        self.rpc_request(endpoint, "CancelTask", json!({ "id": id }))
            .build()
            .ok()
    }

    fn rpc_request(&self, endpoint: &str, method: &str, params: Value) -> reqwest::RequestBuilder {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.client
            .post(endpoint)
            .header("A2A-Version", A2A_VERSION)
            .json(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }))
    }

    async fn call(
        &self,
        method: &str,
        params: Value,
        deadline: Instant,
    ) -> Result<Value, A2aError> {
        let endpoint = self.endpoint(deadline).await?.to_owned();
        let reply = self
            .send(self.rpc_request(&endpoint, method, params), deadline)
            .await?;
        if let Some(e) = reply.get("error") {
            let code = e.get("code").and_then(Value::as_i64).unwrap_or(0);
            let msg = e
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("no message");
            return Err(failed(format!(
                "{method} failed: {msg} (JSON-RPC error {code})"
            )));
        }
        reply
            .get("result")
            .cloned()
            .ok_or_else(|| failed(format!("{method}: the reply has neither result nor error")))
    }

    /// One HTTP exchange by `deadline`: the JSON body of a 2xx answer.
    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        deadline: Instant,
    ) -> Result<Value, A2aError> {
        let exchange = async {
            let mut resp = request
                .send()
                .await
                .map_err(|e| failed(format!("request failed: {}", with_causes(&e))))?;
            let status = resp.status();
            let mut buf = Vec::new();
            while let Some(chunk) = resp
                .chunk()
                .await
                .map_err(|e| failed(format!("reading the answer failed: {}", with_causes(&e))))?
            {
                buf.extend_from_slice(&chunk);
                if buf.len() > self.max_output {
                    return Err(failed(format!(
                        "its answer is larger than {} bytes",
                        self.max_output
                    )));
                }
            }
            if !status.is_success() {
                let text = String::from_utf8_lossy(&buf);
                return Err(failed(format!("answered {status}: {}", text.trim())));
            }
            serde_json::from_slice(&buf).map_err(|e| failed(format!("its answer is not JSON: {e}")))
        };
        tokio::time::timeout_at(deadline, exchange)
            .await
            .map_err(|_| A2aError::Timeout)?
    }
}

/// The URL of a card's JSON-RPC interface of protocol 1.0.
pub fn jsonrpc_endpoint(card: &Value) -> Result<String, String> {
    let interfaces = card
        .get("supportedInterfaces")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let found = interfaces.iter().find(|i| {
        i.get("protocolBinding").and_then(Value::as_str) == Some("JSONRPC")
            && i.get("protocolVersion")
                .and_then(Value::as_str)
                .is_none_or(|v| v.starts_with("1."))
    });
    match found.and_then(|i| i.get("url")).and_then(Value::as_str) {
        Some(url) if url.starts_with("http://") || url.starts_with("https://") => {
            Ok(url.to_owned())
        }
        Some(url) => Err(format!("its JSON-RPC interface `{url}` is not an http URL")),
        None => {
            let version = card
                .get("protocolVersion")
                .and_then(Value::as_str)
                .unwrap_or("unknown");
            Err(format!(
                "its card offers no JSON-RPC interface of A2A {A2A_VERSION} (card protocol \
                 version: {version})"
            ))
        }
    }
}

/// A `SendMessage` result: a message, or a task (wrapped as A2A 1.0 does).
pub fn outcome(result: &Value) -> Result<Outcome, String> {
    if let Some(m) = result.get("message") {
        return answer_text(m.get("parts")).map(Outcome::Answer);
    }
    if let Some(t) = result.get("task") {
        return task_outcome(t);
    }
    Err("the result holds neither a message nor a task".into())
}

/// What a task says: its answer, that it still runs, or why it ended without one.
pub fn task_outcome(task: &Value) -> Result<Outcome, String> {
    let state = task
        .pointer("/status/state")
        .and_then(Value::as_str)
        .unwrap_or("");
    let status_text = || answer_text(task.pointer("/status/message/parts")).ok();
    match state {
        "TASK_STATE_SUBMITTED" | "TASK_STATE_WORKING" => {
            match task.get("id").and_then(Value::as_str) {
                Some(id) if !id.is_empty() => Ok(Outcome::Running(id.to_owned())),
                _ => Err("a running task without an id".into()),
            }
        }
        "TASK_STATE_COMPLETED" => {
            let from_artifacts: Vec<String> = task
                .get("artifacts")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|a| answer_text(a.get("parts")).ok())
                .collect();
            if from_artifacts.is_empty() {
                status_text()
                    .map(Outcome::Answer)
                    .ok_or_else(|| "the task completed without a text answer".to_owned())
            } else {
                Ok(Outcome::Answer(from_artifacts.join("\n")))
            }
        }
        "TASK_STATE_INPUT_REQUIRED" | "TASK_STATE_AUTH_REQUIRED" => Err(format!(
            "the task needs more from its client ({state}), which a node cannot give{}",
            status_text().map(|t| format!(": {t}")).unwrap_or_default()
        )),
        "" => Err("the task has no state".into()),
        other => Err(format!(
            "the task ended {other}{}",
            status_text().map(|t| format!(": {t}")).unwrap_or_default()
        )),
    }
}

/// The text parts of `parts`, joined by newlines (an error when there are none).
fn answer_text(parts: Option<&Value>) -> Result<String, String> {
    let texts: Vec<&str> = parts
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .filter(|t| !t.trim().is_empty())
        .collect();
    if texts.is_empty() {
        Err("the answer has no text part".into())
    } else {
        Ok(texts.join("\n").trim().to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_is_the_cards_json_rpc_interface_of_a2a_1() {
        let card = json!({
            "supportedInterfaces": [
                {"url": "http://h/grpc", "protocolBinding": "GRPC", "protocolVersion": "1.0"},
                {"url": "http://h/v03", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
                {"url": "http://h/a2a", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
            ]
        });
        assert_eq!(jsonrpc_endpoint(&card).unwrap(), "http://h/a2a");
        let old = json!({"url": "http://h/", "protocolVersion": "0.3.0"});
        let e = jsonrpc_endpoint(&old).unwrap_err();
        assert!(
            e.contains("no JSON-RPC interface of A2A 1.0") && e.contains("0.3.0"),
            "{e}"
        );
    }

    #[test]
    fn answers_come_from_messages_artifacts_or_the_status() {
        let m = json!({"message": {"parts": [{"text": "Twelve."}, {"data": {}}]}});
        assert_eq!(outcome(&m).unwrap(), Outcome::Answer("Twelve.".into()));
        let done = json!({"task": {"id": "t1", "status": {"state": "TASK_STATE_COMPLETED"},
            "artifacts": [{"parts": [{"text": "a"}]}, {"parts": [{"text": "b"}]}]}});
        assert_eq!(outcome(&done).unwrap(), Outcome::Answer("a\nb".into()));
        let status_only = json!({"id": "t1", "status": {"state": "TASK_STATE_COMPLETED",
            "message": {"parts": [{"text": "in the status"}]}}});
        assert_eq!(
            task_outcome(&status_only).unwrap(),
            Outcome::Answer("in the status".into())
        );
        let running = json!({"task": {"id": "t9", "status": {"state": "TASK_STATE_WORKING"}}});
        assert_eq!(outcome(&running).unwrap(), Outcome::Running("t9".into()));
        let failed = json!({"id": "t1", "status": {"state": "TASK_STATE_FAILED",
            "message": {"parts": [{"text": "disk full"}]}}});
        assert_eq!(
            task_outcome(&failed).unwrap_err(),
            "the task ended TASK_STATE_FAILED: disk full"
        );
        let input = json!({"id": "t1", "status": {"state": "TASK_STATE_INPUT_REQUIRED"}});
        assert!(task_outcome(&input).unwrap_err().contains("cannot give"));
        assert!(outcome(&json!({"nothing": 1})).is_err());
        let empty = json!({"message": {"parts": [{"text": "  "}]}});
        assert!(outcome(&empty).is_err());
    }
}
