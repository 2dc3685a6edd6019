//! Implementations of the `starling` subcommands.

pub mod bench;
pub mod client;
pub mod demo;
pub mod embed;
pub mod eval;
pub mod eval_admission;
pub mod eval_format;
pub mod eval_memory;
pub mod eval_swarm_qa;
pub mod generate;
pub mod mcp;
pub mod memory;
pub mod models;
pub mod peers;
pub mod serve;
pub mod task;
pub mod up;

use std::path::{Path, PathBuf};

use anyhow::Context;
use starling_models::engine::{Engine, EngineConfig};
use starling_models::requant::{self, Requantize};
use starling_models::source::{registry, ModelCache, Progress};

use crate::cli::ModelArgs;

/// The data directory: `--home`, `$STARLING_HOME`, or the platform default.
pub fn home_dir(flag: Option<&Path>) -> anyhow::Result<PathBuf> {
    match flag {
        Some(p) => Ok(p.to_path_buf()),
        None => Ok(ModelCache::default_data_dir()?),
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

/// Resolves `--model` to a local GGUF file (fetching it when needed) and applies the
/// `--requantize` policy.
pub fn resolve_chat_model(home: &Path, args: &ModelArgs) -> anyhow::Result<PathBuf> {
    let cache = ModelCache::new(home);
    let source = registry::parse_spec(&args.model)?;
    let path = cache
        .resolve(&source, &Progress::new())
        .with_context(|| format!("cannot get model `{}`", args.model))?;
    let policy: Requantize = args.requantize.parse()?;
    let path = requant::prepare(&path, policy, cache.models_dir())
        .with_context(|| format!("cannot prepare {}", path.display()))?;
    Ok(path)
}

/// Resolves and loads the chat model named by `args`.
pub fn load_engine(home: &Path, args: &ModelArgs) -> anyhow::Result<Engine> {
    apply_threads(args.threads);
    let path = resolve_chat_model(home, args)?;
    let config = EngineConfig {
        max_seq_len: args.ctx,
        device: args.device,
        ..EngineConfig::default()
    };
    Engine::load(&path, &config).with_context(|| format!("cannot load {}", path.display()))
}

/// Runs `fut` on a small single-threaded runtime (for commands that make a few HTTP calls).
pub fn block_on<F: std::future::Future>(fut: F) -> anyhow::Result<F::Output> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    Ok(rt.block_on(fut))
}

/// Waits for Ctrl-C or (on Unix) SIGTERM.
pub async fn wait_for_stop_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
