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
}

impl Default for BenchConfig {
    fn default() -> Self {
        Self {
            prompt_tokens: vec![512],
            gen_tokens: vec![128],
            repetitions: 5,
        }
    }
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
    use super::mean_stddev;

    #[test]
    fn stats() {
        let (m, s) = mean_stddev(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert!((m - 5.0).abs() < 1e-12);
        assert!((s - 2.138089935).abs() < 1e-6);
        assert_eq!(mean_stddev(&[]), (0.0, 0.0));
    }
}
