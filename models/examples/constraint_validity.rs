//! Runs the decision cases with and without the JSON Schema constraint and prints the share
//! of valid outputs for each, and the time per generated token.
//!
//! `cargo run --release -p starling-models --example constraint_validity -- [N] [MODEL.gguf]`

use std::time::Instant;

use serde_json::Value;
use starling_models::chat::ChatMessage;
use starling_models::constraint::Constraint;
use starling_models::engine::{Engine, EngineConfig, GenerateRequest, Prompt};
use starling_models::requant::{self, Requantize};

#[path = "support/decision_cases.rs"]
mod decision_cases;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(200);
    let src = match args.next() {
        Some(p) => p.into(),
        None => starling_models::testing::chat_model(),
    };
    let path = requant::prepare(&src, Requantize::Q8_0, &std::env::temp_dir())?;
    let engine = Engine::load(&path, &EngineConfig::default())?;
    let schema = decision_cases::schema();
    let validator = jsonschema::validator_for(&schema)?;
    for constrained in [false, true] {
        let (mut valid, mut tokens, mut ms) = (0usize, 0usize, 0f64);
        let started = Instant::now();
        for (prompt, sampling) in decision_cases::cases(n) {
            let req = GenerateRequest {
                prompt: Prompt::Chat(vec![
                    ChatMessage::new("system", decision_cases::SYSTEM),
                    ChatMessage::new("user", &prompt),
                ]),
                max_tokens: 200,
                sampling,
                stop: Vec::new(),
                constraint: constrained.then(|| Constraint::JsonSchema(schema.clone())),
                logprobs: None,
            };
            let (text, done) = engine.generate(req)?.text().await?;
            tokens += done.completion_tokens;
            ms += done.generation_ms;
            if serde_json::from_str::<Value>(text.trim()).is_ok_and(|v| validator.is_valid(&v)) {
                valid += 1;
            }
        }
        println!(
            "{}: {valid}/{n} valid ({:.1}%), {tokens} tokens, {:.2} ms/token, {:.0} s total",
            if constrained {
                "with constraint   "
            } else {
                "without constraint"
            },
            100.0 * valid as f64 / n as f64,
            ms / tokens.max(1) as f64,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
