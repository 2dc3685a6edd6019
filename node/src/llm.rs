//! The agent's access to its local model: free text answers and *decisions* (JSON that
//! always validates against a schema, enforced token by token by the constrained decoder).
//!
//! Every agent module (team formation, group chat turns, task execution, memory scoring)
//! goes through [`Llm`], which also counts the tokens spent, so communication cost per
//! task can be reported.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::Value;
use starling_models::chat::ChatMessage;
use starling_models::constraint::Constraint;
use starling_models::engine::{GenerateRequest, ModelSlot, Prompt};
use starling_models::sampling::SamplingOptions;

use crate::outside::Busy;

/// Why the model could not answer.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// Generation failed (model error, queue closed, bad request).
    #[error("the local model failed: {0}")]
    Model(#[from] starling_models::ModelError),
    /// Output did not parse into the expected type. With a constraint this only happens
    /// when `max_tokens` cut the JSON short.
    #[error("the model's decision was cut short or does not fit: {0}")]
    Decode(String),
}

/// Token counters, shared by clones of an [`Llm`].
#[derive(Debug, Default)]
pub struct TokenCounters {
    /// Prompt tokens processed (including cached ones).
    pub prompt: AtomicU64,
    /// Tokens generated.
    pub completion: AtomicU64,
    /// Calls made.
    pub calls: AtomicU64,
    /// Milliseconds spent generating (decode), for tokens per second.
    pub generation_ms: AtomicU64,
    /// Calls waiting for or running on the model right now.
    pub in_flight: AtomicU64,
}

impl TokenCounters {
    /// (prompt, completion, calls) so far.
    pub fn snapshot(&self) -> (u64, u64, u64) {
        (
            self.prompt.load(Ordering::Relaxed),
            self.completion.load(Ordering::Relaxed),
            self.calls.load(Ordering::Relaxed),
        )
    }
}

/// The node's chat model, as the agent uses it.
#[derive(Clone)]
pub struct Llm {
    slot: ModelSlot,
    sampling: SamplingOptions,
    counters: Arc<TokenCounters>,
}

impl std::fmt::Debug for Llm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Llm")
            .field("model", &self.slot.current().info().id)
            .finish()
    }
}

impl Llm {
    /// Wraps the model slot (hot-swappable: each call uses the model active at that time).
    /// Decisions use greedy decoding with a mild repetition penalty, so they are
    /// reproducible; free text uses the same unless [`Llm::with_sampling`] says otherwise.
    pub fn new(slot: ModelSlot) -> Self {
        Self {
            slot,
            sampling: SamplingOptions {
                temperature: 0.0,
                repeat_penalty: 1.1,
                ..SamplingOptions::default()
            },
            counters: Arc::new(TokenCounters::default()),
        }
    }

    /// Uses `sampling` for every call.
    pub fn with_sampling(mut self, sampling: SamplingOptions) -> Self {
        self.sampling = sampling;
        self
    }

    /// Tokens spent through this handle and its clones.
    pub fn counters(&self) -> &Arc<TokenCounters> {
        &self.counters
    }

    /// The model's context length in tokens.
    pub fn context_length(&self) -> usize {
        self.slot.current().info().context_length
    }

    async fn run(
        &self,
        messages: Vec<ChatMessage>,
        max_tokens: usize,
        constraint: Option<Constraint>,
    ) -> Result<String, LlmError> {
        struct InFlight<'a>(&'a AtomicU64);
        impl Drop for InFlight<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Relaxed);
            }
        }
        self.counters.in_flight.fetch_add(1, Ordering::Relaxed);
        let _guard = InFlight(&self.counters.in_flight);
        let engine = self.slot.current();
        let req = GenerateRequest {
            prompt: Prompt::Chat(messages),
            max_tokens,
            sampling: self.sampling.clone(),
            stop: Vec::new(),
            constraint,
            logprobs: None,
        };
        let (text, done) = {
            // The model runs on its own thread.
            let _busy = Busy::start();
            engine.generate(req)?.text().await?
        };
        self.counters
            .prompt
            .fetch_add(done.prompt_tokens as u64, Ordering::Relaxed);
        self.counters
            .completion
            .fetch_add(done.completion_tokens as u64, Ordering::Relaxed);
        self.counters.calls.fetch_add(1, Ordering::Relaxed);
        self.counters
            .generation_ms
            .fetch_add(done.generation_ms.max(0.0) as u64, Ordering::Relaxed);
        Ok(text)
    }

    /// A free-text answer.
    pub async fn answer(
        &self,
        messages: Vec<ChatMessage>,
        max_tokens: usize,
    ) -> Result<String, LlmError> {
        Ok(self
            .run(messages, max_tokens, None)
            .await?
            .trim()
            .to_owned())
    }

    /// A decision: JSON valid under `schema`, parsed into `T`.
    pub async fn decide<T: DeserializeOwned>(
        &self,
        messages: Vec<ChatMessage>,
        schema: &Value,
        max_tokens: usize,
    ) -> Result<T, LlmError> {
        let text = self
            .run(
                messages,
                max_tokens,
                Some(Constraint::JsonSchema(schema.clone())),
            )
            .await?;
        serde_json::from_str(&text).map_err(|e| LlmError::Decode(format!("{e}: {text}")))
    }

    /// Output matching a regular expression (e.g. a bare number).
    pub async fn matching(
        &self,
        messages: Vec<ChatMessage>,
        regex: &str,
        max_tokens: usize,
    ) -> Result<String, LlmError> {
        self.run(
            messages,
            max_tokens,
            Some(Constraint::Regex(regex.to_owned())),
        )
        .await
    }
}

/// A model decision, as the agent runtime asks for one: JSON valid under a schema. A narrow
/// trait so that tests can script the decisions (and their failures) of each node while
/// everything else runs for real; [`Llm`] is the product's one implementation.
pub trait Decide: Send + Sync + 'static {
    /// A decision under `schema` (at most `max_tokens` tokens), as JSON.
    fn decide_json<'a>(
        &'a self,
        messages: Vec<ChatMessage>,
        schema: &'a Value,
        max_tokens: usize,
    ) -> futures::future::BoxFuture<'a, Result<Value, LlmError>>;
}

impl Decide for Llm {
    fn decide_json<'a>(
        &'a self,
        messages: Vec<ChatMessage>,
        schema: &'a Value,
        max_tokens: usize,
    ) -> futures::future::BoxFuture<'a, Result<Value, LlmError>> {
        Box::pin(self.decide(messages, schema, max_tokens))
    }
}
