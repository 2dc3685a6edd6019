//! `starling up`: run a node (swarm + models + HTTP API) until Ctrl-C.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use starling_discovery::JoinCode;

use crate::config::NodeConfig;
use crate::daemon::{Node, StartOptions};

/// Arguments of `starling up`. Flags override the config file, which overrides defaults.
#[derive(Debug, Args)]
pub struct UpArgs {
    /// Node config (TOML); see `configs/` for commented examples. Every key has a default.
    #[arg(short, long)]
    pub config: Option<PathBuf>,
    /// Identity, database and peer cache (default: `$STARLING_HOME/node`).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Node name shown to peers (default: the host name).
    #[arg(long)]
    pub name: Option<String>,
    /// UDP address for QUIC (default 0.0.0.0:7420). A loopback address keeps the node,
    /// and its mDNS, off every network interface.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Address peers should dial, if not the listen address.
    #[arg(long)]
    pub advertise: Option<SocketAddr>,
    /// A peer to dial at start, `HOST:PORT` or `NODEID@HOST:PORT` (repeatable).
    #[arg(long = "bootstrap", value_name = "ADDR")]
    pub bootstrap: Vec<String>,
    /// Where the local HTTP API listens (default 127.0.0.1:7431). Beyond loopback it
    /// needs an API key.
    #[arg(long)]
    pub api: Option<SocketAddr>,
    /// The API key (added to `api.keys`).
    #[command(flatten)]
    pub key: crate::cli::ServeKeyArgs,
    /// Join a swarm with a code printed by `starling invite` on one of its nodes.
    #[arg(long, value_name = "CODE")]
    pub join: Option<String>,
    /// Set the swarm secret directly (scripts and tests); stored for later starts.
    #[arg(
        long,
        value_name = "SECRET",
        env = "STARLING_SWARM_SECRET",
        hide_env_values = true
    )]
    pub swarm_secret: Option<String>,
    /// Do not use mDNS (no multicast at all).
    #[arg(long)]
    pub no_mdns: bool,
    /// Chat model (registry name, GGUF path or source); overrides `models.chat`.
    #[arg(short, long)]
    pub model: Option<String>,
    /// Embedding model; `none` serves none. Overrides `models.embedding`.
    #[arg(long)]
    pub embedding_model: Option<String>,
    /// Print the node's id and addresses as JSON on stdout once it is up.
    #[arg(long)]
    pub json: bool,
}

impl UpArgs {
    /// The config file (if any) with these flags applied, validated.
    pub fn effective_config(&self) -> anyhow::Result<NodeConfig> {
        let mut c = match &self.config {
            Some(p) => NodeConfig::load(p)?,
            None => NodeConfig::default(),
        };
        if let Some(d) = &self.data_dir {
            c.node.data_dir = Some(d.clone());
        }
        if let Some(n) = &self.name {
            c.node.name = Some(n.clone());
        }
        if let Some(l) = self.listen {
            c.network.listen = l;
        }
        if let Some(a) = self.advertise {
            c.network.advertise = Some(a);
        }
        c.network.bootstrap.extend(self.bootstrap.iter().cloned());
        if let Some(a) = self.api {
            c.api.listen = a;
        }
        if let Some(k) = &self.key.api_key {
            c.api.keys.push(k.clone());
        }
        if let Some(s) = &self.swarm_secret {
            c.network.swarm_secret = Some(s.clone());
        }
        if self.no_mdns {
            c.network.mdns = false;
        }
        if let Some(m) = &self.model {
            c.models.chat = m.clone();
        }
        if let Some(m) = &self.embedding_model {
            c.models.embedding = if m == "none" {
                String::new()
            } else {
                m.clone()
            };
        }
        c.validate()?;
        Ok(c)
    }
}

/// Runs the node until Ctrl-C or SIGTERM.
pub fn run(home: &Path, args: UpArgs) -> anyhow::Result<()> {
    let config = args.effective_config()?;
    let join = args
        .join
        .as_deref()
        .map(|s| s.trim().parse::<JoinCode>())
        .transpose()
        .map_err(|e| anyhow::anyhow!("--join: {e}"))?;
    crate::loading::apply_threads(config.models.threads);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let node = Node::start(
            config,
            StartOptions {
                join,
                home: home.to_path_buf(),
                ..StartOptions::default()
            },
        )
        .await?;
        let id = node.swarm.node_id();
        if args.json {
            let info = serde_json::json!({
                "id": id.to_string(),
                "name": node.swarm.name(),
                "addr": node.swarm.advertised_addr().to_string(),
                "api": node.api_addr.to_string(),
            });
            println!("{info}");
        }
        eprintln!(
            "node {} ({}) up\n  QUIC     {}\n  API      http://{}  (dashboard, /v1 OpenAI-compatible, /api node API)\n  peers:   starling peers --api {}\n  invite:  starling invite --api {}",
            node.swarm.name(),
            id,
            node.swarm.advertised_addr(),
            node.api_addr,
            node.api_addr,
            node.api_addr,
        );
        super::wait_for_stop_signal().await;
        eprintln!("leaving the swarm");
        node.shutdown().await;
        Ok(())
    })
}
