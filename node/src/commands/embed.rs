//! `starling embed`: sentence embeddings from the local embedding model.

use std::path::Path;

use anyhow::Context;
use clap::Args;
use starling_models::embed::{BertEmbedder, EmbedBackend, Embedder};
use starling_models::source::{registry, ModelCache, Progress};

/// Arguments of `starling embed`.
#[derive(Debug, Args)]
pub struct EmbedArgs {
    /// Texts to embed (one vector each). Use `-` to read one text per line from stdin.
    #[arg(required = true)]
    pub texts: Vec<String>,
    /// Embedding model: a registry name, a directory with config.json, tokenizer.json and
    /// model.safetensors, or a source.
    #[arg(long, env = "STARLING_EMBED_MODEL", default_value = "all-minilm-l6-v2")]
    pub model: String,
    /// Print the vectors as JSON (default: dimensions, norm and the cosine similarity of
    /// every pair).
    #[arg(long)]
    pub json: bool,
    /// Backend: `auto` (Starling's CPU kernels with 8-bit linear layers where the CPU has
    /// AVX2 or AVX-512, else candle), `kernels`, or `candle` (f32, the reference).
    #[arg(long, default_value = "auto")]
    pub backend: EmbedBackend,
}

/// Embeds the texts and prints the vectors (JSON) or a summary with pairwise similarities.
pub fn run(home: &Path, args: EmbedArgs) -> anyhow::Result<()> {
    let texts: Vec<String> = if args.texts == ["-"] {
        std::io::read_to_string(std::io::stdin())
            .context("cannot read texts from stdin")?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect()
    } else {
        args.texts.clone()
    };
    let source = registry::parse_spec(&args.model)?;
    let dir = ModelCache::new(home)
        .resolve(&source, &Progress::new())
        .with_context(|| format!("cannot get embedding model `{}`", args.model))?;
    let embedder = BertEmbedder::load_with(&dir, args.backend)
        .with_context(|| format!("cannot load {}", dir.display()))?;
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let vectors = embedder.embed(&refs)?;
    if args.json {
        let out: Vec<_> = texts
            .iter()
            .zip(&vectors)
            .map(|(t, v)| serde_json::json!({ "text": t, "embedding": v }))
            .collect();
        println!(
            "{}",
            serde_json::to_string(&serde_json::json!({ "model": args.model, "data": out }))?
        );
        return Ok(());
    }
    println!("model {} ({} dimensions)", args.model, embedder.dim());
    for (i, (t, v)) in texts.iter().zip(&vectors).enumerate() {
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        println!("[{i}] norm {norm:.4}  {t}");
    }
    for i in 0..vectors.len() {
        for j in i + 1..vectors.len() {
            let cos: f32 = vectors[i].iter().zip(&vectors[j]).map(|(a, b)| a * b).sum();
            println!("cos([{i}], [{j}]) = {cos:.4}");
        }
    }
    Ok(())
}
