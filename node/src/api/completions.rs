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
use starling_models::engine::{Engine, Prompt, TokenLogprob};

use super::chat::{self, ChatCompletionRequest, Collected, Started, TokenCounts};
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

/// Most prompts one request may carry (answers: prompts × `n`, at most this many too).
pub(crate) const MAX_PROMPTS: usize = 32;

/// One prompt of a request: text, or token ids taken exactly as they are.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PromptIn {
    Text(String),
    Ids(Vec<u32>),
}

impl PromptIn {
    fn to_engine(&self) -> Prompt {
        match self {
            Self::Text(t) => Prompt::Text(t.clone()),
            Self::Ids(ids) => Prompt::Tokens(ids.clone()),
        }
    }

    /// Its text, as echoed: token ids are written out as the model's tokens.
    fn text(&self, engine: &Engine) -> String {
        match self {
            Self::Text(t) => t.clone(),
            Self::Ids(ids) => token_text(engine, ids),
        }
    }
}

/// The text of token ids (bytes that are no valid UTF-8, as in a piece of a character, are
/// replaced).
fn token_text(engine: &Engine, ids: &[u32]) -> String {
    let bytes: Vec<u8> = ids
        .iter()
        .flat_map(|&t| engine.tokenizer().token_bytes(t).iter().copied())
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The prompts of a request, as OpenAI takes them: a string, an array of strings, an array
/// of token ids, or an array of such arrays. Each is answered on its own (`n` answers
/// each).
fn prompts(prompt: Value) -> Result<Vec<PromptIn>, ApiError> {
    const SHAPE: &str = "a prompt is a string, an array of strings, an array of token ids, or an array of arrays of token ids";
    let ids = |items: &[Value]| -> Option<Vec<u32>> {
        items
            .iter()
            .map(|v| v.as_u64().and_then(|t| u32::try_from(t).ok()))
            .collect()
    };
    let list = match prompt {
        Value::String(s) => vec![PromptIn::Text(s)],
        Value::Array(items) if items.is_empty() => {
            return Err(ApiError::invalid_param("prompt", "the prompt is empty"))
        }
        Value::Array(items) if items.iter().all(Value::is_string) => items
            .into_iter()
            .map(|v| PromptIn::Text(v.as_str().unwrap_or_default().to_owned()))
            .collect(),
        Value::Array(items) if items.iter().all(Value::is_number) => {
            vec![PromptIn::Ids(ids(&items).ok_or_else(|| {
                ApiError::invalid_param("prompt", "token ids are integers from 0 to 2^32 - 1")
            })?)]
        }
        Value::Array(items) if items.iter().all(Value::is_array) => items
            .iter()
            .map(|v| {
                ids(v.as_array().map(Vec::as_slice).unwrap_or_default())
                    .map(PromptIn::Ids)
                    .ok_or_else(|| ApiError::invalid_param("prompt", SHAPE))
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(ApiError::invalid_param("prompt", SHAPE)),
    };
    if list.len() > MAX_PROMPTS {
        return Err(ApiError::invalid_param(
            "prompt",
            format!("at most {MAX_PROMPTS} prompts per request"),
        ));
    }
    let empty = |p: &PromptIn| match p {
        PromptIn::Text(t) => t.is_empty(),
        PromptIn::Ids(ids) => ids.is_empty(),
    };
    if let Some(i) = list.iter().position(empty) {
        let which = if list.len() == 1 {
            "the prompt is empty".to_owned()
        } else {
            format!("prompt {i} is empty")
        };
        return Err(ApiError::invalid_param("prompt", which));
    }
    Ok(list)
}

/// What `echo` asks for: nothing, the prompt before the completion, or with `logprobs` the
/// prompt's tokens scored too (`Scored(alternatives per token)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Echo {
    No,
    Text,
    Scored(usize),
}

/// A text completion request read: the chat request it amounts to (for the sampling
/// fields and their checks), its prompts, what to echo, and whether it only scores
/// (`max_tokens: 0`, with `echo` the prompt's log-probabilities and nothing generated).
#[derive(Debug)]
struct Read {
    chat: ChatCompletionRequest,
    prompts: Vec<PromptIn>,
    echo: Echo,
    generates: bool,
}

impl CompletionRequest {
    /// The request as the handler uses it.
    fn read(self) -> Result<Read, ApiError> {
        let prompts = prompts(self.prompt)?;
        let n = usize::try_from(self.n.unwrap_or(1)).unwrap_or(usize::MAX);
        if prompts.len() > 1 && n.saturating_mul(prompts.len()) > MAX_PROMPTS {
            return Err(ApiError::invalid_param(
                "n",
                format!("prompts × n is at most {MAX_PROMPTS}"),
            ));
        }
        if prompts.len() > 1 && self.stream == Some(true) {
            return Err(ApiError::invalid_param(
                "prompt",
                "several prompts cannot be streamed: stream one prompt per request, or ask with stream: false",
            ));
        }
        let generates = self.max_tokens != Some(0);
        let mut req = Map::new();
        let mut put = |k: &str, v: Value| {
            if !v.is_null() {
                req.insert(k.to_owned(), v);
            }
        };
        put("model", json!(self.model));
        // The chat checks need a message; the prompt itself is sent raw.
        put("messages", json!([{"role": "user", "content": "-"}]));
        // `max_tokens: 0` generates nothing; the chat checks still read the other fields.
        put(
            "max_tokens",
            json!(self.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS).max(1)),
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
        Ok(Read {
            chat,
            prompts,
            echo,
            generates,
        })
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
    engine: &Engine,
    prompt: &PromptIn,
    top: usize,
) -> Result<Value, ApiError> {
    // Scoring is model work like a generation: a busy server refuses it the same way.
    let _permit = state.admit()?;
    let scorer = engine.clone();
    let prompt_in = prompt.clone();
    let (tokens, scoring) = tokio::task::spawn_blocking(move || match prompt_in {
        PromptIn::Text(text) => scorer.score_text(&text, top),
        PromptIn::Ids(ids) => scorer.score_ids(ids, top),
    })
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
        let text = token_text(engine, &[t]);
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

/// How many tokens `prompt` is to the model (with BOS where the model adds one), counted
/// off the async threads: a long text takes a while to tokenise.
async fn prompt_length(engine: &Engine, prompt: &PromptIn) -> Result<usize, ApiError> {
    let engine = engine.clone();
    let prompt = prompt.to_engine();
    tokio::task::spawn_blocking(move || engine.prompt_tokens(&prompt).map(|t| t.len()))
        .await
        .map_err(|e| ApiError::internal(format!("the request task failed: {e}")))?
        .map_err(ApiError::from)
}

/// The prompt's own scores when it is echoed with `logprobs` (the same for every answer).
async fn echoed_scores(
    state: &AppState,
    engine: &Engine,
    prompt: &PromptIn,
    echo: Echo,
) -> Result<Option<Value>, ApiError> {
    match echo {
        Echo::Scored(top) => Ok(Some(prompt_logprobs(state, engine, prompt, top).await?)),
        Echo::No | Echo::Text => Ok(None),
    }
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
    let Read {
        chat: chat_req,
        prompts,
        echo,
        generates,
    } = body.read()?;
    let mut plan = chat_req.plan()?;
    let engine = state.chat_engine(plan.model.as_deref())?;
    let id = chat::random_id("cmpl-");
    let created = chat::unix_now();
    let scored = plan.logprobs.is_some();
    // What a choice says of its tokens' scores when nothing is generated.
    let nothing_scored = || scored.then(|| legacy_logprobs(&[], 0));
    if !plan.stream {
        let mut choices = Vec::with_capacity(plan.n * prompts.len());
        let mut usage = TokenCounts::default();
        let mut model = engine.info().id.clone();
        for (p, prompt) in prompts.iter().enumerate() {
            let echoed = echoed_scores(&state, &engine, prompt, echo).await?;
            let head = match echo {
                Echo::No => String::new(),
                Echo::Text | Echo::Scored(_) => prompt.text(&engine),
            };
            if !generates {
                usage.prompt += prompt_length(&engine, prompt).await?;
                for i in 0..plan.n {
                    let mut c = choice(
                        &head,
                        Some("length"),
                        echoed.clone().or_else(nothing_scored),
                    );
                    c["index"] = json!(p * plan.n + i);
                    choices.push(c);
                }
                continue;
            }
            let mut answers = Vec::with_capacity(plan.n);
            for (i, mut one) in chat::choice_plans(&plan).into_iter().enumerate() {
                one.raw = Some(prompt.to_engine());
                let started = chat::start(&state, &mut one).await?;
                model = started.model_id;
                let Collected {
                    text,
                    done,
                    logprobs,
                } = chat::collect(started.generation, started.run, &state).await?;
                let lp = match &echoed {
                    Some(scores) => {
                        let mut lp = scores.clone();
                        append_logprobs(&mut lp, legacy_logprobs(&logprobs, covered_chars(scores)));
                        Some(lp)
                    }
                    // Echoed without logprobs: nothing is scored.
                    None => scored.then(|| legacy_logprobs(&logprobs, 0)),
                };
                let mut c = choice(
                    &format!("{head}{text}"),
                    Some(chat::finish_reason(done.finish_reason)),
                    lp,
                );
                c["index"] = json!(p * plan.n + i);
                choices.push(c);
                answers.push(done);
            }
            usage = usage.plus(TokenCounts::of_answers(&answers));
        }
        return Ok(Json(
            json!({"id": id, "object": "text_completion", "created": created,
                   "model": model, "system_fingerprint": null, "choices": choices,
                   "usage": usage.json()}),
        )
        .into_response());
    }
    // Streamed: one prompt (several are refused when the request is read).
    let prompt = &prompts[0];
    let echoed = echoed_scores(&state, &engine, prompt, echo).await?;
    let include_usage = plan.include_usage;
    let model_id = engine.info().id.clone();
    let head = move |model: &str, choices: Value| {
        json!({"id": id, "object": "text_completion", "created": created,
               "model": model, "system_fingerprint": null, "choices": choices})
    };
    let first = (echo != Echo::No).then(|| {
        head(
            &model_id,
            json!([choice(&prompt.text(&engine), None, echoed.clone())]),
        )
    });
    let done = |events: Vec<Value>| {
        let events = events
            .into_iter()
            .map(|v| Ok::<_, Infallible>(Event::default().data(v.to_string())))
            .chain([Ok(Event::default().data("[DONE]"))]);
        Sse::new(futures::stream::iter(events))
            .keep_alive(KeepAlive::default())
            .into_response()
    };
    if !generates {
        let mut events: Vec<Value> = first.into_iter().collect();
        let lp = (echo == Echo::No).then(nothing_scored).flatten();
        events.push(head(&model_id, json!([choice("", Some("length"), lp)])));
        if include_usage {
            let mut u = head(&model_id, json!([]));
            u["usage"] = TokenCounts {
                prompt: prompt_length(&engine, prompt).await?,
                ..TokenCounts::default()
            }
            .json();
            events.push(u);
        }
        return Ok(done(events));
    }
    plan.raw = Some(prompt.to_engine());
    let Started {
        generation,
        run,
        model_id,
        ..
    } = chat::start(&state, &mut plan).await?;
    // Log-probabilities wait for the text of their tokens; `sent` counts the characters
    // sent so far, for the offsets.
    let mut sent = match &echoed {
        Some(lp) => covered_chars(lp),
        None => 0,
    };
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
                chat::Piece::Text(t) => vec![head(&model_id, json!([choice(&t, None, take(&t))]))],
                chat::Piece::Done(done) => {
                    let reason = chat::finish_reason(done.finish_reason);
                    let mut last =
                        vec![head(&model_id, json!([choice("", Some(reason), take(""))]))];
                    if include_usage {
                        let mut u = head(&model_id, json!([]));
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
    fn prompts_are_texts_or_token_ids_as_openai_takes_them() {
        let text = |t: &str| PromptIn::Text(t.to_owned());
        assert_eq!(prompts(json!("a b")).expect("string"), [text("a b")]);
        assert_eq!(prompts(json!(["a b"])).expect("one"), [text("a b")]);
        assert_eq!(
            prompts(json!(["a", "b"])).expect("two"),
            [text("a"), text("b")]
        );
        assert_eq!(
            prompts(json!([1, 2, 3])).expect("ids"),
            [PromptIn::Ids(vec![1, 2, 3])]
        );
        assert_eq!(
            prompts(json!([[1, 2], [3]])).expect("batch of ids"),
            [PromptIn::Ids(vec![1, 2]), PromptIn::Ids(vec![3])]
        );
        for bad in [
            json!(null),
            json!([]),
            json!(""),
            json!(["a", ""]),
            json!([[1], []]),
            json!([1, "a"]),
            json!([-1]),
            json!([1.5]),
            json!([4_294_967_296_u64]),
            json!([[1], "a"]),
            json!([[1, [2]]]),
            json!({"text": "a"}),
        ] {
            assert!(prompts(bad.clone()).is_err(), "{bad} is refused");
        }
        let many: Vec<String> = (0..=MAX_PROMPTS).map(|i| i.to_string()).collect();
        assert!(prompts(json!(many)).is_err());
    }

    #[test]
    fn max_tokens_defaults_to_sixteen_and_chat_checks_apply() {
        let read = request(json!({"prompt": "Once", "echo": true}))
            .read()
            .expect("valid");
        assert_eq!((read.echo, read.generates), (Echo::Text, true));
        assert_eq!(read.prompts, [PromptIn::Text("Once".into())]);
        assert_eq!(read.chat.plan().expect("plan").max_tokens, Some(16));
        let read = request(json!({"prompt": "Once", "echo": true, "logprobs": 2}))
            .read()
            .expect("valid");
        assert_eq!(read.echo, Echo::Scored(2));
        let read = request(json!({"prompt": "Once", "logprobs": 2}))
            .read()
            .expect("valid");
        assert_eq!(read.echo, Echo::No);
        let read = request(json!({"prompt": "x", "temperature": 7}))
            .read()
            .expect("read");
        assert!(
            read.chat.plan().is_err(),
            "the chat checks refuse temperature 7"
        );
        assert!(request(json!({"prompt": ""})).read().is_err());
    }

    #[test]
    fn max_tokens_zero_only_scores_and_the_sampling_fields_are_still_checked() {
        let read = request(json!({"prompt": [5, 6], "max_tokens": 0, "echo": true, "logprobs": 1}))
            .read()
            .expect("valid");
        assert!(!read.generates);
        assert_eq!(read.echo, Echo::Scored(1));
        read.chat.plan().expect("the chat checks pass");
        let read = request(json!({"prompt": "x", "max_tokens": 0, "top_p": 0}))
            .read()
            .expect("read");
        assert!(read.chat.plan().is_err(), "top_p 0 is refused as always");
    }

    #[test]
    fn several_prompts_are_answered_unstreamed_and_bounded_with_n() {
        let two = json!(["a", "b"]);
        assert!(request(json!({"prompt": two, "n": 2})).read().is_ok());
        assert!(request(json!({"prompt": two, "stream": true}))
            .read()
            .is_err());
        let many: Vec<String> = (0..MAX_PROMPTS).map(|i| i.to_string()).collect();
        assert!(request(json!({"prompt": many, "n": 1})).read().is_ok());
        assert!(request(json!({"prompt": many, "n": 2})).read().is_err());
    }
}
