//! Micro benchmark of the hybrid index: p50/p99 query latency at 10k and 100k entries of
//! 384-dimensional vectors (random unit vectors, synthetic texts).
//!
//! Run with `cargo run --release -p starling-node --example search_bench`.

use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use starling_node::search::{Bm25Index, HybridIndex, HybridOptions};

const DIM: usize = 384;
const WORDS: &[&str] = &[
    "translate",
    "contract",
    "invoice",
    "debug",
    "rust",
    "python",
    "forecast",
    "sales",
    "video",
    "podcast",
    "plan",
    "travel",
    "audit",
    "security",
    "deploy",
    "cloud",
    "chart",
    "survey",
    "german",
    "japanese",
    "logo",
    "design",
    "tests",
    "pipeline",
    "budget",
    "europe",
    "asia",
    "clean",
    "data",
    "model",
    "summary",
    "report",
    "legal",
    "medical",
    "music",
    "audio",
];

fn vector(rng: &mut StdRng) -> Vec<f32> {
    (0..DIM).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

fn text(rng: &mut StdRng, words: usize) -> String {
    (0..words)
        .map(|_| WORDS[rng.gen_range(0..WORDS.len())])
        .collect::<Vec<_>>()
        .join(" ")
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut rng = StdRng::seed_from_u64(42);
    for n in [10_000usize, 100_000] {
        let start = Instant::now();
        let mut index = HybridIndex::new(DIM);
        let mut bm25 = Bm25Index::new();
        for key in 0..n as u64 {
            let t = text(&mut rng, 20);
            bm25.insert(key, &t);
            index.insert(key, &t, vector(&mut rng))?;
        }
        let build = start.elapsed();
        let queries: Vec<(String, Vec<f32>)> = (0..200)
            .map(|_| (text(&mut rng, 8), vector(&mut rng)))
            .collect();
        let opts = HybridOptions::default();
        let mut hybrid_ms = Vec::new();
        let mut bm25_ms = Vec::new();
        for (q, v) in &queries {
            let t = Instant::now();
            let hits = index.search(q, v, 10, &opts);
            hybrid_ms.push(t.elapsed().as_secs_f64() * 1e3);
            assert_eq!(hits.len(), 10);
            let t = Instant::now();
            std::hint::black_box(bm25.search(q, 10));
            bm25_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        hybrid_ms.sort_by(f64::total_cmp);
        bm25_ms.sort_by(f64::total_cmp);
        println!(
            "{n:>7} entries (build {:.1} s): hybrid p50 {:.2} ms p99 {:.2} ms | bm25 p50 {:.2} ms p99 {:.2} ms",
            build.as_secs_f64(),
            percentile(&hybrid_ms, 0.5),
            percentile(&hybrid_ms, 0.99),
            percentile(&bm25_ms, 0.5),
            percentile(&bm25_ms, 0.99),
        );
    }
    Ok(())
}
