//! Weight matrices in the kernels' layout, activation quantisation (once per matmul input,
//! as ggml does), and the parallel matrix products built from the tile kernels.

#![allow(unsafe_code)]

use std::ops::Range;

use candle_core::quantized::GgmlDType;
use half::f16;

use super::kernels::{
    self, ActRows, Format, Isa, Layout, PanelActs, PanelRows, WeightRows, BLOCK, PANEL_TOKENS,
};

/// Values in a Q6_K super-block, its bytes, and values per sub-block (one scale each).
const Q6K_VALUES: usize = 256;
const Q6K_BYTES: usize = 210;
const Q6K_SUB: usize = 16;
use super::ops;
use super::pages::Pages;
use super::pool::{Disjoint, Pool};

/// Values in a Q4_K super-block, and its bytes.
const Q4K_VALUES: usize = 256;
const Q4K_BYTES: usize = 144;

/// The 6-bit scale and minimum factors of Q4_K sub-block `j` (of 8), packed in 12 bytes:
/// sub-blocks 0–3 in the low 6 bits of bytes 0–3 (scales) and 4–7 (minimums), 4–7 in the
/// nibbles of bytes 8–11 plus the top 2 bits of bytes 0–7.
fn q4k_scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Rows of a matmul chunk are a multiple of this (keeps 4-row tiles whole).
const ROW_ALIGN: usize = 16;

/// Rows per chunk of a parallel matmul over `rows` rows: about eight chunks per thread, so
/// that a thread that loses its core holds up little, and whole 16-row groups.
fn rows_per_chunk(rows: usize, threads: usize) -> usize {
    rows.div_ceil(8 * threads)
        .next_multiple_of(ROW_ALIGN)
        .max(ROW_ALIGN)
}

/// A quantised weight matrix of `rows × k` in the kernels' packed layout.
pub(crate) struct QMatrix {
    fmt: Format,
    layout: Layout,
    rows: usize,
    k: usize,
    nbp: usize,
    q: Pages<u8>,
    d: Pages<f16>,
    m: Pages<f16>,
}

impl QMatrix {
    /// Repacks a GGUF tensor of `rows` rows of `k` values stored as `dtype` blocks. Q8_0,
    /// Q4_0 and Q4_1 keep their values exactly; Q4_K is exact in its 4-bit values and keeps
    /// each 32-value sub-block's scale and minimum (super-block scale × 6-bit factor) as
    /// f16, in the Q4_1 layout (about 0.05% rounding of a scale, well under the 8-bit
    /// activations' error). Other types have no kernel here. Each row's blocks are arranged
    /// as `layout` says (the activations it is multiplied with must share it).
    pub(crate) fn from_ggml(
        dtype: GgmlDType,
        rows: usize,
        k: usize,
        data: &[u8],
        layout: Layout,
    ) -> Result<Self, String> {
        let (fmt, block_values, block_bytes) = match dtype {
            GgmlDType::Q8_0 => (Format::Q8_0, BLOCK, 34),
            GgmlDType::Q4_0 => (Format::Q4_0, BLOCK, 18),
            GgmlDType::Q4_1 => (Format::Q4_1, BLOCK, 20),
            GgmlDType::Q4K => (Format::Q4_1, Q4K_VALUES, Q4K_BYTES),
            GgmlDType::Q6K if layout == Layout::Lanes => (Format::Q6, Q6K_VALUES, Q6K_BYTES),
            GgmlDType::Q6K => {
                return Err("Q6_K weights have a kernel in the lane layout only".into())
            }
            other => return Err(format!("{other:?} weights have no CPU kernel")),
        };
        if !k.is_multiple_of(block_values) {
            return Err(format!("row width {k} is not a multiple of {block_values}"));
        }
        let nb = k / BLOCK;
        if data.len() != rows * (k / block_values) * block_bytes {
            return Err(format!(
                "{} bytes of data for {rows}×{k} {dtype:?} values",
                data.len()
            ));
        }
        let nbp = nb.next_multiple_of(2);
        let rb = fmt.row_bytes(nbp * BLOCK);
        let mut m = Self {
            fmt,
            layout,
            rows,
            k,
            nbp,
            q: Pages::zeroed(rows * rb),
            d: Pages::zeroed(rows * nbp * fmt.scales_per_block(layout)),
            m: Pages::zeroed(
                if fmt.has_second_scale() && fmt.scales_per_block(layout) == 1 {
                    rows * nbp
                } else {
                    0
                },
            ),
        };
        let half = |b: &[u8], at: usize| f16::from_le_bytes([b[at], b[at + 1]]);
        // One 32-value block at a time: its unsigned values, scale and (Q4_1) minimum.
        let mut put = |r: usize, b: usize, u: &[u8; BLOCK], d: f16, min: Option<f16>| {
            m.d[kernels::scale_index(fmt, layout, nbp, rows, r, b)] = d;
            if let Some(min) = min {
                m.set_second(r, b, min);
            }
            // Each group of four values is contiguous in either layout.
            for (g, four) in u.chunks_exact(4).enumerate() {
                let (at, shift) = kernels::weight_index(fmt, layout, nbp, rows, r, b, 4 * g);
                for (dst, &v) in m.q[at..at + 4].iter_mut().zip(four) {
                    *dst |= v << shift;
                }
            }
        };
        let per_row = k / block_values;
        if fmt == Format::Q6 {
            for r in 0..rows {
                for sb in 0..per_row {
                    let at = (r * per_row + sb) * block_bytes;
                    m.put_q6k(r, sb, &data[at..at + block_bytes]);
                }
            }
            return Ok(m);
        }
        for r in 0..rows {
            for sb in 0..per_row {
                let at = (r * per_row + sb) * block_bytes;
                let blk = &data[at..at + block_bytes];
                let mut u = [0u8; BLOCK];
                match dtype {
                    GgmlDType::Q8_0 => {
                        for (j, &byte) in blk[2..].iter().enumerate() {
                            u[j] = byte ^ 0x80; // (q as i8) + 128
                        }
                        put(r, sb, &u, half(blk, 0), None);
                    }
                    GgmlDType::Q4_0 | GgmlDType::Q4_1 => {
                        let (qs, min) = if dtype == GgmlDType::Q4_1 {
                            (&blk[4..], Some(half(blk, 2)))
                        } else {
                            (&blk[2..], None)
                        };
                        for (j, &byte) in qs.iter().enumerate() {
                            u[j] = byte & 0x0F;
                            u[j + BLOCK / 2] = byte >> 4;
                        }
                        put(r, sb, &u, half(blk, 0), min);
                    }
                    _ => {
                        // Q4_K: d, dmin, 12 bytes of packed 6-bit scales and minimums, then
                        // 128 bytes whose low nibbles are sub-block 2i and high nibbles
                        // sub-block 2i + 1 of each 64 values.
                        let (d, dmin) = (half(blk, 0).to_f32(), half(blk, 2).to_f32());
                        let scales = &blk[4..16];
                        for j in 0..Q4K_VALUES / BLOCK {
                            let (sc, mn) = q4k_scale_min(j, scales);
                            let qs = &blk[16 + 32 * (j / 2)..16 + 32 * (j / 2 + 1)];
                            for (v, &byte) in u.iter_mut().zip(qs) {
                                *v = if j.is_multiple_of(2) {
                                    byte & 0x0F
                                } else {
                                    byte >> 4
                                };
                            }
                            put(
                                r,
                                sb * (Q4K_VALUES / BLOCK) + j,
                                &u,
                                f16::from_f32(d * sc as f32),
                                Some(f16::from_f32(-dmin * mn as f32)),
                            );
                        }
                    }
                }
            }
        }
        Ok(m)
    }

    /// Places Q6_K super-block `sb` of row `r` (`blk`, 210 bytes) as eight [`Format::Q6`]
    /// blocks. ggml's block: 128 bytes of low nibbles (`ql`), 64 of top bit pairs (`qh`),
    /// 16 signed 8-bit sub-block scales, then the f16 super-block scale `d`. Each 128-value
    /// half `n` reads `ql[64n..]` and `qh[32n..]`: for `l < 32`, values `l`, `l + 32`,
    /// `l + 64`, `l + 96` are the low nibble of `ql[l]`, of `ql[l + 32]`, the high nibble of
    /// `ql[l]`, of `ql[l + 32]`, each with bits `0–1`, `2–3`, `4–5`, `6–7` of `qh[l]` on top;
    /// value `i` of the super-block has scale `d · scales[i / 16]`. The values (`q + 32`,
    /// 0..64) are kept exactly, each 16-value scale as one f16 (rounding about 2^-11).
    fn put_q6k(&mut self, r: usize, sb: usize, blk: &[u8]) {
        let (ql, qh, scales) = (&blk[..128], &blk[128..192], &blk[192..208]);
        let d = f16::from_le_bytes([blk[208], blk[209]]).to_f32();
        let (nbp, rows) = (self.nbp, self.rows);
        // The value `q + 32` of element `i` of the super-block.
        let value = |i: usize| {
            let (n, rest) = (i / 128, i % 128);
            let (quarter, l) = (rest / 32, rest % 32);
            let low_byte = ql[64 * n + l + 32 * (quarter % 2)];
            let low = if quarter < 2 {
                low_byte & 0x0F
            } else {
                low_byte >> 4
            };
            low | (((qh[32 * n + l] >> (2 * quarter)) & 3) << 4)
        };
        for sub in 0..Q6K_VALUES / BLOCK {
            let b = sb * (Q6K_VALUES / BLOCK) + sub;
            // Each group of four values lies in four consecutive bytes (of its nibble step
            // and of its high step), so one place serves the four.
            for g in 0..BLOCK / 4 {
                let [(lo, ls), (hi, hs)] = kernels::q6_index(nbp, rows, r, b, 4 * g);
                for v in 0..4 {
                    let u = value(sub * BLOCK + 4 * g + v);
                    self.q[lo + v] |= (u & 0x0F) << ls;
                    self.q[hi + v] |= (u >> 4) << hs;
                }
            }
            let scale = |half: usize| {
                f16::from_f32(d * scales[(sub * BLOCK + half * Q6K_SUB) / Q6K_SUB] as i8 as f32)
            };
            self.d[kernels::scale_index(self.fmt, self.layout, nbp, rows, r, b)] = scale(0);
            self.set_second(r, b, scale(1));
        }
    }

    /// Sets block `b`'s second value (Q4_1's bias, Q6's second scale) of row `r`.
    fn set_second(&mut self, r: usize, b: usize, v: f16) {
        let (at, in_d) = kernels::second_index(self.fmt, self.layout, self.nbp, self.rows, r, b);
        if in_d {
            self.d[at] = v;
        } else {
            self.m[at] = v;
        }
    }

    /// Stacks matrices of the same format, layout and width row-wise; gives them back
    /// otherwise, and when a part other than the last ends in a short tile of interleaved
    /// rows (which would land amid the stack's tiles).
    pub(crate) fn concat(parts: Vec<QMatrix>) -> Result<QMatrix, Vec<QMatrix>> {
        let Some(first) = parts.first() else {
            return Err(parts);
        };
        let (fmt, layout, k) = (first.fmt, first.layout, first.k);
        if parts
            .iter()
            .any(|p| p.fmt != fmt || p.layout != layout || p.k != k)
            || parts[..parts.len() - 1]
                .iter()
                .any(|p| !p.rows.is_multiple_of(layout.tile_rows()))
        {
            return Err(parts);
        }
        let q = Pages::concat(&parts.iter().map(|p| &p.q[..]).collect::<Vec<_>>());
        let d = Pages::concat(&parts.iter().map(|p| &p.d[..]).collect::<Vec<_>>());
        let m = Pages::concat(&parts.iter().map(|p| &p.m[..]).collect::<Vec<_>>());
        let rows = parts.iter().map(|p| p.rows).sum();
        let nbp = first.nbp;
        Ok(QMatrix {
            fmt,
            layout,
            rows,
            k,
            nbp,
            q,
            d,
            m,
        })
    }

    /// Number of rows (outputs).
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Storage format.
    pub(crate) fn format(&self) -> Format {
        self.fmt
    }

    /// Bytes of weight data held.
    pub(crate) fn bytes(&self) -> usize {
        self.q.len() + 2 * (self.d.len() + self.m.len())
    }

    /// All the rows.
    fn whole(&self) -> WeightRows<'_> {
        WeightRows {
            q: &self.q,
            d: &self.d,
            m: &self.m,
            fmt: self.fmt,
            layout: self.layout,
            nbp: self.nbp,
            rows: self.rows,
            first: 0,
        }
    }

    fn view(&self, r0: usize, n: usize) -> WeightRows<'_> {
        self.whole().sub(r0, n)
    }

    /// Writes column `c` as f32 values into `out` (one per row).
    pub(crate) fn column(&self, c: usize, out: &mut [f32]) {
        let (b, j) = (c / BLOCK, c % BLOCK);
        let w = self.whole();
        for (r, o) in out[..self.rows].iter_mut().enumerate() {
            let (d, m) = w.value_scale_bias(r, b, j);
            *o = d * w.value(r, b, j) as f32 + m;
        }
    }

    /// Writes row `r` as f32 values into `out` (`k` values).
    pub(crate) fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let w = self.view(r, 1);
        for (b, chunk) in out[..self.k].chunks_mut(BLOCK).enumerate() {
            for (j, o) in chunk.iter_mut().enumerate() {
                let (d, m) = w.value_scale_bias(0, b, j);
                *o = d * w.value(0, b, j) as f32 + m;
            }
        }
    }
}

/// Activations quantised to signed 8-bit blocks: `tokens × k` values, padded like the
/// weights.
pub(crate) struct QActs {
    k: usize,
    layout: Layout,
    /// The instruction set that quantises rows into these blocks (every tier gives the
    /// same bits; see [`quantize_block`]).
    isa: Isa,
    nbp: usize,
    q: Vec<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
    h: Vec<f32>,
    /// The rows quantised last, transposed for the prompt kernel ([`kernels::panel`]) in
    /// groups of [`PANEL_TOKENS`], when there were at least [`PANEL_MIN_TOKENS`] of them on
    /// a tier that has it; `panel.tokens` is how many (0: none).
    panel: PanelBuf,
}

/// [`QActs::panel`]: the values, scales and sums of every group of 16 tokens, one group
/// after another (see [`PanelActs`]).
#[derive(Default)]
struct PanelBuf {
    q: Vec<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
    h: Vec<f32>,
    tokens: usize,
}

/// Tokens from which a matrix product runs the prompt kernel ([`kernels::panel`]): 16
/// tokens fill its lanes, and fewer would leave lanes idle that the tile kernel uses.
const PANEL_MIN_TOKENS: usize = PANEL_TOKENS;

impl QActs {
    /// Storage for rows of width `k` (a multiple of 32) arranged as `layout` and
    /// quantised with `isa`, initially for no tokens.
    pub(crate) fn new(k: usize, layout: Layout, isa: Isa) -> Self {
        Self {
            k,
            layout,
            isa,
            nbp: (k / BLOCK).next_multiple_of(2),
            q: Vec::new(),
            d: Vec::new(),
            s: Vec::new(),
            h: Vec::new(),
            panel: PanelBuf::default(),
        }
    }

    /// After quantising `seq` rows: transposes them for the prompt kernel where it runs.
    fn finish(&mut self, seq: usize) {
        if self.isa == Isa::Avx512Vnni && self.layout == Layout::Lanes && seq >= PANEL_MIN_TOKENS {
            self.transpose(seq);
        } else {
            self.panel.tokens = 0;
        }
    }

    /// Group `j` of 16 tokens of [`QActs::panel`].
    fn panel_group(&self, j: usize) -> PanelActs<'_> {
        let (nbp, p) = (self.nbp, &self.panel);
        let (nq, nd) = (nbp * BLOCK * PANEL_TOKENS, nbp * PANEL_TOKENS);
        PanelActs {
            q: &p.q[j * nq..(j + 1) * nq],
            d: &p.d[j * nd..(j + 1) * nd],
            s: &p.s[j * nd..(j + 1) * nd],
            h: &p.h[j * nd..(j + 1) * nd],
        }
    }

    /// Fills [`QActs::panel`] from the first `seq` rows: group `j`'s block `b` holds, for
    /// each of its tokens `c`, the four values `4g..4g + 4` at `64·(8b + g) + 4c`, and the
    /// block's scale, sum and first half's sum at `16b + c`.
    fn transpose(&mut self, seq: usize) {
        let (nbp, kp) = (self.nbp, self.nbp * BLOCK);
        let groups = seq.div_ceil(PANEL_TOKENS);
        let p = &mut self.panel;
        p.q.clear();
        p.q.resize(groups * kp * PANEL_TOKENS, 0);
        p.d.clear();
        p.d.resize(groups * nbp * PANEL_TOKENS, 0.0);
        p.s.clear();
        p.s.resize(groups * nbp * PANEL_TOKENS, 0.0);
        p.h.clear();
        p.h.resize(groups * nbp * PANEL_TOKENS, 0.0);
        // Where each group of four values of a row lies in the lane layout.
        let from: Vec<usize> = (0..nbp * BLOCK / 4)
            .map(|u| self.layout.byte_index(nbp, u / 8, 4 * (u % 8)))
            .collect();
        for c in 0..seq {
            let (j, lane) = (c / PANEL_TOKENS, c % PANEL_TOKENS);
            let row = &self.q[c * kp..(c + 1) * kp];
            let dst = &mut p.q[j * kp * PANEL_TOKENS..(j + 1) * kp * PANEL_TOKENS];
            for (u, &f) in from.iter().enumerate() {
                let at = 64 * u + 4 * lane;
                dst[at..at + 4].copy_from_slice(&row[f..f + 4]);
            }
            for b in 0..nbp {
                let at = (j * nbp + b) * PANEL_TOKENS + lane;
                p.d[at] = self.d[c * nbp + b];
                p.s[at] = self.s[c * nbp + b];
                p.h[at] = self.h[c * nbp + b];
            }
        }
        p.tokens = seq;
    }

    /// Makes room for `tokens` rows (grows only).
    pub(crate) fn reserve(&mut self, tokens: usize) {
        let nbp = self.nbp;
        if self.d.len() < tokens * nbp {
            self.q.resize(tokens * nbp * BLOCK, 0);
            self.d.resize(tokens * nbp, 0.0);
            self.s.resize(tokens * nbp, 0.0);
            self.h.resize(tokens * nbp, 0.0);
        }
    }

    fn view(&self, c0: usize, n: usize) -> ActRows<'_> {
        let nbp = self.nbp;
        ActRows {
            q: &self.q[c0 * nbp * BLOCK..(c0 + n) * nbp * BLOCK],
            d: &self.d[c0 * nbp..(c0 + n) * nbp],
            s: &self.s[c0 * nbp..(c0 + n) * nbp],
            h: &self.h[c0 * nbp..(c0 + n) * nbp],
            layout: self.layout,
            nbp,
        }
    }
}

/// One activation row's block slices: values, scales, and the scaled sums of each block
/// and of its first half.
struct RowOut<'a> {
    q: &'a mut [i8],
    d: &'a mut [f32],
    s: &'a mut [f32],
    h: &'a mut [f32],
}

/// Quantises one 32-value block, `x` (times `gain` and the optional per-value `weight`,
/// multiplied in that order), into `out`: returns the block's unrounded scale
/// (`max |v| / 127`) and the sums of the quantised values of its two halves. Values are
/// rounded half to even, as ggml's SIMD quantisers do, and every tier gives the same bits
/// as the portable code (`quantize_block_tiers_agree_bit_for_bit`).
fn quantize_block(
    isa: Isa,
    x: &[f32],
    gain: f32,
    weight: Option<&[f32]>,
    out: &mut [i8],
) -> (f32, [i32; 2]) {
    let (x, out) = (&x[..BLOCK], &mut out[..BLOCK]);
    let weight = weight.map(|w| &w[..BLOCK]);
    #[cfg(target_arch = "x86_64")]
    match isa {
        // SAFETY: the tier is only chosen on a CPU that has it (`Isa::available`), and
        // every slice holds BLOCK values (checked above).
        Isa::Avx512Vnni => return unsafe { x86q::block_avx512(x, gain, weight, out) },
        Isa::Avx2 | Isa::Avx => return unsafe { x86q::block_avx(x, gain, weight, out) },
        Isa::Neon | Isa::Scalar => {}
    }
    let _ = isa;
    let mut v = [0f32; BLOCK];
    match weight {
        Some(w) => {
            for j in 0..BLOCK {
                v[j] = x[j] * gain * w[j];
            }
        }
        None => v.copy_from_slice(x),
    }
    let amax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    let scale = amax / 127.0;
    let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
    let mut sums = [0i32; 2];
    // Each half on its own (a branch in one loop would keep it from vectorising).
    for ((os, vs), sum) in out
        .chunks_exact_mut(BLOCK / 2)
        .zip(v.chunks_exact(BLOCK / 2))
        .zip(&mut sums)
    {
        for (o, &x) in os.iter_mut().zip(vs) {
            let r = (x * inv).round_ties_even() as i8;
            *sum += r as i32;
            *o = r;
        }
    }
    (scale, sums)
}

/// The x86 tiers of [`quantize_block`]. The portable loop compiles to scalar code (a
/// serial chain of `max` for the block's largest value and a saturating conversion value
/// by value): about 2 ns a value, a sixth of a batch-1 embedding.
#[cfg(target_arch = "x86_64")]
mod x86q {
    use std::arch::x86_64::*;

    use super::BLOCK;

    /// Lanes of the products `v · inv` clamped to the range of `i8` (an integer range, so
    /// clamping before or after rounding is the same), NaN kept.
    #[inline(always)]
    unsafe fn clamp512(p: __m512) -> __m512 {
        // `max`/`min` return the second operand when one is NaN, so NaN stays.
        _mm512_min_ps(
            _mm512_set1_ps(127.0),
            _mm512_max_ps(_mm512_set1_ps(-128.0), p),
        )
    }

    /// AVX-512 tier of [`super::quantize_block`]; the caller guarantees AVX-512 F/BW and
    /// BLOCK values in every slice.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    pub(super) unsafe fn block_avx512(
        x: &[f32],
        gain: f32,
        weight: Option<&[f32]>,
        out: &mut [i8],
    ) -> (f32, [i32; 2]) {
        let mut v0 = _mm512_loadu_ps(x.as_ptr());
        let mut v1 = _mm512_loadu_ps(x.as_ptr().add(16));
        if let Some(w) = weight {
            let g = _mm512_set1_ps(gain);
            v0 = _mm512_mul_ps(_mm512_mul_ps(v0, g), _mm512_loadu_ps(w.as_ptr()));
            v1 = _mm512_mul_ps(_mm512_mul_ps(v1, g), _mm512_loadu_ps(w.as_ptr().add(16)));
        }
        // `max(a, acc)` keeps `acc` where `a` is NaN: NaN is ignored, as by `f32::max`.
        let m = _mm512_max_ps(_mm512_abs_ps(v0), _mm512_setzero_ps());
        let m = _mm512_max_ps(_mm512_abs_ps(v1), m);
        let amax = _mm512_reduce_max_ps(m);
        let scale = amax / 127.0;
        let inv = _mm512_set1_ps(if scale != 0.0 { 1.0 / scale } else { 0.0 });
        let mut sums = [0i32; 2];
        for (h, v) in [v0, v1].into_iter().enumerate() {
            let p = clamp512(_mm512_mul_ps(v, inv));
            let r =
                _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(p);
            // NaN converts to i32::MIN; `as i8` makes it 0.
            let r = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(p, p), r);
            sums[h] = _mm512_reduce_add_epi32(r);
            _mm_storeu_si128(out.as_mut_ptr().add(16 * h).cast(), _mm512_cvtepi32_epi8(r));
        }
        (scale, sums)
    }

    /// AVX tier of [`super::quantize_block`] (256-bit floats; the integer packing is
    /// SSE2): for the AVX2 and AVX kernels. The caller guarantees AVX and BLOCK values in
    /// every slice.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn block_avx(
        x: &[f32],
        gain: f32,
        weight: Option<&[f32]>,
        out: &mut [i8],
    ) -> (f32, [i32; 2]) {
        let mut v = [_mm256_setzero_ps(); BLOCK / 8];
        for (i, vi) in v.iter_mut().enumerate() {
            *vi = _mm256_loadu_ps(x.as_ptr().add(8 * i));
            if let Some(w) = weight {
                *vi = _mm256_mul_ps(
                    _mm256_mul_ps(*vi, _mm256_set1_ps(gain)),
                    _mm256_loadu_ps(w.as_ptr().add(8 * i)),
                );
            }
        }
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        // `max(a, acc)` keeps `acc` where `a` is NaN: NaN is ignored, as by `f32::max`.
        let mut m = _mm256_setzero_ps();
        for vi in v {
            m = _mm256_max_ps(_mm256_and_ps(vi, abs), m);
        }
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let m1 = _mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2));
        let amax = _mm_cvtss_f32(m1);
        let scale = amax / 127.0;
        let inv = _mm256_set1_ps(if scale != 0.0 { 1.0 / scale } else { 0.0 });
        let mut r = [_mm_setzero_si128(); BLOCK / 4];
        for (i, vi) in v.into_iter().enumerate() {
            let p = _mm256_min_ps(
                _mm256_set1_ps(127.0),
                _mm256_max_ps(_mm256_set1_ps(-128.0), _mm256_mul_ps(vi, inv)),
            );
            // Round half to even (the default rounding mode), then NaN to 0.
            let q = _mm256_cvtps_epi32(_mm256_round_ps::<
                { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
            >(p));
            let ordered = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_ORD_Q>(p, p));
            let q = _mm256_castps_si256(_mm256_and_ps(
                _mm256_castsi256_ps(q),
                _mm256_castsi256_ps(ordered),
            ));
            r[2 * i] = _mm256_castsi256_si128(q);
            r[2 * i + 1] = _mm256_extractf128_si256::<1>(q);
        }
        let mut sums = [0i32; 2];
        for (h, sum) in sums.iter_mut().enumerate() {
            let quarter = |j: usize| r[4 * h + j];
            let s = _mm_add_epi32(
                _mm_add_epi32(quarter(0), quarter(1)),
                _mm_add_epi32(quarter(2), quarter(3)),
            );
            let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
            *sum = _mm_cvtsi128_si32(s);
            // Values lie in -128..=127, so the saturating packs change nothing.
            let lo = _mm_packs_epi32(quarter(0), quarter(1));
            let hi = _mm_packs_epi32(quarter(2), quarter(3));
            _mm_storeu_si128(out.as_mut_ptr().add(16 * h).cast(), _mm_packs_epi16(lo, hi));
        }
        (scale, sums)
    }
}

/// Quantises one row (`x` of `k` values, times `gain` and the optional per-value `weight`)
/// into its block slices, arranged as `layout`.
fn quantize_row(
    isa: Isa,
    x: &[f32],
    gain: f32,
    weight: Option<&[f32]>,
    layout: Layout,
    out: RowOut<'_>,
) {
    let RowOut { q, d, s, h } = out;
    let nb = x.len() / BLOCK;
    let nbp = d.len();
    let mut lane_block = [0i8; BLOCK];
    for b in 0..nbp {
        if b >= nb {
            match layout {
                Layout::Pairs => q[b * BLOCK..(b + 1) * BLOCK].fill(0),
                Layout::Lanes => {
                    for t in 0..BLOCK / 4 {
                        let at = layout.byte_index(nbp, b, 4 * t);
                        q[at..at + 4].fill(0);
                    }
                }
            }
            d[b] = 0.0;
            s[b] = 0.0;
            h[b] = 0.0;
            continue;
        }
        let block = match layout {
            Layout::Pairs => &mut q[b * BLOCK..(b + 1) * BLOCK],
            Layout::Lanes => &mut lane_block[..],
        };
        let (scale, sums) = quantize_block(
            isa,
            &x[b * BLOCK..(b + 1) * BLOCK],
            gain,
            weight.map(|w| &w[b * BLOCK..(b + 1) * BLOCK]),
            block,
        );
        let (sum, first) = (sums[0] + sums[1], sums[0]);
        if layout == Layout::Lanes {
            // Each group of four values goes to its lane of the chunk.
            for (g, four) in lane_block.chunks_exact(4).enumerate() {
                let at = layout.byte_index(nbp, b, 4 * g);
                q[at..at + 4].copy_from_slice(four);
            }
        }
        // Scales are kept at f16 precision, as ggml and candle store them.
        let scale = f16::from_f32(scale).to_f32();
        d[b] = scale;
        s[b] = scale * sum as f32;
        h[b] = scale * first as f32;
    }
}

/// Quantises `seq` rows of `x` (`seq × k`) into `acts`; with `norm = Some((weight, eps))`
/// the rows are RMS-normalised and scaled by `weight` first. Large batches are split over
/// the pool.
pub(crate) fn quantize(
    pool: &Pool,
    x: &[f32],
    seq: usize,
    norm: Option<(&[f32], f32)>,
    acts: &mut QActs,
) {
    let (k, layout, isa) = (acts.k, acts.layout, acts.isa);
    acts.reserve(seq);
    let nbp = acts.nbp;
    let row = |c: usize, out: RowOut<'_>| {
        let xr = &x[c * k..(c + 1) * k];
        let (gain, w) = match norm {
            Some((w, eps)) => (ops::rms_gain(xr, eps), Some(w)),
            None => (1.0, None),
        };
        quantize_row(isa, xr, gain, w, layout, out);
    };
    let threads = pool.threads();
    if seq < 4 * threads {
        for c in 0..seq {
            row(
                c,
                RowOut {
                    q: &mut acts.q[c * nbp * BLOCK..(c + 1) * nbp * BLOCK],
                    d: &mut acts.d[c * nbp..(c + 1) * nbp],
                    s: &mut acts.s[c * nbp..(c + 1) * nbp],
                    h: &mut acts.h[c * nbp..(c + 1) * nbp],
                },
            );
        }
        acts.finish(seq);
        return;
    }
    let (q, d, s, h) = (
        Disjoint::new(&mut acts.q),
        Disjoint::new(&mut acts.d),
        Disjoint::new(&mut acts.s),
        Disjoint::new(&mut acts.h),
    );
    const TOKENS: usize = 8;
    pool.run(seq.div_ceil(TOKENS), &|_, chunk| {
        for c in chunk * TOKENS..(chunk * TOKENS + TOKENS).min(seq) {
            // SAFETY: every chunk (hence token row c) is handed to one thread only, and row
            // c owns exactly these sub-ranges of the four buffers.
            unsafe {
                row(
                    c,
                    RowOut {
                        q: q.part(c * nbp * BLOCK, nbp * BLOCK),
                        d: d.part(c * nbp, nbp),
                        s: s.part(c * nbp, nbp),
                        h: h.part(c * nbp, nbp),
                    },
                )
            }
        }
    });
    acts.finish(seq);
}

/// Bytes of quantised activations a block of tokens may hold while a range of weight rows
/// passes over it: well inside a core's L2 (1–2 MiB on current x86 cores), beside the
/// range's weights.
const ACT_BLOCK_BYTES: usize = 512 << 10;

/// Tokens per block of [`for_tiles`] for rows of `k` values (8-bit values plus three f32 per
/// 32 of them): a multiple of 4, at least 4.
fn tokens_per_block(k: usize) -> usize {
    let row = k + k / BLOCK * 12;
    (ACT_BLOCK_BYTES / row.max(1)).max(4) / 4 * 4
}

/// Weight bytes a group of rows of a matmul holds while the tokens of a block pass over it:
/// a quarter of the smallest L2 cache of the CPUs measured (1 MiB a core on AMD EPYC).
const WEIGHT_GROUP_BYTES: usize = 256 << 10;

/// Calls `emit(token, first_row, values)` for every tile of rows `rows` of `w` against the
/// first `seq` rows of `acts`. The tokens go in blocks, each met by every row of the range
/// before the next: the block's activations stay in cache, where one pass of all tokens per
/// row group would stream them from memory again for every four rows once the prompt's
/// activations outgrow the cache (at 1B scale, 512 tokens of an 8192-wide row are 4 MiB).
/// Within a block the rows go in groups of at most [`WEIGHT_GROUP_BYTES`], and four tokens
/// at a time meet every tile of the group: those tokens' activations stay in the L1 cache
/// and the group's weights in L2, where four rows meeting every token of the block in turn
/// read the block's activations from L2 for every tile. On a 2-core Sapphire Rapids Xeon
/// this took the prompt speed of the 1B Q4_K_M shape from 81-84 to 101-117 tokens/s in an
/// alternating A/B (`benches/RESULTS.md`, issue 14).
fn for_tiles(
    isa: Isa,
    w: &QMatrix,
    rows: Range<usize>,
    acts: &QActs,
    seq: usize,
    emit: &mut dyn FnMut(usize, usize, &[f32]),
) {
    if acts.panel.tokens == seq
        && seq > 0
        && w.layout == Layout::Lanes
        && matches!(
            w.fmt,
            Format::Q8_0 | Format::Q4_0 | Format::Q4_1 | Format::Q6
        )
    {
        return for_panels(isa, w, rows, acts, seq, emit);
    }
    let block = tokens_per_block(acts.k);
    let row_bytes = w.bytes() / w.rows.max(1);
    let group = (WEIGHT_GROUP_BYTES / row_bytes.max(1)).max(4) / 4 * 4;
    let mut c0 = 0;
    while c0 < seq {
        let cols = c0..(c0 + block).min(seq);
        let mut g0 = rows.start;
        while g0 < rows.end {
            let g = g0..(g0 + group).min(rows.end);
            let mut c = cols.start;
            while c < cols.end {
                if c + 4 <= cols.end {
                    tiles_of_tokens::<4>(isa, w, g.clone(), acts, c, emit);
                    c += 4;
                } else {
                    tiles_of_tokens::<1>(isa, w, g.clone(), acts, c, emit);
                    c += 1;
                }
            }
            g0 = g.end;
        }
        c0 = cols.end;
    }
}

/// Bytes of unpacked weights (a byte a value, and an f32 scale and bias a block) a group of
/// rows of [`for_panels`] holds while every group of 16 tokens passes over it.
const PANEL_GROUP_BYTES: usize = 256 << 10;

/// [`for_tiles`] by the prompt kernel ([`kernels::panel`]), for the first `seq` rows of
/// `acts`, which [`quantize`] transposed. The rows go in groups of at most
/// [`PANEL_GROUP_BYTES`]; each group is unpacked to a byte a value (Q4 and Q6 formats)
/// and its scales and biases (Q6: of each half) to f32 once, then every group of 16 tokens
/// meets its rows eight at a time.
fn for_panels(
    isa: Isa,
    w: &QMatrix,
    rows: Range<usize>,
    acts: &QActs,
    seq: usize,
    emit: &mut dyn FnMut(usize, usize, &[f32]),
) {
    let (nbp, kp) = (w.nbp, w.nbp * BLOCK);
    let halves = w.fmt == Format::Q6;
    // A row's bytes, and its f32 scales and biases (Q6: two of each a block).
    let row_bytes = kp + if halves { 16 } else { 8 } * nbp;
    let group = (PANEL_GROUP_BYTES / row_bytes).max(8) / 8 * 8;
    let (mut bytes, mut d, mut m) = (Vec::new(), Vec::new(), Vec::new());
    let (mut d1, mut m1) = (Vec::new(), Vec::new());
    let mut out = Vec::new();
    let mut g0 = rows.start;
    while g0 < rows.end {
        let g = g0..(g0 + group).min(rows.end);
        let n = g.len();
        let packed = w.view(g.start, n);
        let q: &[u8] = match w.fmt {
            Format::Q8_0 => packed.q,
            Format::Q6 => {
                kernels::unpack_q6(&packed, &mut bytes);
                &bytes
            }
            _ => {
                kernels::unpack_nibbles(&packed, &mut bytes);
                &bytes
            }
        };
        for v in [&mut d, &mut m, &mut d1, &mut m1] {
            v.clear();
        }
        for r in 0..n {
            let half = halves.then_some((&mut d1, &mut m1));
            packed.row_scales(r, &mut d, &mut m, half);
        }
        let pr = PanelRows {
            q,
            d: &d,
            m: &m,
            d1: &d1,
            m1: &m1,
            nbp,
            rows: packed.rows,
        };
        out.clear();
        out.resize(2 * PANEL_TOKENS * n, 0.0);
        let groups = seq.div_ceil(PANEL_TOKENS);
        let mut j = 0;
        while j < groups {
            // Two groups of tokens at a time where there are two: each weight broadcast
            // then feeds two products.
            let t = if j + 2 <= groups { 2 } else { 1 };
            let mut r = 0;
            while r < n {
                let step = match n - r {
                    8.. => 8,
                    4..=7 => 4,
                    _ => 1,
                };
                match (step, t) {
                    (8, 2) => panel_and_place::<8, 2>(isa, &pr, r, acts, j, n, &mut out),
                    (8, _) => panel_and_place::<8, 1>(isa, &pr, r, acts, j, n, &mut out),
                    (4, 2) => panel_and_place::<4, 2>(isa, &pr, r, acts, j, n, &mut out),
                    (4, _) => panel_and_place::<4, 1>(isa, &pr, r, acts, j, n, &mut out),
                    (_, 2) => panel_and_place::<1, 2>(isa, &pr, r, acts, j, n, &mut out),
                    _ => panel_and_place::<1, 1>(isa, &pr, r, acts, j, n, &mut out),
                }
                r += step;
            }
            for c in j * PANEL_TOKENS..((j + t) * PANEL_TOKENS).min(seq) {
                let o = c - j * PANEL_TOKENS;
                emit(c, g.start, &out[o * n..(o + 1) * n]);
            }
            j += t;
        }
        g0 = g.end;
    }
}

/// Rows `r..r + R` of `w` against the `T` groups of 16 tokens from group `j` of `acts`,
/// token `c` (of those) placed at `out[c·n + r..]`.
fn panel_and_place<const R: usize, const T: usize>(
    isa: Isa,
    w: &PanelRows<'_>,
    r: usize,
    acts: &QActs,
    j: usize,
    n: usize,
    out: &mut [f32],
) {
    let a: [PanelActs<'_>; T] = std::array::from_fn(|t| acts.panel_group(j + t));
    let mut o = [[[0f32; PANEL_TOKENS]; T]; R];
    kernels::panel::<R, T>(isa, w, r, &a, &mut o);
    for (i, row) in o.iter().enumerate() {
        for (t, group) in row.iter().enumerate() {
            for (c, &v) in group.iter().enumerate() {
                out[(t * PANEL_TOKENS + c) * n + r + i] = v;
            }
        }
    }
}

/// The tiles of the tokens `c..c + C` against the rows `rows` (four at a time, then one).
fn tiles_of_tokens<const C: usize>(
    isa: Isa,
    w: &QMatrix,
    rows: Range<usize>,
    acts: &QActs,
    c: usize,
    emit: &mut dyn FnMut(usize, usize, &[f32]),
) {
    // No prefetch of rows ahead here: with a tile's rows interleaved into one stream, the
    // hardware prefetcher keeps up on the AVX-512 tier, and prefetching 16 rows ahead slowed
    // 1B decode on one AMD EPYC thread from 16.4 to 10.5 tokens/s (benches/RESULTS.md,
    // issue 14). The AVX2 tile kernel asks for its own stream 1 KiB ahead (`PF_DIST`).
    let a = acts.view(c, C);
    let mut r = rows.start;
    while r < rows.end {
        if r + 4 <= rows.end {
            tile_and_emit::<4, C>(isa, w, r, &a, c, emit);
            r += 4;
        } else {
            tile_and_emit::<1, C>(isa, w, r, &a, c, emit);
            r += 1;
        }
    }
}

/// One tile, rows `r..r + R` against the tokens `c..c + C` (`a`), each token's values
/// handed to `emit`.
fn tile_and_emit<const R: usize, const C: usize>(
    isa: Isa,
    w: &QMatrix,
    r: usize,
    a: &ActRows<'_>,
    c: usize,
    emit: &mut dyn FnMut(usize, usize, &[f32]),
) {
    let mut out = [[0f32; R]; C];
    kernels::tile::<R, C>(isa, &w.view(r, R), a, &mut out);
    for (i, o) in out.iter().enumerate() {
        emit(c + i, r, o);
    }
}

/// What a matrix product does with its results.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Epilogue {
    /// `out = W·a`
    Store,
    /// `out += W·a` (residual connections).
    Add,
}

/// `out[c][..rows] (=|+=) W · acts[c]` for the first `seq` activation rows, with `out` rows
/// `stride` apart; the weight rows are split over the pool.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul(
    pool: &Pool,
    isa: Isa,
    w: &QMatrix,
    acts: &QActs,
    seq: usize,
    out: &mut [f32],
    stride: usize,
    epilogue: Epilogue,
) {
    assert!(acts.k == w.k && stride >= w.rows && out.len() >= (seq.max(1) - 1) * stride + w.rows);
    let chunk = rows_per_chunk(w.rows, pool.threads());
    let out = Disjoint::new(out);
    pool.run(w.rows.div_ceil(chunk), &|_, i| {
        let rows = i * chunk..((i + 1) * chunk).min(w.rows);
        for_tiles(isa, w, rows, acts, seq, &mut |c, r0, vals| {
            // SAFETY: chunk i (one thread) writes only the columns of its own rows, in
            // every token row.
            let dst = unsafe { out.part(c * stride + r0, vals.len()) };
            match epilogue {
                Epilogue::Store => dst.copy_from_slice(vals),
                Epilogue::Add => dst.iter_mut().zip(vals).for_each(|(o, v)| *o += v),
            }
        });
    });
}

/// The function a gated feed-forward applies to its gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gate {
    /// SwiGLU (llama, qwen, phi3).
    Silu,
    /// GeGLU with tanh-approximated GELU (gemma3).
    GeluTanh,
}

/// The gated feed-forward input: `out[c][i] = act(gate·a)[i] · (up·a)[i]`; `up_buf` (same
/// size as `out`) holds the up projection.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gated(
    pool: &Pool,
    isa: Isa,
    act: Gate,
    gate: &QMatrix,
    up: &QMatrix,
    acts: &QActs,
    seq: usize,
    out: &mut [f32],
    up_buf: &mut [f32],
) {
    let n = gate.rows;
    assert!(
        up.rows == n
            && gate.k == acts.k
            && up.k == acts.k
            && out.len() >= seq * n
            && up_buf.len() >= seq * n
    );
    let chunk = rows_per_chunk(n, pool.threads());
    let out = Disjoint::new(out);
    let up_out = Disjoint::new(up_buf);
    pool.run(n.div_ceil(chunk), &|_, i| {
        let rows = i * chunk..((i + 1) * chunk).min(n);
        for (w, dst) in [(gate, &out), (up, &up_out)] {
            for_tiles(isa, w, rows.clone(), acts, seq, &mut |c, r0, vals| {
                // SAFETY: chunk i (one thread) writes only the columns of its own rows.
                unsafe { dst.part(c * n + r0, vals.len()) }.copy_from_slice(vals);
            });
        }
        // Then the gating over whole rows, which vectorises.
        for c in 0..seq {
            // SAFETY: as above; the two parts are in different buffers.
            let (g, u) = unsafe {
                (
                    out.part(c * n + rows.start, rows.len()),
                    up_out.part(c * n + rows.start, rows.len()),
                )
            };
            match act {
                Gate::Silu => {
                    for (g, &u) in g.iter_mut().zip(u.iter()) {
                        *g = ops::silu(*g) * u;
                    }
                }
                Gate::GeluTanh => {
                    for (g, &u) in g.iter_mut().zip(u.iter()) {
                        *g = ops::gelu_tanh(*g) * u;
                    }
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::QTensor;
    use candle_core::{Device, Tensor};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    /// `Σ w·x` and `Σ |w·x|` (the scale an error of quantised arithmetic is judged against).
    pub(super) fn dot_and_magnitude(w: &[f32], x: &[f32]) -> (f32, f32) {
        let exact = w.iter().zip(x).map(|(a, b)| a * b).sum();
        let mag = w.iter().zip(x).map(|(a, b)| (a * b).abs()).sum();
        (exact, mag)
    }

    fn ggml_blocks(dtype: GgmlDType, rows: usize, k: usize, rng: &mut StdRng) -> Vec<u8> {
        let (bytes, payload) = match dtype {
            GgmlDType::Q8_0 => (34, 32),
            GgmlDType::Q4_0 => (18, 16),
            _ => (20, 16),
        };
        let mut data = Vec::new();
        for _ in 0..rows * k / BLOCK {
            data.extend_from_slice(&f16::from_f32(rng.gen_range(0.001f32..0.05)).to_le_bytes());
            if bytes == 20 {
                data.extend_from_slice(&f16::from_f32(rng.gen_range(-0.2f32..0.2)).to_le_bytes());
            }
            for _ in 0..payload {
                data.push(rng.gen());
            }
        }
        data
    }

    /// ggml's own reading of a block row.
    fn ggml_dequantize(dtype: GgmlDType, data: &[u8], k: usize, row: usize) -> Vec<f32> {
        let t = candle_core::quantized::QTensor::new(
            candle_core::quantized::QStorage::from_data(
                std::borrow::Cow::Borrowed(data),
                &candle_core::Device::Cpu,
                dtype,
            )
            .expect("storage"),
            (data.len() / (dtype.type_size() * k / BLOCK), k),
        )
        .expect("tensor");
        let all = t.dequantize(&candle_core::Device::Cpu).expect("dequantize");
        all.get(row).expect("row").to_vec1::<f32>().expect("vec")
    }

    #[test]
    fn repacked_rows_dequantize_like_ggml() {
        let mut rng = StdRng::seed_from_u64(7);
        for layout in [Layout::Pairs, Layout::Lanes] {
            for dtype in [GgmlDType::Q8_0, GgmlDType::Q4_0, GgmlDType::Q4_1] {
                for k in [32, 64, 576, 96] {
                    let data = ggml_blocks(dtype, 3, k, &mut rng);
                    let m = QMatrix::from_ggml(dtype, 3, k, &data, layout).expect("repack");
                    for r in 0..3 {
                        let want = ggml_dequantize(dtype, &data, k, r);
                        let mut got = vec![0f32; k];
                        m.dequantize_row(r, &mut got);
                        assert_eq!(got, want, "{dtype:?} {layout:?} k={k} row {r}");
                        for (c, w) in want.iter().enumerate() {
                            let mut col = vec![0f32; 3];
                            m.column(c, &mut col);
                            assert_eq!(col[r], *w, "{dtype:?} {layout:?} k={k} column {c}");
                        }
                    }
                }
            }
        }
    }

    /// Runs `for_tiles` (which takes the prompt kernel when `acts` is transposed) over all
    /// rows of `w` and the first `seq` tokens; returns `out[c][r]`.
    fn products(isa: Isa, w: &QMatrix, acts: &QActs, seq: usize) -> Vec<Vec<f32>> {
        let mut out = vec![vec![f32::NAN; w.rows]; seq];
        for_tiles(isa, w, 0..w.rows, acts, seq, &mut |c, r0, v| {
            out[c][r0..r0 + v.len()].copy_from_slice(v)
        });
        out
    }

    #[test]
    // Rows and tokens index several result tables in step.
    #[allow(clippy::needless_range_loop)]
    fn prompt_kernel_matches_f32_reference_and_the_tile_kernel_bit_for_bit() {
        let mut rng = StdRng::seed_from_u64(11);
        let pool = Pool::new(1).expect("pool");
        // Short last chunks (k = 576: 18 blocks; 96: 3 blocks, padded to 4), short last
        // tiles (rows 5, 13), odd groups of 16 tokens (17, 40: a group of two, then one).
        // Q6_K rows need k in whole super-blocks: their short last chunks have 8 blocks.
        let q6_shapes = [(13, 768, 17), (5, 256, 40), (24, 1024, 16), (40, 2304, 33)];
        let shapes = [(13, 576, 17), (5, 96, 40), (24, 1024, 16), (40, 2048, 33)];
        for dtype in [
            GgmlDType::Q8_0,
            GgmlDType::Q4_0,
            GgmlDType::Q4_1,
            GgmlDType::Q6K,
        ] {
            let q6 = dtype == GgmlDType::Q6K;
            for (rows, k, seq) in if q6 { q6_shapes } else { shapes } {
                let blocks = if q6 {
                    let v: Vec<f32> = (0..rows * k).map(|_| rng.gen_range(-1f32..1.0)).collect();
                    let t = Tensor::from_vec(v, (rows, k), &Device::Cpu).expect("tensor");
                    let q = QTensor::quantize(&t, dtype).expect("q6k");
                    q.data().expect("data").to_vec()
                } else {
                    ggml_blocks(dtype, rows, k, &mut rng)
                };
                let w = QMatrix::from_ggml(dtype, rows, k, &blocks, Layout::Lanes).expect("repack");
                let x: Vec<f32> = (0..seq * k).map(|_| rng.gen_range(-2f32..2.0)).collect();
                let mut acts = QActs::new(k, Layout::Lanes, Isa::Scalar);
                quantize(&pool, &x, seq, None, &mut acts);
                acts.transpose(seq);
                let portable = products(Isa::Scalar, &w, &acts, seq);
                let mut wrow = vec![0f32; k];
                for r in 0..rows {
                    w.dequantize_row(r, &mut wrow);
                    for c in 0..seq {
                        let (exact, mag) = dot_and_magnitude(&wrow, &x[c * k..(c + 1) * k]);
                        let got = portable[c][r];
                        assert!(
                            (got - exact).abs() <= 0.01 * mag + 1e-4,
                            "{dtype:?} {rows}x{k} token {c} row {r}: {got} vs {exact}"
                        );
                    }
                }
                if Isa::available().contains(&Isa::Avx512Vnni) {
                    // The AVX-512 prompt kernel, and the tile kernel it stands in for (the
                    // same activations without their transposed copy), give the portable
                    // prompt kernel's bits.
                    let fast = products(Isa::Avx512Vnni, &w, &acts, seq);
                    acts.panel.tokens = 0;
                    let tiles = products(Isa::Avx512Vnni, &w, &acts, seq);
                    for c in 0..seq {
                        for r in 0..rows {
                            let bits = portable[c][r].to_bits();
                            assert_eq!(
                                fast[c][r].to_bits(),
                                bits,
                                "{dtype:?} {rows}x{k} token {c} row {r}"
                            );
                            assert_eq!(
                                tiles[c][r].to_bits(),
                                bits,
                                "tiles: {dtype:?} {rows}x{k} token {c} row {r}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_token_gets_the_same_bits_in_any_lane_of_the_prompt_kernel() {
        let mut rng = StdRng::seed_from_u64(12);
        let pool = Pool::new(1).expect("pool");
        let (rows, k, seq) = (12, 576, 36);
        let blocks = ggml_blocks(GgmlDType::Q4_1, rows, k, &mut rng);
        let w = QMatrix::from_ggml(GgmlDType::Q4_1, rows, k, &blocks, Layout::Lanes).expect("w");
        let x: Vec<f32> = (0..(seq + 5) * k)
            .map(|_| rng.gen_range(-2f32..2.0))
            .collect();
        let isa = *Isa::available().first().expect("a tier");
        let run = |from: usize| {
            let mut acts = QActs::new(k, Layout::Lanes, isa);
            quantize(&pool, &x[from * k..(from + seq) * k], seq, None, &mut acts);
            acts.transpose(seq);
            products(isa, &w, &acts, seq)
        };
        // Token c of the first run is token c - 5 of the second: another lane, group and
        // pair of groups.
        let (a, b) = (run(0), run(5));
        for c in 5..seq {
            for r in 0..rows {
                assert_eq!(
                    a[c][r].to_bits(),
                    b[c - 5][r].to_bits(),
                    "token {c} row {r}"
                );
            }
        }
    }

    #[test]
    fn parallel_matmul_matches_f32_reference() {
        let mut rng = StdRng::seed_from_u64(3);
        let pool = Pool::new(2).expect("pool");
        // Every tier with each layout (AVX-512 reads the pair layout with the AVX2 kernel,
        // the other tiers read the lane layout with portable code);
        // 9 and 16 tokens take the pool's path of quantising; 30 tokens of 32768 values go
        // in three blocks of tokens (12, 12, 6).
        for (isa, layout) in Isa::available()
            .into_iter()
            .flat_map(|i| [(i, Layout::Pairs), (i, Layout::Lanes)])
        {
            for dtype in [GgmlDType::Q8_0, GgmlDType::Q4_0, GgmlDType::Q4_1] {
                for (rows, k, seq) in [
                    (70, 96, 1),
                    (64, 576, 9),
                    (33, 64, 5),
                    (20, 1024, 16),
                    (9, 32768, 30),
                ] {
                    let blocks = ggml_blocks(dtype, rows, k, &mut rng);
                    let w = QMatrix::from_ggml(dtype, rows, k, &blocks, layout).expect("repack");
                    let x: Vec<f32> = (0..seq * k).map(|_| rng.gen_range(-2f32..2.0)).collect();
                    let mut acts = QActs::new(k, layout, isa);
                    quantize(&pool, &x, seq, None, &mut acts);
                    let stride = rows + 3;
                    let mut out = vec![1f32; seq * stride];
                    matmul(&pool, isa, &w, &acts, seq, &mut out, stride, Epilogue::Add);
                    let mut wrow = vec![0f32; k];
                    for r in 0..rows {
                        w.dequantize_row(r, &mut wrow);
                        for c in 0..seq {
                            let xr = &x[c * k..(c + 1) * k];
                            let (exact, mag) = dot_and_magnitude(&wrow, xr);
                            let got = out[c * stride + r] - 1.0;
                            // 8-bit activations: about 1/254 relative error per value.
                            assert!(
                            (got - exact).abs() <= 0.01 * mag + 1e-4,
                            "{isa:?} {layout:?} {dtype:?} {rows}x{k} token {c} row {r}: {got} vs {exact}"
                        );
                        }
                    }
                    for c in 0..seq {
                        assert!(
                            out[c * stride + rows..(c + 1) * stride]
                                .iter()
                                .all(|&v| v == 1.0),
                            "padding touched"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn quantize_block_tiers_agree_bit_for_bit() {
        let mut rng = StdRng::seed_from_u64(17);
        let mut blocks: Vec<Vec<f32>> = (0..2000)
            .map(|i| {
                // Magnitudes from subnormal to huge, so scales of every size occur.
                let e: i32 = i % 60 - 30;
                (0..BLOCK)
                    .map(|_| rng.gen_range(-1f32..1.0) * 2f32.powi(4 * e))
                    .collect()
            })
            .collect();
        blocks.extend([
            vec![0.0; BLOCK],
            vec![-0.0; BLOCK],
            // A largest value of 127 makes the scale exactly 1, so the others are halfway
            // values (-15.5 … 14.5), which round to even.
            (0..BLOCK)
                .map(|j| if j == 0 { 127.0 } else { j as f32 - 16.5 })
                .collect(),
        ]);
        // NaN in every lane position of each tier's registers, one position at a time.
        blocks.extend((0..BLOCK).map(|n| {
            (0..BLOCK)
                .map(|j| if j == n { f32::NAN } else { j as f32 - 7.0 })
                .collect()
        }));
        blocks.extend([
            (0..BLOCK)
                .map(|j| if j == 9 { f32::INFINITY } else { -(j as f32) })
                .collect(),
            (0..BLOCK)
                .map(|j| if j == 0 { f32::NEG_INFINITY } else { 1.0 })
                .collect(),
            (0..BLOCK).map(|j| j as f32 * 1e-44).collect(),
            vec![f32::MAX; BLOCK],
        ]);
        let weight: Vec<f32> = (0..BLOCK).map(|_| rng.gen_range(-3f32..3.0)).collect();
        for isa in Isa::available() {
            for x in &blocks {
                for (gain, w) in [(1.0, None), (0.37, Some(&weight[..]))] {
                    let mut want = [0i8; BLOCK];
                    let mut got = [0i8; BLOCK];
                    let a = quantize_block(Isa::Scalar, x, gain, w, &mut want);
                    let b = quantize_block(isa, x, gain, w, &mut got);
                    assert_eq!(
                        (a.0.to_bits(), a.1, want),
                        (b.0.to_bits(), b.1, got),
                        "{isa:?} on {x:?} (gain {gain}, weighted {})",
                        w.is_some()
                    );
                }
            }
        }
    }

    #[test]
    fn token_blocks_fit_the_cache_budget_in_whole_tiles() {
        for k in [64usize, 576, 2048, 8192, 1 << 20] {
            let b = tokens_per_block(k);
            assert!(b >= 4 && b.is_multiple_of(4), "k={k}: {b}");
            assert!(
                b == 4 || b * (k + k / BLOCK * 12) <= ACT_BLOCK_BYTES,
                "k={k}: {b}"
            );
        }
        // SmolLM2's rows take a whole 512-token prompt in one block; 1B's FFN rows do not.
        assert!(tokens_per_block(576) >= 512);
        assert!(tokens_per_block(8192) < 64);
    }

    #[test]
    fn chunks_are_whole_row_groups() {
        for rows in [16usize, 192, 576, 960, 1536, 49152] {
            for threads in 1..5 {
                let c = rows_per_chunk(rows, threads);
                assert!(c.is_multiple_of(ROW_ALIGN) && c >= ROW_ALIGN);
                assert!(rows.div_ceil(c) <= 8 * threads);
            }
        }
    }
}

#[cfg(test)]
mod k_quant_tests {
    use candle_core::quantized::QTensor;
    use candle_core::{Device, Tensor};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    #[test]
    fn q4_k_keeps_its_values_and_rounds_only_the_scales() {
        let (rows, k) = (8, 512);
        let mut rng = StdRng::seed_from_u64(9);
        let values: Vec<f32> = (0..rows * k).map(|_| rng.gen_range(-1f32..1.0)).collect();
        let t = Tensor::from_vec(values, (rows, k), &Device::Cpu).expect("tensor");
        let q = QTensor::quantize(&t, GgmlDType::Q4K).expect("q4k");
        let reference = q
            .dequantize(&Device::Cpu)
            .expect("dequantize")
            .to_vec2::<f32>()
            .expect("values");
        for layout in [Layout::Pairs, Layout::Lanes] {
            let m = QMatrix::from_ggml(GgmlDType::Q4K, rows, k, &q.data().expect("data"), layout)
                .expect("repack");
            let mut row = vec![0f32; k];
            for (r, want) in reference.iter().enumerate() {
                m.dequantize_row(r, &mut row);
                for (a, b) in row.iter().zip(want) {
                    // Scale and minimum are f16 here: relative rounding 2^-11 of each.
                    assert!(
                        (a - b).abs() <= 2e-3 * (1.0 + b.abs()),
                        "{layout:?} row {r}: {a} vs {b}"
                    );
                }
            }
        }
    }

    /// Q6_K repacked as six-bit values with one f16 scale per 16 values reads back as
    /// ggml's dequantisation, up to the f16 rounding of `d · scale` (at most 2^-11 of it),
    /// in every row and column; the pair layout has no Q6 kernel and says so.
    #[test]
    fn q6_k_keeps_its_values_and_rounds_only_the_scales() {
        // 1280 values: 40 blocks a row, so a last chunk of 8 blocks (2 lanes each).
        for (rows, k) in [(9usize, 256usize), (5, 1280), (4, 4096)] {
            let mut rng = StdRng::seed_from_u64(k as u64);
            let values: Vec<f32> = (0..rows * k).map(|_| rng.gen_range(-1f32..1.0)).collect();
            let t = Tensor::from_vec(values, (rows, k), &Device::Cpu).expect("tensor");
            let q = QTensor::quantize(&t, GgmlDType::Q6K).expect("q6k");
            let reference = q
                .dequantize(&Device::Cpu)
                .expect("dequantize")
                .to_vec2::<f32>()
                .expect("values");
            let data = q.data().expect("data");
            let err = QMatrix::from_ggml(GgmlDType::Q6K, rows, k, &data, Layout::Pairs);
            assert!(err.is_err_and(|e| e.contains("lane layout")));
            let m =
                QMatrix::from_ggml(GgmlDType::Q6K, rows, k, &data, Layout::Lanes).expect("repack");
            assert_eq!(m.format(), Format::Q6);
            assert_eq!(
                m.bytes(),
                rows * k / 32 * 28,
                "six bits and two f16 per 32 values"
            );
            let mut row = vec![0f32; k];
            for (r, want) in reference.iter().enumerate() {
                m.dequantize_row(r, &mut row);
                for (a, b) in row.iter().zip(want) {
                    assert!(
                        (a - b).abs() <= 1e-3 * b.abs() + 1e-6,
                        "k={k} row {r}: {a} vs {b}"
                    );
                }
            }
            let mut col = vec![0f32; rows];
            for c in [0, 15, 16, 31, 255, k - 1] {
                m.column(c, &mut col);
                for r in 0..rows {
                    let b = reference[r][c];
                    assert!((col[r] - b).abs() <= 1e-3 * b.abs() + 1e-6, "column {c}");
                }
            }
        }
    }

    /// Q6 matrices multiply like their dequantised values on every tier, one token and a
    /// batch (the pool's path of quantising), rows in tiles of four and alone.
    #[test]
    fn q6_k_matmul_matches_f32_reference() {
        let pool = Pool::new(2).expect("pool");
        let mut rng = StdRng::seed_from_u64(5);
        for (rows, k, seq) in [(70usize, 256usize, 1usize), (33, 1280, 9), (20, 2048, 16)] {
            let values: Vec<f32> = (0..rows * k).map(|_| rng.gen_range(-1f32..1.0)).collect();
            let t = Tensor::from_vec(values, (rows, k), &Device::Cpu).expect("tensor");
            let q = QTensor::quantize(&t, GgmlDType::Q6K).expect("q6k");
            let w = QMatrix::from_ggml(
                GgmlDType::Q6K,
                rows,
                k,
                &q.data().expect("data"),
                Layout::Lanes,
            )
            .expect("repack");
            let x: Vec<f32> = (0..seq * k).map(|_| rng.gen_range(-2f32..2.0)).collect();
            let mut acts = QActs::new(k, Layout::Lanes, Isa::Scalar);
            quantize(&pool, &x, seq, None, &mut acts);
            for isa in Isa::available() {
                let mut out = vec![0f32; seq * rows];
                matmul(&pool, isa, &w, &acts, seq, &mut out, rows, Epilogue::Store);
                let mut wrow = vec![0f32; k];
                for r in 0..rows {
                    w.dequantize_row(r, &mut wrow);
                    for c in 0..seq {
                        let xr = &x[c * k..(c + 1) * k];
                        let (exact, mag) = super::tests::dot_and_magnitude(&wrow, xr);
                        let got = out[c * rows + r];
                        assert!(
                            (got - exact).abs() <= 0.01 * mag + 1e-4,
                            "{isa:?} {rows}x{k} token {c} row {r}: {got} vs {exact}"
                        );
                    }
                }
            }
        }
    }
}
