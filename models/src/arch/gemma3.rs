//! Gemma 3 decoder from GGUF: QK-norm, sandwich norms around attention and MLP, GELU MLP,
//! interleaved sliding-window (local) and global attention layers with their own rotary
//! bases, and embeddings scaled by `sqrt(hidden)`. Norm weights in GGUF files already
//! include Gemma's `+1` offset, so they are used as stored.

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};

use super::common::{
    attention, attention_mask, last_logits, linear, norm_weight, rope_tables, KvCache, Projection,
};
use super::{md_f32_or, md_u32, Transformer};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;

/// Every `SWA_PATTERN`-th layer is global; the others use the sliding window.
const SWA_PATTERN: usize = 6;
const LOCAL_ROPE_BASE: f32 = 10_000.0;

struct Layer {
    attn_norm: Tensor,
    qkv: Projection,
    q_norm: Tensor,
    k_norm: Tensor,
    wo: QMatMul,
    post_attn_norm: Tensor,
    ffn_norm: Tensor,
    gate_up: Projection,
    down: QMatMul,
    post_ffn_norm: Tensor,
    window: Option<usize>,
    cache: KvCache,
}

/// A Gemma 3 model with its KV cache.
pub struct Gemma3 {
    embeddings: QTensor,
    layers: Vec<Layer>,
    norm: Tensor,
    output: QMatMul,
    local_rope: (Tensor, Tensor),
    global_rope: (Tensor, Tensor),
    n_head: usize,
    n_kv_head: usize,
    head_dim: usize,
    hidden: usize,
    eps: f32,
    vocab: usize,
    max_seq: usize,
    device: Device,
}

impl Gemma3 {
    /// Loads weights from a GGUF file whose `general.architecture` is `gemma3`.
    pub fn load(file: &GgufFile, device: &Device, max_seq_len: usize) -> Result<Self> {
        let ct = file.content();
        let n_head = md_u32(ct, "gemma3.attention.head_count")? as usize;
        let n_kv_head = md_u32(ct, "gemma3.attention.head_count_kv")? as usize;
        let n_layer = md_u32(ct, "gemma3.block_count")? as usize;
        let hidden = md_u32(ct, "gemma3.embedding_length")? as usize;
        let head_dim = md_u32(ct, "gemma3.attention.key_length")? as usize;
        let ctx = md_u32(ct, "gemma3.context_length").unwrap_or(32_768) as usize;
        let window = md_u32(ct, "gemma3.attention.sliding_window")? as usize;
        let eps = md_f32_or(ct, "gemma3.attention.layer_norm_rms_epsilon", 1e-6)?;
        let global_base = md_f32_or(ct, "gemma3.rope.freq_base", 1_000_000.0)?;
        let scaling = md_f32_or(ct, "gemma3.rope.scaling.factor", 1.0)?;
        if n_head == 0
            || n_kv_head == 0
            || !n_head.is_multiple_of(n_kv_head)
            || !head_dim.is_multiple_of(2)
        {
            return Err(ModelError::Metadata {
                key: "gemma3.attention.head_count".into(),
                reason: format!("{n_head} heads / {n_kv_head} kv heads / head width {head_dim} are inconsistent"),
            });
        }
        let max_seq = max_seq_len.min(ctx).max(1);
        // Global layers may use linear rope scaling; local layers never do.
        let global_rope = rope_tables(head_dim, global_base, scaling.max(1.0), max_seq, device)?;
        let local_rope = rope_tables(head_dim, LOCAL_ROPE_BASE, 1.0, max_seq, device)?;

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
            let sliding = (i + 1) % SWA_PATTERN != 0;
            layers.push(Layer {
                attn_norm: norm_weight(file, &p("attn_norm"), device)?,
                qkv: Projection::load(file, &[p("attn_q"), p("attn_k"), p("attn_v")], device)?,
                q_norm: norm_weight(file, &p("attn_q_norm"), device)?,
                k_norm: norm_weight(file, &p("attn_k_norm"), device)?,
                wo: linear(file, &p("attn_output"), device)?,
                post_attn_norm: norm_weight(file, &p("post_attention_norm"), device)?,
                ffn_norm: norm_weight(file, &p("ffn_norm"), device)?,
                gate_up: Projection::load(file, &[p("ffn_gate"), p("ffn_up")], device)?,
                down: linear(file, &p("ffn_down"), device)?,
                post_ffn_norm: norm_weight(file, &p("post_ffw_norm"), device)?,
                window: sliding.then_some(window),
                cache: KvCache::new(n_kv_head, head_dim, max_seq, device)?,
            });
        }
        Ok(Self {
            embeddings,
            layers,
            norm: norm_weight(file, "output_norm.weight", device)?,
            output,
            local_rope,
            global_rope,
            n_head,
            n_kv_head,
            head_dim,
            hidden,
            eps,
            vocab,
            max_seq,
            device: device.clone(),
        })
    }
}

impl Transformer for Gemma3 {
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let seq = tokens.len();
        let pos = self.cache_len();
        super::check_input(tokens, pos, self.max_seq, self.vocab)?;
        let ids = Tensor::new(tokens, &self.device)?;
        let mut x = (self.embeddings.embedding(&ids)?.unsqueeze(0)? * (self.hidden as f64).sqrt())?;
        let local = (
            self.local_rope.0.narrow(0, pos, seq)?,
            self.local_rope.1.narrow(0, pos, seq)?,
        );
        let global = (
            self.global_rope.0.narrow(0, pos, seq)?,
            self.global_rope.1.narrow(0, pos, seq)?,
        );
        let n_rep = self.n_head / self.n_kv_head;
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        let (h, kvh, d) = (self.n_head, self.n_kv_head, self.head_dim);
        for layer in &mut self.layers {
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
            let q = candle_nn::ops::rms_norm(&q, &layer.q_norm, self.eps)?;
            let k = candle_nn::ops::rms_norm(&k, &layer.k_norm, self.eps)?;
            let (cos, sin) = if layer.window.is_some() {
                &local
            } else {
                &global
            };
            let q = candle_nn::rotary_emb::rope(&q, cos, sin)?;
            let k = candle_nn::rotary_emb::rope(&k, cos, sin)?;
            let (k, v, key_start) = layer.cache.append(&k, &v, layer.window)?;
            let mask = if seq > 1 {
                Some(attention_mask(
                    seq,
                    pos,
                    key_start,
                    n_rep,
                    layer.window,
                    &self.device,
                )?)
            } else {
                None
            };
            let y = attention(&q, &k, &v, mask.as_ref(), scale)?;
            let y = layer.wo.forward(&y)?;
            let x1 = (candle_nn::ops::rms_norm(&y, &layer.post_attn_norm, self.eps)? + &x)?;
            let xn = candle_nn::ops::rms_norm(&x1, &layer.ffn_norm, self.eps)?;
            let gu = layer.gate_up.forward(&xn)?;
            let act = gu[0].gelu()?.mul(&gu[1])?;
            let y = layer.down.forward(&act)?;
            x = (candle_nn::ops::rms_norm(&y, &layer.post_ffn_norm, self.eps)? + x1)?;
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
