//! Late interaction: a re-ranking stage that reads the query and each candidate token by
//! token (MaxSim, as in ColBERT, Khattab & Zaharia 2020), with the default embedder's own
//! token vectors.
//!
//! A query token's score is its best similarity with any token of the candidate, and the
//! candidate's score is the mean over the query's tokens. One pooled vector per text
//! averages a request's particular details away (*halving a cake* and *scaling cookies* pool
//! to nearly the same vector); token by token, the detail the query names has to be found in
//! the candidate. Measured on the memory sets (`benches/memory/README.md`), re-ordering the
//! hybrid search's top 20 this way raised MRR on the shared dev queries, the blind queries
//! and the project's own.
//!
//! Token vectors are kept as their signs only, one bit a dimension (48 bytes a token for
//! 384 dimensions, against 1,536 in `f32`), and compared by Hamming distance: the
//! similarity of two tokens is `1 - 2 * hamming / dim`, the cosine of their sign vectors.
//! On the memory sets this ranked as well as the full vectors did (measured with both).

/// The sign bits of a text's token vectors (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenBits {
    dim: usize,
    /// `dim.div_ceil(64)` words a token, bit `j % 64` of word `j / 64` set when component
    /// `j` is positive.
    words: Vec<u64>,
}

/// Most tokens kept from one text (the embedder reads at most a few hundred).
pub const MAX_TOKENS: usize = 1024;

impl TokenBits {
    /// The signs of `rows`, token vectors of `dim` values each (a trailing partial row is
    /// ignored; at most [`MAX_TOKENS`] rows are kept).
    pub fn from_rows(rows: &[f32], dim: usize) -> Self {
        if dim == 0 {
            return Self::default();
        }
        let per = dim.div_ceil(64);
        let mut words = Vec::new();
        for row in rows.chunks_exact(dim).take(MAX_TOKENS) {
            let start = words.len();
            words.resize(start + per, 0u64);
            for (j, &x) in row.iter().enumerate() {
                if x > 0.0 {
                    words[start + j / 64] |= 1 << (j % 64);
                }
            }
        }
        Self { dim, words }
    }

    /// Dimensions of the token vectors these bits came from.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        match self.dim {
            0 => 0,
            d => self.words.len() / d.div_ceil(64),
        }
    }

    /// Whether there is no token.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The mean, over this query's tokens, of each one's best similarity with a token of
    /// `doc` (`1 - 2 * hamming / dim`, in [-1, 1]). 0 when either side has no token or
    /// their dimensions differ.
    pub fn maxsim(&self, doc: &TokenBits) -> f32 {
        if self.is_empty() || doc.is_empty() || self.dim != doc.dim {
            return 0.0;
        }
        let per = self.dim.div_ceil(64);
        let mut total = 0u64;
        for q in self.words.chunks_exact(per) {
            let best = doc
                .words
                .chunks_exact(per)
                .map(|d| {
                    q.iter()
                        .zip(d)
                        .map(|(a, b)| (a ^ b).count_ones())
                        .sum::<u32>()
                })
                .min()
                .unwrap_or(self.dim as u32);
            total += u64::from(best);
        }
        let mean_hamming = total as f32 / self.len() as f32;
        1.0 - 2.0 * mean_hamming / self.dim as f32
    }

    /// Bytes to store: the dimension (`u32`, little-endian), then the words (`u64`,
    /// little-endian).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + 8 * self.words.len());
        out.extend_from_slice(&(self.dim as u32).to_le_bytes());
        for w in &self.words {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out
    }

    /// Reads [`TokenBits::to_bytes`]; `None` when the bytes are not whole tokens of a
    /// plausible dimension.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let (head, rest) = bytes.split_first_chunk::<4>()?;
        let dim = u32::from_le_bytes(*head) as usize;
        if dim == 0 || dim > 1 << 16 || !rest.len().is_multiple_of(8) {
            return None;
        }
        let words: Vec<u64> = rest
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect();
        let per = dim.div_ceil(64);
        if !words.len().is_multiple_of(per) || words.len() / per > MAX_TOKENS {
            return None;
        }
        // Bits above `dim` in a token's last word must be clear, or two equal vectors
        // would not be equal here.
        let spare = per * 64 - dim;
        if spare > 0 {
            let mask = !0u64 << (64 - spare);
            if words.chunks_exact(per).any(|t| t[per - 1] & mask != 0) {
                return None;
            }
        }
        Some(Self { dim, words })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn bits(rows: &[&[f32]]) -> TokenBits {
        let dim = rows[0].len();
        let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        TokenBits::from_rows(&flat, dim)
    }

    #[test]
    fn a_text_matches_itself_fully_and_its_opposite_not_at_all() {
        let a = bits(&[&[0.5, -0.2, 0.1, -0.9], &[-0.1, 0.3, 0.3, 0.2]]);
        assert_eq!(a.len(), 2);
        assert!((a.maxsim(&a) - 1.0).abs() < 1e-6);
        let one = bits(&[&[0.5, -0.2, 0.1, -0.9]]);
        let neg = bits(&[&[-0.5, 0.2, -0.1, 0.9]]);
        assert!((one.maxsim(&neg) + 1.0).abs() < 1e-6);
    }

    #[test]
    fn each_query_token_takes_its_best_document_token() {
        // Query tokens q1 = ++++ and q2 = ----; the document has one token equal to each of
        // them and one half way: both query tokens find a perfect match.
        let q = bits(&[&[1.0, 1.0, 1.0, 1.0], &[-1.0, -1.0, -1.0, -1.0]]);
        let doc = bits(&[
            &[1.0, 1.0, -1.0, -1.0],
            &[-1.0, -1.0, -1.0, -1.0],
            &[1.0, 1.0, 1.0, 1.0],
        ]);
        assert!((q.maxsim(&doc) - 1.0).abs() < 1e-6);
        // Without the ---- token, q2's best is the half-way token: (1 + 0) / 2.
        let doc2 = bits(&[&[1.0, 1.0, -1.0, -1.0], &[1.0, 1.0, 1.0, 1.0]]);
        assert!((q.maxsim(&doc2) - 0.5).abs() < 1e-6);
        // Not symmetric: the document's tokens are not all in the query.
        assert!((doc.maxsim(&q) - (0.0 + 1.0 + 1.0) / 3.0).abs() < 1e-6);
    }

    #[test]
    fn empty_or_mismatched_sides_score_zero() {
        let a = bits(&[&[1.0, -1.0, 1.0]]);
        let b = bits(&[&[1.0, -1.0, 1.0, 1.0]]);
        assert_eq!(a.maxsim(&TokenBits::default()), 0.0);
        assert_eq!(TokenBits::default().maxsim(&a), 0.0);
        assert_eq!(a.maxsim(&b), 0.0);
    }

    #[test]
    fn dimensions_beyond_one_word_count() {
        // 100 dimensions: two words a token; the tokens differ only in component 90.
        let mut x = vec![1.0f32; 100];
        let a = TokenBits::from_rows(&x, 100);
        x[90] = -1.0;
        let b = TokenBits::from_rows(&x, 100);
        assert!((a.maxsim(&b) - (1.0 - 2.0 / 100.0)).abs() < 1e-6);
    }

    #[test]
    fn bytes_round_trip_and_bad_bytes_are_refused() {
        let rows: Vec<f32> = (0..3 * 70).map(|i| ((i * 37 % 11) as f32) - 5.0).collect();
        let a = TokenBits::from_rows(&rows, 70);
        assert_eq!(a.len(), 3);
        let bytes = a.to_bytes();
        assert_eq!(TokenBits::from_bytes(&bytes), Some(a.clone()));
        // Cut mid-word, cut mid-token, no header, dimension 0, a bit set above the dimension.
        assert_eq!(TokenBits::from_bytes(&bytes[..bytes.len() - 3]), None);
        assert_eq!(TokenBits::from_bytes(&bytes[..bytes.len() - 8]), None);
        assert_eq!(TokenBits::from_bytes(&bytes[..2]), None);
        assert_eq!(TokenBits::from_bytes(&[0, 0, 0, 0]), None);
        let mut bad = bytes.clone();
        let last = bad.len() - 1;
        bad[last] |= 0x80;
        assert_eq!(TokenBits::from_bytes(&bad), None);
    }
}
