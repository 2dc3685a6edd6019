//! Tools a node offers to the tasks it executes: the built-in `calculator` and `search_docs`,
//! and external agents integrated by command or HTTP endpoint.
//!
//! Every tool has a name, a description and a JSON Schema for its arguments (an object),
//! which the executor puts into the constrained decision that picks a tool, so the model's
//! arguments always have the right shape. [`ToolBox::from_config`] builds the set a node
//! offers from its `[agent]` config.
//!
//! # External agent protocol
//!
//! The task goes out as JSON, `{"task_id": "...", "description": "...", "context": "..."}`:
//! on the standard input of a command (closed after writing), or as the body of an HTTP
//! `POST`. The answer (stdout or response body) is either `{"result": "...", "ok": true}`
//! (`ok` defaults to true; with `"ok": false` the call failed, and `result` or `error` says
//! why), or plain text, taken as the result. A command must exit with status 0; an endpoint
//! must answer 2xx. Calls are bounded by a timeout (the command is killed when it passes) and
//! an output size limit; an empty answer, an answer that is not UTF-8, or a JSON object
//! without `result` is an error.
//!
//! An HTTP agent may take long (IoA's `run(task) -> task_id` contract): it answers the
//! POST with `{"task_id": "...", "status": "working"}` (or `submitted`), and the node polls
//! `GET <url>/<task_id>` (after 0.5 s, doubling to 5 s) until the answer is no longer
//! pending (each change of its state or `progress` text is reported, see
//! [`ExternalAgent::run_reporting`]); the answer is then read as above. When the call's
//! timeout passes first, or the call is dropped (the task was cancelled), the node sends
//! `DELETE <url>/<task_id>`.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tracing::{debug, info, warn};

use super::a2a::{A2aAgent, A2aError, Outcome};
use super::docs::{DocIndex, DocsError, Passage};
use super::with_causes;
use crate::config::{AgentSection, ExternalAgentConfig};

/// Why a tool call failed. The message is meant for the model too: it is put into the
/// context of the retry.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The arguments do not fit the tool's schema.
    #[error("bad arguments: {0}")]
    BadArgs(String),
    /// The expression could not be evaluated.
    #[error("calculator: {0}")]
    Calc(#[from] CalcError),
    /// The document folder could not be read.
    #[error(transparent)]
    Docs(#[from] DocsError),
    /// No tool of that name is offered.
    #[error("no tool named `{0}`")]
    Unknown(String),
    /// The external agent did not answer in time.
    #[error("external agent `{name}` did not answer within {secs} s")]
    Timeout {
        /// Tool name.
        name: String,
        /// The limit.
        secs: u64,
    },
    /// The external agent could not be reached or failed.
    #[error("external agent `{name}` failed: {reason}")]
    External {
        /// Tool name.
        name: String,
        /// What went wrong.
        reason: String,
    },
}

/// A tool the executor can call.
///
/// Calls return a boxed future so tools can live behind `Arc<dyn Tool>`.
pub trait Tool: Send + Sync {
    /// Unique name, as the model writes it.
    fn name(&self) -> &str;
    /// One line on what it does and when to use it.
    fn description(&self) -> &str;
    /// JSON Schema of the argument object.
    fn parameters(&self) -> Value;
    /// Runs the tool; the result is text for the model.
    fn call(&self, args: Value) -> BoxFuture<'_, Result<String, ToolError>>;
}

// ---------------------------------------------------------------------------------------------
// Calculator
// ---------------------------------------------------------------------------------------------

/// Why an expression has no value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CalcError {
    /// Nothing to evaluate.
    #[error("the expression is empty")]
    Empty,
    /// Longer than [`MAX_EXPRESSION_CHARS`].
    #[error("the expression is longer than {MAX_EXPRESSION_CHARS} characters")]
    TooLong,
    /// Parentheses or unary operators nested deeper than [`MAX_NESTING`].
    #[error("the expression is nested deeper than {MAX_NESTING} levels")]
    TooDeep,
    /// A character that is not part of an expression.
    #[error("unexpected character `{ch}` at position {pos}")]
    UnexpectedChar {
        /// The character.
        ch: char,
        /// 0-based character position.
        pos: usize,
    },
    /// A token in the wrong place.
    #[error("unexpected `{found}` at position {pos}")]
    UnexpectedToken {
        /// The token as written.
        found: String,
        /// 0-based character position.
        pos: usize,
    },
    /// The expression stops in the middle.
    #[error("the expression ends too early")]
    UnexpectedEnd,
    /// A name that is neither a function nor a constant.
    #[error(
        "unknown name `{0}` (functions: sqrt, abs, round, min, max, ln, log10; constants: pi, e)"
    )]
    UnknownName(String),
    /// A function called with the wrong number of arguments.
    #[error("`{name}` takes {expected} argument(s), got {got}")]
    Arity {
        /// The function.
        name: String,
        /// What it takes.
        expected: &'static str,
        /// What it got.
        got: usize,
    },
    /// Division (or modulo) by zero, or zero to a negative power.
    #[error("division by zero")]
    DivisionByZero,
    /// The result is too large to represent.
    #[error("overflow: the result is too large")]
    Overflow,
    /// A function applied outside its domain (square root or logarithm of a negative).
    #[error("{0}")]
    Domain(String),
}

/// Longest expression accepted, in characters.
pub const MAX_EXPRESSION_CHARS: usize = 1_000;
/// Deepest nesting of parentheses and unary operators accepted.
pub const MAX_NESTING: usize = 64;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(f64),
    Ident(String),
    Op(char),
    LParen,
    RParen,
    Comma,
}

impl Tok {
    fn text(&self) -> String {
        match self {
            Tok::Num(n) => n.to_string(),
            Tok::Ident(s) => s.clone(),
            Tok::Op(c) => c.to_string(),
            Tok::LParen => "(".into(),
            Tok::RParen => ")".into(),
            Tok::Comma => ",".into(),
        }
    }
}

fn lex(input: &str) -> Result<Vec<(Tok, usize)>, CalcError> {
    let chars: Vec<char> = input.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let start = i;
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) {
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            // Scientific notation only when digits follow the `e` (else `2e` is 2 * e).
            if i < chars.len() && (chars[i] == 'e' || chars[i] == 'E') {
                let mut j = i + 1;
                if j < chars.len() && (chars[j] == '+' || chars[j] == '-') {
                    j += 1;
                }
                if j < chars.len() && chars[j].is_ascii_digit() {
                    while j < chars.len() && chars[j].is_ascii_digit() {
                        j += 1;
                    }
                    i = j;
                }
            }
            let text: String = chars[start..i].iter().collect();
            let n: f64 = text.parse().map_err(|_| CalcError::UnexpectedToken {
                found: text.clone(),
                pos: start,
            })?;
            out.push((Tok::Num(n), start));
            continue;
        }
        if c.is_ascii_alphabetic() || c == '_' {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let name: String = chars[start..i].iter().collect();
            out.push((Tok::Ident(name.to_ascii_lowercase()), start));
            continue;
        }
        let tok = match c {
            '+' | '-' | '*' | '/' | '^' | '%' => Tok::Op(c),
            '−' => Tok::Op('-'),
            '×' => Tok::Op('*'),
            '÷' => Tok::Op('/'),
            '(' => Tok::LParen,
            ')' => Tok::RParen,
            ',' => Tok::Comma,
            _ => return Err(CalcError::UnexpectedChar { ch: c, pos: start }),
        };
        out.push((tok, start));
        i += 1;
    }
    Ok(out)
}

/// Recursive-descent parser and evaluator.
///
/// ```text
/// expr    = term (("+" | "-") term)*
/// term    = unary (("*" | "/" | "%") unary)*
/// unary   = "-" unary | "+" unary | power
/// power   = primary ("^" unary)?          (right-associative; -2^2 = -4, 2^-1 = 0.5)
/// primary = number | constant | name "(" expr ("," expr)* ")" | "(" expr ")"
/// ```
struct Parser {
    toks: Vec<(Tok, usize)>,
    pos: usize,
    depth: usize,
}

fn finite(x: f64) -> Result<f64, CalcError> {
    if x.is_finite() {
        Ok(x)
    } else if x.is_nan() {
        Err(CalcError::Domain("the result is not a number".into()))
    } else {
        Err(CalcError::Overflow)
    }
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|(t, _)| t)
    }

    fn next(&mut self) -> Option<(Tok, usize)> {
        let t = self.toks.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn unexpected(&self) -> CalcError {
        match self.toks.get(self.pos) {
            Some((t, pos)) => CalcError::UnexpectedToken {
                found: t.text(),
                pos: *pos,
            },
            None => CalcError::UnexpectedEnd,
        }
    }

    fn enter(&mut self) -> Result<(), CalcError> {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            Err(CalcError::TooDeep)
        } else {
            Ok(())
        }
    }

    fn expr(&mut self) -> Result<f64, CalcError> {
        let mut acc = self.term()?;
        while let Some(Tok::Op(op @ ('+' | '-'))) = self.peek().cloned() {
            self.pos += 1;
            let rhs = self.term()?;
            acc = finite(if op == '+' { acc + rhs } else { acc - rhs })?;
        }
        Ok(acc)
    }

    fn term(&mut self) -> Result<f64, CalcError> {
        let mut acc = self.unary()?;
        while let Some(Tok::Op(op @ ('*' | '/' | '%'))) = self.peek().cloned() {
            self.pos += 1;
            let rhs = self.unary()?;
            acc = match op {
                '*' => finite(acc * rhs)?,
                _ if rhs == 0.0 => return Err(CalcError::DivisionByZero),
                '/' => finite(acc / rhs)?,
                _ => finite(acc % rhs)?,
            };
        }
        Ok(acc)
    }

    fn unary(&mut self) -> Result<f64, CalcError> {
        match self.peek() {
            Some(Tok::Op(op @ ('-' | '+'))) => {
                let negate = *op == '-';
                self.pos += 1;
                self.enter()?;
                let v = self.unary()?;
                self.depth -= 1;
                Ok(if negate { -v } else { v })
            }
            _ => self.power(),
        }
    }

    fn power(&mut self) -> Result<f64, CalcError> {
        let base = self.primary()?;
        if let Some(Tok::Op('^')) = self.peek() {
            self.pos += 1;
            self.enter()?;
            let exp = self.unary()?;
            self.depth -= 1;
            if base == 0.0 && exp < 0.0 {
                return Err(CalcError::DivisionByZero);
            }
            if base < 0.0 && exp.fract() != 0.0 {
                return Err(CalcError::Domain(
                    "a negative number to a fractional power is not real".into(),
                ));
            }
            return finite(base.powf(exp));
        }
        Ok(base)
    }

    fn primary(&mut self) -> Result<f64, CalcError> {
        match self.next() {
            Some((Tok::Num(n), _)) => finite(n),
            Some((Tok::LParen, _)) => {
                self.enter()?;
                let v = self.expr()?;
                self.depth -= 1;
                match self.next() {
                    Some((Tok::RParen, _)) => Ok(v),
                    _ => {
                        self.pos -= 1;
                        Err(self.unexpected())
                    }
                }
            }
            Some((Tok::Ident(name), _)) => {
                if let Some(Tok::LParen) = self.peek() {
                    self.pos += 1;
                    self.enter()?;
                    let mut args = Vec::new();
                    if let Some(Tok::RParen) = self.peek() {
                        self.pos += 1;
                    } else {
                        loop {
                            args.push(self.expr()?);
                            match self.next() {
                                Some((Tok::Comma, _)) => continue,
                                Some((Tok::RParen, _)) => break,
                                _ => {
                                    self.pos -= 1;
                                    return Err(self.unexpected());
                                }
                            }
                        }
                    }
                    self.depth -= 1;
                    apply(&name, &args)
                } else {
                    match name.as_str() {
                        "pi" => Ok(std::f64::consts::PI),
                        "e" => Ok(std::f64::consts::E),
                        _ if FUNCTIONS.contains(&name.as_str()) => {
                            Err(CalcError::UnexpectedToken {
                                found: name,
                                pos: self.toks.get(self.pos - 1).map_or(0, |t| t.1),
                            })
                        }
                        _ => Err(CalcError::UnknownName(name)),
                    }
                }
            }
            Some(_) => {
                self.pos -= 1;
                Err(self.unexpected())
            }
            None => Err(CalcError::UnexpectedEnd),
        }
    }
}

const FUNCTIONS: &[&str] = &["sqrt", "abs", "round", "min", "max", "ln", "log10"];

fn apply(name: &str, args: &[f64]) -> Result<f64, CalcError> {
    let one = |f: fn(f64) -> Result<f64, CalcError>| match args {
        [x] => f(*x),
        _ => Err(CalcError::Arity {
            name: name.to_owned(),
            expected: "1",
            got: args.len(),
        }),
    };
    match name {
        "sqrt" => one(|x| {
            if x < 0.0 {
                Err(CalcError::Domain("square root of a negative number".into()))
            } else {
                Ok(x.sqrt())
            }
        }),
        "abs" => one(|x| Ok(x.abs())),
        "round" => one(|x| Ok(x.round())),
        "ln" | "log10" => {
            let ln = name == "ln";
            one(if ln {
                |x: f64| {
                    if x <= 0.0 {
                        Err(CalcError::Domain("logarithm of a number <= 0".into()))
                    } else {
                        Ok(x.ln())
                    }
                }
            } else {
                |x: f64| {
                    if x <= 0.0 {
                        Err(CalcError::Domain("logarithm of a number <= 0".into()))
                    } else {
                        Ok(x.log10())
                    }
                }
            })
        }
        "min" | "max" => {
            if args.is_empty() {
                return Err(CalcError::Arity {
                    name: name.to_owned(),
                    expected: "1 or more",
                    got: 0,
                });
            }
            let init = args[0];
            Ok(args[1..].iter().fold(
                init,
                |a, &b| {
                    if name == "min" {
                        a.min(b)
                    } else {
                        a.max(b)
                    }
                },
            ))
        }
        _ => Err(CalcError::UnknownName(name.to_owned())),
    }
}

/// Evaluates an arithmetic expression: `+ - * / % ^`, parentheses, unary minus, decimals
/// (and `1.5e3`), functions `sqrt abs round min max ln log10`, constants `pi e`. `^` binds
/// tighter than unary minus and is right-associative; `%` is the remainder. Nothing but
/// arithmetic is ever evaluated.
pub fn evaluate(expression: &str) -> Result<f64, CalcError> {
    if expression.chars().count() > MAX_EXPRESSION_CHARS {
        return Err(CalcError::TooLong);
    }
    let toks = lex(expression)?;
    if toks.is_empty() {
        return Err(CalcError::Empty);
    }
    let mut p = Parser {
        toks,
        pos: 0,
        depth: 0,
    };
    let v = p.expr()?;
    if p.pos < p.toks.len() {
        return Err(p.unexpected());
    }
    // `-0` prints as 0.
    Ok(if v == 0.0 { 0.0 } else { v })
}

/// Formats a result for people and models: integers without a decimal point, other values
/// rounded to 12 significant digits without trailing zeros, very large or small ones in
/// scientific notation.
pub fn format_number(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    let mag = x.abs();
    if x.fract() == 0.0 && mag < 1e15 {
        return format!("{x:.0}");
    }
    if !(1e-6..1e15).contains(&mag) {
        return format!("{x:.11e}")
            .split_once('e')
            .map(|(m, e)| {
                let m = m.trim_end_matches('0').trim_end_matches('.');
                format!("{m}e{e}")
            })
            .unwrap_or_else(|| x.to_string());
    }
    // Digits after the point so that 12 significant digits are kept.
    // Digits before the point (0 or negative for values below 1: leading zeros).
    let int_digits = mag.log10().floor() as i32 + 1;
    let decimals = (12 - int_digits).clamp(0, 20) as usize;
    let s = format!("{x:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

/// Finds the longest arithmetic expression written in `text` that evaluates, e.g.
/// `"What is 17 * 23 + 4?"` → `"17 * 23 + 4"`.
///
/// It must contain an operator or a function call: a lone number is not an expression, and
/// neither is a hyphenated span without spaces (`2024-05-01`, `3-4 people`), which is far
/// more often a date or a range than a subtraction.
pub fn find_expression(text: &str) -> Option<String> {
    let chars: Vec<char> = text.chars().collect();
    let allowed =
        |c: char| c.is_ascii_digit() || " \t.+-*/^%(),×÷−".contains(c) || c.is_ascii_alphabetic();
    let mut best: Option<String> = None;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if !(c.is_ascii_digit() || c == '(' || c == '-' || c.is_ascii_alphabetic()) {
            i += 1;
            continue;
        }
        // Extend over allowed characters; letters only as known names.
        let mut j = i;
        let mut last_good = None;
        while j < chars.len() && j - i < MAX_EXPRESSION_CHARS && allowed(chars[j]) {
            if chars[j].is_ascii_alphabetic() {
                let mut k = j;
                while k < chars.len() && chars[k].is_ascii_alphanumeric() {
                    k += 1;
                }
                let word: String = chars[j..k].iter().collect::<String>().to_ascii_lowercase();
                let known = FUNCTIONS.contains(&word.as_str()) || word == "pi";
                let glued = j > 0 && chars[j - 1].is_ascii_alphanumeric();
                if !known || glued {
                    break;
                }
                j = k;
            } else {
                j += 1;
            }
            last_good = Some(j);
        }
        if let Some(end) = last_good {
            let candidate: String = chars[i..end].iter().collect();
            let trimmed = candidate
                .trim()
                .trim_end_matches(|c: char| " .,+-*/^%×÷−(".contains(c))
                .trim();
            if is_expression(trimmed)
                && evaluate(trimmed).is_ok()
                && best.as_ref().is_none_or(|b| trimmed.len() > b.len())
            {
                best = Some(trimmed.to_owned());
            }
        }
        // Skip past the current word or number.
        let mut k = i + 1;
        while k < chars.len()
            && chars[k].is_ascii_alphanumeric()
            && chars[i].is_ascii_alphanumeric()
        {
            k += 1;
        }
        i = k;
    }
    best
}

fn is_expression(s: &str) -> bool {
    if !s.chars().any(|c| c.is_ascii_digit()) {
        return false;
    }
    let has_call = FUNCTIONS
        .iter()
        .any(|f| s.to_ascii_lowercase().contains(&format!("{f}(")));
    let has_op = s.chars().any(|c| "+*/^%×÷".contains(c));
    let spaced_minus = s.contains(" - ") || s.contains(" − ");
    has_call || has_op || spaced_minus
}

/// The `calculator` tool.
#[derive(Debug, Default, Clone, Copy)]
pub struct Calculator;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CalcArgs {
    expression: String,
}

impl Tool for Calculator {
    fn name(&self) -> &str {
        "calculator"
    }

    fn description(&self) -> &str {
        "Evaluates arithmetic like (17 * 23 + 4) / 2, sqrt(2), 2^10."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": { "expression": { "type": "string", "minLength": 1, "maxLength": 120 } },
            "required": ["expression"],
            "additionalProperties": false
        })
    }

    fn call(&self, args: Value) -> BoxFuture<'_, Result<String, ToolError>> {
        Box::pin(async move {
            let args: CalcArgs =
                serde_json::from_value(args).map_err(|e| ToolError::BadArgs(e.to_string()))?;
            let v = evaluate(&args.expression)?;
            // A lone number evaluates to itself: as an observation it only adds noise.
            if lex(&args.expression)?.len() == 1 {
                return Err(ToolError::BadArgs(
                    "nothing to calculate: write an expression with an operator, like 17 * 23"
                        .into(),
                ));
            }
            Ok(format!("{} = {}", args.expression.trim(), format_number(v)))
        })
    }
}

// ---------------------------------------------------------------------------------------------
// search_docs
// ---------------------------------------------------------------------------------------------

/// The `search_docs` tool over a [`DocIndex`], shared so it can be reloaded while in use.
#[derive(Debug, Clone)]
pub struct SearchDocs {
    index: Arc<RwLock<DocIndex>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    query: String,
    #[serde(default)]
    k: Option<usize>,
}

/// Passages returned by `search_docs` when the model does not say.
pub const DEFAULT_PASSAGES: usize = 3;

impl SearchDocs {
    /// Indexes `folder`.
    pub fn open(folder: &std::path::Path) -> Result<Self, DocsError> {
        Ok(Self::new(DocIndex::open(folder)?))
    }

    /// Wraps an existing index.
    pub fn new(index: DocIndex) -> Self {
        Self {
            index: Arc::new(RwLock::new(index)),
        }
    }

    /// The best `k` passages for `query` (see [`DocIndex::search`]).
    pub fn search(&self, query: &str, k: usize) -> Vec<Passage> {
        // A panic while holding the lock cannot leave the index half-written (reload swaps
        // whole fields), so a poisoned lock is still safe to read.
        let index = self.index.read().unwrap_or_else(|p| p.into_inner());
        index.search(query, k)
    }

    /// The best `k` units of the folder for a sub-question (see
    /// [`super::grounded::locate`]).
    pub fn locate(
        &self,
        sub: &super::grounded::SubQuestion,
        k: usize,
    ) -> Vec<super::grounded::Located> {
        super::grounded::locate(sub, &self.units(), k)
    }

    /// The folder's citable units (shared, not copied).
    pub fn units(&self) -> Arc<Vec<super::grounded::Unit>> {
        let index = self.index.read().unwrap_or_else(|p| p.into_inner());
        index.units()
    }

    /// Re-reads the folder (on a blocking thread). Returns the number of passages.
    pub async fn reload(&self) -> Result<usize, DocsError> {
        let (root, limits) = {
            let index = self.index.read().unwrap_or_else(|p| p.into_inner());
            (index.root().to_path_buf(), index.limits())
        };
        let fresh = tokio::task::spawn_blocking(move || DocIndex::with_limits(&root, limits))
            .await
            .map_err(|e| DocsError::Read {
                path: PathBuf::new(),
                source: std::io::Error::other(e.to_string()),
            })??;
        let n = fresh.len();
        *self.index.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        Ok(n)
    }
}

/// Formats passages as the tool's observation: one block per passage, file first.
pub fn format_passages(passages: &[Passage]) -> String {
    let mut out = String::new();
    for p in passages {
        let _ = writeln!(out, "[{}] {}", p.file.display(), p.text);
    }
    out.trim_end().to_owned()
}

impl Tool for SearchDocs {
    fn name(&self) -> &str {
        "search_docs"
    }

    fn description(&self) -> &str {
        "Searches this node's documents for facts; give a few keywords."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "query": { "type": "string", "minLength": 1, "maxLength": 120 }
            },
            "required": ["query"],
            "additionalProperties": false
        })
    }

    fn call(&self, args: Value) -> BoxFuture<'_, Result<String, ToolError>> {
        Box::pin(async move {
            let args: SearchArgs =
                serde_json::from_value(args).map_err(|e| ToolError::BadArgs(e.to_string()))?;
            if args.query.trim().is_empty() {
                return Err(ToolError::BadArgs("`query` is empty".into()));
            }
            let k = args.k.unwrap_or(DEFAULT_PASSAGES).clamp(1, 10);
            let hits = self.search(&args.query, k);
            if hits.is_empty() {
                Ok(format!(
                    "No passage in the documents matches `{}`.",
                    args.query
                ))
            } else {
                Ok(format_passages(&hits))
            }
        })
    }
}

// ---------------------------------------------------------------------------------------------
// External agents
// ---------------------------------------------------------------------------------------------

/// The task as sent to an external agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExternalTask {
    /// The task's id.
    pub task_id: String,
    /// What to do.
    pub description: String,
    /// Background: the goal of the group, earlier results.
    #[serde(default)]
    pub context: String,
}

/// The JSON form of an external agent's answer.
#[derive(Debug, Deserialize)]
struct ExternalReply {
    #[serde(default)]
    result: Option<String>,
    #[serde(default = "default_true")]
    ok: bool,
    #[serde(default)]
    error: Option<String>,
    /// `submitted` or `working`: a long task, still running (with `task_id`). Any other
    /// value (`completed`, `failed`, ...) is an answer like one without it; `failed`,
    /// `canceled` and `rejected` count as `ok: false`.
    #[serde(default)]
    status: Option<String>,
    /// The agent's id of a long task, polled as `GET <url>/<task_id>`.
    #[serde(default)]
    task_id: Option<String>,
    /// What a long task is doing now (logged).
    #[serde(default)]
    progress: Option<String>,
}

/// An external agent's answer, read.
#[derive(Debug, Clone, PartialEq)]
enum Reply {
    /// The result.
    Done(String),
    /// A long task still running at the agent.
    Pending {
        /// Its id at the agent.
        task_id: String,
        /// Where it stands and what it is doing.
        progress: Progress,
    },
}

/// Where a long task at an external agent stands, as the agent reports it while the node
/// waits for the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// `submitted` or `working`.
    pub state: &'static str,
    /// What it is doing, if it says (one line, at most [`PROGRESS_CHARS`] characters).
    pub text: Option<String>,
}

/// Longest progress text kept from an agent.
pub const PROGRESS_CHARS: usize = 200;

impl Progress {
    fn new(state: &str, text: Option<String>) -> Self {
        let text = text
            .map(|t| {
                let line = t.split_whitespace().collect::<Vec<_>>().join(" ");
                line.chars().take(PROGRESS_CHARS).collect::<String>()
            })
            .filter(|t| !t.is_empty());
        let state = if state == "submitted" {
            "submitted"
        } else {
            "working"
        };
        Self { state, text }
    }
}

/// First wait before polling a long task, doubled after each poll up to [`POLL_MAX`].
const POLL_FIRST: Duration = Duration::from_millis(500);
/// Longest wait between two polls of a long task.
const POLL_MAX: Duration = Duration::from_secs(5);
/// How long a `DELETE` of a cancelled long task may take.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether `id` can go into a URL path as it is: 1 to 128 of `A-Z a-z 0-9 . _ ~ -`, not
/// `.` or `..`.
fn valid_task_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'~' | b'-'))
}

fn default_true() -> bool {
    true
}

/// How an external agent is reached.
#[derive(Debug, Clone)]
enum Transport {
    Command(Vec<String>),
    Http {
        url: String,
        client: reqwest::Client,
    },
    A2a {
        agent: Arc<A2aAgent>,
        client: reqwest::Client,
    },
}

/// An external agent integrated as a tool (see the module docs for the protocol).
#[derive(Debug, Clone)]
pub struct ExternalAgent {
    name: String,
    description: String,
    transport: Transport,
    timeout: Duration,
    max_output: usize,
    /// The `DELETE`s of cancelled long tasks, owned: aborted when the last clone goes.
    cancels: Arc<std::sync::Mutex<tokio::task::JoinSet<()>>>,
}

/// A long task at an agent: unless disarmed (its answer came), dropping it sends the
/// agent's cancel request (`DELETE <url>/<task_id>`, or A2A's `CancelTask`), bounded by
/// [`CANCEL_TIMEOUT`], on the agent's [`JoinSet`].
///
/// [`JoinSet`]: tokio::task::JoinSet
struct CancelOnDrop<'a> {
    agent: &'a ExternalAgent,
    client: reqwest::Client,
    request: Option<reqwest::Request>,
}

impl CancelOnDrop<'_> {
    fn disarm(&mut self) {
        self.request = None;
    }
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        let Some(mut request) = self.request.take() else {
            return;
        };
        let url = request.url().to_string();
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            warn!(tool = %self.agent.name, %url, "no runtime to cancel the long task");
            return;
        };
        *request.timeout_mut() = Some(CANCEL_TIMEOUT);
        let (client, name) = (self.client.clone(), self.agent.name.clone());
        let mut set = match self.agent.cancels.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        while set.try_join_next().is_some() {}
        set.spawn_on(
            async move {
                match client.execute(request).await {
                    Ok(r) => info!(tool = %name, %url, status = %r.status(), "long task cancelled"),
                    Err(e) => warn!(tool = %name, %url, error = %e, "cannot cancel the long task"),
                }
            },
            &handle,
        );
    }
}

/// Bytes of a failing command's stderr kept for the error message.
const STDERR_TAIL: usize = 2_000;

impl ExternalAgent {
    /// Builds the tool from its config entry (validated by [`crate::config::NodeConfig`]).
    pub fn from_config(config: &ExternalAgentConfig) -> Result<Self, ToolError> {
        let http_client = || {
            let failed = |reason: String| ToolError::External {
                name: config.name.clone(),
                reason,
            };
            // Backstop only: the call's own timeout (below) fires first.
            let mut builder =
                reqwest::Client::builder().timeout(Duration::from_secs(config.timeout_secs + 5));
            if let Some(path) = &config.ca_file {
                let pem = std::fs::read(path)
                    .map_err(|e| failed(format!("cannot read ca_file {}: {e}", path.display())))?;
                let certs = reqwest::Certificate::from_pem_bundle(&pem)
                    .ok()
                    .filter(|c| !c.is_empty())
                    .ok_or_else(|| {
                        failed(format!(
                            "ca_file {} holds no PEM certificate",
                            path.display()
                        ))
                    })?;
                for cert in certs {
                    builder = builder.add_root_certificate(cert);
                }
            }
            builder
                .build()
                .map_err(|e| failed(format!("cannot build an HTTP client: {e}")))
        };
        let transport = match (&config.command, &config.url, &config.a2a) {
            (Some(cmd), None, None) if !cmd.is_empty() => Transport::Command(cmd.clone()),
            (None, Some(url), None) => Transport::Http {
                url: url.clone(),
                client: http_client()?,
            },
            (None, None, Some(url)) => {
                let client = http_client()?;
                Transport::A2a {
                    agent: Arc::new(A2aAgent::new(url, client.clone(), config.max_output_bytes)),
                    client,
                }
            }
            _ => {
                return Err(ToolError::External {
                    name: config.name.clone(),
                    reason: "needs exactly one of `command`, `url` and `a2a`".into(),
                })
            }
        };
        let description = if config.description.trim().is_empty() {
            format!(
                "External agent `{}`: give it a task description.",
                config.name
            )
        } else {
            config.description.clone()
        };
        Ok(Self {
            name: config.name.clone(),
            description,
            transport,
            timeout: Duration::from_secs(config.timeout_secs),
            max_output: config.max_output_bytes,
            cancels: Arc::default(),
        })
    }

    /// Sends `task` and waits for the result.
    pub async fn run(&self, task: &ExternalTask) -> Result<String, ToolError> {
        self.run_reporting(task, &|_| {}).await
    }

    /// [`run`](Self::run), calling `report` each time a long task's state or progress
    /// text changes while the node waits for it.
    pub async fn run_reporting(
        &self,
        task: &ExternalTask,
        report: &(dyn Fn(Progress) + Send + Sync),
    ) -> Result<String, ToolError> {
        let body = serde_json::to_vec(task).map_err(|e| self.fail(e.to_string()))?;
        match &self.transport {
            Transport::Command(cmd) => {
                let raw = self.run_command(cmd, &body).await?;
                match self.parse_reply(&raw)? {
                    Reply::Done(text) => Ok(text),
                    Reply::Pending { .. } => Err(self
                        .fail("it answered with a pending task; only HTTP agents can be polled")),
                }
            }
            Transport::Http { url, client } => self.run_http(client, url, body, report).await,
            Transport::A2a { agent, client } => self.run_a2a(agent, client, task, report).await,
        }
    }

    /// Sends the task as an A2A message; a task still running is polled with `GetTask`
    /// until it has its answer, all within the call's timeout.
    async fn run_a2a(
        &self,
        agent: &A2aAgent,
        client: &reqwest::Client,
        task: &ExternalTask,
        report: &(dyn Fn(Progress) + Send + Sync),
    ) -> Result<String, ToolError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let a2a = |e: A2aError| match e {
            A2aError::Timeout => self.timed_out(),
            A2aError::Failed(why) => self.fail(why),
        };
        let id = match agent
            .send_message(&task.description, &task.context, deadline)
            .await
            .map_err(a2a)?
        {
            Outcome::Answer(text) => return Ok(text),
            Outcome::Running(id) => id,
        };
        debug!(tool = %self.name, task = %id, "A2A task running");
        report(Progress::new("working", None));
        let mut guard = CancelOnDrop {
            agent: self,
            client: client.clone(),
            request: agent.cancel_request(&id),
        };
        let mut wait = POLL_FIRST;
        loop {
            self.pause(wait, deadline).await?;
            match agent.get_task(&id, deadline).await {
                Ok(Outcome::Answer(text)) => {
                    guard.disarm();
                    return Ok(text);
                }
                Ok(Outcome::Running(_)) => {}
                Err(A2aError::Failed(why)) => {
                    // The task ended without an answer (or the agent forgot it).
                    guard.disarm();
                    return Err(self.fail(why));
                }
                Err(A2aError::Timeout) => return Err(self.timed_out()),
            }
            wait = (wait * 2).min(POLL_MAX);
        }
    }

    /// The name it is configured under.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn fail(&self, reason: impl Into<String>) -> ToolError {
        ToolError::External {
            name: self.name.clone(),
            reason: reason.into(),
        }
    }

    fn timed_out(&self) -> ToolError {
        ToolError::Timeout {
            name: self.name.clone(),
            secs: self.timeout.as_secs(),
        }
    }

    async fn run_command(&self, cmd: &[String], input: &[u8]) -> Result<Vec<u8>, ToolError> {
        let (program, args) = cmd
            .split_first()
            .ok_or_else(|| self.fail("empty command"))?;
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| self.fail(format!("cannot start `{program}`: {e}")))?;
        let (Some(mut stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(self.fail("the command's pipes are missing"));
        };
        let max = self.max_output;
        let exchange = async {
            let write = async {
                // A command that does not read its input closes the pipe: not an error.
                let _ = stdin.write_all(input).await;
                drop(stdin);
            };
            let (_, out, err) = tokio::join!(
                write,
                read_limited(stdout, max),
                read_limited(stderr, STDERR_TAIL)
            );
            let status = child.wait().await;
            (out, err, status)
        };
        let (out, err, status) = match tokio::time::timeout(self.timeout, exchange).await {
            Ok(r) => r,
            Err(_) => {
                // Dropping the exchange future dropped `child` with kill_on_drop: the process
                // is killed and reaped by tokio.
                warn!(tool = %self.name, "external command timed out; killed");
                return Err(self.timed_out());
            }
        };
        let status = status.map_err(|e| self.fail(format!("cannot wait for the command: {e}")))?;
        let err = err.map(|(b, _)| b).unwrap_or_default();
        let (out, truncated) =
            out.map_err(|e| self.fail(format!("cannot read its output: {e}")))?;
        if truncated {
            return Err(self.fail(format!("its output is larger than {max} bytes")));
        }
        if !status.success() {
            let stderr = String::from_utf8_lossy(&err);
            return Err(self.fail(format!("exited with {status}: {}", stderr.trim())));
        }
        Ok(out)
    }

    /// POSTs the task; a long task is then polled until it has its answer, all within
    /// the call's timeout.
    async fn run_http(
        &self,
        client: &reqwest::Client,
        url: &str,
        body: Vec<u8>,
        report: &(dyn Fn(Progress) + Send + Sync),
    ) -> Result<String, ToolError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let post = client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        let raw = self.exchange(post, url, deadline).await?;
        let (task_id, progress) = match self.parse_reply(&raw)? {
            Reply::Done(text) => return Ok(text),
            Reply::Pending { task_id, progress } => (task_id, progress),
        };
        let poll_url = format!("{}/{task_id}", url.trim_end_matches('/'));
        debug!(tool = %self.name, %poll_url, ?progress, "long task submitted");
        report(progress.clone());
        let mut last = progress;
        let mut guard = CancelOnDrop {
            agent: self,
            client: client.clone(),
            request: client.delete(&poll_url).build().ok(),
        };
        let mut wait = POLL_FIRST;
        loop {
            // Past the deadline, the guard cancels the task at the agent.
            self.pause(wait, deadline).await?;
            let raw = self
                .exchange(client.get(&poll_url), &poll_url, deadline)
                .await?;
            let reply = self.parse_reply(&raw);
            if !matches!(reply, Ok(Reply::Pending { .. })) {
                // An answer, or a failure the agent reported: nothing left to cancel.
                guard.disarm();
            }
            match reply? {
                Reply::Done(text) => return Ok(text),
                Reply::Pending { progress, .. } => {
                    debug!(tool = %self.name, ?progress, "long task still running");
                    if progress != last {
                        report(progress.clone());
                        last = progress;
                    }
                }
            }
            wait = (wait * 2).min(POLL_MAX);
        }
    }

    /// Waits `wait` before the next poll of a long task; a timeout when `deadline` comes
    /// first.
    async fn pause(&self, wait: Duration, deadline: tokio::time::Instant) -> Result<(), ToolError> {
        tokio::time::timeout_at(deadline, tokio::time::sleep(wait))
            .await
            .map_err(|_| self.timed_out())
    }

    /// One HTTP exchange, by `deadline`: the body of a 2xx answer (at most `max_output`
    /// bytes).
    async fn exchange(
        &self,
        request: reqwest::RequestBuilder,
        url: &str,
        deadline: tokio::time::Instant,
    ) -> Result<Vec<u8>, ToolError> {
        let exchange =
            async {
                let mut resp = request.send().await.map_err(|e| {
                    self.fail(format!("request to {url} failed: {}", with_causes(&e)))
                })?;
                let status = resp.status();
                let mut buf = Vec::new();
                while let Some(chunk) = resp.chunk().await.map_err(|e| {
                    self.fail(format!("reading the answer failed: {}", with_causes(&e)))
                })? {
                    buf.extend_from_slice(&chunk);
                    if buf.len() > self.max_output {
                        return Err(self.fail(format!(
                            "its answer is larger than {} bytes",
                            self.max_output
                        )));
                    }
                }
                if !status.is_success() {
                    let text = String::from_utf8_lossy(&buf);
                    return Err(self.fail(format!("answered {status}: {}", text.trim())));
                }
                Ok(buf)
            };
        match tokio::time::timeout_at(deadline, exchange).await {
            Ok(r) => r,
            Err(_) => Err(self.timed_out()),
        }
    }

    fn parse_reply(&self, raw: &[u8]) -> Result<Reply, ToolError> {
        let text = std::str::from_utf8(raw).map_err(|_| self.fail("its answer is not UTF-8"))?;
        let text = text.trim();
        if text.is_empty() {
            return Err(self.fail("its answer is empty"));
        }
        if text.starts_with('{') {
            if let Ok(v) = serde_json::from_str::<Value>(text) {
                let reply: ExternalReply = serde_json::from_value(v).map_err(|e| {
                    self.fail(format!("its JSON answer does not fit the protocol: {e}"))
                })?;
                let status = reply.status.as_deref().unwrap_or("");
                if matches!(status, "submitted" | "working") {
                    return match reply.task_id {
                        Some(id) if valid_task_id(&id) => Ok(Reply::Pending {
                            task_id: id,
                            progress: Progress::new(status, reply.progress),
                        }),
                        _ => Err(self.fail(format!(
                            "its answer says `{status}` without a `task_id` of 1 to 128 \
                             letters, digits, `.`, `_`, `~` or `-`"
                        ))),
                    };
                }
                if !reply.ok || matches!(status, "failed" | "canceled" | "rejected") {
                    let why = reply
                        .error
                        .or(reply.result)
                        .unwrap_or_else(|| "no reason given".into());
                    return Err(self.fail(format!("it reported failure: {why}")));
                }
                return match reply.result {
                    Some(r) if !r.trim().is_empty() => Ok(Reply::Done(r.trim().to_owned())),
                    _ => Err(self.fail("its JSON answer has no `result`")),
                };
            }
        }
        Ok(Reply::Done(text.to_owned()))
    }
}

/// Reads at most `max` bytes; the flag says whether more were available. The rest of the
/// stream is not read (a command blocked on a full pipe is ended by the timeout).
async fn read_limited<R: AsyncRead + Unpin>(
    reader: R,
    max: usize,
) -> std::io::Result<(Vec<u8>, bool)> {
    let mut buf = Vec::new();
    let limit = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
    reader.take(limit).read_to_end(&mut buf).await?;
    let truncated = buf.len() > max;
    buf.truncate(max);
    Ok((buf, truncated))
}

#[derive(Deserialize)]
struct ExternalArgs {
    description: String,
    #[serde(default)]
    task_id: Option<String>,
    #[serde(default)]
    context: Option<String>,
}

impl Tool for ExternalAgent {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> Value {
        // `task_id` and `context` are filled in by the executor, not the model.
        json!({
            "type": "object",
            "properties": {
                "description": { "type": "string", "minLength": 1, "maxLength": 300 }
            },
            "required": ["description"],
            "additionalProperties": false
        })
    }

    fn call(&self, args: Value) -> BoxFuture<'_, Result<String, ToolError>> {
        Box::pin(async move {
            let args: ExternalArgs =
                serde_json::from_value(args).map_err(|e| ToolError::BadArgs(e.to_string()))?;
            if args.description.trim().is_empty() {
                return Err(ToolError::BadArgs("`description` is empty".into()));
            }
            let task = ExternalTask {
                task_id: args.task_id.unwrap_or_default(),
                description: args.description,
                context: args.context.unwrap_or_default(),
            };
            debug!(tool = %self.name, task_id = %task.task_id, "calling external agent");
            self.run(&task).await
        })
    }
}

// ---------------------------------------------------------------------------------------------
// ToolBox
// ---------------------------------------------------------------------------------------------

/// The tools a node offers, in a fixed order (built-ins first, then external agents).
#[derive(Clone, Default)]
pub struct ToolBox {
    tools: Vec<Arc<dyn Tool>>,
    docs: Option<SearchDocs>,
    calculator: bool,
}

impl std::fmt::Debug for ToolBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolBox")
            .field("tools", &self.names())
            .finish()
    }
}

impl ToolBox {
    /// No tools.
    pub fn new() -> Self {
        Self::default()
    }

    /// The tools `agent` asks for: `calculator` if listed; `search_docs` if listed and a
    /// docs folder is configured (indexed now); every `[[agent.external]]` entry.
    pub fn from_config(agent: &AgentSection) -> Result<Self, ToolError> {
        let mut tb = Self::new();
        for name in &agent.tools {
            match name.as_str() {
                "calculator" => tb = tb.with_calculator(),
                "search_docs" => match &agent.docs {
                    Some(folder) => tb = tb.with_docs(SearchDocs::open(folder)?),
                    None => debug!("search_docs is listed but no docs folder is configured"),
                },
                other => return Err(ToolError::Unknown(other.to_owned())),
            }
        }
        for ext in &agent.external {
            tb = tb.with_tool(Arc::new(ExternalAgent::from_config(ext)?));
        }
        info!(tools = ?tb.names(), "tools offered");
        Ok(tb)
    }

    /// Adds the calculator.
    pub fn with_calculator(mut self) -> Self {
        if !self.calculator {
            self.calculator = true;
            self.tools.push(Arc::new(Calculator));
        }
        self
    }

    /// Adds `search_docs` over `docs`.
    pub fn with_docs(mut self, docs: SearchDocs) -> Self {
        self.tools.retain(|t| t.name() != "search_docs");
        self.tools.push(Arc::new(docs.clone()));
        self.docs = Some(docs);
        self
    }

    /// Adds any tool (replacing one of the same name).
    pub fn with_tool(mut self, tool: Arc<dyn Tool>) -> Self {
        self.tools.retain(|t| t.name() != tool.name());
        self.tools.push(tool);
        self
    }

    /// The tool called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.iter().find(|t| t.name() == name)
    }

    /// All tools, in order.
    pub fn tools(&self) -> &[Arc<dyn Tool>] {
        &self.tools
    }

    /// Tool names, in order.
    pub fn names(&self) -> Vec<String> {
        self.tools.iter().map(|t| t.name().to_owned()).collect()
    }

    /// True when no tool is offered.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// Whether the calculator is offered.
    pub fn has_calculator(&self) -> bool {
        self.calculator
    }

    /// The document search, when offered.
    pub fn docs(&self) -> Option<&SearchDocs> {
        self.docs.as_ref()
    }

    /// Calls the tool `name`.
    pub async fn call(&self, name: &str, args: Value) -> Result<String, ToolError> {
        let tool = self
            .get(name)
            .ok_or_else(|| ToolError::Unknown(name.to_owned()))?;
        tool.call(args).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(s: &str) -> f64 {
        evaluate(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn precedence_and_associativity() {
        assert_eq!(eval("2 + 3 * 4"), 14.0);
        assert_eq!(eval("(2 + 3) * 4"), 20.0);
        assert_eq!(eval("10 - 4 - 3"), 3.0);
        assert_eq!(eval("100 / 10 / 5"), 2.0);
        assert_eq!(eval("2 ^ 3 ^ 2"), 512.0);
        assert_eq!(eval("-2 ^ 2"), -4.0);
        assert_eq!(eval("(-2) ^ 2"), 4.0);
        assert_eq!(eval("2 ^ -1"), 0.5);
        assert_eq!(eval("--3"), 3.0);
        assert_eq!(eval("7 % 3 * 2"), 2.0);
        assert_eq!(eval("1.5e3 + .5"), 1500.5);
        // No implicit multiplication.
        assert!(matches!(
            evaluate("2e"),
            Err(CalcError::UnexpectedToken { pos: 1, .. })
        ));
        assert_eq!(eval("17 × 23 ÷ 1"), 391.0);
        assert!((eval("sqrt(2) ^ 2") - 2.0).abs() < 1e-12);
        assert_eq!(
            eval("max(1, -5, 3) + min(4, 2) + abs(-3) + round(2.5)"),
            11.0
        );
        assert!((eval("ln(e) + log10(1000) + PI") - (4.0 + std::f64::consts::PI)).abs() < 1e-12);
    }

    #[test]
    fn errors_are_clear() {
        assert_eq!(evaluate("1 / 0"), Err(CalcError::DivisionByZero));
        assert_eq!(evaluate("5 % (2 - 2)"), Err(CalcError::DivisionByZero));
        assert_eq!(evaluate("0 ^ -1"), Err(CalcError::DivisionByZero));
        assert_eq!(evaluate("10 ^ 400"), Err(CalcError::Overflow));
        assert_eq!(evaluate("1e308 * 10"), Err(CalcError::Overflow));
        assert_eq!(
            evaluate("foo(2)"),
            Err(CalcError::UnknownName("foo".into()))
        );
        assert_eq!(evaluate("x + 1"), Err(CalcError::UnknownName("x".into())));
        assert_eq!(evaluate(""), Err(CalcError::Empty));
        assert_eq!(evaluate("2 +"), Err(CalcError::UnexpectedEnd));
        assert_eq!(evaluate("(2 + 3"), Err(CalcError::UnexpectedEnd));
        assert!(matches!(
            evaluate("2 3"),
            Err(CalcError::UnexpectedToken { pos: 2, .. })
        ));
        assert!(matches!(
            evaluate("2 $ 3"),
            Err(CalcError::UnexpectedChar { ch: '$', pos: 2 })
        ));
        assert!(matches!(
            evaluate("sqrt(1, 2)"),
            Err(CalcError::Arity { got: 2, .. })
        ));
        assert!(matches!(evaluate("sqrt(-1)"), Err(CalcError::Domain(_))));
        assert!(matches!(evaluate("ln(0)"), Err(CalcError::Domain(_))));
        assert!(matches!(evaluate("(-8) ^ 0.5"), Err(CalcError::Domain(_))));
        assert_eq!(evaluate(&"(".repeat(100)), Err(CalcError::TooDeep));
        assert_eq!(evaluate(&"-".repeat(100)), Err(CalcError::TooDeep));
        assert_eq!(evaluate(&"1+".repeat(600)), Err(CalcError::TooLong));
        let msg = CalcError::UnknownName("foo".into()).to_string();
        assert!(msg.contains("foo") && msg.contains("sqrt"), "{msg}");
    }

    #[test]
    fn numbers_are_formatted_for_reading() {
        assert_eq!(format_number(eval("17 * 23 + 4")), "395");
        assert_eq!(format_number(eval("0.1 + 0.2")), "0.3");
        assert_eq!(format_number(eval("1 / 3")), "0.333333333333");
        assert_eq!(format_number(eval("-7 / 2")), "-3.5");
        assert_eq!(format_number(eval("2 ^ 60")), "1.15292150461e18");
        assert_eq!(format_number(eval("-0")), "0");
        assert_eq!(format_number(1e-9), "1e-9");
    }

    #[test]
    fn expressions_are_found_in_text() {
        let f = |s: &str| find_expression(s);
        assert_eq!(f("What is 17 * 23 + 4?").as_deref(), Some("17 * 23 + 4"));
        assert_eq!(f("Compute (2 + 3) * 4.").as_deref(), Some("(2 + 3) * 4"));
        assert_eq!(f("What is sqrt(16) plus 1").as_deref(), Some("sqrt(16)"));
        assert_eq!(f("Area is pi * 2 ^ 2 m2").as_deref(), Some("pi * 2 ^ 2"));
        assert_eq!(f("Subtract: 10 - 4"), Some("10 - 4".into()));
        assert_eq!(f("Meeting on 2024-05-01 with 3-4 people"), None);
        assert_eq!(f("The year 2024 was fine."), None);
        assert_eq!(f("What coolant does the Zorblat reactor use?"), None);
        assert_eq!(
            f("Divide 1 / 0 now"),
            None,
            "expressions that fail are not grounding"
        );
    }

    #[tokio::test]
    async fn calculator_tool_checks_arguments() {
        let c = Calculator;
        assert_eq!(
            c.call(json!({"expression": "2 + 2"})).await.unwrap(),
            "2 + 2 = 4"
        );
        assert!(matches!(
            c.call(json!({"expr": "2"})).await,
            Err(ToolError::BadArgs(_))
        ));
        let e = c.call(json!({"expression": " 271648 "})).await.unwrap_err();
        assert!(e.to_string().contains("nothing to calculate"), "{e}");
        assert_eq!(
            c.call(json!({"expression": "-3"})).await.unwrap(),
            "-3 = -3"
        );
        let e = c.call(json!({"expression": "1/0"})).await.unwrap_err();
        assert_eq!(e.to_string(), "calculator: division by zero");
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_strings_never_panic(s in "\\PC{0,200}") {
            let _ = evaluate(&s);
            let _ = find_expression(&s);
        }

        #[test]
        fn arithmetic_strings_never_panic(s in "[0-9 .+*/^%()e,-]{0,300}|(sqrt|min|max|ln|pi|[(),0-9+*^-]){0,80}") {
            if let Ok(v) = evaluate(&s) {
                proptest::prop_assert!(v.is_finite());
                let _ = format_number(v);
            }
            let _ = find_expression(&s);
        }
    }

    fn external(name: &str, command: Option<Vec<String>>, url: Option<String>) -> ExternalAgent {
        ExternalAgent::from_config(&ExternalAgentConfig {
            name: name.into(),
            description: format!("test agent {name}"),
            skills: Vec::new(),
            command,
            url,
            a2a: None,
            ca_file: None,
            timeout_secs: 2,
            max_output_bytes: 200,
        })
        .unwrap()
    }

    fn sh(script: &str) -> Option<Vec<String>> {
        Some(vec!["sh".into(), "-c".into(), script.into()])
    }

    fn task() -> ExternalTask {
        ExternalTask {
            task_id: "t1".into(),
            description: "Reverse the word stressed".into(),
            context: "spelling game".into(),
        }
    }

    #[tokio::test]
    async fn external_command_protocol() {
        // A real agent in python: reads the task JSON, answers in the JSON shape.
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("agent.py");
        std::fs::write(
            &script,
            "import json, sys\n\
             t = json.load(sys.stdin)\n\
             word = t['description'].split()[-1]\n\
             print(json.dumps({'result': t['task_id'] + ':' + word[::-1] + ' (' + t['context'] + ')', 'ok': True}))\n",
        )
        .unwrap();
        let py = external(
            "reverser",
            Some(vec![
                "python3".into(),
                script.to_string_lossy().into_owned(),
            ]),
            None,
        );
        assert_eq!(
            py.run(&task()).await.unwrap(),
            "t1:desserts (spelling game)"
        );

        // Through the Tool interface, with arguments as the executor grounds them.
        let out = py
            .call(json!({"description": "flip it", "task_id": "t9", "context": "c"}))
            .await
            .unwrap();
        assert_eq!(out, "t9:ti (c)");
        assert!(matches!(
            py.call(json!({"description": ""})).await,
            Err(ToolError::BadArgs(_))
        ));

        // Plain text answers are the result; stdin need not be read.
        let plain = external("plain", sh("echo '  just text  '"), None);
        assert_eq!(plain.run(&task()).await.unwrap(), "just text");
        // `cat` echoes the task JSON: an object without `result` breaks the protocol.
        let cat = external("cat", Some(vec!["cat".into()]), None);
        let e = cat.run(&task()).await.unwrap_err().to_string();
        assert!(e.contains("no `result`"), "{e}");
    }

    #[tokio::test]
    async fn external_command_failures() {
        let cases: [(&str, &str); 6] = [
            (
                "echo '{\"ok\": false, \"error\": \"no idea\"}'",
                "reported failure: no idea",
            ),
            ("echo '{\"result\": 5}'", "does not fit the protocol"),
            ("printf ''", "empty"),
            ("printf '\\377\\376'", "not UTF-8"),
            ("echo oops >&2; exit 3", "oops"),
            (
                "head -c 1000 /dev/zero | tr '\\0' x",
                "larger than 200 bytes",
            ),
        ];
        for (script, needle) in cases {
            let agent = external("bad", sh(script), None);
            let e = agent.run(&task()).await.unwrap_err().to_string();
            assert!(e.contains(needle), "{script}: {e}");
            assert!(e.contains("`bad`"), "{script}: {e}");
        }
        let missing = external("missing", Some(vec!["/nonexistent/agent".into()]), None);
        let e = missing.run(&task()).await.unwrap_err().to_string();
        assert!(e.contains("cannot start"), "{e}");
    }

    #[tokio::test]
    async fn external_command_is_killed_on_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        // `exec` so the shell's pid is the sleeper's.
        let script = format!("echo $$ > {}; exec sleep 30", pid_file.display());
        let agent = external("slow", sh(&script), None);
        let started = std::time::Instant::now();
        let e = agent.run(&task()).await.unwrap_err();
        assert!(matches!(e, ToolError::Timeout { secs: 2, .. }), "{e}");
        assert!(started.elapsed() < Duration::from_secs(10));
        let pid = std::fs::read_to_string(&pid_file).unwrap();
        let proc_dir = PathBuf::from(format!("/proc/{}", pid.trim()));
        // Killed and reaped: the process is gone shortly after.
        let mut gone = false;
        for _ in 0..50 {
            if !proc_dir.exists() {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(gone, "process {} still alive", pid.trim());
    }

    #[tokio::test]
    async fn external_http_protocol() {
        use axum::{http::StatusCode, routing::post, Json, Router};

        async fn run(Json(t): Json<ExternalTask>) -> (StatusCode, String) {
            match t.description.as_str() {
                "fail" => (StatusCode::INTERNAL_SERVER_ERROR, "boom".into()),
                "plain" => (StatusCode::OK, "plain answer".into()),
                "slow" => {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    (StatusCode::OK, "late".into())
                }
                "huge" => (StatusCode::OK, "x".repeat(1000)),
                _ => (
                    StatusCode::OK,
                    json!({"result": format!("{} done ({})", t.task_id, t.description), "ok": true})
                        .to_string(),
                ),
            }
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route("/run", post(run));
        let server = tokio::spawn(async move { axum::serve(listener, app).await });

        let agent = external("web", None, Some(format!("http://{addr}/run")));
        let mut t = task();
        assert_eq!(
            agent.run(&t).await.unwrap(),
            "t1 done (Reverse the word stressed)"
        );
        t.description = "plain".into();
        assert_eq!(agent.run(&t).await.unwrap(), "plain answer");
        t.description = "fail".into();
        let e = agent.run(&t).await.unwrap_err().to_string();
        assert!(e.contains("500") && e.contains("boom"), "{e}");
        t.description = "huge".into();
        let e = agent.run(&t).await.unwrap_err().to_string();
        assert!(e.contains("larger than 200"), "{e}");
        t.description = "slow".into();
        let e = agent.run(&t).await.unwrap_err();
        assert!(matches!(e, ToolError::Timeout { secs: 2, .. }), "{e}");
        server.abort();
        let _ = server.await;
        // Nobody listening any more (a fresh agent: no pooled connection).
        let agent = external("web", None, Some(format!("http://{addr}/run")));
        let e = agent.run(&task()).await.unwrap_err().to_string();
        assert!(e.contains("request to"), "{e}");
    }

    #[tokio::test]
    async fn search_docs_tool_returns_passages() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("a.md"),
            "The Zorblat reactor's coolant is liquid argon at 87 K.",
        )
        .unwrap();
        let docs = SearchDocs::open(dir.path()).unwrap();
        let out = docs
            .call(json!({"query": "Zorblat coolant"}))
            .await
            .unwrap();
        assert_eq!(
            out,
            "[a.md] The Zorblat reactor's coolant is liquid argon at 87 K."
        );
        let none = docs.call(json!({"query": "volcano"})).await.unwrap();
        assert!(none.starts_with("No passage"), "{none}");
        assert!(docs.call(json!({"query": " "})).await.is_err());
        std::fs::write(dir.path().join("b.txt"), "Volcanoes erupt lava.").unwrap();
        assert_eq!(docs.reload().await.unwrap(), 2);
        let out = docs.call(json!({"query": "volcano"})).await.unwrap();
        assert!(out.contains("[b.txt]"), "{out}");
    }

    #[test]
    fn toolbox_from_config() {
        let dir = tempfile::tempdir().unwrap();
        let mut agent = AgentSection::default();
        // No docs folder: search_docs is not offered.
        let tb = ToolBox::from_config(&agent).unwrap();
        assert_eq!(tb.names(), vec!["calculator"]);
        assert!(tb.has_calculator() && tb.docs().is_none());
        agent.docs = Some(dir.path().to_path_buf());
        agent.external.push(ExternalAgentConfig {
            name: "echo".into(),
            description: String::new(),
            skills: Vec::new(),
            command: Some(vec!["cat".into()]),
            url: None,
            a2a: None,
            ca_file: None,
            timeout_secs: 5,
            max_output_bytes: 1000,
        });
        let tb = ToolBox::from_config(&agent).unwrap();
        assert_eq!(tb.names(), vec!["search_docs", "calculator", "echo"]);
        assert!(tb.get("echo").unwrap().description().contains("echo"));
        agent.docs = Some(dir.path().join("missing"));
        assert!(matches!(
            ToolBox::from_config(&agent),
            Err(ToolError::Docs(_))
        ));
    }
}
