//! Local hybrid search: BM25 over an inverted index, fused with embedding cosine similarity.
//!
//! Used for agent cards, and meant for memories and local documents too. Entries are keyed
//! by a caller-chosen `u64`; both indexes are incremental (insert, replace, remove).
//!
//! # Fusion
//!
//! [`HybridIndex::search`] scores **every** entry with both signals (the cosine is a dense,
//! brute-force pass; BM25 touches only the postings of the query terms), then fuses them with
//! a convex combination of max-normalised scores:
//!
//! ```text
//! score = prior(key) * (semantic_weight * max(cos, 0) / max_cos + lexical_weight * bm25 / max_bm25)
//! ```
//!
//! where `max_cos` and `max_bm25` are the best scores of this query. Since every entry has
//! both scores, nothing is lost by fusing scores rather than ranks, and unlike reciprocal rank
//! fusion the magnitude survives: an entry that is far ahead on one signal stays ahead, and a
//! query whose terms match nothing contributes no lexical noise. Normalising by the query's
//! maximum (with the theoretical minimum 0) makes BM25, which is unbounded and
//! corpus-dependent, comparable with the cosine; this is the "convex combination, TM2C2"
//! scheme that Bruch et al. ("An Analysis of Fusion Functions for Hybrid Retrieval", 2023)
//! found to beat reciprocal rank fusion in and out of domain. The optional prior multiplies
//! the fused score, so feedback or trust can demote an entry without re-indexing it.
//!
//! # Whole texts, chunked when long
//!
//! An entry may have several embeddings ([`HybridIndex::insert_passages`]), and its cosine
//! with a query is its best one's. Cards and memories are embedded as whole texts, split into
//! [`chunks`] of consecutive sentences only when a text is longer than the embedding model
//! reads well, and a query is embedded whole too. On team-formation data written
//! independently of this code (the dev split in `../shared/eval` and
//! `benches/team_formation/blind.jsonl`), one vector per card and per task beat one per
//! sentence on both sides by 5 to 8 points of MRR: a task's sentences are not one
//! requirement each, and a card's sentences are read best together (see
//! `benches/team_formation/README.md`).
//!
//! # Vector storage
//!
//! Vectors are stored as 8-bit integers with one scale per vector (`x ≈ q · max|x| / 127`),
//! a quarter of the memory of `f32`, and the query is quantised the same way, so the dense
//! pass is an integer dot product that the compiler vectorises. For unit vectors of a few
//! hundred dimensions the cosine error is below 0.005 (checked in the tests), well under the
//! differences that decide a ranking. Large indexes split the dense pass across the
//! machine's cores.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

mod late;
pub use late::{TokenBits, MAX_TOKENS};

/// Words dropped by [`tokenize`]: frequent English function words that carry no topic.
const STOPWORDS: &[&str] = &[
    "a",
    "about",
    "above",
    "after",
    "again",
    "against",
    "all",
    "also",
    "am",
    "an",
    "and",
    "any",
    "are",
    "as",
    "at",
    "be",
    "because",
    "been",
    "before",
    "being",
    "below",
    "between",
    "both",
    "but",
    "by",
    "can",
    "could",
    "did",
    "do",
    "does",
    "doing",
    "down",
    "during",
    "each",
    "few",
    "for",
    "from",
    "further",
    "had",
    "has",
    "have",
    "having",
    "he",
    "her",
    "here",
    "hers",
    "herself",
    "him",
    "himself",
    "his",
    "how",
    "i",
    "if",
    "in",
    "into",
    "is",
    "it",
    "its",
    "itself",
    "just",
    "me",
    "more",
    "most",
    "my",
    "myself",
    "no",
    "nor",
    "not",
    "now",
    "of",
    "off",
    "on",
    "once",
    "only",
    "or",
    "other",
    "our",
    "ours",
    "ourselves",
    "out",
    "over",
    "own",
    "same",
    "she",
    "should",
    "so",
    "some",
    "such",
    "than",
    "that",
    "the",
    "their",
    "theirs",
    "them",
    "themselves",
    "then",
    "there",
    "these",
    "they",
    "this",
    "those",
    "through",
    "to",
    "too",
    "under",
    "until",
    "up",
    "us",
    "very",
    "was",
    "we",
    "were",
    "what",
    "when",
    "where",
    "which",
    "while",
    "who",
    "whom",
    "why",
    "will",
    "with",
    "would",
    "you",
    "your",
    "yours",
    "yourself",
    "yourselves",
];

/// Splits `text` into index terms: lowercased, split at every character that is not
/// alphanumeric (Unicode-aware), stopwords and single letters dropped, and lightly stemmed
/// (plural `-s`/`-es`/`-ies`, `-ing`, `-ed`, a final `-e`), so that "analyzes", "analyzed",
/// "analyzing" and "analyze" all become the same term.
pub fn tokenize(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .filter_map(|w| {
            let lower = w.to_lowercase();
            let single_letter = lower.chars().count() == 1 && !lower.chars().all(char::is_numeric);
            if single_letter || STOPWORDS.binary_search(&lower.as_str()).is_ok() {
                None
            } else {
                Some(stem(lower))
            }
        })
        .collect()
}

fn has_vowel(s: &str) -> bool {
    s.chars()
        .any(|c| matches!(c, 'a' | 'e' | 'i' | 'o' | 'u' | 'y'))
}

/// Strips `suffix` when the rest is at least `min` characters long and has a vowel.
fn strip<'a>(word: &'a str, suffix: &str, min: usize) -> Option<&'a str> {
    let stem = word.strip_suffix(suffix)?;
    (stem.chars().count() >= min && has_vowel(stem)).then_some(stem)
}

/// A light, deterministic suffix stripper (not Porter: it only has to map inflections of one
/// word to one term, and never merge unrelated words often).
///
/// Kept over a maintained crate by measurement (2026-11-28, Intel Xeon, release build):
/// Snowball English (`rust-stemmers` 1.2) in its place changed the node's card search MRR
/// by -0.5 / +0.4 points (team-formation dev / blind), memory MRR by -0.009 / 0.000
/// (dev / blind), and swarm-QA scenarios by -1 on `own` and `fresh` and 0 on the other five
/// sets. No gain anywhere to pay for the grounded pipeline's rules, which are written
/// against these stems (`tim`, `venu`, `driv`).
fn stem(word: String) -> String {
    if !word.is_ascii() || word.len() <= 3 || word.bytes().all(|b| b.is_ascii_digit()) {
        return word;
    }
    let mut w: String = if let Some(s) = strip(&word, "ies", 2) {
        format!("{s}y")
    } else if let Some(s) = strip(&word, "ied", 2) {
        format!("{s}y")
    } else if let Some(s) = word.strip_suffix("sses") {
        format!("{s}ss")
    } else if word.ends_with('s')
        && !word.ends_with("ss")
        && !word.ends_with("us")
        && !word.ends_with("is")
    {
        word[..word.len() - 1].to_string()
    } else {
        word.clone()
    };
    let verb = strip(&w, "ing", 3)
        .or_else(|| strip(&w, "ed", 3))
        .map(str::to_string);
    if let Some(mut s) = verb {
        // "planned" -> "plan", but "falling" -> "fall" (as Porter: not for l, s, z).
        let b = s.as_bytes();
        let n = b.len();
        if n >= 2
            && b[n - 1] == b[n - 2]
            && !matches!(b[n - 1], b'l' | b's' | b'z' | b'e')
            && !has_vowel(&s[n - 1..])
        {
            s.truncate(n - 1);
        }
        w = s;
    }
    if w.len() >= 4 && w.ends_with('e') && !w.ends_with("ee") {
        w.pop();
    }
    w
}

/// Splits `text` into its sentences, at `.`, `!` or `?` followed by whitespace (so "v1.2"
/// and "e.g.x" stay whole), trimmed, leaving out pieces with no letter or digit. A semicolon
/// does not split: it joins clauses of one thought ("translate the contracts; they are in
/// German"), and a clause on its own loses what the other one says.
pub fn split_sentences(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let boundary =
            matches!(c, '.' | '!' | '?') && chars.peek().is_none_or(|&(_, n)| n.is_whitespace());
        if boundary {
            let end = i + c.len_utf8();
            let s = text[start..end].trim();
            if s.chars().any(char::is_alphanumeric) {
                out.push(s.to_string());
            }
            start = end;
        }
    }
    let rest = text[start..].trim();
    if rest.chars().any(char::is_alphanumeric) {
        out.push(rest.to_string());
    }
    out
}

/// Words of one chunk ([`chunks`]): all-MiniLM-L6-v2 was trained on texts of at most 128
/// word pieces, about 100 English words, and truncates at 256.
pub const CHUNK_WORDS: usize = 120;

/// The texts to embed for one entry ([`HybridIndex::insert_passages`]): `text` itself when it
/// has at most `max_words` words, else runs of consecutive sentences of at most `max_words`
/// words each (a longer sentence is a chunk of its own), at most [`MAX_PASSAGES`] of them
/// (the last one takes the rest). A text with no words gives itself, trimmed.
pub fn chunks(text: &str, max_words: usize) -> Vec<String> {
    let text = text.trim();
    let words = |s: &str| s.split_whitespace().count();
    if words(text) <= max_words.max(1) {
        return vec![text.to_owned()];
    }
    let mut out: Vec<String> = Vec::new();
    let mut current = String::new();
    let mut count = 0;
    for sentence in split_sentences(text) {
        let n = words(&sentence);
        if count > 0 && count + n > max_words && out.len() + 1 < MAX_PASSAGES {
            out.push(std::mem::take(&mut current));
            count = 0;
        }
        if count > 0 {
            current.push(' ');
        }
        current.push_str(&sentence);
        count += n;
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// BM25 parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bm25Params {
    /// Term-frequency saturation (default 1.2).
    pub k1: f32,
    /// Length normalisation, 0 (none) to 1 (full) (default 0.75).
    pub b: f32,
}

impl Default for Bm25Params {
    fn default() -> Self {
        Self { k1: 1.2, b: 0.75 }
    }
}

#[derive(Debug, Clone, Copy)]
struct Posting {
    slot: u32,
    tf: u32,
    /// Length of the slot's document, kept here so that scoring reads the postings alone
    /// (a lookup in `slots` per posting was a cache miss each on large indexes).
    len: u32,
}

#[derive(Debug, Clone)]
struct Slot {
    key: u64,
    len: u32,
    /// Distinct term ids of the document (to find its postings on removal).
    terms: Vec<u32>,
    live: bool,
}

/// An incremental BM25 index over an inverted index, keyed by `u64`.
///
/// Inserting an existing key replaces its text. Scores use the non-negative Lucene IDF
/// `ln(1 + (N - df + 0.5) / (df + 0.5))`; each distinct query term counts once.
#[derive(Debug, Clone, Default)]
pub struct Bm25Index {
    params: Bm25Params,
    term_ids: HashMap<String, u32>,
    postings: Vec<Vec<Posting>>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    by_key: HashMap<u64, u32>,
    total_len: u64,
}

impl Bm25Index {
    /// An empty index with the default parameters (k1 = 1.2, b = 0.75).
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty index with the given parameters.
    pub fn with_params(params: Bm25Params) -> Self {
        Self {
            params,
            ..Self::default()
        }
    }

    /// The parameters in use.
    pub fn params(&self) -> Bm25Params {
        self.params
    }

    /// Indexes `text` under `key`, replacing what `key` had.
    pub fn insert(&mut self, key: u64, text: &str) {
        self.insert_slot(key, text);
    }

    /// Inserts and returns the slot used (shared with [`HybridIndex`]'s vector rows).
    fn insert_slot(&mut self, key: u64, text: &str) -> u32 {
        self.remove(key);
        let tokens = tokenize(text);
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for t in tokens.iter() {
            let next = self.term_ids.len() as u32;
            let id = *self.term_ids.entry(t.clone()).or_insert(next);
            if id as usize == self.postings.len() {
                self.postings.push(Vec::new());
            }
            *counts.entry(id).or_insert(0) += 1;
        }
        let slot_data = Slot {
            key,
            len: tokens.len() as u32,
            terms: counts.keys().copied().collect(),
            live: true,
        };
        let slot = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = slot_data;
                s
            }
            None => {
                self.slots.push(slot_data);
                (self.slots.len() - 1) as u32
            }
        };
        let len = tokens.len() as u32;
        for (id, tf) in counts {
            self.postings[id as usize].push(Posting { slot, tf, len });
        }
        self.total_len += tokens.len() as u64;
        self.by_key.insert(key, slot);
        slot
    }

    /// Removes `key`; returns whether it was indexed.
    pub fn remove(&mut self, key: u64) -> bool {
        self.remove_slot(key).is_some()
    }

    fn remove_slot(&mut self, key: u64) -> Option<u32> {
        let slot = self.by_key.remove(&key)?;
        let entry = &mut self.slots[slot as usize];
        entry.live = false;
        self.total_len -= u64::from(entry.len);
        for id in std::mem::take(&mut entry.terms) {
            let list = &mut self.postings[id as usize];
            if let Some(pos) = list.iter().position(|p| p.slot == slot) {
                list.swap_remove(pos);
            }
        }
        self.free.push(slot);
        Some(slot)
    }

    /// Number of indexed entries.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Whether nothing is indexed.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Whether `key` is indexed.
    pub fn contains(&self, key: u64) -> bool {
        self.by_key.contains_key(&key)
    }

    /// The `k` best entries for `query`, best first, as `(key, score)`. Entries that share no
    /// term with the query are not returned.
    pub fn search(&self, query: &str, k: usize) -> Vec<(u64, f32)> {
        let mut scores = vec![0.0f32; self.slots.len()];
        let touched = self.score_into(query, &mut scores);
        top_k(touched.iter().map(|&s| (scores[s as usize], s)), k)
            .into_iter()
            .map(|(score, slot)| (self.slots[slot as usize].key, score))
            .collect()
    }

    /// Adds the BM25 score of every matching slot to `scores` (indexed by slot) and returns
    /// the slots touched.
    fn score_into(&self, query: &str, scores: &mut [f32]) -> Vec<u32> {
        let n = self.len();
        if n == 0 {
            return Vec::new();
        }
        let mut terms = tokenize(query);
        terms.sort_unstable();
        terms.dedup();
        let avg_len = (self.total_len as f32 / n as f32).max(1.0);
        let Bm25Params { k1, b } = self.params;
        let mut touched = Vec::new();
        for t in &terms {
            let Some(&id) = self.term_ids.get(t) else {
                continue;
            };
            let list = &self.postings[id as usize];
            if list.is_empty() {
                continue;
            }
            let df = list.len() as f32;
            let idf = (1.0 + (n as f32 - df + 0.5) / (df + 0.5)).ln();
            for p in list {
                let len = p.len as f32;
                let tf = p.tf as f32;
                let s = idf * tf * (k1 + 1.0) / (tf + k1 * (1.0 - b + b * len / avg_len));
                let acc = &mut scores[p.slot as usize];
                if *acc == 0.0 {
                    touched.push(p.slot);
                }
                *acc += s;
            }
        }
        touched
    }
}

/// Why an entry could not be added to a [`HybridIndex`].
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    /// The embedding has the wrong length.
    #[error("embedding has {got} dimensions, the index takes {expected}")]
    DimensionMismatch {
        /// Dimensions of the index.
        expected: usize,
        /// Dimensions of the embedding given.
        got: usize,
    },
    /// The embedding has a NaN or infinite component, or is all zeros.
    #[error("embedding is not a finite, non-zero vector")]
    InvalidEmbedding,
    /// An entry needs between 1 and [`MAX_PASSAGES`] embeddings.
    #[error("an entry needs 1 to {MAX_PASSAGES} embeddings, got {0}")]
    PassageCount(usize),
}

/// How [`HybridIndex::search`] weighs its signals.
#[derive(Clone, Copy)]
pub struct HybridOptions<'a> {
    /// Weight of the max-normalised cosine similarity (default 0.7).
    pub semantic_weight: f32,
    /// Weight of the max-normalised BM25 score (default 0.3).
    pub lexical_weight: f32,
    /// Multiplier of each entry's fused score (feedback, trust); `None` = 1 for all. Values
    /// are clamped to be non-negative.
    pub prior: Option<&'a dyn Fn(u64) -> f32>,
}

impl Default for HybridOptions<'_> {
    fn default() -> Self {
        Self {
            semantic_weight: 0.7,
            lexical_weight: 0.3,
            prior: None,
        }
    }
}

impl std::fmt::Debug for HybridOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HybridOptions")
            .field("semantic_weight", &self.semantic_weight)
            .field("lexical_weight", &self.lexical_weight)
            .field("prior", &self.prior.map(|_| "fn"))
            .finish()
    }
}

/// One result of [`HybridIndex::search`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hit {
    /// The entry's key.
    pub key: u64,
    /// Fused score (higher is better), prior included.
    pub score: f32,
    /// Raw BM25 score (0 when no query term matches).
    pub bm25: f32,
    /// Cosine similarity of the query's embedding and the entry's best-matching one (its
    /// best passage).
    pub cosine: f32,
}

/// BM25 plus one or more L2-normalised embeddings per entry (its passages), searched
/// together (see the module docs for the fusion, the passages and the vector storage).
#[derive(Debug, Clone)]
pub struct HybridIndex {
    dim: usize,
    bm25: Bm25Index,
    /// Quantised vectors, one row of `dim` per passage (zeros when the row is free).
    vectors: Vec<i8>,
    /// Scale of each row: component `j` is `vectors[row * dim + j] * scales[row]`.
    scales: Vec<f32>,
    /// BM25 slot that owns each row ([`FREE_ROW`] when none does).
    row_slot: Vec<u32>,
    /// Rows of each BM25 slot.
    slot_rows: Vec<Vec<u32>>,
    /// Free rows, reused before the storage grows.
    free_rows: Vec<u32>,
    /// Token bits of entries that have them ([`HybridIndex::set_tokens`]), for the
    /// late-interaction stage ([`HybridIndex::rerank_late`]).
    late: HashMap<u64, Vec<TokenBits>>,
}

/// Owner of a row that no entry uses.
const FREE_ROW: u32 = u32::MAX;

/// Most passages (vectors) one entry may have.
pub const MAX_PASSAGES: usize = 64;

/// Entries x dimensions above which the dense pass is split across threads (below it,
/// starting threads costs more than it saves).
const PARALLEL_MIN_WORK: usize = 1 << 21;

/// Quantises a finite vector to `i8` with one scale (`x ≈ q * scale`), into `out`.
fn quantize_into(v: &[f32], out: &mut [i8]) -> f32 {
    let max = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    if max == 0.0 {
        out.fill(0);
        return 0.0;
    }
    let inv = 127.0 / max;
    for (o, x) in out.iter_mut().zip(v) {
        // |x * inv| <= 127, so the cast cannot saturate.
        *o = (x * inv).round() as i8;
    }
    max / 127.0
}

impl HybridIndex {
    /// An empty index for vectors of `dim` dimensions (default BM25 parameters).
    pub fn new(dim: usize) -> Self {
        Self::with_params(dim, Bm25Params::default())
    }

    /// An empty index for vectors of `dim` dimensions with the given BM25 parameters.
    pub fn with_params(dim: usize, params: Bm25Params) -> Self {
        Self {
            dim,
            bm25: Bm25Index::with_params(params),
            vectors: Vec::new(),
            scales: Vec::new(),
            row_slot: Vec::new(),
            slot_rows: Vec::new(),
            free_rows: Vec::new(),
            late: HashMap::new(),
        }
    }

    /// Dimensions of the vectors.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Indexes `text` and `embedding` under `key`, replacing what `key` had. The embedding
    /// is L2-normalised here.
    pub fn insert(&mut self, key: u64, text: &str, embedding: Vec<f32>) -> Result<(), SearchError> {
        self.insert_passages(key, text, vec![embedding])
    }

    /// Indexes `text` under `key` with one embedding per passage of the entry (e.g. per
    /// sentence of a card), replacing what `key` had; the entry's cosine with a query is
    /// its best passage's. Every embedding is checked and L2-normalised before anything
    /// changes, so a bad one leaves the index as it was.
    pub fn insert_passages(
        &mut self,
        key: u64,
        text: &str,
        embeddings: Vec<Vec<f32>>,
    ) -> Result<(), SearchError> {
        if embeddings.is_empty() || embeddings.len() > MAX_PASSAGES {
            return Err(SearchError::PassageCount(embeddings.len()));
        }
        let mut embeddings = embeddings;
        for e in &mut embeddings {
            if e.len() != self.dim {
                return Err(SearchError::DimensionMismatch {
                    expected: self.dim,
                    got: e.len(),
                });
            }
            if !normalize(e) {
                return Err(SearchError::InvalidEmbedding);
            }
        }
        let slot = self.bm25.insert_slot(key, text) as usize;
        self.late.remove(&key);
        if self.slot_rows.len() <= slot {
            self.slot_rows.resize_with(slot + 1, Vec::new);
        }
        self.free_slot_rows(slot);
        let dim = self.dim;
        for e in &embeddings {
            let row = match self.free_rows.pop() {
                Some(r) => r as usize,
                None => {
                    self.vectors.resize(self.vectors.len() + dim, 0);
                    self.scales.push(0.0);
                    self.row_slot.push(FREE_ROW);
                    self.scales.len() - 1
                }
            };
            self.scales[row] = quantize_into(e, &mut self.vectors[row * dim..(row + 1) * dim]);
            self.row_slot[row] = slot as u32;
            self.slot_rows[slot].push(row as u32);
        }
        Ok(())
    }

    /// Releases the rows of `slot` for reuse.
    fn free_slot_rows(&mut self, slot: usize) {
        let dim = self.dim;
        for row in std::mem::take(&mut self.slot_rows[slot]) {
            let r = row as usize;
            self.vectors[r * dim..(r + 1) * dim].fill(0);
            self.scales[r] = 0.0;
            self.row_slot[r] = FREE_ROW;
            self.free_rows.push(row);
        }
    }

    /// Removes `key`; returns whether it was indexed.
    pub fn remove(&mut self, key: u64) -> bool {
        self.late.remove(&key);
        match self.bm25.remove_slot(key) {
            Some(slot) => {
                if (slot as usize) < self.slot_rows.len() {
                    self.free_slot_rows(slot as usize);
                }
                true
            }
            None => false,
        }
    }

    /// Number of indexed entries.
    pub fn len(&self) -> usize {
        self.bm25.len()
    }

    /// Whether nothing is indexed.
    pub fn is_empty(&self) -> bool {
        self.bm25.is_empty()
    }

    /// Whether `key` is indexed.
    pub fn contains(&self, key: u64) -> bool {
        self.bm25.contains(key)
    }

    /// The `k` best entries for `query` (text) and `query_embedding`, best first.
    ///
    /// Every entry is a candidate: one whose text shares no term with the query can still be
    /// found by meaning. An empty `query_embedding` searches by text only; one of the wrong
    /// length is ignored likewise (with a warning).
    pub fn search(
        &self,
        query: &str,
        query_embedding: &[f32],
        k: usize,
        opts: &HybridOptions,
    ) -> Vec<Hit> {
        let slots = &self.bm25.slots;
        if k == 0 || self.is_empty() {
            return Vec::new();
        }
        let mut bm25 = vec![0.0f32; slots.len()];
        self.bm25.score_into(query, &mut bm25);
        let max_bm25 = bm25.iter().copied().fold(0.0f32, f32::max);

        let mut q = query_embedding.to_vec();
        let semantic = if q.is_empty() {
            false
        } else if q.len() != self.dim {
            tracing::warn!(
                expected = self.dim,
                got = q.len(),
                "query embedding has the wrong length; searching by text only"
            );
            false
        } else {
            normalize(&mut q)
        };
        let mut cosine = vec![0.0f32; slots.len()];
        if semantic {
            self.cosines(&q, &mut cosine);
        }
        let max_cos = slots
            .iter()
            .zip(&cosine)
            .filter(|(s, _)| s.live)
            .map(|(_, &c)| c)
            .fold(0.0f32, f32::max);

        let ws = if max_cos > 0.0 {
            opts.semantic_weight / max_cos
        } else {
            0.0
        };
        let wl = if max_bm25 > 0.0 {
            opts.lexical_weight / max_bm25
        } else {
            0.0
        };
        let fused = slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.live)
            .map(|(i, s)| {
                let mut score = ws * cosine[i].max(0.0) + wl * bm25[i];
                if let Some(prior) = opts.prior {
                    score *= prior(s.key).max(0.0);
                }
                (score, i as u32)
            });
        top_k(fused, k)
            .into_iter()
            .map(|(score, slot)| {
                let i = slot as usize;
                Hit {
                    key: slots[i].key,
                    score,
                    bm25: bm25[i],
                    cosine: cosine[i],
                }
            })
            .collect()
    }
}

impl HybridIndex {
    /// Gives the indexed entry `key` its texts' token bits (several: the entry matches by
    /// its best, as with passages), replacing any it had; empty bags are dropped. Returns
    /// false, changing nothing, when `key` is not indexed. Inserting the entry again
    /// clears them.
    pub fn set_tokens(&mut self, key: u64, bags: Vec<TokenBits>) -> bool {
        if !self.contains(key) {
            return false;
        }
        let bags: Vec<TokenBits> = bags.into_iter().filter(|b| !b.is_empty()).collect();
        if bags.is_empty() {
            self.late.remove(&key);
        } else {
            self.late.insert(key, bags);
        }
        true
    }

    /// The first vector of entry `key` (quantised values and their scale), if indexed.
    fn first_row(&self, key: u64) -> Option<(&[i8], f32)> {
        let slot = *self.bm25.by_key.get(&key)? as usize;
        let row = *self.slot_rows.get(slot)?.first()? as usize;
        let dim = self.dim;
        Some((&self.vectors[row * dim..(row + 1) * dim], self.scales[row]))
    }

    /// Takes the token bits of `key` out of the index (none when it has none).
    pub fn take_tokens(&mut self, key: u64) -> Vec<TokenBits> {
        self.late.remove(&key).unwrap_or_default()
    }

    /// The late-interaction stage: re-orders the first `depth` of `hits` (a result of
    /// [`HybridIndex::search`], best first) by the MaxSim of `query` with each entry's best
    /// bag of token bits, times `prior` (as the search applies it). Only hits the first
    /// stage found relevant at all (score above 0) are in reach, and one without token bits
    /// (indexed before it had them) keeps its place while the others are re-ordered among
    /// the places they hold. The scores stay where they were, so the list stays sorted by
    /// [`Hit::score`] and a hit takes the score of the place it moves to; `bm25` and
    /// `cosine` move with their entry. Returns whether anything could be re-ordered (the
    /// query has tokens and two hits in reach have bits).
    ///
    /// `neighbour_weight` adds, to every hit in reach, that many times the cosine of its
    /// first vector with the first vector of the hit the MaxSim ranks first (before the
    /// prior multiplies; the leader gains the weight itself). Worked examples of one kind
    /// of task resemble each other more than an entry that merely shares the request's
    /// subject resembles them, so the second and third example follow the best one
    /// (`benches/memory/README.md`). 0 turns it off.
    pub fn rerank_late(
        &self,
        hits: &mut [Hit],
        query: &TokenBits,
        depth: usize,
        prior: Option<&dyn Fn(u64) -> f32>,
        neighbour_weight: f32,
    ) -> bool {
        if query.is_empty() {
            return false;
        }
        // (late score, place, prior) of every hit in reach that has token bits.
        let mut scored: Vec<(f32, usize, f32)> = hits
            .iter()
            .take(depth)
            .take_while(|h| h.score > 0.0)
            .enumerate()
            .filter_map(|(i, h)| {
                let bags = self.late.get(&h.key)?;
                let late = bags
                    .iter()
                    .map(|b| query.maxsim(b))
                    .fold(f32::NEG_INFINITY, f32::max);
                let p = prior.map_or(1.0, |f| f(h.key).max(0.0));
                // MaxSim is in [-1, 1]: shifted to [0, 2] so a prior of 0 still ranks last.
                Some(((late + 1.0) * p, i, p))
            })
            .collect();
        if scored.len() < 2 {
            return false;
        }
        if neighbour_weight > 0.0 {
            let leader = scored
                .iter()
                .copied()
                // The first of equals leads, as the stable sort below would put it.
                .reduce(|a, b| if b.0 > a.0 { b } else { a })
                .and_then(|(_, i, _)| self.first_row(hits[i].key));
            if let Some((lv, ls)) = leader {
                for (score, i, p) in &mut scored {
                    let cos = self
                        .first_row(hits[*i].key)
                        .map_or(0.0, |(v, s)| dot_i8(v, lv) as f32 * s * ls);
                    *score += neighbour_weight * cos * *p;
                }
            }
        }
        let places: Vec<usize> = scored.iter().map(|&(_, i, _)| i).collect();
        // Stable: ties keep the first stage's order.
        scored.sort_by(|a, b| b.0.total_cmp(&a.0));
        let moved: Vec<Hit> = scored.iter().map(|&(_, i, _)| hits[i]).collect();
        for (&place, mut h) in places.iter().zip(moved) {
            h.score = hits[place].score;
            hits[place] = h;
        }
        true
    }
}

/// The sentences of a query searched beside the whole text
/// ([`HybridIndex::search_with_parts`]): none for a one-sentence query.
pub fn query_parts(query: &str) -> Vec<String> {
    let sentences = split_sentences(query);
    if sentences.len() > 1 {
        sentences
    } else {
        Vec::new()
    }
}

/// Weight of a query's best sentence next to the whole query in
/// [`HybridIndex::search_with_parts`].
pub const PART_WEIGHT: f32 = 0.5;

impl HybridIndex {
    /// [`HybridIndex::search`] for a query of several sentences (`parts`, each with its
    /// embedding): an entry scores its fused score for the whole query plus
    /// [`PART_WEIGHT`] times its best fused score for any one part. The whole text carries
    /// the situation that decides between look-alike entries; a part finds the entry that
    /// one need of a list asks for, which one vector of the whole averages away. With fewer
    /// than two parts this is [`HybridIndex::search`]. [`Hit::bm25`] and [`Hit::cosine`] are
    /// the whole query's.
    pub fn search_with_parts(
        &self,
        query: &str,
        query_embedding: &[f32],
        parts: &[(&str, &[f32])],
        k: usize,
        opts: &HybridOptions,
    ) -> Vec<Hit> {
        if parts.len() < 2 {
            return self.search(query, query_embedding, k, opts);
        }
        let n = self.len();
        let mut best: HashMap<u64, f32> = HashMap::with_capacity(n);
        for (text, embedding) in parts {
            for h in self.search(text, embedding, n, opts) {
                let b = best.entry(h.key).or_insert(0.0);
                *b = b.max(h.score);
            }
        }
        let mut hits = self.search(query, query_embedding, n, opts);
        for h in &mut hits {
            h.score += PART_WEIGHT * best.get(&h.key).copied().unwrap_or(0.0);
        }
        hits.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.key.cmp(&b.key)));
        hits.truncate(k);
        hits
    }
}

impl HybridIndex {
    /// Fills `out[slot]` with the cosine of the unit vector `q` with the best passage of
    /// the entry in `slot` (-1 for free slots). The dense pass over the rows is split
    /// across threads for large indexes.
    fn cosines(&self, q: &[f32], out: &mut [f32]) {
        let mut qq = vec![0i8; self.dim];
        let q_scale = quantize_into(q, &mut qq);
        let dim = self.dim;
        let pass = |rows: &[i8], scales: &[f32], out: &mut [f32]| {
            for ((c, row), s) in out.iter_mut().zip(rows.chunks_exact(dim)).zip(scales) {
                *c = dot_i8(row, &qq) as f32 * s * q_scale;
            }
        };
        let rows = self.scales.len();
        let mut row_cos = vec![0.0f32; rows];
        let threads = std::thread::available_parallelism().map_or(1, usize::from);
        if threads < 2 || rows * dim < PARALLEL_MIN_WORK {
            pass(&self.vectors, &self.scales, &mut row_cos);
        } else {
            let per = rows.div_ceil(threads);
            std::thread::scope(|scope| {
                let mut chunks = row_cos
                    .chunks_mut(per)
                    .zip(self.vectors.chunks(per * dim))
                    .zip(self.scales.chunks(per));
                // The first chunk runs on this thread, the others on scoped threads.
                let first = chunks.next();
                for ((o, v), s) in chunks {
                    scope.spawn(move || pass(v, s, o));
                }
                if let Some(((o, v), s)) = first {
                    pass(v, s, o);
                }
            });
        }
        out.fill(-1.0);
        for (&slot, c) in self.row_slot.iter().zip(row_cos) {
            if let Some(best) = out.get_mut(slot as usize) {
                *best = best.max(c);
            }
        }
    }
}

/// L2-normalises `v` in place; false if it is not finite or is zero.
fn normalize(v: &mut [f32]) -> bool {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if !norm.is_finite() || norm == 0.0 {
        return false;
    }
    v.iter_mut().for_each(|x| *x /= norm);
    true
}

/// Integer dot product of two `i8` vectors, in blocks of 32 lanes the compiler turns into
/// widening SIMD multiply-adds. No overflow: each product is at most 127², and a block
/// lane sums one product per 32 components.
fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    let mut acc = [0i32; 32];
    let ca = a.chunks_exact(32);
    let cb = b.chunks_exact(32);
    let tail: i32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(&x, &y)| i32::from(x) * i32::from(y))
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..32 {
            acc[i] += i32::from(x[i]) * i32::from(y[i]);
        }
    }
    acc.iter().sum::<i32>() + tail
}

/// Score with a total order for the heap (NaN sorts lowest).
#[derive(Clone, Copy, PartialEq)]
struct Ranked(f32, u32);

impl Eq for Ranked {}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: the heap's top is the worst kept entry. Ties: lower slot wins.
        other.0.total_cmp(&self.0).then(self.1.cmp(&other.1))
    }
}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The `k` highest `(score, slot)` pairs, best first (ties broken by lower slot).
fn top_k(items: impl Iterator<Item = (f32, u32)>, k: usize) -> Vec<(f32, u32)> {
    if k == 0 {
        return Vec::new();
    }
    let mut heap: BinaryHeap<Ranked> = BinaryHeap::with_capacity(k.min(1024) + 1);
    for (score, slot) in items {
        let score = if score.is_nan() {
            f32::NEG_INFINITY
        } else {
            score
        };
        if heap.len() < k {
            heap.push(Ranked(score, slot));
        } else if let Some(worst) = heap.peek() {
            if Ranked(score, slot) < *worst {
                heap.pop();
                heap.push(Ranked(score, slot));
            }
        }
    }
    // Ascending by `Ranked` order = best first.
    heap.into_sorted_vec()
        .into_iter()
        .map(|Ranked(s, i)| (s, i))
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn stopwords_are_sorted_for_binary_search() {
        assert!(STOPWORDS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn tokenize_lowercases_splits_stems_and_drops_stopwords() {
        assert_eq!(
            tokenize("The Analyzer analyzes analyzed DATA-sets, running & planned!"),
            vec!["analyzer", "analyz", "analyz", "data", "set", "run", "plan"]
        );
        assert_eq!(
            tokenize("queries query QUERIED"),
            vec!["query", "query", "query"]
        );
        assert_eq!(
            tokenize("falling fall passes pass status"),
            vec!["fall", "fall", "pass", "pass", "status"]
        );
        assert_eq!(
            tokenize("Übersetzung für Verträge 2024 x"),
            vec!["übersetzung", "für", "verträge", "2024"]
        );
        assert_eq!(tokenize("string thing"), vec!["string", "thing"]);
        assert!(tokenize("it is of the and").is_empty());
    }

    #[test]
    fn bm25_ranks_a_known_corpus() {
        let mut idx = Bm25Index::new();
        idx.insert(1, "translate legal contracts from German");
        idx.insert(2, "the cat sat on the mat");
        idx.insert(3, "contracts contracts contracts review");
        idx.insert(4, "German bakery recipes");
        let hits = idx.search("German contracts", 10);
        let keys: Vec<u64> = hits.iter().map(|h| h.0).collect();
        // Doc 1 has both terms; 3 repeats the rarer-length-adjusted "contract"; 4 has "german".
        assert_eq!(keys[0], 1);
        assert_eq!(keys.len(), 3);
        assert!(!keys.contains(&2));
        assert!(hits.windows(2).all(|w| w[0].1 >= w[1].1));
        // Hand-computed score of doc 2 for "cat": N=4, df=1, idf=ln(1+3.5/1.5), len 3 (cat, sat,
        // mat), average length (4+3+4+3)/4 = 3.5.
        let idf = (1.0f32 + 3.5 / 1.5).ln();
        let expect = idf * 2.2 / (1.0 + 1.2 * (0.25 + 0.75 * 3.0 / 3.5));
        let got = idx.search("cats", 1);
        assert_eq!(got[0].0, 2);
        assert!((got[0].1 - expect).abs() < 1e-5, "{} vs {expect}", got[0].1);
    }

    #[test]
    fn bm25_remove_and_replace() {
        let mut idx = Bm25Index::new();
        idx.insert(1, "rust compiler");
        idx.insert(2, "python interpreter");
        assert_eq!(idx.len(), 2);
        assert!(idx.remove(1));
        assert!(!idx.remove(1));
        assert_eq!(idx.len(), 1);
        assert!(idx.search("rust", 5).is_empty());
        // The freed slot is reused and the old postings are gone.
        idx.insert(3, "go runtime");
        assert_eq!(idx.search("runtime", 5)[0].0, 3);
        assert!(idx.search("compiler", 5).is_empty());
        // Re-inserting a key replaces its text.
        idx.insert(2, "rust toolchain");
        assert_eq!(idx.len(), 2);
        assert!(idx.search("python", 5).is_empty());
        assert_eq!(idx.search("rust", 5)[0].0, 2);
        assert!(idx.remove(2) && idx.remove(3) && idx.is_empty());
    }

    fn unit(v: &[f32]) -> Vec<f32> {
        let mut v = v.to_vec();
        assert!(normalize(&mut v));
        v
    }

    #[test]
    fn hybrid_rejects_bad_embeddings() {
        let mut idx = HybridIndex::new(3);
        assert!(matches!(
            idx.insert(1, "x", vec![1.0, 0.0]),
            Err(SearchError::DimensionMismatch {
                expected: 3,
                got: 2
            })
        ));
        assert!(matches!(
            idx.insert(1, "x", vec![0.0; 3]),
            Err(SearchError::InvalidEmbedding)
        ));
        assert!(matches!(
            idx.insert(1, "x", vec![f32::NAN, 1.0, 0.0]),
            Err(SearchError::InvalidEmbedding)
        ));
        assert!(idx.is_empty());
    }

    #[test]
    fn hybrid_fuses_lexical_and_semantic_and_applies_prior() {
        let mut idx = HybridIndex::new(3);
        // 1 matches the query by meaning only, 2 by words only, 3 by neither.
        idx.insert(1, "physician", vec![1.0, 0.1, 0.0]).unwrap();
        idx.insert(2, "doctor of philosophy", vec![0.0, 1.0, 0.0])
            .unwrap();
        idx.insert(3, "garden tools", vec![0.0, 0.0, 1.0]).unwrap();
        let q = [1.0, 0.0, 0.0];
        let hits = idx.search("doctor", &q, 3, &HybridOptions::default());
        assert_eq!(hits.len(), 3);
        assert_eq!(hits[0].key, 1, "{hits:?}");
        assert_eq!(hits[0].bm25, 0.0);
        assert!((hits[0].cosine - unit(&[1.0, 0.1, 0.0])[0]).abs() < 5e-3);
        assert_eq!(hits[1].key, 2);
        assert!(hits[1].bm25 > 0.0);
        assert_eq!(hits[2].key, 3);
        // Text only: the lexical match alone.
        let text_only = idx.search("doctor", &[], 3, &HybridOptions::default());
        assert_eq!(text_only[0].key, 2);
        assert!(text_only[0].score > 0.0 && text_only[1].score == 0.0);
        // A prior can demote the semantic match below the lexical one.
        let prior = |key: u64| if key == 1 { 0.1 } else { 1.0 };
        let opts = HybridOptions {
            prior: Some(&prior),
            ..HybridOptions::default()
        };
        assert_eq!(idx.search("doctor", &q, 1, &opts)[0].key, 2);
        // Removal frees the row; a new entry reuses it.
        assert!(idx.remove(1));
        assert_eq!(
            idx.search("doctor", &q, 3, &HybridOptions::default()).len(),
            2
        );
        idx.insert(4, "medic", vec![0.9, 0.0, 0.1]).unwrap();
        assert_eq!(
            idx.search("doctor", &q, 1, &HybridOptions::default())[0].key,
            4
        );
    }

    #[test]
    fn a_sentence_of_a_list_finds_its_entry() {
        // The whole query (a blend of two needs) is closest to the generalist 3; its second
        // sentence asks exactly for 2, which the parts bring up to the top (0.96 vs 0.94).
        let mut idx = HybridIndex::new(3);
        idx.insert(1, "", vec![1.0, 0.0, 0.0]).unwrap();
        idx.insert(2, "", vec![0.0, 1.0, 0.0]).unwrap();
        idx.insert(3, "", vec![0.2, 0.7, 0.7]).unwrap();
        let whole = [0.3, 0.9, 0.5];
        let opts = HybridOptions::default();
        assert_eq!(idx.search("", &whole, 1, &opts)[0].key, 3);
        let parts: [(&str, &[f32]); 2] = [("", &[1.0, 0.0, 0.0]), ("", &[0.0, 1.0, 0.0])];
        let hits = idx.search_with_parts("", &whole, &parts, 3, &opts);
        assert_eq!(hits[0].key, 2, "{hits:?}");
        assert_eq!(hits.len(), 3);
        // One part is the whole query again.
        assert_eq!(
            idx.search_with_parts("", &whole, &parts[..1], 3, &opts),
            idx.search("", &whole, 3, &opts)
        );
    }

    #[test]
    fn top_k_keeps_the_best_in_order() {
        let items = [(0.5, 0), (2.0, 1), (f32::NAN, 2), (1.0, 3), (2.0, 4)];
        assert_eq!(
            top_k(items.into_iter(), 3),
            vec![(2.0, 1), (2.0, 4), (1.0, 3)]
        );
        assert_eq!(top_k(items.into_iter(), 0), vec![]);
        assert_eq!(top_k(items.into_iter(), 10).len(), 5);
    }

    #[test]
    fn dot_i8_matches_naive() {
        let a: Vec<i8> = (0..77).map(|i| (i * 37 % 255 - 127) as i8).collect();
        let b: Vec<i8> = (0..77).map(|i| (i * 91 % 255 - 127) as i8).collect();
        let naive: i32 = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| i32::from(x) * i32::from(y))
            .sum();
        assert_eq!(dot_i8(&a, &b), naive);
        let max = vec![-128i8; 384];
        assert_eq!(dot_i8(&max, &max), 384 * 128 * 128);
    }

    #[test]
    fn quantised_cosines_are_close_to_exact_also_when_split_across_threads() {
        // Pseudo-random unit vectors of 384 dimensions; enough rows to use threads.
        let dim = 384;
        let rows = PARALLEL_MIN_WORK / dim + 7;
        let mut state = 0x9e37_79b9_u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % 2001) as f32 / 1000.0 - 1.0
        };
        let mut idx = HybridIndex::new(dim);
        let mut exact = Vec::with_capacity(rows);
        for key in 0..rows as u64 {
            let v = unit(&(0..dim).map(|_| next()).collect::<Vec<_>>());
            exact.push(v.clone());
            idx.insert(key, "", v).unwrap();
        }
        let q = unit(&(0..dim).map(|_| next()).collect::<Vec<_>>());
        let mut got = vec![0.0; rows];
        idx.cosines(&q, &mut got);
        for (row, c) in exact.iter().zip(&got) {
            let want: f32 = row.iter().zip(&q).map(|(x, y)| x * y).sum();
            assert!((c - want).abs() < 5e-3, "{c} vs {want}");
        }
    }

    #[test]
    fn sentences_and_chunks() {
        assert_eq!(
            split_sentences("We need help. First, fix v1.2 now; then ship it!  Done?"),
            vec![
                "We need help.",
                "First, fix v1.2 now; then ship it!",
                "Done?"
            ]
        );
        assert_eq!(split_sentences("no full stop"), vec!["no full stop"]);
        assert!(split_sentences(" . ; ").is_empty());
        // A short text is one chunk, whole.
        assert_eq!(chunks(" A b. C d. E f. ", 8), vec!["A b. C d. E f."]);
        // A long one is cut between sentences, each chunk within the word limit.
        assert_eq!(
            chunks("A b. C d. E f. G h i j k.", 4),
            vec!["A b. C d.", "E f.", "G h i j k."]
        );
        assert_eq!(chunks(" ... ", 4), vec!["..."]);
        // Never more chunks than an entry may have embeddings.
        let long = "Word word. ".repeat(MAX_PASSAGES * 3);
        let c = chunks(&long, 2);
        assert_eq!(c.len(), MAX_PASSAGES);
        assert_eq!(c.join(" ").split_whitespace().count(), MAX_PASSAGES * 3 * 2);
    }

    #[test]
    fn an_entry_matches_by_its_best_passage() {
        let mut idx = HybridIndex::new(3);
        // Entry 1 states one thing precisely and mentions another; entry 2 is one blend.
        idx.insert_passages(1, "one", vec![vec![1.0, 0.0, 0.0], vec![0.0, 0.0, 1.0]])
            .unwrap();
        idx.insert(2, "two", vec![0.8, 0.0, 0.6]).unwrap();
        let hits = idx.search("", &[1.0, 0.0, 0.0], 2, &HybridOptions::default());
        assert_eq!(hits[0].key, 1);
        assert!((hits[0].cosine - 1.0).abs() < 0.01, "{hits:?}");
        assert!((hits[1].cosine - 0.8).abs() < 0.01, "{hits:?}");

        // Replacing an entry with fewer passages frees its old rows (and reuses them).
        idx.insert_passages(1, "one", vec![vec![0.0, 1.0, 0.0]])
            .unwrap();
        let hits = idx.search("", &[0.0, 0.0, 1.0], 2, &HybridOptions::default());
        assert_eq!(hits[0].key, 2);
        assert!(hits[1].cosine.abs() < 0.01, "{hits:?}");
        idx.insert_passages(3, "three", vec![vec![0.0, 0.0, 1.0]; 2])
            .unwrap();
        // The freed row is reused before one more is added.
        assert_eq!(idx.scales.len(), 4, "{:?}", idx.row_slot);
        assert!(idx.remove(3));
        let hits = idx.search("", &[0.0, 0.0, 1.0], 5, &HybridOptions::default());
        assert_eq!(hits.iter().map(|h| h.key).collect::<Vec<_>>(), vec![2, 1]);
    }

    #[test]
    fn bad_passages_leave_the_entry_as_it_was() {
        let mut idx = HybridIndex::new(2);
        idx.insert(7, "kept", vec![1.0, 0.0]).unwrap();
        let bad = [
            vec![],
            vec![vec![0.0, 1.0], vec![f32::NAN, 1.0]],
            vec![vec![0.0, 1.0], vec![1.0]],
            vec![vec![0.0, 1.0]; MAX_PASSAGES + 1],
        ];
        for b in bad {
            assert!(idx.insert_passages(7, "replaced", b).is_err());
        }
        let hits = idx.search("kept", &[1.0, 0.0], 1, &HybridOptions::default());
        assert_eq!(hits[0].key, 7);
        assert!(hits[0].bm25 > 0.0 && (hits[0].cosine - 1.0).abs() < 0.01);
    }

    /// An index of four entries whose first-stage order for the query "apple" is 1, 2, 3,
    /// 4 (by cosine), each with one bag of token bits.
    fn late_index() -> HybridIndex {
        let mut idx = HybridIndex::new(2);
        for (key, cos) in [(1u64, 1.0f32), (2, 0.9), (3, 0.8), (4, 0.7)] {
            let e = vec![cos, (1.0 - cos * cos).max(0.0).sqrt()];
            idx.insert(key, "apple", e).unwrap();
        }
        idx
    }

    fn tok(rows: &[[f32; 4]]) -> TokenBits {
        let flat: Vec<f32> = rows.iter().flatten().copied().collect();
        TokenBits::from_rows(&flat, 4)
    }

    #[test]
    fn late_interaction_reorders_the_head_and_scores_keep_their_places() {
        let mut idx = late_index();
        let q = tok(&[[1.0, 1.0, 1.0, 1.0]]);
        // Entry 3 matches the query's token exactly, 2 in three signs of four, 1 and 4 in none.
        idx.set_tokens(1, vec![tok(&[[-1.0, -1.0, -1.0, -1.0]])]);
        idx.set_tokens(2, vec![tok(&[[1.0, 1.0, 1.0, -1.0]])]);
        // Several bags: the best counts.
        idx.set_tokens(
            3,
            vec![
                tok(&[[-1.0, -1.0, -1.0, -1.0]]),
                tok(&[[1.0, 1.0, 1.0, 1.0]]),
            ],
        );
        idx.set_tokens(4, vec![tok(&[[-1.0, -1.0, -1.0, -1.0]])]);
        let mut hits = idx.search("apple", &[1.0, 0.0], 4, &HybridOptions::default());
        let before: Vec<u64> = hits.iter().map(|h| h.key).collect();
        assert_eq!(before, vec![1, 2, 3, 4]);
        let scores: Vec<f32> = hits.iter().map(|h| h.score).collect();
        let cos3 = hits[2].cosine;
        // Depth 3: entry 4 stays where it is.
        assert!(idx.rerank_late(&mut hits, &q, 3, None, 0.0));
        let after: Vec<u64> = hits.iter().map(|h| h.key).collect();
        assert_eq!(after, vec![3, 2, 1, 4]);
        assert_eq!(hits.iter().map(|h| h.score).collect::<Vec<_>>(), scores);
        assert_eq!(hits[0].cosine, cos3);
    }

    #[test]
    fn late_interaction_brings_the_leaders_look_alike_forward_with_a_neighbour_weight() {
        let mut idx = HybridIndex::new(2);
        // 1 leads by its tokens; 3 is 1's look-alike (same vector) with weaker tokens than 2,
        // whose vector is orthogonal to 1's.
        idx.insert(1, "apple", vec![1.0, 0.0]).unwrap();
        idx.insert(2, "apple", vec![0.0, 1.0]).unwrap();
        idx.insert(3, "apple", vec![1.0, 0.0]).unwrap();
        let q = tok(&[[1.0, 1.0, 1.0, 1.0]]);
        idx.set_tokens(1, vec![tok(&[[1.0, 1.0, 1.0, 1.0]])]);
        idx.set_tokens(2, vec![tok(&[[1.0, 1.0, 1.0, -1.0]])]);
        idx.set_tokens(3, vec![tok(&[[1.0, 1.0, -1.0, -1.0]])]);
        let hits = idx.search("apple", &[0.6, 0.8], 3, &HybridOptions::default());
        let order = |w: f32| {
            let mut h = hits.clone();
            assert!(idx.rerank_late(&mut h, &q, 3, None, w));
            h.iter().map(|h| h.key).collect::<Vec<_>>()
        };
        // MaxSim alone: 1 (1.0), 2 (0.5), 3 (0.0).
        assert_eq!(order(0.0), vec![1, 2, 3]);
        // Too light to outweigh half a MaxSim.
        assert_eq!(order(0.4), vec![1, 2, 3]);
        // 3 gains the weight times its cosine with 1 (1.0), 2 nothing; 1 keeps the lead.
        assert_eq!(order(1.0), vec![1, 3, 2]);
        // A prior of 0 still ranks an entry last, look-alike or not.
        let demote = |key: u64| if key == 3 { 0.0 } else { 1.0 };
        let mut h = hits.clone();
        assert!(idx.rerank_late(&mut h, &q, 3, Some(&demote), 1.0));
        assert_eq!(h.iter().map(|h| h.key).collect::<Vec<_>>(), vec![1, 2, 3]);
    }

    #[test]
    fn late_interaction_applies_the_prior_and_skips_a_head_with_a_gap() {
        let mut idx = late_index();
        let q = tok(&[[1.0, 1.0, 1.0, 1.0]]);
        for key in 1..=4 {
            let row = if key == 2 {
                [1.0, 1.0, 1.0, 1.0]
            } else {
                [1.0, -1.0, -1.0, -1.0]
            };
            assert!(idx.set_tokens(key, vec![tok(&[row])]));
        }
        let hits = idx.search("apple", &[1.0, 0.0], 4, &HybridOptions::default());
        let mut a = hits.clone();
        assert!(idx.rerank_late(&mut a, &q, 4, None, 0.0));
        assert_eq!(a[0].key, 2);
        // A prior of 0 for entry 2 puts it last, whatever its tokens.
        let demote = |key: u64| if key == 2 { 0.0 } else { 1.0 };
        let mut b = hits.clone();
        assert!(idx.rerank_late(&mut b, &q, 4, Some(&demote), 0.0));
        assert_eq!(
            b.iter().map(|h| h.key).collect::<Vec<_>>(),
            vec![1, 3, 4, 2]
        );
        // An entry without token bits (2, inserted again) keeps its place; the others are
        // re-ordered among theirs (4 now matches best).
        idx.insert(2, "apple", vec![0.9, (1.0f32 - 0.81).sqrt()])
            .unwrap();
        idx.set_tokens(4, vec![tok(&[[1.0, 1.0, 1.0, -1.0]])]);
        let mut c = hits.clone();
        assert!(idx.rerank_late(&mut c, &q, 4, None, 0.0));
        assert_eq!(
            c.iter().map(|h| h.key).collect::<Vec<_>>(),
            vec![4, 2, 1, 3]
        );
        // Fewer than two entries with bits in reach: nothing moves.
        let mut d = hits.clone();
        assert!(!idx.rerank_late(&mut d, &q, 2, None, 0.0));
        assert_eq!(d, hits);
        // A hit the first stage scored 0 is out of reach.
        let mut e = hits.clone();
        e[0].score = 0.0;
        assert!(!idx.rerank_late(&mut e, &q, 4, None, 0.0));
        // No query tokens, unknown keys.
        assert!(!idx.rerank_late(&mut c, &TokenBits::default(), 4, None, 0.0));
        assert!(!idx.set_tokens(99, vec![q.clone()]));
        assert!(idx.remove(2) && !idx.set_tokens(2, vec![q]));
    }
}
