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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args.first().ok_or("usage: cpu_bench MODEL.gguf [PP] [TG] [REPS] [THREADS] [cpu|candle]")?;
    let num = |i: usize, default: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default);
    let (pp, tg, reps, threads) = (num(1, 512), num(2, 128), num(3, 3), num(4, 2));
    let backend = args.get(5).map_or("cpu", String::as_str);
    std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
    let file = GgufFile::open(std::path::Path::new(path))?;
    let max = pp.max(tg) + 1;
    let mut model: Box<dyn Transformer> = match backend {
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
        for rep in 0..=reps {
            let tokens: Vec<u32> = (0..n).map(|_| token()).collect();
            model.truncate(0);
            let t0 = Instant::now();
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
            }
        }
        let mean = rates.iter().sum::<f64>() / rates.len().max(1) as f64;
        let best = rates.iter().cloned().fold(0.0, f64::max);
        println!("{backend} {name}{n}: mean {mean:.1} tok/s, best {best:.1} tok/s ({rates:.1?})");
    }
    Ok(())
}
