//! Starling's evaluations, kept out of the product binary: the benchmarks behind
//! `starling eval …` (the `starling-eval` executable, which `starling eval` runs).
//!
//! - [`swarm_qa`]: multi-node question answering, every scenario a swarm of real nodes.
//! - [`team_formation`], [`formation_loop`], [`synth`]: agent search on team-formation
//!   benchmarks (IoA's format, below) and a seeded synthetic generator.
//! - [`memory`], [`admission`], [`format`]: memory retrieval, admission and worked-example
//!   formatting.
//! - [`cli`]: the command line.
//!
//! Team-formation files are JSON Lines, one task per line:
//!
//! ```text
//! {"task_id": "...", "task_description": "...",
//!  "agents": [{"agent_name": "...", "agent_type": "...", "agent_description": "..."}]}
//! ```
//!
//! The agents of a line are that task's gold team; the registry searched is the union of the
//! agents of all lines (by name).

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod admission;
pub mod cli;
pub mod format;
pub mod formation_loop;
pub mod memory;
pub mod memory_cmd;
pub mod swarm_qa;
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
