//! The real loading and inference code on a tiny random-weight llama GGUF that the test
//! writes itself: fast, and independent of downloaded models.

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::GgmlDType;
use candle_core::Device;
use starling_models::arch;
use starling_models::chat::ChatMessage;
use starling_models::engine::{Chunk, Engine, EngineConfig, FinishReason, GenerateRequest, Prompt};
use starling_models::gguf::GgufFile;
use starling_models::requant::{self, Requantize};
use starling_models::sampling::SamplingOptions;
use starling_models::testing::{write_tiny, write_tiny_llama, TinyArch};
use starling_models::ModelError;

fn tiny(dir: &Path, dtype: GgmlDType) -> PathBuf {
    let path = dir.join(format!("tiny-{dtype:?}.gguf"));
    write_tiny_llama(&path, dtype, 256);
    path
}

fn greedy(prompt: &str, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt: Prompt::Chat(vec![ChatMessage::new("user", prompt)]),
        max_tokens,
        sampling: SamplingOptions::greedy(),
        stop: Vec::new(),
        constraint: None,
        logprobs: None,
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let nb: f32 = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (na * nb)
}

#[tokio::test]
async fn generates_and_streams_the_same_text_twice() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine =
        Engine::load(&tiny(dir.path(), GgmlDType::Q8_0), &EngineConfig::default()).expect("load");
    assert_eq!(engine.info().architecture, "llama");
    let (text, done) = engine
        .generate(greedy("hello there", 24))
        .expect("queue")
        .text()
        .await
        .expect("run");
    // Random weights rarely pick the end token; either way the counts must be consistent.
    assert!(done.completion_tokens <= 24);
    if done.finish_reason == FinishReason::Length {
        assert_eq!(done.completion_tokens, 24);
    }
    // Streaming chunk by chunk yields the same text as collecting.
    let mut gen = engine.generate(greedy("hello there", 24)).expect("queue");
    let mut streamed = String::new();
    let mut second = None;
    while let Some(item) = gen.next().await {
        match item.expect("chunk") {
            Chunk::Text(t) => streamed.push_str(&t),
            Chunk::Logprob(_) => {}
            Chunk::Done(c) => second = Some(c),
        }
    }
    assert_eq!(streamed, text);
    let second = second.expect("done chunk");
    // The second request shares the whole prompt with the first: all but the last token
    // come from the KV cache.
    assert_eq!(second.cached_prompt_tokens, second.prompt_tokens - 1);
    assert_eq!(second.completion_tokens, done.completion_tokens);
}

#[test]
fn cached_prefix_gives_the_same_logits_as_a_fresh_prefill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = GgufFile::open(&tiny(dir.path(), GgmlDType::Q8_0)).expect("open");
    let mut m = arch::load(&file, &Device::Cpu, 256).expect("load");
    let tokens: Vec<u32> = (10..40).collect();
    let whole = m.forward(&tokens).expect("forward");
    m.truncate(0);
    m.forward(&tokens[..17]).expect("first part");
    let split = m.forward(&tokens[17..]).expect("second part");
    assert!(
        cosine(&whole, &split) > 0.9999,
        "cosine {}",
        cosine(&whole, &split)
    );
    // Token by token after rolling back to a shared prefix.
    m.truncate(5);
    assert_eq!(m.cache_len(), 5);
    let mut last = Vec::new();
    for &t in &tokens[5..] {
        last = m.forward(&[t]).expect("step");
    }
    assert!(
        cosine(&whole, &last) > 0.9999,
        "cosine {}",
        cosine(&whole, &last)
    );
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|x| x.0)
    };
    assert_eq!(argmax(&whole), argmax(&last));
}

#[test]
fn q4_1_is_requantised_once_and_stays_close() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = tiny(dir.path(), GgmlDType::Q4_1);
    let out = requant::prepare(&src, Requantize::Q8_0, dir.path()).expect("prepare");
    assert_ne!(out, src);
    let converted = GgufFile::open(&out).expect("open converted");
    let q = &converted.content().tensor_infos["blk.0.attn_q.weight"];
    assert_eq!(q.ggml_dtype, GgmlDType::Q8_0);
    // A second call reuses the file.
    let stamp = std::fs::metadata(&out)
        .and_then(|m| m.modified())
        .expect("mtime");
    let again = requant::prepare(&src, Requantize::Q8_0, dir.path()).expect("prepare again");
    assert_eq!(again, out);
    assert_eq!(
        std::fs::metadata(&out)
            .and_then(|m| m.modified())
            .expect("mtime"),
        stamp
    );
    // `auto` keeps a llama file whose types the CPU kernels run (the tiny model is one,
    // unless the candle backend is forced).
    let auto = requant::prepare(&src, Requantize::Auto, dir.path()).expect("auto");
    if arch::cpu::eligible(&GgufFile::open(&src).expect("open"), &Device::Cpu).is_ok() {
        assert_eq!(auto, src);
    } else {
        assert_eq!(auto, out);
    }
    // `off` keeps the original.
    assert_eq!(
        requant::prepare(&src, Requantize::Off, dir.path()).expect("off"),
        src
    );

    let tokens: Vec<u32> = (20..50).collect();
    let orig = GgufFile::open(&src).expect("open");
    let a = arch::load(&orig, &Device::Cpu, 64)
        .expect("load")
        .forward(&tokens)
        .expect("fwd");
    let b = arch::load(&converted, &Device::Cpu, 64)
        .expect("load")
        .forward(&tokens)
        .expect("fwd");
    assert!(cosine(&a, &b) > 0.99, "cosine {}", cosine(&a, &b));
}

#[test]
fn damaged_files_are_clear_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = tiny(dir.path(), GgmlDType::Q8_0);
    let bytes = std::fs::read(&good).expect("read");

    let truncated = dir.path().join("truncated.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() * 2 / 3]).expect("write");
    let err = Engine::load(&truncated, &EngineConfig::default())
        .err()
        .expect("must fail");
    assert!(matches!(err, ModelError::BadGguf { .. }), "{err}");
    assert!(err.to_string().contains("truncated"), "{err}");

    let garbage = dir.path().join("garbage.gguf");
    std::fs::write(&garbage, b"definitely not a model file").expect("write");
    let err = Engine::load(&garbage, &EngineConfig::default())
        .err()
        .expect("must fail");
    assert!(matches!(err, ModelError::BadGguf { .. }), "{err}");

    let missing = dir.path().join("missing.gguf");
    let err = Engine::load(&missing, &EngineConfig::default())
        .err()
        .expect("must fail");
    assert!(matches!(err, ModelError::Io { .. }), "{err}");
}

#[tokio::test]
async fn bad_requests_are_refused_and_the_engine_keeps_serving() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = EngineConfig {
        max_seq_len: 32,
        ..EngineConfig::default()
    };
    let engine = Engine::load(&tiny(dir.path(), GgmlDType::Q8_0), &config).expect("load");
    let long = "word ".repeat(100);
    let err = engine.generate(greedy(&long, 4)).err().expect("too long");
    assert!(matches!(err, ModelError::ContextOverflow { .. }), "{err}");
    // Megabytes are refused by their size, before tokenisation: the bound is a count of
    // tokens the text needs at least, so it says more than the context holds.
    let huge = "x".repeat(8 << 20);
    let fewest = huge.len() / (2 * engine.tokenizer().max_token_bytes());
    match engine.generate(greedy(&huge, 4)).err() {
        Some(ModelError::ContextOverflow { needed, max }) => {
            assert_eq!((needed, max), (fewest + 1, 32));
        }
        other => panic!("{other:?}"),
    }
    // The bound never refuses what fits: a prompt below it tokenises as usual.
    assert!(engine.generate(greedy("hi", 4)).is_ok());
    let mut bad = greedy("hi", 4);
    bad.sampling.top_p = 0.0;
    assert!(matches!(
        engine.generate(bad).err(),
        Some(ModelError::InvalidRequest(_))
    ));
    assert!(engine.generate(greedy("hi", 0)).is_err());
    // The output is cut at the context window, not an error.
    let (_, done) = engine
        .generate(greedy("hi", 1000))
        .expect("queue")
        .text()
        .await
        .expect("run");
    assert!(done.prompt_tokens + done.completion_tokens <= 32);
}

#[tokio::test]
async fn stop_strings_end_the_output() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine =
        Engine::load(&tiny(dir.path(), GgmlDType::Q8_0), &EngineConfig::default()).expect("load");
    let (full, _) = engine
        .generate(greedy("abc", 40))
        .expect("queue")
        .text()
        .await
        .expect("run");
    // Stop at a piece of the greedy output itself: the output must end right before it.
    let chars: Vec<char> = full.chars().collect();
    if chars.len() < 8 {
        return; // the random model ended its turn almost at once; nothing to cut
    }
    let stop: String = chars[4..7].iter().collect();
    let mut req = greedy("abc", 40);
    req.stop = vec![stop.clone()];
    let (cut, done) = engine
        .generate(req)
        .expect("queue")
        .text()
        .await
        .expect("run");
    assert_eq!(done.finish_reason, FinishReason::Stop);
    let at = full.find(&stop).expect("stop occurs in the full text");
    assert_eq!(cut, full[..at]);
}

#[tokio::test]
async fn every_llama_shaped_architecture_chats_through_the_engine() {
    // The numbers are checked against llama.cpp in `reference_logits.rs`; here each
    // architecture goes the product's way: metadata, tokenizer, chat template, Q4_0 weights
    // on the CPU kernels, generation and the prompt cache.
    let dir = tempfile::tempdir().expect("tempdir");
    for arch in [
        TinyArch::Llama3,
        TinyArch::Qwen2,
        TinyArch::Qwen3,
        TinyArch::Phi3,
    ] {
        let path = dir.path().join(format!("{}.gguf", arch.name()));
        write_tiny(&path, arch, GgmlDType::Q4_0, 256);
        let engine = Engine::load(&path, &EngineConfig::default()).expect("load");
        let expected = if arch == TinyArch::Llama3 {
            "llama"
        } else {
            arch.name()
        };
        assert_eq!(engine.info().architecture, expected);
        let (text, first) = engine
            .generate(greedy("what is in the box?", 12))
            .expect("queue")
            .text()
            .await
            .expect("run");
        assert!(first.completion_tokens <= 12, "{arch:?}");
        let (again, second) = engine
            .generate(greedy("what is in the box?", 12))
            .expect("queue")
            .text()
            .await
            .expect("run");
        assert_eq!(
            again, text,
            "{arch:?}: greedy output changed on a cached prompt"
        );
        assert_eq!(second.cached_prompt_tokens, second.prompt_tokens - 1);
    }
}

#[test]
fn unsupported_architecture_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.gguf");
    let md = [("general.architecture", Value::String("mamba".into()))];
    let md_refs: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (*k, v)).collect();
    let mut f = std::fs::File::create(&path).expect("create");
    gguf_file::write(&mut f, &md_refs, &[]).expect("write");
    let file = GgufFile::open(&path).expect("open");
    let err = arch::load(&file, &Device::Cpu, 16)
        .err()
        .expect("must fail");
    assert!(err.to_string().contains("mamba"), "{err}");
}

/// The log-probability chunks of a generation, and its text and end.
async fn scored(
    engine: &Engine,
    req: GenerateRequest,
) -> (
    Vec<starling_models::engine::TokenLogprob>,
    String,
    starling_models::engine::Completion,
) {
    let mut gen = engine.generate(req).expect("queue");
    let (mut probs, mut text, mut done) = (Vec::new(), String::new(), None);
    while let Some(item) = gen.next().await {
        match item.expect("chunk") {
            Chunk::Logprob(l) => probs.push(l),
            Chunk::Text(t) => text.push_str(&t),
            Chunk::Done(c) => done = Some(c),
        }
    }
    (probs, text, done.expect("done"))
}

#[tokio::test]
async fn logprobs_score_every_generated_token_and_its_best_alternatives() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine =
        Engine::load(&tiny(dir.path(), GgmlDType::Q8_0), &EngineConfig::default()).expect("load");
    let mut req = greedy("hello there", 12);
    req.logprobs = Some(5);
    let (probs, text, done) = scored(&engine, req).await;
    assert_eq!(
        probs.len(),
        done.completion_tokens,
        "one entry per generated token"
    );
    let joined: String = probs.iter().map(|p| p.chosen.token.as_str()).collect();
    assert_eq!(joined, text, "the tokens spell the text");
    for p in &probs {
        assert_eq!(p.top.len(), 5);
        assert!(
            p.top.windows(2).all(|w| w[0].logprob >= w[1].logprob),
            "best first"
        );
        // Greedy without a penalty picks the most likely token.
        assert_eq!(p.chosen.bytes, p.top[0].bytes);
        assert!(p.chosen.logprob <= 0.0 && p.chosen.logprob > -30.0);
        let mass: f32 = p.top.iter().map(|t| t.logprob.exp()).sum();
        assert!(
            mass <= 1.0 + 1e-4,
            "probabilities of distinct tokens sum to at most 1"
        );
    }
    // Off unless asked for.
    let (none, plain, _) = scored(&engine, greedy("hello there", 12)).await;
    assert!(none.is_empty());
    assert_eq!(plain, text);
    // Under a constraint, the distribution is over the tokens it allows: every
    // alternative reported continues the only text the constraint accepts, and they carry
    // all the mass.
    let mut forced = greedy("hello there", 12);
    forced.constraint = Some(starling_models::constraint::Constraint::Regex(
        "hello".into(),
    ));
    forced.logprobs = Some(20);
    let (probs, text, _) = scored(&engine, forced).await;
    assert_eq!(text, "hello");
    let mut so_far = String::new();
    for p in &probs {
        assert!(!p.top.is_empty());
        for alt in &p.top {
            assert!(
                "hello".starts_with(&format!("{so_far}{}", alt.token)),
                "{alt:?} after {so_far:?}"
            );
        }
        let mass: f32 = p.top.iter().map(|t| t.logprob.exp()).sum();
        assert!(
            (mass - 1.0).abs() < 1e-3,
            "the allowed tokens carry all the mass: {mass}"
        );
        so_far.push_str(&p.chosen.token);
    }
    assert_eq!(so_far, "hello");
    let mut too_many = greedy("hello there", 4);
    too_many.logprobs = Some(21);
    assert!(engine.generate(too_many).is_err());
}

#[test]
fn forward_all_gives_each_positions_logits_as_steps_do() {
    let dir = tempfile::tempdir().expect("tempdir");
    for kind in TinyArch::ALL {
        let path = dir.path().join(format!("{}.gguf", kind.name()));
        write_tiny(&path, kind, GgmlDType::Q8_0, 256);
        let file = GgufFile::open(&path).expect("open");
        let mut m = arch::load(&file, &Device::Cpu, 256).expect("load");
        let vocab = m.vocab_size();
        let prefix: Vec<u32> = (10..18).collect();
        let tokens: Vec<u32> = (40..52).collect();
        m.forward(&prefix).expect("prefix");
        let all = m.forward_all(&tokens).expect("all");
        assert_eq!(all.len(), tokens.len() * vocab, "{}", kind.name());
        assert_eq!(m.cache_len(), prefix.len() + tokens.len());
        m.truncate(prefix.len());
        for (i, &t) in tokens.iter().enumerate() {
            let step = m.forward(&[t]).expect("step");
            let row = &all[i * vocab..(i + 1) * vocab];
            let c = cosine(row, &step);
            assert!(c > 0.9999, "{} position {i}: cosine {c}", kind.name());
        }
    }
}

#[test]
fn scoring_gives_each_tokens_logprob_after_what_precedes_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = tiny(dir.path(), GgmlDType::Q8_0);
    let engine = Engine::load(&path, &EngineConfig::default()).expect("load");
    let prompt = Prompt::Chat(vec![ChatMessage::new("user", "hello there")]);
    let continuation: Vec<u32> = vec![70, 71, 99, 120, 33, 64];
    let scored = engine
        .score_tokens(&prompt, continuation.clone())
        .expect("queue")
        .blocking_wait()
        .expect("score");
    assert_eq!(scored.tokens, continuation);
    // The same numbers, step by step on a fresh copy of the model.
    let file = GgufFile::open(&path).expect("open");
    let mut m = arch::load(&file, &Device::Cpu, 256).expect("load");
    let mut logits = m
        .forward(&engine.prompt_tokens(&prompt).expect("prompt"))
        .expect("prompt pass");
    for (i, &t) in continuation.iter().enumerate() {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let z: f32 = logits.iter().map(|l| (l - max).exp()).sum::<f32>().ln() + max;
        let want = logits[t as usize] - z;
        let got = scored.entries[i].chosen.logprob;
        assert!((got - want).abs() < 1e-3, "token {i}: {got} vs {want}");
        logits = m.forward(&[t]).expect("step");
    }
    assert!(
        (scored.total() - scored.entries.iter().map(|e| e.chosen.logprob).sum::<f32>()).abs()
            < 1e-6
    );
    // A text is scored through its tokens; a generation after a scoring still works (the
    // cache holds the scored prefix).
    let text = engine
        .score(&prompt, "hello")
        .expect("queue")
        .blocking_wait()
        .expect("score");
    assert!(!text.tokens.is_empty());
    assert!(text
        .entries
        .iter()
        .all(|e| e.chosen.logprob <= 0.0 && e.chosen.logprob.is_finite()));
    let mut gen = engine.generate(greedy("hello there", 4)).expect("queue");
    while let Some(chunk) = gen.blocking_next() {
        if let Chunk::Done(_) = chunk.expect("chunk") {
            break;
        }
    }
    // A raw text scored as a whole: every token after the first (this vocabulary adds no
    // BOS), with alternatives, and the same numbers as scoring its tail after its head.
    let long: String = "the cat sat on the mat and then ".repeat(6);
    let (tokens, scoring) = engine.score_text(&long, 3).expect("queue");
    let whole = scoring
        .expect("more than one token")
        .blocking_wait()
        .expect("score");
    assert_eq!(whole.tokens, tokens[1..]);
    assert!(whole.entries.iter().all(|e| e.top.len() == 3));
    assert!(whole
        .entries
        .iter()
        .all(|e| e.top[0].logprob >= e.chosen.logprob - 1e-6));
    let mut m = arch::load(&file, &Device::Cpu, 256).expect("load");
    let mut logits = m.forward(&tokens[..1]).expect("first");
    for (i, &t) in tokens[1..].iter().enumerate() {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let z: f32 = logits.iter().map(|l| (l - max).exp()).sum::<f32>().ln() + max;
        let got = whole.entries[i].chosen.logprob;
        assert!((got - (logits[t as usize] - z)).abs() < 1e-3, "token {i}");
        logits = m.forward(&[t]).expect("step");
    }
    let (one, none) = engine.score_text("a", 0).expect("one token");
    assert_eq!((one.len(), none.is_none()), (1, true));
    assert!(engine.score_text("a b", 21).is_err());
    // A text far beyond the context is refused before it is tokenised.
    assert!(matches!(
        engine.score_text(&"x".repeat(10_000_000), 0),
        Err(ModelError::ContextOverflow { .. })
    ));
    // Empty, out-of-vocabulary and overlong continuations are refused.
    assert!(engine.score(&prompt, "").is_err());
    assert!(engine.score_tokens(&prompt, vec![u32::MAX]).is_err());
    assert!(matches!(
        engine.score(&prompt, &"word ".repeat(400)),
        Err(ModelError::ContextOverflow { .. })
    ));
}
