//! The grounded pipeline (decomposition, probing, routing, bridges, calculations, the
//! answer template) run offline over swarm-QA scenario files, with every node's documents
//! in memory and no model or network: the same functions the runtime calls. It checks the
//! project's own scenarios (`benches/swarm_qa/own.jsonl`) and prints per-scenario results;
//! the development split is scored too when `../shared/eval/swarm_qa/dev.jsonl` exists.
//!
//! `GROUNDED_DEBUG=<scenario id>` prints what each node located for a scenario of an opened
//! set; `GROUNDED_STAGES=1` prints, for every set, counts of where each part of a direct
//! question went ([`stage_of`]), which keeps unread sets unread; `GROUNDED_STAGES=show`
//! also prints, for the opened sets only, the hits of every part not answered right.

use std::path::Path;

use starling_eval::swarm_qa::{load_scenarios, quotes_alias, score_answer, Scenario, ScenarioNode};
use starling_node::agent::grounded::{
    self, Inquiry, Next, NodeHit, PlanStep, Planner, SubQuestion, Unit,
};

/// A node's units in the order a node reads them (`GROUNDED_REVERSE`: the other order, to
/// find answers that depend on reading order).
fn units_of(n: &ScenarioNode) -> Vec<Unit> {
    n.units(std::env::var_os("GROUNDED_REVERSE").is_some())
}

fn probe(nodes: &[(String, Vec<Unit>)], subs: &[SubQuestion]) -> Vec<Vec<NodeHit>> {
    subs.iter()
        .map(|s| {
            nodes
                .iter()
                .flat_map(|(name, units)| {
                    grounded::locate(s, units, grounded::LOCATE_K)
                        .into_iter()
                        .map(move |l| NodeHit {
                            node_id: name.clone(),
                            located: l,
                            prior: 0.0,
                        })
                })
                .collect()
        })
        .collect()
}

/// Where a part of a `single` or `parallel` question went, counted with
/// `GROUNDED_STAGES=1` (counts only, so unread sets stay unread). The winner is the first
/// of the best-scoring hits holding a value, as a node reads its own list. A quoting unit
/// is a located unit whose text holds one of the part's aliases.
fn stage_of(hits: &[NodeHit], aliases: &[String], asker: &str) -> &'static str {
    let quotes = |t: &str| quotes_alias(t, aliases);
    let quoting: Vec<&NodeHit> = hits
        .iter()
        .filter(|h| quotes(&h.located.unit.text))
        .collect();
    let best = grounded::best_direct(hits).map(|b| b.located.score);
    let winner = hits
        .iter()
        .find(|h| h.located.span.is_some() && Some(h.located.score) == best);
    let Some(w) = winner else {
        return if quoting.iter().any(|h| h.located.span.is_some()) {
            "unknown: quoting unit's value under MIN_SCORE"
        } else if !quoting.is_empty() {
            "unknown: no value read from a quoting unit"
        } else {
            "unknown: nothing quoting located"
        };
    };
    if w.located.span.as_deref().is_some_and(quotes) {
        "right"
    } else if quotes(&w.located.unit.text) {
        "wrong span of the right unit"
    } else if quoting.is_empty() {
        "wrong: nothing quoting located"
    } else if quoting.iter().all(|h| h.located.span.is_none()) {
        "wrong: no value read from a quoting unit"
    } else if w.node_id == asker {
        "wrong: the asker's own unit won"
    } else if quoting
        .iter()
        .any(|h| h.node_id == w.node_id && h.located.unit.document == w.located.unit.document)
    {
        "wrong: another unit of the same document won"
    } else if quoting.iter().any(|h| h.node_id == w.node_id) {
        "wrong: another document of the same node won"
    } else {
        "wrong: another node won"
    }
}

/// `GROUNDED_STAGES=show`, on an opened set: for every part of a direct question that was
/// not answered right, its sub-question, its stage and the six best hits (a `*` marks a
/// unit quoting the answer), then any lower hit quoting it.
fn show_lost_parts(s: &Scenario, subs: &[SubQuestion], hits: &[Vec<NodeHit>], stages: &[&str]) {
    let line = |x: &NodeHit, part: &[String]| {
        format!(
            "   {}{} {:.2} {:?} | {} :: {}",
            if quotes_alias(&x.located.unit.text, part) {
                "*"
            } else {
                " "
            },
            x.node_id,
            x.located.score,
            x.located.span,
            x.located.unit.document,
            x.located.unit.text
        )
    };
    for (((sub, h), part), stage) in subs.iter().zip(hits).zip(&s.answer_parts).zip(stages) {
        if *stage == "right" {
            continue;
        }
        eprintln!(
            "## {} [{stage}] {:?} slot {:?} {:?} want {part:?}",
            s.id, sub.text, sub.slot, sub.slot_terms
        );
        let mut ranked: Vec<&NodeHit> = h.iter().collect();
        ranked.sort_by(|a, b| b.located.score.total_cmp(&a.located.score));
        for (i, x) in ranked.iter().enumerate() {
            if i < 6 || quotes_alias(&x.located.unit.text, part) {
                eprintln!("{}", line(x, part));
            }
        }
    }
}

/// Answers one scenario the way the runtime does (every node probed): the answer, the
/// team, and with `GROUNDED_STAGES` where each part went ([`stage_of`]); `unread` keeps
/// `GROUNDED_STAGES=show` from printing anything of it.
fn answer(s: &Scenario, unread: bool) -> (String, Vec<String>, Vec<&'static str>) {
    let mut stages = Vec::new();
    let nodes: Vec<(String, Vec<Unit>)> = s
        .nodes
        .iter()
        .map(|n| (n.name.clone(), units_of(n)))
        .collect();
    // The same plan as the runtime, its probes answered from the documents in memory.
    let cards = s
        .nodes
        .iter()
        .map(|n| {
            (
                n.name.clone(),
                format!("{} {}", n.description, n.skills.join(" ")),
            )
        })
        .collect();
    let mut planner = Planner::new(&s.question)
        .with_cards(cards)
        .with_host(&s.asker);
    let routed = loop {
        match planner.next_step() {
            PlanStep::Probe(asked) => {
                let hits = probe(&nodes, &asked);
                planner.handle(hits);
                // GROUNDED_DEBUG=<scenario id> (or `all`): the sub-questions and what each node located.
                if std::env::var("GROUNDED_DEBUG").is_ok_and(|id| id == s.id || id == "all") {
                    for (sub, h) in planner.subs().iter().zip(planner.hits()) {
                        eprintln!(
                            "{} sub {:?} slot {:?} {:?}",
                            s.id, sub.text, sub.slot, sub.slot_terms
                        );
                        eprintln!("   terms {:?}", sub.terms);
                        for x in h {
                            eprintln!(
                                "   {} {} {:.2} {:?} | {}",
                                s.id,
                                x.node_id,
                                x.located.score,
                                x.located.span,
                                x.located.unit.text
                            );
                        }
                    }
                }
            }
            PlanStep::Done(routed) => {
                if std::env::var_os("GROUNDED_STAGES").is_some()
                    && matches!(s.tier.as_str(), "single" | "parallel2" | "parallel3")
                    && planner.subs().len() == s.answer_parts.len()
                {
                    stages = (planner.hits().iter().zip(&s.answer_parts))
                        .map(|(h, part)| stage_of(h, part, &s.asker))
                        .collect();
                    if !unread && std::env::var("GROUNDED_STAGES").is_ok_and(|v| v == "show") {
                        show_lost_parts(s, planner.subs(), planner.hits(), &stages);
                    }
                }
                break routed;
            }
        }
    };
    let mut inq = Inquiry::new(&s.question, &s.asker, routed);
    let members = inq.members();
    for _round in 0..4 {
        match inq.next_step() {
            Next::Conclude(a) => return (a.answer, members, stages),
            Next::Assign(steps) => {
                for (node, text) in steps {
                    let sub = inq.step_sub(&node, &text).expect("pending step");
                    if std::env::var("GROUNDED_DEBUG").is_ok_and(|id| id == s.id || id == "all") {
                        eprintln!("{} step {node}: {text}", s.id);
                    }
                    let units = &nodes.iter().find(|(n, _)| *n == node).expect("node").1;
                    inq.record(
                        &node,
                        &text,
                        grounded::locate(&sub, units, grounded::LOCATE_K),
                    );
                }
            }
        }
    }
    (inq.answer().answer, members, stages)
}

/// Scores every scenario of a file; `unread` prints the count only, so the failures of a set
/// kept for honest measurement are not read while working on the pipeline.
fn score_file(path: &Path, unread: bool) -> Option<(usize, usize)> {
    if !path.exists() {
        return None;
    }
    let scenarios = load_scenarios(path).expect("scenario file");
    let mut ok = 0;
    // Per tier: (right, of, answered `unknown` where a fact was asked).
    let mut tiers: std::collections::BTreeMap<&str, (usize, usize, usize)> = Default::default();
    // Where the parts of direct questions went (counts only; empty without `GROUNDED_STAGES`).
    let mut stages: std::collections::BTreeMap<&str, usize> = Default::default();
    for s in &scenarios {
        let (a, members, parts) = answer(s, unread);
        for stage in parts {
            *stages.entry(stage).or_insert(0) += 1;
        }
        let good = score_answer(&a, &s.answer_parts, &s.tier);
        ok += usize::from(good);
        let t = tiers.entry(s.tier.as_str()).or_default();
        t.0 += usize::from(good);
        t.1 += 1;
        t.2 += usize::from(!good && s.tier != "unanswerable" && a.contains("unknown"));
        if unread {
            continue;
        }
        eprintln!(
            "{} {:<12} {:<5} team {:?}: {}",
            s.id,
            s.tier,
            if good { "RIGHT" } else { "wrong" },
            members,
            a
        );
    }
    eprintln!("{}: {ok}/{}", path.display(), scenarios.len());
    for (stage, n) in stages {
        eprintln!("  parts: {n:>3}  {stage}");
    }
    // Totals by tier (right/of, and wrong answers holding an `unknown` part): a summary that
    // says which stage to study without showing any scenario of an unread set.
    let by_tier: Vec<String> = tiers
        .iter()
        .map(|(t, (r, n, u))| format!("{t} {r}/{n} ({u} unknown)"))
        .collect();
    eprintln!("  tiers: {}", by_tier.join(", "));
    Some((ok, scenarios.len()))
}

#[test]
fn grounded_pipeline_keeps_its_score_on_the_projects_own_scenarios() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let (ok, n) =
        score_file(&root.join("benches/swarm_qa/own.jsonl"), false).expect("own scenarios");
    if let Some((dok, dn)) = score_file(&root.join("../shared/eval/swarm_qa/dev.jsonl"), false) {
        eprintln!("dev split: {dok}/{dn}");
    }
    // Written after development by helpers that did not read the pipeline: scored, never
    // asserted on (see benches/swarm_qa/README.md).
    // `blind` to `blind3` became development sets on 2026-12-05 (their failures were read to
    // find what does not generalise); `blind4` to `blind8` print their counts only, so their
    // failures stay unread and measure the change.
    for name in [
        "fresh", "holdout", "blind", "blind2", "blind3", "blind4", "blind5", "blind6", "blind7",
        "blind8",
    ] {
        let path = root.join(format!("benches/swarm_qa/{name}.jsonl"));
        let unread = matches!(name, "blind4" | "blind5" | "blind6" | "blind7" | "blind8");
        if let Some((ok, n)) = score_file(&path, unread) {
            eprintln!("{name} scenarios: {ok}/{n}");
        }
    }
    assert_eq!(n, 24);
    // A regression floor, a little under what the pipeline answers now (16/24).
    assert!(ok >= 13, "only {ok}/{n} right");
}
