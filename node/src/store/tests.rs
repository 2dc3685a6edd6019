#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command as Process, Stdio};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::*;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Body {
    text: String,
    n: u32,
}

fn body(text: &str, n: u32) -> Body {
    Body {
        text: text.into(),
        n,
    }
}

fn temp_store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("node.db")).unwrap();
    (dir, store)
}

fn card(author: &str, at: i64, id: u8) -> CardRecord<Body> {
    CardRecord {
        record_id: vec![id; 32],
        author: author.into(),
        name: format!("{author}-{at}"),
        updated_at: at,
        body: body("card", id.into()),
    }
}

#[tokio::test]
async fn cards_keep_newest_per_author() {
    let (_dir, store) = temp_store();
    assert!(store.upsert_card(&card("alice", 10, 1)).await.unwrap());
    assert!(store.upsert_card(&card("bob", 5, 2)).await.unwrap());
    // Older card from the same author is ignored, newer replaces.
    assert!(!store.upsert_card(&card("alice", 9, 3)).await.unwrap());
    assert!(store.upsert_card(&card("alice", 11, 4)).await.unwrap());
    // Same time: the larger record id wins, so every node converges on the same card.
    assert!(store.upsert_card(&card("alice", 11, 5)).await.unwrap());
    assert!(!store.upsert_card(&card("alice", 11, 4)).await.unwrap());

    let all: Vec<CardRecord<Body>> = store.cards().await.unwrap();
    assert_eq!(all, vec![card("alice", 11, 5), card("bob", 5, 2)]);
    let bob: Option<CardRecord<Body>> = store.card("bob").await.unwrap();
    assert_eq!(bob, Some(card("bob", 5, 2)));
    assert_eq!(store.card::<Body>("carol").await.unwrap(), None);
}

#[tokio::test]
async fn contact_book_counts_collaborations() {
    let (_dir, store) = temp_store();
    store
        .record_collaboration("n1", "Alice", true, &"wrote the report")
        .await
        .unwrap();
    store
        .record_collaboration("n1", "Alice B.", false, &"timed out")
        .await
        .unwrap();
    store
        .record_collaboration("n2", "Bob", true, &"ok")
        .await
        .unwrap();
    let n1: Contact<String> = store.contact("n1").await.unwrap().unwrap();
    assert_eq!(n1.name, "Alice B.");
    assert_eq!((n1.n_tasks, n1.n_success), (2, 1));
    assert_eq!(n1.notes, vec!["wrote the report", "timed out"]);
    assert!(n1.last_seen_at > 0);
    let all: Vec<Contact<String>> = store.contacts().await.unwrap();
    assert_eq!(all.len(), 2);

    for i in 0..(MAX_CONTACT_NOTES + 5) {
        store
            .record_collaboration("n3", "Carol", i % 2 == 0, &i)
            .await
            .unwrap();
    }
    let n3: Contact<usize> = store.contact("n3").await.unwrap().unwrap();
    assert_eq!(n3.n_tasks as usize, MAX_CONTACT_NOTES + 5);
    assert_eq!(n3.notes.len(), MAX_CONTACT_NOTES);
    assert_eq!(n3.notes.first(), Some(&5));
    assert_eq!(n3.notes.last(), Some(&(MAX_CONTACT_NOTES + 4)));
}

fn group(id: &str, created_at: i64, parent: Option<&str>) -> GroupRecord<Body> {
    GroupRecord {
        group_id: id.into(),
        parent_group_id: parent.map(Into::into),
        goal: format!("goal of {id}"),
        state: "forming".into(),
        created_at,
        updated_at: created_at,
        body: body(id, 0),
    }
}

#[tokio::test]
async fn groups_round_trip_newest_first() {
    let (_dir, store) = temp_store();
    store.upsert_group(&group("g1", 1, None)).await.unwrap();
    store
        .upsert_group(&group("g3", 3, Some("g1")))
        .await
        .unwrap();
    store.upsert_group(&group("g2", 2, None)).await.unwrap();
    let mut g1 = group("g1", 1, None);
    g1.state = "done".into();
    g1.updated_at = 9;
    store.upsert_group(&g1).await.unwrap();
    // An update keeps the group's creation time (and so its place in the list).
    let mut later = g1.clone();
    later.created_at = 50;
    store.upsert_group(&later).await.unwrap();

    let two: Vec<GroupRecord<Body>> = store.groups(2).await.unwrap();
    assert_eq!(two, vec![group("g3", 3, Some("g1")), group("g2", 2, None)]);
    let all: Vec<GroupRecord<Body>> = store.groups(100).await.unwrap();
    assert_eq!(all.len(), 3);
    assert_eq!(store.group("g1").await.unwrap(), Some(g1));
    assert_eq!(store.group::<Body>("nope").await.unwrap(), None);
}

#[tokio::test]
async fn messages_append_is_idempotent_and_ordered() {
    let (_dir, store) = temp_store();
    for seq in [2u64, 0, 1] {
        assert!(store
            .append_message("g", seq, &body("m", seq as u32))
            .await
            .unwrap());
    }
    // A replayed message keeps the first copy.
    assert!(!store
        .append_message("g", 1, &body("dup", 99))
        .await
        .unwrap());
    assert!(store
        .append_message("other", 1, &body("o", 1))
        .await
        .unwrap());

    let msgs: Vec<MessageRecord<Body>> = store.messages("g").await.unwrap();
    let seqs: Vec<u64> = msgs.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, vec![0, 1, 2]);
    assert_eq!(msgs[1].body, body("m", 1));
    let after: Vec<MessageRecord<Body>> = store.messages_after("g", Some(0)).await.unwrap();
    assert_eq!(after.len(), 2);
    assert!(matches!(
        store.append_message("g", u64::MAX, &body("x", 0)).await,
        Err(StoreError::OutOfRange { .. })
    ));
}

fn task(id: &str, group: &str, state: &str, at: i64) -> TaskRecord<Body> {
    TaskRecord {
        task_id: id.into(),
        group_id: group.into(),
        assignee: Some("n1".into()),
        state: state.into(),
        updated_at: at,
        body: body(id, 1),
    }
}

#[tokio::test]
async fn tasks_round_trip() {
    let (_dir, store) = temp_store();
    store
        .upsert_task(&task("t1", "g", "open", 1))
        .await
        .unwrap();
    store
        .upsert_task(&task("t2", "g", "open", 2))
        .await
        .unwrap();
    store
        .upsert_task(&task("t3", "h", "done", 3))
        .await
        .unwrap();
    store
        .upsert_task(&task("t1", "g", "done", 4))
        .await
        .unwrap();

    assert_eq!(
        store.task("t1").await.unwrap(),
        Some(task("t1", "g", "done", 4))
    );
    let in_g: Vec<TaskRecord<Body>> = store.tasks_in_group("g").await.unwrap();
    assert_eq!(
        in_g,
        vec![task("t2", "g", "open", 2), task("t1", "g", "done", 4)]
    );
    let done: Vec<TaskRecord<Body>> = store.tasks_in_state("done").await.unwrap();
    let ids: Vec<&str> = done.iter().map(|t| t.task_id.as_str()).collect();
    assert_eq!(ids, vec!["t3", "t1"]);
}

fn memory(id: &str, domain: &str, author: &str, at: i64) -> MemoryRecord<Body> {
    MemoryRecord {
        id: id.into(),
        domain: domain.into(),
        author: author.into(),
        score: 0.5,
        created_at: at,
        prompt: format!("prompt {id}"),
        answer: format!("answer {id}"),
        body: body(id, 7),
        forgotten: false,
    }
}

#[tokio::test]
async fn memories_round_trip() {
    let (_dir, store) = temp_store();
    assert!(store
        .insert_memory(&memory("m1", "math", "a", 1))
        .await
        .unwrap());
    assert!(store
        .insert_memory(&memory("m2", "math", "b", 2))
        .await
        .unwrap());
    assert!(store
        .insert_memory(&memory("m3", "code", "a", 3))
        .await
        .unwrap());
    assert!(!store
        .insert_memory(&memory("m1", "x", "y", 9))
        .await
        .unwrap());
    assert_eq!(
        store.memory("m1").await.unwrap(),
        Some(memory("m1", "math", "a", 1))
    );

    let math = MemoryFilter {
        domain: Some("math".into()),
        ..Default::default()
    };
    let got: Vec<MemoryRecord<Body>> = store.memories(&math).await.unwrap();
    let ids: Vec<&str> = got.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, vec!["m2", "m1"]);
    let by_a = MemoryFilter {
        author: Some("a".into()),
        limit: Some(1),
        ..Default::default()
    };
    let got: Vec<MemoryRecord<Body>> = store.memories(&by_a).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, "m3");

    assert!(store.set_memory_score("m2", 0.9).await.unwrap());
    assert!(store.set_memory_forgotten("m2", true).await.unwrap());
    assert!(!store.set_memory_forgotten("nope", true).await.unwrap());
    assert_eq!(store.memory_count(Some("math")).await.unwrap(), 1);
    assert_eq!(store.memory_count(None).await.unwrap(), 2);
    let got: Vec<MemoryRecord<Body>> = store.memories(&math).await.unwrap();
    assert_eq!(got.len(), 1);
    let with_forgotten = MemoryFilter {
        include_forgotten: true,
        ..math
    };
    let got: Vec<MemoryRecord<Body>> = store.memories(&with_forgotten).await.unwrap();
    assert_eq!(got[0].score, 0.9);
    assert!(got[0].forgotten);

    assert_eq!(store.delete_memories_by_author("a").await.unwrap(), 2);
    assert_eq!(store.memory_count(None).await.unwrap(), 0);
    assert_eq!(store.memory::<Body>("m1").await.unwrap(), None);
}

#[tokio::test]
async fn author_trust_and_settings_round_trip() {
    let (_dir, store) = temp_store();
    assert_eq!(store.author_trust("a").await.unwrap(), None);
    let t = AuthorTrust {
        author: "a".into(),
        trust: 0.25,
        ignored: true,
    };
    store.set_author_trust(&t).await.unwrap();
    assert_eq!(store.author_trust("a").await.unwrap(), Some(t.clone()));
    assert_eq!(store.author_trusts().await.unwrap(), vec![t]);

    assert_eq!(store.kv_get("model").await.unwrap(), None);
    store.kv_set("model", "qwen").await.unwrap();
    store.kv_set("model", "llama").await.unwrap();
    assert_eq!(
        store.kv_get("model").await.unwrap().as_deref(),
        Some("llama")
    );
    assert!(store.kv_delete("model").await.unwrap());
    assert!(!store.kv_delete("model").await.unwrap());
}

#[tokio::test]
async fn wrong_payload_type_is_a_decode_error() {
    let (_dir, store) = temp_store();
    store.append_message("g", 0, &"just text").await.unwrap();
    let res = store.messages::<Body>("g").await;
    assert!(matches!(res, Err(StoreError::Decode { .. })), "{res:?}");
}

#[test]
fn blocking_api_and_reopen_keep_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.db");
    {
        let store = Store::open(&path).unwrap();
        assert!(store.append_message("g", 0, &body("a", 0)).wait().unwrap());
        store.kv_set("k", "v").wait().unwrap();
        store.upsert_card(&card("alice", 1, 1)).wait().unwrap();
        store.upsert_group(&group("g", 1, None)).wait().unwrap();
        store
            .upsert_task(&task("t", "g", "open", 1))
            .wait()
            .unwrap();
        store
            .insert_memory(&memory("m", "d", "a", 1))
            .wait()
            .unwrap();
    }
    let store = Store::open(&path).unwrap();
    let msgs: Vec<MessageRecord<Body>> = store.messages("g").wait().unwrap();
    assert_eq!(msgs.len(), 1);
    assert_eq!(store.kv_get("k").wait().unwrap().as_deref(), Some("v"));
    assert_eq!(
        store.card("alice").wait().unwrap(),
        Some(card("alice", 1, 1))
    );
    assert_eq!(store.group("g").wait().unwrap(), Some(group("g", 1, None)));
    assert_eq!(
        store.task("t").wait().unwrap(),
        Some(task("t", "g", "open", 1))
    );
    assert_eq!(store.memory_count(None).wait().unwrap(), 1);
}

#[test]
fn garbage_file_is_a_clear_error_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.db");
    let garbage: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
    std::fs::write(&path, &garbage).unwrap();

    let err = Store::open(&path).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert_eq!(std::fs::read(&path).unwrap(), garbage);
    // No journal files were created next to it either.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("node.db")]);
}

#[test]
fn damaged_pages_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.db");
    {
        let store = Store::open(&path).unwrap();
        for seq in 0..2000 {
            store
                .append_message("g", seq, &body(&"x".repeat(100), 0))
                .wait()
                .unwrap();
        }
    }
    // Keep the valid header, scribble over the rest of the file.
    let mut bytes = std::fs::read(&path).unwrap();
    assert!(bytes.len() > 16384);
    for b in &mut bytes[8192..] {
        *b = 0xA5;
    }
    std::fs::write(&path, &bytes).unwrap();
    let err = Store::open(&path).unwrap_err();
    assert!(
        matches!(err, StoreError::Corrupt { .. }),
        "expected Corrupt, got {err:?}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}

#[test]
fn newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.db");
    drop(Store::open(&path).unwrap());
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(&format!(
            "PRAGMA user_version = {}",
            Store::schema_version() + 1
        ))
        .unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let err = Store::open(&path).unwrap_err();
    match &err {
        StoreError::TooNew {
            found, supported, ..
        } => {
            assert_eq!(*found, Store::schema_version() + 1);
            assert_eq!(*supported, Store::schema_version());
        }
        other => panic!("expected TooNew, got {other:?}"),
    }
    assert!(err.to_string().contains(&path.display().to_string()));
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_tasks_share_one_store() {
    let (_dir, store) = temp_store();
    let mut handles = Vec::new();
    for t in 0..32u32 {
        let store = store.clone();
        handles.push(tokio::spawn(async move {
            for seq in 0..50u64 {
                let group = format!("g{}", t % 4);
                let seq = u64::from(t / 4) * 1000 + seq;
                assert!(store
                    .append_message(&group, seq, &body("c", t))
                    .await
                    .unwrap());
                store
                    .kv_set(&format!("k{t}"), &seq.to_string())
                    .await
                    .unwrap();
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    for g in 0..4 {
        let msgs: Vec<MessageRecord<Body>> = store.messages(&format!("g{g}")).await.unwrap();
        assert_eq!(msgs.len(), 8 * 50);
        assert!(msgs.windows(2).all(|w| w[0].seq < w[1].seq));
    }
    assert_eq!(store.kv_get("k31").await.unwrap().as_deref(), Some("7049"));
}

/// Env var that turns [`crash_child_helper`] into the child of [`killed_writer_loses_nothing_acknowledged`].
const CRASH_DB_ENV: &str = "STARLING_STORE_CRASH_CHILD_DB";

/// Not a test on its own: when re-executed by the crash test with [`CRASH_DB_ENV`] set, it
/// writes messages from 4 threads forever, printing `ack <thread> <seq>` after each reply.
#[test]
fn crash_child_helper() {
    let Ok(path) = std::env::var(CRASH_DB_ENV) else {
        return;
    };
    let store = Store::open(path).unwrap();
    let threads: Vec<_> = (0..4u32)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for seq in 0u64.. {
                    store
                        .append_message(&format!("crash{t}"), seq, &body("payload", t))
                        .wait()
                        .unwrap();
                    println!("ack {t} {seq}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn killed_writer_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.db");
    let mut child = Process::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "store::tests::crash_child_helper",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CRASH_DB_ENV, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut acked: Vec<(u32, u64)> = Vec::new();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    while acked.len() < 400 {
        let line = lines.next().expect("child exited early").unwrap();
        if let Some(ack) = parse_ack(&line) {
            acked.push(ack);
        }
    }
    // SIGKILL mid-stream: no destructors, no clean close.
    child.kill().unwrap();
    // Acks already written to the pipe before the kill count too.
    for line in lines {
        if let Some(ack) = parse_ack(&line.unwrap()) {
            acked.push(ack);
        }
    }
    let status = child.wait().unwrap();
    assert!(!status.success());

    check_acked_present(&path, &acked);
}

fn parse_ack(line: &str) -> Option<(u32, u64)> {
    let mut parts = line.strip_prefix("ack ")?.split(' ');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

fn check_acked_present(path: &Path, acked: &[(u32, u64)]) {
    let store = Store::open(path).unwrap();
    for t in 0..4u32 {
        let stored: std::collections::HashSet<u64> = store
            .messages::<Body>(&format!("crash{t}"))
            .wait()
            .unwrap()
            .into_iter()
            .map(|m| m.seq)
            .collect();
        for &(_, seq) in acked.iter().filter(|(at, _)| *at == t) {
            assert!(stored.contains(&seq), "acknowledged crash{t}/{seq} lost");
        }
    }
    eprintln!("crash test: {} acknowledged rows all present", acked.len());
}

/// Throughput with FULL durability: one writer awaiting each insert, then 64 concurrent
/// writers (group commit). Prints rows/s; asserts only that every row landed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_insert_throughput() {
    let (_dir, store) = temp_store();
    let n = 1000u64;
    let start = Instant::now();
    for seq in 0..n {
        store
            .append_message("seq", seq, &body("m", 0))
            .await
            .unwrap();
    }
    let sequential = n as f64 / start.elapsed().as_secs_f64();

    let writers = 64u64;
    let per = 200u64;
    let start = Instant::now();
    let mut handles = Vec::new();
    for w in 0..writers {
        let store = store.clone();
        handles.push(tokio::spawn(async move {
            for seq in 0..per {
                store
                    .append_message(&format!("w{w}"), seq, &body("m", 0))
                    .await
                    .unwrap();
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let concurrent = (writers * per) as f64 / start.elapsed().as_secs_f64();
    eprintln!(
        "message inserts (synchronous=FULL): sequential {sequential:.0} rows/s, \
         {writers} concurrent writers {concurrent:.0} rows/s"
    );
    assert_eq!(store.messages::<Body>("seq").await.unwrap().len() as u64, n);
    assert_eq!(
        store.messages::<Body>("w63").await.unwrap().len() as u64,
        per
    );
}
