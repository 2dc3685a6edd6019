//! End-to-end checks of the CPU implementation against the candle one on a real model.

use std::path::{Path, PathBuf};

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::Device;

use super::CpuLlama;
use crate::arch::llama::Llama;
use crate::arch::Transformer;
use crate::gguf::GgufFile;

/// The model under test: `STARLING_TEST_LLM`, or the default SmolLM2 file.
fn model_path() -> Option<PathBuf> {
    let p = std::env::var_os("STARLING_TEST_LLM").map_or_else(|| PathBuf::from("/tmp/m/smollm2.gguf"), PathBuf::from);
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "SKIPPED: model {} not found; set STARLING_TEST_LLM to a llama-architecture GGUF file to run this test",
            p.display()
        );
        None
    }
}

/// Ids of a short English text, looked up word by word in the model's vocabulary (GPT-2
/// style `Ġword` tokens), so that the logits are as peaked as on real prompts.
fn prompt(file: &GgufFile) -> Vec<u32> {
    let text = "The quick brown fox jumps over the lazy dog . Once upon a time there was a little girl who lived in a village near the forest . She";
    let vocab = match file.content().metadata.get("tokenizer.ggml.tokens") {
        Some(gguf_file::Value::Array(v)) => v.iter().map(|t| t.to_string().cloned().unwrap_or_default()).collect::<Vec<_>>(),
        _ => Vec::new(),
    };
    let mut ids = Vec::new();
    for (i, w) in text.split(' ').enumerate() {
        let tok = if i == 0 { w.to_string() } else { format!("Ġ{w}") };
        if let Some(id) = vocab.iter().position(|t| *t == tok) {
            ids.push(id as u32);
        }
    }
    assert!(ids.len() > 20, "vocabulary lookup found only {} of the prompt's words", ids.len());
    ids
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        ab += x as f64 * y as f64;
        aa += x as f64 * x as f64;
        bb += y as f64 * y as f64;
    }
    ab / (aa.sqrt() * bb.sqrt())
}

fn argmax(v: &[f32]) -> usize {
    v.iter().enumerate().fold(0, |best, (i, &x)| if x > v[best] { i } else { best })
}

fn compare(what: &str, reference: &[f32], ours: &[f32]) {
    assert_eq!(reference.len(), ours.len(), "{what}: vocabulary sizes differ");
    let cos = cosine(reference, ours);
    let (ra, oa) = (argmax(reference), argmax(ours));
    eprintln!("{what}: cosine {cos:.6}, argmax {ra} / {oa}");
    assert!(cos >= 0.999, "{what}: cosine {cos} < 0.999");
    assert_eq!(ra, oa, "{what}: argmax differs (candle {ra}, cpu {oa})");
}

/// Prefill, 20 greedy decode steps, then a rollback to a shorter prefix and a different
/// continuation: the two implementations must agree at every step.
fn check_against_candle(path: &Path) {
    let file = GgufFile::open(path).expect("open model");
    let ids = prompt(&file);
    let mut candle = Llama::load(&file, &Device::Cpu, 256).expect("candle load");
    let mut cpu = CpuLlama::load(&file, 256, 2).expect("cpu load");
    assert_eq!(cpu.vocab_size(), candle.vocab_size());
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();

    let r = candle.forward(&ids).expect("candle prefill");
    let o = cpu.forward(&ids).expect("cpu prefill");
    compare(&format!("{name} prefill of {}", ids.len()), &r, &o);
    let mut next = argmax(&r) as u32;
    for step in 0..20 {
        let r = candle.forward(&[next]).expect("candle decode");
        let o = cpu.forward(&[next]).expect("cpu decode");
        compare(&format!("{name} decode step {step}"), &r, &o);
        next = argmax(&r) as u32;
    }
    assert_eq!(cpu.cache_len(), ids.len() + 20);

    // Prefix reuse: keep the first 10 positions, continue differently.
    candle.truncate(10);
    cpu.truncate(10);
    assert_eq!(cpu.cache_len(), 10);
    let other = &ids[ids.len() - 6..];
    let r = candle.forward(other).expect("candle after truncate");
    let o = cpu.forward(other).expect("cpu after truncate");
    compare(&format!("{name} after truncate"), &r, &o);
    let mut next = argmax(&r) as u32;
    for step in 0..3 {
        let r = candle.forward(&[next]).expect("candle decode");
        let o = cpu.forward(&[next]).expect("cpu decode");
        compare(&format!("{name} decode after truncate {step}"), &r, &o);
        next = argmax(&r) as u32;
    }
}

/// Writes a copy of `src` whose Q4_1 weights are converted to `target`.
fn convert(src: &Path, target: GgmlDType, out: &Path) {
    let file = GgufFile::open(src).expect("open");
    let ct = file.content();
    let mut tensors = Vec::new();
    for (name, info) in &ct.tensor_infos {
        let t = file.tensor(name, &Device::Cpu).expect("tensor");
        let t = if info.ggml_dtype == GgmlDType::Q4_1 {
            QTensor::quantize(&t.dequantize(&Device::Cpu).expect("dequantize"), target).expect("quantize")
        } else {
            t
        };
        tensors.push((name.clone(), t));
    }
    let metadata: Vec<(&str, &gguf_file::Value)> = ct.metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut w = std::io::BufWriter::new(std::fs::File::create(out).expect("create"));
    gguf_file::write(&mut w, &metadata, &refs).expect("write gguf");
}

#[test]
fn matches_candle_on_real_model() {
    let Some(path) = model_path() else { return };
    check_against_candle(&path);
}

#[test]
fn matches_candle_after_requantisation() {
    let Some(path) = model_path() else { return };
    let has_q4_1 = GgufFile::open(&path)
        .expect("open")
        .content()
        .tensor_infos
        .values()
        .any(|i| i.ggml_dtype == GgmlDType::Q4_1);
    if !has_q4_1 {
        eprintln!("SKIPPED: {} has no Q4_1 weights to convert", path.display());
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    for target in [GgmlDType::Q8_0, GgmlDType::Q4_0] {
        let out = dir.path().join(format!("model-{target:?}.gguf"));
        convert(&path, target, &out);
        check_against_candle(&out);
    }
}

#[test]
fn rejects_bad_requests() {
    let Some(path) = model_path() else { return };
    let file = GgufFile::open(&path).expect("open model");
    let mut cpu = CpuLlama::load(&file, 8, 1).expect("cpu load");
    assert!(cpu.forward(&[]).is_err());
    assert!(cpu.forward(&[cpu.vocab_size() as u32]).is_err());
    assert!(cpu.forward(&[1; 9]).is_err());
    assert_eq!(cpu.cache_len(), 0);
    cpu.forward(&[1; 8]).expect("fits exactly");
    assert!(cpu.forward(&[1]).is_err());
}
