//! Cost per generated token of grammar-constrained decoding on a real
//! vocabulary: the lazy path (`is_allowed` + `commit`) against a full
//! `compute_mask` every step.
//!
//! ```text
//! cargo run --release -p starling-models --example constraint_bench -- /path/to/model.gguf
//! ```
//!
//! The GGUF must carry a GPT-2 byte-level vocabulary (`tokenizer.ggml.tokens`).

use std::collections::HashMap;
use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::quantized::gguf_file;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use starling_models::constraint::{Constraint, ConstraintCompiler, TokenVocab};

type BoxResult<T> = Result<T, Box<dyn Error>>;

fn main() -> BoxResult<()> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: constraint_bench MODEL.gguf")?;
    let vocab = load_vocab(&path)?;
    let eos = vocab.eos_ids.clone();
    println!("vocabulary: {} tokens, eos {:?}", vocab.tokens.len(), eos);

    let t = Instant::now();
    let compiler = ConstraintCompiler::new(vocab)?;
    println!("ConstraintCompiler::new: {:?}", t.elapsed());

    let constraints = [
        (
            "decision JSON Schema",
            Constraint::JsonSchema(decision_schema()),
        ),
        (
            "regex",
            Constraint::Regex(r"(yes|no|maybe): [A-Z][a-z]{2,10}( [a-z0-9]{1,8}){0,6}\.".into()),
        ),
        (
            "Lark",
            Constraint::Lark(
                "start: call (\"; \" call){0,3}\ncall: NAME \"(\" (ARG (\", \" ARG){0,4})? \")\"\n\
                 NAME: /[a-z_]{1,10}/\nARG: /-?[0-9]{1,4}/\n"
                    .into(),
            ),
        ),
    ];
    for (name, constraint) in &constraints {
        let t = Instant::now();
        compiler.compile(constraint)?;
        println!("\n== {name} (compile {:?})", t.elapsed());
        // Sequences a model could produce: random walks through the masks.
        let mut sequences = Vec::new();
        for seed in 0..20 {
            let mut state = compiler.compile(constraint)?;
            let mut rng = StdRng::seed_from_u64(seed);
            let mut seq = Vec::new();
            while !state.is_finished() && seq.len() < 300 {
                let mask = state.compute_mask()?;
                let allowed = mask.allowed_tokens();
                let text: Vec<u32> = allowed
                    .iter()
                    .copied()
                    .filter(|t| !eos.contains(t))
                    .collect();
                // Stop at an accepting point now and then, like a model would.
                if text.is_empty() || (state.can_stop() && rng.gen_bool(0.3)) {
                    break;
                }
                // Prefer short tokens (as a real model in JSON does) half the time.
                let tok = if rng.gen_bool(0.5) {
                    *text
                        .iter()
                        .min_by_key(|&&t| (state.decode(&[t]).len(), rng.gen::<u32>()))
                        .ok_or("empty")?
                } else {
                    text[rng.gen_range(0..text.len())]
                };
                state.commit(tok)?;
                seq.push(tok);
            }
            if seed == 0 {
                println!("sample: {}", String::from_utf8_lossy(&state.decode(&seq)));
            }
            sequences.push(seq);
        }

        let mut lazy = Vec::new();
        let mut masked = Vec::new();
        for seq in &sequences {
            let mut state = compiler.compile(constraint)?;
            for &tok in seq {
                let t = Instant::now();
                let ok = state.is_allowed(tok);
                state.commit(tok)?;
                lazy.push(t.elapsed());
                assert!(ok, "replayed token rejected");
            }
            let mut state = compiler.compile(constraint)?;
            for &tok in seq {
                let t = Instant::now();
                let mask = state.compute_mask()?;
                masked.push(t.elapsed());
                assert!(mask.is_allowed(tok));
                state.commit(tok)?;
            }
        }
        report("is_allowed + commit", &mut lazy);
        report("compute_mask       ", &mut masked);
    }
    Ok(())
}

fn report(label: &str, times: &mut [Duration]) {
    times.sort();
    let n = times.len().max(1);
    let mean = times.iter().sum::<Duration>() / n as u32;
    let pct = |p: f64| times[((times.len() as f64 - 1.0) * p) as usize];
    println!(
        "{label}: {n} tokens, mean {:>8.1?}  p50 {:>8.1?}  p99 {:>8.1?}  max {:>8.1?}",
        mean,
        pct(0.5),
        pct(0.99),
        times.last().copied().unwrap_or_default()
    );
}

fn decision_schema() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["speak", "assign_task", "conclude", "pause"]},
            "next_speakers": {
                "type": "array",
                "items": {"type": "string", "pattern": "^[a-z0-9]{4,8}$"},
                "minItems": 1, "maxItems": 3
            },
            "task_ids": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}, "maxItems": 4},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            "message": {"type": "string", "maxLength": 80}
        },
        "required": ["action", "next_speakers", "confidence", "message"],
        "additionalProperties": false
    })
}

/// Reads the vocabulary of a GGUF with GPT-2 byte-level tokens.
fn load_vocab(path: &str) -> BoxResult<TokenVocab> {
    let mut file = std::fs::File::open(path)?;
    let content = gguf_file::Content::read(&mut file)?;
    let meta = &content.metadata;
    let names = meta
        .get("tokenizer.ggml.tokens")
        .ok_or("no tokenizer.ggml.tokens")?
        .to_vec()?;
    let types = match meta.get("tokenizer.ggml.token_type") {
        Some(v) => v
            .to_vec()?
            .iter()
            .map(|t| t.to_i32())
            .collect::<Result<Vec<_>, _>>()?,
        None => Vec::new(),
    };
    let unbyte = byte_level_decoder();
    let mut tokens = Vec::with_capacity(names.len());
    let mut special = Vec::new();
    for (id, name) in names.iter().enumerate() {
        let name = name.to_string()?;
        // Token type 3 = control.
        if types.get(id) == Some(&3) {
            special.push(id as u32);
            tokens.push(name.as_bytes().to_vec());
        } else {
            let bytes: Option<Vec<u8>> = name.chars().map(|c| unbyte.get(&c).copied()).collect();
            tokens.push(bytes.unwrap_or_else(|| name.as_bytes().to_vec()));
        }
    }
    let mut eos_ids = Vec::new();
    if let Some(v) = meta.get("tokenizer.ggml.eos_token_id") {
        eos_ids.push(v.to_u32()?);
    }
    for name in ["<|im_end|>", "<|endoftext|>", "<|eot_id|>"] {
        if let Some(id) = tokens.iter().position(|t| t == name.as_bytes()) {
            if !eos_ids.contains(&(id as u32)) {
                eos_ids.push(id as u32);
            }
        }
    }
    // Greedy longest match: stands in for the real BPE tokenizer, which the
    // constraint only uses to tokenize forced text.
    let lookup: HashMap<Vec<u8>, u32> = tokens
        .iter()
        .enumerate()
        .filter(|(id, t)| !t.is_empty() && !special.contains(&(*id as u32)))
        .map(|(id, t)| (t.clone(), id as u32))
        .collect();
    let max_len = lookup.keys().map(Vec::len).max().unwrap_or(1);
    let tokenize = Arc::new(move |text: &[u8]| {
        let mut out = Vec::new();
        let mut i = 0;
        while i < text.len() {
            let hit = (1..=max_len.min(text.len() - i))
                .rev()
                .find_map(|n| lookup.get(&text[i..i + n]).map(|&id| (id, n)));
            match hit {
                Some((id, n)) => {
                    out.push(id);
                    i += n;
                }
                None => i += 1,
            }
        }
        out
    });
    Ok(TokenVocab {
        tokens,
        special,
        eos_ids,
        tokenize,
    })
}

/// GPT-2's byte-to-unicode table, inverted: printable bytes stand for
/// themselves, the rest were shifted to U+0100 and up in byte order.
fn byte_level_decoder() -> HashMap<char, u8> {
    let mut map = HashMap::new();
    let mut shifted = 0x100u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let c = if printable {
            char::from(b)
        } else {
            let c = char::from_u32(shifted).unwrap_or(char::REPLACEMENT_CHARACTER);
            shifted += 1;
            c
        };
        map.insert(c, b);
    }
    map
}
