//! Human proxies: questions to this node's person (API, dashboard, `starling reply`), with
//! a timeout and a fallback.

use super::*;

impl Agent {
    /// Whether this node asks its person (human proxy) for this kind of input.
    pub(super) fn asks_person(&self, conclusion: bool) -> bool {
        self.0.config.agent.kind == AgentKind::Human
            && match self.0.config.agent.human_input {
                HumanInput::Always => true,
                HumanInput::Conclusion => conclusion,
                HumanInput::Never => false,
            }
    }

    /// Asks this node's person; `None` when nobody answered in time.
    pub(super) async fn ask_person(
        &self,
        group_id: &str,
        kind: &str,
        prompt: String,
    ) -> Option<String> {
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
        // Closed however the wait ends: answered, timed out, or dropped with a cancelled
        // task (the person is then no longer asked).
        let mut asking = Asking {
            agent: self,
            request_id,
            answered: false,
        };
        let wait = Duration::from_secs(self.0.config.agent.human_timeout_secs);
        let answer = tokio::time::timeout(wait, rx)
            .await
            .ok()
            .and_then(Result::ok);
        asking.answered = answer.is_some();
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
}

/// A question open to this node's person; closing it (on drop) withdraws it.
struct Asking<'a> {
    agent: &'a Agent,
    request_id: String,
    answered: bool,
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        if let Ok(mut m) = self.agent.0.human.lock() {
            m.remove(&self.request_id);
        }
        self.agent.emit(AgentEvent::HumanInputClosed {
            request_id: std::mem::take(&mut self.request_id),
            answered: self.answered,
        });
    }
}
