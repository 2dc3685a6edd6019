//! The member side: the `agent` RPC service a node answers for the groups it takes part
//! in (turns, tasks, probes, messages), and which host it takes them from.

use super::*;

impl Agent {
    /// Refuses `from` for a group this node knows whose recorded host is another node
    /// (its own groups included): only the host sends a group's messages and asks its
    /// turns and tasks. A group not known here is anyone's to start. Returns the group's
    /// record, if known.
    pub(super) async fn check_host(
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
    pub(super) fn takes_over(&self, body: &serde_json::Value, from: &str) -> bool {
        let Ok(view) = serde_json::from_value::<MemberView>(body.clone()) else {
            return false;
        };
        let peers = self.membership();
        peers.is_failing(&view.host)
            && successor(&view.members, &view.host, |id| !peers.is_down(id))
                .is_some_and(|m| m.id == from)
    }

    pub(super) async fn handle_rpc(&self, req: Request) -> Result<Vec<u8>, RpcError> {
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
                let reply = self.do_task(&r, Some(&from)).await;
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
            "progress" => {
                let n: ProgressNote = serde_json::from_slice(&req.body)
                    .map_err(|e| rpc_err(RpcErrorCode::BadRequest, e))?;
                if !matches!(n.state.as_str(), "submitted" | "working") {
                    return Err(rpc_err(
                        RpcErrorCode::BadRequest,
                        "state must be submitted or working",
                    ));
                }
                // Only the assignee of a task this node hosts, while the task runs.
                let key = format!("{}/{}", n.group_id, n.task_id);
                let running = match self.0.store.task::<serde_json::Value>(&key).await {
                    Ok(Some(t)) => t.state == "running" && t.assignee.as_deref() == Some(&from),
                    Ok(None) => false,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read a task");
                        false
                    }
                };
                if !running {
                    return Err(rpc_err(
                        RpcErrorCode::BadRequest,
                        "no running task of that group is assigned to the caller",
                    ));
                }
                self.emit(AgentEvent::AgentProgress {
                    group_id: n.group_id,
                    task_id: n.task_id,
                    assignee: self.name_of(&from),
                    agent: n.agent.chars().take(MAX_AGENT_NAME_CHARS).collect(),
                    state: n.state,
                    progress: n.progress.map(|p| p.chars().take(PROGRESS_CHARS).collect()),
                });
                Ok(Vec::new())
            }
            other => Err(rpc_err(
                RpcErrorCode::UnknownMethod,
                format!("unknown method {other}"),
            )),
        }
    }

    /// This node's decision for a turn (its model, constrained by the schema).
    pub(super) async fn speak(&self, req: &SpeakRequest) -> Result<Decision, AgentError> {
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
        let value = self.0.decide.decide_json(prompt, &req.schema, 400).await?;
        serde_json::from_value(value).map_err(|e| {
            AgentError::Llm(crate::llm::LlmError::Decode(format!(
                "a turn decision: {e}"
            )))
        })
    }

    /// Runs a task assigned to this node.
    ///
    /// `host` is the node that asked for it (`None`: this node hosts the group), to which
    /// a third-party agent's progress on it is forwarded.
    pub(super) async fn do_task(&self, req: &TaskRequest, host: Option<&str>) -> TaskReply {
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
            return self
                .ask_front(front, &task, (&req.group_id, &req.task.id), host)
                .await;
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
            let sub = self.run_sub_team(
                goal,
                child.clone(),
                req.group_id.clone(),
                (depth, req.max_depth),
            );
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

    /// Hands `task` (task `task_id` of group `group_id`) to this node's third-party agent:
    /// its answer (or why it failed) is the reply, verbatim, and a long task's progress goes
    /// out as [`AgentEvent::AgentProgress`] meanwhile, here and, as `progress` notes, to
    /// `host` when another node hosts the group.
    pub(super) async fn ask_front(
        &self,
        front: &ExternalAgent,
        task: &ExternalTask,
        (group_id, task_id): (&str, &str),
        host: Option<&str>,
    ) -> TaskReply {
        tracing::info!(agent = %front.name(), task = %task.task_id, "task handed to the external agent");
        // Only the latest report waits to go to the host: a slow host delays the notes and
        // skips stale ones, never the task.
        let (latest, mut reported) = tokio::sync::watch::channel(None::<ProgressNote>);
        let report = |p: Progress| {
            let note = ProgressNote {
                group_id: group_id.to_owned(),
                task_id: task_id.to_owned(),
                agent: front.name().to_owned(),
                state: p.state.to_owned(),
                progress: p.text,
            };
            self.emit(AgentEvent::AgentProgress {
                group_id: note.group_id.clone(),
                task_id: note.task_id.clone(),
                assignee: self.0.name.clone(),
                agent: note.agent.clone(),
                state: note.state.clone(),
                progress: note.progress.clone(),
            });
            latest.send_replace(Some(note));
        };
        let forward = async {
            let Some(host) = host.and_then(|h| h.parse::<NodeId>().ok()) else {
                return;
            };
            while reported.changed().await.is_ok() {
                let note = reported.borrow_and_update().clone();
                let Some(body) = note.and_then(|n| serde_json::to_vec(&n).ok()) else {
                    continue;
                };
                if let Err(e) = self.0.swarm.call(host, SERVICE, "progress", body).await {
                    tracing::debug!(error = %e, "progress not delivered to the host");
                }
            }
        };
        let run = front.run_reporting(task, &report);
        tokio::pin!(run);
        // `forward` ends at once without a host to forward to; then the run goes on alone.
        // The run ending drops a note still in flight.
        let outcome = tokio::select! {
            r = &mut run => r,
            () = forward => run.await,
        };
        let (ok, result) = match outcome {
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
}

/// A member's task in progress; dropped before it finishes (the host dropped the request),
/// it reports the task cancelled.
pub(super) struct Unfinished {
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

/// Whether `from` may send the messages of a group stored with `body`: the `host` a member
/// recorded may; for a group this node hosts itself (its record holds the [`GroupBody`]),
/// no other node may.
pub(super) fn may_send_messages(body: &serde_json::Value, from: &str) -> bool {
    body.get("host").and_then(serde_json::Value::as_str) == Some(from)
}

pub(super) fn not_the_host() -> RpcError {
    rpc_err(
        RpcErrorCode::BadRequest,
        "only the group's host sends its messages, turns and tasks",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
