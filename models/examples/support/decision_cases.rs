//! Decision-like prompts and schema shared by the constrained-decoding test and the
//! validity comparison example.

#![allow(dead_code)]

use serde_json::{json, Value};
use starling_models::sampling::SamplingOptions;

/// System prompt of the decision cases.
pub const SYSTEM: &str = "You are an agent coordinator. Answer with a JSON object with the fields \
action (search_agents, launch_group or work_alone), queries (short search strings), members \
(node ids like node-12) and confidence (0 to 10).";

/// A schema shaped like the decisions agents make: an enum, bounded arrays of ids and
/// strings, a bounded integer, required fields, no extra fields.
pub fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "action": {"enum": ["search_agents", "launch_group", "work_alone"]},
            "queries": {"type": "array", "items": {"type": "string", "maxLength": 24}, "maxItems": 2},
            "members": {"type": "array", "items": {"type": "string", "pattern": "^node-[0-9]{1,3}$"}, "maxItems": 3},
            "confidence": {"type": "integer", "minimum": 0, "maximum": 10}
        },
        "required": ["action", "members", "confidence"],
        "additionalProperties": false
    })
}

/// `n` varied prompts, each with its own sampling settings (greedy, hot, nucleus, top-k,
/// repetition penalty; different seeds).
pub fn cases(n: usize) -> Vec<(String, SamplingOptions)> {
    let tasks = [
        "translate a German contract into English",
        "plan a three-day trip to Lisbon",
        "find the bug in a Rust parser",
        "summarise ten research papers on batteries",
        "write unit tests for a payment service",
        "compare prices of solar panels",
        "organise a community garden schedule",
        "answer a question about tax law in Spain",
        "design a logo for a bakery",
        "compute the orbit of a small satellite",
        "draft an email to a landlord",
        "review a pull request about caching",
        "collect weather data for five cities",
        "prepare a quiz about medieval history",
        "debug a flaky network test",
        "estimate the cost of a kitchen renovation",
        "recommend books for a ten year old",
        "analyse sales numbers for March",
        "set up a home media server",
        "teach me the basics of chess",
    ];
    let asks = [
        "Task: {t}. Decide what to do.",
        "Should you work alone or find collaborators to {t}?",
        "A user asks you to {t}. Which agents would help? Give your decision.",
        "Decide quickly: {t}.",
        "We need to {t}. Known nodes: node-3 (translator), node-17 (coder), node-42 (researcher).",
        "Please {t}, and say how confident you are.",
        "{t} — search for agents first if you lack the skills.",
        "Incoming task from node-8: {t}",
        "Think about this job: {t}. Respond with the decision object only.",
        "Job #{i}: {t}. Include at most two search queries.",
    ];
    (0..n)
        .map(|i| {
            let t = tasks[i % tasks.len()];
            let a = asks[(i / tasks.len()) % asks.len()];
            let prompt = a.replace("{t}", t).replace("{i}", &i.to_string());
            let seed = Some(i as u64);
            let sampling = match i % 5 {
                0 => SamplingOptions::greedy(),
                1 => SamplingOptions {
                    temperature: 0.7,
                    seed,
                    ..SamplingOptions::default()
                },
                2 => SamplingOptions {
                    temperature: 1.5,
                    top_k: 0,
                    top_p: 1.0,
                    min_p: 0.0,
                    repeat_penalty: 1.0,
                    seed,
                    ..SamplingOptions::default()
                },
                3 => SamplingOptions {
                    temperature: 1.0,
                    top_p: 0.8,
                    top_k: 0,
                    seed,
                    ..SamplingOptions::default()
                },
                _ => SamplingOptions {
                    temperature: 0.9,
                    top_k: 5,
                    repeat_penalty: 1.5,
                    seed,
                    ..SamplingOptions::default()
                },
            };
            (prompt, sampling)
        })
        .collect()
}
