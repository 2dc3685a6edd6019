//! Memory book behaviour with the real embedding model (all-MiniLM-L6-v2): duplicates,
//! trust / ignore / forget, flood resistance, feedback and persistence.

#![allow(clippy::unwrap_used)]

use starling_models::embed::{BertEmbedder, EmbedHandle};
use starling_models::testing;
use starling_node::memory::{BookConfig, Inserted, Memory, MemoryBook};
use starling_node::store::Store;

fn embedder() -> EmbedHandle {
    EmbedHandle::spawn(BertEmbedder::load(testing::embedding_model()).unwrap()).unwrap()
}

fn mem(id: &str, author: &str, domain: &str, prompt: &str, answer: &str, score: f32) -> Memory {
    Memory {
        id: id.into(),
        author: author.into(),
        domain: domain.into(),
        prompt: prompt.into(),
        answer: answer.into(),
        source: None,
        score,
        created_at: 1,
        helpful: 0,
        unhelpful: 0,
    }
}

async fn book(store: Store, e: &EmbedHandle) -> MemoryBook {
    MemoryBook::open(store, Some(e.clone()), None, BookConfig::default())
        .await
        .unwrap()
}

fn ids(hits: &[starling_node::memory::MemoryHit]) -> Vec<String> {
    hits.iter().map(|h| h.memory.id.clone()).collect()
}

#[tokio::test]
async fn near_duplicates_are_not_stored_twice() {
    let e = embedder();
    let b = book(Store::open_in_memory().unwrap(), &e).await;
    let mut added = b.subscribe_added();
    let first = b
        .insert(
            mem("a", "n1", "math", "What is 12 times 3?", "36", 8.0),
            None,
        )
        .await
        .unwrap();
    assert!(matches!(first, Inserted::Added(_)));
    // Same normalised text.
    let same = b
        .insert(
            mem("b", "n2", "math", "what is 12 TIMES 3", "36.", 8.0),
            None,
        )
        .await
        .unwrap();
    assert_eq!(same, Inserted::Duplicate { of: "a".into() });
    // Near-identical wording (cosine >= 0.95).
    let near = b
        .insert(
            mem(
                "c",
                "n2",
                "math",
                "What is 12 times 3 ?!",
                "thirty-six",
                8.0,
            ),
            None,
        )
        .await
        .unwrap();
    assert_eq!(near, Inserted::Duplicate { of: "a".into() });
    // Another domain is another pool.
    let other = b
        .insert(
            mem("d", "n2", "general", "What is 12 times 3?", "36", 8.0),
            None,
        )
        .await
        .unwrap();
    assert!(matches!(other, Inserted::Added(_)));
    // A different question is kept.
    let diff = b
        .insert(
            mem(
                "e",
                "n2",
                "math",
                "What is the square root of 81?",
                "9",
                8.0,
            ),
            None,
        )
        .await
        .unwrap();
    assert!(matches!(diff, Inserted::Added(_)));
    assert_eq!(
        b.insert(
            mem("a", "n1", "math", "What is 12 times 3?", "36", 8.0),
            None
        )
        .await
        .unwrap(),
        Inserted::Known("a".into())
    );
    assert_eq!(b.len(), 3);
    assert_eq!(b.store().memory_count(None).await.unwrap(), 3);
    // Each stored memory is announced once; duplicates and known ones are not.
    let mut announced = Vec::new();
    while let Ok(m) = added.try_recv() {
        announced.push(m.id);
    }
    assert_eq!(announced, ["a", "d", "e"]);
}

const GOOD: &[(&str, &str)] = &[
    (
        "How do I boil an egg so the yolk stays soft?",
        "Boil it for 6 minutes, then cool it in ice water.",
    ),
    (
        "How long should soft boiled eggs cook?",
        "About six minutes in boiling water.",
    ),
    (
        "What is the best way to make runny egg yolks?",
        "Six minutes at a rolling boil, then an ice bath.",
    ),
];

#[tokio::test]
async fn a_flooding_author_cannot_push_out_good_memories() {
    let e = embedder();
    let b = book(Store::open_in_memory().unwrap(), &e).await;
    let mut items = Vec::new();
    for (i, (p, a)) in GOOD.iter().enumerate() {
        items.push((
            mem(&format!("good{i}"), "honest", "cooking", p, a, 7.0),
            None,
        ));
    }
    // 300 spam memories from one author, all about boiling eggs, all claiming 10/10.
    let colours = [
        "red", "blue", "green", "golden", "purple", "silver", "orange", "black", "pink", "white",
    ];
    let animals = [
        "duck", "quail", "goose", "ostrich", "hen", "emu", "pheasant", "turkey", "swan", "pigeon",
    ];
    let places = ["Paris", "Tokyo", "Lima"];
    let mut i = 0;
    for c in colours {
        for a in animals {
            for p in places {
                items.push((
                    mem(
                        &format!("spam{i}"),
                        "flooder",
                        "cooking",
                        &format!("Boil {c} {a} eggs soft yolk minutes, {p} style"),
                        "Buy our product at example.com",
                        10.0,
                    ),
                    None,
                ));
                i += 1;
            }
        }
    }
    b.insert_many(items).await.unwrap();
    let flood = b.list(None, Some("flooder"), 1000).len();
    assert!(flood >= 50, "only {flood} spam memories kept");
    assert_eq!(b.list(None, Some("honest"), 10).len(), 3);
    let query = "How many minutes to boil an egg for a soft yolk?";
    let hits = b.top_k("cooking", query, 4).await.unwrap();
    let from_flooder = hits.iter().filter(|h| h.memory.author == "flooder").count();
    assert_eq!(hits.len(), 4);
    assert!(from_flooder <= 2, "{:?}", ids(&hits));
    let good = hits.iter().filter(|h| h.memory.author == "honest").count();
    assert!(good >= 2, "{:?}", ids(&hits));

    // Lower trust in the flooder: the good ones lead (the share cap still applies to every
    // author, so the third slot goes to the best other author's memory).
    b.set_trust("flooder", 0.1, false).await.unwrap();
    let hits = b.top_k("cooking", query, 3).await.unwrap();
    assert!(
        hits[..2].iter().all(|h| h.memory.author == "honest"),
        "{:?}",
        ids(&hits)
    );
    assert!(hits[2].score < hits[1].score / 2.0, "{hits:?}");

    // Ignore it: none of its memories remain, even when asked for many.
    b.set_trust("flooder", 1.0, true).await.unwrap();
    let hits = b.top_k("cooking", query, 10).await.unwrap();
    assert_eq!(hits.len(), 3);
    assert!(hits.iter().all(|h| h.memory.author == "honest"));
    // New memories from it are ignored too.
    let r = b
        .insert(
            mem("spam-late", "flooder", "cooking", "Eggs?", "spam", 10.0),
            None,
        )
        .await
        .unwrap();
    assert_eq!(r, Inserted::Ignored);
    // Un-ignoring brings them back (capped share).
    b.set_trust("flooder", 1.0, false).await.unwrap();
    let hits = b.top_k("cooking", query, 4).await.unwrap();
    assert!(hits.iter().any(|h| h.memory.author == "flooder"));
    // With only the flooder relevant, it may fill the whole top-k.
    let only = b
        .top_k("cooking", "recipe number 17 product", 3)
        .await
        .unwrap();
    assert_eq!(only.len(), 3);
}

#[tokio::test]
async fn forget_by_id_and_author_persist_across_reopen() {
    let e = embedder();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.db");
    {
        let b = book(Store::open(&path).unwrap(), &e).await;
        b.insert_many(vec![
            (
                mem(
                    "m1",
                    "alice",
                    "general",
                    "What colour is the sky?",
                    "Blue.",
                    8.0,
                ),
                None,
            ),
            (
                mem(
                    "m2",
                    "alice",
                    "general",
                    "What colour is grass?",
                    "Green.",
                    8.0,
                ),
                None,
            ),
            (
                mem(
                    "m3",
                    "bob",
                    "general",
                    "What colour are bananas?",
                    "Yellow.",
                    8.0,
                ),
                None,
            ),
            (
                mem(
                    "m4",
                    "carol",
                    "general",
                    "What colour is snow?",
                    "White.",
                    8.0,
                ),
                None,
            ),
        ])
        .await
        .unwrap();
        assert!(b.forget("m4").await.unwrap());
        assert_eq!(b.forget_author("alice").await.unwrap(), 2);
        b.feedback("m3", true).await.unwrap();
        assert_eq!(b.len(), 1);
    }
    let b = book(Store::open(&path).unwrap(), &e).await;
    assert_eq!(b.len(), 1);
    let m3 = b.get("m3").unwrap();
    assert_eq!((m3.helpful, m3.unhelpful), (1, 0));
    // Redelivered by the swarm: still forgotten / ignored.
    assert_eq!(
        b.insert(
            mem(
                "m4",
                "carol",
                "general",
                "What colour is snow?",
                "White.",
                8.0
            ),
            None
        )
        .await
        .unwrap(),
        Inserted::Ignored
    );
    assert_eq!(
        b.insert(
            mem(
                "m1",
                "alice",
                "general",
                "What colour is the sky?",
                "Blue.",
                8.0
            ),
            None
        )
        .await
        .unwrap(),
        Inserted::Ignored
    );
    let hits = b.top_k("general", "sky colour", 3).await.unwrap();
    assert_eq!(ids(&hits), vec!["m3".to_string()]);
}

#[tokio::test]
async fn feedback_changes_the_ranking() {
    let e = embedder();
    let b = book(Store::open_in_memory().unwrap(), &e).await;
    b.insert_many(vec![
        (
            mem(
                "x",
                "n1",
                "code",
                "How do I reverse a list in Python?",
                "Use list.reverse() or slicing [::-1].",
                8.0,
            ),
            None,
        ),
        (
            mem(
                "y",
                "n2",
                "code",
                "Python: flip the order of items in an array?",
                "Call lst.reverse().",
                8.0,
            ),
            None,
        ),
    ])
    .await
    .unwrap();
    let q = "reverse a list in python";
    let before = b.top_k("code", q, 2).await.unwrap();
    let first = before[0].memory.id.clone();
    let second = before[1].memory.id.clone();
    for _ in 0..3 {
        b.feedback(&first, false).await.unwrap();
        b.feedback(&second, true).await.unwrap();
    }
    let after = b.top_k("code", q, 2).await.unwrap();
    assert_eq!(ids(&after), vec![second, first]);
    assert!(b.feedback("nope", true).await.is_err());
}

#[tokio::test]
async fn an_answer_filed_under_the_wrong_prompt_is_refused() {
    use starling_node::memory::admission::precheck_embedding;
    use starling_node::memory::{AdmissionConfig, Rejection};

    let e = embedder();
    let b = book(Store::open_in_memory().unwrap(), &e).await;
    let pool = [
        (
            "How do volcanoes form?",
            "Magma rises through the crust and erupts at weak points.",
        ),
        (
            "Why do cats purr?",
            "Cats purr by vibrating their laryngeal muscles, often when content.",
        ),
        (
            "What causes tides?",
            "The Moon's gravity pulls the oceans, raising and lowering the sea.",
        ),
        (
            "How does a bicycle stay upright?",
            "Steering corrections and trail keep it balanced.",
        ),
        (
            "Why is bread crusty?",
            "The Maillard reaction browns and hardens the outside while baking.",
        ),
        (
            "How do bees make honey?",
            "Bees evaporate nectar and add enzymes, storing it in combs.",
        ),
    ];
    for (i, (p, a)) in pool.iter().enumerate() {
        // A domain is judged by its profile once two or more authors wrote to it.
        let author = if i % 2 == 0 { "alice" } else { "bob" };
        let m = mem(&format!("m{i}"), author, "general", p, a, 8.0);
        assert!(matches!(
            b.insert(m, None).await.unwrap(),
            Inserted::Added(_)
        ));
    }
    let config = AdmissionConfig::default();
    let prompt = "How do airplanes stay in the air?";
    let own = "Wings deflect air downwards and the pressure difference lifts the airplane.";
    let verdict = precheck_embedding(&b, &config, "general", prompt, own)
        .await
        .unwrap();
    assert!(verdict.is_ok(), "{verdict:?}");
    // The answer to another question of the same domain.
    let other = "Rain forms when water vapour condenses into droplets that grow heavy and fall.";
    let verdict = precheck_embedding(&b, &config, "general", prompt, other)
        .await
        .unwrap();
    assert!(
        matches!(
            verdict,
            Err(Rejection::Mismatched { .. }) | Err(Rejection::Unrelated { .. })
        ),
        "{verdict:?}"
    );
    // Below `min_pool` memories the mismatch check does not apply.
    let small = book(Store::open_in_memory().unwrap(), &e).await;
    let verdict = precheck_embedding(&small, &config, "general", prompt, other)
        .await
        .unwrap();
    assert!(
        !matches!(verdict, Err(Rejection::Mismatched { .. })),
        "{verdict:?}"
    );
}

#[tokio::test]
async fn a_flooding_peer_does_not_make_good_memories_off_domain() {
    use starling_node::memory::admission::precheck_embedding;
    use starling_node::memory::AdmissionConfig;

    let e = embedder();
    let b = book(Store::open_in_memory().unwrap(), &e).await;
    let good = [
        (
            "How do volcanoes form?",
            "Magma rises through the crust and erupts.",
        ),
        ("Why do cats purr?", "They vibrate their laryngeal muscles."),
        ("What causes tides?", "The Moon's gravity pulls the oceans."),
        (
            "Why is bread crusty?",
            "The Maillard reaction browns the outside.",
        ),
    ];
    for (i, (p, a)) in good.iter().enumerate() {
        let author = if i % 2 == 0 { "alice" } else { "bob" };
        let m = mem(&format!("g{i}"), author, "general", p, a, 8.0);
        assert!(matches!(
            b.insert(m, None).await.unwrap(),
            Inserted::Added(_)
        ));
    }
    // 61 nonsense memories from one peer, in `general` and alone in `trivia`.
    for i in 0..61 {
        for domain in ["general", "trivia"] {
            let p = format!("zorbl {i} quux flimflam wib {}", i * 7);
            let a = format!("blarg {i} snorf vexil {}", i * 13);
            let m = mem(&format!("{domain}-x{i}"), "mallory", domain, &p, &a, 8.0);
            b.insert(m, None).await.unwrap();
        }
    }
    let config = AdmissionConfig::default();
    let prompt = "How do airplanes stay in the air?";
    let answer = "Wings deflect air downwards and the pressure difference lifts the airplane.";
    for domain in ["general", "trivia"] {
        let verdict = precheck_embedding(&b, &config, domain, prompt, answer)
            .await
            .unwrap();
        assert!(verdict.is_ok(), "{domain}: {verdict:?}");
    }
    // The flood is in the profile (near duplicates of one another are stored once), as
    // one author of three.
    let profile = b.domain_profile("general").unwrap();
    assert_eq!(profile.authors, 3);
    assert!(profile.memories > 4 + 10, "{}", profile.memories);
}

#[tokio::test]
async fn memories_stored_without_embeddings_are_embedded_once_and_written_back() {
    let e = embedder();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.db");
    {
        // Rows as an older version wrote them: no embeddings in the body.
        let store = Store::open(&path).unwrap();
        let row = starling_node::store::MemoryRecord {
            id: "old1".to_owned(),
            domain: "general".to_owned(),
            author: "alice".to_owned(),
            score: 8.0,
            created_at: 1,
            prompt: "How long should bread dough rise?".to_owned(),
            answer: "About an hour, until doubled.".to_owned(),
            body: serde_json::json!({ "source": null }),
            forgotten: false,
        };
        assert!(store.insert_memory(&row).await.unwrap());
    }
    let b = book(Store::open(&path).unwrap(), &e).await;
    let hits = b
        .top_k("general", "proofing time for dough", 1)
        .await
        .unwrap();
    assert_eq!(ids(&hits), vec!["old1"]);
    let stored: starling_node::store::MemoryRecord<serde_json::Value> =
        b.store().memory("old1").await.unwrap().unwrap();
    for field in ["embedding", "whole"] {
        assert!(
            stored.body[field].is_array(),
            "{field} not written back: {}",
            stored.body
        );
    }
    assert!(
        stored.body["tokens"].is_string(),
        "token bits not written back: {}",
        stored.body
    );
    assert_eq!(stored.body["model"], serde_json::json!(e.model_id()));
}

#[tokio::test]
async fn rows_without_token_bits_get_them_once_and_keep_them_across_reopen() {
    let e = embedder();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.db");
    let prompts = [
        ("m1", "How do I halve a sponge cake recipe?"),
        ("m2", "How do I scale a cookie recipe up for a party?"),
        ("m3", "What oven temperature for sourdough?"),
    ];
    {
        let b = book(Store::open(&path).unwrap(), &e).await;
        for (id, prompt) in prompts {
            b.insert(
                mem(
                    id,
                    "alice",
                    "cooking",
                    prompt,
                    "Divide or multiply every ingredient.",
                    8.0,
                ),
                None,
            )
            .await
            .unwrap();
        }
        // As a version before the re-ranking stage wrote them: vectors, no token bits.
        for (id, _) in prompts {
            let mut row: starling_node::store::MemoryRecord<serde_json::Value> =
                b.store().memory(id).await.unwrap().unwrap();
            assert!(row.body["tokens"].is_string(), "{}", row.body);
            row.body.as_object_mut().unwrap().remove("tokens");
            b.store().set_memory_body(id, &row.body).await.unwrap();
        }
    }
    let b = book(Store::open(&path).unwrap(), &e).await;
    let mut written = Vec::new();
    for (id, _) in prompts {
        let row: starling_node::store::MemoryRecord<serde_json::Value> =
            b.store().memory(id).await.unwrap().unwrap();
        written.push(row.body["tokens"].as_str().unwrap().to_owned());
    }
    let hits = ids(&b
        .top_k("cooking", "cutting a cake recipe in half", 3)
        .await
        .unwrap());
    assert_eq!(hits[0], "m1");
    // Stored bits are read, not made again: swapped between two rows, they stay swapped
    // through the next open.
    for (id, bits) in [("m1", &written[2]), ("m3", &written[0])] {
        let mut row: starling_node::store::MemoryRecord<serde_json::Value> =
            b.store().memory(id).await.unwrap().unwrap();
        row.body["tokens"] = serde_json::json!(bits);
        b.store().set_memory_body(id, &row.body).await.unwrap();
    }
    drop(b);
    let b = book(Store::open(&path).unwrap(), &e).await;
    assert_eq!(b.len(), 3);
    for (id, bits) in [
        ("m1", &written[2]),
        ("m2", &written[1]),
        ("m3", &written[0]),
    ] {
        let row: starling_node::store::MemoryRecord<serde_json::Value> =
            b.store().memory(id).await.unwrap().unwrap();
        assert_eq!(row.body["tokens"].as_str(), Some(bits.as_str()), "{id}");
    }
}

#[test]
fn the_config_file_default_is_the_books_default() {
    let file = starling_node::config::NodeConfig::default().memory;
    let book = BookConfig::default();
    assert_eq!(file.rerank_depth, book.rerank_depth);
    assert_eq!(file.neighbour_weight, book.neighbour_weight);
}

#[tokio::test]
async fn with_the_stage_off_no_token_bits_are_made_and_turning_it_on_makes_them() {
    let e = embedder();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.db");
    let off = BookConfig {
        rerank_depth: 0,
        ..BookConfig::default()
    };
    {
        let b = MemoryBook::open(Store::open(&path).unwrap(), Some(e.clone()), None, off)
            .await
            .unwrap();
        b.insert(
            mem(
                "m1",
                "alice",
                "cooking",
                "How do I halve a cake?",
                "Halve it.",
                8.0,
            ),
            None,
        )
        .await
        .unwrap();
        let row: starling_node::store::MemoryRecord<serde_json::Value> =
            b.store().memory("m1").await.unwrap().unwrap();
        assert!(row.body.get("tokens").is_none(), "{}", row.body);
        assert!(row.body["whole"].is_array());
    }
    let b = book(Store::open(&path).unwrap(), &e).await;
    let row: starling_node::store::MemoryRecord<serde_json::Value> =
        b.store().memory("m1").await.unwrap().unwrap();
    assert!(row.body["tokens"].is_string(), "{}", row.body);
}
