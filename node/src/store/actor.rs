//! The owner thread: takes commands off the channel, runs them in group-committed
//! transactions and replies after each commit.

use rusqlite::{Connection, TransactionBehavior};
use tokio::sync::mpsc;

use super::sql;
use super::{
    AuthorTrust, CardRecord, Contact, GroupRecord, Json, MemoryFilter, MemoryRecord, MessageRecord,
    StoreError, TaskRecord,
};

/// Most commands committed in one transaction.
pub const MAX_BATCH: usize = 512;

/// Delivers a command's outcome (converted for the caller) to whoever is waiting.
pub(crate) type Reply<T> = Box<dyn FnOnce(Result<T, StoreError>) + Send>;

/// One request to the owner thread. Payloads are already JSON.
pub(crate) enum Command {
    UpsertCard {
        card: CardRecord<Json>,
        reply: Reply<bool>,
    },
    Cards {
        reply: Reply<Vec<CardRecord<Json>>>,
    },
    Card {
        author: String,
        reply: Reply<Option<CardRecord<Json>>>,
    },
    RecordCollaboration {
        node_id: String,
        name: String,
        success: bool,
        note: Json,
        at: i64,
        reply: Reply<()>,
    },
    Contacts {
        reply: Reply<Vec<Contact<Json>>>,
    },
    Contact {
        node_id: String,
        reply: Reply<Option<Contact<Json>>>,
    },
    UpsertGroup {
        group: GroupRecord<Json>,
        reply: Reply<()>,
    },
    Groups {
        limit: usize,
        reply: Reply<Vec<GroupRecord<Json>>>,
    },
    Group {
        group_id: String,
        reply: Reply<Option<GroupRecord<Json>>>,
    },
    AppendMessage {
        group_id: String,
        seq: u64,
        body: Json,
        reply: Reply<bool>,
    },
    Messages {
        group_id: String,
        after: Option<u64>,
        reply: Reply<Vec<MessageRecord<Json>>>,
    },
    UpsertTask {
        task: TaskRecord<Json>,
        reply: Reply<()>,
    },
    Task {
        task_id: String,
        reply: Reply<Option<TaskRecord<Json>>>,
    },
    TasksInGroup {
        group_id: String,
        reply: Reply<Vec<TaskRecord<Json>>>,
    },
    TasksInState {
        state: String,
        reply: Reply<Vec<TaskRecord<Json>>>,
    },
    InsertMemory {
        memory: MemoryRecord<Json>,
        reply: Reply<bool>,
    },
    Memory {
        id: String,
        reply: Reply<Option<MemoryRecord<Json>>>,
    },
    Memories {
        filter: MemoryFilter,
        reply: Reply<Vec<MemoryRecord<Json>>>,
    },
    MemoryCount {
        domain: Option<String>,
        reply: Reply<u64>,
    },
    SetMemoryForgotten {
        id: String,
        forgotten: bool,
        reply: Reply<bool>,
    },
    SetMemoryScore {
        id: String,
        score: f64,
        reply: Reply<bool>,
    },
    SetMemoryBody {
        id: String,
        body: Json,
        reply: Reply<bool>,
    },
    SetMaxBytes {
        bytes: u64,
        reply: Reply<u64>,
    },
    DeleteMemoriesByAuthor {
        author: String,
        reply: Reply<u64>,
    },
    DeleteMemory {
        id: String,
        reply: Reply<bool>,
    },
    AuthorTrust {
        author: String,
        reply: Reply<Option<AuthorTrust>>,
    },
    SetAuthorTrust {
        trust: AuthorTrust,
        reply: Reply<()>,
    },
    AuthorTrusts {
        reply: Reply<Vec<AuthorTrust>>,
    },
    KvGet {
        key: String,
        reply: Reply<Option<String>>,
    },
    KvSet {
        key: String,
        value: String,
        reply: Reply<()>,
    },
    KvDelete {
        key: String,
        reply: Reply<bool>,
    },
}

/// Why a batch's commit failed.
struct CommitFailure {
    message: String,
    /// The disk (or the size cap) was full.
    full: bool,
}

/// Sends a command's reply, given the commit failure if the commit failed.
type SendReply = Box<dyn FnOnce(Option<&CommitFailure>) + Send>;

/// A command that has run but not yet replied: the reply waits for the commit.
struct Done {
    applied: bool,
    send: SendReply,
}

/// Pairs a command's result with its reply, to be sent once the commit outcome is known.
fn done<T: Send + 'static>(result: Result<T, StoreError>, reply: Reply<T>) -> Done {
    Done {
        applied: result.is_ok(),
        send: Box::new(
            move |commit_error: Option<&CommitFailure>| match (commit_error, result) {
                (Some(e), Ok(_)) if e.full => reply(Err(StoreError::Full(e.message.clone()))),
                (Some(e), Ok(_)) => reply(Err(StoreError::Commit(e.message.clone()))),
                (_, result) => reply(result),
            },
        ),
    }
}

impl Command {
    fn execute(self, c: &Connection) -> Done {
        match self {
            Command::UpsertCard { card, reply } => done(sql::upsert_card(c, &card), reply),
            Command::Cards { reply } => done(sql::cards(c), reply),
            Command::Card { author, reply } => done(sql::card(c, &author), reply),
            Command::RecordCollaboration {
                node_id,
                name,
                success,
                note,
                at,
                reply,
            } => done(
                sql::record_collaboration(c, &node_id, &name, success, &note, at),
                reply,
            ),
            Command::Contacts { reply } => done(sql::contacts(c), reply),
            Command::Contact { node_id, reply } => done(sql::contact(c, &node_id), reply),
            Command::UpsertGroup { group, reply } => done(sql::upsert_group(c, &group), reply),
            Command::Groups { limit, reply } => done(sql::groups(c, limit), reply),
            Command::Group { group_id, reply } => done(sql::group(c, &group_id), reply),
            Command::AppendMessage {
                group_id,
                seq,
                body,
                reply,
            } => done(sql::append_message(c, &group_id, seq, &body), reply),
            Command::Messages {
                group_id,
                after,
                reply,
            } => done(sql::messages(c, &group_id, after), reply),
            Command::UpsertTask { task, reply } => done(sql::upsert_task(c, &task), reply),
            Command::Task { task_id, reply } => done(sql::task(c, &task_id), reply),
            Command::TasksInGroup { group_id, reply } => {
                done(sql::tasks_in_group(c, &group_id), reply)
            }
            Command::TasksInState { state, reply } => done(sql::tasks_in_state(c, &state), reply),
            Command::InsertMemory { memory, reply } => done(sql::insert_memory(c, &memory), reply),
            Command::Memory { id, reply } => done(sql::memory(c, &id), reply),
            Command::Memories { filter, reply } => done(sql::memories(c, &filter), reply),
            Command::MemoryCount { domain, reply } => {
                done(sql::memory_count(c, domain.as_deref()), reply)
            }
            Command::SetMemoryForgotten {
                id,
                forgotten,
                reply,
            } => done(sql::set_memory_forgotten(c, &id, forgotten), reply),
            Command::SetMemoryScore { id, score, reply } => {
                done(sql::set_memory_score(c, &id, score), reply)
            }
            Command::SetMemoryBody { id, body, reply } => {
                done(sql::set_memory_body(c, &id, &body), reply)
            }
            Command::SetMaxBytes { bytes, reply } => done(sql::set_max_bytes(c, bytes), reply),
            Command::DeleteMemoriesByAuthor { author, reply } => {
                done(sql::delete_memories_by_author(c, &author), reply)
            }
            Command::DeleteMemory { id, reply } => done(sql::delete_memory(c, &id), reply),
            Command::AuthorTrust { author, reply } => done(sql::author_trust(c, &author), reply),
            Command::SetAuthorTrust { trust, reply } => {
                done(sql::set_author_trust(c, &trust), reply)
            }
            Command::AuthorTrusts { reply } => done(sql::author_trusts(c), reply),
            Command::KvGet { key, reply } => done(sql::kv_get(c, &key), reply),
            Command::KvSet { key, value, reply } => done(sql::kv_set(c, &key, &value), reply),
            Command::KvDelete { key, reply } => done(sql::kv_delete(c, &key), reply),
        }
    }

    /// Replies with `error` without running the command.
    fn fail(self, error: &str) {
        fn err<T>(error: &str) -> Result<T, StoreError> {
            Err(StoreError::Commit(error.to_owned()))
        }
        match self {
            Command::UpsertCard { reply, .. } => reply(err(error)),
            Command::Cards { reply } => reply(err(error)),
            Command::Card { reply, .. } => reply(err(error)),
            Command::RecordCollaboration { reply, .. } => reply(err(error)),
            Command::Contacts { reply } => reply(err(error)),
            Command::Contact { reply, .. } => reply(err(error)),
            Command::UpsertGroup { reply, .. } => reply(err(error)),
            Command::Groups { reply, .. } => reply(err(error)),
            Command::Group { reply, .. } => reply(err(error)),
            Command::AppendMessage { reply, .. } => reply(err(error)),
            Command::Messages { reply, .. } => reply(err(error)),
            Command::UpsertTask { reply, .. } => reply(err(error)),
            Command::Task { reply, .. } => reply(err(error)),
            Command::TasksInGroup { reply, .. } => reply(err(error)),
            Command::TasksInState { reply, .. } => reply(err(error)),
            Command::InsertMemory { reply, .. } => reply(err(error)),
            Command::Memory { reply, .. } => reply(err(error)),
            Command::Memories { reply, .. } => reply(err(error)),
            Command::MemoryCount { reply, .. } => reply(err(error)),
            Command::SetMemoryForgotten { reply, .. } => reply(err(error)),
            Command::SetMemoryScore { reply, .. } => reply(err(error)),
            Command::SetMemoryBody { reply, .. } => reply(err(error)),
            Command::SetMaxBytes { reply, .. } => reply(err(error)),
            Command::DeleteMemoriesByAuthor { reply, .. } => reply(err(error)),
            Command::DeleteMemory { reply, .. } => reply(err(error)),
            Command::AuthorTrust { reply, .. } => reply(err(error)),
            Command::SetAuthorTrust { reply, .. } => reply(err(error)),
            Command::AuthorTrusts { reply } => reply(err(error)),
            Command::KvGet { reply, .. } => reply(err(error)),
            Command::KvSet { reply, .. } => reply(err(error)),
            Command::KvDelete { reply, .. } => reply(err(error)),
        }
    }
}

/// The owner thread's loop; returns when every handle has been dropped.
pub(crate) fn run(mut conn: Connection, mut rx: mpsc::UnboundedReceiver<Command>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = rx.blocking_recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(command) => batch.push(command),
                Err(_) => break,
            }
        }
        run_batch(&mut conn, &mut batch);
    }
    if let Err((_, e)) = conn.close() {
        tracing::warn!(error = %e, "closing the store failed");
    }
}

/// Runs `batch` (emptying it) in one transaction, each command in its own savepoint, then
/// commits and replies.
fn run_batch(conn: &mut Connection, batch: &mut Vec<Command>) {
    let size = batch.len();
    let mut tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => {
            let msg = format!("cannot begin transaction: {e}");
            tracing::error!(error = %e, "store: cannot begin transaction");
            for command in batch.drain(..) {
                command.fail(&msg);
            }
            return;
        }
    };
    let mut outcomes = Vec::with_capacity(size);
    for command in batch.drain(..) {
        match tx.savepoint() {
            Ok(sp) => {
                let outcome = command.execute(&sp);
                if outcome.applied {
                    if let Err(e) = sp.commit() {
                        // Releasing a savepoint cannot fail short of an IO error, which
                        // the final commit will report as well.
                        tracing::warn!(error = %e, "store: cannot release savepoint");
                    }
                }
                // A failed command's savepoint rolls back on drop, leaving the others.
                outcomes.push(outcome);
            }
            Err(e) => command.fail(&format!("cannot open savepoint: {e}")),
        }
    }
    let commit = tx.commit();
    if let Err(e) = &commit {
        tracing::error!(error = %e, size, "store: commit failed");
        if !conn.is_autocommit() {
            if let Err(e) = conn.execute_batch("ROLLBACK") {
                tracing::error!(error = %e, "store: rollback after failed commit failed");
            }
        }
    }
    let commit_error = commit.err().map(|e| CommitFailure {
        full: crate::store::is_disk_full(&e),
        message: e.to_string(),
    });
    tracing::trace!(size, "store: batch committed");
    for outcome in outcomes {
        (outcome.send)(commit_error.as_ref());
    }
}
