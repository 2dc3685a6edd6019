//! all-mpnet-base-v2 (an MPNet encoder) against a reference forward pass.
//!
//! The model is optional and large (400 MB), so unlike the MiniLM tests these run only when
//! it is here (`STARLING_TEST_MPNET`, or the model cache after `starling models pull
//! all-mpnet-base-v2`) and otherwise say on stderr that they skipped; see
//! `starling_models::testing::mpnet_model`. The reference vectors in
//! `fixtures/embed/mpnet_reference.json` come from `fixtures/embed/make_mpnet_reference.py`:
//! transformers' MPNetModel written out in numpy (float64 activations), mean pooling and L2
//! normalisation, rounded to 5 decimals.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::Deserialize;
use starling_models::embed::{BertEmbedder, EmbedBackend, EmbedError, Embedder};
use starling_models::testing::{mpnet_model, mpnet_skip_message};

#[derive(Deserialize)]
struct Reference {
    max_seq_length: usize,
    entries: Vec<Entry>,
}

#[derive(Deserialize)]
struct Entry {
    text: String,
    untruncated_tokens: usize,
    vector: Vec<f32>,
}

fn reference() -> Reference {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/embed/mpnet_reference.json");
    let bytes = std::fs::read(&path).expect("read mpnet_reference.json");
    serde_json::from_slice(&bytes).expect("parse mpnet_reference.json")
}

fn model_dir() -> Option<PathBuf> {
    let dir = mpnet_model();
    if dir.is_none() {
        eprintln!("{}", mpnet_skip_message());
    }
    dir
}

/// The model on the default backend, loaded once per test binary.
fn mpnet() -> Option<&'static BertEmbedder> {
    static MODEL: OnceLock<Option<BertEmbedder>> = OnceLock::new();
    MODEL
        .get_or_init(|| model_dir().map(|dir| BertEmbedder::load(dir).expect("load model")))
        .as_ref()
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    dot(a, b) / (dot(a, a).sqrt() * dot(b, b).sqrt())
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Embeds the fixture texts in one batch and returns the lowest cosine to the reference,
/// failing below `floor`.
fn check_against_reference(model: &BertEmbedder, floor: f32) -> f32 {
    let reference = reference();
    assert!(
        reference
            .entries
            .iter()
            .any(|e| e.untruncated_tokens > reference.max_seq_length),
        "the fixture must exercise truncation"
    );
    let texts: Vec<&str> = reference.entries.iter().map(|e| e.text.as_str()).collect();
    let vectors = model.embed(&texts).expect("embed");
    let mut worst = f32::INFINITY;
    for (entry, vector) in reference.entries.iter().zip(&vectors) {
        assert_eq!(vector.len(), 768);
        assert!((dot(vector, vector).sqrt() - 1.0).abs() < 1e-4);
        let cos = cosine(vector, &entry.vector);
        eprintln!(
            "  {cos:.6}  {:>3} tokens  {:?}",
            entry.untruncated_tokens.min(reference.max_seq_length),
            entry.text.chars().take(40).collect::<String>()
        );
        assert!(cos >= floor, "cosine {cos} for {:?}", entry.text);
        worst = worst.min(cos);
    }
    worst
}

#[test]
fn both_backends_match_the_reference() {
    let Some(dir) = model_dir() else { return };
    for (backend, floor) in [
        (EmbedBackend::Candle, 0.9999),
        (EmbedBackend::Kernels, 0.999),
    ] {
        let model = BertEmbedder::load_with(&dir, backend).expect("load");
        assert_eq!(model.backend(), backend);
        assert_eq!(model.dim(), 768);
        assert_eq!(model.max_len(), 384);
        eprintln!("{backend:?}:");
        let worst = check_against_reference(&model, floor);
        eprintln!("{backend:?}: lowest cosine to the reference {worst:.6}");
    }
}

#[test]
fn batched_equals_one_at_a_time() {
    let Some(model) = mpnet() else { return };
    let reference = reference();
    let texts: Vec<&str> = reference.entries.iter().map(|e| e.text.as_str()).collect();
    let batched = model.embed(&texts).expect("embed batch");
    for (text, expected) in texts.iter().zip(&batched) {
        let single = model.embed(&[text]).expect("embed single");
        let diff = max_abs_diff(&single[0], expected);
        assert!(diff < 1e-5, "batch vs single differ by {diff} for {text:?}");
    }
}

#[test]
fn padded_candle_batches_match_single_texts() {
    let Some(dir) = model_dir() else { return };
    let model = BertEmbedder::load_with(&dir, EmbedBackend::Candle).expect("load");
    // Short texts of different lengths share one padded batch.
    let texts = [
        "Hello, world!",
        "Translate the quarterly sales report from German into English for the board.",
        "x",
    ];
    let batched = model.embed(&texts).expect("embed batch");
    for (text, expected) in texts.iter().zip(&batched) {
        let single = model.embed(&[text]).expect("embed single");
        let diff = max_abs_diff(&single[0], expected);
        assert!(diff < 1e-4, "batch vs single differ by {diff} for {text:?}");
    }
}

#[test]
fn similar_sentences_are_closer_than_unrelated_ones() {
    let Some(model) = mpnet() else { return };
    let v = model
        .embed(&[
            "The cat sits on the mat.",
            "A feline rests upon the rug.",
            "Quarterly tax filings are due in April.",
        ])
        .expect("embed");
    assert!(dot(&v[0], &v[1]) > dot(&v[0], &v[2]) + 0.2);
}

#[test]
fn model_id_is_the_directory_name() {
    let Some(model) = mpnet() else { return };
    let dir = model_dir().expect("dir");
    assert_eq!(
        model.model_id(),
        dir.file_name().expect("name").to_string_lossy()
    );
}

/// A model directory with only `config.json`, holding `config`.
fn config_only(config: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("config.json"), config).expect("write");
    dir
}

#[test]
fn unknown_model_types_are_refused_by_name() {
    let dir = config_only(r#"{"model_type": "roberta", "hidden_size": 768}"#);
    match BertEmbedder::load(dir.path()) {
        Err(EmbedError::Unsupported(message)) => {
            assert!(message.contains("roberta"), "{message}");
            assert!(message.contains("bert, mpnet"), "{message}");
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

#[test]
fn mpnet_configs_are_checked() {
    let base = r#""vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 1,
        "intermediate_size": 128, "max_position_embeddings": 66, "layer_norm_eps": 1e-5,
        "model_type": "mpnet""#;
    let odd_heads = config_only(&format!(
        r#"{{{base}, "num_attention_heads": 3, "hidden_act": "gelu"}}"#
    ));
    match BertEmbedder::load(odd_heads.path()) {
        Err(EmbedError::Corrupt { path, reason }) => {
            assert!(path.ends_with("config.json"));
            assert!(reason.contains("multiple"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    let swish = config_only(&format!(
        r#"{{{base}, "num_attention_heads": 4, "hidden_act": "swish"}}"#
    ));
    assert!(matches!(
        BertEmbedder::load(swish.path()),
        Err(EmbedError::Unsupported(m)) if m.contains("swish")
    ));
    // A valid config gets as far as the next missing file.
    let valid = config_only(&format!(
        r#"{{{base}, "num_attention_heads": 4, "hidden_act": "gelu"}}"#
    ));
    assert!(matches!(
        BertEmbedder::load(valid.path()),
        Err(EmbedError::MissingFile { path }) if path.ends_with("tokenizer.json")
    ));
}
