//! Integer dot-product kernels: a tile of `R` quantised weight rows against `C` quantised
//! activation rows, giving `R × C` dot products.
//!
//! Every weight block of 32 values is stored as unsigned integers `u` with an f16 scale `d`
//! and a bias `m`, so that a value is `d·u + m`: Q8_0 stores `q + 128` (`m = -128·d`), Q4_0
//! its nibbles (`m = -8·d`), Q4_1 its nibbles and its own `m`. Activation blocks are signed
//! 8-bit with an f32 scale `da` and `sa = da·Σq`, so one block contributes
//! `d·da·Σ(u·q) + m·sa`. Unsigned-times-signed byte products are exactly what x86's
//! `vpdpbusd` (AVX-512 VNNI) and `vpmaddubsw` (AVX2) compute, and the bias term is one
//! multiply-add per block outside the inner loop.
//!
//! Rows are padded to a whole number of pairs of blocks with zero blocks and arranged in
//! one of two [`Layout`]s, chosen per tier at load: AVX, NEON and the scalar code read
//! blocks in order, two to a 64-value pair (Q8 pairs are 64 bytes, Q4 pairs 32 bytes whose
//! low nibbles are the first block and high nibbles the second); AVX-512 and AVX2 read
//! chunks of 16 blocks interleaved in 4-byte lanes (AVX2 as two 256-bit halves of 8), so
//! that each block's dot product builds up in a 32-bit lane of its own and its scales are
//! applied once per block. In the lane layout the weight rows are also interleaved four at
//! a time (see [`Layout::tile_rows`]): a tile of four rows reads its weights, scales and
//! biases as three sequential streams instead of twelve.
//!
//! Five implementations: AVX-512 VNNI, AVX2 (+FMA, F16C), AVX (+FMA, F16C, without AVX2:
//! 128-bit integer products), aarch64 NEON and portable scalar code, chosen at run time
//! (NEON at compile time: every aarch64 CPU has it); the scalar one is always compiled and
//! the tests check the others against it.
// Kernels index several arrays in lock-step with the same counters; iterator
// chains would hide the tile layout the comments describe.
#![allow(clippy::needless_range_loop)]
#![allow(unsafe_code)]

use half::f16;

/// Values per quantisation block.
pub(crate) const BLOCK: usize = 32;

/// How the unsigned integers of a weight row are stored and what their bias is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    /// One byte per value, `q + 128`; bias `-128·d`.
    Q8_0,
    /// One nibble per value; bias `-8·d`.
    Q4_0,
    /// One nibble per value; bias stored per block.
    Q4_1,
    /// Six bits per value (Q6_K's values, `q + 32`), [`Layout::Lanes`] only: nibble step
    /// `s` of a chunk holds the low nibbles of value steps `2s` (low) and `2s + 1` (high),
    /// high step `i` the top two bits of value steps `4i..4i + 4` (bits `2(t % 4)`), and
    /// each high step follows the two nibble steps it completes, so that a kernel reads
    /// the chunk front to back (see [`Chunk::q6_nibble_step`]). Each half of a block (16 values, a Q6_K sub-block) has its own
    /// f16 scale, the first half's in `d` and the second's where Q4_1 keeps its bias; the
    /// bias of a half is `-32·d` of that half.
    Q6,
}

impl Format {
    /// Bytes of one row of `kp` (padded) values.
    pub(crate) fn row_bytes(self, kp: usize) -> usize {
        match self {
            Self::Q8_0 => kp,
            Self::Q4_0 | Self::Q4_1 => kp / 2,
            Self::Q6 => {
                // Whole chunks take 24 bytes a block; a short last chunk whatever its
                // steps take (a half-used high step when its blocks have 4 lanes each).
                let nbp = kp / BLOCK;
                let full = nbp - nbp % LANES;
                let last = if full < nbp {
                    let ch = Chunk::at(nbp, full);
                    ch.step_bytes() * ch.q6_steps()
                } else {
                    0
                };
                full * 24 + last
            }
        }
    }

    /// For formats with an implicit bias `-offset·d`, the offset (Q6: of each half's `d`).
    pub(crate) fn offset(self) -> f32 {
        match self {
            Self::Q8_0 => 128.0,
            Self::Q4_0 => 8.0,
            Self::Q4_1 => 0.0,
            Self::Q6 => 32.0,
        }
    }

    /// Whether the format keeps a second f16 per block (Q4_1's bias, Q6's second scale).
    pub(crate) fn has_second_scale(self) -> bool {
        matches!(self, Self::Q4_1 | Self::Q6)
    }

    /// The f16 values per block in a matrix's scale array (`d`) in `layout`: in
    /// [`Layout::Lanes`] a block's second value (Q4_1's bias, Q6's second scale) follows
    /// the chunk's scales there (see [`RowAt::chunk_scales`]); [`Layout::Pairs`] keeps it
    /// in an array of its own (`m`).
    pub(crate) fn scales_per_block(self, layout: Layout) -> usize {
        if layout == Layout::Lanes && self.has_second_scale() {
            2
        } else {
            1
        }
    }
}

/// How the 32-value blocks of a row are arranged in memory (weights and activations of one
/// product share it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Blocks in order, two to a 64-value pair: a Q8 block is 32 bytes; a Q4 pair is 32
    /// bytes whose low nibbles are the first block and high nibbles the second.
    Pairs,
    /// Chunks of 16 blocks whose blocks lie side by side in 4-byte lanes: step `t` (0..8)
    /// of a chunk holds values `4t..4t+4` of each of its blocks, block `i` in lane `i`, so
    /// one 512-bit `vpdpbusd` per step accumulates each block's whole dot product in a lane
    /// of its own, and a block's scale is applied once per block instead of once per
    /// register of products. A last chunk of fewer blocks gives each block 2 or 4 lanes
    /// (see [`Chunk`]), so that it takes 4 or 2 steps rather than 8. Steps are
    /// [`Chunk::step_bytes`] apart; Q4 stores step `s` and step `s + steps/2` in the low
    /// and high nibbles of the same bytes.
    Lanes,
}

impl Layout {
    /// The layout the kernels of `isa` read fastest: [`Layout::Lanes`] for AVX-512 VNNI
    /// and AVX2 (which reads each 64-byte step as two halves of eight lanes),
    /// [`Layout::Pairs`] for the others (their registers hold one or two blocks).
    pub(crate) fn for_isa(isa: Isa) -> Self {
        match isa {
            Isa::Avx512Vnni | Isa::Avx2 => Self::Lanes,
            Isa::Avx | Isa::Neon | Isa::Scalar => Self::Pairs,
        }
    }

    /// Rows a weight matrix in this layout interleaves. In [`Layout::Lanes`] the rows go in
    /// tiles of four (fewer in a matrix's last tile), and each chunk step of a tile's rows
    /// lies side by side: step `t` of a chunk is row 0's bytes of that step, then row 1's,
    /// and so on, so a 4-row tile kernel, which reads step `t` of all four rows before step
    /// `t + 1`, reads one sequential stream. Row after row, the four rows are four streams
    /// `row_bytes` apart read in lockstep, which one core of an AMD EPYC reads at half its
    /// sequential rate (`benches/llm/stream_pattern.c`: 12.8 against 23–26 GB/s). A
    /// chunk's block scales (and Q4_1 biases) are interleaved the same way, a chunk at a
    /// time. [`Layout::Pairs`] keeps rows one after another.
    pub(crate) const fn tile_rows(self) -> usize {
        match self {
            Self::Pairs => 1,
            Self::Lanes => 4,
        }
    }

    /// Where value `j` of block `b` lies in one row of `nbp` blocks of `fmt`, as a step of
    /// the row's layout; see [`Spot`].
    #[inline(always)]
    fn spot(self, fmt: Format, nbp: usize, b: usize, j: usize) -> Spot {
        match (self, fmt) {
            (Self::Pairs, Format::Q8_0) => Spot {
                start: 0,
                step: 0,
                step_bytes: 0,
                within: b * BLOCK + j,
                shift: 0,
            },
            (Self::Pairs, _) => Spot {
                start: 0,
                step: 0,
                step_bytes: 0,
                within: (b / 2) * BLOCK + j,
                shift: if b.is_multiple_of(2) { 0 } else { 4 },
            },
            (Self::Lanes, Format::Q8_0) => {
                let ch = Chunk::of(nbp, b);
                let (t, lane) = ch.place(b, j);
                Spot {
                    start: ch.start * BLOCK,
                    step: t,
                    step_bytes: ch.step_bytes(),
                    within: lane * 4 + j % 4,
                    shift: 0,
                }
            }
            (Self::Lanes, _) => {
                let ch = Chunk::of(nbp, b);
                let (t, lane) = ch.place(b, j);
                let half = ch.steps() / 2;
                Spot {
                    start: ch.start * BLOCK / 2,
                    step: t % half,
                    step_bytes: ch.step_bytes(),
                    within: lane * 4 + j % 4,
                    shift: if t < half { 0 } else { 4 },
                }
            }
        }
    }

    /// Where value `j` of block `b` of a [`Format::Q6`] row of `nbp` blocks keeps its low
    /// nibble and its top two bits ([`Layout::Lanes`] only).
    #[inline(always)]
    fn q6_spots(nbp: usize, b: usize, j: usize) -> (Spot, Spot) {
        let ch = Chunk::of(nbp, b);
        let (t, lane) = ch.place(b, j);
        let at = |step: usize, shift: u32| Spot {
            start: ch.start * 24,
            step,
            step_bytes: ch.step_bytes(),
            within: lane * 4 + j % 4,
            shift,
        };
        (
            at(ch.q6_nibble_step(t / 2), 4 * (t % 2) as u32),
            at(ch.q6_high_step(t / 4), 2 * (t % 4) as u32),
        )
    }

    /// Where value `j` of block `b` lies in a row of `nbp` blocks stored one byte per
    /// value (Q8 weights, activations).
    #[inline(always)]
    pub(crate) fn byte_index(self, nbp: usize, b: usize, j: usize) -> usize {
        let s = self.spot(Format::Q8_0, nbp, b, j);
        s.start + s.step * s.step_bytes + s.within
    }

    /// The byte and bit shift (0 or 4) of value `j` of block `b` in a row of `nbp` blocks
    /// stored one nibble per value (Q4_0, Q4_1).
    #[cfg(test)]
    fn nibble_index(self, nbp: usize, b: usize, j: usize) -> (usize, u32) {
        let s = self.spot(Format::Q4_0, nbp, b, j);
        (s.start + s.step * s.step_bytes + s.within, s.shift)
    }
}

/// Blocks per chunk of [`Layout::Lanes`] (the 16 32-bit lanes of a 512-bit register).
pub(crate) const LANES: usize = 16;

/// One chunk of a row in [`Layout::Lanes`]: blocks `start..start + n`, each spread over
/// `per` lanes: 1 in a whole chunk; 2 or 4 in a last chunk of at most 8 or 4 blocks, so
/// that a short chunk takes 4 or 2 steps instead of 8 (never more than 4 lanes, so that a
/// Q4 chunk has an even number of steps to pair in its nibbles).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Chunk {
    /// First block.
    pub start: usize,
    /// Blocks in the chunk (1..=16).
    pub n: usize,
    /// Lanes per block: 1, 2 or 4.
    pub per: usize,
}

impl Chunk {
    /// The chunk that starts at block `start` (a multiple of 16) of a row of `nbp` blocks.
    #[inline(always)]
    pub(crate) fn at(nbp: usize, start: usize) -> Self {
        let n = (nbp - start).min(LANES);
        let per = match n {
            0..=4 => 4,
            5..=8 => 2,
            _ => 1,
        };
        Self { start, n, per }
    }

    /// The chunk that holds block `b`.
    #[inline(always)]
    pub(crate) fn of(nbp: usize, b: usize) -> Self {
        Self::at(nbp, b - b % LANES)
    }

    /// Lanes in use.
    #[inline(always)]
    pub(crate) fn lanes(self) -> usize {
        self.n * self.per
    }

    /// Steps of four values per lane.
    #[inline(always)]
    pub(crate) fn steps(self) -> usize {
        8 / self.per
    }

    /// Steps of [`Format::Q6`] bytes: the nibble steps (two value steps each) and the
    /// high-bit steps (four value steps each, the last possibly half used).
    #[inline(always)]
    pub(crate) fn q6_steps(self) -> usize {
        self.steps() / 2 + self.steps().div_ceil(4)
    }

    /// Where nibble step `s` of a [`Format::Q6`] chunk lies among its steps: in groups of
    /// two nibble steps and the high step that completes them.
    #[inline(always)]
    pub(crate) fn q6_nibble_step(self, s: usize) -> usize {
        3 * (s / 2) + s % 2
    }

    /// Where high step `i` of a [`Format::Q6`] chunk lies among its steps: after the (one
    /// or two) nibble steps of its group.
    #[inline(always)]
    pub(crate) fn q6_high_step(self, i: usize) -> usize {
        3 * i + (self.steps() / 2 - 2 * i).min(2)
    }

    /// Bytes between two steps of one-byte values.
    #[inline(always)]
    pub(crate) fn step_bytes(self) -> usize {
        4 * self.lanes()
    }

    /// The step and lane of value `j` of block `b`: its group of four `g = j / 4` is in
    /// step `g / per`, lane `(b - start)·per + g % per`.
    #[inline(always)]
    pub(crate) fn place(self, b: usize, j: usize) -> (usize, usize) {
        let g = j / 4;
        (g / self.per, (b - self.start) * self.per + g % self.per)
    }
}

/// A value's place in one row: byte `within` (and bit `shift`) of step `step` of a chunk
/// whose steps are `step_bytes` long and start at byte `start` of the row
/// ([`Layout::Pairs`] has one step, the whole row).
#[derive(Clone, Copy, Debug)]
struct Spot {
    start: usize,
    step: usize,
    step_bytes: usize,
    within: usize,
    shift: u32,
}

/// Where row `r` of a weight matrix of `rows` rows in `layout` keeps its steps and scales:
/// the row is number `ri` of a tile of `g` rows whose bytes start at `q` and whose scales
/// start at `d` (see [`Layout::tile_rows`]). For [`Layout::Pairs`], `g` is 1 and the tile
/// is the row.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowAt {
    q: usize,
    d: usize,
    g: usize,
    ri: usize,
    /// [`Format::scales_per_block`].
    s: usize,
}

impl RowAt {
    /// Row `r` of a matrix of `rows` rows of `nbp` blocks of `fmt`.
    #[inline(always)]
    pub(crate) fn new(fmt: Format, layout: Layout, nbp: usize, rows: usize, r: usize) -> Self {
        let tr = layout.tile_rows();
        let tile = r / tr;
        let s = fmt.scales_per_block(layout);
        Self {
            q: tile * tr * fmt.row_bytes(nbp * BLOCK),
            d: tile * tr * nbp * s,
            g: tr.min(rows - tile * tr),
            ri: r % tr,
            s,
        }
    }

    /// The byte of step `s` (`step_bytes` long) of the chunk starting at byte `start` of an
    /// uninterleaved row.
    #[inline(always)]
    pub(crate) fn step(self, start: usize, s: usize, step_bytes: usize) -> usize {
        self.q + self.g * (start + s * step_bytes) + self.ri * step_bytes
    }

    /// For a kernel that walks each of a tile's rows by pointer: pointers into `q` at step 0
    /// (plus `offset` bytes) of the chunk starting at byte `start` of each uninterleaved row,
    /// and the bytes from one step to the next. The rows of one call belong to one tile, so
    /// they share that stride.
    #[inline(always)]
    pub(crate) fn tile_steps<const R: usize>(
        at: &[RowAt; R],
        q: *const u8,
        start: usize,
        step_bytes: usize,
        offset: usize,
    ) -> ([*const u8; R], usize) {
        debug_assert!(at.iter().all(|x| x.g == at[0].g), "rows of one tile");
        let ptrs =
            std::array::from_fn(|r| q.wrapping_add(at[r].step(start, 0, step_bytes) + offset));
        (ptrs, at[0].g * step_bytes)
    }

    /// The index of the first of the scales of chunk `ch`'s blocks, which follow one
    /// another, in [`Layout::Lanes`]; where the format has a second value per block (Q4_1's
    /// biases, Q6's second scales), the chunk's `ch.n` of them follow its scales, so that a
    /// tile reads its scales as one stream (a second array read beside the weights and the
    /// scales slowed Q6 decode over a 58 MB matrix from 23 to 16 GB/s on one AMD EPYC core).
    ///
    /// `per_block` is [`Format::scales_per_block`]: the kernels pass it as a constant of
    /// their format, because a multiply by the runtime field in their chunk loop cost the
    /// AVX2 tier 20% of decode speed on SmolLM2 Q8_0 (AMD EPYC, one thread: the compiler
    /// then scheduled a row's weight loads together instead of step by step).
    #[inline(always)]
    pub(crate) fn chunk_scales(self, ch: Chunk, per_block: usize) -> usize {
        self.d + per_block * (self.g * ch.start + self.ri * ch.n)
    }

    /// The index of block `b`'s scale in a matrix of `nbp` blocks per row.
    #[inline(always)]
    fn scale(self, layout: Layout, nbp: usize, b: usize) -> usize {
        match layout {
            Layout::Pairs => self.d + b,
            Layout::Lanes => {
                let ch = Chunk::of(nbp, b);
                self.chunk_scales(ch, self.s) + b - ch.start
            }
        }
    }

    /// The index of block `b`'s second value (bias or second scale): in the scale array for
    /// [`Layout::Lanes`], in the bias array `m` (at the scale's index) for
    /// [`Layout::Pairs`].
    #[inline(always)]
    fn second(self, layout: Layout, nbp: usize, b: usize) -> usize {
        match layout {
            Layout::Pairs => self.d + b,
            Layout::Lanes => {
                let ch = Chunk::of(nbp, b);
                self.chunk_scales(ch, self.s) + ch.n + b - ch.start
            }
        }
    }

    /// The byte and bit shift (0 or 4) of value `j` of block `b` (not [`Format::Q6`]).
    #[inline(always)]
    fn value(self, fmt: Format, layout: Layout, nbp: usize, b: usize, j: usize) -> (usize, u32) {
        let s = layout.spot(fmt, nbp, b, j);
        (self.step(s.start, s.step, s.step_bytes) + s.within, s.shift)
    }

    /// The byte and shift of the low nibble, and of the top two bits, of value `j` of
    /// block `b` in a [`Format::Q6`] row.
    #[inline(always)]
    fn q6_value(self, nbp: usize, b: usize, j: usize) -> [(usize, u32); 2] {
        let (lo, hi) = Layout::q6_spots(nbp, b, j);
        [lo, hi].map(|s| (self.step(s.start, s.step, s.step_bytes) + s.within, s.shift))
    }
}

/// The byte and bit shift (0, or 4 for the high nibble) of value `j` of block `b` of row
/// `r` in a weight matrix of `rows` rows of `nbp` blocks of `fmt`, arranged as `layout`
/// says (rows interleaved in tiles as [`Layout::tile_rows`] says).
pub(crate) fn weight_index(
    fmt: Format,
    layout: Layout,
    nbp: usize,
    rows: usize,
    r: usize,
    b: usize,
    j: usize,
) -> (usize, u32) {
    RowAt::new(fmt, layout, nbp, rows, r).value(fmt, layout, nbp, b, j)
}

/// The byte and bit shift of the low nibble (0 or 4), and of the top two bits (0, 2, 4 or
/// 6), of value `j` of block `b` of row `r` in a [`Format::Q6`] matrix of `rows` rows of
/// `nbp` blocks (always [`Layout::Lanes`]).
pub(crate) fn q6_index(nbp: usize, rows: usize, r: usize, b: usize, j: usize) -> [(usize, u32); 2] {
    RowAt::new(Format::Q6, Layout::Lanes, nbp, rows, r).q6_value(nbp, b, j)
}

/// The index of block `b`'s scale of row `r` in a weight matrix of `rows` rows of `nbp`
/// blocks of `fmt` arranged as `layout` says.
pub(crate) fn scale_index(
    fmt: Format,
    layout: Layout,
    nbp: usize,
    rows: usize,
    r: usize,
    b: usize,
) -> usize {
    RowAt::new(fmt, layout, nbp, rows, r).scale(layout, nbp, b)
}

/// Where block `b`'s second value (Q4_1's bias, Q6's second scale) of row `r` lies: the
/// index in the scale array ([`Layout::Lanes`]) or in the bias array ([`Layout::Pairs`]),
/// and which of the two it is (true: the scale array).
pub(crate) fn second_index(
    fmt: Format,
    layout: Layout,
    nbp: usize,
    rows: usize,
    r: usize,
    b: usize,
) -> (usize, bool) {
    let at = RowAt::new(fmt, layout, nbp, rows, r).second(layout, nbp, b);
    (at, fmt.scales_per_block(layout) == 2)
}

/// The instruction set the kernels run with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512 F/BW/VL with VNNI (`vpdpbusd`) and F16C.
    Avx512Vnni,
    /// AVX2 with FMA and F16C.
    Avx2,
    /// AVX with FMA and F16C but not AVX2 (AMD Piledriver to Excavator, some
    /// virtual machines): AVX has no 256-bit integer instructions, so the products are
    /// SSSE3's 128-bit `pmaddubsw`, accumulated with 128-bit FMA.
    Avx,
    /// aarch64 Advanced SIMD (NEON), which every aarch64 CPU has.
    Neon,
    /// Portable code.
    Scalar,
}

/// Environment variable that caps the instruction set the kernels use: `scalar`, `avx`,
/// `avx2`, `avx512` or `neon` (for measuring one tier on a CPU that has a better one, or for working
/// around a CPU that misreports a feature). A tier the CPU lacks, or an unknown name, is
/// ignored with a warning.
pub const ISA_ENV: &str = "STARLING_ISA";

impl Isa {
    /// The best instruction set this CPU supports, or the one [`ISA_ENV`] asks for when the
    /// CPU has it.
    pub fn detect() -> Self {
        Self::choose(std::env::var(ISA_ENV).ok().as_deref()).0
    }

    /// The tier to use when [`ISA_ENV`] holds `wanted`, and why it is not the one asked for
    /// when it is not (the CPU lacks it, or the name is unknown). (No logging here: this
    /// file also builds alone, for the NEON tests under qemu.)
    pub fn choose(wanted: Option<&str>) -> (Self, Option<String>) {
        let available = Self::available();
        let best = available.first().copied().unwrap_or(Self::Scalar);
        let Some(wanted) = wanted.filter(|w| !w.is_empty()) else {
            return (best, None);
        };
        match Self::from_name(wanted) {
            Some(isa) if available.contains(&isa) => (isa, None),
            Some(_) => (
                best,
                Some(format!(
                    "{ISA_ENV}={wanted}: this CPU lacks it; using {best:?}"
                )),
            ),
            None => (
                best,
                Some(format!(
                    "{ISA_ENV}={wanted} is not one of scalar, avx, avx2, avx512, neon; using {best:?}"
                )),
            ),
        }
    }

    /// The tier [`ISA_ENV`] names, case-insensitive.
    pub fn from_name(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "scalar" => Some(Self::Scalar),
            "avx" => Some(Self::Avx),
            "avx2" => Some(Self::Avx2),
            "avx512" | "avx512vnni" | "avx512_vnni" => Some(Self::Avx512Vnni),
            "neon" => Some(Self::Neon),
            _ => None,
        }
    }

    /// Every instruction set this CPU supports, best first (always ends with `Scalar`).
    pub fn available() -> Vec<Self> {
        let mut v = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            if avx2
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni")
            {
                v.push(Self::Avx512Vnni);
            }
            if avx2 {
                v.push(Self::Avx2);
            }
            if is_x86_feature_detected!("avx")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
            {
                v.push(Self::Avx);
            }
        }
        if cfg!(target_arch = "aarch64") {
            v.push(Self::Neon);
        }
        v.push(Self::Scalar);
        v
    }
}

/// `R` consecutive weight rows: rows `first..first + R` of the `rows` rows held in the
/// slices (whole tiles of [`Layout::tile_rows`], the last one possibly short, as in a
/// whole matrix).
#[derive(Clone, Copy)]
pub(crate) struct WeightRows<'a> {
    /// Packed integers, `row_bytes` per row.
    pub q: &'a [u8],
    /// Block scales, `nbp` per row, and in [`Layout::Lanes`] the blocks' second values
    /// too (see [`Format::scales_per_block`]).
    pub d: &'a [f16],
    /// [`Layout::Pairs`]: block biases (Q4_1), `nbp` per row; empty otherwise.
    pub m: &'a [f16],
    /// Storage format.
    pub fmt: Format,
    /// Arrangement of each row's blocks, and of the rows in tiles.
    pub layout: Layout,
    /// Blocks per row, padded to an even number.
    pub nbp: usize,
    /// Rows held in the slices.
    pub rows: usize,
    /// The first of the tile's rows.
    pub first: usize,
}

impl WeightRows<'_> {
    /// Rows `r0..r0 + n` of these rows, which must start at the slices' first: the slices
    /// of the tiles that hold them.
    pub(crate) fn sub(&self, r0: usize, n: usize) -> Self {
        assert!(self.first == 0 && r0 + n <= self.rows, "rows out of range");
        let tr = self.layout.tile_rows();
        let (base, end) = (r0 / tr * tr, ((r0 + n).div_ceil(tr) * tr).min(self.rows));
        let (rb, nbp) = (self.fmt.row_bytes(self.nbp * BLOCK), self.nbp);
        let ns = nbp * self.fmt.scales_per_block(self.layout);
        Self {
            q: &self.q[base * rb..end * rb],
            d: &self.d[base * ns..end * ns],
            m: if self.m.is_empty() {
                &[]
            } else {
                &self.m[base * nbp..end * nbp]
            },
            rows: end - base,
            first: r0 - base,
            ..*self
        }
    }

    /// Where the tile's row `r` lies in the slices.
    #[inline(always)]
    pub(crate) fn row_at(&self, r: usize) -> RowAt {
        RowAt::new(self.fmt, self.layout, self.nbp, self.rows, self.first + r)
    }

    /// The unsigned value `j` of block `b` of the tile's row `r`.
    #[inline(always)]
    pub(crate) fn value(&self, r: usize, b: usize, j: usize) -> u8 {
        if self.fmt == Format::Q6 {
            let [(lo, ls), (hi, hs)] = self.row_at(r).q6_value(self.nbp, b, j);
            return ((self.q[lo] >> ls) & 0x0F) | (((self.q[hi] >> hs) & 3) << 4);
        }
        let (at, shift) = self.row_at(r).value(self.fmt, self.layout, self.nbp, b, j);
        match self.fmt {
            Format::Q8_0 => self.q[at],
            _ => (self.q[at] >> shift) & 0x0F,
        }
    }

    /// Appends the scales of every block of the tile's row `r` to `d` and their biases to
    /// `m`, as [`WeightRows::scale_bias`] gives them, a chunk at a time ([`Layout::Lanes`]).
    /// For [`Format::Q6`] these are the first halves'; `half` then takes the second
    /// halves' (and must be given).
    pub(crate) fn row_scales(
        &self,
        r: usize,
        d: &mut Vec<f32>,
        m: &mut Vec<f32>,
        half: Option<(&mut Vec<f32>, &mut Vec<f32>)>,
    ) {
        assert!(self.layout == Layout::Lanes, "lane rows");
        assert_eq!(
            half.is_some(),
            self.fmt == Format::Q6,
            "second halves for Q6 only"
        );
        let at = self.row_at(r);
        let per_block = self.fmt.scales_per_block(self.layout);
        let off = self.fmt.offset();
        let mut half = half;
        let mut chunk = 0;
        while chunk < self.nbp {
            let ch = Chunk::at(self.nbp, chunk);
            let i = at.chunk_scales(ch, per_block);
            let ds = &self.d[i..i + ch.n];
            d.extend(ds.iter().map(|x| x.to_f32()));
            // Q4_1's biases or Q6's second scales (formats with two values a block).
            let second = &self.d[i + ch.n..i + per_block * ch.n];
            if self.fmt == Format::Q4_1 {
                m.extend(second.iter().map(|x| x.to_f32()));
            } else {
                m.extend(ds.iter().map(|x| -off * x.to_f32()));
            }
            if let Some((d1, m1)) = half.as_mut() {
                d1.extend(second.iter().map(|x| x.to_f32()));
                m1.extend(second.iter().map(|x| -off * x.to_f32()));
            }
            chunk += LANES;
        }
    }

    /// The scale `d` and bias `m` of block `b` of the tile's row `r` (`m = -offset·d` for
    /// the formats without a stored bias).
    #[inline(always)]
    pub(crate) fn scale_bias(&self, r: usize, b: usize) -> (f32, f32) {
        self.value_scale_bias(r, b, 0)
    }

    /// The scale and bias that apply to value `j` of block `b` of the tile's row `r` (they
    /// differ between the halves of a [`Format::Q6`] block).
    #[inline(always)]
    pub(crate) fn value_scale_bias(&self, r: usize, b: usize, j: usize) -> (f32, f32) {
        let at = self.row_at(r);
        let d = self.d[at.scale(self.layout, self.nbp, b)].to_f32();
        let second = || {
            let i = at.second(self.layout, self.nbp, b);
            match self.layout {
                Layout::Lanes => self.d[i].to_f32(),
                Layout::Pairs => self.m[i].to_f32(),
            }
        };
        match self.fmt {
            Format::Q4_1 => (d, second()),
            Format::Q6 if j >= BLOCK / 2 => {
                let d = second();
                (d, -Format::Q6.offset() * d)
            }
            f => (d, -f.offset() * d),
        }
    }
}

/// Tokens of one [`panel`] product: the 16 32-bit lanes of a 512-bit register.
pub(crate) const PANEL_TOKENS: usize = 16;

/// Weight rows ready for the prompt kernel [`panel`]: one byte a value in the
/// [`Format::Q8_0`] geometry of [`Layout::Lanes`] (tiles of four rows interleaved step by
/// step; a Q8_0 matrix as it is, Q4 rows unpacked by [`unpack_nibbles`]), and each block's
/// scale and bias as f32, row after row in block order.
#[derive(Clone, Copy)]
pub(crate) struct PanelRows<'a> {
    /// The bytes of `rows` rows, from the start of a tile.
    pub q: &'a [u8],
    /// `d[r·nbp + b]`: the scale of block `b` of row `r`.
    pub d: &'a [f32],
    /// `m[r·nbp + b]`: its bias (Q4_1's minimum, `-offset·d` for the others).
    pub m: &'a [f32],
    /// [`Format::Q6`] rows: the scales of the blocks' second halves (16 values each), as
    /// `d` (whose scales and biases are then the first halves'). Empty for the others.
    pub d1: &'a [f32],
    /// [`Format::Q6`] rows: the second halves' biases (`-32·d1`); empty for the others.
    pub m1: &'a [f32],
    /// Blocks per row.
    pub nbp: usize,
    /// Rows held.
    pub rows: usize,
}

/// [`PANEL_TOKENS`] activation rows transposed for [`panel`]: the four values `4g..4g + 4`
/// of block `b` of every token side by side (64 bytes at `64·(8b + g)`, token `c` at
/// `4c`), and the blocks' scales, `d·Σq` and `d·Σq` over their first halves (for
/// [`Format::Q6`] weights), 16 tokens at `16b`. Tokens past the end of a prompt are zeros.
#[derive(Clone, Copy)]
pub(crate) struct PanelActs<'a> {
    /// `nbp · 8 · 64` values.
    pub q: &'a [i8],
    /// `nbp · 16` scales.
    pub d: &'a [f32],
    /// `nbp · 16` scaled sums.
    pub s: &'a [f32],
    /// `nbp · 16` scaled sums of the blocks' first halves.
    pub h: &'a [f32],
}

/// Unpacks `w`, [`Format::Q4_0`] or [`Format::Q4_1`] rows in [`Layout::Lanes`] starting
/// at a tile (`first` is 0), into `out` as one byte a value in the [`Format::Q8_0`]
/// geometry. Within a tile a chunk's steps lie side by side (step `s` of each row, then
/// step `s + 1`), and a Q4 step `s` holds value step `s` in its low nibbles and step `s +
/// steps/2` in its high ones; so a chunk's bytes unpack into their low nibbles, then their
/// high ones, at twice the offset.
pub(crate) fn unpack_nibbles(w: &WeightRows<'_>, out: &mut Vec<u8>) {
    assert!(
        matches!(w.fmt, Format::Q4_0 | Format::Q4_1) && w.layout == Layout::Lanes && w.first == 0,
        "whole tiles of Q4 rows in lanes"
    );
    let (nbp, tr) = (w.nbp, Layout::Lanes.tile_rows());
    let packed = w.fmt.row_bytes(nbp * BLOCK);
    out.clear();
    out.resize(w.rows * 2 * packed, 0);
    for t0 in (0..w.rows).step_by(tr) {
        let g = tr.min(w.rows - t0);
        let mut at = t0 * packed;
        let mut chunk = 0;
        while chunk < nbp {
            let ch = Chunk::at(nbp, chunk);
            let len = g * ch.steps() / 2 * ch.step_bytes();
            let (lo, hi) = out[2 * at..2 * (at + len)].split_at_mut(len);
            for ((l, h), &x) in lo.iter_mut().zip(hi.iter_mut()).zip(&w.q[at..at + len]) {
                *l = x & 0x0F;
                *h = x >> 4;
            }
            at += len;
            chunk += LANES;
        }
    }
}

/// Unpacks `w`, [`Format::Q6`] rows in [`Layout::Lanes`] starting at a tile (`first` is
/// 0), into `out` as one byte a value (`q + 32`, 0..63) in the [`Format::Q8_0`] geometry:
/// value step `t` of a chunk is nibble step `t / 2` (shifted by 4 when `t` is odd) with
/// the two bits of high step `t / 4` at `2·(t % 4)` on top.
pub(crate) fn unpack_q6(w: &WeightRows<'_>, out: &mut Vec<u8>) {
    assert!(
        w.fmt == Format::Q6 && w.layout == Layout::Lanes && w.first == 0,
        "whole tiles of Q6 rows in lanes"
    );
    let (nbp, tr) = (w.nbp, Layout::Lanes.tile_rows());
    out.clear();
    out.resize(w.rows * nbp * BLOCK, 0);
    for t0 in (0..w.rows).step_by(tr) {
        let src = RowAt::new(Format::Q6, Layout::Lanes, nbp, w.rows, t0);
        let dst = RowAt::new(Format::Q8_0, Layout::Lanes, nbp, w.rows, t0);
        let g = src.g;
        let mut chunk = 0;
        while chunk < nbp {
            let ch = Chunk::at(nbp, chunk);
            let sb = ch.step_bytes();
            let (s0, d0) = (Format::Q6.row_bytes(chunk * BLOCK), chunk * BLOCK);
            // The tile's rows lie side by side within a step: `g·sb` bytes a step.
            let len = g * sb;
            for t in 0..ch.steps() {
                let lo = src.step(s0, ch.q6_nibble_step(t / 2), sb);
                let hi = src.step(s0, ch.q6_high_step(t / 4), sb);
                let (ns, hs) = (4 * (t % 2) as u32, 2 * (t % 4) as u32);
                let to = dst.step(d0, t, sb);
                for ((o, &x), &h) in out[to..to + len]
                    .iter_mut()
                    .zip(&w.q[lo..lo + len])
                    .zip(&w.q[hi..hi + len])
                {
                    *o = ((x >> ns) & 0x0F) | (((h >> hs) & 3) << 4);
                }
            }
            chunk += LANES;
        }
    }
}

/// The results of [`panel`]: `out[r][t][c]` for row `r` and token `c` of group `t`.
pub(crate) type PanelOut<const R: usize, const T: usize> = [[[f32; PANEL_TOKENS]; T]; R];

/// Computes `out[r][t][c] = Σ_k W[r0 + r][k] · A_t[c][k]` for `R` weight rows of `w`
/// against the `T` groups of 16 tokens `a`, on the AVX-512 VNNI tier where `isa` has it
/// (and in portable code otherwise, which gives the same bits). Each token's sum is built
/// in a lane of its own, block by block in row order (`acc += dot·(d_a·d_w)`, then `acc +=
/// m·(d_a·Σq)`), so it does not depend on the other tokens or rows of the call.
///
/// Panics when the slices are shorter than the rows and tokens need.
pub(crate) fn panel<const R: usize, const T: usize>(
    isa: Isa,
    w: &PanelRows<'_>,
    r0: usize,
    a: &[PanelActs<'_>; T],
    out: &mut PanelOut<R, T>,
) {
    let nbp = w.nbp;
    assert!(
        r0 + R <= w.rows
            && w.q.len() >= w.rows * nbp * BLOCK
            && w.d.len() >= w.rows * nbp
            && w.m.len() >= w.rows * nbp
            && w.d1.len() == w.m1.len()
            && (w.d1.is_empty() || w.d1.len() >= w.rows * nbp),
        "panel rows too short"
    );
    assert!(
        a.iter().all(|a| a.q.len() >= nbp * BLOCK * PANEL_TOKENS
            && a.d.len() >= nbp * PANEL_TOKENS
            && a.s.len() >= nbp * PANEL_TOKENS
            && (w.d1.is_empty() || a.h.len() >= nbp * PANEL_TOKENS)),
        "panel activations too short"
    );
    let at: [RowAt; R] =
        std::array::from_fn(|r| RowAt::new(Format::Q8_0, Layout::Lanes, nbp, w.rows, r0 + r));
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::available` lists AVX-512 VNNI only after checking every feature
        // the kernel enables; the slice lengths were checked above.
        Isa::Avx512Vnni => unsafe { x86::panel_avx512::<R, T>(w, r0, &at, a, out) },
        _ => panel_scalar::<R, T>(w, r0, &at, a, out),
    }
}

/// Portable implementation of [`panel`], with the same operations in the same order.
fn panel_scalar<const R: usize, const T: usize>(
    w: &PanelRows<'_>,
    r0: usize,
    at: &[RowAt; R],
    a: &[PanelActs<'_>; T],
    out: &mut PanelOut<R, T>,
) {
    let nbp = w.nbp;
    let halves = !w.d1.is_empty();
    // The tile kernel's 16 lanes, for every row, group and token.
    let mut lanes = vec![[0f32; LANES]; R * T * PANEL_TOKENS];
    let mut chunk = 0;
    while chunk < nbp {
        let ch = Chunk::at(nbp, chunk);
        for r in 0..R {
            let row = (r0 + r) * nbp;
            for (t, a) in a.iter().enumerate() {
                for c in 0..PANEL_TOKENS {
                    let acc = &mut lanes[(r * T + t) * PANEL_TOKENS + c];
                    // The blocks' biases, block i in lane i (Q6: the first half's, then the
                    // second's).
                    for i in 0..ch.n {
                        let (b, at) = (ch.start + i, 16 * (ch.start + i) + c);
                        if halves {
                            acc[i] = w.m[row + b].mul_add(a.h[at], acc[i]);
                            acc[i] = w.m1[row + b].mul_add(a.s[at] - a.h[at], acc[i]);
                        } else {
                            acc[i] = w.m[row + b].mul_add(a.s[at], acc[i]);
                        }
                    }
                    // Lane l: the steps of block l / per that it holds (Q6: those of the
                    // first half, then those of the second, each with its own scale).
                    for l in 0..ch.lanes() {
                        let b = ch.start + l / ch.per;
                        let mut dot = [0i32; 2];
                        for step in 0..ch.steps() {
                            let g = step * ch.per + l % ch.per;
                            let wq = at[r].step(ch.start * BLOCK, step, ch.step_bytes()) + 4 * l;
                            let aq = 64 * (8 * b + g) + 4 * c;
                            for j in 0..4 {
                                dot[usize::from(halves && g >= 4)] +=
                                    w.q[wq + j] as i32 * a.q[aq + j] as i32;
                            }
                        }
                        let da = a.d[16 * b + c];
                        acc[l] = (dot[0] as f32).mul_add(w.d[row + b] * da, acc[l]);
                        if halves {
                            acc[l] = (dot[1] as f32).mul_add(w.d1[row + b] * da, acc[l]);
                        }
                    }
                }
            }
        }
        chunk += LANES;
    }
    for r in 0..R {
        for t in 0..T {
            for c in 0..PANEL_TOKENS {
                out[r][t][c] = lane_sum(&lanes[(r * T + t) * PANEL_TOKENS + c]);
            }
        }
    }
}

/// The sum of the tile kernel's 16 lanes in the order its AVX-512 tier adds them (`sum1`,
/// `sum16`): `(L0 + L1) + (L2 + L3)`, where `Lk = (e4k + e4k+2) + (e4k+1 + e4k+3)`.
fn lane_sum(e: &[f32; LANES]) -> f32 {
    let l = |k: usize| (e[4 * k] + e[4 * k + 2]) + (e[4 * k + 1] + e[4 * k + 3]);
    (l(0) + l(1)) + (l(2) + l(3))
}

/// `C` consecutive quantised activation rows.
#[derive(Clone, Copy)]
pub(crate) struct ActRows<'a> {
    /// Signed 8-bit values, `nbp * 32` per row.
    pub q: &'a [i8],
    /// Block scales, `nbp` per row.
    pub d: &'a [f32],
    /// `d · Σq` per block, `nbp` per row.
    pub s: &'a [f32],
    /// `d · Σq` over the first 16 values of each block, `nbp` per row (the bias of a
    /// [`Format::Q6`] block's first half; `s - h` is the second's).
    pub h: &'a [f32],
    /// Arrangement of each row's values (the weights' layout).
    pub layout: Layout,
    /// Blocks per row (even).
    pub nbp: usize,
}

/// Computes `out[c][r] = Σ_k W[r][k] · A[c][k]` for a tile of `R` weight rows and `C`
/// activation rows.
///
/// Panics when the slices are shorter than the tile needs, `nbp` is odd or the weights and
/// activations are in different layouts.
pub(crate) fn tile<const R: usize, const C: usize>(
    isa: Isa,
    w: &WeightRows<'_>,
    a: &ActRows<'_>,
    out: &mut [[f32; R]; C],
) {
    let nbp = w.nbp;
    let kp = nbp * BLOCK;
    assert!(
        nbp.is_multiple_of(2) && a.nbp == nbp,
        "blocks per row must be even and match"
    );
    assert_eq!(
        w.layout, a.layout,
        "weights and activations must share a layout"
    );
    assert!(
        w.first + R <= w.rows
            && w.q.len() >= w.rows * w.fmt.row_bytes(kp)
            && w.d.len() >= w.rows * nbp * w.fmt.scales_per_block(w.layout),
        "weight tile too short"
    );
    assert!(
        !w.fmt.has_second_scale() || w.layout == Layout::Lanes || w.m.len() >= w.rows * nbp,
        "weight biases missing"
    );
    assert!(
        w.fmt != Format::Q6 || w.layout == Layout::Lanes,
        "Q6 weights come in the lane layout only"
    );
    assert!(
        w.layout.tile_rows() > 1 || w.first == 0,
        "rows one after another start at the slices' first"
    );
    assert!(
        a.q.len() >= C * kp && a.d.len() >= C * nbp && a.s.len() >= C * nbp && a.h.len() >= C * nbp,
        "activation tile too short"
    );
    match (isa, w.layout) {
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512Vnni, Layout::Lanes) => {
            // SAFETY: every caller of this crate-private function passes a tier from
            // `Isa::detect`/`Isa::choose`, which return only members of `Isa::available`,
            // and that lists a tier after checking every feature its kernel enables (here
            // and below); the slice lengths were checked above.
            unsafe {
                match w.fmt {
                    Format::Q8_0 => x86::tile_avx512_lanes::<Q8, R, C>(w, a, out),
                    Format::Q4_0 => x86::tile_avx512_lanes::<Q40, R, C>(w, a, out),
                    Format::Q4_1 => x86::tile_avx512_lanes::<Q41, R, C>(w, a, out),
                    Format::Q6 => x86::tile_avx512_lanes::<Q6, R, C>(w, a, out),
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, Layout::Lanes) => {
            // SAFETY: as above, for the AVX2/FMA/F16C features.
            unsafe {
                match w.fmt {
                    Format::Q8_0 => x86::tile_avx2_lanes::<Q8, R, C>(w, a, out),
                    Format::Q4_0 => x86::tile_avx2_lanes::<Q40, R, C>(w, a, out),
                    Format::Q4_1 => x86::tile_avx2_lanes::<Q41, R, C>(w, a, out),
                    Format::Q6 => x86::tile_avx2_lanes::<Q6, R, C>(w, a, out),
                }
            }
        }
        // The other tiers read the lane layout with the portable code.
        (_, Layout::Lanes) => tile_scalar(w, a, out),
        // AVX-512 reads the pair layout with its AVX2 kernel (`Isa::available` lists
        // AVX-512 only where AVX2, FMA and F16C are present).
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512Vnni | Isa::Avx2, _) => {
            // SAFETY: as above, for the AVX2/FMA/F16C features.
            unsafe {
                match w.fmt {
                    Format::Q8_0 => x86::tile_avx2::<Q8, R, C>(w, a, out),
                    Format::Q4_0 => x86::tile_avx2::<Q40, R, C>(w, a, out),
                    Format::Q4_1 => x86::tile_avx2::<Q41, R, C>(w, a, out),
                    // Asserted above: Q6 comes in the lane layout only.
                    Format::Q6 => unreachable!("Q6 in the pair layout"),
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx, _) => {
            // SAFETY: as above, for the AVX/FMA/F16C features.
            unsafe {
                match w.fmt {
                    Format::Q8_0 => x86::tile_avx::<Q8, R, C>(w, a, out),
                    Format::Q4_0 => x86::tile_avx::<Q40, R, C>(w, a, out),
                    Format::Q4_1 => x86::tile_avx::<Q41, R, C>(w, a, out),
                    // Asserted above: Q6 comes in the lane layout only.
                    Format::Q6 => unreachable!("Q6 in the pair layout"),
                }
            }
        }
        #[cfg(target_arch = "aarch64")]
        (Isa::Neon, _) => {
            // SAFETY: NEON is part of the aarch64 baseline; the slice lengths were checked
            // above.
            unsafe {
                match w.fmt {
                    Format::Q8_0 => arm::tile_neon::<Q8, R, C>(w, a, out),
                    Format::Q4_0 => arm::tile_neon::<Q40, R, C>(w, a, out),
                    Format::Q4_1 => arm::tile_neon::<Q41, R, C>(w, a, out),
                    // Asserted above: Q6 comes in the lane layout only.
                    Format::Q6 => unreachable!("Q6 in the pair layout"),
                }
            }
        }
        _ => tile_scalar(w, a, out),
    }
}

const Q8: u8 = 0;
const Q40: u8 = 1;
const Q41: u8 = 2;
const Q6: u8 = 3;

/// [`Format::offset`] of a kernel's format constant.
const fn offset(f: u8) -> f32 {
    match f {
        Q8 => 128.0,
        Q40 => 8.0,
        Q6 => 32.0,
        _ => 0.0,
    }
}

/// [`Format::scales_per_block`] of a kernel's format constant in [`Layout::Lanes`].
const fn scales_per_block(f: u8) -> usize {
    match f {
        Q41 | Q6 => 2,
        _ => 1,
    }
}

/// [`Format::row_bytes`] of a kernel's format constant; for Q6, valid where `kp` ends at a
/// whole chunk (the start of a chunk in the row).
const fn row_bytes(f: u8, kp: usize) -> usize {
    match f {
        Q8 => kp,
        Q6 => kp / 4 * 3,
        _ => kp / 2,
    }
}

#[cfg(target_arch = "aarch64")]
mod arm {
    use std::arch::aarch64::*;

    use super::{offset, row_bytes, ActRows, WeightRows, BLOCK, Q40, Q41, Q8};

    /// The 32 weights of block `b` of a row as signed bytes: Q8 turned back into `q`
    /// (`u ^ 0x80`, so the product already holds the `-128·d` bias), Q4 nibbles as they are.
    #[inline(always)]
    unsafe fn load_block<const F: u8>(row: *const u8, b: usize) -> (int8x16_t, int8x16_t) {
        // SAFETY (for the whole function): the caller guarantees block `b` lies in the row.
        unsafe {
            let (x0, x1) = if F == Q8 {
                let p = row.add(b * BLOCK);
                let flip = vdupq_n_u8(0x80);
                (
                    veorq_u8(vld1q_u8(p), flip),
                    veorq_u8(vld1q_u8(p.add(16)), flip),
                )
            } else {
                let p = row.add((b / 2) * BLOCK);
                let (x0, x1) = (vld1q_u8(p), vld1q_u8(p.add(16)));
                if b.is_multiple_of(2) {
                    let low = vdupq_n_u8(0x0F);
                    (vandq_u8(x0, low), vandq_u8(x1, low))
                } else {
                    (vshrq_n_u8::<4>(x0), vshrq_n_u8::<4>(x1))
                }
            };
            (vreinterpretq_s8_u8(x0), vreinterpretq_s8_u8(x1))
        }
    }

    /// NEON tile kernel, one block at a time; see [`super::tile`].
    ///
    /// Base NEON has no byte dot product (`sdot` is an optional extension), so products are
    /// widened to 16 bits (`smull`/`smlal`: two products of at most 128·127 each fit) and
    /// pairwise-added into 32 bits.
    ///
    /// # Safety
    /// The slices must be as long as [`super::tile`] checks.
    pub(super) unsafe fn tile_neon<const F: u8, const R: usize, const C: usize>(
        w: &WeightRows<'_>,
        a: &ActRows<'_>,
        out: &mut [[f32; R]; C],
    ) {
        let nbp = w.nbp;
        let kp = nbp * BLOCK;
        let rb = row_bytes(F, kp);
        let (wq, aq) = (w.q.as_ptr(), a.q.as_ptr());
        let mut acc = [[0f32; R]; C];
        for b in 0..nbp {
            let zero = unsafe { vdupq_n_s8(0) };
            let mut wv = [(zero, zero); R];
            let (mut dw, mut mw) = ([0f32; R], [0f32; R]);
            for r in 0..R {
                // SAFETY: block b < nbp lies inside row r.
                wv[r] = unsafe { load_block::<F>(wq.add(r * rb), b) };
                dw[r] = w.d[r * nbp + b].to_f32();
                // Q8's bias is inside its signed products.
                mw[r] = match F {
                    Q41 => w.m[r * nbp + b].to_f32(),
                    Q40 => -offset(F) * dw[r],
                    _ => 0.0,
                };
            }
            for c in 0..C {
                // SAFETY: block b of activation row c.
                let (a0, a1) = unsafe {
                    let p = aq.add(c * kp + b * BLOCK);
                    (vld1q_s8(p), vld1q_s8(p.add(16)))
                };
                let (da, sa) = (a.d[c * nbp + b], a.s[c * nbp + b]);
                for r in 0..R {
                    let (w0, w1) = wv[r];
                    // SAFETY: register arithmetic only.
                    let dot = unsafe {
                        let s0 = vmlal_high_s8(vmull_s8(vget_low_s8(w0), vget_low_s8(a0)), w0, a0);
                        let s1 = vmlal_high_s8(vmull_s8(vget_low_s8(w1), vget_low_s8(a1)), w1, a1);
                        vaddvq_s32(vpadalq_s16(vpaddlq_s16(s0), s1))
                    };
                    acc[c][r] += dw[r] * da * dot as f32 + mw[r] * sa;
                }
            }
        }
        *out = acc;
    }
}

/// Portable implementation of [`tile`].
fn tile_scalar<const R: usize, const C: usize>(
    w: &WeightRows<'_>,
    a: &ActRows<'_>,
    out: &mut [[f32; R]; C],
) {
    let nbp = w.nbp;
    let kp = nbp * BLOCK;
    for (c, out_c) in out.iter_mut().enumerate() {
        let aq = &a.q[c * kp..(c + 1) * kp];
        for (r, o) in out_c.iter_mut().enumerate() {
            let mut sum = 0f32;
            for b in 0..nbp {
                let mut dot = [0i32; 2];
                for j in 0..BLOCK {
                    dot[j / (BLOCK / 2)] +=
                        w.value(r, b, j) as i32 * aq[a.layout.byte_index(nbp, b, j)] as i32;
                }
                let (da, sa) = (a.d[c * nbp + b], a.s[c * nbp + b]);
                if w.fmt == Format::Q6 {
                    // Each half with its own scale and bias.
                    let ((d0, m0), (d1, m1)) = (
                        w.value_scale_bias(r, b, 0),
                        w.value_scale_bias(r, b, BLOCK / 2),
                    );
                    let h = a.h[c * nbp + b];
                    sum += da * (d0 * dot[0] as f32 + d1 * dot[1] as f32) + m0 * h + m1 * (sa - h);
                } else {
                    let (d, m) = w.scale_bias(r, b);
                    sum += d * da * (dot[0] + dot[1]) as f32 + m * sa;
                }
            }
            *o = sum;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use half::f16;

    use super::{
        offset, row_bytes, scales_per_block, ActRows, Chunk, PanelActs, PanelOut, PanelRows, RowAt,
        WeightRows, BLOCK, LANES, Q41, Q6, Q8,
    };

    /// AVX-512 VNNI tile kernel over rows in [`super::Layout::Lanes`]; see [`super::tile`].
    ///
    /// Per chunk of up to 16 blocks, 8 `vpdpbusd` steps (fewer in a short last chunk, see
    /// [`super::Chunk`]) leave each block's integer dot
    /// product in its own 32-bit lane, so the block scales (`d_w · d_a`) and the float
    /// accumulation cost one conversion and one multiply-add per chunk, where blocks read
    /// in order (two to a register) would need them after every product. A shorter last
    /// chunk is read with masked loads.
    ///
    /// # Safety
    /// The CPU must support the enabled features, and the slices must be as long as
    /// [`super::tile`] checks.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn tile_avx512_lanes<const F: u8, const R: usize, const C: usize>(
        w: &WeightRows<'_>,
        a: &ActRows<'_>,
        out: &mut [[f32; R]; C],
    ) {
        let nbp = w.nbp;
        let kp = nbp * BLOCK;
        let (wq, wd) = (w.q.as_ptr(), w.d.as_ptr() as *const i16);
        let at: [RowAt; R] = std::array::from_fn(|r| w.row_at(r));
        let (aq, ad, as_, ah) = (a.q.as_ptr(), a.d.as_ptr(), a.s.as_ptr(), a.h.as_ptr());
        let neg_off = _mm512_set1_ps(-offset(F));
        let low = _mm512_set1_epi8(0x0F);
        let mut acc = [[_mm512_setzero_ps(); R]; C];
        let mut chunk = 0;
        while chunk < nbp {
            let ch = Chunk::at(nbp, chunk);
            let low_mask = |n: usize| -> __mmask16 {
                if n == LANES {
                    0xFFFF
                } else {
                    (1u16 << n) - 1
                }
            };
            // Blocks of the chunk (scales, biases), and lanes of its steps.
            let (bmask, lmask) = (low_mask(ch.n), low_mask(ch.lanes()));
            let (step, steps) = (ch.step_bytes(), ch.steps());
            // The chunk's scales of each row (at `offset` 0) or its second values (at
            // `ch.n`: Q4_1's biases, Q6's second scales), as f32. Read where they are used
            // (the biases here, the scales when a dot product is added up), so that they
            // do not hold registers across the products: Q6's unpacking needs them.
            let scales = |r: usize, offset: usize| {
                // SAFETY: masked load of blocks chunk..chunk+n of row r (< nbp).
                unsafe {
                    _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
                        bmask,
                        wd.add(at[r].chunk_scales(ch, scales_per_block(F)) + offset),
                    ))
                }
            };
            let mut mw = [_mm512_setzero_ps(); R];
            // Q6: the biases of the blocks' second halves.
            let mut mw1 = [_mm512_setzero_ps(); R];
            for r in 0..R {
                mw[r] = if F == Q41 {
                    scales(r, ch.n)
                } else {
                    _mm512_mul_ps(scales(r, 0), neg_off)
                };
                if F == Q6 {
                    mw1[r] = _mm512_mul_ps(scales(r, ch.n), neg_off);
                }
            }
            for c in 0..C {
                // SAFETY: masked load of blocks chunk..chunk+n of activation row c.
                let sa = unsafe { _mm512_maskz_loadu_ps(bmask, as_.add(c * nbp + chunk)) };
                if F == Q6 {
                    // The halves' biases: -32·d0 · h and -32·d1 · (s - h).
                    let h = unsafe { _mm512_maskz_loadu_ps(bmask, ah.add(c * nbp + chunk)) };
                    let rest = _mm512_sub_ps(sa, h);
                    for r in 0..R {
                        acc[c][r] = _mm512_fmadd_ps(mw[r], h, acc[c][r]);
                        acc[c][r] = _mm512_fmadd_ps(mw1[r], rest, acc[c][r]);
                    }
                } else {
                    for r in 0..R {
                        acc[c][r] = _mm512_fmadd_ps(mw[r], sa, acc[c][r]);
                    }
                }
            }
            // Lane l holds part of block l / per: its scale comes from there.
            let spread = (ch.per > 1).then(|| {
                let shift = _mm512_set1_epi32(ch.per.trailing_zeros() as i32);
                let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
                _mm512_srlv_epi32(lanes, shift)
            });
            // acc += dot · (d_w · d_a), each lane with its block's scales (at `offset`).
            let flush = |acc: &mut [[__m512; R]; C], dot: &[[__m512i; R]; C], offset: usize| {
                let dw: [__m512; R] = std::array::from_fn(|r| scales(r, offset));
                for c in 0..C {
                    // SAFETY: masked load of the chunk's activation scales of row c.
                    let da = unsafe { _mm512_maskz_loadu_ps(bmask, ad.add(c * nbp + chunk)) };
                    for r in 0..R {
                        let mut scale = _mm512_mul_ps(dw[r], da);
                        if let Some(idx) = spread {
                            scale = _mm512_permutexvar_ps(idx, scale);
                        }
                        acc[c][r] =
                            _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[c][r]), scale, acc[c][r]);
                    }
                }
            };
            let mut dot = [[_mm512_setzero_si512(); R]; C];
            // Where the scales of the last products are (Q6: its second halves').
            let mut last = 0;
            // SAFETY (both arms): every load covers the chunk's lanes of 4 bytes of one of
            // its steps, inside row r of the weights and row c of the activations.
            // Each row's steps, walked by pointer (no index arithmetic in the loop).
            let (mut wp, stride) = RowAt::tile_steps(&at, wq, row_bytes(F, chunk * BLOCK), step, 0);
            if F == Q6 && steps == 8 {
                // A chunk of one lane a block (every chunk but a row's short last one),
                // unrolled with the shifts as immediates: half `p` of every block is steps
                // 3p, 3p + 1 (nibbles) and 3p + 2 (top bits); its sums go to `acc` with its
                // own scales before the second half's start.
                let m30 = _mm512_set1_epi8(0x30);
                for part in 0..2 {
                    if part == 1 {
                        flush(&mut acc, &dot, 0);
                        dot = [[_mm512_setzero_si512(); R]; C];
                    }
                    // The part's three steps of the tile's rows, in the order they lie in
                    // memory (step by step, each the rows side by side).
                    let mut raw = [[_mm512_setzero_si512(); R]; 3];
                    for k in 0..3 {
                        for r in 0..R {
                            raw[k][r] = unsafe {
                                _mm512_maskz_loadu_epi32(
                                    lmask,
                                    wp[r].add(stride * (3 * part + k)) as *const _,
                                )
                            };
                        }
                    }
                    let mut wv = [[_mm512_setzero_si512(); 4]; R];
                    for r in 0..R {
                        let [x0, x1, hb] = [raw[0][r], raw[1][r], raw[2][r]];
                        // The top bits of value step 4p + i are bits 2i..2i + 2 of `hb`,
                        // moved to bits 4..6 (16-bit shifts: what crosses a byte is masked).
                        let top = [
                            _mm512_and_si512(_mm512_slli_epi16::<4>(hb), m30),
                            _mm512_and_si512(_mm512_slli_epi16::<2>(hb), m30),
                            _mm512_and_si512(hb, m30),
                            _mm512_and_si512(_mm512_srli_epi16::<2>(hb), m30),
                        ];
                        let nibbles = [
                            _mm512_and_si512(x0, low),
                            _mm512_and_si512(_mm512_srli_epi16::<4>(x0), low),
                            _mm512_and_si512(x1, low),
                            _mm512_and_si512(_mm512_srli_epi16::<4>(x1), low),
                        ];
                        for i in 0..4 {
                            wv[r][i] = _mm512_or_si512(nibbles[i], top[i]);
                        }
                    }
                    for c in 0..C {
                        for i in 0..4 {
                            let av = unsafe {
                                _mm512_loadu_si512(
                                    aq.add(c * kp + chunk * BLOCK + (4 * part + i) * step)
                                        as *const _,
                                )
                            };
                            for r in 0..R {
                                dot[c][r] = _mm512_dpbusd_epi32(dot[c][r], wv[r][i], av);
                            }
                        }
                    }
                }
                last = ch.n;
            } else if F == Q6 {
                // Value steps of the first half of every block, then of the second: the
                // halves have scales of their own, so the first half's sums go to `acc`
                // before the second's start.
                let half = steps / 2;
                let three = _mm512_set1_epi8(3);
                for t in 0..steps {
                    if t == half {
                        flush(&mut acc, &dot, 0);
                        dot = [[_mm512_setzero_si512(); R]; C];
                    }
                    let (ns, hs) = (
                        _mm_cvtsi32_si128(4 * (t % 2) as i32),
                        _mm_cvtsi32_si128(2 * (t % 4) as i32),
                    );
                    let mut wv = [_mm512_setzero_si512(); R];
                    for r in 0..R {
                        let (x, hb) = unsafe {
                            (
                                _mm512_maskz_loadu_epi32(
                                    lmask,
                                    wp[r].add(stride * ch.q6_nibble_step(t / 2)) as *const _,
                                ),
                                _mm512_maskz_loadu_epi32(
                                    lmask,
                                    wp[r].add(stride * ch.q6_high_step(t / 4)) as *const _,
                                ),
                            )
                        };
                        // 16-bit shifts: the bits another byte pushes in are masked off.
                        let lo = _mm512_and_si512(_mm512_srl_epi16(x, ns), low);
                        let top = _mm512_and_si512(_mm512_srl_epi16(hb, hs), three);
                        wv[r] = _mm512_or_si512(lo, _mm512_slli_epi16::<4>(top));
                    }
                    for c in 0..C {
                        let av = unsafe {
                            _mm512_maskz_loadu_epi32(
                                lmask,
                                aq.add(c * kp + chunk * BLOCK + t * step) as *const _,
                            )
                        };
                        for r in 0..R {
                            dot[c][r] = _mm512_dpbusd_epi32(dot[c][r], wv[r], av);
                        }
                    }
                }
                last = ch.n;
            } else if F == Q8 {
                for t in 0..steps {
                    let mut wv = [_mm512_setzero_si512(); R];
                    for r in 0..R {
                        wv[r] = unsafe { _mm512_maskz_loadu_epi32(lmask, wp[r] as *const _) };
                        wp[r] = wp[r].wrapping_add(stride);
                    }
                    for c in 0..C {
                        let av = unsafe {
                            _mm512_maskz_loadu_epi32(
                                lmask,
                                aq.add(c * kp + chunk * BLOCK + t * step) as *const _,
                            )
                        };
                        for r in 0..R {
                            dot[c][r] = _mm512_dpbusd_epi32(dot[c][r], wv[r], av);
                        }
                    }
                }
            } else {
                let half = steps / 2;
                for s in 0..half {
                    let mut lo = [_mm512_setzero_si512(); R];
                    let mut hi = [_mm512_setzero_si512(); R];
                    for r in 0..R {
                        let x = unsafe { _mm512_maskz_loadu_epi32(lmask, wp[r] as *const _) };
                        wp[r] = wp[r].wrapping_add(stride);
                        lo[r] = _mm512_and_si512(x, low);
                        hi[r] = _mm512_and_si512(_mm512_srli_epi16::<4>(x), low);
                    }
                    for c in 0..C {
                        let (al, ah) = unsafe {
                            let base = aq.add(c * kp + chunk * BLOCK);
                            (
                                _mm512_maskz_loadu_epi32(lmask, base.add(s * step) as *const _),
                                _mm512_maskz_loadu_epi32(
                                    lmask,
                                    base.add((s + half) * step) as *const _,
                                ),
                            )
                        };
                        for r in 0..R {
                            dot[c][r] = _mm512_dpbusd_epi32(dot[c][r], lo[r], al);
                            dot[c][r] = _mm512_dpbusd_epi32(dot[c][r], hi[r], ah);
                        }
                    }
                }
            }
            flush(&mut acc, &dot, last);
            chunk += LANES;
        }
        if R * C == 16 {
            let mut all = [_mm512_setzero_ps(); 16];
            for c in 0..C {
                for r in 0..R {
                    all[c * R + r] = acc[c][r];
                }
            }
            let mut sums = [0f32; 16];
            // SAFETY: 16 floats fit `sums`; this kernel's features include AVX-512 F.
            unsafe { _mm512_storeu_ps(sums.as_mut_ptr(), sum16(&all)) };
            for c in 0..C {
                for r in 0..R {
                    out[c][r] = sums[c * R + r];
                }
            }
        } else {
            for c in 0..C {
                for r in 0..R {
                    // SAFETY: this kernel's features include AVX-512 F.
                    out[c][r] = unsafe { sum1(acc[c][r]) };
                }
            }
        }
    }

    /// AVX-512 VNNI implementation of [`super::panel`]: each weight row's four bytes of a
    /// step are broadcast to every lane and multiplied with the 16 tokens' four values of
    /// each group.
    ///
    /// # Safety
    /// The CPU must support the enabled features, and the slices must be as long as
    /// [`super::panel`] checks.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn panel_avx512<const R: usize, const T: usize>(
        w: &PanelRows<'_>,
        r0: usize,
        at: &[RowAt; R],
        a: &[PanelActs<'_>; T],
        out: &mut PanelOut<R, T>,
    ) {
        let nbp = w.nbp;
        // The tile kernel's 16 lanes of each row and group, each a vector of 16 tokens.
        let mut lanes = [[[_mm512_setzero_ps(); LANES]; T]; R];
        let mut chunk = 0;
        while chunk < nbp {
            let ch = Chunk::at(nbp, chunk);
            // SAFETY: the caller's contract; the chunk lies inside every row.
            unsafe {
                match (ch.per, w.d1.is_empty()) {
                    (1, true) => panel_chunk::<R, T, 1, false>(w, r0, at, a, ch, &mut lanes),
                    (2, true) => panel_chunk::<R, T, 2, false>(w, r0, at, a, ch, &mut lanes),
                    (_, true) => panel_chunk::<R, T, 4, false>(w, r0, at, a, ch, &mut lanes),
                    (1, false) => panel_chunk::<R, T, 1, true>(w, r0, at, a, ch, &mut lanes),
                    (2, false) => panel_chunk::<R, T, 2, true>(w, r0, at, a, ch, &mut lanes),
                    (_, false) => panel_chunk::<R, T, 4, true>(w, r0, at, a, ch, &mut lanes),
                }
            }
            chunk += LANES;
        }
        for r in 0..R {
            for t in 0..T {
                let e = &lanes[r][t];
                let l = |k: usize| {
                    _mm512_add_ps(
                        _mm512_add_ps(e[4 * k], e[4 * k + 2]),
                        _mm512_add_ps(e[4 * k + 1], e[4 * k + 3]),
                    )
                };
                let sum = _mm512_add_ps(_mm512_add_ps(l(0), l(1)), _mm512_add_ps(l(2), l(3)));
                // SAFETY: 16 floats fit `out[r][t]`.
                unsafe { _mm512_storeu_ps(out[r][t].as_mut_ptr(), sum) };
            }
        }
    }

    /// The blocks of chunk `ch` (each over `PER` lanes) of [`panel_avx512`], added to the
    /// lanes where the tile kernel adds them: block `i`'s bias to lane `i`, then to lane
    /// `l` the product of the steps of block `l / PER` it holds, times `d_w·d_a`. With
    /// `HALVES` (Q6 rows) each half of a block has its own bias and scale, added first
    /// half first, as the tile kernel does.
    #[inline(always)]
    unsafe fn panel_chunk<const R: usize, const T: usize, const PER: usize, const HALVES: bool>(
        w: &PanelRows<'_>,
        r0: usize,
        at: &[RowAt; R],
        a: &[PanelActs<'_>; T],
        ch: Chunk,
        lanes: &mut [[[__m512; LANES]; T]; R],
    ) {
        let sb = ch.step_bytes();
        let start = ch.start * BLOCK;
        // Step 0 of the chunk in each row, and the bytes from one step to the next.
        let base: [*const u8; R] =
            std::array::from_fn(|r| w.q.as_ptr().wrapping_add(at[r].step(start, 0, sb)));
        let stride: [usize; R] =
            std::array::from_fn(|r| at[r].step(start, 1, sb) - at[r].step(start, 0, sb));
        // Whole tiles of a whole chunk (the common case): row r's step g is 64·(r % 4) +
        // 256·g bytes after its tile's step 0, offsets the compiler folds into the loads.
        let whole = PER == 1 && R.is_multiple_of(4) && (0..R).all(|r| stride[r] == 4 * 64);
        // SAFETY (whole body): every weight read is four bytes of one of the chunk's steps
        // inside row r; every activation read is inside its group's transposed block.
        unsafe {
            // Group t's sums of block b: all of it, and (Q6) its first half.
            let sums = |t: usize, b: usize| {
                let sa = _mm512_loadu_ps(a[t].s.as_ptr().add(16 * b));
                let h = if HALVES {
                    _mm512_loadu_ps(a[t].h.as_ptr().add(16 * b))
                } else {
                    sa
                };
                (sa, h)
            };
            // `x` plus the bias of block b of the weights' row `r0 + r` (Q6: the first
            // half's, then the second's), for the sums `(sa, h)` of a group of tokens.
            let biased = |x: __m512, r: usize, b: usize, (sa, h): (__m512, __m512)| {
                let at = (r0 + r) * w.nbp + b;
                let m0 = _mm512_set1_ps(*w.m.get_unchecked(at));
                if HALVES {
                    let m1 = _mm512_set1_ps(*w.m1.get_unchecked(at));
                    _mm512_fmadd_ps(m1, _mm512_sub_ps(sa, h), _mm512_fmadd_ps(m0, h, x))
                } else {
                    _mm512_fmadd_ps(m0, sa, x)
                }
            };
            let bias = |lanes: &mut [[[__m512; LANES]; T]; R], i: usize| {
                let b = ch.start + i;
                for t in 0..T {
                    let sh = sums(t, b);
                    for r in 0..R {
                        lanes[r][t][i] = biased(lanes[r][t][i], r, b, sh);
                    }
                }
            };
            // Lane l: steps 0.. of block l / PER, which hold its groups l % PER + PER·step.
            // With `PER == 1` lane `l` is block `l`, and its bias is added in the same pass
            // as its first product (one load and store of the lane instead of two).
            let lane = |lanes: &mut [[[__m512; LANES]; T]; R], l: usize| {
                let b = ch.start + l / PER;
                let mut dot = [[_mm512_setzero_si512(); T]; R];
                // Q6: the first half's product, added with its scale before the second's.
                let flush = |lanes: &mut [[[__m512; LANES]; T]; R],
                             dot: &[[__m512i; T]; R],
                             ws: &[f32],
                             with_bias: bool| {
                    for t in 0..T {
                        let da = _mm512_loadu_ps(a[t].d.as_ptr().add(16 * b));
                        let sh = sums(t, b);
                        for r in 0..R {
                            let mut x = lanes[r][t][l];
                            if with_bias {
                                x = biased(x, r, b, sh);
                            }
                            let d = _mm512_set1_ps(*ws.get_unchecked((r0 + r) * w.nbp + b));
                            lanes[r][t][l] = _mm512_fmadd_ps(
                                _mm512_cvtepi32_ps(dot[r][t]),
                                _mm512_mul_ps(d, da),
                                x,
                            );
                        }
                    }
                };
                for step in 0..8 / PER {
                    if HALVES && step == 4 / PER {
                        flush(lanes, &dot, w.d, PER == 1);
                        dot = [[_mm512_setzero_si512(); T]; R];
                    }
                    let g = step * PER + l % PER;
                    let av: [__m512i; T] = std::array::from_fn(|t| {
                        _mm512_loadu_si512(a[t].q.as_ptr().add(64 * (8 * b + g)) as *const _)
                    });
                    for r in 0..R {
                        let p = if whole {
                            base[r / 4 * 4].add(4 * l + 64 * (r % 4) + 256 * step)
                        } else {
                            base[r].add(step * stride[r] + 4 * l)
                        };
                        let x = _mm512_set1_epi32((p as *const i32).read_unaligned());
                        for t in 0..T {
                            dot[r][t] = _mm512_dpbusd_epi32(dot[r][t], x, av[t]);
                        }
                    }
                }
                if HALVES {
                    flush(lanes, &dot, w.d1, false);
                } else {
                    flush(lanes, &dot, w.d, PER == 1);
                }
            };
            if PER == 1 {
                // One lane a block: its bias, then its product, in one pass.
                for i in 0..ch.n {
                    lane(lanes, i);
                }
            } else {
                for i in 0..ch.n {
                    bias(lanes, i);
                }
                for l in 0..ch.n * PER {
                    lane(lanes, l);
                }
            }
        }
    }

    /// The sum of the 16 lanes of `v`, added in the same order as [`sum16`] adds each of
    /// its vectors, so that a product does not depend on the tile it fell in (one token
    /// alone, or four at once): within each 128-bit lane `(e0 + e2) + (e1 + e3)`, then
    /// `(L0 + L1) + (L2 + L3)` across them.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F (the callers enable it).
    #[inline(always)]
    unsafe fn sum1(v: __m512) -> f32 {
        // SAFETY: the caller's contract.
        unsafe {
            let t = _mm512_add_ps(v, _mm512_permute_ps::<0b01_00_11_10>(v));
            let u = _mm512_add_ps(t, _mm512_permute_ps::<0b10_11_00_01>(t));
            let w = _mm512_add_ps(u, _mm512_shuffle_f32x4::<0b10_11_00_01>(u, u));
            let z = _mm512_add_ps(w, _mm512_shuffle_f32x4::<0b01_00_11_10>(w, w));
            _mm512_cvtss_f32(z)
        }
    }

    /// Lane `i` of the result is the sum of the 16 lanes of `v[i]`: a transposing tree of
    /// 45 shuffles and adds, where 16 separate horizontal sums take about 130 (a 4 × 4
    /// tile over a short row spends as long summing its accumulators as multiplying).
    ///
    /// # Safety
    /// The CPU must have AVX-512 F (the callers enable it).
    #[inline(always)]
    unsafe fn sum16(v: &[__m512; 16]) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe {
            // Level 1: within each 128-bit lane, positions 0 and 2 sum half of v[2k], 1 and 3
            // half of v[2k + 1].
            let mut b = [_mm512_setzero_ps(); 8];
            for k in 0..8 {
                let (x, y) = (v[2 * k], v[2 * k + 1]);
                b[k] = _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
            }
            // Level 2: position m of each 128-bit lane sums that lane's part of v[4k + m].
            let mut c = [_mm512_setzero_ps(); 4];
            for k in 0..4 {
                let (p, q) = (_mm512_castps_pd(b[2 * k]), _mm512_castps_pd(b[2 * k + 1]));
                c[k] = _mm512_add_ps(
                    _mm512_castpd_ps(_mm512_unpacklo_pd(p, q)),
                    _mm512_castpd_ps(_mm512_unpackhi_pd(p, q)),
                );
            }
            // Levels 3 and 4: add the four 128-bit lanes of each c[k], which lands as 128-bit
            // lane k of the result.
            let pairs = |x: __m512, y: __m512| {
                _mm512_add_ps(
                    _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
                    _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
                )
            };
            let (d0, d1) = (pairs(c[0], c[1]), pairs(c[2], c[3]));
            pairs(d0, d1)
        }
    }

    /// `out` as a tile of four weight rows when `R` is 4 (the kernels' fast shape).
    #[inline(always)]
    fn four_rows<const R: usize, const C: usize>(
        out: &mut [[f32; R]; C],
    ) -> Option<&mut [[f32; 4]; C]> {
        // SAFETY: with R == 4 the two types are the same.
        (R == 4).then(|| unsafe { &mut *(out as *mut [[f32; R]; C] as *mut [[f32; 4]; C]) })
    }

    /// The f16 scales (or Q4_1 minima) of block `b` of four consecutive rows, as f32.
    ///
    /// # Safety
    /// `p` must hold four rows of `nbp` values, `b < nbp`, and the CPU must have F16C (the
    /// callers enable it).
    #[inline(always)]
    unsafe fn scales4(p: *const u16, nbp: usize, b: usize) -> __m128 {
        // SAFETY: the caller's contract.
        unsafe {
            _mm_cvtph_ps(_mm_setr_epi16(
                *p.add(b) as i16,
                *p.add(nbp + b) as i16,
                *p.add(2 * nbp + b) as i16,
                *p.add(3 * nbp + b) as i16,
                0,
                0,
                0,
                0,
            ))
        }
    }

    /// The bias term of weight row `r` against activation row `c`: the sum over blocks of
    /// the block's bias (Q4_1's minimum, `-offset·d` for Q4_0) times the activation
    /// block's `d·Σq`; zero for Q8, whose signed products already hold it.
    #[inline(always)]
    fn row_bias<const F: u8>(w: &WeightRows<'_>, a: &ActRows<'_>, r: usize, c: usize) -> f32 {
        let nbp = w.nbp;
        if F == Q8 {
            return 0.0;
        }
        (0..nbp)
            .map(|b| {
                let m = if F == Q41 {
                    w.m[r * nbp + b].to_f32()
                } else {
                    -offset(F) * w.d[r * nbp + b].to_f32()
                };
                m * a.s[c * nbp + b]
            })
            .sum()
    }

    #[inline(always)]
    unsafe fn hsum256(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// AVX2 tile kernel, one block at a time; see [`super::tile`].
    ///
    /// Q8 rows are turned back into signed bytes (`u ^ 0x80`) so that `vpmaddubsw` cannot
    /// saturate; the signed dot product already includes the `-128·d` bias.
    ///
    /// # Safety
    /// The CPU must support the enabled features, and the slices must be as long as
    /// [`super::tile`] checks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn tile_avx2<const F: u8, const R: usize, const C: usize>(
        w: &WeightRows<'_>,
        a: &ActRows<'_>,
        out: &mut [[f32; R]; C],
    ) {
        if let Some(out4) = four_rows(out) {
            // SAFETY: same contract.
            return unsafe { tile_avx2_r4::<F, C>(w, a, out4) };
        }
        let nbp = w.nbp;
        let kp = nbp * BLOCK;
        let rb = row_bytes(F, kp);
        let (wq, aq) = (w.q.as_ptr(), a.q.as_ptr());
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); R]; C];
        for b in 0..nbp {
            let mut wv = [_mm256_setzero_si256(); R];
            let mut dw = [0f32; R];
            for r in 0..R {
                // SAFETY: block b < nbp lies inside row r.
                wv[r] = unsafe { load_block::<F>(wq.add(r * rb), b) };
                dw[r] = w.d[r * nbp + b].to_f32();
            }
            for c in 0..C {
                // SAFETY: block b of activation row c.
                let av = unsafe { _mm256_loadu_si256(aq.add(c * kp + b * BLOCK) as *const _) };
                let da = a.d[c * nbp + b];
                for r in 0..R {
                    let prod = if F == Q8 {
                        _mm256_maddubs_epi16(_mm256_abs_epi8(wv[r]), _mm256_sign_epi8(av, wv[r]))
                    } else {
                        _mm256_maddubs_epi16(wv[r], av)
                    };
                    let dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(prod, ones));
                    acc[c][r] = _mm256_fmadd_ps(dot, _mm256_set1_ps(dw[r] * da), acc[c][r]);
                }
            }
        }
        for c in 0..C {
            for r in 0..R {
                let bias = row_bias::<F>(w, a, r, c);
                // SAFETY: plain register arithmetic on an initialised vector.
                out[c][r] = unsafe { hsum256(acc[c][r]) } + bias;
            }
        }
    }

    /// The 32 unsigned (Q4) or signed (Q8, `u ^ 0x80`) weight bytes of block `b` of a row.
    #[inline(always)]
    unsafe fn load_block<const F: u8>(row: *const u8, b: usize) -> __m256i {
        // SAFETY: the caller guarantees block `b` lies inside the row.
        unsafe {
            if F == Q8 {
                let x = _mm256_loadu_si256(row.add(b * BLOCK) as *const _);
                _mm256_xor_si256(x, _mm256_set1_epi8(-128))
            } else {
                let x = _mm256_loadu_si256(row.add((b / 2) * BLOCK) as *const _);
                let x = if b.is_multiple_of(2) {
                    x
                } else {
                    _mm256_srli_epi16::<4>(x)
                };
                _mm256_and_si256(x, _mm256_set1_epi8(0x0F))
            }
        }
    }

    /// AVX2 kernel for tiles of four weight rows: the four rows' integer dot products with
    /// one activation block are folded by horizontal adds into one register, lanes
    /// `[r0, r1, r2, r3]` in each 128-bit half, so one conversion and one multiply-add per
    /// activation row and block take the place of four, and the accumulators (one per
    /// activation row) fit AVX2's sixteen registers where four per row would spill.
    ///
    /// Q4 products fold as 16-bit sums: one `vpmaddubsw` lane is at most 2·15·128 = 3840 in
    /// magnitude, four of them 15360 < 2^15. Q8 products (up to 2·128·127) are widened to
    /// 32 bits before folding.
    ///
    /// # Safety
    /// As [`tile_avx2`].
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile_avx2_r4<const F: u8, const C: usize>(
        w: &WeightRows<'_>,
        a: &ActRows<'_>,
        out: &mut [[f32; 4]; C],
    ) {
        let nbp = w.nbp;
        let kp = nbp * BLOCK;
        let rb = row_bytes(F, kp);
        let (wq, aq, ad, as_) = (w.q.as_ptr(), a.q.as_ptr(), a.d.as_ptr(), a.s.as_ptr());
        let (wd, wm) = (w.d.as_ptr() as *const u16, w.m.as_ptr() as *const u16);
        let ones = _mm256_set1_epi16(1);
        let neg_off = _mm_set1_ps(-offset(F));
        let mut acc = [_mm256_setzero_ps(); C];
        for b in 0..nbp {
            // SAFETY: block b < nbp of rows 0..4, and of every activation row c < C.
            unsafe {
                let w0 = load_block::<F>(wq, b);
                let w1 = load_block::<F>(wq.add(rb), b);
                let w2 = load_block::<F>(wq.add(2 * rb), b);
                let w3 = load_block::<F>(wq.add(3 * rb), b);
                let scales = |p: *const u16| scales4(p, nbp, b);
                let d4 = scales(wd);
                let dw = _mm256_set_m128(d4, d4);
                // Bias per row in the low half only: the halves are summed at the end.
                let m4 = if F == Q8 {
                    None
                } else if F == Q41 {
                    Some(_mm256_zextps128_ps256(scales(wm)))
                } else {
                    Some(_mm256_zextps128_ps256(_mm_mul_ps(d4, neg_off)))
                };
                for c in 0..C {
                    let av = _mm256_loadu_si256(aq.add(c * kp + b * BLOCK) as *const _);
                    let dot = if F == Q8 {
                        let prod = |wv: __m256i| {
                            _mm256_madd_epi16(
                                _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(av, wv)),
                                ones,
                            )
                        };
                        let h01 = _mm256_hadd_epi32(prod(w0), prod(w1));
                        let h23 = _mm256_hadd_epi32(prod(w2), prod(w3));
                        _mm256_hadd_epi32(h01, h23)
                    } else {
                        let h01 = _mm256_hadd_epi16(
                            _mm256_maddubs_epi16(w0, av),
                            _mm256_maddubs_epi16(w1, av),
                        );
                        let h23 = _mm256_hadd_epi16(
                            _mm256_maddubs_epi16(w2, av),
                            _mm256_maddubs_epi16(w3, av),
                        );
                        _mm256_madd_epi16(_mm256_hadd_epi16(h01, h23), ones)
                    };
                    let scale = _mm256_mul_ps(dw, _mm256_broadcast_ss(&*ad.add(c * nbp + b)));
                    acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[c]);
                    if let Some(m) = m4 {
                        let sa = _mm256_broadcast_ss(&*as_.add(c * nbp + b));
                        acc[c] = _mm256_fmadd_ps(m, sa, acc[c]);
                    }
                }
            }
        }
        for c in 0..C {
            let s = _mm_add_ps(
                _mm256_castps256_ps128(acc[c]),
                _mm256_extractf128_ps::<1>(acc[c]),
            );
            // SAFETY: out[c] holds four f32.
            unsafe { _mm_storeu_ps(out[c].as_mut_ptr(), s) };
        }
    }

    /// Lanes of one 256-bit half of a chunk step in use: all 8, or the first `used`
    /// (a short last chunk), as a `vpmaskmovd` mask.
    #[inline(always)]
    unsafe fn lane_mask(used: usize) -> __m256i {
        // SAFETY: plain register arithmetic (the callers enable AVX2).
        unsafe {
            let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            _mm256_cmpgt_epi32(_mm256_set1_epi32(used as i32), idx)
        }
    }

    /// Eight 32-bit lanes at `p`: a plain load when all are in use, a masked one (which
    /// touches no byte of a lane left out) otherwise.
    #[inline(always)]
    unsafe fn load_lanes<T>(p: *const T, used: usize, mask: __m256i) -> __m256i {
        // SAFETY: the caller guarantees the `used` lanes at `p` are readable.
        unsafe {
            if used == 8 {
                _mm256_loadu_si256(p as *const _)
            } else {
                _mm256_maskload_epi32(p as *const i32, mask)
            }
        }
    }

    /// AVX2 tile kernel over rows in [`super::Layout::Lanes`]: each 512-bit step of a chunk
    /// is read as two 256-bit halves of eight 4-byte lanes, one lane per block (or per
    /// part of a block in a short last chunk), so that a block's products build up in a
    /// lane of their own and no horizontal add is needed until the end of the row (the
    /// pair-layout kernel folds every block's products with three `phadd`s, which run on
    /// one shuffle port). Q4 products stay 16-bit for a whole chunk: a `vpmaddubsw` lane is
    /// at most 2·15·127 = 3810 in magnitude and a lane takes eight of them, 30480 < 2^15.
    /// Q8 rows are turned back into signed bytes (`u ^ 0x80`) and multiplied with the sign
    /// trick of [`tile_avx2`], widened to 32 bits after every step.
    ///
    /// Activation rows go two at a time, so that a pair's 4 × 2 integer sums, the weights
    /// and the activations fit the sixteen registers; the float sums, touched once per
    /// chunk half, live in memory.
    ///
    /// # Safety
    /// As [`tile_avx2`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn tile_avx2_lanes<const F: u8, const R: usize, const C: usize>(
        w: &WeightRows<'_>,
        a: &ActRows<'_>,
        out: &mut [[f32; R]; C],
    ) {
        let mut acc = [[_mm256_setzero_ps(); R]; C];
        let mut c0 = 0;
        while c0 < C {
            // SAFETY: the caller's contract; rows c0..c0 + 2 (or c0) exist.
            unsafe {
                if c0 + 2 <= C {
                    lanes_avx2_rows::<F, R, C, 2>(w, a, c0, &mut acc);
                    c0 += 2;
                } else {
                    lanes_avx2_rows::<F, R, C, 1>(w, a, c0, &mut acc);
                    c0 += 1;
                }
            }
        }
        for c in 0..C {
            if R == 4 {
                // The four rows' sums by one tree of horizontal adds (the same for every
                // activation row, so a token's bits do not depend on its tile).
                // SAFETY: plain register arithmetic; out[c] holds four f32.
                unsafe {
                    let h01 = _mm256_hadd_ps(acc[c][0], acc[c][1]);
                    let h23 = _mm256_hadd_ps(acc[c][2], acc[c][3]);
                    let h = _mm256_hadd_ps(h01, h23);
                    let s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
                    _mm_storeu_ps(out[c].as_mut_ptr(), s);
                }
            } else {
                for r in 0..R {
                    // SAFETY: plain register arithmetic on an initialised vector.
                    out[c][r] = unsafe { hsum256(acc[c][r]) };
                }
            }
        }
    }

    /// The products of activation rows `c0..c0 + N` with the tile's weight rows, added
    /// to `acc`; see [`tile_avx2_lanes`].
    #[inline(always)]
    unsafe fn lanes_avx2_rows<const F: u8, const R: usize, const C: usize, const N: usize>(
        w: &WeightRows<'_>,
        a: &ActRows<'_>,
        c0: usize,
        acc: &mut [[__m256; R]; C],
    ) {
        let nbp = w.nbp;
        let at: [RowAt; R] = std::array::from_fn(|r| w.row_at(r));
        let mut chunk = 0;
        while chunk < nbp {
            let ch = Chunk::at(nbp, chunk);
            // SAFETY: the caller's contract; chunk `ch` lies inside every row.
            unsafe {
                if ch.n == LANES {
                    if c0 == 0 && nbp >= 2 * LANES {
                        // The first activation rows (all of them in decode) ask for the
                        // weights ahead, where rows hold at least two whole chunks.
                        prefetch_ahead::<F>(w, &at, ch);
                    }
                    // A whole chunk: two halves of eight blocks, eight steps of 64 bytes
                    // (Q6: the halves of its blocks, each with its own scale, one at a
                    // time).
                    for h in 0..2 {
                        let all = _mm256_set1_epi32(-1);
                        let first = chunk + 8 * h;
                        for part in 0..if F == Q6 { 2 } else { 1 } {
                            let dot = half_dots::<F, R, N>(w, &at, a, c0, ch, h, 8, all, part);
                            for r in 0..R {
                                // The chunk's scales, then its second values.
                                let sc = at[r].chunk_scales(ch, scales_per_block(F)) + 8 * h;
                                let dw = load_f16x8(w.d.as_ptr().add(sc + part * LANES));
                                let m = if F == Q6 {
                                    Some(_mm256_mul_ps(dw, _mm256_set1_ps(-offset(F))))
                                } else {
                                    bias8::<F>(w, sc)
                                };
                                for c in 0..N {
                                    let row = (c0 + c) * nbp + first;
                                    let da = _mm256_loadu_ps(a.d.as_ptr().add(row));
                                    let x = &mut acc[c0 + c][r];
                                    *x = _mm256_fmadd_ps(
                                        _mm256_cvtepi32_ps(dot[c][r]),
                                        _mm256_mul_ps(dw, da),
                                        *x,
                                    );
                                    if let Some(m) = m {
                                        let sa = _mm256_loadu_ps(a.s.as_ptr().add(row));
                                        let sa = if F != Q6 {
                                            sa
                                        } else {
                                            // A Q6 half's bias goes with its own sum.
                                            let h = _mm256_loadu_ps(a.h.as_ptr().add(row));
                                            if part == 0 {
                                                h
                                            } else {
                                                _mm256_sub_ps(sa, h)
                                            }
                                        };
                                        *x = _mm256_fmadd_ps(m, sa, *x);
                                    }
                                }
                            }
                        }
                    }
                } else {
                    short_chunk::<F, R, C, N>(w, &at, a, c0, ch, acc);
                }
            }
            chunk += LANES;
        }
    }

    /// How far ahead of the chunk it reads, in bytes of the tile's weights, the AVX2 lane
    /// kernel asks for them with `prefetcht0`. A 256-bit kernel spends twice the
    /// instructions of the AVX-512 one on each cache line, so fewer lines are in flight
    /// within the out-of-order window and the hardware prefetcher alone left one AMD EPYC
    /// (Zen 4) core reading 12-15 GB/s in decode of a 1B Q4_K_M file. Measured there,
    /// alternating, one thread (tok/s): none 11.6 / 11.4 / 13.8, 1 KiB 16.3 / 12.8 / 14.4;
    /// two threads: none 26.9 / 30.4 / 27.2, 1 KiB 31.5 / 34.7 / 30.0. 2 KiB and 6 KiB did
    /// no better than 1 KiB at one thread and worse at two, and prefetching the scales as
    /// well was slower. Gemma 3 270M, whose rows hold one whole chunk and a short one, lost
    /// 5% with it in three rounds out of three, so only rows of two or more whole chunks
    /// ask (same CPU, two threads, none against this rule: Gemma 97.6 / 108.4 / 94.3
    /// against 101.3 / 104.0 / 104.2, the 1B file 28.0 / 22.7 / 27.6 against 30.2 / 24.9 /
    /// 29.1). The AVX-512 kernel, measured with the same hint, moved within the noise.
    const PF_DIST: usize = 1024;

    /// Asks for the cache lines `PF_DIST` bytes ahead of a whole chunk of a tile's weights
    /// (the tiles of a matrix follow one another, so near the end of a tile this reaches
    /// into the next one, and past the matrix's end it is a hint that loads nothing).
    #[inline(always)]
    fn prefetch_ahead<const F: u8>(w: &WeightRows<'_>, at: &[RowAt], ch: Chunk) {
        let tile = at[0].g * row_bytes(F, LANES * BLOCK);
        let base =
            w.q.as_ptr()
                .wrapping_add(at[0].q + at[0].g * row_bytes(F, ch.start * BLOCK) + PF_DIST);
        let mut o = 0;
        while o < tile {
            // SAFETY: a prefetch is a hint; it does not fault on any address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(o) as *const i8) };
            o += 64;
        }
    }

    /// Eight f16 values at `p` as f32.
    #[inline(always)]
    unsafe fn load_f16x8(p: *const f16) -> __m256 {
        // SAFETY: the caller guarantees eight values at `p`; F16C is enabled by the callers.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const _)) }
    }

    /// The biases of the 8 blocks whose scales are at `b` in a whole chunk of
    /// [`super::Layout::Lanes`] (a Q4 format; Q4_1's follow the chunk's 16 scales), none
    /// for Q8.
    #[inline(always)]
    unsafe fn bias8<const F: u8>(w: &WeightRows<'_>, b: usize) -> Option<__m256> {
        // SAFETY: the caller guarantees blocks b..b + 8 exist.
        unsafe {
            if F == Q8 {
                None
            } else if F == Q41 {
                Some(load_f16x8(w.d.as_ptr().add(b + LANES)))
            } else {
                Some(_mm256_mul_ps(
                    load_f16x8(w.d.as_ptr().add(b)),
                    _mm256_set1_ps(-offset(F)),
                ))
            }
        }
    }

    /// The integer dot products, per lane, of half `h` of chunk `ch` (its `used` lanes,
    /// `mask` when fewer than 8) of the tile's weight rows with activation rows
    /// `c0..c0 + N`; for Q6, over the value steps of half `part` of each block only.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn half_dots<const F: u8, const R: usize, const N: usize>(
        w: &WeightRows<'_>,
        at: &[RowAt; R],
        a: &ActRows<'_>,
        c0: usize,
        ch: Chunk,
        h: usize,
        used: usize,
        mask: __m256i,
        part: usize,
    ) -> [[__m256i; R]; N] {
        let kp = w.nbp * BLOCK;
        let (wq, aq) = (w.q.as_ptr(), a.q.as_ptr());
        let (step, steps) = (ch.step_bytes(), ch.steps());
        // Each row's steps, walked by pointer (no index arithmetic in the loop).
        let start = row_bytes(F, ch.start * BLOCK);
        let (mut wp, stride) = RowAt::tile_steps(at, wq, start, step, 32 * h);
        let mut dot = [[_mm256_setzero_si256(); R]; N];
        // SAFETY: every load reads the `used` lanes of one step of the chunk, inside row r
        // of the weights or row c0 + c of the activations.
        unsafe {
            let ones = _mm256_set1_epi16(1);
            if F == Q6 && steps == 8 {
                // A whole chunk, unrolled with the shifts as immediates: nibble step 3p + k
                // holds value steps 4p + 2k and 4p + 2k + 1, step 3p + 2 their top bits. Two
                // `vpmaddubsw` lanes (at most 2·63·127 each) still fit 16 bits, so the pair
                // of value steps is widened to 32 bits once.
                let (low, m30) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
                for k in 0..2 {
                    let t = 4 * part + 2 * k;
                    let off = ch.start * BLOCK + t * step + 32 * h;
                    let mut av = [[_mm256_setzero_si256(); 2]; N];
                    for c in 0..N {
                        let p = aq.add((c0 + c) * kp + off);
                        av[c] = [
                            load_lanes(p, used, mask),
                            load_lanes(p.add(step), used, mask),
                        ];
                    }
                    let mut x = [_mm256_setzero_si256(); R];
                    for r in 0..R {
                        x[r] = load_lanes(wp[r].add(stride * (3 * part + k)), used, mask);
                    }
                    for r in 0..R {
                        let hb = load_lanes(wp[r].add(stride * (3 * part + 2)), used, mask);
                        // Bits 4k..4k + 4 of `hb` moved to bits 4..6 (16-bit shifts: what
                        // crosses a byte is masked off).
                        let (top0, top1) = if k == 0 {
                            (_mm256_slli_epi16::<4>(hb), _mm256_slli_epi16::<2>(hb))
                        } else {
                            (hb, _mm256_srli_epi16::<2>(hb))
                        };
                        let u0 = _mm256_or_si256(
                            _mm256_and_si256(x[r], low),
                            _mm256_and_si256(top0, m30),
                        );
                        let u1 = _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(x[r]), low),
                            _mm256_and_si256(top1, m30),
                        );
                        for c in 0..N {
                            let p = _mm256_add_epi16(
                                _mm256_maddubs_epi16(u0, av[c][0]),
                                _mm256_maddubs_epi16(u1, av[c][1]),
                            );
                            dot[c][r] = _mm256_add_epi32(dot[c][r], _mm256_madd_epi16(p, ones));
                        }
                    }
                }
                return dot;
            }
            if F == Q6 {
                // Six-bit values: a `vpmaddubsw` lane is at most 2·63·127, so products are
                // widened to 32 bits after every step. The nibble and high-bit steps are
                // read by offset from step 0 (two value steps share a nibble step).
                let (low, three) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(3));
                let half = steps / 2;
                for t in part * half..(part + 1) * half {
                    let off = ch.start * BLOCK + t * step + 32 * h;
                    let mut av = [_mm256_setzero_si256(); N];
                    for c in 0..N {
                        av[c] = load_lanes(aq.add((c0 + c) * kp + off), used, mask);
                    }
                    let (ns, hs) = (
                        _mm_cvtsi32_si128(4 * (t % 2) as i32),
                        _mm_cvtsi32_si128(2 * (t % 4) as i32),
                    );
                    for r in 0..R {
                        let x =
                            load_lanes(wp[r].add(stride * ch.q6_nibble_step(t / 2)), used, mask);
                        let hb = load_lanes(wp[r].add(stride * ch.q6_high_step(t / 4)), used, mask);
                        let lo = _mm256_and_si256(_mm256_srl_epi16(x, ns), low);
                        let top = _mm256_and_si256(_mm256_srl_epi16(hb, hs), three);
                        let u = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(top));
                        for c in 0..N {
                            let p = _mm256_maddubs_epi16(u, av[c]);
                            dot[c][r] = _mm256_add_epi32(dot[c][r], _mm256_madd_epi16(p, ones));
                        }
                    }
                }
                return dot;
            }
            if F == Q8 {
                let flip = _mm256_set1_epi8(-128);
                for t in 0..steps {
                    let off = ch.start * BLOCK + t * step + 32 * h;
                    let mut av = [_mm256_setzero_si256(); N];
                    for c in 0..N {
                        av[c] = load_lanes(aq.add((c0 + c) * kp + off), used, mask);
                    }
                    for r in 0..R {
                        let wv = _mm256_xor_si256(load_lanes(wp[r], used, mask), flip);
                        wp[r] = wp[r].wrapping_add(stride);
                        let aw = _mm256_abs_epi8(wv);
                        for c in 0..N {
                            let p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(av[c], wv));
                            dot[c][r] = _mm256_add_epi32(dot[c][r], _mm256_madd_epi16(p, ones));
                        }
                    }
                }
            } else {
                let low = _mm256_set1_epi8(0x0F);
                let half = steps / 2;
                for s in 0..half {
                    let off = ch.start * BLOCK + s * step + 32 * h;
                    let mut al = [_mm256_setzero_si256(); N];
                    let mut ah = [_mm256_setzero_si256(); N];
                    for c in 0..N {
                        let base = aq.add((c0 + c) * kp + off);
                        al[c] = load_lanes(base, used, mask);
                        ah[c] = load_lanes(base.add(half * step), used, mask);
                    }
                    for r in 0..R {
                        let x = load_lanes(wp[r], used, mask);
                        wp[r] = wp[r].wrapping_add(stride);
                        let lo = _mm256_and_si256(x, low);
                        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(x), low);
                        for c in 0..N {
                            dot[c][r] =
                                _mm256_add_epi16(dot[c][r], _mm256_maddubs_epi16(lo, al[c]));
                            dot[c][r] =
                                _mm256_add_epi16(dot[c][r], _mm256_maddubs_epi16(hi, ah[c]));
                        }
                    }
                }
                for c in 0..N {
                    for r in 0..R {
                        dot[c][r] = _mm256_madd_epi16(dot[c][r], ones);
                    }
                }
            }
        }
        dot
    }

    /// A short last chunk (fewer than 16 blocks, each over `ch.per` lanes); see
    /// [`lanes_avx2_rows`].
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn short_chunk<const F: u8, const R: usize, const C: usize, const N: usize>(
        w: &WeightRows<'_>,
        at: &[RowAt; R],
        a: &ActRows<'_>,
        c0: usize,
        ch: Chunk,
        acc: &mut [[__m256; R]; C],
    ) {
        let nbp = w.nbp;
        let n = ch.n;
        // SAFETY (whole body): loads of the chunk's lanes (masked where a half is partial)
        // and of its `n` blocks' values, inside the rows.
        unsafe {
            // Lane l of half h holds part of block (8h + l) / per; with per > 1 every block
            // is among the first 8.
            let shift = _mm256_set1_epi32(ch.per.trailing_zeros() as i32);
            let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let spread = |v: [__m256; 2]| -> [__m256; 2] {
                if ch.per == 1 {
                    v
                } else {
                    let idx = |h: i32| {
                        _mm256_srlv_epi32(_mm256_add_epi32(lanes, _mm256_set1_epi32(8 * h)), shift)
                    };
                    [
                        _mm256_permutevar8x32_ps(v[0], idx(0)),
                        _mm256_permutevar8x32_ps(v[0], idx(1)),
                    ]
                }
            };
            // Scales (spread over the lanes) and biases (in block order) of each row; Q6's
            // second halves have their own (`dw1`, `m1`, and the activation sums `sa1`).
            let mut dw = [[_mm256_setzero_ps(); 2]; R];
            let mut m = [[_mm256_setzero_ps(); 2]; R];
            let mut dw1 = [[_mm256_setzero_ps(); 2]; R];
            let mut m1 = [[_mm256_setzero_ps(); 2]; R];
            let k = _mm256_set1_ps(-offset(F));
            for r in 0..R {
                let sc = at[r].chunk_scales(ch, scales_per_block(F));
                let d = f16s(w.d.as_ptr().add(sc), n);
                dw[r] = spread(d);
                if F == Q41 {
                    m[r] = f16s(w.d.as_ptr().add(sc + n), n);
                } else if F != Q8 {
                    m[r] = [_mm256_mul_ps(d[0], k), _mm256_mul_ps(d[1], k)];
                }
                if F == Q6 {
                    let d1 = f16s(w.d.as_ptr().add(sc + n), n);
                    dw1[r] = spread(d1);
                    m1[r] = [_mm256_mul_ps(d1[0], k), _mm256_mul_ps(d1[1], k)];
                }
            }
            let mut da = [[_mm256_setzero_ps(); 2]; N];
            // Activation sums the biases go with: of whole blocks, or of Q6's halves.
            let mut sa = [[_mm256_setzero_ps(); 2]; N];
            let mut sa1 = [[_mm256_setzero_ps(); 2]; N];
            for c in 0..N {
                let row = (c0 + c) * nbp + ch.start;
                da[c] = spread(f32s(a.d.as_ptr().add(row), n));
                if F == Q6 {
                    let (s, h) = (
                        f32s(a.s.as_ptr().add(row), n),
                        f32s(a.h.as_ptr().add(row), n),
                    );
                    sa[c] = h;
                    sa1[c] = [_mm256_sub_ps(s[0], h[0]), _mm256_sub_ps(s[1], h[1])];
                } else if F != Q8 {
                    sa[c] = f32s(a.s.as_ptr().add(row), n);
                }
            }
            for h in 0..2 {
                if 8 * h >= ch.lanes() {
                    break;
                }
                let used = (ch.lanes() - 8 * h).min(8);
                let dot = half_dots::<F, R, N>(w, at, a, c0, ch, h, used, lane_mask(used), 0);
                for r in 0..R {
                    for c in 0..N {
                        let x = &mut acc[c0 + c][r];
                        let scale = _mm256_mul_ps(dw[r][h], da[c][h]);
                        *x = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[c][r]), scale, *x);
                    }
                }
                if F == Q6 {
                    let dot = half_dots::<F, R, N>(w, at, a, c0, ch, h, used, lane_mask(used), 1);
                    for r in 0..R {
                        for c in 0..N {
                            let x = &mut acc[c0 + c][r];
                            let scale = _mm256_mul_ps(dw1[r][h], da[c][h]);
                            *x = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[c][r]), scale, *x);
                        }
                    }
                }
            }
            if F != Q8 {
                // Biases per block, in block order (lane i is block ch.start + i).
                for r in 0..R {
                    for c in 0..N {
                        let x = &mut acc[c0 + c][r];
                        *x = _mm256_fmadd_ps(m[r][0], sa[c][0], *x);
                        *x = _mm256_fmadd_ps(m[r][1], sa[c][1], *x);
                        if F == Q6 {
                            *x = _mm256_fmadd_ps(m1[r][0], sa1[c][0], *x);
                            *x = _mm256_fmadd_ps(m1[r][1], sa1[c][1], *x);
                        }
                    }
                }
            }
        }
    }

    /// `n` (even, at most 16) f16 values at `p` as two vectors of f32, zero past `n`.
    #[inline(always)]
    unsafe fn f16s(p: *const f16, n: usize) -> [__m256; 2] {
        // SAFETY: the caller guarantees `n` values at `p`; `n` is even, so the masked
        // 32-bit loads cover whole values.
        unsafe {
            if n <= 8 {
                [f16_part(p, n), _mm256_setzero_ps()]
            } else {
                [load_f16x8(p), f16_part(p.add(8), n - 8)]
            }
        }
    }

    /// `k` (even, at most 8) f16 values at `p` as f32, zero past `k`.
    #[inline(always)]
    unsafe fn f16_part(p: *const f16, k: usize) -> __m256 {
        // SAFETY: the caller guarantees `k` values at `p`; the masked 32-bit loads read
        // `k / 2` whole pairs of them.
        unsafe {
            let mask = _mm256_castsi256_si128(lane_mask(k / 2));
            _mm256_cvtph_ps(_mm_maskload_epi32(p as *const i32, mask))
        }
    }

    /// `n` (at most 16) f32 values at `p` as two vectors, zero past `n`.
    #[inline(always)]
    unsafe fn f32s(p: *const f32, n: usize) -> [__m256; 2] {
        // SAFETY: the caller guarantees `n` values at `p`.
        unsafe {
            if n <= 8 {
                [_mm256_maskload_ps(p, lane_mask(n)), _mm256_setzero_ps()]
            } else {
                [
                    _mm256_loadu_ps(p),
                    _mm256_maskload_ps(p.add(8), lane_mask(n - 8)),
                ]
            }
        }
    }

    /// The 32 weight bytes of block `b` of a row as two 128-bit halves: unsigned nibbles
    /// (Q4) or signed bytes (Q8, `u ^ 0x80`), as [`load_block`] gives them in one register.
    #[inline(always)]
    unsafe fn load_block_128<const F: u8>(row: *const u8, b: usize) -> (__m128i, __m128i) {
        // SAFETY: the caller guarantees block `b` lies inside the row.
        unsafe {
            if F == Q8 {
                let p = row.add(b * BLOCK);
                let flip = _mm_set1_epi8(-128);
                (
                    _mm_xor_si128(_mm_loadu_si128(p as *const _), flip),
                    _mm_xor_si128(_mm_loadu_si128(p.add(16) as *const _), flip),
                )
            } else {
                let p = row.add((b / 2) * BLOCK);
                let (lo, hi) = (
                    _mm_loadu_si128(p as *const _),
                    _mm_loadu_si128(p.add(16) as *const _),
                );
                let (lo, hi) = if b.is_multiple_of(2) {
                    (lo, hi)
                } else {
                    (_mm_srli_epi16::<4>(lo), _mm_srli_epi16::<4>(hi))
                };
                let mask = _mm_set1_epi8(0x0F);
                (_mm_and_si128(lo, mask), _mm_and_si128(hi, mask))
            }
        }
    }

    /// One block's weight-by-activation products folded to four 32-bit partial sums (they
    /// add up to the block's dot product). Q8 uses the sign trick of [`tile_avx2`], so
    /// `pmaddubsw` (at most 2·128·127 per lane) cannot saturate.
    #[inline(always)]
    unsafe fn block_dot_128<const F: u8>(w: (__m128i, __m128i), a: (__m128i, __m128i)) -> __m128i {
        let ones = _mm_set1_epi16(1);
        let half = |w: __m128i, a: __m128i| {
            let prod = if F == Q8 {
                _mm_maddubs_epi16(_mm_abs_epi8(w), _mm_sign_epi8(a, w))
            } else {
                _mm_maddubs_epi16(w, a)
            };
            _mm_madd_epi16(prod, ones)
        };
        _mm_add_epi32(half(w.0, a.0), half(w.1, a.1))
    }

    /// The 32 activation bytes of block `b` of activation row `c`.
    #[inline(always)]
    unsafe fn load_act_128(aq: *const i8, at: usize) -> (__m128i, __m128i) {
        // SAFETY: the caller guarantees the block lies inside the activations.
        unsafe {
            (
                _mm_loadu_si128(aq.add(at) as *const _),
                _mm_loadu_si128(aq.add(at + 16) as *const _),
            )
        }
    }

    /// AVX tile kernel (AVX, FMA and F16C without AVX2), one block at a time; see
    /// [`super::tile`]. Tiles of four weight rows go to [`tile_avx_r4`]; others (the rows
    /// left over at the end of a matrix) sum each block's dot product in a scalar.
    ///
    /// # Safety
    /// As [`tile_avx2`], for the features enabled here.
    #[target_feature(enable = "avx,fma,f16c")]
    pub(super) unsafe fn tile_avx<const F: u8, const R: usize, const C: usize>(
        w: &WeightRows<'_>,
        a: &ActRows<'_>,
        out: &mut [[f32; R]; C],
    ) {
        if let Some(out4) = four_rows(out) {
            // SAFETY: same contract.
            return unsafe { tile_avx_r4::<F, C>(w, a, out4) };
        }
        let nbp = w.nbp;
        let kp = nbp * BLOCK;
        let rb = row_bytes(F, kp);
        let (wq, aq) = (w.q.as_ptr(), a.q.as_ptr());
        let mut acc = [[0f32; R]; C];
        for b in 0..nbp {
            for r in 0..R {
                // SAFETY: block b < nbp lies inside row r.
                let wv = unsafe { load_block_128::<F>(wq.add(r * rb), b) };
                let dw = w.d[r * nbp + b].to_f32();
                for c in 0..C {
                    // SAFETY: block b of activation row c.
                    let v = unsafe { block_dot_128::<F>(wv, load_act_128(aq, c * kp + b * BLOCK)) };
                    let v = _mm_add_epi32(v, _mm_shuffle_epi32::<0b01_00_11_10>(v));
                    let v = _mm_add_epi32(v, _mm_shuffle_epi32::<0b10_11_00_01>(v));
                    acc[c][r] += _mm_cvtsi128_si32(v) as f32 * dw * a.d[c * nbp + b];
                }
            }
        }
        for c in 0..C {
            for r in 0..R {
                let bias = row_bias::<F>(w, a, r, c);
                out[c][r] = acc[c][r] + bias;
            }
        }
    }

    /// AVX kernel for tiles of four weight rows: each row's block product folds to four
    /// 32-bit sums, and two rounds of `phaddd` put the four rows' dot products in one
    /// register, `[r0, r1, r2, r3]`, so one conversion and one multiply-add per activation
    /// row and block serve all four (the layout [`tile_avx2_r4`] has in each 128-bit half).
    ///
    /// # Safety
    /// As [`tile_avx`].
    #[target_feature(enable = "avx,fma,f16c")]
    unsafe fn tile_avx_r4<const F: u8, const C: usize>(
        w: &WeightRows<'_>,
        a: &ActRows<'_>,
        out: &mut [[f32; 4]; C],
    ) {
        let nbp = w.nbp;
        let kp = nbp * BLOCK;
        let rb = row_bytes(F, kp);
        let (wq, aq, ad, as_) = (w.q.as_ptr(), a.q.as_ptr(), a.d.as_ptr(), a.s.as_ptr());
        let (wd, wm) = (w.d.as_ptr() as *const u16, w.m.as_ptr() as *const u16);
        let neg_off = _mm_set1_ps(-offset(F));
        let mut acc = [_mm_setzero_ps(); C];
        for b in 0..nbp {
            // SAFETY: block b < nbp of rows 0..4, and of every activation row c < C.
            unsafe {
                let w0 = load_block_128::<F>(wq, b);
                let w1 = load_block_128::<F>(wq.add(rb), b);
                let w2 = load_block_128::<F>(wq.add(2 * rb), b);
                let w3 = load_block_128::<F>(wq.add(3 * rb), b);
                let scales = |p: *const u16| scales4(p, nbp, b);
                let d4 = scales(wd);
                let m4 = if F == Q8 {
                    None
                } else if F == Q41 {
                    Some(scales(wm))
                } else {
                    Some(_mm_mul_ps(d4, neg_off))
                };
                for c in 0..C {
                    let av = load_act_128(aq, c * kp + b * BLOCK);
                    let h01 =
                        _mm_hadd_epi32(block_dot_128::<F>(w0, av), block_dot_128::<F>(w1, av));
                    let h23 =
                        _mm_hadd_epi32(block_dot_128::<F>(w2, av), block_dot_128::<F>(w3, av));
                    let dot = _mm_hadd_epi32(h01, h23);
                    let scale = _mm_mul_ps(d4, _mm_set1_ps(*ad.add(c * nbp + b)));
                    acc[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(dot), scale, acc[c]);
                    if let Some(m) = m4 {
                        acc[c] = _mm_fmadd_ps(m, _mm_set1_ps(*as_.add(c * nbp + b)), acc[c]);
                    }
                }
            }
        }
        for c in 0..C {
            // SAFETY: out[c] holds four f32.
            unsafe { _mm_storeu_ps(out[c].as_mut_ptr(), acc[c]) };
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    /// The formats a layout holds (Q6 comes in the lane layout only).
    fn formats(layout: Layout) -> Vec<Format> {
        let mut f = vec![Format::Q8_0, Format::Q4_0, Format::Q4_1];
        if layout == Layout::Lanes {
            f.push(Format::Q6);
        }
        f
    }

    /// Writes unsigned value `u` as value `j` of block `b` of row `r` of a matrix.
    #[allow(clippy::too_many_arguments)]
    fn put(
        q: &mut [u8],
        fmt: Format,
        layout: Layout,
        nbp: usize,
        rows: usize,
        r: usize,
        b: usize,
        j: usize,
        u: u8,
    ) {
        if fmt == Format::Q6 {
            let [(lo, ls), (hi, hs)] = q6_index(nbp, rows, r, b, j);
            q[lo] |= (u & 0x0F) << ls;
            q[hi] |= (u >> 4) << hs;
        } else {
            let (at, shift) = weight_index(fmt, layout, nbp, rows, r, b, j);
            q[at] |= u << shift;
        }
    }

    /// A random packed weight tile of `rows` rows and `nbp` blocks, plus its values as f32.
    struct TestWeights {
        q: Vec<u8>,
        d: Vec<f16>,
        m: Vec<f16>,
        values: Vec<f32>,
    }

    fn weights(
        fmt: Format,
        layout: Layout,
        rows: usize,
        nbp: usize,
        rng: &mut StdRng,
    ) -> TestWeights {
        let kp = nbp * BLOCK;
        let rb = fmt.row_bytes(kp);
        let mut t = TestWeights {
            q: vec![0; rows * rb],
            d: vec![f16::ZERO; rows * nbp * fmt.scales_per_block(layout)],
            m: vec![f16::ZERO; rows * nbp],
            values: vec![0.0; rows * kp],
        };
        for r in 0..rows {
            for b in 0..nbp {
                let d = f16::from_f32(rng.gen_range(0.001f32..0.05));
                let mut m = f16::from_f32(rng.gen_range(-0.2f32..0.2));
                if fmt == Format::Q6 {
                    // Q6's second half has a scale of its own, drawn in the same range.
                    m = f16::from_f32(m.to_f32().abs() / 4.0 + 0.001);
                }
                t.d[scale_index(fmt, layout, nbp, rows, r, b)] = d;
                if fmt.has_second_scale() {
                    let (at, in_d) = second_index(fmt, layout, nbp, rows, r, b);
                    if in_d {
                        t.d[at] = m;
                    } else {
                        t.m[at] = m;
                    }
                }
                for j in 0..BLOCK {
                    let u: u8 = match fmt {
                        Format::Q8_0 => rng.gen(),
                        Format::Q6 => rng.gen_range(0..64),
                        _ => rng.gen_range(0..16),
                    };
                    put(&mut t.q, fmt, layout, nbp, rows, r, b, j, u);
                    let (d, bias) = match fmt {
                        Format::Q4_1 => (d.to_f32(), m.to_f32()),
                        Format::Q6 if j >= BLOCK / 2 => (m.to_f32(), -fmt.offset() * m.to_f32()),
                        f => (d.to_f32(), -f.offset() * d.to_f32()),
                    };
                    t.values[r * kp + b * BLOCK + j] = d * u as f32 + bias;
                }
            }
        }
        if fmt.scales_per_block(layout) == 2 || !fmt.has_second_scale() {
            t.m.clear();
        }
        t
    }

    struct TestActs {
        q: Vec<i8>,
        d: Vec<f32>,
        s: Vec<f32>,
        h: Vec<f32>,
        values: Vec<f32>,
    }

    fn acts(layout: Layout, rows: usize, nbp: usize, rng: &mut StdRng) -> TestActs {
        let mut t = TestActs {
            q: Vec::new(),
            d: Vec::new(),
            s: Vec::new(),
            h: Vec::new(),
            values: Vec::new(),
        };
        for _ in 0..rows {
            let row = t.q.len();
            t.q.resize(row + nbp * BLOCK, 0);
            for b in 0..nbp {
                let d = rng.gen_range(0.001f32..0.1);
                let (mut sum, mut first) = (0i32, 0i32);
                for j in 0..BLOCK {
                    let q: i8 = rng.gen_range(-127..=127);
                    sum += q as i32;
                    if j < BLOCK / 2 {
                        first += q as i32;
                    }
                    t.q[row + layout.byte_index(nbp, b, j)] = q;
                    t.values.push(q as f32 * d);
                }
                t.d.push(d);
                t.s.push(d * sum as f32);
                t.h.push(d * first as f32);
            }
        }
        t
    }

    fn check<const R: usize, const C: usize>(fmt: Format, layout: Layout, nbp: usize, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let w = weights(fmt, layout, R, nbp, &mut rng);
        let a = acts(layout, C, nbp, &mut rng);
        let kp = nbp * BLOCK;
        let wr = WeightRows {
            q: &w.q,
            d: &w.d,
            m: &w.m,
            fmt,
            layout,
            nbp,
            rows: R,
            first: 0,
        };
        let ar = ActRows {
            q: &a.q,
            d: &a.d,
            s: &a.s,
            h: &a.h,
            layout,
            nbp,
        };
        let mut scalar = [[0f32; R]; C];
        tile(Isa::Scalar, &wr, &ar, &mut scalar);
        for isa in Isa::available() {
            let mut out = [[0f32; R]; C];
            tile(isa, &wr, &ar, &mut out);
            for (o, s) in out.iter().flatten().zip(scalar.iter().flatten()) {
                assert!(
                    (o - s).abs() <= 1e-4 * s.abs().max(1.0),
                    "{isa:?} {fmt:?} {layout:?}: {o} vs scalar {s}"
                );
            }
            for c in 0..C {
                for r in 0..R {
                    let (mut exact, mut mag) = (0f64, 0f64);
                    for k in 0..kp {
                        let p = w.values[r * kp + k] as f64 * a.values[c * kp + k] as f64;
                        exact += p;
                        mag += p.abs();
                    }
                    let err = (out[c][r] as f64 - exact).abs();
                    assert!(
                        err <= 1e-5 * mag + 1e-6,
                        "{isa:?} {fmt:?} {layout:?} R={R} C={C} nbp={nbp} [{c}][{r}]: {} vs {exact} (scale {mag})",
                        out[c][r]
                    );
                }
            }
        }
    }

    #[test]
    fn kernels_match_f32_reference() {
        // Short last chunks of the lane layout: 2 (alone), 18 and 34 (2 blocks, 4 lanes each),
        // 20 (4 blocks), 22 and 24 (6 and 8 blocks, 2 lanes each), 26, 28 and 30 (10, 12 and 14
        // blocks, 1 lane each).
        for layout in [Layout::Pairs, Layout::Lanes] {
            for fmt in formats(layout) {
                for (i, nbp) in [2usize, 18, 20, 22, 24, 26, 28, 30, 32, 34, 48, 64]
                    .into_iter()
                    .enumerate()
                {
                    check::<4, 4>(fmt, layout, nbp, i as u64);
                    check::<4, 1>(fmt, layout, nbp, 10 + i as u64);
                    check::<1, 1>(fmt, layout, nbp, 20 + i as u64);
                    check::<1, 4>(fmt, layout, nbp, 30 + i as u64);
                }
            }
        }
    }

    /// A product's value does not depend on how many tokens its tile held (batched and
    /// one-at-a-time inference give the same numbers).
    #[test]
    fn the_largest_products_do_not_overflow_any_tier() {
        // Every weight at an extreme (nibble 15, or Q8's -128 and 127) against every
        // activation at +127 or -127: the largest sums any kernel keeps in 16 or 32 bits
        // (AVX2 holds Q4 products of a whole chunk in 16 bits). Uniform values make the
        // layout irrelevant, so both layouts see the same numbers.
        for layout in [Layout::Pairs, Layout::Lanes] {
            for fmt in formats(layout) {
                for nbp in [2usize, 16, 18, 64] {
                    for (byte, sign) in [(0xFFu8, 1i8), (0xFF, -1), (0x00, 1), (0x00, -1)] {
                        let (rows, cols) = (4, 4);
                        let rb = fmt.row_bytes(nbp * BLOCK);
                        let wq = vec![byte; rows * rb];
                        let wd = vec![f16::from_f32(0.01); rows * nbp * 2];
                        let wm = vec![f16::from_f32(0.0); rows * nbp];
                        let aq = vec![127 * sign; cols * nbp * BLOCK];
                        let ad = vec![0.01f32; cols * nbp];
                        let as_ = vec![0.01 * 127.0 * BLOCK as f32 * sign as f32; cols * nbp];
                        let ah: Vec<f32> = as_.iter().map(|s| s / 2.0).collect();
                        let w = WeightRows {
                            q: &wq,
                            d: &wd,
                            m: &wm,
                            fmt,
                            layout,
                            nbp,
                            rows,
                            first: 0,
                        };
                        let a = ActRows {
                            q: &aq,
                            d: &ad,
                            s: &as_,
                            h: &ah,
                            layout,
                            nbp,
                        };
                        let mut scalar = [[0f32; 4]; 4];
                        tile(Isa::Scalar, &w, &a, &mut scalar);
                        for isa in Isa::available() {
                            let mut out = [[0f32; 4]; 4];
                            tile(isa, &w, &a, &mut out);
                            for (o, s) in out.iter().flatten().zip(scalar.iter().flatten()) {
                                assert!(
                                    (o - s).abs() <= 1e-4 * s.abs().max(1.0),
                                    "{isa:?} {fmt:?} {layout:?} nbp={nbp} {byte:#x} x {sign}: {o} vs {s}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_token_gets_the_same_bits_alone_or_in_a_tile_of_four() {
        let mut rng = StdRng::seed_from_u64(77);
        for layout in [Layout::Pairs, Layout::Lanes] {
            for fmt in formats(layout) {
                for nbp in [18usize, 64] {
                    let w = weights(fmt, layout, 4, nbp, &mut rng);
                    let a = acts(layout, 4, nbp, &mut rng);
                    let kp = nbp * BLOCK;
                    let whole = WeightRows {
                        q: &w.q,
                        d: &w.d,
                        m: &w.m,
                        fmt,
                        layout,
                        nbp,
                        rows: 4,
                        first: 0,
                    };
                    let wr = |r: usize, n: usize| whole.sub(r, n);
                    let ar = |c: usize, n: usize| ActRows {
                        q: &a.q[c * kp..(c + n) * kp],
                        d: &a.d[c * nbp..(c + n) * nbp],
                        s: &a.s[c * nbp..(c + n) * nbp],
                        h: &a.h[c * nbp..(c + n) * nbp],
                        layout,
                        nbp,
                    };
                    for isa in Isa::available() {
                        // Four tokens at once against one at a time, for a 4-row tile and
                        // for a single row (the tail of a matrix's rows).
                        let mut all = [[0f32; 4]; 4];
                        tile(isa, &wr(0, 4), &ar(0, 4), &mut all);
                        let mut row0 = [[0f32; 1]; 4];
                        tile(isa, &wr(0, 1), &ar(0, 4), &mut row0);
                        for c in 0..4 {
                            let mut col = [[0f32; 4]; 1];
                            tile(isa, &wr(0, 4), &ar(c, 1), &mut col);
                            let mut one = [[0f32; 1]; 1];
                            tile(isa, &wr(0, 1), &ar(c, 1), &mut one);
                            let what = format!("{isa:?} {fmt:?} {layout:?} nbp={nbp} token {c}");
                            assert_eq!(
                                all[c].map(f32::to_bits),
                                col[0].map(f32::to_bits),
                                "{what}"
                            );
                            assert_eq!(row0[c][0].to_bits(), one[0][0].to_bits(), "{what}");
                        }
                    }
                }
            }
        }
    }

    /// Every value and scale of a matrix has a place of its own in either layout, inside
    /// the matrix, whatever its number of rows (the last tile of four may be short), and
    /// the lane layout puts step `t` of a tile's rows side by side.
    #[test]
    fn matrices_place_every_value_once_with_tiles_interleaved() {
        for layout in [Layout::Pairs, Layout::Lanes] {
            for fmt in formats(layout) {
                for nbp in [2usize, 18, 22, 32, 34, 38, 40] {
                    for rows in 1..=9 {
                        let rb = fmt.row_bytes(nbp * BLOCK);
                        // The bits of each byte that some value uses, which no two share.
                        let mut seen = vec![0u8; rows * rb];
                        let mut scales = vec![0u8; rows * nbp * fmt.scales_per_block(layout)];
                        let what = format!("{layout:?} {fmt:?} nbp={nbp} rows={rows}");
                        let mut mark = |at: usize, bits: u8| {
                            assert_eq!(seen[at] & bits, 0, "{what}: byte {at} shared");
                            seen[at] |= bits;
                        };
                        for r in 0..rows {
                            for b in 0..nbp {
                                scales[scale_index(fmt, layout, nbp, rows, r, b)] += 1;
                                let (second, in_d) = second_index(fmt, layout, nbp, rows, r, b);
                                if in_d {
                                    scales[second] += 1;
                                }
                                for j in 0..BLOCK {
                                    match fmt {
                                        Format::Q6 => {
                                            let [(lo, ls), (hi, hs)] = q6_index(nbp, rows, r, b, j);
                                            mark(lo, 0x0F << ls);
                                            mark(hi, 0x03 << hs);
                                        }
                                        Format::Q8_0 => mark(
                                            weight_index(fmt, layout, nbp, rows, r, b, j).0,
                                            0xFF,
                                        ),
                                        _ => {
                                            let (at, shift) =
                                                weight_index(fmt, layout, nbp, rows, r, b, j);
                                            mark(at, 0x0F << shift);
                                        }
                                    }
                                }
                            }
                        }
                        // Every bit is used, except the top half of the high-bit bytes of a
                        // Q6 last chunk of at most 4 blocks (their 2 value steps).
                        let used: u32 = seen.iter().map(|b| b.count_ones()).sum();
                        let bits = match fmt {
                            Format::Q8_0 => 8,
                            Format::Q6 => 6,
                            _ => 4,
                        };
                        assert_eq!(used as usize, rows * nbp * BLOCK * bits, "{what}: bits");
                        let tail = nbp % LANES;
                        if fmt != Format::Q6 || !(1..=4).contains(&tail) {
                            assert!(seen.iter().all(|&b| b == 0xFF), "{what}: values");
                        }
                        assert!(scales.iter().all(|&n| n == 1), "{what}: scales");
                    }
                }
            }
        }
        // Q8, 32 blocks, 4 rows: step 0 of row 1 follows step 0 of row 0 (64 bytes), and
        // step 1 of row 0 follows step 0 of row 3; the second chunk starts after 4 × 512.
        let at = |r, b, j| weight_index(Format::Q8_0, Layout::Lanes, 32, 4, r, b, j).0;
        assert_eq!(at(1, 0, 0), 64);
        assert_eq!(at(0, 0, 4), 4 * 64);
        assert_eq!(at(2, 3, 5), 4 * 64 + 2 * 64 + 12 + 1);
        assert_eq!(at(0, 16, 0), 4 * 512);
        // Rows 4 and 5 of 6 are a tile of two; scales of a chunk's 16 blocks go per row.
        assert_eq!(
            weight_index(Format::Q8_0, Layout::Lanes, 32, 6, 5, 0, 0).0,
            4 * 1024 + 64
        );
        let (q8, q41, lanes) = (Format::Q8_0, Format::Q4_1, Layout::Lanes);
        assert_eq!(scale_index(q8, lanes, 32, 4, 1, 2), 16 + 2);
        assert_eq!(scale_index(q8, lanes, 32, 4, 0, 17), 4 * 16 + 1);
        assert_eq!(scale_index(q8, Layout::Pairs, 32, 4, 1, 2), 32 + 2);
        // Q4_1's biases follow each row's 16 scales of a chunk.
        assert_eq!(scale_index(q41, lanes, 32, 4, 1, 2), 32 + 2);
        assert_eq!(second_index(q41, lanes, 32, 4, 1, 2), (32 + 16 + 2, true));
        assert_eq!(scale_index(q41, lanes, 32, 4, 0, 17), 4 * 32 + 1);
        assert_eq!(
            second_index(q41, Layout::Pairs, 32, 4, 1, 2),
            (32 + 2, false)
        );
    }

    /// The rows of a matrix whose last tile of four is short (5 to 7 rows) multiply like
    /// their values say, one at a time and four at once, on every tier.
    #[test]
    fn rows_of_a_short_last_tile_multiply_right() {
        let mut rng = StdRng::seed_from_u64(91);
        for layout in [Layout::Pairs, Layout::Lanes] {
            for fmt in formats(layout) {
                for (rows, nbp) in [(5usize, 18usize), (6, 34), (7, 64)] {
                    let w = weights(fmt, layout, rows, nbp, &mut rng);
                    let a = acts(layout, 1, nbp, &mut rng);
                    let kp = nbp * BLOCK;
                    let whole = WeightRows {
                        q: &w.q,
                        d: &w.d,
                        m: &w.m,
                        fmt,
                        layout,
                        nbp,
                        rows,
                        first: 0,
                    };
                    let ar = ActRows {
                        q: &a.q,
                        d: &a.d,
                        s: &a.s,
                        h: &a.h,
                        layout,
                        nbp,
                    };
                    let exact = |r: usize| -> f64 {
                        (0..kp)
                            .map(|k| w.values[r * kp + k] as f64 * a.values[k] as f64)
                            .sum()
                    };
                    for isa in Isa::available() {
                        let mut four = [[0f32; 4]; 1];
                        tile(isa, &whole.sub(0, 4), &ar, &mut four);
                        for r in 0..rows {
                            let mut one = [[0f32; 1]; 1];
                            tile(isa, &whole.sub(r, 1), &ar, &mut one);
                            let want = exact(r);
                            let what = format!("{isa:?} {fmt:?} {layout:?} rows={rows} row {r}");
                            assert!(
                                (one[0][0] as f64 - want).abs() <= 1e-3 * want.abs().max(1.0),
                                "{what}: {} vs {want}",
                                one[0][0]
                            );
                            if r < 4 {
                                assert!(
                                    (four[0][r] as f64 - want).abs() <= 1e-3 * want.abs().max(1.0),
                                    "{what} in a tile of four"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// Every value of a row has a place of its own in either layout, inside the row.
    #[test]
    fn layouts_place_every_value_once() {
        for layout in [Layout::Pairs, Layout::Lanes] {
            for nbp in [2usize, 4, 6, 8, 16, 18, 20, 22, 24, 28, 30, 34, 64] {
                let mut bytes = vec![0u8; nbp * BLOCK];
                let mut nibbles = vec![0u8; nbp * BLOCK / 2];
                for b in 0..nbp {
                    for j in 0..BLOCK {
                        bytes[layout.byte_index(nbp, b, j)] += 1;
                        let (at, shift) = layout.nibble_index(nbp, b, j);
                        nibbles[at] += 1 << (shift / 4);
                    }
                }
                assert!(bytes.iter().all(|&n| n == 1), "{layout:?} {nbp}: bytes");
                assert!(nibbles.iter().all(|&n| n == 3), "{layout:?} {nbp}: nibbles");
            }
        }
        // A whole chunk: value 5 of block 3 is step 1, lane 3, byte 1 of 16 lanes.
        assert_eq!(Layout::Lanes.byte_index(32, 3, 5), 64 + 12 + 1);
        assert_eq!(Layout::Lanes.nibble_index(32, 3, 21), (64 + 12 + 1, 4));
        // A last chunk of 2 blocks (18 in all) gives each 4 lanes, so 2 steps of 8 lanes:
        // value 5 of block 17 is group 1, step 0, lane 1·4 + 1; value 21 is group 5,
        // step 1, lane 5; as a nibble, step 1 is the high half of step 0's bytes.
        assert_eq!(Layout::Lanes.byte_index(18, 17, 5), 16 * 32 + 5 * 4 + 1);
        assert_eq!(
            Layout::Lanes.byte_index(18, 17, 21),
            16 * 32 + 32 + 5 * 4 + 1
        );
        assert_eq!(
            Layout::Lanes.nibble_index(18, 17, 21),
            (16 * 16 + 5 * 4 + 1, 4)
        );
        assert_eq!(
            [1, 4, 5, 8, 9, 16].map(|n| Chunk::at(n, 0).per),
            [4, 4, 2, 2, 1, 1]
        );
    }

    #[test]
    fn scalar_is_always_available() {
        assert_eq!(Isa::available().last(), Some(&Isa::Scalar));
    }

    #[test]
    fn tiers_are_named_as_the_environment_variable_takes_them() {
        assert_eq!(Isa::from_name("Scalar"), Some(Isa::Scalar));
        assert_eq!(Isa::from_name("AVX2"), Some(Isa::Avx2));
        assert_eq!(Isa::from_name("avx"), Some(Isa::Avx));
        assert_eq!(Isa::from_name("avx512"), Some(Isa::Avx512Vnni));
        assert_eq!(Isa::from_name("neon"), Some(Isa::Neon));
        assert_eq!(Isa::from_name("sse4"), None);
        // Scalar is on every CPU; an unknown name is ignored with a reason.
        assert_eq!(Isa::choose(Some("scalar")), (Isa::Scalar, None));
        assert_eq!(Isa::choose(None), (Isa::available()[0], None));
        let (isa, why) = Isa::choose(Some("sse4"));
        assert_eq!(isa, Isa::available()[0]);
        assert!(why.is_some_and(|w| w.contains("not one of")));
    }

    /// What `kernels_match_f32_reference` checks besides scalar code on aarch64.
    #[cfg(target_arch = "aarch64")]
    #[test]
    fn neon_is_available_on_aarch64() {
        assert_eq!(Isa::available(), [Isa::Neon, Isa::Scalar]);
    }
}
