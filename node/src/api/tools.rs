//! Tool calling for `POST /v1/chat/completions` (OpenAI's `tools`, `tool_choice`,
//! `parallel_tool_calls`, assistant `tool_calls` and `tool` messages).
//!
//! Starling's generic tool format, used with every model: the tools are listed in a system
//! message, and a call is the JSON object `{"tool_calls": [{"name": ..., "arguments":
//! {...}}]}`. The constraint engine writes that object under a schema built from the tools'
//! own parameter schemas, so every call parses and its arguments validate: with `required`
//! or a named tool the output must be a call; with `auto` the grammar lets the model either
//! write such a call or a plain answer that does not start with `{`, a constrained choice
//! between calling and answering. (Chat templates with a tool format of their own, such as
//! Qwen's `<tool_call>`, are not used yet: the generic format works with any template.)

use serde_json::{json, Map, Value};
use starling_models::chat::ChatMessage;
use starling_models::constraint::Constraint;

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

    /// JSON Schema of the call object.
    pub fn call_schema(&self) -> Value {
        let items: Vec<Value> = self
            .callable()
            .map(|t| {
                json!({
                    "type": "object",
                    "properties": {
                        "name": {"const": t.name},
                        "arguments": t.parameters,
                    },
                    "required": ["name", "arguments"],
                    "additionalProperties": false,
                })
            })
            .collect();
        let max = if self.parallel { MAX_PARALLEL } else { 1 };
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

    /// The constraint on the output: a call, or (with `auto`) a call or an answer that does
    /// not start with `{`.
    pub fn constraint(&self) -> Constraint {
        let schema = self.call_schema();
        match self.choice {
            ToolChoice::Auto => Constraint::Lark(format!(
                "start: call | ANSWER\ncall: %json {schema}\nANSWER: /[^{{\\s][\\s\\S]*/\n"
            )),
            _ => Constraint::JsonSchema(schema),
        }
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

/// Reads the model's output: the calls when it wrote a call object, `None` for a plain
/// answer. `ids` makes the call ids.
pub fn read_calls(output: &str, mut ids: impl FnMut() -> String) -> Option<Vec<ToolCall>> {
    let text = output.trim_start();
    if !text.starts_with('{') {
        return None;
    }
    let v: Value = serde_json::from_str(text.trim_end())
        .ok()
        .or_else(|| whole_calls(text))?;
    let calls = v.get("tool_calls")?.as_array()?;
    let out: Vec<ToolCall> = calls
        .iter()
        .filter_map(|c| {
            Some(ToolCall {
                id: ids(),
                name: c.get("name")?.as_str()?.to_string(),
                arguments: c.get("arguments")?.to_string(),
            })
        })
        .collect();
    (!out.is_empty()).then_some(out)
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

/// The text an earlier assistant message with `tool_calls` becomes in the prompt: the call
/// object of the generic format, so the model sees its own calls as it wrote them.
pub fn history_calls(tool_calls: &[Value], i: usize) -> Result<String, ApiError> {
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
        let mut call = Map::new();
        call.insert("name".into(), Value::String(name.to_string()));
        call.insert("arguments".into(), args);
        calls.push(Value::Object(call));
    }
    Ok(json!({"tool_calls": calls}).to_string())
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
        let out = r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}"#;
        let calls = read_calls(out, &mut ids).unwrap();
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city":"Oslo"}"#);
        assert_eq!(calls[0].id, "call_1");
        assert!(read_calls("It is sunny.", &mut ids).is_none());
        // Cut short in a second call: the first, complete one is kept.
        let cut =
            r#"{"tool_calls": [{"name": "a", "arguments": {"s": "x}]"}}, {"name": "b", "argu"#;
        let salvaged = read_calls(cut, &mut ids).unwrap();
        assert_eq!(salvaged.len(), 1);
        assert_eq!(salvaged[0].arguments, r#"{"s":"x}]"}"#);
        assert!(read_calls(r#"{"tool_calls": [{"name": "a", "argu"#, &mut ids).is_none());
        let history = history_calls(&openai_calls(&calls).as_array().unwrap().clone(), 1).unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&history).unwrap(),
            serde_json::from_str::<Value>(out).unwrap()
        );
        assert!(history_calls(&[json!({"function": {"name": "x", "arguments": "{"}})], 0).is_err());
    }
}
