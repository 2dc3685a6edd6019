//! `starling eval format`: do retrieved shared memories (worked examples) make the node's
//! model follow a required output format more often?
//!
//! Tasks are JSON Lines `{"domain", "prompt", "check"}` where `check` is a machine rule
//! ([`Check`]). Memories are JSON Lines `{"domain", "prompt", "answer"}` (optionally `"id"`
//! and their own `"check"`, used only to report how many memories follow their format).
//! No memory may have a task's prompt (compared after normalisation): the examples are for
//! other prompts.
//!
//! Each task is answered twice by the real model with the executor's own answer prompt
//! ([`answer_messages`]): once with the examples the executor would retrieve for it
//! ([`MemoryBook::examples_for`]: top-k of the task's domain, at least the executor's
//! minimum cosine, shown as earlier chat turns) and once with none. Decoding is the node's:
//! greedy, with its repetition penalty, at most `--max-tokens` tokens.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use starling_models::chat::ChatMessage;
use starling_models::embed::EmbedHandle;
use starling_models::engine::ModelSlot;

use crate::memory::load_jsonl;
use starling_node::agent::executor::{answer_messages, ExecutorConfig, TaskSpec};
use starling_node::cli::ModelArgs;
use starling_node::llm::Llm;
use starling_node::memory::record::{normalize_text, validate_domain};
use starling_node::memory::{format_examples, BookConfig, Memory, MemoryBook};
use starling_node::store::Store;

/// Arguments of `starling eval format`.
#[derive(Debug, Args)]
pub struct EvalFormatArgs {
    /// Tasks: JSON Lines of {"domain", "prompt", "check": {"type": ..., ...}}.
    #[arg(long)]
    pub tasks: PathBuf,
    /// Memories (worked examples for other prompts): JSON Lines of {"domain", "prompt",
    /// "answer"}.
    #[arg(long)]
    pub memories: PathBuf,
    /// Examples retrieved per task (the executor's default).
    #[arg(long, default_value_t = ExecutorConfig::default().memory_examples)]
    pub k: usize,
    /// Lowest cosine of task and memory prompt for a memory to be shown (default: the
    /// executor's).
    #[arg(long)]
    pub min_cosine: Option<f32>,
    /// Token limit of each answer (default: the executor's).
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// Use only the first N tasks.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Show the retrieved examples the way the executor did before, as one block of text
    /// at the top of the task message, instead of as earlier chat turns (for comparison).
    #[arg(long)]
    pub examples_as_text: bool,
    /// Print JSON (with every answer).
    #[arg(long)]
    pub json: bool,
    /// Embedding model: a registry name, a directory, or a source.
    #[arg(long, env = "STARLING_EMBED_MODEL", default_value = "all-minilm-l6-v2")]
    pub embed_model: String,
    /// The chat model.
    #[command(flatten)]
    pub model: ModelArgs,
}

/// A machine-checkable format rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Check {
    /// The whole answer (trimmed) matches the regular expression.
    Regex {
        /// The pattern (anchored at both ends by the checker).
        pattern: String,
    },
    /// The answer's non-empty lines are exactly one per prefix, in order, each starting
    /// with its prefix and having text after it.
    LinePrefixes {
        /// The prefixes, e.g. `["Name:", "Age:"]`.
        prefixes: Vec<String>,
    },
    /// The answer is one JSON object with exactly these keys.
    JsonKeys {
        /// The keys, any order.
        keys: Vec<String>,
    },
    /// The answer's non-empty lines are a numbered list of exactly `items` items:
    /// `1. ...`, `2. ...` (or `1) ...`).
    NumberedList {
        /// The number of items.
        items: usize,
    },
    /// The answer's last non-empty line is `ANSWER: <x>` (with `value`, x must equal it,
    /// ignoring case and a final period).
    FinalAnswer {
        /// The expected value, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        value: Option<String>,
    },
}

impl Check {
    /// The rule's name in reports.
    pub fn name(&self) -> &'static str {
        match self {
            Check::Regex { .. } => "regex",
            Check::LinePrefixes { .. } => "line_prefixes",
            Check::JsonKeys { .. } => "json_keys",
            Check::NumberedList { .. } => "numbered_list",
            Check::FinalAnswer { .. } => "final_answer",
        }
    }
}

/// A [`Check`] ready to apply (its regex compiled).
#[derive(Debug, Clone)]
pub struct Rule {
    check: Check,
    regex: Option<regex::Regex>,
}

impl Rule {
    /// Compiles `check`; an invalid regex or an empty rule is an error.
    pub fn new(check: Check) -> Result<Self, String> {
        let regex = match &check {
            Check::Regex { pattern } => Some(
                regex::Regex::new(&format!("^(?:{pattern})$"))
                    .map_err(|e| format!("bad pattern {pattern:?}: {e}"))?,
            ),
            Check::LinePrefixes { prefixes } if prefixes.is_empty() => {
                return Err("line_prefixes needs at least one prefix".into())
            }
            Check::JsonKeys { keys } if keys.is_empty() => {
                return Err("json_keys needs at least one key".into())
            }
            Check::NumberedList { items: 0 } => {
                return Err("numbered_list needs at least one item".into())
            }
            _ => None,
        };
        Ok(Self { check, regex })
    }

    /// The rule.
    pub fn check(&self) -> &Check {
        &self.check
    }

    /// `Ok` when `answer` follows the rule, otherwise what is wrong.
    pub fn apply(&self, answer: &str) -> Result<(), String> {
        let text = answer.trim();
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        match &self.check {
            Check::Regex { .. } => match &self.regex {
                Some(re) if re.is_match(text) => Ok(()),
                _ => Err("does not match the pattern".into()),
            },
            Check::LinePrefixes { prefixes } => {
                if lines.len() != prefixes.len() {
                    return Err(format!(
                        "{} non-empty lines, expected {}",
                        lines.len(),
                        prefixes.len()
                    ));
                }
                for (i, (line, prefix)) in lines.iter().zip(prefixes).enumerate() {
                    match line.strip_prefix(prefix.as_str()) {
                        Some(rest) if !rest.trim().is_empty() => {}
                        Some(_) => {
                            return Err(format!("line {} has nothing after {prefix:?}", i + 1))
                        }
                        None => {
                            return Err(format!("line {} does not start with {prefix:?}", i + 1))
                        }
                    }
                }
                Ok(())
            }
            Check::JsonKeys { keys } => {
                let value: serde_json::Value =
                    serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
                let obj = value.as_object().ok_or("not a JSON object")?;
                let got: HashSet<&str> = obj.keys().map(String::as_str).collect();
                let want: HashSet<&str> = keys.iter().map(String::as_str).collect();
                if got == want {
                    Ok(())
                } else {
                    let mut got: Vec<&str> = got.into_iter().collect();
                    got.sort_unstable();
                    Err(format!("keys {got:?}, expected {keys:?}"))
                }
            }
            Check::NumberedList { items } => {
                if lines.len() != *items {
                    return Err(format!(
                        "{} non-empty lines, expected {items} items",
                        lines.len()
                    ));
                }
                for (i, line) in lines.iter().enumerate() {
                    let n = (i + 1).to_string();
                    let rest = line
                        .strip_prefix(n.as_str())
                        .and_then(|r| r.strip_prefix('.').or_else(|| r.strip_prefix(')')));
                    match rest {
                        Some(r) if r.starts_with(' ') && !r.trim().is_empty() => {}
                        _ => return Err(format!("line {} is not item {n}", i + 1)),
                    }
                }
                Ok(())
            }
            Check::FinalAnswer { value } => {
                let last = lines.last().ok_or("empty answer")?;
                let x = last
                    .strip_prefix("ANSWER:")
                    .map(str::trim)
                    .filter(|x| !x.is_empty())
                    .ok_or("the last line is not `ANSWER: <x>`")?;
                match value {
                    Some(v) if !x.trim_end_matches('.').eq_ignore_ascii_case(v.trim()) => {
                        Err(format!("ANSWER is {x:?}, expected {v:?}"))
                    }
                    _ => Ok(()),
                }
            }
        }
    }
}

/// One task of the tasks file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FormatTask {
    /// Domain pool its examples come from.
    pub domain: String,
    /// The prompt (states the required format).
    pub prompt: String,
    /// The rule its answer must follow.
    pub check: Check,
}

/// One worked example of the memories file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FormatMemory {
    /// Id (default: its line number).
    #[serde(default)]
    pub id: Option<String>,
    /// Domain pool.
    pub domain: String,
    /// The prompt (not one of the tasks').
    pub prompt: String,
    /// An answer in the required format.
    pub answer: String,
    /// The rule the answer follows (checked for the report only).
    #[serde(default)]
    pub check: Option<Check>,
}

/// The two answers to one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskResult {
    /// The task's prompt.
    pub prompt: String,
    /// Its rule.
    pub rule: String,
    /// Ids of the memories shown.
    pub examples: Vec<String>,
    /// Answer with the examples.
    pub with_answer: String,
    /// Whether it follows the rule, or why not.
    pub with_error: Option<String>,
    /// Answer without examples.
    pub without_answer: String,
    /// Whether it follows the rule, or why not.
    pub without_error: Option<String>,
}

/// Follow rates for one rule (or all).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    /// Tasks.
    pub tasks: usize,
    /// Answers with examples that follow the rule.
    pub with_memories: usize,
    /// Answers without examples that follow the rule.
    pub without_memories: usize,
    /// with_memories / tasks.
    pub with_rate: f64,
    /// without_memories / tasks.
    pub without_rate: f64,
    /// Tasks failed without examples and passed with them.
    pub helped: usize,
    /// Tasks passed without examples and failed with them.
    pub hurt: usize,
}

impl Rates {
    fn add(&mut self, r: &TaskResult) {
        let (w, wo) = (r.with_error.is_none(), r.without_error.is_none());
        self.tasks += 1;
        self.with_memories += usize::from(w);
        self.without_memories += usize::from(wo);
        self.helped += usize::from(w && !wo);
        self.hurt += usize::from(!w && wo);
        self.with_rate = self.with_memories as f64 / self.tasks as f64;
        self.without_rate = self.without_memories as f64 / self.tasks as f64;
    }
}

/// The result of `starling eval format`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FormatReport {
    /// The chat model.
    pub model: String,
    /// Examples asked for per task.
    pub k: usize,
    /// Examples shown as one text block (the old layout) rather than as chat turns.
    pub examples_as_text: bool,
    /// Lowest cosine for an example to be shown.
    pub min_cosine: f32,
    /// Token limit per answer.
    pub max_tokens: usize,
    /// Memories in the book.
    pub memories: usize,
    /// Memories with a check that follow it (of those with one).
    pub memories_following: (usize, usize),
    /// Tasks that were shown at least one example.
    pub tasks_with_examples: usize,
    /// Mean examples shown per task.
    pub mean_examples: f64,
    /// All tasks.
    pub all: Rates,
    /// Per rule.
    pub per_rule: BTreeMap<String, Rates>,
    /// Every task's answers.
    pub results: Vec<TaskResult>,
    /// Seconds spent generating.
    pub seconds: f64,
}

/// Checks the data: valid rules and domains, and no memory with a task's prompt.
pub fn validate(tasks: &[FormatTask], memories: &[FormatMemory]) -> Result<Vec<Rule>, String> {
    let mut rules = Vec::with_capacity(tasks.len());
    for (i, t) in tasks.iter().enumerate() {
        validate_domain(&t.domain).map_err(|e| format!("task {}: {e}", i + 1))?;
        rules.push(Rule::new(t.check.clone()).map_err(|e| format!("task {}: {e}", i + 1))?);
    }
    let prompts: HashSet<String> = tasks.iter().map(|t| normalize_text(&t.prompt)).collect();
    for (i, m) in memories.iter().enumerate() {
        validate_domain(&m.domain).map_err(|e| format!("memory {}: {e}", i + 1))?;
        if prompts.contains(&normalize_text(&m.prompt)) {
            return Err(format!(
                "memory {} has a task's prompt ({:?}): examples must be for other prompts",
                i + 1,
                m.prompt
            ));
        }
    }
    Ok(rules)
}

/// Answers every task with and without examples.
async fn answer_all(
    tasks: &[FormatTask],
    rules: &[Rule],
    book: &MemoryBook,
    llm: &Llm,
    args: &EvalFormatArgs,
    min_cosine: f32,
    max_tokens: usize,
) -> anyhow::Result<Vec<TaskResult>> {
    let bar = if args.json {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(tasks.len() as u64)
    };
    bar.set_style(
        ProgressStyle::with_template("answering [{bar:30}] {pos}/{len} (eta {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut out = Vec::with_capacity(tasks.len());
    for (i, (task, rule)) in tasks.iter().zip(rules).enumerate() {
        let spec = TaskSpec {
            task_id: format!("format-{}", i + 1),
            description: task.prompt.clone(),
            context: String::new(),
        };
        let examples = book
            .examples_for(&task.domain, &task.prompt, args.k, min_cosine)
            .await;
        let messages = if args.examples_as_text {
            text_block(&spec, &examples)
        } else {
            answer_messages(&spec, "", &examples, None)
        };
        let with_answer = llm.answer(messages, max_tokens).await?;
        let without_answer = llm
            .answer(answer_messages(&spec, "", &[], None), max_tokens)
            .await?;
        let result = TaskResult {
            prompt: task.prompt.clone(),
            rule: rule.check().name().to_owned(),
            examples: examples.into_iter().map(|m| m.id).collect(),
            with_error: rule.apply(&with_answer).err(),
            with_answer,
            without_error: rule.apply(&without_answer).err(),
            without_answer,
        };
        tracing::debug!(
            task = i + 1,
            examples = result.examples.len(),
            with = result.with_error.is_none(),
            without = result.without_error.is_none(),
            "task answered"
        );
        out.push(result);
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(out)
}

/// The layout the executor used before examples became turns (kept for comparison): the
/// examples as one text block ([`format_examples`]) at the top of the task message.
pub fn text_block(task: &TaskSpec, examples: &[Memory]) -> Vec<ChatMessage> {
    let mut messages = answer_messages(task, "", &[], None);
    if let Some(last) = messages.last_mut() {
        if !examples.is_empty() {
            last.content = format!("{}\n{}", format_examples(examples), last.content);
        }
    }
    messages
}

/// Loads the memories into a fresh in-memory book (with embeddings).
async fn load_book(memories: &[FormatMemory], embedder: EmbedHandle) -> anyhow::Result<MemoryBook> {
    let book = MemoryBook::open(
        Store::open_in_memory()?,
        Some(embedder),
        None,
        BookConfig::default(),
    )
    .await?;
    let items = memories
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let body = MemoryBook::body(&m.domain, &m.prompt, &m.answer, None, 8.0);
            let id = m.id.clone().unwrap_or_else(|| format!("m{}", i + 1));
            (Memory::from_body(id, "eval".into(), body), None)
        })
        .collect();
    book.insert_many(items).await?;
    Ok(book)
}

/// Runs `starling eval format`.
pub fn run(home: &Path, args: EvalFormatArgs) -> anyhow::Result<()> {
    let mut tasks: Vec<FormatTask> = load_jsonl(&args.tasks)?;
    if let Some(n) = args.limit {
        tasks.truncate(n);
    }
    anyhow::ensure!(!tasks.is_empty(), "{} has no tasks", args.tasks.display());
    let memories: Vec<FormatMemory> = load_jsonl(&args.memories)?;
    let rules = validate(&tasks, &memories).map_err(anyhow::Error::msg)?;
    let mut checked = (0, 0);
    for m in &memories {
        if let Some(c) = &m.check {
            let rule = Rule::new(c.clone()).map_err(anyhow::Error::msg)?;
            checked.1 += 1;
            if rule.apply(&m.answer).is_ok() {
                checked.0 += 1;
            } else {
                tracing::warn!(prompt = %m.prompt, "a memory does not follow its own format");
            }
        }
    }
    let defaults = ExecutorConfig::default();
    let min_cosine = args.min_cosine.unwrap_or(defaults.memory_min_cosine);
    let max_tokens = args.max_tokens.unwrap_or(defaults.answer_tokens);

    let embedder =
        starling_node::loading::load_embedder(home, &args.embed_model, Default::default())?;
    let engine = starling_node::loading::load_engine(home, &args.model.options())?;
    let llm = Llm::new(ModelSlot::new(engine));
    let start = std::time::Instant::now();
    let (results, indexed) = starling_node::commands::block_on(async {
        let book = load_book(&memories, embedder).await?;
        let results =
            answer_all(&tasks, &rules, &book, &llm, &args, min_cosine, max_tokens).await?;
        anyhow::Ok((results, book.len()))
    })??;
    let mut all = Rates::default();
    let mut per_rule: BTreeMap<String, Rates> = BTreeMap::new();
    for r in &results {
        all.add(r);
        per_rule.entry(r.rule.clone()).or_default().add(r);
    }
    let shown: usize = results.iter().map(|r| r.examples.len()).sum();
    let report = FormatReport {
        model: args.model.model.clone(),
        k: args.k,
        examples_as_text: args.examples_as_text,
        min_cosine,
        max_tokens,
        memories: indexed,
        memories_following: checked,
        tasks_with_examples: results.iter().filter(|r| !r.examples.is_empty()).count(),
        mean_examples: shown as f64 / results.len() as f64,
        all,
        per_rule,
        results,
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
pub fn render(r: &FormatReport) -> String {
    let mut s = format!(
        "{} tasks; model {}; {} memories ({} of {} checked follow their format); k = {}, min cosine {}, max {} tokens{}; {:.0} s\n",
        r.all.tasks,
        r.model,
        r.memories,
        r.memories_following.0,
        r.memories_following.1,
        r.k,
        r.min_cosine,
        r.max_tokens,
        if r.examples_as_text { ", examples as a text block" } else { "" },
        r.seconds
    );
    s += &format!(
        "examples shown: {} of {} tasks got at least one, {:.2} per task\n\n",
        r.tasks_with_examples, r.all.tasks, r.mean_examples
    );
    s += &format!(
        "{:<14} {:>5} {:>15} {:>15} {:>7} {:>5}\n",
        "rule", "tasks", "with memories", "without", "helped", "hurt"
    );
    let row = |name: &str, x: &Rates| {
        format!(
            "{:<14} {:>5} {:>8} {:>5.1}% {:>8} {:>5.1}% {:>7} {:>5}\n",
            name,
            x.tasks,
            x.with_memories,
            x.with_rate * 100.0,
            x.without_memories,
            x.without_rate * 100.0,
            x.helped,
            x.hurt
        )
    };
    for (name, x) in &r.per_rule {
        s += &row(name, x);
    }
    s += &row("all", &r.all);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(json: &str) -> Rule {
        Rule::new(serde_json::from_str(json).unwrap()).unwrap()
    }

    #[test]
    fn regex_rule_matches_the_whole_answer() {
        let r = rule(r#"{"type": "regex", "pattern": "\\d{4}-\\d{2}-\\d{2}"}"#);
        assert!(r.apply(" 2024-03-05\n").is_ok());
        assert!(r.apply("The date is 2024-03-05").is_err());
        assert!(r.apply("2024-03-05.").is_err());
        // Alternation is anchored as a whole.
        let r = rule(r#"{"type": "regex", "pattern": "yes|no"}"#);
        assert!(r.apply("no").is_ok());
        assert!(r.apply("yes, no").is_err());
        assert!(Rule::new(Check::Regex {
            pattern: "(".into()
        })
        .is_err());
    }

    #[test]
    fn line_prefixes_rule() {
        let r = rule(r#"{"type": "line_prefixes", "prefixes": ["Name:", "Age:"]}"#);
        assert!(r.apply("Name: Ada\n\nAge: 36").is_ok());
        assert_eq!(
            r.apply("Age: 36\nName: Ada").unwrap_err(),
            "line 1 does not start with \"Name:\""
        );
        assert!(r.apply("Name: Ada\nAge:").is_err());
        assert!(r.apply("Name: Ada\nAge: 36\nNote: x").is_err());
        assert!(r.apply("Sure! Name: Ada, Age: 36").is_err());
    }

    #[test]
    fn json_keys_rule() {
        let r = rule(r#"{"type": "json_keys", "keys": ["city", "country"]}"#);
        assert!(r.apply(r#"{"country": "France", "city": "Paris"}"#).is_ok());
        assert!(r.apply(r#"{"city": "Paris"}"#).is_err());
        assert!(r
            .apply(r#"{"city": "Paris", "country": "France", "x": 1}"#)
            .is_err());
        assert!(r.apply(r#"["city", "country"]"#).is_err());
        assert!(r
            .apply("```json\n{\"city\": \"Paris\", \"country\": \"France\"}\n```")
            .is_err());
        assert!(Rule::new(Check::JsonKeys { keys: vec![] }).is_err());
    }

    #[test]
    fn numbered_list_rule() {
        let r = rule(r#"{"type": "numbered_list", "items": 3}"#);
        assert!(r.apply("1. red\n2. green\n3) blue").is_ok());
        assert!(r.apply("1. red\n2. green").is_err());
        assert!(r.apply("1. red\n3. green\n2. blue").is_err());
        assert!(r.apply("Colors:\n1. red\n2. green\n3. blue").is_err());
        assert!(r.apply("1. red\n2. green\n3.").is_err());
        assert!(r.apply("1.red\n2. green\n3. blue").is_err());
        assert!(Rule::new(Check::NumberedList { items: 0 }).is_err());
    }

    #[test]
    fn final_answer_rule() {
        let r = rule(r#"{"type": "final_answer"}"#);
        assert!(r.apply("12 + 30 = 42.\nANSWER: 42").is_ok());
        assert!(r.apply("ANSWER: 42\nHope this helps").is_err());
        assert!(r.apply("ANSWER:").is_err());
        assert!(r.apply("answer: 42").is_err());
        let r = rule(r#"{"type": "final_answer", "value": "Paris"}"#);
        assert!(r.apply("ANSWER: paris.").is_ok());
        assert!(r.apply("ANSWER: Lyon").is_err());
        assert!(serde_json::from_str::<Check>(r#"{"type": "final_answer", "x": 1}"#).is_err());
    }

    #[test]
    fn examples_become_turns_before_the_task() {
        let task = TaskSpec {
            task_id: "t".into(),
            description: "Name two trees.".into(),
            context: String::new(),
        };
        let body = MemoryBook::body("lists", "Name two birds.", "1. Owl\n2. Crow", None, 8.0);
        let m = Memory::from_body("m1".into(), "eval".into(), body);
        let plain = answer_messages(&task, "", &[], None);
        let turns = answer_messages(&task, "", std::slice::from_ref(&m), None);
        assert_eq!(turns.len(), plain.len() + 2);
        assert_eq!(turns.first(), plain.first());
        assert_eq!(turns.last(), plain.last());
        assert_eq!(turns[1], ChatMessage::user("Task: Name two birds."));
        assert_eq!(turns[2], ChatMessage::assistant("1. Owl\n2. Crow"));
        let block = text_block(&task, &[m]);
        assert_eq!(block.len(), plain.len());
        assert!(block[1].content.starts_with("Here are worked examples"));
    }

    #[test]
    fn memories_must_not_hold_task_prompts() {
        let task = FormatTask {
            domain: "lists".into(),
            prompt: "List three fruits as a numbered list.".into(),
            check: Check::NumberedList { items: 3 },
        };
        let mut memory = FormatMemory {
            id: None,
            domain: "lists".into(),
            prompt: "List two trees as a numbered list.".into(),
            answer: "1. oak\n2. elm".into(),
            check: None,
        };
        assert_eq!(
            validate(std::slice::from_ref(&task), std::slice::from_ref(&memory))
                .unwrap()
                .len(),
            1
        );
        memory.prompt = "list THREE fruits as a numbered list".into();
        assert!(validate(&[task], &[memory]).is_err());
    }
}
