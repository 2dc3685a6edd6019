//! `starling task "..."`: submit a task to the local node, print its answer and citations
//! (with `-v` also the group chat, live). Also the live printer `starling demo` uses.

use std::collections::HashSet;
use std::io::Write;

use clap::Args;
use eventsource_stream::Eventsource;
use futures::{Stream, StreamExt};

use super::client::NodeAddr;
use crate::agent::chat::{LostTurnReason, MessageType};
use crate::agent::runtime::{AgentEvent, TaskResult};
use crate::api::node::{SubmitTask, Submitted};
use crate::api::tasks::{TaskState, TaskView};

/// Arguments of `starling task`.
#[derive(Debug, Args)]
pub struct TaskArgs {
    /// What the swarm should do.
    pub task: String,
    /// Which node.
    #[command(flatten)]
    pub node: NodeAddr,
    /// Print each event as a JSON line (the conclusion event last) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Follows the events of one submitted task (its group and sub-groups).
pub struct Follower {
    groups: HashSet<String>,
    root: String,
    json: bool,
    chat: bool,
}

/// What an event meant for the follower.
pub enum Step {
    /// Keep following.
    More,
    /// The root group concluded with this answer.
    Done(String),
    /// The task failed.
    Failed(String),
}

impl Follower {
    /// Follows group `root`; `chat`: print the group chat live too (otherwise only the
    /// team and, at the end, the answer with its citations).
    pub fn new(root: String, json: bool, chat: bool) -> Self {
        let mut groups = HashSet::new();
        groups.insert(root.clone());
        Self {
            groups,
            root,
            json,
            chat,
        }
    }

    fn mine(&self, group: &str) -> bool {
        self.groups.contains(group)
    }

    /// Prints `ev` if it belongs to the task.
    pub fn on(&mut self, ev: &AgentEvent) -> Step {
        let relevant = match ev {
            AgentEvent::TaskSubmitted { group_id, .. }
            | AgentEvent::TeamFormed { group_id, .. }
            | AgentEvent::TaskState { group_id, .. }
            | AgentEvent::AgentProgress { group_id, .. }
            | AgentEvent::TurnLost { group_id, .. }
            | AgentEvent::Concluded { group_id, .. }
            | AgentEvent::TaskFailed { group_id, .. } => self.mine(group_id),
            AgentEvent::GroupLaunched {
                group_id, parent, ..
            } => {
                if parent.as_deref().is_some_and(|p| self.mine(p)) {
                    self.groups.insert(group_id.clone());
                }
                self.mine(group_id)
            }
            AgentEvent::Message { message, .. } => self.mine(&message.group_id),
            _ => false,
        };
        if !relevant {
            return Step::More;
        }
        if self.json {
            if let Ok(line) = serde_json::to_string(ev) {
                println!("{line}");
            }
        } else if self.chat
            || matches!(
                ev,
                AgentEvent::TeamFormed { .. }
                    | AgentEvent::Concluded { .. }
                    | AgentEvent::TaskFailed { .. }
            )
        {
            print_event(ev);
        }
        let _ = std::io::stdout().flush();
        match ev {
            AgentEvent::Concluded {
                group_id, answer, ..
            } if *group_id == self.root => Step::Done(answer.clone()),
            AgentEvent::TaskFailed { group_id, error } if *group_id == self.root => {
                Step::Failed(error.clone())
            }
            _ => Step::More,
        }
    }
}

/// One human-readable line (or block) per event.
pub fn print_event(ev: &AgentEvent) {
    match ev {
        AgentEvent::TaskSubmitted { task, .. } => println!("task: {task}"),
        AgentEvent::TeamFormed { members, calls, .. } => {
            if members.is_empty() {
                println!("team: working alone ({calls} tool calls)");
            } else {
                println!("team: {} ({calls} tool calls)", members.join(", "));
            }
        }
        AgentEvent::GroupLaunched {
            group_id,
            members,
            parent,
            ..
        } => {
            let sub = if parent.is_some() {
                "sub-team "
            } else {
                "group "
            };
            println!("{sub}{group_id} launched with {}", members.join(", "));
        }
        AgentEvent::Message {
            message,
            sender_name,
        } => {
            let kind = match message.msg_type {
                MessageType::Discuss => "says",
                MessageType::AssignSync | MessageType::AssignAsync => "assigns",
                MessageType::Pause | MessageType::AutoPause => "pauses",
                MessageType::Conclude => "concludes",
                MessageType::TaskReport => "reports",
                MessageType::MemberLeft => "left",
            };
            let task = message
                .task_id
                .as_deref()
                .map(|t| format!(" [{t}]"))
                .unwrap_or_default();
            // An assignment shows the task itself (the decision's text is the same for
            // every task it assigns).
            let text = match (&message.task_desc, message.msg_type) {
                (Some(desc), MessageType::AssignSync | MessageType::AssignAsync) => desc.trim(),
                _ => message.content.trim(),
            };
            println!("  [{:>2}] {sender_name} {kind}{task}: {text}", message.turn);
        }
        AgentEvent::TaskState {
            task_id,
            assignee,
            state,
            ..
        } => println!("  task {task_id} ({assignee}): {state:?}"),
        AgentEvent::AgentProgress {
            task_id,
            assignee,
            agent,
            state,
            progress,
            ..
        } => {
            let task = if task_id.is_empty() {
                String::new()
            } else {
                format!("task {task_id} ")
            };
            let said = progress
                .as_deref()
                .map(|p| format!(": {p}"))
                .unwrap_or_default();
            println!("  {task}({assignee}, agent {agent}): {state}{said}");
        }
        AgentEvent::TurnLost { member, reason, .. } => {
            let why = match reason {
                LostTurnReason::Timeout => "no answer in time",
                LostTurnReason::Repetition => "it said nothing new",
                LostTurnReason::MemberDown => "it left",
                LostTurnReason::NoAnswer => "its answer failed",
            };
            println!("  {member} loses its turn: {why}");
        }
        AgentEvent::Concluded {
            answer,
            citations,
            status,
            ..
        } => {
            println!("\nanswer: {answer}");
            if citations.is_empty() {
                println!("sources: none ({status:?})");
            } else {
                println!("sources:");
                for c in citations {
                    println!("  - {}", c.line());
                }
            }
        }
        AgentEvent::TaskFailed { error, .. } => println!("failed: {error}"),
        _ => {}
    }
}

/// Submits and follows a task; `chat`: also print the group chat (`-v`).
pub fn run(args: TaskArgs, chat: bool) -> anyhow::Result<()> {
    super::block_on(async move {
        // Subscribe first so no event is missed.
        let client = args.node.client()?;
        let events = client
            .get(format!("http://{}/api/events", args.node.api))
            .send()
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "no Starling node answers at http://{} ({e}). Start one with `starling up`.",
                    args.node.api
                )
            })?;
        let sub: Submitted = args
            .node
            .post(
                "/api/tasks",
                &SubmitTask {
                    task: args.task.clone(),
                    wait: false,
                },
            )
            .await?;
        let mut f = Follower::new(sub.group_id.clone(), args.json, chat);
        let mut incoming = std::pin::pin!(decode_events(events.bytes_stream()));
        let ended = loop {
            let step = match incoming.next().await.transpose()? {
                Some(Incoming::Event(ev)) => f.on(&ev),
                // The node dropped events this client was too slow for; the conclusion may
                // be among them: ask for the task itself.
                Some(Incoming::Lagged(missed)) => {
                    tracing::debug!(missed, "events missed; asking the node for the task");
                    outcome(&args.node, &mut f, &sub.group_id).await?
                }
                Some(Incoming::Shutdown) => {
                    anyhow::bail!("the node shut down before the task concluded")
                }
                // The stream ended (the node stopping, a proxy timing out): the task may
                // have ended before it did.
                None => match outcome(&args.node, &mut f, &sub.group_id).await? {
                    Step::More => {
                        anyhow::bail!("the node closed the event stream before the task concluded")
                    }
                    ended => ended,
                },
            };
            if !matches!(step, Step::More) {
                break step;
            }
        };
        match ended {
            Step::Failed(e) => anyhow::bail!("the task failed: {e}"),
            _ => Ok(()),
        }
    })?
}

/// One item of a node's event stream (`GET /api/events`), decoded.
#[derive(Debug)]
pub enum Incoming {
    /// An agent event.
    Event(Box<AgentEvent>),
    /// The node dropped this many events for this subscriber, which fell behind.
    Lagged(u64),
    /// The node is shutting down; the stream ends after this.
    Shutdown,
}

/// Decodes `GET /api/events`: server-sent events whose data is one JSON [`AgentEvent`],
/// `lagged` when the node dropped some and `shutdown` last when it stops. Events this
/// version does not know are skipped;
/// a broken stream is an error.
pub fn decode_events<S, B, E>(bytes: S) -> impl Stream<Item = anyhow::Result<Incoming>>
where
    S: Stream<Item = Result<B, E>>,
    B: AsRef<[u8]>,
    E: std::fmt::Display,
{
    bytes.eventsource().filter_map(|item| async move {
        match item {
            Err(e) => Some(Err(anyhow::anyhow!("the event stream broke: {e}"))),
            Ok(ev) if ev.event == "lagged" => {
                let missed = serde_json::from_str::<serde_json::Value>(&ev.data)
                    .ok()
                    .and_then(|v| v["missed"].as_u64())
                    .unwrap_or(0);
                Some(Ok(Incoming::Lagged(missed)))
            }
            Ok(ev) if ev.event == "shutdown" => Some(Ok(Incoming::Shutdown)),
            Ok(ev) => serde_json::from_str::<AgentEvent>(&ev.data)
                .ok()
                .map(|e| Ok(Incoming::Event(Box::new(e)))),
        }
    })
}

/// Where task `id` stands, asked of the node (`GET /api/tasks/{id}`): a finished task is
/// printed as its conclusion event would have been.
async fn outcome(node: &NodeAddr, f: &mut Follower, id: &str) -> anyhow::Result<Step> {
    let v: serde_json::Value = node.get(&format!("/api/tasks/{id}")).await?;
    Ok(task_outcome(f, v))
}

/// What `GET /api/tasks/{id}`'s body `v` means for the follower `f`.
fn task_outcome(f: &mut Follower, v: serde_json::Value) -> Step {
    if v.get("answer").is_some() {
        return match serde_json::from_value::<TaskResult>(v) {
            Ok(r) => f.on(&AgentEvent::Concluded {
                group_id: r.group_id,
                conclusion: r.conclusion,
                answer: r.answer,
                citations: r.citations,
                status: r.status,
            }),
            Err(e) => Step::Failed(format!("the node's task result is not understood: {e}")),
        };
    }
    match serde_json::from_value::<TaskView>(v) {
        Ok(t) if t.state == TaskState::Running => Step::More,
        Ok(t) => Step::Failed(t.error.unwrap_or_else(|| t.state.name().to_owned())),
        Err(e) => Step::Failed(format!("the node's task view is not understood: {e}")),
    }
}

/// Arguments of `starling reply`.
#[derive(Debug, Args)]
pub struct ReplyArgs {
    /// The question's id (see `starling reply` with no arguments); omit to list questions.
    pub id: Option<String>,
    /// Your answer.
    pub answer: Option<String>,
    /// Which node.
    #[command(flatten)]
    pub node: NodeAddr,
}

/// Lists or answers the questions a human-proxy node is waiting on.
pub fn reply(args: ReplyArgs) -> anyhow::Result<()> {
    super::block_on(async move {
        match (args.id, args.answer) {
            (Some(id), Some(answer)) => {
                let client = args.node.client()?;
                let r = client
                    .post(format!("http://{}/api/human/{id}", args.node.api))
                    .json(&crate::api::node::HumanAnswer { answer })
                    .send()
                    .await
                    .map_err(|e| {
                        anyhow::anyhow!(
                            "no Starling node answers at http://{} ({e})",
                            args.node.api
                        )
                    })?;
                if !r.status().is_success() {
                    let v: serde_json::Value = r.json().await.unwrap_or_default();
                    anyhow::bail!("{}", v["error"]["message"].as_str().unwrap_or("refused"));
                }
                println!("answered {id}");
                Ok(())
            }
            (Some(_), None) => {
                anyhow::bail!("give the answer after the id: starling reply ID \"your answer\"")
            }
            _ => {
                let list: Vec<crate::agent::runtime::HumanRequest> =
                    args.node.get("/api/human").await?;
                if list.is_empty() {
                    println!("no open questions");
                }
                for q in list {
                    println!(
                        "{} ({}, group {}):\n{}\n",
                        q.request_id, q.kind, q.group_id, q.prompt
                    );
                }
                Ok(())
            }
        }
    })?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::grounded::AnswerStatus;

    fn decode_all(chunks: Vec<Vec<u8>>) -> Vec<Incoming> {
        let bytes = futures::stream::iter(chunks.into_iter().map(Ok::<_, std::io::Error>));
        futures::executor::block_on(decode_events(bytes).collect::<Vec<_>>())
            .into_iter()
            .map(|r| r.expect("decoded"))
            .collect()
    }

    #[test]
    fn a_character_split_between_chunks_arrives_whole() {
        let ev = AgentEvent::TaskFailed {
            group_id: "g1".into(),
            error: "Zoë's café: 5 °C – ✓".into(),
        };
        let wire = format!(
            "event: task_failed\ndata: {}\n\n",
            serde_json::to_string(&ev).unwrap()
        )
        .into_bytes();
        // Cut inside every multi-byte character in turn.
        let cuts: Vec<usize> = (1..wire.len())
            .filter(|&i| (wire[i] & 0xC0) == 0x80)
            .collect();
        assert!(cuts.len() >= 4);
        for cut in cuts {
            let got = decode_all(vec![wire[..cut].to_vec(), wire[cut..].to_vec()]);
            match got.as_slice() {
                [Incoming::Event(ev)] => match ev.as_ref() {
                    AgentEvent::TaskFailed { error, .. } => {
                        assert_eq!(error, "Zoë's café: 5 °C – ✓", "cut at {cut}")
                    }
                    other => panic!("cut at {cut}: {other:?}"),
                },
                other => panic!("cut at {cut}: {other:?}"),
            }
        }
    }

    #[test]
    fn lagged_is_reported_and_unknown_events_are_skipped() {
        let got = decode_all(vec![
            b"event: lagged\ndata: {\"event\":\"lagged\",\"missed\":17}\n\n".to_vec(),
            b"event: from_the_future\ndata: {\"event\":\"from_the_future\"}\n\n: keep-alive\n\n"
                .to_vec(),
            b"event: shutdown\ndata: {\"event\":\"shutdown\"}\n\n".to_vec(),
        ]);
        assert!(
            matches!(got.as_slice(), [Incoming::Lagged(17), Incoming::Shutdown]),
            "{got:?}"
        );
    }

    #[test]
    fn a_task_asked_for_after_lost_events_ends_the_follow_as_its_state_says() {
        let mut f = Follower::new("g1".into(), true, false);
        let done = serde_json::to_value(TaskResult {
            group_id: "g1".into(),
            members: vec!["basil".into()],
            answer: "24 degrees".into(),
            citations: Vec::new(),
            status: AnswerStatus::Answered,
            conclusion: String::new(),
            turns: 2,
            tokens: 0,
        })
        .unwrap();
        assert!(matches!(task_outcome(&mut f, done), Step::Done(a) if a == "24 degrees"));
        let view = |state: &str, error: Option<&str>| {
            serde_json::json!({
                "group_id": "g1", "task": "t", "state": state,
                "submitted_at": 1, "ended_at": null, "error": error
            })
        };
        assert!(matches!(
            task_outcome(&mut f, view("running", None)),
            Step::More
        ));
        assert!(matches!(
            task_outcome(&mut f, view("cancelled", None)),
            Step::Failed(e) if e == "cancelled"
        ));
        assert!(matches!(
            task_outcome(&mut f, view("failed", Some("no model"))),
            Step::Failed(e) if e == "no model"
        ));
    }
}
