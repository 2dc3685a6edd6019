//! The group chat of a team of agents, after the Internet of Agents paper, decentralised.
//!
//! [`GroupChat`] is a sans-IO state machine in the shape of `quinn-proto`: the runtime feeds it
//! [`Input`]s with the current time ([`GroupChat::handle`]), drains [`Effect`]s
//! ([`GroupChat::poll`]) and calls back with [`Input::Tick`] once the instant returned by
//! [`GroupChat::poll_timeout`] has passed. It reads no clock, opens no socket and calls no
//! model: the same inputs always give the same effects.
//!
//! One node (normally the initiator's) hosts the chat. Exactly one member is the *speaker* at a
//! time: the machine asks it for a [`Decision`] ([`Effect::AskSpeaker`], carrying a JSON Schema
//! for constrained decoding), turns the decision into [`Message`]s ([`Effect::Broadcast`]) and
//! picks the next speaker.
//!
//! # States
//!
//! * [`ChatState::Discussion`]: members speak in turn.
//! * [`ChatState::SyncTaskAssignment`]: tasks were assigned synchronously; nobody speaks until
//!   every assignee has reported ([`Input::TaskResult`]).
//! * [`ChatState::AsyncTaskAssignment`]: asynchronous tasks are running; the discussion goes
//!   on. The state falls back to `Discussion` when the last one finishes.
//! * [`ChatState::PauseAndTrigger`]: nobody speaks until the listed tasks are finished, either
//!   because a speaker asked for it (`pause`) or because the machine paused by itself: the
//!   speaker wanted to conclude while tasks were unfinished, or the member due to speak is the
//!   assignee of an unfinished task.
//! * [`ChatState::Conclusion`]: final; unfinished tasks are cancelled.
//!
//! # Policies
//!
//! * **Next speaker.** A decision's `next_speakers` are kept if they are live members other than
//!   the sender (the sender itself only when it is the last live member); duplicates are
//!   dropped. A non-empty valid list replaces the queue of upcoming speakers, who then speak in
//!   that order; an empty one leaves the queue as it was. When the queue is empty the fallback
//!   is **round robin**: the first live member after the previous speaker in launch order,
//!   wrapping around, never the previous speaker unless it is the only live member. After an
//!   explicit `pause` that named nobody, the pauser speaks again when the pause ends.
//! * **Turns.** Every accepted decision and every lost turn uses one turn. The decision for turn
//!   `max_turns` may only be `conclude` (anything else is converted into a conclusion with the
//!   same content); if that turn is lost too, the machine concludes by itself, so
//!   [`GroupChat::turn`] never exceeds `max_turns`.
//! * **Repetition.** A `discuss` or `assign_*` decision whose text (content plus task
//!   descriptions) is empty, or (with [`ChatConfig::repetition_guard`] on) whose
//!   [`similarity`] to an earlier message reaches [`ChatConfig::repetition_threshold`], is
//!   rejected. The speaker is asked again with the reason (the `retry` field of
//!   [`Effect::AskSpeaker`]) up to [`ChatConfig::repetition_retries`] times (default 0),
//!   then loses the turn. `pause` and `conclude` are exempt (a conclusion restates results
//!   by nature). Losing the turn at once is the default because a retry is a whole new
//!   generation over the same prompt: in the demo a retry with a small model cost more
//!   tokens than the guard saved (`benches/RESULTS.md`).
//! * **Lenient normalisation.** Decisions come from models and peers, so they are normalised
//!   rather than refused: strings are cut to the configured lengths, assignments to unknown or
//!   departed members are dropped (an assignment left with no task becomes `discuss`), a type
//!   that is not allowed becomes `discuss` (or `conclude` when only that is allowed), pause
//!   triggers are narrowed to running tasks (none valid: all running tasks).
//! * **Failures.** A member that goes down ([`Input::MemberDown`]), does not answer before its
//!   deadline, or whose answer fails ([`Input::NoAnswer`]: the call or its model failed)
//!   loses its turn; a member that goes down has its running tasks failed. A member that
//!   misses [`ChatConfig::max_missed_turns`] turns in a row is treated as down (never the
//!   initiator, the host: a slow or failing model of its own costs it turns, not its group). A task whose deadline passes fails. A failed task is handed on once
//!   to another live member ([`ChatConfig::reassign_failed`]). When only one member
//!   is left, it is asked to conclude (the initiator, if it is the one left); when nobody
//!   is, the machine concludes by itself.
//!   The host may add a member to the running group ([`Input::Recruit`]), a replacement for
//!   one whose task failed.
//! * **Nested teams.** An assignee may launch a sub-team for its task when
//!   `team_up_depth < max_depth` ([`GroupChat::sub_team_depth`]); [`Input::SubTeam`] records the
//!   child group on the task.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use thiserror::Error;
use tracing::{debug, info};

/// Milliseconds on a monotonic clock chosen by the runtime. The machine only compares and adds
/// these values; it never reads a clock.
pub type Millis = u64;

/// Identifier of a task within one group chat (`t1`, `t2`, ...), allocated by the machine.
pub type TaskId = String;

/// A member of a group: an opaque node id (the runtime maps it to a discovery node id) and a
/// display name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRef {
    /// Node id, opaque to the chat.
    pub id: String,
    /// Human-readable name shown in prompts and the dashboard.
    pub name: String,
}

/// Tunables of a group chat. All durations are in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ChatConfig {
    /// How long a speaker has to answer once asked.
    pub turn_timeout_ms: u64,
    /// How long an assignee has to report a task result.
    pub task_timeout_ms: u64,
    /// Whether turns that only repeat earlier messages are rejected (empty turns always
    /// are).
    pub repetition_guard: bool,
    /// A turn whose [`similarity`] to an earlier message is at least this is a repetition.
    /// In `(0, 1]`.
    pub repetition_threshold: f64,
    /// Words per shingle in [`similarity`]. At least 1.
    pub shingle_words: usize,
    /// Times a speaker whose turn was rejected (repetition, empty) is asked again, with the
    /// reason, before the turn is lost. Each retry is one more full generation.
    pub repetition_retries: u32,
    /// Consecutive missed turns after which a member is treated as down; 0 never does.
    pub max_missed_turns: u32,
    /// Longest message content, in characters.
    pub max_content_chars: usize,
    /// Longest task description, in characters.
    pub max_task_desc_chars: usize,
    /// Longest task abstract (short title), in characters.
    pub max_abstract_chars: usize,
    /// Most tasks one decision may assign.
    pub max_tasks_per_decision: usize,
    /// The initiator moderates: while it is live it takes every turn, and the other
    /// members contribute through the tasks it assigns (a grounded inquiry: members
    /// report cited findings, they do not write free text).
    pub moderated: bool,
    /// A team launched for a task splits the work first: the initiator's first turn, when
    /// other members are live, may only be one `assign_sync` with exactly one task for each
    /// of them, in launch order ([`opening_schema`]). It takes precedence over the turn
    /// limit: with `max_turns = 1` it is the only turn, and the machine concludes with the
    /// tasks' results once they are in.
    pub opening_assignment: bool,
    /// A task that fails (its result not ok, its deadline passed, its assignee gone) is
    /// handed once to another live member ([`GroupChat`] picks the next member in launch
    /// order after the failed assignee that has no running task, else any other live
    /// member, the initiator last), as a new task with the same description; the pause
    /// that waited on the failed task waits on the new one. A task that is itself such a
    /// retry is not handed on again. Not in moderated groups: their moderator routes a
    /// failed sub-question by the evidence it holds.
    pub reassign_failed: bool,
}

impl Default for ChatConfig {
    fn default() -> Self {
        Self {
            turn_timeout_ms: 120_000,
            task_timeout_ms: 30 * 60_000,
            repetition_guard: true,
            repetition_threshold: 0.75,
            shingle_words: 2,
            repetition_retries: 0,
            max_missed_turns: 2,
            max_content_chars: 4000,
            max_task_desc_chars: 2000,
            max_abstract_chars: 120,
            max_tasks_per_decision: 8,
            moderated: false,
            opening_assignment: false,
            reassign_failed: true,
        }
    }
}

/// Everything needed to launch a group chat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LaunchParams {
    /// Unique id of the group.
    pub group_id: String,
    /// What the team is to achieve.
    pub goal: String,
    /// Members in launch order (the order round robin follows); must include the initiator.
    pub members: Vec<MemberRef>,
    /// Node id of the member that launched the group; it speaks first.
    pub initiator: String,
    /// Nesting depth of this group: 0 for a top-level team.
    pub team_up_depth: u32,
    /// Deepest nesting allowed; sub-teams may be formed while `team_up_depth < max_depth`.
    pub max_depth: u32,
    /// Turn limit; at least 1. The last turn may only conclude.
    pub max_turns: u32,
    /// Tunables.
    pub config: ChatConfig,
}

impl LaunchParams {
    /// These params for a sub-team asked for by a group whose `max_depth` is `parent_max`:
    /// the tree is no deeper than its root allowed, whatever the sub-team's host would
    /// allow itself (never below the sub-team's own depth, which the parent allowed).
    pub fn within(mut self, parent_max: u32) -> Self {
        self.max_depth = self.max_depth.min(parent_max).max(self.team_up_depth);
        self
    }
}

/// The state of a group chat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatState {
    /// Members speak in turn.
    Discussion,
    /// Waiting for every assignee of a synchronous assignment.
    SyncTaskAssignment,
    /// Asynchronous tasks are running while the discussion goes on.
    AsyncTaskAssignment,
    /// Waiting for the listed tasks (explicit pause or one the machine took by itself).
    PauseAndTrigger,
    /// The chat is over.
    Conclusion,
}

/// What a speaker may decide to do with its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionType {
    /// Say something.
    Discuss,
    /// Assign tasks and wait for all of them before anyone speaks again.
    AssignSync,
    /// Assign tasks and let the discussion go on.
    AssignAsync,
    /// Wait for the listed running tasks.
    Pause,
    /// End the chat with a conclusion.
    Conclude,
}

impl DecisionType {
    /// The wire name (`discuss`, `assign_sync`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            DecisionType::Discuss => "discuss",
            DecisionType::AssignSync => "assign_sync",
            DecisionType::AssignAsync => "assign_async",
            DecisionType::Pause => "pause",
            DecisionType::Conclude => "conclude",
        }
    }
}

/// The type of a recorded [`Message`]: a speaker's decision or an event the machine records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageType {
    /// A speaker's contribution.
    Discuss,
    /// One synchronously assigned task (one message per task).
    AssignSync,
    /// One asynchronously assigned task (one message per task).
    AssignAsync,
    /// A speaker paused the chat until `triggers` finish.
    Pause,
    /// The conclusion; the last message of a chat.
    Conclude,
    /// An assignee's task result, or the failure of a task.
    TaskReport,
    /// The machine paused the chat by itself until `triggers` finish.
    AutoPause,
    /// A member went down or stopped answering.
    MemberLeft,
}

/// A speaker's decision for its turn, as produced by a constrained model (see
/// [`Decision::json_schema`]) or sent by a peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// What to do with the turn.
    #[serde(rename = "type")]
    pub msg_type: DecisionType,
    /// The message text (for `conclude`, the conclusion).
    pub content: String,
    /// Who should speak next, in order.
    #[serde(default)]
    pub next_speakers: Vec<String>,
    /// Tasks to assign (`assign_sync` / `assign_async`).
    #[serde(default)]
    pub tasks: Vec<TaskSpec>,
    /// Task ids to wait for (`pause`).
    #[serde(default)]
    pub triggers: Vec<TaskId>,
}

/// One task in an assignment decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSpec {
    /// Node id of the member that is to do it.
    pub assignee: String,
    /// Short title.
    #[serde(default)]
    pub task_abstract: Option<String>,
    /// What is to be done.
    pub task_desc: String,
}

impl Decision {
    /// A JSON Schema that exactly the acceptable decisions match, for constrained decoding.
    ///
    /// `next_speakers` are the ids a decision may name as next speakers, `assignees` the ids it
    /// may assign tasks to, `allowed` the types it may choose (an empty list means
    /// `conclude` only), `open_tasks` the ids a `pause` may wait for; string and array bounds
    /// come from `limits`. The schema is an `anyOf` with one branch per usable type (`pause`
    /// needs open tasks and `assign_*` assignees); properties are listed in generation order
    /// (`type` first).
    pub fn json_schema(
        next_speakers: &[String],
        assignees: &[String],
        allowed: &[DecisionType],
        open_tasks: &[TaskId],
        limits: &ChatConfig,
    ) -> Value {
        let content = json!({
            "type": "string",
            "minLength": 1,
            "maxLength": limits.max_content_chars,
        });
        let speakers = json!({
            "type": "array",
            "items": { "enum": next_speakers },
            "minItems": 1,
            "maxItems": next_speakers.len(),
        });
        let tasks = json!({
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "assignee": { "enum": assignees },
                    "task_abstract": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": limits.max_abstract_chars,
                    },
                    "task_desc": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": limits.max_task_desc_chars,
                    },
                },
                "required": ["assignee", "task_abstract", "task_desc"],
                "additionalProperties": false,
            },
            "minItems": 1,
            "maxItems": limits.max_tasks_per_decision.max(1),
        });
        let triggers = json!({
            "type": "array",
            "items": { "enum": open_tasks },
            "minItems": 1,
            "maxItems": open_tasks.len(),
        });
        let conclude_only = [DecisionType::Conclude];
        let allowed = if allowed.is_empty() {
            &conclude_only[..]
        } else {
            allowed
        };
        let mut branches = Vec::new();
        let mut seen = HashSet::new();
        for &kind in allowed {
            if !seen.insert(kind) {
                continue;
            }
            let mut props = vec![("content", content.clone())];
            match kind {
                DecisionType::Conclude => {}
                DecisionType::Discuss => {
                    if !next_speakers.is_empty() {
                        props.push(("next_speakers", speakers.clone()));
                    }
                }
                DecisionType::AssignSync | DecisionType::AssignAsync => {
                    if assignees.is_empty() {
                        continue;
                    }
                    if !next_speakers.is_empty() {
                        props.push(("next_speakers", speakers.clone()));
                    }
                    props.push(("tasks", tasks.clone()));
                }
                DecisionType::Pause => {
                    if open_tasks.is_empty() {
                        continue;
                    }
                    if !next_speakers.is_empty() {
                        props.push(("next_speakers", speakers.clone()));
                    }
                    props.push(("triggers", triggers.clone()));
                }
            }
            branches.push(object_schema(kind, props));
        }
        if branches.is_empty() {
            branches.push(object_schema(
                DecisionType::Conclude,
                vec![("content", content)],
            ));
        }
        if branches.len() == 1 {
            branches.swap_remove(0)
        } else {
            json!({ "anyOf": branches })
        }
    }
}

/// One `anyOf` branch: an object with `type` fixed to `kind` and every listed property required.
fn object_schema(kind: DecisionType, props: Vec<(&str, Value)>) -> Value {
    let mut properties = Map::new();
    let mut required = vec![Value::from("type")];
    properties.insert("type".into(), json!({ "enum": [kind.as_str()] }));
    for (name, schema) in props {
        required.push(Value::from(name));
        properties.insert(name.into(), schema);
    }
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

/// The schema of an opening assignment ([`ChatConfig::opening_assignment`]): one
/// `assign_sync` with exactly one task for each of `others`, in order.
pub fn opening_schema(others: &[String], limits: &ChatConfig) -> Value {
    let items: Vec<Value> = others
        .iter()
        .map(|id| {
            json!({
                "type": "object",
                "properties": {
                    "assignee": {"enum": [id]},
                    "task_abstract": {"type": "string", "minLength": 3, "maxLength": limits.max_abstract_chars.min(60)},
                    "task_desc": {"type": "string", "minLength": 10, "maxLength": limits.max_task_desc_chars.min(300)}
                },
                "required": ["assignee", "task_abstract", "task_desc"],
                "additionalProperties": false
            })
        })
        .collect();
    json!({
        "type": "object",
        "properties": {
            "type": {"enum": ["assign_sync"]},
            "content": {"type": "string", "minLength": 1, "maxLength": 300},
            "tasks": {
                "type": "array",
                "prefixItems": items,
                "items": false,
                "minItems": others.len(),
                "maxItems": others.len()
            }
        },
        "required": ["type", "content", "tasks"],
        "additionalProperties": false
    })
}

/// Who takes over a group whose host `host` is gone: the first of `members` (in the host's
/// order) other than the host that `live` says is up. Every member computes it from the same
/// list, so one of them resumes the group as long as their views of who is up agree.
pub fn successor<'a>(
    members: &'a [MemberRef],
    host: &str,
    live: impl Fn(&str) -> bool,
) -> Option<&'a MemberRef> {
    members.iter().find(|m| m.id != host && live(&m.id))
}

/// A recorded group-chat message: the persisted and broadcast form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// The group it belongs to.
    pub group_id: String,
    /// Position in the chat, from 0, increasing (a log a new host resumed may have gaps
    /// where it missed a message).
    pub seq: u64,
    /// Turns used when it was recorded (the speaker's turn number for speaker messages).
    pub turn: u32,
    /// The speaker, or for machine-recorded events the member concerned (assignee of a
    /// reported task, member that left or whose step waits). Conclusions the machine makes by
    /// itself are sent in the initiator's name.
    pub sender: String,
    /// Chat state once the message was recorded.
    pub state: ChatState,
    /// What kind of message it is.
    pub msg_type: MessageType,
    /// Text.
    pub content: String,
    /// Valid next speakers named by the decision.
    #[serde(default)]
    pub next_speakers: Vec<String>,
    /// The task an assignment or report is about.
    #[serde(default)]
    pub task_id: Option<TaskId>,
    /// Assignee of `task_id`.
    #[serde(default)]
    pub assignee: Option<String>,
    /// Description of `task_id`.
    #[serde(default)]
    pub task_desc: Option<String>,
    /// Short title of `task_id`.
    #[serde(default)]
    pub task_abstract: Option<String>,
    /// Result of `task_id` (reports of successful tasks).
    #[serde(default)]
    pub task_conclusion: Option<String>,
    /// Tasks a pause waits for.
    #[serde(default)]
    pub triggers: Vec<TaskId>,
}

/// Whether an assignment blocks the chat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskMode {
    /// Assigned with `assign_sync`.
    Sync,
    /// Assigned with `assign_async`.
    Async,
}

/// Lifecycle of a task. Tasks start `Running`: the machine emits [`Effect::RunTask`] as soon as
/// it creates one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Handed to the assignee, no result yet.
    Running,
    /// Reported successfully.
    Done,
    /// Reported as failed, timed out, or its assignee went down.
    Failed,
    /// Abandoned because the chat concluded.
    Cancelled,
}

/// A task of the group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// Id within the group.
    pub id: TaskId,
    /// Member that is to do it.
    pub assignee: String,
    /// Member whose decision assigned it.
    pub assigner: String,
    /// Short title, if given.
    pub task_abstract: Option<String>,
    /// What is to be done.
    pub desc: String,
    /// Sync or async.
    pub mode: TaskMode,
    /// Where it is in its lifecycle.
    pub state: TaskState,
    /// Turn of the assigning decision.
    pub assigned_turn: u32,
    /// When it fails unless reported.
    pub deadline: Millis,
    /// Result (done) or reason (failed).
    pub result: Option<String>,
    /// Group id of the sub-team formed for it, if any.
    pub child_group: Option<String>,
}

/// Why a speaker is asked again within the same turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rejection {
    /// The turn said nothing (no words after normalisation).
    Empty,
    /// The turn repeated message `seq` with this [`similarity`].
    Repeats {
        /// The earlier message it repeats.
        seq: u64,
        /// Its similarity to that message, in `[0, 1]`.
        similarity: f64,
    },
}

/// Why a speaker lost its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LostTurnReason {
    /// No decision before the deadline.
    Timeout,
    /// Only repeated earlier content (or said nothing), on every try
    /// ([`ChatConfig::repetition_retries`]).
    Repetition,
    /// Went down while asked.
    MemberDown,
    /// Its answer failed ([`Input::NoAnswer`]).
    NoAnswer,
}

/// Why the chat paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseReason {
    /// A synchronous assignment waits for all its tasks.
    SyncAssignment,
    /// A speaker paused on triggers.
    Trigger,
    /// The speaker wanted to conclude while tasks were unfinished.
    BeforeConclusion,
    /// The member due to speak is the assignee of unfinished tasks.
    SpeakerBusy,
}

/// Why the chat concluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConclusionReason {
    /// A speaker chose to conclude.
    Decided,
    /// The turn limit forced it.
    TurnLimit,
    /// Every other member (or every member) left.
    MembersGone,
}

/// What the runtime must do. Drained with [`GroupChat::poll`], in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Ask `member` for its decision; answer with [`Input::Decision`] before `deadline`.
    /// At most one ask is outstanding: a new one (for anyone) only follows the answer, an
    /// [`Effect::TurnLost`] or a pause.
    AskSpeaker {
        /// Who speaks.
        member: String,
        /// The turn it is asked for (1-based, at most `max_turns`).
        turn: u32,
        /// Types it may choose; only `conclude` on the last turn or when everyone else left.
        allowed_types: Vec<DecisionType>,
        /// When it loses the turn.
        deadline: Millis,
        /// Set when this is the retry after a rejected answer: tell the speaker why.
        retry: Option<Rejection>,
        /// JSON Schema of the acceptable decisions (see [`Decision::json_schema`]).
        schema: Value,
    },
    /// Send this message to every live member (and persist it).
    Broadcast(Message),
    /// Have the assignee run this task, then report with [`Input::TaskResult`].
    RunTask {
        /// The task (state `Running`).
        task: Task,
        /// `Some(depth)` if the assignee may form a sub-team for it, launched at that depth.
        sub_team_depth: Option<u32>,
    },
    /// The task is abandoned (the chat concluded): the assignee may stop working on it.
    CancelTask {
        /// The task.
        task_id: TaskId,
        /// Who was doing it.
        assignee: String,
    },
    /// The outstanding ask to `member` is void; a late answer will be refused.
    TurnLost {
        /// Who lost the turn.
        member: String,
        /// Why.
        reason: LostTurnReason,
    },
    /// Nobody speaks until these tasks are finished.
    Paused {
        /// The tasks waited for.
        waiting_on: Vec<TaskId>,
        /// Why.
        reason: PauseReason,
    },
    /// The chat is over; the last effect of a chat.
    Concluded {
        /// The conclusion text.
        conclusion: String,
        /// The member that concluded, `None` if the machine did.
        by: Option<String>,
        /// Why.
        reason: ConclusionReason,
    },
}

/// What happened, fed to [`GroupChat::handle`].
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// The speaker's answer.
    Decision {
        /// The member that sent it (authenticated by the runtime).
        from: String,
        /// Its decision.
        decision: Decision,
    },
    /// An assignee's report on its task.
    TaskResult {
        /// The member that sent it (must be the assignee).
        from: String,
        /// The task.
        task_id: TaskId,
        /// Whether it succeeded.
        ok: bool,
        /// The result, or why it failed.
        result: String,
    },
    /// The assignee of a running task formed a sub-team for it.
    SubTeam {
        /// The member that sent it (must be the assignee).
        from: String,
        /// The task.
        task_id: TaskId,
        /// Group id of the sub-team.
        child_group_id: String,
    },
    /// A member went down (membership reported it, or the runtime gave up on it).
    MemberDown(String),
    /// The speaker's answer failed (the call to it failed, or its model did): a missed
    /// turn, counted toward [`ChatConfig::max_missed_turns`] like a timeout. The initiator
    /// (the host) is never marked down for missed turns.
    NoAnswer {
        /// The member that was asked.
        from: String,
        /// What failed.
        reason: String,
    },
    /// A member joins the running group: the replacement the host found for a member whose
    /// task failed. It can be assigned tasks and speak from now on.
    Recruit(MemberRef),
    /// Time passed: enforce the deadlines up to `now`. Deadlines are only enforced here.
    Tick,
}

/// Invalid launch parameters.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LaunchError {
    /// The group id is empty.
    #[error("group id is empty")]
    EmptyGroupId,
    /// No members.
    #[error("a group needs at least one member")]
    NoMembers,
    /// A member id is empty.
    #[error("a member id is empty")]
    EmptyMemberId,
    /// A member is listed twice.
    #[error("member {0} is listed twice")]
    DuplicateMember(String),
    /// The initiator is not among the members.
    #[error("initiator {0} is not a member")]
    InitiatorNotMember(String),
    /// `max_turns` is 0.
    #[error("max_turns must be at least 1")]
    ZeroTurns,
    /// `team_up_depth > max_depth`.
    #[error("team-up depth {depth} is above the maximum {max_depth}")]
    DepthAboveMax {
        /// The group's depth.
        depth: u32,
        /// The maximum.
        max_depth: u32,
    },
    /// A [`ChatConfig`] value is out of range.
    #[error("invalid chat config: {0}")]
    InvalidConfig(&'static str),
}

/// An input the machine refused; the state is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ChatError {
    /// The chat has concluded.
    #[error("the group chat has concluded")]
    Concluded,
    /// A decision came from a member that is not being asked.
    #[error("{from} is not the speaker (expected {expected:?})")]
    NotSpeaker {
        /// Who sent it.
        from: String,
        /// Who is being asked, if anyone.
        expected: Option<String>,
    },
    /// No task has this id.
    #[error("unknown task {0}")]
    UnknownTask(TaskId),
    /// The sender is not the task's assignee.
    #[error("{from} is not the assignee of task {task_id}")]
    NotAssignee {
        /// The task.
        task_id: TaskId,
        /// Who sent it.
        from: String,
    },
    /// The task is already finished.
    #[error("task {task_id} is {state:?}, not running")]
    TaskNotRunning {
        /// The task.
        task_id: TaskId,
        /// Its state.
        state: TaskState,
    },
    /// No member has this id.
    #[error("unknown member {0}")]
    UnknownMember(String),
    /// A recruit is already a member (live or down).
    #[error("{0} is already a member")]
    AlreadyMember(String),
    /// A recruit has an empty id.
    #[error("a recruit needs a member id")]
    EmptyRecruit,
    /// This group is already at the maximum nesting depth.
    #[error("no sub-team allowed at depth {depth} (max {max_depth})")]
    SubTeamNotAllowed {
        /// The group's depth.
        depth: u32,
        /// The maximum.
        max_depth: u32,
    },
    /// The task already has a sub-team.
    #[error("task {task_id} already has sub-team {child_group_id}")]
    SubTeamExists {
        /// The task.
        task_id: TaskId,
        /// Its sub-team.
        child_group_id: String,
    },
}

/// The outstanding request to the speaker.
#[derive(Debug, Clone)]
struct Ask {
    member: String,
    turn: u32,
    allowed: Vec<DecisionType>,
    deadline: Millis,
    retries: u32,
    forced: Option<ConclusionReason>,
    schema: Value,
}

/// What a pause waits for and who speaks when it ends.
#[derive(Debug, Clone)]
struct Wait {
    tasks: Vec<TaskId>,
    resume_with: Option<String>,
    reason: PauseReason,
}

/// A group chat. See the [module documentation](self) for the states and policies.
#[derive(Debug, Clone)]
pub struct GroupChat {
    group_id: String,
    goal: String,
    members: Vec<MemberRef>,
    initiator: String,
    team_up_depth: u32,
    max_depth: u32,
    max_turns: u32,
    config: ChatConfig,
    state: ChatState,
    turn: u32,
    messages: Vec<Message>,
    tasks: Vec<Task>,
    next_task: u32,
    effects: VecDeque<Effect>,
    asking: Option<Ask>,
    wait: Option<Wait>,
    queue: VecDeque<String>,
    last_speaker: String,
    down: BTreeSet<String>,
    missed: BTreeMap<String, u32>,
    ending: Option<ConclusionReason>,
    conclusion: Option<String>,
    /// Tasks handed on after failing, and the retries themselves: neither is handed on
    /// (again).
    retried: HashSet<TaskId>,
}

impl LaunchParams {
    fn validate(&self) -> Result<(), LaunchError> {
        if self.group_id.is_empty() {
            return Err(LaunchError::EmptyGroupId);
        }
        if self.members.is_empty() {
            return Err(LaunchError::NoMembers);
        }
        let mut ids = HashSet::new();
        for m in &self.members {
            if m.id.is_empty() {
                return Err(LaunchError::EmptyMemberId);
            }
            if !ids.insert(m.id.as_str()) {
                return Err(LaunchError::DuplicateMember(m.id.clone()));
            }
        }
        if !ids.contains(self.initiator.as_str()) {
            return Err(LaunchError::InitiatorNotMember(self.initiator.clone()));
        }
        if self.max_turns == 0 {
            return Err(LaunchError::ZeroTurns);
        }
        if self.team_up_depth > self.max_depth {
            return Err(LaunchError::DepthAboveMax {
                depth: self.team_up_depth,
                max_depth: self.max_depth,
            });
        }
        let c = &self.config;
        // NaN fails both comparisons, so it is refused too.
        if !(c.repetition_threshold > 0.0 && c.repetition_threshold <= 1.0) {
            return Err(LaunchError::InvalidConfig(
                "repetition_threshold must be in (0, 1]",
            ));
        }
        if c.shingle_words == 0 {
            return Err(LaunchError::InvalidConfig(
                "shingle_words must be at least 1",
            ));
        }
        if c.max_content_chars == 0 || c.max_task_desc_chars == 0 || c.max_abstract_chars == 0 {
            return Err(LaunchError::InvalidConfig(
                "length limits must be at least 1",
            ));
        }
        if c.turn_timeout_ms == 0 || c.task_timeout_ms == 0 {
            return Err(LaunchError::InvalidConfig("timeouts must be at least 1 ms"));
        }
        Ok(())
    }
}

impl GroupChat {
    /// Launches a chat at `now`: the initiator is asked first.
    pub fn launch(params: LaunchParams, now: Millis) -> Result<Self, LaunchError> {
        params.validate()?;
        let initiator = params.initiator.clone();
        let mut chat = Self::build(params);
        info!(group = %chat.group_id, members = chat.members.len(), max_turns = chat.max_turns, "group chat launched");
        chat.give_turn(now, Some(initiator));
        Ok(chat)
    }

    /// A chat in discussion with an empty log, nobody asked yet (`params` validated).
    fn build(params: LaunchParams) -> Self {
        let LaunchParams {
            group_id,
            goal,
            members,
            initiator,
            team_up_depth,
            max_depth,
            max_turns,
            config,
        } = params;
        Self {
            group_id,
            goal,
            members,
            last_speaker: initiator.clone(),
            initiator,
            team_up_depth,
            max_depth,
            max_turns,
            config,
            state: ChatState::Discussion,
            turn: 0,
            messages: Vec::new(),
            tasks: Vec::new(),
            next_task: 1,
            effects: VecDeque::new(),
            asking: None,
            wait: None,
            queue: VecDeque::new(),
            down: BTreeSet::new(),
            missed: BTreeMap::new(),
            ending: None,
            conclusion: None,
            retried: HashSet::new(),
        }
    }

    /// Resumes a group whose host is gone, hosted now by `params.initiator` (its
    /// [`successor`]): `prior` is the log this node recorded (other groups' messages are
    /// ignored). The log goes on after it (sequence numbers after the last recorded, task
    /// ids after the last assigned), a [`MessageType::MemberLeft`] message in
    /// `previous_host`'s name records the handover, and the chat starts again from the new
    /// host's turn with a fresh turn budget: the work the old host had under way is asked
    /// for again (its calls ended with it).
    pub fn resume(
        params: LaunchParams,
        mut prior: Vec<Message>,
        previous_host: &str,
        now: Millis,
    ) -> Result<Self, LaunchError> {
        params.validate()?;
        prior.retain(|m| m.group_id == params.group_id);
        prior.sort_by_key(|m| m.seq);
        prior.dedup_by_key(|m| m.seq);
        let next_task = prior
            .iter()
            .filter_map(|m| m.task_id.as_deref()?.strip_prefix('t')?.parse::<u32>().ok())
            .max()
            .map_or(1, |n| n.saturating_add(1));
        let initiator = params.initiator.clone();
        let mut chat = Self::build(params);
        chat.messages = prior;
        chat.next_task = next_task;
        info!(group = %chat.group_id, %previous_host, host = %initiator, "group chat resumed by a new host");
        let note = format!("the host left; {initiator} resumes the group");
        let msg = chat.message(previous_host, MessageType::MemberLeft, note);
        chat.publish(msg);
        chat.give_turn(now, Some(initiator));
        Ok(chat)
    }

    /// Feeds one input at time `now`. On error nothing changed.
    pub fn handle(&mut self, input: Input, now: Millis) -> Result<(), ChatError> {
        if self.state == ChatState::Conclusion {
            return match input {
                Input::Tick => Ok(()),
                _ => Err(ChatError::Concluded),
            };
        }
        match input {
            Input::Decision { from, decision } => self.on_decision(from, decision, now),
            Input::TaskResult {
                from,
                task_id,
                ok,
                result,
            } => self.on_task_result(&from, &task_id, ok, result, now),
            Input::SubTeam {
                from,
                task_id,
                child_group_id,
            } => self.on_sub_team(&from, &task_id, child_group_id),
            Input::MemberDown(member) => self.on_member_down(&member, now),
            Input::Recruit(member) => self.on_recruit(member),
            Input::NoAnswer { from, reason } => self.on_no_answer(from, &reason, now),
            Input::Tick => {
                self.on_tick(now);
                Ok(())
            }
        }
    }

    /// The next effect to carry out, if any.
    pub fn poll(&mut self) -> Option<Effect> {
        self.effects.pop_front()
    }

    /// The earliest deadline (speaker's answer or a task's result); feed [`Input::Tick`] once
    /// it has passed. `None` when nothing is timed (the chat concluded).
    pub fn poll_timeout(&self) -> Option<Millis> {
        if self.state == ChatState::Conclusion {
            return None;
        }
        let tasks = self
            .tasks
            .iter()
            .filter(|t| t.state == TaskState::Running)
            .map(|t| t.deadline);
        self.asking.iter().map(|a| a.deadline).chain(tasks).min()
    }

    /// Group id.
    pub fn group_id(&self) -> &str {
        &self.group_id
    }

    /// The goal.
    pub fn goal(&self) -> &str {
        &self.goal
    }

    /// Every member, in launch order, live or not.
    pub fn members(&self) -> &[MemberRef] {
        &self.members
    }

    /// Members that have not gone down, in launch order.
    pub fn live_members(&self) -> impl Iterator<Item = &MemberRef> + '_ {
        self.members.iter().filter(|m| !self.down.contains(&m.id))
    }

    /// Whether `id` is a member that has not gone down.
    pub fn is_live(&self, id: &str) -> bool {
        !self.down.contains(id) && self.members.iter().any(|m| m.id == id)
    }

    /// The initiator's node id.
    pub fn initiator(&self) -> &str {
        &self.initiator
    }

    /// The tunables.
    pub fn config(&self) -> &ChatConfig {
        &self.config
    }

    /// Current state.
    pub fn state(&self) -> ChatState {
        self.state
    }

    /// Turns used so far (accepted decisions plus lost turns); never above `max_turns`.
    pub fn turn(&self) -> u32 {
        self.turn
    }

    /// The turn limit.
    pub fn max_turns(&self) -> u32 {
        self.max_turns
    }

    /// Nesting depth of this group.
    pub fn team_up_depth(&self) -> u32 {
        self.team_up_depth
    }

    /// Deepest nesting allowed.
    pub fn max_depth(&self) -> u32 {
        self.max_depth
    }

    /// `Some(depth of a child group)` if an assignee may form a sub-team, `None` at the maximum
    /// depth.
    pub fn sub_team_depth(&self) -> Option<u32> {
        (self.team_up_depth < self.max_depth).then_some(self.team_up_depth + 1)
    }

    /// Every message so far, by `seq`.
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// Every task so far, in creation order.
    pub fn tasks(&self) -> &[Task] {
        &self.tasks
    }

    /// One task.
    pub fn task(&self, id: &str) -> Option<&Task> {
        self.tasks.iter().find(|t| t.id == id)
    }

    /// The member being asked for a decision, if any.
    pub fn current_speaker(&self) -> Option<&str> {
        self.asking.as_ref().map(|a| a.member.as_str())
    }

    /// The tasks a pause waits for (also the unfinished ones among them), if paused.
    pub fn waiting_on(&self) -> Option<&[TaskId]> {
        self.wait.as_ref().map(|w| w.tasks.as_slice())
    }

    /// The conclusion, once concluded.
    pub fn conclusion(&self) -> Option<&str> {
        self.conclusion.as_deref()
    }

    // ---- inputs ----

    fn on_decision(
        &mut self,
        from: String,
        decision: Decision,
        now: Millis,
    ) -> Result<(), ChatError> {
        let Some(ask) = self.asking.as_ref().filter(|a| a.member == from) else {
            return Err(ChatError::NotSpeaker {
                from,
                expected: self.asking.as_ref().map(|a| a.member.clone()),
            });
        };
        let forced = ask.forced.or(self.ending);
        let allowed_kind = ask.allowed.contains(&decision.msg_type);
        let retries = ask.retries;
        let mut d = self.normalise(decision);
        let named = self.valid_next_speakers(&from, &d.next_speakers);
        let running = self.running_ids(|_| true);
        let mut kind = d.msg_type;
        if forced.is_some() {
            kind = DecisionType::Conclude;
        } else if !allowed_kind {
            kind = DecisionType::Discuss;
        }
        if matches!(kind, DecisionType::AssignSync | DecisionType::AssignAsync)
            && d.tasks.is_empty()
        {
            kind = DecisionType::Discuss;
        }
        if kind == DecisionType::Pause && d.triggers.is_empty() {
            d.triggers = running.clone();
            if d.triggers.is_empty() {
                kind = DecisionType::Discuss;
            }
        }
        self.missed.remove(&from);

        if matches!(
            kind,
            DecisionType::Discuss | DecisionType::AssignSync | DecisionType::AssignAsync
        ) {
            if let Some(rejection) = self.repetition(&d) {
                if retries >= self.config.repetition_retries {
                    debug!(group = %self.group_id, member = %from, ?rejection, "repetition: turn lost");
                    self.lose_turn(from, LostTurnReason::Repetition, now);
                } else {
                    debug!(group = %self.group_id, member = %from, ?rejection, "repetition: asking again");
                    self.retry(rejection, now);
                }
                return Ok(());
            }
        }

        if kind == DecisionType::Conclude && forced.is_none() && !running.is_empty() {
            // The conclusion depends on unfinished work: wait for it, then ask again.
            self.asking = None;
            self.auto_pause(running, from, PauseReason::BeforeConclusion);
            return Ok(());
        }

        self.asking = None;
        self.turn += 1;
        self.last_speaker = from.clone();
        if !named.is_empty() {
            self.queue = named.iter().cloned().collect();
        }
        debug!(group = %self.group_id, member = %from, turn = self.turn, kind = kind.as_str(), "decision accepted");
        match kind {
            DecisionType::Discuss => {
                self.state = self.active_state();
                let mut msg = self.message(&from, MessageType::Discuss, d.content);
                msg.next_speakers = named;
                self.publish(msg);
                self.give_turn(now, None);
            }
            DecisionType::AssignSync | DecisionType::AssignAsync => {
                let (mode, msg_type, state) = if kind == DecisionType::AssignSync {
                    (
                        TaskMode::Sync,
                        MessageType::AssignSync,
                        ChatState::SyncTaskAssignment,
                    )
                } else {
                    (
                        TaskMode::Async,
                        MessageType::AssignAsync,
                        ChatState::AsyncTaskAssignment,
                    )
                };
                self.state = state;
                let mut created = Vec::new();
                for spec in d.tasks {
                    let task = Task {
                        id: format!("t{}", self.next_task),
                        assignee: spec.assignee,
                        assigner: from.clone(),
                        task_abstract: spec.task_abstract,
                        desc: spec.task_desc,
                        mode,
                        state: TaskState::Running,
                        assigned_turn: self.turn,
                        deadline: now.saturating_add(self.config.task_timeout_ms),
                        result: None,
                        child_group: None,
                    };
                    self.next_task += 1;
                    let mut msg = self.message(&from, msg_type, d.content.clone());
                    msg.next_speakers = named.clone();
                    created.push(task.id.clone());
                    self.start_task(task, msg);
                }
                if mode == TaskMode::Sync {
                    self.pause(created, None, PauseReason::SyncAssignment);
                } else {
                    self.give_turn(now, None);
                }
            }
            DecisionType::Pause => {
                self.state = ChatState::PauseAndTrigger;
                let mut msg = self.message(&from, MessageType::Pause, d.content);
                msg.next_speakers = named.clone();
                msg.triggers = d.triggers.clone();
                self.publish(msg);
                let resume_with = named.is_empty().then(|| from.clone());
                self.pause(d.triggers, resume_with, PauseReason::Trigger);
            }
            DecisionType::Conclude => {
                let reason = forced.unwrap_or(ConclusionReason::Decided);
                self.conclude(d.content, Some(from), reason);
            }
        }
        Ok(())
    }

    fn on_task_result(
        &mut self,
        from: &str,
        task_id: &str,
        ok: bool,
        result: String,
        now: Millis,
    ) -> Result<(), ChatError> {
        let idx = self.running_task_index(from, task_id)?;
        let result: String = result.chars().take(self.config.max_content_chars).collect();
        let outcome = if ok {
            TaskState::Done
        } else {
            TaskState::Failed
        };
        self.finish_task(idx, outcome, result);
        if outcome == TaskState::Failed {
            self.hand_on(idx, now);
        }
        self.after_tasks_changed(now);
        Ok(())
    }

    fn on_sub_team(
        &mut self,
        from: &str,
        task_id: &str,
        child_group_id: String,
    ) -> Result<(), ChatError> {
        let idx = self.running_task_index(from, task_id)?;
        if self.sub_team_depth().is_none() {
            return Err(ChatError::SubTeamNotAllowed {
                depth: self.team_up_depth,
                max_depth: self.max_depth,
            });
        }
        let task = &mut self.tasks[idx];
        if let Some(existing) = &task.child_group {
            return Err(ChatError::SubTeamExists {
                task_id: task.id.clone(),
                child_group_id: existing.clone(),
            });
        }
        debug!(group = %self.group_id, task = %task.id, child = %child_group_id, "sub-team formed");
        task.child_group = Some(child_group_id);
        Ok(())
    }

    fn on_recruit(&mut self, member: MemberRef) -> Result<(), ChatError> {
        if member.id.is_empty() {
            return Err(ChatError::EmptyRecruit);
        }
        if self.members.iter().any(|m| m.id == member.id) {
            return Err(ChatError::AlreadyMember(member.id));
        }
        debug!(group = %self.group_id, member = %member.id, "member recruited");
        self.members.push(member);
        Ok(())
    }

    fn on_member_down(&mut self, member: &str, now: Millis) -> Result<(), ChatError> {
        if !self.members.iter().any(|m| m.id == member) {
            return Err(ChatError::UnknownMember(member.to_owned()));
        }
        if !self.down.contains(member) {
            self.mark_down(member, LostTurnReason::MemberDown, now);
        }
        Ok(())
    }

    fn on_tick(&mut self, now: Millis) {
        let expired: Vec<usize> = (0..self.tasks.len())
            .filter(|&i| self.tasks[i].state == TaskState::Running && self.tasks[i].deadline <= now)
            .collect();
        for &i in &expired {
            self.finish_task(i, TaskState::Failed, "no result before the deadline".into());
            self.hand_on(i, now);
        }
        if !expired.is_empty() {
            self.after_tasks_changed(now);
        }
        let Some(ask) = self.asking.as_ref().filter(|a| a.deadline <= now) else {
            return;
        };
        let member = ask.member.clone();
        self.missed_turn(member, LostTurnReason::Timeout, now);
    }

    fn on_no_answer(&mut self, from: String, reason: &str, now: Millis) -> Result<(), ChatError> {
        if self.asking.as_ref().is_none_or(|a| a.member != from) {
            return Err(ChatError::NotSpeaker {
                from,
                expected: self.asking.as_ref().map(|a| a.member.clone()),
            });
        }
        debug!(group = %self.group_id, member = %from, %reason, "no answer");
        self.missed_turn(from, LostTurnReason::NoAnswer, now);
        Ok(())
    }

    /// The asked `member` missed its turn for `reason`: it loses the turn, and is treated
    /// as down after [`ChatConfig::max_missed_turns`] in a row (never the initiator, late or
    /// failed: the host does not leave its own group).
    fn missed_turn(&mut self, member: String, reason: LostTurnReason, now: Millis) {
        let missed = self.missed.entry(member.clone()).or_default();
        *missed += 1;
        let limit = self.config.max_missed_turns;
        if limit > 0 && *missed >= limit && member != self.initiator {
            debug!(group = %self.group_id, %member, "missed too many turns: treated as down");
            self.mark_down(&member, reason, now);
        } else {
            self.lose_turn(member, reason, now);
        }
    }

    // ---- transitions ----

    /// Hands the next turn to `candidate` (if live) or the fallback choice, pausing first if
    /// that member is busy with its own tasks, or concludes when no turn is left or nobody is.
    fn give_turn(&mut self, now: Millis, candidate: Option<String>) {
        if self.turn >= self.max_turns {
            self.self_conclude(ConclusionReason::TurnLimit);
            return;
        }
        let pick = match candidate {
            _ if self.config.moderated && self.is_live(&self.initiator) => {
                Some(self.initiator.clone())
            }
            Some(m) if self.is_live(&m) => Some(m),
            _ => self.choose_next(),
        };
        let Some(member) = pick else {
            self.self_conclude(ConclusionReason::MembersGone);
            return;
        };
        let others: Vec<String> = self
            .live_members()
            .filter(|m| m.id != member)
            .map(|m| m.id.clone())
            .collect();
        let opening = self.config.opening_assignment
            && self.turn == 0
            && member == self.initiator
            && self.ending.is_none()
            && !others.is_empty();
        let forced = if opening { None } else { self.forced_reason() };
        if forced.is_none() {
            let busy = self.running_ids(|t| t.assignee == member);
            if !busy.is_empty() {
                self.auto_pause(busy, member, PauseReason::SpeakerBusy);
                return;
            }
        }
        let allowed = if opening {
            vec![DecisionType::AssignSync]
        } else if forced.is_some() {
            vec![DecisionType::Conclude]
        } else {
            let mut v = vec![
                DecisionType::Discuss,
                DecisionType::AssignSync,
                DecisionType::AssignAsync,
            ];
            if self.tasks.iter().any(|t| t.state == TaskState::Running) {
                v.push(DecisionType::Pause);
            }
            v.push(DecisionType::Conclude);
            v
        };
        let schema = if opening {
            opening_schema(&others, &self.config)
        } else {
            self.schema_for(&member, &allowed)
        };
        let ask = Ask {
            member,
            turn: self.turn + 1,
            allowed,
            deadline: now.saturating_add(self.config.turn_timeout_ms),
            retries: 0,
            forced,
            schema,
        };
        debug!(group = %self.group_id, member = %ask.member, turn = ask.turn, "asking speaker");
        self.effects.push_back(ask_effect(&ask, None));
        self.asking = Some(ask);
    }

    /// Asks the current speaker again after a rejected answer.
    fn retry(&mut self, rejection: Rejection, now: Millis) {
        let deadline = now.saturating_add(self.config.turn_timeout_ms);
        if let Some(ask) = self.asking.as_mut() {
            ask.retries += 1;
            ask.deadline = deadline;
            let effect = ask_effect(ask, Some(rejection));
            self.effects.push_back(effect);
        }
    }

    fn lose_turn(&mut self, member: String, reason: LostTurnReason, now: Millis) {
        debug!(group = %self.group_id, %member, ?reason, "turn lost");
        self.asking = None;
        self.turn += 1;
        self.last_speaker = member.clone();
        self.effects.push_back(Effect::TurnLost { member, reason });
        self.give_turn(now, None);
    }

    fn mark_down(&mut self, member: &str, reason_if_speaker: LostTurnReason, now: Millis) {
        info!(group = %self.group_id, %member, "member left the group chat");
        self.down.insert(member.to_owned());
        let msg = self.message(member, MessageType::MemberLeft, "left the group".into());
        self.publish(msg);
        let theirs: Vec<usize> = (0..self.tasks.len())
            .filter(|&i| {
                self.tasks[i].state == TaskState::Running && self.tasks[i].assignee == member
            })
            .collect();
        for &i in &theirs {
            self.finish_task(i, TaskState::Failed, "the assignee left the group".into());
        }
        self.queue.retain(|m| m != member);
        if let Some(w) = self.wait.as_mut() {
            if w.resume_with.as_deref() == Some(member) {
                w.resume_with = None;
            }
        }
        let live = self.live_members().count();
        if live == 1 && self.members.len() > 1 {
            self.ending = Some(ConclusionReason::MembersGone);
        }
        // Knowing whether the chat is ending: a task no pause waits on would be cancelled
        // by the conclusion at once, so it is not handed on then.
        for i in theirs {
            self.hand_on(i, now);
        }
        let was_speaker = self.asking.as_ref().is_some_and(|a| a.member == member);
        if was_speaker {
            // Concludes by itself if nobody is left.
            self.lose_turn(member.to_owned(), reason_if_speaker, now);
        } else if live == 0 {
            self.self_conclude(ConclusionReason::MembersGone);
        } else {
            self.after_tasks_changed(now);
        }
    }

    /// Resumes a pause whose tasks are all finished; leaves the async state when no async task
    /// runs any more.
    fn after_tasks_changed(&mut self, now: Millis) {
        let done = match &self.wait {
            Some(w) => w
                .tasks
                .iter()
                .all(|id| self.task(id).is_none_or(|t| t.state != TaskState::Running)),
            None => {
                if self.state == ChatState::AsyncTaskAssignment {
                    self.state = self.active_state();
                }
                return;
            }
        };
        if done {
            if let Some(w) = self.wait.take() {
                debug!(group = %self.group_id, "pause over");
                self.state = self.active_state();
                self.give_turn(now, w.resume_with);
            }
        }
    }

    fn pause(&mut self, tasks: Vec<TaskId>, resume_with: Option<String>, reason: PauseReason) {
        self.state = if reason == PauseReason::SyncAssignment {
            ChatState::SyncTaskAssignment
        } else {
            ChatState::PauseAndTrigger
        };
        debug!(group = %self.group_id, ?reason, waiting_on = ?tasks, "paused");
        self.effects.push_back(Effect::Paused {
            waiting_on: tasks.clone(),
            reason,
        });
        self.wait = Some(Wait {
            tasks,
            resume_with,
            reason,
        });
    }

    /// A pause the machine takes by itself before `member` speaks.
    fn auto_pause(&mut self, tasks: Vec<TaskId>, member: String, reason: PauseReason) {
        self.state = ChatState::PauseAndTrigger;
        let what = match reason {
            PauseReason::BeforeConclusion => "before concluding",
            _ => "before speaking",
        };
        let mut msg = self.message(
            &member,
            MessageType::AutoPause,
            format!("waiting for {} {what}", tasks.join(", ")),
        );
        msg.triggers = tasks.clone();
        self.publish(msg);
        self.pause(tasks, Some(member), reason);
    }

    fn self_conclude(&mut self, reason: ConclusionReason) {
        let mut text = match reason {
            ConclusionReason::TurnLimit => "The turn limit was reached before anyone concluded.",
            ConclusionReason::MembersGone => "Every member left before anyone concluded.",
            ConclusionReason::Decided => "The group concluded.",
        }
        .to_owned();
        for t in self.tasks.iter().filter(|t| t.state == TaskState::Done) {
            let result = t.result.as_deref().unwrap_or_default();
            text.push_str(&format!("\n- {} ({}): {result}", t.id, t.assignee));
        }
        self.conclude(text, None, reason);
    }

    fn conclude(&mut self, conclusion: String, by: Option<String>, reason: ConclusionReason) {
        info!(group = %self.group_id, ?reason, by = ?by, "group chat concluded");
        self.asking = None;
        self.wait = None;
        self.queue.clear();
        self.state = ChatState::Conclusion;
        let sender = by.clone().unwrap_or_else(|| self.initiator.clone());
        let msg = self.message(&sender, MessageType::Conclude, conclusion.clone());
        self.publish(msg);
        for t in self
            .tasks
            .iter_mut()
            .filter(|t| t.state == TaskState::Running)
        {
            t.state = TaskState::Cancelled;
            self.effects.push_back(Effect::CancelTask {
                task_id: t.id.clone(),
                assignee: t.assignee.clone(),
            });
        }
        self.conclusion = Some(conclusion.clone());
        self.effects.push_back(Effect::Concluded {
            conclusion,
            by,
            reason,
        });
    }

    fn finish_task(&mut self, idx: usize, outcome: TaskState, result: String) {
        let task = &mut self.tasks[idx];
        task.state = outcome;
        task.result = Some(result.clone());
        debug!(group = %self.group_id, task = %task.id, ?outcome, "task finished");
        let task = task.clone();
        let (content, conclusion) = if outcome == TaskState::Done {
            (result.clone(), Some(result))
        } else {
            (format!("task {} failed: {result}", task.id), None)
        };
        let mut msg = self.message(&task.assignee, MessageType::TaskReport, content);
        describe_task(&mut msg, &task);
        msg.task_conclusion = conclusion;
        self.publish(msg);
    }

    /// Announces `task` with `msg` (its task fields filled in), has it run, and keeps it.
    fn start_task(&mut self, task: Task, mut msg: Message) {
        describe_task(&mut msg, &task);
        self.publish(msg);
        self.effects.push_back(Effect::RunTask {
            task: task.clone(),
            sub_team_depth: self.sub_team_depth(),
        });
        self.tasks.push(task);
    }

    /// Hands the failed task `idx` to another live member (see
    /// [`ChatConfig::reassign_failed`]), unless it is a retry, was handed on already, or
    /// nobody else is live.
    fn hand_on(&mut self, idx: usize, now: Millis) {
        if !self.config.reassign_failed
            || self.config.moderated
            || self.conclusion.is_some()
            || self.retried.contains(&self.tasks[idx].id)
        {
            return;
        }
        let failed = self.tasks[idx].clone();
        // A pause for the speaker's own tasks ends when they end: it does not wait for
        // another member's retry. Other pauses (a sync assignment, a trigger, the wait
        // before concluding) wait for the retry as they waited for the task.
        let waited = self
            .wait
            .as_ref()
            .is_some_and(|w| w.reason != PauseReason::SpeakerBusy && w.tasks.contains(&failed.id));
        if !waited && self.forced_reason().is_some() {
            return;
        }
        let busy = |id: &str| {
            self.tasks
                .iter()
                .any(|t| t.state == TaskState::Running && t.assignee == id)
        };
        let start = self
            .members
            .iter()
            .position(|m| m.id == failed.assignee)
            .map_or(0, |p| p + 1);
        let n = self.members.len();
        let order: Vec<&MemberRef> = (0..n).map(|k| &self.members[(start + k) % n]).collect();
        let eligible = |m: &&&MemberRef| {
            m.id != failed.assignee && !self.down.contains(&m.id) && m.id != self.initiator
        };
        let Some(to) = order
            .iter()
            .filter(eligible)
            .find(|m| !busy(&m.id))
            .or_else(|| order.iter().find(eligible))
            .map(|m| m.id.clone())
            .or_else(|| {
                (failed.assignee != self.initiator && !self.down.contains(&self.initiator))
                    .then(|| self.initiator.clone())
            })
        else {
            return;
        };
        let task = Task {
            id: format!("t{}", self.next_task),
            assignee: to,
            assigner: self.initiator.clone(),
            deadline: now.saturating_add(self.config.task_timeout_ms),
            state: TaskState::Running,
            assigned_turn: self.turn,
            result: None,
            child_group: None,
            ..failed.clone()
        };
        self.next_task += 1;
        self.retried.insert(failed.id.clone());
        self.retried.insert(task.id.clone());
        info!(group = %self.group_id, failed = %failed.id, task = %task.id, to = %task.assignee, "failed task handed on");
        let msg_type = match task.mode {
            TaskMode::Sync => MessageType::AssignSync,
            TaskMode::Async => MessageType::AssignAsync,
        };
        let initiator = self.initiator.clone();
        let msg = self.message(
            &initiator,
            msg_type,
            format!("task {} failed; handed on as {}", failed.id, task.id),
        );
        if waited {
            if let Some(slot) = self
                .wait
                .as_mut()
                .and_then(|w| w.tasks.iter_mut().find(|t| **t == failed.id))
            {
                *slot = task.id.clone();
            }
        }
        self.start_task(task, msg);
    }

    // ---- helpers ----

    fn forced_reason(&self) -> Option<ConclusionReason> {
        self.ending
            .or_else(|| (self.turn + 1 >= self.max_turns).then_some(ConclusionReason::TurnLimit))
    }

    fn active_state(&self) -> ChatState {
        let async_running = self
            .tasks
            .iter()
            .any(|t| t.state == TaskState::Running && t.mode == TaskMode::Async);
        if async_running {
            ChatState::AsyncTaskAssignment
        } else {
            ChatState::Discussion
        }
    }

    fn running_ids(&self, keep: impl Fn(&Task) -> bool) -> Vec<TaskId> {
        self.tasks
            .iter()
            .filter(|t| t.state == TaskState::Running && keep(t))
            .map(|t| t.id.clone())
            .collect()
    }

    fn running_task_index(&self, from: &str, task_id: &str) -> Result<usize, ChatError> {
        let idx = self
            .tasks
            .iter()
            .position(|t| t.id == task_id)
            .ok_or_else(|| ChatError::UnknownTask(task_id.to_owned()))?;
        let task = &self.tasks[idx];
        if task.assignee != from {
            return Err(ChatError::NotAssignee {
                task_id: task.id.clone(),
                from: from.to_owned(),
            });
        }
        if task.state != TaskState::Running {
            return Err(ChatError::TaskNotRunning {
                task_id: task.id.clone(),
                state: task.state,
            });
        }
        Ok(idx)
    }

    /// Next speaker when the decision named none that is still valid: the queue first, then
    /// round robin after the previous speaker (see the module documentation).
    fn choose_next(&mut self) -> Option<String> {
        let live = self.live_members().count();
        while let Some(m) = self.queue.pop_front() {
            if self.is_live(&m) && (m != self.last_speaker || live == 1) {
                return Some(m);
            }
        }
        let n = self.members.len();
        let start = self
            .members
            .iter()
            .position(|m| m.id == self.last_speaker)
            .unwrap_or(n - 1);
        (1..=n)
            .map(|k| &self.members[(start + k) % n])
            .find(|m| !self.down.contains(&m.id) && (m.id != self.last_speaker || live == 1))
            .map(|m| m.id.clone())
    }

    fn valid_next_speakers(&self, from: &str, named: &[String]) -> Vec<String> {
        let alone = self.live_members().count() == 1;
        let mut out: Vec<String> = Vec::new();
        for m in named {
            if self.is_live(m) && (m != from || alone) && !out.contains(m) {
                out.push(m.clone());
            }
        }
        out
    }

    /// Cuts strings to the configured lengths and drops assignments and triggers that cannot
    /// be honoured.
    fn normalise(&self, d: Decision) -> Decision {
        let c = &self.config;
        let tasks = d
            .tasks
            .into_iter()
            .filter(|t| self.is_live(&t.assignee))
            .filter_map(|t| {
                let desc = clip(&t.task_desc, c.max_task_desc_chars);
                (!desc.is_empty()).then(|| TaskSpec {
                    assignee: t.assignee,
                    task_abstract: t
                        .task_abstract
                        .map(|a| clip(&a, c.max_abstract_chars))
                        .filter(|a| !a.is_empty()),
                    task_desc: desc,
                })
            })
            .take(c.max_tasks_per_decision)
            .collect();
        let mut triggers: Vec<TaskId> = Vec::new();
        for id in d.triggers {
            let running = self
                .task(&id)
                .is_some_and(|t| t.state == TaskState::Running);
            if running && !triggers.contains(&id) {
                triggers.push(id);
            }
        }
        Decision {
            msg_type: d.msg_type,
            content: clip(&d.content, c.max_content_chars),
            next_speakers: d.next_speakers,
            tasks,
            triggers,
        }
    }

    /// Why the decision would only repeat what was said, if it would.
    fn repetition(&self, d: &Decision) -> Option<Rejection> {
        let mut text = d.content.clone();
        for t in &d.tasks {
            text.push(' ');
            text.push_str(&t.task_desc);
        }
        let k = self.config.shingle_words;
        let mine = shingles(&text, k);
        if mine.is_empty() {
            return Some(Rejection::Empty);
        }
        if !self.config.repetition_guard {
            return None;
        }
        let mut best: Option<(u64, f64)> = None;
        for m in &self.messages {
            if matches!(m.msg_type, MessageType::AutoPause | MessageType::MemberLeft) {
                continue;
            }
            let mut earlier = m.content.clone();
            if let Some(desc) = &m.task_desc {
                earlier.push(' ');
                earlier.push_str(desc);
            }
            let s = jaccard(&mine, &shingles(&earlier, k));
            if best.is_none_or(|(_, b)| s > b) {
                best = Some((m.seq, s));
            }
        }
        best.filter(|&(_, s)| s >= self.config.repetition_threshold)
            .map(|(seq, similarity)| Rejection::Repeats { seq, similarity })
    }

    fn schema_for(&self, member: &str, allowed: &[DecisionType]) -> Value {
        let live: Vec<String> = self.live_members().map(|m| m.id.clone()).collect();
        let speakers: Vec<String> = if live.len() == 1 {
            live.clone()
        } else {
            live.iter().filter(|m| *m != member).cloned().collect()
        };
        let open = self.running_ids(|_| true);
        Decision::json_schema(&speakers, &live, allowed, &open, &self.config)
    }

    /// The sequence number of the next message: after the last one (a resumed log may
    /// have gaps where this node missed a message).
    fn next_seq(&self) -> u64 {
        self.messages.last().map_or(0, |m| m.seq + 1)
    }

    fn message(&self, sender: &str, msg_type: MessageType, content: String) -> Message {
        Message {
            group_id: self.group_id.clone(),
            seq: self.next_seq(),
            turn: self.turn,
            sender: sender.to_owned(),
            state: self.state,
            msg_type,
            content,
            next_speakers: Vec::new(),
            task_id: None,
            assignee: None,
            task_desc: None,
            task_abstract: None,
            task_conclusion: None,
            triggers: Vec::new(),
        }
    }

    fn publish(&mut self, mut msg: Message) {
        msg.seq = self.next_seq();
        msg.state = self.state;
        self.messages.push(msg.clone());
        self.effects.push_back(Effect::Broadcast(msg));
    }
}

fn ask_effect(ask: &Ask, retry: Option<Rejection>) -> Effect {
    Effect::AskSpeaker {
        member: ask.member.clone(),
        turn: ask.turn,
        allowed_types: ask.allowed.clone(),
        deadline: ask.deadline,
        retry,
        schema: ask.schema.clone(),
    }
}

/// Trims and cuts `s` to at most `max` characters.
fn clip(s: &str, max: usize) -> String {
    s.trim().chars().take(max).collect()
}

/// Similarity of two texts in `[0, 1]`: the Jaccard index of their sets of word shingles.
///
/// Texts are normalised first: lower-cased, every character that is not alphanumeric becomes a
/// word break. A shingle is `shingle_words` consecutive words (a text with fewer words is one
/// shingle). Two texts without words have similarity 0.
pub fn similarity(a: &str, b: &str, shingle_words: usize) -> f64 {
    jaccard(&shingles(a, shingle_words), &shingles(b, shingle_words))
}

fn shingles(text: &str, k: usize) -> HashSet<String> {
    let lower = text.to_lowercase();
    let words: Vec<&str> = lower
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let k = k.max(1);
    if words.is_empty() {
        HashSet::new()
    } else if words.len() < k {
        HashSet::from([words.join(" ")])
    } else {
        words.windows(k).map(|w| w.join(" ")).collect()
    }
}

fn jaccard(a: &HashSet<String>, b: &HashSet<String>) -> f64 {
    let union = a.union(b).count();
    if union == 0 {
        return 0.0;
    }
    a.intersection(b).count() as f64 / union as f64
}

/// Fills in the task fields of a message about `task` (its assignment or its report).
fn describe_task(msg: &mut Message, task: &Task) {
    msg.task_id = Some(task.id.clone());
    msg.assignee = Some(task.assignee.clone());
    msg.task_desc = Some(task.desc.clone());
    msg.task_abstract = task.task_abstract.clone();
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;
    use starling_models::constraint::{Constraint, ConstraintCompiler, TokenVocab};

    use super::*;

    const T0: Millis = 1_000;

    fn params(ids: &[&str], max_turns: u32) -> LaunchParams {
        LaunchParams {
            group_id: "g1".into(),
            goal: "Plan a weekend trip to Lyon".into(),
            members: ids
                .iter()
                .map(|id| MemberRef {
                    id: (*id).into(),
                    name: id.to_uppercase(),
                })
                .collect(),
            initiator: ids[0].into(),
            team_up_depth: 0,
            max_depth: 1,
            max_turns,
            config: ChatConfig::default(),
        }
    }

    fn launch(ids: &[&str], max_turns: u32) -> (GroupChat, Vec<Effect>) {
        launch_with(params(ids, max_turns))
    }

    /// Launches `p` at `T0` and drains the launch effects.
    fn launch_with(p: LaunchParams) -> (GroupChat, Vec<Effect>) {
        let mut chat = GroupChat::launch(p, T0).unwrap();
        let fx = drain(&mut chat);
        (chat, fx)
    }

    /// The effect of `member` losing its turn to the repetition guard.
    fn lost_to_repetition(member: &str) -> Effect {
        Effect::TurnLost {
            member: member.into(),
            reason: LostTurnReason::Repetition,
        }
    }

    fn drain(chat: &mut GroupChat) -> Vec<Effect> {
        std::iter::from_fn(|| chat.poll()).collect()
    }

    fn strs(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    fn decision(kind: DecisionType, content: &str, next: &[&str]) -> Decision {
        Decision {
            msg_type: kind,
            content: content.into(),
            next_speakers: strs(next),
            tasks: Vec::new(),
            triggers: Vec::new(),
        }
    }

    fn discuss(content: &str, next: &[&str]) -> Decision {
        decision(DecisionType::Discuss, content, next)
    }

    fn assign(
        kind: DecisionType,
        content: &str,
        tasks: &[(&str, &str)],
        next: &[&str],
    ) -> Decision {
        let mut d = decision(kind, content, next);
        d.tasks = tasks
            .iter()
            .map(|(who, desc)| TaskSpec {
                assignee: (*who).into(),
                task_abstract: Some(format!("task for {who}")),
                task_desc: (*desc).into(),
            })
            .collect();
        d
    }

    fn say(chat: &mut GroupChat, from: &str, d: Decision, now: Millis) -> Vec<Effect> {
        chat.handle(
            Input::Decision {
                from: from.into(),
                decision: d,
            },
            now,
        )
        .unwrap();
        drain(chat)
    }

    fn report(chat: &mut GroupChat, from: &str, task: &str, ok: bool, result: &str) -> Vec<Effect> {
        chat.handle(
            Input::TaskResult {
                from: from.into(),
                task_id: task.into(),
                ok,
                result: result.into(),
            },
            T0 + 10,
        )
        .unwrap();
        drain(chat)
    }

    #[test]
    fn moderated_chat_gives_every_turn_to_the_live_initiator() {
        let mut p = params(&["a", "b", "c"], 6);
        p.config.moderated = true;
        let (mut chat, fx) = launch_with(p);
        assert_eq!(asked(&fx), strs(&["a"]));
        // The initiator names b as next speaker: in a moderated chat it speaks again.
        let fx = say(
            &mut chat,
            "a",
            assign(
                DecisionType::AssignSync,
                "",
                &[("b", "find x"), ("c", "find y")],
                &["b"],
            ),
            T0 + 1,
        );
        assert!(
            asked(&fx).is_empty(),
            "nobody speaks during a sync assignment"
        );
        report(&mut chat, "b", "t1", true, "x");
        let fx = report(&mut chat, "c", "t2", true, "y");
        assert_eq!(asked(&fx), strs(&["a"]));
        let fx = say(&mut chat, "a", discuss("both found", &["c"]), T0 + 20);
        assert_eq!(asked(&fx), strs(&["a"]));
        // Without the initiator the ordinary policy applies again: the speaker it named.
        chat.handle(Input::MemberDown("a".into()), T0 + 30).unwrap();
        let fx = drain(&mut chat);
        assert_eq!(asked(&fx), strs(&["c"]));
    }

    /// Members asked in these effects, in order.
    fn asked(fx: &[Effect]) -> Vec<String> {
        fx.iter()
            .filter_map(|e| match e {
                Effect::AskSpeaker { member, .. } => Some(member.clone()),
                _ => None,
            })
            .collect()
    }

    fn allowed(fx: &[Effect]) -> Vec<DecisionType> {
        fx.iter()
            .find_map(|e| match e {
                Effect::AskSpeaker { allowed_types, .. } => Some(allowed_types.clone()),
                _ => None,
            })
            .unwrap()
    }

    fn broadcasts(fx: &[Effect]) -> Vec<&Message> {
        fx.iter()
            .filter_map(|e| match e {
                Effect::Broadcast(m) => Some(m),
                _ => None,
            })
            .collect()
    }

    fn concluded(fx: &[Effect]) -> Option<(String, Option<String>, ConclusionReason)> {
        fx.iter().find_map(|e| match e {
            Effect::Concluded {
                conclusion,
                by,
                reason,
            } => Some((conclusion.clone(), by.clone(), *reason)),
            _ => None,
        })
    }

    use DecisionType::{AssignAsync, AssignSync, Conclude, Discuss, Pause};

    #[test]
    fn launch_asks_the_initiator_first() {
        let (chat, fx) = launch(&["a", "b", "c"], 10);
        assert_eq!(fx.len(), 1);
        let Effect::AskSpeaker {
            member,
            turn,
            allowed_types,
            deadline,
            retry,
            schema,
        } = &fx[0]
        else {
            panic!("expected an ask, got {fx:?}");
        };
        assert_eq!(member, "a");
        assert_eq!(*turn, 1);
        // No task is running, so pausing is not offered.
        assert_eq!(allowed_types, &[Discuss, AssignSync, AssignAsync, Conclude]);
        assert_eq!(*deadline, T0 + ChatConfig::default().turn_timeout_ms);
        assert_eq!(retry, &None);
        assert_eq!(schema["anyOf"].as_array().unwrap().len(), 4);
        assert_eq!(chat.state(), ChatState::Discussion);
        assert_eq!(chat.current_speaker(), Some("a"));
        assert_eq!(chat.poll_timeout(), Some(*deadline));
        assert_eq!(chat.turn(), 0);
    }

    #[test]
    fn launch_refuses_bad_parameters() {
        let check = |f: &dyn Fn(&mut LaunchParams), want: LaunchError| {
            let mut p = params(&["a", "b"], 5);
            f(&mut p);
            assert_eq!(GroupChat::launch(p, T0).unwrap_err(), want);
        };
        check(&|p| p.group_id.clear(), LaunchError::EmptyGroupId);
        check(&|p| p.members.clear(), LaunchError::NoMembers);
        check(&|p| p.members[1].id.clear(), LaunchError::EmptyMemberId);
        check(
            &|p| p.members[1].id = "a".into(),
            LaunchError::DuplicateMember("a".into()),
        );
        check(
            &|p| p.initiator = "z".into(),
            LaunchError::InitiatorNotMember("z".into()),
        );
        check(&|p| p.max_turns = 0, LaunchError::ZeroTurns);
        check(
            &|p| p.team_up_depth = 2,
            LaunchError::DepthAboveMax {
                depth: 2,
                max_depth: 1,
            },
        );
        check(
            &|p| p.config.repetition_threshold = f64::NAN,
            LaunchError::InvalidConfig("repetition_threshold must be in (0, 1]"),
        );
        check(
            &|p| p.config.shingle_words = 0,
            LaunchError::InvalidConfig("shingle_words must be at least 1"),
        );
    }

    #[test]
    fn discussion_passes_to_the_named_speaker() {
        let (mut chat, _) = launch(&["a", "b", "c"], 10);
        let fx = say(
            &mut chat,
            "a",
            discuss("Let us pick a hotel first.", &["c"]),
            T0 + 5,
        );
        let msgs = broadcasts(&fx);
        assert_eq!(msgs.len(), 1);
        let m = msgs[0];
        assert_eq!(
            (m.seq, m.turn, m.sender.as_str(), m.msg_type, m.state),
            (0, 1, "a", MessageType::Discuss, ChatState::Discussion)
        );
        assert_eq!(m.content, "Let us pick a hotel first.");
        assert_eq!(m.next_speakers, strs(&["c"]));
        assert_eq!(m.group_id, "g1");
        assert_eq!(asked(&fx), strs(&["c"]));
        assert_eq!(chat.turn(), 1);
        assert_eq!(chat.messages(), std::slice::from_ref(m));
    }

    #[test]
    fn fallback_is_round_robin_after_the_sender_and_deterministic() {
        let script = |chat: &mut GroupChat| {
            let mut order = Vec::new();
            // No next speaker: after a comes b.
            order.extend(asked(&say(chat, "a", discuss("one two three", &[]), T0)));
            // Unknown member: after b comes c.
            order.extend(asked(&say(
                chat,
                "b",
                discuss("four five six", &["zz"]),
                T0,
            )));
            // Itself: not allowed, after c comes d.
            order.extend(asked(&say(
                chat,
                "c",
                discuss("seven eight nine", &["c"]),
                T0,
            )));
            // Wraps around to a.
            order.extend(asked(&say(
                chat,
                "d",
                discuss("ten eleven twelve", &[]),
                T0,
            )));
            order
        };
        let (mut one, _) = launch(&["a", "b", "c", "d"], 20);
        let (mut two, _) = launch(&["a", "b", "c", "d"], 20);
        assert_eq!(script(&mut one), strs(&["b", "c", "d", "a"]));
        script(&mut two);
        assert_eq!(one.messages(), two.messages());
        assert_eq!(format!("{one:?}"), format!("{two:?}"));

        // A member that went down is skipped.
        let (mut chat, _) = launch(&["a", "b", "c"], 20);
        chat.handle(Input::MemberDown("b".into()), T0).unwrap();
        drain(&mut chat);
        assert_eq!(
            asked(&say(&mut chat, "a", discuss("alpha beta", &["b"]), T0)),
            strs(&["c"])
        );

        // Alone, a member speaks again.
        let (mut solo, _) = launch(&["a"], 5);
        assert_eq!(
            asked(&say(&mut solo, "a", discuss("thinking aloud", &[]), T0)),
            strs(&["a"])
        );
    }

    #[test]
    fn named_speakers_are_queued_in_order() {
        let (mut chat, _) = launch(&["a", "b", "c", "d"], 20);
        assert_eq!(
            asked(&say(
                &mut chat,
                "a",
                discuss("c then b please", &["c", "b", "c"]),
                T0
            )),
            strs(&["c"])
        );
        // c names nobody: the queue goes on with b.
        assert_eq!(
            asked(&say(&mut chat, "c", discuss("my view on hotels", &[]), T0)),
            strs(&["b"])
        );
        // Queue empty: round robin after b.
        assert_eq!(
            asked(&say(&mut chat, "b", discuss("my view on trains", &[]), T0)),
            strs(&["c"])
        );
        // A new list replaces the queue.
        let _ = say(&mut chat, "c", discuss("d then a", &["d", "a"]), T0);
        assert_eq!(
            asked(&say(&mut chat, "d", discuss("then b instead", &["b"]), T0)),
            strs(&["b"])
        );
    }

    #[test]
    fn max_turns_allows_only_conclusion_on_the_last_turn() {
        let (mut chat, _) = launch(&["a", "b", "c"], 3);
        say(
            &mut chat,
            "a",
            discuss("first idea about the trip", &[]),
            T0,
        );
        let fx = say(
            &mut chat,
            "b",
            discuss("second idea about the trip", &[]),
            T0,
        );
        assert_eq!(asked(&fx), strs(&["c"]));
        assert_eq!(allowed(&fx), vec![Conclude]);
        let Effect::AskSpeaker { schema, turn, .. } = &fx[1] else {
            panic!("{fx:?}")
        };
        assert_eq!(*turn, 3);
        assert_eq!(schema["properties"]["type"]["enum"], json!(["conclude"]));
        assert!(schema.get("anyOf").is_none());
        // The speaker still discusses: it is turned into the conclusion.
        let fx = say(
            &mut chat,
            "c",
            discuss("We go by train on Friday.", &["a"]),
            T0,
        );
        assert_eq!(
            concluded(&fx),
            Some((
                "We go by train on Friday.".into(),
                Some("c".into()),
                ConclusionReason::TurnLimit
            ))
        );
        assert_eq!(chat.state(), ChatState::Conclusion);
        assert_eq!(chat.turn(), 3);
        assert_eq!(chat.conclusion(), Some("We go by train on Friday."));
        let last = chat.messages().last().unwrap();
        assert_eq!(
            (last.msg_type, last.state),
            (MessageType::Conclude, ChatState::Conclusion)
        );
        assert_eq!(chat.poll_timeout(), None);
        assert_eq!(chat.current_speaker(), None);

        // A single-turn chat asks for the conclusion straight away.
        let (_, fx) = launch(&["a", "b"], 1);
        assert_eq!(allowed(&fx), vec![Conclude]);
    }

    #[test]
    fn losing_the_last_turn_makes_the_machine_conclude() {
        let (mut chat, _) = launch(&["a", "b"], 2);
        say(&mut chat, "a", discuss("a plan", &[]), T0);
        let deadline = chat.poll_timeout().unwrap();
        chat.handle(Input::Tick, deadline).unwrap();
        let fx = drain(&mut chat);
        assert_eq!(
            fx[0],
            Effect::TurnLost {
                member: "b".into(),
                reason: LostTurnReason::Timeout
            }
        );
        let (text, by, reason) = concluded(&fx).unwrap();
        assert_eq!((by, reason), (None, ConclusionReason::TurnLimit));
        assert!(text.contains("turn limit"), "{text}");
        assert_eq!(chat.turn(), 2);
        // Sent in the initiator's name.
        assert_eq!(chat.messages().last().unwrap().sender, "a");
    }

    #[test]
    fn a_failed_answer_is_a_missed_turn_and_never_evicts_the_host() {
        // Default config: down after 2 missed turns in a row.
        let (mut chat, _) = launch(&["a", "b", "c"], 20);
        let no_answer = |from: &str| Input::NoAnswer {
            from: from.into(),
            reason: "connection lost".into(),
        };
        // Only the member being asked can fail to answer.
        assert!(matches!(
            chat.handle(no_answer("b"), T0),
            Err(ChatError::NotSpeaker { .. })
        ));
        let fx = say(&mut chat, "a", discuss("over to b", &["b"]), T0);
        assert_eq!(asked(&fx), strs(&["b"]));
        chat.handle(no_answer("b"), T0 + 1).unwrap();
        let fx = drain(&mut chat);
        assert!(fx.contains(&Effect::TurnLost {
            member: "b".into(),
            reason: LostTurnReason::NoAnswer,
        }));
        assert!(chat.is_live("b"), "one failed answer is not a departure");
        // The second in a row: b is treated as down.
        let speaker = asked(&fx).pop().unwrap();
        say(&mut chat, &speaker, discuss("b again", &["b"]), T0 + 2);
        chat.handle(no_answer("b"), T0 + 3).unwrap();
        assert!(!chat.is_live("b"));
        // The initiator's own failed answers cost it turns, never its place.
        let (mut chat, _) = launch(&["a", "b"], 20);
        for k in 0..4 {
            let fx = drain(&mut chat);
            let now = T0 + 10 * k;
            match asked(&fx).pop().as_deref() {
                Some("a") | None => chat.handle(no_answer("a"), now).unwrap(),
                Some(other) => {
                    say(&mut chat, other, discuss("your turn", &["a"]), now);
                    chat.handle(no_answer("a"), now + 1).unwrap();
                }
            }
            assert!(chat.is_live("a"), "the host was marked down");
        }
    }

    #[test]
    fn a_recruit_takes_over_a_failed_task() {
        // Moderated, as a grounded inquiry's group is: the host speaks after each report.
        let mut p = params(&["a", "b"], 10);
        p.config.moderated = true;
        let (mut chat, _) = launch_with(p);
        let run_for = |fx: &[Effect]| -> Vec<String> {
            fx.iter()
                .filter_map(|e| match e {
                    Effect::RunTask { task, .. } => Some(task.assignee.clone()),
                    _ => None,
                })
                .collect()
        };
        let fx = say(
            &mut chat,
            "a",
            assign(AssignSync, "Find the fact.", &[("b", "find the fact")], &[]),
            T0,
        );
        assert_eq!(run_for(&fx), strs(&["b"]));
        chat.handle(
            Input::TaskResult {
                from: "b".into(),
                task_id: "t1".into(),
                ok: false,
                result: "unreachable".into(),
            },
            T0 + 1,
        )
        .unwrap();
        let fx = drain(&mut chat);
        assert_eq!(asked(&fx), strs(&["a"]));
        // Before it joins, c cannot be given a task.
        assert!(!chat.is_live("c"));
        let c = MemberRef {
            id: "c".into(),
            name: "c".into(),
        };
        chat.handle(Input::Recruit(c.clone()), T0 + 2).unwrap();
        assert!(chat.is_live("c"));
        assert_eq!(
            chat.handle(Input::Recruit(c), T0 + 2),
            Err(ChatError::AlreadyMember("c".into()))
        );
        let fx = say(
            &mut chat,
            "a",
            assign(AssignSync, "Ask c instead.", &[("c", "find the fact")], &[]),
            T0 + 3,
        );
        assert_eq!(run_for(&fx), strs(&["c"]));
    }

    #[test]
    fn sync_assignment_pauses_until_every_assignee_reports() {
        let (mut chat, _) = launch(&["a", "b", "c"], 10);
        let fx = say(
            &mut chat,
            "a",
            assign(
                AssignSync,
                "Split the research.",
                &[("b", "find hotels"), ("c", "find trains")],
                &["b"],
            ),
            T0,
        );
        let msgs = broadcasts(&fx);
        assert_eq!(msgs.len(), 2);
        assert_eq!(msgs[0].task_id.as_deref(), Some("t1"));
        assert_eq!(msgs[0].assignee.as_deref(), Some("b"));
        assert_eq!(msgs[0].task_desc.as_deref(), Some("find hotels"));
        assert_eq!(msgs[1].task_id.as_deref(), Some("t2"));
        assert!(msgs.iter().all(|m| m.msg_type == MessageType::AssignSync
            && m.state == ChatState::SyncTaskAssignment
            && m.content == "Split the research."));
        let runs: Vec<&Task> = fx
            .iter()
            .filter_map(|e| match e {
                Effect::RunTask { task, .. } => Some(task),
                _ => None,
            })
            .collect();
        assert_eq!(runs.len(), 2);
        assert_eq!(
            (runs[1].assignee.as_str(), runs[1].mode),
            ("c", TaskMode::Sync)
        );
        assert_eq!(
            fx.last(),
            Some(&Effect::Paused {
                waiting_on: strs(&["t1", "t2"]),
                reason: PauseReason::SyncAssignment
            })
        );
        assert!(asked(&fx).is_empty());
        assert_eq!(chat.state(), ChatState::SyncTaskAssignment);
        assert_eq!(chat.current_speaker(), None);
        assert_eq!(chat.waiting_on(), Some(&strs(&["t1", "t2"])[..]));
        assert_eq!(
            chat.poll_timeout(),
            Some(T0 + ChatConfig::default().task_timeout_ms)
        );

        // Nobody may speak while waiting.
        let err = chat
            .handle(
                Input::Decision {
                    from: "b".into(),
                    decision: discuss("can I talk?", &[]),
                },
                T0,
            )
            .unwrap_err();
        assert_eq!(
            err,
            ChatError::NotSpeaker {
                from: "b".into(),
                expected: None
            }
        );

        let fx = report(&mut chat, "b", "t1", true, "Hotel Bellecour, 90 EUR");
        let msgs = broadcasts(&fx);
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].msg_type, MessageType::TaskReport);
        assert_eq!(msgs[0].sender, "b");
        assert_eq!(
            msgs[0].task_conclusion.as_deref(),
            Some("Hotel Bellecour, 90 EUR")
        );
        assert!(asked(&fx).is_empty());
        assert_eq!(chat.state(), ChatState::SyncTaskAssignment);

        let fx = report(&mut chat, "c", "t2", true, "TGV at 8:04");
        assert_eq!(asked(&fx), strs(&["b"]));
        assert_eq!(chat.state(), ChatState::Discussion);
        assert_eq!(chat.waiting_on(), None);
        assert!(chat.tasks().iter().all(|t| t.state == TaskState::Done));
        assert_eq!(
            chat.task("t2").unwrap().result.as_deref(),
            Some("TGV at 8:04")
        );
        assert_eq!(chat.turn(), 1);
    }

    #[test]
    fn async_assignment_lets_the_discussion_go_on() {
        let (mut chat, _) = launch(&["a", "b", "c"], 10);
        let fx = say(
            &mut chat,
            "a",
            assign(
                AssignAsync,
                "c, look up trains meanwhile.",
                &[("c", "find trains")],
                &["b"],
            ),
            T0,
        );
        assert!(fx.iter().any(|e| matches!(e, Effect::RunTask { .. })));
        assert_eq!(asked(&fx), strs(&["b"]));
        assert_eq!(chat.state(), ChatState::AsyncTaskAssignment);
        // A task is running: pausing is now offered.
        assert_eq!(
            allowed(&fx),
            vec![Discuss, AssignSync, AssignAsync, Pause, Conclude]
        );

        let fx = say(
            &mut chat,
            "b",
            discuss("Hotels near Bellecour look good.", &["a"]),
            T0,
        );
        assert_eq!(asked(&fx), strs(&["a"]));
        assert_eq!(broadcasts(&fx)[0].state, ChatState::AsyncTaskAssignment);

        // The report arrives while a is asked: no new ask, the state returns to discussion.
        let fx = report(&mut chat, "c", "t1", true, "TGV at 8:04");
        assert!(asked(&fx).is_empty());
        assert_eq!(chat.state(), ChatState::Discussion);
        assert_eq!(chat.current_speaker(), Some("a"));
    }

    #[test]
    fn pause_waits_for_its_triggers_then_the_pauser_speaks() {
        let (mut chat, _) = launch(&["a", "b", "c"], 10);
        say(
            &mut chat,
            "a",
            assign(
                AssignAsync,
                "c, look up trains.",
                &[("c", "find trains")],
                &["b"],
            ),
            T0,
        );
        let mut d = decision(Pause, "Let us wait for the trains.", &[]);
        d.triggers = strs(&["t1", "t9"]);
        let fx = say(&mut chat, "b", d, T0);
        let msgs = broadcasts(&fx);
        assert_eq!(msgs[0].msg_type, MessageType::Pause);
        // The unknown trigger is dropped.
        assert_eq!(msgs[0].triggers, strs(&["t1"]));
        assert_eq!(
            fx.last(),
            Some(&Effect::Paused {
                waiting_on: strs(&["t1"]),
                reason: PauseReason::Trigger
            })
        );
        assert_eq!(chat.state(), ChatState::PauseAndTrigger);
        assert_eq!(chat.turn(), 2);
        let fx = report(&mut chat, "c", "t1", true, "TGV at 8:04");
        assert_eq!(asked(&fx), strs(&["b"]));
        assert_eq!(chat.state(), ChatState::Discussion);

        // With nothing running, pause is not offered and a pause becomes discussion.
        let fx = say(
            &mut chat,
            "b",
            decision(Pause, "waiting for nothing at all", &["a"]),
            T0,
        );
        assert_eq!(broadcasts(&fx)[0].msg_type, MessageType::Discuss);
        assert_eq!(asked(&fx), strs(&["a"]));
    }

    #[test]
    fn concluding_with_unfinished_tasks_pauses_first() {
        let (mut chat, _) = launch(&["a", "b", "c"], 10);
        say(
            &mut chat,
            "a",
            assign(
                AssignAsync,
                "c, look up trains.",
                &[("c", "find trains")],
                &["b"],
            ),
            T0,
        );
        let fx = say(&mut chat, "b", decision(Conclude, "We are done.", &[]), T0);
        let msgs = broadcasts(&fx);
        assert_eq!(msgs.len(), 1);
        assert_eq!(
            (msgs[0].msg_type, msgs[0].sender.as_str()),
            (MessageType::AutoPause, "b")
        );
        assert_eq!(msgs[0].triggers, strs(&["t1"]));
        assert_eq!(
            fx.last(),
            Some(&Effect::Paused {
                waiting_on: strs(&["t1"]),
                reason: PauseReason::BeforeConclusion
            })
        );
        // Not a turn: the conclusion was not accepted.
        assert_eq!(chat.turn(), 1);
        assert!(concluded(&fx).is_none());
        let fx = report(&mut chat, "c", "t1", true, "TGV at 8:04");
        let Some(Effect::AskSpeaker { member, turn, .. }) =
            fx.iter().find(|e| matches!(e, Effect::AskSpeaker { .. }))
        else {
            panic!("{fx:?}")
        };
        assert_eq!((member.as_str(), *turn), ("b", 2));
        let fx = say(
            &mut chat,
            "b",
            decision(Conclude, "Train at 8:04, hotel booked.", &[]),
            T0,
        );
        assert_eq!(
            concluded(&fx),
            Some((
                "Train at 8:04, hotel booked.".into(),
                Some("b".into()),
                ConclusionReason::Decided
            ))
        );
    }

    #[test]
    fn a_busy_next_speaker_makes_the_chat_pause() {
        let (mut chat, _) = launch(&["a", "b", "c"], 10);
        let fx = say(
            &mut chat,
            "a",
            assign(
                AssignAsync,
                "b, find hotels and tell us.",
                &[("b", "find hotels")],
                &["b"],
            ),
            T0,
        );
        assert!(asked(&fx).is_empty());
        let auto = broadcasts(&fx)
            .into_iter()
            .find(|m| m.msg_type == MessageType::AutoPause)
            .unwrap();
        assert_eq!(auto.sender, "b");
        assert_eq!(
            fx.last(),
            Some(&Effect::Paused {
                waiting_on: strs(&["t1"]),
                reason: PauseReason::SpeakerBusy
            })
        );
        assert_eq!(chat.state(), ChatState::PauseAndTrigger);
        let fx = report(&mut chat, "b", "t1", true, "Hotel Bellecour");
        assert_eq!(asked(&fx), strs(&["b"]));
    }

    #[test]
    fn repetition_is_rejected_once_then_the_turn_is_lost() {
        let mut p = params(&["a", "b", "c"], 10);
        p.config.repetition_retries = 1;
        let (mut chat, _) = launch_with(p);
        say(
            &mut chat,
            "a",
            discuss(
                "We should take the train to Lyon on Friday morning.",
                &["b"],
            ),
            T0,
        );
        let fx = say(
            &mut chat,
            "b",
            discuss("we should TAKE the train to Lyon, on Friday morning!", &[]),
            T0 + 50,
        );
        assert_eq!(
            fx,
            vec![Effect::AskSpeaker {
                member: "b".into(),
                turn: 2,
                allowed_types: vec![Discuss, AssignSync, AssignAsync, Conclude],
                deadline: T0 + 50 + ChatConfig::default().turn_timeout_ms,
                retry: Some(Rejection::Repeats {
                    seq: 0,
                    similarity: 1.0
                }),
                schema: chat.asking.as_ref().unwrap().schema.clone(),
            }]
        );
        assert_eq!(chat.turn(), 1);
        assert_eq!(chat.messages().len(), 1);
        let fx = say(
            &mut chat,
            "b",
            discuss("We should take the train to Lyon on Friday morning", &[]),
            T0,
        );
        assert_eq!(fx[0], lost_to_repetition("b"));
        assert_eq!(asked(&fx), strs(&["c"]));
        assert_eq!(chat.turn(), 2);
        assert_eq!(chat.messages().len(), 1);

        // A retry that says something new is accepted.
        let fx = say(&mut chat, "c", discuss("   ...  ", &[]), T0);
        let Effect::AskSpeaker { retry, .. } = &fx[0] else {
            panic!("{fx:?}")
        };
        assert_eq!(retry, &Some(Rejection::Empty));
        let fx = say(
            &mut chat,
            "c",
            discuss("The bus is cheaper but takes six hours.", &[]),
            T0,
        );
        assert_eq!(broadcasts(&fx).len(), 1);
        assert_eq!(chat.turn(), 3);
    }

    #[test]
    fn by_default_a_repetition_loses_the_turn_at_once_and_the_guard_can_be_off() {
        let line = "We should take the train to Lyon on Friday morning.";
        let (mut chat, _) = launch(&["a", "b", "c"], 10);
        say(&mut chat, "a", discuss(line, &["b"]), T0);
        let fx = say(&mut chat, "b", discuss(line, &[]), T0);
        assert_eq!(fx[0], lost_to_repetition("b"));
        assert_eq!(asked(&fx), strs(&["c"]));
        assert_eq!((chat.turn(), chat.messages().len()), (2, 1));

        let mut p = params(&["a", "b", "c"], 10);
        p.config.repetition_guard = false;
        let (mut chat, _) = launch_with(p);
        say(&mut chat, "a", discuss(line, &["b"]), T0);
        let fx = say(&mut chat, "b", discuss(line, &["c"]), T0);
        assert_eq!(broadcasts(&fx).len(), 1, "{fx:?}");
        // An empty turn is still refused: it is not a message at all.
        let fx = say(&mut chat, "c", discuss(" ... ", &[]), T0);
        assert_eq!(fx[0], lost_to_repetition("c"));
    }

    /// a assigns t1 (hotels) to b and t2 (trains) to c.
    fn split_hotels_and_trains(chat: &mut GroupChat) {
        say(
            chat,
            "a",
            assign(
                DecisionType::AssignSync,
                "split",
                &[("b", "hotels"), ("c", "trains")],
                &[],
            ),
            T0,
        );
    }

    /// The allowed types and schema of the one `AskSpeaker` in `fx`.
    fn ask_of(fx: &[Effect]) -> (String, Vec<DecisionType>, Value) {
        let asks: Vec<_> = fx
            .iter()
            .filter_map(|e| match e {
                Effect::AskSpeaker {
                    member,
                    allowed_types,
                    schema,
                    ..
                } => Some((member.clone(), allowed_types.clone(), schema.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(asks.len(), 1, "{fx:?}");
        asks.into_iter().next().unwrap()
    }

    #[test]
    fn an_opening_assignment_gives_each_other_member_one_task_first() {
        let mut p = params(&["a", "b", "c"], 6);
        p.config.opening_assignment = true;
        let (mut chat, fx) = launch_with(p);
        let (member, allowed, schema) = ask_of(&fx);
        assert_eq!(member, "a");
        assert_eq!(allowed, vec![DecisionType::AssignSync]);
        assert_eq!(
            schema,
            opening_schema(&["b".into(), "c".into()], chat.config())
        );
        assert_eq!(schema["properties"]["tasks"]["minItems"], 2);
        // Only the first turn: the next one is free.
        split_hotels_and_trains(&mut chat);
        report(&mut chat, "b", "t1", true, "b done");
        let fx = report(&mut chat, "c", "t2", true, "c done");
        let (_, allowed, _) = ask_of(&fx);
        assert!(allowed.contains(&DecisionType::Discuss), "{allowed:?}");
        // Without the option the first turn is free too, and a group of one has nobody
        // to assign to.
        let (_, fx) = launch(&["a", "b"], 6);
        assert!(ask_of(&fx).1.contains(&DecisionType::Discuss));
        let mut alone = params(&["a"], 6);
        alone.config.opening_assignment = true;
        let (_, fx) = launch_with(alone);
        assert!(ask_of(&fx).1.contains(&DecisionType::Conclude));
    }

    #[test]
    fn with_one_turn_the_opening_assignment_is_kept_and_its_results_conclude() {
        let mut p = params(&["a", "b"], 1);
        p.config.opening_assignment = true;
        let (mut chat, fx) = launch_with(p);
        assert_eq!(ask_of(&fx).1, vec![DecisionType::AssignSync]);
        say(
            &mut chat,
            "a",
            assign(DecisionType::AssignSync, "split", &[("b", "hotels")], &[]),
            T0,
        );
        assert_eq!(chat.task("t1").unwrap().state, TaskState::Running);
        report(&mut chat, "b", "t1", true, "Hotel Lumiere");
        assert_eq!(chat.state(), ChatState::Conclusion);
        assert!(
            chat.conclusion().unwrap().contains("Hotel Lumiere"),
            "{:?}",
            chat.conclusion()
        );
    }

    #[test]
    fn the_successor_is_the_first_live_member_after_the_host() {
        let p = params(&["a", "b", "c", "d"], 4);
        let ids = |m: Option<&MemberRef>| m.map(|m| m.id.clone());
        assert_eq!(ids(successor(&p.members, "a", |_| true)), Some("b".into()));
        assert_eq!(
            ids(successor(&p.members, "a", |id| id != "b")),
            Some("c".into())
        );
        // The host is never its own successor, wherever it stands in the list.
        assert_eq!(ids(successor(&p.members, "c", |_| true)), Some("a".into()));
        assert_eq!(ids(successor(&p.members, "a", |id| id == "a")), None);
    }

    #[test]
    fn a_resumed_chat_goes_on_after_the_recorded_log() {
        // a hosts and assigns t1 to b and t2 to c; a is lost after b's report.
        let (mut chat, _) = launch(&["a", "b", "c"], 6);
        split_hotels_and_trains(&mut chat);
        report(&mut chat, "b", "t1", true, "Hotel Lumiere");
        // What b recorded, t1's assignment missed.
        let mut log: Vec<Message> = chat.messages().to_vec();
        assert_eq!(log[0].task_id.as_deref(), Some("t1"), "{log:?}");
        assert_eq!(log[1].task_id.as_deref(), Some("t2"), "{log:?}");
        log.remove(0);
        let last = log.last().unwrap().seq;
        // b resumes with c.
        let mut p = params(&["b", "c"], 6);
        p.members[0].name = "B".into();
        let mut foreign = log[0].clone();
        foreign.group_id = "another".into();
        foreign.seq = last + 5;
        foreign.task_id = Some("t9".into());
        let mut recorded = log.clone();
        recorded.push(foreign);
        let mut resumed = GroupChat::resume(p, recorded, "a", T0 + 20).unwrap();
        let fx = drain(&mut resumed);
        let msgs = broadcasts(&fx);
        assert_eq!(msgs[0].msg_type, MessageType::MemberLeft);
        assert_eq!(msgs[0].sender, "a");
        assert_eq!(msgs[0].seq, last + 1);
        assert_eq!(asked(&fx), vec!["b".to_string()]);
        // The other group's message is not part of the log; the rest is, in order, and
        // the handover after it.
        assert_eq!(resumed.messages().len(), log.len() + 1);
        assert!(resumed.messages().windows(2).all(|w| w[0].seq < w[1].seq));
        // New tasks are numbered after the old ones.
        say(
            &mut resumed,
            "b",
            assign(DecisionType::AssignSync, "again", &[("c", "trains")], &[]),
            T0 + 21,
        );
        assert!(resumed.task("t3").is_some(), "{:?}", resumed.tasks());
        assert_eq!(resumed.task("t3").unwrap().assignee, "c");
    }

    #[test]
    fn similarity_is_jaccard_of_word_shingles() {
        assert_eq!(similarity("Hello, World!", "hello world", 2), 1.0);
        assert_eq!(similarity("alpha beta gamma", "delta epsilon zeta", 2), 0.0);
        assert_eq!(similarity("", "", 2), 0.0);
        assert_eq!(similarity("short", "short", 3), 1.0);
        // Ten words, the fifth changed: 9 bigrams each, 7 shared, 11 in all.
        let a = "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10";
        let b = "w1 w2 w3 w4 xx w6 w7 w8 w9 w10";
        assert!((similarity(a, b, 2) - 7.0 / 11.0).abs() < 1e-12);
        // Containing the earlier text plus as much new text halves the similarity.
        let c = format!("{a} n1 n2 n3 n4 n5 n6 n7 n8 n9 n10");
        assert!((similarity(a, &c, 1) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn repetition_threshold_is_configurable() {
        let mut p = params(&["a", "b"], 10);
        p.config.repetition_threshold = 0.5;
        p.config.repetition_retries = 1;
        let (mut chat, _) = launch_with(p);
        say(
            &mut chat,
            "a",
            discuss("w1 w2 w3 w4 w5 w6 w7 w8 w9 w10", &[]),
            T0,
        );
        // 7/11 >= 0.5: rejected here, accepted with the default 0.75.
        let fx = say(
            &mut chat,
            "b",
            discuss("w1 w2 w3 w4 xx w6 w7 w8 w9 w10", &[]),
            T0,
        );
        assert!(matches!(
            &fx[0],
            Effect::AskSpeaker {
                retry: Some(Rejection::Repeats { .. }),
                ..
            }
        ));
        let (mut chat, _) = launch(&["a", "b"], 10);
        say(
            &mut chat,
            "a",
            discuss("w1 w2 w3 w4 w5 w6 w7 w8 w9 w10", &[]),
            T0,
        );
        let fx = say(
            &mut chat,
            "b",
            discuss("w1 w2 w3 w4 xx w6 w7 w8 w9 w10", &[]),
            T0,
        );
        assert_eq!(broadcasts(&fx).len(), 1);
    }

    #[test]
    fn a_member_going_down_mid_task_fails_its_task_and_another_member_takes_it() {
        let (mut chat, _) = launch(&["a", "b", "c"], 10);
        say(
            &mut chat,
            "a",
            assign(
                AssignSync,
                "Both of you, research.",
                &[("b", "hotels"), ("c", "trains")],
                &["c"],
            ),
            T0,
        );
        chat.handle(Input::MemberDown("b".into()), T0 + 1).unwrap();
        let fx = drain(&mut chat);
        let msgs = broadcasts(&fx);
        assert_eq!(msgs[0].msg_type, MessageType::MemberLeft);
        assert_eq!(msgs[1].msg_type, MessageType::TaskReport);
        assert_eq!(msgs[1].task_id.as_deref(), Some("t1"));
        assert_eq!(msgs[1].task_conclusion, None);
        assert_eq!(chat.task("t1").unwrap().state, TaskState::Failed);
        // b's task goes to c, the only other live member besides the host (busy with its
        // own, but nobody else is free), as t3; the pause waits for both.
        assert_eq!(msgs[2].msg_type, MessageType::AssignSync);
        assert_eq!(msgs[2].task_id.as_deref(), Some("t3"));
        let t3 = chat.task("t3").unwrap();
        assert_eq!((t3.assignee.as_str(), t3.desc.as_str()), ("c", "hotels"));
        assert!(fx
            .iter()
            .any(|e| matches!(e, Effect::RunTask { task, .. } if task.id == "t3")));
        assert!(asked(&fx).is_empty());
        assert_eq!(chat.state(), ChatState::SyncTaskAssignment);
        assert!(!chat.is_live("b"));
        assert_eq!(chat.live_members().count(), 2);
        // A late report from b is refused.
        let err = chat
            .handle(
                Input::TaskResult {
                    from: "b".into(),
                    task_id: "t1".into(),
                    ok: true,
                    result: "late".into(),
                },
                T0,
            )
            .unwrap_err();
        assert_eq!(
            err,
            ChatError::TaskNotRunning {
                task_id: "t1".into(),
                state: TaskState::Failed
            }
        );
        let fx = report(&mut chat, "c", "t2", true, "TGV at 8:04");
        assert!(
            asked(&fx).is_empty(),
            "the pause ended before the handed-on task"
        );
        let fx = report(&mut chat, "c", "t3", true, "Hotel Lyon");
        assert_eq!(asked(&fx), strs(&["c"]));
        // Going down twice changes nothing.
        chat.handle(Input::MemberDown("b".into()), T0).unwrap();
        assert!(drain(&mut chat).is_empty());
    }

    #[test]
    fn the_speaker_going_down_loses_its_turn() {
        let (mut chat, _) = launch(&["a", "b", "c"], 10);
        say(&mut chat, "a", discuss("b, what do you think?", &["b"]), T0);
        chat.handle(Input::MemberDown("b".into()), T0).unwrap();
        let fx = drain(&mut chat);
        assert_eq!(
            fx[1],
            Effect::TurnLost {
                member: "b".into(),
                reason: LostTurnReason::MemberDown
            }
        );
        assert_eq!(asked(&fx), strs(&["c"]));
        assert_eq!(chat.turn(), 2);
        // b's late decision is refused.
        let err = chat
            .handle(
                Input::Decision {
                    from: "b".into(),
                    decision: discuss("I am back", &[]),
                },
                T0,
            )
            .unwrap_err();
        assert!(matches!(err, ChatError::NotSpeaker { .. }));
    }

    #[test]
    fn when_everyone_else_is_gone_the_initiator_concludes() {
        let (mut chat, _) = launch(&["a", "b", "c"], 10);
        say(&mut chat, "a", discuss("b, what do you think?", &["b"]), T0);
        chat.handle(Input::MemberDown("c".into()), T0).unwrap();
        drain(&mut chat);
        chat.handle(Input::MemberDown("b".into()), T0).unwrap();
        let fx = drain(&mut chat);
        assert_eq!(asked(&fx), strs(&["a"]));
        assert_eq!(allowed(&fx), vec![Conclude]);
        let fx = say(
            &mut chat,
            "a",
            discuss("Going alone: train on Friday.", &[]),
            T0,
        );
        assert_eq!(
            concluded(&fx),
            Some((
                "Going alone: train on Friday.".into(),
                Some("a".into()),
                ConclusionReason::MembersGone
            ))
        );

        // Nobody left at all: the machine concludes.
        let (mut chat, _) = launch(&["a", "b"], 10);
        chat.handle(Input::MemberDown("b".into()), T0).unwrap();
        chat.handle(Input::MemberDown("a".into()), T0).unwrap();
        let fx = drain(&mut chat);
        let (_, by, reason) = concluded(&fx).unwrap();
        assert_eq!((by, reason), (None, ConclusionReason::MembersGone));
        assert_eq!(chat.state(), ChatState::Conclusion);
    }

    #[test]
    fn a_speaker_that_does_not_answer_in_time_loses_its_turn() {
        let (mut chat, _) = launch(&["a", "b", "c"], 10);
        let deadline = chat.poll_timeout().unwrap();
        chat.handle(Input::Tick, deadline - 1).unwrap();
        assert!(drain(&mut chat).is_empty());
        chat.handle(Input::Tick, deadline).unwrap();
        let fx = drain(&mut chat);
        assert_eq!(
            fx[0],
            Effect::TurnLost {
                member: "a".into(),
                reason: LostTurnReason::Timeout
            }
        );
        assert_eq!(asked(&fx), strs(&["b"]));
        assert_eq!(chat.turn(), 1);
        assert_eq!(
            chat.poll_timeout(),
            Some(deadline + ChatConfig::default().turn_timeout_ms)
        );
        // a, the initiator (the host), misses a second turn in a row: it loses the turn,
        // never its group.
        say(
            &mut chat,
            "b",
            discuss("a, your opinion?", &["a"]),
            deadline,
        );
        let deadline = chat.poll_timeout().unwrap();
        chat.handle(Input::Tick, deadline + 5).unwrap();
        let fx = drain(&mut chat);
        assert!(broadcasts(&fx).is_empty());
        assert!(fx.contains(&Effect::TurnLost {
            member: "a".into(),
            reason: LostTurnReason::Timeout
        }));
        assert!(chat.is_live("a"));
        // c misses two turns in a row: treated as down (max_missed_turns = 2).
        let (mut next, mut now, mut fx) = (asked(&fx).pop().unwrap(), deadline + 5, fx);
        // (Different words each time: a repeated message would be rejected.)
        for ask in ["c, your opinion?", "What does c make of the plan?"] {
            say(&mut chat, &next, discuss(ask, &["c"]), now);
            now = chat.poll_timeout().unwrap();
            chat.handle(Input::Tick, now).unwrap();
            fx = drain(&mut chat);
            next = asked(&fx).pop().unwrap();
        }
        assert_eq!(broadcasts(&fx)[0].msg_type, MessageType::MemberLeft);
        assert!(fx.contains(&Effect::TurnLost {
            member: "c".into(),
            reason: LostTurnReason::Timeout
        }));
        assert!(!chat.is_live("c"));
        // Two members left, a and b: neither is alone, so the discussion goes on normally.
        assert_eq!(
            allowed(&fx),
            vec![Discuss, AssignSync, AssignAsync, Conclude]
        );
    }

    #[test]
    fn a_sub_team_is_no_deeper_than_its_root_allows() {
        let mut p = params(&["a", "b"], 10);
        p.team_up_depth = 1;
        p.max_depth = 3;
        // The root allowed one level: the sub-team at depth 1 may form no other.
        let sub = p.clone().within(1);
        assert_eq!(sub.max_depth, 1);
        assert_eq!(GroupChat::launch(sub, T0).unwrap().sub_team_depth(), None);
        // The root allows more than the sub-team's host does: the host's bound holds.
        assert_eq!(p.clone().within(5).max_depth, 3);
        // Never below the sub-team's own depth (its launch would be invalid).
        assert_eq!(p.within(0).max_depth, 1);
    }

    #[test]
    fn a_task_without_result_before_its_deadline_fails_and_is_handed_on_once() {
        let (mut chat, _) = launch(&["a", "b", "c"], 10);
        say(
            &mut chat,
            "a",
            assign(AssignSync, "b, hotels please.", &[("b", "hotels")], &[]),
            T0,
        );
        let deadline = chat.poll_timeout().unwrap();
        assert_eq!(deadline, T0 + ChatConfig::default().task_timeout_ms);
        chat.handle(Input::Tick, deadline).unwrap();
        let fx = drain(&mut chat);
        assert_eq!(broadcasts(&fx)[0].msg_type, MessageType::TaskReport);
        assert_eq!(chat.task("t1").unwrap().state, TaskState::Failed);
        // b is still a member, but its task goes to c (the next member after b that is
        // free); the pause waits for it.
        assert!(chat.is_live("b"));
        let t2 = chat.task("t2").unwrap();
        assert_eq!((t2.assignee.as_str(), t2.desc.as_str()), ("c", "hotels"));
        assert_eq!(t2.mode, TaskMode::Sync);
        assert!(asked(&fx).is_empty());
        // The retry fails too: it is not handed on again, and the pause ends; round robin
        // after a gives b the turn.
        let fx = report(&mut chat, "c", "t2", false, "no hotel list here");
        assert_eq!(chat.tasks().len(), 2, "a retry was handed on again");
        assert_eq!(asked(&fx), strs(&["b"]));
    }

    /// A moderated group (a grounded inquiry) hands nothing on: its moderator routes the
    /// sub-question by its evidence; nor does a group with the rule off.
    #[test]
    fn moderated_groups_and_groups_with_the_rule_off_hand_no_failed_task_on() {
        for config in [
            ChatConfig {
                moderated: true,
                ..ChatConfig::default()
            },
            ChatConfig {
                reassign_failed: false,
                ..ChatConfig::default()
            },
        ] {
            let mut p = params(&["a", "b", "c"], 10);
            p.config = config;
            let (mut chat, _) = launch_with(p);
            say(
                &mut chat,
                "a",
                assign(AssignSync, "b, hotels please.", &[("b", "hotels")], &[]),
                T0,
            );
            report(&mut chat, "b", "t1", false, "no hotel list here");
            assert_eq!(chat.tasks().len(), 1);
        }
    }

    /// The next member after the failed assignee that has no running task takes it, past
    /// a busy one; a speaker-busy pause does not wait for the retry of the speaker's own
    /// failed task.
    #[test]
    fn a_failed_task_goes_to_the_next_free_member() {
        let (mut chat, _) = launch(&["a", "b", "c", "d"], 10);
        say(
            &mut chat,
            "a",
            assign(
                AssignAsync,
                "b hotels, c trains.",
                &[("b", "hotels"), ("c", "trains")],
                &["b"],
            ),
            T0,
        );
        // b is next but busy: the machine pauses for b's task.
        assert_eq!(chat.state(), ChatState::PauseAndTrigger);
        let fx = report(&mut chat, "b", "t1", false, "no hotel list here");
        let t3 = chat.task("t3").unwrap();
        assert_eq!((t3.assignee.as_str(), t3.desc.as_str()), ("d", "hotels"));
        // b's own task ended: b speaks now, without waiting for d's retry.
        assert_eq!(asked(&fx), strs(&["b"]));
    }

    /// With the host the only other live member, the host takes the failed task.
    #[test]
    fn the_host_takes_a_failed_task_when_nobody_else_is_live() {
        let (mut chat, _) = launch(&["a", "b"], 10);
        say(
            &mut chat,
            "a",
            assign(AssignSync, "b, hotels please.", &[("b", "hotels")], &[]),
            T0,
        );
        chat.handle(Input::MemberDown("b".into()), T0 + 1).unwrap();
        drain(&mut chat);
        let t2 = chat.task("t2").unwrap();
        assert_eq!((t2.assignee.as_str(), t2.desc.as_str()), ("a", "hotels"));
        // Once it is in, the host (the one member left) is asked to conclude.
        let fx = report(&mut chat, "a", "t2", true, "Hotel Lyon");
        assert_eq!(asked(&fx), strs(&["a"]));
        assert_eq!(allowed(&fx), vec![DecisionType::Conclude]);
    }

    #[test]
    fn sub_teams_respect_the_depth_limit() {
        let (mut chat, _) = launch(&["a", "b", "c"], 10);
        assert_eq!(chat.sub_team_depth(), Some(1));
        let fx = say(
            &mut chat,
            "a",
            assign(AssignAsync, "b, hotels please.", &[("b", "hotels")], &["c"]),
            T0,
        );
        assert!(fx.iter().any(|e| matches!(
            e,
            Effect::RunTask {
                sub_team_depth: Some(1),
                ..
            }
        )));
        let sub = |from: &str, task: &str, child: &str| Input::SubTeam {
            from: from.into(),
            task_id: task.into(),
            child_group_id: child.into(),
        };
        assert_eq!(
            chat.handle(sub("c", "t1", "g2"), T0),
            Err(ChatError::NotAssignee {
                task_id: "t1".into(),
                from: "c".into()
            })
        );
        assert_eq!(
            chat.handle(sub("b", "t7", "g2"), T0),
            Err(ChatError::UnknownTask("t7".into()))
        );
        chat.handle(sub("b", "t1", "g2"), T0).unwrap();
        assert_eq!(chat.task("t1").unwrap().child_group.as_deref(), Some("g2"));
        assert_eq!(
            chat.handle(sub("b", "t1", "g3"), T0),
            Err(ChatError::SubTeamExists {
                task_id: "t1".into(),
                child_group_id: "g2".into()
            })
        );

        // At the maximum depth, no sub-team.
        let mut p = params(&["a", "b"], 10);
        p.team_up_depth = 1;
        let (mut deep, _) = launch_with(p);
        assert_eq!(deep.sub_team_depth(), None);
        let fx = say(
            &mut deep,
            "a",
            assign(AssignAsync, "b, hotels please.", &[("b", "hotels")], &["a"]),
            T0,
        );
        assert!(fx.iter().any(|e| matches!(
            e,
            Effect::RunTask {
                sub_team_depth: None,
                ..
            }
        )));
        assert_eq!(
            deep.handle(sub("b", "t1", "g9"), T0),
            Err(ChatError::SubTeamNotAllowed {
                depth: 1,
                max_depth: 1
            })
        );
        assert_eq!(deep.task("t1").unwrap().child_group, None);
    }

    #[test]
    fn refused_inputs_change_nothing() {
        let (mut chat, _) = launch(&["a", "b", "c"], 10);
        say(
            &mut chat,
            "a",
            assign(AssignAsync, "c, trains.", &[("c", "trains")], &["b"]),
            T0,
        );
        let before = format!("{chat:?}");
        let refused = [
            (
                Input::Decision {
                    from: "c".into(),
                    decision: discuss("I am not the speaker", &[]),
                },
                ChatError::NotSpeaker {
                    from: "c".into(),
                    expected: Some("b".into()),
                },
            ),
            (
                Input::TaskResult {
                    from: "c".into(),
                    task_id: "t42".into(),
                    ok: true,
                    result: "x".into(),
                },
                ChatError::UnknownTask("t42".into()),
            ),
            (
                Input::TaskResult {
                    from: "b".into(),
                    task_id: "t1".into(),
                    ok: true,
                    result: "x".into(),
                },
                ChatError::NotAssignee {
                    task_id: "t1".into(),
                    from: "b".into(),
                },
            ),
            (
                Input::MemberDown("zz".into()),
                ChatError::UnknownMember("zz".into()),
            ),
        ];
        for (input, want) in refused {
            assert_eq!(chat.handle(input, T0 + 7), Err(want));
            assert_eq!(format!("{chat:?}"), before);
        }

        // After the conclusion everything but Tick is refused.
        say(&mut chat, "b", decision(Conclude, "done", &[]), T0);
        report(&mut chat, "c", "t1", true, "trains found");
        say(&mut chat, "b", decision(Conclude, "done", &[]), T0);
        assert_eq!(chat.state(), ChatState::Conclusion);
        let before = format!("{chat:?}");
        assert_eq!(
            chat.handle(Input::MemberDown("a".into()), T0),
            Err(ChatError::Concluded)
        );
        assert_eq!(
            chat.handle(
                Input::Decision {
                    from: "a".into(),
                    decision: discuss("more", &[])
                },
                T0
            ),
            Err(ChatError::Concluded)
        );
        assert_eq!(chat.handle(Input::Tick, u64::MAX), Ok(()));
        assert_eq!(format!("{chat:?}"), before);
    }

    #[test]
    fn decisions_are_normalised() {
        let (mut chat, _) = launch(&["a", "b", "c"], 10);
        // Assignments to strangers are dropped; none left means discussion.
        let fx = say(
            &mut chat,
            "a",
            assign(AssignSync, "zz, do it", &[("zz", "x")], &[]),
            T0,
        );
        assert_eq!(broadcasts(&fx)[0].msg_type, MessageType::Discuss);
        assert!(chat.tasks().is_empty());
        // Over-long content is cut.
        let long = "word ".repeat(2000) + "end";
        let fx = say(&mut chat, "b", discuss(&long, &[]), T0);
        assert_eq!(
            broadcasts(&fx)[0].content.chars().count(),
            ChatConfig::default().max_content_chars
        );
        // Too many tasks are cut; empty descriptions dropped.
        let mut d = assign(
            AssignAsync,
            "everyone works",
            &[("a", "  "), ("b", "b work")],
            &["a"],
        );
        d.tasks.extend((0..20).map(|i| TaskSpec {
            assignee: "a".into(),
            task_abstract: None,
            task_desc: format!("job {i}"),
        }));
        say(&mut chat, "c", d, T0);
        assert_eq!(
            chat.tasks().len(),
            ChatConfig::default().max_tasks_per_decision
        );
        assert_eq!(chat.tasks()[0].assignee, "b");
    }

    #[test]
    fn messages_and_decisions_round_trip_through_json() {
        let (mut chat, _) = launch(&["a", "b"], 10);
        say(
            &mut chat,
            "a",
            assign(AssignSync, "b, hotels.", &[("b", "hotels")], &[]),
            T0,
        );
        report(&mut chat, "b", "t1", true, "Bellecour");
        let json = serde_json::to_string(chat.messages()).unwrap();
        let back: Vec<Message> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, chat.messages());
        let d: Decision = serde_json::from_str(
            r#"{"type": "assign_async", "content": "go", "tasks": [{"assignee": "b", "task_desc": "x"}]}"#,
        )
        .unwrap();
        assert_eq!(d.msg_type, AssignAsync);
        assert!(d.next_speakers.is_empty());
        assert_eq!(d.tasks[0].task_abstract, None);
    }

    fn byte_vocab() -> TokenVocab {
        let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        tokens.push(b"<|end|>".to_vec());
        TokenVocab {
            tokens,
            special: vec![],
            eos_ids: vec![256],
            tokenize: Arc::new(|b: &[u8]| b.iter().map(|&x| u32::from(x)).collect()),
        }
    }

    /// Whether constrained decoding with `schema` can produce exactly `text`.
    fn schema_accepts(compiler: &ConstraintCompiler, schema: &Value, text: &str) -> bool {
        let mut state = compiler
            .compile(&Constraint::JsonSchema(schema.clone()))
            .unwrap();
        for b in text.bytes() {
            if !state.is_allowed(u32::from(b)) {
                return false;
            }
            state.commit(u32::from(b)).unwrap();
        }
        state.can_stop()
    }

    #[test]
    fn the_decision_schema_constrains_decoding() {
        let compiler = ConstraintCompiler::new(byte_vocab()).unwrap();
        let (mut chat, _) = launch(&["a", "b", "c"], 10);
        let fx = say(
            &mut chat,
            "a",
            assign(AssignAsync, "c, trains.", &[("c", "trains")], &["b"]),
            T0,
        );
        let Some(Effect::AskSpeaker { schema, .. }) =
            fx.iter().find(|e| matches!(e, Effect::AskSpeaker { .. }))
        else {
            panic!("{fx:?}")
        };
        let good = [
            r#"{"type": "discuss", "content": "hi", "next_speakers": ["a", "c"]}"#,
            r#"{"type": "assign_sync", "content": "go", "next_speakers": ["c"], "tasks": [{"assignee": "b", "task_abstract": "hotels", "task_desc": "find one"}]}"#,
            r#"{"type": "pause", "content": "wait", "next_speakers": ["a"], "triggers": ["t1"]}"#,
            r#"{"type": "conclude", "content": "done"}"#,
        ];
        for text in good {
            assert!(schema_accepts(&compiler, schema, text), "{text}");
            let d: Decision = serde_json::from_str(text).unwrap();
            assert!(matches!(
                d.msg_type,
                Discuss | AssignSync | Pause | Conclude
            ));
        }
        let bad = [
            // b is the speaker: not a valid next speaker.
            r#"{"type": "discuss", "content": "hi", "next_speakers": ["b"]}"#,
            r#"{"type": "discuss", "content": "hi", "next_speakers": ["zz"]}"#,
            r#"{"type": "discuss", "content": "", "next_speakers": ["a"]}"#,
            r#"{"type": "pause", "content": "wait", "next_speakers": ["a"], "triggers": ["t2"]}"#,
            r#"{"type": "assign_sync", "content": "go", "next_speakers": ["c"], "tasks": []}"#,
            r#"{"type": "shout", "content": "hi"}"#,
        ];
        for text in bad {
            assert!(!schema_accepts(&compiler, schema, text), "{text}");
        }
        // A forced conclusion admits nothing else.
        let forced = Decision::json_schema(
            &strs(&["a"]),
            &strs(&["a", "b"]),
            &[Conclude],
            &[],
            &ChatConfig::default(),
        );
        assert!(schema_accepts(
            &compiler,
            &forced,
            r#"{"type": "conclude", "content": "ok"}"#
        ));
        assert!(!schema_accepts(
            &compiler,
            &forced,
            r#"{"type": "discuss", "content": "ok"}"#
        ));
    }

    // ---- property test ----

    #[derive(Debug, Clone)]
    enum Op {
        /// The current speaker answers (if any).
        Speak {
            kind: u8,
            fresh: bool,
            next: Vec<u8>,
            tasks: Vec<u8>,
            triggers: Vec<u8>,
        },
        /// Somebody else sends a decision.
        Intrude(u8),
        /// A task result, from its assignee or not.
        Report {
            task: u8,
            ok: bool,
            honest: bool,
        },
        Down(u8),
        SubTeam(u8),
        /// Time passes by this many milliseconds, then a tick.
        Wait(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            5 => (0u8..5, any::<bool>(), proptest::collection::vec(0u8..6, 0..3),
                  proptest::collection::vec(0u8..6, 0..3), proptest::collection::vec(0u8..6, 0..3))
                .prop_map(|(kind, fresh, next, tasks, triggers)| Op::Speak { kind, fresh, next, tasks, triggers }),
            1 => (0u8..6).prop_map(Op::Intrude),
            3 => (0u8..8, any::<bool>(), any::<bool>()).prop_map(|(task, ok, honest)| Op::Report { task, ok, honest }),
            1 => (0u8..6).prop_map(Op::Down),
            1 => (0u8..8).prop_map(Op::SubTeam),
            2 => (0u32..200_000).prop_map(Op::Wait),
        ]
    }

    const IDS: [&str; 6] = ["a", "b", "c", "d", "e", "zz"];

    /// Drives a chat and checks the invariants after every step.
    struct Harness {
        chat: GroupChat,
        now: Millis,
        /// Who was asked and has not answered, lost its turn, or been paused since.
        asked: Option<String>,
        fresh: u32,
        concluded: bool,
    }

    impl Harness {
        fn step(&mut self, input: Input) {
            let from_speaker =
                matches!(&input, Input::Decision { from, .. } if Some(from) == self.asked.as_ref());
            let ok = self.chat.handle(input, self.now).is_ok();
            // An accepted answer ends the outstanding ask; its effects may re-ask the same
            // speaker (retry), lose its turn (repetition), pause, or ask the next one.
            let mut answered = ok && from_speaker;
            while let Some(effect) = self.chat.poll() {
                assert!(!self.concluded, "effect after the conclusion: {effect:?}");
                match effect {
                    Effect::AskSpeaker {
                        member,
                        turn,
                        allowed_types,
                        deadline,
                        ..
                    } => {
                        if answered {
                            answered = false;
                        } else {
                            assert_eq!(self.asked, None, "two speakers asked at once");
                        }
                        assert!(
                            self.chat.is_live(&member)
                                || self.chat.state() == ChatState::Conclusion
                        );
                        assert!(turn <= self.chat.max_turns());
                        assert!(!allowed_types.is_empty());
                        assert!(deadline > self.now);
                        self.asked = Some(member);
                    }
                    Effect::TurnLost { member, .. } => {
                        assert_eq!(self.asked.as_ref(), Some(&member));
                        answered = false;
                        self.asked = None;
                    }
                    Effect::Paused { waiting_on, .. } => {
                        if answered {
                            answered = false;
                            self.asked = None;
                        }
                        assert_eq!(self.asked, None);
                        assert!(!waiting_on.is_empty());
                    }
                    Effect::Concluded { .. } => {
                        self.asked = None;
                        self.concluded = true;
                    }
                    Effect::Broadcast(_) | Effect::RunTask { .. } | Effect::CancelTask { .. } => {}
                }
            }
            if answered {
                self.asked = None;
            }
            let chat = &self.chat;
            assert_eq!(chat.current_speaker(), self.asked.as_deref());
            assert!(chat.turn() <= chat.max_turns());
            assert_eq!(chat.state() == ChatState::Conclusion, self.concluded);
            assert_eq!(chat.conclusion().is_some(), self.concluded);
            assert!(!(chat.current_speaker().is_some() && chat.waiting_on().is_some()));
            if self.concluded {
                assert!(chat.tasks().iter().all(|t| t.state != TaskState::Running));
                assert_eq!(chat.poll_timeout(), None);
            } else {
                // Somebody is asked, or the chat waits for a running task.
                let waiting_on_running = chat.waiting_on().is_some_and(|w| {
                    w.iter()
                        .any(|id| chat.task(id).is_some_and(|t| t.state == TaskState::Running))
                });
                assert!(
                    chat.current_speaker().is_some() || waiting_on_running,
                    "stuck: {chat:?}"
                );
                assert!(chat.poll_timeout().is_some());
            }
            for (i, m) in chat.messages().iter().enumerate() {
                assert_eq!(m.seq, i as u64);
            }
            if let Some(Message {
                msg_type: MessageType::Conclude,
                ..
            }) = chat.messages().last()
            {
                assert!(self.concluded);
            }
        }

        fn fresh_text(&mut self) -> String {
            self.fresh += 1;
            format!(
                "idea number {} about plan {}",
                self.fresh,
                self.fresh * 7 + 3
            )
        }

        fn apply(&mut self, op: Op) {
            match op {
                Op::Speak {
                    kind,
                    fresh,
                    next,
                    tasks,
                    triggers,
                } => {
                    let Some(from) = self.asked.clone() else {
                        return;
                    };
                    let content = if fresh || self.chat.messages().is_empty() {
                        self.fresh_text()
                    } else {
                        self.chat.messages()[0].content.clone()
                    };
                    let kind =
                        [Discuss, AssignSync, AssignAsync, Pause, Conclude][usize::from(kind)];
                    let mut d = decision(kind, &content, &[]);
                    d.next_speakers = next
                        .iter()
                        .map(|&i| IDS[usize::from(i)].to_owned())
                        .collect();
                    d.tasks = tasks
                        .iter()
                        .map(|&i| TaskSpec {
                            assignee: IDS[usize::from(i)].to_owned(),
                            task_abstract: None,
                            task_desc: format!("job {i}"),
                        })
                        .collect();
                    d.triggers = triggers.iter().map(|i| format!("t{i}")).collect();
                    self.step(Input::Decision { from, decision: d });
                }
                Op::Intrude(i) => {
                    let from = IDS[usize::from(i)].to_owned();
                    if Some(&from) != self.asked.as_ref() {
                        let before = format!("{:?}", self.chat);
                        let content = self.fresh_text();
                        assert!(self
                            .chat
                            .handle(
                                Input::Decision {
                                    from,
                                    decision: discuss(&content, &[])
                                },
                                self.now
                            )
                            .is_err());
                        assert_eq!(format!("{:?}", self.chat), before);
                    }
                }
                Op::Report { task, ok, honest } => {
                    let task_id = format!("t{task}");
                    let from = match (honest, self.chat.task(&task_id)) {
                        (true, Some(t)) => t.assignee.clone(),
                        _ => "a".to_owned(),
                    };
                    let result = self.fresh_text();
                    self.step(Input::TaskResult {
                        from,
                        task_id,
                        ok,
                        result,
                    });
                }
                Op::Down(i) => self.step(Input::MemberDown(IDS[usize::from(i)].to_owned())),
                Op::SubTeam(task) => {
                    let task_id = format!("t{task}");
                    let from = self
                        .chat
                        .task(&task_id)
                        .map(|t| t.assignee.clone())
                        .unwrap_or_default();
                    let child_group_id = format!("child-{task}");
                    self.step(Input::SubTeam {
                        from,
                        task_id,
                        child_group_id,
                    });
                }
                Op::Wait(ms) => {
                    self.now += u64::from(ms);
                    self.step(Input::Tick);
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]
        #[test]
        fn random_inputs_keep_the_invariants_and_the_chat_concludes(
            n_members in 1usize..6,
            max_turns in 1u32..12,
            depth in 0u32..3,
            ops in proptest::collection::vec(op(), 0..60),
        ) {
            let mut p = params(&IDS[..n_members], max_turns);
            p.max_depth = 2;
            p.team_up_depth = depth.min(2);
            let mut h = Harness { chat: GroupChat::launch(p, T0).unwrap(), now: T0, asked: None, fresh: 0, concluded: false };
            h.step(Input::Tick);
            for op in ops {
                if h.concluded {
                    break;
                }
                h.apply(op);
            }
            // Keep answering with fresh discussion and finishing tasks: the chat must conclude.
            let mut steps = 0;
            while !h.concluded {
                steps += 1;
                prop_assert!(steps < 200, "no conclusion: {:?}", h.chat);
                if let Some(from) = h.asked.clone() {
                    let content = h.fresh_text();
                    h.step(Input::Decision { from, decision: discuss(&content, &[]) });
                } else {
                    let running = h.chat.tasks().iter().find(|t| t.state == TaskState::Running).cloned();
                    let t = running.expect("not asking, not concluded: some task must be running");
                    let result = h.fresh_text();
                    h.step(Input::TaskResult { from: t.assignee, task_id: t.id, ok: true, result });
                }
            }
            prop_assert!(h.chat.turn() <= h.chat.max_turns());
            prop_assert_eq!(h.chat.messages().last().map(|m| m.msg_type), Some(MessageType::Conclude));
        }
    }
}
