//! The statements behind each command. Everything here runs on the owner thread inside the
//! current batch's transaction; payloads stay JSON text.

use rusqlite::{params, Connection, OptionalExtension, Row};

use super::{
    AuthorTrust, CardRecord, Contact, GroupRecord, Json, MemoryFilter, MemoryRecord, MessageRecord,
    StoreError, TaskRecord, MAX_CONTACT_NOTES,
};

type Result<T> = std::result::Result<T, StoreError>;

fn err(op: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
    move |source| {
        if super::is_disk_full(&source) {
            StoreError::Full(format!("{op}: {source}"))
        } else {
            StoreError::Sqlite { op, source }
        }
    }
}

pub(super) fn set_max_bytes(c: &Connection, bytes: u64) -> Result<u64> {
    let page: i64 = c
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .map_err(err("read page size"))?;
    let page = u64::try_from(page.max(1)).unwrap_or(4096);
    let pages = to_i64("page count", bytes.div_ceil(page).max(1))?;
    // SQLite keeps the cap at or above the current page count and answers the cap set.
    let set: i64 = c
        .query_row(&format!("PRAGMA max_page_count = {pages}"), [], |r| {
            r.get(0)
        })
        .map_err(err("cap the database size"))?;
    Ok(u64::try_from(set).unwrap_or(0) * page)
}

fn to_i64(what: &'static str, value: u64) -> Result<i64> {
    i64::try_from(value).map_err(|_| StoreError::OutOfRange { what, value })
}

/// Reads a non-negative integer column.
fn get_u64(row: &Row<'_>, idx: usize) -> rusqlite::Result<u64> {
    let value: i64 = row.get(idx)?;
    u64::try_from(value).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(idx, rusqlite::types::Type::Integer, e.into())
    })
}

// ----- cards -----

pub(super) fn upsert_card(c: &Connection, card: &CardRecord<Json>) -> Result<bool> {
    let changed = c
        .prepare_cached(
            "INSERT INTO cards (author, record_id, name, updated_at, body)
             VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (author) DO UPDATE SET
                 record_id = excluded.record_id, name = excluded.name,
                 updated_at = excluded.updated_at, body = excluded.body
             WHERE excluded.updated_at > cards.updated_at
                OR (excluded.updated_at = cards.updated_at
                    AND excluded.record_id > cards.record_id)",
        )
        .and_then(|mut s| {
            s.execute(params![
                card.author,
                card.record_id,
                card.name,
                card.updated_at,
                card.body
            ])
        })
        .map_err(err("upsert card"))?;
    Ok(changed > 0)
}

const CARD_COLUMNS: &str = "record_id, author, name, updated_at, body";

fn card_row(row: &Row<'_>) -> rusqlite::Result<CardRecord<Json>> {
    Ok(CardRecord {
        record_id: row.get(0)?,
        author: row.get(1)?,
        name: row.get(2)?,
        updated_at: row.get(3)?,
        body: row.get(4)?,
    })
}

pub(super) fn cards(c: &Connection) -> Result<Vec<CardRecord<Json>>> {
    c.prepare_cached(&format!("SELECT {CARD_COLUMNS} FROM cards ORDER BY author"))
        .and_then(|mut s| s.query_map([], card_row)?.collect())
        .map_err(err("list cards"))
}

pub(super) fn card(c: &Connection, author: &str) -> Result<Option<CardRecord<Json>>> {
    c.prepare_cached(&format!(
        "SELECT {CARD_COLUMNS} FROM cards WHERE author = ?1"
    ))
    .and_then(|mut s| s.query_row([author], card_row).optional())
    .map_err(err("get card"))
}

// ----- contacts -----

pub(super) fn record_collaboration(
    c: &Connection,
    node_id: &str,
    name: &str,
    success: bool,
    note: &str,
    at: i64,
) -> Result<()> {
    let existing: Option<String> = c
        .prepare_cached("SELECT notes FROM contacts WHERE node_id = ?1")
        .and_then(|mut s| s.query_row([node_id], |row| row.get(0)).optional())
        .map_err(err("read contact"))?;
    let mut notes: Vec<serde_json::Value> = match &existing {
        Some(json) => serde_json::from_str(json).map_err(|source| StoreError::Decode {
            what: "contact notes",
            source,
        })?,
        None => Vec::new(),
    };
    let note: serde_json::Value =
        serde_json::from_str(note).map_err(|source| StoreError::Decode {
            what: "contact note",
            source,
        })?;
    notes.push(note);
    if notes.len() > MAX_CONTACT_NOTES {
        notes.drain(..notes.len() - MAX_CONTACT_NOTES);
    }
    let notes = serde_json::to_string(&notes).map_err(|source| StoreError::Encode {
        what: "contact notes",
        source,
    })?;
    c.prepare_cached(
        "INSERT INTO contacts (node_id, name, n_tasks, n_success, last_seen_at, notes)
         VALUES (?1, ?2, 1, ?3, ?4, ?5)
         ON CONFLICT (node_id) DO UPDATE SET
             name = excluded.name,
             n_tasks = contacts.n_tasks + 1,
             n_success = contacts.n_success + excluded.n_success,
             last_seen_at = max(contacts.last_seen_at, excluded.last_seen_at),
             notes = excluded.notes",
    )
    .and_then(|mut s| s.execute(params![node_id, name, i64::from(success), at, notes]))
    .map_err(err("record collaboration"))?;
    Ok(())
}

const CONTACT_COLUMNS: &str = "node_id, name, n_tasks, n_success, last_seen_at, notes";

/// Reads a contact; `notes` is split into one JSON text per note.
fn contact_row(row: &Row<'_>) -> rusqlite::Result<(Contact<Json>, String)> {
    Ok((
        Contact {
            node_id: row.get(0)?,
            name: row.get(1)?,
            n_tasks: get_u64(row, 2)?,
            n_success: get_u64(row, 3)?,
            last_seen_at: row.get(4)?,
            notes: Vec::new(),
        },
        row.get(5)?,
    ))
}

fn split_notes((mut contact, notes): (Contact<Json>, String)) -> Result<Contact<Json>> {
    let notes: Vec<serde_json::Value> =
        serde_json::from_str(&notes).map_err(|source| StoreError::Decode {
            what: "contact notes",
            source,
        })?;
    contact.notes = notes.iter().map(serde_json::Value::to_string).collect();
    Ok(contact)
}

pub(super) fn contacts(c: &Connection) -> Result<Vec<Contact<Json>>> {
    let rows: Vec<_> = c
        .prepare_cached(&format!(
            "SELECT {CONTACT_COLUMNS} FROM contacts ORDER BY last_seen_at DESC, node_id"
        ))
        .and_then(|mut s| s.query_map([], contact_row)?.collect())
        .map_err(err("list contacts"))?;
    rows.into_iter().map(split_notes).collect()
}

pub(super) fn contact(c: &Connection, node_id: &str) -> Result<Option<Contact<Json>>> {
    c.prepare_cached(&format!(
        "SELECT {CONTACT_COLUMNS} FROM contacts WHERE node_id = ?1"
    ))
    .and_then(|mut s| s.query_row([node_id], contact_row).optional())
    .map_err(err("get contact"))?
    .map(split_notes)
    .transpose()
}

// ----- groups -----

pub(super) fn upsert_group(c: &Connection, g: &GroupRecord<Json>) -> Result<()> {
    c.prepare_cached(
        "INSERT INTO groups
             (group_id, parent_group_id, goal, state, created_at, updated_at, body)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT (group_id) DO UPDATE SET
             parent_group_id = excluded.parent_group_id, goal = excluded.goal,
             state = excluded.state, updated_at = excluded.updated_at, body = excluded.body",
    )
    .and_then(|mut s| {
        s.execute(params![
            g.group_id,
            g.parent_group_id,
            g.goal,
            g.state,
            g.created_at,
            g.updated_at,
            g.body
        ])
    })
    .map_err(err("upsert group"))?;
    Ok(())
}

const GROUP_COLUMNS: &str = "group_id, parent_group_id, goal, state, created_at, updated_at, body";

fn group_row(row: &Row<'_>) -> rusqlite::Result<GroupRecord<Json>> {
    Ok(GroupRecord {
        group_id: row.get(0)?,
        parent_group_id: row.get(1)?,
        goal: row.get(2)?,
        state: row.get(3)?,
        created_at: row.get(4)?,
        updated_at: row.get(5)?,
        body: row.get(6)?,
    })
}

pub(super) fn groups(c: &Connection, limit: usize) -> Result<Vec<GroupRecord<Json>>> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    c.prepare_cached(&format!(
        "SELECT {GROUP_COLUMNS} FROM groups ORDER BY created_at DESC, group_id LIMIT ?1"
    ))
    .and_then(|mut s| s.query_map([limit], group_row)?.collect())
    .map_err(err("list groups"))
}

pub(super) fn group(c: &Connection, group_id: &str) -> Result<Option<GroupRecord<Json>>> {
    c.prepare_cached(&format!(
        "SELECT {GROUP_COLUMNS} FROM groups WHERE group_id = ?1"
    ))
    .and_then(|mut s| s.query_row([group_id], group_row).optional())
    .map_err(err("get group"))
}

// ----- messages -----

pub(super) fn append_message(c: &Connection, group_id: &str, seq: u64, body: &str) -> Result<bool> {
    let seq = to_i64("message seq", seq)?;
    let inserted = c
        .prepare_cached(
            "INSERT INTO messages (group_id, seq, body) VALUES (?1, ?2, ?3)
             ON CONFLICT (group_id, seq) DO NOTHING",
        )
        .and_then(|mut s| s.execute(params![group_id, seq, body]))
        .map_err(err("append message"))?;
    Ok(inserted > 0)
}

pub(super) fn messages(
    c: &Connection,
    group_id: &str,
    after: Option<u64>,
) -> Result<Vec<MessageRecord<Json>>> {
    // `after` beyond i64::MAX cannot match any stored seq.
    let after = match after {
        Some(a) => i64::try_from(a).unwrap_or(i64::MAX),
        None => -1,
    };
    c.prepare_cached(
        "SELECT group_id, seq, body FROM messages
         WHERE group_id = ?1 AND seq > ?2 ORDER BY seq",
    )
    .and_then(|mut s| {
        s.query_map(params![group_id, after], |row| {
            Ok(MessageRecord {
                group_id: row.get(0)?,
                seq: get_u64(row, 1)?,
                body: row.get(2)?,
            })
        })?
        .collect()
    })
    .map_err(err("list messages"))
}

// ----- tasks -----

pub(super) fn upsert_task(c: &Connection, t: &TaskRecord<Json>) -> Result<()> {
    c.prepare_cached(
        "INSERT OR REPLACE INTO tasks (task_id, group_id, assignee, state, updated_at, body)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )
    .and_then(|mut s| {
        s.execute(params![
            t.task_id,
            t.group_id,
            t.assignee,
            t.state,
            t.updated_at,
            t.body
        ])
    })
    .map_err(err("upsert task"))?;
    Ok(())
}

const TASK_COLUMNS: &str = "task_id, group_id, assignee, state, updated_at, body";

fn task_row(row: &Row<'_>) -> rusqlite::Result<TaskRecord<Json>> {
    Ok(TaskRecord {
        task_id: row.get(0)?,
        group_id: row.get(1)?,
        assignee: row.get(2)?,
        state: row.get(3)?,
        updated_at: row.get(4)?,
        body: row.get(5)?,
    })
}

pub(super) fn task(c: &Connection, task_id: &str) -> Result<Option<TaskRecord<Json>>> {
    c.prepare_cached(&format!(
        "SELECT {TASK_COLUMNS} FROM tasks WHERE task_id = ?1"
    ))
    .and_then(|mut s| s.query_row([task_id], task_row).optional())
    .map_err(err("get task"))
}

pub(super) fn tasks_in_group(c: &Connection, group_id: &str) -> Result<Vec<TaskRecord<Json>>> {
    c.prepare_cached(&format!(
        "SELECT {TASK_COLUMNS} FROM tasks WHERE group_id = ?1 ORDER BY updated_at, task_id"
    ))
    .and_then(|mut s| s.query_map([group_id], task_row)?.collect())
    .map_err(err("list tasks by group"))
}

pub(super) fn tasks_in_state(c: &Connection, state: &str) -> Result<Vec<TaskRecord<Json>>> {
    c.prepare_cached(&format!(
        "SELECT {TASK_COLUMNS} FROM tasks WHERE state = ?1 ORDER BY updated_at, task_id"
    ))
    .and_then(|mut s| s.query_map([state], task_row)?.collect())
    .map_err(err("list tasks by state"))
}

// ----- memories -----

pub(super) fn insert_memory(c: &Connection, m: &MemoryRecord<Json>) -> Result<bool> {
    let inserted = c
        .prepare_cached(
            "INSERT INTO memories
                 (id, domain, author, score, created_at, prompt, answer, body, forgotten)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
             ON CONFLICT (id) DO NOTHING",
        )
        .and_then(|mut s| {
            s.execute(params![
                m.id,
                m.domain,
                m.author,
                m.score,
                m.created_at,
                m.prompt,
                m.answer,
                m.body,
                m.forgotten
            ])
        })
        .map_err(err("insert memory"))?;
    Ok(inserted > 0)
}

const MEMORY_COLUMNS: &str =
    "id, domain, author, score, created_at, prompt, answer, body, forgotten";

fn memory_row(row: &Row<'_>) -> rusqlite::Result<MemoryRecord<Json>> {
    Ok(MemoryRecord {
        id: row.get(0)?,
        domain: row.get(1)?,
        author: row.get(2)?,
        score: row.get(3)?,
        created_at: row.get(4)?,
        prompt: row.get(5)?,
        answer: row.get(6)?,
        body: row.get(7)?,
        forgotten: row.get(8)?,
    })
}

pub(super) fn memory(c: &Connection, id: &str) -> Result<Option<MemoryRecord<Json>>> {
    c.prepare_cached(&format!(
        "SELECT {MEMORY_COLUMNS} FROM memories WHERE id = ?1"
    ))
    .and_then(|mut s| s.query_row([id], memory_row).optional())
    .map_err(err("get memory"))
}

pub(super) fn memories(c: &Connection, f: &MemoryFilter) -> Result<Vec<MemoryRecord<Json>>> {
    // A negative LIMIT means "no limit" in SQLite.
    let limit = f.limit.map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX));
    c.prepare_cached(&format!(
        "SELECT {MEMORY_COLUMNS} FROM memories
         WHERE (?1 IS NULL OR domain = ?1)
           AND (?2 IS NULL OR author = ?2)
           AND (?3 OR forgotten = 0)
         ORDER BY created_at DESC, id
         LIMIT ?4"
    ))
    .and_then(|mut s| {
        let rows = s.query_map(
            params![f.domain, f.author, f.include_forgotten, limit],
            |row| Ok((row.get::<_, String>(0).ok(), memory_row(row))),
        )?;
        let mut out = Vec::new();
        for r in rows {
            match r? {
                (_, Ok(m)) => out.push(m),
                // One damaged row does not hide the others (nor stop the node).
                (id, Err(e)) => tracing::warn!(
                    table = "memories",
                    id = id.as_deref().unwrap_or("?"),
                    error = %e,
                    "unreadable row skipped"
                ),
            }
        }
        Ok(out)
    })
    .map_err(err("list memories"))
}

pub(super) fn delete_memory(c: &Connection, id: &str) -> Result<bool> {
    let deleted = c
        .prepare_cached("DELETE FROM memories WHERE id = ?1")
        .and_then(|mut s| s.execute([id]))
        .map_err(err("delete memory"))?;
    Ok(deleted > 0)
}

pub(super) fn memory_count(c: &Connection, domain: Option<&str>) -> Result<u64> {
    c.prepare_cached(
        "SELECT count(*) FROM memories WHERE forgotten = 0 AND (?1 IS NULL OR domain = ?1)",
    )
    .and_then(|mut s| s.query_row([domain], |row| get_u64(row, 0)))
    .map_err(err("count memories"))
}

pub(super) fn set_memory_forgotten(c: &Connection, id: &str, forgotten: bool) -> Result<bool> {
    let changed = c
        .prepare_cached("UPDATE memories SET forgotten = ?2 WHERE id = ?1")
        .and_then(|mut s| s.execute(params![id, forgotten]))
        .map_err(err("forget memory"))?;
    Ok(changed > 0)
}

pub(super) fn set_memory_score(c: &Connection, id: &str, score: f64) -> Result<bool> {
    let changed = c
        .prepare_cached("UPDATE memories SET score = ?2 WHERE id = ?1")
        .and_then(|mut s| s.execute(params![id, score]))
        .map_err(err("score memory"))?;
    Ok(changed > 0)
}

pub(super) fn set_memory_body(c: &Connection, id: &str, body: &str) -> Result<bool> {
    let changed = c
        .prepare_cached("UPDATE memories SET body = ?2 WHERE id = ?1")
        .and_then(|mut s| s.execute(params![id, body]))
        .map_err(err("update memory body"))?;
    Ok(changed > 0)
}

pub(super) fn delete_memories_by_author(c: &Connection, author: &str) -> Result<u64> {
    let deleted = c
        .prepare_cached("DELETE FROM memories WHERE author = ?1")
        .and_then(|mut s| s.execute([author]))
        .map_err(err("delete memories"))?;
    // usize -> u64 is lossless on every supported target.
    Ok(deleted as u64)
}

// ----- author trust -----

fn trust_row(row: &Row<'_>) -> rusqlite::Result<AuthorTrust> {
    let trust: f64 = row.get(1)?;
    Ok(AuthorTrust {
        author: row.get(0)?,
        trust: trust as f32,
        ignored: row.get(2)?,
    })
}

pub(super) fn author_trust(c: &Connection, author: &str) -> Result<Option<AuthorTrust>> {
    c.prepare_cached("SELECT author, trust, ignored FROM author_trust WHERE author = ?1")
        .and_then(|mut s| s.query_row([author], trust_row).optional())
        .map_err(err("get author trust"))
}

pub(super) fn set_author_trust(c: &Connection, t: &AuthorTrust) -> Result<()> {
    c.prepare_cached(
        "INSERT OR REPLACE INTO author_trust (author, trust, ignored) VALUES (?1, ?2, ?3)",
    )
    .and_then(|mut s| s.execute(params![t.author, f64::from(t.trust), t.ignored]))
    .map_err(err("set author trust"))?;
    Ok(())
}

pub(super) fn author_trusts(c: &Connection) -> Result<Vec<AuthorTrust>> {
    c.prepare_cached("SELECT author, trust, ignored FROM author_trust ORDER BY author")
        .and_then(|mut s| s.query_map([], trust_row)?.collect())
        .map_err(err("list author trust"))
}

// ----- settings -----

pub(super) fn kv_get(c: &Connection, key: &str) -> Result<Option<String>> {
    c.prepare_cached("SELECT value FROM kv WHERE key = ?1")
        .and_then(|mut s| s.query_row([key], |row| row.get(0)).optional())
        .map_err(err("get setting"))
}

pub(super) fn kv_set(c: &Connection, key: &str, value: &str) -> Result<()> {
    c.prepare_cached("INSERT OR REPLACE INTO kv (key, value) VALUES (?1, ?2)")
        .and_then(|mut s| s.execute([key, value]))
        .map_err(err("set setting"))?;
    Ok(())
}

pub(super) fn kv_delete(c: &Connection, key: &str) -> Result<bool> {
    let deleted = c
        .prepare_cached("DELETE FROM kv WHERE key = ?1")
        .and_then(|mut s| s.execute([key]))
        .map_err(err("delete setting"))?;
    Ok(deleted > 0)
}
