//! `starling eval swarm-qa`: multi-node question answering, end to end.
//!
//! Every scenario of the file runs in this process, as `starling demo` runs its personas: one
//! node per scenario node on loopback (no mDNS, one fresh swarm secret per scenario, nothing
//! leaves the machine), each with its own documents, all sharing one copy of the models. The
//! asker gets the question; the task's short `answer` (never the conclusion) is scored.
//!
//! Modes, measured in the same run:
//! * `swarm`: every scenario node is up, the question is submitted at the asker;
//! * `alone`: only the asker, with only its own documents;
//! * `oracle`: one node, named as the asker, holding every document of the scenario (each
//!   node's documents in a sub-folder named after the node).
//!
//! Scoring ([`score_answer`]): an answer is right when every `answer_parts` group has an alias
//! in it (case-insensitive substring) and it has at most [`MAX_ANSWER_WORDS`] words; an answer
//! to an answerable question that also says "unknown" (any of [`UNANSWERABLE_ALIASES`]) is
//! wrong, so hedging does not pay.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};
use starling_discovery::SwarmSecret;
use starling_models::source::registry;

use starling_node::agent::grounded::{AnswerStatus, Citation};
use starling_node::cli::ModelArgs;
use starling_node::config::NodeConfig;
use starling_node::daemon::{Node, SharedModels, StartOptions};

pub use starling_node::agent::grounded::MAX_ANSWER_WORDS;

/// Ways to say that the swarm does not know: the part of an `unanswerable` scenario, and a
/// hedge that makes an answer to an answerable question wrong.
pub const UNANSWERABLE_ALIASES: &[&str] = &[
    "unknown",
    "not known",
    "no information",
    "cannot be determined",
    "don't know",
    "do not know",
    "not found",
];

/// The tier of scenarios that no node can answer.
pub const UNANSWERABLE_TIER: &str = "unanswerable";

/// The tiers of the benchmark, in the order reports list them (others follow by name).
pub const TIERS: &[&str] = &[
    "single",
    "parallel2",
    "parallel3",
    "bridge",
    "calc",
    UNANSWERABLE_TIER,
];

/// How long the asker may take to learn every card of its scenario.
const CARD_WAIT: Duration = Duration::from_secs(30);

/// Which nodes a scenario runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Every scenario node; the question is submitted at the asker.
    Swarm,
    /// Only the asker, with only its own documents.
    Alone,
    /// One node named as the asker, holding every document of the scenario.
    Oracle,
}

impl Mode {
    /// The mode's name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Swarm => "swarm",
            Mode::Alone => "alone",
            Mode::Oracle => "oracle",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Arguments of `starling eval swarm-qa`.
#[derive(Debug, Args)]
pub struct SwarmQaArgs {
    /// Benchmark file: one scenario per line (id, tier, question, answer_parts, asker, needs,
    /// nodes with their documents).
    #[arg(long)]
    pub data: PathBuf,
    /// Mode to measure: swarm (all nodes), alone (the asker with its own documents only) or
    /// oracle (one node holding every document); repeat to measure several in one run
    /// (default: swarm).
    #[arg(long = "mode", value_enum)]
    pub modes: Vec<Mode>,
    /// Run only the first N scenarios.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Seconds a scenario's task may take before it counts as failed (wrong).
    #[arg(long, default_value_t = 120)]
    pub timeout_secs: u64,
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Write one JSON line per scenario and mode to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Embedding model of the nodes: a registry name, a directory, or a source.
    #[arg(long, env = "STARLING_EMBED_MODEL", default_value = "all-minilm-l6-v2")]
    pub embed_model: String,
    /// The chat model shared by all nodes.
    #[command(flatten)]
    pub model: ModelArgs,
}

// ---------------------------------------------------------------------------------------
// Data

/// A document of a scenario node.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct ScenarioDocument {
    /// File name.
    pub name: String,
    /// Its text.
    pub text: String,
}

/// A node of a scenario.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct ScenarioNode {
    /// Node name (unique within the scenario).
    pub name: String,
    /// Its agent card's description.
    #[serde(default)]
    pub description: String,
    /// Its card's skills (optional).
    #[serde(default)]
    pub skills: Vec<String>,
    /// Its private documents.
    #[serde(default)]
    pub documents: Vec<ScenarioDocument>,
}

impl ScenarioNode {
    /// Its documents' evidence units in the order a node reads them: documents by file
    /// name, as the runtime's document index lists its folder (`reverse`: the other order,
    /// to find answers that depend on reading order).
    pub fn units(&self, reverse: bool) -> Vec<starling_node::agent::grounded::Unit> {
        let mut docs: Vec<_> = self.documents.iter().collect();
        docs.sort_by(|a, b| a.name.cmp(&b.name));
        if reverse {
            docs.reverse();
        }
        docs.iter()
            .flat_map(|d| starling_node::agent::grounded::document_units(&d.name, &d.text))
            .collect()
    }
}

/// One scenario (one line of the benchmark file). Unknown fields are ignored.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct Scenario {
    /// Scenario id.
    pub id: String,
    /// Split (`dev`, ...).
    #[serde(default)]
    pub split: String,
    /// Tier: single, parallel2, parallel3, bridge, calc or unanswerable.
    pub tier: String,
    /// The question given to the asker.
    pub question: String,
    /// Alias lists: the answer is right when every list has an alias in it.
    pub answer_parts: Vec<Vec<String>>,
    /// A reference answer (not used in scoring).
    #[serde(default)]
    pub answer: String,
    /// The node that receives the question.
    pub asker: String,
    /// The nodes whose documents hold the needed facts (never the asker).
    #[serde(default)]
    pub needs: Vec<String>,
    /// The scenario's nodes.
    pub nodes: Vec<ScenarioNode>,
}

impl Scenario {
    /// Checks what serde cannot: known asker and needs, unique non-empty node names.
    fn check(&self) -> Result<(), String> {
        if self.id.trim().is_empty() {
            return Err("empty `id`".into());
        }
        if self.answer_parts.is_empty() || self.answer_parts.iter().any(Vec::is_empty) {
            return Err("`answer_parts` needs at least one non-empty alias list".into());
        }
        let mut names = BTreeSet::new();
        for n in &self.nodes {
            if n.name.trim().is_empty() || n.name.chars().count() > 64 {
                return Err(format!("node name `{}` must be 1 to 64 characters", n.name));
            }
            if !names.insert(n.name.as_str()) {
                return Err(format!("node `{}` appears twice", n.name));
            }
        }
        if !names.contains(self.asker.as_str()) {
            return Err(format!(
                "the asker `{}` is not one of the nodes",
                self.asker
            ));
        }
        if let Some(n) = self.needs.iter().find(|n| !names.contains(n.as_str())) {
            return Err(format!(
                "`needs` names `{n}`, which is not one of the nodes"
            ));
        }
        Ok(())
    }

    fn asker_node(&self) -> Option<&ScenarioNode> {
        self.nodes.iter().find(|n| n.name == self.asker)
    }
}

/// Parses a benchmark file's text (JSON Lines; blank lines are skipped). Errors name
/// `source` and the line.
pub fn parse_scenarios(text: &str, source: &str) -> anyhow::Result<Vec<Scenario>> {
    let mut out = Vec::new();
    let mut ids = BTreeSet::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let s: Scenario = serde_json::from_str(line)
            .with_context(|| format!("{source} line {}: not a swarm-qa scenario", i + 1))?;
        s.check()
            .map_err(|e| anyhow::anyhow!("{source} line {} (scenario {}): {e}", i + 1, s.id))?;
        anyhow::ensure!(
            ids.insert(s.id.clone()),
            "{source} line {}: scenario id `{}` appears twice",
            i + 1,
            s.id
        );
        out.push(s);
    }
    Ok(out)
}

/// Reads and parses a benchmark file.
pub fn load_scenarios(path: &Path) -> anyhow::Result<Vec<Scenario>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    parse_scenarios(&text, &path.display().to_string())
}

// ---------------------------------------------------------------------------------------
// Scoring

/// Words of `text`, split at whitespace.
pub fn word_count(text: &str) -> usize {
    text.split_whitespace().count()
}

fn contains_any(haystack_lower: &str, aliases: &[impl AsRef<str>]) -> bool {
    aliases
        .iter()
        .any(|a| haystack_lower.contains(&a.as_ref().to_lowercase()))
}

/// Whether `text` holds one of `aliases` (case-insensitive substring), as [`score_answer`]
/// reads an answer part.
pub fn quotes_alias(text: &str, aliases: &[impl AsRef<str>]) -> bool {
    contains_any(&text.to_lowercase(), aliases)
}

/// Whether `answer` is right: at most [`MAX_ANSWER_WORDS`] words, every group of `parts`
/// has an alias in it (case-insensitive substring), and, unless `tier` is `unanswerable`,
/// it says none of [`UNANSWERABLE_ALIASES`].
pub fn score_answer(answer: &str, parts: &[Vec<String>], tier: &str) -> bool {
    if word_count(answer) > MAX_ANSWER_WORDS || parts.is_empty() {
        return false;
    }
    let lower = answer.to_lowercase();
    if !parts.iter().all(|group| contains_any(&lower, group)) {
        return false;
    }
    tier == UNANSWERABLE_TIER || !contains_any(&lower, UNANSWERABLE_ALIASES)
}

// ---------------------------------------------------------------------------------------
// Results and their aggregation

/// The outcome of one scenario in one mode (a line of `--out`).
#[derive(Clone, Debug, Serialize)]
pub struct ScenarioRow {
    /// The mode.
    pub mode: Mode,
    /// Scenario id.
    pub id: String,
    /// Its tier.
    pub tier: String,
    /// The question.
    pub question: String,
    /// The task's short answer (empty when the task failed).
    pub answer: String,
    /// The answer's citations.
    pub citations: Vec<Citation>,
    /// The answer's status (none when the task failed).
    pub status: Option<AnswerStatus>,
    /// Whether the answer is right ([`score_answer`]).
    pub correct: bool,
    /// The asker.
    pub asker: String,
    /// The scenario's `needs`.
    pub needs: Vec<String>,
    /// The task's members (names, the asker first).
    pub members: Vec<String>,
    /// Seconds the task took.
    pub wall_s: f64,
    /// Model tokens (prompt + completion) all nodes of the scenario processed for the task.
    pub tokens: u64,
    /// Chat messages the asker stored for the task's group.
    pub messages: usize,
    /// Why the scenario failed, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ScenarioRow {
    fn new(mode: Mode, s: &Scenario) -> Self {
        Self {
            mode,
            id: s.id.clone(),
            tier: s.tier.clone(),
            question: s.question.clone(),
            answer: String::new(),
            citations: Vec::new(),
            status: None,
            correct: false,
            asker: s.asker.clone(),
            needs: s.needs.clone(),
            members: Vec::new(),
            wall_s: 0.0,
            tokens: 0,
            messages: 0,
            error: None,
        }
    }

    /// Members other than the asker.
    fn recruited(&self) -> BTreeSet<&str> {
        self.members
            .iter()
            .map(String::as_str)
            .filter(|m| *m != self.asker)
            .collect()
    }
}

/// Accuracy of one tier.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TierReport {
    /// Scenarios of the tier.
    pub n: usize,
    /// Share answered right.
    pub accuracy: f64,
}

/// The metrics of one mode over all its scenarios.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModeReport {
    /// Share of scenarios answered right (0 to 1).
    pub accuracy: f64,
    /// Accuracy per tier.
    pub tiers: BTreeMap<String, TierReport>,
    /// Accuracy on the `unanswerable` tier (null without such scenarios).
    pub unanswerable_accuracy: Option<f64>,
    /// Mean share of recruited members (other than the asker) that the scenario needs, over
    /// scenarios that recruited someone (null when none did).
    pub team_precision: Option<f64>,
    /// Mean share of needed nodes recruited, over scenarios with needs (null when none).
    pub team_recall: Option<f64>,
    /// Mean model tokens all nodes processed per task.
    pub tokens_per_task: f64,
    /// Mean chat messages stored at the asker per task.
    pub messages_per_task: f64,
    /// Mean seconds per task.
    pub mean_wall_s: f64,
    /// Scenarios.
    pub n: usize,
    /// Scenarios that failed (task error, timeout): counted as wrong.
    pub errors: usize,
}

fn mean(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values
        .into_iter()
        .fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    (n > 0).then(|| sum / n as f64)
}

fn share(rows: &[&ScenarioRow]) -> f64 {
    mean(rows.iter().map(|r| if r.correct { 1.0 } else { 0.0 })).unwrap_or(0.0)
}

/// Aggregates the rows of one mode.
pub fn aggregate(rows: &[ScenarioRow]) -> ModeReport {
    let all: Vec<&ScenarioRow> = rows.iter().collect();
    let mut by_tier: BTreeMap<String, Vec<&ScenarioRow>> = BTreeMap::new();
    for r in rows {
        by_tier.entry(r.tier.clone()).or_default().push(r);
    }
    let tiers = by_tier
        .iter()
        .map(|(t, rs)| {
            (
                t.clone(),
                TierReport {
                    n: rs.len(),
                    accuracy: share(rs),
                },
            )
        })
        .collect();
    let unanswerable_accuracy = by_tier.get(UNANSWERABLE_TIER).map(|rs| share(rs));
    let team_precision = mean(rows.iter().filter_map(|r| {
        let recruited = r.recruited();
        (!recruited.is_empty()).then(|| {
            let hits = recruited
                .iter()
                .filter(|m| r.needs.iter().any(|n| n == *m))
                .count();
            hits as f64 / recruited.len() as f64
        })
    }));
    let team_recall = mean(rows.iter().filter(|r| !r.needs.is_empty()).map(|r| {
        let recruited = r.recruited();
        let needs: BTreeSet<&str> = r.needs.iter().map(String::as_str).collect();
        let hits = needs.iter().filter(|n| recruited.contains(*n)).count();
        hits as f64 / needs.len() as f64
    }));
    ModeReport {
        accuracy: share(&all),
        tiers,
        unanswerable_accuracy,
        team_precision,
        team_recall,
        tokens_per_task: mean(rows.iter().map(|r| r.tokens as f64)).unwrap_or(0.0),
        messages_per_task: mean(rows.iter().map(|r| r.messages as f64)).unwrap_or(0.0),
        mean_wall_s: mean(rows.iter().map(|r| r.wall_s)).unwrap_or(0.0),
        n: rows.len(),
        errors: rows.iter().filter(|r| r.error.is_some()).count(),
    }
}

/// The modes to run: as asked, without repeats, in the order first asked (default: swarm).
pub fn modes_to_run(asked: &[Mode]) -> Vec<Mode> {
    let mut out: Vec<Mode> = Vec::new();
    for m in asked {
        if !out.contains(m) {
            out.push(*m);
        }
    }
    if out.is_empty() {
        out.push(Mode::Swarm);
    }
    out
}

/// The `--json` object: the swarm mode's report (else the first mode's) at the top level,
/// with `mode` naming it, and every mode's report under `modes`.
pub fn json_report(
    reports: &[(Mode, ModeReport)],
    extra: serde_json::Map<String, serde_json::Value>,
) -> anyhow::Result<serde_json::Value> {
    let top = reports
        .iter()
        .find(|(m, _)| *m == Mode::Swarm)
        .or_else(|| reports.first())
        .ok_or_else(|| anyhow::anyhow!("no mode was run"))?;
    let mut object = match serde_json::to_value(&top.1)? {
        serde_json::Value::Object(o) => o,
        _ => anyhow::bail!("a report is not a JSON object"),
    };
    object.insert("mode".into(), top.0.name().into());
    let mut modes = serde_json::Map::new();
    for (m, r) in reports {
        modes.insert(m.name().into(), serde_json::to_value(r)?);
    }
    object.insert("modes".into(), modes.into());
    object.extend(extra);
    Ok(object.into())
}

fn pct(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

fn opt_pct(v: Option<f64>) -> String {
    v.map(pct).unwrap_or_else(|| "-".into())
}

/// The readable table: one column per mode, one row per metric.
pub fn render_table(reports: &[(Mode, ModeReport)]) -> String {
    let mut tiers: Vec<String> = TIERS
        .iter()
        .filter(|t| reports.iter().any(|(_, r)| r.tiers.contains_key(**t)))
        .map(|t| t.to_string())
        .collect();
    for (_, r) in reports {
        for t in r.tiers.keys() {
            if !tiers.contains(t) {
                tiers.push(t.clone());
            }
        }
    }
    let mut lines: Vec<(String, Vec<String>)> = Vec::new();
    let mut row = |label: String, f: &dyn Fn(&ModeReport) -> String| {
        lines.push((label, reports.iter().map(|(_, r)| f(r)).collect()));
    };
    row("scenarios".into(), &|r| r.n.to_string());
    row("accuracy".into(), &|r| pct(r.accuracy));
    for t in &tiers {
        row(format!("  {t}"), &|r| match r.tiers.get(t) {
            Some(x) => format!("{} (n={})", pct(x.accuracy), x.n),
            None => "-".into(),
        });
    }
    row("unanswerable".into(), &|r| opt_pct(r.unanswerable_accuracy));
    row("team precision".into(), &|r| opt_pct(r.team_precision));
    row("team recall".into(), &|r| opt_pct(r.team_recall));
    row("tokens/task".into(), &|r| {
        format!("{:.0}", r.tokens_per_task)
    });
    row("messages/task".into(), &|r| {
        format!("{:.1}", r.messages_per_task)
    });
    row("wall s/task".into(), &|r| format!("{:.1}", r.mean_wall_s));
    row("failed".into(), &|r| r.errors.to_string());
    let label_width = lines.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
    let mut out = format!("{:<label_width$}", "");
    for (m, _) in reports {
        out.push_str(&format!(" {:>16}", m.name()));
    }
    out.push('\n');
    for (label, cells) in lines {
        out.push_str(&format!("{label:<label_width$}"));
        for c in cells {
            out.push_str(&format!(" {c:>16}"));
        }
        out.push('\n');
    }
    out
}

// ---------------------------------------------------------------------------------------
// Nodes of a scenario

/// A node to start for a scenario in some mode.
#[derive(Clone, Debug, PartialEq)]
pub struct NodePlan {
    /// Node name.
    pub name: String,
    /// Its card's description.
    pub description: String,
    /// Its card's skills.
    pub skills: Vec<String>,
    /// Its documents: path relative to its document folder, text.
    pub documents: Vec<(PathBuf, String)>,
}

/// A file name that stays inside its folder and is not hidden or skipped by the document
/// index (which reads `.txt`, `.md` and `.markdown` files only).
fn safe_file_name(name: &str) -> String {
    let mut s = path_safe(name).trim_start_matches('.').to_owned();
    if s.is_empty() {
        s = "document".into();
    }
    let lower = s.to_lowercase();
    if ![".md", ".txt", ".markdown"]
        .iter()
        .any(|e| lower.ends_with(e))
    {
        s.push_str(".txt");
    }
    s
}

/// `name` with path separators and control characters replaced by `_`.
fn path_safe(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c == '/' || c == '\\' || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect()
}

/// A folder name for a node: its name, kept inside the parent folder and not hidden.
fn safe_dir_name(name: &str) -> String {
    let s = path_safe(name);
    let s = s.trim_start_matches('.');
    if s.is_empty() {
        "node".into()
    } else {
        s.to_owned()
    }
}

fn documents_of(node: &ScenarioNode, folder: Option<&str>) -> Vec<(PathBuf, String)> {
    let mut used = BTreeSet::new();
    node.documents
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let mut file = safe_file_name(&d.name);
            if !used.insert(file.clone()) {
                file = format!("{i}-{file}");
                used.insert(file.clone());
            }
            let path = match folder {
                Some(f) => Path::new(f).join(file),
                None => PathBuf::from(file),
            };
            (path, d.text.clone())
        })
        .collect()
}

/// The nodes a scenario runs with in `mode`, the asker first.
pub fn plan_nodes(s: &Scenario, mode: Mode) -> anyhow::Result<Vec<NodePlan>> {
    let asker = s
        .asker_node()
        .ok_or_else(|| anyhow::anyhow!("the asker `{}` is not one of the nodes", s.asker))?;
    let plan = |n: &ScenarioNode, documents| NodePlan {
        name: n.name.clone(),
        description: n.description.clone(),
        skills: n.skills.clone(),
        documents,
    };
    Ok(match mode {
        Mode::Swarm => std::iter::once(asker)
            .chain(s.nodes.iter().filter(|n| n.name != s.asker))
            .map(|n| plan(n, documents_of(n, None)))
            .collect(),
        Mode::Alone => vec![plan(asker, documents_of(asker, None))],
        Mode::Oracle => {
            let documents = s
                .nodes
                .iter()
                .flat_map(|n| documents_of(n, Some(&safe_dir_name(&n.name))))
                .collect();
            vec![plan(asker, documents)]
        }
    })
}

/// The config of a planned node: loopback only, no mDNS, `secret`, data and documents under
/// `dir`, both built-in tools.
fn node_config(
    plan: &NodePlan,
    dir: &Path,
    secret: &str,
    model: &ModelArgs,
    embed_model: &str,
) -> anyhow::Result<NodeConfig> {
    let folder = safe_dir_name(&plan.name);
    let docs_dir = dir.join("docs").join(&folder);
    std::fs::create_dir_all(&docs_dir)
        .with_context(|| format!("cannot create {}", docs_dir.display()))?;
    for (path, text) in &plan.documents {
        let file = docs_dir.join(path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(&file, text).with_context(|| format!("cannot write {}", file.display()))?;
    }
    let mut c = NodeConfig::default();
    c.node.name = Some(plan.name.clone());
    c.node.data_dir = Some(dir.join("data").join(&folder));
    c.agent.description = plan.description.clone();
    c.agent.skills = plan.skills.clone();
    c.agent.docs = Some(docs_dir);
    c.agent.tools = vec!["search_docs".into(), "calculator".into()];
    c.network.listen = "127.0.0.1:0".parse()?;
    c.network.bootstrap.clear();
    c.network.mdns = false;
    c.network.swarm_secret = Some(secret.to_owned());
    c.api.listen = "127.0.0.1:0".parse()?;
    c.models.chat = model.model.clone();
    c.models.embedding = embed_model.to_owned();
    c.models.requantize = model.requantize.clone();
    c.models.context = model.ctx;
    c.models.threads = model.threads;
    c.validate()
        .with_context(|| format!("node `{}`", plan.name))?;
    Ok(c)
}

/// Prompt + completion tokens the nodes' models have processed so far.
fn tokens(nodes: &[Node]) -> u64 {
    nodes
        .iter()
        .map(|n| {
            let (p, c, _) = n.agent.llm().counters().snapshot();
            p + c
        })
        .sum()
}

/// What every scenario run shares.
struct RunContext<'a> {
    home: &'a Path,
    shared: SharedModels,
    model: &'a ModelArgs,
    embed_model: &'a str,
    timeout: Duration,
}

/// Runs one scenario in one mode; failures are recorded in the row, never returned.
async fn run_scenario(cx: &RunContext<'_>, s: &Scenario, mode: Mode) -> ScenarioRow {
    let mut row = ScenarioRow::new(mode, s);
    let mut nodes: Vec<Node> = Vec::new();
    let tmp = tempfile::tempdir().context("cannot create a temporary directory");
    let result = match &tmp {
        Ok(tmp) => drive(cx, s, mode, tmp.path(), &mut nodes, &mut row).await,
        Err(e) => Err(anyhow::anyhow!("{e:#}")),
    };
    if let Err(e) = result {
        row.error = Some(format!("{e:#}"));
    }
    for n in &nodes {
        n.shutdown().await;
    }
    drop(nodes);
    row.correct = row.error.is_none() && score_answer(&row.answer, &s.answer_parts, &s.tier);
    row
}

/// Starts the scenario's nodes (pushed to `nodes`, so that the caller stops them whatever
/// happens), submits the question at the asker and fills `row`.
async fn drive(
    cx: &RunContext<'_>,
    s: &Scenario,
    mode: Mode,
    dir: &Path,
    nodes: &mut Vec<Node>,
    row: &mut ScenarioRow,
) -> anyhow::Result<()> {
    let plans = plan_nodes(s, mode)?;
    let secret = SwarmSecret::generate().to_string();
    for plan in &plans {
        let mut c = node_config(plan, dir, &secret, cx.model, cx.embed_model)?;
        if let Some(first) = nodes.first() {
            c.network.bootstrap = vec![format!(
                "{}@{}",
                first.swarm.node_id(),
                first.swarm.advertised_addr()
            )];
        }
        let opts = StartOptions {
            join: None,
            home: cx.home.to_path_buf(),
            models: Some(cx.shared.clone()),
            no_repetition_guard: false,
        };
        let node = Node::start(c, opts)
            .await
            .with_context(|| format!("cannot start node `{}`", plan.name))?;
        nodes.push(node);
    }
    let asker = nodes
        .first()
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no node to ask"))?;
    let waited = Instant::now();
    loop {
        let known = asker.agent.known_cards().len();
        if known >= plans.len() {
            break;
        }
        anyhow::ensure!(
            waited.elapsed() < CARD_WAIT,
            "the asker knew {known} of {} agent cards after {} s",
            plans.len(),
            CARD_WAIT.as_secs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = tokens(nodes);
    let group_id = starling_node::agent::runtime::new_group_id();
    let started = Instant::now();
    let agent = asker.agent.clone();
    let question = s.question.clone();
    let gid = group_id.clone();
    let mut job = tokio::spawn(async move { agent.submit_as(&question, gid).await });
    let outcome = tokio::time::timeout(cx.timeout, &mut job).await;
    row.wall_s = started.elapsed().as_secs_f64();
    let outcome = match outcome {
        Ok(Ok(Ok(result))) => Ok(result),
        Ok(Ok(Err(e))) => Err(anyhow::anyhow!("the task failed: {e}")),
        Ok(Err(e)) => Err(anyhow::anyhow!("the task panicked or was cancelled: {e}")),
        Err(_) => {
            job.abort();
            Err(anyhow::anyhow!(
                "the task took longer than {} s",
                cx.timeout.as_secs()
            ))
        }
    };
    row.tokens = tokens(nodes).saturating_sub(before);
    match asker
        .agent
        .store()
        .messages::<serde_json::Value>(&group_id)
        .await
    {
        Ok(m) => row.messages = m.len(),
        Err(e) => tracing::warn!(error = %e, "cannot count the group's messages"),
    }
    let result = outcome?;
    row.answer = result.answer;
    row.citations = result.citations;
    row.status = Some(result.status);
    row.members = result.members;
    Ok(())
}

fn one_line(text: &str, max_chars: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > max_chars {
        let cut: String = flat.chars().take(max_chars).collect();
        format!("{cut}...")
    } else {
        flat
    }
}

/// Runs `starling eval swarm-qa`.
pub fn run(home: &Path, args: SwarmQaArgs) -> anyhow::Result<()> {
    let mut scenarios = load_scenarios(&args.data)?;
    if let Some(limit) = args.limit {
        scenarios.truncate(limit);
    }
    anyhow::ensure!(args.timeout_secs > 0, "--timeout-secs must be at least 1");
    let modes = modes_to_run(&args.modes);
    let mut out = match &args.out {
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("cannot create {}", p.display()))?,
        )),
        None => None,
    };

    eprintln!("loading models (shared by every node)...");
    let engine = starling_node::loading::load_engine(home, &args.model.options())?;
    let aliases = registry::find(&args.model.model)
        .map(|k| vec![k.name.to_owned()])
        .unwrap_or_default();
    let embedder =
        starling_node::loading::load_embedder(home, &args.embed_model, args.model.embed_backend)?;
    let cx = RunContext {
        home,
        shared: SharedModels {
            chat: starling_models::engine::ModelSlot::new(engine),
            aliases,
            embedder: Some(embedder),
        },
        model: &args.model,
        embed_model: &args.embed_model,
        timeout: Duration::from_secs(args.timeout_secs),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;

    let total = scenarios.len();
    let mut rows: BTreeMap<Mode, Vec<ScenarioRow>> = BTreeMap::new();
    for (i, s) in scenarios.iter().enumerate() {
        for &mode in &modes {
            let row = rt.block_on(run_scenario(&cx, s, mode));
            eprintln!(
                "[{}/{total}] {:<6} {:<10} {:<12} {:<5} {:>6.1} s  {}",
                i + 1,
                mode.name(),
                row.id,
                row.tier,
                if row.correct { "right" } else { "wrong" },
                row.wall_s,
                match &row.error {
                    Some(e) => format!("ERROR {}", one_line(e, 200)),
                    None => one_line(&row.answer, 200),
                }
            );
            if let Some(w) = out.as_mut() {
                serde_json::to_writer(&mut *w, &row)?;
                w.write_all(b"\n")?;
                w.flush()?;
            }
            rows.entry(mode).or_default().push(row);
        }
    }
    drop(rt);

    let reports: Vec<(Mode, ModeReport)> = modes
        .iter()
        .map(|m| (*m, aggregate(rows.get(m).map(Vec::as_slice).unwrap_or(&[]))))
        .collect();
    if args.json {
        let mut extra = serde_json::Map::new();
        extra.insert("data".into(), args.data.display().to_string().into());
        extra.insert("model".into(), args.model.model.clone().into());
        println!("{}", serde_json::to_string(&json_report(&reports, extra)?)?);
    } else {
        println!(
            "swarm-qa: {total} scenarios from {}, model {}",
            args.data.display(),
            args.model.model
        );
        print!("{}", render_table(&reports));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parts(groups: &[&[&str]]) -> Vec<Vec<String>> {
        groups
            .iter()
            .map(|g| g.iter().map(|a| a.to_string()).collect())
            .collect()
    }

    fn unknown_parts() -> Vec<Vec<String>> {
        vec![UNANSWERABLE_ALIASES.iter().map(|a| a.to_string()).collect()]
    }

    /// A made-up scenario in the dev file's format (with an unknown field, `notes`).
    const SCENARIO: &str = r#"{"id": "t-001", "split": "dev", "tier": "parallel2", "question": "How tall is the Orrin lighthouse and who keeps it?", "answer_parts": [["31 m", "31 metres"], ["Ida Vell", "Vell"]], "answer": "It is 31 m tall and Ida Vell keeps it.", "asker": "ana", "needs": ["bo", "cy"], "notes": "ignored", "nodes": [{"name": "ana", "description": "Tour guide.", "documents": [{"name": "tours.md", "text": "Tours start at ten."}]}, {"name": "bo", "description": "Surveyor.", "documents": [{"name": "heights.md", "text": "The Orrin lighthouse is 31 m tall."}, {"name": "notes.md", "text": "Survey done in May."}]}, {"name": "cy", "description": "Harbour master.", "documents": [{"name": "notes.md", "text": "Ida Vell keeps the Orrin lighthouse."}]}]}"#;

    #[test]
    fn right_answer_with_every_part() {
        let p = parts(&[&["31 m", "31 metres"], &["Ida Vell", "Vell"]]);
        assert!(score_answer(
            "The lighthouse is 31 m tall and Ida Vell keeps it.",
            &p,
            "parallel2"
        ));
    }

    #[test]
    fn missing_part_is_wrong() {
        let p = parts(&[&["31 m", "31 metres"], &["Ida Vell", "Vell"]]);
        assert!(!score_answer(
            "The lighthouse is 31 m tall.",
            &p,
            "parallel2"
        ));
        assert!(!score_answer("", &p, "parallel2"));
    }

    #[test]
    fn aliases_match_case_insensitively() {
        let p = parts(&[&["31 metres"], &["Ida Vell"]]);
        assert!(score_answer("31 METRES, kept by ida vell", &p, "parallel2"));
        let p = parts(&[&["Ch 6", "channel 6"]]);
        assert!(score_answer("Use CHANNEL 6.", &p, "single"));
    }

    #[test]
    fn more_than_sixty_words_is_wrong() {
        let p = parts(&[&["Ida Vell"]]);
        let sixty = format!("Ida Vell{}", " word".repeat(58));
        assert_eq!(word_count(&sixty), 60);
        assert!(score_answer(&sixty, &p, "single"));
        let sixty_one = format!("{sixty} more");
        assert_eq!(word_count(&sixty_one), 61);
        assert!(!score_answer(&sixty_one, &p, "single"));
        assert_eq!(word_count("  a\tb\n c  "), 3);
    }

    #[test]
    fn hedging_on_an_answerable_question_is_wrong() {
        let p = parts(&[&["Ida Vell"]]);
        assert!(!score_answer(
            "Ida Vell, or it is unknown who keeps it.",
            &p,
            "single"
        ));
        assert!(!score_answer("Ida Vell? I don't know.", &p, "bridge"));
        assert!(!score_answer("ida vell; otherwise NOT FOUND", &p, "calc"));
    }

    #[test]
    fn unanswerable_is_right_when_it_says_unknown() {
        let p = unknown_parts();
        assert!(score_answer(
            "unknown: no node holds the release date.",
            &p,
            UNANSWERABLE_TIER
        ));
        assert!(score_answer(
            "This cannot be determined.",
            &p,
            UNANSWERABLE_TIER
        ));
        assert!(!score_answer("It ships on 3 May.", &p, UNANSWERABLE_TIER));
    }

    fn row(tier: &str, correct: bool, members: &[&str], needs: &[&str]) -> ScenarioRow {
        ScenarioRow {
            mode: Mode::Swarm,
            id: format!("{tier}-{}", members.len()),
            tier: tier.into(),
            question: "q".into(),
            answer: "a".into(),
            citations: Vec::new(),
            status: Some(AnswerStatus::Answered),
            correct,
            asker: "ana".into(),
            needs: needs.iter().map(|n| n.to_string()).collect(),
            members: members.iter().map(|n| n.to_string()).collect(),
            wall_s: 2.0,
            tokens: 100,
            messages: 4,
            error: None,
        }
    }

    #[test]
    fn aggregation_of_a_small_set() {
        let mut failed = row("calc", false, &[], &["bo", "cy"]);
        failed.error = Some("timeout".into());
        failed.tokens = 400;
        failed.messages = 0;
        failed.wall_s = 8.0;
        let rows = vec![
            // Recruited bo (needed) and dan (not): precision 1/2, recall 1/1.
            row("single", true, &["ana", "bo", "dan"], &["bo"]),
            // Recruited bo only, needs bo and cy: precision 1, recall 1/2.
            row("parallel2", false, &["ana", "bo"], &["bo", "cy"]),
            // Recruited nobody: no precision; recall 0.
            row("single", false, &["ana"], &["cy"]),
            // Unanswerable, no needs; recruited dan: precision 0.
            row(UNANSWERABLE_TIER, true, &["ana", "dan"], &[]),
            failed,
        ];
        let r = aggregate(&rows);
        assert_eq!(r.n, 5);
        assert_eq!(r.errors, 1);
        assert!((r.accuracy - 0.4).abs() < 1e-9);
        assert_eq!(
            r.tiers["single"],
            TierReport {
                n: 2,
                accuracy: 0.5
            }
        );
        assert_eq!(
            r.tiers["parallel2"],
            TierReport {
                n: 1,
                accuracy: 0.0
            }
        );
        assert_eq!(
            r.tiers["calc"],
            TierReport {
                n: 1,
                accuracy: 0.0
            }
        );
        assert_eq!(r.unanswerable_accuracy, Some(1.0));
        // Precision over the three rows that recruited someone: (0.5 + 1 + 0) / 3.
        assert!((r.team_precision.unwrap() - 0.5).abs() < 1e-9);
        // Recall over the four rows with needs: (1 + 0.5 + 0 + 0) / 4.
        assert!((r.team_recall.unwrap() - 0.375).abs() < 1e-9);
        assert!((r.tokens_per_task - 160.0).abs() < 1e-9);
        assert!((r.messages_per_task - 3.2).abs() < 1e-9);
        assert!((r.mean_wall_s - 3.2).abs() < 1e-9);

        // Nothing recruited and no needs: both undefined, no unanswerable tier.
        let r = aggregate(&[row("single", true, &["ana"], &[])]);
        assert_eq!(r.team_precision, None);
        assert_eq!(r.team_recall, None);
        assert_eq!(r.unanswerable_accuracy, None);
        let r = aggregate(&[]);
        assert_eq!((r.n, r.accuracy), (0, 0.0));
    }

    #[test]
    fn json_report_puts_swarm_on_top_and_every_mode_under_modes() {
        let alone = aggregate(&[row("single", false, &["ana"], &["bo"])]);
        let swarm = aggregate(&[row("single", true, &["ana", "bo"], &["bo"])]);
        let v = json_report(
            &[(Mode::Alone, alone.clone()), (Mode::Swarm, swarm)],
            serde_json::Map::new(),
        )
        .unwrap();
        assert_eq!(v["mode"], "swarm");
        assert_eq!(v["accuracy"], 1.0);
        assert_eq!(v["tiers"]["single"]["n"], 1);
        assert_eq!(v["modes"]["alone"]["accuracy"], 0.0);
        assert!(v["unanswerable_accuracy"].is_null());
        let v = json_report(&[(Mode::Alone, alone)], serde_json::Map::new()).unwrap();
        assert_eq!(v["mode"], "alone");
        let table = render_table(&[(Mode::Alone, aggregate(&[]))]);
        assert!(
            table.contains("alone") && table.contains("accuracy"),
            "{table}"
        );
    }

    #[test]
    fn modes_default_to_swarm_and_drop_repeats() {
        assert_eq!(modes_to_run(&[]), vec![Mode::Swarm]);
        assert_eq!(
            modes_to_run(&[Mode::Oracle, Mode::Swarm, Mode::Oracle]),
            vec![Mode::Oracle, Mode::Swarm]
        );
    }

    #[test]
    fn parses_a_scenario_line() {
        let text = format!("{SCENARIO}\n\n");
        let s = parse_scenarios(&text, "t.jsonl").unwrap();
        assert_eq!(s.len(), 1);
        let s = &s[0];
        assert_eq!(s.id, "t-001");
        assert_eq!(s.tier, "parallel2");
        assert_eq!(s.asker, "ana");
        assert_eq!(s.needs, ["bo", "cy"]);
        assert_eq!(s.answer_parts.len(), 2);
        assert_eq!(s.nodes.len(), 3);
        assert_eq!(s.nodes[1].documents[0].name, "heights.md");
        assert!(s.nodes[0].skills.is_empty());
    }

    #[test]
    fn bad_lines_are_named() {
        let text = format!("{SCENARIO}\n{{\"id\": \"x\"}}\n");
        let e = format!("{:#}", parse_scenarios(&text, "t.jsonl").unwrap_err());
        assert!(e.contains("t.jsonl line 2"), "{e}");
        let text = format!("{SCENARIO}\nnot json\n");
        let e = format!("{:#}", parse_scenarios(&text, "t.jsonl").unwrap_err());
        assert!(e.contains("line 2"), "{e}");
        let bad = SCENARIO.replace("\"asker\": \"ana\"", "\"asker\": \"zed\"");
        let e = format!("{:#}", parse_scenarios(&bad, "t.jsonl").unwrap_err());
        assert!(e.contains("line 1") && e.contains("zed"), "{e}");
        let bad = SCENARIO.replace("\"needs\": [\"bo\", \"cy\"]", "\"needs\": [\"bo\", \"q\"]");
        let e = format!("{:#}", parse_scenarios(&bad, "t.jsonl").unwrap_err());
        assert!(e.contains("`q`"), "{e}");
        let twice = format!("{SCENARIO}\n{SCENARIO}\n");
        let e = format!("{:#}", parse_scenarios(&twice, "t.jsonl").unwrap_err());
        assert!(e.contains("line 2") && e.contains("twice"), "{e}");
    }

    #[test]
    fn plans_per_mode() {
        let s = &parse_scenarios(SCENARIO, "t").unwrap()[0];
        let swarm = plan_nodes(s, Mode::Swarm).unwrap();
        let names: Vec<&str> = swarm.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["ana", "bo", "cy"]);
        assert_eq!(swarm[1].documents.len(), 2);

        let alone = plan_nodes(s, Mode::Alone).unwrap();
        assert_eq!(alone.len(), 1);
        assert_eq!(
            alone[0].documents,
            [(PathBuf::from("tours.md"), "Tours start at ten.".to_string())]
        );

        let oracle = plan_nodes(s, Mode::Oracle).unwrap();
        assert_eq!(oracle.len(), 1);
        assert_eq!(oracle[0].name, "ana");
        assert_eq!(oracle[0].description, "Tour guide.");
        let paths: Vec<PathBuf> = oracle[0].documents.iter().map(|d| d.0.clone()).collect();
        // Both bo and cy hold a notes.md: the sub-folders keep them apart.
        assert_eq!(
            paths,
            [
                PathBuf::from("ana/tours.md"),
                PathBuf::from("bo/heights.md"),
                PathBuf::from("bo/notes.md"),
                PathBuf::from("cy/notes.md"),
            ]
        );
    }

    #[test]
    fn node_configs_stay_on_loopback_with_their_documents() {
        let s = &parse_scenarios(SCENARIO, "t").unwrap()[0];
        let dir = tempfile::tempdir().unwrap();
        let model = ModelArgs {
            model: "smollm2-135m-instruct".into(),
            requantize: "auto".into(),
            ctx: 4096,
            threads: None,
            device: starling_models::engine::DeviceKind::Cpu,
            embed_backend: Default::default(),
        };
        let secret = SwarmSecret::generate().to_string();
        let plan = &plan_nodes(s, Mode::Oracle).unwrap()[0];
        let c = node_config(plan, dir.path(), &secret, &model, "all-minilm-l6-v2").unwrap();
        assert_eq!(c.node.name.as_deref(), Some("ana"));
        assert!(c.network.listen.ip().is_loopback() && c.api.listen.ip().is_loopback());
        assert!(!c.network.mdns);
        assert_eq!(c.network.swarm_secret.as_deref(), Some(secret.as_str()));
        assert_eq!(c.agent.tools, ["search_docs", "calculator"]);
        let docs = c.agent.docs.unwrap();
        assert_eq!(
            std::fs::read_to_string(docs.join("cy/notes.md")).unwrap(),
            "Ida Vell keeps the Orrin lighthouse."
        );
        assert!(docs.join("bo/notes.md").is_file());
    }

    #[test]
    fn file_names_are_made_safe() {
        assert_eq!(safe_file_name("notes.md"), "notes.md");
        assert_eq!(safe_file_name("../x/y.txt"), "_x_y.txt");
        assert_eq!(safe_file_name(".hidden.md"), "hidden.md");
        assert_eq!(safe_file_name("data.csv"), "data.csv.txt");
        assert_eq!(safe_dir_name("magnus-l"), "magnus-l");
        assert_eq!(safe_dir_name("a b/c"), "a b_c");
        assert_eq!(safe_dir_name(".."), "node");
    }
}
