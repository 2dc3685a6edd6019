//! `starling task "..."`: submit a task to the local node, print its answer and citations
//! (with `-v` also the group chat, live). Also the live printer `starling demo` uses.

use std::collections::HashSet;
use std::io::Write;

use anyhow::Context;
use clap::Args;

use super::client::NodeAddr;
use crate::agent::chat::{LostTurnReason, MessageType};
use crate::agent::runtime::AgentEvent;
use crate::api::node::{SubmitTask, Submitted};

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
        let mut events = client
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
        let mut f = Follower::new(sub.group_id, args.json, chat);
        let mut buf = String::new();
        while let Some(chunk) = events.chunk().await.context("event stream broke")? {
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buf.find("\n\n") {
                let block: String = buf.drain(..end + 2).collect();
                for line in block.lines() {
                    let Some(data) = line.strip_prefix("data:") else {
                        continue;
                    };
                    let Ok(ev) = serde_json::from_str::<AgentEvent>(data.trim()) else {
                        continue;
                    };
                    match f.on(&ev) {
                        Step::More => {}
                        Step::Done(_) => return Ok(()),
                        Step::Failed(e) => anyhow::bail!("the task failed: {e}"),
                    }
                }
            }
        }
        anyhow::bail!("the node closed the event stream before the task concluded")
    })?
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
