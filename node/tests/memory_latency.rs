//! Retrieval latency over 100,000 memories (synthetic unit embeddings of the real model's
//! dimension, 384; prompts from a word list), plus one query through the real embedding
//! model timed separately. Prints p50/p95.

#![allow(clippy::unwrap_used)]

use std::time::Instant;

use rand::{Rng, SeedableRng};
use starling_models::embed::{BertEmbedder, EmbedHandle};
use starling_node::memory::{BookConfig, Memory, MemoryBook};
use starling_node::store::Store;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_k_over_100k_memories() {
    const N: usize = 100_000;
    const DIM: usize = 384;
    let e = EmbedHandle::spawn(
        BertEmbedder::load(starling_models::testing::embedding_model()).unwrap(),
    )
    .unwrap();
    assert_eq!(e.dim(), DIM);
    // The cosine duplicate check is one dense pass per insert (O(n) each); it is turned off
    // for this bulk load of distinct random vectors (normalised-text duplicates still count).
    let config = BookConfig {
        duplicate_cosine: 2.0,
        ..BookConfig::default()
    };
    let book = MemoryBook::open(
        Store::open_in_memory().unwrap(),
        Some(e.clone()),
        None,
        config,
    )
    .await
    .unwrap();
    let words = [
        "boil", "egg", "rice", "convert", "miles", "capital", "france", "python", "list", "sort",
        "date", "format", "garden", "plant", "tomato", "train", "ticket", "budget", "loan", "tax",
        "email", "meeting", "invoice", "recipe", "bread", "yeast", "oven", "reverse", "string",
        "file",
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut items = Vec::with_capacity(N);
    for i in 0..N {
        let prompt: Vec<&str> = (0..8)
            .map(|_| words[rng.gen_range(0..words.len())])
            .collect();
        let v: Vec<f32> = (0..DIM).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        items.push((
            Memory {
                id: format!("m{i}"),
                author: format!("node{}", i % 50),
                domain: "general".into(),
                prompt: format!("{} {i}", prompt.join(" ")),
                answer: "a".into(),
                source: None,
                score: 7.0,
                created_at: i as i64,
                helpful: 0,
                unhelpful: 0,
            },
            Some(v),
        ));
    }
    let t = Instant::now();
    for chunk in items.chunks(10_000) {
        book.insert_many(chunk.to_vec()).await.unwrap();
    }
    eprintln!("LATENCY indexed {N} in {:.1}s", t.elapsed().as_secs_f64());
    assert_eq!(book.len(), N);
    let mut times = Vec::new();
    for _ in 0..50 {
        let q: Vec<f32> = (0..DIM).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let t = Instant::now();
        let hits = book.top_k_embedded("general", "boil egg rice oven", &q, 3);
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(hits.len(), 3);
    }
    times.sort_by(f64::total_cmp);
    let t = Instant::now();
    let hits = book
        .top_k("general", "how do I boil rice in the oven", 3)
        .await
        .unwrap();
    let real = t.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(hits.len(), 3);
    eprintln!(
        "LATENCY top-3 over {N}: p50 {:.2} ms, p95 {:.2} ms (precomputed query vector); \
         with real query embedding: {real:.2} ms",
        times[times.len() / 2],
        times[times.len() * 95 / 100]
    );
}
