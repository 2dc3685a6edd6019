//! Runs one task on this node: plan, act with tools, answer, verify.
//!
//! The loop follows the planner / executor / verifier split of tool-using agents, with every
//! model decision constrained to a JSON Schema so a small local model cannot produce a
//! malformed tool call:
//!
//! 1. **Grounding** (deterministic, before any model call). If the calculator is offered and
//!    the task text contains an arithmetic expression ([`find_expression`]), it is evaluated;
//!    if documents are offered and a passage covers at least
//!    [`ExecutorConfig::grounding_coverage`] of the task's terms, the best passages are
//!    retrieved. These observations enter the trace like any tool call (marked `grounded`),
//!    so facts the node holds reach the answer even when a small model forgets to ask for
//!    them. This is retrieval grounding, as in retrieval-augmented generation: it only adds
//!    evidence, it never writes the answer.
//! 2. **Plan**: a constrained list of 1 to [`ExecutorConfig::max_steps`] short steps.
//! 3. **Act**: for each step, a constrained decision picks a tool *with its arguments* (the
//!    schema is an `anyOf` with one branch per tool, whose `args` is that tool's own argument
//!    schema) or `answer` (no tool needed). Arguments the model should not invent (an
//!    external agent's `task_id` and `context`) are filled in from the task. A failed call is
//!    retried with the error in the prompt, up to [`ExecutorConfig::max_attempts`] attempts.
//!    A call identical to an earlier successful one is not repeated.
//! 4. **Answer**: the observations are put into the prompt verbatim (truncated per
//!    observation), and the model is told to copy names and numbers from them.
//! 5. **Verify**: a constrained `{"supported": bool, "missing": string}` check of the answer
//!    against the observations; when it is not supported, one revision pass with the
//!    verifier's note, then one more check whose verdict is reported.
//!
//! Prompts are short and concrete: the default model has 135M parameters.

use std::fmt::Write as _;

use crate::memory::{admit, AdmissionConfig, Admitted, Memory, MemoryBook, Pair, DEFAULT_DOMAIN};

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use starling_models::chat::ChatMessage;
use tracing::{debug, info, warn};

use super::tools::{find_expression, format_passages, ToolBox, ToolError};
use crate::llm::{Llm, LlmError};

/// Why a task could not be run at all. Tool failures are not errors: they are recorded in
/// the trace.
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    /// The local model failed (not a decision cut short: those fall back).
    #[error(transparent)]
    Llm(LlmError),
}

/// The task as the executor receives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSpec {
    /// The task's id (passed on to external agents).
    pub task_id: String,
    /// What to do.
    pub description: String,
    /// Background: the group's goal, earlier results. May be empty.
    #[serde(default)]
    pub context: String,
}

/// One tool call (or a decision to use no tool) in a task's trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepTrace {
    /// The plan step this call served (`grounding` for the deterministic ones).
    pub step: String,
    /// The tool called, or `answer` when the step needed no tool.
    pub tool: String,
    /// Arguments as called (after grounding).
    pub args: Value,
    /// What the tool returned.
    pub observation: Option<String>,
    /// Why the call failed.
    pub error: Option<String>,
    /// True for the executor's deterministic grounding calls.
    pub grounded: bool,
}

/// The result of a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskOutcome {
    /// An answer was produced.
    pub ok: bool,
    /// The answer.
    pub answer: String,
    /// The verifier found the answer supported by the observations.
    pub verified: bool,
    /// What the verifier found missing (when not verified).
    pub missing: Option<String>,
    /// Every tool call, in order.
    pub steps: Vec<StepTrace>,
    /// Model tokens spent (prompt + completion). Counted on the shared [`Llm`] counters, so
    /// tasks running at the same time on the same handle count each other's tokens too.
    pub tokens: u64,
    /// Ids of the shared memories shown to the model as worked examples.
    #[serde(default)]
    pub examples: Vec<String>,
}

/// Knobs of the executor.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutorConfig {
    /// Most plan steps (default 4).
    pub max_steps: usize,
    /// Attempts per step when tool calls fail (default 3).
    pub max_attempts: usize,
    /// Token limit of the plan decision.
    pub plan_tokens: usize,
    /// Token limit of a tool decision.
    pub decision_tokens: usize,
    /// Token limit of the answer.
    pub answer_tokens: usize,
    /// Token limit of the verification.
    pub verify_tokens: usize,
    /// Characters of one observation shown to the model.
    pub observation_chars: usize,
    /// Share of the task's distinct terms a passage must contain to be retrieved by
    /// grounding (default 0.5).
    pub grounding_coverage: f32,
    /// Passages retrieved by grounding (default 2).
    pub grounding_passages: usize,
    /// Whether a step may be done without a tool (default true). A node that only routes
    /// tasks to an integrated external agent sets this to false: every step then calls a
    /// tool.
    pub allow_no_tool: bool,
    /// Shared memories shown as worked examples when answering (default 3; 0: none).
    pub memory_examples: usize,
    /// Lowest cosine between the task and a memory's prompt for it to be shown (default
    /// 0.6): an example about another subject makes a small model copy its facts.
    pub memory_min_cosine: f32,
    /// Offer verified answers for admission into the shared memories (default true).
    pub admit_memories: bool,
    /// Lowest admission score (0..10) for a verified answer to be kept (default 6).
    pub admission_threshold: f32,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        Self {
            max_steps: 4,
            max_attempts: 3,
            plan_tokens: 120,
            decision_tokens: 96,
            answer_tokens: 160,
            verify_tokens: 64,
            observation_chars: 700,
            grounding_coverage: 0.5,
            grounding_passages: 2,
            allow_no_tool: true,
            memory_examples: 3,
            memory_min_cosine: 0.6,
            admit_memories: true,
            admission_threshold: AdmissionConfig::default().threshold,
        }
    }
}

/// The plan decision.
#[derive(Debug, Deserialize)]
struct Plan {
    steps: Vec<String>,
}

/// A tool decision.
#[derive(Debug, Deserialize)]
struct Pick {
    tool: String,
    #[serde(default)]
    args: Value,
}

/// The verifier's verdict.
#[derive(Debug, Deserialize)]
struct Verdict {
    supported: bool,
    #[serde(default)]
    missing: String,
}

/// The pseudo-tool meaning "no tool needed for this step".
const NO_TOOL: &str = "answer";

/// Runs tasks with the node's model and tools.
#[derive(Debug, Clone)]
pub struct Executor {
    llm: Llm,
    tools: ToolBox,
    config: ExecutorConfig,
    memory: Option<MemoryBook>,
    /// Work left running after an answer (memory feedback and admission): owned, so
    /// [`Executor::close`] awaits it and dropping the last clone aborts it.
    background: crate::owned::Background,
}

impl Executor {
    /// An executor with the default config.
    pub fn new(llm: Llm, tools: ToolBox) -> Self {
        Self::with_config(llm, tools, ExecutorConfig::default())
    }

    /// An executor with `config`.
    pub fn with_config(llm: Llm, tools: ToolBox, config: ExecutorConfig) -> Self {
        Self {
            llm,
            tools,
            config,
            memory: None,
            background: crate::owned::Background::new(),
        }
    }

    /// Tasks left running after answers (or ended and not yet reaped).
    pub fn background_tasks(&self) -> usize {
        self.background.len()
    }

    /// Waits up to `limit` for the work left running after answers (memory admission) to
    /// end, then aborts it; returns how many tasks were aborted.
    pub async fn close(&self, limit: std::time::Duration) -> usize {
        self.background.close(limit).await
    }

    /// Uses the node's shared memories: the best matching ones are worked examples in the
    /// answer prompt (and get feedback from the verifier's verdict), and verified answers
    /// are offered for admission.
    pub fn with_memory(mut self, memory: MemoryBook) -> Self {
        self.memory = Some(memory);
        self
    }

    /// The tools offered.
    pub fn tools(&self) -> &ToolBox {
        &self.tools
    }

    /// Runs `task` to an outcome.
    pub async fn run(&self, task: &TaskSpec) -> Result<TaskOutcome, ExecutorError> {
        let before = self.llm.counters().snapshot();
        let mut steps = Vec::new();
        self.ground(task, &mut steps).await;

        if !self.tools.is_empty() {
            let plan = self.plan(task).await?;
            info!(task_id = %task.task_id, plan = ?plan, "task plan");
            for step in &plan {
                self.act(task, step, &mut steps).await?;
            }
        }

        let facts = self.facts(&steps);
        let examples = self.examples(task).await;
        let mut answer = self.compose(task, &facts, &examples, None).await?;
        let mut verdict = self.verify(task, &facts, &answer).await?;
        if !verdict.supported {
            debug!(task_id = %task.task_id, missing = %verdict.missing, "answer not supported; revising");
            let revised = self
                .compose(task, &facts, &examples, Some((&answer, &verdict.missing)))
                .await?;
            if !revised.is_empty() {
                answer = revised;
                verdict = self.verify(task, &facts, &answer).await?;
            }
        }
        let ok = !answer.is_empty();
        if !ok {
            warn!(task_id = %task.task_id, "the model produced no answer");
        }
        let after = self.llm.counters().snapshot();
        let tokens = (after.0 + after.1).saturating_sub(before.0 + before.1);
        info!(
            task_id = %task.task_id,
            steps = steps.len(),
            verified = verdict.supported,
            tokens,
            "task done"
        );
        self.learn(task, &examples, ok && verdict.supported, &answer);
        Ok(TaskOutcome {
            ok,
            answer,
            verified: verdict.supported,
            missing: (!verdict.supported && !verdict.missing.is_empty()).then_some(verdict.missing),
            steps,
            tokens,
            examples: examples.into_iter().map(|m| m.id).collect(),
        })
    }

    /// Shared memories close enough to the task to serve as worked examples.
    async fn examples(&self, task: &TaskSpec) -> Vec<Memory> {
        let Some(book) = &self.memory else {
            return Vec::new();
        };
        book.examples_for(
            DEFAULT_DOMAIN,
            &task.description,
            self.config.memory_examples,
            self.config.memory_min_cosine,
        )
        .await
    }

    /// After a task: feedback for the examples shown (helpful when the answer was
    /// verified), and admission of a verified answer. In the background: the reply does
    /// not wait for the admission score.
    fn learn(&self, task: &TaskSpec, examples: &[Memory], verified: bool, answer: &str) {
        let Some(book) = self.memory.clone() else {
            return;
        };
        let ids: Vec<String> = examples.iter().map(|m| m.id.clone()).collect();
        let pair = (verified && self.config.admit_memories).then(|| Pair {
            domain: DEFAULT_DOMAIN.to_owned(),
            prompt: task.description.clone(),
            answer: answer.to_owned(),
            source: Some(task.task_id.clone()),
        });
        let llm = self.llm.clone();
        let admission = AdmissionConfig {
            threshold: self.config.admission_threshold,
            ..AdmissionConfig::default()
        };
        self.background.spawn(async move {
            for id in ids {
                if let Err(e) = book.feedback(&id, verified).await {
                    debug!(error = %e, memory = %id, "memory feedback not recorded");
                }
            }
            if let Some(pair) = pair {
                match admit(&book, Some(&llm), &admission, &pair, None).await {
                    Ok(Admitted::Kept(m)) => {
                        info!(memory = %m.id, "answer kept as a shared memory")
                    }
                    Ok(Admitted::Rejected(r)) => debug!(reason = %r, "answer not kept as a memory"),
                    Err(e) => warn!(error = %e, "memory admission failed"),
                }
            }
        });
    }

    /// Deterministic observations (see the module docs).
    async fn ground(&self, task: &TaskSpec, steps: &mut Vec<StepTrace>) {
        if self.tools.has_calculator() {
            if let Some(expr) = find_expression(&task.description) {
                let args = json!({ "expression": expr });
                let result = self.tools.call("calculator", args.clone()).await;
                steps.push(trace("grounding", "calculator", args, result, true));
            }
        }
        if let Some(docs) = self.tools.docs() {
            // The task text first, then each clause of the context (the team's goal): a
            // task written by a small model can be vague, while the goal names what the
            // team needs. A passage must cover enough of one query's terms to count.
            let mut queries = vec![task.description.clone()];
            queries.extend(clauses(&task.context));
            for query in queries {
                let hits: Vec<_> = docs
                    .search(&query, self.config.grounding_passages)
                    .into_iter()
                    .filter(|p| p.coverage >= self.config.grounding_coverage)
                    .filter(|p| {
                        !steps.iter().any(|s| {
                            s.observation
                                .as_deref()
                                .is_some_and(|o| o.contains(p.text.trim()))
                        })
                    })
                    .collect();
                if !hits.is_empty() {
                    steps.push(StepTrace {
                        step: "grounding".into(),
                        tool: "search_docs".into(),
                        args: json!({ "query": query }),
                        observation: Some(format_passages(&hits)),
                        error: None,
                        grounded: true,
                    });
                }
            }
        }
    }

    async fn plan(&self, task: &TaskSpec) -> Result<Vec<String>, ExecutorError> {
        let schema = json!({
            "type": "object",
            "properties": {
                "steps": {
                    "type": "array",
                    "items": { "type": "string", "minLength": 1, "maxLength": 100 },
                    "minItems": 1,
                    "maxItems": self.config.max_steps.max(1)
                }
            },
            "required": ["steps"],
            "additionalProperties": false
        });
        let system = format!(
            "You plan a task. Write 1 to {} short steps. Tools you can use: {}.",
            self.config.max_steps.max(1),
            self.tools.names().join(", ")
        );
        // One worked example: small models imitate far better than they follow instructions.
        let messages = vec![
            ChatMessage::system(system),
            ChatMessage::user(
                "Task: How many days are in 3 weeks, and what do my notes say about holidays?",
            ),
            ChatMessage::assistant(
                r#"{"steps": ["Compute 3 * 7 with the calculator", "Search the documents for holidays"]}"#,
            ),
            ChatMessage::user(task_text(task)),
        ];
        match self
            .llm
            .decide::<Plan>(messages, &schema, self.config.plan_tokens)
            .await
        {
            Ok(plan) => {
                let mut steps: Vec<String> = plan
                    .steps
                    .into_iter()
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect();
                steps.dedup();
                steps.truncate(self.config.max_steps.max(1));
                if steps.is_empty() {
                    steps.push(task.description.clone());
                }
                Ok(steps)
            }
            Err(LlmError::Decode(e)) => {
                debug!(error = %e, "plan cut short; the task is one step");
                Ok(vec![task.description.clone()])
            }
            Err(e) => Err(ExecutorError::Llm(e)),
        }
    }

    /// The schema of a tool decision: one branch per tool, plus `answer`.
    fn pick_schema(&self) -> Value {
        let mut branches: Vec<Value> = self
            .tools
            .tools()
            .iter()
            .map(|t| {
                json!({
                    "type": "object",
                    "properties": {
                        "tool": { "enum": [t.name()] },
                        "args": t.parameters()
                    },
                    "required": ["tool", "args"],
                    "additionalProperties": false
                })
            })
            .collect();
        if self.config.allow_no_tool || branches.is_empty() {
            branches.push(json!({
                "type": "object",
                "properties": { "tool": { "enum": [NO_TOOL] } },
                "required": ["tool"],
                "additionalProperties": false
            }));
        }
        json!({ "anyOf": branches })
    }

    fn tool_menu(&self) -> String {
        let mut menu = String::new();
        for t in self.tools.tools() {
            let params = t.parameters();
            let args: Vec<String> = params["properties"]
                .as_object()
                .map(|p| p.keys().map(|k| format!("\"{k}\": \"...\"")).collect())
                .unwrap_or_default();
            let _ = writeln!(
                menu,
                "- {}: {} args: {{{}}}",
                t.name(),
                t.description(),
                args.join(", ")
            );
        }
        if self.config.allow_no_tool || self.tools.is_empty() {
            let _ = write!(menu, "- {NO_TOOL}: no tool is needed for this step.");
        }
        menu.trim_end().to_owned()
    }

    /// Runs one plan step: pick a tool, call it, retry on failure.
    async fn act(
        &self,
        task: &TaskSpec,
        step: &str,
        steps: &mut Vec<StepTrace>,
    ) -> Result<(), ExecutorError> {
        let schema = self.pick_schema();
        let system = format!(
            "You do one step of a task by choosing a tool and its arguments.\nTools:\n{}",
            self.tool_menu()
        );
        let mut last_error: Option<String> = None;
        for attempt in 1..=self.config.max_attempts.max(1) {
            let mut user = format!("{}\nStep: {step}", task_text(task));
            let facts = self.facts(steps);
            if !facts.is_empty() {
                let _ = write!(user, "\nKnown facts:\n{facts}");
            }
            if let Some(err) = &last_error {
                let _ = write!(
                    user,
                    "\nYour last call failed: {err}\nFix the arguments or choose another tool."
                );
            }
            let messages = vec![ChatMessage::system(system.clone()), ChatMessage::user(user)];
            let pick = match self
                .llm
                .decide::<Pick>(messages, &schema, self.config.decision_tokens)
                .await
            {
                Ok(p) => p,
                Err(LlmError::Decode(e)) => {
                    debug!(error = %e, attempt, "tool decision cut short");
                    last_error = Some("your answer was cut short; use shorter arguments".into());
                    continue;
                }
                Err(e) => return Err(ExecutorError::Llm(e)),
            };
            if pick.tool == NO_TOOL {
                debug!(step, "no tool needed");
                steps.push(StepTrace {
                    step: step.to_owned(),
                    tool: NO_TOOL.into(),
                    args: Value::Null,
                    observation: None,
                    error: None,
                    grounded: false,
                });
                return Ok(());
            }
            let args = self.ground_args(task, &pick.tool, pick.args);
            let repeated = steps
                .iter()
                .any(|s| s.tool == pick.tool && s.args == args && s.observation.is_some());
            if repeated {
                debug!(tool = %pick.tool, "same call already made; reusing its observation");
                return Ok(());
            }
            let result = self.tools.call(&pick.tool, args.clone()).await;
            let failed = result.as_ref().err().map(ToString::to_string);
            steps.push(trace(step, &pick.tool, args.clone(), result, false));
            match failed {
                None => return Ok(()),
                Some(err) => {
                    debug!(tool = %pick.tool, attempt, error = %err, "tool call failed");
                    last_error = Some(format!("{} {} -> {err}", pick.tool, args));
                }
            }
        }
        Ok(())
    }

    /// Fills in what the model should not make up: an external agent's task id and context.
    fn ground_args(&self, task: &TaskSpec, tool: &str, args: Value) -> Value {
        let mut map = match args {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        let builtin = matches!(tool, "calculator" | "search_docs");
        if !builtin {
            map.insert("task_id".into(), json!(task.task_id));
            let context = if task.context.is_empty() {
                task.description.clone()
            } else {
                format!("{}\n\nWhole task: {}", task.context, task.description)
            };
            map.insert("context".into(), json!(context));
        }
        Value::Object(map)
    }

    /// The successful observations, each cut to the configured length, within a budget that
    /// keeps the prompt inside the model's context. The deterministic (grounded) ones come
    /// last, nearest the question: they are the most reliable, and small models lean on the
    /// most recent context.
    fn facts(&self, steps: &[StepTrace]) -> String {
        let budget = self.llm.context_length().saturating_mul(2);
        let mut out = String::new();
        let ordered = steps
            .iter()
            .filter(|s| !s.grounded)
            .chain(steps.iter().filter(|s| s.grounded));
        for obs in ordered.filter_map(|s| s.observation.as_deref()) {
            let cut = truncate_chars(obs, self.config.observation_chars);
            if out.len() + cut.len() > budget {
                break;
            }
            let _ = writeln!(out, "- {cut}");
        }
        out.trim_end().to_owned()
    }

    async fn compose(
        &self,
        task: &TaskSpec,
        facts: &str,
        examples: &[Memory],
        revise: Option<(&str, &str)>,
    ) -> Result<String, ExecutorError> {
        let messages = answer_messages(task, facts, examples, revise);
        self.llm
            .answer(messages, self.config.answer_tokens)
            .await
            .map_err(ExecutorError::Llm)
    }

    async fn verify(
        &self,
        task: &TaskSpec,
        facts: &str,
        answer: &str,
    ) -> Result<Verdict, ExecutorError> {
        if answer.is_empty() {
            return Ok(Verdict {
                supported: false,
                missing: "there is no answer".into(),
            });
        }
        let schema = json!({
            "type": "object",
            "properties": {
                "supported": { "type": "boolean" },
                "missing": { "type": "string", "maxLength": 150 }
            },
            "required": ["supported", "missing"],
            "additionalProperties": false
        });
        let facts = if facts.is_empty() { "(none)" } else { facts };
        let user = format!(
            "Facts:\n{facts}\n\nTask: {}\nAnswer: {answer}\n\nDoes the answer do the task and agree with the facts? If not, say what is missing.",
            task.description
        );
        let messages = vec![
            ChatMessage::system("You check an answer against facts."),
            ChatMessage::user(user),
        ];
        match self
            .llm
            .decide::<Verdict>(messages, &schema, self.config.verify_tokens)
            .await
        {
            Ok(v) => Ok(v),
            Err(LlmError::Decode(e)) => {
                // A verdict cut short is no verdict: keep the answer, report it unverified.
                debug!(error = %e, "verification cut short");
                Ok(Verdict {
                    supported: false,
                    missing: String::new(),
                })
            }
            Err(e) => Err(ExecutorError::Llm(e)),
        }
    }
}

/// The messages of the executor's answer call: the instruction, then each worked example
/// from shared memories as an earlier exchange (its request as a user turn, its answer as
/// the assistant's), then `facts` (observations, may be empty) and the task; with `revise`
/// = (earlier answer, what it missed), a revision request.
///
/// Examples as turns, not as a text block: measured with the default 135M model on
/// rule-checkable format tasks (`starling eval format`, benches/memory/README.md), a block
/// of "Example 1: Request: ..." text was mostly copied into the answer, while the same
/// examples as turns were followed.
pub fn answer_messages(
    task: &TaskSpec,
    facts: &str,
    examples: &[Memory],
    revise: Option<(&str, &str)>,
) -> Vec<ChatMessage> {
    let system = if facts.is_empty() {
        "Answer the task briefly and concretely."
    } else {
        "Answer the task using the facts. Copy names and numbers from the facts exactly. Be brief."
    };
    let mut messages = vec![ChatMessage::system(system)];
    for m in examples {
        messages.push(ChatMessage::user(format!("Task: {}", m.prompt.trim())));
        messages.push(ChatMessage::assistant(m.answer.trim()));
    }
    let mut user = String::new();
    if !facts.is_empty() {
        let _ = write!(user, "Facts:\n{facts}\n\n");
    }
    let _ = write!(user, "{}", task_text(task));
    if let Some((previous, missing)) = revise {
        let _ = write!(user, "\n\nYour earlier answer: {previous}");
        if !missing.trim().is_empty() {
            let _ = write!(user, "\nIt missed: {missing}");
        }
        let _ = write!(user, "\nWrite a better answer.");
    }
    // No fixed worked example here: with the default 135M model, an example's facts leak
    // into answers to unrelated tasks. Shared memories are shown only when their prompt is
    // close to the task (`memory_min_cosine`).
    messages.push(ChatMessage::user(user));
    messages
}

fn task_text(task: &TaskSpec) -> String {
    if task.context.trim().is_empty() {
        format!("Task: {}", task.description)
    } else {
        format!("Context: {}\nTask: {}", task.context, task.description)
    }
}

fn trace(
    step: &str,
    tool: &str,
    args: Value,
    result: Result<String, ToolError>,
    grounded: bool,
) -> StepTrace {
    let (observation, error) = match result {
        Ok(o) => (Some(o), None),
        Err(e) => (None, Some(e.to_string())),
    };
    StepTrace {
        step: step.to_owned(),
        tool: tool.to_owned(),
        args,
        observation,
        error,
        grounded,
    }
}

/// `s` cut to at most `max` characters (with `…` when cut).
fn truncate_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// Clauses of `text` with at least three words (split at sentence and clause marks), used
/// as separate grounding queries.
fn clauses(text: &str) -> Vec<String> {
    text.split(['?', '.', '!', ';', ',', '\n'])
        .map(str::trim)
        .filter(|c| c.split_whitespace().count() >= 3)
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use starling_models::engine::{Engine, EngineConfig, ModelSlot};

    use super::*;
    use crate::agent::tools::{ExternalAgent, SearchDocs};
    use crate::config::ExternalAgentConfig;

    /// The real loading code on a tiny random-weight model: decisions are valid JSON, free
    /// text is gibberish.
    fn tiny_llm(dir: &Path) -> Llm {
        let path = dir.join("tiny.gguf");
        starling_models::testing::write_tiny_llama(
            &path,
            candle_core::quantized::GgmlDType::Q8_0,
            2048,
        );
        let engine = Engine::load(&path, &EngineConfig::default()).unwrap();
        Llm::new(ModelSlot::new(engine))
    }

    /// Room for the random model's arguments to close their strings (its tokens are short).
    fn test_config() -> ExecutorConfig {
        ExecutorConfig {
            plan_tokens: 600,
            decision_tokens: 600,
            answer_tokens: 40,
            verify_tokens: 300,
            ..ExecutorConfig::default()
        }
    }

    fn task(description: &str) -> TaskSpec {
        TaskSpec {
            task_id: "t1".into(),
            description: description.into(),
            context: String::new(),
        }
    }

    #[test]
    fn goal_clauses_become_queries() {
        let c = clauses(
            "At what temperature do seeds germinate, and on which day does the shuttle dock? Go.",
        );
        assert_eq!(
            c,
            vec![
                "At what temperature do seeds germinate".to_owned(),
                "and on which day does the shuttle dock".to_owned()
            ]
        );
        assert!(clauses("").is_empty());
    }

    #[tokio::test]
    async fn runs_end_to_end_with_grounding() {
        let dir = tempfile::tempdir().unwrap();
        let docs = dir.path().join("docs");
        std::fs::create_dir(&docs).unwrap();
        std::fs::write(
            docs.join("reactor.md"),
            "The Zorblat reactor's coolant is liquid argon at 87 K.",
        )
        .unwrap();
        let tools = ToolBox::new()
            .with_calculator()
            .with_docs(SearchDocs::open(&docs).unwrap());
        let exec = Executor::with_config(tiny_llm(dir.path()), tools, test_config());

        let out = exec
            .run(&task(
                "What is 17 * 23 + 4 for the Zorblat reactor coolant?",
            ))
            .await
            .unwrap();
        let grounded: Vec<_> = out.steps.iter().filter(|s| s.grounded).collect();
        assert_eq!(grounded.len(), 2, "{:#?}", out.steps);
        assert_eq!(grounded[0].tool, "calculator");
        assert_eq!(
            grounded[0].observation.as_deref(),
            Some("17 * 23 + 4 = 395")
        );
        assert_eq!(grounded[1].tool, "search_docs");
        assert!(grounded[1]
            .observation
            .as_deref()
            .unwrap()
            .contains("liquid argon at 87 K"));
        // Plan, at least one tool decision, answer and verification all ran.
        assert!(out.tokens > 0);
        assert!(out.steps.len() > 2, "{:#?}", out.steps);
        for s in &out.steps[2..] {
            assert!(
                ["calculator", "search_docs", NO_TOOL].contains(&s.tool.as_str()),
                "{s:?}"
            );
        }
        assert_eq!(out.ok, !out.answer.is_empty());
        let json = serde_json::to_value(&out).unwrap();
        assert_eq!(serde_json::from_value::<TaskOutcome>(json).unwrap(), out);
    }

    #[tokio::test]
    async fn no_tools_means_answer_directly() {
        let dir = tempfile::tempdir().unwrap();
        let exec = Executor::new(tiny_llm(dir.path()), ToolBox::new());
        let out = exec.run(&task("Say hello.")).await.unwrap();
        assert!(out.steps.is_empty());
        assert!(out.tokens > 0);
    }

    #[tokio::test]
    async fn failing_tool_calls_are_retried_with_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let counter = dir.path().join("count");
        // A real external agent that fails twice, then answers.
        let script = format!(
            "n=$(cat {c} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {c}; \
             if [ $n -lt 3 ]; then echo \"busy, try again\" >&2; exit 1; fi; \
             echo \"{{\\\"result\\\": \\\"done on try $n\\\"}}\"",
            c = counter.display()
        );
        let agent = ExternalAgent::from_config(&ExternalAgentConfig {
            name: "flaky".into(),
            description: "Does any task.".into(),
            skills: Vec::new(),
            command: Some(vec!["sh".into(), "-c".into(), script]),
            url: None,
            a2a: None,
            ca_file: None,
            timeout_secs: 10,
            max_output_bytes: 1000,
        })
        .unwrap();
        let tools = ToolBox::new().with_tool(std::sync::Arc::new(agent));
        let config = ExecutorConfig {
            allow_no_tool: false,
            max_steps: 1,
            ..test_config()
        };
        let exec = Executor::with_config(tiny_llm(dir.path()), tools, config);
        let out = exec.run(&task("Summarise the plan.")).await.unwrap();
        assert_eq!(out.steps.len(), 3, "{:#?}", out.steps);
        for s in &out.steps[..2] {
            assert_eq!(s.tool, "flaky");
            assert!(
                s.error.as_deref().unwrap().contains("busy, try again"),
                "{s:?}"
            );
            // Grounded arguments: the task id and context come from the task.
            assert_eq!(s.args["task_id"], "t1");
            assert_eq!(s.args["context"], "Summarise the plan.");
        }
        assert_eq!(out.steps[2].observation.as_deref(), Some("done on try 3"));
        assert!(out.steps[2].error.is_none());
    }

    #[tokio::test]
    async fn attempts_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let agent = ExternalAgent::from_config(&ExternalAgentConfig {
            name: "broken".into(),
            description: "Does any task.".into(),
            skills: Vec::new(),
            command: Some(vec!["sh".into(), "-c".into(), "exit 7".into()]),
            url: None,
            a2a: None,
            ca_file: None,
            timeout_secs: 10,
            max_output_bytes: 1000,
        })
        .unwrap();
        let tools = ToolBox::new().with_tool(std::sync::Arc::new(agent));
        let config = ExecutorConfig {
            allow_no_tool: false,
            max_steps: 2,
            ..test_config()
        };
        let exec = Executor::with_config(tiny_llm(dir.path()), tools, config);
        let out = exec.run(&task("Summarise the plan.")).await.unwrap();
        // At most 3 attempts per plan step, every one recorded with its error.
        assert!(
            (3..=6).contains(&out.steps.len()) && out.steps.len() % 3 == 0,
            "{:#?}",
            out.steps
        );
        assert!(out
            .steps
            .iter()
            .all(|s| s.error.is_some() && s.observation.is_none()));
    }

    #[test]
    fn truncation_respects_characters() {
        assert_eq!(truncate_chars("héllo", 2), "hé…");
        assert_eq!(truncate_chars("hé", 2), "hé");
    }
}
