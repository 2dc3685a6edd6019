//! A persistent [`RecordStore`] in SQLite, so a node's cards and memories (and everything
//! it received from peers) survive a restart or a `kill -9`.
//!
//! Only verified records are ever inserted, so rows are read back without re-checking
//! signatures; each row's id is recomputed from its content, and a row that does not
//! match (disk damage, manual editing) is skipped with a warning rather than served.
//! The `(timestamp, id)` index that reconciliation fingerprints is kept in memory,
//! loaded once at open.
//!
//! Durability: WAL journal with `synchronous = NORMAL`. Every insert is its own
//! committed transaction before [`RecordStore::insert`] returns, so a killed process
//! loses nothing it acknowledged; only an operating-system crash or power loss can
//! drop the last transactions, which peers then re-send through reconciliation.

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};

use crate::identity::NodeId;
use crate::records::{Record, RecordId, RecordStore, StoreError};

/// Schema version written to `PRAGMA user_version`.
const SCHEMA_VERSION: i64 = 1;

/// SQLite-backed record store.
pub struct SqliteRecordStore {
    path: PathBuf,
    inner: Mutex<Inner>,
}

struct Inner {
    conn: Connection,
    index: BTreeSet<(u64, RecordId)>,
    ids: HashSet<RecordId>,
}

fn err(e: impl std::fmt::Display) -> StoreError {
    StoreError(e.to_string())
}

impl SqliteRecordStore {
    /// Opens (creating if needed) the store at `path`. A file that is not a database, or
    /// one written by a newer Starling, is an error naming the path; nothing is deleted.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let ctx = |e: rusqlite::Error| StoreError(format!("record store {}: {e}", path.display()));
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| StoreError(format!("cannot create {}: {e}", dir.display())))?;
        }
        let conn = Connection::open(path).map_err(ctx)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(ctx)?;
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(ctx)?;
        if version > SCHEMA_VERSION {
            return Err(StoreError(format!(
                "record store {} was written by a newer Starling (schema {version}, this one knows {SCHEMA_VERSION})",
                path.display()
            )));
        }
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(ctx)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(ctx)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS records (
                id BLOB PRIMARY KEY,
                author BLOB NOT NULL,
                kind TEXT NOT NULL,
                timestamp_ms INTEGER NOT NULL,
                body BLOB NOT NULL,
                signature BLOB NOT NULL
            ) WITHOUT ROWID;
            CREATE INDEX IF NOT EXISTS records_kind ON records(kind, timestamp_ms);",
        )
        .map_err(ctx)?;
        conn.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(ctx)?;
        let mut index = BTreeSet::new();
        let mut ids = HashSet::new();
        {
            let mut stmt = conn
                .prepare("SELECT id, timestamp_ms FROM records")
                .map_err(ctx)?;
            let rows = stmt
                .query_map([], |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, i64>(1)?)))
                .map_err(ctx)?;
            for row in rows {
                let (id, ts) = row.map_err(ctx)?;
                let Ok(id) = <[u8; 32]>::try_from(id.as_slice()) else {
                    tracing::warn!(path = %path.display(), "skipping a record row with a malformed id");
                    continue;
                };
                let id = RecordId(id);
                index.insert((ts.max(0) as u64, id));
                ids.insert(id);
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            inner: Mutex::new(Inner { conn, index, ids }),
        })
    }

    /// Opens `records.db` in a node's data directory.
    pub fn in_dir(data_dir: &Path) -> Result<Self, StoreError> {
        Self::open(&data_dir.join("records.db"))
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>, StoreError> {
        self.inner
            .lock()
            .map_err(|_| StoreError("record store lock poisoned".into()))
    }

    fn row_to_record(&self, row: &rusqlite::Row<'_>) -> rusqlite::Result<Option<Record>> {
        let id: Vec<u8> = row.get(0)?;
        let author: Vec<u8> = row.get(1)?;
        let kind: String = row.get(2)?;
        let ts: i64 = row.get(3)?;
        let body: Vec<u8> = row.get(4)?;
        let sig: Vec<u8> = row.get(5)?;
        let parsed = (|| {
            let id = RecordId(id.as_slice().try_into().ok()?);
            let author = NodeId::from_bytes(author.as_slice().try_into().ok()?).ok()?;
            let sig: [u8; 64] = sig.as_slice().try_into().ok()?;
            Record::from_stored(author, kind, ts.max(0) as u64, body, sig, &id)
        })();
        if parsed.is_none() {
            tracing::warn!(path = %self.path.display(), "skipping a damaged record row");
        }
        Ok(parsed)
    }
}

impl RecordStore for SqliteRecordStore {
    fn insert(&self, record: Record) -> Result<bool, StoreError> {
        let mut g = self.lock()?;
        if g.ids.contains(&record.id()) {
            return Ok(false);
        }
        let n = g
            .conn
            .execute(
                "INSERT OR IGNORE INTO records (id, author, kind, timestamp_ms, body, signature)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    record.id().0.as_slice(),
                    record.author().as_bytes().as_slice(),
                    record.kind(),
                    i64::try_from(record.timestamp_ms()).unwrap_or(i64::MAX),
                    record.body(),
                    record.signature().as_slice(),
                ],
            )
            .map_err(err)?;
        g.index.insert((record.timestamp_ms(), record.id()));
        g.ids.insert(record.id());
        Ok(n > 0)
    }

    /// The whole batch is one transaction: one commit (one WAL sync point)
    /// instead of one per record, and all-or-nothing if it fails.
    fn insert_many(&self, records: Vec<Record>) -> Result<Vec<bool>, StoreError> {
        let mut g = self.lock()?;
        let g = &mut *g;
        let mut fresh = Vec::with_capacity(records.len());
        let tx = g.conn.transaction().map_err(err)?;
        {
            let mut stmt = tx
                .prepare_cached(
                    "INSERT OR IGNORE INTO records (id, author, kind, timestamp_ms, body, signature)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )
                .map_err(err)?;
            let mut batch_ids = HashSet::new();
            for record in &records {
                if g.ids.contains(&record.id()) || !batch_ids.insert(record.id()) {
                    fresh.push(false);
                    continue;
                }
                let n = stmt
                    .execute(params![
                        record.id().0.as_slice(),
                        record.author().as_bytes().as_slice(),
                        record.kind(),
                        i64::try_from(record.timestamp_ms()).unwrap_or(i64::MAX),
                        record.body(),
                        record.signature().as_slice(),
                    ])
                    .map_err(err)?;
                fresh.push(n > 0);
            }
        }
        tx.commit().map_err(err)?;
        // Only after the commit: the in-memory index never names a row that
        // is not on disk.
        for record in &records {
            g.index.insert((record.timestamp_ms(), record.id()));
            g.ids.insert(record.id());
        }
        Ok(fresh)
    }

    fn contains(&self, id: &RecordId) -> Result<bool, StoreError> {
        Ok(self.lock()?.ids.contains(id))
    }

    fn get(&self, id: &RecordId) -> Result<Option<Record>, StoreError> {
        let g = self.lock()?;
        let row = g
            .conn
            .query_row(
                "SELECT id, author, kind, timestamp_ms, body, signature FROM records WHERE id = ?1",
                [id.0.as_slice()],
                |r| self.row_to_record(r),
            )
            .optional()
            .map_err(err)?;
        Ok(row.flatten())
    }

    fn index(&self) -> Result<Vec<(u64, RecordId)>, StoreError> {
        Ok(self.lock()?.index.iter().copied().collect())
    }

    fn by_kind(&self, kind: &str) -> Result<Vec<Record>, StoreError> {
        let g = self.lock()?;
        let mut stmt = g
            .conn
            .prepare_cached(
                "SELECT id, author, kind, timestamp_ms, body, signature FROM records
                 WHERE kind = ?1 ORDER BY timestamp_ms, id",
            )
            .map_err(err)?;
        let rows = stmt
            .query_map([kind], |r| self.row_to_record(r))
            .map_err(err)?;
        let mut out = Vec::new();
        for r in rows {
            if let Some(rec) = r.map_err(err)? {
                out.push(rec);
            }
        }
        Ok(out)
    }

    fn len(&self) -> Result<usize, StoreError> {
        Ok(self.lock()?.ids.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Identity;

    #[test]
    fn records_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.db");
        let me = Identity::generate();
        let a = Record::sign(&me, "card", b"a".to_vec()).unwrap();
        let b = Record::sign(&me, "memory", b"b".to_vec()).unwrap();
        {
            let s = SqliteRecordStore::open(&path).unwrap();
            assert!(s.insert(a.clone()).unwrap());
            assert!(!s.insert(a.clone()).unwrap());
            assert!(s.insert(b.clone()).unwrap());
        }
        let s = SqliteRecordStore::open(&path).unwrap();
        assert_eq!(s.len().unwrap(), 2);
        assert!(s.contains(&a.id()).unwrap());
        assert_eq!(s.get(&b.id()).unwrap(), Some(b.clone()));
        assert_eq!(s.by_kind("card").unwrap(), vec![a.clone()]);
        let mut want = vec![(a.timestamp_ms(), a.id()), (b.timestamp_ms(), b.id())];
        want.sort();
        assert_eq!(s.index().unwrap(), want);
    }

    #[test]
    fn insert_many_is_one_transaction_that_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.db");
        let me = Identity::generate();
        let recs: Vec<Record> = (0..50)
            .map(|i| Record::sign_at(&me, "card", 1000 + i, vec![i as u8]).unwrap())
            .collect();
        {
            let s = SqliteRecordStore::open(&path).unwrap();
            assert!(s.insert(recs[0].clone()).unwrap());
            let mut batch = recs.clone();
            batch.push(recs[7].clone());
            let fresh = s.insert_many(batch).unwrap();
            assert_eq!(fresh.len(), 51);
            assert!(!fresh[0] && !fresh[50]);
            assert_eq!(fresh.iter().filter(|f| **f).count(), 49);
        }
        let s = SqliteRecordStore::open(&path).unwrap();
        assert_eq!(s.len().unwrap(), 50);
        assert_eq!(s.by_kind("card").unwrap(), recs);
    }

    #[test]
    fn damaged_row_is_skipped_not_served() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.db");
        let me = Identity::generate();
        let a = Record::sign(&me, "card", b"a".to_vec()).unwrap();
        {
            let s = SqliteRecordStore::open(&path).unwrap();
            s.insert(a.clone()).unwrap();
        }
        {
            let c = Connection::open(&path).unwrap();
            c.execute("UPDATE records SET body = x'00'", []).unwrap();
        }
        let s = SqliteRecordStore::open(&path).unwrap();
        assert_eq!(s.get(&a.id()).unwrap(), None);
        assert!(s.by_kind("card").unwrap().is_empty());
    }

    #[test]
    fn garbage_file_is_an_error_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.db");
        std::fs::write(&path, vec![0x42u8; 8192]).unwrap();
        let e = SqliteRecordStore::open(&path).err().unwrap();
        assert!(e.to_string().contains("r.db"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), vec![0x42u8; 8192]);
    }

    #[test]
    fn newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.db");
        {
            let c = Connection::open(&path).unwrap();
            c.pragma_update(None, "user_version", 99).unwrap();
        }
        let e = SqliteRecordStore::open(&path).err().unwrap();
        assert!(e.to_string().contains("newer"), "{e}");
    }
}
