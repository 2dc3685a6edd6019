//! The memory record: its wire body (what is signed and replicated), its validation, and the
//! node-internal [`Memory`] built from it.
//!
//! A memory travels as a signed swarm record of kind [`MEMORY_KIND`] whose body is the JSON
//! of [`MemoryBody`]. The author is the record's author (the signing node), never a field of
//! the body, so it cannot be forged. Everything in the body comes from the network and is
//! checked by [`MemoryBody::validate`] before it is stored or indexed.

use serde::{Deserialize, Serialize};

/// Record kind tag of a memory.
pub const MEMORY_KIND: &str = "memory";
/// Wire version of [`MemoryBody`].
pub const MEMORY_VERSION: u16 = 1;
/// Longest accepted prompt, in bytes.
pub const MAX_PROMPT_BYTES: usize = 8 * 1024;
/// Longest accepted answer, in bytes.
pub const MAX_ANSWER_BYTES: usize = 16 * 1024;
/// Longest accepted domain name, in bytes.
pub const MAX_DOMAIN_BYTES: usize = 64;
/// Longest accepted source id, in bytes.
pub const MAX_SOURCE_BYTES: usize = 128;
/// Highest admission score (scores are on a 0..=10 scale).
pub const MAX_SCORE: f32 = 10.0;
/// The pool used when none is named.
pub const DEFAULT_DOMAIN: &str = "general";

/// Why a memory was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MemoryError {
    /// The body is not JSON of the expected shape.
    #[error("malformed memory body: {0}")]
    Malformed(String),
    /// A body from a newer protocol.
    #[error("memory body version {0} is not supported (this node speaks {MEMORY_VERSION})")]
    Version(u16),
    /// The domain is empty, too long, or has characters other than `a-z 0-9 - _ .`.
    #[error("invalid domain {0:?}: use 1-64 characters from a-z, 0-9, '-', '_', '.'")]
    Domain(String),
    /// A text field is empty (after trimming).
    #[error("the {0} is empty")]
    Empty(&'static str),
    /// A text field is longer than its limit.
    #[error("the {field} has {len} bytes, more than the limit of {limit}")]
    TooLong {
        /// Which field.
        field: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The score is not a number in 0..=10.
    #[error("score {0} is not in 0..=10")]
    Score(f32),
}

/// The signed, replicated body of a memory record (wire type, JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryBody {
    /// Wire version ([`MEMORY_VERSION`]).
    pub v: u16,
    /// The domain pool.
    pub domain: String,
    /// The prompt (task or question).
    pub prompt: String,
    /// The answer that was kept.
    pub answer: String,
    /// Where the pair came from (task or group id), if anywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The author's admission score, 0..=10 (claimed by the author; receivers weigh it by
    /// their trust in the author).
    pub score: f32,
    /// When the pair was made (Unix ms).
    pub created_at: i64,
}

impl MemoryBody {
    /// Parses and validates a record body.
    pub fn decode(bytes: &[u8]) -> Result<Self, MemoryError> {
        let body: Self =
            serde_json::from_slice(bytes).map_err(|e| MemoryError::Malformed(e.to_string()))?;
        body.validate()?;
        Ok(body)
    }

    /// The record body bytes.
    pub fn encode(&self) -> Vec<u8> {
        // A struct of strings and numbers always serialises.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Checks every field against the limits.
    pub fn validate(&self) -> Result<(), MemoryError> {
        if self.v != MEMORY_VERSION {
            return Err(MemoryError::Version(self.v));
        }
        validate_domain(&self.domain)?;
        check_text("prompt", &self.prompt, MAX_PROMPT_BYTES)?;
        check_text("answer", &self.answer, MAX_ANSWER_BYTES)?;
        if let Some(s) = &self.source {
            if s.len() > MAX_SOURCE_BYTES {
                return Err(MemoryError::TooLong {
                    field: "source",
                    len: s.len(),
                    limit: MAX_SOURCE_BYTES,
                });
            }
        }
        if !self.score.is_finite() || !(0.0..=MAX_SCORE).contains(&self.score) {
            return Err(MemoryError::Score(self.score));
        }
        Ok(())
    }
}

/// Checks a domain name.
pub fn validate_domain(domain: &str) -> Result<(), MemoryError> {
    let ok = !domain.is_empty()
        && domain.len() <= MAX_DOMAIN_BYTES
        && domain
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(MemoryError::Domain(domain.to_owned()))
    }
}

fn check_text(field: &'static str, text: &str, limit: usize) -> Result<(), MemoryError> {
    if text.trim().is_empty() {
        return Err(MemoryError::Empty(field));
    }
    if text.len() > limit {
        return Err(MemoryError::TooLong {
            field,
            len: text.len(),
            limit,
        });
    }
    Ok(())
}

/// A memory as the node uses it: the body plus provenance and local feedback.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Memory {
    /// Record id (hex).
    pub id: String,
    /// Author node id (the record's signer).
    pub author: String,
    /// The domain pool.
    pub domain: String,
    /// The prompt.
    pub prompt: String,
    /// The answer.
    pub answer: String,
    /// Task or group id it came from.
    pub source: Option<String>,
    /// Admission score, 0..=10.
    pub score: f32,
    /// Creation time (Unix ms).
    pub created_at: i64,
    /// Times it was reported helpful here.
    pub helpful: u32,
    /// Times it was reported unhelpful here.
    pub unhelpful: u32,
}

impl Memory {
    /// A memory from a validated body and its record's id and author.
    pub fn from_body(id: String, author: String, body: MemoryBody) -> Self {
        Self {
            id,
            author,
            domain: body.domain,
            prompt: body.prompt,
            answer: body.answer,
            source: body.source,
            score: body.score,
            created_at: body.created_at,
            helpful: 0,
            unhelpful: 0,
        }
    }
}

/// Text normalised for duplicate detection: lowercase alphanumeric words separated by one
/// space (punctuation and spacing differences do not count).
pub fn normalize_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for word in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        if !out.is_empty() {
            out.push(' ');
        }
        out.extend(word.chars().flat_map(char::to_lowercase));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body() -> MemoryBody {
        MemoryBody {
            v: MEMORY_VERSION,
            domain: "math".into(),
            prompt: "What is 2 + 2?".into(),
            answer: "4".into(),
            source: Some("task-1".into()),
            score: 8.0,
            created_at: 1,
        }
    }

    #[test]
    fn round_trip_and_limits() {
        let b = body();
        assert_eq!(MemoryBody::decode(&b.encode()).unwrap(), b);
        let mut long = body();
        long.prompt = "x".repeat(MAX_PROMPT_BYTES + 1);
        assert!(matches!(
            MemoryBody::decode(&long.encode()),
            Err(MemoryError::TooLong {
                field: "prompt",
                ..
            })
        ));
        let mut empty = body();
        empty.answer = "  \n".into();
        assert_eq!(empty.validate(), Err(MemoryError::Empty("answer")));
        let mut bad = body();
        bad.domain = "Math!".into();
        assert!(matches!(bad.validate(), Err(MemoryError::Domain(_))));
        let mut score = body();
        score.score = f32::NAN;
        assert!(matches!(score.validate(), Err(MemoryError::Score(_))));
        score.score = 11.0;
        assert!(matches!(score.validate(), Err(MemoryError::Score(_))));
        assert!(matches!(
            MemoryBody::decode(b"{\"v\":1}"),
            Err(MemoryError::Malformed(_))
        ));
        let mut newer = body();
        newer.v = 2;
        assert_eq!(newer.validate(), Err(MemoryError::Version(2)));
    }

    #[test]
    fn normalisation_ignores_case_spacing_and_punctuation() {
        assert_eq!(
            normalize_text("  What IS 2+2?\n"),
            normalize_text("what is 2 + 2")
        );
        assert_ne!(normalize_text("2+2"), normalize_text("2+3"));
    }
}
