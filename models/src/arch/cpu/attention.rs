//! Rotary embeddings, a preallocated f32 KV cache written in place, and causal attention
//! with grouped KV heads.
//!
//! Keys are stored in blocks of 16 positions, transposed within a block
//! (`[kv_head][block][dim][16]`), so the scores of one query against 16 keys are 16-wide
//! multiply-adds with no horizontal sums. Values are stored by position
//! (`[kv_head][pos][dim]`). The cache is allocated zeroed for the whole context, so the OS
//! only backs the pages that positions actually reach.

#![allow(unsafe_code)]

use std::ops::Range;

use super::ops;
use super::pool::{Disjoint, Pool};
use crate::arch::shape::{Rope, RopeStyle};

/// Positions per key block.
const KB: usize = 16;

/// Shapes of the attention part of a layer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_kv: usize,
    /// Values per head.
    pub head_dim: usize,
}

impl Dims {
    /// Width of a `q|k|v` row.
    pub(crate) fn qkv_width(&self) -> usize {
        (self.n_head + 2 * self.n_kv) * self.head_dim
    }
}

struct LayerCache {
    k: Vec<f32>,
    v: Vec<f32>,
}

/// KV cache of every layer plus the rotary tables and per-thread score buffers.
pub(crate) struct Attention {
    dims: Dims,
    /// Positions the cache holds, a multiple of [`KB`].
    cap: usize,
    layers: Vec<LayerCache>,
    style: RopeStyle,
    /// Rotated values at the start of each head.
    rot: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
    /// Tables of the sliding-window layers' own rotary embedding (Gemma 3), when they
    /// have one.
    local: Option<(Vec<f32>, Vec<f32>)>,
    /// Per layer, the sliding window it attends within (`None`: every earlier position).
    windows: Vec<Option<usize>>,
    scores: Vec<f32>,
    threads: usize,
}

impl Attention {
    /// Allocates the cache for `n_layer` layers and `max_seq` positions, and the tables of
    /// `rope`.
    pub(crate) fn new(
        dims: Dims,
        n_layer: usize,
        max_seq: usize,
        rope: &Rope,
        threads: usize,
    ) -> Self {
        let cap = max_seq.next_multiple_of(KB);
        let size = dims.n_kv * cap * dims.head_dim;
        let layers = (0..n_layer)
            .map(|_| LayerCache {
                k: vec![0.0; size],
                v: vec![0.0; size],
            })
            .collect();
        // The same tables as the candle implementation.
        let (cos, sin) = rope.tables(max_seq);
        Self {
            dims,
            cap,
            layers,
            style: rope.style,
            rot: rope.dims,
            cos,
            sin,
            local: None,
            windows: vec![None; n_layer],
            scores: vec![0.0; threads * cap],
            threads,
        }
    }

    /// Gives the layers that have one a sliding window (`windows`, one entry per layer)
    /// and makes them rotate by `local` (same style and width as the global rotation).
    pub(crate) fn with_sliding_windows(
        mut self,
        windows: Vec<Option<usize>>,
        local: &Rope,
    ) -> Self {
        assert!(
            windows.len() == self.layers.len()
                && local.style == self.style
                && local.dims == self.rot
                && windows.iter().all(|w| w.is_none_or(|w| w > 0)),
            "one positive window or none per layer, and a rotation of the same shape"
        );
        self.windows = windows;
        self.local = Some(local.tables(self.cap));
        self
    }

    /// Rotates the queries and keys of `seq` rows of `qkv` (positions `pos..`), scales the
    /// queries by `1/sqrt(head_dim)`, and writes keys and values into layer `layer`'s cache.
    /// With `qk_norm` (query weights, key weights, epsilon), every query and key head is
    /// RMS-normalised first; with `rotate` false (smollm3's NoPE layers) nothing turns.
    pub(crate) fn store(
        &mut self,
        layer: usize,
        qkv: &mut [f32],
        seq: usize,
        pos: usize,
        qk_norm: Option<(&[f32], &[f32], f32)>,
        rotate: bool,
    ) {
        let Dims {
            n_head,
            n_kv,
            head_dim: d,
        } = self.dims;
        let width = self.dims.qkv_width();
        let rot = if rotate { self.rot } else { 0 };
        let half = self.rot / 2;
        let scale = 1.0 / (d as f32).sqrt();
        let cache = &mut self.layers[layer];
        let (cos_t, sin_t) = match (&self.local, self.windows[layer]) {
            (Some((c, s)), Some(_)) => (c, s),
            _ => (&self.cos, &self.sin),
        };
        for c in 0..seq {
            let p = pos + c;
            let (cos, sin) = (
                &cos_t[p * half..(p + 1) * half],
                &sin_t[p * half..(p + 1) * half],
            );
            let row = &mut qkv[c * width..(c + 1) * width];
            let (q, kv) = row.split_at_mut(n_head * d);
            let (k, v) = kv.split_at_mut(n_kv * d);
            let rotate = match self.style {
                RopeStyle::Interleaved => rope_interleaved,
                RopeStyle::Halves => rope_halves,
            };
            for head in q.chunks_exact_mut(d) {
                if let Some((w, _, eps)) = qk_norm {
                    rms_norm(head, w, eps);
                }
                rotate(&mut head[..rot], cos, sin);
                head.iter_mut().for_each(|x| *x *= scale);
            }
            for head in k.chunks_exact_mut(d) {
                if let Some((_, w, eps)) = qk_norm {
                    rms_norm(head, w, eps);
                }
                rotate(&mut head[..rot], cos, sin);
            }
            let (blk, lane) = (p / KB, p % KB);
            for g in 0..n_kv {
                let base = g * self.cap * d + blk * d * KB + lane;
                for (i, &x) in k[g * d..(g + 1) * d].iter().enumerate() {
                    cache.k[base + i * KB] = x;
                }
                let vbase = (g * self.cap + p) * d;
                cache.v[vbase..vbase + d].copy_from_slice(&v[g * d..(g + 1) * d]);
            }
        }
    }

    /// Causal attention of `seq` queries (rows of `qkv`, already stored with [`Self::store`]
    /// at positions `pos..`) over the cached keys (within the layer's sliding window, if it
    /// has one), written to `out` (`seq × n_head·head_dim`).
    pub(crate) fn attend(
        &mut self,
        pool: &Pool,
        layer: usize,
        qkv: &[f32],
        seq: usize,
        pos: usize,
        out: &mut [f32],
    ) {
        let dims = self.dims;
        let (d, width, cap) = (dims.head_dim, dims.qkv_width(), self.cap);
        let hidden = dims.n_head * d;
        let n_rep = dims.n_head / dims.n_kv;
        assert!(
            pool.threads() <= self.threads,
            "score buffers were sized for fewer threads"
        );
        let cache = &self.layers[layer];
        let window = self.windows[layer];
        let out = Disjoint::new(out);
        let scores = Disjoint::new(&mut self.scores);
        let one = |c: usize, h: usize, scratch: &mut [f32]| {
            let g = h / n_rep;
            let q = &qkv[c * width + h * d..c * width + (h + 1) * d];
            let end = pos + c + 1;
            let keys = window.map_or(0, |w| end.saturating_sub(w))..end;
            let kc = &cache.k[g * cap * d..(g + 1) * cap * d];
            let vc = &cache.v[g * cap * d..(g + 1) * cap * d];
            // SAFETY: every (token, head) pair belongs to exactly one chunk, hence one thread,
            // and owns its `head_dim` slice of `out`.
            let o = unsafe { out.part(c * hidden + h * d, d) };
            match d {
                64 => head::<64>(q, kc, vc, keys, scratch, o),
                128 => head::<128>(q, kc, vc, keys, scratch, o),
                256 => head::<256>(q, kc, vc, keys, scratch, o),
                _ => head_any(d, q, kc, vc, keys, scratch, o),
            }
        };
        let job = |t: usize, c: usize, heads: std::ops::Range<usize>| {
            // SAFETY: each thread index has its own `cap`-sized score buffer, and a thread
            // runs one chunk at a time.
            let scratch = unsafe { scores.part(t * cap, cap) };
            for h in heads {
                one(c, h, scratch);
            }
        };
        if seq == 1 {
            // Decode: one chunk per head.
            pool.run(dims.n_head, &|t, h| job(t, 0, h..h + 1));
        } else {
            // Prefill: one chunk per token, all heads (later tokens see more keys; handing
            // chunks out dynamically balances that).
            pool.run(seq, &|t, c| job(t, c, 0..dims.n_head));
        }
    }
}

/// Interleaved rotary embedding (pairs of adjacent values), as candle's `rope_i`.
fn rope_interleaved(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    for ((pair, &c), &s) in x.chunks_exact_mut(2).zip(cos).zip(sin) {
        let (a, b) = (pair[0], pair[1]);
        pair[0] = a * c - b * s;
        pair[1] = a * s + b * c;
    }
}

/// Rotary embedding of the two halves of a head (value `i` with value `i + d/2`), as
/// candle's `rope`.
fn rope_halves(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let (lo, hi) = x.split_at_mut(x.len() / 2);
    for (((a, b), &c), &s) in lo.iter_mut().zip(hi).zip(cos).zip(sin) {
        let (x0, x1) = (*a, *b);
        *a = x0 * c - x1 * s;
        *b = x0 * s + x1 * c;
    }
}

/// RMS normalisation of one head in place, with per-dimension weights.
fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    let g = ops::rms_gain(x, eps);
    for (v, &wi) in x.iter_mut().zip(w) {
        *v *= g * wi;
    }
}

/// `acc += x · row`, 16 lanes (one AVX-512 register, two AVX ones).
#[inline(always)]
fn axpy16(acc: &mut [f32; KB], x: f32, row: &[f32; KB]) {
    for j in 0..KB {
        acc[j] += x * row[j];
    }
}

/// Views a slice of exactly `N` values as an array.
#[inline(always)]
fn arr<const N: usize>(s: &[f32]) -> &[f32; N] {
    s.try_into()
        .unwrap_or_else(|_| unreachable!("slices are cut to {N} values"))
}

/// The key blocks that hold positions `keys`, each with its `KB` score slots in `scratch`
/// (indexed by absolute position, so `scratch[keys]` are the scores afterwards).
fn key_blocks<'a>(
    scratch: &'a mut [f32],
    keys: &Range<usize>,
) -> impl Iterator<Item = (usize, &'a mut [f32])> {
    scratch[..keys.end.div_ceil(KB) * KB]
        .chunks_exact_mut(KB)
        .enumerate()
        .skip(keys.start / KB)
}

/// One query head against the cached positions `keys`, for a head size known at compile
/// time.
fn head<const D: usize>(
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    keys: Range<usize>,
    scratch: &mut [f32],
    out: &mut [f32],
) {
    let q: &[f32; D] = arr(q);
    for (blk, sc) in key_blocks(scratch, &keys) {
        let kb = &kc[blk * D * KB..(blk + 1) * D * KB];
        // Four independent accumulators hide the multiply-add latency.
        let (mut a0, mut a1, mut a2, mut a3) = ([0f32; KB], [0f32; KB], [0f32; KB], [0f32; KB]);
        for (i, rows) in kb.chunks_exact(4 * KB).enumerate() {
            axpy16(&mut a0, q[4 * i], arr(&rows[..KB]));
            axpy16(&mut a1, q[4 * i + 1], arr(&rows[KB..2 * KB]));
            axpy16(&mut a2, q[4 * i + 2], arr(&rows[2 * KB..3 * KB]));
            axpy16(&mut a3, q[4 * i + 3], arr(&rows[3 * KB..]));
        }
        for j in 0..KB {
            sc[j] = (a0[j] + a1[j]) + (a2[j] + a3[j]);
        }
    }
    let sc = &mut scratch[keys.clone()];
    let sum = ops::softmax_unnormalised(sc);
    let mut a0 = [0f32; D];
    let mut a1 = [0f32; D];
    let mut pairs = sc.chunks_exact(2);
    let mut rows = vc[keys.start * D..keys.end * D].chunks_exact(2 * D);
    for (p, v) in (&mut pairs).zip(&mut rows) {
        let (v0, v1): (&[f32; D], &[f32; D]) = (arr(&v[..D]), arr(&v[D..]));
        for i in 0..D {
            a0[i] += p[0] * v0[i];
        }
        for i in 0..D {
            a1[i] += p[1] * v1[i];
        }
    }
    if let [p] = pairs.remainder() {
        let v0: &[f32; D] = arr(&vc[(keys.end - 1) * D..keys.end * D]);
        for i in 0..D {
            a0[i] += p * v0[i];
        }
    }
    let inv = 1.0 / sum;
    for i in 0..D {
        out[i] = (a0[i] + a1[i]) * inv;
    }
}

/// [`head`] for any head size.
fn head_any(
    d: usize,
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    keys: Range<usize>,
    scratch: &mut [f32],
    out: &mut [f32],
) {
    for (blk, sc) in key_blocks(scratch, &keys) {
        let kb = &kc[blk * d * KB..(blk + 1) * d * KB];
        let mut acc = [0f32; KB];
        for (i, row) in kb.chunks_exact(KB).enumerate() {
            for j in 0..KB {
                acc[j] += q[i] * row[j];
            }
        }
        sc.copy_from_slice(&acc);
    }
    let sc = &mut scratch[keys.clone()];
    let sum = ops::softmax_unnormalised(sc);
    out.fill(0.0);
    for (j, &p) in keys.zip(sc.iter()) {
        for (o, v) in out.iter_mut().zip(&vc[j * d..(j + 1) * d]) {
            *o += p * v;
        }
    }
    let inv = 1.0 / sum;
    out.iter_mut().for_each(|o| *o *= inv);
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    /// Plain causal attention over explicit key/value rows.
    fn reference(q: &[f32], ks: &[Vec<f32>], vs: &[Vec<f32>]) -> Vec<f32> {
        let scale = 1.0 / (q.len() as f32).sqrt();
        let s: Vec<f32> = ks
            .iter()
            .map(|k| k.iter().zip(q).map(|(a, b)| a * b).sum::<f32>() * scale)
            .collect();
        let max = s.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let e: Vec<f32> = s.iter().map(|v| (v - max).exp()).collect();
        let sum: f32 = e.iter().sum();
        let mut out = vec![0f32; q.len()];
        for (p, v) in e.iter().zip(vs) {
            for (o, x) in out.iter_mut().zip(v) {
                *o += p / sum * x;
            }
        }
        out
    }

    /// A prompt attends token by token with all heads in one chunk, decode head by head
    /// in chunks of their own; a token must get the same bits either way (a prompt split
    /// by the prefix cache then answers as a whole one). Four head sizes, 1 to 4 query heads
    /// a KV head.
    #[test]
    fn a_prompt_and_decode_give_a_token_the_same_bits() {
        for (n_head, n_kv, head_dim) in [(8, 2, 64), (6, 1, 128), (9, 3, 64), (4, 1, 256)] {
            let dims = Dims {
                n_head,
                n_kv,
                head_dim,
            };
            let pool = Pool::new(2).expect("pool");
            let rope = Rope {
                style: RopeStyle::Halves,
                dims: head_dim,
                base: 10_000.0,
                linear: 1.0,
                factors: None,
                attn_factor: 1.0,
            };
            let mut rng = StdRng::seed_from_u64(9);
            let width = dims.qkv_width();
            let total = 35;
            let raw: Vec<f32> = (0..total * width)
                .map(|_| rng.gen_range(-1f32..1.0))
                .collect();
            let hidden = n_head * head_dim;
            let run = |one_by_one: bool| {
                let mut att = Attention::new(dims, 1, 64, &rope, 2);
                let mut qkv = raw.clone();
                let mut outs = vec![0f32; total * hidden];
                let step = if one_by_one { 1 } else { total };
                for from in (0..total).step_by(step) {
                    let to = (from + step).min(total);
                    let rows = &mut qkv[from * width..to * width];
                    att.store(0, rows, to - from, from, None, true);
                    att.attend(
                        &pool,
                        0,
                        rows,
                        to - from,
                        from,
                        &mut outs[from * hidden..to * hidden],
                    );
                }
                outs
            };
            let (prompt, decode) = (run(false), run(true));
            for (i, (a, b)) in prompt.iter().zip(&decode).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{n_head}/{n_kv} heads of {head_dim}: token {} value {}",
                    i / hidden,
                    i % hidden
                );
            }
        }
    }

    #[test]
    fn cached_attention_matches_reference() {
        // Windows: none, one that starts inside a key block, one wider than any prefix.
        for (head_dim, window) in [
            (64usize, None),
            (32, None),
            (64, Some(5)),
            (32, Some(21)),
            (64, Some(100)),
        ] {
            let dims = Dims {
                n_head: 4,
                n_kv: 2,
                head_dim,
            };
            let pool = Pool::new(2).expect("pool");
            let rope = Rope {
                style: RopeStyle::Interleaved,
                dims: head_dim,
                base: 10_000.0,
                linear: 1.0,
                factors: None,
                attn_factor: 1.0,
            };
            let mut att = Attention::new(dims, 1, 64, &rope, 2);
            if window.is_some() {
                // The same rotation as the local one, so the reference below rotates alike.
                att = att.with_sliding_windows(vec![window], &rope);
            }
            let mut rng = StdRng::seed_from_u64(5);
            let width = dims.qkv_width();
            // Prefill 37 tokens, then decode 3 more one by one.
            let total = 40;
            let raw: Vec<f32> = (0..total * width)
                .map(|_| rng.gen_range(-1f32..1.0))
                .collect();
            let mut rotated = raw.clone();
            let mut outs = vec![0f32; total * 4 * head_dim];
            let hidden = 4 * head_dim;
            let mut run = |from: usize, to: usize| {
                let seq = to - from;
                let qkv = &mut rotated[from * width..to * width];
                att.store(0, qkv, seq, from, None, true);
                att.attend(
                    &pool,
                    0,
                    qkv,
                    seq,
                    from,
                    &mut outs[from * hidden..to * hidden],
                );
            };
            run(0, 37);
            for p in 37..total {
                run(p, p + 1);
            }
            // Reference: rotate with the same tables, no scaling, then plain attention.
            let half = head_dim / 2;
            let rot = |v: &[f32], p: usize| {
                let mut v = v.to_vec();
                for h in v.chunks_exact_mut(head_dim) {
                    rope_interleaved(
                        h,
                        &att.cos[p * half..(p + 1) * half],
                        &att.sin[p * half..(p + 1) * half],
                    );
                }
                v
            };
            for c in 0..total {
                for h in 0..4 {
                    let g = h / 2;
                    let q = rot(
                        &raw[c * width + h * head_dim..c * width + (h + 1) * head_dim],
                        c,
                    );
                    let first = window.map_or(0, |w: usize| (c + 1).saturating_sub(w));
                    let ks: Vec<Vec<f32>> = (first..=c)
                        .map(|j| {
                            rot(
                                &raw[j * width + (4 + g) * head_dim
                                    ..j * width + (5 + g) * head_dim],
                                j,
                            )
                        })
                        .collect();
                    let vs: Vec<Vec<f32>> = (first..=c)
                        .map(|j| {
                            raw[j * width + (6 + g) * head_dim..j * width + (7 + g) * head_dim]
                                .to_vec()
                        })
                        .collect();
                    let want = reference(&q, &ks, &vs);
                    let got = &outs[c * hidden + h * head_dim..c * hidden + (h + 1) * head_dim];
                    for (a, b) in got.iter().zip(&want) {
                        assert!(
                            (a - b).abs() < 1e-5,
                            "d={head_dim} window {window:?} token {c} head {h}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }
}
