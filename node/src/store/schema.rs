//! Opening the database file: connection settings, the corruption check and forward
//! migrations keyed by `PRAGMA user_version`.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OpenFlags, TransactionBehavior};

use super::StoreError;

/// Forward migrations: entry `i` takes the schema from version `i` to version `i + 1`.
/// Entries are never edited once released; a change is a new entry appended at the end.
const MIGRATIONS: &[&str] = &[
    // 0 -> 1: the initial schema. Payloads are JSON text owned by other modules.
    r#"
    CREATE TABLE cards (
        author      TEXT PRIMARY KEY,
        record_id   BLOB NOT NULL,
        name        TEXT NOT NULL,
        updated_at  INTEGER NOT NULL,
        body        TEXT NOT NULL
    ) STRICT;

    CREATE TABLE contacts (
        node_id       TEXT PRIMARY KEY,
        name          TEXT NOT NULL,
        n_tasks       INTEGER NOT NULL,
        n_success     INTEGER NOT NULL,
        last_seen_at  INTEGER NOT NULL,
        notes         TEXT NOT NULL
    ) STRICT;

    CREATE TABLE groups (
        group_id         TEXT PRIMARY KEY,
        parent_group_id  TEXT,
        goal             TEXT NOT NULL,
        state            TEXT NOT NULL,
        created_at       INTEGER NOT NULL,
        updated_at       INTEGER NOT NULL,
        body             TEXT NOT NULL
    ) STRICT;
    CREATE INDEX groups_by_created ON groups (created_at DESC, group_id);

    CREATE TABLE messages (
        group_id  TEXT NOT NULL,
        seq       INTEGER NOT NULL,
        body      TEXT NOT NULL,
        PRIMARY KEY (group_id, seq)
    ) STRICT, WITHOUT ROWID;

    CREATE TABLE tasks (
        task_id     TEXT PRIMARY KEY,
        group_id    TEXT NOT NULL,
        assignee    TEXT,
        state       TEXT NOT NULL,
        updated_at  INTEGER NOT NULL,
        body        TEXT NOT NULL
    ) STRICT;
    CREATE INDEX tasks_by_group ON tasks (group_id, updated_at);
    CREATE INDEX tasks_by_state ON tasks (state, updated_at);

    CREATE TABLE memories (
        id          TEXT PRIMARY KEY,
        domain      TEXT NOT NULL,
        author      TEXT NOT NULL,
        score       REAL NOT NULL,
        created_at  INTEGER NOT NULL,
        prompt      TEXT NOT NULL,
        answer      TEXT NOT NULL,
        body        TEXT NOT NULL,
        forgotten   INTEGER NOT NULL DEFAULT 0
    ) STRICT;
    CREATE INDEX memories_by_domain ON memories (domain, created_at DESC);
    CREATE INDEX memories_by_author ON memories (author, created_at DESC);

    CREATE TABLE author_trust (
        author   TEXT PRIMARY KEY,
        trust    REAL NOT NULL,
        ignored  INTEGER NOT NULL
    ) STRICT;

    CREATE TABLE kv (
        key    TEXT PRIMARY KEY,
        value  TEXT NOT NULL
    ) STRICT;
    "#,
];

/// The schema version this build writes.
pub(crate) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// How long a statement waits for a lock held by another connection (e.g. a second process
/// reading the file) before failing with "database is locked".
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens (creating if absent) the database at `path`, checks it and migrates it forward.
pub(crate) fn open_file(path: &Path) -> Result<Connection, StoreError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(|source| StoreError::Open {
        path: path.to_owned(),
        source,
    })?;
    prepare(conn, path, true)
}

/// Opens a private in-memory database with the current schema (for tests and tools).
pub(crate) fn open_memory() -> Result<Connection, StoreError> {
    let conn = Connection::open_in_memory().map_err(|source| StoreError::Open {
        path: ":memory:".into(),
        source,
    })?;
    prepare(conn, Path::new(":memory:"), false)
}

fn prepare(mut conn: Connection, path: &Path, on_disk: bool) -> Result<Connection, StoreError> {
    // Reading the version is the first statement that touches the file: a file that is not
    // a database (or whose header is damaged) fails here, before anything is written to it.
    let found: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(|e| classify(path, "read schema version", e))?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::TooNew {
            path: path.to_owned(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    if found < 0 {
        return Err(StoreError::Corrupt {
            path: path.to_owned(),
            detail: format!("negative schema version {found}"),
        });
    }

    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| classify(path, "set busy timeout", e))?;
    if on_disk {
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
            .map_err(|e| classify(path, "enable WAL", e))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Corrupt {
                path: path.to_owned(),
                detail: format!("cannot switch to WAL journal mode (still {mode:?})"),
            });
        }
    }
    // FULL: in WAL mode every commit fsyncs the log before returning, so a row whose write
    // was acknowledged survives a process kill *and* an OS crash or power cut. NORMAL would
    // only survive a process kill. Group commit (see `actor`) keeps the fsync cost per batch.
    conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;")
        .map_err(|e| classify(path, "set pragmas", e))?;

    // A cheap structural check of the pages the schema lives on; a damaged file is reported
    // rather than half-used.
    let check: String = conn
        .query_row("PRAGMA quick_check(1)", [], |row| row.get(0))
        .map_err(|e| classify(path, "check integrity", e))?;
    if check != "ok" {
        return Err(StoreError::Corrupt {
            path: path.to_owned(),
            detail: check,
        });
    }

    for (from, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let to = from + 1;
        tracing::info!(path = %path.display(), from, to, "migrating store schema");
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| classify(path, "begin migration", e))?;
        tx.execute_batch(sql)
            .map_err(|e| classify(path, "migrate schema", e))?;
        tx.execute_batch(&format!("PRAGMA user_version = {to}"))
            .map_err(|e| classify(path, "record schema version", e))?;
        tx.commit()
            .map_err(|e| classify(path, "commit migration", e))?;
    }
    Ok(conn)
}

/// Maps "this is not a database" and corruption codes to [`StoreError::Corrupt`].
fn classify(path: &Path, op: &'static str, source: rusqlite::Error) -> StoreError {
    match source.sqlite_error_code() {
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => StoreError::Corrupt {
            path: path.to_owned(),
            detail: source.to_string(),
        },
        _ => StoreError::Sqlite { op, source },
    }
}
