//! The node's persistent store: one SQLite file (WAL mode) owned by a single thread.
//!
//! [`Store`] is a cheap, cloneable handle. Each method sends a typed command to the owner
//! thread and returns a [`Pending`] reply, which is either `.await`ed from async code or
//! [`Pending::wait`]ed from plain threads. The command is sent when the method is called;
//! awaiting only waits for its reply.
//!
//! **Durability.** A write's reply is sent only after the transaction holding it has
//! committed, with `synchronous = FULL`: in WAL mode the log is fsynced on every commit, so
//! an acknowledged write survives a killed process and also an OS crash or power cut. To keep
//! that affordable the owner thread commits *groups*: it drains every command already
//! queued (up to [`MAX_BATCH`]) into one transaction, each command in its own savepoint so
//! that one failing command does not undo the others, then commits once and replies to all.
//!
//! **Payloads** are JSON text: the typed API takes `T: Serialize` and returns
//! `T: DeserializeOwned`, so other modules store their own serde types without this module
//! knowing them. All timestamps are Unix milliseconds.
//!
//! **Files.** The schema version lives in `PRAGMA user_version` and is migrated forward on
//! open. A file from a newer build ([`StoreError::TooNew`]) or a file that is not a sound
//! SQLite database ([`StoreError::Corrupt`]) is reported with its path and left untouched.

mod actor;
mod schema;
mod sql;

#[cfg(test)]
mod tests;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::outside::Busy;

use actor::{Command, Reply};

pub use actor::MAX_BATCH;

/// Everything that can go wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file could not be opened or created (missing directory, permissions, ...).
    #[error("cannot open database {}: {source}", path.display())]
    Open {
        /// The database path.
        path: PathBuf,
        /// The SQLite error.
        source: rusqlite::Error,
    },
    /// The file exists but is not a sound SQLite database. It has not been modified.
    #[error(
        "{} is not a usable Starling database ({detail}); the file was left untouched, \
         move it away or restore a backup",
        path.display()
    )]
    Corrupt {
        /// The database path.
        path: PathBuf,
        /// What SQLite reported.
        detail: String,
    },
    /// The file was written by a newer Starling with a schema this build does not know.
    #[error(
        "{} has schema version {found}, newer than this build supports ({supported}); \
         upgrade starling to open it",
        path.display()
    )]
    TooNew {
        /// The database path.
        path: PathBuf,
        /// The version found in the file.
        found: i64,
        /// The newest version this build can read.
        supported: i64,
    },
    /// A statement failed.
    #[error("database error during {op}: {source}")]
    Sqlite {
        /// What the store was doing.
        op: &'static str,
        /// The SQLite error.
        source: rusqlite::Error,
    },
    /// The transaction holding this command failed to commit; the command was not applied.
    #[error("commit failed, the write was not applied: {0}")]
    Commit(String),
    /// The disk (or the database's size cap, [`Store::set_max_bytes`]) is full; the write
    /// was not applied and nothing already stored was changed.
    #[error("the disk is full, the write was not applied ({0}); free some space and retry")]
    Full(String),
    /// A payload could not be serialised to JSON.
    #[error("cannot encode {what} as JSON: {source}")]
    Encode {
        /// Which payload.
        what: &'static str,
        /// The serde error.
        source: serde_json::Error,
    },
    /// A stored payload does not deserialise into the requested type.
    #[error("stored {what} does not decode into the requested type: {source}")]
    Decode {
        /// Which payload.
        what: &'static str,
        /// The serde error.
        source: serde_json::Error,
    },
    /// A number does not fit SQLite's signed 64-bit integers.
    #[error("{what} is out of range for the database: {value}")]
    OutOfRange {
        /// Which value.
        what: &'static str,
        /// The value.
        value: u64,
    },
    /// The owner thread could not be started.
    #[error("cannot start the store thread: {0}")]
    Spawn(std::io::Error),
    /// The owner thread has stopped (it panicked); no command can be served.
    #[error("the store thread has stopped")]
    Closed,
}

impl StoreError {
    /// Whether the write failed for lack of space (see [`StoreError::Full`]).
    pub fn is_full(&self) -> bool {
        matches!(self, StoreError::Full(_))
    }
}

/// Whether SQLite reported a full disk or database.
pub(crate) fn is_disk_full(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull)
}

/// A signed agent card as stored: the newest card per author is kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CardRecord<T> {
    /// Id of the signed record that carried the card.
    pub record_id: Vec<u8>,
    /// Node id of the card's author.
    pub author: String,
    /// Display name from the card.
    pub name: String,
    /// When the author issued this version (Unix ms); newer replaces older.
    pub updated_at: i64,
    /// The card itself.
    pub body: T,
}

/// An entry of the contact book: a past collaborator and how working with them went.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Contact<N> {
    /// The collaborator's node id.
    pub node_id: String,
    /// Their latest known name.
    pub name: String,
    /// Collaborations recorded.
    pub n_tasks: u64,
    /// Of which successful.
    pub n_success: u64,
    /// Last collaboration (Unix ms).
    pub last_seen_at: i64,
    /// The most recent notes, oldest first (at most [`MAX_CONTACT_NOTES`]).
    pub notes: Vec<N>,
}

/// How many notes a contact keeps; older ones are dropped so prompts stay bounded.
pub const MAX_CONTACT_NOTES: usize = 32;

/// A group chat / team.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupRecord<T> {
    /// The group id.
    pub group_id: String,
    /// The group this one is a sub-team of.
    pub parent_group_id: Option<String>,
    /// What the group is for.
    pub goal: String,
    /// Lifecycle state, as named by the runtime.
    pub state: String,
    /// Creation time (Unix ms).
    pub created_at: i64,
    /// Last change (Unix ms).
    pub updated_at: i64,
    /// The runtime's full group state.
    pub body: T,
}

/// One message of a group chat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageRecord<T> {
    /// The group.
    pub group_id: String,
    /// Position in the group's log; `(group_id, seq)` is unique.
    pub seq: u64,
    /// The message.
    pub body: T,
}

/// A task of a group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord<T> {
    /// The task id.
    pub task_id: String,
    /// The group the task belongs to.
    pub group_id: String,
    /// Node id of the assignee, once assigned.
    pub assignee: Option<String>,
    /// Lifecycle state, as named by the runtime.
    pub state: String,
    /// Last change (Unix ms).
    pub updated_at: i64,
    /// The runtime's full task state.
    pub body: T,
}

/// A kept prompt–answer pair (own or received).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryRecord<T> {
    /// Record id.
    pub id: String,
    /// The domain pool it belongs to.
    pub domain: String,
    /// Node id of the author.
    pub author: String,
    /// Ranking score (the store does not interpret it).
    pub score: f64,
    /// Creation time (Unix ms).
    pub created_at: i64,
    /// The prompt.
    pub prompt: String,
    /// The answer.
    pub answer: String,
    /// The full record (signature, rubric scores, ...).
    pub body: T,
    /// Locally hidden from retrieval without deleting it.
    pub forgotten: bool,
}

/// Which memories to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryFilter {
    /// Only this domain.
    pub domain: Option<String>,
    /// Only this author.
    pub author: Option<String>,
    /// Also list forgotten memories.
    pub include_forgotten: bool,
    /// At most this many, newest first (`None`: all).
    pub limit: Option<usize>,
}

/// Local trust in a memory author.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuthorTrust {
    /// The author's node id.
    pub author: String,
    /// Trust weight (the store does not interpret it).
    pub trust: f32,
    /// Ignore everything from this author.
    pub ignored: bool,
}

/// Handle to the store. Cloning is cheap; the database closes when the last clone drops.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    /// `Some` until drop; dropped first so the owner thread sees the channel close.
    tx: Option<mpsc::UnboundedSender<Command>>,
    thread: Option<JoinHandle<()>>,
    path: PathBuf,
}

impl Drop for Inner {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(thread) = self.thread.take() {
            // The owner thread finishes the commands already queued, then closes the
            // connection (checkpointing the WAL); wait so the file is closed on return.
            if thread.join().is_err() {
                tracing::error!(path = %self.path.display(), "store thread panicked");
            }
        }
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.inner.path)
            .finish()
    }
}

impl Store {
    /// Opens (creating if absent) the database at `path` and starts its owner thread.
    ///
    /// Blocking (file IO, migrations): call at start-up or from `spawn_blocking`. The parent
    /// directory must exist.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref().to_owned();
        let conn = schema::open_file(&path)?;
        tracing::debug!(path = %path.display(), version = schema::SCHEMA_VERSION, "store opened");
        Self::start(conn, path)
    }

    /// Opens a private in-memory database (nothing persists), for tests and tools.
    pub fn open_in_memory() -> Result<Self, StoreError> {
        let conn = schema::open_memory()?;
        Self::start(conn, PathBuf::from(":memory:"))
    }

    fn start(conn: rusqlite::Connection, path: PathBuf) -> Result<Self, StoreError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let thread = std::thread::Builder::new()
            .name("starling-store".into())
            .spawn(move || actor::run(conn, rx))
            .map_err(StoreError::Spawn)?;
        Ok(Self {
            inner: Arc::new(Inner {
                tx: Some(tx),
                thread: Some(thread),
                path,
            }),
        })
    }

    /// The database path (`:memory:` for an in-memory store).
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The schema version this build reads and writes.
    pub fn schema_version() -> i64 {
        schema::SCHEMA_VERSION
    }

    // ----- cards -----

    /// Stores `card` unless the stored card of the same author is newer (ties broken by
    /// record id). Returns whether it was stored.
    pub fn upsert_card<T: Serialize>(&self, card: &CardRecord<T>) -> Pending<bool> {
        let body = match encode("card", &card.body) {
            Ok(body) => body,
            Err(e) => return Pending::failed(e),
        };
        let card = CardRecord {
            record_id: card.record_id.clone(),
            author: card.author.clone(),
            name: card.name.clone(),
            updated_at: card.updated_at,
            body,
        };
        self.call(|reply| Command::UpsertCard { card, reply }, Ok)
    }

    /// Every stored card, by author.
    pub fn cards<T: DeserializeOwned + Send + 'static>(&self) -> Pending<Vec<CardRecord<T>>> {
        self.call(|reply| Command::Cards { reply }, decode_all(decode_card))
    }

    /// The stored card of `author`.
    pub fn card<T: DeserializeOwned + Send + 'static>(
        &self,
        author: &str,
    ) -> Pending<Option<CardRecord<T>>> {
        let author = author.to_owned();
        self.call(
            |reply| Command::Card { author, reply },
            decode_opt(decode_card),
        )
    }

    // ----- contacts -----

    /// Records one finished collaboration with `node_id` (now), appending `note` to the
    /// contact's notes and updating its name.
    pub fn record_collaboration<N: Serialize>(
        &self,
        node_id: &str,
        name: &str,
        success: bool,
        note: &N,
    ) -> Pending<()> {
        let note = match encode("contact note", note) {
            Ok(note) => note,
            Err(e) => return Pending::failed(e),
        };
        let node_id = node_id.to_owned();
        let name = name.to_owned();
        let at = now_ms();
        self.call(
            |reply| Command::RecordCollaboration {
                node_id,
                name,
                success,
                note,
                at,
                reply,
            },
            Ok,
        )
    }

    /// The contact book, most recently seen first.
    pub fn contacts<N: DeserializeOwned + Send + 'static>(&self) -> Pending<Vec<Contact<N>>> {
        self.call(
            |reply| Command::Contacts { reply },
            decode_all(decode_contact),
        )
    }

    /// One contact.
    pub fn contact<N: DeserializeOwned + Send + 'static>(
        &self,
        node_id: &str,
    ) -> Pending<Option<Contact<N>>> {
        let node_id = node_id.to_owned();
        self.call(
            |reply| Command::Contact { node_id, reply },
            decode_opt(decode_contact),
        )
    }

    // ----- groups -----

    /// Inserts a group, or updates it keeping the `created_at` first stored.
    pub fn upsert_group<T: Serialize>(&self, group: &GroupRecord<T>) -> Pending<()> {
        let body = match encode("group", &group.body) {
            Ok(body) => body,
            Err(e) => return Pending::failed(e),
        };
        let group = GroupRecord {
            group_id: group.group_id.clone(),
            parent_group_id: group.parent_group_id.clone(),
            goal: group.goal.clone(),
            state: group.state.clone(),
            created_at: group.created_at,
            updated_at: group.updated_at,
            body,
        };
        self.call(|reply| Command::UpsertGroup { group, reply }, Ok)
    }

    /// Up to `limit` groups, newest (by creation) first.
    pub fn groups<T: DeserializeOwned + Send + 'static>(
        &self,
        limit: usize,
    ) -> Pending<Vec<GroupRecord<T>>> {
        self.call(
            |reply| Command::Groups { limit, reply },
            decode_all(decode_group),
        )
    }

    /// One group.
    pub fn group<T: DeserializeOwned + Send + 'static>(
        &self,
        group_id: &str,
    ) -> Pending<Option<GroupRecord<T>>> {
        let group_id = group_id.to_owned();
        self.call(
            |reply| Command::Group { group_id, reply },
            decode_opt(decode_group),
        )
    }

    // ----- messages -----

    /// Appends message `seq` of `group_id`. Idempotent: if `(group_id, seq)` is already
    /// stored, the stored message is kept and `false` is returned.
    pub fn append_message<T: Serialize>(
        &self,
        group_id: &str,
        seq: u64,
        body: &T,
    ) -> Pending<bool> {
        let body = match encode("message", body) {
            Ok(body) => body,
            Err(e) => return Pending::failed(e),
        };
        let group_id = group_id.to_owned();
        self.call(
            |reply| Command::AppendMessage {
                group_id,
                seq,
                body,
                reply,
            },
            Ok,
        )
    }

    /// Every message of `group_id`, by `seq`.
    pub fn messages<T: DeserializeOwned + Send + 'static>(
        &self,
        group_id: &str,
    ) -> Pending<Vec<MessageRecord<T>>> {
        self.messages_after(group_id, None)
    }

    /// The messages of `group_id` with `seq > after` (all if `None`), by `seq`.
    pub fn messages_after<T: DeserializeOwned + Send + 'static>(
        &self,
        group_id: &str,
        after: Option<u64>,
    ) -> Pending<Vec<MessageRecord<T>>> {
        let group_id = group_id.to_owned();
        self.call(
            |reply| Command::Messages {
                group_id,
                after,
                reply,
            },
            decode_all(decode_message),
        )
    }

    // ----- tasks -----

    /// Inserts or replaces a task.
    pub fn upsert_task<T: Serialize>(&self, task: &TaskRecord<T>) -> Pending<()> {
        let body = match encode("task", &task.body) {
            Ok(body) => body,
            Err(e) => return Pending::failed(e),
        };
        let task = TaskRecord {
            task_id: task.task_id.clone(),
            group_id: task.group_id.clone(),
            assignee: task.assignee.clone(),
            state: task.state.clone(),
            updated_at: task.updated_at,
            body,
        };
        self.call(|reply| Command::UpsertTask { task, reply }, Ok)
    }

    /// One task.
    pub fn task<T: DeserializeOwned + Send + 'static>(
        &self,
        task_id: &str,
    ) -> Pending<Option<TaskRecord<T>>> {
        let task_id = task_id.to_owned();
        self.call(
            |reply| Command::Task { task_id, reply },
            decode_opt(decode_task),
        )
    }

    /// The tasks of a group, oldest change first.
    pub fn tasks_in_group<T: DeserializeOwned + Send + 'static>(
        &self,
        group_id: &str,
    ) -> Pending<Vec<TaskRecord<T>>> {
        let group_id = group_id.to_owned();
        self.call(
            |reply| Command::TasksInGroup { group_id, reply },
            decode_all(decode_task),
        )
    }

    /// The tasks in `state`, oldest change first.
    pub fn tasks_in_state<T: DeserializeOwned + Send + 'static>(
        &self,
        state: &str,
    ) -> Pending<Vec<TaskRecord<T>>> {
        let state = state.to_owned();
        self.call(
            |reply| Command::TasksInState { state, reply },
            decode_all(decode_task),
        )
    }

    // ----- memories -----

    /// Inserts a memory. Idempotent on `id`: an existing memory is kept (with its local
    /// score and `forgotten` flag) and `false` is returned.
    pub fn insert_memory<T: Serialize>(&self, memory: &MemoryRecord<T>) -> Pending<bool> {
        let body = match encode("memory", &memory.body) {
            Ok(body) => body,
            Err(e) => return Pending::failed(e),
        };
        let memory = MemoryRecord {
            id: memory.id.clone(),
            domain: memory.domain.clone(),
            author: memory.author.clone(),
            score: memory.score,
            created_at: memory.created_at,
            prompt: memory.prompt.clone(),
            answer: memory.answer.clone(),
            body,
            forgotten: memory.forgotten,
        };
        self.call(|reply| Command::InsertMemory { memory, reply }, Ok)
    }

    /// One memory (forgotten or not).
    pub fn memory<T: DeserializeOwned + Send + 'static>(
        &self,
        id: &str,
    ) -> Pending<Option<MemoryRecord<T>>> {
        let id = id.to_owned();
        self.call(
            |reply| Command::Memory { id, reply },
            decode_opt(decode_memory),
        )
    }

    /// Memories matching `filter`, newest first.
    pub fn memories<T: DeserializeOwned + Send + 'static>(
        &self,
        filter: &MemoryFilter,
    ) -> Pending<Vec<MemoryRecord<T>>> {
        let filter = filter.clone();
        self.call(
            |reply| Command::Memories { filter, reply },
            decode_all(decode_memory),
        )
    }

    /// Memories matching `filter`, newest first, and the ids of the rows whose body does
    /// not decode (each skipped with a warning naming the table and the id) instead of
    /// failing the whole list.
    pub fn readable_memories<T: DeserializeOwned + Send + 'static>(
        &self,
        filter: &MemoryFilter,
    ) -> Pending<(Vec<MemoryRecord<T>>, Vec<String>)> {
        let filter = filter.clone();
        self.call(
            |reply| Command::Memories { filter, reply },
            |rows: Vec<MemoryRecord<Json>>| {
                let mut good = Vec::with_capacity(rows.len());
                let mut bad = Vec::new();
                for row in rows {
                    let id = row.id.clone();
                    match decode_memory(row) {
                        Ok(m) => good.push(m),
                        Err(e) => {
                            tracing::warn!(table = "memories", id = %id, error = %e, "undecodable row skipped");
                            bad.push(id);
                        }
                    }
                }
                Ok((good, bad))
            },
        )
    }

    /// Deletes one memory. Returns whether it existed.
    pub fn delete_memory(&self, id: &str) -> Pending<bool> {
        let id = id.to_owned();
        self.call(|reply| Command::DeleteMemory { id, reply }, Ok)
    }

    /// Counts memories that are not forgotten, in `domain` or in all domains.
    pub fn memory_count(&self, domain: Option<&str>) -> Pending<u64> {
        let domain = domain.map(str::to_owned);
        self.call(|reply| Command::MemoryCount { domain, reply }, Ok)
    }

    /// Sets a memory's `forgotten` flag. Returns whether the memory exists.
    pub fn set_memory_forgotten(&self, id: &str, forgotten: bool) -> Pending<bool> {
        let id = id.to_owned();
        self.call(
            |reply| Command::SetMemoryForgotten {
                id,
                forgotten,
                reply,
            },
            Ok,
        )
    }

    /// Sets a memory's score. Returns whether the memory exists.
    pub fn set_memory_score(&self, id: &str, score: f64) -> Pending<bool> {
        let id = id.to_owned();
        self.call(|reply| Command::SetMemoryScore { id, score, reply }, Ok)
    }

    /// Replaces a memory's local body (what this node derived from the signed record, such
    /// as its embeddings). Returns whether the memory exists.
    pub fn set_memory_body<T: Serialize>(&self, id: &str, body: &T) -> Pending<bool> {
        let body = match encode("memory", body) {
            Ok(body) => body,
            Err(e) => return Pending::failed(e),
        };
        let id = id.to_owned();
        self.call(|reply| Command::SetMemoryBody { id, body, reply }, Ok)
    }

    /// Caps the database at about `bytes` (SQLite's `max_page_count`; at least its current
    /// size). A write past the cap fails with [`StoreError::Full`] exactly as on a full
    /// disk, so it also serves to test that path. Returns the cap in bytes.
    pub fn set_max_bytes(&self, bytes: u64) -> Pending<u64> {
        self.call(|reply| Command::SetMaxBytes { bytes, reply }, Ok)
    }

    /// Deletes every memory by `author`. Returns how many were deleted.
    pub fn delete_memories_by_author(&self, author: &str) -> Pending<u64> {
        let author = author.to_owned();
        self.call(
            |reply| Command::DeleteMemoriesByAuthor { author, reply },
            Ok,
        )
    }

    // ----- author trust -----

    /// The trust entry of `author`, if one was set.
    pub fn author_trust(&self, author: &str) -> Pending<Option<AuthorTrust>> {
        let author = author.to_owned();
        self.call(|reply| Command::AuthorTrust { author, reply }, Ok)
    }

    /// Sets (replaces) the trust entry of `trust.author`.
    pub fn set_author_trust(&self, trust: &AuthorTrust) -> Pending<()> {
        let trust = trust.clone();
        self.call(|reply| Command::SetAuthorTrust { trust, reply }, Ok)
    }

    /// Every trust entry, by author.
    pub fn author_trusts(&self) -> Pending<Vec<AuthorTrust>> {
        self.call(|reply| Command::AuthorTrusts { reply }, Ok)
    }

    // ----- settings -----

    /// A setting's value.
    pub fn kv_get(&self, key: &str) -> Pending<Option<String>> {
        let key = key.to_owned();
        self.call(|reply| Command::KvGet { key, reply }, Ok)
    }

    /// Sets a setting.
    pub fn kv_set(&self, key: &str, value: &str) -> Pending<()> {
        let key = key.to_owned();
        let value = value.to_owned();
        self.call(|reply| Command::KvSet { key, value, reply }, Ok)
    }

    /// Removes a setting. Returns whether it existed.
    pub fn kv_delete(&self, key: &str) -> Pending<bool> {
        let key = key.to_owned();
        self.call(|reply| Command::KvDelete { key, reply }, Ok)
    }

    /// Sends a command whose raw reply is converted by `map` (on the owner thread, after
    /// commit) into what the caller receives.
    fn call<Raw, R>(
        &self,
        make: impl FnOnce(Reply<Raw>) -> Command,
        map: impl FnOnce(Raw) -> Result<R, StoreError> + Send + 'static,
    ) -> Pending<R>
    where
        Raw: 'static,
        R: Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let reply: Reply<Raw> = Box::new(move |raw: Result<Raw, StoreError>| {
            // The caller may have stopped waiting; the write has happened regardless.
            let _ = tx.send(raw.and_then(map));
        });
        let sent = match &self.inner.tx {
            Some(sender) => sender.send(make(reply)).is_ok(),
            None => false,
        };
        if sent {
            Pending {
                state: PendingState::Waiting(rx),
                busy: None,
            }
        } else {
            Pending::failed(StoreError::Closed)
        }
    }
}

/// The reply to one store command: `.await` it, or call [`Pending::wait`] outside async
/// code. Dropping it does not cancel the command.
#[must_use = "the reply tells whether the command succeeded"]
#[derive(Debug)]
pub struct Pending<R> {
    state: PendingState<R>,
    /// Held while an awaited reply is being computed on the store's thread.
    busy: Option<Busy>,
}

#[derive(Debug)]
enum PendingState<R> {
    Waiting(oneshot::Receiver<Result<R, StoreError>>),
    Failed(Option<StoreError>),
}

impl<R> Pending<R> {
    fn failed(error: StoreError) -> Self {
        Self {
            state: PendingState::Failed(Some(error)),
            busy: None,
        }
    }

    /// Blocks the current thread until the reply arrives.
    ///
    /// # Panics
    /// When called on a thread that is running an async runtime (use `.await` there).
    pub fn wait(self) -> Result<R, StoreError> {
        match self.state {
            PendingState::Waiting(rx) => rx.blocking_recv().unwrap_or(Err(StoreError::Closed)),
            PendingState::Failed(error) => Err(error.unwrap_or(StoreError::Closed)),
        }
    }
}

impl<R> Future for Pending<R> {
    type Output = Result<R, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match &mut this.state {
            PendingState::Waiting(rx) => {
                this.busy.get_or_insert_with(Busy::start);
                let poll = Pin::new(rx)
                    .poll(cx)
                    .map(|res| res.unwrap_or(Err(StoreError::Closed)));
                if poll.is_ready() {
                    this.busy = None;
                }
                poll
            }
            // A second poll after completion reports `Closed`.
            PendingState::Failed(error) => {
                Poll::Ready(Err(error.take().unwrap_or(StoreError::Closed)))
            }
        }
    }
}

/// Stored JSON text, before decoding into the caller's type.
pub(crate) type Json = String;

fn encode<T: Serialize>(what: &'static str, value: &T) -> Result<Json, StoreError> {
    serde_json::to_string(value).map_err(|source| StoreError::Encode { what, source })
}

fn decode<T: DeserializeOwned>(what: &'static str, json: &str) -> Result<T, StoreError> {
    serde_json::from_str(json).map_err(|source| StoreError::Decode { what, source })
}

fn decode_all<A, B>(
    one: fn(A) -> Result<B, StoreError>,
) -> impl FnOnce(Vec<A>) -> Result<Vec<B>, StoreError> + Send + 'static
where
    A: 'static,
    B: 'static,
{
    move |rows| rows.into_iter().map(one).collect()
}

fn decode_opt<A, B>(
    one: fn(A) -> Result<B, StoreError>,
) -> impl FnOnce(Option<A>) -> Result<Option<B>, StoreError> + Send + 'static
where
    A: 'static,
    B: 'static,
{
    move |row| row.map(one).transpose()
}

fn decode_card<T: DeserializeOwned>(c: CardRecord<Json>) -> Result<CardRecord<T>, StoreError> {
    Ok(CardRecord {
        body: decode("card", &c.body)?,
        record_id: c.record_id,
        author: c.author,
        name: c.name,
        updated_at: c.updated_at,
    })
}

fn decode_contact<N: DeserializeOwned>(c: Contact<Json>) -> Result<Contact<N>, StoreError> {
    let notes = c
        .notes
        .iter()
        .map(|note| decode("contact note", note))
        .collect::<Result<_, _>>()?;
    Ok(Contact {
        node_id: c.node_id,
        name: c.name,
        n_tasks: c.n_tasks,
        n_success: c.n_success,
        last_seen_at: c.last_seen_at,
        notes,
    })
}

fn decode_group<T: DeserializeOwned>(g: GroupRecord<Json>) -> Result<GroupRecord<T>, StoreError> {
    Ok(GroupRecord {
        body: decode("group", &g.body)?,
        group_id: g.group_id,
        parent_group_id: g.parent_group_id,
        goal: g.goal,
        state: g.state,
        created_at: g.created_at,
        updated_at: g.updated_at,
    })
}

fn decode_message<T: DeserializeOwned>(
    m: MessageRecord<Json>,
) -> Result<MessageRecord<T>, StoreError> {
    Ok(MessageRecord {
        body: decode("message", &m.body)?,
        group_id: m.group_id,
        seq: m.seq,
    })
}

fn decode_task<T: DeserializeOwned>(t: TaskRecord<Json>) -> Result<TaskRecord<T>, StoreError> {
    Ok(TaskRecord {
        body: decode("task", &t.body)?,
        task_id: t.task_id,
        group_id: t.group_id,
        assignee: t.assignee,
        state: t.state,
        updated_at: t.updated_at,
    })
}

fn decode_memory<T: DeserializeOwned>(
    m: MemoryRecord<Json>,
) -> Result<MemoryRecord<T>, StoreError> {
    Ok(MemoryRecord {
        body: decode("memory", &m.body)?,
        id: m.id,
        domain: m.domain,
        author: m.author,
        score: m.score,
        created_at: m.created_at,
        prompt: m.prompt,
        answer: m.answer,
        forgotten: m.forgotten,
    })
}

/// Current wall-clock time in Unix milliseconds (0 if the clock is before 1970).
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
