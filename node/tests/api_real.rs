//! The HTTP API with the real default models (SmolLM2 and all-MiniLM-L6-v2): answers that
//! depend on the model being right, embeddings, and cancellation of a long generation.

mod api_support;

use std::time::{Duration, Instant};

use api_support::{Server, SseReader};
use base64::Engine as _;
use reqwest::StatusCode;
use serde_json::{json, Value};
use starling_models::embed::{BertEmbedder, EmbedHandle};
use starling_models::engine::{Engine, EngineConfig, ModelSlot};
use starling_models::testing;
use starling_node::api::{ApiConfig, AppState};

async fn real_server() -> Server {
    let engine =
        Engine::load(&testing::chat_model(), &EngineConfig::default()).expect("load chat model");
    let embedder = BertEmbedder::load(testing::embedding_model()).expect("load embedder");
    let state = AppState::new(ApiConfig::default())
        .with_chat_model(ModelSlot::new(engine))
        .with_embedder(EmbedHandle::spawn(embedder).expect("spawn embedder"));
    Server::start(state).await
}

async fn post(server: &Server, path: &str, body: &Value) -> (StatusCode, Value) {
    let resp = reqwest::Client::new()
        .post(server.url(path))
        .json(body)
        .send()
        .await
        .expect("send");
    (resp.status(), resp.json().await.expect("json"))
}

#[tokio::test]
async fn real_models_answer_embed_and_cancel() {
    let server = real_server().await;

    // A factual answer, and a stop sequence cutting a count short.
    let (status, body) = post(
        &server,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "What is the capital of France?"}], "temperature": 0, "max_tokens": 24}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let answer = body["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    assert!(answer.contains("Paris"), "{answer}");
    let (_, body) = post(
        &server,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Count from 1 to 10, separated by commas."}],
                "temperature": 0, "max_tokens": 64, "stop": ["5"]}),
    )
    .await;
    let counted = body["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    assert!(counted.contains('4') && !counted.contains('5'), "{counted}");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");

    // Embeddings: unit vectors, similar sentences closer, base64 equal to floats.
    let texts = json!([
        "A cat sits on the mat.",
        "A kitten is sitting on a rug.",
        "Quarterly revenue grew by 4%."
    ]);
    let (status, floats) = post(&server, "/v1/embeddings", &json!({"input": texts})).await;
    assert_eq!(status, StatusCode::OK, "{floats}");
    let vectors: Vec<Vec<f32>> = floats["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|d| serde_json::from_value(d["embedding"].clone()).expect("floats"))
        .collect();
    assert_eq!(vectors.len(), 3);
    assert!(vectors.iter().all(|v| v.len() == 384));
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    assert!((dot(&vectors[0], &vectors[0]) - 1.0).abs() < 1e-3);
    assert!(dot(&vectors[0], &vectors[1]) > dot(&vectors[0], &vectors[2]) + 0.2);
    let (_, encoded) = post(
        &server,
        "/v1/embeddings",
        &json!({"input": texts, "encoding_format": "base64"}),
    )
    .await;
    for (d, v) in encoded["data"]
        .as_array()
        .expect("data")
        .iter()
        .zip(&vectors)
    {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(d["embedding"].as_str().expect("base64 string"))
            .expect("valid base64");
        let decoded: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(&decoded, v);
    }
    // `dimensions` keeps a unit-length prefix; beyond the model's size it is a 400.
    let (status, short) = post(
        &server,
        "/v1/embeddings",
        &json!({"input": texts, "dimensions": 128}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{short}");
    for (d, v) in short["data"].as_array().expect("data").iter().zip(&vectors) {
        let s: Vec<f32> = serde_json::from_value(d["embedding"].clone()).expect("floats");
        assert_eq!(s.len(), 128);
        assert!((dot(&s, &s) - 1.0).abs() < 1e-3);
        // The same direction as the full vector's first 128 components.
        let head = &v[..128];
        let cos = dot(&s, head) / dot(head, head).sqrt();
        assert!(cos > 0.999, "{cos}");
    }
    let (status, _) = post(
        &server,
        "/v1/embeddings",
        &json!({"input": "a", "dimensions": 385}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // A long generation whose client goes away stops at once: the next request does not
    // wait for it.
    let resp = reqwest::Client::new()
        .post(server.url("/v1/chat/completions"))
        .json(&json!({"messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
                      "temperature": 0.7, "seed": 3, "max_tokens": 3000, "stream": true}))
        .send()
        .await
        .expect("send");
    let mut events = SseReader::new(resp);
    for _ in 0..6 {
        let e = events.next().await.expect("event");
        assert!(!e.contains("finish_reason\":\"stop"), "ended early: {e}");
    }
    drop(events);
    let started = Instant::now();
    let (status, body) = post(
        &server,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Say hi."}], "temperature": 0, "max_tokens": 4}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(15),
        "the next request waited {waited:?}"
    );
    assert_eq!(server.state.metrics().cancelled_generations, 1);
    server.stop().await;
}
