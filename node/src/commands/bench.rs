//! `starling bench`.

use std::path::Path;

use clap::Args;
use starling_models::bench::{self, BenchConfig};

use crate::cli::ModelArgs;

/// Arguments of `starling bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt lengths to test (comma-separated).
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    prompt: Vec<usize>,
    /// Generation lengths to test (comma-separated).
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    gen: Vec<usize>,
    /// Measured repetitions of each test (after one warm-up).
    #[arg(short = 'r', long, default_value_t = 5)]
    repetitions: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs the benchmark and prints a llama-bench style table (or JSON).
pub fn run(home: &Path, args: BenchArgs) -> anyhow::Result<()> {
    crate::loading::apply_threads(args.model.threads);
    let path = crate::loading::resolve_chat_model(home, &args.model.options())?;
    let config = BenchConfig {
        prompt_tokens: args.prompt,
        gen_tokens: args.gen,
        repetitions: args.repetitions.max(1),
    };
    let results = bench::run(&path, &config, args.model.device, |line| {
        eprintln!("{line}")
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
        return Ok(());
    }
    println!(
        "| {:<40} | {:>10} | {:>8} | {:>7} | {:>8} | {:>20} |",
        "model", "size", "type", "threads", "test", "t/s"
    );
    println!(
        "|{:-<42}|{:->12}|{:->10}|{:->9}|{:->10}|{:->22}|",
        "", "", "", "", "", ""
    );
    for r in &results {
        println!(
            "| {:<40} | {:>7.2} MiB | {:>8} | {:>7} | {:>8} | {:>11.2} ± {:>6.2} |",
            r.model,
            r.size_bytes as f64 / (1024.0 * 1024.0),
            r.quantization,
            r.threads,
            r.test,
            r.tokens_per_second,
            r.stddev
        );
    }
    Ok(())
}
