//! Tool calling for `POST /v1/chat/completions` (OpenAI's `tools`, `tool_choice`,
//! `parallel_tool_calls`, assistant `tool_calls` and `tool` messages).
//!
//! A call is written in the model's own format when its chat template has one
//! ([`ToolFormat`], found by rendering a probe when the model loads): the template lists
//! the tools and renders earlier calls and results, and the model writes Hermes-style
//! `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (Qwen 2.5, Qwen 3,
//! SmolLM3) or Llama 3.1's bare `{"name": ..., "parameters": {...}}` object. Otherwise
//! Starling's generic format is used, which works with any template: the tools are listed
//! in a system message, a call is the JSON object `{"tool_calls": [{"name": ...,
//! "arguments": {...}}]}`, earlier calls are shown in that format and tool results as a
//! user turn.
//!
//! Either way the constraint engine writes the call under a grammar built from the tools'
//! own parameter schemas, so every call parses and its arguments validate: with `required`
//! or a named tool the output must be a call; with `auto` the grammar lets the model either
//! write a call or a plain answer that does not start as a call does (`{`, or `<` for the
//! Hermes format), a constrained choice between calling and answering.

use serde_json::{json, Map, Value};
use starling_models::chat::{ChatMessage, ChatToolCall, ToolFormat};
use starling_models::constraint::{json_layout_for_lark, Constraint};

use super::error::ApiError;

/// Longest tool name OpenAI allows.
const MAX_NAME: usize = 64;
/// Most tools in one request.
pub const MAX_TOOLS: usize = 128;
/// Most calls in one answer when parallel calls are allowed.
const MAX_PARALLEL: usize = 8;

/// One function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// Its name (`^[A-Za-z0-9_-]{1,64}$`).
    pub name: String,
    /// What it does, shown to the model.
    pub description: String,
    /// JSON Schema of its arguments (an object schema; `{}` when the request gave none).
    pub parameters: Value,
}

/// What `tool_choice` asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// Never call a tool: the tools are not offered.
    None,
    /// Call tools or answer, as the model chooses.
    Auto,
    /// Call at least one tool.
    Required,
    /// Call this tool.
    Named(String),
}

/// The tools of a request and how they may be used.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolPlan {
    /// The tools offered.
    pub tools: Vec<Tool>,
    /// How.
    pub choice: ToolChoice,
    /// Several calls in one answer allowed (`parallel_tool_calls`, default true).
    pub parallel: bool,
    /// The embedding router has decided this request (whether or not it chose a tool), so
    /// the answers of a request with `n` > 1 share one decision and one embedding.
    pub routed: bool,
}

/// The syntax the model writes calls in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syntax {
    /// Starling's own: `{"tool_calls": [{"name": ..., "arguments": {...}}]}`, tools listed
    /// in a system message.
    Generic,
    /// The chat template's own format.
    Native(ToolFormat),
}

impl Syntax {
    /// The syntax for a model whose template has `format` (or none).
    pub fn of(format: Option<ToolFormat>) -> Self {
        format.map_or(Self::Generic, Self::Native)
    }

    /// Whether output whose first non-blank character is `c` is (the start of) a call.
    pub fn opens_call(self, c: char) -> bool {
        match self {
            Self::Native(ToolFormat::Hermes) => c == '<',
            Self::Generic | Self::Native(ToolFormat::Llama3Json) => c == '{',
        }
    }

    /// Reads the model's output: the calls when it wrote calls, `None` for a plain answer
    /// (or a call cut short before any call was whole). `ids` makes the call ids.
    pub fn read_calls(
        self,
        output: &str,
        mut ids: impl FnMut() -> String,
    ) -> Option<Vec<ToolCall>> {
        let text = output.trim_start();
        if !text.chars().next().is_some_and(|c| self.opens_call(c)) {
            return None;
        }
        let (calls, args_key) = match self {
            Self::Generic => {
                let v: Value = serde_json::from_str(text.trim_end())
                    .ok()
                    .or_else(|| whole_calls(text))?;
                (v.get("tool_calls")?.as_array()?.clone(), "arguments")
            }
            Self::Native(ToolFormat::Hermes) => (hermes_calls(text), "arguments"),
            Self::Native(ToolFormat::Llama3Json) => (
                vec![serde_json::from_str(text.trim_end()).ok()?],
                "parameters",
            ),
        };
        let out: Vec<ToolCall> = calls
            .iter()
            .filter_map(|c| {
                Some(ToolCall {
                    id: ids(),
                    name: c.get("name")?.as_str()?.to_string(),
                    arguments: c.get(args_key)?.to_string(),
                })
            })
            .collect();
        (!out.is_empty()).then_some(out)
    }
}

/// The whole `<tool_call>` blocks of Hermes-style output, in order (a block cut short by
/// `max_tokens` is left out).
fn hermes_calls(text: &str) -> Vec<Value> {
    const OPEN: &str = "<tool_call>";
    const CLOSE: &str = "</tool_call>";
    let mut out = Vec::new();
    let mut rest = text.trim_start();
    while let Some(after) = rest.strip_prefix(OPEN) {
        let Some(end) = after.find(CLOSE) else { break };
        if let Ok(v) = serde_json::from_str(after[..end].trim()) {
            out.push(v);
        }
        rest = after[end + CLOSE.len()..].trim_start();
    }
    out
}

fn bad(param: impl Into<String>, message: impl Into<String>) -> ApiError {
    ApiError::invalid_param(param, message)
}

/// Reads `tools`, `tool_choice` and `parallel_tool_calls`. `None` when there is nothing to
/// call (no tools, or `tool_choice: "none"`).
pub fn parse(
    tools: Option<&[Value]>,
    choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<Option<ToolPlan>, ApiError> {
    let tools = tools.unwrap_or_default();
    if tools.len() > MAX_TOOLS {
        return Err(bad(
            "tools",
            format!("at most {MAX_TOOLS} tools are accepted"),
        ));
    }
    let mut parsed: Vec<Tool> = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let tool = parse_tool(t, i)?;
        if parsed.iter().any(|p| p.name == tool.name) {
            return Err(bad(
                format!("tools[{i}].function.name"),
                format!("tool name `{}` is given twice", tool.name),
            ));
        }
        parsed.push(tool);
    }
    let choice = match choice {
        None | Some(Value::Null) => {
            if parsed.is_empty() {
                ToolChoice::None
            } else {
                ToolChoice::Auto
            }
        }
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(bad(
                    "tool_choice",
                    format!("unknown tool_choice `{other}` (expected none, auto, required or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}})"),
                ))
            }
        },
        Some(v) => {
            let name = v
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| v.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| {
                    bad(
                        "tool_choice",
                        "tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    )
                })?;
            if !parsed.iter().any(|t| t.name == name) {
                return Err(bad(
                    "tool_choice.function.name",
                    format!("tool_choice names `{name}`, which is not among the tools"),
                ));
            }
            ToolChoice::Named(name.to_string())
        }
    };
    if choice != ToolChoice::None && parsed.is_empty() {
        return Err(bad(
            "tool_choice",
            "tool_choice asks for a tool call but no tools are given",
        ));
    }
    if choice == ToolChoice::None {
        return Ok(None);
    }
    Ok(Some(ToolPlan {
        tools: parsed,
        choice,
        parallel: parallel.unwrap_or(true),
        routed: false,
    }))
}

fn parse_tool(t: &Value, i: usize) -> Result<Tool, ApiError> {
    if t.get("type").and_then(Value::as_str) != Some("function") {
        return Err(bad(
            format!("tools[{i}].type"),
            "only tools of type `function` are supported",
        ));
    }
    let f = t.get("function").filter(|f| f.is_object()).ok_or_else(|| {
        bad(
            format!("tools[{i}].function"),
            "a tool needs a `function` object",
        )
    })?;
    let name = f
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| {
            !n.is_empty()
                && n.len() <= MAX_NAME
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        })
        .ok_or_else(|| {
            bad(
                format!("tools[{i}].function.name"),
                "a tool name is 1 to 64 letters, digits, `_` or `-`",
            )
        })?;
    let description = match f.get("description") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => {
            return Err(bad(
                format!("tools[{i}].function.description"),
                "a tool description must be a string",
            ))
        }
    };
    let parameters = match f.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => {
            return Err(bad(
                format!("tools[{i}].function.parameters"),
                "tool parameters must be a JSON Schema object",
            ))
        }
    };
    Ok(Tool {
        name: name.to_string(),
        description,
        parameters,
    })
}

impl ToolPlan {
    /// The tools a call may name: all of them, or the named one.
    fn callable(&self) -> impl Iterator<Item = &Tool> {
        self.tools.iter().filter(move |t| match &self.choice {
            ToolChoice::Named(n) => &t.name == n,
            _ => true,
        })
    }

    /// What the embedding router compares with the user's message, one text per tool:
    /// `name: description`.
    pub fn route_texts(&self) -> Vec<String> {
        self.tools
            .iter()
            .map(|t| format!("{}: {}", t.name, t.description.trim()))
            .collect()
    }

    /// Whether the embedding router decides this request: it has not decided yet, and
    /// - `auto`: the conversation ends with the user's message. After a `tool` result the
    ///   model answers or calls again by itself.
    /// - `required`: it ends with the user's message or a tool result. A call must follow
    ///   either way, and left to itself the small model repeats the call it just made
    ///   (pydantic-ai and smolagents looped on their weather tool until the context was
    ///   full), so the router picks among the tools not called yet ([`Self::uncalled`]).
    /// - a named tool or `none`: never; the client has chosen.
    pub fn routes(&self, messages: &[ChatMessage]) -> bool {
        let last = messages.last().map(|m| m.role.as_str());
        !self.routed
            && !self.tools.is_empty()
            && match self.choice {
                ToolChoice::Auto => last == Some("user"),
                ToolChoice::Required => matches!(last, Some("user" | "tool")),
                ToolChoice::None | ToolChoice::Named(_) => false,
            }
    }

    /// For each offered tool, whether the conversation has not called it yet. A tool is
    /// called when an assistant message's calls name it, or when an assistant message's
    /// text holds a call of it written out (`'name': 'get_weather'` or `"name":
    /// "get_weather"`): clients such as smolagents send earlier calls back as text
    /// (`Calling tools: [{... 'name': 'get_weather' ...}]`) and their results as user
    /// messages. The whole conversation counts, since such a client's results look like
    /// the user's turns.
    pub fn uncalled(&self, messages: &[ChatMessage]) -> Vec<bool> {
        let assistant: Vec<&ChatMessage> =
            messages.iter().filter(|m| m.role == "assistant").collect();
        self.tools
            .iter()
            .map(|t| {
                !assistant.iter().any(|m| {
                    m.tool_calls.iter().any(|c| c.function.name == t.name)
                        || call_written_out(&m.content, &t.name)
                })
            })
            .collect()
    }

    /// The embedding router's decision, from the cosine similarity of the user's message
    /// to each tool's [`route_texts`](Self::route_texts):
    /// - `auto`: the most similar tool is called when its similarity reaches `threshold`;
    ///   below it `auto` stays, and the model chooses between a call and an answer. Every
    ///   tool may be routed, called before or not (a user's next question may want the
    ///   same tool again).
    /// - `required`: the most similar of the tools `open` marks ([`Self::uncalled`]) is
    ///   called, whatever its similarity (there is no answer to choose instead); when every
    ///   tool has been called the model picks.
    ///
    /// A chosen tool becomes the `tool_choice`, called once; the model writes its arguments
    /// under its schema. Returns the tool chosen; either way the plan is marked as decided.
    ///
    /// Why: left to itself a small model never starts a call under `auto` (0 of 36
    /// prompts that wanted one, `benches/tools/README.md`) and, made to call, picks the
    /// tool worse than the embedding model ranks them; which tool, and whether any, is a
    /// choice among grounded options, the arguments stay the chat model's, under the
    /// constraint.
    pub fn route(&mut self, open: &[bool], similarities: &[f32], threshold: f32) -> Option<&str> {
        if !matches!(self.choice, ToolChoice::Auto | ToolChoice::Required)
            || similarities.len() != self.tools.len()
            || open.len() != self.tools.len()
        {
            return None;
        }
        self.routed = true;
        let (best, sim) = similarities
            .iter()
            .enumerate()
            .filter(|(i, s)| (self.choice == ToolChoice::Auto || open[*i]) && s.is_finite())
            .max_by(|a, b| a.1.total_cmp(b.1))?;
        // A NaN threshold compares as nothing, so it routes nothing.
        if self.choice == ToolChoice::Auto && sim.partial_cmp(&threshold).is_none_or(|o| o.is_lt())
        {
            return None;
        }
        self.choice = ToolChoice::Named(self.tools[best].name.clone());
        // One call: a small model given one tool repeats the call while parallel calls are
        // allowed (1.8 calls per routed request on `routing_blind.jsonl`).
        self.parallel = false;
        Some(&self.tools[best].name)
    }

    /// Most calls in one answer.
    fn max_calls(&self) -> usize {
        if self.parallel {
            MAX_PARALLEL
        } else {
            1
        }
    }

    /// JSON Schema of one call: `{"name": <a callable tool>, <args_key>: <its arguments>}`.
    fn one_call_schema(&self, args_key: &str) -> Value {
        json!({"anyOf": self.call_items(args_key)})
    }

    /// One schema per callable tool, for `{"name": <the tool>, <args_key>: <its arguments>}`.
    fn call_items(&self, args_key: &str) -> Vec<Value> {
        self.callable()
            .map(|t| {
                let mut properties = Map::new();
                properties.insert("name".into(), json!({"const": t.name}));
                properties.insert(args_key.into(), t.parameters.clone());
                json!({
                    "type": "object",
                    "properties": properties,
                    "required": ["name", args_key],
                    "additionalProperties": false,
                })
            })
            .collect()
    }

    /// JSON Schema of the generic format's call object.
    pub fn call_schema(&self) -> Value {
        let items = self.call_items("arguments");
        let max = self.max_calls();
        json!({
            "type": "object",
            "properties": {
                "tool_calls": {
                    "type": "array",
                    "items": {"anyOf": items},
                    "minItems": 1,
                    "maxItems": max,
                }
            },
            "required": ["tool_calls"],
            "additionalProperties": false,
        })
    }

    /// The constraint on the output in `syntax`: calls, or (with `auto`) calls or an answer
    /// that does not start as a call does.
    pub fn constraint(&self, syntax: Syntax) -> Constraint {
        let auto = self.choice == ToolChoice::Auto;
        // One JSON value that is the call, or (with `auto`) that or an answer not opening
        // with `{`.
        let one_object = |schema: Value| match auto {
            true => Constraint::Lark(format!(
                "start: call | ANSWER\ncall: %json {}\nANSWER: /[^{{\\s][\\s\\S]*/\n",
                json_layout_for_lark(&schema)
            )),
            false => Constraint::JsonSchema(schema),
        };
        match syntax {
            Syntax::Generic => one_object(self.call_schema()),
            // One call per turn: Llama 3.1's templates refuse more in the history.
            Syntax::Native(ToolFormat::Llama3Json) => {
                one_object(self.one_call_schema("parameters"))
            }
            Syntax::Native(ToolFormat::Hermes) => {
                let schema = json_layout_for_lark(&self.one_call_schema("arguments"));
                let calls = match self.max_calls() - 1 {
                    0 => "call".to_string(),
                    more => format!("call (\"\\n\" call){{0,{more}}}"),
                };
                let start = if auto { "calls | ANSWER" } else { "calls" };
                Constraint::Lark(format!(
                    "start: {start}\ncalls: {calls}\n\
                     call: \"<tool_call>\\n\" args \"\\n</tool_call>\"\n\
                     args: %json {schema}\nANSWER: /[^<\\s][\\s\\S]*/\n"
                ))
            }
        }
    }

    /// The tools as the chat template reads them (OpenAI's function definitions).
    pub fn template_tools(&self) -> Value {
        Value::Array(
            self.tools
                .iter()
                .map(|t| {
                    json!({"type": "function", "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    }})
                })
                .collect(),
        )
    }

    /// The system text that lists the tools and the call format.
    pub fn instructions(&self) -> String {
        let mut s = String::from("You can call these tools:\n");
        for t in &self.tools {
            s.push_str(&format!(
                "- {}: {} Arguments (JSON Schema): {}\n",
                t.name,
                if t.description.is_empty() {
                    "(no description)."
                } else {
                    t.description.trim()
                },
                t.parameters
            ));
        }
        s.push_str(
            "To call tools, reply with only a JSON object: {\"tool_calls\": [{\"name\": \
             \"<tool name>\", \"arguments\": {<arguments>}}]}.",
        );
        match &self.choice {
            ToolChoice::Auto => s.push_str(
                " When no tool is needed, or once tool results answer the question, reply \
                 in plain text instead.",
            ),
            ToolChoice::Required => s.push_str(" Call at least one tool now."),
            ToolChoice::Named(n) => s.push_str(&format!(" Call `{n}` now.")),
            ToolChoice::None => {}
        }
        s
    }

    /// Adds the tool instructions to the conversation: to its leading system message, or as
    /// a new first message.
    pub fn instruct(&self, messages: &mut Vec<ChatMessage>) {
        let text = self.instructions();
        match messages.first_mut() {
            Some(first) if first.role == "system" => {
                first.content = format!("{}\n\n{text}", first.content.trim_end());
            }
            _ => messages.insert(0, ChatMessage::new("system", text)),
        }
    }
}

/// The cosine similarity of `vectors[0]` (the user's message) to each of the others (the
/// tools' [`ToolPlan::route_texts`]); 0 for an empty or mismatched vector. Embedders return
/// unit vectors, but a vector is normalised here anyway (the memory book's helpers), so
/// the router's threshold means a cosine whatever the model.
pub fn similarities(vectors: &[Vec<f32>]) -> Vec<f32> {
    use crate::memory::book::{dot, unit};
    let Some((q, rest)) = vectors.split_first() else {
        return Vec::new();
    };
    let Some(q) = unit(q.clone()) else {
        return vec![0.0; rest.len()];
    };
    rest.iter()
        .map(|v| match unit(v.clone()) {
            Some(v) if v.len() == q.len() => dot(&q, &v),
            _ => 0.0,
        })
        .collect()
}

/// The last user message: what the tool router compares with the tools, and what worked
/// examples are looked up for.
pub fn last_user_message(messages: &[ChatMessage]) -> Option<&str> {
    messages
        .iter()
        .rev()
        .find(|m| m.role == "user")
        .map(|m| m.content.as_str())
}

/// Whether `text` holds a call of tool `name` written out as JSON or as a Python dict:
/// `"name": "NAME"` or `'name': 'NAME'`. A tool's name in prose ("let me search") is no call.
fn call_written_out(text: &str, name: &str) -> bool {
    [('"', "\"name\""), ('\'', "'name'")]
        .iter()
        .any(|(q, key)| {
            let quoted = format!("{q}{name}{q}");
            text.match_indices(key).any(|(i, _)| {
                text[i + key.len()..]
                    .trim_start()
                    .strip_prefix(':')
                    .is_some_and(|rest| rest.trim_start().starts_with(&quoted))
            })
        })
}

/// One call the model made.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// `call_…`, unique within the answer.
    pub id: String,
    /// The tool.
    pub name: String,
    /// Its arguments as compact JSON text (what OpenAI's `arguments` holds).
    pub arguments: String,
}

/// The calls that were complete when a call object was cut short (by `max_tokens`, often
/// while a small model adds one parallel call after another): the text up to the last
/// call that closed, with the array and object closed after it.
fn whole_calls(text: &str) -> Option<Value> {
    let (mut depth, mut in_string, mut escaped, mut cut) = (0usize, false, false, None);
    for (i, c) in text.char_indices() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' | '[' => depth += 1,
            '}' | ']' => {
                depth = depth.checked_sub(1)?;
                // Object (1) > `tool_calls` array (2) > a call (3) that just closed.
                if c == '}' && depth == 2 {
                    cut = Some(i + 1);
                }
            }
            _ => {}
        }
    }
    serde_json::from_str(&format!("{}]}}", &text[..cut?])).ok()
}

/// The OpenAI `tool_calls` array of an answer.
pub fn openai_calls(calls: &[ToolCall]) -> Value {
    Value::Array(
        calls
            .iter()
            .map(|c| {
                json!({
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                })
            })
            .collect(),
    )
}

/// The calls of an earlier assistant message (OpenAI's `tool_calls`), for the chat
/// template: arguments, which OpenAI sends as a JSON string, become the object templates
/// expect.
pub fn history_calls(tool_calls: &[Value], i: usize) -> Result<Vec<ChatToolCall>, ApiError> {
    let mut calls = Vec::with_capacity(tool_calls.len());
    for (j, c) in tool_calls.iter().enumerate() {
        let f = c.get("function").filter(|f| f.is_object());
        let name = f.and_then(|f| f.get("name")).and_then(Value::as_str);
        let args = f.and_then(|f| f.get("arguments")).and_then(Value::as_str);
        let (Some(name), Some(args)) = (name, args) else {
            return Err(bad(
                format!("messages[{i}].tool_calls[{j}]"),
                "a tool call needs function.name and function.arguments (a JSON string)",
            ));
        };
        let args: Value = serde_json::from_str(args).map_err(|e| {
            bad(
                format!("messages[{i}].tool_calls[{j}].function.arguments"),
                format!("arguments are not JSON: {e}"),
            )
        })?;
        let id = c.get("id").and_then(Value::as_str).unwrap_or_default();
        calls.push(ChatToolCall::function(id, name, args));
    }
    Ok(calls)
}

/// A conversation with tool calls and results, for a template without a tool format: an
/// assistant's calls are appended to its text as the generic call object (so the model sees
/// its own calls as it wrote them), and tool results become a user turn, which every chat
/// template accepts, naming the tool and followed by a request to use them (wording that
/// got SmolLM2-135M to state the result rather than talk past it); the results of parallel
/// calls share one turn.
pub fn generic_history(messages: Vec<ChatMessage>) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len());
    // The lines of the tool-result turn being built (the last message of `out`).
    let mut tool_turn: Option<Vec<String>> = None;
    for m in messages {
        if m.role == "tool" {
            let name = m.name.as_deref().unwrap_or("the tool");
            let lines = tool_turn.get_or_insert_with(|| {
                out.push(ChatMessage::user(String::new()));
                Vec::new()
            });
            lines.push(format!("{name} returned: {}", m.content.trim()));
            let suffix = if lines.len() == 1 {
                "Answer the question with this result."
            } else {
                "Answer the question with these results."
            };
            if let Some(last) = out.last_mut() {
                last.content = format!("{}\n{suffix}", lines.join("\n"));
            }
            continue;
        }
        tool_turn = None;
        if m.tool_calls.is_empty() {
            out.push(m);
            continue;
        }
        let calls: Vec<Value> = m
            .tool_calls
            .iter()
            .map(|c| json!({"name": c.function.name, "arguments": c.function.arguments}))
            .collect();
        let call_text = json!({ "tool_calls": calls }).to_string();
        let content = if m.content.trim().is_empty() {
            call_text
        } else {
            format!("{}\n{call_text}", m.content.trim_end())
        };
        out.push(ChatMessage::new(m.role, content));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!({"type": "function", "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}
        }})
    }

    fn clock() -> Value {
        json!({"type": "function", "function": {
            "name": "get_time",
            "description": "The local time in a time zone.",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}
        }})
    }

    #[test]
    fn the_router_calls_the_most_similar_tool_only_above_its_threshold() {
        let tools = [weather(), clock()];
        let mut plan = parse(Some(&tools), None, None).unwrap().unwrap();
        assert_eq!(
            plan.route_texts(),
            [
                "get_weather: Current weather in a city.",
                "get_time: The local time in a time zone."
            ]
        );
        let open = [true, true];
        // Below the threshold `auto` stays and the model decides.
        assert_eq!(plan.clone().route(&open, &[0.2, 0.25], 0.3), None);
        assert_eq!(plan.choice, ToolChoice::Auto);
        // A similarity per tool is needed.
        assert_eq!(plan.clone().route(&open, &[0.9], 0.3), None);
        assert_eq!(
            plan.clone().route(&open, &[f32::NAN, 0.2], 0.3),
            None,
            "NaN is no similarity"
        );
        assert_eq!(plan.clone().route(&open, &[0.9, 0.1], f32::NAN), None);
        // Under `auto` a tool called before may be routed again.
        assert_eq!(
            plan.clone().route(&[true, false], &[0.31, 0.6], 0.3),
            Some("get_time")
        );
        assert!(plan.parallel);
        assert_eq!(plan.route(&open, &[0.31, 0.6], 0.3), Some("get_time"));
        assert_eq!(plan.choice, ToolChoice::Named("get_time".into()));
        assert!(!plan.parallel, "a routed request makes one call");
        // A decided plan is not routed again.
        assert_eq!(plan.route(&open, &[0.9, 0.1], 0.3), None);
        assert_eq!(plan.choice, ToolChoice::Named("get_time".into()));
        // `required` calls the most similar tool whatever its similarity; when every tool
        // has been called the model picks.
        let required = parse(Some(&tools), Some(&json!("required")), None)
            .unwrap()
            .unwrap();
        let mut r = required.clone();
        assert_eq!(r.route(&open, &[0.1, 0.2], 0.3), Some("get_time"));
        assert_eq!(r.choice, ToolChoice::Named("get_time".into()));
        assert!(!r.parallel);
        // Under `required` a tool called already is not routed again while others remain.
        assert_eq!(
            required.clone().route(&[false, true], &[0.9, 0.1], 0.3),
            Some("get_time")
        );
        let mut r = required.clone();
        assert_eq!(r.route(&[false, false], &[0.9, 0.1], 0.3), None);
        assert_eq!(r.choice, ToolChoice::Required);
        assert!(r.routed && r.parallel);
        // A named choice is the client's.
        let named = json!({"type": "function", "function": {"name": "get_time"}});
        let named = parse(Some(&tools), Some(&named), None).unwrap().unwrap();
        let mut n = named.clone();
        assert_eq!(n.route(&open, &[0.9, 0.1], 0.3), None);
        assert_eq!(n, named);
    }

    #[test]
    fn the_router_decides_only_a_users_turn_under_auto() {
        let tools = [weather()];
        let plan = parse(Some(&tools), None, None).unwrap().unwrap();
        let user = ChatMessage::user("Weather in Oslo?");
        assert!(plan.routes(std::slice::from_ref(&user)));
        assert!(!plan.routes(&[]));
        // After a tool result the model answers or calls again by itself.
        let mut result = ChatMessage::new("tool", "17 degrees");
        result.tool_call_id = Some("call_1".into());
        assert!(!plan.routes(&[user.clone(), result]));
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let forced = parse(Some(&tools), Some(&named), None).unwrap().unwrap();
        assert!(!forced.routes(std::slice::from_ref(&user)));
        // Decided once per request, whatever it decided.
        let mut decided = plan.clone();
        assert_eq!(decided.route(&[true], &[0.1], 0.3), None);
        assert!(!decided.routes(std::slice::from_ref(&user)));
    }

    #[test]
    fn under_required_the_router_moves_on_to_a_tool_not_called_yet() {
        let final_answer = json!({"type": "function", "function": {
            "name": "final_answer", "description": "Provides a final answer.",
            "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}}}});
        let tools = [weather(), final_answer];
        let plan = parse(Some(&tools), Some(&json!("required")), None)
            .unwrap()
            .unwrap();
        let user = ChatMessage::user("Weather in Oslo?");
        assert!(plan.routes(std::slice::from_ref(&user)));
        assert_eq!(plan.uncalled(std::slice::from_ref(&user)), [true, true]);
        assert_eq!(
            last_user_message(std::slice::from_ref(&user)),
            Some("Weather in Oslo?")
        );
        // OpenAI's shape (pydantic-ai): a structured call, then its `tool` result.
        let call = ChatMessage::assistant_calls(
            "",
            vec![ChatToolCall::function(
                "call_1",
                "get_weather",
                json!({"city": "Oslo"}),
            )],
        );
        let result = ChatMessage::tool_result(Some("call_1".into()), None, "4 degrees");
        let openai = [user.clone(), call, result];
        assert!(plan.routes(&openai));
        assert_eq!(plan.uncalled(&openai), [false, true]);
        assert_eq!(last_user_message(&openai), Some("Weather in Oslo?"));
        // smolagents' shape: the call as assistant text, its result as a user message.
        let text = [
            user.clone(),
            ChatMessage::assistant("Calling tools:\n[{'function': {'name': 'get_weather'}}]"),
            ChatMessage::user("Observation:\n4 degrees"),
        ];
        assert!(plan.routes(&text));
        assert_eq!(plan.uncalled(&text), [false, true]);
        let mut next = plan.clone();
        assert_eq!(
            next.route(&plan.uncalled(&text), &[0.8, 0.1], 0.3),
            Some("final_answer")
        );
        // JSON counts too; a name in prose, or inside a longer name, is no call.
        let json_text = [
            user.clone(),
            ChatMessage::assistant(r#"{"name" : "final_answer"}"#),
        ];
        assert_eq!(plan.uncalled(&json_text), [true, false]);
        let prose = [
            user,
            ChatMessage::assistant("I will call get_weather, then final_answer."),
            ChatMessage::assistant("{'name': 'get_weather_v2'}"),
        ];
        assert_eq!(plan.uncalled(&prose), [true, true]);
    }

    #[test]
    fn similarities_are_cosines_to_the_first_vector() {
        let s = similarities(&[
            vec![2.0, 0.0],
            vec![1.0, 0.0],
            vec![0.0, 3.0],
            vec![1.0, 1.0],
            vec![1.0],
        ]);
        assert_eq!(s.len(), 4);
        assert!((s[0] - 1.0).abs() < 1e-6 && s[1].abs() < 1e-6);
        assert!((s[2] - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-6);
        assert_eq!(s[3], 0.0, "a vector of another length");
        assert!(similarities(&[]).is_empty());
        assert_eq!(similarities(&[vec![0.0, 0.0], vec![1.0, 0.0]]), [0.0]);
    }

    #[test]
    fn choices_are_read_and_checked() {
        let tools = [weather()];
        let plan = parse(Some(&tools), None, None).unwrap().unwrap();
        assert_eq!(plan.choice, ToolChoice::Auto);
        assert!(plan.parallel);
        assert!(parse(Some(&tools), Some(&json!("none")), None)
            .unwrap()
            .is_none());
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let plan = parse(Some(&tools), Some(&named), Some(false))
            .unwrap()
            .unwrap();
        assert_eq!(plan.choice, ToolChoice::Named("get_weather".into()));
        let e = parse(
            Some(&tools),
            Some(&json!({"type": "function", "function": {"name": "nope"}})),
            None,
        )
        .unwrap_err();
        assert!(e.to_string().contains("not among the tools"), "{e}");
        assert!(parse(None, Some(&json!("required")), None).is_err());
        let e = parse(
            Some(&[json!({"type": "function", "function": {"name": "a b"}})]),
            None,
            None,
        )
        .unwrap_err();
        assert!(e.to_string().contains("letters, digits"), "{e}");
        assert!(parse(Some(&[weather(), weather()]), None, None).is_err());
    }

    #[test]
    fn the_call_schema_names_only_the_allowed_tools() {
        let other = json!({"type": "function", "function": {"name": "other"}});
        let named = json!({"type": "function", "function": {"name": "other"}});
        let plan = parse(Some(&[weather(), other]), Some(&named), Some(false))
            .unwrap()
            .unwrap();
        let schema = plan.call_schema();
        let items = &schema["properties"]["tool_calls"]["items"]["anyOf"];
        assert_eq!(items.as_array().unwrap().len(), 1);
        assert_eq!(items[0]["properties"]["name"]["const"], "other");
        assert_eq!(schema["properties"]["tool_calls"]["maxItems"], 1);
    }

    #[test]
    fn calls_are_read_back_and_history_is_written_in_the_same_format() {
        let mut n = 0;
        let mut ids = || {
            n += 1;
            format!("call_{n}")
        };
        let generic = Syntax::Generic;
        let out = r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}"#;
        let calls = generic.read_calls(out, &mut ids).unwrap();
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city":"Oslo"}"#);
        assert_eq!(calls[0].id, "call_1");
        assert!(generic.read_calls("It is sunny.", &mut ids).is_none());
        // Cut short in a second call: the first, complete one is kept.
        let cut =
            r#"{"tool_calls": [{"name": "a", "arguments": {"s": "x}]"}}, {"name": "b", "argu"#;
        let salvaged = generic.read_calls(cut, &mut ids).unwrap();
        assert_eq!(salvaged.len(), 1);
        assert_eq!(salvaged[0].arguments, r#"{"s":"x}]"}"#);
        assert!(generic
            .read_calls(r#"{"tool_calls": [{"name": "a", "argu"#, &mut ids)
            .is_none());
        // The same calls in the history, then their results: the assistant turn shows the
        // call object as the model wrote it, the results become one user turn.
        let openai = openai_calls(&calls);
        let history = vec![
            ChatMessage::user("Weather?"),
            ChatMessage::assistant_calls("", history_calls(openai.as_array().unwrap(), 1).unwrap()),
            ChatMessage::tool_result(Some("call_1".into()), Some("get_weather".into()), " 4 C "),
            ChatMessage::tool_result(None, None, "windy"),
        ];
        let lowered = generic_history(history);
        assert_eq!(lowered.len(), 3);
        assert_eq!(
            serde_json::from_str::<Value>(&lowered[1].content).unwrap(),
            serde_json::from_str::<Value>(out).unwrap()
        );
        assert!(lowered[1].tool_calls.is_empty());
        assert_eq!(lowered[2].role, "user");
        assert_eq!(
            lowered[2].content,
            "get_weather returned: 4 C\nthe tool returned: windy\n\
             Answer the question with these results."
        );
        assert!(history_calls(&[json!({"function": {"name": "x", "arguments": "{"}})], 0).is_err());
    }

    #[test]
    fn native_calls_are_read_in_the_templates_syntax() {
        let ids = || "call_x".to_string();
        let hermes = Syntax::Native(ToolFormat::Hermes);
        let two =
            "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"s\": \"</tool\"}}\n</tool_call>\n\
                   <tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>";
        let calls = hermes.read_calls(two, ids).unwrap();
        assert_eq!(
            calls
                .iter()
                .map(|c| (c.name.as_str(), c.arguments.as_str()))
                .collect::<Vec<_>>(),
            [("a", r#"{"s":"</tool"}"#), ("b", "{}")]
        );
        // Cut short inside the second block: the first is kept; inside the first: text.
        let cut = &two[..two.len() - 20];
        assert_eq!(hermes.read_calls(cut, ids).unwrap().len(), 1);
        assert!(hermes.read_calls(&two[..20], ids).is_none());
        assert!(hermes.read_calls("It is sunny.", ids).is_none());
        assert!(hermes.opens_call('<') && !hermes.opens_call('{'));

        let llama = Syntax::Native(ToolFormat::Llama3Json);
        let one = r#"{"name": "get_weather", "parameters": {"city": "Oslo"}}"#;
        let calls = llama.read_calls(one, ids).unwrap();
        assert_eq!(
            (calls[0].name.as_str(), calls[0].arguments.as_str()),
            ("get_weather", r#"{"city":"Oslo"}"#)
        );
        assert!(llama
            .read_calls(r#"{"name": "get_weather", "parame"#, ids)
            .is_none());
        assert!(llama.opens_call('{') && !llama.opens_call('<'));
    }

    #[test]
    fn native_constraints_name_only_the_allowed_tools_in_the_templates_syntax() {
        let other = json!({"type": "function", "function": {"name": "other"}});
        let plan = parse(Some(&[weather(), other.clone()]), None, Some(true))
            .unwrap()
            .unwrap();
        let Constraint::Lark(hermes) = plan.constraint(Syntax::Native(ToolFormat::Hermes)) else {
            panic!("Hermes calls are a grammar");
        };
        assert!(hermes.starts_with("start: calls | ANSWER\n"), "{hermes}");
        assert!(
            hermes.contains(&format!("{{0,{}}}", MAX_PARALLEL - 1)),
            "{hermes}"
        );
        assert!(
            hermes.contains(r#""<tool_call>\n" args "\n</tool_call>""#),
            "{hermes}"
        );
        assert!(
            hermes.contains(r#""const":"get_weather""#) && hermes.contains(r#""const":"other""#)
        );
        let named = json!({"type": "function", "function": {"name": "other"}});
        let plan = parse(Some(&[weather(), other]), Some(&named), Some(false))
            .unwrap()
            .unwrap();
        let Constraint::Lark(hermes) = plan.constraint(Syntax::Native(ToolFormat::Hermes)) else {
            panic!("Hermes calls are a grammar");
        };
        assert!(
            hermes.starts_with("start: calls\ncalls: call\n"),
            "{hermes}"
        );
        assert!(!hermes.contains("get_weather"), "{hermes}");
        let Constraint::JsonSchema(llama) = plan.constraint(Syntax::Native(ToolFormat::Llama3Json))
        else {
            panic!("a named Llama 3 call is a schema");
        };
        assert_eq!(llama["anyOf"][0]["required"], json!(["name", "parameters"]));
        assert_eq!(llama["anyOf"].as_array().unwrap().len(), 1);
        // The template is given every tool, in OpenAI's shape.
        let listed = plan.template_tools();
        assert_eq!(listed[0]["function"]["name"], "get_weather");
        assert_eq!(listed[1]["type"], "function");
    }
}
