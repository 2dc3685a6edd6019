//! `starling serve`: the OpenAI-compatible HTTP API over the local models, without joining
//! a swarm (like `ollama serve`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use starling_models::embed::{BertEmbedder, EmbedBackend, EmbedHandle};
use starling_models::engine::ModelSlot;
use starling_models::source::{registry, ModelCache, ModelSource, Progress};
use tokio_util::sync::CancellationToken;

use crate::api::{self, ApiConfig, AppState};
use crate::cli::ModelArgs;

/// Arguments of `starling serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on. Beyond loopback it needs `--api-key`.
    #[arg(long, default_value_t = api::DEFAULT_ADDR)]
    pub api: SocketAddr,
    /// Which chat model to load.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Embedding model: a registry name, a directory, or a source.
    #[arg(long, env = "STARLING_EMBED_MODEL", default_value = "all-minilm-l6-v2")]
    pub embedding_model: String,
    /// Serve no embedding model (`/v1/embeddings` answers 503).
    #[arg(long)]
    pub no_embeddings: bool,
    /// Inference requests admitted at once, running or queued (more get 429).
    #[arg(long, default_value_t = 32)]
    pub max_inflight: usize,
    /// The API key (added to `api.keys`).
    #[command(flatten)]
    pub key: crate::cli::ServeKeyArgs,
}

/// Loads the models and serves the API until Ctrl-C or SIGTERM.
pub fn run(home: &Path, args: ServeArgs) -> anyhow::Result<()> {
    let config = ApiConfig {
        max_inflight: args.max_inflight.max(1),
        loopback_hosts_only: args.api.ip().is_loopback(),
        api_keys: args.key.api_key.iter().cloned().collect(),
        ..ApiConfig::default()
    };
    // Before the models load: a refusal should not wait for them.
    api::check_exposure(args.api, &config)?;
    let embedding = (!args.no_embeddings).then_some(args.embedding_model.as_str());
    let state = build_state(home, &args.model, embedding, config)?.with_model_switch(model_switch(
        home,
        &args.model,
        &[],
    ));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.api)
            .await
            .with_context(|| format!("cannot listen on {}", args.api))?;
        let addr = listener.local_addr()?;
        eprintln!("OpenAI-compatible API on http://{addr}/v1 (Ctrl-C to stop)");
        let cancel = CancellationToken::new();
        tokio::spawn(stop_on_signal(cancel.clone()));
        api::serve_on(listener, state, cancel).await?;
        Ok(())
    })
}

/// Loads the chat model of `model` and, when `embedding` names one, the embedding model,
/// into an API state. `starling up` builds its API state the same way.
pub fn build_state(
    home: &Path,
    model: &ModelArgs,
    embedding: Option<&str>,
    config: ApiConfig,
) -> anyhow::Result<AppState> {
    let engine = super::load_engine(home, model)?;
    let info = engine.info();
    eprintln!(
        "chat model: {} ({}, {}, context {})",
        info.id, info.architecture, info.quantization, info.context_length
    );
    // A registry name is what users type: answer to it besides the file's own name.
    let aliases = registry::find(&model.model)
        .map(|k| vec![k.name.to_owned()])
        .unwrap_or_default();
    let state = AppState::new(config)
        .with_chat_model_named(ModelSlot::new(engine), aliases)
        .with_model_cache(ModelCache::new(home));
    if let Some(spec) = embedding {
        let handle = load_embedder(home, spec, model.embed_backend)?;
        eprintln!(
            "embedding model: {} ({} dimensions)",
            handle.model_id(),
            handle.dim()
        );
        state.set_embedder(Some(handle));
    }
    Ok(state)
}

/// How `PUT /api/models/active` loads another chat model: with the same options as
/// `model` (context, threads, requantisation), from a registry name, a source, or a file
/// in the model cache, beside the loaded model, or under `dirs`. `starling up` switches
/// the same way.
pub fn model_switch(home: &Path, model: &ModelArgs, dirs: &[PathBuf]) -> api::ModelSwitch {
    let mut allowed = vec![ModelCache::new(home).models_dir().to_path_buf()];
    if let Ok(ModelSource::Local(l)) = registry::parse_spec(&model.model) {
        if let Some(parent) = l.expanded().parent() {
            allowed.push(parent.to_path_buf());
        }
    }
    allowed.extend(dirs.iter().cloned());
    let (home, model) = (home.to_path_buf(), model.clone());
    api::ModelSwitch {
        dirs: allowed,
        load: std::sync::Arc::new(move |spec: &str| {
            let mut args = model.clone();
            args.model = spec.to_owned();
            super::load_engine(&home, &args).map_err(|e| format!("{e:#}"))
        }),
    }
}

/// Resolves `spec` (registry name, directory or source) and starts the embedder on its own
/// thread. A registry name becomes the model's id.
pub fn load_embedder(
    home: &Path,
    spec: &str,
    backend: EmbedBackend,
) -> anyhow::Result<EmbedHandle> {
    let cache = ModelCache::new(home);
    let source = registry::parse_spec(spec)?;
    let dir = cache
        .resolve(&source, &Progress::new())
        .with_context(|| format!("cannot get embedding model `{spec}`"))?;
    let mut embedder = BertEmbedder::load_with(&dir, backend)
        .with_context(|| format!("cannot load embedding model {}", dir.display()))?;
    if let Some(known) = registry::find(spec) {
        embedder = embedder.with_model_id(known.name);
    }
    Ok(EmbedHandle::spawn(embedder)?)
}

/// Cancels `cancel` on Ctrl-C or (on Unix) SIGTERM.
async fn stop_on_signal(cancel: CancellationToken) {
    super::wait_for_stop_signal().await;
    eprintln!("stopping");
    cancel.cancel();
}
