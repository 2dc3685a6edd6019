//! Hosting a group: the host side of a group chat. `host` runs the chat machine
//! (`super::super::chat`) and carries out its effects: asks speakers (`agent/speak`), hands
//! tasks to assignees (`agent/task`), fans messages out (`agent/message`) and stores the
//! group. Also the failover: a member that succeeds a lost host resumes its group here.

use super::*;

impl Agent {
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
    pub(super) fn survivors(&self, r: &Resume) -> Vec<(String, String)> {
        let view = self.membership();
        r.members
            .iter()
            .filter(|m| m.id != r.previous_host && m.id != self.0.me && !view.is_down(&m.id))
            .map(|m| (m.id.clone(), m.name.clone()))
            .collect()
    }

    /// What membership knows of every peer now, read once for one decision.
    pub(super) fn membership(&self) -> Membership {
        Membership(
            self.0
                .swarm
                .peers()
                .into_iter()
                .map(|p| (p.id.to_string(), p.state))
                .collect(),
        )
    }

    /// Hosts a group chat to its conclusion: a new one, or with `resume` one whose host
    /// went down.
    pub(super) async fn host(
        &self,
        params: LaunchParams,
        parent: Option<String>,
        inquiry: Option<Arc<Mutex<Inquiry>>>,
        resume: Option<Resume>,
    ) -> Result<TaskResult, AgentError> {
        // Tokio's clock: virtual in the simulated cluster's tests.
        let started = tokio::time::Instant::now();
        let clock = move || started.elapsed().as_millis() as u64;
        let mut chat = match resume {
            Some(r) => GroupChat::resume(params.clone(), r.messages, &r.previous_host, clock())?,
            None => GroupChat::launch(params.clone(), clock())?,
        };
        let group_id = params.group_id.clone();
        let goal = params.goal.clone();
        let member_names: Vec<String> = params.members.iter().map(|m| m.name.clone()).collect();
        self.persist_group(&chat, parent.clone()).await;
        // What the stored record says of the chat (its state, turn and members), rewritten
        // whenever the machine moves on, so `GET /api/groups/{id}` shows where it stands.
        let mut stored = (chat.state(), chat.turn(), chat.members().len());
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
        let mut deliveries = Couriers::new(self.0.swarm.clone());
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
                                // A step that failed or found nothing stays open: the host
                                // loop re-routes it when this result comes in.
                                let evidence = reply
                                    .as_ref()
                                    .map(|r| r.evidence.clone())
                                    .unwrap_or_default();
                                if !evidence.is_empty() {
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
            let now_at = (chat.state(), chat.turn(), chat.members().len());
            if conclusion.is_none() && now_at != stored {
                stored = now_at;
                self.persist_group(&chat, parent.clone()).await;
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
                deliveries.finish().await;
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
                Some(_) = deliveries.join_next(), if deliveries.running() => continue,
                ev = peer_events.recv() => match ev {
                    Ok(SwarmEvent::PeerDown(id)) => {
                        let id = id.to_string();
                        if chat.is_live(&id) { Input::MemberDown(id) } else { continue }
                    }
                    _ => continue,
                },
                _ = sleep => Input::Tick,
            };
            // Sub-questions this input leaves unanswered — the running tasks of a member
            // that went down, a task that came back failed or without evidence — go to
            // their next holders, who join before the machine takes the input: else a
            // group left to the host alone, or with every task in, would conclude.
            if let Some(i) = &inquiry {
                let unanswered: Vec<(String, String)> = chat
                    .tasks()
                    .iter()
                    .filter(|t| t.state == TaskState::Running)
                    .filter(|t| match &input {
                        Input::MemberDown(down) => t.assignee == *down,
                        Input::TaskResult { from, task_id, .. } => {
                            t.assignee == *from
                                && t.id == *task_id
                                && lock(i).step_sub(from, &t.desc).is_some()
                        }
                        _ => false,
                    })
                    .map(|t| (t.assignee.clone(), t.desc.clone()))
                    .collect();
                self.reroute(&mut chat, i, unanswered, clock());
            }
            if let Err(e) = chat.handle(input, clock()) {
                tracing::debug!(group = %group_id, error = %e, "chat input refused");
            }
            let mut ended = Vec::new();
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
                    if t.state != TaskState::Done {
                        ended.push((t.assignee.clone(), t.desc.clone()));
                    }
                }
            }
            // A sub-question whose task the machine ended unfinished (it timed out) goes to
            // the next node that found a value, which joins before the host's next turn is
            // taken. (Those re-routed above are no longer open; asking again finds nothing.)
            if let Some(i) = &inquiry {
                self.reroute(&mut chat, i, ended, clock());
            }
        }
    }

    /// Sends each of `steps` (assignee, sub-question) that failed to the next node that
    /// found a value for it, which joins the group when it is not a member.
    fn reroute(
        &self,
        chat: &mut GroupChat,
        inquiry: &Mutex<Inquiry>,
        steps: Vec<(String, String)>,
        now: u64,
    ) {
        for (assignee, desc) in steps {
            let next = lock(inquiry).failed(&assignee, &desc);
            let Some(next) = next else { continue };
            tracing::info!(from = %assignee, to = %next, "sub-question re-assigned");
            if chat.members().iter().any(|m| m.id == next) {
                continue;
            }
            let name = self.name_of(&next);
            if let Err(e) = chat.handle(Input::Recruit(MemberRef { id: next, name }), now) {
                tracing::debug!(group = %chat.group_id(), error = %e, "recruit refused");
            }
        }
    }

    pub(super) async fn deliver(
        &self,
        chat: &GroupChat,
        goal: &str,
        message: Message,
        deliveries: &mut Couriers,
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
            let body = Arc::new(serde_json::to_vec(&note).unwrap_or_default());
            for peer in others {
                deliveries.send(peer, body.clone());
            }
        }
    }

    pub(super) async fn record_message(&self, note: &MessageNote) {
        let m = &note.message;
        if let Err(e) = self.0.store.append_message(&m.group_id, m.seq, m).await {
            tracing::warn!(error = %e, "cannot store a chat message");
        }
        self.emit(AgentEvent::Message {
            message: m.clone(),
            sender_name: note.sender_name.clone(),
        });
    }

    pub(super) async fn persist_group(&self, chat: &GroupChat, parent: Option<String>) {
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
    pub(super) async fn persist_own(
        &self,
        g: &Job<'_>,
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
    pub(super) async fn still_forming(&self, group_id: &str) -> bool {
        match self.0.store.group::<serde_json::Value>(group_id).await {
            Ok(Some(g)) => g.state == FORMING,
            Ok(None) => true,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read a group");
                false
            }
        }
    }

    pub(super) async fn persist_task(&self, group_id: &str, t: &Task) {
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

    pub(super) async fn ask_speaker(
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

    pub(super) async fn run_remote_task(
        &self,
        assignee: &str,
        req: &TaskRequest,
        timeout: Duration,
    ) -> Result<TaskReply, String> {
        if assignee == self.0.me {
            return tokio::time::timeout(timeout, self.do_task(req, None))
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

    /// Forms and hosts a sub-team at `depth` under `parent`; `None` when formation chose
    /// to work alone. Boxed: hosting a group can lead back here (a sub-team's assignee may
    /// form its own), so the future type must not be recursive.
    pub(super) fn run_sub_team(
        &self,
        goal: String,
        group_id: String,
        parent: String,
        (depth, parent_max): (u32, u32),
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
            let params = this
                .launch_params(group_id, &goal, members, depth)
                .within(parent_max);
            Ok(Some(this.host(params, Some(parent), None, None).await?))
        })
    }

    pub(super) fn launch_params(
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

    /// A group's members: this node first (it hosts), then `others` (id, name).
    pub(super) fn team(
        &self,
        others: impl IntoIterator<Item = (String, String)>,
    ) -> Vec<MemberRef> {
        let me = MemberRef {
            id: self.0.me.clone(),
            name: self.0.name.clone(),
        };
        std::iter::once(me)
            .chain(others.into_iter().map(|(id, name)| MemberRef { id, name }))
            .collect()
    }

    /// After `dead` went down: resumes each recent open group it hosted that this node
    /// is the [`successor`] for, one after the other. The result is kept like a task
    /// submitted here, and the conclusion goes to the other members.
    pub(super) async fn fail_over(self, dead: String) {
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
            let peers = self.membership();
            let mine = view.host == dead
                && successor(&view.members, &dead, |id| !peers.is_down(id))
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
                .run_task(&g.goal, g.group_id.clone(), None, 0, Start::Resume(resume))
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
}

pub(super) fn tail(messages: &[Message], n: usize) -> Vec<Message> {
    messages[messages.len().saturating_sub(n)..].to_vec()
}

pub(super) fn describe_rejection(r: &Rejection) -> String {
    match r {
        Rejection::Empty => "Your message was empty. Say something new.".into(),
        Rejection::Repeats { seq, .. } => format!(
            "Your message repeats message {seq}. Add something new, assign a task, or conclude."
        ),
    }
}

/// A group's message deliveries: one task per member sends that member the messages one
/// at a time, in the order recorded, so that a member's copy of the log (and of the
/// group's state) never goes back; a slow member holds up only its own messages. Each
/// delivery is bounded by the RPC timeout; one that fails is logged and the next goes on.
pub(super) struct Couriers {
    swarm: Arc<dyn Peers>,
    queues: HashMap<NodeId, tokio::sync::mpsc::UnboundedSender<Arc<Vec<u8>>>>,
    tasks: tokio::task::JoinSet<()>,
}

impl Couriers {
    pub(super) fn new(swarm: Arc<dyn Peers>) -> Self {
        Self {
            swarm,
            queues: HashMap::new(),
            tasks: tokio::task::JoinSet::new(),
        }
    }

    /// Queues `body` (an `agent/message` note) for `peer`.
    pub(super) fn send(&mut self, peer: NodeId, body: Arc<Vec<u8>>) {
        let queue = self.queues.entry(peer).or_insert_with(|| {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Arc<Vec<u8>>>();
            let swarm = self.swarm.clone();
            self.tasks.spawn(async move {
                while let Some(body) = rx.recv().await {
                    let r = swarm
                        .call(peer, SERVICE, "message", body.as_ref().clone())
                        .await;
                    if let Err(e) = r {
                        tracing::debug!(peer = %peer.short(), error = %e, "message not delivered");
                    }
                }
            });
            tx
        });
        let _ = queue.send(body);
    }

    /// Whether a courier is still running (for `join_next` in a `select!`).
    pub(super) fn running(&self) -> bool {
        !self.tasks.is_empty()
    }

    /// The next courier that ended (a member's queue closed).
    pub(super) async fn join_next(&mut self) -> Option<()> {
        self.tasks.join_next().await.map(|_| ())
    }

    /// Delivers everything queued, then returns.
    pub(super) async fn finish(&mut self) {
        self.queues.clear();
        while self.tasks.join_next().await.is_some() {}
    }
}

/// A snapshot of membership: node id → state. A node it does not know (this one among
/// them) counts as up.
pub(super) struct Membership(HashMap<String, PeerState>);

impl Membership {
    /// Whether membership has declared `id` down.
    pub(super) fn is_down(&self, id: &str) -> bool {
        self.0.get(id) == Some(&PeerState::Down)
    }

    /// Whether `id` is suspected or declared down.
    pub(super) fn is_failing(&self, id: &str) -> bool {
        matches!(self.0.get(id), Some(PeerState::Suspect | PeerState::Down))
    }
}
