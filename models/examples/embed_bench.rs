//! Throughput of the BERT embedder: sentences/second at batch 1 and batch 32.
//!
//! Usage: `embed_bench MODEL_DIR SENTENCES_FILE [ROUNDS]`; prints one JSON
//! object `{"batch1": ..., "batch32": ...}` with the best round of each.
//! Thread count follows `RAYON_NUM_THREADS`; `STARLING_EMBED_BACKEND` (auto, kernels,
//! candle) picks the backend. Driven by `benches/embed/bench.sh`.

use std::time::{Duration, Instant};

use starling_models::embed::{BertEmbedder, EmbedBackend, Embedder};

fn best_rate(
    rounds: usize,
    sentences: usize,
    mut run: impl FnMut() -> Result<(), Box<dyn std::error::Error>>,
) -> Result<f64, Box<dyn std::error::Error>> {
    let mut best = Duration::MAX;
    for _ in 0..rounds {
        let started = Instant::now();
        run()?;
        best = best.min(started.elapsed());
    }
    Ok(sentences as f64 / best.as_secs_f64())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(model_dir), Some(sentences_file)) = (args.get(1), args.get(2)) else {
        return Err("usage: embed_bench MODEL_DIR SENTENCES_FILE [ROUNDS]".into());
    };
    let rounds: usize = match args.get(3) {
        Some(r) => r
            .parse()
            .map_err(|e| format!("ROUNDS must be a number: {e}"))?,
        None => 3,
    };
    let text = std::fs::read_to_string(sentences_file)
        .map_err(|e| format!("cannot read {sentences_file}: {e}"))?;
    let sentences: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let backend: EmbedBackend = match std::env::var("STARLING_EMBED_BACKEND") {
        Ok(b) => b.parse()?,
        Err(_) => EmbedBackend::Auto,
    };
    let model = BertEmbedder::load_with(model_dir, backend)?.with_batch_size(32);
    eprintln!("backend: {:?}", model.backend());

    // Warm-up.
    for chunk in sentences.chunks(32) {
        model.embed(chunk)?;
    }
    let batch1 = best_rate(rounds, sentences.len(), || {
        for s in &sentences {
            model.embed(&[s])?;
        }
        Ok(())
    })?;
    let batch32 = best_rate(rounds, sentences.len(), || {
        for chunk in sentences.chunks(32) {
            model.embed(chunk)?;
        }
        Ok(())
    })?;
    println!("{{\"batch1\": {batch1:.2}, \"batch32\": {batch32:.2}}}");
    Ok(())
}
