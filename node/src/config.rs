//! The node's TOML configuration: every key has a default, so an empty file (or none) is a
//! valid config. `starling up --config FILE` reads it; command-line flags override it.
//!
//! Parsing is strict: an unknown key or a value of the wrong shape is an error that names
//! the key and the line (`toml`'s own diagnostics), so a typo never silently falls back to
//! a default. `configs/` holds commented examples.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use starling_discovery::{BootstrapPeer, MembershipPreset, NodeId, DEFAULT_PORT};

/// Where the HTTP API listens unless told otherwise: loopback only.
pub const DEFAULT_API_ADDR: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 7431);

/// Shortest API key accepted.
pub const MIN_API_KEY_LEN: usize = 16;

/// Why the HTTP API may not listen where it was asked to.
#[derive(Debug, thiserror::Error)]
pub enum ExposureError {
    /// Beyond loopback without an API key.
    #[error(
        "refusing to serve the API on {addr} without an API key: anyone who can reach it could \
         read the swarm secret, sign memories and switch models; set one with --api-key, \
         STARLING_API_KEY or `[api] keys`, or listen on loopback"
    )]
    NoKey {
        /// The address.
        addr: SocketAddr,
    },
    /// An API key too short to resist guessing.
    #[error("an API key has {len} characters; use at least {min} (e.g. `openssl rand -hex 24`)")]
    WeakKey {
        /// Its length.
        len: usize,
        /// The least accepted.
        min: usize,
    },
}

/// Whether the HTTP API may listen on `addr` with `keys`: beyond loopback it needs at
/// least one API key (anyone who reaches it could otherwise read the swarm secret, sign
/// memories and switch models), and every key must be long enough to resist guessing.
/// The node's config and `starling serve` are held to the same rule.
pub fn check_exposure(addr: SocketAddr, keys: &[String]) -> Result<(), ExposureError> {
    if let Some(k) = keys.iter().find(|k| k.len() < MIN_API_KEY_LEN) {
        return Err(ExposureError::WeakKey {
            len: k.len(),
            min: MIN_API_KEY_LEN,
        });
    }
    if !addr.ip().is_loopback() && keys.is_empty() {
        return Err(ExposureError::NoKey { addr });
    }
    Ok(())
}

/// Checks one entry of `[api] cors_origins` (or `starling serve --cors-origin`): a web
/// origin, `http://` or `https://` then a host and an optional port, nothing after it
/// (browsers send exactly that in `Origin`). Returns it lower-cased, as it is compared.
/// `*` is refused: any page on the web could then read the API with a user's key.
pub fn check_cors_origin(origin: &str) -> Result<String, String> {
    let o = origin.trim().to_ascii_lowercase();
    if o.contains('*') {
        return Err(format!(
            "`{origin}`: wildcards are not accepted; list each origin (`https://app.example.com`)"
        ));
    }
    let Some((scheme, rest)) = ["http://", "https://"]
        .iter()
        .find_map(|sch| o.strip_prefix(sch).map(|r| (*sch, r)))
    else {
        return Err(format!(
            "`{origin}` is not a web origin: it must start with http:// or https:// \
             (`https://app.example.com`)"
        ));
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty()
        || rest.contains(['/', '?', '#', '@'])
        || rest.chars().any(char::is_whitespace)
    {
        return Err(format!(
            "`{origin}` is not a web origin: give the scheme, host and port only, no path \
             (`https://app.example.com:8443`)"
        ));
    }
    let bad = || format!("`{origin}` does not name a valid host and port");
    let authority: http::uri::Authority = rest.parse().map_err(|_| bad())?;
    if authority.host().is_empty() || authority.host() == "[]" {
        return Err(bad());
    }
    // A port must be a number below 65536; browsers leave the scheme's default port out
    // of `Origin`, so it is dropped here too.
    let host = authority.host();
    let port = match rest.strip_prefix(host).and_then(|p| p.strip_prefix(':')) {
        None => None,
        Some(p) => Some(p.parse::<u16>().map_err(|_| bad())?),
    };
    let default = if scheme == "https://" { 443 } else { 80 };
    Ok(match port {
        Some(p) if p != default => format!("{scheme}{host}:{p}"),
        _ => format!("{scheme}{host}"),
    })
}

/// [`check_cors_origin`] over a list: the origins as they are compared, or the first
/// refusal.
pub fn check_cors_origins(origins: &[String]) -> Result<Vec<String>, String> {
    origins.iter().map(|o| check_cors_origin(o)).collect()
}

/// Why a config could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TOML is malformed or a key has a wrong value (the message names key and line).
    #[error("invalid config {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// toml's message, with the key and position.
        message: String,
    },
    /// Parsed, but a value is out of range or inconsistent.
    #[error("invalid config: `{key}` {problem}")]
    Invalid {
        /// Dotted key, e.g. `agent.max_turns`.
        key: &'static str,
        /// What is wrong with it.
        problem: String,
    },
}

/// A whole node configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// Who this node is.
    pub node: NodeSection,
    /// How it reaches other nodes.
    pub network: NetworkSection,
    /// Its local HTTP API.
    pub api: ApiSection,
    /// Which models it runs.
    pub models: ModelsSection,
    /// Its agent persona and behaviour.
    pub agent: AgentSection,
    /// How it uses and keeps shared memories.
    pub memory: MemorySection,
}

/// `[node]`
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeSection {
    /// Name shown to peers (default: the host name).
    pub name: Option<String>,
    /// Where identity, database and peer cache live (default: `$STARLING_HOME/node`).
    /// A relative path is relative to the config file.
    pub data_dir: Option<PathBuf>,
}

/// `[network]`
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetworkSection {
    /// UDP address for QUIC. mDNS runs only on the interfaces this covers (never for a
    /// loopback address).
    pub listen: SocketAddr,
    /// Address peers should dial if not `listen` (e.g. behind port forwarding).
    pub advertise: Option<SocketAddr>,
    /// Peers to dial at start: `HOST:PORT` or `NODEID@HOST:PORT`.
    pub bootstrap: Vec<String>,
    /// Discover peers with mDNS on the LAN.
    pub mdns: bool,
    /// Failure-detection timing: `lan` (fast) or `wan`.
    pub membership: MembershipChoice,
    /// The swarm secret (base32). Prefer `starling invite` / `--join`; when unset the node
    /// uses the secret stored in its data dir, creating a new swarm on first start.
    pub swarm_secret: Option<String>,
    /// Admit only these node ids (in addition to the secret). Empty: anyone with the secret.
    pub allowlist: Vec<String>,
}

impl Default for NetworkSection {
    fn default() -> Self {
        Self {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), DEFAULT_PORT),
            advertise: None,
            bootstrap: Vec::new(),
            mdns: true,
            membership: MembershipChoice::Lan,
            swarm_secret: None,
            allowlist: Vec::new(),
        }
    }
}

/// Membership preset as written in the config.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MembershipChoice {
    /// Local network timing.
    #[default]
    Lan,
    /// Wide-area timing.
    Wan,
}

impl From<MembershipChoice> for MembershipPreset {
    fn from(c: MembershipChoice) -> Self {
        match c {
            MembershipChoice::Lan => MembershipPreset::Lan,
            MembershipChoice::Wan => MembershipPreset::Wan,
        }
    }
}

/// The default cosine at which `tool_choice: "auto"` calls the most similar tool
/// (`[api] tool_router_threshold`, `starling serve --tool-router`; how it was chosen is in
/// `benches/tools/README.md`).
pub const DEFAULT_TOOL_ROUTER: f32 = 0.3;

/// `[api]`
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiSection {
    /// Where the HTTP API (OpenAI-compatible + node API + dashboard) listens. Beyond
    /// loopback it needs `keys`.
    pub listen: SocketAddr,
    /// Inference requests admitted at once, running or queued (more get 429).
    pub max_inflight: usize,
    /// API keys (at least 16 characters each): when any is set, every request needs
    /// `Authorization: Bearer <key>`. Required when `listen` is not loopback.
    pub keys: Vec<String>,
    /// Web origins (`https://app.example.com`) whose pages may call the API from a browser,
    /// besides pages served from this machine (loopback), which always may. Pages of other
    /// origins get no CORS headers, so the browser keeps them from reading answers.
    pub cors_origins: Vec<String>,
    /// `tool_choice` `auto` and `required` ask the embedding model which offered tool fits
    /// the user's message: `auto` calls it when the cosine reaches `tool_router_threshold`,
    /// `required` calls the best tool not called yet in the conversation; `false` leaves
    /// every such choice to the chat model (which, at 135M, never calls under `auto` and
    /// repeats its last call under `required`).
    pub tool_router: bool,
    /// The cosine (0 < t <= 1) at which the router calls the most similar tool.
    pub tool_router_threshold: f32,
}

impl Default for ApiSection {
    fn default() -> Self {
        Self {
            listen: DEFAULT_API_ADDR,
            max_inflight: 32,
            keys: Vec::new(),
            cors_origins: Vec::new(),
            tool_router: true,
            tool_router_threshold: DEFAULT_TOOL_ROUTER,
        }
    }
}

impl ApiSection {
    /// [`crate::api::ApiConfig::tool_router`] as this section sets it.
    pub fn tool_router(&self) -> Option<f32> {
        self.tool_router.then_some(self.tool_router_threshold)
    }
}

/// `[models]`
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelsSection {
    /// Chat model: registry name, GGUF path or source (`hf:…`, `pip:…`).
    pub chat: String,
    /// Embedding model: registry name, directory or source; empty for none.
    pub embedding: String,
    /// Re-quantisation of weights without a fast kernel: `auto`, `q8_0`, `q4_0` or `off`.
    pub requantize: String,
    /// Embedding backend: `auto`, `kernels` (8-bit linear layers) or `candle` (f32).
    pub embedding_backend: String,
    /// Context length in tokens.
    pub context: usize,
    /// Inference threads (default: all cores).
    pub threads: Option<usize>,
    /// Directories whose model files `PUT /api/models/active` may load (besides the
    /// model cache and the directory of the configured chat model). Any other path is
    /// refused without saying whether it exists.
    pub dirs: Vec<PathBuf>,
}

impl Default for ModelsSection {
    fn default() -> Self {
        Self {
            chat: "smollm2-135m-instruct".into(),
            embedding: "all-minilm-l6-v2".into(),
            requantize: "auto".into(),
            embedding_backend: "auto".into(),
            context: 4096,
            threads: None,
            dirs: Vec::new(),
        }
    }
}

/// `[memory]`
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemorySection {
    /// Shared memories shown as worked examples before the model answers a task, a chat
    /// turn or (with `openai`) an API chat completion; 0 turns retrieval off.
    pub examples: usize,
    /// Lowest cosine similarity between the prompt and a memory's prompt for it to be
    /// shown.
    pub min_similarity: f32,
    /// Also put worked examples into `/v1/chat/completions` requests (off by default:
    /// API clients get the model as it is unless the node's owner asks for this).
    pub openai: bool,
    /// Offer verified task answers for admission into the shared memories.
    pub admit: bool,
    /// Lowest admission score (0 to 10) for a pair to be kept and shared.
    pub threshold: f32,
    /// How many of the hybrid search's first hits the late-interaction stage re-orders
    /// (query and memory compared token by token); 0 turns the stage off.
    pub rerank_depth: usize,
    /// Weight, in that stage, of a memory's likeness to the best hit (cosine of their
    /// prompts): the next examples follow the best one; 0 turns it off.
    pub neighbour_weight: f32,
}

impl Default for MemorySection {
    fn default() -> Self {
        Self {
            examples: 3,
            min_similarity: 0.6,
            openai: false,
            admit: true,
            // The default model's scores carry no signal (benches/memory/README.md): the
            // checks decide, and the score only drops pairs the model rates 0 or 1.
            threshold: 2.0,
            // The memory book's own default (`BookConfig`; config depends on no other
            // module, so a test in node/tests/memory_book.rs keeps the two equal).
            rerank_depth: 20,
            neighbour_weight: 0.1,
        }
    }
}

/// `[agent]`
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentSection {
    /// One or two sentences on what this agent knows and does (goes into its card).
    pub description: String,
    /// Skills or tags (go into its card; searched by other nodes).
    pub skills: Vec<String>,
    /// `tool` (answers by itself) or `human` (a person answers through the CLI/dashboard).
    pub kind: AgentKind,
    /// Folder of local documents searched by the `search_docs` tool (relative to the
    /// config file). Different nodes hold different knowledge.
    pub docs: Option<PathBuf>,
    /// Built-in tools offered: `search_docs`, `calculator`.
    pub tools: Vec<String>,
    /// How a task is answered: `grounded` (sub-questions drawn from the task, each answered
    /// by the member whose documents hold cited evidence, the answer built from the cited
    /// spans) or `chat` (the model forms the team, writes the tasks and the conclusion).
    pub collaboration: Collaboration,
    /// Turns after which a group chat is forced to conclude.
    pub max_turns: u32,
    /// How deep nested sub-teams may go.
    pub max_depth: u32,
    /// Seconds a member has to answer before it loses its turn.
    pub turn_timeout_secs: u64,
    /// External agents this node integrates as tools (`[[agent.external]]`): a command or an
    /// HTTP endpoint that takes a task and returns a result.
    pub external: Vec<ExternalAgentConfig>,
    /// MCP servers whose tools this node offers (`[[agent.mcp]]`: a command it starts and
    /// speaks to over stdio, or a streamable-HTTP `url`); their tools are offered to
    /// the executor as `NAME_TOOL`, with the server's own argument schemas.
    pub mcp: Vec<McpServerConfig>,
    /// Whether the executor may answer a step without calling a tool. `false` routes every
    /// task through the tools (for a node that fronts an external agent or MCP server).
    pub allow_no_tool: bool,
    /// Who answers the tasks other nodes assign to this one: `model` (the node's model and
    /// tools) or `external:NAME` (the `[[agent.external]]` entry NAME: the task goes to it
    /// verbatim, its answer comes back verbatim, cited as that agent's; the card advertises
    /// the agent's description and skills).
    pub executor: String,
    /// For `kind = "human"`: when the person is asked (`always`: every turn and task;
    /// `conclusion`: only when the chat must conclude; `never`: the model answers for them).
    pub human_input: HumanInput,
    /// Seconds to wait for the person before the fallback applies.
    pub human_timeout_secs: u64,
    /// What happens when the person does not answer in time: `model` (the node's model
    /// answers) or `skip` (the turn is lost / the task fails).
    pub human_fallback: HumanFallback,
}

/// How a node answers a task (`[agent] collaboration`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Collaboration {
    /// Answers are built from spans copied out of cited evidence (the default: a small
    /// model's free text cannot be trusted with facts).
    #[default]
    Grounded,
    /// The model forms the team, writes the tasks and the conclusion in free text.
    Chat,
}

/// When a human proxy asks its person (AutoGen's `human_input_mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HumanInput {
    /// Every turn and every task.
    #[default]
    Always,
    /// Only for the conclusion.
    Conclusion,
    /// Never: the model answers.
    Never,
}

/// What a human proxy does when its person does not answer in time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HumanFallback {
    /// The node's model answers.
    #[default]
    Model,
    /// Nobody answers: the turn is lost or the task fails.
    Skip,
}

/// `[[agent.external]]`: an external agent reached by a command or an HTTP endpoint.
///
/// Protocol: the task is sent as JSON `{"task_id", "description", "context"}` (on the
/// command's stdin, or as the body of a POST); the answer is `{"result": "...", "ok": true}`
/// or plain text (on stdout, or as the response body).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalAgentConfig {
    /// Tool name (lowercase letters, digits, `_`, `-`; unique; not a built-in tool's).
    pub name: String,
    /// What it does (shown to the model choosing tools; on the card when it is the node's
    /// executor).
    #[serde(default)]
    pub description: String,
    /// Its skills or tags (on the card when it is the node's executor).
    #[serde(default)]
    pub skills: Vec<String>,
    /// Program and arguments, run without a shell. A relative program path containing `/`
    /// is relative to the config file.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// `http://` or `https://` endpoint taking the task by POST.
    #[serde(default)]
    pub url: Option<String>,
    /// An A2A agent: its base URL (its card is at `/.well-known/agent-card.json` under it)
    /// or its card's URL; the task goes as an A2A 1.0 `SendMessage`.
    #[serde(default)]
    pub a2a: Option<String>,
    /// PEM file of CA certificates trusted for this agent's `https://` address besides the
    /// built-in public roots (a private CA, or the agent's own self-signed certificate).
    /// Relative to the config file.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Seconds before the call is abandoned (and the command killed).
    #[serde(default = "default_external_timeout")]
    pub timeout_secs: u64,
    /// Largest answer accepted, in bytes.
    #[serde(default = "default_external_max_output")]
    pub max_output_bytes: usize,
}

fn default_external_timeout() -> u64 {
    60
}

fn default_external_max_output() -> usize {
    64 * 1024
}

/// `[[agent.mcp]]`: an MCP server whose tools the node offers: one it starts and talks to
/// over stdio (`command`), or one already running that it reaches over MCP's streamable
/// HTTP transport (`url`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// Prefix of its tools' names (`NAME_TOOL`): lowercase letters, digits, `_`, `-`.
    pub name: String,
    /// Program and arguments, run without a shell. A relative program path containing `/`
    /// is relative to the config file. Exactly one of `command` and `url`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Environment variables set for the command, besides the node's own.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// The MCP endpoint of a server speaking streamable HTTP (`http://host:port/mcp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// HTTP headers sent with every request to `url` (an `Authorization` token, say).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub headers: std::collections::BTreeMap<String, String>,
    /// Seconds a tool call may take.
    #[serde(default = "default_external_timeout")]
    pub timeout_secs: u64,
    /// Largest tool result accepted, in bytes.
    #[serde(default = "default_external_max_output")]
    pub max_output_bytes: usize,
}

impl AgentSection {
    /// The external agent that answers for this node (`executor = "external:NAME"`), or
    /// `None` for `executor = "model"`; the message says what is wrong with the key.
    pub fn fronted(&self) -> Result<Option<&ExternalAgentConfig>, String> {
        let e = self.executor.trim();
        if e == "model" {
            return Ok(None);
        }
        let Some(name) = e.strip_prefix("external:") else {
            return Err(format!("`{e}` is neither `model` nor `external:NAME`"));
        };
        if self.kind == AgentKind::Human {
            return Err("an agent of `kind = \"human\"` is answered by its person, not by an external agent".into());
        }
        match self.external.iter().find(|x| x.name == name) {
            Some(x) => Ok(Some(x)),
            None => Err(format!(
                "`external:{name}` names no `[[agent.external]]` entry (entries: {})",
                if self.external.is_empty() {
                    "none".to_owned()
                } else {
                    self.external
                        .iter()
                        .map(|x| x.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            )),
        }
    }
}

impl Default for AgentSection {
    fn default() -> Self {
        Self {
            description: "A general assistant running on a local model.".into(),
            skills: Vec::new(),
            kind: AgentKind::Tool,
            docs: None,
            tools: vec!["search_docs".into(), "calculator".into()],
            collaboration: Collaboration::Grounded,
            max_turns: 12,
            max_depth: 2,
            turn_timeout_secs: 120,
            external: Vec::new(),
            mcp: Vec::new(),
            allow_no_tool: true,
            executor: "model".into(),
            human_input: HumanInput::Always,
            human_timeout_secs: 300,
            human_fallback: HumanFallback::Model,
        }
    }
}

/// Who answers for an agent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentKind {
    /// The node's own model and tools.
    #[default]
    Tool,
    /// A person, through the CLI or dashboard.
    Human,
}

impl NodeConfig {
    /// Reads and validates `path`. Relative paths in the file become relative to its folder.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut config = Self::parse(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            },
            other => other,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        config.resolve_relative(base);
        Ok(config)
    }

    /// Parses and validates TOML text.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let config: Self = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::from("<text>"),
            message: e.to_string().trim_end().to_owned(),
        })?;
        config.validate()?;
        Ok(config)
    }

    fn resolve_relative(&mut self, base: &Path) {
        let ca_files = self.agent.external.iter_mut().map(|e| &mut e.ca_file);
        for p in [&mut self.node.data_dir, &mut self.agent.docs]
            .into_iter()
            .chain(ca_files)
            .flatten()
        {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
        let programs = self
            .agent
            .external
            .iter_mut()
            .filter_map(|e| e.command.as_mut().and_then(|c| c.first_mut()))
            .chain(
                self.agent
                    .mcp
                    .iter_mut()
                    .filter_map(|m| m.command.first_mut()),
            );
        for program in programs {
            let path = Path::new(program.as_str());
            if path.is_relative() && program.contains('/') {
                *program = base.join(path).to_string_lossy().into_owned();
            }
        }
    }

    /// Checks values that parse but make no sense.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, problem: &str| {
            Err(ConfigError::Invalid {
                key,
                problem: problem.to_owned(),
            })
        };
        if let Some(name) = &self.node.name {
            if name.trim().is_empty() || name.chars().count() > 64 {
                return invalid("node.name", "must be 1 to 64 characters");
            }
        }
        if let Err(e) = self.bootstrap_peers() {
            return invalid("network.bootstrap", &e);
        }
        if let Err(e) = self.allowlist() {
            return invalid("network.allowlist", &e);
        }
        if let Some(s) = &self.network.swarm_secret {
            if s.parse::<starling_discovery::SwarmSecret>().is_err() {
                return invalid(
                    "network.swarm_secret",
                    "is not a swarm secret (52 base32 characters, as printed by `starling invite --secret`)",
                );
            }
        }
        if self.api.max_inflight == 0 {
            return invalid("api.max_inflight", "must be at least 1");
        }
        if let Err(e) = check_exposure(self.api.listen, &self.api.keys) {
            return invalid("api.keys", &e.to_string());
        }
        if let Err(e) = check_cors_origins(&self.api.cors_origins) {
            return invalid("api.cors_origins", &e);
        }
        if !(self.api.tool_router_threshold > 0.0 && self.api.tool_router_threshold <= 1.0) {
            return invalid("api.tool_router_threshold", "must be above 0 and at most 1");
        }
        if self.models.context < 16 {
            return invalid("models.context", "must be at least 16 tokens");
        }
        if self.models.chat.trim().is_empty() {
            return invalid("models.chat", "must name a chat model");
        }
        if let Err(e) = self
            .models
            .requantize
            .parse::<starling_models::requant::Requantize>()
        {
            return invalid("models.requantize", &e.to_string());
        }
        if let Err(e) = self
            .models
            .embedding_backend
            .parse::<starling_models::embed::EmbedBackend>()
        {
            return invalid("models.embedding_backend", &e);
        }
        if self.models.threads == Some(0) {
            return invalid("models.threads", "must be at least 1 (or left out)");
        }
        for t in &self.agent.tools {
            if !KNOWN_TOOLS.contains(&t.as_str()) {
                return invalid(
                    "agent.tools",
                    &format!(
                        "names unknown tool `{t}` (known: {})",
                        KNOWN_TOOLS.join(", ")
                    ),
                );
            }
        }
        if !(1..=200).contains(&self.agent.max_turns) {
            return invalid("agent.max_turns", "must be between 1 and 200");
        }
        if self.memory.examples > 16 {
            return invalid("memory.examples", "must be at most 16");
        }
        if !(-1.0..=1.0).contains(&self.memory.min_similarity) {
            return invalid("memory.min_similarity", "must be between -1 and 1");
        }
        if !(0.0..=10.0).contains(&self.memory.threshold) {
            return invalid("memory.threshold", "must be between 0 and 10");
        }
        if self.memory.rerank_depth > 200 {
            return invalid("memory.rerank_depth", "must be at most 200");
        }
        if !(0.0..=4.0).contains(&self.memory.neighbour_weight) {
            return invalid("memory.neighbour_weight", "must be between 0 and 4");
        }
        if self.agent.max_depth > 5 {
            return invalid("agent.max_depth", "must be at most 5");
        }
        if self.agent.human_timeout_secs == 0 {
            return invalid("agent.human_timeout_secs", "must be at least 1");
        }
        if self.agent.turn_timeout_secs == 0 {
            return invalid("agent.turn_timeout_secs", "must be at least 1");
        }
        let mut names = std::collections::HashSet::new();
        for ext in &self.agent.external {
            if let Err(problem) = ext.check() {
                return invalid("agent.external", &problem);
            }
            if !names.insert(ext.name.as_str()) {
                return invalid(
                    "agent.external",
                    &format!("names `{}` more than once", ext.name),
                );
            }
        }
        if let Err(problem) = self.agent.fronted() {
            return invalid("agent.executor", &problem);
        }
        let mut servers = std::collections::HashSet::new();
        for m in &self.agent.mcp {
            if let Err(problem) = m.check() {
                return invalid("agent.mcp", &problem);
            }
            if !servers.insert(m.name.as_str()) {
                return invalid("agent.mcp", &format!("names `{}` more than once", m.name));
            }
        }
        Ok(())
    }

    /// `network.bootstrap` parsed.
    pub fn bootstrap_peers(&self) -> Result<Vec<BootstrapPeer>, String> {
        self.network
            .bootstrap
            .iter()
            .map(|s| s.parse::<BootstrapPeer>().map_err(|e| e.to_string()))
            .collect()
    }

    /// `network.allowlist` parsed.
    pub fn allowlist(&self) -> Result<Vec<NodeId>, String> {
        self.network
            .allowlist
            .iter()
            .map(|s| {
                s.parse::<NodeId>()
                    .map_err(|_| format!("`{s}` is not a node id"))
            })
            .collect()
    }

    /// The node name: configured, else the host name, else `starling`.
    pub fn node_name(&self) -> String {
        self.node.name.clone().unwrap_or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "starling".into())
        })
    }
}

/// Built-in tools a node can offer.
pub const KNOWN_TOOLS: &[&str] = &["search_docs", "calculator"];

/// Names no external agent may take: the built-in tools and the executor's `answer`.
const RESERVED_TOOL_NAMES: &[&str] = &["search_docs", "calculator", "answer"];

/// Whether `name` can name a tool or a tool prefix: 1 to 32 lowercase letters, digits, `_`
/// or `-`.
fn check_tool_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= 32
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "entry `{name}`: name must be 1 to 32 lowercase letters, digits, `_` or `-`"
        ))
    }
}

/// Checks the limits an external agent and an MCP server share.
fn check_limits(name: &str, timeout_secs: u64, max_output_bytes: usize) -> Result<(), String> {
    if !(1..=3600).contains(&timeout_secs) {
        return Err(format!(
            "entry `{name}`: `timeout_secs` must be between 1 and 3600"
        ));
    }
    if !(1..=16 << 20).contains(&max_output_bytes) {
        return Err(format!(
            "entry `{name}`: `max_output_bytes` must be between 1 and 16 MiB"
        ));
    }
    Ok(())
}

/// Checks that entry `name`'s `key` is an `http://` address, or also an `https://` one
/// when `tls`: MCP's HTTP transport (`rmcp`, on its own HTTP client) is built without TLS.
fn check_http_url(name: &str, key: &str, url: &str, tls: bool) -> Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://").filter(|_| tls));
    if rest.is_none_or(str::is_empty) {
        return Err(if tls {
            format!("entry `{name}`: `{key}` must be an http:// or https:// address")
        } else {
            format!("entry `{name}`: `{key}` must be an http:// address (MCP over https is not built in)")
        });
    }
    Ok(())
}

impl McpServerConfig {
    /// Checks one entry; the message names the entry and what is wrong.
    fn check(&self) -> Result<(), String> {
        let name = &self.name;
        check_tool_name(name)?;
        match &self.url {
            None => {
                if self.command.first().is_none_or(|p| p.trim().is_empty()) {
                    return Err(format!(
                        "entry `{name}`: needs `command` (a program) or `url`"
                    ));
                }
                if !self.headers.is_empty() {
                    return Err(format!("entry `{name}`: `headers` go with `url`"));
                }
            }
            Some(url) => {
                if !self.command.is_empty() {
                    return Err(format!(
                        "entry `{name}`: needs exactly one of `command` and `url`"
                    ));
                }
                if !self.env.is_empty() {
                    return Err(format!("entry `{name}`: `env` goes with `command`"));
                }
                check_http_url(name, "url", url, false)?;
                for (key, value) in &self.headers {
                    // What the transport will accept (`agent::mcp` builds them with `http`),
                    // in ASCII: `http` also lets through bytes that servers read differently.
                    let valid = http::HeaderName::from_bytes(key.as_bytes()).is_ok()
                        && http::HeaderValue::from_str(value).is_ok()
                        && value.is_ascii();
                    if !valid {
                        return Err(format!(
                            "entry `{name}`: header `{key}` is not a valid HTTP header"
                        ));
                    }
                    // The transport sets these itself.
                    const RESERVED: [&str; 4] = [
                        "accept",
                        "mcp-session-id",
                        "mcp-protocol-version",
                        "last-event-id",
                    ];
                    if RESERVED.iter().any(|r| key.eq_ignore_ascii_case(r)) {
                        return Err(format!(
                            "entry `{name}`: header `{key}` is set by the MCP transport"
                        ));
                    }
                }
            }
        }
        check_limits(name, self.timeout_secs, self.max_output_bytes)
    }
}

impl ExternalAgentConfig {
    /// Checks one entry; the message names the entry and what is wrong.
    fn check(&self) -> Result<(), String> {
        let name = &self.name;
        check_tool_name(name)?;
        if RESERVED_TOOL_NAMES.contains(&name.as_str()) {
            return Err(format!(
                "entry `{name}`: name is reserved for a built-in tool"
            ));
        }
        match (&self.command, &self.url, &self.a2a) {
            (Some(cmd), None, None) => {
                if cmd.first().is_none_or(|p| p.trim().is_empty()) {
                    return Err(format!("entry `{name}`: `command` needs a program"));
                }
            }
            (None, Some(url), None) | (None, None, Some(url)) => {
                let key = if self.url.is_some() { "url" } else { "a2a" };
                check_http_url(name, key, url, true)?;
            }
            _ => {
                return Err(format!(
                    "entry `{name}`: needs exactly one of `command`, `url` and `a2a`"
                ))
            }
        }
        if self.ca_file.is_some() && self.command.is_some() {
            return Err(format!(
                "entry `{name}`: `ca_file` goes with an https:// `url` or `a2a`"
            ));
        }
        check_limits(name, self.timeout_secs, self.max_output_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_config_is_all_defaults() {
        let c = NodeConfig::parse("").unwrap();
        assert_eq!(c, NodeConfig::default());
        assert!(c.network.mdns);
        assert_eq!(c.api.listen, DEFAULT_API_ADDR);
    }

    #[test]
    fn full_config_parses() {
        let c = NodeConfig::parse(
            r#"
            [node]
            name = "alice"
            [network]
            listen = "127.0.0.1:7500"
            bootstrap = ["127.0.0.1:7501"]
            mdns = false
            membership = "wan"
            [api]
            listen = "127.0.0.1:8000"
            cors_origins = ["https://App.example.com", "http://10.0.0.5:8080/"]
            [models]
            chat = "gemma3-270m"
            embedding = ""
            [agent]
            description = "Knows botany."
            skills = ["plants", "gardening"]
            kind = "human"
            max_turns = 6
            "#,
        )
        .unwrap();
        assert_eq!(c.node.name.as_deref(), Some("alice"));
        assert_eq!(c.network.membership, MembershipChoice::Wan);
        assert_eq!(c.bootstrap_peers().unwrap().len(), 1);
        assert_eq!(c.agent.kind, AgentKind::Human);
        assert_eq!(c.agent.max_turns, 6);
        let origins: Vec<String> = c
            .api
            .cors_origins
            .iter()
            .map(|o| check_cors_origin(o).unwrap())
            .collect();
        assert_eq!(origins, ["https://app.example.com", "http://10.0.0.5:8080"]);
        // Browsers leave a scheme's default port out of `Origin`; IPv6 hosts keep brackets.
        for (given, compared) in [
            ("https://app.example.com:443", "https://app.example.com"),
            ("http://app.example.com:80/", "http://app.example.com"),
            ("http://app.example.com:443", "http://app.example.com:443"),
            ("http://[::1]:8080", "http://[::1]:8080"),
        ] {
            assert_eq!(check_cors_origin(given).unwrap(), compared, "{given}");
        }
        for bad in [
            "https://:8080",
            "https://app.example.com:99999",
            "https://app.example.com:abc",
            "https://user@app.example.com",
        ] {
            assert!(check_cors_origin(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            ("[network]\nlisten = \"nope\"", "listen"),
            ("[network]\nmdsn = true", "mdsn"),
            ("[agent]\nmax_turns = \"many\"", "max_turns"),
            ("[agent]\nmax_turns = 0", "agent.max_turns"),
            ("[agent]\ntools = [\"rm -rf\"]", "agent.tools"),
            ("[network]\nbootstrap = [\"x:y\"]", "network.bootstrap"),
            ("[network]\nswarm_secret = \"abc\"", "network.swarm_secret"),
            ("[models]\nrequantize = \"q9\"", "models.requantize"),
            (
                "[models]\nembedding_backend = \"gpu\"",
                "models.embedding_backend",
            ),
            ("[api]\nmax_inflight = 0", "api.max_inflight"),
            ("[api]\nlisten = \"0.0.0.0:7431\"", "api.keys"),
            ("[api]\nkeys = [\"short\"]", "api.keys"),
            ("[api]\ncors_origins = [\"*\"]", "api.cors_origins"),
            (
                "[api]\ntool_router_threshold = 0",
                "api.tool_router_threshold",
            ),
            (
                "[api]\ntool_router_threshold = 1.5",
                "api.tool_router_threshold",
            ),
            (
                "[api]\ncors_origins = [\"app.example.com\"]",
                "api.cors_origins",
            ),
            (
                "[api]\ncors_origins = [\"https://app.example.com/ui\"]",
                "api.cors_origins",
            ),
            ("[memory]\nthreshold = 11", "memory.threshold"),
            ("[memory]\nrerank_depth = 500", "memory.rerank_depth"),
            ("[memory]\nneighbour_weight = -1", "memory.neighbour_weight"),
            (
                "[memory]\nneighbour_weight = nan",
                "memory.neighbour_weight",
            ),
            ("[memory]\nmin_similarity = 2", "memory.min_similarity"),
            ("[memory]\nexamples = 100", "memory.examples"),
        ];
        for (text, key) in cases {
            let e = NodeConfig::parse(text).unwrap_err().to_string();
            assert!(e.contains(key), "{text:?}: {e}");
        }
    }

    #[test]
    fn mcp_servers_parse_and_validate() {
        let c = NodeConfig::parse(
            "[agent]\nallow_no_tool = false\n\
             [[agent.mcp]]\nname = \"files\"\ncommand = [\"npx\", \"server\"]\n\
             env = { LOG_LEVEL = \"warn\" }\n",
        )
        .unwrap();
        assert!(!c.agent.allow_no_tool);
        let m = &c.agent.mcp[0];
        assert_eq!(m.command, ["npx", "server"]);
        assert_eq!(m.env.get("LOG_LEVEL").map(String::as_str), Some("warn"));
        assert_eq!((m.timeout_secs, m.max_output_bytes), (60, 64 * 1024));
        for (entry, want) in [
            ("name = \"Files\"\ncommand = [\"x\"]", "lowercase"),
            (
                "name = \"f\"\ncommand = []",
                "needs `command` (a program) or `url`",
            ),
            (
                "name = \"f\"\ncommand = [\"x\"]\ntimeout_secs = 0",
                "timeout_secs",
            ),
            (
                "name = \"f\"\ncommand = [\"x\"]\nurl = \"http://h\"",
                "exactly one of",
            ),
            ("name = \"f\"", "needs `command` (a program) or `url`"),
            ("name = \"f\"\nurl = \"https://h/mcp\"", "http:// address"),
            ("name = \"f\"\nurl = \"h:80\"", "http:// address"),
            (
                "name = \"f\"\nurl = \"http://h\"\nenv = { A = \"b\" }",
                "`env` goes with `command`",
            ),
            (
                "name = \"f\"\ncommand = [\"x\"]\nheaders = { A = \"b\" }",
                "`headers` go with `url`",
            ),
            (
                "name = \"f\"\nurl = \"http://h\"\nheaders = { \"a b\" = \"c\" }",
                "not a valid HTTP header",
            ),
            (
                "name = \"f\"\nurl = \"http://h\"\nheaders = { A = \"b\\nc\" }",
                "not a valid HTTP header",
            ),
            (
                "name = \"f\"\nurl = \"http://h\"\nheaders = { A = \"café\" }",
                "not a valid HTTP header",
            ),
            (
                "name = \"f\"\nurl = \"http://h\"\nheaders = { Mcp-Session-Id = \"1\" }",
                "set by the MCP transport",
            ),
            ("name = \"f\"\ncommand = [\"x\"]\nport = 1", "unknown field"),
        ] {
            let e = NodeConfig::parse(&format!("[[agent.mcp]]\n{entry}\n"))
                .expect_err(entry)
                .to_string();
            assert!(e.contains(want), "{entry:?}: {e}");
        }
        let http = NodeConfig::parse(
            "[[agent.mcp]]\nname = \"web\"\nurl = \"http://127.0.0.1:8931/mcp\"\n\
             headers = { Authorization = \"Bearer t0k\" }\n",
        )
        .unwrap();
        let m = &http.agent.mcp[0];
        assert_eq!(m.url.as_deref(), Some("http://127.0.0.1:8931/mcp"));
        assert!(m.command.is_empty());
        assert_eq!(
            m.headers.get("Authorization").map(String::as_str),
            Some("Bearer t0k")
        );
        let dup = "[[agent.mcp]]\nname = \"f\"\ncommand = [\"a\"]\n\
                   [[agent.mcp]]\nname = \"f\"\ncommand = [\"b\"]\n";
        let e = NodeConfig::parse(dup).expect_err("duplicate").to_string();
        assert!(e.contains("more than once"), "{e}");
    }

    #[test]
    fn executor_names_an_external_agent() {
        let entry = "[[agent.external]]\nname = \"parts\"\ncommand = [\"./parts.py\"]\n\
                     description = \"Looks up spare parts.\"\nskills = [\"parts\", \"stock\"]\n";
        let c =
            NodeConfig::parse(&format!("[agent]\nexecutor = \"external:parts\"\n{entry}")).unwrap();
        let fronted = c.agent.fronted().unwrap().expect("an external executor");
        assert_eq!(fronted.name, "parts");
        assert_eq!(fronted.skills, ["parts", "stock"]);
        assert!(NodeConfig::parse(entry)
            .unwrap()
            .agent
            .fronted()
            .unwrap()
            .is_none());
        for (executor, want) in [
            (
                "external:nope",
                "names no `[[agent.external]]` entry (entries: parts)",
            ),
            ("robot", "neither `model` nor `external:NAME`"),
        ] {
            let e = NodeConfig::parse(&format!("[agent]\nexecutor = \"{executor}\"\n{entry}"))
                .expect_err(executor)
                .to_string();
            assert!(
                e.contains("agent.executor") && e.contains(want),
                "{executor}: {e}"
            );
        }
        let human = format!("[agent]\nkind = \"human\"\nexecutor = \"external:parts\"\n{entry}");
        let e = NodeConfig::parse(&human).expect_err("human").to_string();
        assert!(e.contains("by its person"), "{e}");
    }

    #[test]
    fn external_agents_parse_and_validate() {
        let c = NodeConfig::parse(
            r#"
            [[agent.external]]
            name = "summariser"
            description = "Summarises text."
            command = ["python3", "summarise.py"]
            [[agent.external]]
            name = "web-lookup"
            url = "http://127.0.0.1:9000/run"
            timeout_secs = 5
            [[agent.external]]
            name = "desk"
            a2a = "https://desk.example/"
            ca_file = "/etc/starling/desk-ca.pem"
            "#,
        )
        .unwrap();
        assert_eq!(c.agent.external.len(), 3);
        assert_eq!(
            c.agent.external[2].ca_file.as_deref(),
            Some(Path::new("/etc/starling/desk-ca.pem"))
        );
        assert_eq!(c.agent.external[0].timeout_secs, 60);
        assert_eq!(c.agent.external[0].max_output_bytes, 64 * 1024);
        assert_eq!(
            c.agent.external[1].url.as_deref(),
            Some("http://127.0.0.1:9000/run")
        );

        let cases = [
            ("name = \"x\"", "exactly one of"),
            (
                "name = \"x\"\ncommand = [\"a\"]\nurl = \"http://h\"",
                "exactly one of",
            ),
            ("name = \"Bad Name\"\ncommand = [\"a\"]", "lowercase"),
            ("name = \"calculator\"\ncommand = [\"a\"]", "reserved"),
            ("name = \"x\"\ncommand = []", "needs a program"),
            ("name = \"x\"\nurl = \"ftp://h\"", "http://"),
            ("name = \"x\"\nurl = \"https://\"", "https://"),
            (
                "name = \"x\"\ncommand = [\"a\"]\nca_file = \"ca.pem\"",
                "`ca_file` goes with",
            ),
            (
                "name = \"x\"\ncommand = [\"a\"]\ntimeout_secs = 0",
                "timeout_secs",
            ),
            (
                "name = \"x\"\ncommand = [\"a\"]\nmax_output_bytes = 0",
                "max_output_bytes",
            ),
            ("name = \"x\"\ncommand = [\"a\"]\nfoo = 1", "foo"),
        ];
        for (entry, needle) in cases {
            let text = format!("[[agent.external]]\n{entry}\n");
            let e = NodeConfig::parse(&text).unwrap_err().to_string();
            assert!(e.contains(needle), "{entry:?}: {e}");
            if !needle.contains("foo") {
                assert!(e.contains("agent.external"), "{entry:?}: {e}");
            }
        }
        let dup = "[[agent.external]]\nname = \"x\"\ncommand = [\"a\"]\n\
                   [[agent.external]]\nname = \"x\"\nurl = \"http://h\"\n";
        let e = NodeConfig::parse(dup).unwrap_err().to_string();
        assert!(e.contains("more than once"), "{e}");
    }

    #[test]
    fn relative_paths_follow_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n.toml");
        std::fs::write(
            &path,
            "[node]\ndata_dir = \"data\"\n[agent]\ndocs = \"docs\"\n\
             [[agent.external]]\nname = \"a\"\ncommand = [\"./bin/agent\", \"./x\"]\n\
             [[agent.external]]\nname = \"b\"\ncommand = [\"python3\"]\n\
             [[agent.external]]\nname = \"c\"\nurl = \"https://h/\"\nca_file = \"certs/ca.pem\"\n",
        )
        .unwrap();
        let c = NodeConfig::load(&path).unwrap();
        assert_eq!(c.node.data_dir.unwrap(), dir.path().join("data"));
        assert_eq!(c.agent.docs.unwrap(), dir.path().join("docs"));
        let a = c.agent.external[0].command.as_ref().unwrap();
        assert_eq!(a[0], dir.path().join("./bin/agent").to_string_lossy());
        assert_eq!(a[1], "./x", "only the program is resolved");
        assert_eq!(c.agent.external[1].command.as_ref().unwrap()[0], "python3");
        assert_eq!(
            c.agent.external[2].ca_file.as_deref(),
            Some(dir.path().join("certs/ca.pem").as_path())
        );
        let e = NodeConfig::load(&dir.path().join("missing.toml")).unwrap_err();
        assert!(e.to_string().contains("missing.toml"), "{e}");
    }

    #[test]
    fn example_configs_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "toml") {
                let c = NodeConfig::load(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                if let Some(d) = &c.agent.docs {
                    assert!(d.is_dir(), "{}: docs {} missing", p.display(), d.display());
                }
                n += 1;
            }
        }
        assert!(n >= 4, "only {n} example configs");
        // The documented defaults are the real defaults.
        let all = NodeConfig::load(&dir.join("node.toml")).unwrap();
        assert_eq!(all, NodeConfig::default());
    }
}
