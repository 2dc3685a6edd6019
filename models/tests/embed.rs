//! Sentence embeddings against the sentence-transformers reference.
//!
//! Tests that need the real all-MiniLM-L6-v2 files get them from
//! `starling_models::testing` (`STARLING_TEST_EMBED`, or the model cache, fetched on first
//! use); a missing model fails the test. The reference vectors in
//! `fixtures/embed/reference.json` come from `fixtures/embed/make_reference.py`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::Deserialize;
use starling_models::arch::cpu::Isa;
use starling_models::embed::{BertEmbedder, EmbedBackend, EmbedError, EmbedHandle, Embedder};

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
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/embed/reference.json");
    let bytes = std::fs::read(&path).expect("read reference.json");
    serde_json::from_slice(&bytes).expect("parse reference.json")
}

/// The real model directory, found (and fetched on first use) by
/// `starling_models::testing`; a missing model fails the test.
fn model_dir() -> Option<PathBuf> {
    Some(starling_models::testing::embedding_model())
}

/// The real model, loaded once per test binary; `None` (after a skip message)
/// when its files are absent.
fn minilm() -> Option<&'static BertEmbedder> {
    static MODEL: OnceLock<Option<BertEmbedder>> = OnceLock::new();
    MODEL
        .get_or_init(|| model_dir().map(|dir| BertEmbedder::load(dir).expect("load model")))
        .as_ref()
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn norm(a: &[f32]) -> f32 {
    dot(a, a).sqrt()
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    dot(a, b) / (norm(a) * norm(b))
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn reports_model_shape() {
    let Some(model) = minilm() else { return };
    let reference = reference();
    assert_eq!(model.dim(), 384);
    assert_eq!(model.max_len(), reference.max_seq_length);
    assert_eq!(model.max_len(), 256);
    assert_eq!(
        model.model_id(),
        model_dir()
            .expect("dir")
            .file_name()
            .expect("name")
            .to_string_lossy()
    );
    let renamed = BertEmbedder::load(model_dir().expect("dir"))
        .expect("load")
        .with_model_id("all-MiniLM-L6-v2");
    assert_eq!(renamed.model_id(), "all-MiniLM-L6-v2");
}

#[test]
fn matches_sentence_transformers() {
    let Some(model) = minilm() else { return };
    check_against_reference(model);
}

#[test]
fn both_backends_match_sentence_transformers() {
    let Some(dir) = model_dir() else { return };
    for backend in [EmbedBackend::Kernels, EmbedBackend::Candle] {
        let model = BertEmbedder::load_with(&dir, backend).expect("load");
        assert_eq!(model.backend(), backend);
        eprintln!("{backend:?}:");
        check_against_reference(&model);
    }
}

#[test]
fn default_backend_is_the_kernels_where_the_cpu_has_simd() {
    let Some(model) = minilm() else { return };
    let expected = if Isa::detect() == Isa::Scalar
        || std::env::var("STARLING_BACKEND").is_ok_and(|v| v.eq_ignore_ascii_case("candle"))
    {
        EmbedBackend::Candle
    } else {
        EmbedBackend::Kernels
    };
    assert_eq!(model.backend(), expected);
    assert_eq!("kernels".parse::<EmbedBackend>(), Ok(EmbedBackend::Kernels));
    assert_eq!("F32".parse::<EmbedBackend>(), Ok(EmbedBackend::Candle));
    assert_eq!("auto".parse::<EmbedBackend>(), Ok(EmbedBackend::Auto));
    assert!("gpu".parse::<EmbedBackend>().is_err());
}

fn check_against_reference(model: &BertEmbedder) {
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
    assert_eq!(vectors.len(), texts.len());
    let mut worst = f32::INFINITY;
    for (entry, vector) in reference.entries.iter().zip(&vectors) {
        assert_eq!(vector.len(), 384);
        assert!(vector.iter().all(|x| x.is_finite()), "{:?}", entry.text);
        assert!(
            (norm(vector) - 1.0).abs() < 1e-4,
            "norm of {:?}",
            entry.text
        );
        let cos = cosine(vector, &entry.vector);
        assert!(cos >= 0.999, "cosine {cos} for {:?}", entry.text);
        worst = worst.min(cos);
    }
    eprintln!("lowest cosine to the reference: {worst:.6}");
}

#[test]
fn similar_sentences_are_closer_than_unrelated_ones() {
    let Some(model) = minilm() else { return };
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
fn batched_equals_one_at_a_time_and_keeps_order() {
    let Some(model) = minilm() else { return };
    let reference = reference();
    let texts: Vec<&str> = reference.entries.iter().map(|e| e.text.as_str()).collect();
    let batched = model.embed(&texts).expect("embed batch");

    for (text, expected) in texts.iter().zip(&batched) {
        let single = model.embed(&[text]).expect("embed single");
        assert_eq!(single.len(), 1);
        let diff = max_abs_diff(&single[0], expected);
        assert!(diff < 1e-5, "batch vs single differ by {diff} for {text:?}");
    }

    let reversed: Vec<&str> = texts.iter().rev().copied().collect();
    let backwards = model.embed(&reversed).expect("embed reversed");
    for (a, b) in backwards.iter().rev().zip(&batched) {
        assert!(max_abs_diff(a, b) < 1e-5);
    }
}

#[test]
fn small_batches_give_the_same_vectors() {
    let Some(dir) = model_dir() else { return };
    let Some(model) = minilm() else { return };
    let small = BertEmbedder::load(dir).expect("load").with_batch_size(3);
    assert_eq!(small.batch_size(), 3);
    let reference = reference();
    let texts: Vec<&str> = reference.entries.iter().map(|e| e.text.as_str()).collect();
    let a = model.embed(&texts).expect("embed");
    let b = small.embed(&texts).expect("embed small batches");
    for ((x, y), text) in a.iter().zip(&b).zip(&texts) {
        assert!(max_abs_diff(x, y) < 1e-5, "{text:?}");
    }
}

#[test]
fn text_past_the_limit_is_ignored() {
    let Some(model) = minilm() else { return };
    let long = "alpha ".repeat(300);
    let longer = format!("{long} and then something completely different happens here");
    let v = model.embed(&[&long, &longer]).expect("embed");
    assert!(max_abs_diff(&v[0], &v[1]) < 1e-6);
    // ... whereas within the limit, the tail counts.
    let w = model
        .embed(&["alpha alpha", "alpha alpha and then something else"])
        .expect("embed");
    assert!(max_abs_diff(&w[0], &w[1]) > 1e-2);
}

#[test]
fn empty_input_gives_no_vectors() {
    let Some(model) = minilm() else { return };
    assert!(model.embed(&[]).expect("embed").is_empty());
}

#[test]
fn token_vectors_come_with_the_same_pooled_vector() {
    let Some(model) = minilm() else { return };
    let texts = [
        "Key safe by the side door.",
        "who should I ring if the boiler packs up?",
    ];
    let pooled = model.embed(&texts).expect("embed");
    let with = model.embed_tokens(&texts).expect("embed_tokens");
    assert!(model.embed_tokens(&[]).expect("empty").is_empty());
    let dim = model.dim();
    for ((text, v), t) in texts.iter().zip(&pooled).zip(&with) {
        assert!(max_abs_diff(v, &t.vector) < 1e-6, "{text}");
        // One row per word piece, without [CLS] and [SEP]; each of unit length, and their
        // mean points where the pooled vector does (it also averages [CLS] and [SEP]).
        let rows = t.tokens.len() / dim;
        assert_eq!(t.tokens.len() % dim, 0);
        assert!((6..=16).contains(&rows), "{text}: {rows} tokens");
        let mut mean = vec![0f32; dim];
        for row in t.tokens.chunks_exact(dim) {
            assert!((norm(row) - 1.0).abs() < 1e-4);
            mean.iter_mut().zip(row).for_each(|(m, x)| *m += x);
        }
        assert!(cosine(&mean, v) > 0.8, "{text}: {}", cosine(&mean, v));
    }
    // The same token in another text is another vector (contextual), but a close one.
    let a = model.embed_tokens(&["boiler"]).expect("a");
    let b = model.embed_tokens(&["the boiler is broken"]).expect("b");
    let (a, b) = (&a[0].tokens, &b[0].tokens);
    assert_eq!(a.len(), dim);
    let close = b
        .chunks_exact(dim)
        .map(|r| dot(a, r))
        .fold(f32::MIN, f32::max);
    assert!(close > 0.5 && close < 0.9999, "{close}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handle_serves_concurrent_callers() {
    let Some(dir) = model_dir() else { return };
    let Some(model) = minilm() else { return };
    let handle = EmbedHandle::spawn(BertEmbedder::load(dir).expect("load")).expect("spawn");
    assert_eq!(handle.dim(), 384);
    assert_eq!(handle.max_len(), 256);
    assert_eq!(handle.model_id(), model.model_id());

    let reference = reference();
    let texts: Vec<String> = reference.entries.iter().map(|e| e.text.clone()).collect();
    let other = handle.clone();
    let tail = texts[10..].to_vec();
    let second = tokio::spawn(async move { other.embed(tail).await });
    let first = handle.embed(texts[..10].to_vec()).await.expect("first");
    let second = second.await.expect("join").expect("second");
    let got: Vec<Vec<f32>> = first.into_iter().chain(second).collect();
    for (entry, vector) in reference.entries.iter().zip(&got) {
        assert!(cosine(vector, &entry.vector) >= 0.999, "{:?}", entry.text);
    }
    assert!(handle.embed(Vec::new()).await.expect("empty").is_empty());
    assert!(handle.supports_tokens());
    let t = handle
        .embed_tokens(vec![texts[0].clone()])
        .await
        .expect("tokens");
    assert!(cosine(&t[0].vector, &got[0]) >= 0.9999);
    assert!(!t[0].tokens.is_empty());
}

/// Copies the named files of the real model into a fresh directory.
fn partial_copy(from: &Path, files: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for file in files {
        std::fs::copy(from.join(file), dir.path().join(file)).expect("copy");
    }
    dir
}

#[test]
fn missing_files_are_named() {
    let empty = tempfile::tempdir().expect("tempdir");
    match BertEmbedder::load(empty.path()) {
        Err(EmbedError::MissingFile { path }) => assert!(path.ends_with("config.json")),
        other => panic!("expected MissingFile, got {other:?}"),
    }

    let Some(dir) = model_dir() else { return };
    let no_tokenizer = partial_copy(&dir, &["config.json", "model.safetensors"]);
    let err = BertEmbedder::load(no_tokenizer.path()).expect_err("no tokenizer");
    assert!(matches!(&err, EmbedError::MissingFile { path } if path.ends_with("tokenizer.json")));
    assert!(err.to_string().contains("tokenizer.json"), "{err}");

    let no_weights = partial_copy(&dir, &["config.json", "tokenizer.json"]);
    let err = BertEmbedder::load(no_weights.path()).expect_err("no weights");
    assert!(
        matches!(&err, EmbedError::MissingFile { path } if path.ends_with("model.safetensors"))
    );
}

#[test]
fn corrupt_files_are_named() {
    let bad_config = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        bad_config.path().join("config.json"),
        b"{\"hidden_size\": 384",
    )
    .expect("write");
    match BertEmbedder::load(bad_config.path()) {
        Err(EmbedError::Corrupt { path, .. }) => assert!(path.ends_with("config.json")),
        other => panic!("expected Corrupt config, got {other:?}"),
    }

    let Some(dir) = model_dir() else { return };
    let bad_weights = partial_copy(&dir, &["config.json", "tokenizer.json"]);
    std::fs::write(
        bad_weights.path().join("model.safetensors"),
        b"\x10\x00\x00\x00garbage",
    )
    .expect("write");
    let err = BertEmbedder::load(bad_weights.path()).expect_err("corrupt weights");
    assert!(
        matches!(&err, EmbedError::Corrupt { path, .. } if path.ends_with("model.safetensors")),
        "{err}"
    );

    // A truncated weights file: the header is intact, the tensors are not.
    let truncated = partial_copy(&dir, &["config.json", "tokenizer.json"]);
    let weights = std::fs::read(dir.join("model.safetensors")).expect("read");
    std::fs::write(
        truncated.path().join("model.safetensors"),
        &weights[..weights.len() / 2],
    )
    .expect("write");
    let err = BertEmbedder::load(truncated.path()).expect_err("truncated weights");
    assert!(
        matches!(&err, EmbedError::Corrupt { path, .. } if path.ends_with("model.safetensors")),
        "{err}"
    );

    let bad_tokenizer = partial_copy(&dir, &["config.json", "model.safetensors"]);
    std::fs::write(bad_tokenizer.path().join("tokenizer.json"), b"not json").expect("write");
    let err = BertEmbedder::load(bad_tokenizer.path()).expect_err("corrupt tokenizer");
    assert!(
        matches!(&err, EmbedError::Corrupt { path, .. } if path.ends_with("tokenizer.json")),
        "{err}"
    );
}

#[test]
fn unsupported_pooling_is_refused() {
    let Some(dir) = model_dir() else { return };
    let cls = partial_copy(
        &dir,
        &["config.json", "tokenizer.json", "model.safetensors"],
    );
    std::fs::create_dir(cls.path().join("1_Pooling")).expect("mkdir");
    std::fs::write(
        cls.path().join("1_Pooling/config.json"),
        br#"{"word_embedding_dimension": 384, "pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false}"#,
    )
    .expect("write");
    assert!(matches!(
        BertEmbedder::load(cls.path()),
        Err(EmbedError::Unsupported(_))
    ));
}
