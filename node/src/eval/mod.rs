//! Offline evaluations of the node's components.
//!
//! - [`synth`]: a seeded generator of synthetic team-formation benchmarks.
//! - [`team_formation`]: loads such a benchmark (or any file in the same format) and scores a
//!   ranking of the agent registry against each task's gold team.
//! - [`formation_loop`]: runs the node's real LLM team-formation loop against the registry
//!   and scores the teams it launches.
//!
//! The benchmark format is JSON Lines, one task per line:
//!
//! ```text
//! {"task_id": "...", "task_description": "...",
//!  "agents": [{"agent_name": "...", "agent_type": "...", "agent_description": "..."}]}
//! ```
//!
//! The agents of a line are that task's gold team; the registry searched is the union of the
//! agents of all lines (by name).

pub mod formation_loop;
pub mod synth;
pub mod team_formation;

use serde::{Deserialize, Serialize};

/// One agent card as it appears in a benchmark file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentRecord {
    /// Unique name of the agent.
    pub agent_name: String,
    /// Kind of agent (e.g. "tool agent", "human proxy").
    pub agent_type: String,
    /// Free-text description of what the agent does.
    pub agent_description: String,
}

/// One line of a benchmark file: a task and its gold team.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// Identifier of the task.
    pub task_id: String,
    /// What has to be done, in natural language (the search query).
    pub task_description: String,
    /// The agents the task needs (its gold team).
    pub agents: Vec<AgentRecord>,
}
