//! The llama-shaped family on candle (Llama 2/3, SmolLM2, Mistral-style GQA, Qwen2/2.5,
//! Qwen3, Phi-3/3.5/4-mini; [`super::shape`] says how they differ).
//!
//! GGUF stores the Q and K projections of `llama` models permuted for the interleaved
//! ("normal") rotary layout, so rotations pair adjacent dimensions (`rope_i`); the Qwen
//! models rotate the two halves of each head (`rope`).

use candle_core::quantized::QMatMul;
use candle_core::{Device, Module, Tensor};

use super::common::{
    attention, attention_mask, last_logits, linear, norm_weight, KvCache, Projection,
};
use super::shape::{LlamaShape, RopeStyle};
use super::Transformer;
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;

struct Layer {
    attn_norm: Tensor,
    qkv: Projection,
    /// Biases of Q, K and V, when the model has them (qwen2).
    qkv_bias: Option<[Tensor; 3]>,
    /// RMSNorm weights of every query and key head (qwen3).
    qk_norm: Option<(Tensor, Tensor)>,
    /// The layer applies the rotary embedding (not one of smollm3's NoPE layers).
    rotates: bool,
    wo: QMatMul,
    ffn_norm: Tensor,
    gate_up: Projection,
    down: QMatMul,
    cache: KvCache,
}

/// A llama-shaped model with its KV cache.
pub struct Llama {
    embeddings: candle_core::quantized::QTensor,
    layers: Vec<Layer>,
    norm: Tensor,
    output: QMatMul,
    cos: Tensor,
    sin: Tensor,
    n_head: usize,
    n_kv_head: usize,
    head_dim: usize,
    eps: f32,
    rope: RopeStyle,
    /// Rotated values per head (the rest of a head passes through).
    rot_dim: usize,
    vocab: usize,
    max_seq: usize,
    device: Device,
}

impl Llama {
    /// Loads weights from a GGUF file whose architecture is one of [`super::shape::FAMILY`].
    pub fn load(file: &GgufFile, device: &Device, max_seq_len: usize) -> Result<Self> {
        let shape = LlamaShape::read(file, max_seq_len)?;
        if shape.gemma.is_some() {
            // Gemma 3's post-norms, GELU gate and windows are `super::gemma3::Gemma3`'s.
            return Err(ModelError::UnsupportedArchitecture(shape.arch));
        }
        let (n_head, n_kv_head, head_dim) = (shape.n_head, shape.n_kv, shape.head_dim);
        let (max_seq, rot_dim) = (shape.max_seq, shape.rope.dims);
        let (cos, sin) = shape.rope.tables(max_seq);
        let cos = Tensor::from_vec(cos, (max_seq, rot_dim / 2), device)?;
        let sin = Tensor::from_vec(sin, (max_seq, rot_dim / 2), device)?;
        let (q_width, kv_width) = (shape.q_width(), shape.kv_width());

        let embeddings = file.tensor("token_embd.weight", device)?;
        let vocab = embeddings.shape().dims()[0];
        let output = if file.has_tensor("output.weight") {
            linear(file, "output.weight", device)?
        } else {
            QMatMul::from_qtensor(file.tensor("token_embd.weight", device)?)?
        };
        let mut layers = Vec::with_capacity(shape.n_layer);
        for i in 0..shape.n_layer {
            let p = |s: &str| format!("blk.{i}.{s}.weight");
            let bias = |s: &str| norm_weight(file, &format!("blk.{i}.{s}.bias"), device);
            let qkv_bias = if shape.qkv_bias {
                Some([bias("attn_q")?, bias("attn_k")?, bias("attn_v")?])
            } else {
                None
            };
            let qk_norm = if shape.qk_norm {
                Some((
                    norm_weight(file, &p("attn_q_norm"), device)?,
                    norm_weight(file, &p("attn_k_norm"), device)?,
                ))
            } else {
                None
            };
            layers.push(Layer {
                attn_norm: norm_weight(file, &p("attn_norm"), device)?,
                qkv: if shape.fused_qkv {
                    Projection::split(
                        file,
                        &p("attn_qkv"),
                        vec![q_width, kv_width, kv_width],
                        device,
                    )?
                } else {
                    Projection::load(file, &[p("attn_q"), p("attn_k"), p("attn_v")], device)?
                },
                qkv_bias,
                qk_norm,
                rotates: shape.rotates(i),
                wo: linear(file, &p("attn_output"), device)?,
                ffn_norm: norm_weight(file, &p("ffn_norm"), device)?,
                gate_up: if shape.fused_gate_up {
                    Projection::split(file, &p("ffn_up"), vec![shape.ffn, shape.ffn], device)?
                } else {
                    Projection::load(file, &[p("ffn_gate"), p("ffn_up")], device)?
                },
                down: linear(file, &p("ffn_down"), device)?,
                cache: KvCache::new(n_kv_head, head_dim, max_seq, device)?,
            });
        }
        Ok(Self {
            embeddings,
            layers,
            norm: norm_weight(file, "output_norm.weight", device)?,
            output,
            cos,
            sin,
            n_head,
            n_kv_head,
            head_dim,
            eps: shape.eps,
            rope: shape.rope.style,
            rot_dim,
            vocab,
            max_seq,
            device: device.clone(),
        })
    }
}

impl Transformer for Llama {
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let seq = tokens.len();
        let pos = self.cache_len();
        super::check_input(tokens, pos, self.max_seq, self.vocab)?;
        let ids = Tensor::new(tokens, &self.device)?;
        let mut x = self.embeddings.embedding(&ids)?.unsqueeze(0)?; // (1, seq, hidden)
        let cos = self.cos.narrow(0, pos, seq)?;
        let sin = self.sin.narrow(0, pos, seq)?;
        let n_rep = self.n_head / self.n_kv_head;
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        let (h, kvh, d) = (self.n_head, self.n_kv_head, self.head_dim);
        for layer in &mut self.layers {
            let residual = &x;
            let xn = candle_nn::ops::rms_norm(&x, &layer.attn_norm, self.eps)?;
            let mut qkv = layer.qkv.forward(&xn)?;
            if let Some(bias) = &layer.qkv_bias {
                for (part, b) in qkv.iter_mut().zip(bias) {
                    *part = part.broadcast_add(b)?;
                }
            }
            let q = qkv[0]
                .reshape((1, seq, h, d))?
                .transpose(1, 2)?
                .contiguous()?;
            let k = qkv[1]
                .reshape((1, seq, kvh, d))?
                .transpose(1, 2)?
                .contiguous()?;
            let v = qkv[2].reshape((1, seq, kvh, d))?.transpose(1, 2)?;
            let (q, k) = match &layer.qk_norm {
                Some((qn, kn)) => (
                    candle_nn::ops::rms_norm(&q, qn, self.eps)?,
                    candle_nn::ops::rms_norm(&k, kn, self.eps)?,
                ),
                None => (q, k),
            };
            let rotate = match self.rope {
                RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i,
                RopeStyle::Halves => candle_nn::rotary_emb::rope,
            };
            let (q, k) = if !layer.rotates {
                (q, k)
            } else if self.rot_dim == d {
                (rotate(&q, &cos, &sin)?, rotate(&k, &cos, &sin)?)
            } else {
                // Partial rotary: the first `rot_dim` values of a head turn, the rest pass.
                let part = |t: &Tensor| -> Result<Tensor> {
                    let turned = rotate(&t.narrow(3, 0, self.rot_dim)?.contiguous()?, &cos, &sin)?;
                    let rest = t.narrow(3, self.rot_dim, d - self.rot_dim)?;
                    Ok(Tensor::cat(&[&turned, &rest], 3)?)
                };
                (part(&q)?, part(&k)?)
            };
            let (k, v, key_start) = layer.cache.append(&k, &v, None)?;
            let mask = if seq > 1 {
                Some(attention_mask(
                    seq,
                    pos,
                    key_start,
                    n_rep,
                    None,
                    &self.device,
                )?)
            } else {
                None
            };
            let y = attention(&q, &k, &v, mask.as_ref(), scale)?;
            let x1 = (layer.wo.forward(&y)? + residual)?;
            let xn = candle_nn::ops::rms_norm(&x1, &layer.ffn_norm, self.eps)?;
            let gu = layer.gate_up.forward(&xn)?;
            let act = candle_nn::ops::silu(&gu[0])?.mul(&gu[1])?;
            x = (layer.down.forward(&act)? + x1)?;
        }
        let last = x.narrow(1, seq - 1, 1)?;
        let last = candle_nn::ops::rms_norm(&last, &self.norm, self.eps)?;
        last_logits(&self.output.forward(&last)?)
    }

    fn cache_len(&self) -> usize {
        self.layers.first().map_or(0, |l| l.cache.len())
    }

    fn truncate(&mut self, len: usize) {
        for l in &mut self.layers {
            l.cache.truncate(len);
        }
    }

    fn max_seq_len(&self) -> usize {
        self.max_seq
    }

    fn vocab_size(&self) -> usize {
        self.vocab
    }
}
