//! `starling generate`: one-shot local generation, streamed to stdout.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use starling_models::chat::ChatMessage;
use starling_models::constraint::Constraint;
use starling_models::engine::{Chunk, GenerateRequest, Prompt};
use starling_models::sampling::SamplingOptions;

use crate::cli::ModelArgs;

/// Arguments of `starling generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// The prompt (the user's message). Use `-` to read it from standard input.
    pub prompt: String,
    /// Which model to load.
    #[command(flatten)]
    pub model: ModelArgs,
    /// A system message put before the prompt.
    #[arg(long)]
    pub system: Option<String>,
    /// Send the prompt as raw text, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// Maximum tokens to generate.
    #[arg(short = 'n', long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    /// Top-k (0 = off).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Top-p / nucleus (1 = off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Min-p (0 = off).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Repetition penalty (1 = off).
    #[arg(long, default_value_t = 1.1)]
    pub repeat_penalty: f32,
    /// Tokens the repetition penalty looks back over.
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Random seed, for reproducible sampling.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop before this string (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Constrain the output to this JSON Schema (a file); the output always parses and
    /// validates unless --max-tokens cuts it short.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["regex", "grammar"])]
    pub json_schema: Option<PathBuf>,
    /// Constrain the output to match this regular expression.
    #[arg(long, value_name = "RE", conflicts_with = "grammar")]
    pub regex: Option<String>,
    /// Constrain the output to this Lark grammar (a file).
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<PathBuf>,
    /// Print a JSON object with the text and statistics instead of streaming.
    #[arg(long)]
    pub json: bool,
}

/// Loads the model, streams the answer to stdout, and prints statistics to stderr.
pub fn run(home: &Path, args: GenerateArgs) -> anyhow::Result<()> {
    let prompt = if args.prompt == "-" {
        std::io::read_to_string(std::io::stdin()).context("cannot read the prompt from stdin")?
    } else {
        args.prompt.clone()
    };
    let engine = crate::loading::load_engine(home, &args.model.options())?;
    let prompt = if args.raw {
        Prompt::Text(prompt)
    } else {
        let mut messages = Vec::new();
        if let Some(s) = &args.system {
            messages.push(ChatMessage::new("system", s));
        }
        messages.push(ChatMessage::new("user", &prompt));
        Prompt::Chat(messages)
    };
    let req = GenerateRequest {
        prompt,
        max_tokens: args.max_tokens,
        sampling: SamplingOptions {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            min_p: args.min_p,
            repeat_penalty: args.repeat_penalty,
            repeat_last_n: args.repeat_last_n,
            seed: args.seed,
        },
        stop: args.stop.clone(),
        constraint: constraint(&args)?,
        logprobs: None,
    };
    let mut gen = engine.generate(req)?;
    let mut stdout = std::io::stdout().lock();
    let mut text = String::new();
    while let Some(item) = gen.blocking_next() {
        match item? {
            Chunk::Text(t) => {
                if !args.json {
                    stdout.write_all(t.as_bytes())?;
                    stdout.flush()?;
                }
                text.push_str(&t);
            }
            Chunk::Logprob(_) => {}
            Chunk::Done(done) => {
                if args.json {
                    let out = serde_json::json!({
                        "model": engine.info().id,
                        "text": text,
                        "completion": done,
                    });
                    writeln!(stdout, "{}", serde_json::to_string_pretty(&out)?)?;
                } else {
                    writeln!(stdout)?;
                    let tps = if done.generation_ms > 0.0 {
                        done.completion_tokens as f64 / (done.generation_ms / 1e3)
                    } else {
                        0.0
                    };
                    eprintln!(
                        "[{} prompt tokens ({} cached) in {:.0} ms, {} tokens in {:.0} ms = {:.1} tok/s, finish: {:?}]",
                        done.prompt_tokens,
                        done.cached_prompt_tokens,
                        done.prompt_ms,
                        done.completion_tokens,
                        done.generation_ms,
                        tps,
                        done.finish_reason
                    );
                }
                return Ok(());
            }
        }
    }
    anyhow::bail!("the inference engine stopped before finishing")
}

/// The constraint the flags ask for, read and parsed with errors naming the file.
fn constraint(args: &GenerateArgs) -> anyhow::Result<Option<Constraint>> {
    let read = |p: &Path| {
        std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))
    };
    if let Some(p) = &args.json_schema {
        let schema = serde_json::from_str(&read(p)?)
            .with_context(|| format!("{} is not valid JSON", p.display()))?;
        return Ok(Some(Constraint::JsonSchema(schema)));
    }
    if let Some(re) = &args.regex {
        return Ok(Some(Constraint::Regex(re.clone())));
    }
    if let Some(p) = &args.grammar {
        return Ok(Some(Constraint::Lark(read(p)?)));
    }
    Ok(None)
}
