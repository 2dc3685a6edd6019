//! `starling eval admission`: how well memory admission separates good prompt–answer pairs
//! from corrupted ones, with the node's real admission path and model.
//!
//! Every good pair `{"domain", "prompt", "answer"}` of the file yields corrupted variants:
//!
//! - **shuffled**: the answer of another pair of the same domain;
//! - **truncated**: the answer cut mid-sentence (about halfway, at a word boundary);
//! - **off-domain**: the pair filed under another domain of the file;
//! - **empty**: an empty answer.
//!
//! Each good and corrupted pair goes through [`assess`] (text checks, embedding checks, the
//! LLM's rubric score and the threshold: what a node runs before publishing). The pool the
//! embedding checks compare with is real: pairs are split into two folds (alternating
//! within each domain) and each fold is judged against a book holding the other fold's good
//! pairs, so no pair is judged against a pool containing itself. The shuffled partner comes
//! from the same fold, so the pool never holds the pair its answer belongs to.
//!
//! Pairs stopped by a check are also scored by the LLM, to report what the LLM alone would
//! have done and the score distributions per variant; the threshold sweep uses them too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use starling_models::embed::EmbedHandle;
use starling_models::engine::ModelSlot;

use crate::memory::load_jsonl;
use starling_node::cli::ModelArgs;
use starling_node::llm::Llm;
use starling_node::memory::admission::{assess, score_pair};
use starling_node::memory::record::{normalize_text, MAX_SCORE};
use starling_node::memory::{AdmissionConfig, BookConfig, Memory, MemoryBook, Pair, Rejection};
use starling_node::store::Store;

/// Arguments of `starling eval admission`.
#[derive(Debug, Args)]
pub struct EvalAdmissionArgs {
    /// Good pairs: JSON Lines of {"domain", "prompt", "answer"}.
    #[arg(long)]
    pub pairs: PathBuf,
    /// Use only the first N good pairs.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Admission threshold (default: the node's).
    #[arg(long)]
    pub threshold: Option<f32>,
    /// Print JSON (with every judged pair).
    #[arg(long)]
    pub json: bool,
    /// Embedding model: a registry name, a directory, or a source.
    #[arg(long, env = "STARLING_EMBED_MODEL", default_value = "all-minilm-l6-v2")]
    pub embed_model: String,
    /// The chat model that scores pairs.
    #[command(flatten)]
    pub model: ModelArgs,
}

/// One good pair of the input file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GoodPair {
    /// Domain pool.
    pub domain: String,
    /// The prompt.
    pub prompt: String,
    /// A good answer to it.
    pub answer: String,
}

/// What was done to a good pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Variant {
    /// Unchanged.
    Good,
    /// Answer taken from another pair of the same domain.
    Shuffled,
    /// Answer cut mid-sentence.
    Truncated,
    /// Filed under another domain.
    OffDomain,
    /// Empty answer.
    Empty,
}

impl Variant {
    /// Every variant, in report order.
    pub const ALL: [Variant; 5] = [
        Variant::Good,
        Variant::Shuffled,
        Variant::Truncated,
        Variant::OffDomain,
        Variant::Empty,
    ];

    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Good => "good",
            Variant::Shuffled => "shuffled",
            Variant::Truncated => "truncated",
            Variant::OffDomain => "off_domain",
            Variant::Empty => "empty",
        }
    }
}

/// A pair to judge.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// How it was made.
    pub variant: Variant,
    /// Index of the good pair it was made from.
    pub source: usize,
    /// Fold (0 or 1) of that good pair.
    pub fold: usize,
    /// The pair offered for admission.
    pub pair: Pair,
}

/// `answer` cut mid-sentence: the words up to about 55% of its length, never ending on a
/// sentence end. `None` when the answer is too short to cut (fewer than three words kept).
pub fn truncate_answer(answer: &str) -> Option<String> {
    let t = answer.trim();
    let mut target = t.len() * 55 / 100;
    while !t.is_char_boundary(target) {
        target -= 1;
    }
    let cut = t[..target].rfind(char::is_whitespace)?;
    let mut head = t[..cut].trim_end();
    while head.ends_with(['.', '!', '?']) {
        let i = head.rfind(char::is_whitespace)?;
        head = head[..i].trim_end();
    }
    (head.split_whitespace().count() >= 3).then(|| head.to_owned())
}

/// Fold of each pair: alternating within its domain, in file order.
pub fn folds(pairs: &[GoodPair]) -> Vec<usize> {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    pairs
        .iter()
        .map(|p| {
            let n = seen.entry(p.domain.as_str()).or_default();
            let fold = *n % 2;
            *n += 1;
            fold
        })
        .collect()
}

/// The good pairs and their corrupted variants (see the module docs). A variant that cannot
/// be made (a domain with one pair in a fold, an answer too short to cut, a file with one
/// domain) is left out.
pub fn build_candidates(pairs: &[GoodPair]) -> Vec<Candidate> {
    let fold = folds(pairs);
    let domains: Vec<&str> = {
        let mut d: Vec<&str> = pairs.iter().map(|p| p.domain.as_str()).collect();
        d.sort_unstable();
        d.dedup();
        d
    };
    let make = |variant, i: usize, domain: &str, answer: String| Candidate {
        variant,
        source: i,
        fold: fold[i],
        pair: Pair {
            domain: domain.to_owned(),
            prompt: pairs[i].prompt.clone(),
            answer,
            source: None,
        },
    };
    let mut out = Vec::new();
    for (i, p) in pairs.iter().enumerate() {
        out.push(make(Variant::Good, i, &p.domain, p.answer.clone()));
        // The next pair of the same domain and fold (cyclically) with a different answer.
        let group: Vec<usize> = (0..pairs.len())
            .filter(|&j| pairs[j].domain == p.domain && fold[j] == fold[i])
            .collect();
        let at = group.iter().position(|&j| j == i).unwrap_or(0);
        let partner = (1..group.len())
            .map(|step| group[(at + step) % group.len()])
            .find(|&j| normalize_text(&pairs[j].answer) != normalize_text(&p.answer));
        if let Some(j) = partner {
            out.push(make(
                Variant::Shuffled,
                i,
                &p.domain,
                pairs[j].answer.clone(),
            ));
        }
        if let Some(cut) = truncate_answer(&p.answer) {
            out.push(make(Variant::Truncated, i, &p.domain, cut));
        }
        if domains.len() > 1 {
            let at = domains.iter().position(|d| *d == p.domain).unwrap_or(0);
            let other = domains[(at + 1) % domains.len()];
            out.push(make(Variant::OffDomain, i, other, p.answer.clone()));
        }
        out.push(make(Variant::Empty, i, &p.domain, String::new()));
    }
    out
}

/// Where admission stopped a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Admitted.
    Accepted,
    /// Stopped by the text checks (invalid, echo, truncated).
    Text,
    /// Stopped by the embedding checks (unrelated answer, off-domain prompt).
    Embedding,
    /// Scored below the threshold by the LLM.
    Score,
}

impl Stage {
    fn of(r: &Rejection) -> Self {
        match r {
            Rejection::Invalid(_) | Rejection::Echo | Rejection::Truncated(_) => Stage::Text,
            Rejection::OffDomain { .. }
            | Rejection::Unrelated { .. }
            | Rejection::Mismatched { .. } => Stage::Embedding,
            Rejection::LowScore { .. } | Rejection::Duplicate { .. } => Stage::Score,
        }
    }
}

/// The verdict on one candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Judged {
    /// How the pair was made.
    pub variant: Variant,
    /// Index of its good pair in the file.
    pub source: usize,
    /// The domain it was filed under.
    pub domain: String,
    /// Where admission stopped it.
    pub stage: Stage,
    /// Why it was rejected.
    pub reason: Option<String>,
    /// The LLM's rubric score (also for pairs the checks stopped; `None` for invalid ones).
    pub score: Option<f32>,
}

impl Judged {
    fn accepted(&self) -> bool {
        self.stage == Stage::Accepted
    }

    /// Would be accepted at `threshold` (the checks unchanged).
    fn accepted_at(&self, threshold: f32) -> bool {
        matches!(self.stage, Stage::Accepted | Stage::Score)
            && self.score.is_some_and(|s| s >= threshold)
    }
}

/// Results for one variant.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VariantStats {
    /// Pairs judged.
    pub n: usize,
    /// Pairs admitted.
    pub accepted: usize,
    /// accepted / n.
    pub acceptance: f64,
    /// Stopped by the text checks.
    pub rejected_text: usize,
    /// Stopped by the embedding checks.
    pub rejected_embedding: usize,
    /// Scored below the threshold.
    pub rejected_score: usize,
    /// Pairs the LLM scored.
    pub scored: usize,
    /// Mean LLM score over those.
    pub mean_score: f64,
    /// Share of scored pairs at or above the threshold (the LLM alone, no checks).
    pub llm_alone_acceptance: f64,
    /// How many scored pairs got each score 0..=10.
    pub histogram: Vec<usize>,
}

/// Precision and recall at one threshold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepPoint {
    /// The threshold.
    pub threshold: f32,
    /// Share of accepted pairs that are good.
    pub precision: f64,
    /// Share of good pairs accepted.
    pub recall: f64,
    /// Corrupted pairs accepted.
    pub corrupted_accepted: usize,
}

/// The result of `starling eval admission`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdmissionReport {
    /// Good pairs used.
    pub good_pairs: usize,
    /// Domains.
    pub domains: Vec<String>,
    /// The chat model.
    pub model: String,
    /// The threshold applied.
    pub threshold: f32,
    /// Per variant.
    pub variants: BTreeMap<Variant, VariantStats>,
    /// Share of admitted pairs that are good (all variants).
    pub precision: f64,
    /// Share of good pairs admitted.
    pub recall: f64,
    /// Precision if only the LLM score decided (no checks).
    pub llm_alone_precision: f64,
    /// Recall if only the LLM score decided.
    pub llm_alone_recall: f64,
    /// Precision and recall of the full path at every threshold 0..=10.
    pub sweep: Vec<SweepPoint>,
    /// Every judged pair.
    pub judged: Vec<Judged>,
    /// Seconds spent judging.
    pub seconds: f64,
}

/// Turns verdicts into the report's statistics.
pub fn summarize(judged: &[Judged], threshold: f32) -> AdmissionReportStats {
    let mut variants: BTreeMap<Variant, VariantStats> = BTreeMap::new();
    for j in judged {
        let s = variants.entry(j.variant).or_insert_with(|| VariantStats {
            histogram: vec![0; MAX_SCORE as usize + 1],
            ..VariantStats::default()
        });
        s.n += 1;
        match j.stage {
            Stage::Accepted => s.accepted += 1,
            Stage::Text => s.rejected_text += 1,
            Stage::Embedding => s.rejected_embedding += 1,
            Stage::Score => s.rejected_score += 1,
        }
        if let Some(score) = j.score {
            s.scored += 1;
            s.mean_score += f64::from(score);
            if score >= threshold {
                s.llm_alone_acceptance += 1.0;
            }
            let bin = (score.round().max(0.0) as usize).min(s.histogram.len() - 1);
            s.histogram[bin] += 1;
        }
    }
    for s in variants.values_mut() {
        s.acceptance = ratio(s.accepted, s.n);
        if s.scored > 0 {
            s.mean_score /= s.scored as f64;
            s.llm_alone_acceptance /= s.scored as f64;
        }
    }
    let pr = |accept: &dyn Fn(&Judged) -> bool| {
        let good = judged.iter().filter(|j| j.variant == Variant::Good);
        let good_n = good.clone().count();
        let good_ok = good.filter(|j| accept(j)).count();
        let all_ok = judged.iter().filter(|j| accept(j)).count();
        (
            ratio(good_ok, all_ok),
            ratio(good_ok, good_n),
            all_ok - good_ok,
        )
    };
    let (precision, recall, _) = pr(&|j| j.accepted());
    let (llm_alone_precision, llm_alone_recall, _) =
        pr(&|j| j.score.is_some_and(|s| s >= threshold));
    let sweep = (0..=MAX_SCORE as u8)
        .map(|t| {
            let t = f32::from(t);
            let (precision, recall, corrupted_accepted) = pr(&|j| j.accepted_at(t));
            SweepPoint {
                threshold: t,
                precision,
                recall,
                corrupted_accepted,
            }
        })
        .collect();
    AdmissionReportStats {
        variants,
        precision,
        recall,
        llm_alone_precision,
        llm_alone_recall,
        sweep,
    }
}

/// The statistics part of [`AdmissionReport`].
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionReportStats {
    /// Per variant.
    pub variants: BTreeMap<Variant, VariantStats>,
    /// Share of admitted pairs that are good.
    pub precision: f64,
    /// Share of good pairs admitted.
    pub recall: f64,
    /// Precision of the LLM score alone.
    pub llm_alone_precision: f64,
    /// Recall of the LLM score alone.
    pub llm_alone_recall: f64,
    /// The threshold sweep.
    pub sweep: Vec<SweepPoint>,
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// Books for the two folds: fold f is judged against the good pairs of fold 1 - f.
async fn fold_books(
    pairs: &[GoodPair],
    fold: &[usize],
    embedder: &EmbedHandle,
) -> anyhow::Result<[MemoryBook; 2]> {
    let mut books = Vec::with_capacity(2);
    for f in 0..2 {
        let book = MemoryBook::open(
            Store::open_in_memory()?,
            Some(embedder.clone()),
            None,
            BookConfig::default(),
        )
        .await?;
        // The pool is the node's own memories (one author, this node: its profile judges
        // the candidates as in a node that wrote them).
        let me = book.me().to_owned();
        let items = pairs
            .iter()
            .enumerate()
            .filter(|(i, _)| fold[*i] != f)
            .map(|(i, p)| {
                let body = MemoryBook::body(&p.domain, &p.prompt, &p.answer, None, 8.0);
                (
                    Memory::from_body(format!("pool-{i}"), me.clone(), body),
                    None,
                )
            })
            .collect();
        book.insert_many(items).await?;
        books.push(book);
    }
    let b1 = books.pop().context("two books were made")?;
    let b0 = books.pop().context("two books were made")?;
    Ok([b0, b1])
}

/// Judges every candidate with the real admission path.
async fn judge_all(
    pairs: &[GoodPair],
    candidates: &[Candidate],
    llm: &Llm,
    embedder: &EmbedHandle,
    config: &AdmissionConfig,
    quiet: bool,
) -> anyhow::Result<Vec<Judged>> {
    let books = fold_books(pairs, &folds(pairs), embedder).await?;
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(candidates.len() as u64)
    };
    bar.set_style(
        ProgressStyle::with_template("judging [{bar:30}] {pos}/{len} (eta {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut out = Vec::with_capacity(candidates.len());
    for c in candidates {
        let book = &books[c.fold];
        let verdict = assess(book, Some(llm), config, &c.pair, None).await?;
        let (stage, reason, score) = match verdict {
            Ok(a) => (Stage::Accepted, None, Some(a.score)),
            Err(r) => {
                let stage = Stage::of(&r);
                let score = match &r {
                    Rejection::LowScore { score, .. } => Some(*score),
                    Rejection::Invalid(_) => None,
                    _ => {
                        Some(score_pair(llm, &c.pair.domain, &c.pair.prompt, &c.pair.answer).await?)
                    }
                };
                (stage, Some(r.to_string()), score)
            }
        };
        tracing::debug!(
            variant = c.variant.name(),
            source = c.source,
            ?stage,
            ?score,
            "judged"
        );
        out.push(Judged {
            variant: c.variant,
            source: c.source,
            domain: c.pair.domain.clone(),
            stage,
            reason,
            score,
        });
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(out)
}

/// Runs `starling eval admission`.
pub fn run(home: &Path, args: EvalAdmissionArgs) -> anyhow::Result<()> {
    let mut pairs: Vec<GoodPair> = load_jsonl(&args.pairs)?;
    if let Some(n) = args.limit {
        pairs.truncate(n);
    }
    anyhow::ensure!(!pairs.is_empty(), "{} has no pairs", args.pairs.display());
    let mut config = AdmissionConfig::default();
    if let Some(t) = args.threshold {
        config.threshold = t;
    }
    let candidates = build_candidates(&pairs);
    let embedder =
        starling_node::loading::load_embedder(home, &args.embed_model, Default::default())?;
    let engine = starling_node::loading::load_engine(home, &args.model.options())?;
    let llm = Llm::new(ModelSlot::new(engine));
    let start = std::time::Instant::now();
    let judged = starling_node::commands::block_on(judge_all(
        &pairs,
        &candidates,
        &llm,
        &embedder,
        &config,
        args.json,
    ))??;
    let stats = summarize(&judged, config.threshold);
    let mut domains: Vec<String> = pairs.iter().map(|p| p.domain.clone()).collect();
    domains.sort_unstable();
    domains.dedup();
    let report = AdmissionReport {
        good_pairs: pairs.len(),
        domains,
        model: args.model.model.clone(),
        threshold: config.threshold,
        variants: stats.variants,
        precision: stats.precision,
        recall: stats.recall,
        llm_alone_precision: stats.llm_alone_precision,
        llm_alone_recall: stats.llm_alone_recall,
        sweep: stats.sweep,
        judged,
        seconds: start.elapsed().as_secs_f64(),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(())
}

/// The report as text.
pub fn render(r: &AdmissionReport) -> String {
    let mut s = format!(
        "{} good pairs over {} domains ({}); model {}; threshold {}; {:.0} s\n\n",
        r.good_pairs,
        r.domains.len(),
        r.domains.join(", "),
        r.model,
        r.threshold,
        r.seconds
    );
    s += &format!(
        "{:<11} {:>4} {:>9} {:>6} {:>6} {:>6} {:>10} {:>9}  {}\n",
        "variant",
        "n",
        "accepted",
        "text",
        "embed",
        "score",
        "mean score",
        "LLM alone",
        "score histogram 0..10"
    );
    for v in Variant::ALL {
        let Some(x) = r.variants.get(&v) else {
            continue;
        };
        let hist: Vec<String> = x.histogram.iter().map(ToString::to_string).collect();
        s += &format!(
            "{:<11} {:>4} {:>8.1}% {:>6} {:>6} {:>6} {:>10} {:>8.1}%  [{}]\n",
            v.name(),
            x.n,
            x.acceptance * 100.0,
            x.rejected_text,
            x.rejected_embedding,
            x.rejected_score,
            if x.scored > 0 {
                format!("{:.2}", x.mean_score)
            } else {
                "-".into()
            },
            x.llm_alone_acceptance * 100.0,
            hist.join(" ")
        );
    }
    s += &format!(
        "\nadmission: precision {:.1}%, recall of good pairs {:.1}%\nLLM score alone (no checks): precision {:.1}%, recall {:.1}%\n",
        r.precision * 100.0,
        r.recall * 100.0,
        r.llm_alone_precision * 100.0,
        r.llm_alone_recall * 100.0
    );
    s += "\nthreshold sweep (checks + score >= t): t precision recall corrupted-accepted\n";
    for p in &r.sweep {
        s += &format!(
            "  {:>4} {:>8.1}% {:>6.1}% {:>5}\n",
            p.threshold,
            p.precision * 100.0,
            p.recall * 100.0,
            p.corrupted_accepted
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(domain: &str, prompt: &str, answer: &str) -> GoodPair {
        GoodPair {
            domain: domain.into(),
            prompt: prompt.into(),
            answer: answer.into(),
        }
    }

    #[test]
    fn truncation_cuts_mid_sentence() {
        let a = "Water boils at 100 degrees Celsius at sea level. At altitude it boils lower.";
        let cut = truncate_answer(a).unwrap();
        assert!(a.starts_with(&cut) && cut.len() < a.len(), "{cut:?}");
        assert!(!cut.ends_with(['.', '!', '?']), "{cut:?}");
        assert!(cut.split_whitespace().count() >= 3);
        // Backs off past a sentence end that lands right at the cut.
        let b = "One two three four five six. Seven eight nine ten eleven twelve";
        let cut = truncate_answer(b).unwrap();
        assert_eq!(cut, "One two three four five");
        // Too short to cut into something that still reads like an answer.
        assert_eq!(truncate_answer("391"), None);
        assert_eq!(truncate_answer("It is 391."), None);
        // Multibyte text is cut at a character boundary.
        let c = "Le café coûte trois euros à Paris, été comme hiver, selon le menu.";
        assert!(c.starts_with(&truncate_answer(c).unwrap()));
    }

    #[test]
    fn variants_are_built_per_domain_and_fold() {
        let pairs = vec![
            pair("math", "What is 2+2?", "2 + 2 = 4, so the answer is four."),
            pair("math", "What is 3+3?", "3 + 3 = 6, so the answer is six."),
            pair("math", "What is 4+4?", "4 + 4 = 8, so the answer is eight."),
            pair(
                "code",
                "Print hi in Python.",
                "Use print(\"hi\") in a Python script file.",
            ),
            pair("math", "What is 5+5?", "5 + 5 = 10, so the answer is ten."),
        ];
        assert_eq!(folds(&pairs), vec![0, 1, 0, 0, 1]);
        let c = build_candidates(&pairs);
        let of = |i: usize, v: Variant| c.iter().find(|c| c.source == i && c.variant == v);
        // Good pairs unchanged.
        assert_eq!(of(0, Variant::Good).unwrap().pair.answer, pairs[0].answer);
        // Shuffled: the next pair of the same domain and fold.
        assert_eq!(
            of(0, Variant::Shuffled).unwrap().pair.answer,
            pairs[2].answer
        );
        assert_eq!(
            of(2, Variant::Shuffled).unwrap().pair.answer,
            pairs[0].answer
        );
        assert_eq!(
            of(1, Variant::Shuffled).unwrap().pair.answer,
            pairs[4].answer
        );
        assert_eq!(
            of(1, Variant::Shuffled).unwrap().pair.prompt,
            pairs[1].prompt
        );
        // The only code pair has no partner.
        assert!(of(3, Variant::Shuffled).is_none());
        // Off-domain: the next domain in sorted order, same prompt and answer.
        let off = &of(0, Variant::OffDomain).unwrap().pair;
        assert_eq!(
            (off.domain.as_str(), off.answer.as_str()),
            ("code", pairs[0].answer.as_str())
        );
        assert_eq!(of(3, Variant::OffDomain).unwrap().pair.domain, "math");
        // Truncated and empty.
        let t = &of(0, Variant::Truncated).unwrap().pair.answer;
        assert!(pairs[0].answer.starts_with(t.as_str()) && t.len() < pairs[0].answer.len());
        assert_eq!(of(4, Variant::Empty).unwrap().pair.answer, "");
        for x in &c {
            assert_eq!(x.fold, folds(&pairs)[x.source]);
        }
    }

    fn judged(variant: Variant, stage: Stage, score: Option<f32>) -> Judged {
        Judged {
            variant,
            source: 0,
            domain: "math".into(),
            stage,
            reason: None,
            score,
        }
    }

    #[test]
    fn summary_counts_precision_and_recall() {
        let j = vec![
            judged(Variant::Good, Stage::Accepted, Some(8.0)),
            judged(Variant::Good, Stage::Score, Some(4.0)),
            judged(Variant::Shuffled, Stage::Accepted, Some(7.0)),
            judged(Variant::Shuffled, Stage::Embedding, Some(9.0)),
            judged(Variant::Empty, Stage::Text, None),
        ];
        let s = summarize(&j, 6.0);
        assert!((s.precision - 0.5).abs() < 1e-9);
        assert!((s.recall - 0.5).abs() < 1e-9);
        // The LLM alone would also take the shuffled pair the embedding check stopped.
        assert!((s.llm_alone_precision - 1.0 / 3.0).abs() < 1e-9);
        let sh = &s.variants[&Variant::Shuffled];
        assert_eq!((sh.n, sh.accepted, sh.rejected_embedding), (2, 1, 1));
        assert!((sh.mean_score - 8.0).abs() < 1e-9);
        assert_eq!(sh.histogram[7] + sh.histogram[9], 2);
        assert_eq!(s.variants[&Variant::Empty].scored, 0);
        // At threshold 4 the low-scored good pair is in; the check still stops the other.
        let t4 = &s.sweep[4];
        assert!((t4.recall - 1.0).abs() < 1e-9 && t4.corrupted_accepted == 1);
    }
}
