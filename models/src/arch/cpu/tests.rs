//! End-to-end checks of the CPU implementation against the candle one on a real model.

use std::path::{Path, PathBuf};

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::Device;

use super::{CpuLlama, Q6kPath};
use crate::arch::gemma3::Gemma3;
use crate::arch::llama::Llama;
use crate::arch::Transformer;
use crate::gguf::GgufFile;

/// The model under test: the default SmolLM2 file, found (and fetched on first use) by
/// `crate::testing`; a missing model fails the test.
fn model_path() -> Option<PathBuf> {
    Some(crate::testing::chat_model())
}

/// Ids of a short English text, looked up word by word in the model's vocabulary (GPT-2
/// style `Ġword` or SentencePiece `▁word` tokens), so that the logits are as peaked as on
/// real prompts.
fn prompt(file: &GgufFile) -> Vec<u32> {
    let text = "The quick brown fox jumps over the lazy dog . Once upon a time there was a little girl who lived in a village near the forest . She";
    let vocab = match file.content().metadata.get("tokenizer.ggml.tokens") {
        Some(gguf_file::Value::Array(v)) => v
            .iter()
            .map(|t| t.to_string().cloned().unwrap_or_default())
            .collect::<Vec<_>>(),
        _ => Vec::new(),
    };
    let mut ids = Vec::new();
    for (i, w) in text.split(' ').enumerate() {
        let forms = if i == 0 {
            [w.to_string(), format!("▁{w}")]
        } else {
            [format!("Ġ{w}"), format!("▁{w}")]
        };
        if let Some(id) = forms
            .iter()
            .find_map(|tok| vocab.iter().position(|t| t == tok))
        {
            ids.push(id as u32);
        }
    }
    assert!(
        ids.len() > 20,
        "vocabulary lookup found only {} of the prompt's words",
        ids.len()
    );
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
    v.iter()
        .enumerate()
        .fold(0, |best, (i, &x)| if x > v[best] { i } else { best })
}

/// Logits of the three implementations for one step.
struct Step<'a> {
    what: String,
    exact: &'a [f32],
    candle: &'a [f32],
    cpu: &'a [f32],
}

/// The CPU logits must pick the same token as exact arithmetic and stay within cosine 0.99
/// of it. Both quantised pipelines carry their own 8-bit activation noise: on this prompt
/// candle's own logits range from 0.9947 to 0.99998 (cosine to exact) from step to step, so
/// a 0.999 bound would fail for candle itself, and the same noise realised differently
/// (changing only the order of f32 additions moves single steps by up to 0.001, because
/// activations are re-quantised after every layer) can put two correct pipelines at
/// opposite sides of exact: their angles add, so 0.9947 each way is 0.979 apart. Per step
/// the two quantised pipelines must agree to 0.98;
/// whether ours is as accurate as candle's is judged over all steps, by
/// [`Trio::finish`]. Returns `1 − cosine to exact` of ours and of candle's.
fn compare(step: &Step<'_>) -> (f64, f64) {
    let cos_exact = cosine(step.cpu, step.exact);
    let cos_candle = cosine(step.cpu, step.candle);
    let candle_exact = cosine(step.candle, step.exact);
    let (e, c, o) = (argmax(step.exact), argmax(step.candle), argmax(step.cpu));
    eprintln!(
        "{}: cos(cpu, exact) {cos_exact:.6}, cos(candle, exact) {candle_exact:.6}, cos(cpu, candle) {cos_candle:.6}; argmax {e} / {c} / {o}",
        step.what
    );
    assert!(
        cos_exact >= 0.99,
        "{}: cosine to exact {cos_exact} < 0.99",
        step.what
    );
    assert!(
        cos_candle >= 0.98,
        "{}: cosine to candle {cos_candle} < 0.98",
        step.what
    );
    // Same greedy token as exact arithmetic, unless the two are a near-tie there (candle's
    // own pipeline flips such ties too): closer than 0.25 logits, or than twice the RMS
    // error of this step's logits (the 8-bit activations' noise, which moves each logit by
    // about that much either way).
    let gap = step.exact[e] - step.exact[o];
    let rms = (step
        .cpu
        .iter()
        .zip(step.exact)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum::<f64>()
        / step.cpu.len() as f64)
        .sqrt() as f32;
    eprintln!("{}: RMS logit error {rms:.4}", step.what);
    assert!(
        e == o || gap < 0.25f32.max(2.0 * rms),
        "{}: argmax {o} differs from exact {e} by {gap} logits (RMS error {rms})",
        step.what
    );
    (1.0 - cos_exact, 1.0 - candle_exact)
}

/// The implementation under test and its two references, fed the same tokens.
struct Trio {
    name: String,
    exact: Box<dyn Transformer>,
    candle: Box<dyn Transformer>,
    cpu: CpuLlama,
    /// Σ (1 − cosine to exact) over the steps so far: ours, candle's.
    error: (f64, f64),
    steps: usize,
}

impl Trio {
    /// Runs `tokens` through all three, compares, and returns the exact argmax.
    fn step(&mut self, what: &str, tokens: &[u32]) -> u32 {
        let e = self.exact.forward(tokens).expect("f32 forward");
        let c = self.candle.forward(tokens).expect("candle forward");
        let o = self.cpu.forward(tokens).expect("cpu forward");
        let (ours, candle) = compare(&Step {
            what: format!("{} {what}", self.name),
            exact: &e,
            candle: &c,
            cpu: &o,
        });
        self.error.0 += ours;
        self.error.1 += candle;
        self.steps += 1;
        argmax(&e) as u32
    }

    /// Over all steps, ours must be about as close to exact arithmetic as candle's
    /// quantised pipeline: mean `1 − cosine` at most 1.5 × candle's (the spread between
    /// two summation orders of our own kernels on this prompt is 1.2–1.5×).
    fn finish(&self) {
        let n = self.steps.max(1) as f64;
        let (ours, candle) = (self.error.0 / n, self.error.1 / n);
        eprintln!(
            "{}: mean 1 - cos to exact: ours {ours:.6}, candle {candle:.6}",
            self.name
        );
        assert!(
            ours <= 1.5 * candle,
            "{}: mean error to exact {ours} is more than 1.5 × candle's {candle}",
            self.name
        );
    }

    fn truncate(&mut self, len: usize) {
        self.exact.truncate(len);
        self.candle.truncate(len);
        self.cpu.truncate(len);
    }
}

/// The candle implementation of `file`'s architecture.
fn candle_impl(file: &GgufFile, max_seq: usize) -> Box<dyn Transformer> {
    if file.architecture().expect("architecture") == "gemma3" {
        Box::new(Gemma3::load(file, &Device::Cpu, max_seq).expect("candle gemma3 load"))
    } else {
        Box::new(Llama::load(file, &Device::Cpu, max_seq).expect("candle load"))
    }
}

/// Prefill, 20 greedy decode steps, then a rollback to a shorter prefix and a different
/// continuation, comparing the CPU implementation with candle on the same file and with
/// candle on `exact` (the same weights stored as f32, so no quantised arithmetic at all).
fn check_against_candle(path: &Path, exact: &Path) {
    let file = GgufFile::open(path).expect("open model");
    let ids = prompt(&file);
    let mut t = Trio {
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        exact: candle_impl(&GgufFile::open(exact).expect("open f32 copy"), 256),
        candle: candle_impl(&file, 256),
        // Q6_K through its kernel (where the tier has one) whatever the file's size.
        cpu: CpuLlama::load_with(&file, 256, 2, Q6kPath::Kernel).expect("cpu load"),
        error: (0.0, 0.0),
        steps: 0,
    };
    assert_eq!(t.cpu.vocab_size(), t.candle.vocab_size());

    let mut next = t.step(&format!("prefill of {}", ids.len()), &ids);
    for i in 0..20 {
        next = t.step(&format!("decode step {i}"), &[next]);
    }
    assert_eq!(t.cpu.cache_len(), ids.len() + 20);

    // Prefix reuse: keep the first 10 positions, continue differently.
    t.truncate(10);
    assert_eq!(t.cpu.cache_len(), 10);
    let mut next = t.step("after truncate", &ids[ids.len() - 6..]);
    for i in 0..3 {
        next = t.step(&format!("decode after truncate {i}"), &[next]);
    }
    t.finish();
}

/// Writes a copy of `src` whose `from` weights are converted to `target`.
fn convert(src: &Path, from: &[GgmlDType], target: GgmlDType, out: &Path) {
    let file = GgufFile::open(src).expect("open");
    let ct = file.content();
    let mut tensors = Vec::new();
    for (name, info) in &ct.tensor_infos {
        let t = file.tensor(name, &Device::Cpu).expect("tensor");
        let t = if from.contains(&info.ggml_dtype) && info.shape.rank() == 2 {
            QTensor::quantize(&t.dequantize(&Device::Cpu).expect("dequantize"), target)
                .expect("quantize")
        } else {
            t
        };
        tensors.push((name.clone(), t));
    }
    let metadata: Vec<(&str, &gguf_file::Value)> =
        ct.metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut w = std::io::BufWriter::new(std::fs::File::create(out).expect("create"));
    gguf_file::write(&mut w, &metadata, &refs).expect("write gguf");
}

const QUANTISED: [GgmlDType; 8] = [
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q5_0,
    GgmlDType::Q5_1,
    GgmlDType::Q8_0,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
];

#[test]
fn matches_candle_on_real_model() {
    let Some(path) = model_path() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let exact = dir.path().join("model-f32.gguf");
    convert(&path, &QUANTISED, GgmlDType::F32, &exact);
    check_against_candle(&path, &exact);
}

/// Gemma 3 (the second default chat model: Q4_K, Q6_K, Q5_0 and Q8_0 matrices, QK-norm,
/// post-norms, a GELU gate, scaled embeddings, sliding-window layers with their own
/// rotation) against candle's implementation of it, on the file as it ships.
#[test]
fn matches_candle_on_gemma3() {
    let path = crate::testing::second_chat_model();
    let dir = tempfile::tempdir().expect("tempdir");
    let exact = dir.path().join("gemma-f32.gguf");
    convert(&path, &QUANTISED, GgmlDType::F32, &exact);
    check_against_candle(&path, &exact);
}

/// Positions beyond Gemma 3's sliding window (512): the local layers must stop seeing the
/// oldest keys as the exact function does. A 600-token prefill, then decode steps past it,
/// against candle on the f32 copy (no quantised arithmetic) and on the file itself.
#[test]
fn gemma3_sliding_window_matches_exact() {
    let path = crate::testing::second_chat_model();
    let dir = tempfile::tempdir().expect("tempdir");
    let exact_path = dir.path().join("gemma-f32.gguf");
    convert(&path, &QUANTISED, GgmlDType::F32, &exact_path);
    let file = GgufFile::open(&path).expect("open");
    let base = prompt(&file);
    let ids: Vec<u32> = base.iter().copied().cycle().take(600).collect();
    let mut exact = candle_impl(&GgufFile::open(&exact_path).expect("open f32"), 700);
    let mut candle = candle_impl(&file, 700);
    let mut cpu = CpuLlama::load_with(&file, 700, 2, Q6kPath::Kernel).expect("cpu load");
    let mut tokens = ids;
    for i in 0..4 {
        let e = exact.forward(&tokens).expect("exact forward");
        let c = candle.forward(&tokens).expect("candle forward");
        let o = cpu.forward(&tokens).expect("cpu forward");
        let (ours, theirs) = (cosine(&o, &e), cosine(&c, &e));
        eprintln!(
            "gemma3 step {i} at position {}: cos(cpu, exact) {ours:.6}, cos(candle, exact) {theirs:.6}",
            cpu.cache_len()
        );
        assert!(
            ours >= 0.99 && ours >= theirs - 0.005,
            "past the window: cosine to exact {ours} (candle {theirs})"
        );
        tokens = vec![argmax(&e) as u32];
    }
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
        convert(&path, &[GgmlDType::Q4_1], target, &out);
        let exact = dir.path().join(format!("model-{target:?}-f32.gguf"));
        convert(&out, &QUANTISED, GgmlDType::F32, &exact);
        check_against_candle(&out, &exact);
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

#[test]
fn a_cpu_without_a_simd_tier_is_left_to_candle() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tiny.gguf");
    crate::testing::write_tiny_llama(&path, GgmlDType::Q8_0, 64);
    let file = GgufFile::open(&path).expect("open");
    let cpu = Device::Cpu;
    for isa in super::kernels::Isa::available() {
        let verdict = super::eligible_on(&file, &cpu, isa);
        match isa {
            super::kernels::Isa::Scalar => {
                let reason = verdict.expect_err("scalar code is slower than candle's");
                assert!(reason.contains("SIMD"), "{reason}");
            }
            _ => assert_eq!(verdict, Ok(()), "{isa:?}"),
        }
    }
}

/// A small file reads its Q6_K matrices as Q8_0 unless the kernel is asked for, which the
/// lane-layout tiers then use (the tiny k-quant file's token embeddings, also its output,
/// are Q6_K); the other tiers convert either way.
#[test]
fn q6_k_takes_the_kernel_only_for_large_files_or_when_asked() {
    use super::kernels::{Format, Isa, Layout};
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("kquants.gguf");
    crate::testing::write_tiny(
        &path,
        crate::testing::TinyArch::KQuants,
        GgmlDType::Q8_0,
        64,
    );
    let file = GgufFile::open(&path).expect("open");
    let lanes = Layout::for_isa(Isa::detect()) == Layout::Lanes;
    for (path, want) in [
        (Q6kPath::Auto, Format::Q8_0),
        (Q6kPath::Q8_0, Format::Q8_0),
        (
            Q6kPath::Kernel,
            if lanes { Format::Q6 } else { Format::Q8_0 },
        ),
    ] {
        let cpu = CpuLlama::load_with(&file, 8, 1, path).expect("cpu load");
        assert_eq!(cpu.output.format(), want, "{path:?}");
    }
}
