//! Signed, immutable records (agent cards, memories, ...).
//!
//! A record is `{author, kind, timestamp_ms, body}` signed by the author's
//! node key. Its [`RecordId`] is the SHA-256 of the signed content, so equal
//! content means equal id and a record cannot be altered without changing id
//! and invalidating the signature. Receivers verify before storing.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::identity::{Identity, NodeId};
use crate::wire::RecordWire;

/// Longest accepted kind tag.
pub const MAX_KIND_LEN: usize = 64;
/// Largest accepted record body (256 KiB).
pub const MAX_BODY_LEN: usize = 256 * 1024;
/// How far in the future a record timestamp may be (clock skew allowance).
pub const MAX_FUTURE_SKEW_MS: u64 = 10 * 60 * 1000;

/// Why a record was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The signature does not verify against the author.
    #[error("bad signature")]
    BadSignature,
    /// Kind tag empty or too long.
    #[error("invalid kind tag")]
    BadKind,
    /// Body too large.
    #[error("body of {0} bytes exceeds the limit")]
    TooLarge(usize),
    /// Timestamp too far in the future.
    #[error("timestamp is in the future")]
    FromTheFuture,
}

/// Content hash identifying a record.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordId(pub [u8; 32]);

impl fmt::Display for RecordId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for RecordId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RecordId({})", &hex::encode(self.0)[..12])
    }
}

/// The signed portion of a record, encoded canonically with postcard.
#[derive(Serialize)]
struct SignedContent<'a> {
    domain: &'static str,
    author: &'a NodeId,
    kind: &'a str,
    timestamp_ms: u64,
    body: &'a [u8],
}

fn signed_bytes(author: &NodeId, kind: &str, timestamp_ms: u64, body: &[u8]) -> Vec<u8> {
    let content = SignedContent {
        domain: "starling/record/v1",
        author,
        kind,
        timestamp_ms,
        body,
    };
    // Serialising plain strings, integers and byte slices into a Vec cannot fail.
    postcard::to_allocvec(&content).unwrap_or_default()
}

/// A verified, signed record. Only constructible by signing or by verifying.
#[derive(Clone, PartialEq, Eq)]
pub struct Record {
    author: NodeId,
    kind: String,
    timestamp_ms: u64,
    body: Vec<u8>,
    signature: [u8; 64],
    id: RecordId,
}

impl fmt::Debug for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Record")
            .field("id", &self.id)
            .field("author", &self.author)
            .field("kind", &self.kind)
            .field("timestamp_ms", &self.timestamp_ms)
            .field("body_len", &self.body.len())
            .finish()
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn check_shape(kind: &str, body: &[u8]) -> Result<(), RecordError> {
    if kind.is_empty() || kind.len() > MAX_KIND_LEN {
        return Err(RecordError::BadKind);
    }
    if body.len() > MAX_BODY_LEN {
        return Err(RecordError::TooLarge(body.len()));
    }
    Ok(())
}

impl Record {
    /// Creates and signs a record authored by `identity`, stamped now.
    pub fn sign(identity: &Identity, kind: &str, body: Vec<u8>) -> Result<Self, RecordError> {
        Self::sign_at(identity, kind, now_ms(), body)
    }

    /// Creates and signs a record with an explicit timestamp.
    pub fn sign_at(
        identity: &Identity,
        kind: &str,
        timestamp_ms: u64,
        body: Vec<u8>,
    ) -> Result<Self, RecordError> {
        check_shape(kind, &body)?;
        let author = identity.node_id();
        let bytes = signed_bytes(&author, kind, timestamp_ms, &body);
        Ok(Self {
            author,
            kind: kind.to_owned(),
            timestamp_ms,
            signature: identity.sign(&bytes),
            id: RecordId(Sha256::digest(&bytes).into()),
            body,
        })
    }

    /// Rebuilds a record that was verified before it was stored (a persistent
    /// store reading its own rows): recomputes the id but not the signature.
    /// Returns `None` when `expected_id` does not match the content, i.e. the
    /// row was damaged.
    pub(crate) fn from_stored(
        author: NodeId,
        kind: String,
        timestamp_ms: u64,
        body: Vec<u8>,
        signature: [u8; 64],
        expected_id: &RecordId,
    ) -> Option<Self> {
        let bytes = signed_bytes(&author, &kind, timestamp_ms, &body);
        let id = RecordId(Sha256::digest(&bytes).into());
        (id == *expected_id).then_some(Self {
            author,
            kind,
            timestamp_ms,
            body,
            signature,
            id,
        })
    }

    /// The id a received record would have, computed without checking the
    /// signature (a hash, much cheaper than verifying): lets a receiver skip
    /// records it already holds before paying for verification.
    pub fn wire_id(wire: &RecordWire) -> RecordId {
        let bytes = signed_bytes(&wire.author, &wire.kind, wire.timestamp_ms, &wire.body);
        RecordId(Sha256::digest(&bytes).into())
    }

    /// Verifies a received record.
    pub fn verify(wire: RecordWire, now_ms: u64) -> Result<Self, RecordError> {
        check_shape(&wire.kind, &wire.body)?;
        if wire.timestamp_ms > now_ms.saturating_add(MAX_FUTURE_SKEW_MS) {
            return Err(RecordError::FromTheFuture);
        }
        let signature: [u8; 64] = wire
            .signature
            .as_slice()
            .try_into()
            .map_err(|_| RecordError::BadSignature)?;
        let bytes = signed_bytes(&wire.author, &wire.kind, wire.timestamp_ms, &wire.body);
        if !wire.author.verify(&bytes, &signature) {
            return Err(RecordError::BadSignature);
        }
        Ok(Self {
            author: wire.author,
            kind: wire.kind,
            timestamp_ms: wire.timestamp_ms,
            body: wire.body,
            signature,
            id: RecordId(Sha256::digest(&bytes).into()),
        })
    }

    /// The wire form.
    pub fn to_wire(&self) -> RecordWire {
        RecordWire {
            author: self.author,
            kind: self.kind.clone(),
            timestamp_ms: self.timestamp_ms,
            body: self.body.clone(),
            signature: self.signature.to_vec(),
        }
    }

    /// Content id.
    pub fn id(&self) -> RecordId {
        self.id
    }
    /// Author node.
    pub fn author(&self) -> NodeId {
        self.author
    }
    /// Kind tag.
    pub fn kind(&self) -> &str {
        &self.kind
    }
    /// Author's timestamp (ms since the Unix epoch).
    pub fn timestamp_ms(&self) -> u64 {
        self.timestamp_ms
    }
    /// Body bytes.
    pub fn body(&self) -> &[u8] {
        &self.body
    }
    /// The author's signature.
    pub fn signature(&self) -> &[u8; 64] {
        &self.signature
    }
}

/// Errors from a record store backend.
#[derive(Debug, thiserror::Error)]
#[error("record store: {0}")]
pub struct StoreError(pub String);

/// Storage for verified records. The node may back this with SQLite; the
/// replication engine only needs these operations.
///
/// Implementations are called from async tasks and must not block for long.
pub trait RecordStore: Send + Sync + 'static {
    /// Inserts a verified record; returns `false` if it was already present.
    fn insert(&self, record: Record) -> Result<bool, StoreError>;
    /// Inserts several verified records; one flag per record, `false` for
    /// those already present. The default inserts one at a time; a backend
    /// with per-insert commit cost should do the batch in one transaction.
    fn insert_many(&self, records: Vec<Record>) -> Result<Vec<bool>, StoreError> {
        records.into_iter().map(|r| self.insert(r)).collect()
    }
    /// Whether a record with this id is stored.
    fn contains(&self, id: &RecordId) -> Result<bool, StoreError>;
    /// Fetches one record.
    fn get(&self, id: &RecordId) -> Result<Option<Record>, StoreError>;
    /// All `(timestamp_ms, id)` pairs, sorted by timestamp then id: the set
    /// that reconciliation fingerprints.
    fn index(&self) -> Result<Vec<(u64, RecordId)>, StoreError>;
    /// All records of one kind, oldest first.
    fn by_kind(&self, kind: &str) -> Result<Vec<Record>, StoreError>;
    /// Number of stored records.
    fn len(&self) -> Result<usize, StoreError> {
        Ok(self.index()?.len())
    }
    /// Whether the store is empty.
    fn is_empty(&self) -> Result<bool, StoreError> {
        Ok(self.len()? == 0)
    }
}

/// In-memory [`RecordStore`].
#[derive(Default)]
pub struct MemRecordStore {
    inner: Mutex<MemInner>,
}

#[derive(Default)]
struct MemInner {
    by_id: HashMap<RecordId, Record>,
    index: BTreeMap<(u64, RecordId), ()>,
}

impl MemRecordStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, MemInner>, StoreError> {
        self.inner
            .lock()
            .map_err(|_| StoreError("lock poisoned".into()))
    }
}

impl RecordStore for MemRecordStore {
    fn insert(&self, record: Record) -> Result<bool, StoreError> {
        let mut g = self.lock()?;
        if g.by_id.contains_key(&record.id) {
            return Ok(false);
        }
        g.index.insert((record.timestamp_ms, record.id), ());
        g.by_id.insert(record.id, record);
        Ok(true)
    }

    fn insert_many(&self, records: Vec<Record>) -> Result<Vec<bool>, StoreError> {
        let mut g = self.lock()?;
        Ok(records
            .into_iter()
            .map(|record| {
                if g.by_id.contains_key(&record.id) {
                    return false;
                }
                g.index.insert((record.timestamp_ms, record.id), ());
                g.by_id.insert(record.id, record);
                true
            })
            .collect())
    }

    fn contains(&self, id: &RecordId) -> Result<bool, StoreError> {
        Ok(self.lock()?.by_id.contains_key(id))
    }

    fn get(&self, id: &RecordId) -> Result<Option<Record>, StoreError> {
        Ok(self.lock()?.by_id.get(id).cloned())
    }

    fn index(&self) -> Result<Vec<(u64, RecordId)>, StoreError> {
        Ok(self.lock()?.index.keys().copied().collect())
    }

    fn by_kind(&self, kind: &str) -> Result<Vec<Record>, StoreError> {
        let g = self.lock()?;
        Ok(g.index
            .keys()
            .filter_map(|(_, id)| g.by_id.get(id))
            .filter(|r| r.kind == kind)
            .cloned()
            .collect())
    }

    fn len(&self) -> Result<usize, StoreError> {
        Ok(self.lock()?.by_id.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_record_verifies_and_tampering_fails() {
        let me = Identity::generate();
        let r = Record::sign(&me, "card", b"hello".to_vec()).unwrap();
        let back = Record::verify(r.to_wire(), now_ms()).unwrap();
        assert_eq!(back, r);

        let mut w = r.to_wire();
        w.body = b"hellO".to_vec();
        assert_eq!(Record::verify(w, now_ms()), Err(RecordError::BadSignature));

        let mut w = r.to_wire();
        w.author = Identity::generate().node_id();
        assert_eq!(Record::verify(w, now_ms()), Err(RecordError::BadSignature));

        let mut w = r.to_wire();
        w.kind = "memory".into();
        assert_eq!(Record::verify(w, now_ms()), Err(RecordError::BadSignature));

        let mut w = r.to_wire();
        w.signature.truncate(10);
        assert_eq!(Record::verify(w, now_ms()), Err(RecordError::BadSignature));
    }

    #[test]
    fn shape_limits() {
        let me = Identity::generate();
        assert_eq!(
            Record::sign(&me, "", vec![]).unwrap_err(),
            RecordError::BadKind
        );
        assert!(matches!(
            Record::sign(&me, "k", vec![0; MAX_BODY_LEN + 1]),
            Err(RecordError::TooLarge(_))
        ));
        let future = Record::sign_at(&me, "k", now_ms() + 2 * MAX_FUTURE_SKEW_MS, vec![]).unwrap();
        assert_eq!(
            Record::verify(future.to_wire(), now_ms()),
            Err(RecordError::FromTheFuture)
        );
    }

    #[test]
    fn ids_are_content_hashes() {
        let me = Identity::generate();
        let a = Record::sign_at(&me, "k", 5, b"x".to_vec()).unwrap();
        let b = Record::sign_at(&me, "k", 5, b"x".to_vec()).unwrap();
        let c = Record::sign_at(&me, "k", 6, b"x".to_vec()).unwrap();
        assert_eq!(a.id(), b.id());
        assert_ne!(a.id(), c.id());
    }

    #[test]
    fn mem_store_basics() {
        let me = Identity::generate();
        let s = MemRecordStore::new();
        let a = Record::sign_at(&me, "card", 2, b"a".to_vec()).unwrap();
        let b = Record::sign_at(&me, "memory", 1, b"b".to_vec()).unwrap();
        assert!(s.insert(a.clone()).unwrap());
        assert!(!s.insert(a.clone()).unwrap());
        assert!(s.insert(b.clone()).unwrap());
        assert_eq!(s.len().unwrap(), 2);
        assert!(s.contains(&a.id()).unwrap());
        assert_eq!(s.get(&b.id()).unwrap(), Some(b.clone()));
        assert_eq!(s.index().unwrap(), vec![(1, b.id()), (2, a.id())]);
        assert_eq!(s.by_kind("card").unwrap(), vec![a.clone()]);
        let c = Record::sign_at(&me, "card", 3, b"c".to_vec()).unwrap();
        assert_eq!(
            s.insert_many(vec![a.clone(), c.clone(), c.clone()])
                .unwrap(),
            vec![false, true, false]
        );
        assert_eq!(s.len().unwrap(), 3);
        assert_eq!(
            s.index().unwrap(),
            vec![(1, b.id()), (2, a.id()), (3, c.id())]
        );
    }

    #[test]
    fn wire_id_matches_verified_id() {
        let me = Identity::generate();
        let r = Record::sign(&me, "card", b"x".to_vec()).unwrap();
        assert_eq!(Record::wire_id(&r.to_wire()), r.id());
    }
}
