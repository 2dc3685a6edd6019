//! `starling serve`: the OpenAI-compatible HTTP API over the local models, without joining
//! a swarm (like `ollama serve`).

use std::net::SocketAddr;
use std::path::Path;

use anyhow::Context;
use clap::Args;
use tokio_util::sync::CancellationToken;

use crate::api::{self, ApiConfig};
use crate::cli::ModelArgs;
use crate::loading::{build_state, model_switch};

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
    /// A web origin (`https://app.example.com`) whose pages may call the API from a browser
    /// besides this machine's own; repeat for more.
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    pub cors_origins: Vec<String>,
    /// Leave `tool_choice` `auto` and `required` to the chat model alone (by default the
    /// embedding model picks the offered tool that fits the user's message, see
    /// `--tool-router`).
    #[arg(long, conflicts_with = "tool_router")]
    pub no_tool_router: bool,
    /// The cosine between the user's message and a tool's `name: description` at which
    /// `tool_choice: "auto"` calls that tool (0 < t <= 1).
    #[arg(long = "tool-router", value_name = "COSINE", default_value_t = crate::config::DEFAULT_TOOL_ROUTER, value_parser = router_threshold)]
    pub tool_router: f32,
}

fn router_threshold(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(t) if t > 0.0 && t <= 1.0 => Ok(t),
        _ => Err(format!("`{s}` is not a cosine above 0 and at most 1")),
    }
}

/// Loads the models and serves the API until Ctrl-C or SIGTERM.
pub fn run(home: &Path, args: ServeArgs) -> anyhow::Result<()> {
    let config = ApiConfig {
        max_inflight: args.max_inflight.max(1),
        loopback_hosts_only: args.api.ip().is_loopback(),
        api_keys: args.key.api_key.iter().cloned().collect(),
        cors_origins: crate::config::check_cors_origins(&args.cors_origins)
            .map_err(|e| anyhow::anyhow!("--cors-origin {e}"))?,
        tool_router: (!args.no_tool_router).then_some(args.tool_router),
        ..ApiConfig::default()
    };
    // Before the models load: a refusal should not wait for them.
    api::check_exposure(args.api, &config)?;
    let embedding = (!args.no_embeddings).then_some(args.embedding_model.as_str());
    let model = args.model.options();
    let state = build_state(home, &model, embedding, config)?.with_model_switch(model_switch(
        home,
        &model,
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

/// Cancels `cancel` on Ctrl-C or (on Unix) SIGTERM.
async fn stop_on_signal(cancel: CancellationToken) {
    super::wait_for_stop_signal().await;
    eprintln!("stopping");
    cancel.cancel();
}
