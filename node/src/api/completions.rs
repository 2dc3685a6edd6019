//! `POST /v1/completions`: OpenAI's (legacy) text completions. The prompt is continued as it
//! is, without the chat template, whole or streamed as server-sent `text_completion` events.
//!
//! The request is read into the same [`ChatPlan`] as a chat completion (its sampling fields
//! are rewritten as a chat request's and checked by the same code), with the prompt as raw
//! text.

use std::convert::Infallible;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use starling_models::engine::TokenLogprob;

use super::chat::{self, ChatCompletionRequest, Collected, Started};
use super::error::ApiError;
use super::extract::{ApiJson, Documented};
use super::state::AppState;

/// OpenAI's default `max_tokens` for text completions.
const DEFAULT_MAX_TOKENS: u64 = 16;

/// The request body.
#[derive(Debug, Deserialize)]
pub(crate) struct CompletionRequest {
    model: Option<String>,
    prompt: Value,
    max_tokens: Option<u64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<u64>,
    min_p: Option<f64>,
    repeat_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    presence_penalty: Option<f64>,
    seed: Option<i64>,
    stop: Option<Value>,
    stream: Option<bool>,
    stream_options: Option<Value>,
    echo: Option<bool>,
    n: Option<u64>,
    logprobs: Option<u64>,
}

impl Documented for CompletionRequest {
    const SCHEMA: &'static str = "CompletionRequest";
}

/// The prompt: a string, or an array holding one string.
fn prompt_text(prompt: Value) -> Result<String, ApiError> {
    match prompt {
        Value::String(s) => Ok(s),
        Value::Array(mut items) if items.len() == 1 && items[0].is_string() => Ok(items
            .pop()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()),
        Value::Array(items) if items.iter().all(Value::is_string) => Err(ApiError::invalid_param(
            "prompt",
            "one prompt per request: send each prompt in its own request",
        )),
        _ => Err(ApiError::invalid_param(
            "prompt",
            "token-id prompts are not supported; send the prompt as text",
        )),
    }
}

/// What `echo` asks for: nothing, the prompt before the completion, or with `logprobs` the
/// prompt's tokens scored too (`Scored(alternatives per token)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Echo {
    No,
    Text,
    Scored(usize),
}

impl CompletionRequest {
    /// The chat request this one amounts to, the prompt and what to echo.
    fn into_chat(self) -> Result<(ChatCompletionRequest, String, Echo), ApiError> {
        let prompt = prompt_text(self.prompt)?;
        if prompt.is_empty() {
            return Err(ApiError::invalid_param("prompt", "the prompt is empty"));
        }
        let mut req = Map::new();
        let mut put = |k: &str, v: Value| {
            if !v.is_null() {
                req.insert(k.to_owned(), v);
            }
        };
        put("model", json!(self.model));
        // The chat checks need a message; the prompt itself is sent raw.
        put("messages", json!([{"role": "user", "content": "-"}]));
        put(
            "max_tokens",
            json!(self.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)),
        );
        put("temperature", json!(self.temperature));
        put("top_p", json!(self.top_p));
        put("top_k", json!(self.top_k));
        put("min_p", json!(self.min_p));
        put("repeat_penalty", json!(self.repeat_penalty));
        put("frequency_penalty", json!(self.frequency_penalty));
        put("presence_penalty", json!(self.presence_penalty));
        put("seed", json!(self.seed));
        put("stop", self.stop.unwrap_or(Value::Null));
        put("stream", json!(self.stream));
        put("stream_options", self.stream_options.unwrap_or(Value::Null));
        put("n", json!(self.n));
        if let Some(top) = self.logprobs {
            put("logprobs", json!(true));
            put("top_logprobs", json!(top));
        }
        let echo = match (self.echo, self.logprobs) {
            (Some(true), Some(top)) => Echo::Scored(usize::try_from(top).unwrap_or(usize::MAX)),
            (Some(true), None) => Echo::Text,
            _ => Echo::No,
        };
        let chat = serde_json::from_value(Value::Object(req))
            .map_err(|e| ApiError::invalid(format!("invalid request: {e}")))?;
        Ok((chat, prompt, echo))
    }
}

fn choice(text: &str, finish: Option<&str>, logprobs: Option<Value>) -> Value {
    json!({"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish})
}

/// The legacy `logprobs` of a text completion: parallel lists of tokens, their
/// log-probabilities, the alternatives (`{token: logprob}`) and each token's offset in the
/// text, counted in characters from `offset`.
fn legacy_logprobs(entries: &[TokenLogprob], mut offset: usize) -> Value {
    let mut tokens = Vec::with_capacity(entries.len());
    let mut token_logprobs = Vec::with_capacity(entries.len());
    let mut top_logprobs = Vec::with_capacity(entries.len());
    let mut text_offset = Vec::with_capacity(entries.len());
    for e in entries {
        tokens.push(json!(e.chosen.token));
        token_logprobs.push(json!(e.chosen.logprob));
        let top: Map<String, Value> = e
            .top
            .iter()
            .map(|t| (t.token.clone(), json!(t.logprob)))
            .collect();
        top_logprobs.push(Value::Object(top));
        text_offset.push(json!(offset));
        offset += e.chosen.token.chars().count();
    }
    json!({"tokens": tokens, "token_logprobs": token_logprobs,
           "top_logprobs": top_logprobs, "text_offset": text_offset})
}

/// The legacy `logprobs` of an echoed prompt: every token of it, the first with `null`
/// where nothing comes before it to predict it.
async fn prompt_logprobs(
    state: &AppState,
    model: Option<&str>,
    prompt: &str,
    top: usize,
) -> Result<Value, ApiError> {
    let engine = state.chat_engine(model)?;
    // Scoring is model work like a generation: a busy server refuses it the same way.
    let _permit = state.admit()?;
    let text = prompt.to_owned();
    let scorer = engine.clone();
    let (tokens, scoring) = tokio::task::spawn_blocking(move || scorer.score_text(&text, top))
        .await
        .map_err(|e| ApiError::internal(format!("the request task failed: {e}")))?
        .map_err(ApiError::from)?;
    let entries = match scoring {
        Some(s) => s.wait().await.map_err(ApiError::from)?.entries,
        None => Vec::new(),
    };
    // Tokens before the scored ones (the first, without BOS) have no log-probability.
    let unscored = &tokens[..tokens.len() - entries.len()];
    let mut out = legacy_logprobs(&[], 0);
    let mut offset = 0;
    for &t in unscored {
        let text = String::from_utf8_lossy(engine.tokenizer().token_bytes(t)).into_owned();
        let len = text.chars().count();
        for (key, v) in [
            ("tokens", json!(text)),
            ("token_logprobs", Value::Null),
            ("top_logprobs", Value::Null),
            ("text_offset", json!(offset)),
        ] {
            if let Some(list) = out[key].as_array_mut() {
                list.push(v);
            }
        }
        offset += len;
    }
    append_logprobs(&mut out, legacy_logprobs(&entries, offset));
    Ok(out)
}

/// Appends the lists of `more` to those of `to` (both legacy `logprobs`).
fn append_logprobs(to: &mut Value, more: Value) {
    for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
        if let (Some(list), Value::Array(extra)) = (to[key].as_array_mut(), more[key].clone()) {
            list.extend(extra);
        }
    }
}

/// The number of characters the legacy `logprobs` `lp` cover (its tokens' text).
fn covered_chars(lp: &Value) -> usize {
    lp["tokens"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter_map(Value::as_str)
                .map(|s| s.chars().count())
                .sum()
        })
        .unwrap_or(0)
}

/// The handler.
pub(crate) async fn completions(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CompletionRequest>,
) -> Result<Response, ApiError> {
    let (chat_req, prompt, echo) = body.into_chat()?;
    let mut plan = chat_req.plan()?;
    plan.raw = Some(prompt.clone());
    let id = chat::random_id("cmpl-");
    let created = chat::unix_now();
    let scored = plan.logprobs.is_some();
    // The prompt's own scores, when echoed with logprobs (the same for every answer).
    let echoed = match echo {
        Echo::Scored(top) => {
            Some(prompt_logprobs(&state, plan.model.as_deref(), &prompt, top).await?)
        }
        Echo::No | Echo::Text => None,
    };
    if !plan.stream {
        let mut choices = Vec::with_capacity(plan.n);
        let mut answers = Vec::with_capacity(plan.n);
        let mut model = String::new();
        for (index, mut one) in chat::choice_plans(&plan).into_iter().enumerate() {
            let started = chat::start(&state, &mut one).await?;
            model = started.model_id;
            let Collected {
                text,
                done,
                logprobs,
            } = chat::collect(started.generation, started.run, &state).await?;
            let (text, lp) = match &echoed {
                Some(head) => {
                    let mut lp = head.clone();
                    append_logprobs(&mut lp, legacy_logprobs(&logprobs, covered_chars(head)));
                    (format!("{prompt}{text}"), Some(lp))
                }
                // Echoed without logprobs: nothing is scored.
                None if echo == Echo::Text => (format!("{prompt}{text}"), None),
                None => (text, scored.then(|| legacy_logprobs(&logprobs, 0))),
            };
            let mut c = choice(&text, Some(chat::finish_reason(done.finish_reason)), lp);
            c["index"] = json!(index);
            choices.push(c);
            answers.push(done);
        }
        return Ok(Json(
            json!({"id": id, "object": "text_completion", "created": created,
                              "model": model, "system_fingerprint": null, "choices": choices,
                              "usage": chat::usage_of_all(&answers)}),
        )
        .into_response());
    }
    let Started {
        generation,
        run,
        model_id,
        ..
    } = chat::start(&state, &mut plan).await?;
    let head = move |choices: Value| {
        json!({"id": id, "object": "text_completion", "created": created,
               "model": model_id, "system_fingerprint": null, "choices": choices})
    };
    let include_usage = plan.include_usage;
    // Log-probabilities wait for the text of their tokens; `sent` counts the characters
    // sent so far, for the offsets.
    let mut sent = match &echoed {
        Some(lp) => covered_chars(lp),
        None => 0,
    };
    let first = (echo != Echo::No).then(|| head(json!([choice(&prompt, None, echoed)])));
    let pieces = chat::pieces(generation, run, state.shutdown_token().clone());
    let mut pending: Vec<TokenLogprob> = Vec::new();
    let events = futures::stream::iter(first)
        .chain(pieces.flat_map(move |piece| {
            let mut take = |text: &str| {
                let l = scored.then(|| legacy_logprobs(&std::mem::take(&mut pending), sent));
                sent += text.chars().count();
                l
            };
            let out: Vec<Value> = match piece {
                chat::Piece::Logprob(l) => {
                    pending.push(l);
                    Vec::new()
                }
                chat::Piece::Text(t) => vec![head(json!([choice(&t, None, take(&t))]))],
                chat::Piece::Done(done) => {
                    let reason = chat::finish_reason(done.finish_reason);
                    let mut last = vec![head(json!([choice("", Some(reason), take(""))]))];
                    if include_usage {
                        let mut u = head(json!([]));
                        u["usage"] = chat::usage(&done);
                        last.push(u);
                    }
                    last
                }
                chat::Piece::Failed(e) => vec![e.body()],
            };
            futures::stream::iter(out)
        }))
        .map(|v| Ok::<_, Infallible>(Event::default().data(v.to_string())))
        .chain(futures::stream::once(async {
            Ok(Event::default().data("[DONE]"))
        }));
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(v: Value) -> CompletionRequest {
        serde_json::from_value(v).expect("shape")
    }

    #[test]
    fn prompts_are_one_text() {
        assert_eq!(prompt_text(json!("a b")).expect("string"), "a b");
        assert_eq!(prompt_text(json!(["a b"])).expect("one"), "a b");
        assert!(prompt_text(json!(["a", "b"])).is_err());
        assert!(prompt_text(json!([1, 2, 3])).is_err());
        assert!(prompt_text(json!([[1, 2]])).is_err());
        assert!(prompt_text(json!(null)).is_err());
    }

    #[test]
    fn max_tokens_defaults_to_sixteen_and_chat_checks_apply() {
        let (chat, prompt, echo) = request(json!({"prompt": "Once", "echo": true}))
            .into_chat()
            .expect("valid");
        let plan = chat.plan().expect("plan");
        assert_eq!(plan.max_tokens, Some(16));
        assert_eq!((prompt.as_str(), echo), ("Once", Echo::Text));
        let (_, _, echo) = request(json!({"prompt": "Once", "echo": true, "logprobs": 2}))
            .into_chat()
            .expect("valid");
        assert_eq!(echo, Echo::Scored(2));
        let (_, _, echo) = request(json!({"prompt": "Once", "logprobs": 2}))
            .into_chat()
            .expect("valid");
        assert_eq!(echo, Echo::No);
        let (chat, _, _) = request(json!({"prompt": "x", "temperature": 7}))
            .into_chat()
            .expect("read");
        assert!(chat.plan().is_err(), "the chat checks refuse temperature 7");
        assert!(request(json!({"prompt": ""})).into_chat().is_err());
    }
}
