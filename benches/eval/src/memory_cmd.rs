//! `starling eval memory`: retrieval quality of the memory book on a labelled file.

use std::path::{Path, PathBuf};

use clap::Args;

use crate::memory::{evaluate, load_jsonl, render, EvalMemory, EvalQuery};

/// Arguments of `starling eval memory`.
#[derive(Debug, Args)]
pub struct EvalMemoryArgs {
    /// Memories: JSON Lines of {"id", "domain", "prompt", "answer"}.
    #[arg(long)]
    pub memories: PathBuf,
    /// Queries: JSON Lines of {"query", "domain", "relevant": [ids]}.
    #[arg(long)]
    pub queries: PathBuf,
    /// Also simulate one round of usage feedback (labels of half the queries) and report the
    /// other half before and after.
    #[arg(long)]
    pub feedback: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Embedding model: a registry name, a directory, or a source.
    #[arg(long, env = "STARLING_EMBED_MODEL", default_value = "all-minilm-l6-v2")]
    pub embed_model: String,
}

/// Runs `starling eval memory`.
pub fn run(home: &Path, args: EvalMemoryArgs) -> anyhow::Result<()> {
    let memories: Vec<EvalMemory> = load_jsonl(&args.memories)?;
    let queries: Vec<EvalQuery> = load_jsonl(&args.queries)?;
    let handle =
        starling_node::loading::load_embedder(home, &args.embed_model, Default::default())?;
    let report = starling_node::commands::block_on(evaluate(
        &memories,
        &queries,
        Some(handle),
        args.feedback,
    ))??;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(())
}
