//! How the late-interaction stage was chosen (`benches/memory/README.md`): the variants of
//! re-ordering the first stage's top 20 by MaxSim of the default embedder's token vectors,
//! measured side by side, for memories and for agent cards.
//!
//! ```text
//! cargo run --release -p starling-eval --example late_interaction -- MEMORIES QUERIES...
//! cargo run --release -p starling-eval --example late_interaction -- team TASKS...
//! ```
//!
//! The `best + w nb` rows add `w` times the cosine of a memory's prompt vector with that of
//! the MaxSim's first hit (the book's `neighbour_weight`); the `rocchio` rows re-rank by the
//! query vector plus `w` times the first hit's.
//!
//! `PROBE_QUANT=int8` or `sign` keeps the memory side's token vectors as 8-bit integers or
//! as sign bits (the node's choice) instead of `f32`. The memories' first stage is the book
//! without its own re-ranking.

use std::collections::HashMap;
use std::path::Path;

use starling_eval::memory::{book_of, load_jsonl, EvalMemory, EvalQuery, Metrics};
use starling_models::embed::{BertEmbedder, EmbedHandle, Embedder};

const DEPTH: usize = 20;

fn tokens_of(e: &BertEmbedder, texts: &[&str]) -> anyhow::Result<Vec<Vec<f32>>> {
    Ok(e.embed_tokens(texts)?
        .into_iter()
        .map(|t| t.tokens)
        .collect())
}

fn maxsim(q: &[f32], d: &[f32], dim: usize) -> f32 {
    let nq = q.len() / dim;
    if nq == 0 || d.is_empty() {
        return 0.0;
    }
    let mut total = 0.0;
    for qr in q.chunks_exact(dim) {
        let mut best = f32::MIN;
        for dr in d.chunks_exact(dim) {
            let s: f32 = qr.iter().zip(dr).map(|(a, b)| a * b).sum();
            best = best.max(s);
        }
        total += best;
    }
    total / nq as f32
}

fn team(path: &str) -> anyhow::Result<()> {
    use starling_eval::team_formation::{
        card_index_text, evaluate_rankings, Dataset, RetrievalConfig,
    };
    use starling_node::search::{query_parts, HybridIndex, HybridOptions};
    let ds = Dataset::load(Path::new(path))?;
    let emb = BertEmbedder::load(starling_models::testing::embedding_model())?;
    let dim = emb.dim();
    let cards = starling_eval::cli::embed_cards(&ds, &emb)?;
    let texts: Vec<String> = ds.registry.iter().map(card_index_text).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let card_tok = tokens_of(&emb, &refs)?;
    let mut index = HybridIndex::new(dim);
    for (i, (agent, v)) in ds.registry.iter().zip(&cards).enumerate() {
        index.insert_passages(i as u64, &card_index_text(agent), v.clone())?;
    }
    let qs: Vec<&str> = ds.tasks.iter().map(|t| t.description.as_str()).collect();
    let qv = emb.embed(&qs)?;
    let qtok = tokens_of(&emb, &qs)?;
    let parts: Vec<Vec<String>> = qs.iter().map(|q| query_parts(q)).collect();
    let pv: Vec<Vec<Vec<f32>>> = parts
        .iter()
        .map(|p| emb.embed(&p.iter().map(String::as_str).collect::<Vec<_>>()))
        .collect::<Result<_, _>>()?;
    let c = RetrievalConfig::default();
    let opts = HybridOptions {
        semantic_weight: c.semantic_weight,
        lexical_weight: c.lexical_weight,
        prior: None,
    };
    let n = ds.registry.len();
    let node = |i: usize| -> Vec<(usize, f32)> {
        let tp: Vec<(&str, &[f32])> = parts[i]
            .iter()
            .zip(&pv[i])
            .map(|(p, v)| (p.as_str(), v.as_slice()))
            .collect();
        index
            .search_with_parts(qs[i], &qv[i], &tp, n, &opts)
            .into_iter()
            .map(|h| (h.key as usize, h.score))
            .collect()
    };
    let rerank = |i: usize, mode: usize| -> Vec<usize> {
        let hits = node(i);
        let head = hits.len().min(DEPTH);
        let ms: Vec<f32> = hits[..head]
            .iter()
            .map(|&(k, _)| maxsim(&qtok[i], &card_tok[k], dim))
            .collect();
        let mut rank_ms = vec![0usize; head];
        let mut idx: Vec<usize> = (0..head).collect();
        idx.sort_by(|&a, &b| ms[b].total_cmp(&ms[a]));
        for (pos, &k) in idx.iter().enumerate() {
            rank_ms[k] = pos;
        }
        let top = hits.first().map_or(1.0, |h| h.1.max(1e-6));
        let key = |k: usize| -> f32 {
            match mode {
                1 => ms[k],
                2 => 1.0 / (61.0 + k as f32) + 1.0 / (61.0 + rank_ms[k] as f32),
                3 => hits[k].1 / top + ms[k],
                _ => hits[k].1 / top + 2.0 * ms[k],
            }
        };
        let mut idx: Vec<usize> = (0..head).collect();
        idx.sort_by(|&a, &b| key(b).total_cmp(&key(a)));
        idx.into_iter()
            .map(|k| hits[k].0)
            .chain(hits[head..].iter().map(|h| h.0))
            .collect()
    };
    println!("{path} ({} tasks, {n} agents)", ds.tasks.len());
    for (name, mode) in [
        ("node", 0usize),
        ("maxsim", 1),
        ("rrf", 2),
        ("node + 1.0 ms", 3),
        ("node + 2.0 ms", 4),
    ] {
        let m = evaluate_rankings(&ds, |i, _| {
            if mode == 0 {
                node(i).into_iter().map(|h| h.0).collect()
            } else {
                rerank(i, mode)
            }
        });
        println!(
            "  {name:<14} R@g {:.3}  R@10 {:.3}  MRR {:.3}",
            m.recall_at_g, m.recall_at_10, m.mrr
        );
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args[0] == "team" {
        for p in &args[1..] {
            team(p)?;
        }
        return Ok(());
    }
    let memories: Vec<EvalMemory> = load_jsonl(Path::new(&args[0]))?;
    let dir = starling_models::testing::embedding_model();
    let tokens = BertEmbedder::load(&dir)?;
    let dim = tokens.dim();
    let handle = EmbedHandle::spawn(BertEmbedder::load(&dir)?)?;
    let (book, _) = book_of(&memories, Some(handle)).await?;
    let prompts: Vec<&str> = memories.iter().map(|m| m.prompt.as_str()).collect();
    let wholes: Vec<String> = memories
        .iter()
        .map(|m| format!("{}\n{}", m.prompt, m.answer))
        .collect();
    let whole_refs: Vec<&str> = wholes.iter().map(String::as_str).collect();
    let t0 = std::time::Instant::now();
    let quant = std::env::var("PROBE_QUANT").unwrap_or_default();
    let q = |v: Vec<Vec<f32>>| -> Vec<Vec<f32>> {
        v.into_iter()
            .map(|m| {
                m.iter()
                    .map(|&x| match quant.as_str() {
                        "int8" => (x * 127.0).round().clamp(-127.0, 127.0) / 127.0,
                        "sign" => {
                            if x >= 0.0 {
                                1.0 / (dim as f32).sqrt()
                            } else {
                                -1.0 / (dim as f32).sqrt()
                            }
                        }
                        _ => x,
                    })
                    .collect()
            })
            .collect()
    };
    let prompt_tok = q(tokens_of(&tokens, &prompts)?);
    let pvec = tokens.embed(&prompts)?;
    let whole_tok = q(tokens_of(&tokens, &whole_refs)?);
    eprintln!(
        "token vectors of {} memories: {:?}",
        memories.len(),
        t0.elapsed()
    );
    let positions: HashMap<&str, usize> = memories
        .iter()
        .enumerate()
        .map(|(i, m)| (m.id.as_str(), i))
        .collect();

    for path in &args[1..] {
        let queries: Vec<EvalQuery> = load_jsonl(Path::new(path))?;
        let texts: Vec<&str> = queries.iter().map(|q| q.query.as_str()).collect();
        let qvec = tokens.embed(&texts)?;
        let qtok = q(tokens_of(&tokens, &texts)?);
        let all: Vec<&EvalQuery> = queries.iter().collect();
        let mut rows: Vec<(String, Vec<Vec<String>>)> = Vec::new();
        let variants = [
            "node",
            "maxsim prompt",
            "maxsim whole",
            "maxsim best",
            "rrf node+best",
            "node + 0.5 best",
            "node + 1.0 best",
            "node + 2.0 best",
            "best + 0.1 nb",
            "best + 0.25 nb",
            "best + 0.5 nb",
            "rocchio 0.5",
            "rocchio 1.0",
        ];
        let mut ranks: Vec<Vec<Vec<String>>> = vec![Vec::new(); variants.len()];
        for (i, q) in queries.iter().enumerate() {
            let hits = book.ranked(
                &q.domain,
                &q.query,
                &qvec[i],
                None,
                DEPTH,
                true,
                starling_node::memory::RankOverrides::default(),
            );
            let node: Vec<String> = hits.iter().map(|h| h.memory.id.clone()).collect();
            let ms: Vec<(f32, f32)> = hits
                .iter()
                .map(|h| {
                    let j = positions[h.memory.id.as_str()];
                    (
                        maxsim(&qtok[i], &prompt_tok[j], dim),
                        maxsim(&qtok[i], &whole_tok[j], dim),
                    )
                })
                .collect();
            let order_by = |key: &dyn Fn(usize) -> f32| -> Vec<String> {
                let mut idx: Vec<usize> = (0..hits.len()).collect();
                idx.sort_by(|&a, &b| key(b).total_cmp(&key(a)));
                idx.into_iter().map(|k| node[k].clone()).collect()
            };
            let best = |k: usize| ms[k].0.max(ms[k].1);
            let best_rank: Vec<usize> = {
                let mut idx: Vec<usize> = (0..hits.len()).collect();
                idx.sort_by(|&a, &b| best(b).total_cmp(&best(a)));
                let mut r = vec![0; hits.len()];
                for (pos, k) in idx.into_iter().enumerate() {
                    r[k] = pos;
                }
                r
            };
            let top = hits.first().map_or(1.0, |h| h.score.max(1e-6));
            ranks[0].push(node.clone());
            ranks[1].push(order_by(&|k| ms[k].0));
            ranks[2].push(order_by(&|k| ms[k].1));
            ranks[3].push(order_by(&best));
            ranks[4].push(order_by(&|k| {
                1.0 / (60.0 + k as f32 + 1.0) + 1.0 / (60.0 + best_rank[k] as f32 + 1.0)
            }));
            for (v, w) in [(5, 0.5f32), (6, 1.0), (7, 2.0)] {
                ranks[v].push(order_by(&|k| hits[k].score / top + w * best(k)));
            }
            let dot = |a: &[f32], b: &[f32]| -> f32 { a.iter().zip(b).map(|(x, y)| x * y).sum() };
            let vec_of = |k: usize| &pvec[positions[hits[k].memory.id.as_str()]];
            let first = (0..hits.len()).max_by(|&a, &b| best(a).total_cmp(&best(b)));
            for (v, w) in [(8, 0.1f32), (9, 0.25), (10, 0.5)] {
                ranks[v].push(order_by(&|k| {
                    let nb = match first {
                        Some(f) if f != k => dot(vec_of(k), vec_of(f)),
                        Some(_) => 1.0,
                        None => 0.0,
                    };
                    best(k) + w * nb
                }));
            }
            for (v, w) in [(11, 0.5f32), (12, 1.0)] {
                let qv: Vec<f32> = match first {
                    Some(f) => qvec[i]
                        .iter()
                        .zip(vec_of(f))
                        .map(|(a, b)| a + w * b)
                        .collect(),
                    None => qvec[i].clone(),
                };
                ranks[v].push(order_by(&|k| dot(&qv, vec_of(k))));
            }
        }
        for (name, r) in variants.iter().zip(ranks) {
            rows.push((name.to_string(), r));
        }
        println!("{path} ({} queries)", queries.len());
        for (name, r) in &rows {
            let m = Metrics::of(r, &all);
            println!(
                "  {name:<18} R@1 {:.3}  R@3 {:.3}  MRR {:.3}",
                m.recall_at_1, m.recall_at_3, m.mrr
            );
        }
    }
    Ok(())
}
