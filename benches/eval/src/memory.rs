//! Offline retrieval evaluation (`starling eval memory`): Recall@1, Recall@3 and MRR of each
//! stage of the memory book's real ranking (BM25 alone, the embeddings alone, reciprocal rank
//! fusion of the two for comparison, the book's fused relevance, and that times the prior),
//! the latency of a top-3 search with its query embedding, and optionally the ranking before
//! and after one simulated round of usage feedback.
//!
//! Files are JSON Lines. Memories: `{"id", "domain", "prompt", "answer"}`. Queries:
//! `{"query", "domain", "relevant": [ids]}`.
//!
//! Metrics per query, averaged over queries: Recall@k = |relevant ∩ top-k| / |relevant|;
//! reciprocal rank = 1 / rank of the first relevant memory in the top 10 (0 if none).
//!
//! Feedback simulation: queries at even positions (0, 2, ...) are the *training* half. For
//! each, the top 3 are retrieved and each one is reported helpful if it is among the
//! query's relevant memories, unhelpful otherwise (as a node would learn from task
//! outcomes). The odd half is evaluated before and after, so the gain is on queries whose
//! labels were never used.

use std::collections::{HashMap, HashSet};
use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use starling_models::embed::EmbedHandle;

use starling_node::memory::book::{BookConfig, BookError, Inserted, MemoryBook, RankOverrides};
use starling_node::memory::record::{validate_domain, Memory, MAX_SCORE};
use starling_node::store::Store;

/// Depth of the ranking used for MRR.
const DEPTH: usize = 10;

/// The constant `k` of reciprocal rank fusion, 60 as in Cormack et al.
const RRF_K: f64 = 60.0;

/// One memory of an evaluation file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalMemory {
    /// Id referenced by queries.
    pub id: String,
    /// Domain pool.
    pub domain: String,
    /// The prompt.
    pub prompt: String,
    /// The answer.
    pub answer: String,
}

/// One query of an evaluation file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalQuery {
    /// The query text (a new prompt).
    pub query: String,
    /// Domain pool searched.
    pub domain: String,
    /// Ids of the memories that should be retrieved.
    pub relevant: Vec<String>,
}

/// Why an evaluation could not run.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// A line is not the expected JSON.
    #[error("{}:{line}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The data is inconsistent (no queries, unknown ids, bad domains).
    #[error("{0}")]
    Data(String),
    /// The memory book failed.
    #[error(transparent)]
    Book(#[from] BookError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] starling_node::store::StoreError),
}

/// Reads a JSON Lines file (blank lines skipped).
pub fn load_jsonl<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<T>, EvalError> {
    let file = std::fs::File::open(path).map_err(|source| EvalError::Read {
        path: path.to_owned(),
        source,
    })?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|source| EvalError::Read {
            path: path.to_owned(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        out.push(serde_json::from_str(&line).map_err(|e| EvalError::Parse {
            path: path.to_owned(),
            line: i + 1,
            message: e.to_string(),
        })?);
    }
    Ok(out)
}

/// Retrieval quality over a set of queries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// Queries evaluated.
    pub queries: usize,
    /// Mean Recall@1.
    pub recall_at_1: f64,
    /// Mean Recall@3.
    pub recall_at_3: f64,
    /// Mean reciprocal rank (top 10).
    pub mrr: f64,
}

impl Metrics {
    /// Metrics of ranked id lists against the queries' relevant sets.
    pub fn of(rankings: &[Vec<String>], queries: &[&EvalQuery]) -> Self {
        let mut m = Self {
            queries: queries.len(),
            ..Self::default()
        };
        if queries.is_empty() {
            return m;
        }
        for (ranked, q) in rankings.iter().zip(queries) {
            let rel: HashSet<&str> = q.relevant.iter().map(String::as_str).collect();
            if rel.is_empty() {
                continue;
            }
            let hits_at = |k: usize| {
                ranked
                    .iter()
                    .take(k)
                    .filter(|id| rel.contains(id.as_str()))
                    .count() as f64
                    / rel.len() as f64
            };
            m.recall_at_1 += hits_at(1);
            m.recall_at_3 += hits_at(3);
            if let Some(pos) = ranked
                .iter()
                .take(DEPTH)
                .position(|id| rel.contains(id.as_str()))
            {
                m.mrr += 1.0 / (pos + 1) as f64;
            }
        }
        let n = queries.len() as f64;
        m.recall_at_1 /= n;
        m.recall_at_3 /= n;
        m.mrr /= n;
        m
    }
}

/// Before/after one simulated feedback round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeedbackReport {
    /// Queries whose labels became feedback.
    pub train_queries: usize,
    /// Feedback reports given (helpful, unhelpful).
    pub reports: (usize, usize),
    /// The node's retrieval on the held-out half before feedback.
    pub before: Metrics,
    /// The same after feedback.
    pub after: Metrics,
    /// BM25 alone on the held-out half.
    pub bm25: Metrics,
}

/// One stage of the ranking, scored on all queries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stage {
    /// What the stage ranks by.
    pub name: String,
    /// Its metrics.
    pub metrics: Metrics,
}

/// Result of an evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryEvalReport {
    /// Memories in the file.
    pub memories: usize,
    /// Memories indexed (the rest were near-duplicates of another).
    pub indexed: usize,
    /// Embedding model used ("" for none).
    pub embed_model: String,
    /// The node's retrieval (hybrid BM25 + embedding, with its prior, re-ranked by late
    /// interaction) on all queries.
    pub hybrid: Metrics,
    /// BM25 alone on all queries.
    pub bm25: Metrics,
    /// Every stage of the ranking on all queries, the node's last.
    pub stages: Vec<Stage>,
    /// Median time of one top-3 search, embedding the query included, in milliseconds.
    pub top3_p50_ms: f64,
    /// The feedback simulation, when asked for.
    pub feedback: Option<FeedbackReport>,
}

/// A memory book in memory holding `memories` (one author, equal scores, as every stage of
/// the evaluation sees them), and how many were indexed (near-duplicates are not).
pub async fn book_of(
    memories: &[EvalMemory],
    embedder: Option<EmbedHandle>,
) -> Result<(MemoryBook, usize), EvalError> {
    let book = MemoryBook::open(
        Store::open_in_memory()?,
        embedder,
        None,
        BookConfig::default(),
    )
    .await?;
    let items = memories
        .iter()
        .map(|m| {
            (
                Memory {
                    id: m.id.clone(),
                    author: "eval".into(),
                    domain: m.domain.clone(),
                    prompt: m.prompt.clone(),
                    answer: m.answer.clone(),
                    source: None,
                    score: MAX_SCORE * 0.8,
                    created_at: 0,
                    helpful: 0,
                    unhelpful: 0,
                },
                None,
            )
        })
        .collect();
    let outcomes = book.insert_many(items).await?;
    let indexed = outcomes
        .iter()
        .filter(|o| matches!(o, Inserted::Added(_)))
        .count();
    Ok((book, indexed))
}

/// Evaluates the memory book's retrieval on `memories` and `queries` (see the module docs).
pub async fn evaluate(
    memories: &[EvalMemory],
    queries: &[EvalQuery],
    embedder: Option<EmbedHandle>,
    with_feedback: bool,
) -> Result<MemoryEvalReport, EvalError> {
    if queries.is_empty() {
        return Err(EvalError::Data("no queries".into()));
    }
    let ids: HashSet<&str> = memories.iter().map(|m| m.id.as_str()).collect();
    if ids.len() != memories.len() {
        return Err(EvalError::Data("memory ids are not unique".into()));
    }
    for q in queries {
        if let Some(bad) = q.relevant.iter().find(|r| !ids.contains(r.as_str())) {
            return Err(EvalError::Data(format!(
                "query {:?} names unknown memory {bad:?}",
                q.query
            )));
        }
    }
    for m in memories {
        validate_domain(&m.domain).map_err(|e| EvalError::Data(format!("memory {}: {e}", m.id)))?;
    }
    let embed_model = embedder
        .as_ref()
        .map_or_else(String::new, |e| e.model_id().to_owned());
    let (book, indexed) = book_of(memories, embedder).await?;

    let mut embeddings = Vec::with_capacity(queries.len());
    let mut tokens = Vec::with_capacity(queries.len());
    for chunk in queries.chunks(64) {
        for (v, t) in book
            .embed_with_tokens(chunk.iter().map(|q| q.query.clone()).collect())
            .await?
        {
            embeddings.push(v);
            tokens.push(t);
        }
    }
    // Weights in place of the book's own, whether the prior counts and whether the
    // re-ranking stage runs.
    let rank_with = |i: usize, overrides: RankOverrides, with_prior: bool, late: bool| {
        let q = &queries[i];
        book.ranked(
            &q.domain,
            &q.query,
            &embeddings[i],
            tokens[i].as_ref().filter(|_| late),
            DEPTH,
            with_prior,
            overrides,
        )
        .into_iter()
        .map(|h| h.memory.id)
        .collect::<Vec<String>>()
    };
    let rank = |i: usize, weights: Option<(f32, f32)>, with_prior: bool| {
        let overrides = RankOverrides {
            weights,
            ..RankOverrides::default()
        };
        rank_with(i, overrides, with_prior, false)
    };
    let hybrid_rank = |i: usize| rank_with(i, RankOverrides::default(), true, true);
    let no_neighbours = RankOverrides {
        neighbour_weight: Some(0.0),
        ..RankOverrides::default()
    };
    let bm25_rank = |i: usize| rank(i, Some((0.0, 1.0)), false);
    let dense_rank = |i: usize| rank(i, Some((1.0, 0.0)), false);
    let rrf_rank = |i: usize| {
        let mut score: HashMap<String, f64> = HashMap::new();
        for list in [bm25_rank(i), dense_rank(i)] {
            for (r, id) in list.into_iter().enumerate() {
                *score.entry(id).or_default() += 1.0 / (RRF_K + r as f64 + 1.0);
            }
        }
        let mut ranked: Vec<(String, f64)> = score.into_iter().collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        ranked.into_iter().map(|(id, _)| id).collect()
    };
    let n = queries.len();
    let all: Vec<&EvalQuery> = queries.iter().collect();
    let score =
        |f: &dyn Fn(usize) -> Vec<String>| Metrics::of(&(0..n).map(f).collect::<Vec<_>>(), &all);
    let stage = |name: &str, metrics: Metrics| Stage {
        name: name.to_owned(),
        metrics,
    };
    let bm25_all = score(&bm25_rank);
    let stages = vec![
        stage("BM25 (prompt + answer)", bm25_all),
        stage("dense (prompt, whole)", score(&dense_rank)),
        stage("RRF of the two", score(&rrf_rank)),
        stage("fused", score(&|i| rank(i, None, false))),
        stage("fused x prior", score(&|i| rank(i, None, true))),
        stage(
            "x prior, late interaction",
            score(&|i| rank_with(i, no_neighbours, true, true)),
        ),
        stage("node (late interaction + neighbours)", score(&hybrid_rank)),
    ];
    let mut times = Vec::with_capacity(n);
    for q in queries {
        let start = std::time::Instant::now();
        book.top_k(&q.domain, &q.query, 3).await?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    let top3_p50_ms = times.get(n / 2).copied().unwrap_or(0.0);

    let hybrid = score(&hybrid_rank);

    let feedback = if with_feedback {
        let train: Vec<usize> = (0..queries.len()).step_by(2).collect();
        let test: Vec<usize> = (1..queries.len()).step_by(2).collect();
        let test_q: Vec<&EvalQuery> = test.iter().map(|&i| &queries[i]).collect();
        let before = Metrics::of(
            &test.iter().map(|&i| hybrid_rank(i)).collect::<Vec<_>>(),
            &test_q,
        );
        let mut reports = (0, 0);
        for &i in &train {
            let q = &queries[i];
            let top: Vec<String> = hybrid_rank(i).into_iter().take(3).collect();
            for id in top {
                let helpful = q.relevant.contains(&id);
                book.feedback(&id, helpful).await?;
                if helpful {
                    reports.0 += 1;
                } else {
                    reports.1 += 1;
                }
            }
        }
        let after = Metrics::of(
            &test.iter().map(|&i| hybrid_rank(i)).collect::<Vec<_>>(),
            &test_q,
        );
        let bm25 = Metrics::of(
            &test.iter().map(|&i| bm25_rank(i)).collect::<Vec<_>>(),
            &test_q,
        );
        Some(FeedbackReport {
            train_queries: train.len(),
            reports,
            before,
            after,
            bm25,
        })
    } else {
        None
    };
    Ok(MemoryEvalReport {
        memories: memories.len(),
        indexed,
        embed_model,
        hybrid,
        bm25: bm25_all,
        stages,
        top3_p50_ms,
        feedback,
    })
}

/// The report as text.
pub fn render(r: &MemoryEvalReport) -> String {
    let row = |name: &str, m: &Metrics| {
        format!(
            "{name:<36} {:>6} {:>9.3} {:>9.3} {:>7.3}\n",
            m.queries, m.recall_at_1, m.recall_at_3, m.mrr
        )
    };
    let mut s = format!(
        "memories: {} ({} indexed, {} near-duplicates dropped), embedding model: {}\n\n{:<36} {:>6} {:>9} {:>9} {:>7}\n",
        r.memories,
        r.indexed,
        r.memories - r.indexed,
        if r.embed_model.is_empty() { "none" } else { &r.embed_model },
        "method",
        "n",
        "Recall@1",
        "Recall@3",
        "MRR"
    );
    for st in &r.stages {
        s += &row(&st.name, &st.metrics);
    }
    s += &format!(
        "top-3 search p50 {:.2} ms, embedding the query included\n",
        r.top3_p50_ms
    );
    if let Some(f) = &r.feedback {
        s += &format!(
            "\nfeedback: {} training queries gave {} helpful / {} unhelpful reports; held-out half:\n",
            f.train_queries, f.reports.0, f.reports.1
        );
        s += &row("node, before feedback", &f.before);
        s += &row("node, after feedback", &f.after);
        s += &row("BM25 alone", &f.bm25);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(rel: &[&str]) -> EvalQuery {
        EvalQuery {
            query: "x".into(),
            domain: "d".into(),
            relevant: rel.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn metrics_on_a_toy_ranking() {
        let q1 = q(&["a"]);
        let q2 = q(&["b"]);
        let q3 = q(&["c", "d"]);
        let rankings = vec![
            vec!["a".to_string(), "x".into()],
            vec!["x".into(), "y".into(), "b".into()],
            vec!["d".into(), "y".into(), "z".into(), "c".into()],
        ];
        let m = Metrics::of(&rankings, &[&q1, &q2, &q3]);
        assert_eq!(m.queries, 3);
        assert!((m.recall_at_1 - (1.0 + 0.0 + 0.5) / 3.0).abs() < 1e-9);
        assert!((m.recall_at_3 - (1.0 + 1.0 + 0.5) / 3.0).abs() < 1e-9);
        assert!((m.mrr - (1.0 + 1.0 / 3.0 + 1.0) / 3.0).abs() < 1e-9);
    }
}
