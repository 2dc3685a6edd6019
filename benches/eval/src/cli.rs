//! `starling eval ...`: offline evaluations (team-formation retrieval, benchmark generation).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use starling_models::embed::{BertEmbedder, Embedder};
use starling_models::source::{registry, ModelCache, Progress};

use crate::formation_loop::{self, FormationReport, RegistrySearch};
use crate::synth::{self, SynthConfig};
use crate::team_formation::{
    self, card_passages, Dataset, Metrics, RetrievalConfig, RetrievalReport,
};
use starling_node::agent::formation::FormationConfig;
use starling_node::cli::ModelArgs;
use starling_node::llm::Llm;

/// The Internet of Agents paper's figures for its regular team formation (Top@1, Top@10,
/// mean rank, MRR), printed next to ours.
const PAPER: (f64, f64, f64, f64) = (0.414, 0.649, 27.4, 0.501);

/// `starling eval ...`
#[derive(Debug, Subcommand)]
pub enum EvalCommand {
    /// Score the node's agent search on a team-formation benchmark.
    ///
    /// Every agent of the file is indexed as a node indexes a card (its whole description
    /// embedded, chunked when long, and BM25 over name, type and description); each task
    /// description is one query. One row per stage of the node's card search: BM25 alone,
    /// dense (cosine) alone, reciprocal rank fusion of the two (for comparison), the fused
    /// score (max-normalised, 0.7 x cosine + 0.3 x BM25) of the whole task, and the node's
    /// search ("+ sentences": the whole task's fused score plus half of the best of its
    /// sentences'). Metrics:
    ///   Recall@g   share of the gold team in the first g results (g = team size), per task
    ///   Recall@10  share of the gold team in the first 10 results, per task
    ///   Top@1/@10  share of gold agents at filtered rank 1 / <= 10
    ///   mean rank  mean filtered rank of gold agents
    ///   MRR        mean over all (task, gold agent) pairs of 1 / filtered rank
    /// The filtered rank of a gold agent is 1 + the number of non-gold agents above it (the
    /// other members of its team do not count against it), so every member of a team can be
    /// at rank 1, as in the link-prediction protocol these metrics come from.
    ///
    /// With --full, the node's real LLM team-formation loop (search_agents / launch_group,
    /// constrained tool calls, at most 10) also runs on the first --limit tasks against the
    /// same index, and prints the share of gold agents recruited, the precision of recruits,
    /// the mean team size and the mean number of tool calls.
    ///
    /// Examples:
    ///   starling eval team-formation --data tasks.jsonl
    ///   starling eval team-formation --data tasks.jsonl --top 50 --json
    ///   starling eval team-formation --data tasks.jsonl --full --limit 20
    #[command(verbatim_doc_comment)]
    TeamFormation(TeamFormationArgs),
    /// Generate a synthetic team-formation benchmark (JSON Lines).
    ///
    /// Examples:
    ///   starling eval synth-team --cards 1200 --tasks 500 --seed 1 --out tasks.jsonl
    #[command(verbatim_doc_comment)]
    SynthTeam(SynthTeamArgs),
    /// Score the node's memory retrieval (hybrid + prior) against BM25 alone: Recall@1,
    /// Recall@3 and MRR, optionally before/after a simulated feedback round.
    ///
    /// Examples:
    ///   starling eval memory --memories memories.jsonl --queries queries.jsonl
    ///   starling eval memory --memories m.jsonl --queries q.jsonl --feedback --json
    #[command(verbatim_doc_comment)]
    Memory(crate::memory_cmd::EvalMemoryArgs),
    /// Score memory admission (text and embedding checks, LLM rubric score, threshold) on
    /// good prompt–answer pairs and corrupted variants of them (shuffled answer, truncated
    /// answer, filed under another domain, empty answer): acceptance per variant, precision
    /// and recall, the LLM's score distributions and a threshold sweep.
    ///
    /// Examples:
    ///   starling eval admission --pairs benches/memory/admission_pairs.jsonl
    ///   starling eval admission --pairs pairs.jsonl --limit 20 --json
    #[command(verbatim_doc_comment)]
    Admission(crate::admission::EvalAdmissionArgs),
    /// Measure whether retrieved memories (worked examples, as the executor shows them) make
    /// the model follow a required output format: each rule-checked task is answered with
    /// and without the top-k memories, and both follow rates are printed.
    ///
    /// Examples:
    ///   starling eval format --tasks benches/memory/format_tasks.jsonl \
    ///       --memories benches/memory/format_memories.jsonl
    ///   starling eval format --tasks t.jsonl --memories m.jsonl --k 3 --json
    #[command(verbatim_doc_comment)]
    Format(crate::format::EvalFormatArgs),
    /// Run multi-node question answering end to end: per scenario, one node per scenario
    /// node on loopback (each with its own documents, all sharing one copy of the models);
    /// the asker gets the question and the task's short answer is scored. Right: every
    /// answer part has an alias in it (case-insensitive) and it has at most 60 words; an
    /// answer to an answerable question that also says "unknown" (or another way to say it)
    /// is wrong. Modes, measured in the same run:
    ///   swarm   every scenario node is up; the question goes to the asker (default)
    ///   alone   only the asker, with only its own documents
    ///   oracle  one node named as the asker, holding every document of the scenario
    /// Reports accuracy (overall, per tier, unanswerable), team precision and recall
    /// (members recruited vs the scenario's needs), tokens and chat messages per task and
    /// seconds per task. A scenario that fails or times out counts as wrong.
    ///
    /// Examples:
    ///   starling eval swarm-qa --data swarm_qa/dev.jsonl
    ///   starling eval swarm-qa --data dev.jsonl --mode swarm --mode alone --mode oracle
    ///   starling eval swarm-qa --data dev.jsonl --limit 2 --json --out rows.jsonl
    #[command(verbatim_doc_comment)]
    SwarmQa(crate::swarm_qa::SwarmQaArgs),
}

/// Arguments of `starling eval team-formation`.
#[derive(Debug, Args)]
pub struct TeamFormationArgs {
    /// Benchmark file: one JSON object per line with task_id, task_description and agents
    /// (the gold team: agent_name, agent_type, agent_description).
    #[arg(long)]
    pub data: PathBuf,
    /// Candidates retrieved per task (default: the whole registry). Gold agents not
    /// retrieved count as ranked after every other agent.
    #[arg(long)]
    pub top: Option<usize>,
    /// Print the results as JSON.
    #[arg(long)]
    pub json: bool,
    /// Embedding model: a registry name, a directory, or a source.
    #[arg(long, env = "STARLING_EMBED_MODEL", default_value = "all-minilm-l6-v2")]
    pub embed_model: String,
    /// Weight of the cosine in the hybrid score.
    #[arg(long)]
    pub semantic_weight: Option<f32>,
    /// Weight of BM25 in the hybrid score.
    #[arg(long)]
    pub lexical_weight: Option<f32>,
    /// Also run the real LLM team-formation loop (on the first --limit tasks).
    #[arg(long)]
    pub full: bool,
    /// Tasks the --full loop runs on (each costs several model calls).
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// The chat model of the --full loop.
    #[command(flatten)]
    pub model: ModelArgs,
}

/// Arguments of `starling eval synth-team`.
#[derive(Debug, Args)]
pub struct SynthTeamArgs {
    /// Agent cards in the registry (each is in at least one gold team).
    #[arg(long, default_value_t = 1200)]
    pub cards: usize,
    /// Tasks (teams of 2-4 agents; needs cards <= 4 x tasks).
    #[arg(long, default_value_t = 500)]
    pub tasks: usize,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Probability that a task names an action or object with the cards' own key term
    /// instead of a paraphrase.
    #[arg(long, default_value_t = 0.5)]
    pub lexical_overlap: f64,
    /// Most context (noise) sentences per task.
    #[arg(long, default_value_t = 2)]
    pub context_sentences: usize,
    /// Output file (JSON Lines).
    #[arg(long)]
    pub out: PathBuf,
}

/// Runs an `eval` subcommand.
pub fn run(home: &Path, command: EvalCommand) -> anyhow::Result<()> {
    match command {
        EvalCommand::TeamFormation(args) => run_team_formation(home, args),
        EvalCommand::SynthTeam(args) => run_synth_team(args),
        EvalCommand::Memory(args) => crate::memory_cmd::run(home, args),
        EvalCommand::Admission(args) => crate::admission::run(home, args),
        EvalCommand::Format(args) => crate::format::run(home, args),
        EvalCommand::SwarmQa(args) => crate::swarm_qa::run(home, args),
    }
}

fn run_synth_team(args: SynthTeamArgs) -> anyhow::Result<()> {
    let records = synth::generate(SynthConfig {
        cards: args.cards,
        tasks: args.tasks,
        seed: args.seed,
        lexical_overlap: args.lexical_overlap,
        context_sentences: args.context_sentences,
    })?;
    let file = std::fs::File::create(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let mut out = std::io::BufWriter::new(file);
    for r in &records {
        serde_json::to_writer(&mut out, r)?;
        out.write_all(b"\n")?;
    }
    out.flush()
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    eprintln!(
        "wrote {} tasks over {} agents to {}",
        records.len(),
        args.cards,
        args.out.display()
    );
    Ok(())
}

/// Embeds `texts` in batches, with a progress bar on stderr.
pub fn embed_texts(
    embedder: &dyn Embedder,
    texts: &[String],
    label: &str,
) -> anyhow::Result<Vec<Vec<f32>>> {
    const CHUNK: usize = 128;
    let bar = ProgressBar::new(texts.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{msg:>8} [{bar:30}] {pos}/{len} ({per_sec}, eta {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(label.to_string());
    let mut out = Vec::with_capacity(texts.len());
    for chunk in texts.chunks(CHUNK) {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        out.extend(embedder.embed(&refs)?);
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    Ok(out)
}

/// Embeds groups of texts (flattened into batches), keeping the grouping.
pub fn embed_groups(
    embedder: &dyn Embedder,
    groups: &[Vec<String>],
    label: &str,
) -> anyhow::Result<Vec<Vec<Vec<f32>>>> {
    let flat: Vec<String> = groups.iter().flatten().cloned().collect();
    let mut vectors = embed_texts(embedder, &flat, label)?.into_iter();
    Ok(groups
        .iter()
        .map(|g| vectors.by_ref().take(g.len()).collect())
        .collect())
}

/// Embeds every card of the registry, one vector per passage ([`card_passages`]).
pub fn embed_cards(
    dataset: &Dataset,
    embedder: &dyn Embedder,
) -> anyhow::Result<Vec<Vec<Vec<f32>>>> {
    let cards: Vec<Vec<String>> = dataset.registry.iter().map(card_passages).collect();
    embed_groups(embedder, &cards, "cards")
}

/// Embeds the task descriptions and evaluates retrieval over the cards (embedded with
/// [`embed_cards`]).
pub fn team_formation_report(
    dataset: &Dataset,
    embedder: &dyn Embedder,
    card_vectors: &[Vec<Vec<f32>>],
    config: &RetrievalConfig,
) -> anyhow::Result<RetrievalReport> {
    let queries: Vec<String> = dataset
        .tasks
        .iter()
        .map(|t| t.description.clone())
        .collect();
    let start = std::time::Instant::now();
    let query_vectors = embed_texts(embedder, &queries, "queries")?;
    let parts: Vec<Vec<String>> = queries
        .iter()
        .map(|q| starling_node::search::query_parts(q))
        .collect();
    let part_vectors = embed_groups(embedder, &parts, "task sentences")?;
    tracing::info!(
        texts = query_vectors.len() + part_vectors.iter().map(Vec::len).sum::<usize>(),
        secs = start.elapsed().as_secs_f64(),
        "embedded task descriptions and their sentences"
    );
    let mut report = team_formation::evaluate_retrieval(
        dataset,
        card_vectors,
        &query_vectors,
        &part_vectors,
        config,
    )?;
    // A node embeds one task at a time, with its sentences in the same batch: time that on
    // up to 50 tasks.
    let mut times = Vec::new();
    for (q, p) in queries.iter().zip(&parts).take(50) {
        let mut batch = vec![q.as_str()];
        batch.extend(p.iter().map(String::as_str));
        let start = std::time::Instant::now();
        embedder.embed(&batch)?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    report.embed_p50_ms = times.get(times.len() / 2).copied().unwrap_or(0.0);
    Ok(report)
}

fn run_team_formation(home: &Path, args: TeamFormationArgs) -> anyhow::Result<()> {
    let dataset = Dataset::load(&args.data)?;
    let source = registry::parse_spec(&args.embed_model)?;
    let dir = ModelCache::new(home)
        .resolve(&source, &Progress::new())
        .with_context(|| format!("cannot get embedding model `{}`", args.embed_model))?;
    let embedder =
        BertEmbedder::load(&dir).with_context(|| format!("cannot load {}", dir.display()))?;
    let mut config = RetrievalConfig {
        depth: args.top,
        ..RetrievalConfig::default()
    };
    if let Some(w) = args.semantic_weight {
        config.semantic_weight = w;
    }
    if let Some(w) = args.lexical_weight {
        config.lexical_weight = w;
    }
    let card_vectors = embed_cards(&dataset, &embedder)?;
    let report = team_formation_report(&dataset, &embedder, &card_vectors, &config)?;
    let full = if args.full {
        Some(run_full(home, &args, &dataset, &card_vectors, embedder)?)
    } else {
        None
    };
    if args.json {
        let out = serde_json::json!({
            "data": args.data,
            "embed_model": args.embed_model,
            "semantic_weight": config.semantic_weight,
            "lexical_weight": config.lexical_weight,
            "top": args.top,
            "report": report,
            "paper": {"top1": PAPER.0, "top10": PAPER.1, "mean_rank": PAPER.2, "mrr": PAPER.3},
            "full": full,
        });
        println!("{}", serde_json::to_string(&out)?);
        return Ok(());
    }
    println!(
        "{}: {} tasks, {} agents, {} gold pairs; embeddings {}; fused = {:.2} x cosine + {:.2} x BM25 (max-normalised)",
        args.data.display(),
        report.fused.tasks,
        report.agents,
        report.fused.gold_pairs,
        args.embed_model,
        config.semantic_weight,
        config.lexical_weight
    );
    println!(
        "{:<10} {:>9} {:>9} {:>7} {:>7} {:>9} {:>7}",
        "method", "Recall@g", "Recall@10", "Top@1", "Top@10", "mean rank", "MRR"
    );
    let row = |name: &str, m: &Metrics| {
        println!(
            "{:<10} {:>8.1}% {:>8.1}% {:>6.1}% {:>6.1}% {:>9.1} {:>6.1}%",
            name,
            m.recall_at_g * 100.0,
            m.recall_at_10 * 100.0,
            m.top1 * 100.0,
            m.top10 * 100.0,
            m.mean_rank,
            m.mrr * 100.0
        );
    };
    row("bm25", &report.bm25);
    row("dense", &report.dense);
    row("rrf", &report.rrf);
    row("fused", &report.fused_whole);
    row("+ sentences", &report.fused);
    println!(
        "{:<10} {:>9} {:>9} {:>6.1}% {:>6.1}% {:>9.1} {:>6.1}%   (IoA paper, regular team formation)",
        "paper",
        "-",
        "-",
        PAPER.0 * 100.0,
        PAPER.1 * 100.0,
        PAPER.2,
        PAPER.3 * 100.0
    );
    let h = &report.fused;
    println!(
        "node vs paper: Top@1 {:+.1} pt, Top@10 {:+.1} pt, mean rank {:+.1}, MRR {:+.1} pt (Recall@g vs the paper's Top@1: {:+.1} pt)",
        (h.top1 - PAPER.0) * 100.0,
        (h.top10 - PAPER.1) * 100.0,
        h.mean_rank - PAPER.2,
        (h.mrr - PAPER.3) * 100.0,
        (h.recall_at_g - PAPER.0) * 100.0
    );
    println!(
        "index build {:.1} ms; per task: embedding p50 {:.1} ms, fused search p50 {:.2} ms over {} cards",
        report.index_ms, report.embed_p50_ms, report.query_p50_ms, report.agents
    );
    if let Some(f) = &full {
        println!(
            "full LLM loop on {} tasks ({}): gold recruited {:.1}%, precision of recruits {:.1}%, mean team size {:.2}, mean tool calls {:.2}",
            f.tasks,
            args.model.model,
            f.gold_recruited * 100.0,
            f.precision * 100.0,
            f.team_size,
            f.tool_calls
        );
        println!(
            "  gold shown as candidates {:.1}%, worked alone {:.1}%, launch forced {:.1}%, {:.0} prompt + {:.0} completion tokens and {:.1} s per task",
            f.gold_seen * 100.0,
            f.alone * 100.0,
            f.forced * 100.0,
            f.prompt_tokens,
            f.completion_tokens,
            f.seconds
        );
    }
    Ok(())
}

/// Runs the real team-formation loop with the chat model of `args` on the first
/// `args.limit` tasks.
fn run_full(
    home: &Path,
    args: &TeamFormationArgs,
    dataset: &Dataset,
    card_vectors: &[Vec<Vec<f32>>],
    embedder: BertEmbedder,
) -> anyhow::Result<FormationReport> {
    let engine = starling_node::loading::load_engine(home, &args.model.options())?;
    let llm = Llm::new(starling_models::engine::ModelSlot::new(engine));
    let search = RegistrySearch::new(&dataset.registry, card_vectors, embedder)?;
    let limit = args.limit.min(dataset.tasks.len());
    let quiet = args.json;
    let report = starling_node::commands::block_on(formation_loop::evaluate_formation(
        dataset,
        &llm,
        &search,
        limit,
        &FormationConfig::default(),
        |i, o| {
            if !quiet {
                eprintln!(
                    "[{}/{limit}] {}: recruited {} of {} gold ({} recruits, {} calls) queries: {}",
                    i + 1,
                    o.task_id,
                    o.correct,
                    o.gold,
                    o.recruits.len(),
                    o.tool_calls,
                    o.queries.join(" | ")
                );
            }
        },
    ))??;
    Ok(report)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn team_formation_on_a_small_generated_benchmark_with_the_real_model() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("tasks.jsonl");
        run_synth_team(SynthTeamArgs {
            cards: 120,
            tasks: 40,
            seed: 11,
            lexical_overlap: 0.5,
            context_sentences: 2,
            out: data.clone(),
        })
        .unwrap();
        let dataset = Dataset::load(&data).unwrap();
        assert_eq!(dataset.registry.len(), 120);
        assert_eq!(dataset.tasks.len(), 40);
        let embedder = BertEmbedder::load(starling_models::testing::embedding_model()).unwrap();
        let cards = embed_cards(&dataset, &embedder).unwrap();
        let report =
            team_formation_report(&dataset, &embedder, &cards, &RetrievalConfig::default())
                .unwrap();
        assert_eq!(report.agents, 120);
        let (h, b) = (report.fused, report.bm25);
        // A random ranking of 120 agents has MRR ~0.04 and Top@10 ~0.08.
        assert!(h.mrr > 0.15 && h.top10 > 0.3, "{h:?}");
        // The paraphrased tasks defeat BM25 alone more than the fused search.
        assert!(
            h.mrr > b.mrr && h.mean_rank < b.mean_rank,
            "hybrid {h:?}\nbm25 {b:?}"
        );
        // Truncating the candidate list can only lower recall-like metrics.
        let shallow = team_formation_report(
            &dataset,
            &embedder,
            &cards,
            &RetrievalConfig {
                depth: Some(3),
                ..RetrievalConfig::default()
            },
        )
        .unwrap();
        assert!(shallow.fused.top10 <= h.top10 && shallow.fused.mean_rank >= h.mean_rank);
    }
}
