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

use super::{AgentRecord, TaskRecord};
use crate::agent::card::AgentCard;
use crate::config::AgentKind;
use crate::search::{
    split_sentences, Bm25Index, Hit, HybridIndex, HybridOptions, MultiQueryOptions, SearchError,
};

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
    }
}

/// The passages of a card that get embedded, one vector each, as a node embeds a card
/// ([`AgentCard::passages`]): the sentences of its description, i.e. what the agent does.
/// The name is an identifier and the type a kind of agent, not a capability; in the
/// embedding they only pull together cards that happen to share a type or similar-sounding
/// names.
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

/// Splits a task description into its requirements, one search query each: its sentences
/// ([`split_sentences`]). A team needs one agent per requirement, and one embedding of a
/// four-requirement text matches none of them well.
pub fn split_requirements(text: &str) -> Vec<String> {
    split_sentences(text)
}

/// How [`evaluate_retrieval`] searches (defaults: [`MultiQueryOptions::default`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetrievalConfig {
    /// Weight of the max-normalised cosine in each query's hybrid score.
    pub semantic_weight: f32,
    /// Weight of the max-normalised BM25 score in each query's hybrid score.
    pub lexical_weight: f32,
    /// Inverse temperature of each query's softmax over its hybrid scores.
    pub sharpness: f32,
    /// Exponent of a query's best cosine in its weight when queries are merged.
    pub confidence_power: f32,
    /// Candidates retrieved per task; `None` ranks the whole registry.
    pub depth: Option<usize>,
}

impl Default for RetrievalConfig {
    fn default() -> Self {
        let o = MultiQueryOptions::default();
        Self {
            semantic_weight: o.fusion.semantic_weight,
            lexical_weight: o.fusion.lexical_weight,
            sharpness: o.sharpness,
            confidence_power: o.confidence_power,
            depth: None,
        }
    }
}

/// Results of [`evaluate_retrieval`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RetrievalReport {
    /// Agents in the registry.
    pub agents: usize,
    /// The node's hybrid search (BM25 + cosine, fused).
    pub hybrid: Metrics,
    /// BM25 alone.
    pub bm25: Metrics,
    /// Embedding cosine alone.
    pub semantic: Metrics,
    /// Time to build the hybrid index (embeddings given), in milliseconds.
    pub index_ms: f64,
    /// Median time of one hybrid query (embedding given), in milliseconds.
    pub query_p50_ms: f64,
}

/// Indexes every card ([`card_index_text`] for BM25, the embeddings `card_vectors[i]` of
/// the [`card_passages`] of `dataset.registry[i]`) and scores the hybrid search, BM25 alone and the
/// cosine alone. The queries of task `i` are its [`split_requirements`], with embeddings
/// `query_vectors[i]` (one per requirement); the hybrid and the cosine merge them with
/// [`HybridIndex::search_many`] (per-query softmax, weighted by how well each query matches
/// anything), BM25 alone by the best raw score per agent.
pub fn evaluate_retrieval(
    dataset: &Dataset,
    card_vectors: &[Vec<Vec<f32>>],
    query_vectors: &[Vec<Vec<f32>>],
    config: &RetrievalConfig,
) -> Result<RetrievalReport, EvalError> {
    let n = dataset.registry.len();
    let dim = card_vectors
        .first()
        .and_then(|p| p.first())
        .map_or(0, Vec::len);
    let queries: Vec<Vec<String>> = dataset
        .tasks
        .iter()
        .map(|t| split_requirements(&t.description))
        .collect();
    let wanted: usize = queries.iter().map(Vec::len).sum();
    let given: usize = query_vectors.iter().map(Vec::len).sum();
    if card_vectors.len() != n
        || query_vectors.len() != queries.len()
        || queries
            .iter()
            .zip(query_vectors)
            .any(|(q, v)| q.len() != v.len())
    {
        return Err(EvalError::VectorCount {
            expected: n + wanted,
            got: card_vectors.len() + given,
        });
    }
    let start = std::time::Instant::now();
    let mut hybrid = HybridIndex::new(dim);
    let mut bm25 = Bm25Index::new();
    for (i, (agent, v)) in dataset.registry.iter().zip(card_vectors).enumerate() {
        let text = card_index_text(agent);
        hybrid.insert_passages(i as u64, &text, v.clone())?;
        bm25.insert(i as u64, &text);
    }
    let index_ms = start.elapsed().as_secs_f64() * 1e3;
    let k = config.depth.unwrap_or(n).min(n);
    let task_queries = |i: usize| -> Vec<(&str, &[f32])> {
        queries[i]
            .iter()
            .zip(&query_vectors[i])
            .map(|(q, v)| (q.as_str(), v.as_slice()))
            .collect()
    };
    let keys = |hits: Vec<Hit>| hits.into_iter().map(|h| h.key as usize).collect::<Vec<_>>();

    let opts = MultiQueryOptions {
        fusion: HybridOptions {
            semantic_weight: config.semantic_weight,
            lexical_weight: config.lexical_weight,
            prior: None,
        },
        sharpness: config.sharpness,
        confidence_power: config.confidence_power,
    };
    let mut times = Vec::with_capacity(dataset.tasks.len());
    let hybrid_metrics = evaluate_rankings(dataset, |i, _| {
        let q = task_queries(i);
        let start = std::time::Instant::now();
        let hits = hybrid.search_many(&q, k, &opts);
        times.push(start.elapsed().as_secs_f64() * 1e3 / q.len().max(1) as f64);
        keys(hits)
    });
    let semantic_only = MultiQueryOptions {
        fusion: HybridOptions {
            semantic_weight: 1.0,
            lexical_weight: 0.0,
            prior: None,
        },
        ..opts
    };
    let semantic = evaluate_rankings(dataset, |i, _| {
        keys(hybrid.search_many(&task_queries(i), k, &semantic_only))
    });
    let bm25_metrics = evaluate_rankings(dataset, |i, _| {
        let mut best: HashMap<u64, f32> = HashMap::new();
        for q in &queries[i] {
            for (key, score) in bm25.search(q, k) {
                let b = best.entry(key).or_insert(0.0);
                *b = b.max(score);
            }
        }
        let mut ranked: Vec<(u64, f32)> = best.into_iter().collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        ranked
            .into_iter()
            .take(k)
            .map(|(key, _)| key as usize)
            .collect()
    });
    times.sort_by(f64::total_cmp);
    Ok(RetrievalReport {
        agents: n,
        hybrid: hybrid_metrics,
        bm25: bm25_metrics,
        semantic,
        index_ms,
        query_p50_ms: times.get(times.len() / 2).copied().unwrap_or(0.0),
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
