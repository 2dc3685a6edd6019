//! Quick prompt-processing / generation throughput check of the llama implementations,
//! without building the whole `starling` binary.
//!
//! ```text
//! cargo run --release -p starling-models --example cpu_bench -- MODEL.gguf [PP] [TG] [REPS] [THREADS] [cpu|candle]
//! ```

use std::time::Instant;

use candle_core::Device;
use starling_models::arch::cpu::CpuLlama;
use starling_models::arch::llama::Llama;
use starling_models::arch::Transformer;
use starling_models::gguf::GgufFile;

/// User + system CPU time of this process, in seconds (from /proc; 0 elsewhere).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    f.get(11)
        .zip(f.get(12))
        .map_or(0.0, |(u, s)| (u + s) / 100.0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args
        .first()
        .ok_or("usage: cpu_bench MODEL.gguf [PP] [TG] [REPS] [THREADS] [cpu|candle]")?;
    let num =
        |i: usize, default: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default);
    let (pp, tg, reps, threads) = (num(1, 512), num(2, 128), num(3, 3), num(4, 2));
    let backend = args.get(5).map_or("cpu", String::as_str);
    std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
    let file = GgufFile::open(std::path::Path::new(path))?;
    let max = pp.max(tg) + 1;
    let mut model: Box<dyn Transformer> = match backend {
        "candle" if file.architecture()? == "gemma3" => Box::new(
            starling_models::arch::gemma3::Gemma3::load(&file, &Device::Cpu, max)?,
        ),
        "candle" => Box::new(Llama::load(&file, &Device::Cpu, max)?),
        _ => Box::new(CpuLlama::load(&file, max, threads)?),
    };
    let vocab = model.vocab_size() as u32;
    let mut seed = 12345u32;
    let mut token = move || {
        seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (seed >> 8) % vocab
    };
    for (name, n, batch) in [("pp", pp, true), ("tg", tg, false)] {
        if n == 0 {
            continue;
        }
        let mut rates = Vec::new();
        let (mut cpu, mut tokens_timed) = (0.0, 0usize);
        for rep in 0..=reps {
            let tokens: Vec<u32> = (0..n).map(|_| token()).collect();
            model.truncate(0);
            let t0 = Instant::now();
            let c0 = cpu_seconds();
            if batch {
                model.forward(&tokens)?;
            } else {
                for &t in &tokens {
                    model.forward(&[t])?;
                }
            }
            let rate = n as f64 / t0.elapsed().as_secs_f64();
            if rep > 0 {
                rates.push(rate);
                cpu += cpu_seconds() - c0;
                tokens_timed += n;
            }
        }
        let mean = rates.iter().sum::<f64>() / rates.len().max(1) as f64;
        let best = rates.iter().cloned().fold(0.0, f64::max);
        let per_cpu = tokens_timed as f64 / cpu.max(1e-9);
        println!(
            "{backend} {name}{n}: mean {mean:.1} tok/s, best {best:.1} tok/s ({rates:.1?}), {per_cpu:.1} tok per CPU-second"
        );
    }
    Ok(())
}
