//! `POST /v1/chat/completions`: OpenAI's chat completions, whole or streamed as server-sent
//! events.

use std::convert::Infallible;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::Stream;
use rand::distributions::Alphanumeric;
use rand::Rng;
use serde::Deserialize;
use serde_json::{json, Value};
use starling_models::chat::ChatMessage;
use starling_models::constraint::{Constraint, ConstraintError};
use starling_models::engine::{
    Chunk, Completion, Engine, FinishReason, GenerateRequest, Generation, Prompt, TokenLogprob,
    TokenProb, MAX_TOP_LOGPROBS,
};
use starling_models::sampling::SamplingOptions;
use starling_models::ModelError;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use super::error::ApiError;
use super::extract::{ApiJson, Documented};
use super::state::{AppState, MemoryExamples, Metrics};
use super::tools::{self, Syntax, ToolPlan};
use crate::memory::DEFAULT_DOMAIN;

/// Most stop sequences in one request.
const MAX_STOP: usize = 16;
/// Most messages in one request.
const MAX_MESSAGES: usize = 4096;
/// Most choices (`n`) in one request: each is a generation of its own.
pub(crate) const MAX_CHOICES: u64 = 8;

/// The request body. Fields OpenAI defines that change nothing here (`user`, `metadata`,
/// `store`, ...) are accepted and ignored; fields whose meaning this server cannot honour
/// are refused with 400 rather than silently dropped.
#[derive(Debug, Deserialize)]
pub(crate) struct ChatCompletionRequest {
    model: Option<String>,
    messages: Vec<MessageIn>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    /// Extension (llama.cpp's name): keep the k most likely tokens.
    top_k: Option<u64>,
    /// Extension: drop tokens less likely than `min_p` times the best one.
    min_p: Option<f64>,
    /// Extension: repetition penalty (1 = off).
    repeat_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    presence_penalty: Option<f64>,
    seed: Option<i64>,
    stop: Option<Value>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    n: Option<u64>,
    response_format: Option<Value>,
    logprobs: Option<bool>,
    top_logprobs: Option<u64>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
}

impl Documented for ChatCompletionRequest {
    const SCHEMA: &'static str = "ChatCompletionRequest";
}

#[derive(Debug, Deserialize)]
struct MessageIn {
    role: String,
    content: Option<Value>,
    tool_calls: Option<Vec<Value>>,
    tool_call_id: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

/// What `response_format` asks for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum OutputFormat {
    /// Free text.
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON matching this schema.
    JsonSchema(Value),
}

/// A validated request, ready for an engine.
#[derive(Debug, Clone)]
pub(crate) struct ChatPlan {
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    pub max_tokens: Option<usize>,
    pub sampling: SamplingOptions,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub format: OutputFormat,
    /// The tools the model may call, unless there are none (or `tool_choice` is `none`).
    pub tools: Option<ToolPlan>,
    /// Report log-probabilities with this many alternatives per token.
    pub logprobs: Option<usize>,
    /// How many answers to write (`n`; never more than one when streaming).
    pub n: usize,
    /// A raw prompt (text or token ids) to continue instead of `messages` (Ollama's `raw`
    /// generate, OpenAI's text completions): no chat template, no worked examples, no tool
    /// instructions.
    pub raw: Option<Prompt>,
}

impl ChatCompletionRequest {
    /// Checks every field and turns the request into a plan, or names the bad field.
    pub fn plan(self) -> Result<ChatPlan, ApiError> {
        let n = self.n.unwrap_or(1);
        if !(1..=MAX_CHOICES).contains(&n) {
            return Err(ApiError::invalid_param(
                "n",
                format!("n must be between 1 and {MAX_CHOICES}"),
            ));
        }
        if n > 1 && self.stream == Some(true) {
            return Err(ApiError::invalid_param(
                "n",
                "n > 1 cannot be streamed: ask for n answers with stream: false, or stream one",
            ));
        }
        let logprobs = match (self.logprobs, self.top_logprobs) {
            (Some(true), top) => {
                let top = top.unwrap_or(0);
                if top > MAX_TOP_LOGPROBS as u64 {
                    return Err(ApiError::invalid_param(
                        "top_logprobs",
                        format!("top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}"),
                    ));
                }
                Some(top as usize)
            }
            (_, Some(_)) => {
                return Err(ApiError::invalid_param(
                    "top_logprobs",
                    "top_logprobs needs logprobs: true",
                ))
            }
            _ => None,
        };
        let tools = tools::parse(
            self.tools.as_deref(),
            self.tool_choice.as_ref(),
            self.parallel_tool_calls,
        )?;
        let messages = convert_messages(self.messages)?;
        for (param, n) in [
            ("max_tokens", self.max_tokens),
            ("max_completion_tokens", self.max_completion_tokens),
        ] {
            if n == Some(0) {
                return Err(ApiError::invalid_param(
                    param,
                    format!("{param} must be at least 1"),
                ));
            }
        }
        // max_completion_tokens wins when both are given.
        let max_tokens = self
            .max_completion_tokens
            .or(self.max_tokens)
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX));

        let mut sampling = SamplingOptions::default();
        if let Some(t) = self.temperature {
            if !(0.0..=2.0).contains(&t) {
                return Err(ApiError::invalid_param(
                    "temperature",
                    "temperature must be between 0 and 2",
                ));
            }
            sampling.temperature = t as f32;
        }
        if let Some(p) = self.top_p {
            // Checked as the engine will see it: a tiny positive f64 is 0 as an f32.
            if !(p as f32 > 0.0 && p <= 1.0) {
                return Err(ApiError::invalid_param(
                    "top_p",
                    "top_p must be greater than 0 and at most 1",
                ));
            }
            sampling.top_p = p as f32;
        }
        if let Some(k) = self.top_k {
            sampling.top_k = usize::try_from(k).unwrap_or(usize::MAX);
        }
        if let Some(p) = self.min_p {
            if !(0.0..=1.0).contains(&p) {
                return Err(ApiError::invalid_param(
                    "min_p",
                    "min_p must be between 0 and 1",
                ));
            }
            sampling.min_p = p as f32;
        }
        if let Some(r) = self.repeat_penalty {
            if !(r as f32 > 0.0 && r <= 10.0) {
                return Err(ApiError::invalid_param(
                    "repeat_penalty",
                    "repeat_penalty must be greater than 0 and at most 10",
                ));
            }
            sampling.repeat_penalty = r as f32;
        }
        for (param, v) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            // Accepted for compatibility; the engine applies its own repetition penalty.
            if v.is_some_and(|v| !(-2.0..=2.0).contains(&v)) {
                return Err(ApiError::invalid_param(
                    param,
                    format!("{param} must be between -2 and 2"),
                ));
            }
        }
        // OpenAI seeds are signed; any 64-bit pattern is as good a seed as another.
        sampling.seed = self.seed.map(|s| s as u64);

        let stop = convert_stop(self.stop)?;
        let format = match &self.response_format {
            None | Some(Value::Null) => OutputFormat::Text,
            Some(v) => parse_response_format(v)?,
        };
        if tools.is_some() && format != OutputFormat::Text {
            return Err(ApiError::invalid_param(
                "response_format",
                "response_format cannot be combined with tools: a tool call is already \
                 constrained JSON; give the structure as a tool's parameters instead",
            ));
        }
        let stream = self.stream.unwrap_or(false);
        let include_usage = stream
            && self
                .stream_options
                .and_then(|o| o.include_usage)
                .unwrap_or(false);
        Ok(ChatPlan {
            model: self.model.filter(|m| !m.is_empty()),
            messages,
            max_tokens,
            sampling,
            stop,
            stream,
            include_usage,
            format,
            tools,
            logprobs,
            n: n as usize,
            raw: None,
        })
    }
}

fn convert_messages(messages: Vec<MessageIn>) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "messages must hold at least one message",
        ));
    }
    if messages.len() > MAX_MESSAGES {
        return Err(ApiError::invalid_param(
            "messages",
            format!("at most {MAX_MESSAGES} messages are accepted"),
        ));
    }
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len());
    // Call ids of earlier assistant messages and the tools they named.
    let mut call_names: Vec<(String, String)> = Vec::new();
    for (i, m) in messages.into_iter().enumerate() {
        let role = match m.role.as_str() {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            "tool" => "tool",
            "function" => {
                return Err(ApiError::invalid_param(
                    format!("messages[{i}].role"),
                    format!("messages[{i}]: the legacy `function` role is not supported; send tool results as `tool` messages"),
                ))
            }
            other => {
                return Err(ApiError::invalid_param(
                    format!("messages[{i}].role"),
                    format!("messages[{i}]: unknown role `{other}` (expected system, developer, user, assistant or tool)"),
                ))
            }
        };
        let calls = m.tool_calls.filter(|t| !t.is_empty());
        if calls.is_some() && role != "assistant" {
            return Err(ApiError::invalid_param(
                format!("messages[{i}].tool_calls"),
                "only assistant messages carry tool_calls",
            ));
        }
        let content = message_text(m.content, i)?;
        if let Some(calls) = calls {
            let calls = tools::history_calls(&calls, i)?;
            for c in &calls {
                call_names.push((c.id.clone(), c.function.name.clone()));
            }
            out.push(ChatMessage::assistant_calls(content, calls));
            continue;
        }
        if role == "tool" {
            // Named after the call it answers (the generic format and some templates show
            // the name).
            let id = m.tool_call_id;
            let name = id.as_ref().and_then(|id| {
                call_names
                    .iter()
                    .find(|(call, _)| call == id)
                    .map(|(_, name)| name.clone())
            });
            out.push(ChatMessage::tool_result(id, name, content));
            continue;
        }
        out.push(ChatMessage::new(role, content));
    }
    Ok(out)
}

/// A message's content: a string, or an array of `{"type": "text", "text": ...}` parts
/// (joined by newlines). Null is an empty message.
fn message_text(content: Option<Value>, i: usize) -> Result<String, ApiError> {
    let param = || format!("messages[{i}].content");
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                match (
                    part.get("type").and_then(Value::as_str),
                    part.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(text)) => texts.push(text),
                    (Some(kind), _) if kind != "text" => {
                        return Err(ApiError::invalid_param(
                            format!("messages[{i}].content[{j}].type"),
                            format!("content parts of type `{kind}` are not supported (only text)"),
                        ))
                    }
                    _ => {
                        return Err(ApiError::invalid_param(
                            format!("messages[{i}].content[{j}]"),
                            "a content part must be {\"type\": \"text\", \"text\": string}",
                        ))
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        Some(_) => Err(ApiError::invalid_param(
            param(),
            "content must be a string or an array of text parts",
        )),
    }
}

fn convert_stop(stop: Option<Value>) -> Result<Vec<String>, ApiError> {
    let list = match stop {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s],
        Some(Value::Array(items)) => items
            .into_iter()
            .map(|v| match v {
                Value::String(s) => Ok(s),
                _ => Err(ApiError::invalid_param(
                    "stop",
                    "stop must be a string or an array of strings",
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ApiError::invalid_param(
                "stop",
                "stop must be a string or an array of strings",
            ))
        }
    };
    if list.len() > MAX_STOP {
        return Err(ApiError::invalid_param(
            "stop",
            format!("at most {MAX_STOP} stop sequences are accepted"),
        ));
    }
    // An empty stop string would end every generation before it starts.
    Ok(list.into_iter().filter(|s| !s.is_empty()).collect())
}

/// Reads `response_format`: `{"type": "text"}`, `{"type": "json_object"}` or
/// `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`.
pub(crate) fn parse_response_format(v: &Value) -> Result<OutputFormat, ApiError> {
    let bad = |m: &str| ApiError::invalid_param("response_format", m.to_owned());
    match v.get("type").and_then(Value::as_str) {
        Some("text") => Ok(OutputFormat::Text),
        Some("json_object") => Ok(OutputFormat::JsonObject),
        Some("json_schema") => {
            let spec = v
                .get("json_schema")
                .filter(|s| s.is_object())
                .ok_or_else(|| {
                    bad("response_format.json_schema must be an object holding `schema`")
                })?;
            // The document's schema refuses these too, but its error can only point at the
            // `oneOf` around `response_format`; this one names the field.
            for (field, ok) in [
                ("name", spec.get("name").is_none_or(Value::is_string)),
                (
                    "description",
                    spec.get("description").is_none_or(Value::is_string),
                ),
                (
                    "strict",
                    spec.get("strict")
                        .is_none_or(|v| v.is_boolean() || v.is_null()),
                ),
            ] {
                if !ok {
                    let kind = if field == "strict" {
                        "a boolean"
                    } else {
                        "a string"
                    };
                    return Err(ApiError::invalid_param(
                        format!("response_format.json_schema.{field}"),
                        format!("response_format.json_schema.{field} must be {kind}"),
                    ));
                }
            }
            match spec.get("schema") {
                // OpenAI allows leaving the schema out: any JSON value then.
                None | Some(Value::Null) => Ok(OutputFormat::JsonSchema(json!({}))),
                Some(s @ (Value::Object(_) | Value::Bool(_))) => {
                    Ok(OutputFormat::JsonSchema(s.clone()))
                }
                Some(_) => Err(bad(
                    "response_format.json_schema.schema must be a JSON Schema object",
                )),
            }
        }
        Some(other) => Err(bad(&format!(
            "unknown response_format type `{other}` (expected text, json_object or json_schema)"
        ))),
        None => Err(bad("response_format must be an object with a `type`")),
    }
}

/// The constraint that enforces `format` token by token. `json_object` is any JSON
/// object; a `json_schema` is compiled by the engine (a bad schema is a 400).
fn constraint_for(format: &OutputFormat) -> Option<Constraint> {
    match format {
        OutputFormat::Text => None,
        OutputFormat::JsonObject => Some(Constraint::JsonSchema(json!({"type": "object"}))),
        OutputFormat::JsonSchema(schema) => Some(Constraint::JsonSchema(schema.clone())),
    }
}

/// A generation under way for a [`ChatPlan`], counted and holding its admission permit.
pub(crate) struct Started {
    /// The stream of text.
    pub generation: Generation,
    /// Its accounting.
    pub run: Run,
    /// The id of the model that answers.
    pub model_id: String,
    /// Ids of the shared memories shown to the model as worked examples.
    pub shown: Vec<String>,
    /// The syntax the model writes tool calls in, when the request offers tools.
    pub tool_syntax: Option<Syntax>,
}

/// The embedding router for `tool_choice` `auto` and `required` ([`ToolPlan::route`]),
/// when it is on, the request is one it decides ([`ToolPlan::routes`]) and an embedding
/// model is served. An embedding that fails leaves the decision to the chat model.
async fn route_tools(state: &AppState, plan: &mut ChatPlan) {
    let Some(threshold) = state.config().tool_router else {
        return;
    };
    let Some(tp) = plan.tools.as_mut() else {
        return;
    };
    if !tp.routes(&plan.messages) {
        return;
    }
    let Some(embedder) = state.embedder() else {
        return;
    };
    let open = tp.uncalled(&plan.messages);
    let question = tools::last_user_message(&plan.messages)
        .unwrap_or_default()
        .trim()
        .to_string();
    // Tried once per request, whatever comes of it: the answers of `n` > 1 share it.
    tp.routed = true;
    if question.is_empty() {
        tracing::debug!("tool router: no user message to compare; the model decides");
        return;
    }
    let mut texts = vec![question];
    texts.extend(tp.route_texts());
    match embedder.embed(texts).await {
        Ok(vectors) => {
            let sims = tools::similarities(&vectors);
            match tp.route(&open, &sims, threshold) {
                Some(tool) => tracing::debug!(tool, "tool router: calling the most similar tool"),
                None => tracing::debug!("tool router: no tool to call; the model decides"),
            }
        }
        Err(e) => tracing::warn!("tool router: embedding failed ({e}); the model decides"),
    }
}

/// Picks the engine for `plan`, admits the request, lets the tool router decide, adds
/// worked examples and tool instructions and starts generating. The front ends (OpenAI's
/// chat completions, Ollama's chat and generate) differ only in how they read requests and
/// write answers.
pub(crate) async fn start(state: &AppState, plan: &mut ChatPlan) -> Result<Started, ApiError> {
    let engine = state.chat_engine(plan.model.as_deref())?;
    // Admitted before any work is done for it: the router's and the worked examples'
    // embeddings count as the request's, and a busy node refuses it before them.
    let permit = state.admit()?;
    route_tools(state, plan).await;
    let context = engine.info().context_length;
    let max_tokens = plan
        .max_tokens
        .or(state.config().default_max_tokens)
        .unwrap_or(context)
        .max(1);
    let syntax = Syntax::of(engine.tool_format());
    let constraint = match &plan.tools {
        Some(tp) => Some(tp.constraint(syntax)),
        None => constraint_for(&plan.format),
    };
    // A template with a tool format of its own lists the tools and renders calls and
    // results itself; for any other, both are written in the generic format here.
    let template_tools = match syntax {
        Syntax::Native(_) => plan.tools.as_ref().map(ToolPlan::template_tools),
        Syntax::Generic => {
            plan.messages = tools::generic_history(std::mem::take(&mut plan.messages));
            None
        }
    };
    let chat_prompt = |messages: Vec<ChatMessage>| match &template_tools {
        Some(tools) => Prompt::ChatWithTools(messages, tools.clone()),
        None => Prompt::Chat(messages),
    };
    let request = |prompt: Prompt| GenerateRequest {
        prompt,
        max_tokens,
        sampling: plan.sampling.clone(),
        stop: plan.stop.clone(),
        constraint: constraint.clone(),
        logprobs: plan.logprobs,
    };
    let mut shown = Vec::new();
    let generation = if let Some(raw) = plan.raw.take() {
        // A raw prompt is the model's input as it is: no examples, no instructions.
        generate(&engine, request(raw)).await?
    } else {
        // Worked examples from shared memories, when the node is set to show them. The
        // request as sent is kept: it is answered as is if the examples do not fit.
        let mut as_sent = None;
        if let Some(ex) = state.memory_examples() {
            let mut messages = plan.messages.clone();
            shown = with_examples(&mut messages, &ex).await;
            if !shown.is_empty() {
                as_sent = Some(std::mem::replace(&mut plan.messages, messages));
            }
        }
        if let (Some(tp), Syntax::Generic) = (&plan.tools, syntax) {
            tp.instruct(&mut plan.messages);
            if let Some(sent) = as_sent.as_mut() {
                tp.instruct(sent);
            }
        }
        let messages = std::mem::take(&mut plan.messages);
        let mut generation = generate(&engine, request(chat_prompt(messages))).await?;
        if let (Err(ModelError::ContextOverflow { .. }), Some(messages)) = (&generation, as_sent) {
            tracing::debug!("worked examples do not fit the context; answering without them");
            shown.clear();
            generation = generate(&engine, request(chat_prompt(messages))).await?;
        }
        generation
    };
    let generation = generation.map_err(|e| match e {
        ModelError::Constraint(ConstraintError::Compile { .. }) if plan.tools.is_some() => {
            ApiError::invalid_param("tools", format!("a tool's parameters: {e}"))
        }
        ModelError::Constraint(ConstraintError::Compile { .. }) => {
            ApiError::invalid_param("response_format", e.to_string())
        }
        e => ApiError::from(e),
    })?;
    Metrics::add(&state.counters().chat_completions, 1);
    Ok(Started {
        generation,
        run: Run::new(state, permit),
        model_id: engine.info().id.clone(),
        shown,
        tool_syntax: plan.tools.is_some().then_some(syntax),
    })
}

/// The handler.
pub(crate) async fn chat_completions(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<ChatCompletionRequest>,
) -> Result<Response, ApiError> {
    let plan = body.plan()?;
    if plan.stream {
        let mut first = plan.clone();
        let Started {
            generation,
            run,
            model_id,
            shown,
            tool_syntax,
        } = start(&state, &mut first).await?;
        let events = stream_events(StreamState {
            generation,
            run,
            meta: Meta {
                id: completion_id(),
                created: unix_now(),
                model: model_id,
            },
            include_usage: plan.include_usage,
            shutdown: state.shutdown_token().clone(),
            phase: Phase::Role,
            tool_text: tool_syntax.map(ToolText::new),
            queue: std::collections::VecDeque::new(),
            logprobs: plan.logprobs.map(|_| Vec::new()),
        });
        let response = Sse::new(events)
            .keep_alive(KeepAlive::default())
            .into_response();
        return Ok(with_memories_header(response, &shown));
    }
    let created = unix_now();
    let mut choices = Vec::with_capacity(plan.n);
    let mut answers = Vec::with_capacity(plan.n);
    let (mut model, mut shown) = (String::new(), Vec::new());
    // The tool router decides once per request, for the first answer; the others share it.
    let mut decided = None;
    for (index, mut one) in choice_plans(&plan).into_iter().enumerate() {
        if decided.is_some() {
            one.tools.clone_from(&decided);
        }
        let started = start(&state, &mut one).await?;
        if index == 0 {
            model = started.model_id.clone();
            shown = started.shown.clone();
            decided = one.tools.clone();
        }
        let Collected {
            text,
            done,
            logprobs,
        } = collect(started.generation, started.run, &state).await?;
        let calls = started
            .tool_syntax
            .and_then(|syntax| syntax.read_calls(&text, call_id));
        let (message, finish) = match calls {
            Some(calls) => (
                json!({"role": "assistant", "content": null, "refusal": null,
                       "tool_calls": tools::openai_calls(&calls)}),
                "tool_calls",
            ),
            None => (
                json!({"role": "assistant", "content": text, "refusal": null}),
                finish_reason(done.finish_reason),
            ),
        };
        choices.push(json!({
            "index": index,
            "message": message,
            "logprobs": plan.logprobs.map(|_| openai_logprobs(&logprobs)),
            "finish_reason": finish,
        }));
        answers.push(done);
    }
    let response = Json(json!({
        "id": completion_id(),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": null,
        "choices": choices,
        "usage": usage_of_all(&answers),
    }))
    .into_response();
    Ok(with_memories_header(response, &shown))
}

/// One plan per answer of a request with `n` answers: answer `i` samples with the
/// request's seed plus `i`, so the answers differ (unless greedy) and a seeded request
/// gives the same answers again.
pub(crate) fn choice_plans(plan: &ChatPlan) -> Vec<ChatPlan> {
    (0..plan.n)
        .map(|i| {
            let mut one = plan.clone();
            one.n = 1;
            one.sampling.seed = plan.sampling.seed.map(|s| s.wrapping_add(i as u64));
            one
        })
        .collect()
}

/// The usage of several answers to one prompt: the prompt counted once, the completions
/// summed.
pub(crate) fn usage_of_all(answers: &[Completion]) -> Value {
    TokenCounts::of_answers(answers).json()
}

/// The token counts of OpenAI's `usage`.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct TokenCounts {
    pub prompt: usize,
    pub completion: usize,
    pub cached: usize,
}

impl TokenCounts {
    /// Several answers to one prompt: the prompt counted once, the completions summed.
    pub fn of_answers(answers: &[Completion]) -> Self {
        Self {
            prompt: answers.first().map_or(0, |d| d.prompt_tokens),
            cached: answers.first().map_or(0, |d| d.cached_prompt_tokens),
            completion: answers.iter().map(|d| d.completion_tokens).sum(),
        }
    }

    /// These and `other` together (answers to different prompts).
    pub fn plus(self, other: Self) -> Self {
        Self {
            prompt: self.prompt + other.prompt,
            completion: self.completion + other.completion,
            cached: self.cached + other.cached,
        }
    }

    pub fn json(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
            "prompt_tokens_details": {"cached_tokens": self.cached},
        })
    }
}

/// `response` with the ids of the shared memories shown as worked examples, if any.
fn with_memories_header(mut response: Response, shown: &[String]) -> Response {
    if !shown.is_empty() {
        if let Ok(v) = axum::http::HeaderValue::from_str(&shown.join(",")) {
            response.headers_mut().insert(MEMORIES_HEADER, v);
        }
    }
    response
}

/// Starts a generation. Rendering and tokenising a long prompt is CPU work: it runs off
/// the async workers.
async fn generate(
    engine: &Engine,
    req: GenerateRequest,
) -> Result<Result<Generation, ModelError>, ApiError> {
    let engine = engine.clone();
    tokio::task::spawn_blocking(move || engine.generate(req))
        .await
        .map_err(|e| ApiError::internal(format!("the request task failed: {e}")))
}

/// Response header listing the ids of the shared memories shown as worked examples.
pub const MEMORIES_HEADER: &str = "x-starling-memories";

/// Adds worked examples from shared memories for the last user message as earlier
/// exchanges (the memory's prompt as a user turn, its answer as the assistant's) after the
/// leading system messages: a small model follows examples given as turns and copies
/// examples given as a block of text (`starling eval format`). Returns the ids shown.
async fn with_examples(messages: &mut Vec<ChatMessage>, ex: &MemoryExamples) -> Vec<String> {
    let Some(query) = tools::last_user_message(messages).map(str::to_owned) else {
        return Vec::new();
    };
    let memories = ex
        .book
        .examples_for(DEFAULT_DOMAIN, &query, ex.k, ex.min_cosine)
        .await;
    let at = messages
        .iter()
        .position(|m| m.role != "system")
        .unwrap_or(messages.len());
    let turns = memories.iter().flat_map(|m| {
        [
            ChatMessage::user(m.prompt.trim()),
            ChatMessage::assistant(m.answer.trim()),
        ]
    });
    messages.splice(at..at, turns);
    memories.into_iter().map(|m| m.id).collect()
}

/// A whole answer: its text, its end and (when asked for) its tokens' log-probabilities.
pub(crate) struct Collected {
    pub text: String,
    pub done: Completion,
    pub logprobs: Vec<TokenLogprob>,
}

pub(crate) async fn collect(
    mut generation: Generation,
    mut run: Run,
    state: &AppState,
) -> Result<Collected, ApiError> {
    let shutdown = state.shutdown_token().clone();
    let mut text = String::new();
    let mut logprobs = Vec::new();
    loop {
        let item = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Err(ApiError::shutting_down()),
            item = generation.next() => item,
        };
        match item {
            Some(Ok(Chunk::Text(t))) => text.push_str(&t),
            Some(Ok(Chunk::Logprob(l))) => logprobs.push(l),
            Some(Ok(Chunk::Done(done))) => {
                run.finish(&done);
                return Ok(Collected {
                    text,
                    done,
                    logprobs,
                });
            }
            Some(Err(e)) => {
                run.fail();
                return Err(e.into());
            }
            None => {
                run.fail();
                return Err(ApiError::from(ModelError::EngineStopped));
            }
        }
    }
}

/// One step of a generation as the streaming front ends see it.
pub(crate) enum Piece {
    /// More text.
    Text(String),
    /// The log-probability of a token whose text comes next (only when asked for).
    Logprob(TokenLogprob),
    /// The end, with the counts.
    Done(Completion),
    /// It failed (or the server is stopping); nothing follows.
    Failed(ApiError),
}

/// The pieces of `generation` until its end or failure, keeping `run`'s accounting: the
/// stream that the NDJSON (Ollama) and `text_completion` front ends write out. Dropping it
/// (the client went away) drops the generation, which stops the engine's work on it.
pub(crate) fn pieces(
    generation: Generation,
    run: Run,
    shutdown: CancellationToken,
) -> impl Stream<Item = Piece> {
    futures::stream::unfold(Some((generation, run)), move |state| {
        let shutdown = shutdown.clone();
        async move {
            let (mut generation, mut run) = state?;
            let item = tokio::select! {
                biased;
                _ = shutdown.cancelled() => {
                    run.fail();
                    Metrics::add(&run.state.counters().cancelled_generations, 1);
                    return Some((Piece::Failed(ApiError::shutting_down()), None));
                }
                item = generation.next() => item,
            };
            match item {
                Some(Ok(Chunk::Text(t))) => Some((Piece::Text(t), Some((generation, run)))),
                Some(Ok(Chunk::Logprob(l))) => Some((Piece::Logprob(l), Some((generation, run)))),
                Some(Ok(Chunk::Done(done))) => {
                    run.finish(&done);
                    Some((Piece::Done(done), None))
                }
                Some(Err(e)) => {
                    run.fail();
                    Some((Piece::Failed(e.into()), None))
                }
                None => {
                    run.fail();
                    Some((Piece::Failed(ModelError::EngineStopped.into()), None))
                }
            }
        }
    })
}

/// Accounting of one generation: holds its admission permit, counts it as active, and
/// counts it as cancelled when dropped before its end (client gone, server stopping).
pub(crate) struct Run {
    state: AppState,
    _permit: OwnedSemaphorePermit,
    ended: bool,
}

impl Run {
    fn new(state: &AppState, permit: OwnedSemaphorePermit) -> Self {
        Metrics::add(&state.counters().active_generations, 1);
        Self {
            state: state.clone(),
            _permit: permit,
            ended: false,
        }
    }

    pub(crate) fn finish(&mut self, done: &Completion) {
        let m = self.state.counters();
        Metrics::add(&m.prompt_tokens, done.prompt_tokens as u64);
        Metrics::add(&m.completion_tokens, done.completion_tokens as u64);
        Metrics::add(&m.cached_prompt_tokens, done.cached_prompt_tokens as u64);
        self.ended = true;
    }

    pub(crate) fn fail(&mut self) {
        self.ended = true;
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let m = self.state.counters();
        m.active_generations
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        if !self.ended {
            Metrics::add(&m.cancelled_generations, 1);
            tracing::debug!("generation cancelled before its end");
        }
    }
}

struct Meta {
    id: String,
    created: u64,
    model: String,
}

enum Phase {
    Role,
    Body,
    Usage(Value),
    Done,
    End,
}

struct StreamState {
    generation: Generation,
    run: Run,
    meta: Meta,
    include_usage: bool,
    shutdown: CancellationToken,
    phase: Phase,
    /// With tools: the text so far, until it shows whether it is a call.
    tool_text: Option<ToolText>,
    /// Events to send before going on (a call's chunk before the finish chunk).
    queue: std::collections::VecDeque<Event>,
    /// Log-probabilities of tokens whose text has not been sent yet (`None`: not asked).
    logprobs: Option<Vec<TokenLogprob>>,
}

/// A streamed answer with tools: text is held back until its first character tells a
/// call (`{`, or `<` in the Hermes format: held to the end and sent as one `tool_calls`
/// delta) from an answer (sent as it comes).
struct ToolText {
    syntax: Syntax,
    text: String,
    call: Option<bool>,
}

impl ToolText {
    fn new(syntax: Syntax) -> Self {
        Self {
            syntax,
            text: String::new(),
            call: None,
        }
    }
}

impl StreamState {
    /// A chunk, carrying the log-probabilities gathered since the last one.
    fn chunk(&mut self, delta: Value, finish: Option<&str>) -> Event {
        let logprobs = self
            .logprobs
            .as_mut()
            .filter(|l| !l.is_empty())
            .map(|l| openai_logprobs(&std::mem::take(l)));
        let mut body = json!({
            "id": self.meta.id,
            "object": "chat.completion.chunk",
            "created": self.meta.created,
            "model": self.meta.model,
            "system_fingerprint": null,
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
        });
        if self.include_usage {
            body["usage"] = Value::Null;
        }
        Event::default().data(body.to_string())
    }
}

/// The SSE events of a streamed completion: a first chunk with the role, one chunk per
/// piece of text, a last chunk with the finish reason, the usage chunk when asked for, then
/// `[DONE]`. Dropping the stream (the client went away) drops the generation, which stops
/// the engine's work on it.
fn stream_events(state: StreamState) -> impl Stream<Item = Result<Event, Infallible>> {
    futures::stream::unfold(state, |mut st| async move {
        if let Some(event) = st.queue.pop_front() {
            return Some((Ok(event), st));
        }
        let event = match std::mem::replace(&mut st.phase, Phase::End) {
            Phase::Role => {
                st.phase = Phase::Body;
                st.chunk(json!({"role": "assistant", "content": ""}), None)
            }
            Phase::Body => {
                let item = tokio::select! {
                    biased;
                    _ = st.shutdown.cancelled() => {
                        st.run.fail();
                        Metrics::add(&st.run.state.counters().cancelled_generations, 1);
                        st.phase = Phase::Done;
                        return Some((Ok(error_event(&ApiError::shutting_down())), st));
                    }
                    item = st.generation.next() => item,
                };
                match item {
                    Some(Ok(Chunk::Logprob(l))) => {
                        st.phase = Phase::Body;
                        if let Some(pending) = st.logprobs.as_mut() {
                            pending.push(l);
                        }
                        return Some((Ok(Event::default().comment("")), st));
                    }
                    Some(Ok(Chunk::Text(text))) => {
                        st.phase = Phase::Body;
                        match st.tool_text.as_mut() {
                            None
                            | Some(ToolText {
                                call: Some(false), ..
                            }) => st.chunk(json!({"content": text}), None),
                            Some(held) => {
                                held.text.push_str(&text);
                                match held.text.trim_start().chars().next() {
                                    // Nothing telling yet, or a call: keep holding.
                                    None => return Some((Ok(Event::default().comment("")), st)),
                                    Some(c) if held.syntax.opens_call(c) => {
                                        held.call = Some(true);
                                        return Some((Ok(Event::default().comment("")), st));
                                    }
                                    Some(_) => {
                                        held.call = Some(false);
                                        let text = std::mem::take(&mut held.text);
                                        st.chunk(json!({"content": text}), None)
                                    }
                                }
                            }
                        }
                    }
                    Some(Ok(Chunk::Done(done))) => {
                        st.run.finish(&done);
                        st.phase = if st.include_usage {
                            Phase::Usage(usage(&done))
                        } else {
                            Phase::Done
                        };
                        let held = st.tool_text.take().filter(|h| h.call != Some(false));
                        match held {
                            Some(ToolText { syntax, text, .. }) => match syntax
                                .read_calls(&text, call_id)
                            {
                                Some(calls) => {
                                    let deltas: Vec<Value> = calls
                                        .iter()
                                        .enumerate()
                                        .map(|(i, c)| {
                                            json!({"index": i, "id": c.id, "type": "function",
                                                   "function": {"name": c.name, "arguments": c.arguments}})
                                        })
                                        .collect();
                                    let finish = st.chunk(json!({}), Some("tool_calls"));
                                    st.queue.push_back(finish);
                                    st.chunk(json!({"tool_calls": deltas}), None)
                                }
                                None => {
                                    // Cut short (max_tokens) before the call was whole, or
                                    // blank: sent as text, with the real finish reason.
                                    let finish = st
                                        .chunk(json!({}), Some(finish_reason(done.finish_reason)));
                                    st.queue.push_back(finish);
                                    st.chunk(json!({"content": text}), None)
                                }
                            },
                            None => st.chunk(json!({}), Some(finish_reason(done.finish_reason))),
                        }
                    }
                    Some(Err(e)) => {
                        st.run.fail();
                        st.phase = Phase::Done;
                        error_event(&ApiError::from(e))
                    }
                    None => {
                        st.run.fail();
                        st.phase = Phase::Done;
                        error_event(&ApiError::from(ModelError::EngineStopped))
                    }
                }
            }
            Phase::Usage(usage) => {
                st.phase = Phase::Done;
                let body = json!({
                    "id": st.meta.id,
                    "object": "chat.completion.chunk",
                    "created": st.meta.created,
                    "model": st.meta.model,
                    "system_fingerprint": null,
                    "choices": [],
                    "usage": usage,
                });
                Event::default().data(body.to_string())
            }
            Phase::Done => {
                st.phase = Phase::End;
                Event::default().data("[DONE]")
            }
            Phase::End => return None,
        };
        Some((Ok(event), st))
    })
}

/// A token and its log-probability as OpenAI writes them.
fn openai_prob(t: &TokenProb) -> Value {
    json!({"token": t.token, "logprob": t.logprob, "bytes": t.bytes})
}

/// OpenAI's `logprobs` of a chat choice: `{"content": [...], "refusal": null}`.
pub(crate) fn openai_logprobs(entries: &[TokenLogprob]) -> Value {
    let content: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut v = openai_prob(&e.chosen);
            v["top_logprobs"] = e.top.iter().map(openai_prob).collect();
            v
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// An error in the middle of a stream, as OpenAI sends it: `data: {"error": {...}}`.
fn error_event(e: &ApiError) -> Event {
    Event::default().data(e.body().to_string())
}

pub(crate) fn usage(done: &Completion) -> Value {
    usage_of_all(std::slice::from_ref(done))
}

pub(crate) fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

pub(crate) fn random_id(prefix: &str) -> String {
    let suffix: String = rand::thread_rng()
        .sample_iter(&Alphanumeric)
        .take(24)
        .map(char::from)
        .collect();
    format!("{prefix}{suffix}")
}

pub(crate) fn call_id() -> String {
    random_id("call_")
}

fn completion_id() -> String {
    random_id("chatcmpl-")
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<ChatPlan, ApiError> {
        let req: ChatCompletionRequest = serde_json::from_value(v).expect("shape");
        req.plan()
    }

    fn param_of(r: Result<ChatPlan, ApiError>) -> Option<String> {
        r.err()
            .and_then(|e| e.body()["error"]["param"].as_str().map(str::to_owned))
    }

    #[test]
    fn full_request_maps_to_engine_options() {
        let plan = parse(json!({
            "model": "m",
            "messages": [
                {"role": "developer", "content": "Be terse."},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": null},
            ],
            "max_tokens": 5,
            "max_completion_tokens": 7,
            "temperature": 0,
            "top_p": 0.5,
            "seed": -1,
            "stop": "END",
            "stream": true,
            "stream_options": {"include_usage": true},
            "n": 1,
            "user": "ignored",
        }))
        .expect("valid");
        assert_eq!(plan.messages[0], ChatMessage::system("Be terse."));
        assert_eq!(plan.messages[1], ChatMessage::user("a\nb"));
        assert_eq!(plan.messages[2], ChatMessage::assistant(""));
        assert_eq!(plan.max_tokens, Some(7));
        assert_eq!(plan.sampling.temperature, 0.0);
        assert_eq!(plan.sampling.top_p, 0.5);
        assert_eq!(plan.sampling.seed, Some(u64::MAX));
        assert_eq!(plan.stop, vec!["END".to_owned()]);
        assert!(plan.stream && plan.include_usage);
    }

    #[test]
    fn bad_fields_name_their_param() {
        let msgs = json!([{"role": "user", "content": "hi"}]);
        assert_eq!(
            param_of(parse(json!({"messages": msgs, "n": 9}))).as_deref(),
            Some("n")
        );
        assert_eq!(
            param_of(parse(json!({"messages": msgs, "n": 2, "stream": true}))).as_deref(),
            Some("n")
        );
        assert_eq!(
            param_of(parse(json!({"messages": msgs, "temperature": 2.5}))).as_deref(),
            Some("temperature")
        );
        assert_eq!(
            param_of(parse(json!({"messages": msgs, "top_p": 0}))).as_deref(),
            Some("top_p")
        );
        assert_eq!(
            param_of(parse(json!({"messages": msgs, "top_p": 5e-324}))).as_deref(),
            Some("top_p")
        );
        assert_eq!(
            param_of(parse(json!({"messages": msgs, "repeat_penalty": 1e-60}))).as_deref(),
            Some("repeat_penalty")
        );
        assert_eq!(
            param_of(parse(json!({"messages": msgs, "max_tokens": 0}))).as_deref(),
            Some("max_tokens")
        );
        assert_eq!(
            param_of(parse(json!({"messages": msgs, "stop": [1]}))).as_deref(),
            Some("stop")
        );
        assert_eq!(
            param_of(parse(json!({"messages": []}))).as_deref(),
            Some("messages")
        );
        assert_eq!(
            param_of(parse(
                json!({"messages": [{"role": "wizard", "content": "x"}]})
            ))
            .as_deref(),
            Some("messages[0].role")
        );
        assert_eq!(
            param_of(parse(
                json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})
            ))
            .as_deref(),
            Some("messages[0].content[0].type")
        );
        assert_eq!(
            param_of(parse(
                json!({"messages": msgs, "response_format": {"type": "yaml"}})
            ))
            .as_deref(),
            Some("response_format")
        );
    }

    #[test]
    fn response_formats_parse() {
        assert_eq!(
            parse_response_format(&json!({"type": "text"})).expect("text"),
            OutputFormat::Text
        );
        assert_eq!(
            parse_response_format(&json!({"type": "json_object"})).expect("object"),
            OutputFormat::JsonObject
        );
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        assert_eq!(
            parse_response_format(
                &json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
            )
            .expect("schema"),
            OutputFormat::JsonSchema(schema)
        );
        assert!(parse_response_format(&json!({"type": "json_schema"})).is_err());
        for bad in [
            json!({"type": "json_schema", "json_schema": {"name": -1.5, "schema": {}}}),
            json!({"type": "json_schema", "json_schema": {"name": "x", "strict": "yes"}}),
            json!({"type": "json_schema", "json_schema": {"name": "x", "description": []}}),
        ] {
            assert!(parse_response_format(&bad).is_err(), "{bad}");
        }
        assert!(parse_response_format(
            &json!({"type": "json_schema", "json_schema": {"name": "x", "strict": null, "description": "d"}})
        )
        .is_ok());
    }

    #[test]
    fn stop_sequences_are_bounded_and_empty_ones_dropped() {
        assert_eq!(
            convert_stop(Some(json!(["a", ""]))).expect("ok"),
            vec!["a".to_owned()]
        );
        let many: Vec<String> = (0..=MAX_STOP).map(|i| i.to_string()).collect();
        assert!(convert_stop(Some(json!(many))).is_err());
    }
}
