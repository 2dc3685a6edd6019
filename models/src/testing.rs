//! Real model files for tests, found the same way the product finds them.
//!
//! Each function returns the path of a well-known model: from an environment variable when
//! set (`STARLING_TEST_LLM`, `STARLING_TEST_LLM2`, `STARLING_TEST_EMBED`), otherwise from the
//! model cache in `$STARLING_HOME` (or the platform data directory), fetching it with the
//! product's own model sources on first use. A model that cannot be had fails the calling
//! test with a message saying how to fix it: tests never pass by skipping silently.
//!
//! The one exception is [`mpnet_model`], an optional 400 MB model: it is used when present
//! and never fetched, and the tests that need it say on stderr that they skipped.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use crate::source::{registry, ModelCache, Progress};

/// Serialises fetches within one test process (the cache also locks across processes).
static FETCH: Mutex<()> = Mutex::new(());

fn resolve(env: &str, name: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        assert!(p.exists(), "{env}={} does not exist", p.display());
        return p;
    }
    let _guard = FETCH.lock().unwrap_or_else(|p| p.into_inner());
    let cache = match ModelCache::from_env() {
        Ok(c) => c,
        Err(e) => panic!("no model cache for tests: {e}"),
    };
    let known = registry::find(name).unwrap_or_else(|| panic!("`{name}` is not in the registry"));
    match cache.resolve(&known.source(), &Progress::quiet()) {
        Ok(p) => p,
        Err(e) => panic!(
            "test model `{name}` is not available: {e}\n\
             Fetch it with `cargo run -p starling-node -- models pull --all` (needs python3 -m pip \
             and access to PyPI), or point {env} at a local copy."
        ),
    }
}

/// The default chat model (SmolLM2-135M-Instruct, Q4_1 GGUF, llama architecture).
pub fn chat_model() -> PathBuf {
    resolve("STARLING_TEST_LLM", "smollm2-135m-instruct")
}

/// A second chat model of another architecture (Gemma 3 270M, Q4_K_M GGUF).
pub fn second_chat_model() -> PathBuf {
    resolve("STARLING_TEST_LLM2", "gemma3-270m")
}

/// The default embedding model directory (all-MiniLM-L6-v2).
pub fn embedding_model() -> PathBuf {
    resolve("STARLING_TEST_EMBED", "all-minilm-l6-v2")
}

/// Environment variable naming an all-mpnet-base-v2 directory for tests.
pub const MPNET_ENV: &str = "STARLING_TEST_MPNET";

/// The optional MPNet embedding model directory (all-mpnet-base-v2), if it is here:
/// `STARLING_TEST_MPNET` when set (it must exist), else the copy in the model cache. It is
/// never fetched for tests (400 MB, and not a default model): `None` means the caller
/// should skip, after printing [`mpnet_skip_message`].
pub fn mpnet_model() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(MPNET_ENV).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        assert!(p.exists(), "{MPNET_ENV}={} does not exist", p.display());
        return Some(p);
    }
    let cache = ModelCache::from_env().ok()?;
    let known = registry::find("all-mpnet-base-v2")?;
    cache.cached(&known.source())
}

/// What a test skipped for want of [`mpnet_model`] prints.
pub fn mpnet_skip_message() -> String {
    format!(
        "skipped: all-mpnet-base-v2 is not in the model cache; fetch it with \
         `cargo run -p starling-node -- models pull all-mpnet-base-v2` or set {MPNET_ENV} \
         to its directory"
    )
}

const HIDDEN: usize = 64;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const LAYERS: usize = 2;
const FFN: usize = 128;

/// GPT-2's byte-to-unicode table: printable bytes map to themselves, the rest to U+0100...
fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars: Vec<(u32, u32)> = printable.iter().map(|&b| (b, b)).collect();
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            chars.push((b, 256 + n));
            n += 1;
        }
    }
    printable.clear();
    chars.sort();
    chars
        .into_iter()
        .map(|(_, c)| char::from_u32(c).expect("valid char"))
        .collect()
}

struct Vocab {
    tokens: Vec<String>,
    types: Vec<i32>,
    merges: Vec<String>,
}

fn vocab() -> Vocab {
    let mut tokens = vec![
        "<|endoftext|>".to_string(),
        "<|im_start|>".into(),
        "<|im_end|>".into(),
    ];
    let mut types = vec![3, 3, 3];
    for c in byte_chars() {
        tokens.push(c.to_string());
        types.push(1);
    }
    let merges = ["Ġ t", "h e", "Ġt he", "i n", "o n"];
    for m in merges {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    Vocab {
        tokens,
        types,
        merges: merges.iter().map(|s| s.to_string()).collect(),
    }
}

fn random(shape: (usize, usize), seed: u64) -> Tensor {
    // A small LCG keeps the weights reproducible without extra dependencies.
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let n = shape.0 * shape.1;
    let data: Vec<f32> = (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) as f32 / (1u64 << 31) as f32 - 0.5) * 0.2
        })
        .collect();
    Tensor::from_vec(data, shape, &Device::Cpu).expect("shape matches data")
}

/// Writes a tiny random-weight llama GGUF (2 layers, GQA, a byte-level BPE vocabulary with
/// ChatML control tokens and template) to `path`: the real loading and inference code runs
/// on it in milliseconds. Weights are quantised to `dtype`; the context is `context` tokens.
///
/// Panics on failure: this is for tests.
#[allow(clippy::expect_used, clippy::unwrap_used)]
pub fn write_tiny_llama(path: &Path, dtype: GgmlDType, context: u32) {
    let v = vocab();
    let n_vocab = v.tokens.len();
    let q = |t: Tensor| QTensor::quantize(&t, dtype).expect("quantize");
    let f32t = |n: usize| {
        QTensor::quantize(
            &Tensor::ones(n, candle_core::DType::F32, &Device::Cpu).expect("ones"),
            GgmlDType::F32,
        )
        .expect("f32")
    };
    let mut tensors: Vec<(String, QTensor)> = vec![
        ("token_embd.weight".into(), q(random((n_vocab, HIDDEN), 1))),
        ("output_norm.weight".into(), f32t(HIDDEN)),
    ];
    let kv = HIDDEN / HEADS * KV_HEADS;
    for l in 0..LAYERS {
        let s = 100 * (l as u64 + 1);
        let p = |n: &str| format!("blk.{l}.{n}.weight");
        tensors.push((p("attn_norm"), f32t(HIDDEN)));
        tensors.push((p("attn_q"), q(random((HIDDEN, HIDDEN), s + 1))));
        tensors.push((p("attn_k"), q(random((kv, HIDDEN), s + 2))));
        tensors.push((p("attn_v"), q(random((kv, HIDDEN), s + 3))));
        tensors.push((p("attn_output"), q(random((HIDDEN, HIDDEN), s + 4))));
        tensors.push((p("ffn_norm"), f32t(HIDDEN)));
        tensors.push((p("ffn_gate"), q(random((FFN, HIDDEN), s + 5))));
        tensors.push((p("ffn_up"), q(random((FFN, HIDDEN), s + 6))));
        tensors.push((p("ffn_down"), q(random((HIDDEN, FFN), s + 7))));
    }
    let template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    let strs = |xs: &[String]| Value::Array(xs.iter().map(|s| Value::String(s.clone())).collect());
    let md: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("llama".into())),
        ("general.name", Value::String("tiny".into())),
        ("llama.context_length", Value::U32(context)),
        ("llama.embedding_length", Value::U32(HIDDEN as u32)),
        ("llama.block_count", Value::U32(LAYERS as u32)),
        ("llama.feed_forward_length", Value::U32(FFN as u32)),
        ("llama.attention.head_count", Value::U32(HEADS as u32)),
        ("llama.attention.head_count_kv", Value::U32(KV_HEADS as u32)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("llama.rope.freq_base", Value::F32(10000.0)),
        (
            "llama.rope.dimension_count",
            Value::U32((HIDDEN / HEADS) as u32),
        ),
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String("smollm".into())),
        ("tokenizer.ggml.tokens", strs(&v.tokens)),
        (
            "tokenizer.ggml.token_type",
            Value::Array(v.types.iter().map(|&t| Value::I32(t)).collect()),
        ),
        ("tokenizer.ggml.merges", strs(&v.merges)),
        ("tokenizer.ggml.bos_token_id", Value::U32(1)),
        ("tokenizer.ggml.eos_token_id", Value::U32(2)),
        ("tokenizer.ggml.add_bos_token", Value::Bool(false)),
        ("tokenizer.chat_template", Value::String(template.into())),
    ];
    let md_refs: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (*k, v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut f = std::fs::File::create(path).expect("create gguf");
    gguf_file::write(&mut f, &md_refs, &t_refs).expect("write gguf");
}
