//! Tasks submitted through the API: which are running, which ended and how, and the
//! handles that cancel them.
//!
//! [`TaskBoard`] is the bookkeeping alone (no IO, no clock: times are passed in);
//! [`TaskRunner`] owns the spawned tasks in a `JoinSet`, so dropping it (the node shutting
//! down) aborts them, and cancelling one aborts its future on this node.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use tokio::task::{AbortHandle, JoinSet};

use crate::agent::runtime::lock;

/// How many ended tasks are remembered (running ones are always kept).
pub const REMEMBERED: usize = 1000;

/// Where a submitted task stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Being worked on.
    Running,
    /// Ended with a result (`GET /api/tasks/{id}` returns it).
    Done,
    /// Ended with an error.
    Failed,
    /// Cancelled by `DELETE /api/tasks/{id}`.
    Cancelled,
}

impl TaskState {
    /// Its name as the API writes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Done => "done",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

/// One task as `GET /api/tasks` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskView {
    /// Its id (the group id `POST /api/tasks` returned).
    pub group_id: String,
    /// The task as submitted.
    pub task: String,
    /// Where it stands.
    pub state: TaskState,
    /// Submitted (Unix ms).
    pub submitted_at: i64,
    /// Ended (Unix ms), once it has.
    pub ended_at: Option<i64>,
    /// Why it failed.
    pub error: Option<String>,
}

/// What cancelling a task did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancel {
    /// It was running and is cancelled now.
    Cancelled,
    /// It had already ended (in this state).
    Ended(TaskState),
    /// No such task.
    Unknown,
}

/// The tasks submitted to this node, newest last.
#[derive(Debug, Default)]
pub struct TaskBoard {
    tasks: VecDeque<TaskView>,
}

impl TaskBoard {
    /// Records a task that starts now.
    pub fn submit(&mut self, group_id: &str, task: &str, now_ms: i64) {
        self.tasks.push_back(TaskView {
            group_id: group_id.to_owned(),
            task: task.to_owned(),
            state: TaskState::Running,
            submitted_at: now_ms,
            ended_at: None,
            error: None,
        });
        // Forget the oldest ended tasks beyond REMEMBERED.
        let mut ended = self
            .tasks
            .iter()
            .filter(|t| t.state != TaskState::Running)
            .count();
        while ended > REMEMBERED {
            match self
                .tasks
                .iter()
                .position(|t| t.state != TaskState::Running)
            {
                Some(i) => {
                    self.tasks.remove(i);
                    ended -= 1;
                }
                None => break,
            }
        }
    }

    /// Records that a running task ended (`Err`: with that error). A cancelled task stays
    /// cancelled.
    pub fn finish(&mut self, group_id: &str, outcome: Result<(), String>, now_ms: i64) {
        if let Some(t) = self.running_mut(group_id) {
            t.ended_at = Some(now_ms);
            match outcome {
                Ok(()) => t.state = TaskState::Done,
                Err(e) => {
                    t.state = TaskState::Failed;
                    t.error = Some(e);
                }
            }
        }
    }

    /// Marks a running task cancelled.
    pub fn cancel(&mut self, group_id: &str, now_ms: i64) -> Cancel {
        if let Some(t) = self.running_mut(group_id) {
            t.state = TaskState::Cancelled;
            t.ended_at = Some(now_ms);
            return Cancel::Cancelled;
        }
        match self.get(group_id) {
            Some(t) => Cancel::Ended(t.state),
            None => Cancel::Unknown,
        }
    }

    /// The task `group_id` (the latest of that id).
    pub fn get(&self, group_id: &str) -> Option<&TaskView> {
        self.tasks.iter().rev().find(|t| t.group_id == group_id)
    }

    /// Every remembered task, newest first.
    pub fn list(&self) -> Vec<TaskView> {
        self.tasks.iter().rev().cloned().collect()
    }

    fn running_mut(&mut self, group_id: &str) -> Option<&mut TaskView> {
        self.tasks
            .iter_mut()
            .rev()
            .find(|t| t.group_id == group_id && t.state == TaskState::Running)
    }
}

/// The board with the tasks themselves: spawned into a `JoinSet` this runner owns.
#[derive(Debug, Default)]
pub struct TaskRunner {
    board: Mutex<TaskBoard>,
    set: Mutex<JoinSet<()>>,
    handles: Mutex<HashMap<String, AbortHandle>>,
}

fn now_ms() -> i64 {
    i64::try_from(starling_discovery::records::now_ms()).unwrap_or(i64::MAX)
}

impl TaskRunner {
    /// Records `task` as running and spawns `work` for it; its outcome ends it.
    pub fn spawn<F>(self: &std::sync::Arc<Self>, group_id: &str, task: &str, work: F)
    where
        F: Future<Output = Result<(), String>> + Send + 'static,
    {
        lock(&self.board).submit(group_id, task, now_ms());
        let me = std::sync::Arc::downgrade(self);
        let id = group_id.to_owned();
        let mut set = lock(&self.set);
        // Reap the tasks that ended since the last spawn.
        while set.try_join_next().is_some() {}
        let handle = set.spawn(async move {
            let outcome = work.await;
            if let Some(me) = me.upgrade() {
                if let Err(e) = &outcome {
                    tracing::warn!(group = %id, error = %e, "task failed");
                }
                me.end(&id, outcome);
            }
        });
        lock(&self.handles).insert(group_id.to_owned(), handle);
    }

    /// Records that a task run outside the runner (`"wait": true`) started.
    pub fn started(&self, group_id: &str, task: &str) {
        lock(&self.board).submit(group_id, task, now_ms());
    }

    /// Records how a task ended.
    pub fn end(&self, group_id: &str, outcome: Result<(), String>) {
        lock(&self.board).finish(group_id, outcome, now_ms());
        lock(&self.handles).remove(group_id);
    }

    /// Cancels a running task: its work on this node stops at once.
    pub fn cancel(&self, group_id: &str) -> Cancel {
        let outcome = lock(&self.board).cancel(group_id, now_ms());
        if outcome == Cancel::Cancelled {
            if let Some(h) = lock(&self.handles).remove(group_id) {
                h.abort();
            }
        }
        outcome
    }

    /// The task `group_id`, as listed.
    pub fn get(&self, group_id: &str) -> Option<TaskView> {
        lock(&self.board).get(group_id).cloned()
    }

    /// Every remembered task, newest first.
    pub fn list(&self) -> Vec<TaskView> {
        lock(&self.board).list()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_state_is_named_as_the_api_writes_it() {
        for state in [
            TaskState::Running,
            TaskState::Done,
            TaskState::Failed,
            TaskState::Cancelled,
        ] {
            assert_eq!(serde_json::to_value(state).unwrap(), state.name());
        }
    }

    #[test]
    fn the_board_follows_a_task_from_submission_to_its_end() {
        let mut b = TaskBoard::default();
        b.submit("g1", "what is up", 1);
        b.submit("g2", "and down", 2);
        assert_eq!(b.get("g1").map(|t| t.state), Some(TaskState::Running));
        b.finish("g1", Ok(()), 3);
        assert_eq!(b.cancel("g2", 4), Cancel::Cancelled);
        // A cancelled task that ends later stays cancelled; ended ones cannot be cancelled.
        b.finish("g2", Err("aborted".into()), 5);
        assert_eq!(b.get("g2").map(|t| t.state), Some(TaskState::Cancelled));
        assert_eq!(b.cancel("g1", 6), Cancel::Ended(TaskState::Done));
        assert_eq!(b.cancel("nope", 6), Cancel::Unknown);
        let ids: Vec<String> = b.list().into_iter().map(|t| t.group_id).collect();
        assert_eq!(ids, ["g2", "g1"]);
        // Only ended tasks are forgotten, the oldest first.
        for i in 0..REMEMBERED + 5 {
            b.submit(&format!("x{i}"), "t", 10);
            b.finish(&format!("x{i}"), Ok(()), 11);
        }
        b.submit("live", "t", 12);
        assert_eq!(b.list().len(), REMEMBERED + 1);
        assert!(b.get("g1").is_none() && b.get("live").is_some());
    }

    #[tokio::test]
    async fn a_cancelled_task_stops_and_a_finished_one_is_recorded() {
        let runner = Arc::new(TaskRunner::default());
        let (mut tx, rx) = tokio::sync::oneshot::channel::<()>();
        runner.spawn("slow", "wait forever", async move {
            let _ = rx.await;
            Ok(())
        });
        runner.spawn("quick", "done at once", async { Ok(()) });
        assert_eq!(runner.cancel("slow"), Cancel::Cancelled);
        // The aborted future dropped its receiver: the sender sees the channel closed.
        tokio::time::timeout(std::time::Duration::from_secs(5), tx.closed())
            .await
            .expect("the cancelled task stopped");
        for _ in 0..100 {
            if runner.get("quick").map(|t| t.state) == Some(TaskState::Done) {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(runner.get("quick").map(|t| t.state), Some(TaskState::Done));
        assert_eq!(
            runner.get("slow").map(|t| t.state),
            Some(TaskState::Cancelled)
        );
    }
}
