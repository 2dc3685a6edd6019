//! Loading the node's models from names, sources and files: shared by the daemon
//! (`starling up`) and the binary's commands, so that neither reaches into the other.
//!
//! [`ModelOptions`] is what a config or a command line says about the models; the command
//! line's `ModelArgs` (in `cli`) converts into it.

use std::path::{Path, PathBuf};

use anyhow::Context;
use starling_models::embed::{BertEmbedder, EmbedBackend, EmbedHandle};
use starling_models::engine::{DeviceKind, Engine, EngineConfig, ModelSlot};
use starling_models::requant::{self, Requantize};
use starling_models::source::{registry, ModelCache, ModelSource, Progress};

use crate::api::{self, ApiConfig, AppState};
use crate::config::NodeConfig;

/// How to load the chat model (and with which embedding backend).
#[derive(Debug, Clone)]
pub struct ModelOptions {
    /// A registry name, a path to a GGUF file, or a source (`hf:…`, `pip:…`).
    pub model: String,
    /// The requantisation policy (`auto`, `off`, `q8_0`, `q4_0`).
    pub requantize: String,
    /// Context length in tokens (capped by the model's own).
    pub ctx: usize,
    /// CPU threads for inference (`None`: all cores).
    pub threads: Option<usize>,
    /// Where the chat model runs.
    pub device: DeviceKind,
    /// The embedding backend.
    pub embed_backend: EmbedBackend,
}

impl ModelOptions {
    /// The options a node's config describes.
    pub fn from_config(config: &NodeConfig) -> Self {
        Self {
            model: config.models.chat.clone(),
            requantize: config.models.requantize.clone(),
            ctx: config.models.context,
            threads: config.models.threads,
            device: DeviceKind::Cpu,
            // Checked by `NodeConfig::validate`.
            embed_backend: config.models.embedding_backend.parse().unwrap_or_default(),
        }
    }
}

/// Sets the CPU thread count of the inference backend. Must run before the first model
/// operation (the thread pool is created once).
pub fn apply_threads(threads: Option<usize>) {
    if let Some(n) = threads.filter(|&n| n > 0) {
        // Runs at start-up on the main thread, before any other thread exists.
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    }
}

/// Resolves the model to a local GGUF file (fetching it when needed) and applies the
/// requantisation policy.
pub fn resolve_chat_model(home: &Path, options: &ModelOptions) -> anyhow::Result<PathBuf> {
    let cache = ModelCache::new(home);
    let source = registry::parse_spec(&options.model)?;
    let path = cache
        .resolve(&source, &Progress::new())
        .with_context(|| format!("cannot get model `{}`", options.model))?;
    let policy: Requantize = options.requantize.parse()?;
    let path = requant::prepare(&path, policy, cache.models_dir())
        .with_context(|| format!("cannot prepare {}", path.display()))?;
    Ok(path)
}

/// Resolves and loads the chat model named by `options`.
pub fn load_engine(home: &Path, options: &ModelOptions) -> anyhow::Result<Engine> {
    apply_threads(options.threads);
    let path = resolve_chat_model(home, options)?;
    let config = EngineConfig {
        max_seq_len: options.ctx,
        device: options.device,
        ..EngineConfig::default()
    };
    Engine::load(&path, &config).with_context(|| format!("cannot load {}", path.display()))
}

/// Loads the chat model of `model` and, when `embedding` names one, the embedding model,
/// into an API state (`starling serve` and `starling up` alike).
pub fn build_state(
    home: &Path,
    model: &ModelOptions,
    embedding: Option<&str>,
    config: ApiConfig,
) -> anyhow::Result<AppState> {
    let engine = load_engine(home, model)?;
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
/// in the model cache, beside the loaded model, or under `dirs`.
pub fn model_switch(home: &Path, model: &ModelOptions, dirs: &[PathBuf]) -> api::ModelSwitch {
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
            let mut options = model.clone();
            options.model = spec.to_owned();
            load_engine(&home, &options).map_err(|e| format!("{e:#}"))
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
