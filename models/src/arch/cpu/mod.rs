//! A CPU implementation of the llama-shaped family ([`crate::arch::shape`]: llama, smollm3,
//! qwen2, qwen3, phi3, gemma3) built for speed: weights stay quantised (Q8_0, Q4_0, Q4_1, Q4_K
//! repacked as 4-bit blocks of 32 with their own scale and minimum, and on the AVX-512 and
//! AVX2 tiers the Q6_K of 1B-class files as 6-bit values with an f16 scale per 16; Q5_0,
//! Q5_1, Q5_K and the other Q6_K become Q8_0 in memory) in a layout made for integer SIMD
//! dot products, activations are quantised to 8-bit blocks once per matmul input, Q/K/V
//! share one matrix product and gate/up another, the KV cache is preallocated and written in place, scratch buffers are
//! reused so a decode step does not allocate (besides the returned logits), and the work of
//! every matmul is split over a persistent pool of spinning worker threads.
//!
//! It computes the same function as [`super::llama::Llama`] and [`super::gemma3::Gemma3`]
//! (the candle implementations), which stay available for other devices and weight types.

mod attention;
pub(crate) mod bert;
mod kernels;
pub use kernels::ISA_ENV;
mod ops;
mod pages;
mod pool;
mod quant;

use candle_core::quantized::GgmlDType;
use candle_core::Device;

use self::attention::{Attention, Dims};
pub use self::kernels::Isa;
use self::kernels::{Layout, BLOCK};
use self::pool::Pool;
use self::quant::{Epilogue, Gate, QActs, QMatrix};
use super::shape::LlamaShape;
use super::Transformer;
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;

/// Environment variable that selects the implementation: `candle` forces the candle one,
/// anything else (or nothing) lets [`super::load`] pick this one when it can.
pub const BACKEND_ENV: &str = "STARLING_BACKEND";

/// Weight types the kernels run directly (Q4_K's 4-bit values in the Q4_1 layout, with a
/// scale and minimum per 32 values).
const KERNEL_TYPES: [GgmlDType; 4] = [
    GgmlDType::Q8_0,
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q4K,
];

/// Weight types converted to Q8_0 in memory at load time (Q6_K only where the tier's layout
/// is [`Layout::Pairs`]: the AVX-512 and AVX2 kernels read it as it is): the rest of the
/// Q4_K_M and Q5_K_M mixes, and Q5_0/Q5_1, which llama-quantize puts in those mixes wherever a row is not a
/// multiple of 256 values (most of SmolLM2's and Gemma 3 270M's matrices). Q8_0's step is at
/// most a quarter of Q6_K's (its 8 bits cover the block's largest value, Q6_K's 6 bits the
/// same range with finer 16-value scales) and an eighth of Q5_0's over the same 32 values,
/// so little is lost.
const CONVERTED_TYPES: [GgmlDType; 4] = [
    GgmlDType::Q5_0,
    GgmlDType::Q5_1,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
];

/// Whether [`super::load`] should use this implementation for `file` on `device`: a
/// llama-shaped model on the CPU whose weight matrices all have a kernel here, on a CPU with
/// one of the kernels' SIMD tiers, unless the environment asks for candle. Returns the
/// reason when not (logged at `-v`). `requantize = auto` follows the same answer: a file
/// left to candle has its Q4_1/Q5_x weights converted to Q8_0.
pub fn eligible(file: &GgufFile, device: &Device) -> std::result::Result<(), String> {
    eligible_on(file, device, Isa::detect())
}

/// [`eligible`] on a CPU whose best kernel tier is `isa`.
pub fn eligible_on(file: &GgufFile, device: &Device, isa: Isa) -> std::result::Result<(), String> {
    if !device.is_cpu() {
        return Err("not a CPU device".into());
    }
    if std::env::var(BACKEND_ENV).is_ok_and(|v| v.eq_ignore_ascii_case("candle")) {
        return Err(format!("{BACKEND_ENV}=candle"));
    }
    // Without a SIMD tier the kernels run portable code, and candle is faster there: built
    // for a CPU with AVX but neither AVX2 nor FMA (or for baseline x86-64), candle ran a
    // Q8_0 copy of the shipped Q4_1 file 5.1x (6.9x) faster in prompt processing and 4.8x
    // (3.7x) in generation than the kernels' scalar tier ran the Q4_1 file itself
    // (benches/RESULTS.md, "CPUs without a SIMD tier of the kernels"). With AVX, FMA and
    // F16C the AVX tier is 2.2x / 1.7x candle's best there (the section after it).
    if isa == Isa::Scalar {
        return Err(
            "this CPU has none of the kernels' SIMD tiers (AVX+FMA, AVX2, AVX-512, NEON): candle is \
             faster on it"
                .into(),
        );
    }
    let ct = file.content();
    let shape = LlamaShape::read(file, 1).map_err(|e| e.to_string())?;
    let mut names = vec!["token_embd.weight".to_string()];
    if file.has_tensor("output.weight") {
        names.push("output.weight".into());
    }
    for i in 0..shape.n_layer {
        names.extend(shape.layer_matrices(i));
    }
    for name in &names {
        let info = ct
            .tensor_infos
            .get(name)
            .ok_or_else(|| format!("tensor {name} is missing"))?;
        if !KERNEL_TYPES.contains(&info.ggml_dtype) && !CONVERTED_TYPES.contains(&info.ggml_dtype) {
            return Err(format!("tensor {name} is {:?}", info.ggml_dtype));
        }
    }
    Ok(())
}

struct Layer {
    attn_norm: Vec<f32>,
    qkv: Vec<QMatrix>,
    /// Biases of the `q|k|v` row (qwen2).
    qkv_bias: Option<Vec<f32>>,
    /// RMSNorm weights of a query head and of a key head (qwen3).
    qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    /// The layer applies the rotary embedding (not one of smollm3's NoPE layers).
    rotates: bool,
    wo: QMatrix,
    /// RMSNorm weights of the attention output before it joins the residual (gemma3).
    post_attn_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    gate: QMatrix,
    up: QMatrix,
    down: QMatrix,
    /// RMSNorm weights of the feed-forward output before it joins the residual (gemma3).
    post_ffn_norm: Option<Vec<f32>>,
}

/// Buffers reused by every forward pass, grown to the largest batch seen.
struct Scratch {
    tokens: usize,
    x: Vec<f32>,
    qkv: Vec<f32>,
    att: Vec<f32>,
    ffn: Vec<f32>,
    ffn_up: Vec<f32>,
    /// A block's output before its post-norm (gemma3), `tokens × hidden`.
    post: Vec<f32>,
    acts: QActs,
    /// Attention outputs (all query heads), when their width is not the model's.
    acts_att: Option<QActs>,
    acts_ffn: QActs,
    logits: Vec<f32>,
}

/// A llama-shaped model run by the CPU kernels of this module.
pub struct CpuLlama {
    layers: Vec<Layer>,
    /// Token embeddings; `None` when they are the output matrix (tied weights).
    embeddings: Option<QMatrix>,
    output: QMatrix,
    output_norm: Vec<f32>,
    attention: Attention,
    dims: Dims,
    hidden: usize,
    ffn: usize,
    eps: f32,
    /// The feed-forward's gate function.
    gate: Gate,
    /// Factor the token embeddings are multiplied by (gemma3: `sqrt(hidden)`).
    embed_scale: Option<f32>,
    vocab: usize,
    max_seq: usize,
    len: usize,
    scratch: Scratch,
    pool: Pool,
    isa: Isa,
}

fn tensor_err(name: &str, reason: impl std::fmt::Display) -> ModelError {
    ModelError::Tensor {
        name: name.to_string(),
        reason: reason.to_string(),
    }
}

/// Bytes of every layer's matrices.
fn layer_bytes(layers: &[Layer]) -> usize {
    layers
        .iter()
        .map(|l| {
            l.qkv.iter().map(QMatrix::bytes).sum::<usize>()
                + [&l.wo, &l.gate, &l.up, &l.down]
                    .iter()
                    .map(|m| m.bytes())
                    .sum::<usize>()
        })
        .sum()
}

/// Files whose tensors hold at least this many bytes keep their Q6_K matrices as they are
/// on the tiers with a Q6_K kernel; smaller ones have them converted to Q8_0. Decode of a
/// 1B-class file is bound by memory bandwidth, and six bits a weight read fewer bytes; a
/// small model's decode is bound by arithmetic, and unpacking six bits costs more than
/// reading eight. Measured on an AMD EPYC (2 threads, `cpu_bench`, same-run A/B, decode
/// tok/s, Q8_0 conversion → Q6_K kernel), AVX-512 / AVX2 tier: SmolLM2-135M Q4_K_M (128 MiB)
/// 132 → 125 / 133 → 112; Gemma 3 270M Q4_K_M (260 MiB) 101 → 103 / 92 → 82; Llama 3.2 1B
/// shape Q4_K_M (0.8 GB) 32.5 → 35.6 / 26.0 → 28.1; Qwen2.5 1.5B shape Q4_K_M (1.0 GB)
/// 26.9 → 28.6 / 20.1 → 22.8 (benches/RESULTS.md).
const Q6K_NATIVE_MIN_BYTES: u64 = 512 << 20;

/// Environment variable that chooses how Q6_K matrices are read on the tiers with a Q6_K
/// kernel: `kernel` (as they are), `q8_0` (converted), or unset / `auto` (by the file's
/// size, see [`Q6K_NATIVE_MIN_BYTES`]); for measuring both paths on one file. An unknown
/// value is ignored with a warning.
pub const Q6K_ENV: &str = "STARLING_Q6K";

/// How Q6_K matrices are read where the tier has a Q6_K kernel (AVX-512, AVX2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Q6kPath {
    /// By the file's size: the kernel for files of at least [`Q6K_NATIVE_MIN_BYTES`].
    #[default]
    Auto,
    /// The Q6_K kernel.
    Kernel,
    /// Converted to Q8_0 at load.
    Q8_0,
}

impl Q6kPath {
    /// The path [`Q6K_ENV`] asks for (`Auto` when unset or unknown, with a warning).
    pub fn from_env() -> Self {
        match std::env::var(Q6K_ENV).ok().as_deref() {
            None | Some("") | Some("auto") => Self::Auto,
            Some("kernel") => Self::Kernel,
            Some("q8_0") => Self::Q8_0,
            Some(other) => {
                tracing::warn!("{Q6K_ENV}={other} is not one of auto, kernel, q8_0; using auto");
                Self::Auto
            }
        }
    }
}

/// How weights are arranged at load: the tier's layout, and whether Q6_K stays Q6_K.
#[derive(Clone, Copy, Debug)]
struct Packing {
    layout: Layout,
    q6k: bool,
}

impl Packing {
    /// The packing for `file` on a tier reading `layout`.
    fn for_file(file: &GgufFile, layout: Layout, path: Q6kPath) -> Self {
        let bytes: u64 = file
            .content()
            .tensor_infos
            .values()
            .map(crate::gguf::tensor_bytes)
            .sum();
        let q6k = layout == Layout::Lanes
            && match path {
                Q6kPath::Auto => bytes >= Q6K_NATIVE_MIN_BYTES,
                Q6kPath::Kernel => true,
                Q6kPath::Q8_0 => false,
            };
        tracing::debug!(
            tensor_mib = bytes >> 20,
            q6k_kernel = q6k,
            ?path,
            "Q6_K matrices {} (auto: the Q6_K kernel for files of at least {} MiB on lane-layout tiers)",
            if q6k { "kept as they are" } else { "converted to Q8_0 if any" },
            Q6K_NATIVE_MIN_BYTES >> 20
        );
        Self { layout, q6k }
    }
}

/// Reads a 2-D weight into the kernels' layout, checking its shape.
fn load_matrix(
    file: &GgufFile,
    pack: Packing,
    name: &str,
    rows: usize,
    k: usize,
) -> Result<QMatrix> {
    Ok(load_row_blocks(file, pack, name, &[rows], k)?.remove(0))
}

/// Reads a 2-D weight whose rows are several matrices one after another (phi3's gate-then-up
/// `ffn_up`) as one matrix per entry of `rows`, checking the total shape.
fn load_row_blocks(
    file: &GgufFile,
    pack: Packing,
    name: &str,
    rows: &[usize],
    k: usize,
) -> Result<Vec<QMatrix>> {
    let mut t = file.tensor(name, &Device::Cpu)?;
    // Q6_K has a kernel in the lane layout (AVX-512, AVX2), used for large files (see
    // `Q6K_NATIVE_MIN_BYTES`); otherwise it is read as Q8_0.
    let native = t.dtype() == GgmlDType::Q6K && pack.q6k;
    let layout = pack.layout;
    if CONVERTED_TYPES.contains(&t.dtype()) && !native {
        t = candle_core::quantized::QTensor::quantize(
            &t.dequantize(&Device::Cpu)?,
            GgmlDType::Q8_0,
        )?;
    }
    let (n, tk) = t.shape().dims2().map_err(|e| tensor_err(name, e))?;
    let total: usize = rows.iter().sum();
    if (n, tk) != (total, k) {
        return Err(tensor_err(
            name,
            format!("shape {n}×{tk}, expected {total}×{k}"),
        ));
    }
    let data = t.data()?;
    // Rows are stored one after another, each a whole number of blocks.
    let dtype = t.dtype();
    let row_bytes = k / dtype.block_size() * dtype.type_size();
    let mut start = 0;
    rows.iter()
        .map(|&r| {
            let bytes = &data[start * row_bytes..(start + r) * row_bytes];
            start += r;
            QMatrix::from_ggml(dtype, r, k, bytes, layout).map_err(|e| tensor_err(name, e))
        })
        .collect()
}

fn load_vector(file: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>> {
    let t = file.tensor(name, &Device::Cpu)?.dequantize(&Device::Cpu)?;
    let v = t.flatten_all()?.to_vec1::<f32>()?;
    if v.len() != len {
        return Err(tensor_err(
            name,
            format!("{} values, expected {len}", v.len()),
        ));
    }
    Ok(v)
}

impl CpuLlama {
    /// Loads a llama-shaped GGUF file for at most `max_seq_len` positions (capped by the
    /// model's context length), using `threads` threads (0: candle's setting, i.e.
    /// `RAYON_NUM_THREADS` or all cores).
    pub fn load(file: &GgufFile, max_seq_len: usize, threads: usize) -> Result<Self> {
        Self::load_with(file, max_seq_len, threads, Q6kPath::from_env())
    }

    /// [`CpuLlama::load`] with the way Q6_K matrices are read given.
    pub fn load_with(
        file: &GgufFile,
        max_seq_len: usize,
        threads: usize,
        q6k: Q6kPath,
    ) -> Result<Self> {
        let ct = file.content();
        let shape = LlamaShape::read(file, max_seq_len)?;
        let (n_kv, n_layer, hidden, ffn, head_dim) = (
            shape.n_kv,
            shape.n_layer,
            shape.hidden,
            shape.ffn,
            shape.head_dim,
        );
        let (q_width, kv_width) = (shape.q_width(), shape.kv_width());
        if [hidden, ffn, q_width]
            .iter()
            .any(|w| !w.is_multiple_of(BLOCK))
        {
            return Err(ModelError::Metadata {
                key: format!("{}.embedding_length", shape.arch),
                reason: format!(
                    "widths {hidden}, {ffn} and {q_width} must be multiples of {BLOCK}"
                ),
            });
        }
        let (isa, ignored) = Isa::choose(std::env::var(ISA_ENV).ok().as_deref());
        if let Some(why) = ignored {
            tracing::warn!("{why}");
        }
        // Weights are arranged for the tier's kernels once, at load.
        let layout = Layout::for_isa(isa);
        let pack = Packing::for_file(file, layout, q6k);
        let max_seq = shape.max_seq;
        let dims = Dims {
            n_head: shape.n_head,
            n_kv,
            head_dim,
        };

        let embd_info = ct
            .tensor_infos
            .get("token_embd.weight")
            .ok_or_else(|| tensor_err("token_embd.weight", "missing"))?;
        let vocab = embd_info.shape.dims().first().copied().unwrap_or(0);
        let embd = load_matrix(file, pack, "token_embd.weight", vocab, hidden)?;
        let (embeddings, output) = if file.has_tensor("output.weight") {
            (
                Some(embd),
                load_matrix(file, pack, "output.weight", vocab, hidden)?,
            )
        } else {
            (None, embd)
        };
        let mut layers = Vec::with_capacity(n_layer);
        for i in 0..n_layer {
            let name = |s: &str| format!("blk.{i}.{s}.weight");
            let qkv_bias = if shape.qkv_bias {
                let bias = |s: &str, n| load_vector(file, &format!("blk.{i}.{s}.bias"), n);
                let mut b = bias("attn_q", q_width)?;
                b.extend(bias("attn_k", kv_width)?);
                b.extend(bias("attn_v", kv_width)?);
                Some(b)
            } else {
                None
            };
            let qk_norm = if shape.qk_norm {
                Some((
                    load_vector(file, &name("attn_q_norm"), head_dim)?,
                    load_vector(file, &name("attn_k_norm"), head_dim)?,
                ))
            } else {
                None
            };
            let qkv = if shape.fused_qkv {
                vec![load_matrix(
                    file,
                    pack,
                    &name("attn_qkv"),
                    q_width + 2 * kv_width,
                    hidden,
                )?]
            } else {
                let parts = vec![
                    load_matrix(file, pack, &name("attn_q"), q_width, hidden)?,
                    load_matrix(file, pack, &name("attn_k"), kv_width, hidden)?,
                    load_matrix(file, pack, &name("attn_v"), kv_width, hidden)?,
                ];
                // One matrix when the three share a format, so Q, K and V cost one product.
                match QMatrix::concat(parts) {
                    Ok(m) => vec![m],
                    Err(parts) => parts,
                }
            };
            let (gate, up) = if shape.fused_gate_up {
                let mut gu = load_row_blocks(file, pack, &name("ffn_up"), &[ffn, ffn], hidden)?;
                let up = gu
                    .pop()
                    .ok_or_else(|| tensor_err(&name("ffn_up"), "empty"))?;
                let gate = gu
                    .pop()
                    .ok_or_else(|| tensor_err(&name("ffn_up"), "empty"))?;
                (gate, up)
            } else {
                (
                    load_matrix(file, pack, &name("ffn_gate"), ffn, hidden)?,
                    load_matrix(file, pack, &name("ffn_up"), ffn, hidden)?,
                )
            };
            let post_norm = |s: &str| -> Result<Option<Vec<f32>>> {
                shape
                    .gemma
                    .is_some()
                    .then(|| load_vector(file, &name(s), hidden))
                    .transpose()
            };
            layers.push(Layer {
                attn_norm: load_vector(file, &name("attn_norm"), hidden)?,
                post_attn_norm: post_norm("post_attention_norm")?,
                post_ffn_norm: post_norm("post_ffw_norm")?,
                qkv,
                qkv_bias,
                qk_norm,
                rotates: shape.rotates(i),
                wo: load_matrix(file, pack, &name("attn_output"), hidden, q_width)?,
                ffn_norm: load_vector(file, &name("ffn_norm"), hidden)?,
                gate,
                up,
                down: load_matrix(file, pack, &name("ffn_down"), hidden, ffn)?,
            });
        }
        let threads = if threads == 0 {
            candle_core::utils::get_num_threads()
        } else {
            threads
        }
        .max(1);
        let pool = Pool::new(threads).map_err(|e| {
            ModelError::InvalidRequest(format!("cannot start inference threads: {e}"))
        })?;
        let weight_bytes: usize =
            layer_bytes(&layers) + output.bytes() + embeddings.as_ref().map_or(0, QMatrix::bytes);
        tracing::info!(
            ?isa,
            threads,
            layers = n_layer,
            weight_mib = weight_bytes / (1 << 20),
            output = ?output.format(),
            arch = %shape.arch,
            "CPU llama-family backend loaded"
        );
        let mut attention = Attention::new(dims, n_layer, max_seq, &shape.rope, threads);
        if let Some(g) = &shape.gemma {
            let windows = (0..n_layer).map(|i| shape.window(i)).collect();
            attention = attention.with_sliding_windows(windows, &g.local_rope);
        }
        Ok(Self {
            layers,
            embeddings,
            output,
            output_norm: load_vector(file, "output_norm.weight", hidden)?,
            attention,
            dims,
            hidden,
            ffn,
            eps: shape.eps,
            gate: if shape.gemma.is_some() {
                Gate::GeluTanh
            } else {
                Gate::Silu
            },
            embed_scale: shape.gemma.as_ref().map(|g| g.embed_scale),
            vocab,
            max_seq,
            len: 0,
            scratch: Scratch {
                tokens: 0,
                x: Vec::new(),
                qkv: Vec::new(),
                att: Vec::new(),
                ffn: Vec::new(),
                ffn_up: Vec::new(),
                post: Vec::new(),
                acts: QActs::new(hidden, layout, isa),
                acts_att: (q_width != hidden).then(|| QActs::new(q_width, layout, isa)),
                acts_ffn: QActs::new(ffn, layout, isa),
                logits: vec![0.0; vocab],
            },
            pool,
            isa,
        })
    }

    /// The instruction set the kernels use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Threads a matrix product runs on.
    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    fn reserve(&mut self, seq: usize) {
        let s = &mut self.scratch;
        if s.tokens >= seq {
            return;
        }
        s.tokens = seq;
        s.x.resize(seq * self.hidden, 0.0);
        s.qkv.resize(seq * self.dims.qkv_width(), 0.0);
        s.att
            .resize(seq * self.dims.n_head * self.dims.head_dim, 0.0);
        s.ffn.resize(seq * self.ffn, 0.0);
        s.ffn_up.resize(seq * self.ffn, 0.0);
        if self.layers.iter().any(|l| l.post_attn_norm.is_some()) {
            s.post.resize(seq * self.hidden, 0.0);
        }
        s.acts.reserve(seq);
        if let Some(a) = &mut s.acts_att {
            a.reserve(seq);
        }
        s.acts_ffn.reserve(seq);
    }
}

impl Transformer for CpuLlama {
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.run(tokens, 1)
    }

    fn forward_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.run(tokens, tokens.len())
    }

    fn cache_len(&self) -> usize {
        self.len
    }

    fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    fn max_seq_len(&self) -> usize {
        self.max_seq
    }

    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn weight_bytes_per_token(&self) -> Option<usize> {
        let layers = layer_bytes(&self.layers);
        // One embedding row when the embeddings are a matrix of their own; tied, it is the
        // output matrix, read whole anyway.
        let row = self
            .embeddings
            .as_ref()
            .map_or(0, |e| e.bytes() / self.vocab.max(1));
        Some(layers + self.output.bytes() + row)
    }
}

impl CpuLlama {
    /// Runs `tokens` through the model and returns the logits of the last `out_rows` of
    /// them (at most `tokens.len()`), position after position.
    fn run(&mut self, tokens: &[u32], out_rows: usize) -> Result<Vec<f32>> {
        let seq = tokens.len();
        let pos = self.len;
        crate::arch::check_input(tokens, pos, self.max_seq, self.vocab)?;
        self.reserve(seq);
        let (hidden, eps, isa) = (self.hidden, self.eps, self.isa);
        let qkv_width = self.dims.qkv_width();
        let embeddings = self.embeddings.as_ref().unwrap_or(&self.output);
        let s = &mut self.scratch;
        let pool = &self.pool;
        for (c, &t) in tokens.iter().enumerate() {
            let row = &mut s.x[c * hidden..(c + 1) * hidden];
            embeddings.dequantize_row(t as usize, row);
            if let Some(f) = self.embed_scale {
                row.iter_mut().for_each(|v| *v *= f);
            }
        }
        for (li, layer) in self.layers.iter().enumerate() {
            quant::quantize(pool, &s.x, seq, Some((&layer.attn_norm, eps)), &mut s.acts);
            let mut col = 0;
            for part in &layer.qkv {
                let rows = part.rows();
                quant::matmul(
                    pool,
                    isa,
                    part,
                    &s.acts,
                    seq,
                    &mut s.qkv[col..],
                    qkv_width,
                    Epilogue::Store,
                );
                col += rows;
            }
            if let Some(bias) = &layer.qkv_bias {
                for row in s.qkv[..seq * qkv_width].chunks_exact_mut(qkv_width) {
                    row.iter_mut().zip(bias).for_each(|(x, b)| *x += b);
                }
            }
            let qk_norm = layer
                .qk_norm
                .as_ref()
                .map(|(q, k)| (q.as_slice(), k.as_slice(), eps));
            self.attention
                .store(li, &mut s.qkv, seq, pos, qk_norm, layer.rotates);
            self.attention
                .attend(pool, li, &s.qkv, seq, pos, &mut s.att);
            let att_acts = s.acts_att.as_mut().unwrap_or(&mut s.acts);
            quant::quantize(pool, &s.att, seq, None, att_acts);
            residual(
                pool,
                isa,
                &layer.wo,
                att_acts,
                seq,
                &mut s.x,
                (layer.post_attn_norm.as_deref(), eps, &mut s.post),
            );
            quant::quantize(pool, &s.x, seq, Some((&layer.ffn_norm, eps)), &mut s.acts);
            quant::gated(
                pool,
                isa,
                self.gate,
                &layer.gate,
                &layer.up,
                &s.acts,
                seq,
                &mut s.ffn,
                &mut s.ffn_up,
            );
            quant::quantize(pool, &s.ffn, seq, None, &mut s.acts_ffn);
            residual(
                pool,
                isa,
                &layer.down,
                &s.acts_ffn,
                seq,
                &mut s.x,
                (layer.post_ffn_norm.as_deref(), eps, &mut s.post),
            );
        }
        self.len = pos + seq;
        // Generation needs only the last position's logits; scoring needs them all.
        let rows = out_rows.clamp(1, seq);
        let tail = &s.x[(seq - rows) * hidden..seq * hidden];
        quant::quantize(
            pool,
            tail,
            rows,
            Some((&self.output_norm, eps)),
            &mut s.acts,
        );
        s.logits.resize(rows * self.vocab, 0.0);
        quant::matmul(
            pool,
            isa,
            &self.output,
            &s.acts,
            rows,
            &mut s.logits,
            self.vocab,
            Epilogue::Store,
        );
        Ok(s.logits.clone())
    }
}

/// Adds `w · acts` to the residual stream `x` (`seq` rows of `w.rows()` values), through an
/// RMSNorm with `post.0`'s weights first when there is one (gemma3), using `post.2` as room
/// for the unnormalised product.
fn residual(
    pool: &Pool,
    isa: Isa,
    w: &QMatrix,
    acts: &QActs,
    seq: usize,
    x: &mut [f32],
    post: (Option<&[f32]>, f32, &mut [f32]),
) {
    let hidden = w.rows();
    match post {
        (None, ..) => quant::matmul(pool, isa, w, acts, seq, x, hidden, Epilogue::Add),
        (Some(norm), eps, buf) => {
            quant::matmul(pool, isa, w, acts, seq, buf, hidden, Epilogue::Store);
            for (y, x) in buf[..seq * hidden]
                .chunks_exact(hidden)
                .zip(x.chunks_exact_mut(hidden))
            {
                let g = ops::rms_gain(y, eps);
                for ((x, &y), &n) in x.iter_mut().zip(y).zip(norm) {
                    *x += y * g * n;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
