//! Throughput benchmark in the style of llama.cpp's `llama-bench`: prompt processing of
//! `pp` tokens in one batch and generation of `tg` tokens one at a time, each repeated after
//! a warm-up run, reported as mean ± standard deviation in tokens per second.

use std::path::Path;
use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::arch::{self, Transformer};
use crate::engine::DeviceKind;
use crate::error::Result;
use crate::gguf::GgufFile;

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Prompt lengths to process (e.g. 512); 0 entries are skipped.
    pub prompt_tokens: Vec<usize>,
    /// Generation lengths (e.g. 128); 0 entries are skipped.
    pub gen_tokens: Vec<usize>,
    /// Measured repetitions of each test (after one warm-up run).
    pub repetitions: usize,
    /// Measure the machine's read bandwidth too (when there is a generation test).
    pub bandwidth: bool,
}

impl Default for BenchConfig {
    fn default() -> Self {
        Self {
            prompt_tokens: vec![512],
            gen_tokens: vec![128],
            repetitions: 5,
            bandwidth: true,
        }
    }
}

/// Bytes the bandwidth measurement reads per pass: far beyond the last-level cache of any
/// CPU this runs on (server parts have up to a few hundred MiB).
pub const BANDWIDTH_BUFFER: usize = 1 << 30;
/// Passes of the bandwidth measurement; the best counts.
pub const BANDWIDTH_PASSES: usize = 5;

/// The machine's read bandwidth in bytes per second: the best of `passes` passes in which
/// `threads` threads each sum their share of a `bytes`-long buffer (STREAM's read pattern,
/// the one decoding has: every weight once per token, one after another). `None` when the
/// buffer cannot be had.
pub fn memory_bandwidth(bytes: usize, threads: usize, passes: usize) -> Option<f64> {
    let threads = threads.max(1);
    let words = (bytes / 8).next_multiple_of(8 * threads);
    let mut buf: Vec<u64> = Vec::new();
    buf.try_reserve_exact(words).ok()?;
    // Written, not just reserved: pages the kernel has not backed would read as zeros
    // from one shared page and measure nothing.
    buf.extend((0..words as u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    let share = words / threads;
    let mut best = f64::INFINITY;
    for _ in 0..passes.max(1) {
        let start = Instant::now();
        std::thread::scope(|scope| {
            for part in buf.chunks(share) {
                scope.spawn(move || {
                    // One wrapping integer sum: the addition is associative, so the
                    // compiler splits it over as many vector accumulators as it likes and
                    // reads the buffer with plain vector loads. (Eight sums written out as
                    // an array were vectorised across iterations with gathers when built
                    // for an AVX-512 CPU, which read 5-6 GB/s a thread on an AMD EPYC
                    // whose thread streams 32 GB/s: the bench's "of bw" shares came out at
                    // 290-360%.)
                    let sum = part.iter().fold(0u64, |a, &w| a.wrapping_add(w));
                    std::hint::black_box(sum);
                });
            }
        });
        best = best.min(start.elapsed().as_secs_f64());
    }
    Some((words * 8) as f64 / best)
}

/// Bytes of weights one decoded token reads, from the file's tensor index (for models whose
/// implementation does not report its own): every tensor once, except the token embeddings
/// when the file has a separate output matrix (one row of them is read).
pub fn file_weight_bytes_per_token(file: &GgufFile) -> u64 {
    let infos = &file.content().tensor_infos;
    let tied = !infos.contains_key("output.weight");
    infos
        .iter()
        .map(|(name, info)| {
            let bytes = crate::gguf::tensor_bytes(info);
            if name == "token_embd.weight" && !tied {
                bytes / info.shape.dims().first().copied().unwrap_or(1).max(1) as u64
            } else {
                bytes
            }
        })
        .sum()
}

/// One line of results, like a row of `llama-bench`.
#[derive(Debug, Clone, Serialize)]
pub struct BenchResult {
    /// `pp512`, `tg128`, ...
    pub test: String,
    /// The model file.
    pub model: String,
    /// Architecture.
    pub architecture: String,
    /// Dominant weight type.
    pub quantization: String,
    /// File size in bytes.
    pub size_bytes: u64,
    /// Threads used by the CPU backend.
    pub threads: usize,
    /// Mean throughput in tokens per second.
    pub tokens_per_second: f64,
    /// Standard deviation of the throughput.
    pub stddev: f64,
    /// Every measured repetition, tokens per second.
    pub samples: Vec<f64>,
    /// Bytes of weights one decoded token reads (every matrix once, one embedding row).
    pub weight_bytes_per_token: u64,
    /// The machine's read bandwidth measured in the same run with the same threads, bytes
    /// per second (`None` when it was not measured).
    pub memory_bandwidth: Option<f64>,
    /// For generation tests: weight bytes per token × tokens per second over the measured
    /// bandwidth, i.e. how close decoding is to the limit that reading the weights sets.
    pub bandwidth_fraction: Option<f64>,
}

/// Runs the benchmark on a GGUF file. `progress` is called with a line of status per run.
pub fn run(
    path: &Path,
    config: &BenchConfig,
    device: DeviceKind,
    mut progress: impl FnMut(&str),
) -> Result<Vec<BenchResult>> {
    let device = &device.open()?;
    let file = GgufFile::open(path)?;
    let longest = config
        .prompt_tokens
        .iter()
        .chain(&config.gen_tokens)
        .max()
        .copied()
        .unwrap_or(1);
    let mut model = arch::load(&file, device, longest + 1)?;
    let vocab = model.vocab_size() as u32;
    let arch_name = file.architecture()?;
    let quant = crate::engine::dominant_quantization(&file);
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let threads = candle_core::utils::get_num_threads();
    let per_token = model
        .weight_bytes_per_token()
        .map_or_else(|| file_weight_bytes_per_token(&file), |b| b as u64);
    let generates = config.gen_tokens.iter().any(|&n| n > 0);
    let bandwidth = if config.bandwidth && generates {
        progress(&format!(
            "memory bandwidth: reading {} MiB",
            BANDWIDTH_BUFFER >> 20
        ));
        let b = memory_bandwidth(BANDWIDTH_BUFFER, threads, BANDWIDTH_PASSES);
        if let Some(b) = b {
            progress(&format!("memory bandwidth: {:.1} GB/s", b / 1e9));
        }
        b
    } else {
        None
    };
    let mut rng = StdRng::seed_from_u64(1234);
    let mut results = Vec::new();
    let tests = config
        .prompt_tokens
        .iter()
        .filter(|&&n| n > 0)
        .map(|&n| (true, n))
        .chain(
            config
                .gen_tokens
                .iter()
                .filter(|&&n| n > 0)
                .map(|&n| (false, n)),
        );
    for (is_prompt, n) in tests {
        let name = if is_prompt {
            format!("pp{n}")
        } else {
            format!("tg{n}")
        };
        let mut samples = Vec::with_capacity(config.repetitions);
        for rep in 0..=config.repetitions {
            let tokens: Vec<u32> = (0..n).map(|_| rng.gen_range(0..vocab)).collect();
            let secs = device.with_context(|| time_once(model.as_mut(), &tokens, is_prompt))?;
            let tps = n as f64 / secs;
            if rep == 0 {
                progress(&format!("{name}: warm-up {tps:.1} tok/s"));
            } else {
                progress(&format!(
                    "{name}: run {rep}/{} {tps:.1} tok/s",
                    config.repetitions
                ));
                samples.push(tps);
            }
        }
        let (mean, sd) = mean_stddev(&samples);
        results.push(BenchResult {
            test: name,
            model: path
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default(),
            architecture: arch_name.clone(),
            quantization: quant.clone(),
            size_bytes: size,
            threads,
            tokens_per_second: mean,
            stddev: sd,
            samples,
            weight_bytes_per_token: per_token,
            memory_bandwidth: bandwidth,
            bandwidth_fraction: bandwidth
                .filter(|_| !is_prompt)
                .map(|b| per_token as f64 * mean / b),
        });
    }
    Ok(results)
}

/// One timed run from an empty cache: the whole batch at once (`pp`), or token by token
/// (`tg`).
fn time_once(model: &mut dyn Transformer, tokens: &[u32], batch: bool) -> Result<f64> {
    model.truncate(0);
    let start = Instant::now();
    if batch {
        model.forward(tokens)?;
    } else {
        for &t in tokens {
            model.forward(&[t])?;
        }
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Mean and sample standard deviation.
pub fn mean_stddev(xs: &[f64]) -> (f64, f64) {
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, 0.0);
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

#[cfg(test)]
mod tests {
    use super::{file_weight_bytes_per_token, mean_stddev, memory_bandwidth};
    use crate::arch;
    use crate::gguf::GgufFile;
    use crate::testing::{write_model, Dims, TinyArch, CHATML_TEMPLATE};
    use candle_core::quantized::GgmlDType;
    use candle_core::Device;

    #[test]
    fn a_decoded_token_reads_every_matrix_once() {
        // A qwen2-shaped file of widths of its own, its vocabulary padded to 1000 tokens,
        // output tied to the embeddings.
        let dims = Dims {
            hidden: 128,
            ffn: 256,
            heads: 4,
            kv_heads: 2,
            head_dim: 32,
            layers: 2,
            vocab: 1000,
            output: false,
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("m.gguf");
        write_model(
            &path,
            TinyArch::Qwen2,
            &dims,
            GgmlDType::Q8_0,
            64,
            CHATML_TEMPLATE,
        );
        let file = GgufFile::open(&path).expect("open");
        let model = arch::load(&file, &Device::Cpu, 64).expect("load");
        assert_eq!(model.vocab_size(), 1000);
        // Q8_0: 34 bytes per 32 values. Per layer Q, K, V (128 + 64 + 64 rows), O, gate, up
        // and down; then the tied output matrix, read whole.
        let q8 = |values: usize| values / 32 * 34;
        let layer = q8(256 * 128) + q8(128 * 128) + 3 * q8(256 * 128);
        let matrices = 2 * layer + q8(1000 * 128);
        assert_eq!(model.weight_bytes_per_token(), Some(matrices));
        // The file's count adds the F32 norms (2 per layer and the output's) and the Q, K, V
        // biases.
        let vectors = 4 * (2 * (128 + 128 + 256) + 128);
        assert_eq!(
            file_weight_bytes_per_token(&file),
            (matrices + vectors) as u64
        );
    }

    #[test]
    fn bandwidth_is_a_positive_rate() {
        // 64 MiB on two threads: a rate in bytes per second, far from zero and from
        // infinity (no speed target: this checks the measurement reads its buffer).
        let b = memory_bandwidth(64 << 20, 2, 2).expect("64 MiB");
        assert!(b > 1e8 && b < 1e13, "{b}");
    }

    #[test]
    fn stats() {
        let (m, s) = mean_stddev(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert!((m - 5.0).abs() < 1e-12);
        assert!((s - 2.138089935).abs() < 1e-6);
        assert_eq!(mean_stddev(&[]), (0.0, 0.0));
    }
}
