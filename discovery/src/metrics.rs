//! Counters for what the networking layer accepted and dropped.

use std::sync::atomic::{AtomicU64, Ordering};

/// Monotonic counters, shared by all tasks of a swarm.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Records verified and newly stored.
    pub records_accepted: AtomicU64,
    /// Records received that were already stored.
    pub records_duplicate: AtomicU64,
    /// Records dropped for a bad signature.
    pub records_bad_signature: AtomicU64,
    /// Records dropped for another reason (shape, clock, author not allowed).
    pub records_rejected: AtomicU64,
    /// Connections refused at admission (wrong secret, not allowlisted, ...).
    pub admission_refused: AtomicU64,
    /// Connections admitted.
    pub admission_accepted: AtomicU64,
    /// Streams closed because of a malformed or oversized frame.
    pub bad_frames: AtomicU64,
    /// Reconciliation rounds completed.
    pub sync_rounds: AtomicU64,
}

/// A plain copy of [`Metrics`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct MetricsSnapshot {
    /// See [`Metrics::records_accepted`].
    pub records_accepted: u64,
    /// See [`Metrics::records_duplicate`].
    pub records_duplicate: u64,
    /// See [`Metrics::records_bad_signature`].
    pub records_bad_signature: u64,
    /// See [`Metrics::records_rejected`].
    pub records_rejected: u64,
    /// See [`Metrics::admission_refused`].
    pub admission_refused: u64,
    /// See [`Metrics::admission_accepted`].
    pub admission_accepted: u64,
    /// See [`Metrics::bad_frames`].
    pub bad_frames: u64,
    /// See [`Metrics::sync_rounds`].
    pub sync_rounds: u64,
}

impl Metrics {
    /// Adds one to a counter.
    pub(crate) fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads all counters.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MetricsSnapshot {
            records_accepted: r(&self.records_accepted),
            records_duplicate: r(&self.records_duplicate),
            records_bad_signature: r(&self.records_bad_signature),
            records_rejected: r(&self.records_rejected),
            admission_refused: r(&self.admission_refused),
            admission_accepted: r(&self.admission_accepted),
            bad_frames: r(&self.bad_frames),
            sync_rounds: r(&self.sync_rounds),
        }
    }
}
