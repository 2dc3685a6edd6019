//! A grounded inquiry (`[agent] collaboration = "grounded"`): probes the swarm's
//! documents for each sub-question, routes them, and hosts the moderated group that
//! assigns them (the policy is `super::super::grounded`; this side moves probes and tasks).

use super::*;

impl Agent {
    /// Answers `task` as a grounded inquiry: the task's own clauses become sub-questions;
    /// the cards that match them are searched and those nodes probed (`agent`/`locate`,
    /// documents only, no model) for cited evidence; each sub-question is routed to the
    /// node holding its value (or, for a bridge, the node naming the entity and then the one
    /// holding its value; for a calculation, the two holding its numbers). The team is the
    /// nodes routed to; this node hosts a moderated group chat that assigns the
    /// sub-questions as tasks, asks the follow-ups in a second round and concludes with the
    /// answer built from the cited spans. When this node holds everything (or nobody holds
    /// anything) it answers alone.
    pub(super) async fn run_grounded(
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
        let planner = Planner::new(task).with_host(&self.0.me);
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
        let peers = self.membership();
        let known: Vec<String> = cards
            .iter()
            .map(|(id, _)| id.clone())
            .filter(|id| *id != self.0.me && !peers.is_down(id))
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
    pub(super) async fn agent_offers(&self, task: &str) -> Vec<AgentOffer> {
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
    pub(super) async fn answer_by_front(
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
        let reply = self
            .ask_front(front, &external, (&group_id, ""), None)
            .await;
        let mut inquiry = Inquiry::new(&task, &self.0.me, vec![(sub, route)]);
        inquiry.record_reply(&self.0.me, &task, reply.ok.then_some(reply.result));
        self.concluded_alone(group_id, self.named(inquiry.answer()))
    }

    /// The result of a task this node answered alone with `answer` (announced as
    /// concluded).
    pub(super) fn concluded_alone(&self, group_id: String, answer: Answer) -> TaskResult {
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
    pub(super) async fn add_candidates(&self, candidates: &mut Vec<String>, queries: &[String]) {
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

    pub(super) async fn probe(&self, nodes: &[String], subs: &[SubQuestion]) -> Vec<Vec<NodeHit>> {
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
    pub(super) fn locate_local(&self, sub: &SubQuestion) -> Vec<Located> {
        self.0
            .executor
            .tools()
            .docs()
            .map(|d| d.locate(sub, grounded::LOCATE_K))
            .unwrap_or_default()
    }

    /// A grounded task: the units of this node's documents that answer `sub`, quoted; the
    /// task result names the value and its evidence, or says nothing was found.
    pub(super) fn grounded_task(&self, sub: &SubQuestion) -> TaskReply {
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
    pub(super) fn advance(&self, inquiry: &Mutex<Inquiry>, last: bool) -> Next {
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
    pub(super) fn inquiry_turn(&self, inquiry: &Mutex<Inquiry>, last: bool) -> Decision {
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

    /// `a` with node names in its citations.
    pub(super) fn named(&self, mut a: Answer) -> Answer {
        for c in &mut a.citations {
            c.node = self.name_of(&c.node_id);
        }
        a
    }
}
