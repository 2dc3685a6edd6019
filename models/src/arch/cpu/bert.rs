//! A BERT encoder (sentence-transformers models such as all-MiniLM-L6-v2, and MPNet ones
//! such as all-mpnet-base-v2: see [`Variant`]) on the same CPU kernels as the llama path: the linear layers hold Q8_0 weights and take 8-bit block
//! activations; embeddings, biases, layer norms, attention and the activation function stay
//! in f32. The few hidden channels that BERT drives far above the rest are multiplied in f32
//! beside the 8-bit product (see [`Outliers`]); without that, the worst fixture sentence
//! falls to cosine 0.998 against sentence-transformers, with it it stays above 0.9994.
//!
//! A batch is run without padding: the linear layers see the tokens of every text as one
//! `tokens × hidden` matrix, and attention runs per text and head, so a short text next to a
//! long one costs only its own tokens, and every per-token decision is made per token, so a
//! text's vector does not depend on the texts batched with it.
//!
//! [`crate::embed::BertEmbedder`] uses it by default on CPUs with integer SIMD kernels and
//! keeps candle's f32 implementation as the reference (`EmbedBackend::Candle`); the fixture
//! test holds both to cosine ≥ 0.999 against sentence-transformers.

#![allow(unsafe_code)]

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use super::kernels::{Isa, Layout, BLOCK};
use super::ops;
use super::pool::{Disjoint, Pool};
use super::quant::{self, Epilogue, QActs, QMatrix};

/// The feed-forward activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Activation {
    /// `x·Φ(x)` with the exact normal CDF (`gelu` in transformers).
    GeluErf,
    /// The tanh approximation of GELU (`gelu_new`, `gelu_pytorch_tanh`).
    GeluTanh,
    /// `max(x, 0)`.
    Relu,
}

/// Which member of the BERT family a checkpoint is: the layers are the same (post-norm,
/// biased linear layers, GELU feed-forward), the embeddings, the attention scores and the
/// tensor names differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Variant {
    /// BERT: word + position + token-type embeddings, positions counted from 0; tensors
    /// `attention.self.{query,key,value}`, `attention.output.{dense,LayerNorm}`.
    Bert,
    /// MPNet (transformers' `MPNetModel`): word + position embeddings, positions counted
    /// from `position_offset` (`pad_token_id + 1`), and a T5-style relative position bias
    /// (`encoder.relative_attention_bias`, `buckets × heads`, shared by all layers) added
    /// to the attention scores; tensors `attention.attn.{q,k,v,o}`, `attention.LayerNorm`.
    MPNet {
        position_offset: usize,
        buckets: usize,
    },
}

/// transformers' `MPNetAttention` buckets relative distances up to this far apart (fixed
/// there, not in the config).
pub(crate) const MPNET_MAX_DISTANCE: usize = 128;

/// The sizes a BERT checkpoint is built with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BertShape {
    pub vocab: usize,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub ffn: usize,
    pub max_positions: usize,
    /// Token types (BERT only; 0 for MPNet).
    pub type_vocab: usize,
    pub eps: f32,
    pub activation: Activation,
    pub variant: Variant,
}

impl BertShape {
    /// The first position embedding a text uses.
    pub(crate) fn position_offset(&self) -> usize {
        match self.variant {
            Variant::Bert => 0,
            Variant::MPNet {
                position_offset, ..
            } => position_offset,
        }
    }

    /// The most tokens one text may have.
    pub(crate) fn max_tokens(&self) -> usize {
        self.max_positions.saturating_sub(self.position_offset())
    }
}

/// The bucket of a relative distance `relative` (key position minus query position), as
/// transformers' `MPNetAttention.relative_position_bucket` (T5's bidirectional scheme):
/// half the buckets for keys after the query, half for keys before it; within each half,
/// distances below a quarter of the buckets get one bucket each and longer ones share
/// logarithmically wider buckets up to `max_distance`, past which all fall in the last.
pub(crate) fn relative_position_bucket(
    relative: i64,
    buckets: usize,
    max_distance: usize,
) -> usize {
    let half = buckets / 2;
    let n = -relative;
    let base = if n < 0 { half } else { 0 };
    let n = n.unsigned_abs() as usize;
    let max_exact = half / 2;
    if n < max_exact {
        return base + n;
    }
    let log_ratio =
        (n as f64 / max_exact as f64).ln() / (max_distance as f64 / max_exact as f64).ln();
    let large = max_exact + (log_ratio * (half - max_exact) as f64) as usize;
    base + large.min(half - 1)
}

/// MPNet's relative position bias, laid out for attention: for each head, the bias of
/// every relative distance `-(span-1) ..= span-1`, so that a query row's biases are one
/// contiguous slice.
struct RelativeBias {
    span: usize,
    /// `heads × (2·span - 1)`.
    table: Vec<f32>,
}

impl RelativeBias {
    /// `weight` is `buckets × heads`, as in the checkpoint.
    fn new(weight: &[f32], buckets: usize, heads: usize, span: usize) -> Self {
        let width = 2 * span - 1;
        let mut table = vec![0f32; heads * width];
        for at in 0..width {
            let relative = at as i64 - (span as i64 - 1);
            let bucket = relative_position_bucket(relative, buckets, MPNET_MAX_DISTANCE);
            for head in 0..heads {
                table[head * width + at] = weight[bucket * heads + head];
            }
        }
        Self { span, table }
    }

    /// The biases of query `i` of a text of `len` tokens against all its keys, for `head`.
    fn row(&self, head: usize, i: usize, len: usize) -> &[f32] {
        let width = 2 * self.span - 1;
        let start = head * width + self.span - 1 - i;
        &self.table[start..start + len]
    }
}

/// Reads the named tensor as f32 values, checking it has the given dimensions.
pub(crate) type TensorSource<'a> = dyn Fn(&str, &[usize]) -> Result<Vec<f32>, String> + 'a;

struct LayerNorm {
    weight: Vec<f32>,
    bias: Vec<f32>,
}

struct Linear {
    weight: QMatrix,
    bias: Vec<f32>,
    /// Dequantised weight columns of the input channels split out as outliers.
    columns: ColumnCache,
}

/// Weight columns in f32, kept after first use for at most `k / 8` of the `k` input
/// channels. The outliers of BERT's hidden states fall on a few fixed channels (on the
/// memory benchmark's 56 queries, each all-MiniLM-L6-v2 projection saw 12 to 76 distinct
/// ones, a handful of them in every text), and reading a column out of the row-major Q8_0
/// blocks costs a cache miss per row: a fifth of a batch-1 embedding before this cache.
/// The cached values are the ones [`QMatrix::column`] gives, so vectors do not change.
struct ColumnCache {
    slots: Vec<std::sync::OnceLock<Box<[f32]>>>,
    /// Columns claimed so far (never more than `budget` are filled).
    claimed: std::sync::atomic::AtomicUsize,
    budget: usize,
}

impl ColumnCache {
    fn new(k: usize) -> Self {
        Self {
            slots: (0..k).map(|_| std::sync::OnceLock::new()).collect(),
            claimed: std::sync::atomic::AtomicUsize::new(0),
            budget: k / 8,
        }
    }

    /// Column `c` of `weight`, from the cache or added to it; `None` once the budget is
    /// spent on other columns (the caller dequantises it itself).
    fn get(&self, weight: &QMatrix, c: usize) -> Option<&[f32]> {
        use std::sync::atomic::Ordering::Relaxed;
        let slot = self.slots.get(c)?;
        if let Some(column) = slot.get() {
            return Some(column);
        }
        // A claim is taken before filling, so at most `budget` columns are ever stored;
        // a thread that loses the race to fill the same column gives its claim back.
        if self.claimed.fetch_add(1, Relaxed) >= self.budget {
            self.claimed.fetch_sub(1, Relaxed);
            return None;
        }
        let mut filled = false;
        let column = slot.get_or_init(|| {
            filled = true;
            dequantised_column(weight, c).into_boxed_slice()
        });
        if !filled {
            self.claimed.fetch_sub(1, Relaxed);
        }
        Some(column)
    }
}

/// Column `c` of `weight` (input channel `c` of every output row), dequantised.
fn dequantised_column(weight: &QMatrix, c: usize) -> Vec<f32> {
    let mut column = vec![0f32; weight.rows()];
    weight.column(c, &mut column);
    column
}

struct Layer {
    /// Query, key and value stacked into one `3·hidden × hidden` product.
    qkv: Linear,
    attn_out: Linear,
    attn_norm: LayerNorm,
    up: Linear,
    down: Linear,
    out_norm: LayerNorm,
}

/// A BERT encoder run by the CPU kernels.
pub(crate) struct CpuBert {
    shape: BertShape,
    word: Vec<f32>,
    /// Position embeddings from the variant's first position on, with BERT's token-type-0
    /// embedding already added (every input here is a single segment).
    position: Vec<f32>,
    embed_norm: LayerNorm,
    layers: Vec<Layer>,
    /// MPNet's relative position bias.
    relative: Option<RelativeBias>,
    pool: Pool,
    isa: Isa,
}

/// Rows handled per chunk of a parallel element-wise pass.
const ROWS_PER_CHUNK: usize = 8;

impl CpuBert {
    /// Whether the kernels can run a model of this shape.
    pub(crate) fn supports(shape: &BertShape) -> Result<(), String> {
        if !shape.hidden.is_multiple_of(BLOCK) || !shape.ffn.is_multiple_of(BLOCK) {
            return Err(format!(
                "widths {} and {} must be multiples of {BLOCK}",
                shape.hidden, shape.ffn
            ));
        }
        if shape.heads == 0 || !shape.hidden.is_multiple_of(shape.heads) {
            return Err(format!(
                "{} heads do not divide width {}",
                shape.heads, shape.hidden
            ));
        }
        if shape.max_tokens() == 0 {
            return Err("no position embeddings".into());
        }
        match shape.variant {
            Variant::Bert if shape.type_vocab == 0 => Err("no token-type embeddings".into()),
            Variant::MPNet { buckets, .. } if buckets < 4 || !buckets.is_multiple_of(2) => Err(
                format!("{buckets} relative position buckets (expected an even number ≥ 4)"),
            ),
            _ => Ok(()),
        }
    }

    /// Builds the encoder from the checkpoint's tensors (names as in transformers'
    /// `BertModel` or `MPNetModel`, with `prefix` such as `""` or `"bert."`), quantising the
    /// linear layers' weights to Q8_0. `threads` is the size of the worker pool.
    pub(crate) fn load(
        shape: BertShape,
        prefix: &str,
        tensor: &TensorSource<'_>,
        threads: usize,
    ) -> Result<Self, String> {
        Self::supports(&shape)?;
        let h = shape.hidden;
        let get = |name: &str, dims: &[usize]| tensor(&format!("{prefix}{name}"), dims);
        let norm = |name: &str| -> Result<LayerNorm, String> {
            Ok(LayerNorm {
                weight: get(&format!("{name}.weight"), &[h])?,
                bias: get(&format!("{name}.bias"), &[h])?,
            })
        };
        let isa = Isa::detect();
        let layout = Layout::for_isa(isa);
        let linear = |names: &[String], rows: usize, k: usize| -> Result<Linear, String> {
            let mut weight = Vec::with_capacity(names.len() * rows * k);
            let mut bias = Vec::with_capacity(names.len() * rows);
            for name in names {
                weight.extend(get(&format!("{name}.weight"), &[rows, k])?);
                bias.extend(get(&format!("{name}.bias"), &[rows])?);
            }
            let n = names.len() * rows;
            Ok(Linear {
                weight: quantize_q8_0(&weight, n, k, layout)
                    .map_err(|e| format!("{}: {e}", names[0]))?,
                bias,
                columns: ColumnCache::new(k),
            })
        };

        let word = get("embeddings.word_embeddings.weight", &[shape.vocab, h])?;
        let mut position = get(
            "embeddings.position_embeddings.weight",
            &[shape.max_positions, h],
        )?;
        position.drain(..shape.position_offset() * h);
        let relative = match shape.variant {
            Variant::Bert => {
                let token_type = get(
                    "embeddings.token_type_embeddings.weight",
                    &[shape.type_vocab, h],
                )?;
                for row in position.chunks_exact_mut(h) {
                    row.iter_mut()
                        .zip(&token_type[..h])
                        .for_each(|(p, t)| *p += t);
                }
                None
            }
            Variant::MPNet { buckets, .. } => {
                let weight = get(
                    "encoder.relative_attention_bias.weight",
                    &[buckets, shape.heads],
                )?;
                Some(RelativeBias::new(
                    &weight,
                    buckets,
                    shape.heads,
                    shape.max_tokens(),
                ))
            }
        };
        let embed_norm = norm("embeddings.LayerNorm")?;

        let mut layers = Vec::with_capacity(shape.layers);
        for i in 0..shape.layers {
            let p = format!("encoder.layer.{i}");
            let (qkv, out, out_norm) = match shape.variant {
                Variant::Bert => (
                    ["query", "key", "value"].map(|w| format!("{p}.attention.self.{w}")),
                    format!("{p}.attention.output.dense"),
                    format!("{p}.attention.output.LayerNorm"),
                ),
                Variant::MPNet { .. } => (
                    ["q", "k", "v"].map(|w| format!("{p}.attention.attn.{w}")),
                    format!("{p}.attention.attn.o"),
                    format!("{p}.attention.LayerNorm"),
                ),
            };
            layers.push(Layer {
                qkv: linear(&qkv, h, h)?,
                attn_out: linear(&[out], h, h)?,
                attn_norm: norm(&out_norm)?,
                up: linear(&[format!("{p}.intermediate.dense")], shape.ffn, h)?,
                down: linear(&[format!("{p}.output.dense")], h, shape.ffn)?,
                out_norm: norm(&format!("{p}.output.LayerNorm"))?,
            });
        }
        let pool = Pool::new(threads.max(1)).map_err(|e| format!("cannot start threads: {e}"))?;
        Ok(Self {
            shape,
            word,
            position,
            embed_norm,
            layers,
            relative,
            pool,
            isa,
        })
    }

    /// The instruction set the kernels use.
    pub(crate) fn isa(&self) -> Isa {
        self.isa
    }

    /// Threads a forward pass runs on.
    pub(crate) fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// Runs the encoder over `texts` (token ids, each at most the model's position count
    /// long and below its vocabulary size) and returns the last hidden states of all their
    /// tokens, text after text: `sum(len) × hidden` values.
    pub(crate) fn forward(&self, texts: &[&[u32]]) -> Result<Vec<f32>, String> {
        let s = &self.shape;
        let h = s.hidden;
        for ids in texts {
            if ids.len() > s.max_tokens() {
                return Err(format!(
                    "{} tokens exceed the model's {} positions",
                    ids.len(),
                    s.max_tokens()
                ));
            }
            if let Some(&bad) = ids.iter().find(|&&t| t as usize >= s.vocab) {
                return Err(format!("token id {bad} is outside the vocabulary"));
            }
        }
        let tokens: usize = texts.iter().map(|t| t.len()).sum();
        let mut spans = Vec::with_capacity(texts.len());
        let mut x = vec![0f32; tokens * h];
        let mut at = 0;
        for ids in texts {
            spans.push(at..at + ids.len());
            for (p, &t) in ids.iter().enumerate() {
                let row = &mut x[(at + p) * h..(at + p + 1) * h];
                let word = &self.word[t as usize * h..(t as usize + 1) * h];
                let pos = &self.position[p * h..(p + 1) * h];
                for ((o, w), q) in row.iter_mut().zip(word).zip(pos) {
                    *o = w + q;
                }
            }
            at += ids.len();
        }
        if tokens == 0 {
            return Ok(x);
        }
        self.rows(&mut x, h, &|_, row| {
            layer_norm(row, &self.embed_norm, s.eps)
        });

        let mut scratch = Scratch {
            acts: QActs::new(h, Layout::for_isa(self.isa), self.isa),
            acts_ffn: QActs::new(s.ffn, Layout::for_isa(self.isa), self.isa),
            masked: Vec::new(),
        };
        let mut qkv = vec![0f32; tokens * 3 * h];
        let mut att = vec![0f32; tokens * h];
        let mut ffn = vec![0f32; tokens * s.ffn];
        for layer in &self.layers {
            self.project(
                &layer.qkv,
                &x,
                tokens,
                true,
                &mut scratch,
                &mut qkv,
                Epilogue::Store,
            );
            self.rows(&mut qkv, 3 * h, &|_, row| add(row, &layer.qkv.bias));
            self.attention(&qkv, &spans, &mut att);

            self.residual(
                &layer.attn_out,
                &att,
                &layer.attn_norm,
                &mut scratch,
                &mut x,
            );

            self.project(
                &layer.up,
                &x,
                tokens,
                true,
                &mut scratch,
                &mut ffn,
                Epilogue::Store,
            );
            let act = s.activation;
            self.rows(&mut ffn, s.ffn, &|_, row| {
                for (v, b) in row.iter_mut().zip(&layer.up.bias) {
                    *v = activate(act, *v + b);
                }
            });

            self.residual(&layer.down, &ffn, &layer.out_norm, &mut scratch, &mut x);
        }
        Ok(x)
    }

    /// A residual sub-layer with BERT's post-norm: `x = LayerNorm(x + W·input + b)`.
    fn residual(
        &self,
        l: &Linear,
        input: &[f32],
        norm: &LayerNorm,
        scratch: &mut Scratch,
        x: &mut [f32],
    ) {
        let h = self.shape.hidden;
        let tokens = x.len() / h;
        self.project(l, input, tokens, false, scratch, x, Epilogue::Add);
        self.rows(x, h, &|_, row| {
            add(row, &l.bias);
            layer_norm(row, norm, self.shape.eps);
        });
    }

    /// `out (=|+=) W·x` for the `tokens` rows of `x`. With `split`, columns of `x` whose
    /// magnitude stands far above the rest (a few fixed channels of BERT's hidden states
    /// reach 10–30 where the others stay near 1) are taken out of the 8-bit product, where
    /// one of them would coarsen the quantisation of its whole 32-value block, and
    /// multiplied in f32 instead, as LLM.int8() does.
    ///
    /// Only the hidden states (the inputs of the QKV and FFN-up products) are split. The
    /// attention context and the GELU output are heavy-tailed in every channel: the same
    /// rule took out a third to a half of their columns (all-MiniLM-L6-v2's FFN-down input:
    /// up to 808 of 1,536 for one text), which made an embedding twice as slow, and their
    /// split did not raise the fixture's cosine to sentence-transformers enough to matter
    /// (measured 2026-12-06; `models/tests/embed.rs` and `embed_mpnet.rs`: lowest cosine
    /// 0.99949 and 0.99934 with every input split, 0.99929 and 0.99913 with the hidden
    /// states only, 0.998 with none).
    #[allow(clippy::too_many_arguments)]
    fn project(
        &self,
        l: &Linear,
        x: &[f32],
        tokens: usize,
        split: bool,
        scratch: &mut Scratch,
        out: &mut [f32],
        epilogue: Epilogue,
    ) {
        let k = x.len() / tokens;
        let width = l.weight.rows();
        let acts = if k == self.shape.hidden {
            &mut scratch.acts
        } else {
            &mut scratch.acts_ffn
        };
        let outliers = if split {
            Outliers::find(x, tokens, k)
        } else {
            Outliers::none()
        };
        if outliers.is_empty() {
            quant::quantize(&self.pool, x, tokens, None, acts);
        } else {
            let masked = &mut scratch.masked;
            masked.clear();
            masked.extend_from_slice(x);
            for (t, row) in masked.chunks_exact_mut(k).enumerate() {
                outliers.of(t).iter().for_each(|&c| row[c as usize] = 0.0);
            }
            quant::quantize(&self.pool, masked, tokens, None, acts);
        }
        quant::matmul(
            &self.pool, self.isa, &l.weight, acts, tokens, out, width, epilogue,
        );
        if outliers.is_empty() {
            return;
        }
        // The weight columns of every outlier, once each.
        let mut used: Vec<u32> = outliers.cols.clone();
        used.sort_unstable();
        used.dedup();
        // From the cache, or dequantised here once its budget is spent.
        let columns: Vec<std::borrow::Cow<'_, [f32]>> = used
            .iter()
            .map(|&c| match l.columns.get(&l.weight, c as usize) {
                Some(column) => std::borrow::Cow::Borrowed(column),
                None => std::borrow::Cow::Owned(dequantised_column(&l.weight, c as usize)),
            })
            .collect();
        self.rows(&mut out[..tokens * width], width, &|t, row| {
            for &c in outliers.of(t) {
                let Ok(i) = used.binary_search(&c) else {
                    continue;
                };
                let v = x[t * k + c as usize];
                row.iter_mut()
                    .zip(columns[i].iter())
                    .for_each(|(o, w)| *o += v * w);
            }
        });
    }

    /// Calls `f(index, row)` for every `width`-wide row of `data`, over the pool when there
    /// are many.
    fn rows(&self, data: &mut [f32], width: usize, f: &(dyn Fn(usize, &mut [f32]) + Sync)) {
        let n = data.len() / width;
        if n < 2 * ROWS_PER_CHUNK {
            data.chunks_exact_mut(width)
                .enumerate()
                .for_each(|(i, row)| f(i, row));
            return;
        }
        let parts = Disjoint::new(data);
        self.pool.run(n.div_ceil(ROWS_PER_CHUNK), &|_, chunk| {
            let first = chunk * ROWS_PER_CHUNK;
            let count = ROWS_PER_CHUNK.min(n - first);
            // SAFETY: chunk `chunk` (one thread) owns rows first..first + count.
            let rows = unsafe { parts.part(first * width, count * width) };
            rows.chunks_exact_mut(width)
                .enumerate()
                .for_each(|(i, row)| f(first + i, row));
        });
    }

    /// Bidirectional multi-head attention within each text's span of tokens: reads `qkv`
    /// (`tokens × 3·hidden`, biases added) and writes `att` (`tokens × hidden`).
    fn attention(&self, qkv: &[f32], spans: &[std::ops::Range<usize>], att: &mut [f32]) {
        let h = self.shape.hidden;
        let heads = self.shape.heads;
        let d = h / heads;
        let scale = 1.0 / (d as f32).sqrt();
        let out = Disjoint::new(att);
        self.pool.run(spans.len() * heads, &|_, unit| {
            let span = &spans[unit / heads];
            let col = unit % heads * d;
            let len = span.len();
            // This head's keys transposed (one row per dimension, padded with zeros to
            // whole groups of KEYS) and values, contiguous, so that the loops below run
            // over whole rows without strides or horizontal sums.
            let lenp = len.next_multiple_of(KEYS);
            let mut keys = vec![0f32; d * lenp];
            let mut values = Vec::with_capacity(len * d);
            for (j, t) in span.clone().enumerate() {
                let row = &qkv[t * 3 * h..(t + 1) * 3 * h];
                for (dim, &k) in row[h + col..h + col + d].iter().enumerate() {
                    keys[dim * lenp + j] = k;
                }
                values.extend_from_slice(&row[2 * h + col..2 * h + col + d]);
            }
            let queries: Vec<&[f32]> = span
                .clone()
                .map(|i| &qkv[i * 3 * h + col..i * 3 * h + col + d])
                .collect();
            let mut scores = vec![0f32; len * lenp];
            scores_of(&queries, &keys, scale, &mut scores);
            for (local, i) in span.clone().enumerate() {
                // SAFETY: unit (text, head) is handed to one thread, and writes only the
                // head's columns of its own text's rows.
                let dst = unsafe { out.part(i * h + col, d) };
                let bias = self
                    .relative
                    .as_ref()
                    .map(|r| r.row(unit % heads, local, len));
                let row = Row {
                    scores: &mut scores[local * lenp..local * lenp + len],
                    values: &values,
                    bias,
                };
                match d {
                    32 => attend_row::<32>(row, dst),
                    64 => attend_row::<64>(row, dst),
                    _ => attend_row_any(row, dst),
                }
            }
        });
    }
}

/// Keys a block of [`scores_of`] covers: one 512-bit register of f32.
const KEYS: usize = 16;
/// Queries a block of [`scores_of`] covers, each with its own accumulators (four named
/// rows there).
const QUERIES: usize = 4;
const _: () = assert!(QUERIES == 4);

/// `scores[r · lenp + j] = Σ_dim (scale · q_r[dim]) · keys[dim · lenp + j]` for every query
/// `r` and every key `j` of `lenp` (a multiple of [`KEYS`]), with `keys` transposed
/// (`q_r.len()` rows of `lenp`). Each sum runs over the dimensions in order, as a single
/// loop over them would, but a block of [`QUERIES`] × [`KEYS`] sums stays in registers: one
/// row of sums at a time was stored and reloaded for every dimension (a twelfth of a
/// batch-1 embedding).
fn scores_of(queries: &[&[f32]], keys: &[f32], scale: f32, scores: &mut [f32]) {
    let Some(d) = queries.first().map(|q| q.len()) else {
        return;
    };
    let lenp = keys.len() / d;
    let mut scaled = vec![0f32; d * QUERIES];
    for (block, qs) in queries.chunks(QUERIES).enumerate() {
        // The block's queries side by side (zeros where the last block has fewer).
        scaled.fill(0.0);
        for (r, q) in qs.iter().enumerate() {
            for (dim, &v) in q.iter().enumerate() {
                scaled[dim * QUERIES + r] = v * scale;
            }
        }
        for j0 in (0..lenp).step_by(KEYS) {
            // Four named rows, each updated key by key in one loop: written as a nested
            // loop over queries, the compiler kept the sums in memory (gathers and
            // scatters).
            let [mut a0, mut a1, mut a2, mut a3] = [[0f32; KEYS]; QUERIES];
            for (dim, qd) in scaled.chunks_exact(QUERIES).enumerate() {
                let k: &[f32; KEYS] = keys[dim * lenp + j0..dim * lenp + j0 + KEYS]
                    .try_into()
                    .expect("a whole group of keys");
                let (q0, q1, q2, q3) = (qd[0], qd[1], qd[2], qd[3]);
                for t in 0..KEYS {
                    a0[t] += q0 * k[t];
                    a1[t] += q1 * k[t];
                    a2[t] += q2 * k[t];
                    a3[t] += q3 * k[t];
                }
            }
            for (r, a) in [a0, a1, a2, a3].iter().take(qs.len()).enumerate() {
                let at = (block * QUERIES + r) * lenp + j0;
                scores[at..at + KEYS].copy_from_slice(a);
            }
        }
    }
}

/// One query row of attention: its scores (`scale · K·q`, one per key), the head's values
/// of the text (rows of the head width), and the relative position bias of this query
/// against every key, if the model has one.
struct Row<'a> {
    scores: &'a mut [f32],
    values: &'a [f32],
    bias: Option<&'a [f32]>,
}

impl Row<'_> {
    /// Adds the bias and turns the scores into unnormalised softmax weights; returns
    /// their inverse sum.
    fn weights(&mut self) -> f32 {
        if let Some(bias) = self.bias {
            self.scores.iter_mut().zip(bias).for_each(|(s, b)| *s += b);
        }
        1.0 / ops::softmax_unnormalised(self.scores)
    }
}

/// One query row of attention over a head's values (rows of `D`):
/// `out = softmax(scores + bias) · V`, with the accumulator in registers.
fn attend_row<const D: usize>(mut row: Row<'_>, out: &mut [f32]) {
    let inv = row.weights();
    let mut acc = [0f32; D];
    for (&p, v) in row.scores.iter().zip(row.values.chunks_exact(D)) {
        let v: &[f32; D] = v.try_into().expect("value row of D values");
        for (a, v) in acc.iter_mut().zip(v) {
            *a += p * v;
        }
    }
    out.iter_mut().zip(&acc).for_each(|(o, a)| *o = a * inv);
}

/// [`attend_row`] for any head width.
fn attend_row_any(mut row: Row<'_>, out: &mut [f32]) {
    let d = out.len();
    let inv = row.weights();
    out.fill(0.0);
    for (&p, v) in row.scores.iter().zip(row.values.chunks_exact(d)) {
        out.iter_mut().zip(v).for_each(|(a, v)| *a += p * v);
    }
    out.iter_mut().for_each(|o| *o *= inv);
}

/// Buffers of one forward pass.
struct Scratch {
    /// Quantised inputs of width `hidden`.
    acts: QActs,
    /// Quantised inputs of width `ffn`.
    acts_ffn: QActs,
    /// A copy of an input with its outlier columns zeroed.
    masked: Vec<f32>,
}

/// The values of an input to multiply in f32, chosen per token row (so that a text's
/// vector does not depend on the texts batched with it): those over [`OUTLIER_RATIO`] times
/// the row's mean magnitude, at most one per 32-value block on average (the largest).
struct Outliers {
    /// Columns, row after row.
    cols: Vec<u32>,
    /// Where each row's columns start in `cols`, plus the end.
    starts: Vec<usize>,
}

impl Outliers {
    fn find(x: &[f32], tokens: usize, k: usize) -> Self {
        let cap = (k / BLOCK).max(1);
        let mut cols = Vec::new();
        let mut starts = Vec::with_capacity(tokens + 1);
        let mut found: Vec<u32> = Vec::new();
        for row in x.chunks_exact(k).take(tokens) {
            starts.push(cols.len());
            let mean = row.iter().map(|v| v.abs()).sum::<f32>() / k as f32;
            let threshold = mean * OUTLIER_RATIO;
            found.clear();
            found.extend((0..k as u32).filter(|&c| row[c as usize].abs() > threshold));
            if found.len() > cap {
                found.sort_unstable_by(|&a, &b| {
                    row[b as usize].abs().total_cmp(&row[a as usize].abs())
                });
                found.truncate(cap);
            }
            cols.extend_from_slice(&found);
        }
        starts.push(cols.len());
        Self { cols, starts }
    }

    /// No outliers: every value goes through the 8-bit product.
    fn none() -> Self {
        Self {
            cols: Vec::new(),
            starts: Vec::new(),
        }
    }

    fn is_empty(&self) -> bool {
        self.cols.is_empty()
    }

    /// The columns of row `t`.
    fn of(&self, t: usize) -> &[u32] {
        &self.cols[self.starts[t]..self.starts[t + 1]]
    }
}

/// See [`Outliers`].
const OUTLIER_RATIO: f32 = 6.0;

/// Q8_0 blocks of a row-major `rows × k` f32 matrix, in the kernels' layout.
fn quantize_q8_0(values: &[f32], rows: usize, k: usize, layout: Layout) -> Result<QMatrix, String> {
    let quantised = Tensor::from_slice(values, (rows, k), &Device::Cpu)
        .and_then(|t| QTensor::quantize(&t, GgmlDType::Q8_0))
        .and_then(|q| q.data().map(|d| d.into_owned()))
        .map_err(|e| e.to_string())?;
    QMatrix::from_ggml(GgmlDType::Q8_0, rows, k, &quantised, layout)
}

fn add(row: &mut [f32], bias: &[f32]) {
    row.iter_mut().zip(bias).for_each(|(x, b)| *x += b);
}

/// `(x - mean) / sqrt(var + eps) · weight + bias`, in place.
fn layer_norm(row: &mut [f32], norm: &LayerNorm, eps: f32) {
    let n = row.len() as f32;
    let mean = row.iter().sum::<f32>() / n;
    let var = row.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / n;
    let inv = 1.0 / (var + eps).sqrt();
    for ((x, w), b) in row.iter_mut().zip(&norm.weight).zip(&norm.bias) {
        *x = (*x - mean) * inv * w + b;
    }
}

fn activate(act: Activation, x: f32) -> f32 {
    match act {
        Activation::GeluErf => 0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2)),
        Activation::GeluTanh => {
            const C: f32 = 0.797_884_6; // sqrt(2/π)
            let u = C * (x + 0.044_715 * x * x * x);
            // tanh(u) = 1 - 2 / (e^{2u} + 1)
            0.5 * x * (2.0 - 2.0 / (ops::exp(2.0 * u) + 1.0))
        }
        Activation::Relu => x.max(0.0),
    }
}

/// The error function to about 1.5e-7 absolute error (Abramowitz and Stegun 7.1.26).
fn erf(x: f32) -> f32 {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [
        0.254_829_6,
        -0.284_496_74,
        1.421_413_8,
        -1.453_152_1,
        1.061_405_4,
    ];
    let ax = x.abs();
    let t = 1.0 / (1.0 + P * ax);
    let poly = t * (A[0] + t * (A[1] + t * (A[2] + t * (A[3] + t * A[4]))));
    let y = 1.0 - poly * ops::exp(-ax * ax);
    y.copysign(x)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn blocked_scores_equal_the_row_by_row_sums_bit_for_bit() {
        // Lengths around the block sizes, head widths of MiniLM, MPNet and an odd one.
        for (len, d) in [
            (1usize, 32usize),
            (3, 64),
            (4, 32),
            (5, 8),
            (16, 32),
            (17, 64),
            (33, 24),
        ] {
            let lenp = len.next_multiple_of(KEYS);
            let value = |i: usize| ((i * 7919 % 2003) as f32 - 1001.0) / 97.0;
            let mut keys = vec![0f32; d * lenp];
            for dim in 0..d {
                for j in 0..len {
                    keys[dim * lenp + j] = value(dim * 31 + j * 17 + 5);
                }
            }
            let qs: Vec<Vec<f32>> = (0..len)
                .map(|r| (0..d).map(|dim| value(r * 131 + dim * 3)).collect())
                .collect();
            let queries: Vec<&[f32]> = qs.iter().map(Vec::as_slice).collect();
            let scale = 1.0 / (d as f32).sqrt();
            let mut scores = vec![f32::NAN; len * lenp];
            scores_of(&queries, &keys, scale, &mut scores);
            for (r, q) in qs.iter().enumerate() {
                for j in 0..len {
                    let mut want = 0f32;
                    for (dim, &v) in q.iter().enumerate() {
                        want += v * scale * keys[dim * lenp + j];
                    }
                    let got = scores[r * lenp + j];
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "len {len}, d {d}, ({r}, {j})"
                    );
                }
            }
        }
    }

    #[test]
    fn column_cache_keeps_at_most_its_budget_and_gives_the_dequantised_columns() {
        let (rows, k) = (8, 64);
        let values: Vec<f32> = (0..rows * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let weight = quantize_q8_0(&values, rows, k, Layout::for_isa(Isa::detect())).unwrap();
        let cache = ColumnCache::new(k);
        assert_eq!(cache.budget, 8);
        let mut expected = vec![0f32; rows];
        for c in 0..8 {
            weight.column(c * 3, &mut expected);
            assert_eq!(cache.get(&weight, c * 3).unwrap(), &expected[..]);
        }
        // The budget is spent: a new column is not stored, the stored ones still come back.
        assert!(cache.get(&weight, 1).is_none());
        assert!(cache.slots[1].get().is_none());
        weight.column(21, &mut expected);
        assert_eq!(cache.get(&weight, 21).unwrap(), &expected[..]);
        assert_eq!(cache.slots.iter().filter(|s| s.get().is_some()).count(), 8);
        assert!(cache.get(&weight, k).is_none());

        // Threads racing for the same columns fill each once and give back the claims that
        // lost, so every claim left is a stored column and the budget still goes to
        // distinct columns. (A racing thread may see a transient `None`: callers spill.)
        let cache = ColumnCache::new(k);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for c in 0..8 {
                        let _ = cache.get(&weight, c);
                    }
                });
            }
        });
        let stored = || cache.slots.iter().filter(|s| s.get().is_some()).count();
        let claimed = || cache.claimed.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(claimed(), stored());
        for c in 0..8 {
            assert!(cache.get(&weight, c).is_some());
        }
        assert_eq!((claimed(), stored()), (8, 8));
        assert!(cache.get(&weight, 8).is_none());
    }

    #[test]
    fn erf_matches_known_values() {
        for (x, want) in [
            (0.0f32, 0.0f32),
            (0.5, 0.520_499_9),
            (1.0, 0.842_700_8),
            (-1.0, -0.842_700_8),
            (2.0, 0.995_322_3),
            (-3.5, -0.999_999_3),
        ] {
            assert!((erf(x) - want).abs() < 3e-7, "erf({x}) = {}", erf(x));
        }
    }

    #[test]
    fn gelu_variants_agree_roughly() {
        for x in [-3.0f32, -1.0, -0.1, 0.0, 0.3, 1.0, 2.5] {
            let exact = activate(Activation::GeluErf, x);
            let tanh = activate(Activation::GeluTanh, x);
            assert!((exact - tanh).abs() < 2e-3, "{x}: {exact} vs {tanh}");
        }
        assert_eq!(activate(Activation::Relu, -2.0), 0.0);
        assert_eq!(activate(Activation::GeluErf, 0.0), 0.0);
    }

    #[test]
    fn outliers_are_chosen_per_row_and_capped() {
        let k = 64;
        let mut x = vec![0.5f32; 3 * k];
        x[5] = 20.0; // row 0: one outlier
        x[k + 7] = -30.0; // row 1: three outliers, over the cap of two
        x[k + 40] = 25.0;
        x[k + 41] = 10.0;
        let o = Outliers::find(&x, 3, k);
        assert_eq!(o.of(0), &[5]);
        assert_eq!(o.of(1), &[7, 40], "the largest two, largest first");
        assert!(o.of(2).is_empty());
        assert!(!o.is_empty());
        assert!(Outliers::find(&vec![1.0; 2 * k], 2, k).is_empty());
    }

    #[test]
    fn relative_buckets_follow_t5() {
        // 32 buckets, max distance 128 (MPNet): a key n places before the query (relative
        // -n) falls in bucket n for n < 8, then 8 + floor(8·log16(n/8)) = 8 + floor(log2(n²/64))
        // up to 15; keys after the query use buckets 16 and up the same way.
        let expected = |n: u64| -> usize {
            if n < 8 {
                n as usize
            } else {
                (8 + (63 - (n * n).leading_zeros()) as usize - 6).min(15)
            }
        };
        for n in 0..600i64 {
            let b = expected(n as u64);
            assert_eq!(relative_position_bucket(-n, 32, 128), b, "-{n}");
            let after = if n == 0 { 0 } else { 16 + b };
            assert_eq!(relative_position_bucket(n, 32, 128), after, "+{n}");
        }
        // Spot values from transformers.
        assert_eq!(relative_position_bucket(-15, 32, 128), 9);
        assert_eq!(relative_position_bucket(-16, 32, 128), 10);
        assert_eq!(relative_position_bucket(-127, 32, 128), 15);
        assert_eq!(relative_position_bucket(3, 32, 128), 19);
    }

    #[test]
    fn relative_bias_rows_line_up_with_keys() {
        let buckets = 32;
        let heads = 2;
        // Bias of bucket b for head h: 100·h + b.
        let weight: Vec<f32> = (0..buckets)
            .flat_map(|b| (0..heads).map(move |h| (100 * h + b) as f32))
            .collect();
        let bias = RelativeBias::new(&weight, buckets, heads, 20);
        for (i, len) in [(0, 1), (0, 20), (7, 12), (19, 20)] {
            for head in 0..heads {
                let row = bias.row(head, i, len);
                assert_eq!(row.len(), len);
                for (j, &b) in row.iter().enumerate() {
                    let bucket = relative_position_bucket(j as i64 - i as i64, buckets, 128);
                    assert_eq!(b, (100 * head + bucket) as f32, "i {i} j {j} head {head}");
                }
            }
        }
    }

    #[test]
    fn layer_norm_centres_and_scales() {
        let norm = LayerNorm {
            weight: vec![2.0; 4],
            bias: vec![1.0; 4],
        };
        let mut row = [1.0f32, 2.0, 3.0, 4.0];
        layer_norm(&mut row, &norm, 0.0);
        let mean: f32 = row.iter().sum::<f32>() / 4.0;
        assert!((mean - 1.0).abs() < 1e-6);
        let sd = (row.iter().map(|x| (x - 1.0).powi(2)).sum::<f32>() / 4.0).sqrt();
        assert!((sd - 2.0).abs() < 1e-5);
    }
}
