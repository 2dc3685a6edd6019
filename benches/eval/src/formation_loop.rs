//! `starling eval team-formation --full`: the node's real LLM team-formation loop
//! ([`form_team`]) run against an offline registry, scored against each task's gold team.
//!
//! # Metrics (per task, then averaged over tasks unless said otherwise)
//!
//! - `gold_recruited`: share of the gold team that the launched group contains.
//! - `precision`: share of recruits that are gold, over all recruits of all tasks (a task
//!   whose model worked alone adds no recruit).
//! - `team_size`: number of recruits (this node excluded).
//! - `tool_calls`: calls the model made (searches plus the final launch).
//! - `gold_seen`: share of the gold team that appeared among the candidates the searches
//!   showed the model (an upper bound on what it could recruit).

use std::sync::Mutex;

use serde::Serialize;
use starling_models::embed::Embedder;

use crate::team_formation::{agent_card, card_index_text, Dataset, EvalError};
use crate::AgentRecord;
use starling_node::agent::card::{CardHit, KnownCard};
use starling_node::agent::formation::{form_team, AgentSearch, FormationConfig, ToolCall};
use starling_node::llm::{Llm, LlmError};
use starling_node::search::{HybridIndex, HybridOptions};

/// The registry of a benchmark behind the [`AgentSearch`] the formation loop uses: the
/// same hybrid index as the node's card book, with each query embedded by `E`. Agent `i`
/// of the registry appears with node id `i`.
pub struct RegistrySearch<'a, E> {
    registry: &'a [AgentRecord],
    index: HybridIndex,
    embedder: Mutex<E>,
}

impl<E: Embedder> std::fmt::Debug for RegistrySearch<'_, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistrySearch")
            .field("agents", &self.registry.len())
            .finish()
    }
}

impl<'a, E: Embedder> RegistrySearch<'a, E> {
    /// Indexes `registry` with `card_vectors` (the passages' embeddings of each agent, from
    /// `embedder`).
    pub fn new(
        registry: &'a [AgentRecord],
        card_vectors: &[Vec<Vec<f32>>],
        embedder: E,
    ) -> Result<Self, EvalError> {
        if card_vectors.len() != registry.len() {
            return Err(EvalError::VectorCount {
                expected: registry.len(),
                got: card_vectors.len(),
            });
        }
        let mut index = HybridIndex::new(embedder.dim());
        for (i, (agent, v)) in registry.iter().zip(card_vectors).enumerate() {
            index.insert_passages(i as u64, &card_index_text(agent), v.clone())?;
        }
        Ok(Self {
            registry,
            index,
            embedder: Mutex::new(embedder),
        })
    }

    fn hits(&self, query: &str, k: usize) -> Vec<CardHit> {
        // As a node searches (`Agent::search_cards`): a query of several sentences is
        // searched whole and sentence by sentence.
        let sentences = starling_node::search::query_parts(query);
        let mut texts = vec![query];
        texts.extend(sentences.iter().map(String::as_str));
        let mut vectors = {
            let embedder = match self.embedder.lock() {
                Ok(e) => e,
                Err(poisoned) => poisoned.into_inner(),
            };
            match embedder.embed(&texts) {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot embed the query; searching by text only");
                    Vec::new()
                }
            }
        }
        .into_iter();
        let embedding = vectors.next().unwrap_or_default();
        let part_vectors: Vec<Vec<f32>> = vectors.collect();
        let parts: Vec<(&str, &[f32])> = texts[1..]
            .iter()
            .enumerate()
            .map(|(i, t)| (*t, part_vectors.get(i).map_or(&[][..], Vec::as_slice)))
            .collect();
        self.index
            .search_with_parts(query, &embedding, &parts, k, &HybridOptions::default())
            .into_iter()
            .filter_map(|h| {
                let agent = self.registry.get(h.key as usize)?;
                Some(CardHit {
                    card: KnownCard {
                        node_id: h.key.to_string(),
                        published_ms: 0,
                        card: agent_card(agent),
                    },
                    score: h.score,
                    bm25: h.bm25,
                    cosine: h.cosine,
                })
            })
            .collect()
    }
}

impl<E: Embedder> AgentSearch for RegistrySearch<'_, E> {
    async fn search(&self, query: &str, k: usize) -> Vec<CardHit> {
        self.hits(query, k)
    }
}

/// Node id the evaluating node uses for itself (matches no registry agent).
const SELF_ID: &str = "evaluator";

/// What the loop did on one task.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TaskOutcome {
    /// The task.
    pub task_id: String,
    /// Gold team size.
    pub gold: usize,
    /// Recruits (registry names).
    pub recruits: Vec<String>,
    /// Recruits that are gold.
    pub correct: usize,
    /// Gold agents shown to the model as candidates.
    pub gold_seen: usize,
    /// Tool calls made.
    pub tool_calls: usize,
    /// Whether the launch was forced by the call limit.
    pub forced: bool,
    /// Queries the model searched for.
    pub queries: Vec<String>,
}

/// Results of [`evaluate_formation`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FormationReport {
    /// Tasks run.
    pub tasks: usize,
    /// Mean share of the gold team recruited.
    pub gold_recruited: f64,
    /// Share of all recruits that are gold.
    pub precision: f64,
    /// Mean number of recruits.
    pub team_size: f64,
    /// Mean tool calls.
    pub tool_calls: f64,
    /// Mean share of the gold team shown as candidates.
    pub gold_seen: f64,
    /// Share of tasks where the model launched with nobody (worked alone).
    pub alone: f64,
    /// Share of tasks where launch was forced by the call limit.
    pub forced: f64,
    /// Prompt tokens processed, per task.
    pub prompt_tokens: f64,
    /// Tokens generated, per task.
    pub completion_tokens: f64,
    /// Mean wall time per task, in seconds.
    pub seconds: f64,
    /// Per task.
    pub outcomes: Vec<TaskOutcome>,
}

/// Runs [`form_team`] on the first `limit` tasks of `dataset` and scores the teams.
/// `progress` is called after each task with its index and outcome.
pub async fn evaluate_formation<S: AgentSearch + Sync>(
    dataset: &Dataset,
    llm: &Llm,
    search: &S,
    limit: usize,
    config: &FormationConfig,
    mut progress: impl FnMut(usize, &TaskOutcome),
) -> Result<FormationReport, LlmError> {
    let (prompt0, completion0, _) = llm.counters().snapshot();
    let start = std::time::Instant::now();
    let mut outcomes = Vec::new();
    for (i, task) in dataset.tasks.iter().take(limit).enumerate() {
        let formation = form_team(llm, search, &task.description, SELF_ID, &[], config).await?;
        let is_gold = |node_id: &str| {
            node_id
                .parse::<usize>()
                .is_ok_and(|index| task.gold.contains(&index))
        };
        let correct = formation
            .members
            .iter()
            .filter(|m| is_gold(&m.node_id))
            .count();
        let gold_seen = formation
            .candidates
            .iter()
            .filter(|(_, r)| is_gold(&r.node_id))
            .count();
        let queries = formation
            .calls
            .iter()
            .flat_map(|c| match c {
                ToolCall::SearchAgents { queries } => queries.clone(),
                ToolCall::LaunchGroup { .. } => Vec::new(),
            })
            .collect();
        let outcome = TaskOutcome {
            task_id: task.id.clone(),
            gold: task.gold.len(),
            recruits: formation.members.iter().map(|m| m.name.clone()).collect(),
            correct,
            gold_seen,
            tool_calls: formation.calls.len(),
            forced: formation.forced,
            queries,
        };
        progress(i, &outcome);
        outcomes.push(outcome);
    }
    let (prompt1, completion1, _) = llm.counters().snapshot();
    Ok(summarize(
        outcomes,
        prompt1 - prompt0,
        completion1 - completion0,
        start.elapsed().as_secs_f64(),
    ))
}

fn summarize(
    outcomes: Vec<TaskOutcome>,
    prompt_tokens: u64,
    completion_tokens: u64,
    seconds: f64,
) -> FormationReport {
    let n = outcomes.len().max(1) as f64;
    let mean = |f: &dyn Fn(&TaskOutcome) -> f64| outcomes.iter().map(f).sum::<f64>() / n;
    let recruited: usize = outcomes.iter().map(|o| o.recruits.len()).sum();
    let correct: usize = outcomes.iter().map(|o| o.correct).sum();
    FormationReport {
        tasks: outcomes.len(),
        gold_recruited: mean(&|o| o.correct as f64 / o.gold.max(1) as f64),
        precision: if recruited == 0 {
            0.0
        } else {
            correct as f64 / recruited as f64
        },
        team_size: mean(&|o| o.recruits.len() as f64),
        tool_calls: mean(&|o| o.tool_calls as f64),
        gold_seen: mean(&|o| o.gold_seen as f64 / o.gold.max(1) as f64),
        alone: mean(&|o| f64::from(u8::from(o.recruits.is_empty()))),
        forced: mean(&|o| f64::from(u8::from(o.forced))),
        prompt_tokens: prompt_tokens as f64 / n,
        completion_tokens: completion_tokens as f64 / n,
        seconds: seconds / n,
        outcomes,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn outcome(gold: usize, recruits: usize, correct: usize, calls: usize) -> TaskOutcome {
        TaskOutcome {
            task_id: "t".into(),
            gold,
            recruits: (0..recruits).map(|i| format!("a{i}")).collect(),
            correct,
            gold_seen: correct,
            tool_calls: calls,
            forced: false,
            queries: Vec::new(),
        }
    }

    #[test]
    fn summary_matches_hand_computation() {
        // Task 1: gold 2, recruited 3 of which 2 gold. Task 2: gold 4, worked alone.
        let r = summarize(vec![outcome(2, 3, 2, 4), outcome(4, 0, 0, 1)], 100, 20, 6.0);
        assert_eq!(r.tasks, 2);
        assert!((r.gold_recruited - 0.5).abs() < 1e-12);
        assert!((r.precision - 2.0 / 3.0).abs() < 1e-12);
        assert!((r.team_size - 1.5).abs() < 1e-12);
        assert!((r.tool_calls - 2.5).abs() < 1e-12);
        assert!((r.alone - 0.5).abs() < 1e-12);
        assert!((r.prompt_tokens - 50.0).abs() < 1e-12 && (r.seconds - 3.0).abs() < 1e-12);
    }
}
