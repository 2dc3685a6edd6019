//! The agent runtime of a running node: wires the sans-IO pieces (team formation, the
//! group-chat machine, the executor) to the swarm (cards, RPC, fan-out, membership), the
//! model and the store.
//!
//! Decentralised hosting: the node that launches a group *hosts* its chat machine (no
//! server anywhere else). It asks each speaker for its decision over RPC
//! (`agent`/`speak`), hands tasks to assignees (`agent`/`task`), and sends every recorded
//! message to all members (`agent`/`message`), who persist and show it. An assignee may
//! host a sub-team for its task in turn, up to the group's `max_depth`.
//!
//! Everything that happens is published on an [`AgentEvent`] broadcast (the API's SSE
//! stream and the dashboard read it) and persisted in the store.
//!
//! One file per role: this one holds the [`Agent`], its wire types and events, cards and
//! task submission (and the model-driven team flow); `host` hosts groups (and resumes a
//! lost host's), `member` answers the `agent` RPC service, `inquiry` runs grounded
//! inquiries, `human` asks a human proxy's person, `prompts` writes the texts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use starling_discovery::{NodeId, PeerState, Request, RpcError, RpcErrorCode, SwarmEvent};
use starling_models::chat::ChatMessage;
use starling_models::embed::EmbedHandle;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::card::{AgentCard, CardBook, CardHit, CARD_KIND};
use super::chat::{
    successor, ChatConfig, ChatState, Decision, DecisionType, Effect, GroupChat, Input,
    LaunchParams, LostTurnReason, MemberRef, Message, Rejection, Task, TaskSpec as ChatTaskSpec,
    TaskState,
};
use super::executor::{Executor, TaskSpec};
use super::formation::{form_team, AgentSearch, ContactLine, Formation, FormationConfig};
use super::grounded::{
    self, AgentOffer, Answer, AnswerStatus, Citation, Inquiry, Located, Next, NodeHit, PlanStep,
    Planner, Route, SubQuestion,
};
use super::peers::Peers;
use super::tools::{ExternalAgent, ExternalTask, Progress, PROGRESS_CHARS};
use crate::config::{AgentKind, Collaboration, HumanFallback, HumanInput, NodeConfig};
use crate::llm::{Decide, Llm};
use crate::memory::{format_examples, MemoryBook, DEFAULT_DOMAIN};
use crate::store::{GroupRecord, Store, TaskRecord};

mod host;
mod human;
mod inquiry;
mod member;
mod prompts;

pub use prompts::{answer_message, with_evidence, with_findings};
use prompts::{clip_words, speak_prompt};

/// RPC service of the agent runtime.
pub const SERVICE: &str = "agent";

/// Something that happened, for the event stream.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum AgentEvent {
    /// A peer came up.
    PeerUp {
        /// Node id.
        node_id: String,
        /// Name.
        name: String,
    },
    /// A peer went down.
    PeerDown {
        /// Node id.
        node_id: String,
    },
    /// A card was learned or updated.
    Card {
        /// Author.
        node_id: String,
        /// Name on the card.
        name: String,
    },
    /// A submitted task is being worked on.
    TaskSubmitted {
        /// The group id that will carry it.
        group_id: String,
        /// The task text.
        task: String,
    },
    /// Team formation finished.
    TeamFormed {
        /// The group id.
        group_id: String,
        /// Recruited member names (empty: working alone).
        members: Vec<String>,
        /// Tool calls the model made.
        calls: usize,
    },
    /// A group chat started (hosted here or elsewhere).
    GroupLaunched {
        /// Group id.
        group_id: String,
        /// Parent group, for sub-teams.
        parent: Option<String>,
        /// Goal.
        goal: String,
        /// Member names.
        members: Vec<String>,
    },
    /// A chat message.
    Message {
        /// The message.
        message: Message,
        /// Sender's name.
        sender_name: String,
    },
    /// A task changed state.
    TaskState {
        /// Group id.
        group_id: String,
        /// Task id (within the group).
        task_id: String,
        /// Assignee name.
        assignee: String,
        /// New state.
        state: TaskState,
    },
    /// The external agent answering for this node, or for the assignee of a task of a
    /// group this node hosts, reported where a long task stands (IoA's `run(task) ->
    /// task_id` contract, or an A2A task still working).
    AgentProgress {
        /// Group id.
        group_id: String,
        /// Task id within the group (empty for a task the node was asked directly).
        task_id: String,
        /// The name of the node whose agent it is.
        assignee: String,
        /// The external agent's name (`[[agent.external]]`).
        agent: String,
        /// `submitted` or `working`.
        state: String,
        /// What the agent says it is doing, if it says.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        progress: Option<String>,
    },
    /// A speaker lost its turn (it repeated earlier content, timed out or went down).
    TurnLost {
        /// Group id.
        group_id: String,
        /// The speaker's name.
        member: String,
        /// Why.
        reason: LostTurnReason,
    },
    /// A group concluded.
    Concluded {
        /// Group id.
        group_id: String,
        /// The group's conclusion message.
        conclusion: String,
        /// The task's answer (at most 60 words; see [`TaskResult::answer`]).
        #[serde(default)]
        answer: String,
        /// Evidence of every fact in the answer.
        #[serde(default)]
        citations: Vec<Citation>,
        /// Answered, partly answered or unknown.
        #[serde(default)]
        status: AnswerStatus,
    },
    /// A human proxy's person is asked for input (answer with `POST /api/human/{id}`).
    HumanInputRequested {
        /// Request id.
        request_id: String,
        /// Group it is about.
        group_id: String,
        /// `turn` or `task`.
        kind: String,
        /// What the person is asked.
        prompt: String,
    },
    /// A human input request was answered or timed out.
    HumanInputClosed {
        /// Request id.
        request_id: String,
        /// Whether the person answered.
        answered: bool,
    },
    /// A submitted task failed before it concluded.
    TaskFailed {
        /// The group id that carried it.
        group_id: String,
        /// What went wrong.
        error: String,
    },
    /// A memory was added (own or received).
    MemoryAdded {
        /// Memory id.
        id: String,
        /// Domain.
        domain: String,
        /// Author node id.
        author: String,
    },
}

/// `agent`/`speak` request: the host asks a member for its decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpeakRequest {
    /// Group.
    pub group_id: String,
    /// Goal.
    pub goal: String,
    /// Members.
    pub members: Vec<MemberRef>,
    /// Recent messages.
    pub transcript: Vec<Message>,
    /// Tasks so far.
    pub tasks: Vec<Task>,
    /// Turn number and limit.
    pub turn: u32,
    /// Turn limit.
    pub max_turns: u32,
    /// Types allowed.
    pub allowed: Vec<DecisionType>,
    /// Why the previous answer was refused.
    pub retry: Option<String>,
    /// JSON Schema the decision must match.
    pub schema: serde_json::Value,
}

/// `agent`/`task` request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRequest {
    /// Group.
    pub group_id: String,
    /// Goal of the group.
    pub goal: String,
    /// The task.
    pub task: Task,
    /// Sub-team depth allowed, if any.
    pub sub_team_depth: Option<u32>,
    /// Max depth of the tree.
    pub max_depth: u32,
    /// In a grounded inquiry: the sub-question to locate evidence for (the member answers
    /// with cited units, not free text).
    #[serde(default)]
    pub grounded: Option<SubQuestion>,
}

/// `agent`/`task` reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskReply {
    /// Success.
    pub ok: bool,
    /// Result or failure reason.
    pub result: String,
    /// Sub-team formed, if any.
    pub child_group: Option<String>,
    /// In a grounded inquiry: the evidence located, best first.
    #[serde(default)]
    pub evidence: Vec<Located>,
    /// The third-party agent whose verbatim answer `result` is (`executor =
    /// "external:NAME"`); absent when the node answered itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

/// `agent`/`locate` request: which units of your documents answer these sub-questions?
/// Answered from the documents alone (no model), so probing the swarm is cheap.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LocateRequest {
    /// The sub-questions.
    pub subs: Vec<SubQuestion>,
}

/// `agent`/`locate` reply: per sub-question, the best units (at most [`grounded::LOCATE_K`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LocateReply {
    /// Per sub-question, in order.
    pub hits: Vec<Vec<Located>>,
}

/// Task results a node keeps for `GET /api/tasks/{id}`.
pub const KEPT_RESULTS: usize = 256;

/// Most sub-questions one `locate` request may carry.
pub const MAX_LOCATE_SUBS: usize = 16;
/// Cards probed per query (the task and each sub-question) in a grounded inquiry.
pub const PROBE_CARDS: usize = 5;
/// Most nodes probed for one task.
pub const MAX_PROBED: usize = 12;
/// Longest agent name a `progress` note may show.
const MAX_AGENT_NAME_CHARS: usize = 64;
/// Most members a member keeps of a group another node hosts.
const MAX_GROUP_MEMBERS: usize = 64;
/// The state of a task's group from submission until a team's chat is launched.
pub const FORMING: &str = "forming";
/// The state of a task's group that failed before a chat was launched.
pub const FAILED: &str = "failed";
/// How many of the latest groups are looked at for one to resume when a host goes down.
const RESUMABLE_GROUPS: usize = 50;

/// `agent`/`message` notification.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageNote {
    /// Goal, so a member can show the group.
    pub goal: String,
    /// Sender name.
    pub sender_name: String,
    /// The message.
    pub message: Message,
    /// The group's live members in the host's order, so that a member can tell who
    /// takes over if the host goes down (empty from nodes that predate host failover).
    #[serde(default)]
    pub members: Vec<MemberRef>,
}

/// `agent`/`progress` notification: a member whose third-party agent works on a task of a
/// group the callee hosts says where the task stands, so that the host's watchers see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgressNote {
    /// Group.
    pub group_id: String,
    /// Task id within the group.
    pub task_id: String,
    /// The external agent's name (`[[agent.external]]`).
    pub agent: String,
    /// `submitted` or `working`.
    pub state: String,
    /// What the agent says it is doing, if it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
}

/// What a member keeps about a group another node hosts (the body of its group record).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct MemberView {
    /// The node whose messages, turns and tasks this node takes for the group.
    host: String,
    /// The members as the host last listed them.
    #[serde(default)]
    members: Vec<MemberRef>,
}

/// A task this node runs: what, under which group id, below which parent group, at which
/// nesting depth.
struct Job<'a> {
    task: &'a str,
    group_id: &'a str,
    parent: Option<String>,
    depth: u32,
}

/// A group taken over from a host that went down: that host, the members it had and the
/// log this node recorded.
struct Resume {
    previous_host: String,
    members: Vec<MemberRef>,
    messages: Vec<Message>,
}

/// How [`Agent::run_task`] finds the task's group: new, already stored as `forming`
/// ([`Agent::open_group`]), or taken over from a host that went down.
enum Start {
    Fresh,
    Opened,
    Resume(Resume),
}

/// A task's group stored as `forming` before the task runs ([`Agent::open_group`]).
#[must_use = "run the task with Agent::submit_opened"]
#[derive(Debug)]
pub struct OpenedGroup {
    task: String,
    group_id: String,
}

/// A finished task as `starling task` reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskResult {
    /// Group id (also for work done alone).
    pub group_id: String,
    /// Members (names), the submitter first.
    pub members: Vec<String>,
    /// The short, direct answer (at most 60 words): the facts asked for, each copied from
    /// cited evidence, or `unknown: ...` when the swarm does not hold them.
    pub answer: String,
    /// The evidence behind every fact of the answer.
    pub citations: Vec<Citation>,
    /// Whether the question is answered, partly answered or unknown.
    pub status: AnswerStatus,
    /// The group's conclusion message (the transcript's last word; the answer above is the
    /// result).
    pub conclusion: String,
    /// Turns used.
    pub turns: u32,
    /// Tokens this node's model spent on it.
    pub tokens: u64,
}

impl TaskResult {
    /// The answer followed by its numbered sources (`[1] node, document: "quote"`), as
    /// the protocols that carry one text (MCP, A2A) show it.
    pub fn answer_with_sources(&self) -> String {
        let mut text = self.answer.clone();
        if !self.citations.is_empty() {
            text.push_str("\n\nSources:");
            for (i, c) in self.citations.iter().enumerate() {
                text.push_str(&format!("\n[{}] {}", i + 1, c.line()));
            }
        }
        text
    }
}

/// Why a task could not be run.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The model failed.
    #[error(transparent)]
    Llm(#[from] crate::llm::LlmError),
    /// The executor failed.
    #[error(transparent)]
    Executor(#[from] super::executor::ExecutorError),
    /// The group could not be launched.
    #[error("cannot launch the group: {0}")]
    Launch(#[from] super::chat::LaunchError),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

struct Inner {
    /// The swarm (the real one, or an in-memory network in tests).
    swarm: Arc<dyn Peers>,
    /// Who decides this node's chat turns (its model, or a test's script).
    decide: Arc<dyn Decide>,
    me: String,
    name: String,
    config: NodeConfig,
    llm: Llm,
    embedder: Option<EmbedHandle>,
    executor: Executor,
    /// The third-party agent that answers the tasks assigned to this node (`[agent]
    /// executor = "external:NAME"`), if any.
    front: Option<ExternalAgent>,
    cards: Mutex<CardBook>,
    store: Store,
    events: broadcast::Sender<AgentEvent>,
    names: Mutex<HashMap<String, String>>,
    /// Open questions to this node's person (human proxies).
    human: Mutex<HashMap<String, PendingHuman>>,
    /// Disable the repetition guard (for measuring what it saves).
    repetition_guard: bool,
    /// Shared memories (worked examples for chat turns).
    memory: Option<MemoryBook>,
    /// Results of the latest tasks submitted here, newest last (at most
    /// [`KEPT_RESULTS`]; in memory: the groups themselves are in the store).
    results: Mutex<std::collections::VecDeque<TaskResult>>,
    /// Chat messages sent to members (per recipient) and received from hosts.
    pub(crate) messages_sent: std::sync::atomic::AtomicU64,
    pub(crate) messages_received: std::sync::atomic::AtomicU64,
    cancel: CancellationToken,
    /// Background tasks of the agent (the swarm follower, the memory announcer):
    /// [`Agent::close`] awaits them.
    background: crate::owned::Background,
}

struct PendingHuman {
    info: HumanRequest,
    reply: tokio::sync::oneshot::Sender<String>,
}

/// A question waiting for this node's person.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HumanRequest {
    /// Request id.
    pub request_id: String,
    /// Group it is about.
    pub group_id: String,
    /// `turn` or `task`.
    pub kind: String,
    /// What the person is asked.
    pub prompt: String,
}

/// The agent runtime handle (cheap to clone).
#[derive(Clone)]
pub struct Agent(Arc<Inner>);

/// Options of [`Agent::start`].
pub struct AgentOptions {
    /// Keep the repetition guard on (default).
    pub repetition_guard: bool,
    /// Shared memories: worked examples for chat turns (`[memory]` of the config says how
    /// many), and [`AgentEvent::MemoryAdded`] for each one stored.
    pub memory: Option<MemoryBook>,
    /// Who decides this node's chat turns; `None`: the node's model (the `llm` given to
    /// [`Agent::start`]). Tests script decisions through it.
    pub decide: Option<Arc<dyn Decide>>,
}

impl Default for AgentOptions {
    fn default() -> Self {
        Self {
            repetition_guard: true,
            memory: None,
            decide: None,
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn rpc_err(code: RpcErrorCode, e: impl std::fmt::Display) -> RpcError {
    RpcError::new(code, e.to_string())
}

impl Agent {
    /// Starts the runtime: publishes this node's card, loads known cards, registers the
    /// RPC handlers and follows swarm events.
    #[allow(clippy::too_many_arguments)]
    pub async fn start(
        swarm: impl Peers,
        config: NodeConfig,
        llm: Llm,
        embedder: Option<EmbedHandle>,
        executor: Executor,
        store: Store,
        models: Vec<String>,
        opts: AgentOptions,
        cancel: CancellationToken,
    ) -> anyhow::Result<Self> {
        let swarm: Arc<dyn Peers> = Arc::new(swarm);
        let (events, _) = broadcast::channel(1024);
        let dim = embedder.as_ref().map_or(0, |e| e.dim());
        let front = match config
            .agent
            .fronted()
            .map_err(|e| anyhow::anyhow!("agent.executor {e}"))?
        {
            Some(x) => Some(ExternalAgent::from_config(x).map_err(|e| anyhow::anyhow!("{e}"))?),
            None => None,
        };
        let decide: Arc<dyn Decide> = match &opts.decide {
            Some(d) => d.clone(),
            None => Arc::new(llm.clone()),
        };
        let agent = Agent(Arc::new(Inner {
            decide,
            me: swarm.node_id().to_string(),
            name: swarm.name().to_owned(),
            swarm: swarm.clone(),
            config: config.clone(),
            llm,
            embedder,
            executor,
            front,
            cards: Mutex::new(CardBook::new(dim)),
            store,
            events,
            names: Mutex::new(HashMap::new()),
            human: Mutex::new(HashMap::new()),
            repetition_guard: opts.repetition_guard,
            memory: opts.memory.clone(),
            results: Mutex::new(std::collections::VecDeque::new()),
            messages_sent: Default::default(),
            messages_received: Default::default(),
            cancel,
            background: crate::owned::Background::new(),
        }));
        // Subscribe before loading: a card that arrives while the stored ones load (a
        // sync on connect does that at start) is then seen by `follow_swarm`, not lost.
        let swarm_events = swarm.events();
        // Every card we already have (persisted by the record store), then our own.
        for r in swarm
            .records(CARD_KIND)
            .map_err(|e| anyhow::anyhow!("{e}"))?
        {
            agent.learn_card(&r).await;
        }
        let mut card = AgentCard::from_config(&config, models);
        // What the executor really offers: external agents and MCP tools too, and
        // `search_docs` only with a docs folder.
        card.tools = agent.0.executor.tools().names();
        let current = agent.cards().get(&agent.0.me).map(|k| k.card.clone());
        if current.as_ref() != Some(&card) {
            let r = swarm
                .publish(CARD_KIND, card.to_body())
                .await
                .map_err(|e| anyhow::anyhow!("cannot publish the agent card: {e}"))?;
            agent.learn_card(&r).await;
        }
        let a = agent.clone();
        swarm.register(
            SERVICE,
            Arc::new(move |req: Request| {
                let a = a.clone();
                async move { a.handle_rpc(req).await }
            }),
        );
        agent
            .0
            .background
            .spawn(agent.clone().follow_swarm(swarm_events));
        if let Some(book) = &opts.memory {
            agent.announce_memories(book);
        }
        Ok(agent)
    }

    fn cards(&self) -> std::sync::MutexGuard<'_, CardBook> {
        match self.0.cards.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// After the node's cancel fired: waits up to `limit` for the agent's background work
    /// (its own and its executor's) to stop, and aborts what is left; returns how many
    /// tasks had to be aborted.
    pub async fn close(&self, limit: std::time::Duration) -> usize {
        let (own, executor) =
            tokio::join!(self.0.background.close(limit), self.0.executor.close(limit));
        own + executor
    }

    /// Background tasks the agent holds (running, or ended and not yet reaped).
    pub fn background_tasks(&self) -> usize {
        self.0.background.len() + self.0.executor.background_tasks()
    }

    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.0.me
    }

    /// Subscribes to events.
    pub fn events(&self) -> broadcast::Receiver<AgentEvent> {
        self.0.events.subscribe()
    }

    /// Publishes [`AgentEvent::MemoryAdded`] for every memory `book` stores from now on,
    /// until the node stops.
    fn announce_memories(&self, book: &crate::memory::MemoryBook) {
        let mut rx = book.subscribe_added();
        let agent = self.clone();
        self.0.background.spawn(async move {
            loop {
                let m = tokio::select! {
                    biased;
                    _ = agent.0.cancel.cancelled() => break,
                    m = rx.recv() => m,
                };
                match m {
                    Ok(m) => agent.emit(AgentEvent::MemoryAdded {
                        id: m.id,
                        domain: m.domain,
                        author: m.author,
                    }),
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::debug!(missed = n, "memory events skipped (burst of memories)")
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                }
            }
        });
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.0.store
    }

    /// (messages sent to members, messages received from hosts).
    pub fn message_counts(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.0.messages_sent.load(Relaxed),
            self.0.messages_received.load(Relaxed),
        )
    }

    /// The model handle (token counters).
    pub fn llm(&self) -> &Llm {
        &self.0.llm
    }

    /// Every known card.
    pub fn known_cards(&self) -> Vec<super::card::KnownCard> {
        self.cards().all()
    }

    fn emit(&self, e: AgentEvent) {
        let _ = self.0.events.send(e);
    }

    fn name_of(&self, id: &str) -> String {
        if id == self.0.me {
            return self.0.name.clone();
        }
        if let Some(n) = self.0.names.lock().ok().and_then(|m| m.get(id).cloned()) {
            return n;
        }
        if let Some(c) = self.cards().get(id) {
            return c.card.name.clone();
        }
        id.chars().take(10).collect()
    }

    /// Embeds `texts` in one batch; none when there is no embedder or it fails (the caller
    /// then searches or indexes by text only).
    async fn embed_many(&self, texts: Vec<String>) -> Vec<Vec<f32>> {
        match &self.0.embedder {
            Some(e) => e.embed(texts).await.unwrap_or_else(|err| {
                tracing::warn!(error = %err, "embedding failed; using text only");
                Vec::new()
            }),
            None => Vec::new(),
        }
    }

    async fn learn_card(&self, r: &starling_discovery::Record) {
        let card = match AgentCard::from_record(r) {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(author = %r.author().short(), error = %e, "ignoring card");
                return;
            }
        };
        let v = self.embed_many(card.passages()).await;
        let author = r.author().to_string();
        let name = card.name.clone();
        if self.cards().upsert(&author, r.timestamp_ms(), card, v) {
            if let Ok(mut m) = self.0.names.lock() {
                m.insert(author.clone(), name.clone());
            }
            self.emit(AgentEvent::Card {
                node_id: author,
                name,
            });
        }
    }

    async fn follow_swarm(self, mut rx: broadcast::Receiver<SwarmEvent>) {
        // Groups resumed after their host went down; dropped (so stopped) with this loop.
        let mut failovers = tokio::task::JoinSet::new();
        loop {
            let ev = tokio::select! {
                biased;
                _ = self.0.cancel.cancelled() => break,
                Some(_) = failovers.join_next(), if !failovers.is_empty() => continue,
                ev = rx.recv() => ev,
            };
            match ev {
                Ok(SwarmEvent::PeerUp(p)) => {
                    if let Ok(mut m) = self.0.names.lock() {
                        m.insert(p.id.to_string(), p.name.clone());
                    }
                    self.emit(AgentEvent::PeerUp {
                        node_id: p.id.to_string(),
                        name: p.name,
                    })
                }
                Ok(SwarmEvent::PeerDown(id)) => {
                    self.emit(AgentEvent::PeerDown {
                        node_id: id.to_string(),
                    });
                    failovers.spawn(self.clone().fail_over(id.to_string()));
                }
                Ok(SwarmEvent::Record { id, kind, .. }) if kind == CARD_KIND => {
                    if let Ok(Some(r)) = self.0.swarm.record(&id) {
                        self.learn_card(&r).await;
                    }
                }
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(
                        missed = n,
                        "agent fell behind swarm events; reloading cards"
                    );
                    if let Ok(all) = self.0.swarm.records(CARD_KIND) {
                        for r in all {
                            self.learn_card(&r).await;
                        }
                    }
                }
                Err(broadcast::error::RecvError::Closed) => break,
            }
        }
    }

    /// Hybrid search over known cards (this node left out).
    pub async fn search_cards(&self, query: &str, k: usize) -> Vec<CardHit> {
        // A query of several sentences is searched whole and sentence by sentence
        // (`CardBook::search_with_parts`); all embedded in one batch.
        let sentences = crate::search::query_parts(query);
        let mut texts = vec![query.to_owned()];
        texts.extend(sentences.iter().cloned());
        let mut vectors = self.embed_many(texts).await.into_iter();
        let v = vectors.next().unwrap_or_default();
        let part_vectors: Vec<Vec<f32>> = vectors.collect();
        let parts: Vec<(&str, &[f32])> = if part_vectors.len() == sentences.len() {
            sentences
                .iter()
                .zip(&part_vectors)
                .map(|(s, v)| (s.as_str(), v.as_slice()))
                .collect()
        } else {
            sentences.iter().map(|s| (s.as_str(), &[][..])).collect()
        };
        let me = self.0.me.clone();
        self.cards()
            .search_with_parts(query, &v, &parts, k, &[me.as_str()])
    }

    async fn contact_lines(&self) -> Vec<ContactLine> {
        match self.0.store.contacts::<String>().await {
            Ok(cs) => cs
                .into_iter()
                .map(|c| ContactLine {
                    node_id: c.node_id,
                    name: c.name,
                    tasks: c.n_tasks,
                    successes: c.n_success,
                })
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the contact book");
                Vec::new()
            }
        }
    }

    /// Forms a team for `task` with the model (formation only, no chat).
    pub async fn form(&self, task: &str) -> Result<Formation, AgentError> {
        self.form_with(task, FormationConfig::default()).await
    }

    async fn form_with(
        &self,
        task: &str,
        config: FormationConfig,
    ) -> Result<Formation, AgentError> {
        let contacts = self.contact_lines().await;
        Ok(form_team(
            self.0.decide.as_ref(),
            self,
            task,
            &self.0.me,
            &contacts,
            &config,
        )
        .await?)
    }

    /// Handles a task submitted to this node: forms a team (or works alone), runs the
    /// group chat it hosts, records how each collaborator did, returns the conclusion.
    pub async fn submit(&self, task: &str) -> Result<TaskResult, AgentError> {
        let group_id = new_group_id();
        self.run_task(task, group_id, None, 0, Start::Fresh).await
    }

    /// Like [`Agent::submit`] with a chosen group id (so a caller can follow its events).
    /// A failure is also published as [`AgentEvent::TaskFailed`].
    pub async fn submit_as(&self, task: &str, group_id: String) -> Result<TaskResult, AgentError> {
        self.submit_started(task, group_id, Start::Fresh).await
    }

    /// [`Agent::submit_as`] for a group [`Agent::open_group`] has already stored.
    pub async fn submit_opened(&self, opened: OpenedGroup) -> Result<TaskResult, AgentError> {
        self.submit_started(&opened.task, opened.group_id, Start::Opened)
            .await
    }

    async fn submit_started(
        &self,
        task: &str,
        group_id: String,
        start: Start,
    ) -> Result<TaskResult, AgentError> {
        let r = self.run_task(task, group_id.clone(), None, 0, start).await;
        match &r {
            Ok(result) => self.keep_result(result.clone()),
            Err(e) => self.emit(AgentEvent::TaskFailed {
                group_id,
                error: e.to_string(),
            }),
        }
        r
    }

    /// Stores the group of a task about to be submitted as `forming`, so that
    /// `GET /api/groups/{id}` answers for it as soon as its id is handed out; run it with
    /// [`Agent::submit_opened`] ([`Agent::submit_as`] stores it when it starts).
    pub async fn open_group(&self, task: &str, group_id: &str) -> OpenedGroup {
        let own = Job {
            task,
            group_id,
            parent: None,
            depth: 0,
        };
        self.persist_own(&own, FORMING, 0, None).await;
        OpenedGroup {
            task: task.to_owned(),
            group_id: group_id.to_owned(),
        }
    }

    fn keep_result(&self, result: TaskResult) {
        let mut kept = lock(&self.0.results);
        if kept.len() >= KEPT_RESULTS {
            kept.pop_front();
        }
        kept.push_back(result);
    }

    /// The result of a task submitted here (one of the latest [`KEPT_RESULTS`]).
    pub fn task_result(&self, group_id: &str) -> Option<TaskResult> {
        lock(&self.0.results)
            .iter()
            .rev()
            .find(|r| r.group_id == group_id)
            .cloned()
    }

    async fn run_task(
        &self,
        task: &str,
        group_id: String,
        parent: Option<String>,
        depth: u32,
        start: Start,
    ) -> Result<TaskResult, AgentError> {
        let (p0, c0, _) = self.0.llm.counters().snapshot();
        self.emit(AgentEvent::TaskSubmitted {
            group_id: group_id.clone(),
            task: task.to_owned(),
        });
        // From submission on the task has a group here: `forming` (this node alone) until a
        // team's chat is launched and stores its own record.
        let own = Job {
            task,
            group_id: &group_id,
            parent,
            depth,
        };
        let resume = match start {
            Start::Fresh => {
                self.persist_own(&own, FORMING, 0, None).await;
                None
            }
            Start::Opened => None,
            Start::Resume(r) => Some(r),
        };
        let run = match self.0.config.agent.collaboration {
            Collaboration::Grounded => self.run_grounded(&own, resume).await,
            Collaboration::Chat => self.run_chat(&own, resume).await,
        };
        let result = match run {
            Ok(r) => r,
            Err(e) => {
                if self.still_forming(&group_id).await {
                    self.persist_own(&own, FAILED, 0, None).await;
                }
                return Err(e);
            }
        };
        // A task done alone had no group chat: it is stored as a concluded group of one, so
        // `GET /api/groups/{id}` answers for every task that ended here.
        if self.still_forming(&group_id).await {
            let concluded = state_name(ChatState::Conclusion);
            self.persist_own(&own, concluded, result.turns, Some(result.answer.clone()))
                .await;
        }
        let (p1, c1, _) = self.0.llm.counters().snapshot();
        Ok(TaskResult {
            tokens: (p1 - p0) + (c1 - c0),
            ..result
        })
    }

    /// Answers `task` the model's way: it forms the team, writes the tasks and the
    /// conclusion (`[agent] collaboration = "chat"`).
    async fn run_chat(
        &self,
        job: &Job<'_>,
        resume: Option<Resume>,
    ) -> Result<TaskResult, AgentError> {
        let (task, group_id, parent, depth) = (
            job.task,
            job.group_id.to_owned(),
            job.parent.clone(),
            job.depth,
        );
        // A resumed group keeps the team its host formed.
        if let Some(r) = resume {
            let members = self.team(self.survivors(&r));
            let params = self.launch_params(group_id, task, members, depth);
            return self.host(params, parent, None, Some(r)).await;
        }
        let mut formation = self.form(task).await?;
        self.emit(AgentEvent::TeamFormed {
            group_id: group_id.clone(),
            members: formation.members.iter().map(|m| m.name.clone()).collect(),
            calls: formation.calls.len(),
        });
        let mut alone = None;
        if formation.members.is_empty() {
            let out = self
                .0
                .executor
                .run(&TaskSpec {
                    task_id: format!("{group_id}/t0"),
                    description: task.to_owned(),
                    context: String::new(),
                })
                .await?;
            // The model chose to work alone but the answer has no support (the verifier
            // rejected it and nothing on this node grounded it): ask the swarm after all,
            // this time with working alone ruled out while candidates exist.
            if needs_help(&out) {
                let again = self
                    .form_with(
                        task,
                        FormationConfig {
                            require_team: true,
                            ..FormationConfig::default()
                        },
                    )
                    .await?;
                if !again.members.is_empty() {
                    tracing::info!(
                        members = again.members.len(),
                        "answer alone was unsupported; forming a team"
                    );
                    self.emit(AgentEvent::TeamFormed {
                        group_id: group_id.clone(),
                        members: again.members.iter().map(|m| m.name.clone()).collect(),
                        calls: again.calls.len(),
                    });
                    formation = again;
                }
            }
            alone = Some(out);
        }
        let result = if let (Some(out), true) = (alone, formation.members.is_empty()) {
            self.emit(AgentEvent::Concluded {
                group_id: group_id.clone(),
                conclusion: out.answer.clone(),
                answer: clip_words(&out.answer, grounded::MAX_ANSWER_WORDS),
                citations: Vec::new(),
                status: AnswerStatus::Unknown,
            });
            TaskResult {
                group_id,
                members: vec![self.0.name.clone()],
                answer: clip_words(&out.answer, grounded::MAX_ANSWER_WORDS),
                citations: Vec::new(),
                status: AnswerStatus::Unknown,
                conclusion: out.answer,
                turns: 0,
                tokens: 0,
            }
        } else {
            let members = self.team(
                formation
                    .members
                    .iter()
                    .map(|r| (r.node_id.clone(), r.name.clone())),
            );
            let params = self.launch_params(group_id.clone(), task, members, depth);
            self.host(params, parent, None, None).await?
        };
        Ok(result)
    }
}

impl AgentSearch for Agent {
    async fn search(&self, query: &str, k: usize) -> Vec<CardHit> {
        self.search_cards(query, k).await
    }
}

/// What the store keeps about a group besides its columns.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GroupBody {
    /// Members.
    pub members: Vec<MemberRef>,
    /// Host.
    pub initiator: String,
    /// Turns used.
    pub turn: u32,
    /// Turn limit.
    pub max_turns: u32,
    /// Nesting depth.
    pub depth: u32,
    /// Conclusion, once concluded.
    pub conclusion: Option<String>,
}

/// Whether an answer this node produced alone lacks support: the verifier rejected it and
/// no passage or calculation on this node grounded it.
fn needs_help(out: &super::executor::TaskOutcome) -> bool {
    !out.verified && !out.steps.iter().any(|s| s.grounded)
}

/// Locks `m`, also when a panic poisoned it (the data is plain state, never half-written).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Wire name of a chat state.
pub fn state_name(s: ChatState) -> &'static str {
    match s {
        ChatState::Discussion => "discussion",
        ChatState::SyncTaskAssignment => "sync_task_assignment",
        ChatState::AsyncTaskAssignment => "async_task_assignment",
        ChatState::PauseAndTrigger => "pause_and_trigger",
        ChatState::Conclusion => "conclusion",
    }
}

/// A fresh group id.
pub fn new_group_id() -> String {
    let r: u64 = rand::random();
    format!("g{:012x}", r & 0xffff_ffff_ffff)
}

#[cfg(test)]
mod sim_tests;
#[cfg(test)]
mod wire_tests;
