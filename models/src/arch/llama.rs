//! Llama-family decoder (Llama 2/3, SmolLM, Mistral-style GQA) from GGUF.
//!
//! GGUF stores the Q and K projections of llama models permuted for the interleaved
//! ("normal") rotary layout, so rotations pair adjacent dimensions (`rope_i`).

use candle_core::quantized::QMatMul;
use candle_core::{Device, Module, Tensor};

use super::common::{
    attention, attention_mask, last_logits, linear, norm_weight, rope_tables, KvCache, Projection,
};
use super::{md_f32_or, md_u32, Transformer};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;

struct Layer {
    attn_norm: Tensor,
    qkv: Projection,
    wo: QMatMul,
    ffn_norm: Tensor,
    gate_up: Projection,
    down: QMatMul,
    cache: KvCache,
}

/// A llama model with its KV cache.
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
    vocab: usize,
    max_seq: usize,
    device: Device,
}

impl Llama {
    /// Loads weights from a GGUF file whose `general.architecture` is `llama`.
    pub fn load(file: &GgufFile, device: &Device, max_seq_len: usize) -> Result<Self> {
        let ct = file.content();
        let n_head = md_u32(ct, "llama.attention.head_count")? as usize;
        let n_kv_head = md_u32(ct, "llama.attention.head_count_kv")? as usize;
        let n_layer = md_u32(ct, "llama.block_count")? as usize;
        let hidden = md_u32(ct, "llama.embedding_length")? as usize;
        let ctx = md_u32(ct, "llama.context_length").unwrap_or(4096) as usize;
        let eps = md_f32_or(ct, "llama.attention.layer_norm_rms_epsilon", 1e-5)?;
        let base = md_f32_or(ct, "llama.rope.freq_base", 10_000.0)?;
        if n_head == 0
            || n_kv_head == 0
            || !n_head.is_multiple_of(n_kv_head)
            || !hidden.is_multiple_of(n_head)
        {
            return Err(ModelError::Metadata {
                key: "llama.attention.head_count".into(),
                reason: format!(
                    "{n_head} heads / {n_kv_head} kv heads / width {hidden} are inconsistent"
                ),
            });
        }
        let head_dim = hidden / n_head;
        let rot_dim = md_u32(ct, "llama.rope.dimension_count")
            .map(|d| d as usize)
            .unwrap_or(head_dim);
        if rot_dim != head_dim {
            return Err(ModelError::Metadata {
                key: "llama.rope.dimension_count".into(),
                reason: format!(
                    "partial rotary embeddings ({rot_dim} of {head_dim}) are not supported"
                ),
            });
        }
        let max_seq = max_seq_len.min(ctx).max(1);
        let (cos, sin) = rope_tables(rot_dim, base, 1.0, max_seq, device)?;

        let embeddings = file.tensor("token_embd.weight", device)?;
        let vocab = embeddings.shape().dims()[0];
        let output = if file.has_tensor("output.weight") {
            linear(file, "output.weight", device)?
        } else {
            QMatMul::from_qtensor(file.tensor("token_embd.weight", device)?)?
        };
        let mut layers = Vec::with_capacity(n_layer);
        for i in 0..n_layer {
            let p = |s: &str| format!("blk.{i}.{s}.weight");
            layers.push(Layer {
                attn_norm: norm_weight(file, &p("attn_norm"), device)?,
                qkv: Projection::load(file, &[p("attn_q"), p("attn_k"), p("attn_v")], device)?,
                wo: linear(file, &p("attn_output"), device)?,
                ffn_norm: norm_weight(file, &p("ffn_norm"), device)?,
                gate_up: Projection::load(file, &[p("ffn_gate"), p("ffn_up")], device)?,
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
            eps,
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
            let qkv = layer.qkv.forward(&xn)?;
            let q = qkv[0]
                .reshape((1, seq, h, d))?
                .transpose(1, 2)?
                .contiguous()?;
            let k = qkv[1]
                .reshape((1, seq, kvh, d))?
                .transpose(1, 2)?
                .contiguous()?;
            let v = qkv[2].reshape((1, seq, kvh, d))?.transpose(1, 2)?;
            let q = candle_nn::rotary_emb::rope_i(&q, &cos, &sin)?;
            let k = candle_nn::rotary_emb::rope_i(&k, &cos, &sin)?;
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
