//! Shared memories (after INMS): prompt–answer pairs from finished work, admitted by the
//! node's LLM against a per-domain rubric, published as signed swarm records, and retrieved
//! as worked examples before the node's LLM answers.
//!
//! - [`record`]: the wire body of a memory record, its limits and validation.
//! - [`book`]: [`MemoryBook`], the indexed, persisted pool with trust, feedback and
//!   flood-resistant ranking.
//! - [`admission`]: deterministic pre-checks and the LLM rubric score.
//! - [`sync`]: feeding the book from the swarm.
//! - [`api_types`]: the JSON types of the `/api/memories` routes (served by
//!   [`crate::api::memories`]).

pub mod admission;
pub mod api_types;
pub mod book;
pub mod record;
pub mod sync;

pub use admission::{admit, score_pair, AdmissionConfig, Admitted, Pair, Rejection};
pub use book::{
    format_examples, BookConfig, BookError, DomainProfile, Inserted, MemoryBook, MemoryHit,
    RankOverrides, WithVectors,
};
pub use record::{Memory, MemoryBody, MemoryError, DEFAULT_DOMAIN, MEMORY_KIND, MEMORY_VERSION};
