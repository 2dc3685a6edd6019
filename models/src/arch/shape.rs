//! The llama-shaped family: pre-norm decoder blocks with RMSNorm, rotary attention over
//! grouped KV heads and a gated feed-forward (SwiGLU; GELU for gemma3), in the GGUF tensor
//! layout llama.cpp uses.
//!
//! Its members differ only in details this module reads once from the file:
//! - `llama` (Llama 2/3, SmolLM2, Mistral): rotation of adjacent pairs (the converter
//!   permutes Q and K for it), optional per-dimension rotary frequency factors
//!   (`rope_freqs.weight`, Llama 3.1/3.2's long-context scaling) and optional linear scaling;
//! - `qwen2` (Qwen2, Qwen2.5): biases on Q, K and V, rotation of the two halves of a head;
//! - `qwen3`: no biases, an RMSNorm over every query and key head before the rotation, and a
//!   head width of its own (`attention.key_length`, not model width / heads);
//! - `smollm3`: as `llama`, but every fourth layer has no rotary embedding at all (NoPE);
//! - `phi3` (Phi-3, Phi-3.5, Phi-4-mini): Q, K and V in one matrix (`attn_qkv`), gate and up
//!   in one (`ffn_up`, gate first), rotation of head halves over only part of a head
//!   (Phi-4-mini rotates 96 of 128 values), LongRoPE's short and long frequency factors
//!   (`rope_factors_{short,long}.weight`, the long ones when the context is longer than the
//!   original) and an attention factor that scales the rotation (`rope.scaling.attn_factor`).
//!
//! So one implementation per backend runs them all: [`super::cpu::CpuLlama`] on the CPU
//! kernels, and on candle [`super::llama::Llama`] for the members of [`FAMILY`] and
//! [`super::gemma3::Gemma3`] for gemma3.

use candle_core::quantized::gguf_file;

use super::{md_f32_or, md_u32};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;

/// Values of `general.architecture` that are llama-shaped and run on candle as
/// [`super::llama::Llama`] (gemma3 is read here too, but has a candle implementation of its
/// own).
pub const FAMILY: &[&str] = &["llama", "smollm3", "qwen2", "qwen3", "phi3"];

/// Which dimensions of a head the rotary embedding rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Dimensions `2i` and `2i + 1` (llama.cpp's "normal" rope, candle's `rope_i`).
    Interleaved,
    /// Dimensions `i` and `i + d/2` (llama.cpp's NeoX rope, candle's `rope`).
    Halves,
}

/// How positions become rotation angles: angle = position / `linear` · base^(−2i/d) /
/// `factors[i]`, for the first `dims` values of a head; cosines and sines are multiplied by
/// `attn_factor`.
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    /// Which dimensions rotate together.
    pub style: RopeStyle,
    /// How many values of a head rotate (the rest pass through).
    pub dims: usize,
    /// `rope.freq_base`.
    pub base: f32,
    /// Linear position scaling (`rope.scaling.type = linear`, or gemma3's
    /// `rope.scaling.factor` written without a type), 1 when none.
    pub linear: f32,
    /// Per-pair frequency divisors (`rope_freqs.weight`, or LongRoPE's factors for the
    /// context in use; `dims/2` values), when the file has them.
    pub factors: Option<Vec<f32>>,
    /// Scale of the cosines and sines (so of queries and keys), 1 unless the file sets
    /// `rope.scaling.attn_factor`.
    pub attn_factor: f32,
}

impl Rope {
    /// Cosine and sine tables, `max_seq × dims/2` values each, row-major by position.
    /// Computed in f64 so that every backend rotates by exactly the same angles.
    pub(crate) fn tables(&self, max_seq: usize) -> (Vec<f32>, Vec<f32>) {
        let half = self.dims / 2;
        let freqs: Vec<f64> = (0..half)
            .map(|i| {
                let f = 1f64 / (self.base as f64).powf(2.0 * i as f64 / self.dims as f64);
                let divisor = self
                    .factors
                    .as_ref()
                    .and_then(|fs| fs.get(i))
                    .map_or(1.0, |&x| x as f64);
                f / divisor
            })
            .collect();
        let mut cos = Vec::with_capacity(max_seq * half);
        let mut sin = Vec::with_capacity(max_seq * half);
        for pos in 0..max_seq {
            for f in &freqs {
                let angle = pos as f64 / self.linear as f64 * f;
                cos.push((angle.cos() * self.attn_factor as f64) as f32);
                sin.push((angle.sin() * self.attn_factor as f64) as f32);
            }
        }
        (cos, sin)
    }
}

/// Everything that tells the members of the family apart, read and checked once.
#[derive(Clone, Debug)]
pub struct LlamaShape {
    /// `general.architecture`, also the prefix of the model's metadata keys.
    pub arch: String,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_kv: usize,
    /// Decoder blocks.
    pub n_layer: usize,
    /// Model (residual stream) width.
    pub hidden: usize,
    /// Feed-forward width.
    pub ffn: usize,
    /// Width of one attention head.
    pub head_dim: usize,
    /// Positions the model is loaded for: the caller's limit, capped by the trained context.
    pub max_seq: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// Rotary embedding.
    pub rope: Rope,
    /// Q, K and V have biases (`blk.N.attn_{q,k,v}.bias`).
    pub qkv_bias: bool,
    /// Query and key heads are RMS-normalised before the rotation
    /// (`blk.N.attn_{q,k}_norm.weight`).
    pub qk_norm: bool,
    /// Q, K and V are one matrix (`blk.N.attn_qkv.weight`).
    pub fused_qkv: bool,
    /// Gate and up are one matrix of twice the feed-forward width (`blk.N.ffn_up.weight`,
    /// gate rows first) and there is no `ffn_gate`.
    pub fused_gate_up: bool,
    /// Layers `step − 1, 2·step − 1, …` skip the rotary embedding (smollm3: 4); 0 when
    /// every layer rotates.
    pub no_rope_step: usize,
    /// Gemma 3's differences from the llama layout, when the file is `gemma3`.
    pub gemma: Option<GemmaShape>,
}

/// What a `gemma3` file adds to the llama-shaped layout.
#[derive(Clone, Debug)]
pub struct GemmaShape {
    /// Positions a sliding-window layer attends to (its own and the `window − 1` before).
    pub window: usize,
    /// The rotary embedding of the sliding-window layers (the global layers use
    /// [`LlamaShape::rope`]).
    pub local_rope: Rope,
    /// Factor the token embeddings are multiplied by: `sqrt(width)`.
    pub embed_scale: f32,
}

/// Every sixth layer of Gemma 3 (the 6th, 12th, …) attends globally; the others use the
/// sliding window (as llama.cpp and the reference implementation fix it for `gemma3`).
const GEMMA_SWA_PATTERN: usize = 6;
/// Rotary base of Gemma 3's sliding-window layers.
const GEMMA_LOCAL_ROPE_BASE: f32 = 10_000.0;

fn metadata_err(key: &str, reason: impl Into<String>) -> ModelError {
    ModelError::Metadata {
        key: key.to_string(),
        reason: reason.into(),
    }
}

fn md_string(ct: &gguf_file::Content, key: &str) -> Result<Option<String>> {
    match ct.metadata.get(key) {
        None => Ok(None),
        Some(v) => v
            .to_string()
            .map(|s| Some(s.clone()))
            .map_err(|e| metadata_err(key, e.to_string())),
    }
}

/// A 1-D f32 tensor of `len` positive, finite values (rotary frequency factors).
fn factor_tensor(file: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>> {
    let t = file.tensor(name, &candle_core::Device::Cpu)?;
    let v = t
        .dequantize(&candle_core::Device::Cpu)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    if v.len() != len || v.iter().any(|&x| !(x.is_finite() && x > 0.0)) {
        return Err(ModelError::Tensor {
            name: name.into(),
            reason: format!(
                "expected {len} positive frequency factors, found {} values",
                v.len()
            ),
        });
    }
    Ok(v)
}

impl LlamaShape {
    /// Reads the shape of a llama-shaped file, to be run for at most `max_seq_len`
    /// positions (which picks LongRoPE's factors); errors name the key or tensor at fault.
    pub fn read(file: &GgufFile, max_seq_len: usize) -> Result<Self> {
        let arch = file.architecture()?;
        let style = match arch.as_str() {
            "llama" | "smollm3" => RopeStyle::Interleaved,
            "qwen2" | "qwen3" | "phi3" | "gemma3" => RopeStyle::Halves,
            _ => return Err(ModelError::UnsupportedArchitecture(arch)),
        };
        let ct = file.content();
        let key = |k: &str| format!("{arch}.{k}");
        let n_head = md_u32(ct, &key("attention.head_count"))? as usize;
        let n_kv = match ct.metadata.get(&key("attention.head_count_kv")) {
            None => n_head,
            Some(_) => md_u32(ct, &key("attention.head_count_kv"))? as usize,
        };
        let n_layer = md_u32(ct, &key("block_count"))? as usize;
        let hidden = md_u32(ct, &key("embedding_length"))? as usize;
        let ffn = md_u32(ct, &key("feed_forward_length"))? as usize;
        let gemma = arch == "gemma3";
        let ctx = md_u32(ct, &key("context_length")).unwrap_or(if gemma { 32_768 } else { 4096 })
            as usize;
        let eps = md_f32_or(
            ct,
            &key("attention.layer_norm_rms_epsilon"),
            if gemma { 1e-6 } else { 1e-5 },
        )?;
        let base = md_f32_or(
            ct,
            &key("rope.freq_base"),
            if gemma { 1_000_000.0 } else { 10_000.0 },
        )?;
        if n_head == 0 || n_kv == 0 || !n_head.is_multiple_of(n_kv) {
            return Err(metadata_err(
                &key("attention.head_count"),
                format!("{n_head} heads and {n_kv} kv heads are inconsistent"),
            ));
        }
        let head_dim = match ct.metadata.get(&key("attention.key_length")) {
            Some(_) => md_u32(ct, &key("attention.key_length"))? as usize,
            None if hidden.is_multiple_of(n_head) => hidden / n_head,
            None => {
                return Err(metadata_err(
                    &key("embedding_length"),
                    format!("width {hidden} is not a multiple of {n_head} heads"),
                ))
            }
        };
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(metadata_err(
                &key("attention.key_length"),
                format!("head width {head_dim} must be even and positive"),
            ));
        }
        if let Some(v) = ct.metadata.get(&key("attention.value_length")) {
            let v = v
                .to_u32()
                .map_err(|e| metadata_err(&key("attention.value_length"), e.to_string()))?;
            if v as usize != head_dim {
                return Err(metadata_err(
                    &key("attention.value_length"),
                    format!("value heads of width {v} differ from key heads of {head_dim}"),
                ));
            }
        }
        let rot_dim = md_u32(ct, &key("rope.dimension_count"))
            .map(|d| d as usize)
            .unwrap_or(head_dim);
        if rot_dim == 0 || rot_dim > head_dim || !rot_dim.is_multiple_of(2) {
            return Err(metadata_err(
                &key("rope.dimension_count"),
                format!("{rot_dim} rotary dimensions do not fit a head of {head_dim}"),
            ));
        }
        if rot_dim != head_dim && style == RopeStyle::Interleaved {
            return Err(metadata_err(
                &key("rope.dimension_count"),
                format!(
                    "partial rotary embeddings ({rot_dim} of {head_dim}) need the halves layout"
                ),
            ));
        }
        let max_seq = max_seq_len.min(ctx).max(1);
        let has_long = file.has_tensor("rope_factors_long.weight");
        let linear = match md_string(ct, &key("rope.scaling.type"))?.as_deref() {
            // Gemma 3's converter writes the global layers' linear factor without a type.
            None if gemma => md_f32_or(ct, &key("rope.scaling.factor"), 1.0)?.max(1.0),
            None | Some("none") => 1.0,
            Some("linear") => md_f32_or(ct, &key("rope.scaling.factor"), 1.0)?.max(1.0),
            Some("longrope") if has_long => 1.0,
            Some(other) => {
                return Err(metadata_err(
                    &key("rope.scaling.type"),
                    format!("rope scaling `{other}` is not supported (none, linear, and longrope with its factor tensors are)"),
                ))
            }
        };
        let attn_factor = md_f32_or(ct, &key("rope.scaling.attn_factor"), 1.0)?;
        if !(attn_factor.is_finite() && attn_factor > 0.0) {
            return Err(metadata_err(
                &key("rope.scaling.attn_factor"),
                format!("{attn_factor} is not a positive number"),
            ));
        }
        let half = rot_dim / 2;
        let factors = if file.has_tensor("rope_freqs.weight") {
            Some(factor_tensor(file, "rope_freqs.weight", half)?)
        } else if has_long || file.has_tensor("rope_factors_short.weight") {
            // As llama.cpp: the long factors once the context exceeds the original one.
            let original = match ct
                .metadata
                .get(&key("rope.scaling.original_context_length"))
            {
                Some(_) => md_u32(ct, &key("rope.scaling.original_context_length"))? as usize,
                None => ctx,
            };
            let name = if max_seq > original {
                "rope_factors_long.weight"
            } else {
                "rope_factors_short.weight"
            };
            Some(factor_tensor(file, name, half)?)
        } else {
            None
        };
        let qkv_bias = file.has_tensor("blk.0.attn_q.bias");
        let qk_norm = file.has_tensor("blk.0.attn_q_norm.weight");
        let fused_qkv = file.has_tensor("blk.0.attn_qkv.weight");
        let fused_gate_up = !file.has_tensor("blk.0.ffn_gate.weight");
        if (arch == "qwen3" || gemma) && !qk_norm {
            return Err(ModelError::Tensor {
                name: "blk.0.attn_q_norm.weight".into(),
                reason: format!("missing ({arch} normalises query and key heads)"),
            });
        }
        let gemma = if gemma {
            if fused_qkv || fused_gate_up || qkv_bias {
                return Err(metadata_err(
                    "general.architecture",
                    "a gemma3 file has separate Q, K, V, gate and up matrices and no biases",
                ));
            }
            let window = md_u32(ct, &key("attention.sliding_window"))? as usize;
            if window == 0 {
                return Err(metadata_err(
                    &key("attention.sliding_window"),
                    "a sliding window of 0 positions",
                ));
            }
            Some(GemmaShape {
                window,
                local_rope: Rope {
                    style,
                    dims: rot_dim,
                    base: GEMMA_LOCAL_ROPE_BASE,
                    linear: 1.0,
                    factors: None,
                    attn_factor: 1.0,
                },
                embed_scale: (hidden as f32).sqrt(),
            })
        } else {
            None
        };
        Ok(Self {
            n_head,
            n_kv,
            n_layer,
            hidden,
            ffn,
            head_dim,
            max_seq,
            eps,
            rope: Rope {
                style,
                dims: rot_dim,
                base,
                linear,
                factors,
                attn_factor,
            },
            qkv_bias,
            qk_norm,
            fused_qkv,
            fused_gate_up,
            // As llama.cpp, which fixes SmolLM3's step rather than reading it.
            no_rope_step: if arch == "smollm3" { 4 } else { 0 },
            gemma,
            arch,
        })
    }

    /// Width of all query heads together.
    pub fn q_width(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of all key (or value) heads together.
    pub fn kv_width(&self) -> usize {
        self.n_kv * self.head_dim
    }

    /// Whether layer `layer` rotates its queries and keys.
    pub fn rotates(&self, layer: usize) -> bool {
        self.no_rope_step == 0 || !(layer + 1).is_multiple_of(self.no_rope_step)
    }

    /// The sliding window layer `layer` attends within, if it has one (Gemma 3's local
    /// layers); `None` for global attention.
    pub fn window(&self, layer: usize) -> Option<usize> {
        self.gemma
            .as_ref()
            .filter(|_| !(layer + 1).is_multiple_of(GEMMA_SWA_PATTERN))
            .map(|g| g.window)
    }

    /// Names of layer `i`'s 2-D weight matrices as the file stores them.
    pub fn layer_matrices(&self, i: usize) -> Vec<String> {
        let mut names = Vec::with_capacity(7);
        if self.fused_qkv {
            names.push("attn_qkv");
        } else {
            names.extend(["attn_q", "attn_k", "attn_v"]);
        }
        names.push("attn_output");
        if !self.fused_gate_up {
            names.push("ffn_gate");
        }
        names.extend(["ffn_up", "ffn_down"]);
        names
            .into_iter()
            .map(|n| format!("blk.{i}.{n}.weight"))
            .collect()
    }
}
