//! What the API's handlers share: the served models, limits, counters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use starling_models::embed::EmbedHandle;
use starling_models::engine::{Engine, ModelSlot};
use starling_models::source::ModelCache;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::error::ApiError;

/// Limits and defaults of the API.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiConfig {
    /// Largest accepted request body, in bytes (larger ones get 413).
    pub max_body_bytes: usize,
    /// Inference requests (chat and embeddings) admitted at once, running or queued; more
    /// get 429.
    pub max_inflight: usize,
    /// Most texts in one embeddings request.
    pub max_embedding_inputs: usize,
    /// Output tokens when a chat request names no limit; None means up to the context window
    /// (OpenAI's behaviour).
    pub default_max_tokens: Option<usize>,
    /// Answer only requests whose `Host` header names loopback (`localhost`, `127.x.x.x`,
    /// `[::1]`). This stops web pages from reaching the API through DNS rebinding; turn it
    /// off only when the API is deliberately served on another interface.
    pub loopback_hosts_only: bool,
    /// API keys: when any is set, every request needs `Authorization: Bearer <key>` with one
    /// of them. The API refuses to listen beyond loopback without one (see
    /// [`super::check_exposure`]).
    pub api_keys: Vec<String>,
    /// How long a client may take to send a request's headers; an idle keep-alive
    /// connection waiting for its next request is closed after this too.
    pub header_timeout: std::time::Duration,
    /// How long a request body may take to arrive.
    pub body_timeout: std::time::Duration,
    /// Most connections served at once; more are closed as they are accepted.
    pub max_connections: usize,
    /// Web origins (lower-case, as [`crate::config::check_cors_origin`] returns them) whose
    /// pages get CORS headers, besides loopback pages, which always do.
    pub cors_origins: Vec<String>,
    /// The embedding router for `tool_choice` `auto` and `required`
    /// ([`super::tools::ToolPlan::route`]): with an embedding model served, the offered tool
    /// most similar to the user's message is called (under `auto` when the cosine reaches
    /// this); `None` leaves every such decision to the chat model.
    pub tool_router: Option<f32>,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 4 * 1024 * 1024,
            max_inflight: 32,
            max_embedding_inputs: 2048,
            default_max_tokens: None,
            loopback_hosts_only: true,
            api_keys: Vec::new(),
            header_timeout: std::time::Duration::from_secs(30),
            body_timeout: std::time::Duration::from_secs(60),
            max_connections: 1024,
            cors_origins: Vec::new(),
            tool_router: Some(crate::config::DEFAULT_TOOL_ROUTER),
        }
    }
}

/// The chat model and the extra names it answers to.
#[derive(Clone)]
struct ChatModel {
    slot: ModelSlot,
    aliases: Vec<String>,
}

/// State shared by every handler. Cheap to clone.
///
/// Worked examples for `/v1/chat/completions`: up to `k` memories of the general domain
/// similar to the last user message (cosine >= `min_cosine`) go into the system message.
#[derive(Clone, Debug)]
pub struct MemoryExamples {
    /// Where the memories come from.
    pub book: crate::memory::MemoryBook,
    /// Most examples per request.
    pub k: usize,
    /// Lowest cosine between the last user message and a memory's prompt.
    pub min_cosine: f32,
}

/// Loads a chat model by the spec a user gave (registry name, source or path), or says
/// why not. Supplied by the binary, which knows the model options and the model cache.
pub type LoadModel = Arc<dyn Fn(&str) -> Result<Engine, String> + Send + Sync>;

/// How `PUT /api/models/active` may switch the chat model.
#[derive(Clone)]
pub struct ModelSwitch {
    /// The only directories whose files may be loaded (besides registry names and
    /// download sources), so the API reveals nothing about other files.
    pub dirs: Vec<std::path::PathBuf>,
    /// Loads a model.
    pub load: LoadModel,
}

/// The model cache `/api/pull` fetches into, and the lock that makes pulls take turns.
#[derive(Clone)]
pub(crate) struct ModelPulls {
    pub cache: ModelCache,
    pub turn: Arc<tokio::sync::Mutex<()>>,
}

/// Models can be set, replaced or removed while the server runs: a request takes the model
/// in place when it starts and keeps it to its end.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Shared>,
}

struct Shared {
    config: ApiConfig,
    chat: RwLock<Option<ChatModel>>,
    embedder: RwLock<Option<EmbedHandle>>,
    examples: RwLock<Option<MemoryExamples>>,
    metrics: Metrics,
    inflight: Arc<Semaphore>,
    shutdown: CancellationToken,
    created: u64,
    /// Where `/api/pull` fetches registry models to, and one pull at a time.
    pulls: std::sync::OnceLock<ModelPulls>,
    /// How `PUT /api/models/active` loads another chat model, if it may.
    switch: std::sync::OnceLock<ModelSwitch>,
}

impl AppState {
    /// A state serving no model yet.
    pub fn new(config: ApiConfig) -> Self {
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Self {
            inner: Arc::new(Shared {
                inflight: Arc::new(Semaphore::new(config.max_inflight.max(1))),
                config,
                chat: RwLock::new(None),
                embedder: RwLock::new(None),
                examples: RwLock::new(None),
                metrics: Metrics::default(),
                shutdown: CancellationToken::new(),
                created,
                pulls: std::sync::OnceLock::new(),
                switch: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Serves `slot` as the chat model (builder form of [`set_chat_model`](Self::set_chat_model)).
    pub fn with_chat_model(self, slot: ModelSlot) -> Self {
        self.set_chat_model(Some(slot), Vec::new());
        self
    }

    /// Serves `slot` as the chat model, answering also to `aliases` (for example the
    /// registry name the user loaded it by) besides the model's own id.
    pub fn with_chat_model_named(self, slot: ModelSlot, aliases: Vec<String>) -> Self {
        self.set_chat_model(Some(slot), aliases);
        self
    }

    /// Lets `/api/pull` fetch the registry's models into `cache` (the cache the server
    /// loads its own models from). Without it, pulls are refused with 503.
    pub fn with_model_cache(self, cache: ModelCache) -> Self {
        // Set once, while the state is built; a second call keeps the first cache.
        let _ = self.inner.pulls.set(ModelPulls {
            cache,
            turn: Arc::new(tokio::sync::Mutex::new(())),
        });
        self
    }

    /// Where `/api/pull` fetches to, if anywhere.
    pub(crate) fn model_pulls(&self) -> Option<ModelPulls> {
        self.inner.pulls.get().cloned()
    }

    /// Lets `PUT /api/models/active` switch the chat model (without it, switching is
    /// refused with 503).
    pub fn with_model_switch(self, switch: ModelSwitch) -> Self {
        // Set once, while the state is built; a second call keeps the first.
        let _ = self.inner.switch.set(switch);
        self
    }

    /// How to switch the chat model, if this server may.
    pub(crate) fn model_switch(&self) -> Option<ModelSwitch> {
        self.inner.switch.get().cloned()
    }

    /// Serves `handle` as the embedding model.
    pub fn with_embedder(self, handle: EmbedHandle) -> Self {
        self.set_embedder(Some(handle));
        self
    }

    /// Sets or removes the chat model.
    pub fn set_chat_model(&self, slot: Option<ModelSlot>, aliases: Vec<String>) {
        let mut guard = self.inner.chat.write().unwrap_or_else(|p| p.into_inner());
        *guard = slot.map(|slot| ChatModel { slot, aliases });
    }

    /// Sets or removes the embedding model.
    pub fn set_embedder(&self, handle: Option<EmbedHandle>) {
        *self
            .inner
            .embedder
            .write()
            .unwrap_or_else(|p| p.into_inner()) = handle;
    }

    /// Puts worked examples from shared memories into chat completions (`None`: off).
    pub fn set_memory_examples(&self, examples: Option<MemoryExamples>) {
        *self
            .inner
            .examples
            .write()
            .unwrap_or_else(|p| p.into_inner()) = examples;
    }

    /// The memory examples setting, when on.
    pub fn memory_examples(&self) -> Option<MemoryExamples> {
        self.inner
            .examples
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The chat model's slot, for hot swapping.
    pub fn chat_slot(&self) -> Option<ModelSlot> {
        self.chat().map(|c| c.slot)
    }

    /// The embedding model.
    pub fn embedder(&self) -> Option<EmbedHandle> {
        self.inner
            .embedder
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The limits in force.
    pub fn config(&self) -> &ApiConfig {
        &self.inner.config
    }

    /// A copy of the counters.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner.metrics.snapshot()
    }

    /// Ends running streams (each gets an error event and `[DONE]`) and refuses new
    /// inference. Called by [`serve`](super::serve) when it is cancelled.
    pub fn begin_shutdown(&self) {
        self.inner.shutdown.cancel();
    }

    pub(crate) fn shutdown_token(&self) -> &CancellationToken {
        &self.inner.shutdown
    }

    pub(crate) fn counters(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// Unix time the server started; the `created` of every listed model.
    pub(crate) fn created(&self) -> u64 {
        self.inner.created
    }

    fn chat(&self) -> Option<ChatModel> {
        self.inner
            .chat
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The chat engine a request for `model` should run on: 503 without a chat model, 404
    /// when `model` names another one.
    pub(crate) fn chat_engine(&self, model: Option<&str>) -> Result<Engine, ApiError> {
        let Some(chat) = self.chat() else {
            return Err(ApiError::model_not_loaded("chat"));
        };
        let engine = chat.slot.current();
        if let Some(name) = model {
            let id = &engine.info().id;
            if !same_model(name, id) && !chat.aliases.iter().any(|a| same_model(name, a)) {
                return Err(ApiError::model_not_found(name, &self.model_ids()));
            }
        }
        Ok(engine)
    }

    /// The embedder a request for `model` should run on.
    pub(crate) fn embed_handle(&self, model: Option<&str>) -> Result<EmbedHandle, ApiError> {
        let Some(handle) = self.embedder() else {
            return Err(ApiError::model_not_loaded("embedding"));
        };
        if let Some(name) = model {
            if !same_model(name, handle.model_id()) {
                return Err(ApiError::model_not_found(name, &self.model_ids()));
            }
        }
        Ok(handle)
    }

    /// The file behind the served model of `kind` (`chat`); `None` for the embedder, whose
    /// handle does not keep it.
    pub(crate) fn model_info(&self, kind: &str) -> Option<starling_models::engine::ModelInfo> {
        match kind {
            "chat" => self.chat().map(|c| c.slot.current().info().clone()),
            _ => None,
        }
    }

    /// Every model served, chat first: (id, kind, aliases).
    pub(crate) fn served_models(&self) -> Vec<ServedModel> {
        let mut out = Vec::new();
        if let Some(chat) = self.chat() {
            let engine = chat.slot.current();
            out.push(ServedModel {
                id: engine.info().id.clone(),
                kind: "chat",
                aliases: chat.aliases.clone(),
                context_length: Some(engine.info().context_length),
            });
        }
        if let Some(embed) = self.embedder() {
            out.push(ServedModel {
                id: embed.model_id().to_owned(),
                kind: "embedding",
                aliases: Vec::new(),
                context_length: Some(embed.max_len()),
            });
        }
        out
    }

    fn model_ids(&self) -> Vec<String> {
        self.served_models().into_iter().map(|m| m.id).collect()
    }

    /// Admits one inference request, or answers 429 when too many are in flight (503 once
    /// shutting down).
    pub(crate) fn admit(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        if self.inner.shutdown.is_cancelled() {
            return Err(ApiError::shutting_down());
        }
        self.inner
            .inflight
            .clone()
            .try_acquire_owned()
            .map_err(|_| ApiError::busy(self.inner.config.max_inflight))
    }
}

/// A model as listed by `/v1/models`.
#[derive(Debug, Clone)]
pub(crate) struct ServedModel {
    pub id: String,
    pub kind: &'static str,
    pub aliases: Vec<String>,
    pub context_length: Option<usize>,
}

impl ServedModel {
    /// Whether `name` refers to this model.
    pub fn answers_to(&self, name: &str) -> bool {
        same_model(name, &self.id) || self.aliases.iter().any(|a| same_model(name, a))
    }
}

/// Model names compare case-insensitively; a leading `owner/` (as in
/// `sentence-transformers/all-MiniLM-L6-v2`) and Ollama's `:latest` tag are ignored.
fn same_model(requested: &str, served: &str) -> bool {
    let base = |s: &str| {
        let s = s.rsplit('/').next().unwrap_or(s);
        s.strip_suffix(":latest").unwrap_or(s).to_ascii_lowercase()
    };
    !requested.is_empty() && base(requested) == base(served)
}

/// Counters of the API, updated lock-free.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    pub http_requests: AtomicU64,
    pub client_errors: AtomicU64,
    pub server_errors: AtomicU64,
    pub chat_completions: AtomicU64,
    pub embedding_requests: AtomicU64,
    pub embedded_texts: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    pub cached_prompt_tokens: AtomicU64,
    pub cancelled_generations: AtomicU64,
    pub active_generations: AtomicU64,
}

impl Metrics {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn snapshot(&self) -> MetricsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MetricsSnapshot {
            http_requests: get(&self.http_requests),
            client_errors: get(&self.client_errors),
            server_errors: get(&self.server_errors),
            chat_completions: get(&self.chat_completions),
            embedding_requests: get(&self.embedding_requests),
            embedded_texts: get(&self.embedded_texts),
            prompt_tokens: get(&self.prompt_tokens),
            completion_tokens: get(&self.completion_tokens),
            cached_prompt_tokens: get(&self.cached_prompt_tokens),
            cancelled_generations: get(&self.cancelled_generations),
            active_generations: get(&self.active_generations),
        }
    }
}

/// The API's counters at one moment (also served at `GET /health`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MetricsSnapshot {
    /// Requests answered (any route, any status).
    pub http_requests: u64,
    /// Answers with a 4xx status.
    pub client_errors: u64,
    /// Answers with a 5xx status.
    pub server_errors: u64,
    /// Chat completions started (streaming or not).
    pub chat_completions: u64,
    /// Embeddings requests served.
    pub embedding_requests: u64,
    /// Texts embedded.
    pub embedded_texts: u64,
    /// Prompt tokens of finished chat completions.
    pub prompt_tokens: u64,
    /// Tokens generated by finished chat completions.
    pub completion_tokens: u64,
    /// Prompt tokens reused from the KV cache.
    pub cached_prompt_tokens: u64,
    /// Generations stopped before their end because the client went away or the server
    /// shut down.
    pub cancelled_generations: u64,
    /// Generations running or queued now.
    pub active_generations: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_match_loosely_but_not_emptily() {
        assert!(same_model("all-minilm-l6-v2", "all-MiniLM-L6-v2"));
        assert!(same_model(
            "sentence-transformers/all-MiniLM-L6-v2",
            "all-MiniLM-L6-v2"
        ));
        assert!(!same_model("gpt-4o", "smollm2"));
        assert!(!same_model("", "smollm2"));
    }

    #[test]
    fn admission_is_bounded_and_refused_after_shutdown() {
        let state = AppState::new(ApiConfig {
            max_inflight: 2,
            ..ApiConfig::default()
        });
        let a = state.admit().expect("first");
        let _b = state.admit().expect("second");
        assert_eq!(state.admit().err().map(|e| e.status().as_u16()), Some(429));
        drop(a);
        let _c = state.admit().expect("a permit came back");
        state.begin_shutdown();
        drop(_c);
        assert_eq!(state.admit().err().map(|e| e.status().as_u16()), Some(503));
    }

    #[test]
    fn missing_models_are_503() {
        let state = AppState::new(ApiConfig::default());
        assert_eq!(
            state.chat_engine(None).err().map(|e| e.status().as_u16()),
            Some(503)
        );
        assert_eq!(
            state
                .embed_handle(Some("x"))
                .err()
                .map(|e| e.status().as_u16()),
            Some(503)
        );
        assert!(state.served_models().is_empty());
    }
}
