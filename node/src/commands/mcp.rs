//! `starling mcp`: the running node as a Model Context Protocol server, so desktop
//! assistants and IDEs can put questions to the swarm: on stdio (the client starts this
//! process), or with `--http ADDR` over MCP's streamable HTTP transport at
//! `http://ADDR/mcp` (loopback only; the SDK also refuses requests whose `Host` is not a
//! loopback name, against DNS rebinding).
//!
//! The process is an adapter: each tool call becomes a request to the node's HTTP API
//! (`POST /api/tasks`, `GET /api/cards`, `GET /api/memories`), the same API `starling task`
//! and `starling memory` use. Stdout carries only the protocol; logs go to stderr.

use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::schemars::JsonSchema;
use rmcp::{tool, tool_handler, tool_router, ServerHandler, ServiceExt};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::client::NodeAddr;
use crate::agent::card::CardHit;
use crate::agent::runtime::TaskResult;
use crate::api::node::{SubmitTask, Submitted};
use crate::api::tasks::{TaskState, TaskView};
use crate::memory::api_types::MemoryList;

/// Arguments of `starling mcp`.
#[derive(Debug, Args)]
pub struct McpArgs {
    #[command(flatten)]
    /// The node to forward the tool calls to.
    pub node: NodeAddr,
    /// Longest an `ask_swarm` call waits for the swarm's answer, in seconds; the task is
    /// cancelled on the node after that.
    #[arg(long, value_name = "SECS", default_value_t = 600)]
    pub task_timeout: u64,
    /// Serve over streamable HTTP at `http://ADDR/mcp` instead of stdio, until Ctrl-C or
    /// SIGTERM. A loopback address: whoever reaches it uses the node with this adapter's
    /// API key.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<std::net::SocketAddr>,
}

/// How often a running task is looked at.
const POLL_EVERY: Duration = Duration::from_millis(500);
/// Longest question, as `POST /api/tasks` takes it.
const MAX_QUESTION_CHARS: usize = 4000;

/// `ask_swarm` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct AskSwarm {
    /// The question or task, in plain words (at most 4000 characters).
    pub question: String,
}

/// `search_agents` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct SearchAgents {
    /// What the agent should know or do, in plain words.
    pub query: String,
    /// Most agents to return (1 to 100, default 5).
    #[serde(default)]
    pub k: Option<u32>,
}

/// `search_memories` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct SearchMemories {
    /// A question like the ones the memories answered.
    pub query: String,
    /// The memories' domain (default `general`).
    #[serde(default)]
    pub domain: Option<String>,
    /// Most memories to return (1 to 100, default 3).
    #[serde(default)]
    pub k: Option<u32>,
}

/// The tools, each a call to the node's API.
#[derive(Clone)]
pub struct SwarmTools {
    node: NodeAddr,
    task_timeout: Duration,
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl SwarmTools {
    /// Tools that forward to `node`.
    pub fn new(node: NodeAddr, task_timeout: Duration) -> Self {
        Self {
            node,
            task_timeout,
            tool_router: Self::tool_router(),
        }
    }

    #[tool(
        annotations(title = "Ask the swarm", read_only_hint = true, open_world_hint = true),
        description = "Ask the Starling swarm a question. The node forms a team of the agents whose cards fit, each answers from its own documents, and the reply is a short answer in which every fact is copied from cited evidence (node, document, quote), or says which parts nobody knows. Takes seconds to minutes."
    )]
    async fn ask_swarm(
        &self,
        Parameters(a): Parameters<AskSwarm>,
        ct: CancellationToken,
    ) -> CallToolResult {
        let question = a.question.trim();
        if question.is_empty() {
            return failure("the question is empty");
        }
        if question.chars().count() > MAX_QUESTION_CHARS {
            return failure(format!(
                "the question is longer than {MAX_QUESTION_CHARS} characters"
            ));
        }
        match self.ask(question, &ct).await {
            Ok(r) => answered(&r),
            Err(e) => failure(format!("{e:#}")),
        }
    }

    #[tool(
        annotations(title = "Search agents", read_only_hint = true, open_world_hint = true),
        description = "Search the agent cards the swarm has published by meaning: who knows about something. Returns each agent's name, node id, description and skills, best match first."
    )]
    async fn search_agents(&self, Parameters(a): Parameters<SearchAgents>) -> CallToolResult {
        let k = match search_size(&a.query, a.k, 5) {
            Ok(k) => k,
            Err(why) => return failure(why),
        };
        let hits: Vec<CardHit> = match self
            .node
            .get_query(
                "/api/cards",
                &[("q", a.query.as_str()), ("k", &k.to_string())],
            )
            .await
        {
            Ok(h) => h,
            Err(e) => return failure(format!("{e:#}")),
        };
        let text = if hits.is_empty() {
            "No agent in the swarm matches.".to_owned()
        } else {
            hits.iter()
                .enumerate()
                .map(|(i, h)| {
                    let c = &h.card.card;
                    let skills = if c.skills.is_empty() {
                        String::new()
                    } else {
                        format!(" Skills: {}.", c.skills.join(", "))
                    };
                    format!(
                        "{}. {} (node {}): {}{skills}",
                        i + 1,
                        c.name,
                        h.card.node_id,
                        c.description
                    )
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        with_structure(text, json!({ "agents": hits }))
    }

    #[tool(
        annotations(
            title = "Search memories",
            read_only_hint = true,
            open_world_hint = true
        ),
        description = "Search the memories the swarm shares (scored question and answer pairs that nodes kept as worked examples), nearest first."
    )]
    async fn search_memories(&self, Parameters(a): Parameters<SearchMemories>) -> CallToolResult {
        let k = match search_size(&a.query, a.k, 3) {
            Ok(k) => k,
            Err(why) => return failure(why),
        };
        let mut query = vec![("q", a.query.clone()), ("limit", k.to_string())];
        if let Some(d) = a.domain.as_ref().filter(|d| !d.trim().is_empty()) {
            query.push(("domain", d.clone()));
        }
        let list: MemoryList = match self.node.get_query("/api/memories", &query).await {
            Ok(l) => l,
            Err(e) => return failure(format!("{e:#}")),
        };
        let text = if list.memories.is_empty() {
            "No shared memory matches.".to_owned()
        } else {
            list.memories
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    let m = &m.memory;
                    format!(
                        "{}. Q: {}\n   A: {}\n   (domain {}, score {:.2}, by {})",
                        i + 1,
                        m.prompt,
                        m.answer,
                        m.domain,
                        m.score,
                        m.author
                    )
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        with_structure(text, json!({ "memories": list.memories }))
    }
}

impl SwarmTools {
    /// Submits `question` and waits for its result; cancels the task on the node when the
    /// client cancels the call or the wait runs out.
    async fn ask(&self, question: &str, ct: &CancellationToken) -> anyhow::Result<TaskResult> {
        let sub: Submitted = self
            .node
            .post(
                "/api/tasks",
                &SubmitTask {
                    task: question.to_owned(),
                    wait: false,
                },
            )
            .await?;
        let path = format!("/api/tasks/{}", sub.group_id);
        let deadline = tokio::time::Instant::now() + self.task_timeout;
        loop {
            tokio::select! {
                () = ct.cancelled() => {
                    self.cancel(&path).await;
                    anyhow::bail!("the call was cancelled; so is the task on the node");
                }
                () = tokio::time::sleep_until(deadline) => {
                    self.cancel(&path).await;
                    anyhow::bail!(
                        "no answer within {} s; the task is cancelled on the node",
                        self.task_timeout.as_secs()
                    );
                }
                () = tokio::time::sleep(POLL_EVERY) => {}
            }
            let v: Value = self.node.get(&path).await?;
            if v.get("answer").is_some() {
                return serde_json::from_value(v)
                    .map_err(|e| anyhow::anyhow!("the node's task result is malformed: {e}"));
            }
            let view: TaskView = serde_json::from_value(v)
                .map_err(|e| anyhow::anyhow!("the node's task view is malformed: {e}"))?;
            match view.state {
                TaskState::Running | TaskState::Done => {}
                TaskState::Failed => anyhow::bail!(
                    "the task failed: {}",
                    view.error.unwrap_or_else(|| "no reason given".into())
                ),
                TaskState::Cancelled => anyhow::bail!("the task was cancelled on the node"),
            }
        }
    }

    /// Best effort: the call fails either way, and the node ends the task by itself.
    async fn cancel(&self, path: &str) {
        if let Err(e) = self.node.delete::<Value>(path).await {
            tracing::warn!("could not cancel {path}: {e:#}");
        }
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SwarmTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("starling", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Starling is a peer-to-peer swarm of local agents. Use ask_swarm for questions \
                 the swarm's documents answer (every fact comes with its source), \
                 search_agents to see who knows what, search_memories for worked examples.",
            )
    }
}

/// The swarm's answer: text with its sources, and the task result as structured content.
fn answered(r: &TaskResult) -> CallToolResult {
    with_structure(
        r.answer_with_sources(),
        serde_json::to_value(r).unwrap_or(Value::Null),
    )
}

/// The number of hits a search asks for (`k`, else `default`), or why an empty query or a
/// `k` outside 1 to 100 is refused.
fn search_size(query: &str, k: Option<u32>, default: u32) -> Result<u32, &'static str> {
    if query.trim().is_empty() {
        return Err("the query is empty");
    }
    let k = k.unwrap_or(default);
    if !(1..=100).contains(&k) {
        return Err("k must be between 1 and 100");
    }
    Ok(k)
}

fn with_structure(text: String, structured: Value) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
    r.structured_content = Some(structured);
    r
}

/// A tool-level error: the client shows the message to its user.
fn failure(msg: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(msg.into())])
}

/// Serves MCP on stdin/stdout until the client closes it, or with `--http` on that address
/// until stopped.
pub fn run(args: McpArgs) -> anyhow::Result<()> {
    if let Some(addr) = args.http {
        anyhow::ensure!(
            addr.ip().is_loopback(),
            "--http {addr}: use a loopback address (127.0.0.1 or ::1); whoever reaches it \
             uses the node with this adapter's API key"
        );
    }
    super::block_on(async move {
        let tools = SwarmTools::new(args.node, Duration::from_secs(args.task_timeout.max(1)));
        if let Some(addr) = args.http {
            return serve_http(tools, addr).await;
        }
        let service = tools
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| anyhow::anyhow!("MCP handshake failed: {e}"))?;
        service
            .waiting()
            .await
            .map_err(|e| anyhow::anyhow!("MCP session ended with an error: {e}"))?;
        anyhow::Ok(())
    })?
}

/// Serves MCP's streamable HTTP transport at `http://addr/mcp` until Ctrl-C or SIGTERM;
/// each session gets its own [`SwarmTools`], and a request the client drops cancels its
/// tool call (and the task on the node).
async fn serve_http(tools: SwarmTools, addr: std::net::SocketAddr) -> anyhow::Result<()> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };
    let stop = CancellationToken::new();
    let service = StreamableHttpService::new(
        move || Ok(tools.clone()),
        std::sync::Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default().with_cancellation_token(stop.child_token()),
    );
    let app = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr()?;
    eprintln!("MCP server listening on http://{local}/mcp");
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            super::wait_for_stop_signal().await;
            stop.cancel();
        })
        .await
        .context("the MCP HTTP server failed")
}
