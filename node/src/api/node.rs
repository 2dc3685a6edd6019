//! The node API (`/api/...`): what a running node knows about itself and its swarm. The
//! CLI (`starling peers`, `starling invite`, ...) and the dashboard talk to the node
//! through these routes. Bodies are this module's own serde types, so internal types can
//! change without changing the wire.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{FromRef, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::Stream;
use serde::{Deserialize, Serialize};
use starling_discovery::{PeerInfo, PeerState};

use super::error::ApiError;
use super::extract::{ApiJson, ApiPath, ApiQuery, Documented};
use super::state::AppState;
use super::tasks::{Cancel, TaskRunner, TaskState, TaskView};
use crate::agent::card::{CardHit, KnownCard};
use crate::agent::chat::{Message, Task};
use crate::agent::runtime::Agent;
use crate::agent::runtime::{new_group_id, GroupBody};
use crate::store::GroupRecord;

/// What the node routes reach of a running node (the daemon hands them over; the API
/// does not know the daemon).
#[derive(Clone)]
pub struct NodeHandles {
    /// The swarm handle.
    pub swarm: starling_discovery::Swarm,
    /// The served models and API counters.
    pub app: AppState,
    /// The agent runtime.
    pub agent: Agent,
    /// The HTTP API's bound address.
    pub api_addr: std::net::SocketAddr,
    /// When the node started.
    pub started: std::time::Instant,
}

/// State of the node routes: the node, plus the API state the shared extractors need.
#[derive(Clone)]
pub struct NodeApi {
    /// The running node.
    pub node: NodeHandles,
    /// The tasks submitted through the API (owned: dropped with the router, they stop).
    pub tasks: Arc<TaskRunner>,
    /// What A2A remembers of the tasks it started.
    pub a2a: Arc<super::a2a::A2aTasks>,
}

impl FromRef<NodeApi> for AppState {
    fn from_ref(s: &NodeApi) -> AppState {
        s.node.app.clone()
    }
}

/// The node routes, ready to merge with [`super::router_with`].
pub fn router(node: NodeHandles) -> Router {
    Router::new()
        .route("/", get(dashboard))
        .route("/openapi.json", get(super::openapi::full))
        .route("/metrics", get(metrics))
        .route("/api/node", get(node_info))
        .route("/api/peers", get(peers))
        .route("/api/invite", get(invite))
        .route("/api/cards", get(cards))
        .route("/api/tasks", get(list_tasks).post(submit_task))
        .route("/api/groups", get(groups))
        .route("/api/groups/{id}", get(group))
        .route("/api/tasks/{id}", get(task_result).delete(cancel_task))
        .route("/api/events", get(events))
        .route("/api/human", get(human_pending))
        .route("/api/human/{id}", post(human_answer))
        .route("/.well-known/agent-card.json", get(super::a2a::card))
        .route("/a2a", post(super::a2a::rpc))
        .with_state(NodeApi {
            node,
            tasks: Arc::new(TaskRunner::default()),
            a2a: Arc::default(),
        })
}

/// `GET /api/node`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeInfoBody {
    /// Node id (Ed25519 public key, base32).
    pub id: String,
    /// Node name.
    pub name: String,
    /// QUIC address peers dial.
    pub addr: String,
    /// Public id of the swarm (not the secret).
    pub swarm_id: String,
    /// HTTP API address.
    pub api: String,
    /// Starling version.
    pub version: String,
    /// Seconds since start.
    pub uptime_secs: u64,
    /// Peers currently alive.
    pub peers_alive: usize,
}

/// One peer in `GET /api/peers`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PeerBody {
    /// Node id.
    pub id: String,
    /// Node name.
    pub name: String,
    /// Address to dial.
    pub addr: String,
    /// `alive`, `suspect` or `down`.
    pub state: String,
    /// Identity generation (grows on restart and rejoin).
    pub generation: u64,
}

impl From<&PeerInfo> for PeerBody {
    fn from(p: &PeerInfo) -> Self {
        Self {
            id: p.id.to_string(),
            name: p.name.clone(),
            addr: p.addr.to_string(),
            state: state_name(p.state).to_owned(),
            generation: p.generation,
        }
    }
}

/// Wire name of a peer state.
pub fn state_name(s: PeerState) -> &'static str {
    match s {
        PeerState::Alive => "alive",
        PeerState::Suspect => "suspect",
        PeerState::Down => "down",
    }
}

/// `GET /api/invite`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InviteBody {
    /// The join code (secret + this node's id and address): treat it like a password.
    pub code: String,
    /// The swarm secret alone (for `--swarm-secret` in scripts).
    pub secret: String,
    /// This node as a bootstrap address (`NODEID@HOST:PORT`).
    pub bootstrap: String,
}

async fn node_info(State(s): State<NodeApi>) -> Json<NodeInfoBody> {
    let n = &s.node;
    let code = n.swarm.join_code();
    Json(NodeInfoBody {
        id: n.swarm.node_id().to_string(),
        name: n.swarm.name().to_owned(),
        addr: n.swarm.advertised_addr().to_string(),
        swarm_id: code.secret.swarm_id().to_string(),
        api: n.api_addr.to_string(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        uptime_secs: n.started.elapsed().as_secs(),
        peers_alive: n
            .swarm
            .peers()
            .iter()
            .filter(|p| p.state == PeerState::Alive)
            .count(),
    })
}

async fn peers(State(s): State<NodeApi>) -> Json<Vec<PeerBody>> {
    Json(s.node.swarm.peers().iter().map(PeerBody::from).collect())
}

async fn invite(State(s): State<NodeApi>) -> Json<InviteBody> {
    let code = s.node.swarm.join_code();
    Json(InviteBody {
        code: code.to_string(),
        secret: code.secret.to_string(),
        bootstrap: format!("{}@{}", code.node_id, s.node.swarm.advertised_addr()),
    })
}

/// `GET /api/cards?q=...&k=...`: every known card, or the best matches for `q`.
#[derive(Debug, Deserialize)]
pub struct CardQuery {
    /// Search text; absent lists all cards.
    pub q: Option<String>,
    /// Most results (default 10, at most 100).
    pub k: Option<usize>,
}

/// `GET /api/cards` answer.
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum CardsBody {
    /// Search results.
    Hits(Vec<CardHit>),
    /// All cards.
    All(Vec<KnownCard>),
}

async fn cards(
    State(s): State<NodeApi>,
    ApiQuery(q): ApiQuery<CardQuery>,
) -> Result<Json<CardsBody>, ApiError> {
    let k = q.k.unwrap_or(10);
    if k == 0 || k > 100 {
        return Err(ApiError::invalid_param("k", "k must be between 1 and 100"));
    }
    match q.q.as_deref().map(str::trim) {
        Some(text) if !text.is_empty() => {
            if text.len() > 2000 {
                return Err(ApiError::invalid_param("q", "query longer than 2000 bytes"));
            }
            Ok(Json(CardsBody::Hits(
                s.node.agent.search_cards(text, k).await,
            )))
        }
        _ => Ok(Json(CardsBody::All(s.node.agent.known_cards()))),
    }
}

/// `POST /api/tasks` body.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitTask {
    /// What to do.
    pub task: String,
    /// Answer only when the task is done (with its result) instead of at once.
    #[serde(default)]
    pub wait: bool,
}

impl Documented for SubmitTask {
    const SCHEMA: &'static str = "SubmitTask";
}

/// `POST /api/tasks` answer when not waiting.
#[derive(Debug, Serialize, Deserialize)]
pub struct Submitted {
    /// The group carrying the task: follow it on `/api/events` or `/api/groups/{id}`.
    pub group_id: String,
}

async fn submit_task(
    State(s): State<NodeApi>,
    ApiJson(body): ApiJson<SubmitTask>,
) -> Result<Response, ApiError> {
    let task = body.task.trim().to_owned();
    if task.is_empty() {
        return Err(ApiError::invalid_param("task", "the task is empty"));
    }
    if task.chars().count() > 4000 {
        return Err(ApiError::invalid_param(
            "task",
            "the task is longer than 4000 characters",
        ));
    }
    let group_id = new_group_id();
    let agent = s.node.agent.clone();
    let opened = agent.open_group(&task, &group_id).await;
    if body.wait {
        s.tasks.started(&group_id, &task);
        let r = agent.submit_opened(opened).await;
        s.tasks
            .end(&group_id, r.as_ref().map(|_| ()).map_err(|e| e.to_string()));
        let r = r.map_err(|e| ApiError::internal(format!("the task failed: {e}")))?;
        return Ok(Json(r).into_response());
    }
    s.tasks.spawn(&group_id, &task, async move {
        agent
            .submit_opened(opened)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    Ok((StatusCode::ACCEPTED, Json(Submitted { group_id })).into_response())
}

/// `GET /api/tasks`: the tasks submitted to this node, newest first (running ones and
/// the last [`super::tasks::REMEMBERED`] ended ones).
async fn list_tasks(State(s): State<NodeApi>) -> Json<Vec<TaskView>> {
    Json(s.tasks.list())
}

/// `DELETE /api/tasks/{id}`: cancels a running task. Its work on this node stops at once,
/// and so does the members' work on its sub-questions (their calls are dropped).
async fn cancel_task(
    State(s): State<NodeApi>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<TaskView>, ApiError> {
    match s.tasks.cancel(&id) {
        Cancel::Cancelled | Cancel::Ended(TaskState::Cancelled) => s
            .tasks
            .get(&id)
            .map(Json)
            .ok_or_else(|| ApiError::internal("a cancelled task is missing from the task list")),
        Cancel::Ended(state) => Err(ApiError::conflict(format!(
            "task `{id}` has already ended ({})",
            state.name()
        ))),
        Cancel::Unknown => Err(ApiError::not_found(format!(
            "no task `{id}` was submitted to this node"
        ))),
    }
}

/// A group as the API shows it.
#[derive(Debug, Serialize, Deserialize)]
pub struct GroupView {
    /// Id.
    pub group_id: String,
    /// Parent group, for sub-teams.
    pub parent_group_id: Option<String>,
    /// Goal.
    pub goal: String,
    /// Chat state.
    pub state: String,
    /// Created (Unix ms).
    pub created_at: i64,
    /// Details (members, turns, conclusion), when this node hosted it.
    pub details: Option<GroupBody>,
}

fn view(g: GroupRecord<serde_json::Value>) -> GroupView {
    GroupView {
        group_id: g.group_id,
        parent_group_id: g.parent_group_id,
        goal: g.goal,
        state: g.state,
        created_at: g.created_at,
        details: serde_json::from_value(g.body).ok(),
    }
}

async fn groups(State(s): State<NodeApi>) -> Result<Json<Vec<GroupView>>, ApiError> {
    let gs = s
        .node
        .agent
        .store()
        .groups::<serde_json::Value>(200)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(Json(gs.into_iter().map(view).collect()))
}

/// `GET /api/groups/{id}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct GroupDetail {
    /// The group.
    pub group: GroupView,
    /// Its messages, in order.
    pub messages: Vec<Message>,
    /// Its tasks.
    pub tasks: Vec<Task>,
}

async fn group(
    State(s): State<NodeApi>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<GroupDetail>, ApiError> {
    let store = s.node.agent.store();
    let g = store
        .group::<serde_json::Value>(&id)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .ok_or_else(|| ApiError::not_found(format!("no group `{id}` on this node")))?;
    let messages = store
        .messages::<Message>(&id)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .into_iter()
        .map(|m| m.body)
        .collect();
    let tasks = store
        .tasks_in_group::<Task>(&id)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .into_iter()
        .map(|t| t.body)
        .collect();
    Ok(Json(GroupDetail {
        group: view(g),
        messages,
        tasks,
    }))
}

/// `GET /api/tasks/{id}`: the result of a task submitted to this node (its answer,
/// citations and status), by the group id `POST /api/tasks` returned.
async fn task_result(
    State(s): State<NodeApi>,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    if let Some(r) = s.node.agent.task_result(&id) {
        return Ok(Json(r).into_response());
    }
    // Not finished: where it stands (202 while it runs), from submission on.
    match s.tasks.get(&id) {
        Some(t) if t.state == TaskState::Running => {
            Ok((StatusCode::ACCEPTED, Json(t)).into_response())
        }
        Some(t) => Ok(Json(t).into_response()),
        None => Err(ApiError::not_found(format!(
            "no task `{id}` on this node (a task submitted elsewhere is answered there)"
        ))),
    }
}

/// `GET /api/events`: server-sent events, one JSON [`crate::agent::runtime::AgentEvent`]
/// per `data:` line, event name = its `event` field; when the node shuts down, a last
/// `shutdown` event, then the stream ends.
async fn events(State(s): State<NodeApi>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    use futures::StreamExt as _;
    let rx = s.node.agent.events();
    let stopping = s.node.app.shutdown_token().clone();
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        let e = match rx.recv().await {
            Ok(ev) => {
                let json = serde_json::to_value(&ev).unwrap_or_default();
                let name = json["event"].as_str().unwrap_or("event").to_owned();
                Event::default().event(name).data(json.to_string())
            }
            Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => Event::default()
                .event("lagged")
                .data(format!("{{\"event\":\"lagged\",\"missed\":{n}}}")),
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
        };
        Some((Ok(e), rx))
    });
    // When the node shuts down the stream says so and ends cleanly, so the server's
    // graceful shutdown does not wait on it.
    let last = Event::default()
        .event("shutdown")
        .data("{\"event\":\"shutdown\"}");
    let stream = stream
        .take_until(stopping.cancelled_owned())
        .chain(futures::stream::once(async move { Ok(last) }));
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// The dashboard page (embedded in the binary; no build step).
const DASHBOARD: &str = include_str!("../../assets/dashboard.html");

async fn dashboard() -> impl IntoResponse {
    (
        [
            (axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (axum::http::header::CACHE_CONTROL, "no-cache"),
        ],
        DASHBOARD,
    )
}

async fn human_pending(State(s): State<NodeApi>) -> Json<Vec<crate::agent::runtime::HumanRequest>> {
    Json(s.node.agent.pending_human())
}

/// `POST /api/human/{id}` body.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HumanAnswer {
    /// The person's answer.
    pub answer: String,
}

impl Documented for HumanAnswer {
    const SCHEMA: &'static str = "HumanAnswer";
}

async fn human_answer(
    State(s): State<NodeApi>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<HumanAnswer>,
) -> Result<StatusCode, ApiError> {
    let answer = body.answer.trim().to_owned();
    if answer.is_empty() {
        return Err(ApiError::invalid_param("answer", "the answer is empty"));
    }
    if answer.chars().count() > 4000 {
        return Err(ApiError::invalid_param(
            "answer",
            "the answer is longer than 4000 characters",
        ));
    }
    if s.node.agent.answer_human(&id, answer) {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!(
            "no open question `{id}` (answered or timed out?)"
        )))
    }
}

/// `GET /metrics`: Prometheus text format.
async fn metrics(State(s): State<NodeApi>) -> super::models::Exposition {
    let n = &s.node;
    let api = n.app.metrics();
    let (agent_prompt, agent_completion, agent_calls) = n.agent.llm().counters().snapshot();
    let c = n.agent.llm().counters();
    let gen_ms = c.generation_ms.load(std::sync::atomic::Ordering::Relaxed);
    let in_flight = c.in_flight.load(std::sync::atomic::Ordering::Relaxed);
    let peers = n.swarm.peers();
    let up = peers.iter().filter(|p| p.state == PeerState::Alive).count();
    let net = n.swarm.metrics();
    let (sent, received) = n.agent.message_counts();
    let generated = api.completion_tokens + agent_completion;
    let mut out = super::models::Exposition::default();
    let mut metric = |name: &str, kind: &str, help: &str, value: f64| {
        out.metric(name, kind, help, value);
    };
    metric(
        "starling_tokens_generated_total",
        "counter",
        "Tokens generated by the local model (API and agent).",
        generated as f64,
    );
    metric(
        "starling_prompt_tokens_total",
        "counter",
        "Prompt tokens processed (API and agent).",
        (api.prompt_tokens + agent_prompt) as f64,
    );
    metric(
        "starling_agent_model_calls_total",
        "counter",
        "Model calls made by the agent runtime.",
        agent_calls as f64,
    );
    metric(
        "starling_agent_tokens_per_second",
        "gauge",
        "Average decode speed of the agent's model calls.",
        if gen_ms > 0 {
            agent_completion as f64 / (gen_ms as f64 / 1000.0)
        } else {
            0.0
        },
    );
    metric(
        "starling_model_queue_depth",
        "gauge",
        "Generations waiting for or running on the model.",
        (api.active_generations + in_flight) as f64,
    );
    metric(
        "starling_peers_up",
        "gauge",
        "Peers currently alive.",
        up as f64,
    );
    metric(
        "starling_peers_known",
        "gauge",
        "Peers known (any state).",
        peers.len() as f64,
    );
    metric(
        "starling_messages_sent_total",
        "counter",
        "Group-chat messages sent to members.",
        sent as f64,
    );
    metric(
        "starling_messages_received_total",
        "counter",
        "Group-chat messages received from hosts.",
        received as f64,
    );
    metric(
        "starling_records_replicated_total",
        "counter",
        "Verified records received from peers and stored.",
        net.records_accepted as f64,
    );
    metric(
        "starling_records_rejected_total",
        "counter",
        "Records dropped (bad signature, non-member, malformed).",
        (net.records_bad_signature + net.records_rejected) as f64,
    );
    metric(
        "starling_http_requests_total",
        "counter",
        "HTTP requests served.",
        api.http_requests as f64,
    );
    metric(
        "starling_http_server_errors_total",
        "counter",
        "HTTP 5xx answers.",
        api.server_errors as f64,
    );
    out
}
