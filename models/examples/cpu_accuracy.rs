//! Compares the last-token logits of the CPU and candle llama implementations with those of
//! candle running on dequantised f32 weights (`CANDLE_DEQUANTIZE_ALL=1`, no activation
//! quantisation), i.e. how far each quantised pipeline is from exact arithmetic.
//!
//! ```text
//! cargo run -p starling-models --example cpu_accuracy -- MODEL.gguf
//! ```

use candle_core::Device;
use starling_models::arch::cpu::CpuLlama;
use starling_models::arch::llama::Llama;
use starling_models::arch::Transformer;
use starling_models::gguf::GgufFile;

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        ab += x as f64 * y as f64;
        aa += x as f64 * x as f64;
        bb += y as f64 * y as f64;
    }
    ab / (aa.sqrt() * bb.sqrt())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: cpu_accuracy MODEL.gguf")?;
    let file = GgufFile::open(std::path::Path::new(&path))?;
    let text = "The quick brown fox jumps over the lazy dog . Once upon a time there was a little girl who lived in a village near the forest . She";
    let vocab = match file.content().metadata.get("tokenizer.ggml.tokens") {
        Some(candle_core::quantized::gguf_file::Value::Array(v)) => v
            .iter()
            .map(|t| t.to_string().cloned().unwrap_or_default())
            .collect::<Vec<_>>(),
        _ => Vec::new(),
    };
    let tokens: Vec<u32> = text
        .split(' ')
        .enumerate()
        .filter_map(|(i, w)| {
            let tok = if i == 0 {
                w.to_string()
            } else {
                format!("Ġ{w}")
            };
            vocab.iter().position(|t| *t == tok).map(|id| id as u32)
        })
        .collect();
    println!("{tokens:?}");
    let mut cpu = CpuLlama::load(&file, 256, 2)?;
    let mut candle = Llama::load(&file, &Device::Cpu, 256)?;
    // The exact reference runs on another thread, where candle reads the flag afresh.
    std::env::set_var("CANDLE_DEQUANTIZE_ALL", "1");
    let path2 = path.clone();
    let toks = tokens.clone();
    let exact = std::thread::spawn(move || -> Vec<Vec<f32>> {
        let file = GgufFile::open(std::path::Path::new(&path2)).expect("open");
        let mut m = Llama::load(&file, &Device::Cpu, 256).expect("load");
        let mut out = Vec::new();
        for n in [1, 2, 3, 10, toks.len()] {
            m.truncate(0);
            out.push(m.forward(&toks[..n]).expect("forward"));
        }
        out
    })
    .join()
    .map_err(|_| "reference thread panicked")?;
    for (i, n) in [1, 2, 3, 10, tokens.len()].into_iter().enumerate() {
        cpu.truncate(0);
        candle.truncate(0);
        let o = cpu.forward(&tokens[..n])?;
        let c = candle.forward(&tokens[..n])?;
        println!(
            "{n:>3} tokens: cos(cpu, exact) {:.6}  cos(candle, exact) {:.6}  cos(cpu, candle) {:.6}",
            cosine(&o, &exact[i]),
            cosine(&c, &exact[i]),
            cosine(&o, &c)
        );
    }
    Ok(())
}
