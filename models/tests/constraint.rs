//! Grammar-constrained decoding driven by a random "model": whatever the
//! logits say, the output must match the constraint.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use starling_models::constraint::{
    Constraint, ConstraintCompiler, ConstraintError, ConstraintState, TokenVocab,
};

/// `<|im_start|>`: a control token that is not an end of turn.
const IM_START: u32 = 256;
/// `<|im_end|>`: end of turn.
const IM_END: u32 = 257;
/// `<|endoftext|>`: a second end-of-turn token.
const EOT: u32 = 258;
/// An unused id with no bytes.
const UNUSED: u32 = 259;

/// Multi-byte tokens on top of the 256 single bytes, in the spirit of BPE
/// merges, including ones that straddle JSON syntax and multi-byte UTF-8.
const MERGES: &[&str] = &[
    "{\"",
    "\":",
    "\": \"",
    "\", \"",
    "\"}",
    "\"]",
    "[\"",
    "\", ",
    ", \"",
    "\": [",
    "], \"",
    "]}",
    "}",
    "true",
    "false",
    "null",
    "action",
    "next",
    "_speakers",
    "next_speakers",
    "task_ids",
    "confidence",
    "message",
    "done",
    "speak",
    "conclude",
    "assign",
    "_task",
    "pause",
    "0.",
    "10",
    "00",
    "99",
    "123",
    " the",
    " a",
    "an",
    "ing",
    "é",
    "日本",
    "\\n",
    "\\\"",
    "\\u00",
    "yes",
    "no",
    "maybe",
    ": ",
    "(",
    ")",
    ", ",
    "; ",
    "call",
    "_id",
    "-1",
    "\"a",
    "a\"",
    "ab",
    "abc",
    "e5",
    "E-",
    "1.5",
];

fn test_vocab() -> TokenVocab {
    let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    tokens.push(b"<|im_start|>".to_vec());
    tokens.push(b"<|im_end|>".to_vec());
    tokens.push(b"<|endoftext|>".to_vec());
    tokens.push(Vec::new());
    tokens.extend(MERGES.iter().map(|m| m.as_bytes().to_vec()));
    let table = tokens.clone();
    let text_ids: Vec<usize> = (0..table.len())
        .filter(|&i| ![IM_START, IM_END, EOT, UNUSED].contains(&(i as u32)))
        .collect();
    // Greedy longest match: not BPE, but a deterministic tokenization that
    // only uses text tokens, which is all the constraint needs.
    let tokenize = Arc::new(move |text: &[u8]| {
        let mut out = Vec::new();
        let mut i = 0;
        while i < text.len() {
            let best = text_ids
                .iter()
                .filter(|&&id| text[i..].starts_with(&table[id]))
                .max_by_key(|&&id| table[id].len())
                .copied()
                .unwrap_or(usize::from(text[i]));
            out.push(best as u32);
            i += table[best].len().max(1);
        }
        out
    });
    TokenVocab {
        tokens,
        special: vec![IM_START],
        eos_ids: vec![IM_END, EOT],
        tokenize,
    }
}

fn compiler() -> ConstraintCompiler {
    ConstraintCompiler::new(test_vocab()).unwrap()
}

/// Samples from softmax(logits); `-inf` logits are never chosen.
fn sample(logits: &[f32], rng: &mut StdRng) -> u32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    assert!(max.is_finite(), "every token masked");
    let weights: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
    let total: f32 = weights.iter().sum();
    let mut r = rng.gen::<f32>() * total;
    for (i, w) in weights.iter().enumerate() {
        if *w > 0.0 {
            if r < *w {
                return i as u32;
            }
            r -= w;
        }
    }
    // Rounding left a sliver of `r`: take the last possible token.
    weights.iter().rposition(|&w| w > 0.0).unwrap() as u32
}

struct Generation {
    text: String,
    tokens: usize,
    masks: usize,
    ended_by_eos: bool,
}

/// The lazy sample / check / mask loop the inference engine runs, with a
/// model whose logits are uniform random (EOS gets a bonus so that output
/// ends in reasonable time once the grammar allows it). With
/// `use_forced`, tokens the grammar forces are committed without sampling.
fn generate(state: &mut ConstraintState, seed: u64, use_forced: bool) -> Generation {
    const MAX_TOKENS: usize = 2_000;
    let mut rng = StdRng::seed_from_u64(seed);
    let vocab = 256 + 4 + MERGES.len();
    let mut out = Vec::new();
    let mut ended_by_eos = false;
    while !state.is_finished() {
        assert!(out.len() < MAX_TOKENS, "seed {seed}: runaway output");
        if use_forced {
            let forced = state.forced_tokens();
            if !forced.is_empty() {
                for t in forced {
                    state.commit(t).unwrap();
                    out.push(t);
                }
                continue;
            }
        }
        // Spare a few logits beyond the vocabulary, like a padded output layer.
        let mut logits: Vec<f32> = (0..vocab + 5).map(|_| rng.gen::<f32>() * 4.0).collect();
        logits[IM_END as usize] += 6.0;
        logits[EOT as usize] += 5.0;
        let mut tok = sample(&logits, &mut rng);
        if !state.is_allowed(tok) {
            let mask = state.compute_mask().unwrap();
            assert!(
                !mask.is_allowed(tok),
                "seed {seed}: mask allows rejected token {tok}"
            );
            mask.apply_to_logits(&mut logits);
            tok = sample(&logits, &mut rng);
            assert!(
                state.is_allowed(tok),
                "seed {seed}: masked sample {tok} rejected"
            );
        }
        if tok == IM_END || tok == EOT {
            assert!(
                state.can_stop(),
                "seed {seed}: EOS allowed before the grammar accepts"
            );
            state.commit(tok).unwrap();
            ended_by_eos = true;
            break;
        }
        assert!(tok != IM_START && tok != UNUSED && (tok as usize) < vocab);
        state.commit(tok).unwrap();
        out.push(tok);
    }
    assert!(
        state.can_stop(),
        "seed {seed}: stopped outside an accepting state"
    );
    assert!(state.is_finished() || ended_by_eos);
    assert!(state.error().is_none(), "seed {seed}: {:?}", state.error());
    let bytes = state.decode(&out);
    let text = String::from_utf8(bytes)
        .unwrap_or_else(|e| panic!("seed {seed}: output is not UTF-8: {e}"));
    Generation {
        text,
        tokens: out.len(),
        masks: state.masks_computed(),
        ended_by_eos,
    }
}

fn decision_schema() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["speak", "assign_task", "conclude", "pause"]},
            "next_speakers": {
                "type": "array",
                "items": {"type": "string", "pattern": "^[a-z0-9]{4,8}$"},
                "minItems": 1,
                "maxItems": 3
            },
            "task_ids": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": 999},
                "maxItems": 4
            },
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            "message": {"type": "string", "maxLength": 40},
            "done": {"type": "boolean"}
        },
        "required": ["action", "next_speakers", "confidence"],
        "additionalProperties": false
    })
}

#[test]
fn json_schema_output_always_validates() {
    let schema = decision_schema();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let c = compiler();
    let mut with_message = 0;
    let mut total_masks = 0;
    let mut total_tokens = 0;
    for seed in 0..60 {
        let mut state = c.compile(&Constraint::JsonSchema(schema.clone())).unwrap();
        let g = generate(&mut state, seed, seed % 2 == 0);
        let value: serde_json::Value = serde_json::from_str(&g.text)
            .unwrap_or_else(|e| panic!("seed {seed}: not JSON ({e}): {}", g.text));
        let errors: Vec<String> = validator
            .iter_errors(&value)
            .map(|e| e.to_string())
            .collect();
        assert!(
            errors.is_empty(),
            "seed {seed}: {} violates the schema: {errors:?}",
            g.text
        );
        println!(
            "seed {seed}: {} tokens, {} masks: {}",
            g.tokens, g.masks, g.text
        );
        if value.get("message").is_some() {
            with_message += 1;
        }
        total_masks += g.masks;
        total_tokens += g.tokens;
    }
    // The random model must have explored the optional fields too, and the
    // lazy path must have skipped the mask for some tokens.
    assert!(with_message > 0);
    assert!(
        total_masks < total_tokens,
        "{total_masks} masks for {total_tokens} tokens"
    );
}

#[test]
fn regex_output_always_matches() {
    let rx = r"(yes|no|maybe): [A-Z][a-z]{2,10}( [a-z0-9é]{1,8}){0,3}\.";
    let check = regex::Regex::new(&format!("^(?:{rx})$")).unwrap();
    let c = compiler();
    for seed in 0..60 {
        let mut state = c.compile(&Constraint::Regex(rx.into())).unwrap();
        let g = generate(&mut state, seed, seed % 3 == 0);
        assert!(check.is_match(&g.text), "seed {seed}: {:?}", g.text);
        println!("seed {seed}: {:?}", g.text);
    }
}

#[test]
fn lark_output_always_parses() {
    let grammar = r#"
start: call ("; " call)*
call: NAME "(" (arg (", " arg)*)? ")"
arg: NUMBER | STRING
NAME: /[a-z_]{1,10}/
NUMBER: /-?[0-9]{1,4}/
STRING: /"[a-z ]{0,12}"/
"#;
    let arg = r#"(?:-?[0-9]{1,4}|"[a-z ]{0,12}")"#;
    let call = format!(r"[a-z_]{{1,10}}\((?:{arg}(?:, {arg})*)?\)");
    let check = regex::Regex::new(&format!("^{call}(?:; {call})*$")).unwrap();
    let c = compiler();
    let mut eos_endings = 0;
    for seed in 0..60 {
        let mut state = c.compile(&Constraint::Lark(grammar.into())).unwrap();
        let g = generate(&mut state, seed, seed % 2 == 1);
        assert!(check.is_match(&g.text), "seed {seed}: {:?}", g.text);
        println!("seed {seed}: {:?}", g.text);
        eos_endings += usize::from(g.ended_by_eos);
    }
    // The language is unbounded: only an EOS can end it.
    assert_eq!(eos_endings, 60);
}

/// At many reachable states, the full mask and the per-token check agree:
/// every masked-in token passes `is_allowed`, and where nothing is forced,
/// nothing else does.
#[test]
fn mask_and_is_allowed_agree() {
    let c = compiler();
    let vocab = (256 + 4 + MERGES.len()) as u32;
    let constraints = [
        Constraint::JsonSchema(decision_schema()),
        Constraint::Regex(r"[a-c]{2,5}(x|yz)?".into()),
    ];
    for constraint in &constraints {
        for seed in 0..4 {
            let mut state = c.compile(constraint).unwrap();
            let mut rng = StdRng::seed_from_u64(seed);
            let mut steps = 0;
            while !state.is_finished() && steps < 60 {
                let mask = state.compute_mask().unwrap();
                let forced = state.forced_tokens();
                for t in 0..vocab + 3 {
                    let ok = state.is_allowed(t);
                    if mask.is_allowed(t) {
                        assert!(
                            ok,
                            "{constraint:?} step {steps}: mask allows {t}, check does not"
                        );
                    } else if forced.is_empty() {
                        assert!(
                            !ok,
                            "{constraint:?} step {steps}: check allows {t}, mask does not"
                        );
                    }
                }
                assert!(!mask.is_allowed(IM_START) && !mask.is_allowed(UNUSED));
                assert_eq!(mask.is_allowed(IM_END), state.can_stop());
                assert_eq!(mask.is_allowed(EOT), state.can_stop());
                let allowed = mask.allowed_tokens();
                assert_eq!(allowed.len(), mask.allowed_count());
                let text: Vec<u32> = allowed
                    .into_iter()
                    .filter(|&t| t != IM_END && t != EOT)
                    .collect();
                if text.is_empty() {
                    break;
                }
                state.commit(text[rng.gen_range(0..text.len())]).unwrap();
                steps += 1;
            }
        }
    }
}

#[test]
fn forced_prefix_is_offered_without_sampling() {
    let c = compiler();
    let mut state = c
        .compile(&Constraint::JsonSchema(decision_schema()))
        .unwrap();
    let forced = state.forced_tokens();
    assert!(!forced.is_empty());
    let text = String::from_utf8(state.decode(&forced)).unwrap();
    assert!(
        r#"{"action": ""#.starts_with(&text) && text.starts_with('{'),
        "{text:?}"
    );
    // Peeking commits nothing.
    assert_eq!(state.tokens_committed(), 0);
    for t in forced {
        state.commit(t).unwrap();
    }
}

#[test]
fn violations_and_control_tokens_are_rejected() {
    let c = compiler();
    let mut state = c.compile(&Constraint::Regex("ab".into())).unwrap();
    for t in [IM_START, UNUSED, IM_END, EOT, u32::from(b'b'), 100_000] {
        assert!(!state.is_allowed(t), "token {t}");
    }
    assert!(!state.can_stop());
    state.commit(u32::from(b'a')).unwrap();
    let err = state.commit(u32::from(b'a')).unwrap_err();
    assert!(
        matches!(err, ConstraintError::Rejected { token: 97, .. }),
        "{err}"
    );
    // Poisoned: nothing works after a violation.
    assert!(state.is_finished());
    assert!(!state.is_allowed(u32::from(b'b')));
    assert!(state.compute_mask().is_err());
    assert!(state.error().is_some());
}

#[test]
fn finished_state_allows_only_eos() {
    let c = compiler();
    let mut state = c.compile(&Constraint::Regex("ab".into())).unwrap();
    state.commit(u32::from(b'a')).unwrap();
    assert!(!state.is_finished());
    state.commit(u32::from(b'b')).unwrap();
    assert!(state.is_finished());
    assert!(state.can_stop());
    assert!(state.is_allowed(IM_END) && state.is_allowed(EOT));
    assert!(!state.is_allowed(u32::from(b'a')));
    let mask = state.compute_mask().unwrap();
    assert_eq!(mask.allowed_tokens(), vec![IM_END, EOT]);
    state.commit(IM_END).unwrap();
    assert!(state.commit(u32::from(b'a')).is_err());
}

#[test]
fn eos_ends_output_only_where_grammar_accepts() {
    let c = compiler();
    let mut state = c.compile(&Constraint::Regex("a+".into())).unwrap();
    assert!(!state.is_allowed(IM_END));
    assert!(state.commit(IM_END).is_err());
    let mut state = c.compile(&Constraint::Regex("a+".into())).unwrap();
    state.commit(u32::from(b'a')).unwrap();
    assert!(state.can_stop() && !state.is_finished());
    assert!(state.is_allowed(EOT));
    state.commit(EOT).unwrap();
    assert!(state.is_finished());
}

fn compile_error(constraint: Constraint) -> String {
    match compiler().compile(&constraint) {
        Err(e @ ConstraintError::Compile { .. }) => {
            println!("{e}");
            e.to_string()
        }
        Err(e) => panic!("{constraint:?}: wrong error kind: {e}"),
        Ok(_) => panic!("{constraint:?}: compiled"),
    }
}

#[test]
fn bad_constraints_are_clean_errors() {
    let msg = compile_error(Constraint::Regex("(ab".into()));
    assert!(msg.contains("regex"), "{msg}");
    let msg = compile_error(Constraint::Lark("start: foo\n".into()));
    assert!(msg.contains("foo"), "{msg}");
    let msg = compile_error(Constraint::Lark("start: \"a\" |\n  )(".into()));
    assert!(msg.contains("Lark"), "{msg}");
    let msg = compile_error(Constraint::JsonSchema(
        json!({"type": "integer", "minimum": 5, "maximum": 1}),
    ));
    assert!(msg.contains("JSON Schema"), "{msg}");
    let msg = compile_error(Constraint::JsonSchema(json!({"type": "frobnicate"})));
    assert!(msg.contains("frobnicate"), "{msg}");
    let msg = compile_error(Constraint::JsonSchema(json!(42)));
    assert!(msg.contains("42"), "{msg}");
    let msg = compile_error(Constraint::JsonSchema(json!({"$ref": "#/$defs/missing"})));
    assert!(msg.contains("missing"), "{msg}");
}

/// Schemas and regexes built to blow up the lexer either compile or fail
/// with an error, in bounded time.
#[test]
fn pathological_constraints_do_not_hang() {
    let c = compiler();
    let started = std::time::Instant::now();
    let nested = (0..200).fold(
        json!({"type": "string"}),
        |inner, _| json!({"type": "array", "items": inner}),
    );
    let wide_enum: Vec<String> = (0..20_000).map(|i| format!("value_{i:05}")).collect();
    let cases = [
        Constraint::Regex("(a|b)*a(a|b){40}".into()),
        Constraint::Regex("[a-z]{1,200}[0-9]{1,200}x{1000}".into()),
        Constraint::JsonSchema(nested),
        Constraint::JsonSchema(json!({"type": "string", "enum": wide_enum})),
    ];
    for constraint in &cases {
        let compiled = c.compile(constraint);
        println!("{}: {:?}", constraint.kind(), compiled.as_ref().err());
        if let Ok(mut state) = compiled {
            let mut rng = StdRng::seed_from_u64(7);
            for _ in 0..30 {
                let Ok(mask) = state.compute_mask() else {
                    break;
                };
                let allowed = mask.allowed_tokens();
                let text: Vec<u32> = allowed
                    .into_iter()
                    .filter(|&t| t != IM_END && t != EOT)
                    .collect();
                if text.is_empty() {
                    break;
                }
                if state.commit(text[rng.gen_range(0..text.len())]).is_err() {
                    break;
                }
            }
        }
    }
    assert!(
        started.elapsed().as_secs() < 60,
        "took {:?}",
        started.elapsed()
    );
}
