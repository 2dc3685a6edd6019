//! Team-formation retrieval evaluation: how well a ranking of the agent registry puts each
//! task's gold team first.
//!
//! # Metrics
//!
//! For a task with gold team `G` (`g = |G|`) and a ranking of the registry:
//!
//! - **raw rank** of an agent: its 1-based position in the ranking.
//! - **filtered rank** of a gold agent: 1 + the number of *non-gold* agents ranked above it.
//!   Each (task, gold agent) pair is scored as its own query with the other gold agents
//!   filtered out, as in the link-prediction protocol the metric set (Top@1, Top@10, mean
//!   rank, MRR) comes from: a team of four can have all four members at filtered rank 1.
//! - `recall_at_g`: share of `G` within the first `g` raw positions, averaged over tasks.
//! - `recall_at_10`: share of `G` within the first 10 raw positions, averaged over tasks.
//! - `top1` / `top10`: share of (task, gold agent) pairs with filtered rank 1 / ≤ 10.
//! - `mean_rank`: mean filtered rank over all (task, gold agent) pairs.
//! - `mrr`: mean over all (task, gold agent) pairs of `1 / filtered rank` (not the first
//!   relevant result per task: with multi-agent gold teams every member has to be found).
//!
//! A gold agent missing from a (truncated) ranking is placed after every non-gold agent.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::{AgentRecord, TaskRecord};
use starling_node::agent::card::AgentCard;
use starling_node::config::AgentKind;
use starling_node::search::{query_parts, Hit, HybridIndex, HybridOptions, SearchError};

/// Why a benchmark file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// The file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// A line is not a task record.
    #[error("line {line}: not a task record: {source}")]
    Parse {
        /// 1-based line number.
        line: usize,
        /// The JSON error.
        source: serde_json::Error,
    },
    /// A task has no gold agents.
    #[error("line {line}: task `{task_id}` has no agents")]
    EmptyTeam {
        /// 1-based line number.
        line: usize,
        /// The task.
        task_id: String,
    },
    /// The file has no tasks.
    #[error("the benchmark has no tasks")]
    Empty,
    /// There is not one embedding per card and per task.
    #[error("{got} embeddings given for {expected} cards and tasks")]
    VectorCount {
        /// Cards plus tasks.
        expected: usize,
        /// Embeddings given.
        got: usize,
    },
    /// A card could not be indexed.
    #[error("cannot index a card: {0}")]
    Index(#[from] SearchError),
}

/// A task with its gold team as indices into [`Dataset::registry`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoldTask {
    /// Identifier of the task.
    pub id: String,
    /// The task description (the query).
    pub description: String,
    /// Registry indices of the gold agents (distinct).
    pub gold: Vec<usize>,
}

/// A benchmark: the registry (union of all tasks' agents) and the tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dataset {
    /// Every distinct agent, in order of first appearance.
    pub registry: Vec<AgentRecord>,
    /// The tasks.
    pub tasks: Vec<GoldTask>,
}

impl Dataset {
    /// Builds the registry and gold teams from task records. An agent name seen again
    /// refers to the first card with that name (a differing card is logged and ignored).
    pub fn from_records(records: Vec<TaskRecord>) -> Result<Self, EvalError> {
        let mut registry: Vec<AgentRecord> = Vec::new();
        let mut by_name: HashMap<String, usize> = HashMap::new();
        let mut tasks = Vec::with_capacity(records.len());
        for (i, record) in records.into_iter().enumerate() {
            if record.agents.is_empty() {
                return Err(EvalError::EmptyTeam {
                    line: i + 1,
                    task_id: record.task_id,
                });
            }
            let mut gold = Vec::with_capacity(record.agents.len());
            for agent in record.agents {
                let index = match by_name.get(&agent.agent_name) {
                    Some(&index) => {
                        if registry[index] != agent {
                            tracing::warn!(agent = %agent.agent_name, task = %record.task_id, "agent card differs from its first appearance; using the first");
                        }
                        index
                    }
                    None => {
                        by_name.insert(agent.agent_name.clone(), registry.len());
                        registry.push(agent);
                        registry.len() - 1
                    }
                };
                if !gold.contains(&index) {
                    gold.push(index);
                }
            }
            tasks.push(GoldTask {
                id: record.task_id,
                description: record.task_description,
                gold,
            });
        }
        if tasks.is_empty() {
            return Err(EvalError::Empty);
        }
        Ok(Self { registry, tasks })
    }

    /// Reads a JSON Lines benchmark (blank lines are skipped).
    pub fn read(reader: impl BufRead) -> Result<Self, EvalError> {
        let mut records = Vec::new();
        for (i, line) in reader.lines().enumerate() {
            let line = line.map_err(|source| EvalError::Read {
                path: PathBuf::from("<input>"),
                source,
            })?;
            if line.trim().is_empty() {
                continue;
            }
            let record: TaskRecord =
                serde_json::from_str(&line).map_err(|source| EvalError::Parse {
                    line: i + 1,
                    source,
                })?;
            records.push(record);
        }
        Self::from_records(records)
    }

    /// Reads a JSON Lines benchmark file.
    pub fn load(path: &Path) -> Result<Self, EvalError> {
        let file = std::fs::File::open(path).map_err(|source| EvalError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::read(std::io::BufReader::new(file)).map_err(|e| match e {
            EvalError::Read { source, .. } => EvalError::Read {
                path: path.to_path_buf(),
                source,
            },
            other => other,
        })
    }
}

/// The agent as a node's card: its description, no skills, and its kind from its type.
pub fn agent_card(agent: &AgentRecord) -> AgentCard {
    let kind = if agent.agent_type.to_ascii_lowercase().contains("human") {
        AgentKind::Human
    } else {
        AgentKind::Tool
    };
    AgentCard {
        name: agent.agent_name.clone(),
        description: agent.agent_description.clone(),
        skills: Vec::new(),
        kind,
        tools: Vec::new(),
        models: Vec::new(),
        agent: None,
    }
}

/// The texts of a card that get embedded, one vector each, as a node embeds a card
/// ([`AgentCard::passages`]): its whole description (chunked when long), i.e. what the
/// agent does. The name is an identifier and the type a kind of agent, not a capability.
pub fn card_passages(agent: &AgentRecord) -> Vec<String> {
    agent_card(agent).passages()
}

/// The text of a card that gets indexed for BM25: name, type and description (a search for
/// an agent's name finds it).
pub fn card_index_text(agent: &AgentRecord) -> String {
    format!(
        "{} ({}): {}",
        agent.agent_name, agent.agent_type, agent.agent_description
    )
}

/// Retrieval quality of one ranking method over a benchmark (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Metrics {
    /// Tasks evaluated.
    pub tasks: usize,
    /// (task, gold agent) pairs evaluated.
    pub gold_pairs: usize,
    /// Mean share of the gold team within the first `g` positions.
    pub recall_at_g: f64,
    /// Mean share of the gold team within the first 10 positions.
    pub recall_at_10: f64,
    /// Share of gold agents at filtered rank 1.
    pub top1: f64,
    /// Share of gold agents at filtered rank ≤ 10.
    pub top10: f64,
    /// Mean filtered rank of gold agents.
    pub mean_rank: f64,
    /// Mean reciprocal filtered rank of gold agents.
    pub mrr: f64,
}

/// Filtered ranks (see the module docs) and raw positions of `gold` in `ranking`, for a
/// registry of `registry_len` agents.
fn gold_ranks(
    gold: &[usize],
    ranking: &[usize],
    registry_len: usize,
) -> Vec<(usize, Option<usize>)> {
    let mut non_gold_above = 0;
    let mut found: HashMap<usize, (usize, usize)> = HashMap::new();
    for (pos, &agent) in ranking.iter().enumerate() {
        if gold.contains(&agent) {
            found.entry(agent).or_insert((non_gold_above + 1, pos + 1));
        } else {
            non_gold_above += 1;
        }
    }
    let non_gold_total = registry_len.saturating_sub(gold.len());
    gold.iter()
        .map(|g| match found.get(g) {
            Some(&(filtered, raw)) => (filtered, Some(raw)),
            None => (non_gold_total + 1, None),
        })
        .collect()
}

/// Scores a ranking method: `rank` gets each task (with its index in [`Dataset::tasks`]) and
/// returns registry indices, best first
/// (it may return only a prefix of the registry). This is the hook for any team-formation
/// method, from plain retrieval to a full LLM loop that returns its chosen team first.
pub fn evaluate_rankings<F>(dataset: &Dataset, mut rank: F) -> Metrics
where
    F: FnMut(usize, &GoldTask) -> Vec<usize>,
{
    let n = dataset.registry.len();
    let (mut recall_g, mut recall_10) = (0.0, 0.0);
    let (mut pairs, mut top1, mut top10, mut rank_sum, mut rr_sum) =
        (0usize, 0usize, 0usize, 0.0, 0.0);
    for (i, task) in dataset.tasks.iter().enumerate() {
        let ranking = rank(i, task);
        let g = task.gold.len();
        let ranks = gold_ranks(&task.gold, &ranking, n);
        let within = |k: usize| {
            ranks
                .iter()
                .filter(|(_, raw)| raw.is_some_and(|r| r <= k))
                .count()
        };
        recall_g += within(g) as f64 / g as f64;
        recall_10 += within(10) as f64 / g as f64;
        for &(filtered, _) in &ranks {
            pairs += 1;
            top1 += usize::from(filtered == 1);
            top10 += usize::from(filtered <= 10);
            rank_sum += filtered as f64;
            rr_sum += 1.0 / filtered as f64;
        }
    }
    let tasks = dataset.tasks.len().max(1) as f64;
    let p = pairs.max(1) as f64;
    Metrics {
        tasks: dataset.tasks.len(),
        gold_pairs: pairs,
        recall_at_g: recall_g / tasks,
        recall_at_10: recall_10 / tasks,
        top1: top1 as f64 / p,
        top10: top10 as f64 / p,
        mean_rank: rank_sum / p,
        mrr: rr_sum / p,
    }
}

/// How [`evaluate_retrieval`] searches (default: the node's card search).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetrievalConfig {
    /// Weight of the max-normalised cosine in the fused score.
    pub semantic_weight: f32,
    /// Weight of the max-normalised BM25 score in the fused score.
    pub lexical_weight: f32,
    /// The constant `k` of reciprocal rank fusion (the `rrf` row), 60 as in Cormack et al.
    pub rrf_k: f32,
    /// Candidates retrieved per task; `None` ranks the whole registry.
    pub depth: Option<usize>,
}

impl Default for RetrievalConfig {
    fn default() -> Self {
        let o = starling_node::agent::card::card_fusion();
        Self {
            semantic_weight: o.semantic_weight,
            lexical_weight: o.lexical_weight,
            rrf_k: 60.0,
            depth: None,
        }
    }
}

/// Results of [`evaluate_retrieval`]: one row per stage of the search.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RetrievalReport {
    /// Agents in the registry.
    pub agents: usize,
    /// BM25 alone (the keyword candidates).
    pub bm25: Metrics,
    /// Embedding cosine alone (the dense candidates).
    pub dense: Metrics,
    /// Reciprocal rank fusion of the two, `1 / (k + rank)` summed (shown for comparison).
    pub rrf: Metrics,
    /// Max-normalised scores fused linearly ([`starling_node::search`]), the whole task as the query.
    pub fused_whole: Metrics,
    /// The node's search: the whole task's fused score plus half the best of its sentences'
    /// ([`HybridIndex::search_with_parts`]).
    pub fused: Metrics,
    /// Time to build the index (embeddings given), in milliseconds.
    pub index_ms: f64,
    /// Median time of one fused query over the registry (embedding given), in milliseconds.
    pub query_p50_ms: f64,
    /// Median time to embed one task description alone (batch of one, as a node embeds a
    /// query), in milliseconds; 0 when not measured.
    pub embed_p50_ms: f64,
}

/// Indexes every card ([`card_index_text`] for BM25, the embeddings `card_vectors[i]` of the
/// [`card_passages`] of `dataset.registry[i]`) and scores each stage of the node's card search:
/// BM25 alone, the cosine alone, reciprocal rank fusion, the fused score of the whole task,
/// and the node's search (whole task and its sentences). Task `i` is its whole description
/// with embedding `query_vectors[i]`, and its [`query_parts`] with embeddings
/// `part_vectors[i]`.
pub fn evaluate_retrieval(
    dataset: &Dataset,
    card_vectors: &[Vec<Vec<f32>>],
    query_vectors: &[Vec<f32>],
    part_vectors: &[Vec<Vec<f32>>],
    config: &RetrievalConfig,
) -> Result<RetrievalReport, EvalError> {
    let n = dataset.registry.len();
    let dim = card_vectors
        .first()
        .and_then(|p| p.first())
        .map_or(0, Vec::len);
    let parts: Vec<Vec<String>> = dataset
        .tasks
        .iter()
        .map(|t| query_parts(&t.description))
        .collect();
    if card_vectors.len() != n
        || query_vectors.len() != dataset.tasks.len()
        || part_vectors.len() != parts.len()
        || parts
            .iter()
            .zip(part_vectors)
            .any(|(p, v)| p.len() != v.len())
    {
        return Err(EvalError::VectorCount {
            expected: n + dataset.tasks.len(),
            got: card_vectors.len() + query_vectors.len(),
        });
    }
    let start = std::time::Instant::now();
    let mut index = HybridIndex::new(dim);
    for (i, (agent, v)) in dataset.registry.iter().zip(card_vectors).enumerate() {
        index.insert_passages(i as u64, &card_index_text(agent), v.clone())?;
    }
    let index_ms = start.elapsed().as_secs_f64() * 1e3;
    let k = config.depth.unwrap_or(n).min(n);
    let keys = |hits: Vec<Hit>| hits.into_iter().map(|h| h.key as usize).collect::<Vec<_>>();
    let weights = |semantic_weight, lexical_weight| HybridOptions {
        semantic_weight,
        lexical_weight,
        prior: None,
    };
    let fused_opts = weights(config.semantic_weight, config.lexical_weight);
    let mut times = Vec::with_capacity(dataset.tasks.len());
    let fused = evaluate_rankings(dataset, |i, t| {
        let task_parts: Vec<(&str, &[f32])> = parts[i]
            .iter()
            .zip(&part_vectors[i])
            .map(|(p, v)| (p.as_str(), v.as_slice()))
            .collect();
        let start = std::time::Instant::now();
        let hits = index.search_with_parts(
            &t.description,
            &query_vectors[i],
            &task_parts,
            k,
            &fused_opts,
        );
        times.push(start.elapsed().as_secs_f64() * 1e3);
        keys(hits)
    });
    let fused_whole = evaluate_rankings(dataset, |i, t| {
        keys(index.search(&t.description, &query_vectors[i], k, &fused_opts))
    });
    let dense = evaluate_rankings(dataset, |i, t| {
        keys(index.search(&t.description, &query_vectors[i], k, &weights(1.0, 0.0)))
    });
    let bm25 = evaluate_rankings(dataset, |i, t| {
        keys(index.search(&t.description, &query_vectors[i], k, &weights(0.0, 1.0)))
    });
    let rrf = evaluate_rankings(dataset, |i, t| {
        let mut score: HashMap<usize, f32> = HashMap::new();
        for w in [weights(1.0, 0.0), weights(0.0, 1.0)] {
            let ranked = keys(index.search(&t.description, &query_vectors[i], n, &w));
            for (rank, key) in ranked.into_iter().enumerate() {
                *score.entry(key).or_default() += 1.0 / (config.rrf_k + rank as f32 + 1.0);
            }
        }
        let mut ranked: Vec<(usize, f32)> = score.into_iter().collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        ranked.into_iter().take(k).map(|(key, _)| key).collect()
    });
    times.sort_by(f64::total_cmp);
    Ok(RetrievalReport {
        agents: n,
        bm25,
        dense,
        rrf,
        fused_whole,
        fused,
        index_ms,
        query_p50_ms: times.get(times.len() / 2).copied().unwrap_or(0.0),
        embed_p50_ms: 0.0,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn agent(name: &str) -> AgentRecord {
        AgentRecord {
            agent_name: name.into(),
            agent_type: "tool agent".into(),
            agent_description: format!("{name} does things"),
        }
    }

    fn toy() -> Dataset {
        let records = vec![
            TaskRecord {
                task_id: "t1".into(),
                task_description: "first".into(),
                agents: vec![agent("a"), agent("b")],
            },
            TaskRecord {
                task_id: "t2".into(),
                task_description: "second".into(),
                agents: vec![agent("c"), agent("d"), agent("a")],
            },
            TaskRecord {
                task_id: "t3".into(),
                task_description: "third".into(),
                agents: vec![agent("e")],
            },
        ];
        Dataset::from_records(records).unwrap()
    }

    #[test]
    fn registry_is_the_union_of_teams() {
        let d = toy();
        let names: Vec<&str> = d.registry.iter().map(|a| a.agent_name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c", "d", "e"]);
        assert_eq!(d.tasks[1].gold, vec![2, 3, 0]);
    }

    #[test]
    fn metrics_match_hand_computation() {
        let d = toy();
        // t1 gold {a=0, b=1}: ranking [0, 2, 1, ...] -> raw 1, 3; filtered 1, 2.
        // t2 gold {c=2, d=3, a=0}: ranking [2, 0, 4, 1] (d missing) -> raw 1, -, 2;
        //    filtered c=1, a=1, d = non-gold total (2) + 1 = 3.
        // t3 gold {e=4}: ranking [0, 1, 2, 3, 4] -> raw 5, filtered 5.
        let d_rankings: HashMap<&str, Vec<usize>> = [
            ("t1", vec![0, 2, 1, 3, 4]),
            ("t2", vec![2, 0, 4, 1]),
            ("t3", vec![0, 1, 2, 3, 4]),
        ]
        .into_iter()
        .collect();
        let m = evaluate_rankings(&d, |_, t| d_rankings[t.id.as_str()].clone());
        assert_eq!(m.tasks, 3);
        assert_eq!(m.gold_pairs, 6);
        // Recall@g: t1 1/2 (only a in the first 2), t2 2/3 (c, a in the first 3), t3 0.
        assert!((m.recall_at_g - (0.5 + 2.0 / 3.0 + 0.0) / 3.0).abs() < 1e-12);
        // Recall@10: t1 1, t2 2/3, t3 1.
        assert!((m.recall_at_10 - (1.0 + 2.0 / 3.0 + 1.0) / 3.0).abs() < 1e-12);
        // Filtered ranks: 1, 2, 1, 3, 1, 5.
        assert!((m.top1 - 3.0 / 6.0).abs() < 1e-12);
        assert!((m.top10 - 1.0).abs() < 1e-12);
        assert!((m.mean_rank - 13.0 / 6.0).abs() < 1e-12);
        let mrr = (1.0 + 0.5 + 1.0 + 1.0 / 3.0 + 1.0 + 0.2) / 6.0;
        assert!((m.mrr - mrr).abs() < 1e-12);
    }

    #[test]
    fn perfect_ranking_scores_perfectly() {
        let d = toy();
        let m = evaluate_rankings(&d, |_, t| {
            let mut r = t.gold.clone();
            r.extend((0..d.registry.len()).filter(|i| !t.gold.contains(i)));
            r
        });
        assert_eq!(
            (m.recall_at_g, m.top1, m.mean_rank, m.mrr),
            (1.0, 1.0, 1.0, 1.0)
        );
    }

    #[test]
    fn bad_lines_are_errors_with_line_numbers() {
        let text = "{\"task_id\":\"x\",\"task_description\":\"d\",\"agents\":[]}\n";
        assert!(matches!(
            Dataset::read(text.as_bytes()),
            Err(EvalError::EmptyTeam { line: 1, .. })
        ));
        let text = "\n{not json}\n";
        assert!(matches!(
            Dataset::read(text.as_bytes()),
            Err(EvalError::Parse { line: 2, .. })
        ));
        assert!(matches!(
            Dataset::read("".as_bytes()),
            Err(EvalError::Empty)
        ));
    }
}
