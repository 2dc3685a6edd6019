//! A running node (`starling up`): the swarm, the models and the HTTP API, wired together.
//!
//! [`Node::start`] does the work in order: data directory and swarm secret, models, swarm
//! (with the SQLite record store, so received cards and memories survive restarts), then
//! the HTTP API (OpenAI-compatible routes + node API). [`Node::shutdown`] leaves the swarm
//! gracefully so peers see a clean departure instead of a failure.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use starling_discovery::{BootstrapPeer, JoinCode, Swarm, SwarmConfig, SwarmSecret};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use starling_models::embed::EmbedHandle;
use starling_models::engine::ModelSlot;

use crate::agent::executor::{Executor, ExecutorConfig};
use crate::agent::runtime::{Agent, AgentOptions};
use crate::agent::tools::ToolBox;
use crate::api::node::NodeHandles;
use crate::api::{self, ApiConfig, AppState};
use crate::config::NodeConfig;
use crate::llm::Llm;
use crate::loading::{self, ModelOptions};
use crate::store::Store;

/// How long [`Node::shutdown`] lets open HTTP connections finish before closing them.
pub const API_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// How long [`Node::shutdown`] waits for background work (the memory sync, card and
/// event followers, a memory being scored) to stop before aborting it.
pub const BACKGROUND_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// File in the data dir holding the swarm secret (base32, owner-readable only).
pub const SECRET_FILE: &str = "swarm.secret";

/// Where the secret came from, for the start-up message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretOrigin {
    /// `--join CODE`.
    JoinCode,
    /// `--swarm-secret` or `network.swarm_secret`.
    Configured,
    /// The data dir, from an earlier start.
    Stored,
    /// Nothing given: this node started a new swarm.
    Created,
}

/// Picks the swarm secret: a join code, else an explicit secret, else the one stored in
/// `data_dir`, else a new one. Whatever is used is stored, so a restart stays in the same
/// swarm without flags.
pub fn resolve_secret(
    data_dir: &Path,
    join: Option<&JoinCode>,
    configured: Option<&str>,
) -> anyhow::Result<(SwarmSecret, SecretOrigin)> {
    let path = data_dir.join(SECRET_FILE);
    let (secret, origin) = if let Some(code) = join {
        (code.secret.clone(), SecretOrigin::JoinCode)
    } else if let Some(s) = configured {
        let secret: SwarmSecret = s
            .trim()
            .parse()
            .map_err(|_| anyhow::anyhow!("the swarm secret is not valid (52 base32 characters, as printed by `starling invite --secret`)"))?;
        (secret, SecretOrigin::Configured)
    } else if path.exists() {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let secret = text.trim().parse().map_err(|_| {
            anyhow::anyhow!(
                "{} does not hold a valid swarm secret; fix or delete it (deleting starts a new swarm)",
                path.display()
            )
        })?;
        return Ok((secret, SecretOrigin::Stored));
    } else {
        (SwarmSecret::generate(), SecretOrigin::Created)
    };
    if let Ok(old) = std::fs::read_to_string(&path) {
        if old.trim() != secret.to_string() {
            tracing::warn!(path = %path.display(), "switching this node to another swarm");
        }
    }
    write_private(&path, &format!("{secret}\n"))?;
    Ok((secret, origin))
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let tmp = path.with_extension("tmp");
    {
        use std::io::Write;
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let mut f = opts
            .open(&tmp)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Everything `starling up` needs besides the config file.
#[derive(Clone, Default)]
pub struct StartOptions {
    /// A join code given with `--join`.
    pub join: Option<JoinCode>,
    /// Where the model cache lives (`--home` / `$STARLING_HOME`).
    pub home: PathBuf,
    /// Models already loaded (several nodes in one process, as `starling demo` runs them,
    /// share one copy); `None` loads what the config names.
    pub models: Option<SharedModels>,
    /// Keep the group chat's repetition guard on (default true; off only to measure it).
    pub no_repetition_guard: bool,
}

/// Loaded models that several in-process nodes can share.
#[derive(Clone)]
pub struct SharedModels {
    /// The chat model.
    pub chat: ModelSlot,
    /// Names it also answers to.
    pub aliases: Vec<String>,
    /// The embedding model, if any.
    pub embedder: Option<EmbedHandle>,
}

/// What a running node shares with its API handlers and agent runtime. Derefs to its
/// [`NodeHandles`] (swarm, models, agent, API address, start time): the part the API's
/// node routes get.
pub struct NodeInner {
    /// What the API's node routes reach.
    pub handles: NodeHandles,
    /// Shared memories (prompt-answer pairs) of the swarm.
    pub memory: crate::memory::MemoryBook,
    /// The effective configuration.
    pub config: NodeConfig,
    /// Identity, database, peer cache.
    pub data_dir: PathBuf,
    /// Model cache home (`--home`).
    pub home: PathBuf,
    /// Fires on shutdown.
    pub cancel: CancellationToken,
    /// The HTTP API's task: [`Node::shutdown`] awaits it; dropping the node aborts it.
    api_task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The node's background tasks (the memory sync): [`Node::shutdown`] awaits them;
    /// dropping the node aborts them.
    background: crate::owned::Background,
    /// Background tasks [`Node::shutdown`] had to abort (still running after
    /// [`BACKGROUND_DRAIN`]).
    aborted_at_shutdown: std::sync::atomic::AtomicUsize,
}

impl std::ops::Deref for NodeInner {
    type Target = NodeHandles;
    fn deref(&self) -> &NodeHandles {
        &self.handles
    }
}

impl Drop for NodeInner {
    fn drop(&mut self) {
        // A node dropped without `shutdown`: its background tasks (which hold the agent,
        // so they would keep it alive) stop on the node's own cancel.
        self.cancel.cancel();
        let task = self.api_task.get_mut().map(Option::take);
        if let Ok(Some(task)) = task {
            task.abort();
        }
    }
}

/// Handle to a running node (cheap to clone).
#[derive(Clone)]
pub struct Node(Arc<NodeInner>);

impl std::ops::Deref for Node {
    type Target = NodeInner;
    fn deref(&self) -> &NodeInner {
        &self.0
    }
}

impl Node {
    /// Starts everything; the API serves until [`Node::shutdown`].
    pub async fn start(config: NodeConfig, opts: StartOptions) -> anyhow::Result<Self> {
        let data_dir = config
            .node
            .data_dir
            .clone()
            .unwrap_or_else(|| opts.home.join("node"));
        // Before anything starts: beyond loopback the API needs a key (as the config file
        // and `starling up` require), also for a caller that built the config itself.
        crate::config::check_exposure(config.api.listen, &config.api.keys)?;
        std::fs::create_dir_all(&data_dir)
            .with_context(|| format!("cannot create data dir {}", data_dir.display()))?;
        let (secret, origin) = resolve_secret(
            &data_dir,
            opts.join.as_ref(),
            config.network.swarm_secret.as_deref(),
        )?;
        if origin == SecretOrigin::Created {
            eprintln!("started a new swarm (run `starling invite` to let another node join)");
        }

        // Models first: a node that cannot serve its model should fail before joining.
        let api_config = ApiConfig {
            max_inflight: config.api.max_inflight,
            loopback_hosts_only: config.api.listen.ip().is_loopback(),
            api_keys: config.api.keys.clone(),
            tool_router: config.api.tool_router(),
            // Checked when a config file is read; checked here again for a caller that
            // built the config itself.
            cors_origins: crate::config::check_cors_origins(&config.api.cors_origins)
                .map_err(|e| anyhow::anyhow!("api.cors_origins: {e}"))?,
            ..ApiConfig::default()
        };
        // What the config says about the chat model: loaded here, and what a model
        // switch through the API starts from.
        let model = ModelOptions::from_config(&config);
        let app = match &opts.models {
            Some(m) => {
                let app = AppState::new(api_config)
                    .with_chat_model_named(m.chat.clone(), m.aliases.clone())
                    .with_model_cache(starling_models::source::ModelCache::new(&opts.home));
                app.set_embedder(m.embedder.clone());
                app
            }
            None => {
                let home = opts.home.clone();
                let model = model.clone();
                let embedding =
                    Some(config.models.embedding.clone()).filter(|s| !s.trim().is_empty());
                tokio::task::spawn_blocking(move || {
                    loading::build_state(&home, &model, embedding.as_deref(), api_config)
                })
                .await
                .context("model loading panicked")??
            }
        };
        // Remote model switches load with the node's model options, from the model cache,
        // the configured model's directory and `[models] dirs` only.
        let app = app.with_model_switch(loading::model_switch(
            &opts.home,
            &model,
            &config.models.dirs,
        ));
        let node_store =
            Store::open(data_dir.join("node.db")).map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut tools = ToolBox::from_config(&config.agent).map_err(|e| anyhow::anyhow!("{e}"))?;
        // A server that does not start costs the node its tools, not its start: the
        // reason is printed and the node runs without them. The servers start together
        // (each within its own timeout); their tools are added in config order.
        let started =
            futures::future::join_all(config.agent.mcp.iter().map(crate::agent::mcp::start)).await;
        for result in started {
            match result {
                Ok(found) => {
                    for t in found {
                        tools = tools.with_tool(t);
                    }
                }
                Err(e) => {
                    tracing::warn!("{e}");
                    eprintln!("warning: {e}; the node runs without its tools");
                }
            }
        }

        let mut sc = SwarmConfig::new(&data_dir, secret);
        sc.name = config.node_name();
        sc.listen = config.network.listen;
        sc.advertise = config.network.advertise;
        sc.mdns = config.network.mdns;
        sc.membership = config.network.membership.into();
        let mut bootstrap: Vec<BootstrapPeer> = config
            .bootstrap_peers()
            .map_err(|e| anyhow::anyhow!("network.bootstrap: {e}"))?;
        if let Some(code) = &opts.join {
            bootstrap.extend(code.bootstrap_peers());
        }
        sc.bootstrap = bootstrap;
        let allow = config
            .allowlist()
            .map_err(|e| anyhow::anyhow!("network.allowlist: {e}"))?;
        if !allow.is_empty() {
            sc.allowlist = Some(allow.into_iter().collect());
        }
        let store = Arc::new(
            starling_discovery::SqliteRecordStore::in_dir(&data_dir)
                .map_err(|e| anyhow::anyhow!("{e}"))?,
        );
        let cache = Arc::new(starling_discovery::discover::FilePeerCache::in_dir(
            &data_dir,
        ));
        let swarm = Swarm::start_with(sc, store, cache)
            .await
            .context("cannot start the swarm")?;

        let cancel = CancellationToken::new();
        let slot = app
            .chat_slot()
            .ok_or_else(|| anyhow::anyhow!("no chat model loaded"))?;
        let model_id = slot.current().info().id.clone();
        let llm = Llm::new(slot);
        let memory = crate::memory::MemoryBook::open(
            node_store.clone(),
            app.embedder(),
            Some(swarm.clone()),
            crate::memory::BookConfig {
                rerank_depth: config.memory.rerank_depth,
                neighbour_weight: config.memory.neighbour_weight,
                ..crate::memory::BookConfig::default()
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("cannot open the memory book: {e}"))?;
        // The node's own background work (the memory sync); the agent owns its own.
        let background = crate::owned::Background::new();
        background.spawn(memory.follow(swarm.clone(), cancel.clone()));
        let agent = Agent::start(
            swarm.clone(),
            config.clone(),
            llm.clone(),
            app.embedder(),
            Executor::with_config(
                llm,
                tools,
                ExecutorConfig {
                    memory_examples: config.memory.examples,
                    memory_min_cosine: config.memory.min_similarity,
                    admit_memories: config.memory.admit,
                    admission_threshold: config.memory.threshold,
                    allow_no_tool: config.agent.allow_no_tool,
                    ..ExecutorConfig::default()
                },
            )
            .with_memory(memory.clone()),
            node_store,
            vec![model_id],
            AgentOptions {
                repetition_guard: !opts.no_repetition_guard,
                memory: Some(memory.clone()),
                decide: None,
            },
            cancel.clone(),
        )
        .await?;

        let listener = TcpListener::bind(config.api.listen)
            .await
            .with_context(|| {
                format!(
                    "cannot listen on {} for the HTTP API (is another node running? use --api to pick another address)",
                    config.api.listen
                )
            })?;
        let api_addr = listener.local_addr()?;
        if config.memory.openai {
            app.set_memory_examples(Some(crate::api::MemoryExamples {
                book: memory.clone(),
                k: config.memory.examples,
                min_cosine: config.memory.min_similarity,
            }));
        }
        let admission = crate::memory::AdmissionConfig {
            threshold: config.memory.threshold,
            ..crate::memory::AdmissionConfig::default()
        };
        let handles = NodeHandles {
            swarm,
            app: app.clone(),
            agent,
            api_addr,
            started: Instant::now(),
        };
        let routes = api::router_with(
            app.clone(),
            crate::api::node::router(handles.clone())
                .merge(crate::api::memories::routes(memory.clone(), admission)),
        );
        let node = Node(Arc::new(NodeInner {
            handles,
            memory,
            config,
            data_dir,
            home: opts.home.clone(),
            cancel: cancel.clone(),
            api_task: std::sync::Mutex::new(None),
            background,
            aborted_at_shutdown: Default::default(),
        }));
        let api_cancel = cancel.clone();
        let api_task = tokio::spawn(async move {
            if let Err(e) = api::serve_router_on(listener, app, routes, api_cancel).await {
                tracing::error!(error = %e, "HTTP API stopped");
            }
        });
        if let Ok(mut slot) = node.api_task.lock() {
            *slot = Some(api_task);
        }
        Ok(node)
    }

    /// Background tasks the node and its agent hold (running, or ended and not yet
    /// reaped): the memory sync, the swarm follower, the memory announcer, memories being
    /// scored. None after [`Node::shutdown`].
    pub fn background_tasks(&self) -> usize {
        self.background.len() + self.agent.background_tasks()
    }

    /// Background tasks that [`Node::shutdown`] had to abort because they were still
    /// running after [`BACKGROUND_DRAIN`] (0 when every one stopped on the cancel).
    pub fn aborted_at_shutdown(&self) -> usize {
        self.aborted_at_shutdown
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stops the API (its listener closed and its connections drained, or cut after
    /// [`API_DRAIN`], when this returns), then the background work (awaited for up to
    /// [`BACKGROUND_DRAIN`], then aborted), and leaves the swarm.
    pub async fn shutdown(&self) {
        self.cancel.cancel();
        let api_task = self.api_task.lock().ok().and_then(|mut t| t.take());
        if let Some(mut task) = api_task {
            match tokio::time::timeout(API_DRAIN, &mut task).await {
                Ok(Err(e)) if e.is_panic() => {
                    tracing::error!(error = %e, "the HTTP API's task panicked");
                }
                Ok(_) => {}
                Err(_) => {
                    // A client holding a stream open (the dashboard's events) does not
                    // keep the node from stopping.
                    tracing::warn!("HTTP connections still open after {API_DRAIN:?}; closing them");
                    task.abort();
                    let _ = task.await;
                }
            }
        }
        // Background work stops on the cancel; what is still running after the limit
        // (a model call scoring a memory) is aborted before the swarm goes.
        let (agent, node) = tokio::join!(
            self.agent.close(BACKGROUND_DRAIN),
            self.background.close(BACKGROUND_DRAIN)
        );
        let aborted = agent + node;
        self.aborted_at_shutdown
            .fetch_add(aborted, std::sync::atomic::Ordering::Relaxed);
        if aborted > 0 {
            tracing::warn!(
                aborted,
                "background tasks still running after {BACKGROUND_DRAIN:?}; aborted"
            );
        }
        self.swarm.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_is_created_once_then_reused() {
        let dir = tempfile::tempdir().unwrap();
        let (a, o) = resolve_secret(dir.path(), None, None).unwrap();
        assert_eq!(o, SecretOrigin::Created);
        let (b, o) = resolve_secret(dir.path(), None, None).unwrap();
        assert_eq!(o, SecretOrigin::Stored);
        assert_eq!(a.to_string(), b.to_string());
        let other = SwarmSecret::generate();
        let (c, o) = resolve_secret(dir.path(), None, Some(&other.to_string())).unwrap();
        assert_eq!(o, SecretOrigin::Configured);
        assert_eq!(c.to_string(), other.to_string());
        let (d, _) = resolve_secret(dir.path(), None, None).unwrap();
        assert_eq!(
            d.to_string(),
            other.to_string(),
            "a configured secret is kept"
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(SECRET_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o077, 0, "secret readable by others: {mode:o}");
        }
    }

    #[test]
    fn damaged_secret_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(SECRET_FILE), "garbage").unwrap();
        let e = resolve_secret(dir.path(), None, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains(SECRET_FILE), "{e}");
        assert!(resolve_secret(dir.path(), None, Some("short")).is_err());
    }
}
