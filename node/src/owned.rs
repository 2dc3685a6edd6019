//! Background tasks that belong to a component: spawned into a [`JoinSet`] the component
//! owns, so they are aborted when its last handle is dropped, and awaited by
//! [`Background::close`] when it shuts down (after its cancellation fired, so they are
//! stopping). Nothing here knows what the tasks do.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::task::JoinSet;

/// A set of owned background tasks (cheap to clone; the clones share it).
#[derive(Debug, Clone, Default)]
pub struct Background(Arc<Mutex<Tasks>>);

#[derive(Debug, Default)]
struct Tasks {
    set: JoinSet<()>,
    /// Closed: what is spawned now is dropped at once (the owner is shutting down).
    closed: bool,
}

impl Background {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    fn tasks(&self) -> MutexGuard<'_, Tasks> {
        // A panic while the lock is held leaves the set whole (spawning is one call).
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `task` in the background (on the current runtime), owned by this set. Tasks
    /// that ended are reaped first, so a long-lived set does not grow. After
    /// [`close`](Self::close) nothing runs: the task is dropped unstarted.
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let mut t = self.tasks();
        if t.closed {
            tracing::debug!("background task not started: its owner is shutting down");
            return;
        }
        while t.set.try_join_next().is_some() {}
        t.set.spawn(task);
    }

    /// Tasks not yet reaped (running, or ended since the last spawn or close).
    pub fn len(&self) -> usize {
        self.tasks().set.len()
    }

    /// Whether no task is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Closes the set (later spawns are dropped unstarted), waits up to `limit` for every
    /// task to end, then aborts those still running and waits for them to go. Returns how
    /// many had to be aborted. A task that panicked is logged.
    pub async fn close(&self, limit: Duration) -> usize {
        let mut set = {
            let mut t = self.tasks();
            t.closed = true;
            std::mem::take(&mut t.set)
        };
        let drain = async {
            while let Some(r) = set.join_next().await {
                if let Err(e) = r {
                    if e.is_panic() {
                        tracing::error!(error = %e, "a background task panicked");
                    }
                }
            }
        };
        if tokio::time::timeout(limit, drain).await.is_ok() {
            return 0;
        }
        let left = set.len();
        set.shutdown().await;
        left
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_util::sync::CancellationToken;

    /// A task that stops on its cancel is awaited (not aborted); one that ignores it is
    /// aborted at the limit; after close nothing starts; dropping the last handle aborts
    /// what is left.
    #[tokio::test(start_paused = true)]
    async fn close_awaits_stopping_tasks_and_aborts_the_rest() {
        let bg = Background::new();
        let cancel = CancellationToken::new();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let c = cancel.clone();
        bg.spawn(async move {
            c.cancelled().await;
            // Work after the cancel (a last write) still finishes.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let _ = done_tx.send(());
        });
        bg.spawn(std::future::pending());
        assert_eq!(bg.len(), 2);
        cancel.cancel();
        assert_eq!(bg.close(Duration::from_secs(5)).await, 1);
        assert!(done_rx.await.is_ok(), "the stopping task was cut short");
        assert!(bg.is_empty());
        // Closed: a task spawned now never runs.
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        bg.spawn(async move {
            let _ = tx.send(());
        });
        assert!(bg.is_empty());
        assert!(rx.await.is_err(), "a task ran after close");

        let bg = Background::new();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        bg.spawn(async move {
            let _keep = tx;
            std::future::pending::<()>().await;
        });
        drop(bg);
        assert!(rx.await.is_err(), "dropping the set left its task running");
    }
}
