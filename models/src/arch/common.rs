//! Building blocks shared by the architectures: fused projections, a growable KV cache that
//! is written in place, rotary tables and attention masks.

use std::borrow::Cow;
use std::sync::Arc;

use candle_core::quantized::{QMatMul, QStorage, QTensor};
use candle_core::{DType, Device, Module, Tensor, D};

use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;

/// One or more projections of the same input. Weights of the same quantisation type are
/// concatenated row-wise into one matrix so that, for example, Q, K and V cost one
/// quantised matmul (one pass over the activations, one thread-pool dispatch) instead of
/// three.
pub(crate) enum Projection {
    /// One fused matrix; `widths` are the output sizes of the parts, in order.
    Fused { mm: QMatMul, widths: Vec<usize> },
    /// Parts with different quantisation types, applied one by one.
    Separate(Vec<QMatMul>),
}

impl Projection {
    /// Loads the named 2-D weights and fuses them when their types match.
    pub(crate) fn load(file: &GgufFile, names: &[String], device: &Device) -> Result<Self> {
        let tensors = names
            .iter()
            .map(|n| file.tensor(n, device))
            .collect::<Result<Vec<_>>>()?;
        Self::from_tensors(names, tensors, device)
    }

    /// One stored matrix whose rows are several projections one after another (phi3's
    /// `attn_qkv`, its gate-then-up `ffn_up`), applied as one product and cut into parts of
    /// `widths` outputs.
    pub(crate) fn split(
        file: &GgufFile,
        name: &str,
        widths: Vec<usize>,
        device: &Device,
    ) -> Result<Self> {
        let t = file.tensor(name, device)?;
        let (n, _) = t.shape().dims2().map_err(|e| ModelError::Tensor {
            name: name.to_string(),
            reason: e.to_string(),
        })?;
        if n != widths.iter().sum::<usize>() {
            return Err(ModelError::Tensor {
                name: name.to_string(),
                reason: format!("{n} rows, expected {}", widths.iter().sum::<usize>()),
            });
        }
        Ok(Self::Fused {
            mm: QMatMul::from_qtensor(t)?,
            widths,
        })
    }

    fn from_tensors(names: &[String], tensors: Vec<QTensor>, device: &Device) -> Result<Self> {
        let mut widths = Vec::with_capacity(tensors.len());
        let mut k = None;
        for (name, t) in names.iter().zip(&tensors) {
            let (n, tk) = t.shape().dims2().map_err(|e| ModelError::Tensor {
                name: name.clone(),
                reason: e.to_string(),
            })?;
            if *k.get_or_insert(tk) != tk {
                return Err(ModelError::Tensor {
                    name: name.clone(),
                    reason: format!("input width {tk} differs from the other projections"),
                });
            }
            widths.push(n);
        }
        let same_type = tensors.windows(2).all(|w| w[0].dtype() == w[1].dtype());
        // Only CPU storage can be concatenated byte-wise here; GPU backends keep the parts.
        if tensors.len() == 1 || !same_type || !device.is_cpu() {
            let mms = tensors
                .into_iter()
                .map(QMatMul::from_qtensor)
                .collect::<candle_core::Result<Vec<_>>>()?;
            return Ok(Self::Separate(mms));
        }
        let dtype = tensors[0].dtype();
        let mut bytes = Vec::new();
        for t in &tensors {
            // Rows of a quantised matrix are stored one after another, so a row-wise
            // concatenation is a concatenation of the raw blocks.
            bytes.extend_from_slice(&t.data()?);
        }
        let n: usize = widths.iter().sum();
        let storage = QStorage::from_data(Cow::Owned(bytes), device, dtype)?;
        let fused = QTensor::new(storage, (n, k.unwrap_or(0)))?;
        Ok(Self::Fused {
            mm: QMatMul::from_arc(Arc::new(fused))?,
            widths,
        })
    }

    /// Applies every part to `x` (`(batch, seq, k)`), returning one tensor per part.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        match self {
            Self::Separate(mms) => Ok(mms
                .iter()
                .map(|m| m.forward(x))
                .collect::<candle_core::Result<Vec<_>>>()?),
            Self::Fused { mm, widths } => {
                let y = mm.forward(x)?;
                let mut out = Vec::with_capacity(widths.len());
                let mut start = 0;
                for &w in widths {
                    out.push(y.narrow(D::Minus1, start, w)?);
                    start += w;
                }
                Ok(out)
            }
        }
    }
}

/// A single quantised weight matrix.
pub(crate) fn linear(file: &GgufFile, name: &str, device: &Device) -> Result<QMatMul> {
    Ok(QMatMul::from_qtensor(file.tensor(name, device)?)?)
}

/// An RMS-norm weight (stored as F32 in GGUF files).
pub(crate) fn norm_weight(file: &GgufFile, name: &str, device: &Device) -> Result<Tensor> {
    Ok(file.tensor(name, device)?.dequantize(device)?)
}

/// Per-layer key/value cache of shape `(1, n_kv_head, capacity, head_dim)`, written in place
/// with `slice_set` so that appending a token copies only that token's keys and values.
/// Capacity grows by doubling up to the model's maximum.
pub(crate) struct KvCache {
    k: Tensor,
    v: Tensor,
    len: usize,
    max: usize,
}

impl KvCache {
    pub(crate) fn new(
        n_kv_head: usize,
        head_dim: usize,
        max: usize,
        device: &Device,
    ) -> Result<Self> {
        let cap = max.min(256);
        Ok(Self {
            k: Tensor::zeros((1, n_kv_head, cap, head_dim), DType::F32, device)?,
            v: Tensor::zeros((1, n_kv_head, cap, head_dim), DType::F32, device)?,
            len: 0,
            max,
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    fn capacity(&self) -> usize {
        self.k.dims()[2]
    }

    fn grow_to(&mut self, needed: usize) -> Result<()> {
        if needed > self.max {
            return Err(ModelError::ContextOverflow {
                needed,
                max: self.max,
            });
        }
        if needed <= self.capacity() {
            return Ok(());
        }
        let mut cap = self.capacity().max(1);
        while cap < needed {
            cap *= 2;
        }
        let cap = cap.min(self.max);
        let (_, h, _, d) = self.k.dims4()?;
        let grow = |old: &Tensor, len: usize| -> Result<Tensor> {
            let new = Tensor::zeros((1, h, cap, d), DType::F32, old.device())?;
            if len > 0 {
                new.slice_set(&old.narrow(2, 0, len)?.contiguous()?, 2, 0)?;
            }
            Ok(new)
        };
        self.k = grow(&self.k, self.len)?;
        self.v = grow(&self.v, self.len)?;
        Ok(())
    }

    /// Appends `k` and `v` (`(1, n_kv_head, seq, head_dim)`) and returns views of the cached
    /// keys and values of the last `window` positions (all positions when `window` is None).
    pub(crate) fn append(
        &mut self,
        k: &Tensor,
        v: &Tensor,
        window: Option<usize>,
    ) -> Result<(Tensor, Tensor, usize)> {
        let seq = k.dims()[2];
        self.grow_to(self.len + seq)?;
        self.k.slice_set(&k.contiguous()?, 2, self.len)?;
        self.v.slice_set(&v.contiguous()?, 2, self.len)?;
        self.len += seq;
        let start = match window {
            // Keys older than the window are never attended to by any of the new queries.
            Some(w) => (self.len - seq).saturating_sub(w.saturating_sub(1)),
            None => 0,
        };
        let n = self.len - start;
        Ok((
            self.k.narrow(2, start, n)?,
            self.v.narrow(2, start, n)?,
            start,
        ))
    }
}

/// Cosine and sine tables of shape `(max_seq, rot_dim / 2)` for rotary embeddings. With
/// linear scaling (`factor > 1`), position `p` rotates like position `p / factor`.
pub(crate) fn rope_tables(
    rot_dim: usize,
    base: f32,
    factor: f32,
    max_seq: usize,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    let half = rot_dim / 2;
    let rope = super::shape::Rope {
        style: super::shape::RopeStyle::Halves,
        dims: rot_dim,
        base,
        linear: factor,
        factors: None,
        attn_factor: 1.0,
    };
    let (cos, sin) = rope.tables(max_seq);
    Ok((
        Tensor::from_vec(cos, (max_seq, half), device)?,
        Tensor::from_vec(sin, (max_seq, half), device)?,
    ))
}

/// Additive attention mask for `seq` new queries at positions `pos..pos+seq` over keys at
/// positions `key_start..pos+seq`, repeated for `n_rep` query heads per KV head: 0 where
/// a query may attend, -inf where the key is in its future or outside its `window`.
pub(crate) fn attention_mask(
    seq: usize,
    pos: usize,
    key_start: usize,
    n_rep: usize,
    window: Option<usize>,
    device: &Device,
) -> Result<Tensor> {
    let keys = pos + seq - key_start;
    let mut m = Vec::with_capacity(n_rep * seq * keys);
    for _ in 0..n_rep {
        for i in 0..seq {
            let q = pos + i;
            for j in 0..keys {
                let k = key_start + j;
                let visible = k <= q && window.is_none_or(|w| q - k < w);
                m.push(if visible { 0f32 } else { f32::NEG_INFINITY });
            }
        }
    }
    Ok(Tensor::from_vec(m, (1, 1, n_rep * seq, keys), device)?)
}

/// Scaled dot-product attention with grouped KV heads and no copy of the cache.
///
/// `q` is `(1, n_head, seq, d)`, `k`/`v` are `(1, n_kv_head, keys, d)` views of the cache.
/// The query heads that share a KV head are folded into the row dimension, so one batched
/// matmul per KV head covers all of them. Returns `(1, seq, n_head * d)`.
pub(crate) fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    scale: f64,
) -> Result<Tensor> {
    let (_, n_head, seq, d) = q.dims4()?;
    let n_kv = k.dims()[1];
    let n_rep = n_head / n_kv;
    let q = q.contiguous()?.reshape((1, n_kv, n_rep * seq, d))?;
    let att = (q.matmul(&k.t()?)? * scale)?;
    let att = match mask {
        Some(m) => att.broadcast_add(m)?,
        None => att,
    };
    let att = candle_nn::ops::softmax_last_dim(&att)?;
    let y = att.matmul(v)?; // (1, n_kv, n_rep*seq, d)
    let y = y
        .reshape((1, n_head, seq, d))?
        .transpose(1, 2)?
        .reshape((1, seq, n_head * d))?;
    Ok(y)
}

/// Logits of the last position as a host vector.
pub(crate) fn last_logits(logits: &Tensor) -> Result<Vec<f32>> {
    Ok(logits
        .flatten_all()?
        .to_dtype(DType::F32)?
        .to_vec1::<f32>()?)
}
