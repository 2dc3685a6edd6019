//! [`MemoryBook`]: the node's shared memories, indexed for retrieval, persisted in the
//! [`Store`], and published/received as signed swarm records.
//!
//! # Ranking
//!
//! Each domain has its own [`HybridIndex`] over the memories: BM25 over prompt and answer,
//! and two embeddings per memory, of the prompt and of prompt and answer together ([`whole_text`]),
//! the better of the two counting, fused as the search module describes. A request phrased
//! unlike the stored prompt often still matches what the answer talks about: on the dev
//! queries of `../shared/eval/memory` the second vector and BM25 over the answer raised
//! Recall@3 from 0.70 to 0.79, and on `benches/memory/blind_queries.jsonl` (written
//! independently of this code) from 0.93 to 0.97. The fused relevance is multiplied by a
//! prior:
//!
//! ```text
//! prior = quality(score) * trust(author) * usefulness(helpful, unhelpful)
//! quality    = 0.5 + 0.05 * score                  (score 0..10 -> 0.5..1.0)
//! trust      = the author's local trust (default 1, clamped to 0..4)
//! usefulness = 2 * (helpful + 1) / (helpful + unhelpful + 2)
//! ```
//!
//! `usefulness` is twice the mean of a Beta(1 + helpful, 1 + unhelpful) posterior: 1 for a
//! memory without feedback, towards 2 for one that helped every time, towards 0 for one that
//! never did, and a single report moves it by a third at most, so one bad outcome does not
//! bury a memory. Authors marked ignored are not indexed at all.
//!
//! Then a re-ranking stage reads query and memory together: the first
//! [`BookConfig::rerank_depth`] hits are re-ordered by late interaction (MaxSim of the
//! query's token vectors with those of the memory's prompt or of its whole text, the better,
//! times the prior; see [`crate::search::TokenBits`]). The embedder gives the token vectors
//! in the same forward pass as the pooled ones, so this costs no extra inference; each
//! memory keeps its tokens' sign bits (48 bytes a token with the default embedder, about
//! 6 KB a memory), in memory and in the store. On the dev queries of `../shared/eval/memory`
//! it raised MRR from 0.868 to 0.916 and on `benches/memory/blind_queries.jsonl` from 0.929
//! to 0.951 (`benches/memory/README.md`).
//!
//! In the same stage each memory gains [`BookConfig::neighbour_weight`] times the cosine of
//! its prompt with the prompt of the memory the stage ranks first. Memories are shown as
//! worked examples, and examples of one kind of task (two sonnets to an object, two
//! "explain the difference between" questions) resemble each other more than a memory
//! that only shares the request's subject resembles them: once the best example is found,
//! the next ones follow it. It raised Recall@3 on the shared dev queries from 0.780 to
//! 0.830, and by under a query on the two independent sets.
//!
//! # Flooding
//!
//! The top-k holds at most `ceil(k * max_author_share)` memories from any one author (half
//! by default) unless no other author has a relevant memory: when an author reaches its
//! share, the search is repeated with that author's memories (and those already taken)
//! weighted 0, so the best memories of *other* authors are found however many memories the
//! flooding author has. Trust then orders what is left.
//!
//! # Duplicates
//!
//! A memory whose prompt, in the same domain, normalises to the same text as a kept one, or
//! whose prompt embedding has cosine >= `duplicate_cosine` with one, is not stored: the first
//! one kept stays, and the caller is told which one it duplicates.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use starling_discovery::{Record, Swarm};
use starling_models::embed::EmbedHandle;

use super::record::{normalize_text, Memory, MemoryBody, MemoryError, MEMORY_KIND};
use crate::search::{HybridIndex, HybridOptions, TokenBits};
use crate::store::{AuthorTrust, MemoryFilter, MemoryRecord, Store, StoreError};

/// Settings key holding the feedback counts (JSON map id -> [helpful, unhelpful]).
const FEEDBACK_KEY: &str = "memory.feedback";
/// Texts embedded per call when loading or ingesting in bulk.
const EMBED_BATCH: usize = 64;
/// Added-memory events buffered for a slow subscriber before it lags.
const ADDED_EVENTS: usize = 1024;

/// Why a memory operation failed.
#[derive(Debug, thiserror::Error)]
pub enum BookError {
    /// The memory is invalid.
    #[error(transparent)]
    Invalid(#[from] MemoryError),
    /// The database failed.
    #[error("memory store: {0}")]
    Store(#[from] StoreError),
    /// The embedding model failed.
    #[error("embedding failed: {0}")]
    Embed(String),
    /// Publishing the record failed.
    #[error("cannot publish the memory: {0}")]
    Publish(String),
    /// The memory does not exist.
    #[error("no memory {0}")]
    NotFound(String),
}

/// Tunables of the memory book.
#[derive(Debug, Clone, PartialEq)]
pub struct BookConfig {
    /// Cosine of prompt embeddings at or above which two memories of one domain are
    /// duplicates. The check scans the domain's pool (one dense pass per new memory); a
    /// value above 1 turns it off (normalised-text duplicates are still caught).
    pub duplicate_cosine: f32,
    /// Weight of the cosine in the fused relevance.
    pub semantic_weight: f32,
    /// Weight of BM25 in the fused relevance.
    pub lexical_weight: f32,
    /// Largest share of the top-k one author may hold while others have relevant memories.
    pub max_author_share: f32,
    /// How many of the fused ranking's first hits the late-interaction stage re-orders
    /// (see the module docs); 0 turns the stage off.
    pub rerank_depth: usize,
    /// Weight, in that stage, of a memory's likeness to the best hit (the cosine of their
    /// prompts; see the module docs); 0 turns it off.
    pub neighbour_weight: f32,
}

impl Default for BookConfig {
    fn default() -> Self {
        Self {
            duplicate_cosine: 0.95,
            semantic_weight: 0.7,
            lexical_weight: 0.3,
            max_author_share: 0.5,
            rerank_depth: 20,
            neighbour_weight: 0.1,
        }
    }
}

/// Weights that replace the book's configured ones in one [`MemoryBook::ranked`] call.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RankOverrides {
    /// (semantic, lexical) fusion weights.
    pub weights: Option<(f32, f32)>,
    /// [`BookConfig::neighbour_weight`].
    pub neighbour_weight: Option<f32>,
}

/// What became of a memory given to the book.
#[derive(Debug, Clone, PartialEq)]
pub enum Inserted {
    /// Stored and indexed.
    Added(Memory),
    /// Already known under this id (nothing changed).
    Known(String),
    /// A near-duplicate of the kept memory with this id; not stored.
    Duplicate {
        /// The kept memory.
        of: String,
    },
    /// From an ignored author, or forgotten here; not indexed.
    Ignored,
}

/// One retrieved memory with its scores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryHit {
    /// The memory (author included).
    pub memory: Memory,
    /// Final score (relevance x prior).
    pub score: f32,
    /// Cosine of the query and the memory: the better of its prompt's and its whole
    /// text's ([`whole_text`]).
    pub cosine: f32,
    /// BM25 of the query against prompt and answer.
    pub bm25: f32,
}

/// Local data kept in the store's body column next to each memory.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct StoredBody {
    #[serde(default)]
    source: Option<String>,
    /// Embedding model id of `embedding`.
    #[serde(default)]
    model: String,
    /// The prompt embedding, quantised to i8 and base64-encoded, with its scale.
    #[serde(default)]
    embedding: Option<(String, f32)>,
    /// The embedding of [`whole_text`], packed the same way (absent in rows written before
    /// it existed: those are embedded again when the book opens).
    #[serde(default)]
    whole: Option<(String, f32)>,
    /// The token bits of the prompt and of the whole text ([`pack_tokens`]), when the
    /// embedder gives token vectors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tokens: Option<String>,
}

impl StoredBody {
    /// The body of a memory whose embeddings by `model` are `vectors` (an empty vector, as
    /// without an embedder, is stored as absent).
    fn packed(source: Option<String>, model: &str, vectors: &Vectors) -> Self {
        let pack = |v: &[f32]| (!v.is_empty()).then(|| pack_embedding(v));
        Self {
            source,
            model: model.to_owned(),
            embedding: pack(&vectors.prompt),
            whole: pack(&vectors.whole),
            tokens: (!vectors.tokens.is_empty()).then(|| pack_tokens(&vectors.tokens)),
        }
    }
}

/// The text of a memory whose embedding is its second vector: prompt and answer.
pub fn whole_text(prompt: &str, answer: &str) -> String {
    format!("{prompt}\n{answer}")
}

/// The text of a memory indexed for BM25: prompt and answer.
fn index_text(m: &Memory) -> String {
    whole_text(&m.prompt, &m.answer)
}

/// A memory with its embeddings of its prompt and of its [`whole_text`], and the token bits
/// of both (for the re-ranking stage), where known.
pub type WithVectors = (
    Memory,
    Option<Vec<f32>>,
    Option<Vec<f32>>,
    Option<Vec<TokenBits>>,
);

/// A memory's two unit embeddings (each empty without an embedder).
#[derive(Debug, Clone, Default)]
struct Vectors {
    /// Of the prompt: duplicates and domain profiles compare prompts.
    prompt: Vec<f32>,
    /// Of [`whole_text`].
    whole: Vec<f32>,
    /// Token bits of the prompt and of [`whole_text`] (empty when the embedder gives no
    /// token vectors). Kept by the index while the memory is indexed.
    tokens: Vec<TokenBits>,
}

/// The embedder's results for `n` texts, checked to be one per text.
fn one_per_text<T>(
    out: Result<Vec<T>, starling_models::embed::EmbedError>,
    n: usize,
) -> Result<Vec<T>, BookError> {
    let out = out.map_err(|e| BookError::Embed(e.to_string()))?;
    if out.len() != n {
        return Err(BookError::Embed(format!(
            "{} vectors for {n} texts",
            out.len()
        )));
    }
    Ok(out)
}

/// Token bags as stored: each one's length (`u32`, little-endian) and
/// [`TokenBits::to_bytes`], base64-encoded.
fn pack_tokens(bags: &[TokenBits]) -> String {
    let mut bytes = Vec::new();
    for b in bags {
        let one = b.to_bytes();
        bytes.extend_from_slice(&(one.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&one);
    }
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Reads [`pack_tokens`]; `None` for anything malformed or of another dimension than `dim`
/// (the memory is then embedded again).
fn unpack_tokens(packed: &str, dim: usize) -> Option<Vec<TokenBits>> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(packed)
        .ok()?;
    let mut rest = bytes.as_slice();
    let mut bags = Vec::new();
    while !rest.is_empty() {
        let (len, tail) = rest.split_first_chunk::<4>()?;
        let len = u32::from_le_bytes(*len) as usize;
        if tail.len() < len {
            return None;
        }
        let bag = TokenBits::from_bytes(&tail[..len])?;
        if bag.dim() != dim {
            return None;
        }
        bags.push(bag);
        rest = &tail[len..];
    }
    Some(bags)
}

fn pack_embedding(v: &[f32]) -> (String, f32) {
    let max = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let scale = if max > 0.0 { max / 127.0 } else { 1.0 };
    // |x / scale| <= 127, so the cast cannot saturate.
    let bytes: Vec<u8> = v
        .iter()
        .map(|x| ((x / scale).round() as i8) as u8)
        .collect();
    (
        base64::engine::general_purpose::STANDARD.encode(bytes),
        scale,
    )
}

fn unpack_embedding(packed: &(String, f32), dim: usize) -> Option<Vec<f32>> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&packed.0)
        .ok()?;
    (bytes.len() == dim).then(|| bytes.iter().map(|&b| (b as i8) as f32 * packed.1).collect())
}

struct Pool {
    index: HybridIndex,
}

struct Slot {
    memory: Memory,
    /// Unit embeddings (empty without an embedder).
    vectors: Vectors,
    /// Normalised prompt, for duplicate detection.
    norm: String,
}

struct State {
    pools: HashMap<String, Pool>,
    /// Indexed memories by key (the index of the slot).
    slots: Vec<Option<Slot>>,
    /// Memory id -> key, for indexed memories.
    keys: HashMap<String, u64>,
    /// (domain, normalised prompt) -> memory id.
    texts: HashMap<(String, String), String>,
    /// Known but not indexed (ignored author): kept to re-index when the author is trusted
    /// again.
    parked: HashMap<String, (Memory, Vectors)>,
    /// Forgotten ids (never indexed again).
    forgotten: HashSet<String>,
    trust: HashMap<String, AuthorTrust>,
    feedback: HashMap<String, (u32, u32)>,
    /// Prior of each slot (0 for a free slot).
    priors: Vec<f32>,
}

struct Inner {
    store: Store,
    embedder: Option<EmbedHandle>,
    swarm: Option<Swarm>,
    me: String,
    config: BookConfig,
    dim: usize,
    state: RwLock<State>,
    /// Memories stored (made here or received), for event streams.
    added: tokio::sync::broadcast::Sender<Memory>,
}

/// The node's memories: see the module docs. Cheap to clone.
#[derive(Clone)]
pub struct MemoryBook(Arc<Inner>);

impl std::fmt::Debug for MemoryBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBook")
            .field("me", &self.0.me)
            .field("len", &self.len())
            .finish()
    }
}

/// `0.5 + 0.05 * score`: the admission score's share of the prior.
fn quality(score: f32) -> f32 {
    0.5 + 0.05 * score.clamp(0.0, 10.0)
}

/// Twice the mean of Beta(1 + helpful, 1 + unhelpful).
pub fn usefulness(helpful: u32, unhelpful: u32) -> f32 {
    2.0 * (helpful as f32 + 1.0) / (helpful as f32 + unhelpful as f32 + 2.0)
}

fn now_ms() -> i64 {
    starling_discovery::records::now_ms() as i64
}

pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

pub(crate) fn unit(mut v: Vec<f32>) -> Option<Vec<f32>> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if !n.is_finite() || n == 0.0 {
        return None;
    }
    v.iter_mut().for_each(|x| *x /= n);
    Some(v)
}

impl MemoryBook {
    /// Opens the book over `store`: loads every kept memory (re-embedding those stored
    /// without a vector of the current model), the author trusts and the feedback counts.
    ///
    /// `swarm` is used to publish new memories (`None`: memories stay local, with random
    /// ids). `me` is this node's id (the author of local memories).
    pub async fn open(
        store: Store,
        embedder: Option<EmbedHandle>,
        swarm: Option<Swarm>,
        config: BookConfig,
    ) -> Result<Self, BookError> {
        let me = swarm
            .as_ref()
            .map_or_else(|| "local".to_owned(), |s| s.node_id().to_string());
        let dim = embedder.as_ref().map_or(1, EmbedHandle::dim);
        let trust: HashMap<String, AuthorTrust> = store
            .author_trusts()
            .await?
            .into_iter()
            .map(|t| (t.author.clone(), t))
            .collect();
        let feedback: HashMap<String, (u32, u32)> = match store.kv_get(FEEDBACK_KEY).await? {
            Some(json) => serde_json::from_str(&json).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "memory feedback counts unreadable; starting afresh");
                HashMap::new()
            }),
            None => HashMap::new(),
        };
        let book = Self(Arc::new(Inner {
            store: store.clone(),
            embedder,
            swarm,
            me,
            config,
            dim,
            added: tokio::sync::broadcast::channel(ADDED_EVENTS).0,
            state: RwLock::new(State {
                pools: HashMap::new(),
                slots: Vec::new(),
                keys: HashMap::new(),
                texts: HashMap::new(),
                parked: HashMap::new(),
                forgotten: HashSet::new(),
                trust,
                feedback,
                priors: Vec::new(),
            }),
        }));
        let (rows, unreadable): (Vec<MemoryRecord<StoredBody>>, Vec<String>) = store
            .readable_memories(&MemoryFilter {
                include_forgotten: true,
                ..MemoryFilter::default()
            })
            .await?;
        book.rebuild_unreadable(&unreadable).await;
        let model = book.model_id();
        let wants_tokens = book.token_embedder().is_some();
        let mut missing = Vec::new();
        let mut loaded = Vec::with_capacity(rows.len());
        for row in rows {
            if row.forgotten {
                book.write().forgotten.insert(row.id.clone());
                continue;
            }
            let unpack = |p: &Option<(String, f32)>| match (p, row.body.model == model) {
                (Some(p), true) => unpack_embedding(p, dim),
                _ => None,
            };
            // With an embedder that gives token vectors, a row without its tokens (written
            // before they existed, or by another model) is embedded again too.
            let tokens = match (&row.body.tokens, wants_tokens, row.body.model == model) {
                (_, false, _) => Some(Vec::new()),
                (Some(t), true, true) => unpack_tokens(t, dim),
                _ => None,
            };
            let emb = unpack(&row.body.embedding)
                .zip(unpack(&row.body.whole))
                .zip(tokens)
                .map(|((prompt, whole), tokens)| Vectors {
                    prompt,
                    whole,
                    tokens,
                });
            if emb.is_none() {
                missing.push(loaded.len());
            }
            let memory = Memory {
                id: row.id,
                author: row.author,
                domain: row.domain,
                prompt: row.prompt,
                answer: row.answer,
                source: row.body.source,
                score: row.score as f32,
                created_at: row.created_at,
                helpful: 0,
                unhelpful: 0,
            };
            loaded.push((memory, emb));
        }
        if !missing.is_empty() && book.0.embedder.is_some() {
            tracing::info!(count = missing.len(), "embedding stored memories");
            for chunk in missing.chunks(EMBED_BATCH) {
                let memories: Vec<&Memory> = chunk.iter().map(|&i| &loaded[i].0).collect();
                let vs = book.embed_memories(&memories).await?;
                for (&i, v) in chunk.iter().zip(vs) {
                    // Written back, so the next start does not embed them again. A failed
                    // write (a full disk) only costs that: the vectors are in memory.
                    let (memory, _) = &loaded[i];
                    let body = StoredBody::packed(memory.source.clone(), &model, &v);
                    if let Err(e) = book.0.store.set_memory_body(&memory.id, &body).await {
                        tracing::warn!(id = %memory.id, error = %e, "could not store a memory's embeddings");
                    }
                    loaded[i].1 = Some(v);
                }
            }
        }
        {
            let mut st = book.write();
            for (memory, emb) in loaded {
                book.index_locked(&mut st, memory, emb.unwrap_or_default());
            }
        }
        tracing::debug!(memories = book.len(), "memory book open");
        Ok(book)
    }

    /// This node's id as memory author.
    pub fn me(&self) -> &str {
        &self.0.me
    }

    /// The store behind the book.
    pub fn store(&self) -> &Store {
        &self.0.store
    }

    /// The embedding model, if any.
    pub fn embedder(&self) -> Option<&EmbedHandle> {
        self.0.embedder.as_ref()
    }

    /// The settings.
    pub fn config(&self) -> &BookConfig {
        &self.0.config
    }

    /// Number of indexed memories.
    pub fn len(&self) -> usize {
        self.read().keys.len()
    }

    /// Whether no memory is indexed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Indexed memories per domain.
    pub fn domains(&self) -> Vec<(String, usize)> {
        let st = self.read();
        let mut v: Vec<(String, usize)> = st
            .pools
            .iter()
            .map(|(d, p)| (d.clone(), p.index.len()))
            .collect();
        v.sort();
        v
    }

    /// An indexed memory by id.
    pub fn get(&self, id: &str) -> Option<Memory> {
        let st = self.read();
        let key = *st.keys.get(id)?;
        st.slots[key as usize].as_ref().map(|s| s.memory.clone())
    }

    /// Indexed memories, newest first, optionally of one domain and/or author.
    pub fn list(&self, domain: Option<&str>, author: Option<&str>, limit: usize) -> Vec<Memory> {
        let st = self.read();
        let mut v: Vec<Memory> = st
            .slots
            .iter()
            .flatten()
            .filter(|s| domain.is_none_or(|d| s.memory.domain == d))
            .filter(|s| author.is_none_or(|a| s.memory.author == a))
            .map(|s| s.memory.clone())
            .collect();
        v.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
        v.truncate(limit);
        v
    }

    /// The embedding model id ("" without one).
    fn model_id(&self) -> String {
        self.0
            .embedder
            .as_ref()
            .map_or_else(String::new, |e| e.model_id().to_owned())
    }

    /// Embeds the prompt and the [`whole_text`] of each memory, in one batch.
    async fn embed_memories(&self, memories: &[&Memory]) -> Result<Vec<Vectors>, BookError> {
        let mut texts: Vec<String> = memories.iter().map(|m| m.prompt.clone()).collect();
        texts.extend(memories.iter().map(|m| whole_text(&m.prompt, &m.answer)));
        let mut vs = self.embed_with_tokens(texts).await?;
        if vs.len() != 2 * memories.len() {
            // No embedder: no vectors.
            return Ok(vec![Vectors::default(); memories.len()]);
        }
        let whole = vs.split_off(memories.len());
        Ok(vs
            .into_iter()
            .zip(whole)
            .map(|((prompt, pt), (whole, wt))| Vectors {
                prompt,
                whole,
                tokens: pt.into_iter().chain(wt).collect(),
            })
            .collect())
    }

    /// The embedder, when the re-ranking stage is on and it gives token vectors: only then
    /// are token bits made, stored and read (with the stage off they cost nothing, and
    /// turning it on again gives the memories their bits when the book next opens).
    fn token_embedder(&self) -> Option<&EmbedHandle> {
        self.0
            .embedder
            .as_ref()
            .filter(|e| self.0.config.rerank_depth > 0 && e.supports_tokens())
    }

    /// Embeds texts as unit vectors, each with its token bits when the re-ranking stage is
    /// on and the embedder gives token vectors (empty vectors and no bits without an
    /// embedder).
    pub async fn embed_with_tokens(
        &self,
        texts: Vec<String>,
    ) -> Result<Vec<(Vec<f32>, Option<TokenBits>)>, BookError> {
        let Some(e) = self.token_embedder() else {
            return Ok(self
                .embed(texts)
                .await?
                .into_iter()
                .map(|v| (v, None))
                .collect());
        };
        let n = texts.len();
        let out = one_per_text(e.embed_tokens(texts).await, n)?;
        let dim = e.dim();
        Ok(out
            .into_iter()
            .map(|t| {
                let bits = TokenBits::from_rows(&t.tokens, dim);
                (unit(t.vector).unwrap_or_default(), Some(bits))
            })
            .collect())
    }

    /// Embeds texts as unit vectors (empty vectors without an embedder).
    pub async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, BookError> {
        match &self.0.embedder {
            Some(e) => {
                let n = texts.len();
                let vs = one_per_text(e.embed(texts).await, n)?;
                Ok(vs
                    .into_iter()
                    .map(|v| unit(v).unwrap_or_default())
                    .collect())
            }
            None => Ok(vec![Vec::new(); texts.len()]),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        // A panic while holding the lock leaves consistent maps (each update is a few
        // inserts), so a poisoned lock is still usable.
        self.0.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.0.state.write().unwrap_or_else(|p| p.into_inner())
    }

    fn trust_of(st: &State, author: &str) -> (f32, bool) {
        match st.trust.get(author) {
            Some(t) => (
                if t.trust.is_finite() {
                    t.trust.clamp(0.0, 4.0)
                } else {
                    1.0
                },
                t.ignored,
            ),
            None => (1.0, false),
        }
    }

    fn prior_of(st: &State, m: &Memory) -> f32 {
        let (trust, _) = Self::trust_of(st, &m.author);
        let (h, u) = st.feedback.get(&m.id).copied().unwrap_or((0, 0));
        quality(m.score) * trust * usefulness(h, u)
    }

    /// The vector the index stores for `emb` (a constant without an embedder: the fusion
    /// then ranks by BM25 alone, since the semantic weight is set to 0).
    fn index_vector(&self, emb: &[f32]) -> Vec<f32> {
        if self.0.embedder.is_none() || emb.len() != self.0.dim {
            let mut v = vec![0.0; self.0.dim];
            v[0] = 1.0;
            v
        } else {
            emb.to_vec()
        }
    }

    /// The duplicate of (`domain`, `norm`, `emb`) among indexed memories, if any.
    fn duplicate_locked(
        &self,
        st: &State,
        domain: &str,
        norm: &str,
        emb: &[f32],
    ) -> Option<String> {
        if let Some(id) = st.texts.get(&(domain.to_owned(), norm.to_owned())) {
            return Some(id.clone());
        }
        if emb.is_empty() || self.0.embedder.is_none() || self.0.config.duplicate_cosine > 1.0 {
            return None;
        }
        let pool = st.pools.get(domain)?;
        let opts = HybridOptions {
            semantic_weight: 1.0,
            lexical_weight: 0.0,
            prior: None,
        };
        let hit = pool.index.search("", emb, 1, &opts).into_iter().next()?;
        (hit.cosine >= self.0.config.duplicate_cosine)
            .then(|| {
                st.slots[hit.key as usize]
                    .as_ref()
                    .map(|s| s.memory.id.clone())
            })
            .flatten()
    }

    /// Indexes a memory (no duplicate check); parks it if its author is ignored.
    fn index_locked(&self, st: &mut State, mut memory: Memory, mut emb: Vectors) {
        if st.keys.contains_key(&memory.id) {
            return;
        }
        if let Some(&(h, u)) = st.feedback.get(&memory.id) {
            memory.helpful = h;
            memory.unhelpful = u;
        }
        if Self::trust_of(st, &memory.author).1 {
            st.parked.insert(memory.id.clone(), (memory, emb));
            return;
        }
        let key = st.slots.len() as u64;
        let mut vectors = vec![self.index_vector(&emb.prompt)];
        if self.0.embedder.is_some() && emb.whole.len() == self.0.dim {
            vectors.push(emb.whole.clone());
        }
        let dim = self.0.dim;
        let pool = st
            .pools
            .entry(memory.domain.clone())
            .or_insert_with(|| Pool {
                index: HybridIndex::new(dim),
            });
        if let Err(e) = pool
            .index
            .insert_passages(key, &index_text(&memory), vectors)
        {
            tracing::warn!(id = %memory.id, error = %e, "memory not indexable");
            return;
        }
        // The index keeps the token bits (unindexing hands them back).
        pool.index.set_tokens(key, std::mem::take(&mut emb.tokens));
        let norm = normalize_text(&memory.prompt);
        st.texts
            .entry((memory.domain.clone(), norm.clone()))
            .or_insert_with(|| memory.id.clone());
        st.keys.insert(memory.id.clone(), key);
        let prior = Self::prior_of(st, &memory);
        st.priors.push(prior);
        st.slots.push(Some(Slot {
            memory,
            vectors: emb,
            norm,
        }));
    }

    /// Removes an indexed memory from the index; returns it with its embedding.
    fn unindex_locked(st: &mut State, id: &str) -> Option<(Memory, Vectors)> {
        let key = st.keys.remove(id)?;
        let slot = st.slots.get_mut(key as usize)?.take()?;
        st.priors[key as usize] = 0.0;
        let mut vectors = slot.vectors;
        if let Some(pool) = st.pools.get_mut(&slot.memory.domain) {
            vectors.tokens = pool.index.take_tokens(key);
            pool.index.remove(key);
        }
        let tk = (slot.memory.domain.clone(), slot.norm.clone());
        if st.texts.get(&tk).is_some_and(|i| i == id) {
            st.texts.remove(&tk);
        }
        Some((slot.memory, vectors))
    }

    /// Adds a memory received or made here: skips known, forgotten and ignored ones and
    /// near-duplicates, otherwise stores it (durably) and indexes it. `embedding` is the
    /// prompt's (computed here when `None`).
    pub async fn insert(
        &self,
        memory: Memory,
        embedding: Option<Vec<f32>>,
    ) -> Result<Inserted, BookError> {
        let mut out = self.insert_many(vec![(memory, embedding)]).await?;
        Ok(out.pop().unwrap_or(Inserted::Ignored))
    }

    /// [`MemoryBook::insert`] for many memories: one embedding batch per 64 prompts and one
    /// store transaction group. Outcomes are in input order.
    pub async fn insert_many(
        &self,
        items: Vec<(Memory, Option<Vec<f32>>)>,
    ) -> Result<Vec<Inserted>, BookError> {
        self.insert_many_with(items.into_iter().map(|(m, e)| (m, e, None, None)).collect())
            .await
    }

    /// [`MemoryBook::insert_many`] with each memory's embeddings of its prompt and of its
    /// [`whole_text`], where known (computed here when `None`).
    pub async fn insert_many_with(
        &self,
        items: Vec<WithVectors>,
    ) -> Result<Vec<Inserted>, BookError> {
        let out = self.store_many(items).await?;
        self.announce(&out);
        Ok(out)
    }

    /// Announces added memories (once durable; nobody listening is fine).
    fn announce(&self, out: &[Inserted]) {
        for o in out {
            if let Inserted::Added(m) = o {
                let _ = self.0.added.send(m.clone());
            }
        }
    }

    /// Indexes and commits memories (see [`MemoryBook::insert_many_with`]) without
    /// announcing them.
    async fn store_many(&self, items: Vec<WithVectors>) -> Result<Vec<Inserted>, BookError> {
        let mut out: Vec<Option<Inserted>> = vec![None; items.len()];
        let mut todo: Vec<(usize, WithVectors)> = Vec::new();
        {
            let st = self.read();
            for (i, (m, e, w, b)) in items.into_iter().enumerate() {
                if st.keys.contains_key(&m.id) {
                    out[i] = Some(Inserted::Known(m.id));
                } else if st.forgotten.contains(&m.id)
                    || st.parked.contains_key(&m.id)
                    || Self::trust_of(&st, &m.author).1
                {
                    out[i] = Some(Inserted::Ignored);
                } else {
                    todo.push((i, (m, e, w, b)));
                }
            }
        }
        // Embeds what is not given: prompts, then whole texts, in batches; everything when
        // the embedder gives token vectors, whose bits no caller has.
        let wants_tokens = self.token_embedder().is_some();
        for chunk in todo.chunks_mut(EMBED_BATCH) {
            let tokens_missing: Vec<bool> = chunk
                .iter()
                .map(|(_, item)| wants_tokens && item.3.is_none())
                .collect();
            let prompts: Vec<usize> = (0..chunk.len())
                .filter(|&j| tokens_missing[j] || chunk[j].1 .1.is_none())
                .collect();
            let wholes: Vec<usize> = (0..chunk.len())
                .filter(|&j| tokens_missing[j] || chunk[j].1 .2.is_none())
                .collect();
            let mut texts: Vec<String> = prompts
                .iter()
                .map(|&j| chunk[j].1 .0.prompt.clone())
                .collect();
            texts.extend(wholes.iter().map(|&j| {
                let m = &chunk[j].1 .0;
                whole_text(&m.prompt, &m.answer)
            }));
            if texts.is_empty() {
                continue;
            }
            let mut vs = self.embed_with_tokens(texts).await?.into_iter();
            for (&j, whole) in prompts
                .iter()
                .map(|j| (j, false))
                .chain(wholes.iter().map(|j| (j, true)))
            {
                let (v, t) = vs.next().unwrap_or_default();
                let item = &mut chunk[j].1;
                if whole {
                    item.2.get_or_insert(v);
                } else {
                    item.1.get_or_insert(v);
                }
                if let (Some(t), true) = (t, tokens_missing[j]) {
                    // Prompts come first, so each memory's bags are (prompt, whole).
                    item.3.get_or_insert_with(Vec::new).push(t);
                }
            }
        }
        let model = self.model_id();
        let mut writes = Vec::new();
        {
            let mut st = self.write();
            for (i, (m, e, w, b)) in todo {
                let emb = e.and_then(unit).unwrap_or_default();
                let whole = w.and_then(unit).unwrap_or_default();
                if st.keys.contains_key(&m.id) {
                    out[i] = Some(Inserted::Known(m.id));
                    continue;
                }
                let norm = normalize_text(&m.prompt);
                if let Some(of) = self.duplicate_locked(&st, &m.domain, &norm, &emb) {
                    tracing::debug!(id = %m.id, of = %of, "near-duplicate memory not stored");
                    out[i] = Some(Inserted::Duplicate { of });
                    continue;
                }
                let vectors = Vectors {
                    prompt: emb,
                    whole,
                    tokens: b.unwrap_or_default(),
                };
                let record = MemoryRecord {
                    id: m.id.clone(),
                    domain: m.domain.clone(),
                    author: m.author.clone(),
                    score: f64::from(m.score),
                    created_at: m.created_at,
                    prompt: m.prompt.clone(),
                    answer: m.answer.clone(),
                    body: StoredBody::packed(m.source.clone(), &model, &vectors),
                    forgotten: false,
                };
                writes.push((i, self.0.store.insert_memory(&record)));
                // Indexed now so that a duplicate later in this batch is caught; taken out
                // again below if its write fails.
                self.index_locked(&mut st, m.clone(), vectors);
                out[i] = Some(Inserted::Added(m));
            }
        }
        // A memory is listed, announced and searchable only once its row is committed: a
        // failed write (a full disk) takes it out of the index again and fails the call.
        let mut failed = None;
        for (i, w) in writes {
            if let Err(e) = w.await {
                if let Some(Inserted::Added(m)) = out[i].take() {
                    Self::unindex_locked(&mut self.write(), &m.id);
                }
                out[i] = Some(Inserted::Ignored);
                failed.get_or_insert(e);
            }
        }
        if let Some(e) = failed {
            // What did commit stays and is announced.
            let added: Vec<Inserted> = out.into_iter().flatten().collect();
            self.announce(&added);
            return Err(e.into());
        }
        Ok(out
            .into_iter()
            .map(|o| o.unwrap_or(Inserted::Ignored))
            .collect())
    }

    /// Publishes a new memory authored here (a signed swarm record when the book has a
    /// swarm, a local memory otherwise) and indexes it. The caller has admitted it (see
    /// [`super::admission`]); a near-duplicate is detected before anything is published.
    pub async fn publish(
        &self,
        body: MemoryBody,
        embedding: Option<Vec<f32>>,
    ) -> Result<Inserted, BookError> {
        body.validate()?;
        let emb = match embedding {
            Some(e) => e,
            None => self
                .embed(vec![body.prompt.clone()])
                .await?
                .pop()
                .unwrap_or_default(),
        };
        if let Some(of) = self.duplicate_locked(
            &self.read(),
            &body.domain,
            &normalize_text(&body.prompt),
            &emb,
        ) {
            return Ok(Inserted::Duplicate { of });
        }
        // Signed first, committed here, and only then stored as a record and sent: a
        // memory that could not be written (a full disk) never reaches a peer.
        let (memory, record) = match &self.0.swarm {
            Some(swarm) => {
                let record = swarm
                    .sign(MEMORY_KIND, body.encode())
                    .map_err(|e| BookError::Publish(e.to_string()))?;
                let mut m =
                    Memory::from_body(record.id().to_string(), record.author().to_string(), body);
                m.created_at = record.timestamp_ms() as i64;
                (m, Some(record))
            }
            None => {
                let id: [u8; 32] = rand::random();
                (
                    Memory::from_body(hex_id(&id), self.0.me.clone(), body),
                    None,
                )
            }
        };
        let id = memory.id.clone();
        let inserted = self
            .store_many(vec![(memory, Some(emb), None, None)])
            .await?
            .pop()
            .unwrap_or(Inserted::Ignored);
        if let (Some(swarm), Some(record), Inserted::Added(_)) = (&self.0.swarm, record, &inserted)
        {
            if let Err(e) = swarm.publish_signed(&record).await {
                // Not stored as a record, so not sent: take the memory back out.
                Self::unindex_locked(&mut self.write(), &id);
                if let Err(d) = self.0.store.delete_memory(&id).await {
                    tracing::warn!(id = %id, error = %d, "cannot remove a memory whose record was not stored");
                }
                return Err(BookError::Publish(e.to_string()));
            }
        }
        self.announce(std::slice::from_ref(&inserted));
        Ok(inserted)
    }

    /// Rows of `ids` could not be decoded: those whose signed record the swarm holds are
    /// deleted, so that catching up with the swarm's records writes them again; the others
    /// stay as they are (skipped, with the store's warning) for their owner to forget.
    async fn rebuild_unreadable(&self, ids: &[String]) {
        if ids.is_empty() {
            return;
        }
        let Some(swarm) = &self.0.swarm else {
            return;
        };
        let held: HashSet<String> = match swarm.records(MEMORY_KIND) {
            Ok(all) => all.iter().map(|r| r.id().to_string()).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot list memory records to rebuild damaged rows");
                return;
            }
        };
        for id in ids.iter().filter(|id| held.contains(*id)) {
            match self.0.store.delete_memory(id).await {
                Ok(_) => {
                    tracing::warn!(id = %id, "damaged memory row will be rebuilt from its signed record")
                }
                Err(e) => tracing::warn!(id = %id, error = %e, "cannot remove damaged memory row"),
            }
        }
    }

    /// Ingests swarm records of kind `memory` (others and invalid ones are skipped, with a
    /// debug log). Returns how many were added.
    pub async fn ingest_records(&self, records: &[Record]) -> Result<usize, BookError> {
        let mut items = Vec::with_capacity(records.len());
        for r in records {
            if r.kind() != MEMORY_KIND {
                continue;
            }
            match MemoryBody::decode(r.body()) {
                Ok(body) => {
                    items.push((
                        Memory::from_body(r.id().to_string(), r.author().to_string(), body),
                        None,
                    ));
                }
                Err(e) => {
                    tracing::debug!(id = %r.id(), author = %r.author().short(), error = %e, "invalid memory record");
                }
            }
        }
        let outcomes = self.insert_many(items).await?;
        Ok(outcomes
            .iter()
            .filter(|o| matches!(o, Inserted::Added(_)))
            .count())
    }

    /// Memories stored from now on (made here or received from peers), each once, after
    /// it is durable. A subscriber that falls more than 1,024 behind sees `Lagged`.
    pub fn subscribe_added(&self) -> tokio::sync::broadcast::Receiver<Memory> {
        self.0.added.subscribe()
    }

    /// The `k` best memories of `domain` for `query` (embedded here), best first.
    pub async fn top_k(
        &self,
        domain: &str,
        query: &str,
        k: usize,
    ) -> Result<Vec<MemoryHit>, BookError> {
        let (emb, tokens) = self
            .embed_with_tokens(vec![query.to_owned()])
            .await?
            .pop()
            .unwrap_or_default();
        Ok(self.top_k_embedded(domain, query, &emb, tokens.as_ref(), k))
    }

    /// Worked examples for a prompt about to be answered: up to `k` memories of `domain`
    /// ranked by [`MemoryBook::top_k`] whose prompt has cosine >= `min_cosine` with `query`
    /// (an example about another subject makes a small model copy its facts). Retrieval
    /// failures are logged and give no examples: answering never waits on them.
    pub async fn examples_for(
        &self,
        domain: &str,
        query: &str,
        k: usize,
        min_cosine: f32,
    ) -> Vec<Memory> {
        if k == 0 || self.is_empty() || query.trim().is_empty() {
            return Vec::new();
        }
        match self.top_k(domain, query, k).await {
            Ok(hits) => hits
                .into_iter()
                .filter(|h| h.cosine >= min_cosine)
                .map(|h| h.memory)
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "memory retrieval failed; answering without examples");
                Vec::new()
            }
        }
    }

    /// [`MemoryBook::top_k`] with the query already embedded (`&[]`: by text only), with
    /// its token bits for the re-ranking stage (`None`: no re-ranking).
    pub fn top_k_embedded(
        &self,
        domain: &str,
        query: &str,
        query_embedding: &[f32],
        query_tokens: Option<&TokenBits>,
        k: usize,
    ) -> Vec<MemoryHit> {
        self.ranked(
            domain,
            query,
            query_embedding,
            query_tokens,
            k,
            true,
            RankOverrides::default(),
        )
    }

    /// Ranking core; `with_prior = false` ranks by relevance alone, `overrides` replace
    /// configured weights, and `query_tokens = None` skips the re-ranking stage (for
    /// evaluating each stage).
    #[allow(clippy::too_many_arguments)]
    pub fn ranked(
        &self,
        domain: &str,
        query: &str,
        query_embedding: &[f32],
        query_tokens: Option<&TokenBits>,
        k: usize,
        with_prior: bool,
        overrides: RankOverrides,
    ) -> Vec<MemoryHit> {
        let st = self.read();
        let Some(pool) = st.pools.get(domain) else {
            return Vec::new();
        };
        if k == 0 || pool.index.is_empty() {
            return Vec::new();
        }
        let q: &[f32] = if self.0.embedder.is_some() {
            query_embedding
        } else {
            &[]
        };
        let (semantic_weight, lexical_weight) = overrides
            .weights
            .unwrap_or((self.0.config.semantic_weight, self.0.config.lexical_weight));
        let neighbour_weight = overrides
            .neighbour_weight
            .unwrap_or(self.0.config.neighbour_weight);
        let semantic_weight = if self.0.embedder.is_some() {
            semantic_weight
        } else {
            0.0
        };
        let cap = ((k as f32 * self.0.config.max_author_share).ceil() as usize).max(1);
        let depth = self.0.config.rerank_depth;
        let fetch = (k * 4 + 8).max(depth);
        let mut taken: Vec<crate::search::Hit> = Vec::new();
        let mut overflow: Vec<crate::search::Hit> = Vec::new();
        let mut per_author: HashMap<&str, usize> = HashMap::new();
        let mut excluded_keys: HashSet<u64> = HashSet::new();
        let mut capped: HashSet<&str> = HashSet::new();
        let slots = &st.slots;
        let priors = &st.priors;
        let author_of = |key: u64| -> &str {
            slots[key as usize]
                .as_ref()
                .map_or("", |s| s.memory.author.as_str())
        };
        // Each pass either fills the top-k, exhausts the index, or caps one more author, so
        // k + 1 passes always suffice.
        for _ in 0..=k {
            let prior = |key: u64| -> f32 {
                // The sets are empty on the first pass, which is usually the only one: the
                // checks then cost nothing (looking up the author is a cache miss per entry).
                if (!excluded_keys.is_empty() && excluded_keys.contains(&key))
                    || (!capped.is_empty() && capped.contains(author_of(key)))
                {
                    return 0.0;
                }
                if with_prior {
                    priors.get(key as usize).copied().unwrap_or(0.0)
                } else {
                    1.0
                }
            };
            let opts = HybridOptions {
                semantic_weight,
                lexical_weight,
                prior: Some(&prior),
            };
            let mut hits = pool.index.search(query, q, fetch, &opts);
            if let Some(t) = query_tokens {
                pool.index
                    .rerank_late(&mut hits, t, depth, Some(&prior), neighbour_weight);
            }
            let exhausted = hits.len() < fetch;
            let mut newly_capped = Vec::new();
            for h in hits {
                if h.score <= 0.0 || excluded_keys.contains(&h.key) {
                    continue;
                }
                let author = author_of(h.key);
                if capped.contains(author) || newly_capped.contains(&author) {
                    overflow.push(h);
                    excluded_keys.insert(h.key);
                    continue;
                }
                let n = per_author.entry(author).or_insert(0);
                if *n >= cap {
                    newly_capped.push(author);
                    overflow.push(h);
                } else {
                    *n += 1;
                    taken.push(h);
                }
                excluded_keys.insert(h.key);
                if taken.len() == k {
                    break;
                }
            }
            if taken.len() >= k || exhausted || newly_capped.is_empty() {
                break;
            }
            capped.extend(newly_capped);
        }
        // No other author has anything relevant: fill with the capped authors' best.
        if taken.len() < k {
            overflow.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.key.cmp(&b.key)));
            let need = k - taken.len();
            taken.extend(overflow.into_iter().take(need));
        }
        taken.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.key.cmp(&b.key)));
        taken
            .into_iter()
            .filter_map(|h| {
                slots[h.key as usize].as_ref().map(|s| MemoryHit {
                    memory: s.memory.clone(),
                    score: h.score,
                    cosine: h.cosine,
                    bm25: h.bm25,
                })
            })
            .collect()
    }

    /// Records whether a retrieved memory helped the final result (adjusts its prior; see
    /// the module docs). Persisted.
    pub async fn feedback(&self, id: &str, helpful: bool) -> Result<Memory, BookError> {
        let (memory, json) = {
            let mut st = self.write();
            let key = *st
                .keys
                .get(id)
                .ok_or_else(|| BookError::NotFound(id.to_owned()))?;
            let counts = st.feedback.entry(id.to_owned()).or_insert((0, 0));
            if helpful {
                counts.0 = counts.0.saturating_add(1);
            } else {
                counts.1 = counts.1.saturating_add(1);
            }
            let (h, u) = *counts;
            let memory = {
                let Some(slot) = st.slots[key as usize].as_mut() else {
                    return Err(BookError::NotFound(id.to_owned()));
                };
                slot.memory.helpful = h;
                slot.memory.unhelpful = u;
                slot.memory.clone()
            };
            st.priors[key as usize] = Self::prior_of(&st, &memory);
            let json = serde_json::to_string(&st.feedback).unwrap_or_default();
            (memory, json)
        };
        self.0.store.kv_set(FEEDBACK_KEY, &json).await?;
        Ok(memory)
    }

    /// Sets the local trust in `author` (weight and ignore flag), persisted. Ignoring an
    /// author takes all its memories out of retrieval; un-ignoring puts them back.
    pub async fn set_trust(
        &self,
        author: &str,
        trust: f32,
        ignored: bool,
    ) -> Result<(), BookError> {
        let entry = AuthorTrust {
            author: author.to_owned(),
            trust: if trust.is_finite() {
                trust.clamp(0.0, 4.0)
            } else {
                1.0
            },
            ignored,
        };
        self.0.store.set_author_trust(&entry).await?;
        let mut st = self.write();
        st.trust.insert(author.to_owned(), entry);
        if ignored {
            let ids: Vec<String> = st
                .slots
                .iter()
                .flatten()
                .filter(|s| s.memory.author == author)
                .map(|s| s.memory.id.clone())
                .collect();
            for id in ids {
                if let Some(m) = Self::unindex_locked(&mut st, &id) {
                    st.parked.insert(id, m);
                }
            }
        } else {
            let ids: Vec<String> = st
                .parked
                .iter()
                .filter(|(_, (m, _))| m.author == author)
                .map(|(id, _)| id.clone())
                .collect();
            for id in ids {
                if let Some((m, e)) = st.parked.remove(&id) {
                    self.index_locked(&mut st, m, e);
                }
            }
            let keys: Vec<u64> = st
                .slots
                .iter()
                .enumerate()
                .filter_map(|(i, s)| {
                    s.as_ref()
                        .filter(|s| s.memory.author == author)
                        .map(|_| i as u64)
                })
                .collect();
            for key in keys {
                let p = st.slots[key as usize]
                    .as_ref()
                    .map(|s| Self::prior_of(&st, &s.memory))
                    .unwrap_or(0.0);
                st.priors[key as usize] = p;
            }
        }
        Ok(())
    }

    /// Every trust entry set here.
    pub fn trusts(&self) -> Vec<AuthorTrust> {
        let mut v: Vec<AuthorTrust> = self.read().trust.values().cloned().collect();
        v.sort_by(|a, b| a.author.cmp(&b.author));
        v
    }

    /// Forgets one memory: hidden from retrieval for good (also when the swarm delivers it
    /// again). Returns whether it was known.
    pub async fn forget(&self, id: &str) -> Result<bool, BookError> {
        let known = self.0.store.set_memory_forgotten(id, true).await?;
        let mut st = self.write();
        let was = Self::unindex_locked(&mut st, id).is_some() || st.parked.remove(id).is_some();
        st.forgotten.insert(id.to_owned());
        Ok(known || was)
    }

    /// Forgets everything from `author` and ignores what it sends from now on. Returns how
    /// many memories were deleted.
    pub async fn forget_author(&self, author: &str) -> Result<u64, BookError> {
        let trust = self.read().trust.get(author).map_or(1.0, |t| t.trust);
        self.set_trust(author, trust, true).await?;
        let n = self.0.store.delete_memories_by_author(author).await?;
        self.write().parked.retain(|_, (m, _)| m.author != author);
        Ok(n)
    }

    /// Follows the swarm: ingests every stored memory record now, then each one as it
    /// arrives (in batches), until `cancel` fires. The caller runs (and owns) the task.
    pub fn follow(
        &self,
        swarm: Swarm,
        cancel: tokio_util::sync::CancellationToken,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let book = self.clone();
        async move { super::sync::follow(book, swarm, cancel).await }
    }

    /// A new memory body authored now.
    pub fn body(
        domain: &str,
        prompt: &str,
        answer: &str,
        source: Option<String>,
        score: f32,
    ) -> MemoryBody {
        MemoryBody {
            v: super::record::MEMORY_VERSION,
            domain: domain.to_owned(),
            prompt: prompt.to_owned(),
            answer: answer.to_owned(),
            source,
            score,
            created_at: now_ms(),
        }
    }

    /// The domain's profile: the prompt embeddings of `domain`'s memories averaged per
    /// author, so that every author weighs the same however many memories it sent (a peer
    /// flooding a domain with 60 memories counts as one voice).
    /// Ignored authors are left out. `None` without an embedder or when the domain has no
    /// memories.
    pub fn domain_profile(&self, domain: &str) -> Option<DomainProfile> {
        self.0.embedder.as_ref()?;
        let st = self.read();
        let mut per_author: HashMap<&str, (Vec<f32>, usize)> = HashMap::new();
        for s in st.slots.iter().flatten() {
            let m = &s.memory;
            let ignored = st.trust.get(&m.author).is_some_and(|t| t.ignored);
            if m.domain == domain && s.vectors.prompt.len() == self.0.dim && !ignored {
                let (sum, n) = per_author
                    .entry(m.author.as_str())
                    .or_insert_with(|| (vec![0.0f32; self.0.dim], 0));
                sum.iter_mut()
                    .zip(&s.vectors.prompt)
                    .for_each(|(a, b)| *a += b);
                *n += 1;
            }
        }
        if per_author.is_empty() {
            return None;
        }
        let mut sum = vec![0.0f32; self.0.dim];
        let mut means = Vec::with_capacity(per_author.len());
        for (author_sum, n) in per_author.values() {
            let mean: Vec<f32> = author_sum.iter().map(|x| x / *n as f32).collect();
            sum.iter_mut().zip(&mean).for_each(|(a, b)| *a += b);
            means.push(mean);
        }
        Some(DomainProfile {
            sum,
            means,
            memories: per_author.values().map(|(_, n)| n).sum(),
            authors: per_author.len(),
            only_me: per_author.len() == 1 && per_author.contains_key(self.0.me.as_str()),
        })
    }

    /// Cosine of two unit vectors (0 when either is empty).
    pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
        if a.is_empty() || a.len() != b.len() {
            0.0
        } else {
            dot(a, b)
        }
    }
}

/// A domain's prompt profile (see [`MemoryBook::domain_profile`]).
#[derive(Debug, Clone, PartialEq)]
pub struct DomainProfile {
    /// Sum over authors of each author's mean prompt embedding: its direction is the
    /// domain's centroid, and `v · sum / authors` is a unit vector's mean cosine with the
    /// authors' prompts.
    pub sum: Vec<f32>,
    /// Each author's mean prompt embedding (not normalised).
    pub means: Vec<Vec<f32>>,
    /// Memories counted.
    pub memories: usize,
    /// Distinct authors counted.
    pub authors: usize,
    /// Whether this node wrote every one of them.
    pub only_me: bool,
}

fn hex_id(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Worked examples for a prompt, from retrieved memories (empty string for none).
pub fn format_examples(memories: &[Memory]) -> String {
    if memories.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "Here are worked examples of similar requests and good answers. Follow their format and approach.\n",
    );
    for (i, m) in memories.iter().enumerate() {
        out.push_str(&format!(
            "\nExample {}:\nRequest: {}\nAnswer: {}\n",
            i + 1,
            m.prompt.trim(),
            m.answer.trim()
        ));
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn token_bags_round_trip_and_bad_ones_are_refused() {
        let rows: Vec<f32> = (0..5 * 8).map(|i| (i % 3) as f32 - 1.0).collect();
        let bags = vec![
            TokenBits::from_rows(&rows[..16], 8),
            TokenBits::from_rows(&rows, 8),
        ];
        let packed = pack_tokens(&bags);
        assert_eq!(unpack_tokens(&packed, 8), Some(bags.clone()));
        assert_eq!(unpack_tokens(&pack_tokens(&[]), 8), Some(Vec::new()));
        // Another model's dimension, not base64, a length running past the end.
        assert_eq!(unpack_tokens(&packed, 16), None);
        assert_eq!(unpack_tokens("not base64!", 8), None);
        let mut bytes = base64::engine::general_purpose::STANDARD
            .decode(&packed)
            .unwrap();
        bytes[0] = 0xff;
        let long = base64::engine::general_purpose::STANDARD.encode(bytes);
        assert_eq!(unpack_tokens(&long, 8), None);
    }
}
