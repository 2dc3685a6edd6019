//! Builder tests on tiny in-memory vocabularies (no model files needed).

use std::collections::HashMap;

use candle_core::quantized::gguf_file::{Content, Value, VersionedMagic};
use proptest::prelude::*;

use super::bytes::gpt2_byte_to_char;
use super::*;

fn strings(v: &[String]) -> Value {
    Value::Array(v.iter().cloned().map(Value::String).collect())
}

fn content(md: Vec<(&str, Value)>) -> Content {
    Content {
        magic: VersionedMagic::GgufV3,
        metadata: md
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect::<HashMap<_, _>>(),
        tensor_infos: HashMap::new(),
        tensor_data_offset: 0,
    }
}

/// A byte-level BPE vocabulary: three control tokens, the 256 byte symbols, and a few
/// merges ("he", "hel", "hell", "hello", "Ġw", "12").
pub(crate) fn tiny_gpt2(pre: &str) -> GgufTokenizer {
    let mut tokens: Vec<String> = vec![
        "<|endoftext|>".into(),
        "<|im_start|>".into(),
        "<|im_end|>".into(),
    ];
    let mut types = vec![3i32, 3, 3];
    for c in gpt2_byte_to_char() {
        tokens.push(c.to_string());
        types.push(1);
    }
    let merges = ["h e", "he l", "hel l", "hell o", "Ġ w", "1 2", "Ċ Ċ"];
    for m in merges {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    let md = vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String(pre.into())),
        ("tokenizer.ggml.tokens", strings(&tokens)),
        (
            "tokenizer.ggml.token_type",
            Value::Array(types.into_iter().map(Value::I32).collect()),
        ),
        (
            "tokenizer.ggml.merges",
            Value::Array(
                merges
                    .iter()
                    .map(|m| Value::String(m.to_string()))
                    .collect(),
            ),
        ),
        ("tokenizer.ggml.bos_token_id", Value::U32(1)),
        ("tokenizer.ggml.eos_token_id", Value::U32(2)),
        ("tokenizer.ggml.add_bos_token", Value::Bool(false)),
    ];
    match GgufTokenizer::from_gguf(&content(md)) {
        Ok(t) => t,
        Err(e) => panic!("tiny gpt2 vocabulary: {e}"),
    }
}

/// A SentencePiece-style vocabulary with byte fallback, scores and no merges.
fn tiny_spm(add_space_prefix: bool) -> GgufTokenizer {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into(), "<eot>".into()];
    let mut types = vec![2i32, 3, 3, 3];
    let mut scores = vec![0f32; 4];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    // (piece, score): higher scores merge first.
    let pieces = [
        ("▁", -1.0),
        ("a", -2.0),
        ("b", -3.0),
        ("c", -4.0),
        ("ab", -5.0),
        ("bc", -6.0),
        ("abc", -7.0),
        ("▁a", -8.0),
        ("▁ab", -9.0),
        ("▁abc", -10.0),
        ("é", -11.0),
    ];
    for (p, s) in pieces {
        tokens.push(p.to_string());
        types.push(1);
        scores.push(s);
    }
    tokens.push("\n\n".into()); // user-defined, like gemma's
    types.push(4);
    scores.push(0.0);
    let md = vec![
        ("tokenizer.ggml.model", Value::String("llama".into())),
        ("tokenizer.ggml.tokens", strings(&tokens)),
        (
            "tokenizer.ggml.token_type",
            Value::Array(types.into_iter().map(Value::I32).collect()),
        ),
        (
            "tokenizer.ggml.scores",
            Value::Array(scores.into_iter().map(Value::F32).collect()),
        ),
        ("tokenizer.ggml.bos_token_id", Value::U32(1)),
        ("tokenizer.ggml.eos_token_id", Value::U32(2)),
        ("tokenizer.ggml.unknown_token_id", Value::U32(0)),
        ("tokenizer.ggml.eot_token_id", Value::U32(3)),
        (
            "tokenizer.ggml.add_space_prefix",
            Value::Bool(add_space_prefix),
        ),
    ];
    match GgufTokenizer::from_gguf(&content(md)) {
        Ok(t) => t,
        Err(e) => panic!("tiny spm vocabulary: {e}"),
    }
}

fn ids_of(t: &GgufTokenizer, pieces: &[&str]) -> Vec<u32> {
    pieces
        .iter()
        .map(|p| t.token_id(p).unwrap_or_else(|| panic!("no token {p:?}")))
        .collect()
}

#[test]
fn gpt2_merges_and_specials() {
    let t = tiny_gpt2("gpt2");
    assert_eq!(t.encode("hello", false).unwrap(), ids_of(&t, &["hello"]));
    assert_eq!(
        t.encode("hello w", false).unwrap(),
        ids_of(&t, &["hello", "Ġw"])
    );
    // Control text is a control token only when allowed.
    assert_eq!(
        t.encode("<|im_start|>hello", true).unwrap(),
        ids_of(&t, &["<|im_start|>", "hello"])
    );
    let plain = t.encode("<|im_end|>", false).unwrap();
    assert!(plain.iter().all(|id| !t.is_special(*id)), "{plain:?}");
    assert_eq!(t.decode(&plain), "<|im_end|>");
    // Control tokens are left out of decoded text but kept by decode_with_special.
    let with = t.encode("hello<|im_end|>", true).unwrap();
    assert_eq!(t.decode(&with), "hello");
    assert_eq!(t.decode_with_special(&with), "hello<|im_end|>");
    assert_eq!(t.bos_id(), Some(1));
    assert_eq!(t.eos_id(), Some(2));
    assert_eq!(t.eot_ids(), &[2, 0]);
    assert!(!t.add_bos());
    assert_eq!(t.vocab_size(), 3 + 256 + 7);
}

#[test]
fn pre_tokenizer_selection_changes_digits() {
    let gpt2 = tiny_gpt2("gpt2");
    let smollm = tiny_gpt2("smollm");
    assert_eq!(gpt2.encode("12", false).unwrap(), ids_of(&gpt2, &["12"]));
    assert_eq!(
        smollm.encode("12", false).unwrap(),
        ids_of(&smollm, &["1", "2"])
    );
    // Unknown pre-tokenizers fall back to GPT-2.
    let unknown = tiny_gpt2("definitely-not-known");
    assert_eq!(
        unknown.encode("12", false).unwrap(),
        ids_of(&unknown, &["12"])
    );
}

#[test]
fn gpt2_token_bytes_undo_the_byte_alphabet() {
    let t = tiny_gpt2("gpt2");
    assert_eq!(t.token_bytes(ids_of(&t, &["Ġw"])[0]), b" w");
    assert_eq!(t.token_bytes(ids_of(&t, &["ĊĊ"])[0]), b"\n\n");
    assert_eq!(t.token_bytes(2), b"<|im_end|>");
    assert_eq!(t.token_bytes(10_000), b"");
    let e = t.encode("é🙂", false).unwrap();
    let all: Vec<u8> = e
        .iter()
        .flat_map(|id| t.token_bytes(*id).to_vec())
        .collect();
    assert_eq!(all, "é🙂".as_bytes());
}

#[test]
fn segments_only_allow_specials_in_template_text() {
    let t = tiny_gpt2("gpt2");
    let ids = t
        .encode_segments(&[
            Segment::template("<|im_start|>user\n"),
            Segment::content("hi<|im_end|>"),
            Segment::template("<|im_end|>\n"),
        ])
        .unwrap();
    let specials: Vec<u32> = ids.iter().copied().filter(|i| t.is_special(*i)).collect();
    assert_eq!(specials, vec![1, 2]);
    assert_eq!(
        t.decode_with_special(&ids),
        "<|im_start|>user\nhi<|im_end|><|im_end|>\n"
    );
    // A special token straddling a boundary is not recognised.
    let split = t
        .encode_segments(&[Segment::content("<|im_"), Segment::template("end|>")])
        .unwrap();
    assert!(split.iter().all(|i| !t.is_special(*i)));
    // Without special text in content, segments tokenise exactly like the whole string.
    let whole = "<|im_start|>user\nhello w<|im_end|>\n";
    let segs = t
        .encode_segments(&[
            Segment::template("<|im_start|>user\nhel"),
            Segment::content("lo "),
            Segment::template("w<|im_end|>\n"),
        ])
        .unwrap();
    assert_eq!(segs, t.encode(whole, true).unwrap());
}

#[test]
fn spm_merges_from_scores_and_byte_fallback() {
    let t = tiny_spm(false);
    // "abc" merges a+b (score -5) before b+c (-6), then ab+c -> abc.
    assert_eq!(t.encode("abc", false).unwrap(), ids_of(&t, &["abc"]));
    assert_eq!(
        t.encode("a abc", false).unwrap(),
        ids_of(&t, &["a", "▁abc"])
    );
    // 'z' is not in the vocabulary: byte fallback.
    assert_eq!(t.encode("z", false).unwrap(), ids_of(&t, &["<0x7A>"]));
    // 'é' is a piece, '🙂' falls back to four bytes.
    assert_eq!(
        t.encode("é🙂", false).unwrap(),
        ids_of(&t, &["é", "<0xF0>", "<0x9F>", "<0x99>", "<0x82>"])
    );
    // User-defined tokens are matched verbatim even in untrusted text.
    assert_eq!(
        t.encode("a\n\na", false).unwrap(),
        ids_of(&t, &["a", "\n\n", "a"])
    );
    assert_eq!(
        t.decode(&t.encode("a abc z 🙂\n\n", false).unwrap()),
        "a abc z 🙂\n\n"
    );
    assert_eq!(t.eot_ids(), &[2, 3]);
    assert!(t.add_bos());
}

#[test]
fn spm_prefix_space_is_added_and_stripped() {
    let t = tiny_spm(true);
    assert_eq!(t.encode("abc", false).unwrap(), ids_of(&t, &["▁abc"]));
    // After a control token the prefix space is added again (as llama.cpp does).
    assert_eq!(
        t.encode("abc<s>abc", true).unwrap(),
        ids_of(&t, &["▁abc", "<s>", "▁abc"])
    );
    assert_eq!(t.decode(&t.encode("abc abc", false).unwrap()), "abc abc");
    let mut s = t.stream_decoder();
    let ids = t.encode("abc a", false).unwrap();
    let streamed: String = ids.iter().filter_map(|id| s.push(*id)).collect();
    assert_eq!(streamed, "abc a");
}

#[test]
fn inner_tokenizer_agrees_and_serialises() {
    for t in [tiny_gpt2("smollm"), tiny_spm(false), tiny_spm(true)] {
        let text = "hello 12 abc é🙂\n\n<|im_end|>";
        let ids = t.encode(text, false).unwrap();
        let inner = t.inner().decode(&ids, false).unwrap();
        assert_eq!(inner, t.decode(&ids));
        let json = t.to_json(false).unwrap();
        let mut back: tokenizers::Tokenizer = json.parse().unwrap();
        // The flag is runtime state, not part of tokenizer.json.
        back.set_encode_special_tokens(true);
        assert_eq!(back.encode(text, false).unwrap().get_ids(), &ids[..]);
    }
}

#[test]
fn bad_metadata_is_an_error() {
    let missing = GgufTokenizer::from_gguf(&content(vec![]));
    assert!(matches!(
        missing,
        Err(TokenizerError::MissingKey("tokenizer.ggml.model"))
    ));
    let bert = GgufTokenizer::from_gguf(&content(vec![(
        "tokenizer.ggml.model",
        Value::String("bert".into()),
    )]));
    assert!(matches!(bert, Err(TokenizerError::UnsupportedModel(_))));
    let mismatch = GgufTokenizer::from_gguf(&content(vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.tokens", strings(&["a".into(), "b".into()])),
        (
            "tokenizer.ggml.token_type",
            Value::Array(vec![Value::I32(1)]),
        ),
    ]));
    assert!(matches!(mismatch, Err(TokenizerError::Invalid(_))));
    let no_merges = GgufTokenizer::from_gguf(&content(vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.tokens", strings(&["a".into()])),
    ]));
    assert!(matches!(
        no_merges,
        Err(TokenizerError::MissingKey("tokenizer.ggml.merges"))
    ));
    let bad_merge = GgufTokenizer::from_gguf(&content(vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.tokens", strings(&["a".into()])),
        ("tokenizer.ggml.merges", strings(&["nospace".into()])),
    ]));
    assert!(matches!(bad_merge, Err(TokenizerError::Invalid(_))));
    let wrong_type =
        GgufTokenizer::from_gguf(&content(vec![("tokenizer.ggml.model", Value::U32(2))]));
    assert!(matches!(wrong_type, Err(TokenizerError::WrongType { .. })));
}

#[test]
fn stream_decoder_holds_back_partial_characters() {
    let t = tiny_spm(false);
    let ids = t.encode("a🙂", false).unwrap();
    assert_eq!(ids.len(), 5);
    let mut s = t.stream_decoder();
    assert_eq!(s.push(ids[0]).as_deref(), Some("a"));
    for id in &ids[1..4] {
        assert_eq!(s.push(*id), None);
        assert!(s.has_pending());
    }
    assert_eq!(s.push(ids[4]).as_deref(), Some("🙂"));
    assert_eq!(s.finish(), None);
    // A cut-off character is flushed as U+FFFD, like decode.
    let mut s = t.stream_decoder();
    let partial = &ids[..3];
    let mut text: String = partial.iter().filter_map(|id| s.push(*id)).collect();
    text.extend(s.finish());
    assert_eq!(text, t.decode(partial));
    assert_eq!(text, "a\u{FFFD}");
}

proptest! {
    #[test]
    fn roundtrip_gpt2(s in "\\PC*") {
        let t = tiny_gpt2("smollm");
        prop_assert_eq!(t.decode(&t.encode(&s, false).unwrap()), s);
    }

    /// SentencePiece writes spaces as U+2581, so a literal U+2581 decodes as a space (in
    /// every implementation); it is left out of the property.
    #[test]
    fn roundtrip_spm(s in "[^\u{2581}\\p{C}]*") {
        let t = tiny_spm(false);
        prop_assert_eq!(t.decode(&t.encode(&s, false).unwrap()), s);
    }

    /// Streaming any id sequence (including invalid byte orders) equals one-shot decode.
    #[test]
    fn stream_equals_decode(ids in proptest::collection::vec(0u32..280, 0..40)) {
        let t = tiny_spm(false);
        let mut s = t.stream_decoder();
        let mut text = String::new();
        for id in &ids {
            if let Some(chunk) = s.push(*id) {
                text.push_str(&chunk);
            }
        }
        if let Some(chunk) = s.finish() {
            text.push_str(&chunk);
        }
        prop_assert_eq!(text, t.decode(&ids));
    }
}
