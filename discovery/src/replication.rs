//! Record replication: push on publish, and set reconciliation (negentropy,
//! range-based) on connect and periodically, so that after a partition heals
//! every node converges while transferring only the records it lacks.
//!
//! Reconciliation stream (initiator = the side that opened it):
//! `Neg` frames back and forth until negentropy reports the two differences;
//! then the initiator pulls what it lacks with `Want` batches of 16-byte id
//! prefixes (answered by `Records`…`WantDone`), and offers what the other
//! side lacks with `Offer` (full ids); the responder answers with `Take`
//! (indices into the offer, answered by `Records`…`WantDone`) until an empty
//! `Take`; the initiator ends with `Done`.
//!
//! Both pulls go through [`InFlight`]: a record that another concurrent sync
//! of this node is already fetching is not asked for again; it is fetched
//! here only if that sync fails to deliver it. Received records already held
//! are dropped before signature verification, and each batch is stored with
//! one [`RecordStore::insert_many`].

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use negentropy::{Id, Negentropy, NegentropyStorageVector};
use tokio::io::AsyncWriteExt;
use tokio::sync::{broadcast, Notify};

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
/// How long a sync waits for records that another sync is fetching before
/// fetching them itself.
const DEFERRED_WAIT: Duration = Duration::from_secs(5);
/// Ids asked for in one `Want`/`Take` round while pulling.
const FETCH_BATCH: usize = 256;

/// Leading bytes of a record id, as named in a `Want`. The responder knows
/// every id it may be asked for (negentropy reported them from its set), so a
/// prefix this long names exactly one of them: finding a second record with a
/// given 128-bit prefix of a SHA-256 is out of reach.
type IdPrefix = [u8; 16];

fn prefix(id: &RecordId) -> IdPrefix {
    let mut p = [0u8; 16];
    p.copy_from_slice(&id.0[..16]);
    p
}

/// Record ids some reconciliation is fetching right now, with the sync that
/// owns each. Concurrent syncs with several peers (on connect, periodic)
/// discover the same missing records; only the owner fetches them, the others
/// wait for it and fetch only what is still missing once it is done. Claims
/// are released by [`Claim`]'s drop, so a failed or cancelled sync never
/// strands an id.
#[derive(Default)]
pub(crate) struct InFlight {
    owners: Mutex<HashMap<RecordId, u64>>,
    next_owner: AtomicU64,
    released: Notify,
}

/// Ids claimed by one sync; released when dropped.
struct Claim<'a> {
    table: &'a InFlight,
    owner: u64,
    held: HashSet<RecordId>,
}

impl InFlight {
    /// A claim handle for a new sync.
    fn claim_handle(&self) -> Claim<'_> {
        Claim {
            table: self,
            owner: self.next_owner.fetch_add(1, Ordering::Relaxed),
            held: HashSet::new(),
        }
    }

    /// Number of ids currently claimed (for tests and metrics).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.owners.lock().map(|o| o.len()).unwrap_or(0)
    }
}

impl Claim<'_> {
    /// Claims the ids nobody else is fetching; returns `(mine, others')`.
    fn take(&mut self, ids: Vec<RecordId>) -> (Vec<RecordId>, Vec<RecordId>) {
        let Ok(mut owners) = self.table.owners.lock() else {
            // A poisoned table only costs deduplication: fetch everything.
            return (ids, Vec::new());
        };
        let (mut mine, mut theirs) = (Vec::new(), Vec::new());
        for id in ids {
            match owners.get(&id) {
                Some(o) if *o != self.owner => theirs.push(id),
                _ => {
                    owners.insert(id, self.owner);
                    self.held.insert(id);
                    mine.push(id);
                }
            }
        }
        (mine, theirs)
    }

    /// Releases `ids` (fetched, or given up) and wakes waiting syncs.
    fn release(&mut self, ids: &[RecordId]) {
        if let Ok(mut owners) = self.table.owners.lock() {
            for id in ids {
                if self.held.remove(id) && owners.get(id) == Some(&self.owner) {
                    owners.remove(id);
                }
            }
        }
        self.table.released.notify_waiters();
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let held: Vec<RecordId> = self.held.iter().copied().collect();
        self.release(&held);
    }
}

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
    pub(crate) in_flight: InFlight,
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

/// Most pushed records stored in one batch, and sent on one push stream.
pub(crate) const PUSH_BATCH: usize = 512;

impl Replicator {
    /// Verifies and stores a batch of received records in one store call;
    /// returns the new ones. Records already stored are counted as
    /// duplicates without paying for signature verification.
    pub(crate) fn ingest_batch(&self, wires: Vec<RecordWire>, from: NodeId) -> Vec<Record> {
        let now = now_ms();
        let mut seen = HashSet::with_capacity(wires.len());
        let mut fresh = Vec::with_capacity(wires.len());
        for wire in wires {
            let id = Record::wire_id(&wire);
            if !seen.insert(id) || self.store.contains(&id).unwrap_or(false) {
                Metrics::inc(&self.metrics.records_duplicate);
                continue;
            }
            let record = match Record::verify(wire, now) {
                Ok(r) => r,
                Err(RecordError::BadSignature) => {
                    Metrics::inc(&self.metrics.records_bad_signature);
                    tracing::warn!(from = %from.short(), "dropped record with a bad signature");
                    continue;
                }
                Err(e) => {
                    Metrics::inc(&self.metrics.records_rejected);
                    tracing::debug!(from = %from.short(), error = %e, "dropped invalid record");
                    continue;
                }
            };
            if !self.admission.allows(&record.author()) {
                Metrics::inc(&self.metrics.records_rejected);
                tracing::debug!(author = %record.author().short(), "dropped record from a non-member author");
                continue;
            }
            fresh.push(record);
        }
        self.store_many(fresh)
    }

    /// Stores verified records; emits an event for each new one and returns them.
    fn store_many(&self, records: Vec<Record>) -> Vec<Record> {
        if records.is_empty() {
            return records;
        }
        let flags = match self.store.insert_many(records.clone()) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, "record store failed");
                return Vec::new();
            }
        };
        let mut out = Vec::with_capacity(records.len());
        for (record, new) in records.into_iter().zip(flags) {
            if new {
                Metrics::inc(&self.metrics.records_accepted);
                let _ = self.events.send(SwarmEvent::Record {
                    id: record.id(),
                    author: record.author(),
                    kind: record.kind().to_owned(),
                });
                out.push(record);
            } else {
                Metrics::inc(&self.metrics.records_duplicate);
            }
        }
        out
    }

    /// Stores a verified record and emits an event if it was new. Returns whether it was
    /// new, or the store's error (for records this node authors: the caller must know that
    /// nothing was stored).
    pub(crate) fn store_checked(&self, record: Record) -> Result<bool, StoreError> {
        match self.store.insert(record.clone()) {
            Ok(true) => {
                Metrics::inc(&self.metrics.records_accepted);
                let _ = self.events.send(SwarmEvent::Record {
                    id: record.id(),
                    author: record.author(),
                    kind: record.kind().to_owned(),
                });
                Ok(true)
            }
            Ok(false) => {
                Metrics::inc(&self.metrics.records_duplicate);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    fn storage(&self) -> Result<NegentropyStorageVector, SyncError> {
        Ok(self.storage_and_prefixes(false)?.0)
    }

    /// The negentropy storage of the current record set and, with
    /// `prefixes`, a map from id prefix to id over the same set (the
    /// responder resolves `Want` prefixes with it).
    fn storage_and_prefixes(
        &self,
        prefixes: bool,
    ) -> Result<(NegentropyStorageVector, HashMap<IdPrefix, RecordId>), SyncError> {
        let index = self.store.index()?;
        let mut storage = NegentropyStorageVector::with_capacity(index.len());
        let mut by_prefix = HashMap::new();
        if prefixes {
            by_prefix.reserve(index.len());
        }
        for (ts, id) in index {
            storage.insert(ts, Id::from_byte_array(id.0))?;
            if prefixes {
                by_prefix.insert(prefix(&id), id);
            }
        }
        storage.seal()?;
        Ok((storage, by_prefix))
    }

    /// Pushes records to a connected peer, one frame each, on one unidirectional stream.
    pub(crate) async fn push_to(
        &self,
        conn: &quinn::Connection,
        records: &[std::sync::Arc<RecordWire>],
    ) -> Result<(), SyncError> {
        let send = conn
            .open_uni()
            .await
            .map_err(|e| SyncError::Stream(e.to_string()))?;
        let mut send = tokio::io::BufWriter::with_capacity(64 * 1024, send);
        let header = StreamHeader {
            version: WIRE_VERSION,
            kind: StreamKind::Push,
        };
        write_frame(&mut send, &header, self.max_frame).await?;
        for record in records {
            write_frame(&mut send, record.as_ref(), self.max_frame).await?;
        }
        send.flush()
            .await
            .map_err(|e| SyncError::Stream(e.to_string()))?;
        let _ = send.into_inner().finish();
        Ok(())
    }

    /// Reads pushed records from a unidirectional stream, storing them in batches of
    /// at most [`PUSH_BATCH`] (one store transaction each) and whatever arrived before
    /// the stream paused.
    pub(crate) async fn serve_push(
        &self,
        from: NodeId,
        recv: &mut quinn::RecvStream,
    ) -> Result<(), CodecError> {
        let mut recv = tokio::io::BufReader::with_capacity(64 * 1024, recv);
        let mut batch = Vec::new();
        loop {
            // Store what we have before waiting on the network for more.
            if !batch.is_empty() && recv.buffer().is_empty() {
                self.ingest_batch(std::mem::take(&mut batch), from);
            }
            match crate::codec::read_frame::<RecordWire, _>(&mut recv, self.max_frame).await {
                Ok(Some(wire)) => {
                    batch.push(wire);
                    if batch.len() >= PUSH_BATCH {
                        self.ingest_batch(std::mem::take(&mut batch), from);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    // Keep the well-formed records that came before the bad frame.
                    self.ingest_batch(batch, from);
                    return Err(e);
                }
            }
        }
        self.ingest_batch(batch, from);
        Ok(())
    }

    /// Runs reconciliation as the initiator on a new stream to `peer`.
    pub(crate) async fn sync_with(
        &self,
        conn: &quinn::Connection,
        peer: NodeId,
    ) -> Result<SyncStats, SyncError> {
        let (mut send, recv) = conn
            .open_bi()
            .await
            .map_err(|e| SyncError::Stream(e.to_string()))?;
        let mut recv = tokio::io::BufReader::with_capacity(64 * 1024, recv);
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
        // Fetch what we lack, except what another sync is already fetching.
        let need: Vec<RecordId> = need.iter().map(|id| RecordId(id.to_bytes())).collect();
        stats.received = self.pull(&mut send, &mut recv, peer, need, None).await?;
        // Offer what they lack; they take what they still lack and nobody
        // else is sending them.
        let have: Vec<RecordId> = have.iter().map(|id| RecordId(id.to_bytes())).collect();
        for offer in have.chunks(MAX_WANT) {
            write_frame(
                &mut send,
                &SyncMsg::Offer(offer.iter().map(|id| id.0).collect()),
                max,
            )
            .await?;
            loop {
                let take = match expect_frame(&mut recv, max).await? {
                    SyncMsg::Take(t) => t,
                    _ => return Err(SyncError::Protocol("expected Take")),
                };
                if take.is_empty() {
                    break;
                }
                let mut ids = Vec::with_capacity(take.len());
                for i in take {
                    let id = offer
                        .get(i as usize)
                        .ok_or(SyncError::Protocol("Take index out of range"))?;
                    ids.push(*id);
                }
                stats.sent += self.send_records(&mut send, &ids).await?;
                write_frame(&mut send, &SyncMsg::WantDone, max).await?;
            }
        }
        write_frame(&mut send, &SyncMsg::Done, max).await?;
        let _ = send.finish();
        // Wait for the responder to finish reading before the stream drops.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), send.stopped()).await;
        Metrics::inc(&self.metrics.sync_rounds);
        tracing::debug!(peer = %peer.short(), ?stats, "reconciled");
        Ok(stats)
    }

    /// Fetches from `peer` the records of `ids` this node still lacks,
    /// leaving to other syncs the ids they are already fetching, then
    /// fetching here whatever those did not deliver. With `offer`, the peer
    /// offered these ids and they are asked for by index (`Take`); without,
    /// by id (`Want`). Returns the number of new records stored.
    async fn pull(
        &self,
        send: &mut quinn::SendStream,
        recv: &mut (impl tokio::io::AsyncRead + Unpin),
        peer: NodeId,
        ids: Vec<RecordId>,
        offer: Option<&HashMap<RecordId, u32>>,
    ) -> Result<usize, SyncError> {
        let missing = |id: &RecordId| !self.store.contains(id).unwrap_or(false);
        let ids: Vec<RecordId> = ids.into_iter().filter(missing).collect();
        let mut claim = self.in_flight.claim_handle();
        let (mine, mut deferred) = claim.take(ids);
        let mut received = self
            .fetch(send, recv, peer, &mine, offer, &mut claim)
            .await?;
        // The wait is bounded by progress: it restarts whenever some of the
        // deferred records arrive.
        let mut deadline = tokio::time::Instant::now() + DEFERRED_WAIT;
        while !deferred.is_empty() {
            let released = self.in_flight.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            let before = deferred.len();
            deferred.retain(missing);
            if deferred.len() < before {
                deadline = tokio::time::Instant::now() + DEFERRED_WAIT;
            }
            // Past the deadline, fetch the rest here even if claimed elsewhere.
            let (mine, theirs) = if tokio::time::Instant::now() >= deadline {
                (std::mem::take(&mut deferred), Vec::new())
            } else {
                claim.take(std::mem::take(&mut deferred))
            };
            received += self
                .fetch(send, recv, peer, &mine, offer, &mut claim)
                .await?;
            deferred = theirs;
            if !deferred.is_empty() {
                let _ = tokio::time::timeout_at(deadline, released).await;
            }
        }
        Ok(received)
    }

    /// Asks the peer for `ids` (in `Want` batches, or as one `Take` of
    /// indices into its offer) and stores what arrives; returns the number
    /// of new records.
    async fn fetch(
        &self,
        send: &mut quinn::SendStream,
        recv: &mut (impl tokio::io::AsyncRead + Unpin),
        peer: NodeId,
        ids: &[RecordId],
        offer: Option<&HashMap<RecordId, u32>>,
        claim: &mut Claim<'_>,
    ) -> Result<usize, SyncError> {
        let max = self.max_frame;
        let mut received = 0;
        // Small batches: claims are released (and waiting syncs woken) as
        // each one lands, not after the whole fetch.
        for chunk in ids.chunks(FETCH_BATCH) {
            let msg = match offer {
                None => SyncMsg::Want(chunk.iter().map(prefix).collect()),
                Some(index) => SyncMsg::Take(
                    chunk
                        .iter()
                        .filter_map(|id| index.get(id).copied())
                        .collect(),
                ),
            };
            write_frame(send, &msg, max).await?;
            loop {
                match expect_frame(recv, max).await? {
                    SyncMsg::Records(batch) => {
                        received += self.ingest_batch(batch, peer).len();
                    }
                    SyncMsg::WantDone => break,
                    _ => return Err(SyncError::Protocol("expected Records or WantDone")),
                }
            }
            claim.release(chunk);
        }
        Ok(received)
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
        recv: &mut (impl tokio::io::AsyncRead + Unpin),
    ) -> Result<(), SyncError> {
        let max = self.max_frame;
        let (storage, by_prefix) = self.storage_and_prefixes(true)?;
        let mut neg = Negentropy::owned(storage, NEG_FRAME_LIMIT)?;
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
                    // A prefix that names nothing here is skipped: the
                    // initiator fetches it elsewhere or at the next sync.
                    let ids: Vec<RecordId> = ids
                        .iter()
                        .filter_map(|p| by_prefix.get(p).copied())
                        .collect();
                    self.send_records(send, &ids).await?;
                    write_frame(send, &SyncMsg::WantDone, max).await?;
                }
                SyncMsg::Offer(ids) => {
                    if ids.len() > MAX_WANT {
                        return Err(SyncError::Protocol("Offer too large"));
                    }
                    let ids: Vec<RecordId> = ids.into_iter().map(RecordId).collect();
                    let index: HashMap<RecordId, u32> =
                        ids.iter().zip(0u32..).map(|(id, i)| (*id, i)).collect();
                    self.pull(send, recv, peer, ids, Some(&index)).await?;
                    write_frame(send, &SyncMsg::Take(Vec::new()), max).await?;
                }
                SyncMsg::Done => break,
                SyncMsg::Records(_) | SyncMsg::WantDone | SyncMsg::Take(_) => {
                    return Err(SyncError::Protocol("unexpected message from the initiator"))
                }
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
    fn in_flight_claims_skip_others_and_release_on_drop() {
        let table = InFlight::default();
        let ids: Vec<RecordId> = (0u8..4).map(|i| RecordId([i; 32])).collect();
        let mut a = table.claim_handle();
        let (mine, theirs) = a.take(ids[..3].to_vec());
        assert_eq!((mine.len(), theirs.len()), (3, 0));
        {
            let mut b = table.claim_handle();
            let (mine, theirs) = b.take(ids.clone());
            assert_eq!(mine, vec![ids[3]]);
            assert_eq!(theirs, ids[..3].to_vec());
            // b fails here: its claim is released by drop.
        }
        assert_eq!(table.len(), 3);
        a.release(&ids[..1]);
        let mut c = table.claim_handle();
        let (mine, theirs) = c.take(ids.clone());
        assert_eq!(mine, vec![ids[0], ids[3]]);
        assert_eq!(theirs, vec![ids[1], ids[2]]);
        drop(a);
        drop(c);
        assert_eq!(table.len(), 0);
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
