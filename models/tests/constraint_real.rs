//! Constrained decoding with the real default model: every output under a decision-like
//! JSON Schema parses and validates, across 200 varied prompts and sampling settings.
//! (`models/examples/constraint_validity.rs` reports the same prompts without the
//! constraint, for comparison.)

use serde_json::{json, Value};
use starling_models::chat::ChatMessage;
use starling_models::constraint::Constraint;
use starling_models::engine::{Engine, EngineConfig, GenerateRequest, Prompt};
use starling_models::requant::{self, Requantize};
use starling_models::testing;

/// The schema and prompts are shared with the comparison example.
#[path = "../examples/support/decision_cases.rs"]
mod decision_cases;

#[tokio::test]
async fn two_hundred_constrained_decisions_are_all_valid() {
    let src = testing::chat_model();
    let path = requant::prepare(&src, Requantize::Q8_0, &std::env::temp_dir()).expect("prepare");
    let engine = Engine::load(&path, &EngineConfig::default()).expect("load");
    let schema = decision_cases::schema();
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    let cases = decision_cases::cases(200);
    assert_eq!(cases.len(), 200);
    let mut failures = Vec::new();
    for (i, (prompt, sampling)) in cases.into_iter().enumerate() {
        let req = GenerateRequest {
            prompt: Prompt::Chat(vec![
                ChatMessage::new("system", decision_cases::SYSTEM),
                ChatMessage::new("user", &prompt),
            ]),
            max_tokens: 200,
            sampling,
            stop: Vec::new(),
            constraint: Some(Constraint::JsonSchema(schema.clone())),
            logprobs: None,
        };
        let (text, _) = engine
            .generate(req)
            .expect("queue")
            .text()
            .await
            .expect("generate");
        match serde_json::from_str::<Value>(&text) {
            Ok(v) if validator.is_valid(&v) => {}
            Ok(v) => failures.push(format!("#{i}: invalid {v}")),
            Err(e) => failures.push(format!("#{i}: does not parse ({e}): {text:?}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of 200 invalid:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn broken_constraints_are_clear_errors() {
    let src = testing::chat_model();
    let engine = Engine::load(&src, &EngineConfig::default()).expect("load");
    let bad = [
        Constraint::JsonSchema(json!({"type": "integer", "minimum": 5, "maximum": 1})),
        Constraint::Regex("(unclosed".into()),
        Constraint::Lark("start: foo".into()),
    ];
    for c in bad {
        let mut req = GenerateRequest::chat(vec![ChatMessage::new("user", "hi")]);
        req.constraint = Some(c.clone());
        let err = engine
            .generate(req)
            .err()
            .unwrap_or_else(|| panic!("{c:?} must be refused"));
        assert!(err.to_string().contains("cannot compile"), "{err}");
    }
}
