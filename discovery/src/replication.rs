//! Record replication: push on publish, and set reconciliation (negentropy,
//! range-based) on connect and periodically, so that after a partition heals
//! every node converges while transferring only the records it lacks.
//!
//! Reconciliation stream (initiator = the side that opened it):
//! `Neg` frames back and forth until negentropy reports the two differences;
//! then the initiator sends `Want` batches (answered by `Records`…`WantDone`),
//! sends the records the other side lacks as `Records`, and ends with `Done`.

use std::sync::Arc;

use negentropy::{Id, Negentropy, NegentropyStorageVector};
use tokio::sync::broadcast;

use crate::admission::Admission;
use crate::codec::{expect_frame, write_frame, CodecError};
use crate::identity::NodeId;
use crate::metrics::Metrics;
use crate::records::{now_ms, Record, RecordError, RecordId, RecordStore, StoreError};
use crate::wire::{RecordWire, StreamHeader, StreamKind, SyncMsg, WIRE_VERSION};
use crate::SwarmEvent;

/// negentropy frame size limit (must be 0 or >= 4096).
const NEG_FRAME_LIMIT: u64 = 64 * 1024;
/// Most ids in one `Want`.
const MAX_WANT: usize = 1024;
/// Most negentropy rounds before giving up (guards against a looping peer).
const MAX_ROUNDS: usize = 64;

/// Errors of a reconciliation run.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// Frame error; the stream is closed.
    #[error("frame: {0}")]
    Codec(#[from] CodecError),
    /// negentropy refused a message.
    #[error("negentropy: {0}")]
    Negentropy(String),
    /// The store failed.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// The peer broke the protocol.
    #[error("protocol: {0}")]
    Protocol(&'static str),
    /// Opening the stream failed.
    #[error("stream: {0}")]
    Stream(String),
}

impl From<negentropy::Error> for SyncError {
    fn from(e: negentropy::Error) -> Self {
        Self::Negentropy(e.to_string())
    }
}

/// Replication engine: verifies and stores incoming records, pushes and
/// reconciles.
pub(crate) struct Replicator {
    pub(crate) store: Arc<dyn RecordStore>,
    pub(crate) admission: Admission,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) events: broadcast::Sender<SwarmEvent>,
    pub(crate) max_frame: usize,
}

/// Outcome of one reconciliation run, from the initiator's view.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncStats {
    /// Records received and newly stored.
    pub received: usize,
    /// Records sent to the peer.
    pub sent: usize,
    /// negentropy rounds.
    pub rounds: usize,
}

impl Replicator {
    /// Verifies and stores a received record. Returns it if new.
    pub(crate) fn ingest(&self, wire: RecordWire, from: NodeId) -> Option<Record> {
        let record = match Record::verify(wire, now_ms()) {
            Ok(r) => r,
            Err(RecordError::BadSignature) => {
                Metrics::inc(&self.metrics.records_bad_signature);
                tracing::warn!(from = %from.short(), "dropped record with a bad signature");
                return None;
            }
            Err(e) => {
                Metrics::inc(&self.metrics.records_rejected);
                tracing::debug!(from = %from.short(), error = %e, "dropped invalid record");
                return None;
            }
        };
        if !self.admission.allows(&record.author()) {
            Metrics::inc(&self.metrics.records_rejected);
            tracing::debug!(author = %record.author().short(), "dropped record from a non-member author");
            return None;
        }
        self.store_new(record)
    }

    /// Stores a verified record; emits an event if it was new.
    pub(crate) fn store_new(&self, record: Record) -> Option<Record> {
        match self.store.insert(record.clone()) {
            Ok(true) => {
                Metrics::inc(&self.metrics.records_accepted);
                let _ = self.events.send(SwarmEvent::Record {
                    id: record.id(),
                    author: record.author(),
                    kind: record.kind().to_owned(),
                });
                Some(record)
            }
            Ok(false) => {
                Metrics::inc(&self.metrics.records_duplicate);
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "record store failed");
                None
            }
        }
    }

    fn storage(&self) -> Result<NegentropyStorageVector, SyncError> {
        let index = self.store.index()?;
        let mut storage = NegentropyStorageVector::with_capacity(index.len());
        for (ts, id) in index {
            storage.insert(ts, Id::from_byte_array(id.0))?;
        }
        storage.seal()?;
        Ok(storage)
    }

    /// Pushes one record to a connected peer on a unidirectional stream.
    pub(crate) async fn push_to(
        &self,
        conn: &quinn::Connection,
        record: &RecordWire,
    ) -> Result<(), SyncError> {
        let mut send = conn
            .open_uni()
            .await
            .map_err(|e| SyncError::Stream(e.to_string()))?;
        let header = StreamHeader {
            version: WIRE_VERSION,
            kind: StreamKind::Push,
        };
        write_frame(&mut send, &header, self.max_frame).await?;
        write_frame(&mut send, record, self.max_frame).await?;
        let _ = send.finish();
        Ok(())
    }

    /// Reads pushed records from a unidirectional stream.
    pub(crate) async fn serve_push(
        &self,
        from: NodeId,
        recv: &mut quinn::RecvStream,
    ) -> Result<(), CodecError> {
        while let Some(wire) =
            crate::codec::read_frame::<RecordWire, _>(recv, self.max_frame).await?
        {
            self.ingest(wire, from);
        }
        Ok(())
    }

    /// Runs reconciliation as the initiator on a new stream to `peer`.
    pub(crate) async fn sync_with(
        &self,
        conn: &quinn::Connection,
        peer: NodeId,
    ) -> Result<SyncStats, SyncError> {
        let (mut send, mut recv) = conn
            .open_bi()
            .await
            .map_err(|e| SyncError::Stream(e.to_string()))?;
        let max = self.max_frame;
        write_frame(
            &mut send,
            &StreamHeader {
                version: WIRE_VERSION,
                kind: StreamKind::Sync,
            },
            max,
        )
        .await?;
        let mut stats = SyncStats::default();
        let mut neg = Negentropy::owned(self.storage()?, NEG_FRAME_LIMIT)?;
        let mut msg = neg.initiate()?;
        let mut have: Vec<Id> = Vec::new();
        let mut need: Vec<Id> = Vec::new();
        loop {
            stats.rounds += 1;
            if stats.rounds > MAX_ROUNDS {
                return Err(SyncError::Protocol("too many rounds"));
            }
            write_frame(&mut send, &SyncMsg::Neg(msg), max).await?;
            let reply = match expect_frame(&mut recv, max).await? {
                SyncMsg::Neg(r) => r,
                _ => return Err(SyncError::Protocol("expected Neg")),
            };
            match neg.reconcile_with_ids(&reply, &mut have, &mut need)? {
                Some(next) => msg = next,
                None => break,
            }
        }
        // Fetch what we lack.
        for chunk in need.chunks(MAX_WANT) {
            let ids = chunk.iter().map(|id| id.to_bytes()).collect();
            write_frame(&mut send, &SyncMsg::Want(ids), max).await?;
            loop {
                match expect_frame(&mut recv, max).await? {
                    SyncMsg::Records(batch) => {
                        for wire in batch {
                            if self.ingest(wire, peer).is_some() {
                                stats.received += 1;
                            }
                        }
                    }
                    SyncMsg::WantDone => break,
                    _ => return Err(SyncError::Protocol("expected Records or WantDone")),
                }
            }
        }
        // Send what they lack.
        let ids: Vec<RecordId> = have.iter().map(|id| RecordId(id.to_bytes())).collect();
        stats.sent = self.send_records(&mut send, &ids).await?;
        write_frame(&mut send, &SyncMsg::Done, max).await?;
        let _ = send.finish();
        // Wait for the responder to finish reading before the stream drops.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), send.stopped()).await;
        Metrics::inc(&self.metrics.sync_rounds);
        tracing::debug!(peer = %peer.short(), ?stats, "reconciled");
        Ok(stats)
    }

    /// Sends the named records in size-bounded `Records` batches.
    async fn send_records(
        &self,
        send: &mut quinn::SendStream,
        ids: &[RecordId],
    ) -> Result<usize, SyncError> {
        let budget = self.max_frame / 2;
        let mut batch: Vec<RecordWire> = Vec::new();
        let mut size = 0usize;
        let mut sent = 0usize;
        for id in ids {
            let Some(record) = self.store.get(id)? else {
                continue;
            };
            let wire = record.to_wire();
            let len = wire.body.len() + wire.kind.len() + 128;
            if len > budget {
                tracing::warn!(id = %id, "record larger than half a frame; not replicated");
                continue;
            }
            if size + len > budget && !batch.is_empty() {
                write_frame(
                    send,
                    &SyncMsg::Records(std::mem::take(&mut batch)),
                    self.max_frame,
                )
                .await?;
                size = 0;
            }
            size += len;
            batch.push(wire);
            sent += 1;
        }
        if !batch.is_empty() {
            write_frame(send, &SyncMsg::Records(batch), self.max_frame).await?;
        }
        Ok(sent)
    }

    /// Serves a reconciliation stream whose header was already read.
    pub(crate) async fn serve_sync(
        &self,
        peer: NodeId,
        send: &mut quinn::SendStream,
        recv: &mut quinn::RecvStream,
    ) -> Result<(), SyncError> {
        let max = self.max_frame;
        let mut neg = Negentropy::owned(self.storage()?, NEG_FRAME_LIMIT)?;
        let mut rounds = 0usize;
        loop {
            match expect_frame(recv, max).await? {
                SyncMsg::Neg(q) => {
                    rounds += 1;
                    if rounds > MAX_ROUNDS {
                        return Err(SyncError::Protocol("too many rounds"));
                    }
                    let reply = neg.reconcile(&q)?;
                    write_frame(send, &SyncMsg::Neg(reply), max).await?;
                }
                SyncMsg::Want(ids) => {
                    if ids.len() > MAX_WANT {
                        return Err(SyncError::Protocol("Want too large"));
                    }
                    let ids: Vec<RecordId> = ids.into_iter().map(RecordId).collect();
                    self.send_records(send, &ids).await?;
                    write_frame(send, &SyncMsg::WantDone, max).await?;
                }
                SyncMsg::Records(batch) => {
                    for wire in batch {
                        self.ingest(wire, peer);
                    }
                }
                SyncMsg::Done => break,
                SyncMsg::WantDone => return Err(SyncError::Protocol("unexpected WantDone")),
            }
        }
        let _ = send.finish();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn storage(items: &[(u64, [u8; 32])]) -> NegentropyStorageVector {
        let mut s = NegentropyStorageVector::new();
        for (ts, id) in items {
            s.insert(*ts, Id::from_byte_array(*id)).unwrap();
        }
        s.seal().unwrap();
        s
    }

    /// Runs negentropy between two sets in memory, as the stream protocol does.
    fn reconcile(a: &[(u64, [u8; 32])], b: &[(u64, [u8; 32])]) -> (Vec<[u8; 32]>, Vec<[u8; 32]>) {
        let mut client = Negentropy::owned(storage(a), NEG_FRAME_LIMIT).unwrap();
        let mut server = Negentropy::owned(storage(b), NEG_FRAME_LIMIT).unwrap();
        let mut msg = client.initiate().unwrap();
        let (mut have, mut need) = (Vec::new(), Vec::new());
        for _ in 0..MAX_ROUNDS {
            let reply = server.reconcile(&msg).unwrap();
            match client
                .reconcile_with_ids(&reply, &mut have, &mut need)
                .unwrap()
            {
                Some(next) => msg = next,
                None => {
                    let mut have: Vec<[u8; 32]> = have.iter().map(|i| i.to_bytes()).collect();
                    let mut need: Vec<[u8; 32]> = need.iter().map(|i| i.to_bytes()).collect();
                    have.sort();
                    need.sort();
                    return (have, need);
                }
            }
        }
        panic!("did not converge in {MAX_ROUNDS} rounds");
    }

    fn item() -> impl Strategy<Value = (u64, [u8; 32])> {
        (0u64..50, any::<[u8; 32]>())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The differences found are exactly the set differences.
        #[test]
        fn finds_exact_differences(
            common in proptest::collection::vec(item(), 0..300),
            only_a in proptest::collection::vec(item(), 0..40),
            only_b in proptest::collection::vec(item(), 0..40),
        ) {
            let ids_b: std::collections::HashSet<[u8; 32]> = common.iter().chain(&only_b).map(|x| x.1).collect();
            let ids_a: std::collections::HashSet<[u8; 32]> = common.iter().chain(&only_a).map(|x| x.1).collect();
            let mut a: Vec<_> = common.iter().chain(&only_a).copied().collect();
            let mut b: Vec<_> = common.iter().chain(&only_b).copied().collect();
            a.sort(); a.dedup_by_key(|x| x.1);
            b.sort(); b.dedup_by_key(|x| x.1);
            let (have, need) = reconcile(&a, &b);
            let mut want_have: Vec<[u8; 32]> = ids_a.difference(&ids_b).copied().collect();
            let mut want_need: Vec<[u8; 32]> = ids_b.difference(&ids_a).copied().collect();
            want_have.sort();
            want_need.sort();
            prop_assert_eq!(have, want_have);
            prop_assert_eq!(need, want_need);
        }

        /// Hostile negentropy messages are errors, not panics.
        #[test]
        fn garbage_messages_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut server = Negentropy::owned(storage(&[(1, [1; 32]), (2, [2; 32])]), NEG_FRAME_LIMIT).unwrap();
            let _ = server.reconcile(&bytes);
            let mut client = Negentropy::owned(storage(&[(1, [1; 32])]), NEG_FRAME_LIMIT).unwrap();
            let _ = client.initiate().unwrap();
            let _ = client.reconcile_with_ids(&bytes, &mut Vec::new(), &mut Vec::new());
        }
    }

    #[test]
    fn large_sets_reconcile_with_small_differences() {
        let common: Vec<(u64, [u8; 32])> = (0..5000u32)
            .map(|i| {
                let mut id = [0u8; 32];
                id[..4].copy_from_slice(&i.to_be_bytes());
                id[31] = 1;
                (u64::from(i / 10), id)
            })
            .collect();
        let mut a = common.clone();
        a.push((7, [9; 32]));
        let (have, need) = reconcile(&a, &common);
        assert_eq!(have, vec![[9; 32]]);
        assert!(need.is_empty());
    }
}
