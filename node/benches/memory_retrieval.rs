//! Benchmark: memory retrieval latency over 100,000 memories (issue target: top-3 in
//! <= 20 ms p50). Run: `cargo bench -p starling-node --bench memory_retrieval`
//! (optimised build; `-- --memories N --queries Q` to change the sizes).
//!
//! The memories are synthetic: two random unit embeddings each (prompt and whole text, as
//! the book indexes them) of the real model's dimension (384), random token bits for the
//! re-ranking stage (16 tokens of prompt and 96 of whole text, about the median memory of
//! `../shared/eval/memory`), and prompts of 8 words drawn from a 30-word list, so that
//! almost every memory shares terms with every query (a worst case for the BM25 side). 50
//! authors, one domain. Timed: the whole ranking of [`MemoryBook::top_k_embedded`] (BM25 +
//! cosine fusion, priors, the per-author cap, the late-interaction re-ranking of the first
//! 20) with the query's vector and 10 tokens' bits given, and end to end: the query embedded
//! by the real model, then ranked (the target). Speed does not depend on the values.

#![allow(clippy::unwrap_used)]

use std::time::Instant;

use rand::{Rng, SeedableRng};
use starling_models::embed::{BertEmbedder, EmbedHandle};
use starling_node::memory::{BookConfig, Memory, MemoryBook};
use starling_node::search::TokenBits;
use starling_node::store::Store;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(run(arg("--memories", 100_000), arg("--queries", 200)));
}

/// Random token bits of `n` tokens of `dim` dimensions.
fn random_tokens(rng: &mut impl Rng, n: usize, dim: usize) -> TokenBits {
    let rows: Vec<f32> = (0..n * dim).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    TokenBits::from_rows(&rows, dim)
}

fn percentile(sorted: &[f64], p: usize) -> f64 {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

async fn run(n: usize, queries: usize) {
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
    let mut items = Vec::with_capacity(n);
    for i in 0..n {
        let prompt: Vec<&str> = (0..8)
            .map(|_| words[rng.gen_range(0..words.len())])
            .collect();
        let v: Vec<f32> = (0..DIM).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let w: Vec<f32> = (0..DIM).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
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
            Some(w),
            Some(vec![
                random_tokens(&mut rng, 16, DIM),
                random_tokens(&mut rng, 96, DIM),
            ]),
        ));
    }
    let t = Instant::now();
    for chunk in items.chunks(10_000) {
        book.insert_many_with(chunk.to_vec()).await.unwrap();
    }
    println!("indexed {n} memories in {:.1} s", t.elapsed().as_secs_f64());
    assert_eq!(book.len(), n);
    // Each query is ranked with the re-ranking stage and without it (alternating, so both
    // see the same machine state): the stage's own cost is the difference.
    let mut times = Vec::new();
    let mut without = Vec::new();
    for _ in 0..queries {
        let q: Vec<f32> = (0..DIM).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let text: Vec<&str> = (0..4)
            .map(|_| words[rng.gen_range(0..words.len())])
            .collect();
        let text = text.join(" ");
        let tokens = random_tokens(&mut rng, 10, DIM);
        let t = Instant::now();
        let hits = book.top_k_embedded("general", &text, &q, Some(&tokens), 3);
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(hits.len(), 3);
        let t = Instant::now();
        let hits = book.top_k_embedded("general", &text, &q, None, 3);
        without.push(t.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(hits.len(), 3);
    }
    times.sort_by(f64::total_cmp);
    without.sort_by(f64::total_cmp);
    // End to end, as a node answers: the query embedded by the real model, then ranked.
    let mut end_to_end = Vec::new();
    for _ in 0..queries.min(50) {
        let text: Vec<&str> = (0..6)
            .map(|_| words[rng.gen_range(0..words.len())])
            .collect();
        let q = format!("how do I {}", text.join(" "));
        let t = Instant::now();
        let hits = book.top_k("general", &q, 3).await.unwrap();
        end_to_end.push(t.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(hits.len(), 3);
    }
    end_to_end.sort_by(f64::total_cmp);
    println!(
        "top-3 over {n} memories, {queries} queries, ranking only: p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms",
        percentile(&times, 50),
        percentile(&times, 95),
        percentile(&times, 99),
    );
    println!(
        "the same without the re-ranking stage: p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms",
        percentile(&without, 50),
        percentile(&without, 95),
        percentile(&without, 99),
    );
    println!(
        "end to end (query embedded by all-MiniLM-L6-v2, then ranked), {} queries: p50 {:.2} ms, p95 {:.2} ms (target p50 <= 20 ms)",
        end_to_end.len(),
        percentile(&end_to_end, 50),
        percentile(&end_to_end, 95),
    );
}
