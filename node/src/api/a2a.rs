//! A2A (the Agent2Agent protocol, version 1.0, JSON-RPC binding): any A2A client can give
//! this node a task and get the swarm's answer.
//!
//! - `GET /.well-known/agent-card.json`: the node's agent card in A2A's shape, its one
//!   interface being `POST /a2a`.
//! - `POST /a2a`: JSON-RPC 2.0 with `SendMessage`, `SendStreamingMessage`, `GetTask` and
//!   `CancelTask`. An A2A task is a Starling task (its id is the group id, so
//!   `GET /api/tasks/{id}` shows it too), run by the node's [`super::tasks::TaskRunner`]:
//!   it goes on when the client disconnects and `CancelTask` stops it. The answer comes as
//!   an artifact with two parts: the answer with its sources as text, and the task result
//!   (answer, status, citations, members) as data.
//!
//! Bodies follow the protobuf JSON mapping of A2A 1.0 (camelCase fields, enum names such
//! as `TASK_STATE_COMPLETED`). JSON-RPC errors are answered with HTTP 200, as JSON-RPC over
//! HTTP does, with A2A's codes (-32001 task not found, -32002 not cancelable, -32004
//! unsupported, -32005 content type not supported). Not served: push notifications,
//! `ListTasks`, `SubscribeToTask`, the extended card, and A2A 0.3's method names.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::Mutex;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::extract::json_body;
use super::node::NodeApi;
use super::tasks::{Cancel, TaskState, TaskView};
use crate::agent::runtime::{new_group_id, TaskResult};

/// The A2A protocol version served.
pub const PROTOCOL_VERSION: &str = "1.0";
/// Where the JSON-RPC endpoint is.
pub const RPC_PATH: &str = "/a2a";
/// Longest task text, as `POST /api/tasks` takes it.
const MAX_TASK_CHARS: usize = 4000;
/// How many A2A tasks' contexts and messages are remembered for `GetTask`.
const REMEMBERED: usize = 1000;

// JSON-RPC and A2A error codes.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const TASK_NOT_FOUND: i64 = -32001;
const TASK_NOT_CANCELABLE: i64 = -32002;
const PUSH_NOT_SUPPORTED: i64 = -32003;
const UNSUPPORTED_OPERATION: i64 = -32004;
const CONTENT_TYPE_NOT_SUPPORTED: i64 = -32005;

/// What A2A knows of a task beyond Starling's own record: its context and the message
/// that started it.
#[derive(Debug, Default)]
pub struct A2aTasks {
    inner: Mutex<(HashMap<String, Origin>, VecDeque<String>)>,
}

#[derive(Debug, Clone)]
struct Origin {
    context_id: String,
    message: Value,
}

impl A2aTasks {
    fn remember(&self, task_id: &str, origin: Origin) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (map, order) = &mut *g;
        if map.insert(task_id.to_owned(), origin).is_none() {
            order.push_back(task_id.to_owned());
        }
        while order.len() > REMEMBERED {
            if let Some(old) = order.pop_front() {
                map.remove(&old);
            }
        }
    }

    fn origin(&self, task_id: &str) -> Option<Origin> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.0.get(task_id).cloned()
    }
}

/// `GET /.well-known/agent-card.json`.
pub async fn card(State(s): State<NodeApi>, headers: HeaderMap) -> Json<Value> {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| !h.is_empty())
        .map_or_else(|| s.node.api_addr.to_string(), str::to_owned);
    let me = s.node.agent.node_id().to_owned();
    let own = s
        .node
        .agent
        .known_cards()
        .into_iter()
        .find(|k| k.node_id == me)
        .map(|k| k.card);
    let name = own
        .as_ref()
        .map_or_else(|| s.node.swarm.name().to_owned(), |c| c.name.clone());
    let description = own
        .as_ref()
        .map_or_else(String::new, |c| c.description.clone());
    let tags = own.as_ref().map_or_else(Vec::new, |c| c.skills.clone());
    Json(json!({
        "name": name,
        "description": format!(
            "{description} A Starling node: it answers with the agents of its swarm, every \
             fact copied from a cited document."
        ).trim().to_owned(),
        "supportedInterfaces": [{
            "url": format!("http://{host}{RPC_PATH}"),
            "protocolBinding": "JSONRPC",
            "protocolVersion": PROTOCOL_VERSION,
        }],
        "version": env!("CARGO_PKG_VERSION"),
        "capabilities": {"streaming": true, "pushNotifications": false},
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain", "application/json"],
        "skills": [{
            "id": "ask-swarm",
            "name": "Answer from the swarm",
            "description": "Answers a question with the agents of the swarm whose cards fit; \
                            the answer copies each fact from cited evidence (node, document, \
                            quote) or says which parts nobody knows.",
            "tags": tags,
            "examples": ["At what temperature do moonflower seeds germinate best?"],
        }],
    }))
}

/// A JSON-RPC request, checked by hand so that every malformed one gets a JSON-RPC error.
struct RpcRequest {
    id: Value,
    method: String,
    params: Value,
}

struct RpcError {
    code: i64,
    message: String,
}

impl RpcError {
    fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

fn rpc_error(id: &Value, e: RpcError) -> Response {
    Json(json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": e.code, "message": e.message},
    }))
    .into_response()
}

fn rpc_result(id: &Value, result: Value) -> Response {
    Json(json!({"jsonrpc": "2.0", "id": id, "result": result})).into_response()
}

fn parse_request(body: &[u8]) -> Result<RpcRequest, (Value, RpcError)> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        (
            Value::Null,
            RpcError::new(PARSE_ERROR, format!("the body is not JSON: {e}")),
        )
    })?;
    let Some(obj) = v.as_object() else {
        return Err((
            Value::Null,
            RpcError::new(
                INVALID_REQUEST,
                "a JSON-RPC request is an object (batches are not served)",
            ),
        ));
    };
    let id = match obj.get("id") {
        Some(id @ (Value::String(_) | Value::Number(_) | Value::Null)) => id.clone(),
        Some(_) => {
            return Err((
                Value::Null,
                RpcError::new(INVALID_REQUEST, "`id` must be a string, a number or null"),
            ))
        }
        None => {
            return Err((
                Value::Null,
                RpcError::new(
                    INVALID_REQUEST,
                    "`id` is missing (notifications are not served)",
                ),
            ))
        }
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err((
            id,
            RpcError::new(INVALID_REQUEST, "`jsonrpc` must be \"2.0\""),
        ));
    }
    let Some(method) = obj.get("method").and_then(Value::as_str) else {
        return Err((
            id,
            RpcError::new(INVALID_REQUEST, "`method` must be a string"),
        ));
    };
    let params = obj.get("params").cloned().unwrap_or_else(|| json!({}));
    if !params.is_object() {
        return Err((
            id,
            RpcError::new(INVALID_PARAMS, "`params` must be an object"),
        ));
    }
    Ok(RpcRequest {
        id,
        method: method.to_owned(),
        params,
    })
}

fn params<T: serde::de::DeserializeOwned>(p: Value) -> Result<T, RpcError> {
    serde_path_to_error::deserialize(p).map_err(|e| {
        let at = e.path().to_string();
        RpcError::new(INVALID_PARAMS, format!("params.{at}: {}", e.into_inner()))
    })
}

/// `POST /a2a`. The body must be declared as JSON (415 otherwise, as on every route: a web
/// page cannot post it without a CORS preflight); everything after that is JSON-RPC.
pub async fn rpc(State(s): State<NodeApi>, req: Request) -> Response {
    let body = match json_body(req, &()).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let req = match parse_request(&body) {
        Ok(r) => r,
        Err((id, e)) => return rpc_error(&id, e),
    };
    let id = req.id.clone();
    let outcome = match req.method.as_str() {
        "SendMessage" => send_message(&s, req.params).await,
        "SendStreamingMessage" => match start_message(&s, req.params) {
            Ok(started) => {
                let view = s.tasks.get(&started.task_id);
                return stream(started, view, id);
            }
            Err(e) => Err(e),
        },
        "GetTask" => get_task(&s, req.params),
        "CancelTask" => cancel_task(&s, req.params),
        "CreateTaskPushNotificationConfig"
        | "GetTaskPushNotificationConfig"
        | "ListTaskPushNotificationConfigs"
        | "DeleteTaskPushNotificationConfig" => Err(RpcError::new(
            PUSH_NOT_SUPPORTED,
            "push notifications are not supported; poll GetTask or use SendStreamingMessage",
        )),
        "ListTasks" | "SubscribeToTask" | "GetExtendedAgentCard" => Err(RpcError::new(
            UNSUPPORTED_OPERATION,
            format!("`{}` is not supported by this node", req.method),
        )),
        m @ ("message/send" | "message/stream" | "tasks/get" | "tasks/cancel") => {
            Err(RpcError::new(
                METHOD_NOT_FOUND,
                format!(
                    "`{m}` is A2A 0.3; this node speaks A2A {PROTOCOL_VERSION} (SendMessage, \
                     SendStreamingMessage, GetTask, CancelTask)"
                ),
            ))
        }
        m => Err(RpcError::new(METHOD_NOT_FOUND, format!("no method `{m}`"))),
    };
    match outcome {
        Ok(v) => rpc_result(&id, v),
        Err(e) => rpc_error(&id, e),
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SendParams {
    message: InMessage,
    #[serde(default)]
    configuration: Option<SendConfiguration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SendConfiguration {
    #[serde(default)]
    return_immediately: bool,
    #[serde(default)]
    history_length: Option<i64>,
    #[serde(default)]
    task_push_notification_config: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct InMessage {
    #[serde(default)]
    message_id: String,
    #[serde(default)]
    context_id: Option<String>,
    #[serde(default)]
    task_id: Option<String>,
    #[serde(default)]
    role: Option<String>,
    parts: Vec<InPart>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct InPart {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    raw: Option<Value>,
    #[serde(default)]
    url: Option<Value>,
    #[serde(default)]
    data: Option<Value>,
}

/// A task the node has started for an A2A message.
struct Started {
    task_id: String,
    origin: Origin,
    history_length: Option<i64>,
    return_immediately: bool,
    done: oneshot::Receiver<Result<TaskResult, String>>,
}

/// Checks an A2A message and starts its task on the node's task runner.
fn start_message(s: &NodeApi, p: Value) -> Result<Started, RpcError> {
    let p: SendParams = params(p)?;
    let config = p.configuration.unwrap_or_default();
    if config.task_push_notification_config.is_some() {
        return Err(RpcError::new(
            PUSH_NOT_SUPPORTED,
            "push notifications are not supported; poll GetTask or use SendStreamingMessage",
        ));
    }
    let m = p.message;
    if m.message_id.trim().is_empty() {
        return Err(RpcError::new(
            INVALID_PARAMS,
            "params.message.messageId is required",
        ));
    }
    if let Some(role) = m.role.as_deref() {
        if !matches!(role, "ROLE_USER" | "ROLE_UNSPECIFIED") {
            return Err(RpcError::new(
                INVALID_PARAMS,
                format!("params.message.role must be ROLE_USER, not {role}"),
            ));
        }
    }
    if let Some(t) = m.task_id.as_deref().filter(|t| !t.is_empty()) {
        return Err(if known(s, t) {
            RpcError::new(
                UNSUPPORTED_OPERATION,
                format!(
                    "task `{t}` takes no further messages: a Starling task ends with its answer. \
                     Send a new message without taskId (the same contextId groups them)"
                ),
            )
        } else {
            RpcError::new(TASK_NOT_FOUND, format!("no task `{t}` on this node"))
        });
    }
    let mut texts = Vec::new();
    for (i, part) in m.parts.iter().enumerate() {
        match part {
            InPart { text: Some(t), .. } => texts.push(t.as_str()),
            InPart { raw: Some(_), .. } | InPart { url: Some(_), .. } => {
                return Err(RpcError::new(
                    CONTENT_TYPE_NOT_SUPPORTED,
                    format!(
                        "params.message.parts[{i}] is a file; this agent reads text parts only"
                    ),
                ))
            }
            InPart { data: Some(_), .. } => {
                return Err(RpcError::new(
                    CONTENT_TYPE_NOT_SUPPORTED,
                    format!("params.message.parts[{i}] is data; this agent reads text parts only"),
                ))
            }
            _ => {
                return Err(RpcError::new(
                    INVALID_PARAMS,
                    format!("params.message.parts[{i}] has no content"),
                ))
            }
        }
    }
    let task = texts.join("\n").trim().to_owned();
    if task.is_empty() {
        return Err(RpcError::new(INVALID_PARAMS, "the message has no text"));
    }
    if task.chars().count() > MAX_TASK_CHARS {
        return Err(RpcError::new(
            INVALID_PARAMS,
            format!("the message is longer than {MAX_TASK_CHARS} characters"),
        ));
    }
    let task_id = new_group_id();
    let context_id = m
        .context_id
        .filter(|c| !c.trim().is_empty())
        .unwrap_or_else(|| format!("ctx-{task_id}"));
    let message = json!({
        "messageId": m.message_id,
        "contextId": context_id,
        "taskId": task_id,
        "role": "ROLE_USER",
        "parts": [{"text": task}],
    });
    let origin = Origin {
        context_id,
        message,
    };
    s.a2a.remember(&task_id, origin.clone());
    let (tx, done) = oneshot::channel();
    let agent = s.node.agent.clone();
    let (gid, text) = (task_id.clone(), task.clone());
    s.tasks.spawn(&task_id, &task, async move {
        let r = agent.submit_as(&text, gid).await.map_err(|e| e.to_string());
        let outcome = r.as_ref().map(|_| ()).map_err(Clone::clone);
        let _ = tx.send(r);
        outcome
    });
    Ok(Started {
        task_id,
        origin,
        history_length: config.history_length,
        return_immediately: config.return_immediately,
        done,
    })
}

async fn send_message(s: &NodeApi, p: Value) -> Result<Value, RpcError> {
    let started = start_message(s, p)?;
    if started.return_immediately {
        let view = s.tasks.get(&started.task_id);
        return Ok(json!({"task": task_json(
            &started.task_id,
            &started.origin,
            view.as_ref(),
            None,
            started.history_length,
        )}));
    }
    let id = started.task_id.clone();
    let result = started.done.await.ok().and_then(Result::ok);
    let view = s.tasks.get(&id);
    Ok(json!({"task": task_json(
        &id,
        &started.origin,
        view.as_ref(),
        result.as_ref(),
        started.history_length,
    )}))
}

/// `SendStreamingMessage`: the task as it starts, then its artifact and final status.
fn stream(started: Started, view: Option<TaskView>, id: Value) -> Response {
    let Started {
        task_id,
        origin,
        history_length,
        done,
        ..
    } = started;
    let first = json!({"task": task_json(&task_id, &origin, view.as_ref(), None, history_length)});
    let events = async_stream_events(id, task_id, origin, first, done);
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

fn async_stream_events(
    id: Value,
    task_id: String,
    origin: Origin,
    first: Value,
    done: oneshot::Receiver<Result<TaskResult, String>>,
) -> impl futures::Stream<Item = Result<Event, Infallible>> {
    let frame = move |id: &Value, result: Value| {
        Ok::<_, Infallible>(
            Event::default()
                .data(json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string()),
        )
    };
    let head = futures::stream::iter([frame(&id, first)]);
    let tail = futures::stream::once(async move {
        let outcome = done.await;
        let mut out = Vec::new();
        let (state, message) = match &outcome {
            Ok(Ok(r)) => {
                out.push(frame(
                    &id,
                    json!({"artifactUpdate": {
                        "taskId": task_id,
                        "contextId": origin.context_id,
                        "artifact": artifact(r),
                        "lastChunk": true,
                    }}),
                ));
                (
                    "TASK_STATE_COMPLETED",
                    agent_message(&task_id, &origin.context_id, &r.answer),
                )
            }
            Ok(Err(e)) => (
                "TASK_STATE_FAILED",
                agent_message(
                    &task_id,
                    &origin.context_id,
                    &format!("the task failed: {e}"),
                ),
            ),
            Err(_) => (
                "TASK_STATE_CANCELED",
                agent_message(&task_id, &origin.context_id, "the task was cancelled"),
            ),
        };
        out.push(frame(
            &id,
            json!({"statusUpdate": {
                "taskId": task_id,
                "contextId": origin.context_id,
                "status": {"state": state, "message": message, "timestamp": now()},
            }}),
        ));
        futures::stream::iter(out)
    });
    futures::StreamExt::chain(head, futures::StreamExt::flatten(tail))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct TaskIdParams {
    id: String,
    #[serde(default)]
    history_length: Option<i64>,
}

fn known(s: &NodeApi, id: &str) -> bool {
    s.tasks.get(id).is_some() || s.node.agent.task_result(id).is_some()
}

fn get_task(s: &NodeApi, p: Value) -> Result<Value, RpcError> {
    let p: TaskIdParams = params(p)?;
    if matches!(p.history_length, Some(n) if n < 0) {
        return Err(RpcError::new(
            INVALID_PARAMS,
            "params.historyLength must not be negative",
        ));
    }
    let result = s.node.agent.task_result(&p.id);
    let view = s.tasks.get(&p.id);
    if result.is_none() && view.is_none() {
        return Err(RpcError::new(
            TASK_NOT_FOUND,
            format!("no task `{}` on this node", p.id),
        ));
    }
    let origin = origin_of(s, &p.id, view.as_ref());
    Ok(task_json(
        &p.id,
        &origin,
        view.as_ref(),
        result.as_ref(),
        p.history_length,
    ))
}

fn cancel_task(s: &NodeApi, p: Value) -> Result<Value, RpcError> {
    let p: TaskIdParams = params(p)?;
    match s.tasks.cancel(&p.id) {
        Cancel::Cancelled | Cancel::Ended(TaskState::Cancelled) => {
            let view = s.tasks.get(&p.id);
            let origin = origin_of(s, &p.id, view.as_ref());
            Ok(task_json(&p.id, &origin, view.as_ref(), None, None))
        }
        Cancel::Ended(_) => Err(RpcError::new(
            TASK_NOT_CANCELABLE,
            format!("task `{}` has already ended", p.id),
        )),
        Cancel::Unknown if s.node.agent.task_result(&p.id).is_some() => Err(RpcError::new(
            TASK_NOT_CANCELABLE,
            format!("task `{}` has already ended", p.id),
        )),
        Cancel::Unknown => Err(RpcError::new(
            TASK_NOT_FOUND,
            format!("no task `{}` on this node", p.id),
        )),
    }
}

/// A task's origin: remembered for A2A tasks, made up for others (submitted through
/// `POST /api/tasks`), whose context is their own id.
fn origin_of(s: &NodeApi, id: &str, view: Option<&TaskView>) -> Origin {
    s.a2a.origin(id).unwrap_or_else(|| {
        let context_id = format!("ctx-{id}");
        let text = view.map(|v| v.task.clone()).unwrap_or_default();
        Origin {
            message: json!({
                "messageId": format!("m-{id}"),
                "contextId": context_id,
                "taskId": id,
                "role": "ROLE_USER",
                "parts": [{"text": text}],
            }),
            context_id,
        }
    })
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn agent_message(task_id: &str, context_id: &str, text: &str) -> Value {
    json!({
        "messageId": format!("answer-{task_id}"),
        "contextId": context_id,
        "taskId": task_id,
        "role": "ROLE_AGENT",
        "parts": [{"text": text}],
    })
}

/// The answer as an A2A artifact: text with sources, and the whole result as data.
fn artifact(r: &TaskResult) -> Value {
    let text = r.answer_with_sources();
    json!({
        "artifactId": "answer",
        "name": "answer",
        "description": "The swarm's answer; every fact is copied from a cited source.",
        "parts": [
            {"text": text, "mediaType": "text/plain"},
            {"data": {
                "answer": r.answer,
                "status": r.status,
                "citations": r.citations,
                "members": r.members,
            }, "mediaType": "application/json"},
        ],
    })
}

/// A task in A2A's shape from what the node knows of it.
fn task_json(
    id: &str,
    origin: &Origin,
    view: Option<&TaskView>,
    result: Option<&TaskResult>,
    history_length: Option<i64>,
) -> Value {
    let (state, message) = match (result, view.map(|v| v.state)) {
        (Some(r), _) => (
            "TASK_STATE_COMPLETED",
            Some(agent_message(id, &origin.context_id, &r.answer)),
        ),
        (None, Some(TaskState::Running)) => ("TASK_STATE_WORKING", None),
        (None, Some(TaskState::Cancelled)) => (
            "TASK_STATE_CANCELED",
            Some(agent_message(
                id,
                &origin.context_id,
                "the task was cancelled",
            )),
        ),
        (None, Some(TaskState::Failed)) => {
            let why = view
                .and_then(|v| v.error.clone())
                .unwrap_or_else(|| "no reason given".into());
            (
                "TASK_STATE_FAILED",
                Some(agent_message(
                    id,
                    &origin.context_id,
                    &format!("the task failed: {why}"),
                )),
            )
        }
        // Done, but its result is no longer kept.
        (None, Some(TaskState::Done) | None) => (
            "TASK_STATE_COMPLETED",
            Some(agent_message(
                id,
                &origin.context_id,
                "the task is done; its result is no longer kept on this node",
            )),
        ),
    };
    let mut history = vec![origin.message.clone()];
    history.extend(message.clone());
    if let Some(n) = history_length {
        let n = usize::try_from(n.max(0)).unwrap_or(0);
        let skip = history.len().saturating_sub(n);
        history.drain(..skip);
    }
    let mut status = json!({"state": state, "timestamp": now()});
    if let Some(m) = message {
        status["message"] = m;
    }
    let mut task = json!({
        "id": id,
        "contextId": origin.context_id,
        "status": status,
        "history": history,
    });
    if let Some(r) = result {
        task["artifacts"] = json!([artifact(r)]);
    }
    task
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err_of(body: &str) -> i64 {
        match parse_request(body.as_bytes()) {
            Ok(_) => 0,
            Err((_, e)) => e.code,
        }
    }

    #[test]
    fn malformed_requests_get_json_rpc_codes() {
        assert_eq!(err_of("not json"), PARSE_ERROR);
        assert_eq!(err_of("[1, 2]"), INVALID_REQUEST);
        assert_eq!(
            err_of(r#"{"jsonrpc": "2.0", "method": "GetTask"}"#),
            INVALID_REQUEST
        );
        assert_eq!(
            err_of(r#"{"jsonrpc": "1.0", "id": 1, "method": "GetTask"}"#),
            INVALID_REQUEST
        );
        assert_eq!(
            err_of(r#"{"jsonrpc": "2.0", "id": {}, "method": "GetTask"}"#),
            INVALID_REQUEST
        );
        assert_eq!(
            err_of(r#"{"jsonrpc": "2.0", "id": 1, "method": 5}"#),
            INVALID_REQUEST
        );
        assert_eq!(
            err_of(r#"{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": [1]}"#),
            INVALID_PARAMS
        );
        assert_eq!(
            err_of(r#"{"jsonrpc": "2.0", "id": "a", "method": "GetTask"}"#),
            0
        );
    }

    #[test]
    fn history_keeps_the_last_messages_asked_for() {
        let origin = Origin {
            context_id: "c".into(),
            message: json!({"messageId": "m1"}),
        };
        let view = TaskView {
            group_id: "g".into(),
            task: "t".into(),
            state: TaskState::Failed,
            submitted_at: 0,
            ended_at: Some(1),
            error: Some("boom".into()),
        };
        let t = task_json("g", &origin, Some(&view), None, None);
        assert_eq!(t["status"]["state"], "TASK_STATE_FAILED");
        assert_eq!(t["history"].as_array().map(Vec::len), Some(2));
        assert!(t["status"]["message"]["parts"][0]["text"]
            .as_str()
            .is_some_and(|s| s.contains("boom")));
        let t = task_json("g", &origin, Some(&view), None, Some(1));
        assert_eq!(t["history"][0]["role"], "ROLE_AGENT");
        let t = task_json("g", &origin, Some(&view), None, Some(0));
        assert_eq!(t["history"], json!([]));
        assert!(t.get("artifacts").is_none());
    }
}
