//! Implementations of the `starling` subcommands.

pub mod bench;
pub mod client;
pub mod demo;
pub mod embed;
pub mod eval;
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
use starling_models::source::ModelCache;

/// The data directory: `--home`, `$STARLING_HOME`, or the platform default.
pub fn home_dir(flag: Option<&Path>) -> anyhow::Result<PathBuf> {
    match flag {
        Some(p) => Ok(p.to_path_buf()),
        None => Ok(ModelCache::default_data_dir()?),
    }
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
