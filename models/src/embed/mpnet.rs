//! MPNet (sentence-transformers' all-mpnet-base-v2 and kin) in f32 on candle: the reference
//! for the CPU kernels' MPNet path (`arch/cpu/bert.rs`, [`Variant::MPNet`]), and what
//! `EmbedBackend::Candle` runs. candle-transformers has no MPNet, so this is transformers'
//! `MPNetModel` written out: word + position embeddings (positions counted from
//! `pad_token_id + 1`), LayerNorm, then post-norm layers whose attention scores get a
//! relative position bias shared by all layers.

use candle_core::{DType, Module, Result, Tensor, D};
use candle_nn::{embedding, layer_norm, linear, Embedding, LayerNorm, Linear, VarBuilder};
use serde::Deserialize;

use crate::arch::cpu::bert::{
    relative_position_bucket, Activation, BertShape, Variant, MPNET_MAX_DISTANCE,
};

/// The fields of an MPNet `config.json` that the forward pass needs.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct MpnetConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub hidden_act: String,
    pub max_position_embeddings: usize,
    pub layer_norm_eps: f64,
    #[serde(default = "default_pad_token_id")]
    pub pad_token_id: usize,
    #[serde(default = "default_buckets")]
    pub relative_attention_num_buckets: usize,
}

fn default_pad_token_id() -> usize {
    1
}

fn default_buckets() -> usize {
    32
}

impl MpnetConfig {
    /// The activation named by `hidden_act`, if one is implemented.
    pub(crate) fn activation(&self) -> Option<Activation> {
        match self.hidden_act.as_str() {
            "gelu" => Some(Activation::GeluErf),
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Some(Activation::GeluTanh),
            "relu" => Some(Activation::Relu),
            _ => None,
        }
    }

    /// The model's sizes (`activation` from [`MpnetConfig::activation`]).
    pub(crate) fn shape(&self, activation: Activation) -> BertShape {
        BertShape {
            vocab: self.vocab_size,
            hidden: self.hidden_size,
            layers: self.num_hidden_layers,
            heads: self.num_attention_heads,
            ffn: self.intermediate_size,
            max_positions: self.max_position_embeddings,
            type_vocab: 0,
            eps: self.layer_norm_eps as f32,
            activation,
            variant: Variant::MPNet {
                position_offset: self.pad_token_id + 1,
                buckets: self.relative_attention_num_buckets,
            },
        }
    }
}

struct Layer {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    attn_norm: LayerNorm,
    up: Linear,
    down: Linear,
    out_norm: LayerNorm,
}

/// An MPNet encoder in f32.
pub(crate) struct MpnetModel {
    word: Embedding,
    position: Embedding,
    embed_norm: LayerNorm,
    layers: Vec<Layer>,
    /// `buckets × heads`.
    relative: Vec<f32>,
    buckets: usize,
    heads: usize,
    position_offset: usize,
    activation: Activation,
}

impl MpnetModel {
    /// Loads the weights under `vb` (tensor names as in transformers' `MPNetModel`; a
    /// `mpnet.` prefix, as saved from a model with a task head, is found by itself).
    pub(crate) fn load(
        vb: VarBuilder,
        config: &MpnetConfig,
        activation: Activation,
    ) -> Result<Self> {
        let vb = if vb.contains_tensor("embeddings.word_embeddings.weight") {
            vb
        } else {
            vb.pp("mpnet")
        };
        let h = config.hidden_size;
        let eps = config.layer_norm_eps;
        let emb = vb.pp("embeddings");
        let word = embedding(config.vocab_size, h, emb.pp("word_embeddings"))?;
        let position = embedding(
            config.max_position_embeddings,
            h,
            emb.pp("position_embeddings"),
        )?;
        let embed_norm = layer_norm(h, eps, emb.pp("LayerNorm"))?;
        let enc = vb.pp("encoder");
        let relative = enc
            .get(
                (
                    config.relative_attention_num_buckets,
                    config.num_attention_heads,
                ),
                "relative_attention_bias.weight",
            )?
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let layers = (0..config.num_hidden_layers)
            .map(|i| {
                let l = enc.pp(format!("layer.{i}"));
                let attn = l.pp("attention.attn");
                Ok(Layer {
                    q: linear(h, h, attn.pp("q"))?,
                    k: linear(h, h, attn.pp("k"))?,
                    v: linear(h, h, attn.pp("v"))?,
                    o: linear(h, h, attn.pp("o"))?,
                    attn_norm: layer_norm(h, eps, l.pp("attention.LayerNorm"))?,
                    up: linear(h, config.intermediate_size, l.pp("intermediate.dense"))?,
                    down: linear(config.intermediate_size, h, l.pp("output.dense"))?,
                    out_norm: layer_norm(h, eps, l.pp("output.LayerNorm"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            word,
            position,
            embed_norm,
            layers,
            relative,
            buckets: config.relative_attention_num_buckets,
            heads: config.num_attention_heads,
            position_offset: config.pad_token_id + 1,
            activation,
        })
    }

    /// The last hidden states (`batch × seq × hidden`) of `input_ids` (`batch × seq`, u32),
    /// whose `attention_mask` (1 for tokens, 0 for padding) is padded at the end.
    pub(crate) fn forward(&self, input_ids: &Tensor, attention_mask: &Tensor) -> Result<Tensor> {
        let (batch, seq) = input_ids.dims2()?;
        let device = input_ids.device();
        // Real tokens sit at positions offset, offset + 1, ...; padding rows are masked out
        // as keys and dropped by the pooling, so their positions do not matter.
        let positions = Tensor::arange(
            self.position_offset as u32,
            (self.position_offset + seq) as u32,
            device,
        )?;
        let mut x = self
            .word
            .forward(input_ids)?
            .broadcast_add(&self.position.forward(&positions)?.unsqueeze(0)?)?;
        x = self.embed_norm.forward(&x)?;

        let mut bias = vec![0f32; self.heads * seq * seq];
        for i in 0..seq {
            for j in 0..seq {
                let bucket =
                    relative_position_bucket(j as i64 - i as i64, self.buckets, MPNET_MAX_DISTANCE);
                for head in 0..self.heads {
                    bias[(head * seq + i) * seq + j] = self.relative[bucket * self.heads + head];
                }
            }
        }
        let bias = Tensor::from_vec(bias, (1, self.heads, seq, seq), device)?;
        let mask = attention_mask
            .to_dtype(DType::F32)?
            .reshape((batch, 1, 1, seq))?;
        let mask = ((mask.ones_like()? - &mask)? * f64::from(f32::MIN))?;
        let bias = bias.broadcast_add(&mask)?;

        let hidden = x.dim(D::Minus1)?;
        let d = hidden / self.heads;
        let scale = 1.0 / (d as f64).sqrt();
        let split = |t: Tensor| -> Result<Tensor> {
            t.reshape((batch, seq, self.heads, d))?
                .transpose(1, 2)?
                .contiguous()
        };
        for layer in &self.layers {
            let q = split(layer.q.forward(&x)?)?;
            let k = split(layer.k.forward(&x)?)?;
            let v = split(layer.v.forward(&x)?)?;
            let scores = (q.matmul(&k.t()?)? * scale)?.broadcast_add(&bias)?;
            let probs = candle_nn::ops::softmax_last_dim(&scores)?;
            let context = probs
                .matmul(&v)?
                .transpose(1, 2)?
                .reshape((batch, seq, hidden))?;
            x = layer
                .attn_norm
                .forward(&(layer.o.forward(&context)? + &x)?)?;
            let up = layer.up.forward(&x)?;
            let up = match self.activation {
                Activation::GeluErf => up.gelu_erf()?,
                Activation::GeluTanh => up.gelu()?,
                Activation::Relu => up.relu()?,
            };
            x = layer.out_norm.forward(&(layer.down.forward(&up)? + &x)?)?;
        }
        Ok(x)
    }
}
