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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use starling_discovery::{NodeId, PeerState, Request, RpcError, RpcErrorCode, Swarm, SwarmEvent};
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
use super::llm::Llm;
use super::tools::{ExternalAgent, ExternalTask};
use crate::config::{AgentKind, Collaboration, HumanFallback, HumanInput, NodeConfig};
use crate::memory::{format_examples, MemoryBook, DEFAULT_DOMAIN};
use crate::store::{GroupRecord, Store, TaskRecord};

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
#[derive(Debug, Clone, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LocateRequest {
    /// The sub-questions.
    pub subs: Vec<SubQuestion>,
}

/// `agent`/`locate` reply: per sub-question, the best units (at most [`grounded::LOCATE_K`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
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
/// Most members a member keeps of a group another node hosts.
const MAX_GROUP_MEMBERS: usize = 64;
/// The state of a task's group from submission until a team's chat is launched.
pub const FORMING: &str = "forming";
/// The state of a task's group that failed before a chat was launched.
pub const FAILED: &str = "failed";
/// How many of the latest groups are looked at for one to resume when a host goes down.
const RESUMABLE_GROUPS: usize = 50;

/// `agent`/`message` notification.
#[derive(Debug, Clone, Serialize, Deserialize)]
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

/// What a member keeps about a group another node hosts (the body of its group record).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct MemberView {
    /// The node whose messages, turns and tasks this node takes for the group.
    host: String,
    /// The members as the host last listed them.
    #[serde(default)]
    members: Vec<MemberRef>,
}

/// The group of a task this node runs, as stored before (or without) a chat.
struct OwnGroup<'a> {
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
    Llm(#[from] super::llm::LlmError),
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
    swarm: Swarm,
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
}

impl Default for AgentOptions {
    fn default() -> Self {
        Self {
            repetition_guard: true,
            memory: None,
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
        swarm: Swarm,
        config: NodeConfig,
        llm: Llm,
        embedder: Option<EmbedHandle>,
        executor: Executor,
        store: Store,
        models: Vec<String>,
        opts: AgentOptions,
        cancel: CancellationToken,
    ) -> anyhow::Result<Self> {
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
        let agent = Agent(Arc::new(Inner {
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
        swarm.register_handler(SERVICE, move |req: Request| {
            let a = a.clone();
            async move { a.handle_rpc(req).await }
        });
        tokio::spawn(agent.clone().follow_swarm(swarm_events));
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
        tokio::spawn(async move {
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
        Ok(form_team(&self.0.llm, self, task, &self.0.me, &contacts, &config).await?)
    }

    /// Handles a task submitted to this node: forms a team (or works alone), runs the
    /// group chat it hosts, records how each collaborator did, returns the conclusion.
    pub async fn submit(&self, task: &str) -> Result<TaskResult, AgentError> {
        let group_id = new_group_id();
        self.run_task(task, group_id, None, 0, None).await
    }

    /// Like [`Agent::submit`] with a chosen group id (so a caller can follow its events).
    /// A failure is also published as [`AgentEvent::TaskFailed`].
    pub async fn submit_as(&self, task: &str, group_id: String) -> Result<TaskResult, AgentError> {
        let r = self.run_task(task, group_id.clone(), None, 0, None).await;
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
    /// `GET /api/groups/{id}` answers for it as soon as its id is handed out
    /// ([`Agent::submit_as`] does the same when it starts).
    pub async fn open_group(&self, task: &str, group_id: &str) {
        let own = OwnGroup {
            task,
            group_id,
            parent: None,
            depth: 0,
        };
        self.persist_own(&own, FORMING, 0, None).await;
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
        resume: Option<Resume>,
    ) -> Result<TaskResult, AgentError> {
        let (p0, c0, _) = self.0.llm.counters().snapshot();
        self.emit(AgentEvent::TaskSubmitted {
            group_id: group_id.clone(),
            task: task.to_owned(),
        });
        // From submission on the task has a group here: `forming` (this node alone) until a
        // team's chat is launched and stores its own record.
        let own = OwnGroup {
            task,
            group_id: &group_id,
            parent: parent.clone(),
            depth,
        };
        if resume.is_none() {
            self.persist_own(&own, FORMING, 0, None).await;
        }
        let run = match self.0.config.agent.collaboration {
            Collaboration::Grounded => {
                self.run_grounded(task, group_id.clone(), parent.clone(), depth, resume)
                    .await
            }
            Collaboration::Chat => {
                self.run_chat(task, group_id.clone(), parent.clone(), depth, resume)
                    .await
            }
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
        task: &str,
        group_id: String,
        parent: Option<String>,
        depth: u32,
        resume: Option<Resume>,
    ) -> Result<TaskResult, AgentError> {
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

    /// Answers `task` as a grounded inquiry: the task's own clauses become sub-questions;
    /// the cards that match them are searched and those nodes probed (`agent`/`locate`,
    /// documents only, no model) for cited evidence; each sub-question is routed to the
    /// node holding its value (or, for a bridge, the node naming the entity and then the one
    /// holding its value; for a calculation, the two holding its numbers). The team is the
    /// nodes routed to; this node hosts a moderated group chat that assigns the
    /// sub-questions as tasks, asks the follow-ups in a second round and concludes with the
    /// answer built from the cited spans. When this node holds everything (or nobody holds
    /// anything) it answers alone.
    async fn run_grounded(
        &self,
        task: &str,
        group_id: String,
        parent: Option<String>,
        depth: u32,
        resume: Option<Resume>,
    ) -> Result<TaskResult, AgentError> {
        let planner = Planner::new(task);
        // Whom to probe. Probing costs no model call (each node matches text against its
        // own documents), so a swarm of at most MAX_PROBED known nodes is probed whole: a
        // card rarely names what its documents hold (a membership secretary's card does
        // not say `M-0417`). A larger swarm is searched: the cards matching the task or one
        // of its sub-questions, and later those matching each follow-up question.
        // Every known card, for the priors of whichever nodes end up probed.
        let cards: Vec<(String, String)> = self
            .known_cards()
            .into_iter()
            .map(|k| {
                let text = format!("{} {}", k.card.description, k.card.skills.join(" "));
                (k.node_id, text)
            })
            .collect();
        // Nodes membership has declared down are not probed (a call to them would wait for
        // its timeout).
        let known: Vec<String> = cards
            .iter()
            .map(|(id, _)| id.clone())
            .filter(|id| *id != self.0.me && !self.is_down(id))
            .collect();
        let search_each_probe = known.len() > MAX_PROBED;
        let mut candidates: Vec<String> = if search_each_probe { Vec::new() } else { known };
        if search_each_probe {
            let queries = std::iter::once(task.to_owned())
                .chain(planner.subs().iter().map(|s| s.text.clone()))
                .collect::<Vec<_>>();
            self.add_candidates(&mut candidates, &queries).await;
        }
        let mut planner = planner.with_cards(cards);
        // The plan asks for at most three rounds of probes; this side only moves them.
        let routed = loop {
            match planner.next_step() {
                PlanStep::Probe(asked) => {
                    if search_each_probe {
                        let queries: Vec<String> = asked.iter().map(|s| s.text.clone()).collect();
                        self.add_candidates(&mut candidates, &queries).await;
                    }
                    let hits = self.probe(&candidates, &asked).await;
                    planner.handle(hits);
                }
                PlanStep::Done(routed) => break routed,
            }
        };
        for ((sub, route), hits) in routed.iter().zip(planner.hits()) {
            tracing::debug!(sub = %sub.text, ?route, "routed");
            for h in hits {
                tracing::trace!(
                    node = %h.node_id,
                    score = h.located.score,
                    span = ?h.located.span,
                    unit = %h.located.unit.text,
                    "hit"
                );
            }
        }
        // Nothing in any node's documents: a third-party agent whose card matches may take
        // the whole task (this node's own included).
        let own = self.0.front.as_ref().map(|f| AgentOffer {
            node_id: self.0.me.clone(),
            agent: f.name().to_owned(),
            bm25: 0.0,
            cosine: 0.0,
        });
        // Searching the cards costs an embedding: only when documents hold nothing.
        let offers = if grounded::wants_agent(&routed) {
            self.agent_offers(task).await
        } else {
            Vec::new()
        };
        let routed = match grounded::delegate(task, &routed, &offers, own.as_ref()) {
            Some((sub, route @ Route::Agent { .. })) => {
                if let (Route::Agent { node_id, .. }, Some(front)) = (&route, &self.0.front) {
                    if *node_id == self.0.me {
                        return Ok(self.answer_by_front(front, sub, route, group_id).await);
                    }
                }
                vec![(sub, route)]
            }
            _ => routed,
        };
        let inquiry = Inquiry::new(task, &self.0.me, routed).with_alternates(planner.hits());
        let member_ids = inquiry.members();
        self.emit(AgentEvent::TeamFormed {
            group_id: group_id.clone(),
            members: member_ids.iter().map(|m| self.name_of(m)).collect(),
            calls: 0,
        });
        let result = if member_ids.is_empty() && resume.is_none() {
            let inquiry = Mutex::new(inquiry);
            let answer = match self.advance(&inquiry, true) {
                Next::Conclude(a) => self.named(a),
                Next::Assign(_) => self.named(lock(&inquiry).answer()),
            };
            self.concluded_alone(group_id, answer)
        } else {
            // A resumed group keeps its members, so that the rest of the log (the
            // conclusion above all) reaches them too.
            let mut others: Vec<(String, String)> = member_ids
                .iter()
                .map(|id| (id.clone(), self.name_of(id)))
                .collect();
            for (id, name) in resume.iter().flat_map(|r| self.survivors(r)) {
                if !others.iter().any(|(o, _)| *o == id) {
                    others.push((id, name));
                }
            }
            let members = self.team(others);
            let mut params = self.launch_params(group_id, task, members, depth);
            params.config.moderated = true;
            // The inquiry's plan makes the opening assignment.
            params.config.opening_assignment = false;
            // The host's turns are computed, not generated: nothing to guard against.
            params.config.repetition_guard = false;
            params.max_turns = params.max_turns.max(4);
            let inquiry = Arc::new(Mutex::new(inquiry));
            self.host(params, parent, Some(inquiry), resume).await?
        };
        Ok(result)
    }

    /// The third-party agents that known cards (this node's own included) offer, best
    /// match for `task` first.
    async fn agent_offers(&self, task: &str) -> Vec<AgentOffer> {
        let fronting = self
            .known_cards()
            .iter()
            .filter(|k| k.card.agent.is_some())
            .count();
        if fronting == 0 {
            return Vec::new();
        }
        let v = self
            .embed_many(vec![task.to_owned()])
            .await
            .into_iter()
            .next()
            .unwrap_or_default();
        let all = self.known_cards().len();
        self.cards()
            .search(task, &v, all, &[])
            .into_iter()
            .filter_map(|h| {
                Some(AgentOffer {
                    agent: h.card.card.agent?,
                    node_id: h.card.node_id,
                    bm25: h.bm25,
                    cosine: h.cosine,
                })
            })
            .collect()
    }

    /// This node's own agent answers the task alone (`sub` routed to it by `route`): its
    /// words are the answer, cited as its.
    async fn answer_by_front(
        &self,
        front: &ExternalAgent,
        sub: SubQuestion,
        route: Route,
        group_id: String,
    ) -> TaskResult {
        self.emit(AgentEvent::TeamFormed {
            group_id: group_id.clone(),
            members: vec![self.0.name.clone()],
            calls: 0,
        });
        let task = sub.text.clone();
        let external = ExternalTask {
            task_id: group_id.clone(),
            description: task.clone(),
            context: String::new(),
        };
        let reply = self.ask_front(front, &external).await;
        let mut inquiry = Inquiry::new(&task, &self.0.me, vec![(sub, route)]);
        inquiry.record_reply(&self.0.me, &task, reply.ok.then_some(reply.result));
        self.concluded_alone(group_id, self.named(inquiry.answer()))
    }

    /// The result of a task this node answered alone with `answer` (announced as
    /// concluded).
    fn concluded_alone(&self, group_id: String, answer: Answer) -> TaskResult {
        self.emit(AgentEvent::Concluded {
            group_id: group_id.clone(),
            conclusion: answer_message(&answer),
            answer: answer.answer.clone(),
            citations: answer.citations.clone(),
            status: answer.status,
        });
        TaskResult {
            group_id,
            members: vec![self.0.name.clone()],
            conclusion: answer_message(&answer),
            answer: answer.answer,
            citations: answer.citations,
            status: answer.status,
            turns: 0,
            tokens: 0,
        }
    }

    /// Asks `nodes` (this one answered locally) which of their units answer `subs`; per
    /// sub-question, every node's hits. Nodes that fail to answer are left out.
    /// Adds the nodes whose cards best match each of `queries` (PROBE_CARDS per query) to
    /// `candidates`, up to MAX_PROBED in all.
    async fn add_candidates(&self, candidates: &mut Vec<String>, queries: &[String]) {
        for q in queries {
            for h in self.search_cards(q, PROBE_CARDS).await {
                if candidates.len() >= MAX_PROBED {
                    return;
                }
                if h.card.node_id != self.0.me && !candidates.contains(&h.card.node_id) {
                    candidates.push(h.card.node_id);
                }
            }
        }
    }

    async fn probe(&self, nodes: &[String], subs: &[SubQuestion]) -> Vec<Vec<NodeHit>> {
        let mut out: Vec<Vec<NodeHit>> = vec![Vec::new(); subs.len()];
        for (i, sub) in subs.iter().enumerate() {
            for l in self.locate_local(sub) {
                out[i].push(NodeHit {
                    node_id: self.0.me.clone(),
                    located: l,
                    prior: 0.0,
                });
            }
        }
        let peers: Vec<NodeId> = nodes
            .iter()
            .filter(|n| **n != self.0.me)
            .filter_map(|n| n.parse().ok())
            .collect();
        if peers.is_empty() || subs.is_empty() {
            return out;
        }
        let body = match serde_json::to_vec(&LocateRequest {
            subs: subs.iter().take(MAX_LOCATE_SUBS).cloned().collect(),
        }) {
            Ok(b) => b,
            Err(_) => return out,
        };
        for (peer, r) in self.0.swarm.fan_out(&peers, SERVICE, "locate", body).await {
            let reply: LocateReply = match r
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(peer = %peer.short(), error = %e, "probe failed");
                    continue;
                }
            };
            for (i, hits) in reply.hits.into_iter().enumerate().take(subs.len()) {
                for l in hits.into_iter().take(grounded::LOCATE_K) {
                    out[i].push(NodeHit {
                        node_id: peer.to_string(),
                        located: l,
                        prior: 0.0,
                    });
                }
            }
        }
        out
    }

    /// The best units of this node's documents for `sub`.
    fn locate_local(&self, sub: &SubQuestion) -> Vec<Located> {
        self.0
            .executor
            .tools()
            .docs()
            .map(|d| d.locate(sub, grounded::LOCATE_K))
            .unwrap_or_default()
    }

    /// A grounded task: the units of this node's documents that answer `sub`, quoted; the
    /// task result names the value and its evidence, or says nothing was found.
    fn grounded_task(&self, sub: &SubQuestion) -> TaskReply {
        let evidence = self.locate_local(sub);
        let valued = evidence
            .iter()
            .find(|l| l.span.is_some() && l.score >= grounded::MIN_SCORE);
        let result = match (valued, evidence.first()) {
            (Some(l), _) => format!(
                "{} (\"{}\", {})",
                l.span.as_deref().unwrap_or_default(),
                l.unit.text,
                l.unit.document
            ),
            (None, Some(l)) if l.score >= grounded::MIN_SCORE => {
                format!("related: \"{}\" ({})", l.unit.text, l.unit.document)
            }
            _ => "not found in my documents".to_owned(),
        };
        TaskReply {
            ok: !evidence.is_empty(),
            result,
            child_group: None,
            evidence,
            agent: None,
        }
    }

    /// Runs the inquiry's pending steps at this node until only other nodes' steps are
    /// pending (returned, unless `last`: then the answer as it stands) or the answer is
    /// known.
    fn advance(&self, inquiry: &Mutex<Inquiry>, last: bool) -> Next {
        loop {
            let next = lock(inquiry).next_step();
            let Next::Assign(steps) = next else {
                return next;
            };
            let (mine, others): (Vec<_>, Vec<_>) =
                steps.into_iter().partition(|(node, _)| *node == self.0.me);
            if mine.is_empty() {
                return if last {
                    Next::Conclude(lock(inquiry).answer())
                } else {
                    Next::Assign(others)
                };
            }
            for (node, text) in mine {
                let Some(sub) = lock(inquiry).step_sub(&node, &text) else {
                    continue;
                };
                let found = self.locate_local(&sub);
                lock(inquiry).record(&node, &text, found);
            }
        }
    }

    /// The host's decision for its turn in a grounded inquiry.
    fn inquiry_turn(&self, inquiry: &Mutex<Inquiry>, last: bool) -> Decision {
        let next = self.advance(inquiry, last);
        match next {
            Next::Assign(steps) => Decision {
                msg_type: DecisionType::AssignSync,
                content: format!(
                    "{} sub-question(s) of the task, each for the member whose documents hold its evidence.",
                    steps.len()
                ),
                next_speakers: Vec::new(),
                tasks: steps
                    .into_iter()
                    .map(|(assignee, task_desc)| ChatTaskSpec {
                        assignee,
                        task_abstract: None,
                        task_desc,
                    })
                    .collect(),
                triggers: Vec::new(),
            },
            Next::Conclude(a) => Decision {
                msg_type: DecisionType::Conclude,
                content: answer_message(&self.named(a)),
                next_speakers: Vec::new(),
                tasks: Vec::new(),
                triggers: Vec::new(),
            },
        }
    }

    /// A group's members: this node first (it hosts), then `others` (id, name).
    fn team(&self, others: impl IntoIterator<Item = (String, String)>) -> Vec<MemberRef> {
        let me = MemberRef {
            id: self.0.me.clone(),
            name: self.0.name.clone(),
        };
        std::iter::once(me)
            .chain(others.into_iter().map(|(id, name)| MemberRef { id, name }))
            .collect()
    }

    /// `a` with node names in its citations.
    fn named(&self, mut a: Answer) -> Answer {
        for c in &mut a.citations {
            c.node = self.name_of(&c.node_id);
        }
        a
    }

    /// Hosts a group chat to its conclusion.
    pub async fn host_group(
        &self,
        params: LaunchParams,
        parent: Option<String>,
        inquiry: Option<Arc<Mutex<Inquiry>>>,
    ) -> Result<TaskResult, AgentError> {
        self.host(params, parent, inquiry, None).await
    }

    /// The members of a resumed group other than its lost host and this node that
    /// membership does not report down, as (id, name).
    fn survivors(&self, r: &Resume) -> Vec<(String, String)> {
        r.members
            .iter()
            .filter(|m| m.id != r.previous_host && m.id != self.0.me && !self.is_down(&m.id))
            .map(|m| (m.id.clone(), m.name.clone()))
            .collect()
    }

    /// Whether membership has declared `id` down (a node it does not know is not).
    fn is_down(&self, id: &str) -> bool {
        self.peer_state(id) == Some(PeerState::Down)
    }

    fn peer_state(&self, id: &str) -> Option<PeerState> {
        if id == self.0.me {
            return Some(PeerState::Alive);
        }
        self.0
            .swarm
            .peers()
            .into_iter()
            .find(|p| p.id.to_string() == id)
            .map(|p| p.state)
    }

    /// Hosts a group chat to its conclusion: a new one, or with `resume` one whose host
    /// went down.
    async fn host(
        &self,
        params: LaunchParams,
        parent: Option<String>,
        inquiry: Option<Arc<Mutex<Inquiry>>>,
        resume: Option<Resume>,
    ) -> Result<TaskResult, AgentError> {
        let started = Instant::now();
        let clock = move || started.elapsed().as_millis() as u64;
        let mut chat = match resume {
            Some(r) => GroupChat::resume(params.clone(), r.messages, &r.previous_host, clock())?,
            None => GroupChat::launch(params.clone(), clock())?,
        };
        let group_id = params.group_id.clone();
        let goal = params.goal.clone();
        let member_names: Vec<String> = params.members.iter().map(|m| m.name.clone()).collect();
        self.persist_group(&chat, parent.clone()).await;
        self.emit(AgentEvent::GroupLaunched {
            group_id: group_id.clone(),
            parent: parent.clone(),
            goal: goal.clone(),
            members: member_names,
        });
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Input>();
        // The group's calls to its members (turns, tasks) and its message deliveries, owned
        // here: when the group ends or is cancelled they are dropped, and a dropped call
        // stops the member's work on it (the RPC layer tells the member).
        let mut calls: tokio::task::JoinSet<()> = tokio::task::JoinSet::new();
        let mut task_calls: HashMap<String, tokio::task::AbortHandle> = HashMap::new();
        let mut deliveries: tokio::task::JoinSet<()> = tokio::task::JoinSet::new();
        let mut peer_events = self.0.swarm.events();
        let mut conclusion = None;
        let mut reported: std::collections::HashSet<(String, String)> =
            std::collections::HashSet::new();
        loop {
            while let Some(effect) = chat.poll() {
                match effect {
                    Effect::AskSpeaker {
                        member,
                        turn,
                        allowed_types,
                        retry,
                        schema,
                        ..
                    } => {
                        // A grounded inquiry: the host's turns are the inquiry's plan (assign
                        // the sub-questions, then the follow-ups, then conclude), no model.
                        if let (Some(inq), true) = (&inquiry, member == self.0.me) {
                            let last = allowed_types == [DecisionType::Conclude];
                            let decision = self.inquiry_turn(inq, last);
                            let _ = tx.send(Input::Decision {
                                from: member,
                                decision,
                            });
                            continue;
                        }
                        let req = SpeakRequest {
                            group_id: group_id.clone(),
                            goal: goal.clone(),
                            members: chat.members().to_vec(),
                            transcript: tail(chat.messages(), 12),
                            tasks: chat.tasks().to_vec(),
                            turn,
                            max_turns: chat.max_turns(),
                            allowed: allowed_types,
                            retry: retry.map(|r| describe_rejection(&r)),
                            schema,
                        };
                        let a = self.clone();
                        let tx = tx.clone();
                        let timeout = Duration::from_millis(chat.config().turn_timeout_ms);
                        calls.spawn(async move {
                            match a.ask_speaker(&member, &req, timeout).await {
                                Ok(decision) => {
                                    let _ = tx.send(Input::Decision {
                                        from: member,
                                        decision,
                                    });
                                }
                                Err(e) => {
                                    // A missed turn, not a departure: membership reports
                                    // members that are really gone.
                                    tracing::info!(member = %member, error = %e, "speaker did not answer");
                                    let _ = tx.send(Input::NoAnswer {
                                        from: member,
                                        reason: e.to_string(),
                                    });
                                }
                            }
                        });
                    }
                    Effect::Broadcast(message) => {
                        self.deliver(&chat, &goal, message, &mut deliveries).await;
                    }
                    Effect::RunTask {
                        task,
                        sub_team_depth,
                    } => {
                        self.emit(AgentEvent::TaskState {
                            group_id: group_id.clone(),
                            task_id: task.id.clone(),
                            assignee: self.name_of(&task.assignee),
                            state: TaskState::Running,
                        });
                        self.persist_task(&group_id, &task).await;
                        let req = TaskRequest {
                            group_id: group_id.clone(),
                            goal: goal.clone(),
                            task: task.clone(),
                            sub_team_depth,
                            max_depth: chat.max_depth(),
                            grounded: inquiry
                                .as_ref()
                                .and_then(|i| lock(i).step_sub(&task.assignee, &task.desc)),
                        };
                        let a = self.clone();
                        let tx = tx.clone();
                        let timeout = Duration::from_millis(chat.config().task_timeout_ms);
                        let inq = inquiry.clone();
                        let task_id = task.id.clone();
                        let call = calls.spawn(async move {
                            let reply = a.run_remote_task(&task.assignee, &req, timeout).await;
                            let agent_step = inq
                                .as_ref()
                                .is_some_and(|i| lock(i).is_agent_step(&task.assignee, &task.desc));
                            if let (Some(i), true) = (&inq, agent_step) {
                                let answer = reply
                                    .as_ref()
                                    .ok()
                                    .filter(|r| r.ok && r.agent.is_some())
                                    .map(|r| r.result.clone());
                                lock(i).record_reply(&task.assignee, &task.desc, answer);
                            } else if let Some(i) = &inq {
                                let evidence = reply
                                    .as_ref()
                                    .map(|r| r.evidence.clone())
                                    .unwrap_or_default();
                                if evidence.is_empty() {
                                    // Failed, or found nothing although its probe had: the
                                    // sub-question goes to the next node that found a value,
                                    // which joins the group before the host's next turn.
                                    let next = lock(i).failed(&task.assignee, &task.desc);
                                    if let Some(next) = next {
                                        tracing::info!(from = %task.assignee, to = %next, "sub-question re-assigned");
                                        let name = a.name_of(&next);
                                        let _ =
                                            tx.send(Input::Recruit(MemberRef { id: next, name }));
                                    }
                                } else {
                                    lock(i).record(&task.assignee, &task.desc, evidence);
                                }
                            }
                            let (ok, result) = match reply {
                                Ok(r) => {
                                    if let Some(child) = r.child_group {
                                        let _ = tx.send(Input::SubTeam {
                                            from: task.assignee.clone(),
                                            task_id: task.id.clone(),
                                            child_group_id: child,
                                        });
                                    }
                                    (r.ok, r.result)
                                }
                                Err(e) => (false, e),
                            };
                            let _ = tx.send(Input::TaskResult {
                                from: task.assignee.clone(),
                                task_id: task.id.clone(),
                                ok,
                                result,
                            });
                        });
                        task_calls.insert(task_id, call);
                    }
                    Effect::CancelTask { task_id, .. } => {
                        // Dropping the call stops the assignee's work on it.
                        if let Some(call) = task_calls.remove(&task_id) {
                            call.abort();
                        }
                        tracing::debug!(group = %group_id, task = %task_id, "task cancelled");
                    }
                    Effect::TurnLost { member, reason } => {
                        tracing::info!(group = %group_id, member = %member, ?reason, "turn lost");
                        self.emit(AgentEvent::TurnLost {
                            group_id: group_id.clone(),
                            member: self.name_of(&member),
                            reason,
                        });
                    }
                    Effect::Paused { .. } => {}
                    Effect::Concluded { conclusion: c, .. } => {
                        conclusion = Some(c);
                    }
                }
            }
            if let Some(c) = conclusion.take() {
                let full = match &inquiry {
                    Some(_) => c.clone(),
                    None => with_findings(&c, chat.tasks(), |id| self.name_of(id)),
                };
                let answer = match &inquiry {
                    Some(i) => {
                        let a = lock(i).answer();
                        self.named(a)
                    }
                    None => Answer {
                        answer: clip_words(&c, grounded::MAX_ANSWER_WORDS),
                        citations: Vec::new(),
                        status: AnswerStatus::Unknown,
                    },
                };
                self.persist_group(&chat, parent.clone()).await;
                for t in chat.tasks() {
                    self.persist_task(&group_id, t).await;
                    if t.assignee != self.0.me {
                        let ok = t.state == TaskState::Done;
                        let note = format!(
                            "{}: {:?}",
                            t.desc.chars().take(80).collect::<String>(),
                            t.state
                        );
                        if let Err(e) = self
                            .0
                            .store
                            .record_collaboration(
                                &t.assignee,
                                &self.name_of(&t.assignee),
                                ok,
                                &note,
                            )
                            .await
                        {
                            tracing::warn!(error = %e, "cannot update the contact book");
                        }
                    }
                }
                // The conclusion (and any message before it) reaches the members before the
                // group's calls are dropped; each delivery is bounded by the RPC timeout.
                while deliveries.join_next().await.is_some() {}
                self.emit(AgentEvent::Concluded {
                    group_id: group_id.clone(),
                    conclusion: full.clone(),
                    answer: answer.answer.clone(),
                    citations: answer.citations.clone(),
                    status: answer.status,
                });
                return Ok(TaskResult {
                    group_id,
                    // Recruits (replacements for failed members) included.
                    members: chat.members().iter().map(|m| m.name.clone()).collect(),
                    answer: answer.answer,
                    citations: answer.citations,
                    status: answer.status,
                    conclusion: full,
                    turns: chat.turn(),
                    tokens: 0,
                });
            }
            let deadline = chat.poll_timeout();
            let sleep = async {
                match deadline {
                    Some(d) => {
                        let now = clock();
                        tokio::time::sleep(Duration::from_millis(d.saturating_sub(now))).await
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            let input = tokio::select! {
                biased;
                _ = self.0.cancel.cancelled() => return Err(AgentError::Other("the node is shutting down".into())),
                i = rx.recv() => match i { Some(i) => i, None => continue },
                Some(_) = calls.join_next(), if !calls.is_empty() => continue,
                Some(_) = deliveries.join_next(), if !deliveries.is_empty() => continue,
                ev = peer_events.recv() => match ev {
                    Ok(SwarmEvent::PeerDown(id)) => {
                        let id = id.to_string();
                        if chat.is_live(&id) { Input::MemberDown(id) } else { continue }
                    }
                    _ => continue,
                },
                _ = sleep => Input::Tick,
            };
            if let Err(e) = chat.handle(input, clock()) {
                tracing::debug!(group = %group_id, error = %e, "chat input refused");
            }
            for t in chat.tasks() {
                if t.state != TaskState::Running
                    && reported.insert((t.id.clone(), format!("{:?}", t.state)))
                {
                    self.emit(AgentEvent::TaskState {
                        group_id: group_id.clone(),
                        task_id: t.id.clone(),
                        assignee: self.name_of(&t.assignee),
                        state: t.state,
                    });
                }
            }
        }
    }

    async fn deliver(
        &self,
        chat: &GroupChat,
        goal: &str,
        message: Message,
        deliveries: &mut tokio::task::JoinSet<()>,
    ) {
        let sender_name = self.name_of(&message.sender);
        let note = MessageNote {
            goal: goal.to_owned(),
            sender_name: sender_name.clone(),
            message: message.clone(),
            members: chat.live_members().cloned().collect(),
        };
        self.record_message(&note).await;
        let others: Vec<NodeId> = chat
            .live_members()
            .filter(|m| m.id != self.0.me)
            .filter_map(|m| m.id.parse().ok())
            .collect();
        if !others.is_empty() {
            self.0
                .messages_sent
                .fetch_add(others.len() as u64, std::sync::atomic::Ordering::Relaxed);
            let body = serde_json::to_vec(&note).unwrap_or_default();
            let swarm = self.0.swarm.clone();
            deliveries.spawn(async move {
                for (peer, r) in swarm.fan_out(&others, SERVICE, "message", body).await {
                    if let Err(e) = r {
                        tracing::debug!(peer = %peer.short(), error = %e, "message not delivered");
                    }
                }
            });
        }
    }

    async fn record_message(&self, note: &MessageNote) {
        let m = &note.message;
        if let Err(e) = self.0.store.append_message(&m.group_id, m.seq, m).await {
            tracing::warn!(error = %e, "cannot store a chat message");
        }
        self.emit(AgentEvent::Message {
            message: m.clone(),
            sender_name: note.sender_name.clone(),
        });
    }

    async fn persist_group(&self, chat: &GroupChat, parent: Option<String>) {
        let now = now_ms() as i64;
        let body = GroupBody {
            members: chat.members().to_vec(),
            initiator: chat.initiator().to_owned(),
            turn: chat.turn(),
            max_turns: chat.max_turns(),
            depth: chat.team_up_depth(),
            conclusion: chat.conclusion().map(str::to_owned),
        };
        let rec = GroupRecord {
            group_id: chat.group_id().to_owned(),
            parent_group_id: parent,
            goal: chat.goal().to_owned(),
            state: state_name(chat.state()).to_owned(),
            created_at: now,
            updated_at: now,
            body,
        };
        if let Err(e) = self.0.store.upsert_group(&rec).await {
            tracing::warn!(error = %e, "cannot store a group");
        }
    }

    /// Stores the group of a task this node runs with no chat of its own (yet): this node
    /// as its only member, in `state`.
    async fn persist_own(
        &self,
        g: &OwnGroup<'_>,
        state: &str,
        turns: u32,
        conclusion: Option<String>,
    ) {
        let now = now_ms() as i64;
        let me = MemberRef {
            id: self.0.me.clone(),
            name: self.0.name.clone(),
        };
        let rec = GroupRecord {
            group_id: g.group_id.to_owned(),
            parent_group_id: g.parent.clone(),
            goal: g.task.to_owned(),
            state: state.to_owned(),
            created_at: now,
            updated_at: now,
            body: GroupBody {
                members: vec![me],
                initiator: self.0.me.clone(),
                turn: turns,
                max_turns: turns,
                depth: g.depth,
                conclusion,
            },
        };
        if let Err(e) = self.0.store.upsert_group(&rec).await {
            tracing::warn!(error = %e, "cannot store a group");
        }
    }

    /// Whether `group_id`'s record is still the one [`Agent::persist_own`] wrote at
    /// submission (no chat stored its own), or missing.
    async fn still_forming(&self, group_id: &str) -> bool {
        match self.0.store.group::<serde_json::Value>(group_id).await {
            Ok(Some(g)) => g.state == FORMING,
            Ok(None) => true,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read a group");
                false
            }
        }
    }

    async fn persist_task(&self, group_id: &str, t: &Task) {
        let rec = TaskRecord {
            task_id: format!("{group_id}/{}", t.id),
            group_id: group_id.to_owned(),
            assignee: Some(t.assignee.clone()),
            state: format!("{:?}", t.state).to_lowercase(),
            updated_at: now_ms() as i64,
            body: t.clone(),
        };
        if let Err(e) = self.0.store.upsert_task(&rec).await {
            tracing::warn!(error = %e, "cannot store a task");
        }
    }

    async fn ask_speaker(
        &self,
        member: &str,
        req: &SpeakRequest,
        timeout: Duration,
    ) -> Result<Decision, String> {
        if member == self.0.me {
            return tokio::time::timeout(timeout, self.speak(req))
                .await
                .map_err(|_| "timed out".to_string())?
                .map_err(|e| e.to_string());
        }
        let id: NodeId = member.parse().map_err(|_| "bad member id".to_string())?;
        let body = serde_json::to_vec(req).map_err(|e| e.to_string())?;
        let reply = self
            .0
            .swarm
            .call_with_timeout(id, SERVICE, "speak", body, timeout)
            .await
            .map_err(|e| e.to_string())?;
        serde_json::from_slice(&reply).map_err(|e| format!("bad decision: {e}"))
    }

    async fn run_remote_task(
        &self,
        assignee: &str,
        req: &TaskRequest,
        timeout: Duration,
    ) -> Result<TaskReply, String> {
        if assignee == self.0.me {
            return tokio::time::timeout(timeout, self.do_task(req))
                .await
                .map_err(|_| "timed out".to_string());
        }
        let id: NodeId = assignee
            .parse()
            .map_err(|_| "bad assignee id".to_string())?;
        let body = serde_json::to_vec(req).map_err(|e| e.to_string())?;
        let reply = self
            .0
            .swarm
            .call_with_timeout(id, SERVICE, "task", body, timeout)
            .await
            .map_err(|e| e.to_string())?;
        serde_json::from_slice(&reply).map_err(|e| format!("bad task reply: {e}"))
    }

    /// This node's decision for a turn (its model, constrained by the schema).
    async fn speak(&self, req: &SpeakRequest) -> Result<Decision, AgentError> {
        let conclude_only = req.allowed == [DecisionType::Conclude];
        let opening = req.allowed == [DecisionType::AssignSync];
        if self.asks_person(conclude_only) && !opening {
            let mut q = format!("Group goal: {}\n", req.goal);
            for m in &req.transcript {
                q.push_str(&format!("{}: {}\n", self.name_of(&m.sender), m.content));
            }
            q.push_str(if conclude_only {
                "Write the conclusion of the chat."
            } else {
                "Your turn: what do you say?"
            });
            match self.ask_person(&req.group_id, "turn", q).await {
                Some(text) => {
                    let msg_type = if conclude_only || !req.allowed.contains(&DecisionType::Discuss)
                    {
                        DecisionType::Conclude
                    } else {
                        DecisionType::Discuss
                    };
                    return Ok(Decision {
                        msg_type,
                        content: text,
                        next_speakers: Vec::new(),
                        tasks: Vec::new(),
                        triggers: Vec::new(),
                    });
                }
                None if self.0.config.agent.human_fallback == HumanFallback::Skip => {
                    return Err(AgentError::Other(
                        "the person did not answer in time".into(),
                    ));
                }
                None => {}
            }
        }
        let examples = match &self.0.memory {
            Some(book) => {
                let m = &self.0.config.memory;
                book.examples_for(DEFAULT_DOMAIN, &req.goal, m.examples, m.min_similarity)
                    .await
            }
            None => Vec::new(),
        };
        let prompt = speak_prompt(self, req, &format_examples(&examples));
        let d: Decision = self.0.llm.decide(prompt, &req.schema, 400).await?;
        Ok(d)
    }

    /// Runs a task assigned to this node.
    async fn do_task(&self, req: &TaskRequest) -> TaskReply {
        if self.asks_person(false) {
            let q = format!("Group goal: {}\nYour task: {}", req.goal, req.task.desc);
            match self.ask_person(&req.group_id, "task", q).await {
                Some(text) => {
                    return TaskReply {
                        ok: true,
                        result: text,
                        child_group: None,
                        evidence: Vec::new(),
                        agent: None,
                    }
                }
                None if self.0.config.agent.human_fallback == HumanFallback::Skip => {
                    return TaskReply {
                        ok: false,
                        result: "the person did not answer in time".into(),
                        child_group: None,
                        evidence: Vec::new(),
                        agent: None,
                    }
                }
                None => {}
            }
        }
        if let Some(sub) = &req.grounded {
            return self.grounded_task(sub);
        }
        if let Some(front) = &self.0.front {
            let task = ExternalTask {
                task_id: format!("{}/{}", req.group_id, req.task.id),
                description: req.task.desc.clone(),
                context: req.goal.clone(),
            };
            return self.ask_front(front, &task).await;
        }
        let spec = TaskSpec {
            task_id: format!("{}/{}", req.group_id, req.task.id),
            description: req.task.desc.clone(),
            context: req.goal.clone(),
        };
        let alone = self.0.executor.run(&spec).await;
        // Nested teams: when this node could not support its answer by itself (the
        // verifier found it unsupported and no tool grounded it) and the group allows
        // another level, it forms a sub-team for the task and hosts it.
        let needs_help = match &alone {
            Ok(out) => needs_help(out),
            Err(_) => true,
        };
        if let (true, Some(depth)) = (needs_help, req.sub_team_depth) {
            let child = new_group_id();
            let goal = format!("{} (for team goal: {})", req.task.desc, req.goal);
            let sub = self.run_sub_team(goal, child.clone(), req.group_id.clone(), depth);
            match sub.await {
                Ok(Some(r)) => {
                    return TaskReply {
                        ok: true,
                        result: r.conclusion,
                        child_group: Some(child),
                        evidence: Vec::new(),
                        agent: None,
                    }
                }
                Ok(None) => {}
                Err(e) => tracing::info!(error = %e, "sub-team failed; answering alone"),
            }
        }
        match alone {
            Ok(out) => TaskReply {
                ok: out.ok,
                result: with_evidence(&out.answer, &out.steps),
                child_group: None,
                evidence: Vec::new(),
                agent: None,
            },
            Err(e) => TaskReply {
                ok: false,
                result: e.to_string(),
                child_group: None,
                evidence: Vec::new(),
                agent: None,
            },
        }
    }

    /// Hands `task` to this node's third-party agent: its answer (or why it failed) as
    /// the reply, verbatim.
    async fn ask_front(&self, front: &ExternalAgent, task: &ExternalTask) -> TaskReply {
        tracing::info!(agent = %front.name(), task = %task.task_id, "task handed to the external agent");
        let (ok, result) = match front.run(task).await {
            Ok(answer) => (true, answer),
            Err(e) => {
                tracing::info!(agent = %front.name(), error = %e, "external agent failed");
                (false, e.to_string())
            }
        };
        TaskReply {
            ok,
            result,
            child_group: None,
            evidence: Vec::new(),
            agent: Some(front.name().to_owned()),
        }
    }

    /// Forms and hosts a sub-team at `depth` under `parent`; `None` when formation chose
    /// to work alone. Boxed: hosting a group can lead back here (a sub-team's assignee may
    /// form its own), so the future type must not be recursive.
    fn run_sub_team(
        &self,
        goal: String,
        group_id: String,
        parent: String,
        depth: u32,
    ) -> futures::future::BoxFuture<'static, Result<Option<TaskResult>, AgentError>> {
        let this = self.clone();
        Box::pin(async move {
            let formation = this.form(&goal).await?;
            if formation.members.is_empty() {
                return Ok(None);
            }
            let members = this.team(
                formation
                    .members
                    .iter()
                    .map(|r| (r.node_id.clone(), r.name.clone())),
            );
            let params = this.launch_params(group_id, &goal, members, depth);
            Ok(Some(this.host(params, Some(parent), None, None).await?))
        })
    }

    fn launch_params(
        &self,
        group_id: String,
        goal: &str,
        members: Vec<MemberRef>,
        depth: u32,
    ) -> LaunchParams {
        let a = &self.0.config.agent;
        LaunchParams {
            group_id,
            goal: goal.to_owned(),
            members,
            initiator: self.0.me.clone(),
            team_up_depth: depth,
            max_depth: a.max_depth.max(depth),
            max_turns: a.max_turns,
            config: ChatConfig {
                turn_timeout_ms: a.turn_timeout_secs * 1000,
                task_timeout_ms: a.turn_timeout_secs * 1000 * 3,
                repetition_guard: self.0.repetition_guard,
                opening_assignment: true,
                ..ChatConfig::default()
            },
        }
    }

    /// Whether this node asks its person (human proxy) for this kind of input.
    fn asks_person(&self, conclusion: bool) -> bool {
        self.0.config.agent.kind == AgentKind::Human
            && match self.0.config.agent.human_input {
                HumanInput::Always => true,
                HumanInput::Conclusion => conclusion,
                HumanInput::Never => false,
            }
    }

    /// Asks this node's person; `None` when nobody answered in time.
    async fn ask_person(&self, group_id: &str, kind: &str, prompt: String) -> Option<String> {
        let request_id = format!("h{:08x}", rand::random::<u32>());
        let (tx, rx) = tokio::sync::oneshot::channel();
        let info = HumanRequest {
            request_id: request_id.clone(),
            group_id: group_id.to_owned(),
            kind: kind.to_owned(),
            prompt: prompt.clone(),
        };
        if let Ok(mut m) = self.0.human.lock() {
            m.insert(request_id.clone(), PendingHuman { info, reply: tx });
        }
        self.emit(AgentEvent::HumanInputRequested {
            request_id: request_id.clone(),
            group_id: group_id.to_owned(),
            kind: kind.to_owned(),
            prompt,
        });
        let wait = Duration::from_secs(self.0.config.agent.human_timeout_secs);
        let answer = tokio::time::timeout(wait, rx)
            .await
            .ok()
            .and_then(Result::ok);
        if let Ok(mut m) = self.0.human.lock() {
            m.remove(&request_id);
        }
        self.emit(AgentEvent::HumanInputClosed {
            request_id,
            answered: answer.is_some(),
        });
        answer
    }

    /// Questions waiting for this node's person.
    pub fn pending_human(&self) -> Vec<HumanRequest> {
        self.0
            .human
            .lock()
            .map(|m| m.values().map(|p| p.info.clone()).collect())
            .unwrap_or_default()
    }

    /// Answers a waiting question; `false` if there is no such (open) question.
    pub fn answer_human(&self, request_id: &str, text: String) -> bool {
        let pending = self
            .0
            .human
            .lock()
            .ok()
            .and_then(|mut m| m.remove(request_id));
        match pending {
            Some(p) => p.reply.send(text).is_ok(),
            None => false,
        }
    }

    /// Refuses `from` for a group this node knows whose recorded host is another node
    /// (its own groups included): only the host sends a group's messages and asks its
    /// turns and tasks. A group not known here is anyone's to start. Returns the group's
    /// record, if known.
    async fn check_host(
        &self,
        group_id: &str,
        from: &str,
    ) -> Result<Option<GroupRecord<serde_json::Value>>, RpcError> {
        let known = self
            .0
            .store
            .group::<serde_json::Value>(group_id)
            .await
            .ok()
            .flatten();
        match known {
            Some(g) if !may_send_messages(&g.body, from) && !self.takes_over(&g.body, from) => {
                Err(not_the_host())
            }
            known => Ok(known),
        }
    }

    /// Whether `from` takes over a group this node is a member of (recorded as `body`):
    /// the host is suspected or declared down here, and `from` is its [`successor`].
    fn takes_over(&self, body: &serde_json::Value, from: &str) -> bool {
        let Ok(view) = serde_json::from_value::<MemberView>(body.clone()) else {
            return false;
        };
        let host_gone = matches!(
            self.peer_state(&view.host),
            Some(PeerState::Suspect | PeerState::Down)
        );
        host_gone
            && successor(&view.members, &view.host, |id| !self.is_down(id))
                .is_some_and(|m| m.id == from)
    }

    /// After `dead` went down: resumes each recent open group it hosted that this node
    /// is the [`successor`] for, one after the other. The result is kept like a task
    /// submitted here, and the conclusion goes to the other members.
    async fn fail_over(self, dead: String) {
        let groups = match self
            .0
            .store
            .groups::<serde_json::Value>(RESUMABLE_GROUPS)
            .await
        {
            Ok(g) => g,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read groups to resume");
                return;
            }
        };
        // A group whose last message is older than two task timeouts was abandoned.
        let window = self.0.config.agent.turn_timeout_secs * 3 * 1000 * 2;
        let since = (now_ms().saturating_sub(window)) as i64;
        for g in groups {
            if g.state == state_name(ChatState::Conclusion) || g.updated_at < since {
                continue;
            }
            let Ok(view) = serde_json::from_value::<MemberView>(g.body) else {
                continue;
            };
            let mine = view.host == dead
                && successor(&view.members, &dead, |id| !self.is_down(id))
                    .is_some_and(|m| m.id == self.0.me);
            if !mine {
                continue;
            }
            let messages = match self.0.store.messages::<Message>(&g.group_id).await {
                Ok(m) => m.into_iter().map(|r| r.body).collect(),
                Err(e) => {
                    tracing::warn!(group = %g.group_id, error = %e, "cannot read a group's log");
                    continue;
                }
            };
            tracing::info!(group = %g.group_id, host = %dead, "the host is down; resuming its group");
            let resume = Resume {
                previous_host: dead.clone(),
                members: view.members,
                messages,
            };
            match self
                .run_task(&g.goal, g.group_id.clone(), None, 0, Some(resume))
                .await
            {
                Ok(result) => self.keep_result(result),
                Err(e) => {
                    tracing::warn!(group = %g.group_id, error = %e, "resuming a group failed");
                    self.emit(AgentEvent::TaskFailed {
                        group_id: g.group_id,
                        error: e.to_string(),
                    });
                }
            }
        }
    }

    async fn handle_rpc(&self, req: Request) -> Result<Vec<u8>, RpcError> {
        let from = req.from.to_string();
        match req.method.as_str() {
            "speak" => {
                let r: SpeakRequest = serde_json::from_slice(&req.body)
                    .map_err(|e| rpc_err(RpcErrorCode::BadRequest, e))?;
                if !r.members.iter().any(|m| m.id == self.0.me) {
                    return Err(rpc_err(
                        RpcErrorCode::BadRequest,
                        "not a member of that group",
                    ));
                }
                self.check_host(&r.group_id, &from).await?;
                let d = self
                    .speak(&r)
                    .await
                    .map_err(|e| rpc_err(RpcErrorCode::Internal, e))?;
                serde_json::to_vec(&d).map_err(|e| rpc_err(RpcErrorCode::Internal, e))
            }
            "task" => {
                let r: TaskRequest = serde_json::from_slice(&req.body)
                    .map_err(|e| rpc_err(RpcErrorCode::BadRequest, e))?;
                if r.task.assignee != self.0.me {
                    return Err(rpc_err(
                        RpcErrorCode::BadRequest,
                        "task is not assigned to this node",
                    ));
                }
                self.check_host(&r.group_id, &from).await?;
                self.emit(AgentEvent::TaskState {
                    group_id: r.group_id.clone(),
                    task_id: r.task.id.clone(),
                    assignee: self.0.name.clone(),
                    state: TaskState::Running,
                });
                // Dropped with the request when the host gives up on it (the group concluded
                // or was cancelled, the task timed out, the host left): the work stops and
                // watchers see the task cancelled here.
                let mut unfinished = Unfinished {
                    agent: Some(self.clone()),
                    group_id: r.group_id.clone(),
                    task_id: r.task.id.clone(),
                };
                let reply = self.do_task(&r).await;
                unfinished.agent = None;
                tracing::info!(from = %req.from.short(), task = %r.task.id, ok = reply.ok, "task done");
                serde_json::to_vec(&reply).map_err(|e| rpc_err(RpcErrorCode::Internal, e))
            }
            "locate" => {
                let r: LocateRequest = serde_json::from_slice(&req.body)
                    .map_err(|e| rpc_err(RpcErrorCode::BadRequest, e))?;
                if r.subs.len() > MAX_LOCATE_SUBS {
                    return Err(rpc_err(
                        RpcErrorCode::BadRequest,
                        format!("at most {MAX_LOCATE_SUBS} sub-questions per request"),
                    ));
                }
                let reply = LocateReply {
                    hits: r.subs.iter().map(|s| self.locate_local(s)).collect(),
                };
                serde_json::to_vec(&reply).map_err(|e| rpc_err(RpcErrorCode::Internal, e))
            }
            "message" => {
                let n: MessageNote = serde_json::from_slice(&req.body)
                    .map_err(|e| rpc_err(RpcErrorCode::BadRequest, e))?;
                if n.message.content.len() > 64 * 1024 {
                    return Err(rpc_err(RpcErrorCode::BadRequest, "message too large"));
                }
                tracing::debug!(from = %from, group = %n.message.group_id, "chat message");
                self.0
                    .messages_received
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                // A member keeps the group it takes part in (state as last seen). Only the
                // host sends a group's messages: another node can neither add to the log
                // nor overwrite the record of a group this node knows (its own groups'
                // records hold their members and conclusion).
                let now = now_ms() as i64;
                let known = self.check_host(&n.message.group_id, &from).await?;
                // The sender is the host (or took over from it); the member list is the
                // host's latest.
                let members = if n.members.is_empty() {
                    known
                        .as_ref()
                        .and_then(|g| serde_json::from_value::<MemberView>(g.body.clone()).ok())
                        .map(|v| v.members)
                        .unwrap_or_default()
                } else {
                    n.members.iter().take(MAX_GROUP_MEMBERS).cloned().collect()
                };
                let view = MemberView {
                    host: from.clone(),
                    members,
                };
                let rec = GroupRecord {
                    group_id: n.message.group_id.clone(),
                    parent_group_id: known.as_ref().and_then(|g| g.parent_group_id.clone()),
                    goal: n.goal.chars().take(4000).collect(),
                    state: state_name(n.message.state).to_owned(),
                    created_at: known.as_ref().map_or(now, |g| g.created_at),
                    updated_at: now,
                    body: serde_json::to_value(&view).unwrap_or_default(),
                };
                if let Err(e) = self.0.store.upsert_group(&rec).await {
                    tracing::warn!(error = %e, "cannot store a group");
                }
                self.record_message(&n).await;
                Ok(Vec::new())
            }
            other => Err(rpc_err(
                RpcErrorCode::UnknownMethod,
                format!("unknown method {other}"),
            )),
        }
    }
}

/// A member's task in progress; dropped before it finishes (the host dropped the request),
/// it reports the task cancelled.
struct Unfinished {
    agent: Option<Agent>,
    group_id: String,
    task_id: String,
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(a) = self.agent.take() {
            tracing::info!(group = %self.group_id, task = %self.task_id, "task cancelled by its host");
            a.emit(AgentEvent::TaskState {
                group_id: std::mem::take(&mut self.group_id),
                task_id: std::mem::take(&mut self.task_id),
                assignee: a.0.name.clone(),
                state: TaskState::Cancelled,
            });
        }
    }
}

impl AgentSearch for Agent {
    async fn search(&self, query: &str, k: usize) -> Vec<CardHit> {
        self.search_cards(query, k).await
    }
}

/// Whether `from` may send the messages of a group stored with `body`: the `host` a member
/// recorded may; for a group this node hosts itself (its record holds the [`GroupBody`]),
/// no other node may.
fn may_send_messages(body: &serde_json::Value, from: &str) -> bool {
    body.get("host").and_then(serde_json::Value::as_str) == Some(from)
}

fn not_the_host() -> RpcError {
    rpc_err(
        RpcErrorCode::BadRequest,
        "only the group's host sends its messages, turns and tasks",
    )
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

/// The first `n` words of `text`.
fn clip_words(text: &str, n: usize) -> String {
    text.split_whitespace()
        .take(n)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The conclusion message of a grounded inquiry: the answer, then its sources.
pub fn answer_message(a: &Answer) -> String {
    let mut s = a.answer.clone();
    if !a.citations.is_empty() {
        s.push_str("\nSources:");
        for c in &a.citations {
            s.push_str(&format!("\n- {}", c.line()));
        }
    }
    s
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

fn tail(messages: &[Message], n: usize) -> Vec<Message> {
    messages[messages.len().saturating_sub(n)..].to_vec()
}

fn describe_rejection(r: &Rejection) -> String {
    match r {
        Rejection::Empty => "Your message was empty. Say something new.".into(),
        Rejection::Repeats { seq, .. } => format!(
            "Your message repeats message {seq}. Add something new, assign a task, or conclude."
        ),
    }
}

/// `examples`: worked examples from shared memories for the goal (see
/// [`format_examples`]), in the system message so that the prompt prefix stays the same for
/// every turn of the group.
fn speak_prompt(agent: &Agent, req: &SpeakRequest, examples: &str) -> Vec<ChatMessage> {
    let me = &agent.0.me;
    let mut system = format!(
        "You are {}, a member of a team chat. About you: {}\n",
        agent.0.name, agent.0.config.agent.description
    );
    system.push_str("Team members (use these ids):\n");
    for m in &req.members {
        let about = agent
            .cards()
            .get(&m.id)
            .map(|c| c.card.description.clone())
            .unwrap_or_default();
        let you = if &m.id == me { " (you)" } else { "" };
        system.push_str(&format!("- {} = {}{}: {}\n", m.id, m.name, you, about));
    }
    system.push_str(
        "Reply with one JSON decision. Types: discuss (say something new), assign_sync / assign_async \
         (give members tasks that match their skills), pause (wait for tasks), conclude (final answer \
         with every fact found).",
    );
    if !examples.is_empty() {
        system.push('\n');
        system.push_str(examples);
    }
    let mut user = format!("Goal: {}\n", req.goal);
    if !req.tasks.is_empty() {
        user.push_str("Tasks:\n");
        for t in &req.tasks {
            let who = agent.name_of(&t.assignee);
            let res = t.result.as_deref().unwrap_or("");
            user.push_str(&format!(
                "- {} ({who}, {:?}): {} {}\n",
                t.id, t.state, t.desc, res
            ));
        }
    }
    if !req.transcript.is_empty() {
        user.push_str("Chat so far:\n");
        for m in &req.transcript {
            let who = agent.name_of(&m.sender);
            let text: String = m.content.chars().take(400).collect();
            user.push_str(&format!("{who}: {text}\n"));
        }
    }
    user.push_str(&format!("Turn {} of {}. ", req.turn, req.max_turns));
    if req.allowed == [DecisionType::Conclude] {
        user.push_str(
            "Conclude now: state the final answer with every fact from the task results.",
        );
    } else if req.allowed == [DecisionType::AssignSync] {
        user.push_str("Split the goal: give each member one task that matches its skills.");
    } else {
        user.push_str("Your decision:");
    }
    if let Some(r) = &req.retry {
        user.push_str(&format!("\nNote: {r}"));
    }
    vec![ChatMessage::system(system), ChatMessage::user(user)]
}

/// The conclusion as shown to the user: the concluding member's text, then what each
/// finished task found, with who found it (provenance).
pub fn with_findings(conclusion: &str, tasks: &[Task], name_of: impl Fn(&str) -> String) -> String {
    let done: Vec<&Task> = tasks
        .iter()
        .filter(|t| {
            t.state == TaskState::Done && t.result.as_deref().is_some_and(|r| !r.trim().is_empty())
        })
        .collect();
    if done.is_empty() {
        return conclusion.to_owned();
    }
    let mut s = conclusion.trim().to_owned();
    s.push_str("\n\nFindings:");
    for t in done {
        s.push_str(&format!(
            "\n- {} ({}): {}",
            t.task_abstract.as_deref().unwrap_or(&t.desc),
            name_of(&t.assignee),
            t.result.as_deref().unwrap_or("").trim()
        ));
    }
    s
}

/// A task's answer followed by the document passages it rests on, quoted (a small model's
/// answer may paraphrase a fact away; the quote keeps it, with where it came from).
pub fn with_evidence(answer: &str, steps: &[super::executor::StepTrace]) -> String {
    let mut quotes: Vec<&str> = Vec::new();
    for s in steps {
        if s.tool != "search_docs" || s.error.is_some() {
            continue;
        }
        if let Some(o) = s.observation.as_deref().map(str::trim) {
            if !o.is_empty() && !quotes.contains(&o) {
                quotes.push(o);
            }
        }
    }
    if quotes.is_empty() {
        return answer.trim().to_owned();
    }
    let mut out = answer.trim().to_owned();
    out.push_str("\nEvidence from my documents:");
    for q in quotes.iter().take(3) {
        let q: String = q.chars().take(600).collect();
        out.push_str("\n> ");
        out.push_str(&q.replace('\n', "\n> "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::executor::StepTrace;

    fn step(tool: &str, obs: &str, error: Option<&str>) -> StepTrace {
        StepTrace {
            step: "s".into(),
            tool: tool.into(),
            args: serde_json::json!({}),
            observation: Some(obs.into()),
            error: error.map(str::to_owned),
            grounded: true,
        }
    }

    #[test]
    fn only_the_recorded_host_may_send_a_groups_messages() {
        let member_record = serde_json::json!({"host": "nodea"});
        assert!(may_send_messages(&member_record, "nodea"));
        assert!(!may_send_messages(&member_record, "nodeb"));
        // A group this node hosts: its record is the full body, and no peer may write to it.
        let own = serde_json::to_value(GroupBody {
            members: Vec::new(),
            initiator: "nodea".into(),
            turn: 3,
            max_turns: 12,
            depth: 0,
            conclusion: None,
        })
        .expect("JSON");
        assert!(!may_send_messages(&own, "nodea"));
        assert!(!may_send_messages(&own, "nodeb"));
    }

    #[test]
    fn evidence_quotes_document_passages_once() {
        let steps = vec![
            step("search_docs", "[a.md] Seeds germinate at 24 C.", None),
            step("search_docs", "[a.md] Seeds germinate at 24 C.", None),
            step("calculator", "4", None),
            step("search_docs", "[b.md] broken", Some("failed")),
        ];
        let r = with_evidence("Warm is best.", &steps);
        assert_eq!(r.matches("24 C").count(), 1, "{r}");
        assert!(r.starts_with("Warm is best."));
        assert!(!r.contains("broken") && !r.contains("\n> 4"));
        assert_eq!(with_evidence(" plain ", &[]), "plain");
    }

    #[test]
    fn findings_credit_each_finished_task() {
        let task = |id: &str, state, result: Option<&str>| Task {
            id: id.into(),
            assignee: format!("n-{id}"),
            assigner: "host".into(),
            task_abstract: Some(format!("about {id}")),
            desc: "d".into(),
            mode: super::super::chat::TaskMode::Sync,
            state,
            assigned_turn: 1,
            deadline: 0,
            result: result.map(str::to_owned),
            child_group: None,
        };
        let tasks = vec![
            task("t1", TaskState::Done, Some("Thursday")),
            task("t2", TaskState::Failed, Some("timeout")),
        ];
        let c = with_findings("Done.", &tasks, |id| id.to_uppercase());
        assert!(c.contains("about t1 (N-T1): Thursday"), "{c}");
        assert!(!c.contains("timeout"));
        assert_eq!(with_findings("Done.", &[], |i| i.to_owned()), "Done.");
    }
}
