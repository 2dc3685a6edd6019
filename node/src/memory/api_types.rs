//! JSON types of the `/api/memories` routes (shared by the server and the CLI).

use serde::{Deserialize, Serialize};

use super::record::Memory;

/// `GET /api/memories` query: a search with `q`, a listing without.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MemoryQuery {
    /// Search text (omit to list).
    #[serde(default)]
    pub q: Option<String>,
    /// Only this domain (search: default `general`).
    #[serde(default)]
    pub domain: Option<String>,
    /// Only this author (listing only).
    #[serde(default)]
    pub author: Option<String>,
    /// At most this many (default 3 for a search, 100 for a listing).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// One memory in an answer, with its score when it comes from a search.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryView {
    /// The memory (author included).
    #[serde(flatten)]
    pub memory: Memory,
    /// Search score (relevance x prior), for search results.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_score: Option<f32>,
}

/// `GET /api/memories` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryList {
    /// The memories, best (search) or newest (listing) first.
    pub memories: Vec<MemoryView>,
}

/// `POST /api/memories` body: a manual add (checked, not LLM-scored).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddMemoryRequest {
    /// Domain pool (default `general`).
    #[serde(default)]
    pub domain: Option<String>,
    /// The prompt.
    pub prompt: String,
    /// The answer.
    pub answer: String,
    /// Task or group id it came from.
    #[serde(default)]
    pub source: Option<String>,
    /// Quality score 0..10 (default 8).
    #[serde(default)]
    pub score: Option<f32>,
}

/// `POST /api/memories` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AddMemoryResponse {
    /// Whether it was kept.
    pub added: bool,
    /// The kept memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    /// Why it was not kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected: Option<String>,
}

/// `DELETE /api/memories` query: exactly one of `author` and `id`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ForgetQuery {
    /// Forget everything by this author and ignore it from now on.
    #[serde(default)]
    pub author: Option<String>,
    /// Forget this memory.
    #[serde(default)]
    pub id: Option<String>,
}

/// `DELETE /api/memories` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForgetResponse {
    /// Memories deleted or hidden.
    pub forgotten: u64,
}

/// `POST /api/memories/{id}/feedback` body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeedbackRequest {
    /// Whether the memory helped the final result.
    pub helpful: bool,
}

/// `POST /api/memories/trust` body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrustRequest {
    /// The author's node id.
    pub author: String,
    /// Trust weight (1 = neutral, 0..4).
    #[serde(default = "one")]
    pub trust: f32,
    /// Ignore everything from this author.
    #[serde(default)]
    pub ignored: bool,
}

fn one() -> f32 {
    1.0
}
