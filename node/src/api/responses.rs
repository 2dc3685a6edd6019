//! `POST /v1/responses`: a stateless subset of OpenAI's Responses API, the interface that
//! newer clients (`client.responses.create`, the OpenAI Agents SDK) use by default.
//!
//! A request is rewritten as a chat completion request and checked by the same code, so
//! sampling, output formats and tool calling behave exactly as in `/v1/chat/completions`.
//! Served: `input` as text or as a list of items (messages whose content is text, and the
//! `function_call` / `function_call_output` items of a tool-calling turn), `instructions`,
//! `max_output_tokens`, `temperature`, `top_p`, `text.format` (`text`, `json_object`, or a
//! `json_schema` enforced token by token), function `tools` with `tool_choice` and
//! `parallel_tool_calls`, and streaming as typed server-sent events.
//!
//! Nothing is stored, so what needs a stored response is refused with a 400 that says so:
//! `previous_response_id`, `conversation`, `store: true`, `background`, and the item
//! references that point into stored conversations. So are hosted tools (web search,
//! file search, ...), non-text input, reasoning options and `include`.

use std::convert::Infallible;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use starling_models::engine::{Completion, FinishReason};

use super::chat::{self, ChatCompletionRequest, Collected, Started};
use super::error::ApiError;
use super::extract::{ApiJson, Documented};
use super::state::AppState;
use super::tools::{Syntax, ToolCall};

/// The request body.
#[derive(Debug, Deserialize)]
pub(crate) struct ResponseRequest {
    model: Option<String>,
    input: Value,
    instructions: Option<String>,
    max_output_tokens: Option<u64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    stream: Option<bool>,
    text: Option<TextOptions>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    store: Option<bool>,
    previous_response_id: Option<String>,
    conversation: Option<Value>,
    background: Option<bool>,
    reasoning: Option<Value>,
    include: Option<Vec<String>>,
    truncation: Option<String>,
    metadata: Option<Map<String, Value>>,
    user: Option<String>,
    /// Accepted as OpenAI's; nothing here depends on them.
    #[allow(dead_code)]
    stream_options: Option<Value>,
    #[allow(dead_code)]
    service_tier: Option<String>,
    #[allow(dead_code)]
    prompt_cache_key: Option<String>,
    #[allow(dead_code)]
    safety_identifier: Option<String>,
}

impl Documented for ResponseRequest {
    const SCHEMA: &'static str = "ResponseRequest";
}

#[derive(Debug, Deserialize)]
struct TextOptions {
    format: Option<Value>,
    /// Accepted; the length of an answer is bounded by `max_output_tokens` only.
    #[allow(dead_code)]
    verbosity: Option<String>,
}

/// What a response repeats of its request.
#[derive(Debug, Clone)]
struct Echoed {
    instructions: Option<String>,
    max_output_tokens: Option<u64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    format: Value,
    tools: Vec<Value>,
    tool_choice: Value,
    parallel_tool_calls: bool,
    metadata: Map<String, Value>,
    user: Option<String>,
}

/// Refuses what needs a stored response, with the reason.
fn stateless(param: &str) -> ApiError {
    ApiError::invalid_param(
        param,
        format!("{param} is not supported: this server stores no responses or conversations; send the whole conversation in `input`"),
    )
}

impl ResponseRequest {
    /// The chat request this one amounts to, and what the response repeats of it.
    fn read(self) -> Result<(ChatCompletionRequest, Echoed), ApiError> {
        if self.previous_response_id.is_some() {
            return Err(stateless("previous_response_id"));
        }
        if self.conversation.as_ref().is_some_and(|c| !c.is_null()) {
            return Err(stateless("conversation"));
        }
        if self.store == Some(true) {
            return Err(ApiError::invalid_param(
                "store",
                "store: true is not supported: this server stores no responses; send store: false or leave it out",
            ));
        }
        if self.background == Some(true) {
            return Err(ApiError::invalid_param(
                "background",
                "background responses are not supported: ask without background, or stream",
            ));
        }
        if self.reasoning.as_ref().is_some_and(|r| !r.is_null()) {
            return Err(ApiError::invalid_param(
                "reasoning",
                "reasoning options are not supported: the model writes its answer without a separate reasoning phase",
            ));
        }
        if let Some(first) = self.include.as_ref().and_then(|i| i.first()) {
            return Err(ApiError::invalid_param(
                "include",
                format!(
                    "include `{first}` is not supported: responses carry their output items only"
                ),
            ));
        }
        if self.truncation.as_deref().is_some_and(|t| t != "disabled") {
            return Err(ApiError::invalid_param(
                "truncation",
                "only truncation \"disabled\" is supported: an input longer than the context is refused, not cut",
            ));
        }
        let mut messages = Vec::new();
        if let Some(i) = &self.instructions {
            messages.push(json!({"role": "system", "content": i}));
        }
        messages.extend(input_messages(self.input)?);
        let format = self
            .text
            .and_then(|t| t.format)
            .filter(|f| !f.is_null())
            .unwrap_or_else(|| json!({"type": "text"}));
        let tools = self.tools.unwrap_or_default();
        let chat_tools = tools
            .iter()
            .enumerate()
            .map(|(i, t)| chat_tool(t, i))
            .collect::<Result<Vec<_>, _>>()?;
        let tool_choice = self.tool_choice.unwrap_or_else(|| json!("auto"));
        let mut req = Map::new();
        let mut put = |k: &str, v: Value| {
            if !v.is_null() {
                req.insert(k.to_owned(), v);
            }
        };
        put("model", json!(self.model));
        put("messages", Value::Array(messages));
        put("max_tokens", json!(self.max_output_tokens));
        put("temperature", json!(self.temperature));
        put("top_p", json!(self.top_p));
        put("stream", json!(self.stream));
        if self.stream == Some(true) {
            put("stream_options", json!({"include_usage": true}));
        }
        let response_format = chat_format(&format)?;
        if response_format["type"] != "text" {
            put("response_format", response_format);
        }
        if !chat_tools.is_empty() {
            put("tools", Value::Array(chat_tools));
            put("tool_choice", chat_tool_choice(&tool_choice)?);
            put("parallel_tool_calls", json!(self.parallel_tool_calls));
        }
        let chat = serde_json::from_value(Value::Object(req))
            .map_err(|e| ApiError::invalid(format!("invalid request: {e}")))?;
        Ok((
            chat,
            Echoed {
                instructions: self.instructions,
                max_output_tokens: self.max_output_tokens,
                temperature: self.temperature,
                top_p: self.top_p,
                format,
                tools,
                tool_choice,
                parallel_tool_calls: self.parallel_tool_calls.unwrap_or(true),
                metadata: self.metadata.unwrap_or_default(),
                user: self.user,
            },
        ))
    }
}

/// The chat messages of `input`: a text is one user message; a list holds messages and
/// the items of a tool-calling turn (consecutive `function_call`s are one assistant turn).
fn input_messages(input: Value) -> Result<Vec<Value>, ApiError> {
    let items = match input {
        Value::String(s) => return Ok(vec![json!({"role": "user", "content": s})]),
        Value::Array(items) if !items.is_empty() => items,
        _ => {
            return Err(ApiError::invalid_param(
                "input",
                "input is a text or a non-empty list of items",
            ))
        }
    };
    let mut out: Vec<Value> = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        let at = format!("input[{i}]");
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        match kind {
            "message" => {
                let role = match item.get("role").and_then(Value::as_str) {
                    Some(r @ ("user" | "assistant" | "system" | "developer")) => r,
                    _ => {
                        return Err(ApiError::invalid_param(
                            format!("{at}.role"),
                            "a message's role is user, assistant, system or developer",
                        ))
                    }
                };
                let content = item.get("content").cloned().unwrap_or(Value::Null);
                out.push(json!({"role": role, "content": content_text(content, &at)?}));
            }
            "function_call" => {
                let field = |k: &str| {
                    item.get(k).and_then(Value::as_str).ok_or_else(|| {
                        ApiError::invalid_param(
                            format!("{at}.{k}"),
                            format!("a function_call item needs `{k}` (a string)"),
                        )
                    })
                };
                let call = json!({"id": field("call_id")?, "type": "function",
                                  "function": {"name": field("name")?, "arguments": field("arguments")?}});
                // Calls made in one turn are one assistant message.
                match out.last_mut() {
                    Some(m) if m["role"] == "assistant" && m["tool_calls"].is_array() => {
                        if let Some(calls) = m["tool_calls"].as_array_mut() {
                            calls.push(call);
                        }
                    }
                    _ => out.push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
                }
            }
            "function_call_output" => {
                let call_id = item.get("call_id").and_then(Value::as_str).ok_or_else(|| {
                    ApiError::invalid_param(
                        format!("{at}.call_id"),
                        "a function_call_output item needs `call_id` (a string)",
                    )
                })?;
                let output = item.get("output").cloned().unwrap_or(Value::Null);
                out.push(json!({"role": "tool", "tool_call_id": call_id,
                                "content": content_text(output, &at)?}));
            }
            "item_reference" => return Err(stateless(&at)),
            other => {
                return Err(ApiError::invalid_param(
                    format!("{at}.type"),
                    format!("input items of type `{other}` are not supported: send messages, function_call and function_call_output items"),
                ))
            }
        }
    }
    Ok(out)
}

/// The text of a message's content: a text, or a list of text parts (joined by newlines).
fn content_text(content: Value, at: &str) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s),
        Value::Array(parts) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let kind = part.get("type").and_then(Value::as_str).unwrap_or_default();
                match (kind, part.get("text").and_then(Value::as_str)) {
                    ("input_text" | "output_text" | "text", Some(t)) => texts.push(t),
                    ("refusal", _) => {}
                    _ => {
                        return Err(ApiError::invalid_param(
                            format!("{at}.content[{j}]"),
                            format!("content parts of type `{kind}` are not supported: only text (input_text, output_text) is"),
                        ))
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        _ => Err(ApiError::invalid_param(
            format!("{at}.content"),
            "content is a text or a list of text parts",
        )),
    }
}

/// The fields `keys` of the object `v` that are set (not null).
fn pick(v: &Value, keys: &[&str]) -> Map<String, Value> {
    keys.iter()
        .filter_map(|&k| Some((k.to_owned(), v.get(k).filter(|v| !v.is_null())?.clone())))
        .collect()
}

/// A Responses function tool as a chat completion tool.
fn chat_tool(tool: &Value, i: usize) -> Result<Value, ApiError> {
    match tool.get("type").and_then(Value::as_str) {
        Some("function") => {
            let function = pick(tool, &["name", "description", "parameters", "strict"]);
            Ok(json!({"type": "function", "function": function}))
        }
        other => Err(ApiError::invalid_param(
            format!("tools[{i}].type"),
            format!(
                "tools of type `{}` are not supported: only function tools are (hosted tools need OpenAI's servers)",
                other.unwrap_or("?")
            ),
        )),
    }
}

/// A Responses `tool_choice` as a chat completion one.
fn chat_tool_choice(choice: &Value) -> Result<Value, ApiError> {
    match choice {
        Value::String(_) => Ok(choice.clone()),
        Value::Object(o) if o.get("type") == Some(&json!("function")) => Ok(
            json!({"type": "function", "function": {"name": o.get("name").cloned().unwrap_or(Value::Null)}}),
        ),
        _ => Err(ApiError::invalid_param(
            "tool_choice",
            "tool_choice is none, auto, required, or {\"type\": \"function\", \"name\": ...}",
        )),
    }
}

/// `text.format` as a chat completion `response_format`.
fn chat_format(format: &Value) -> Result<Value, ApiError> {
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(json!({"type": "text"})),
        Some("json_object") => Ok(json!({"type": "json_object"})),
        Some("json_schema") => {
            let schema = pick(format, &["name", "description", "schema", "strict"]);
            Ok(json!({"type": "json_schema", "json_schema": schema}))
        }
        _ => Err(ApiError::invalid_param(
            "text.format",
            "text.format is {\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": \"json_schema\", \"name\": ..., \"schema\": ...}",
        )),
    }
}

/// A chat check's error in this API's words: `max_tokens` is `max_output_tokens` here,
/// `response_format` is `text.format`, the messages are the `input`.
fn in_our_words(e: ApiError) -> ApiError {
    let renamed = match e.param() {
        Some("max_tokens") => Some("max_output_tokens".to_owned()),
        Some(p) if p.starts_with("response_format") => {
            Some(p.replacen("response_format", "text.format", 1))
        }
        Some(p) if p.starts_with("messages") => Some("input".to_owned()),
        _ => None,
    };
    match renamed {
        Some(p) => e.with_param(p),
        None => e,
    }
}

/// The parts of a response object that do not change while it is written.
#[derive(Clone)]
struct Shell {
    id: String,
    created_at: u64,
    model: String,
    echoed: Echoed,
}

impl Shell {
    /// The response object.
    fn response(&self, status: &str, output: &[Value], usage: Option<&Completion>) -> Value {
        let e = &self.echoed;
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": null,
            "incomplete_details": (status == "incomplete").then(|| json!({"reason": "max_output_tokens"})),
            "instructions": e.instructions,
            "max_output_tokens": e.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": e.parallel_tool_calls,
            "previous_response_id": null,
            "reasoning": null,
            "store": false,
            "temperature": e.temperature,
            "text": {"format": e.format},
            "tool_choice": e.tool_choice,
            "tools": e.tools,
            "top_p": e.top_p,
            "truncation": "disabled",
            "usage": usage.map(response_usage),
            "user": e.user,
            "metadata": e.metadata,
        })
    }
}

/// A response's `usage`.
fn response_usage(done: &Completion) -> Value {
    json!({
        "input_tokens": done.prompt_tokens,
        "input_tokens_details": {"cached_tokens": done.cached_prompt_tokens},
        "output_tokens": done.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": done.prompt_tokens + done.completion_tokens,
    })
}

/// The status of a response that ended for `reason`.
fn status_of(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Length => "incomplete",
        FinishReason::Stop => "completed",
    }
}

fn message_item(id: &str, status: &str, text: &str) -> Value {
    json!({"type": "message", "id": id, "status": status, "role": "assistant",
           "content": [text_part(text)]})
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn call_item(call: &ToolCall, status: &str, arguments: &str) -> Value {
    json!({"type": "function_call", "id": format!("fc_{}", call.id.trim_start_matches("call_")),
           "call_id": call.id, "name": call.name, "arguments": arguments, "status": status})
}

/// The handler.
pub(crate) async fn responses(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<ResponseRequest>,
) -> Result<Response, ApiError> {
    let (chat_req, echoed) = body.read()?;
    let mut plan = chat_req.plan().map_err(in_our_words)?;
    let Started {
        generation,
        run,
        model_id,
        tool_syntax,
        ..
    } = chat::start(&state, &mut plan).await.map_err(in_our_words)?;
    let shell = Shell {
        id: chat::random_id("resp_"),
        created_at: chat::unix_now(),
        model: model_id,
        echoed,
    };
    if !plan.stream {
        let Collected { text, done, .. } = chat::collect(generation, run, &state).await?;
        let status = status_of(done.finish_reason);
        let calls = tool_syntax.and_then(|syntax| syntax.read_calls(&text, chat::call_id));
        let output: Vec<Value> = match calls {
            Some(calls) => calls
                .iter()
                .map(|c| call_item(c, "completed", &c.arguments))
                .collect(),
            None => vec![message_item(&chat::random_id("msg_"), status, &text)],
        };
        return Ok(Json(shell.response(status, &output, Some(&done))).into_response());
    }
    let mut writer = Writer::new(shell, tool_syntax);
    let first = writer.start();
    let pieces = chat::pieces(generation, run, state.shutdown_token().clone());
    let events = futures::stream::iter(first)
        .chain(pieces.flat_map(move |piece| {
            let out = match piece {
                chat::Piece::Text(t) => writer.text(&t),
                chat::Piece::Logprob(_) => Vec::new(),
                chat::Piece::Done(done) => writer.done(&done),
                chat::Piece::Failed(e) => writer.failed(&e),
            };
            futures::stream::iter(out)
        }))
        .map(|v| {
            let kind = v["type"].as_str().unwrap_or_default().to_owned();
            Ok::<_, Infallible>(Event::default().event(kind).data(v.to_string()))
        });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// Writes a streamed response as OpenAI's typed events: `response.created`, then per
/// output item `output_item.added`, its content or arguments as deltas, `output_item.done`,
/// and last `response.completed` (or `.incomplete`, `.failed`) with the whole response.
struct Writer {
    shell: Shell,
    seq: u64,
    /// Finished output items.
    items: Vec<Value>,
    /// The message being written: its id and text so far.
    message: Option<(String, String)>,
    /// Text held back while it may be a tool call (it starts as a call does in the model's
    /// syntax, or is blank yet), and that syntax.
    held: Option<(String, Syntax)>,
}

impl Writer {
    fn new(shell: Shell, tools: Option<Syntax>) -> Self {
        Self {
            shell,
            seq: 0,
            items: Vec::new(),
            message: None,
            held: tools.map(|syntax| (String::new(), syntax)),
        }
    }

    fn event(&mut self, kind: &str, mut body: Value) -> Value {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.seq);
        self.seq += 1;
        body
    }

    fn start(&mut self) -> Vec<Value> {
        let r = self.shell.response("in_progress", &[], None);
        vec![
            self.event("response.created", json!({"response": r})),
            self.event("response.in_progress", json!({"response": r})),
        ]
    }

    fn text(&mut self, t: &str) -> Vec<Value> {
        if let Some((held, syntax)) = self.held.as_mut() {
            held.push_str(t);
            match held.trim_start().chars().next() {
                None => return Vec::new(),
                Some(c) if syntax.opens_call(c) => return Vec::new(),
                Some(_) => {
                    let all = self.held.take().map(|(all, _)| all).unwrap_or_default();
                    return self.write_text(&all);
                }
            }
        }
        self.write_text(t)
    }

    fn write_text(&mut self, t: &str) -> Vec<Value> {
        let mut out = Vec::new();
        if self.message.is_none() {
            let id = chat::random_id("msg_");
            let index = self.items.len();
            out.push(self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": {"type": "message", "id": id,
                       "status": "in_progress", "role": "assistant", "content": []}}),
            ));
            out.push(self.event(
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0, "part": text_part("")}),
            ));
            self.message = Some((id, String::new()));
        }
        if !t.is_empty() {
            let index = self.items.len();
            let id = match self.message.as_mut() {
                Some((id, text)) => {
                    text.push_str(t);
                    id.clone()
                }
                None => String::new(),
            };
            out.push(self.event(
                "response.output_text.delta",
                json!({"item_id": id, "output_index": index, "content_index": 0, "delta": t, "logprobs": []}),
            ));
        }
        out
    }

    fn close_message(&mut self, status: &str) -> Vec<Value> {
        let Some((id, text)) = self.message.take() else {
            return Vec::new();
        };
        let index = self.items.len();
        let item = message_item(&id, status, &text);
        let out = vec![
            self.event(
                "response.output_text.done",
                json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
            ),
            self.event(
                "response.content_part.done",
                json!({"item_id": id, "output_index": index, "content_index": 0, "part": text_part(&text)}),
            ),
            self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            ),
        ];
        self.items.push(item);
        out
    }

    fn write_call(&mut self, call: &ToolCall) -> Vec<Value> {
        let index = self.items.len();
        let item = call_item(call, "completed", &call.arguments);
        let id = item["id"].clone();
        let out = vec![
            self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": call_item(call, "in_progress", "")}),
            ),
            self.event(
                "response.function_call_arguments.delta",
                json!({"item_id": id, "output_index": index, "delta": call.arguments}),
            ),
            self.event(
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": index, "name": call.name, "arguments": call.arguments}),
            ),
            self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            ),
        ];
        self.items.push(item);
        out
    }

    fn done(&mut self, done: &Completion) -> Vec<Value> {
        let status = status_of(done.finish_reason);
        let mut out = Vec::new();
        if let Some((held, syntax)) = self.held.take() {
            match syntax.read_calls(&held, chat::call_id) {
                Some(calls) => {
                    for c in &calls {
                        out.extend(self.write_call(c));
                    }
                }
                // Cut short before the call was whole, or blank: it is text.
                None => out.extend(self.write_text(&held)),
            }
        }
        if self.items.is_empty() && self.message.is_none() {
            out.extend(self.write_text(""));
        }
        out.extend(self.close_message(status));
        let r = self.shell.response(status, &self.items, Some(done));
        let kind = match status {
            "incomplete" => "response.incomplete",
            _ => "response.completed",
        };
        out.push(self.event(kind, json!({"response": r})));
        out
    }

    fn failed(&mut self, e: &ApiError) -> Vec<Value> {
        let mut r = self.shell.response("failed", &self.items, None);
        r["error"] = json!({"code": "server_error", "message": e.message()});
        vec![self.event("response.failed", json!({"response": r}))]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(v: Value) -> Result<(ChatCompletionRequest, Echoed), ApiError> {
        serde_json::from_value::<ResponseRequest>(v)
            .expect("shape")
            .read()
    }

    #[test]
    fn input_items_become_chat_messages_with_tool_turns_merged() {
        let msgs = input_messages(json!([
            {"role": "developer", "content": "Be brief."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather"}, {"type": "input_text", "text": "in Oslo?"}]},
            {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": "{\"city\":\"Oslo\"}"},
            {"type": "function_call", "call_id": "call_2", "name": "time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "4 C"},
            {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "noon"}]},
        ]))
        .expect("valid");
        assert_eq!(msgs.len(), 5);
        assert_eq!(msgs[1]["content"], "Weather\nin Oslo?");
        assert_eq!(msgs[2]["role"], "assistant");
        assert_eq!(msgs[2]["tool_calls"].as_array().map(Vec::len), Some(2));
        assert_eq!(msgs[2]["tool_calls"][1]["function"]["name"], "time");
        assert_eq!(
            msgs[3],
            json!({"role": "tool", "tool_call_id": "call_1", "content": "4 C"})
        );
        assert_eq!(msgs[4]["content"], "noon");
        assert_eq!(
            input_messages(json!("hi")).expect("text"),
            [json!({"role": "user", "content": "hi"})]
        );
    }

    #[test]
    fn what_needs_storage_or_openai_servers_is_refused_by_name() {
        let param = |v: Value| read(v).err().and_then(|e| e.param().map(str::to_owned));
        let cases = [
            (
                json!({"input": "x", "previous_response_id": "resp_1"}),
                "previous_response_id",
            ),
            (json!({"input": "x", "store": true}), "store"),
            (json!({"input": "x", "background": true}), "background"),
            (
                json!({"input": "x", "reasoning": {"effort": "low"}}),
                "reasoning",
            ),
            (
                json!({"input": "x", "include": ["reasoning.encrypted_content"]}),
                "include",
            ),
            (json!({"input": "x", "truncation": "auto"}), "truncation"),
            (
                json!({"input": "x", "tools": [{"type": "web_search"}]}),
                "tools[0].type",
            ),
            (
                json!({"input": [{"type": "item_reference", "id": "msg_1"}]}),
                "input[0]",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
                "input[0].content[0]",
            ),
            (
                json!({"input": [{"role": "tool", "content": "x"}]}),
                "input[0].role",
            ),
            (json!({"input": []}), "input"),
            (
                json!({"input": "x", "text": {"format": {"type": "grammar"}}}),
                "text.format",
            ),
        ];
        for (body, expected) in cases {
            assert_eq!(param(body.clone()).as_deref(), Some(expected), "{body}");
        }
        assert!(read(
            json!({"input": "x", "store": false, "reasoning": null, "truncation": "disabled"})
        )
        .is_ok());
    }

    #[test]
    fn formats_and_tools_map_onto_the_chat_request_and_its_checks() {
        let (chat, echoed) = read(json!({
            "input": "x", "instructions": "Answer in JSON.", "max_output_tokens": 30,
            "text": {"format": {"type": "json_schema", "name": "city", "schema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}, "strict": true}},
        }))
        .expect("valid");
        assert_eq!(echoed.format["name"], "city");
        let plan = chat.plan().expect("the chat checks pass");
        assert_eq!(plan.max_tokens, Some(30));
        assert_eq!(plan.messages[0].role, "system");
        assert!(matches!(
            plan.format,
            super::chat::OutputFormat::JsonSchema(_)
        ));
        let (chat, _) = read(json!({
            "input": "x",
            "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": {"type": "function", "name": "weather"},
        }))
        .expect("valid");
        assert!(chat.plan().expect("the chat checks pass").tools.is_some());
        let (chat, _) = read(json!({"input": "x", "temperature": 9})).expect("read");
        assert!(chat.plan().is_err(), "temperature 9 is refused as in chat");
        let e = in_our_words(ApiError::invalid_param("max_tokens", "bad"));
        assert_eq!(e.param(), Some("max_output_tokens"));
    }

    fn shell() -> Shell {
        let (_, echoed) = read(json!({"input": "x"})).expect("valid");
        Shell {
            id: "resp_1".into(),
            created_at: 0,
            model: "m".into(),
            echoed,
        }
    }

    fn done(reason: FinishReason) -> Completion {
        Completion {
            finish_reason: reason,
            prompt_tokens: 7,
            cached_prompt_tokens: 0,
            completion_tokens: 3,
            prompt_ms: 1.0,
            generation_ms: 1.0,
        }
    }

    #[test]
    fn a_streamed_answer_is_a_whole_sequence_of_typed_events() {
        let mut w = Writer::new(shell(), None);
        let mut events = w.start();
        events.extend(w.text("Hel"));
        events.extend(w.text("lo"));
        events.extend(w.done(&done(FinishReason::Stop)));
        let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let seq: Vec<u64> = events
            .iter()
            .filter_map(|e| e["sequence_number"].as_u64())
            .collect();
        assert_eq!(seq, (0..10).collect::<Vec<_>>());
        let last = &events[9]["response"];
        assert_eq!(last["output"][0]["content"][0]["text"], "Hello");
        assert_eq!(last["usage"]["total_tokens"], 10);
        assert_eq!(last["status"], "completed");
    }

    #[test]
    fn a_streamed_tool_call_is_held_and_sent_as_a_function_call_item() {
        let mut w = Writer::new(shell(), Some(Syntax::Generic));
        let mut events = w.start();
        events.extend(w.text(" {\"tool_calls\": [{\"name\": \"weather\", "));
        assert_eq!(events.len(), 2, "a call is held until it is whole");
        events.extend(w.text("\"arguments\": {\"city\": \"Oslo\"}}]}"));
        events.extend(w.done(&done(FinishReason::Stop)));
        let last = &events[events.len() - 1]["response"];
        assert_eq!(last["output"][0]["type"], "function_call");
        assert_eq!(last["output"][0]["name"], "weather");
        assert_eq!(last["output"][0]["arguments"], "{\"city\":\"Oslo\"}");
        assert!(events
            .iter()
            .any(|e| e["type"] == "response.function_call_arguments.done"));
        // Text that is no call is streamed as soon as that is clear.
        let mut w = Writer::new(shell(), Some(Syntax::Generic));
        assert!(w.text("  ").is_empty());
        let out = w.text("Hi");
        assert_eq!(out.last().map(|e| e["delta"].clone()), Some(json!("  Hi")));
    }

    #[test]
    fn a_response_cut_by_max_output_tokens_is_incomplete() {
        let mut w = Writer::new(shell(), None);
        w.start();
        w.text("abc");
        let out = w.done(&done(FinishReason::Length));
        let last = out.last().expect("events");
        assert_eq!(last["type"], "response.incomplete");
        assert_eq!(
            last["response"]["incomplete_details"]["reason"],
            "max_output_tokens"
        );
        assert_eq!(last["response"]["output"][0]["status"], "incomplete");
    }
}
