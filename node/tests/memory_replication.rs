//! Memories across real swarms on loopback (QUIC, signed records, push + reconciliation):
//! a memory added on one node is retrievable on the others, survives a restart, and 10,000
//! memories reach 5 nodes (timed).

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use starling_discovery::discover::FilePeerCache;
use starling_discovery::{BootstrapPeer, SqliteRecordStore, Swarm, SwarmConfig, SwarmSecret};
use starling_models::embed::{BertEmbedder, EmbedHandle};
use starling_node::memory::{
    admit, AdmissionConfig, Admitted, BookConfig, MemoryBook, Pair, MEMORY_KIND,
};
use starling_node::store::Store;
use tokio_util::sync::CancellationToken;

async fn start(dir: &Path, secret: &SwarmSecret, boot: Option<&Swarm>) -> Swarm {
    let mut c = SwarmConfig::new(dir, secret.clone());
    c.listen = "127.0.0.1:0".parse().unwrap();
    c.mdns = false;
    c.sync_interval = Duration::from_secs(1);
    c.rejoin_interval = Duration::from_millis(300);
    if let Some(b) = boot {
        c.bootstrap = vec![BootstrapPeer {
            addr: b.local_addr(),
            node_id: Some(b.node_id()),
        }];
    }
    let store = Arc::new(SqliteRecordStore::in_dir(dir).unwrap());
    Swarm::start_with(c, store, Arc::new(FilePeerCache::in_dir(dir)))
        .await
        .unwrap()
}

async fn open_book(dir: &Path, e: Option<EmbedHandle>, swarm: &Swarm) -> MemoryBook {
    let store = Store::open(dir.join("node.db")).unwrap();
    MemoryBook::open(store, e, Some(swarm.clone()), BookConfig::default())
        .await
        .unwrap()
}

async fn until(what: &str, deadline: Duration, mut ok: impl AsyncFnMut() -> bool) {
    let t = Instant::now();
    while !ok().await {
        assert!(t.elapsed() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_reaches_every_node_and_survives_restart() {
    let e = EmbedHandle::spawn(
        BertEmbedder::load(starling_models::testing::embedding_model()).unwrap(),
    )
    .unwrap();
    let secret = SwarmSecret::generate();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let a = start(dirs[0].path(), &secret, None).await;
    let b = start(dirs[1].path(), &secret, Some(&a)).await;
    let c = start(dirs[2].path(), &secret, Some(&a)).await;
    let cancel = CancellationToken::new();
    let mut books = Vec::new();
    // Owned here: aborted when the test ends, however it ends.
    let mut follows = tokio::task::JoinSet::new();
    for (d, s) in dirs.iter().zip([&a, &b, &c]) {
        let book = open_book(d.path(), Some(e.clone()), s).await;
        follows.spawn(book.follow(s.clone(), cancel.clone()));
        books.push(book);
    }
    let pair = Pair {
        domain: "math".into(),
        prompt: "What is 17 multiplied by 3?".into(),
        answer: "17 x 3 = 51".into(),
        source: Some("task-1".into()),
    };
    let kept = admit(&books[0], None, &AdmissionConfig::default(), &pair, None)
        .await
        .unwrap();
    let Admitted::Kept(m) = kept else {
        panic!("not kept: {kept:?}")
    };
    assert_eq!(m.author, a.node_id().to_string());
    for book in &books[1..] {
        until("replication", Duration::from_secs(20), async || {
            book.top_k("math", "seventeen times three", 3)
                .await
                .unwrap()
                .iter()
                .any(|h| h.memory.id == m.id && h.memory.author == m.author)
        })
        .await;
    }
    // Restart C with the same data dir: the memory is there before any sync.
    cancel.cancel();
    c.shutdown().await;
    let c_book = books.pop().unwrap();
    drop(c_book);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let c2 = start(dirs[2].path(), &secret, Some(&a)).await;
    let book = open_book(dirs[2].path(), Some(e.clone()), &c2).await;
    assert!(book.get(&m.id).is_some(), "memory lost on restart");
    let hits = book.top_k("math", "17 times 3", 1).await.unwrap();
    assert_eq!(hits[0].memory.id, m.id);
    for s in [&a, &b, &c2] {
        s.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_memory_row_is_skipped_and_rebuilt_from_its_signed_record() {
    let e = EmbedHandle::spawn(
        BertEmbedder::load(starling_models::testing::embedding_model()).unwrap(),
    )
    .unwrap();
    let secret = SwarmSecret::generate();
    let dir = tempfile::tempdir().unwrap();
    let a = start(dir.path(), &secret, None).await;
    let book = open_book(dir.path(), Some(e.clone()), &a).await;
    let mut ids = Vec::new();
    for (prompt, answer) in [
        ("What is 17 multiplied by 3?", "17 x 3 = 51"),
        ("What is 12 plus 30?", "12 + 30 = 42"),
    ] {
        let pair = Pair {
            domain: "math".into(),
            prompt: prompt.into(),
            answer: answer.into(),
            source: None,
        };
        match admit(&book, None, &AdmissionConfig::default(), &pair, None)
            .await
            .unwrap()
        {
            Admitted::Kept(m) => ids.push(m.id),
            other => panic!("not kept: {other:?}"),
        }
    }
    drop(book);
    a.shutdown().await;
    // Damage the first row's body on disk, as a bad sector or a stray write would.
    let db = rusqlite::Connection::open(dir.path().join("node.db")).unwrap();
    let changed = db
        .execute(
            "UPDATE memories SET body = '{not json' WHERE id = ?1",
            [&ids[0]],
        )
        .unwrap();
    assert_eq!(changed, 1);
    drop(db);
    // The node starts; the other memory is there at once, the damaged one comes back
    // from the swarm's signed record.
    let a2 = start(dir.path(), &secret, None).await;
    let book = open_book(dir.path(), Some(e.clone()), &a2).await;
    assert!(book.get(&ids[1]).is_some(), "an intact memory was lost");
    assert!(book.get(&ids[0]).is_none(), "a damaged row was served");
    let cancel = CancellationToken::new();
    let mut follow = tokio::task::JoinSet::new();
    follow.spawn(book.follow(a2.clone(), cancel.clone()));
    until("rebuild", Duration::from_secs(20), async || {
        book.get(&ids[0]).is_some()
    })
    .await;
    cancel.cancel();
    a2.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_memories_reach_five_nodes() {
    const N: usize = 10_000;
    let secret = SwarmSecret::generate();
    let dirs: Vec<_> = (0..5).map(|_| tempfile::tempdir().unwrap()).collect();
    let first = start(dirs[0].path(), &secret, None).await;
    let mut swarms = vec![first.clone()];
    for d in &dirs[1..] {
        swarms.push(start(d.path(), &secret, Some(&first)).await);
    }
    until("membership", Duration::from_secs(20), async || {
        swarms.iter().all(|s| s.peers().len() >= 4)
    })
    .await;
    let t = Instant::now();
    for i in 0..N {
        let body = MemoryBook::body(
            "general",
            &format!("Question number {i}: what is {i} plus {i}?"),
            &format!("{}", 2 * i),
            None,
            7.0,
        );
        first.publish(MEMORY_KIND, body.encode()).await.unwrap();
    }
    let published = t.elapsed();
    until(
        "10k records on 5 nodes",
        Duration::from_secs(120),
        async || {
            swarms
                .iter()
                .all(|s| s.records(MEMORY_KIND).unwrap().len() == N)
        },
    )
    .await;
    let replicated = t.elapsed();
    // Ingest into a node's book (text-only index: no embedding model in this timing).
    let node = &swarms[4];
    let book = open_book(dirs[4].path(), None, node).await;
    let t2 = Instant::now();
    let n = book
        .ingest_records(&node.records(MEMORY_KIND).unwrap())
        .await
        .unwrap();
    let ingest = t2.elapsed();
    assert_eq!(n, N);
    eprintln!(
        "REPLICATION {N} memories to 5 nodes: published in {:.2}s, on all nodes after {:.2}s; \
         book ingest on one node {:.2}s",
        published.as_secs_f64(),
        replicated.as_secs_f64(),
        ingest.as_secs_f64()
    );
    for s in &swarms {
        s.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_the_add_and_nothing_diverges() {
    use starling_node::memory::{BookError, Inserted, MemoryBody, MEMORY_VERSION};
    let e = EmbedHandle::spawn(
        BertEmbedder::load(starling_models::testing::embedding_model()).unwrap(),
    )
    .unwrap();
    let secret = SwarmSecret::generate();
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let a = start(dirs[0].path(), &secret, None).await;
    let b = start(dirs[1].path(), &secret, Some(&a)).await;
    let store = Store::open(dirs[0].path().join("node.db")).unwrap();
    // Duplicate detection off: every memory below is distinct text.
    let config = BookConfig {
        duplicate_cosine: 2.0,
        ..BookConfig::default()
    };
    let book_a = MemoryBook::open(store.clone(), Some(e.clone()), Some(a.clone()), config)
        .await
        .unwrap();
    let cancel = CancellationToken::new();
    // The database may grow by a few pages, then it is "full".
    let size = std::fs::metadata(dirs[0].path().join("node.db"))
        .unwrap()
        .len();
    store.set_max_bytes(size + 24 * 1024).await.unwrap();
    let mut kept = Vec::new();
    let mut full = 0;
    for i in 0..120 {
        let body = MemoryBody {
            v: MEMORY_VERSION,
            domain: "stock".into(),
            prompt: format!("Where is crate {i} of the spring delivery kept?"),
            answer: format!("Crate {i} is on shelf {} in aisle {}.", i * 7 % 31, i % 9),
            source: None,
            score: 8.0,
            created_at: 1_700_000_000_000 + i,
        };
        match book_a.publish(body, None).await {
            Ok(Inserted::Added(m)) => kept.push(m.id),
            Err(BookError::Store(e)) if e.is_full() => full += 1,
            other => panic!("memory {i}: {other:?}"),
        }
    }
    assert!(full > 0, "the cap never filled ({} kept)", kept.len());
    assert!(!kept.is_empty(), "nothing fitted under the cap");
    // What this node lists, what it signed as records and what its peer receives are the
    // kept memories, no more.
    let listed: Vec<String> = book_a
        .list(Some("stock"), None, 1000)
        .into_iter()
        .map(|m| m.id)
        .collect();
    let mut want = kept.clone();
    want.sort();
    let mut got = listed.clone();
    got.sort();
    assert_eq!(got, want, "listed memories differ from the committed ones");
    let mut records: Vec<String> = a
        .records(MEMORY_KIND)
        .unwrap()
        .iter()
        .map(|r| r.id().to_string())
        .collect();
    records.sort();
    assert_eq!(
        records, want,
        "a memory that failed to commit was published"
    );
    // The peer receives the signed records of the kept memories and no others.
    let ids_at_b = || {
        let mut ids: Vec<String> = b
            .records(MEMORY_KIND)
            .unwrap()
            .iter()
            .map(|r| r.id().to_string())
            .collect();
        ids.sort();
        ids
    };
    until("replication", Duration::from_secs(20), async || {
        ids_at_b().len() >= want.len()
    })
    .await;
    assert_eq!(
        ids_at_b(),
        want,
        "the peer holds memories this node did not commit"
    );
    // After a restart (no cap) the same memories are there.
    cancel.cancel();
    drop(book_a);
    drop(store);
    a.shutdown().await;
    let a2 = start(dirs[0].path(), &secret, None).await;
    let book = open_book(dirs[0].path(), Some(e.clone()), &a2).await;
    let mut after: Vec<String> = book
        .list(Some("stock"), None, 1000)
        .into_iter()
        .map(|m| m.id)
        .collect();
    after.sort();
    assert_eq!(after, want, "memories lost or gained across the restart");
    for s in [&a2, &b] {
        s.shutdown().await;
    }
}
