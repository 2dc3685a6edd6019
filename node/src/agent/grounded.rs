//! Grounded answers: a task's result is a short answer built from spans copied out of cited
//! evidence, never free text of the small model.

use serde::{Deserialize, Serialize};

/// Where a fact used in an answer comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Citation {
    /// Name of the node that holds the evidence.
    pub node: String,
    /// Its node id.
    pub node_id: String,
    /// The document (file name relative to the node's document folder), or `calculator`.
    pub document: String,
    /// The evidence, verbatim (a sentence, or a table row with its column names).
    pub quote: String,
}

/// How far a task's answer goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AnswerStatus {
    /// Every part of the question is answered from cited evidence.
    Answered,
    /// Some parts are answered, others are not known to the swarm.
    Partial,
    /// Nothing the swarm holds answers the question.
    #[default]
    Unknown,
}
