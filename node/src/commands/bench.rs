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
    /// Skip measuring the machine's read bandwidth (it reads a 1 GiB buffer five times,
    /// about a second; the table's bandwidth column is then empty).
    #[arg(long)]
    no_bandwidth: bool,
}

/// Runs the benchmark and prints a llama-bench style table (or JSON).
pub fn run(home: &Path, args: BenchArgs) -> anyhow::Result<()> {
    crate::loading::apply_threads(args.model.threads);
    let path = crate::loading::resolve_chat_model(home, &args.model.options())?;
    let config = BenchConfig {
        prompt_tokens: args.prompt,
        gen_tokens: args.gen,
        repetitions: args.repetitions.max(1),
        bandwidth: !args.no_bandwidth,
    };
    let results = bench::run(&path, &config, args.model.device, |line| {
        eprintln!("{line}")
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
        return Ok(());
    }
    println!("CPU: {}", cpu_flags());
    if let Some(b) = results.first().and_then(|r| r.memory_bandwidth) {
        println!(
            "read bandwidth: {:.1} GB/s ({} threads, best of {} passes over {} MiB)",
            b / 1e9,
            results[0].threads,
            bench::BANDWIDTH_PASSES,
            bench::BANDWIDTH_BUFFER >> 20
        );
    }
    println!(
        "| {:<40} | {:>10} | {:>8} | {:>7} | {:>8} | {:>20} | {:>14} |",
        "model", "size", "type", "threads", "test", "t/s", "of bandwidth"
    );
    println!(
        "|{:-<42}|{:->12}|{:->10}|{:->9}|{:->10}|{:->22}|{:->16}|",
        "", "", "", "", "", "", ""
    );
    for r in &results {
        let fraction = r
            .bandwidth_fraction
            .map_or_else(String::new, |f| format!("{:.0}%", 100.0 * f));
        println!(
            "| {:<40} | {:>7.2} MiB | {:>8} | {:>7} | {:>8} | {:>11.2} ± {:>6.2} | {:>14} |",
            r.model,
            r.size_bytes as f64 / (1024.0 * 1024.0),
            r.quantization,
            r.threads,
            r.test,
            r.tokens_per_second,
            r.stddev,
            fraction
        );
    }
    if let Some(r) = results.iter().find(|r| r.bandwidth_fraction.is_some()) {
        println!(
            "of bandwidth: {:.1} MiB of weights per token x t/s over the read bandwidth",
            r.weight_bytes_per_token as f64 / (1024.0 * 1024.0)
        );
    }
    Ok(())
}

/// The CPU's SIMD features that the kernels and candle care about, as the kernels' tiers
/// see them (printed beside every speed figure).
fn cpu_flags() -> String {
    let mut flags: Vec<&str> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        let known = [
            ("avx", std::arch::is_x86_feature_detected!("avx")),
            ("avx2", std::arch::is_x86_feature_detected!("avx2")),
            ("fma", std::arch::is_x86_feature_detected!("fma")),
            ("f16c", std::arch::is_x86_feature_detected!("f16c")),
            ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
            ("avx512bw", std::arch::is_x86_feature_detected!("avx512bw")),
            ("avx512vl", std::arch::is_x86_feature_detected!("avx512vl")),
            (
                "avx512vnni",
                std::arch::is_x86_feature_detected!("avx512vnni"),
            ),
        ];
        flags.extend(known.iter().filter(|(_, has)| *has).map(|(n, _)| *n));
    }
    #[cfg(target_arch = "aarch64")]
    {
        let known = [
            ("neon", std::arch::is_aarch64_feature_detected!("neon")),
            (
                "dotprod",
                std::arch::is_aarch64_feature_detected!("dotprod"),
            ),
        ];
        flags.extend(known.iter().filter(|(_, has)| *has).map(|(n, _)| *n));
    }
    let isa = starling_models::arch::cpu::Isa::choose(
        std::env::var(starling_models::arch::cpu::ISA_ENV)
            .ok()
            .as_deref(),
    )
    .0;
    format!("{} (kernels: {isa:?})", flags.join(" "))
}
