//! Work done outside the async runtime — on the node store's thread, on the model's —
//! as seen by the simulated cluster's paused clock.
//!
//! Tokio's paused test clock (`start_paused`) jumps to the next timer whenever the runtime
//! has nothing to run. A task waiting for the store's or the model's reply looks idle
//! then, so every pending timeout would fire while the reply is still being computed.
//! A blocking task holds the clock still (tokio does not auto-advance while one runs), so
//! in this crate's tests a [`Busy`] guard keeps one running for as long as it lives.
//! Outside tests the guard is empty and costs nothing.

/// Holds a paused test clock still while it lives; empty outside this crate's tests.
#[derive(Debug)]
pub(crate) struct Busy {
    #[cfg(test)]
    _release: Option<std::sync::mpsc::Sender<()>>,
}

impl Busy {
    /// A guard for a wait on work outside the runtime.
    pub(crate) fn start() -> Self {
        #[cfg(test)]
        {
            // Outside a runtime (a plain executor, a blocking wait) there is no clock.
            let Ok(handle) = tokio::runtime::Handle::try_current() else {
                return Self { _release: None };
            };
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            // Ends when the guard (the sender) is dropped.
            drop(handle.spawn_blocking(move || {
                let _ = rx.recv();
            }));
            Self { _release: Some(tx) }
        }
        #[cfg(not(test))]
        Self {}
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Busy;

    #[tokio::test(start_paused = true)]
    async fn a_paused_clock_stands_still_while_a_guard_lives() {
        let start = tokio::time::Instant::now();
        // Work on a thread of its own, as the store's: 50 ms of real time.
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let _ = tx.send(());
        });
        let busy = Busy::start();
        tokio::select! {
            _ = rx => {}
            _ = tokio::time::sleep(Duration::from_secs(3600)) => panic!("the clock jumped an hour"),
        }
        drop(busy);
        assert!(start.elapsed() < Duration::from_secs(1));
        // Without a guard, an idle runtime's clock jumps to the next timer.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(start.elapsed() >= Duration::from_secs(3600));
    }
}
