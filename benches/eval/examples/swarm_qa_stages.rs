//! Where the grounded pipeline loses answers, in counts only, so that scenario sets kept
//! unread stay unread. For every answer part of an answerable, non-calc scenario, pooling
//! every node's evidence units:
//!
//! - whether some unit quotes one of the part's aliases at all;
//! - the best rank such a unit gets for any of the question's sub-questions under the
//!   pipeline's lexical `locate`, and whether the span copied from it holds the alias;
//! - the same rank under cosine of all-MiniLM-L6-v2 embeddings alone, and under the lexical
//!   score plus `--dense-weight` times the cosine;
//! - with `--choice`: whether the 135M chat model, shown the lexical top four units and
//!   asked which one answers (a constrained one-letter choice), picks the quoting unit more
//!   often than the lexical order does.
//!
//! - with `--upr K`: the lexical top K re-ordered by how likely the chat model finds the
//!   sub-question after each unit (query likelihood, as in UPR, Sachan et al. 2022), alone
//!   and fused with the lexical order by reciprocal rank; the unit is shown in a chat turn
//!   asking for a question it answers, or with `--upr-text` as raw text.
//!
//! - with `--judge K`: the lexical top K judged one at a time (no list, so no position to
//!   prefer) by how much more likely the chat model finds `Yes` than `No` after "does
//!   this passage answer the question?", alone and fused with the lexical order by
//!   reciprocal rank. `STARLING_TEST_LLM` picks the model (a GGUF path).
//!
//! - with `--copy K`: the chat model shown the lexical top K units of the sub-question that
//!   ranks the quoting unit best, and made to copy its answer from them (greedy, constrained
//!   to a run of whole words of one unit): how often the copy holds the answer, against
//!   the pipeline's own span. `COPY_SHOW=1` prints each copy (never on an unread set).
//!
//! - with `--pick K`: the distinct values the pipeline reads from the lexical top K units of
//!   that sub-question, where the answer is among them, chosen by the chat model: the value
//!   it finds most likely as the answer after the notes of all K units and the question
//!   (a), the same less its likelihood after a question that asks nothing in particular (b),
//!   after its own unit alone (c), and (a) and (b) fused with the lexical order by
//!   reciprocal rank; against the lexical order's first value. `PICK_SHOW=1` prints the
//!   scores (never on an unread set).
//!
//! ```text
//! cargo run --release -p starling-eval --example swarm_qa_stages -- [--choice] [--upr K [--upr-text]] [--judge K] [--copy K] [--pick K] [--maxsim K] [--dense-weight W] FILE...
//! ```
//!
//! Results and what they mean for the design: `benches/swarm_qa/README.md`.

use std::path::PathBuf;

use starling_eval::swarm_qa::{load_scenarios, quotes_alias, Scenario};
use starling_models::chat::ChatMessage;
use starling_models::constraint::Constraint;
use starling_models::embed::{BertEmbedder, Embedder};
use starling_models::engine::{Chunk, Engine, EngineConfig, GenerateRequest, Prompt};
use starling_node::agent::grounded::{self, SubQuestion, Unit};
use starling_node::search::TokenBits;

/// An answer part: its aliases, matched case-insensitively.
struct Part<'a>(&'a [String]);

impl Part<'_> {
    fn quoted_in(&self, text: &str) -> bool {
        quotes_alias(text, self.0)
    }
}

/// Counts of best ranks: first, second or third, fourth to tenth, lower or nowhere.
#[derive(Default)]
struct Ranks([usize; 4]);

impl Ranks {
    fn add(&mut self, rank: Option<usize>) {
        let b = match rank {
            Some(0) => 0,
            Some(1..=2) => 1,
            Some(3..=9) => 2,
            _ => 3,
        };
        self.0[b] += 1;
    }
}

impl std::fmt::Display for Ranks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [a, b, c, d] = self.0;
        write!(f, "r1 {a:>2}  r2-3 {b:>2}  r4-10 {c:>2}  lower {d:>2}")
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The rank of the first unit quoting `part` when units are ordered by `score`, best first.
fn rank_by(units: &[Unit], part: &Part, score: &[f32]) -> Option<usize> {
    let mut order: Vec<usize> = (0..units.len()).collect();
    order.sort_by(|&a, &b| score[b].total_cmp(&score[a]));
    order.iter().position(|&i| part.quoted_in(&units[i].text))
}

/// The model's choice among the lexical top four for `sub`: (index of the quoting unit,
/// index chosen), when a quoting unit is among them.
fn model_choice(
    engine: &Engine,
    sub: &SubQuestion,
    units: &[Unit],
    part: &Part,
) -> anyhow::Result<Option<(usize, usize)>> {
    const LETTERS: [&str; 4] = ["A", "B", "C", "D"];
    let found = grounded::locate(sub, units, LETTERS.len());
    let Some(right) = found.iter().position(|l| part.quoted_in(&l.unit.text)) else {
        return Ok(None);
    };
    let mut prompt = format!("Question: {}\n\n", sub.text);
    for (letter, l) in LETTERS.iter().zip(&found) {
        prompt.push_str(&format!("{letter}. {}\n", l.unit.text));
    }
    prompt.push_str("\nWhich passage answers the question? Answer with its letter.");
    let mut req = GenerateRequest::chat(vec![ChatMessage::user(prompt)]);
    req.max_tokens = 1;
    req.constraint = Some(Constraint::Regex(format!(
        "[A-{}]",
        LETTERS[found.len() - 1]
    )));
    req.logprobs = Some(LETTERS.len());
    let mut g = engine.generate(req)?;
    while let Some(chunk) = g.blocking_next() {
        if let Chunk::Logprob(lp) = chunk? {
            if let Some(p) = LETTERS.iter().position(|x| *x == lp.chosen.token.trim()) {
                return Ok(Some((right, p)));
            }
        }
    }
    Ok(None)
}

/// A unit as the chat model is shown it: its heading, if any, before its text.
fn passage(unit: &Unit) -> String {
    if unit.heading.is_empty() {
        unit.text.clone()
    } else {
        format!("{}: {}", unit.heading, unit.text)
    }
}

/// How likely the model finds `question` after `unit` (mean log-probability per token).
fn query_likelihood(
    engine: &Engine,
    unit: &Unit,
    question: &str,
    raw: bool,
) -> anyhow::Result<f32> {
    let passage = passage(unit);
    let prompt = if raw {
        Prompt::Text(format!(
            "Passage: {passage}\nA question this passage answers:"
        ))
    } else {
        Prompt::Chat(vec![ChatMessage::user(format!(
            "Passage: {passage}\n\nWrite a question that this passage answers."
        ))])
    };
    Ok(engine
        .score(&prompt, &format!(" {question}"))?
        .blocking_wait()?
        .mean())
}

/// How much more likely the model finds `Yes` than `No` as the answer to whether `unit`
/// answers `question` (log-probabilities, each passage judged alone).
fn judge(engine: &Engine, unit: &Unit, question: &str) -> anyhow::Result<f32> {
    let passage = passage(unit);
    let prompt = Prompt::Chat(vec![ChatMessage::user(format!(
        "Passage: {passage}\n\nQuestion: {question}\n\nDoes the passage answer the question? Answer Yes or No."
    ))]);
    let yes = engine.score(&prompt, "Yes")?.blocking_wait()?.mean();
    let no = engine.score(&prompt, "No")?.blocking_wait()?.mean();
    Ok(yes - no)
}

/// The chat model reads `units` and the question and copies its answer from them: the
/// output is constrained to a run of whole words of one unit (llguidance's
/// `substring_words`), greedy. Returns the copied text.
fn copy_answer(engine: &Engine, units: &[&Unit], question: &str) -> anyhow::Result<String> {
    let mut notes = String::new();
    let mut rules = Vec::new();
    for (i, u) in units.iter().enumerate() {
        notes.push_str(&format!("- {}\n", passage(u)));
        let spec = serde_json::json!({ "substring_words": u.text });
        rules.push(format!("u{i}: %regex {spec}"));
    }
    let names: Vec<String> = (0..units.len()).map(|i| format!("u{i}")).collect();
    let grammar = format!("start: {}\n{}\n", names.join(" | "), rules.join("\n"));
    let prompt = format!(
        "Notes:\n{notes}\nQuestion: {question}\nAnswer with the exact words from the notes, as short as possible."
    );
    let mut req = GenerateRequest::chat(vec![ChatMessage::user(prompt)]);
    req.max_tokens = 24;
    req.sampling.temperature = 0.0;
    req.sampling.repeat_penalty = 1.0;
    req.constraint = Some(Constraint::Lark(grammar));
    let mut g = engine.generate(req)?;
    let mut out = String::new();
    while let Some(chunk) = g.blocking_next() {
        if let Chunk::Text(t) = chunk? {
            out.push_str(&t);
        }
    }
    Ok(out.trim().to_string())
}

/// Scores of each candidate value as the answer, by the chat model: (a) mean log-probability
/// of the value after the notes of every located unit and the question, (b) the same less its
/// mean log-probability after the notes and a question that asks nothing in particular
/// (how much the question itself supports the value), (c) mean log-probability after its own
/// unit alone and the question.
fn pick_scores(
    engine: &Engine,
    found: &[grounded::Located],
    cands: &[(String, usize)],
    question: &str,
) -> anyhow::Result<Vec<[f32; 3]>> {
    let mut notes = String::new();
    for l in found {
        notes.push_str(&format!("- {}\n", passage(&l.unit)));
    }
    let ask = |notes: &str, q: &str| {
        Prompt::Chat(vec![ChatMessage::user(format!(
            "Notes:\n{notes}\nQuestion: {q}\nAnswer with a value from the notes."
        ))])
    };
    let with_q = ask(&notes, question);
    let neutral = ask(&notes, "What is one value in the notes?");
    let mut out = Vec::new();
    for (c, at) in cands {
        let a = engine.score(&with_q, c)?.blocking_wait()?.mean();
        let n = engine.score(&neutral, c)?.blocking_wait()?.mean();
        let own = ask(&format!("- {}\n", passage(&found[*at].unit)), question);
        let o = engine.score(&own, c)?.blocking_wait()?.mean();
        out.push([a, a - n, o]);
    }
    Ok(out)
}

/// Reciprocal-rank fusion (k = 60) of `score` with the lexical order, for items given in
/// that order (an item's index is its lexical rank).
fn fused_with_lexical(score: &[f32]) -> Vec<f32> {
    let mut by_score: Vec<usize> = (0..score.len()).collect();
    by_score.sort_by(|&a, &b| score[b].total_cmp(&score[a]));
    let mut rank = vec![0; score.len()];
    for (r, &i) in by_score.iter().enumerate() {
        rank[i] = r;
    }
    (0..score.len())
        .map(|i| 1.0 / (60.0 + i as f32) + 1.0 / (60.0 + rank[i] as f32))
        .collect()
}

/// Best ranks of the quoting unit among the lexical top `k` of each sub-question, ordered
/// by `score` alone and fused with the lexical order (RRF).
fn rerank_ranks(
    subs: &[SubQuestion],
    units: &[Unit],
    part: &Part,
    k: usize,
    mut score: impl FnMut(&Unit, &SubQuestion) -> anyhow::Result<f32>,
) -> anyhow::Result<(Option<usize>, Option<usize>)> {
    let (mut alone, mut fused): (Option<usize>, Option<usize>) = (None, None);
    for sub in subs {
        let found = grounded::locate(sub, units, k);
        if !found.iter().any(|l| part.quoted_in(&l.unit.text)) {
            continue;
        }
        let s: Vec<f32> = found
            .iter()
            .map(|l| score(&l.unit, sub))
            .collect::<anyhow::Result<_>>()?;
        // `found` is in lexical order.
        let rrf = fused_with_lexical(&s);
        let shown: Vec<Unit> = found.into_iter().map(|l| l.unit).collect();
        alone = alone.into_iter().chain(rank_by(&shown, part, &s)).min();
        fused = fused.into_iter().chain(rank_by(&shown, part, &rrf)).min();
    }
    Ok((alone, fused))
}

/// Best ranks of the quoting unit among the lexical top `k` of each sub-question, ordered
/// by query likelihood alone and by reciprocal-rank fusion of it with the lexical order.
fn upr_ranks(
    engine: &Engine,
    subs: &[SubQuestion],
    units: &[Unit],
    part: &Part,
    (k, raw): (usize, bool),
) -> anyhow::Result<(Option<usize>, Option<usize>)> {
    rerank_ranks(subs, units, part, k, |u, sub| {
        query_likelihood(engine, u, &sub.text, raw)
    })
}

fn main() -> anyhow::Result<()> {
    let mut files = Vec::new();
    let mut choice = false;
    let mut weight = 0.5f32;
    let mut upr: Option<usize> = None;
    let mut upr_text = false;
    let mut judge_k: Option<usize> = None;
    let mut maxsim_k: Option<usize> = None;
    let mut copy_k: Option<usize> = None;
    let mut pick_k: Option<usize> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--choice" => choice = true,
            "--upr-text" => upr_text = true,
            "--judge" => {
                judge_k = Some(
                    args.next()
                        .ok_or_else(|| anyhow::anyhow!("--judge needs a value"))?
                        .parse()?,
                )
            }
            "--maxsim" => {
                maxsim_k = Some(
                    args.next()
                        .ok_or_else(|| anyhow::anyhow!("--maxsim needs a value"))?
                        .parse()?,
                )
            }
            "--pick" => {
                pick_k = Some(
                    args.next()
                        .ok_or_else(|| anyhow::anyhow!("--pick needs a value"))?
                        .parse()?,
                )
            }
            "--copy" => {
                copy_k = Some(
                    args.next()
                        .ok_or_else(|| anyhow::anyhow!("--copy needs a value"))?
                        .parse()?,
                )
            }
            "--upr" => {
                upr = Some(
                    args.next()
                        .ok_or_else(|| anyhow::anyhow!("--upr needs a value"))?
                        .parse()?,
                )
            }
            "--dense-weight" => {
                weight = args
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("--dense-weight needs a value"))?
                    .parse()?
            }
            _ => files.push(PathBuf::from(a)),
        }
    }
    anyhow::ensure!(!files.is_empty(), "name one or more scenario files");
    let embedder = BertEmbedder::load(starling_models::testing::embedding_model())?;
    let engine =
        if choice || upr.is_some() || judge_k.is_some() || copy_k.is_some() || pick_k.is_some() {
            Some(Engine::load(
                &starling_models::testing::chat_model(),
                &EngineConfig::default(),
            )?)
        } else {
            None
        };
    for path in &files {
        let scenarios: Vec<Scenario> = load_scenarios(path)?;
        let (mut unquoted, mut span_wrong) = (0, 0);
        let (mut lexical, mut dense, mut hybrid) =
            (Ranks::default(), Ranks::default(), Ranks::default());
        let (mut asked, mut lexical_first, mut model_right, mut picks) = (0, 0, 0, [0usize; 4]);
        let (mut upr_alone, mut upr_fused) = (Ranks::default(), Ranks::default());
        let (mut judge_alone, mut judge_fused) = (Ranks::default(), Ranks::default());
        let (mut late_alone, mut late_fused) = (Ranks::default(), Ranks::default());
        // --copy: parts asked, lexical span right, copy right, copy right in <= 8 words,
        // words copied in all.
        let mut copied = [0usize; 5];
        // --pick: parts whose answer is among the candidates, then right picks of the
        // lexical order, of (a), (b), (c), and of (a) and (b) fused with the lexical order.
        let mut picked = [0usize; 7];
        for s in &scenarios {
            if s.tier == "calc" || s.tier == "unanswerable" {
                continue;
            }
            let units: Vec<Unit> = s.nodes.iter().flat_map(|n| n.units(false)).collect();
            let texts: Vec<String> = units
                .iter()
                .map(|u| format!("{} {}", u.heading, u.text))
                .collect();
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let unit_vectors = embedder.embed(&refs)?;
            let subs = grounded::decompose(&s.question);
            let sub_texts: Vec<&str> = subs.iter().map(|s| s.text.as_str()).collect();
            let sub_vectors = embedder.embed(&sub_texts)?;
            // Token bits of every unit and sub-question, for --maxsim.
            let bits = |texts: &[&str]| -> anyhow::Result<Vec<TokenBits>> {
                Ok(embedder
                    .embed_tokens(texts)?
                    .iter()
                    .map(|t| TokenBits::from_rows(&t.tokens, embedder.dim()))
                    .collect())
            };
            let (unit_bits, sub_bits) = if maxsim_k.is_some() {
                let u: std::collections::HashMap<String, TokenBits> =
                    texts.iter().cloned().zip(bits(&refs)?).collect();
                let q: std::collections::HashMap<String, TokenBits> = sub_texts
                    .iter()
                    .map(|t| t.to_string())
                    .zip(bits(&sub_texts)?)
                    .collect();
                (u, q)
            } else {
                Default::default()
            };
            for aliases in &s.answer_parts {
                let part = Part(aliases);
                if !units.iter().any(|u| part.quoted_in(&u.text)) {
                    unquoted += 1;
                    continue;
                }
                // Best over the sub-questions: (rank, span holds the alias).
                let mut best_lex: Option<(usize, bool)> = None;
                let mut best_sub = 0;
                let (mut best_dense, mut best_hybrid): (Option<usize>, Option<usize>) =
                    (None, None);
                for (i, (sub, q)) in subs.iter().zip(&sub_vectors).enumerate() {
                    let found = grounded::locate(sub, &units, 10);
                    if let Some(r) = found.iter().position(|l| part.quoted_in(&l.unit.text)) {
                        let ok = found[r].span.as_deref().is_some_and(|x| part.quoted_in(x));
                        if best_lex.is_none_or(|(br, bok)| r < br || (r == br && ok && !bok)) {
                            best_lex = Some((r, ok));
                            best_sub = i;
                        }
                    }
                    let cos: Vec<f32> = unit_vectors.iter().map(|v| dot(v, q)).collect();
                    let r = rank_by(&units, &part, &cos);
                    best_dense = best_dense.into_iter().chain(r).min();
                    let mixed: Vec<f32> = units
                        .iter()
                        .zip(&cos)
                        .map(|(u, c)| grounded::score_unit(sub, u).unwrap_or(0.0) + weight * c)
                        .collect();
                    let r = rank_by(&units, &part, &mixed);
                    best_hybrid = best_hybrid.into_iter().chain(r).min();
                }
                if best_lex == Some((0, false)) {
                    span_wrong += 1;
                }
                lexical.add(best_lex.map(|(r, _)| r));
                dense.add(best_dense);
                hybrid.add(best_hybrid);
                if let (Some(engine), Some(k)) = (&engine, upr) {
                    let (a, f) = upr_ranks(engine, &subs, &units, &part, (k, upr_text))?;
                    upr_alone.add(a);
                    upr_fused.add(f);
                }
                if let Some(k) = maxsim_k {
                    let (a, f) = rerank_ranks(&subs, &units, &part, k, |u, sub| {
                        let key = format!("{} {}", u.heading, u.text);
                        Ok(sub_bits[&sub.text].maxsim(&unit_bits[&key]))
                    })?;
                    late_alone.add(a);
                    late_fused.add(f);
                }
                if let (Some(engine), Some(k)) = (&engine, judge_k) {
                    let (a, f) = rerank_ranks(&subs, &units, &part, k, |u, sub| {
                        judge(engine, u, &sub.text)
                    })?;
                    judge_alone.add(a);
                    judge_fused.add(f);
                }
                if let (Some(engine), Some(k), Some((r, ok))) = (&engine, copy_k, best_lex) {
                    if r < k {
                        let sub = &subs[best_sub];
                        let found = grounded::locate(sub, &units, k);
                        let shown: Vec<&Unit> = found.iter().map(|l| &l.unit).collect();
                        let answer = copy_answer(engine, &shown, &sub.text)?;
                        let n = answer.split_whitespace().count();
                        let right = part.quoted_in(&answer);
                        copied[0] += 1;
                        copied[1] += usize::from(r == 0 && ok);
                        copied[2] += usize::from(right);
                        copied[3] += usize::from(right && n <= 8);
                        copied[4] += n;
                        if std::env::var_os("COPY_SHOW").is_some() {
                            eprintln!(
                                "{} | {} | lex {} | copy {:?}",
                                s.id,
                                sub.text,
                                r == 0 && ok,
                                answer
                            );
                        }
                    }
                }
                if let (Some(engine), Some(k), Some(_)) = (&engine, pick_k, best_lex) {
                    let sub = &subs[best_sub];
                    let found = grounded::locate(sub, &units, k);
                    // Distinct values in the lexical order, with the unit each came from.
                    let mut cands: Vec<(String, usize)> = Vec::new();
                    for (i, l) in found.iter().enumerate() {
                        if let Some(v) = &l.span {
                            if !cands.iter().any(|(c, _)| c == v) {
                                cands.push((v.clone(), i));
                            }
                        }
                    }
                    if cands.iter().any(|(c, _)| part.quoted_in(c)) {
                        let sc = pick_scores(engine, &found, &cands, &sub.text)?;
                        let right = |i: usize| usize::from(part.quoted_in(&cands[i].0));
                        let best = |f: &dyn Fn(usize) -> f32| {
                            (0..cands.len())
                                .max_by(|&a, &b| f(a).total_cmp(&f(b)).then(b.cmp(&a)))
                                .unwrap_or(0)
                        };
                        // `cands` is in lexical order.
                        let fused = |j: usize| {
                            fused_with_lexical(&sc.iter().map(|x| x[j]).collect::<Vec<_>>())
                        };
                        let (f0, f1) = (fused(0), fused(1));
                        picked[0] += 1;
                        picked[1] += right(0);
                        picked[2] += right(best(&|i| sc[i][0]));
                        picked[3] += right(best(&|i| sc[i][1]));
                        picked[4] += right(best(&|i| sc[i][2]));
                        picked[5] += right(best(&|i| f0[i]));
                        picked[6] += right(best(&|i| f1[i]));
                        if std::env::var_os("PICK_SHOW").is_some() {
                            eprintln!(
                                "{} | {} | {:?}",
                                s.id,
                                sub.text,
                                cands.iter().map(|c| &c.0).zip(&sc).collect::<Vec<_>>()
                            );
                        }
                    }
                }
                if let (Some(engine), true) = (&engine, choice) {
                    let best = subs
                        .iter()
                        .filter_map(|sub| model_choice(engine, sub, &units, &part).transpose())
                        .collect::<anyhow::Result<Vec<_>>>()?
                        .into_iter()
                        .min_by_key(|(right, _)| *right);
                    if let Some((right, pick)) = best {
                        asked += 1;
                        lexical_first += usize::from(right == 0);
                        model_right += usize::from(pick == right);
                        picks[pick] += 1;
                    }
                }
            }
        }
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        println!("{name}: no unit quotes the answer {unquoted}");
        println!(
            "  lexical locate  {lexical}  (first, but the span copied misses it: {span_wrong})"
        );
        println!("  cosine alone    {dense}");
        println!("  lexical + {weight} cosine  {hybrid}");
        if let Some(k) = upr {
            println!("  lexical top {k} by query likelihood  {upr_alone}");
            println!("  lexical top {k} fused with it (RRF)  {upr_fused}");
        }
        if let Some(k) = maxsim_k {
            println!("  lexical top {k} by MaxSim  {late_alone}");
            println!("  lexical top {k} fused with MaxSim (RRF)  {late_fused}");
        }
        if let Some(k) = judge_k {
            println!("  lexical top {k} judged one by one (yes - no)  {judge_alone}");
            println!("  lexical top {k} fused with the judge (RRF)  {judge_fused}");
        }
        if let Some(k) = copy_k {
            let [n, lex, right, short, words] = copied;
            println!(
                "  copy from the lexical top {k} ({n} parts): lexical span right {lex}, copy right {right} ({short} in <= 8 words), mean words {:.1}",
                words as f32 / n.max(1) as f32
            );
        }
        if let Some(k) = pick_k {
            let [n, lex, a, b, c, fa, fb] = picked;
            println!(
                "  pick a value of the lexical top {k} ({n} parts with the answer among them): lexical {lex}, model (a) {a}, (b) pmi {b}, (c) own unit {c}, fused (a) {fa}, fused (b) {fb}"
            );
        }
        if choice {
            println!(
                "  choice among the lexical top 4 ({asked} parts): lexical first right {lexical_first}, model right {model_right}, model's picks by position {picks:?}"
            );
        }
    }
    Ok(())
}
