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
    // Besides a few word pieces, merges across the places where the pre-tokenizers differ
    // (digit runs, a space before digits, contractions, runs of spaces and newlines, a
    // lower-to-upper case change), so a wrong pre-tokenizer gives other tokens.
    let merges = [
        "Ġ t", "h e", "Ġt he", "i n", "o n", "1 2", "12 3", "123 4", "Ġ 1", "Ġ1 2", "2 0", "20 2",
        "202 4", "' s", "' t", "' R", "'R E", "Ġ Ġ", "Ċ Ċ", "o W", "Ġ Y", "9 9",
    ];
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

/// Context length of the tiny files whose llama.cpp logits are kept as fixtures.
pub const REFERENCE_CONTEXT: u32 = 256;

/// Llama-shaped architectures [`write_tiny`] writes (see [`crate::arch::shape`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TinyArch {
    /// `llama` as SmolLM2 ships it: tied output, unit norms, `smollm` pre-tokenizer.
    Llama,
    /// `llama` as Llama 3 ships it: per-dimension rotary frequency factors
    /// (`rope_freqs.weight`), a separate output matrix, the `llama-bpe` pre-tokenizer.
    Llama3,
    /// `qwen2`: biases on Q, K and V, rotation of head halves, tied output, the `qwen2`
    /// pre-tokenizer.
    Qwen2,
    /// `qwen3`: RMSNorm over each query and key head, a head width of its own (32, with 4
    /// heads on a width of 64), a separate output matrix, the `qwen2` pre-tokenizer.
    Qwen3,
    /// `smollm3`: 4 layers, the last of which has no rotary embedding (NoPE), the
    /// `llama-bpe` pre-tokenizer.
    SmolLM3,
    /// `llama` in Q4_K_M's mix of k-quants (Q4_K, Q6_K for embeddings, V and down, one
    /// Q5_K matrix) on a width of 256, as k-quants need; [`write_tiny`]'s `dtype` is not
    /// used. The `llama-bpe` pre-tokenizer.
    KQuants,
    /// `phi3` as Phi-4-mini ships it: fused `attn_qkv` and gate-then-up `ffn_up`, rotation
    /// of 12 of a head's 16 values, LongRoPE factors with an original context of 32 (so
    /// the long factors apply beyond 32 positions) and an attention factor, a separate
    /// output matrix, the `gpt-4o` pre-tokenizer.
    Phi3,
}

impl TinyArch {
    /// Every tiny architecture.
    pub const ALL: [TinyArch; 7] = [
        Self::Llama,
        Self::Llama3,
        Self::SmolLM3,
        Self::KQuants,
        Self::Qwen2,
        Self::Qwen3,
        Self::Phi3,
    ];

    /// A short lowercase name (used in fixture file names).
    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Llama3 => "llama3",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::SmolLM3 => "smollm3",
            Self::KQuants => "kquants",
            Self::Phi3 => "phi3",
        }
    }

    fn arch(self) -> &'static str {
        match self {
            Self::Llama | Self::Llama3 | Self::KQuants => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::SmolLM3 => "smollm3",
            Self::Phi3 => "phi3",
        }
    }

    fn pre(self) -> &'static str {
        match self {
            Self::Llama => "smollm",
            Self::Llama3 | Self::SmolLM3 | Self::KQuants => "llama-bpe",
            Self::Qwen2 | Self::Qwen3 => "qwen2",
            Self::Phi3 => "gpt-4o",
        }
    }
}

/// Writes a tiny random-weight llama GGUF (2 layers, GQA, a byte-level BPE vocabulary with
/// ChatML control tokens and template) to `path`: the real loading and inference code runs
/// on it in milliseconds. Weights are quantised to `dtype`; the context is `context` tokens.
///
/// Panics on failure: this is for tests.
pub fn write_tiny_llama(path: &Path, dtype: GgmlDType, context: u32) {
    write_tiny(path, TinyArch::Llama, dtype, context);
}

/// Writes a tiny random-weight GGUF of a llama-shaped architecture to `path` (see
/// [`write_tiny_llama`]). The bytes depend only on the arguments, so a file written here
/// can be read by llama.cpp once and its logits kept as a fixture.
///
/// Panics on failure: this is for tests.
pub fn write_tiny(path: &Path, arch: TinyArch, dtype: GgmlDType, context: u32) {
    write_tiny_templated(path, arch, dtype, context, CHATML_TEMPLATE);
}

/// The plain ChatML template of the tiny files (no tools).
pub const CHATML_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// A ChatML template with a Hermes-style tool format, written for tests in the way Qwen 2.5,
/// Qwen 3 and SmolLM3 templates work: the tools are listed by the template as JSON lines in
/// `<tools>`, an assistant's calls are `<tool_call>` blocks, and tool results are
/// `<tool_response>` blocks in a user turn.
pub const HERMES_TOOLS_TEMPLATE: &str = concat!(
    "{%- if tools -%}",
    "{{- '<|im_start|>system\\n' -}}",
    "{%- if messages[0].role == 'system' -%}{{- messages[0].content + '\\n\\n' -}}{%- endif -%}",
    "{{- 'You may call these tools. Their signatures, one per line:\\n<tools>' -}}",
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}",
    "{{- '\\n</tools>\\nTo call one, write a JSON object with its name and arguments ",
    "between <tool_call> and </tool_call>.<|im_end|>\\n' -}}",
    "{%- elif messages[0].role == 'system' -%}",
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' -}}",
    "{%- endif -%}",
    "{%- for message in messages -%}",
    "{%- if message.role == 'system' and loop.first -%}",
    "{%- elif message.role == 'tool' -%}",
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}",
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' -}}",
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}",
    "{%- else -%}",
    "{{- '<|im_start|>' + message.role -}}",
    "{%- if message.content -%}{{- '\\n' + message.content -}}{%- endif -%}",
    "{%- for call in message.tool_calls or [] -%}",
    "{{- '\\n<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' ",
    "+ (call.function.arguments | tojson) + '}\\n</tool_call>' -}}",
    "{%- endfor -%}",
    "{{- '<|im_end|>\\n' -}}",
    "{%- endif -%}",
    "{%- endfor -%}",
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}",
);

/// A ChatML template with Llama 3.1's tool format, written for tests: the tools are listed
/// (indented JSON) in the first user turn, a call is the bare object `{"name": ...,
/// "parameters": {...}}`, one call per turn, and results come back in an `ipython` turn.
pub const LLAMA3_TOOLS_TEMPLATE: &str = concat!(
    "{%- for message in messages -%}",
    "{%- if message.role == 'user' and loop.first and tools -%}",
    "{{- '<|im_start|>user\\nAnswer with a JSON function call {\"name\": function name, ",
    "\"parameters\": argument object} using one of these functions:\\n' -}}",
    "{%- for tool in tools -%}{{- (tool | tojson(indent=4)) + '\\n\\n' -}}{%- endfor -%}",
    "{{- message.content + '<|im_end|>\\n' -}}",
    "{%- elif message.role == 'tool' -%}",
    "{{- '<|im_start|>ipython\\n' + message.content + '<|im_end|>\\n' -}}",
    "{%- elif message.tool_calls -%}",
    "{%- if message.tool_calls | length != 1 -%}{{- raise_exception('one call at a time') -}}{%- endif -%}",
    "{%- set call = message.tool_calls[0].function -%}",
    "{{- '<|im_start|>assistant\\n{\"name\": \"' + call.name + '\", \"parameters\": ' ",
    "+ (call.arguments | tojson) + '}<|im_end|>\\n' -}}",
    "{%- else -%}",
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}",
    "{%- endif -%}",
    "{%- endfor -%}",
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}",
);

/// A conversation with one tool call and its result: `question`, an assistant turn that
/// calls `get_weather` with `{"city": "Oslo"}` (id `call_1`), and the tool's `result`.
pub fn weather_call_history(question: &str, result: &str) -> Vec<crate::chat::ChatMessage> {
    use crate::chat::{ChatMessage, ChatToolCall};
    let call = ChatToolCall::function("call_1", "get_weather", serde_json::json!({"city": "Oslo"}));
    vec![
        ChatMessage::user(question),
        ChatMessage::assistant_calls("", vec![call]),
        ChatMessage::tool_result(Some("call_1".into()), Some("get_weather".into()), result),
    ]
}

/// [`write_tiny`] with `template` as the file's `tokenizer.chat_template` (for example
/// [`HERMES_TOOLS_TEMPLATE`]).
///
/// Panics on failure: this is for tests.
#[allow(clippy::expect_used, clippy::unwrap_used)]
pub fn write_tiny_templated(
    path: &Path,
    arch: TinyArch,
    dtype: GgmlDType,
    context: u32,
    template: &str,
) {
    write_model(path, arch, &Dims::tiny(arch), dtype, context, template);
}

/// The widths of a file [`write_model`] writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    /// Model width.
    pub hidden: usize,
    /// Feed-forward width.
    pub ffn: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Layers.
    pub layers: usize,
    /// Tokens in the vocabulary: the tiny vocabulary, padded with placeholder tokens up to
    /// this size (never fewer than the tiny vocabulary's own).
    pub vocab: usize,
    /// A separate `output.weight` (else the output is tied to the embeddings).
    pub output: bool,
}

impl Dims {
    /// The widths of the tiny file of `arch` (what [`write_tiny`] writes).
    pub fn tiny(arch: TinyArch) -> Self {
        let (hidden, ffn) = if arch == TinyArch::KQuants {
            (256, 512)
        } else {
            (HIDDEN, FFN)
        };
        Self {
            hidden,
            ffn,
            heads: HEADS,
            kv_heads: KV_HEADS,
            head_dim: match arch {
                TinyArch::Qwen3 => 32,
                _ => hidden / HEADS,
            },
            layers: if arch == TinyArch::SmolLM3 { 4 } else { LAYERS },
            vocab: 0,
            output: matches!(arch, TinyArch::Llama3 | TinyArch::Qwen3 | TinyArch::Phi3),
        }
    }
}

/// A published model's shape, for speed measurements with random weights of its size
/// (speed does not depend on the weights' values): [`write_model`] writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RealShape {
    /// A short name (`llama-3.2-1b`).
    pub name: &'static str,
    /// The architecture whose tensors and metadata the file has.
    pub arch: TinyArch,
    /// Its widths, as the model's own config gives them.
    pub dims: Dims,
}

/// Shapes of published models: Llama 3.2 1B (`config.json`: hidden 2048, 16 layers, 32
/// heads, 8 KV heads, FFN 8192, vocabulary 128,256, tied output, Llama 3 rotary factors) and
/// Qwen2.5 1.5B (hidden 1536, 28 layers, 12 heads, 2 KV heads, FFN 8960, vocabulary
/// 151,936, tied output, biases on Q, K and V).
pub const REAL_SHAPES: [RealShape; 2] = [
    RealShape {
        name: "llama-3.2-1b",
        arch: TinyArch::Llama3,
        dims: Dims {
            hidden: 2048,
            ffn: 8192,
            heads: 32,
            kv_heads: 8,
            head_dim: 64,
            layers: 16,
            vocab: 128_256,
            output: false,
        },
    },
    RealShape {
        name: "qwen2.5-1.5b",
        arch: TinyArch::Qwen2,
        dims: Dims {
            hidden: 1536,
            ffn: 8960,
            heads: 12,
            kv_heads: 2,
            head_dim: 128,
            layers: 28,
            vocab: 151_936,
            output: false,
        },
    },
];

/// Writes a random-weight GGUF of `arch` with widths `dims` (see [`write_tiny`]; the tiny
/// files are `write_model(.., &Dims::tiny(arch), ..)`). Layer weights are scaled so that
/// activations stay finite through many wide layers.
///
/// Panics on failure: this is for tests and benchmarks.
pub fn write_model(
    path: &Path,
    arch: TinyArch,
    dims: &Dims,
    dtype: GgmlDType,
    context: u32,
    template: &str,
) {
    let mut v = vocab();
    for i in v.tokens.len()..dims.vocab {
        v.tokens.push(format!("<|placeholder_{i}|>"));
        // USER_DEFINED: a whole token of its own, never merged into.
        v.types.push(4);
    }
    let n_vocab = v.tokens.len();
    let (hidden, ffn, heads, kv_heads, head_dim) = (
        dims.hidden,
        dims.ffn,
        dims.heads,
        dims.kv_heads,
        dims.head_dim,
    );
    // The k-quant file is Q4_K_M's mix: Q4_K, with Q6_K for the embeddings, V and down
    // projections, and one Q5_K matrix.
    let type_of = |name: &str| {
        if arch != TinyArch::KQuants {
            return dtype;
        }
        if name == "blk.1.attn_k" {
            GgmlDType::Q5K
        } else if ["token_embd", "attn_v", "ffn_down"]
            .iter()
            .any(|n| name.ends_with(n))
        {
            GgmlDType::Q6K
        } else {
            GgmlDType::Q4K
        }
    };
    // Random layers of width 256 turn the rounding of 8-bit activations (which differs
    // between llama.cpp's k-quant path and ours) into logit changes of 10% of their spread;
    // smaller layer weights keep the k-quant file's function smooth enough to compare.
    // Wider layers are scaled down by the square root of their width beyond the tiny one.
    let gain = if arch == TinyArch::KQuants {
        0.3
    } else if hidden > HIDDEN {
        (HIDDEN as f64 / hidden as f64).sqrt()
    } else {
        1.0
    };
    let qn = |name: &str, t: Tensor| {
        let t = if name.starts_with("blk.") {
            (t * gain).expect("scale")
        } else {
            t
        };
        QTensor::quantize(&t, type_of(name)).expect("quantize")
    };
    let f32q = |t: Tensor| QTensor::quantize(&t, GgmlDType::F32).expect("f32");
    let ones =
        |n: usize| f32q(Tensor::ones(n, candle_core::DType::F32, &Device::Cpu).expect("ones"));
    // Norm weights near 1 and biases near 0, different per tensor (SmolLM2's file keeps
    // the unit norms it always had).
    let around = |n: usize, centre: f32, seed: u64| {
        let t = (random((1, n), seed) * 5.0).expect("scale");
        let t = (t + centre as f64).expect("shift");
        f32q(t.reshape(n).expect("reshape"))
    };
    let norm = |n: usize, seed: u64| match arch {
        TinyArch::Llama => ones(n),
        _ => around(n, 1.0, seed),
    };
    let (q_width, kv) = (heads * head_dim, kv_heads * head_dim);
    let mut tensors: Vec<(String, QTensor)> = vec![
        (
            "token_embd.weight".into(),
            qn("token_embd", random((n_vocab, hidden), 1)),
        ),
        ("output_norm.weight".into(), norm(hidden, 2)),
    ];
    if dims.output {
        tensors.push((
            "output.weight".into(),
            qn("output", random((n_vocab, hidden), 3)),
        ));
    }
    if arch == TinyArch::Llama3 {
        // Llama 3.1's scheme divides the lowest frequencies most.
        let factors: Vec<f32> = (0..head_dim / 2)
            .map(|i| 1.0 + 7.0 * i as f32 / (head_dim / 2) as f32)
            .collect();
        let t = Tensor::from_vec(factors, head_dim / 2, &Device::Cpu).expect("factors");
        tensors.push(("rope_freqs.weight".into(), f32q(t)));
    }
    let rot_dim = if arch == TinyArch::Phi3 { 12 } else { head_dim };
    if arch == TinyArch::Phi3 {
        let factors = |top: f32| {
            let v: Vec<f32> = (0..rot_dim / 2)
                .map(|i| 1.0 + top * i as f32 / (rot_dim / 2) as f32)
                .collect();
            f32q(Tensor::from_vec(v, rot_dim / 2, &Device::Cpu).expect("factors"))
        };
        tensors.push(("rope_factors_short.weight".into(), factors(0.5)));
        tensors.push(("rope_factors_long.weight".into(), factors(20.0)));
    }
    let layers = dims.layers;
    for l in 0..layers {
        let s = 100 * (l as u64 + 1);
        let p = |n: &str| format!("blk.{l}.{n}.weight");
        let q = |n: &str, t: Tensor| qn(&format!("blk.{l}.{n}"), t);
        tensors.push((p("attn_norm"), norm(hidden, s + 10)));
        if arch == TinyArch::Phi3 {
            tensors.push((
                p("attn_qkv"),
                q("attn_qkv", random((q_width + 2 * kv, hidden), s + 1)),
            ));
        } else {
            tensors.push((p("attn_q"), q("attn_q", random((q_width, hidden), s + 1))));
            tensors.push((p("attn_k"), q("attn_k", random((kv, hidden), s + 2))));
            tensors.push((p("attn_v"), q("attn_v", random((kv, hidden), s + 3))));
        }
        if arch == TinyArch::Qwen2 {
            let b = |n: &str| format!("blk.{l}.{n}.bias");
            tensors.push((b("attn_q"), around(q_width, 0.0, s + 11)));
            tensors.push((b("attn_k"), around(kv, 0.0, s + 12)));
            tensors.push((b("attn_v"), around(kv, 0.0, s + 13)));
        }
        if arch == TinyArch::Qwen3 {
            tensors.push((p("attn_q_norm"), norm(head_dim, s + 14)));
            tensors.push((p("attn_k_norm"), norm(head_dim, s + 15)));
        }
        tensors.push((
            p("attn_output"),
            q("attn_output", random((hidden, q_width), s + 4)),
        ));
        tensors.push((p("ffn_norm"), norm(hidden, s + 16)));
        if arch == TinyArch::Phi3 {
            tensors.push((p("ffn_up"), q("ffn_up", random((2 * ffn, hidden), s + 6))));
        } else {
            tensors.push((p("ffn_gate"), q("ffn_gate", random((ffn, hidden), s + 5))));
            tensors.push((p("ffn_up"), q("ffn_up", random((ffn, hidden), s + 6))));
        }
        tensors.push((p("ffn_down"), q("ffn_down", random((hidden, ffn), s + 7))));
    }
    let strs = |xs: &[String]| Value::Array(xs.iter().map(|s| Value::String(s.clone())).collect());
    let a = arch.arch();
    let key = |k: &str| format!("{a}.{k}");
    let mut md: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(a.into())),
        ("general.name".into(), Value::String("tiny".into())),
        (key("context_length"), Value::U32(context)),
        (key("embedding_length"), Value::U32(hidden as u32)),
        (key("block_count"), Value::U32(layers as u32)),
        (key("feed_forward_length"), Value::U32(ffn as u32)),
        (key("attention.head_count"), Value::U32(heads as u32)),
        (key("attention.head_count_kv"), Value::U32(kv_heads as u32)),
        (key("attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
        (key("rope.freq_base"), Value::F32(10000.0)),
        (key("rope.dimension_count"), Value::U32(rot_dim as u32)),
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        (
            "tokenizer.ggml.pre".into(),
            Value::String(arch.pre().into()),
        ),
        ("tokenizer.ggml.tokens".into(), strs(&v.tokens)),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(v.types.iter().map(|&t| Value::I32(t)).collect()),
        ),
        ("tokenizer.ggml.merges".into(), strs(&v.merges)),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(1)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(2)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
        (
            "tokenizer.chat_template".into(),
            Value::String(template.into()),
        ),
    ];
    if arch == TinyArch::Phi3 {
        md.push((key("rope.scaling.original_context_length"), Value::U32(32)));
        md.push((key("rope.scaling.attn_factor"), Value::F32(1.19)));
    }
    if arch == TinyArch::Qwen3 {
        md.push((key("attention.key_length"), Value::U32(head_dim as u32)));
        md.push((key("attention.value_length"), Value::U32(head_dim as u32)));
    }
    let md_refs: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut f = std::fs::File::create(path).expect("create gguf");
    gguf_file::write(&mut f, &md_refs, &t_refs).expect("write gguf");
}
