//! The HTTP API end to end over a real loopback socket, with a tiny random-weight model the
//! test writes itself: routes, OpenAI response shapes, streaming, errors for malformed and
//! hostile requests, admission limits, cancellation and shutdown.

mod api_support;

use std::time::Duration;

use api_support::{write_tiny_llama, Server, SseReader};
use reqwest::StatusCode;
use serde_json::{json, Value};
use starling_models::engine::{Engine, EngineConfig, ModelSlot};
use starling_node::api::{ApiConfig, AppState};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn tiny_state(dir: &std::path::Path, config: ApiConfig) -> AppState {
    let path = write_tiny_llama(dir, "tiny", 256);
    let engine = Engine::load(&path, &EngineConfig::default()).expect("load tiny model");
    AppState::new(config).with_chat_model_named(ModelSlot::new(engine), vec!["tiny-alias".into()])
}

/// A tiny model whose context window is `context` tokens, written into `dir`.
fn tiny_engine(dir: &std::path::Path, context: u32) -> Engine {
    let path = write_tiny_llama(dir, "tiny", context);
    Engine::load(&path, &EngineConfig::default()).expect("load tiny model")
}

/// A server with default settings serving `engine` as the chat model.
async fn serve_engine(engine: Engine) -> Server {
    let state =
        AppState::new(ApiConfig::default()).with_chat_model_named(ModelSlot::new(engine), vec![]);
    Server::start(state).await
}

async fn tiny_server(config: ApiConfig) -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = tiny_state(dir.path(), config);
    (Server::start(state).await, dir)
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client")
}

fn greedy(max_tokens: u32) -> Value {
    json!({
        "model": "tiny",
        "messages": [{"role": "system", "content": "You are tiny."}, {"role": "user", "content": "hello there"}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 1,
    })
}

async fn post(server: &Server, path: &str, body: &Value) -> (StatusCode, Value) {
    let resp = client()
        .post(server.url(path))
        .json(body)
        .send()
        .await
        .expect("send");
    let status = resp.status();
    (status, resp.json().await.expect("JSON body"))
}

/// Posts a streamed chat completion and returns its chunks, checking the event-stream
/// content type and the final `[DONE]`.
async fn stream_chunks(server: &Server, req: &Value) -> Vec<Value> {
    let resp = client()
        .post(server.url("/v1/chat/completions"))
        .json(req)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::OK);
    let ctype = resp.headers()["content-type"]
        .to_str()
        .expect("ascii")
        .to_owned();
    assert!(ctype.starts_with("text/event-stream"), "{ctype}");
    let events = SseReader::new(resp).collect().await;
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("chunk JSON"))
        .collect()
}

/// Asserts the OpenAI error shape and returns the error object.
fn error_of(body: &Value) -> &Value {
    let err = &body["error"];
    assert!(
        err["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(err["type"].is_string(), "{body}");
    assert!(
        err.get("param").is_some() && err.get("code").is_some(),
        "{body}"
    );
    err
}

#[tokio::test]
async fn chat_completion_has_openai_shape_and_is_reproducible() {
    let (server, _dir) = tiny_server(ApiConfig::default()).await;
    let (status, body) = post(&server, "/v1/chat/completions", &greedy(12)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert!(body["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("chatcmpl-")));
    assert_eq!(body["model"], "tiny");
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    let content = choice["message"]["content"].as_str().expect("content");
    let usage = &body["usage"];
    let completion = usage["completion_tokens"]
        .as_u64()
        .expect("completion_tokens");
    let prompt = usage["prompt_tokens"].as_u64().expect("prompt_tokens");
    assert!(prompt > 10, "{usage}");
    assert!(
        (1..=12).contains(&completion) || choice["finish_reason"] == "stop",
        "{usage}"
    );
    assert_eq!(usage["total_tokens"].as_u64(), Some(prompt + completion));
    match choice["finish_reason"].as_str() {
        Some("length") => assert_eq!(completion, 12),
        Some("stop") => assert!(completion < 12),
        other => panic!("finish_reason {other:?}"),
    }
    // Greedy decoding gives the same answer again; the alias names the same model, and the
    // second run reuses the cached prompt.
    let mut again = greedy(12);
    again["model"] = json!("TINY-ALIAS");
    let (status, body2) = post(&server, "/v1/chat/completions", &again).await;
    assert_eq!(status, StatusCode::OK, "{body2}");
    assert_eq!(
        body2["choices"][0]["message"]["content"].as_str(),
        Some(content)
    );
    assert_eq!(
        body2["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(),
        Some(prompt - 1)
    );
    assert_ne!(body2["id"], body["id"]);

    // max_completion_tokens wins over max_tokens.
    let mut capped = greedy(12);
    capped["max_completion_tokens"] = json!(3);
    let (_, body3) = post(&server, "/v1/chat/completions", &capped).await;
    assert!(
        body3["usage"]["completion_tokens"]
            .as_u64()
            .is_some_and(|n| n <= 3),
        "{body3}"
    );

    let m = server.state.metrics();
    assert_eq!(m.chat_completions, 3);
    assert_eq!(m.active_generations, 0);
    assert_eq!(m.cancelled_generations, 0);
    assert!(m.completion_tokens >= completion * 2);
    server.stop().await;
}

#[tokio::test]
async fn streaming_sends_role_text_finish_usage_and_done() {
    let (server, _dir) = tiny_server(ApiConfig::default()).await;
    let (_, whole) = post(&server, "/v1/chat/completions", &greedy(16)).await;
    let expected = whole["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_owned();

    let mut req = greedy(16);
    req["stream"] = json!(true);
    req["stream_options"] = json!({"include_usage": true});
    let chunks = stream_chunks(&server, &req).await;
    assert!(chunks.len() >= 3, "{chunks:?}");
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["id"], chunks[0]["id"]);
        assert!(
            c.get("usage").is_some(),
            "usage key present when include_usage: {c}"
        );
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let usage_chunk = &chunks[chunks.len() - 1];
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(
        usage_chunk["usage"]["completion_tokens"],
        whole["usage"]["completion_tokens"]
    );
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(
        finish["choices"][0]["finish_reason"],
        whole["choices"][0]["finish_reason"]
    );
    let mut text = String::new();
    for c in &chunks[1..chunks.len() - 2] {
        assert!(c["choices"][0]["finish_reason"].is_null());
        text.push_str(
            c["choices"][0]["delta"]["content"]
                .as_str()
                .expect("delta content"),
        );
    }
    assert_eq!(text, expected);

    // Without include_usage: no usage chunk, no usage key.
    let mut plain = greedy(4);
    plain["stream"] = json!(true);
    let resp = client()
        .post(server.url("/v1/chat/completions"))
        .json(&plain)
        .send()
        .await
        .expect("send");
    let events = SseReader::new(resp).collect().await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let last: Value = serde_json::from_str(&events[events.len() - 2]).expect("json");
    assert!(last["choices"][0]["finish_reason"].is_string(), "{last}");
    assert!(last.get("usage").is_none(), "{last}");
    server.stop().await;
}

#[tokio::test]
async fn models_are_listed_and_found_by_id_or_alias() {
    let (server, _dir) = tiny_server(ApiConfig::default()).await;
    let list: Value = client()
        .get(server.url("/v1/models"))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(list["object"], "list");
    let data = list["data"].as_array().expect("data");
    assert_eq!(data.len(), 1, "{list}");
    assert_eq!(data[0]["id"], "tiny");
    assert_eq!(data[0]["object"], "model");
    assert_eq!(data[0]["owned_by"], "starling");
    assert_eq!(data[0]["context_length"], 256);
    assert!(data[0]["created"]
        .as_u64()
        .is_some_and(|c| c > 1_600_000_000));

    for id in ["tiny", "tiny-alias"] {
        let resp = client()
            .get(server.url(&format!("/v1/models/{id}")))
            .send()
            .await
            .expect("send");
        assert_eq!(resp.status(), StatusCode::OK);
        let m: Value = resp.json().await.expect("json");
        assert_eq!(m["id"], "tiny");
    }
    let resp = client()
        .get(server.url("/v1/models/org/gpt-9"))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(error_of(&body)["code"], "model_not_found");

    let health: Value = client()
        .get(server.url("/health"))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(health["status"], "ok");
    assert_eq!(health["chat_model"], "tiny");
    assert!(health["embedding_model"].is_null());
    assert!(health["metrics"]["http_requests"]
        .as_u64()
        .is_some_and(|n| n >= 4));
    server.stop().await;
}

#[tokio::test]
async fn invalid_requests_get_openai_errors_with_the_right_status() {
    let (server, _dir) = tiny_server(ApiConfig {
        max_body_bytes: 64 * 1024,
        ..ApiConfig::default()
    })
    .await;
    let c = client();
    let chat = server.url("/v1/chat/completions");
    let raw = |body: &'static str| {
        c.post(&chat)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };

    let cases: Vec<(Value, u16, Option<&str>)> = vec![
        (json!({"model": "tiny"}), 400, Some("messages")),
        (json!({"messages": []}), 400, Some("messages")),
        (json!({"messages": "hi"}), 400, Some("messages")),
        (
            json!({"messages": [{"role": "user", "content": "hi"}], "n": 9}),
            400,
            Some("n"),
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi"}], "temperature": -1}),
            400,
            Some("temperature"),
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}),
            400,
            Some("temperature"),
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}),
            400,
            Some("max_tokens"),
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}),
            400,
            Some("max_tokens"),
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi"}], "stop": {"a": 1}}),
            400,
            Some("stop"),
        ),
        (
            json!({"messages": [{"role": "user", "content": 7}]}),
            400,
            Some("messages[0].content"),
        ),
        (
            json!({"messages": [{"role": "<|im_start|>", "content": "x"}]}),
            400,
            Some("messages[0].role"),
        ),
        (
            json!({"messages": [{"role": "function", "content": "x"}]}),
            400,
            Some("messages[0].role"),
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}),
            400,
            Some("tools[0]"),
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi"}], "model": "gpt-4o"}),
            404,
            Some("model"),
        ),
    ];
    for (body, status, param) in cases {
        let (got, resp) = post(&server, "/v1/chat/completions", &body).await;
        assert_eq!(got.as_u16(), status, "{body} -> {resp}");
        let err = error_of(&resp);
        assert_eq!(err["param"].as_str(), param, "{body} -> {resp}");
    }

    // A prompt longer than the context window.
    let long = "the ".repeat(400);
    let (status, resp) = post(
        &server,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": long}]}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{resp}");
    assert_eq!(error_of(&resp)["code"], "context_length_exceeded");

    // Not JSON, truncated JSON, trailing garbage, deep nesting, invalid UTF-8.
    for body in [
        "{",
        "not json",
        "{\"messages\": [] } x",
        "null",
        "[]",
        "\"s\"",
    ] {
        let resp = raw(body).await.expect("send");
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{body}");
        error_of(&resp.json().await.expect("json"));
    }
    let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    let resp = c
        .post(&chat)
        .header("content-type", "application/json")
        .body(deep)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let resp = c
        .post(&chat)
        .header("content-type", "application/json")
        .body(b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}".to_vec())
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);

    // Wrong content type, body too large, unknown route, wrong method.
    let resp = c
        .post(&chat)
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    error_of(&resp.json().await.expect("json"));
    let big = json!({"messages": [{"role": "user", "content": "x".repeat(100 * 1024)}]});
    let (status, resp) = post(&server, "/v1/chat/completions", &big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{resp}");
    assert_eq!(error_of(&resp)["code"], "request_too_large");
    let resp = c.get(server.url("/v1/nothing")).send().await.expect("send");
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    error_of(&resp.json().await.expect("json"));
    let resp = c.get(&chat).send().await.expect("send");
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
    error_of(&resp.json().await.expect("json"));

    // No embedding model here: 503, after the request itself was found valid.
    let (status, resp) = post(&server, "/v1/embeddings", &json!({"input": "hi"})).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(error_of(&resp)["code"], "model_not_loaded");
    let (status, _) = post(&server, "/v1/embeddings", &json!({"input": 5})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // A request addressed to another host name (DNS rebinding) is refused.
    let resp = c
        .get(server.url("/v1/models"))
        .header("host", "evil.example:80")
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);

    // None of that hurt the server.
    let (status, _) = post(&server, "/v1/chat/completions", &greedy(2)).await;
    assert_eq!(status, StatusCode::OK);
    let m = server.state.metrics();
    // The only 5xx is the deliberate 503 of the embeddings request without a model.
    assert_eq!(m.server_errors, 1, "{m:?}");
    assert!(m.client_errors >= 25, "{m:?}");
    server.stop().await;
}

#[tokio::test]
async fn garbage_on_the_socket_never_takes_the_server_down() {
    let (server, _dir) = tiny_server(ApiConfig::default()).await;
    let garbage: [&[u8]; 5] = [
        b"\x00\x01\x02\xff\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 99999999999999999999\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n{\"mess",
    ];
    for bytes in garbage {
        let mut s = tokio::net::TcpStream::connect(server.addr)
            .await
            .expect("connect");
        s.write_all(bytes).await.expect("write");
        let _ = s.shutdown().await;
        let mut reply = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut reply)).await;
        assert!(read.is_ok(), "server answers or closes within 10 s");
        let reply = String::from_utf8_lossy(&reply);
        assert!(!reply.starts_with("HTTP/1.1 5"), "{reply}");
    }
    let (status, _) = post(&server, "/v1/chat/completions", &greedy(2)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(server.state.metrics().server_errors, 0);
    server.stop().await;
}

#[tokio::test]
async fn dropped_stream_cancels_and_admission_is_bounded() {
    let (server, _dir) = tiny_server(ApiConfig {
        max_inflight: 1,
        ..ApiConfig::default()
    })
    .await;
    let mut req = greedy(200);
    req["stream"] = json!(true);
    let resp = client()
        .post(server.url("/v1/chat/completions"))
        .json(&req)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::OK);
    let mut events = SseReader::new(resp);
    let first: Value =
        serde_json::from_str(&events.next().await.expect("first event")).expect("json");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(server.state.metrics().active_generations, 1);

    // The one admission slot is taken: a second request is told to come back later.
    let (status, body) = post(&server, "/v1/chat/completions", &greedy(2)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(error_of(&body)["code"], "server_busy");

    // The client goes away mid-stream: the generation is dropped and its slot freed.
    drop(events);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while server.state.metrics().active_generations != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "generation still active after disconnect"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(server.state.metrics().cancelled_generations, 1);
    let (status, body) = post(&server, "/v1/chat/completions", &greedy(2)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    server.stop().await;
}

#[tokio::test]
async fn shutdown_ends_open_streams_and_returns() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A larger context so the stream is still running when the server is stopped.
    let path = write_tiny_llama(dir.path(), "tiny-long", 8192);
    let engine = Engine::load(
        &path,
        &EngineConfig {
            max_seq_len: 8192,
            ..EngineConfig::default()
        },
    )
    .expect("load");
    let server =
        Server::start(AppState::new(ApiConfig::default()).with_chat_model(ModelSlot::new(engine)))
            .await;
    let mut req = greedy(8000);
    req["model"] = json!("tiny-long");
    req["stream"] = json!(true);
    req["temperature"] = json!(1.0);
    let resp = client()
        .post(server.url("/v1/chat/completions"))
        .json(&req)
        .send()
        .await
        .expect("send");
    let mut events = SseReader::new(resp);
    for _ in 0..3 {
        events.next().await.expect("event");
    }
    let state = server.state.clone();
    // Keep reading while the server stops, as a live client would.
    let reader = tokio::spawn(events.collect());
    let started = tokio::time::Instant::now();
    server.stop().await;
    assert!(started.elapsed() < Duration::from_secs(20));
    let rest = reader.await.expect("reader");
    assert_eq!(rest.last().map(String::as_str), Some("[DONE]"), "{rest:?}");
    // Unless the random model ended its turn first, the stream was cut with an error event.
    let finished = rest
        .iter()
        .any(|e| e.contains("\"finish_reason\":\"stop\""));
    if !finished {
        let err: Value = serde_json::from_str(&rest[rest.len() - 2]).expect("json");
        assert_eq!(err["error"]["code"], "shutting_down", "{rest:?}");
        assert_eq!(state.metrics().cancelled_generations, 1);
    }
}

#[tokio::test]
async fn a_state_without_models_answers_503_and_lists_nothing() {
    let server = Server::start(AppState::new(ApiConfig::default())).await;
    let (status, body) = post(&server, "/v1/chat/completions", &greedy(2)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(error_of(&body)["code"], "model_not_loaded");
    let list: Value = client()
        .get(server.url("/v1/models"))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(list["data"], json!([]));

    // A model set while running is served at once.
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = Engine::load(
        &write_tiny_llama(dir.path(), "late", 256),
        &EngineConfig::default(),
    )
    .expect("load");
    server
        .state
        .set_chat_model(Some(ModelSlot::new(engine)), Vec::new());
    let mut req = greedy(2);
    req["model"] = json!("late");
    let (status, body) = post(&server, "/v1/chat/completions", &req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["model"], "late");
    server.stop().await;
}

#[tokio::test]
async fn response_format_constrains_the_output() {
    let (server, _dir) = tiny_server(ApiConfig::default()).await;
    let schema = json!({
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": false,
    });
    let mut req = greedy(64);
    req["temperature"] = json!(1.0);
    req["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": true}});
    for seed in 0..3 {
        req["seed"] = json!(seed);
        let (status, body) = post(&server, "/v1/chat/completions", &req).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let content = body["choices"][0]["message"]["content"]
            .as_str()
            .expect("content");
        // Random weights, yet the output is exactly the schema's shape.
        let parsed: Value =
            serde_json::from_str(content).unwrap_or_else(|e| panic!("{content:?}: {e}"));
        assert!(parsed["ok"].is_boolean(), "{parsed}");
        assert_eq!(parsed.as_object().map(|o| o.len()), Some(1), "{parsed}");
        assert_eq!(body["choices"][0]["finish_reason"], "stop", "{body}");
    }

    let mut object = greedy(64);
    object["temperature"] = json!(1.0);
    object["response_format"] = json!({"type": "json_object"});
    let (status, body) = post(&server, "/v1/chat/completions", &object).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let content = body["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    if body["choices"][0]["finish_reason"] == "stop" {
        let parsed: Value =
            serde_json::from_str(content).unwrap_or_else(|e| panic!("{content:?}: {e}"));
        assert!(parsed.is_object(), "{parsed}");
    } else {
        assert!(content.starts_with('{'), "{content:?}");
    }

    let mut bad = greedy(8);
    bad["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}});
    let (status, body) = post(&server, "/v1/chat/completions", &bad).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(error_of(&body)["param"], "response_format");
    server.stop().await;
}

/// Two tools with small argument spaces, so random weights finish a call in a few tokens.
fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {"type": "object",
                           "properties": {"city": {"type": "string", "maxLength": 8}},
                           "required": ["city"], "additionalProperties": false}}},
        {"type": "function", "function": {
            "name": "count",
            "parameters": {"type": "object",
                           "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
                           "required": ["n"], "additionalProperties": false}}}
    ])
}

/// Checks one OpenAI tool call: a known tool, arguments that parse and fit its schema.
fn check_call(call: &Value, only: Option<&str>) {
    assert_eq!(call["type"], "function", "{call}");
    assert!(
        call["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("call_")),
        "{call}"
    );
    let name = call["function"]["name"].as_str().expect("name");
    if let Some(only) = only {
        assert_eq!(name, only, "{call}");
    }
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().expect("args"))
        .unwrap_or_else(|e| panic!("{call}: arguments are not JSON: {e}"));
    match name {
        "get_weather" => {
            let city = args["city"].as_str().expect("city is a string");
            assert!(city.chars().count() <= 8, "{args}");
            assert_eq!(args.as_object().map(|o| o.len()), Some(1), "{args}");
        }
        "count" => {
            let n = args["n"].as_i64().expect("n is an integer");
            assert!((0..=99).contains(&n), "{args}");
        }
        other => panic!("unknown tool {other}"),
    }
}

#[tokio::test]
async fn tool_calls_parse_and_validate_whole_and_streamed() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The tool list takes room in the prompt: a longer context than the other tests.
    let engine = tiny_engine(dir.path(), 4096);
    assert_eq!(engine.tool_format(), None, "ChatML has no tool format");
    let server = serve_engine(engine).await;
    check_tool_calls(&server, 8).await;
    server.stop().await;
}

#[tokio::test]
async fn auto_calls_the_tool_the_embedding_model_finds_closest_to_the_question() {
    use starling_models::embed::{BertEmbedder, EmbedError, EmbedHandle, Embedder};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    /// The real embedder, counting the batches it is asked to embed.
    struct Counted(BertEmbedder, Arc<AtomicUsize>);
    impl Embedder for Counted {
        fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
            self.1.fetch_add(1, Ordering::SeqCst);
            self.0.embed(texts)
        }
        fn dim(&self) -> usize {
            self.0.dim()
        }
        fn max_len(&self) -> usize {
            self.0.max_len()
        }
        fn model_id(&self) -> &str {
            self.0.model_id()
        }
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = tiny_engine(dir.path(), 4096);
    let batches = Arc::new(AtomicUsize::new(0));
    let embedder = EmbedHandle::spawn(Counted(
        BertEmbedder::load(starling_models::testing::embedding_model()).expect("embedder"),
        batches.clone(),
    ))
    .expect("embedder thread");
    let state = AppState::new(ApiConfig::default())
        .with_chat_model_named(ModelSlot::new(engine), vec![])
        .with_embedder(embedder);
    let server = Server::start(state).await;
    let ask = |question: &str| {
        json!({
            "model": "tiny",
            "messages": [{"role": "user", "content": question}],
            "tools": weather_tools(),
            "tool_choice": "auto",
            "parallel_tool_calls": false,
            "max_tokens": 200,
            "temperature": 1.0,
            "seed": 0,
        })
    };
    // The router (on by default) calls get_weather for a weather question, whatever the
    // random-weight model would have chosen; its arguments fit the schema.
    for q in [
        "What is the weather in Paris?",
        "Is it raining in Oslo right now?",
    ] {
        let (status, body) = post(&server, "/v1/chat/completions", &ask(q)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let choice = &body["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{q}: {body}");
        let calls = choice["message"]["tool_calls"]
            .as_array()
            .expect("tool_calls");
        calls
            .iter()
            .for_each(|c| check_call(c, Some("get_weather")));
    }
    // Decided once per request (one batch embedded for two answers): with parallel calls
    // allowed, each answer makes exactly the one routed call. `required` is routed the same
    // way.
    for choice in ["auto", "required"] {
        let before = batches.load(Ordering::SeqCst);
        let mut body = ask("What is the weather in Paris?");
        body["tool_choice"] = json!(choice);
        body["n"] = json!(2);
        body.as_object_mut()
            .expect("an object")
            .remove("parallel_tool_calls");
        let (status, body) = post(&server, "/v1/chat/completions", &body).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let choices = body["choices"].as_array().expect("choices");
        assert_eq!(choices.len(), 2, "{body}");
        for c in choices {
            assert_eq!(c["finish_reason"], "tool_calls", "{choice}: {body}");
            let calls = c["message"]["tool_calls"].as_array().expect("tool_calls");
            assert_eq!(calls.len(), 1, "{choice}: one routed call: {body}");
            check_call(&calls[0], Some("get_weather"));
        }
        assert_eq!(
            batches.load(Ordering::SeqCst) - before,
            1,
            "{choice}: one decision"
        );
    }
    server.stop().await;
}

/// The conversation with a call and its result that [`check_tool_calls`] continues.
fn tool_history() -> Value {
    json!([
        {"role": "user", "content": "weather in Oslo?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "4 degrees, rain"},
    ])
}

/// A model whose chat template has a tool format of its own writes calls in it: the
/// template is given the tools and the history's calls and results (the prompt is exactly
/// the template's rendering of them), and the calls come back parsed and valid.
#[tokio::test]
async fn tool_calls_use_the_chat_templates_own_format() {
    use starling_models::chat::ToolFormat;
    use starling_models::engine::Prompt;
    use starling_models::testing::{TinyArch, HERMES_TOOLS_TEMPLATE, LLAMA3_TOOLS_TEMPLATE};
    let dir = tempfile::tempdir().expect("tempdir");
    for (arch, template, format, most) in [
        (
            TinyArch::Qwen2,
            HERMES_TOOLS_TEMPLATE,
            ToolFormat::Hermes,
            8,
        ),
        (
            TinyArch::Llama3,
            LLAMA3_TOOLS_TEMPLATE,
            ToolFormat::Llama3Json,
            1,
        ),
    ] {
        let sub = dir.path().join(arch.name());
        std::fs::create_dir_all(&sub).expect("model dir");
        let path = api_support::write_tiny_templated(&sub, "tiny", arch, 4096, template);
        let engine = Engine::load(&path, &EngineConfig::default()).expect("load tiny model");
        assert_eq!(engine.tool_format(), Some(format));
        // The prompt of a conversation with a call and its result, as the template renders
        // it with the tools (the request's tools in OpenAI's shape, a missing description
        // as empty).
        let mut tools = weather_tools();
        tools[1]["function"]["description"] = json!("");
        let history =
            starling_models::testing::weather_call_history("weather in Oslo?", "4 degrees, rain");
        let expected = engine
            .prompt_tokens(&Prompt::ChatWithTools(history, tools))
            .expect("prompt")
            .len();
        let server = serve_engine(engine).await;
        let mut follow = greedy(4);
        follow["tools"] = weather_tools();
        follow["messages"] = tool_history();
        let (status, body) = post(&server, "/v1/chat/completions", &follow).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            body["usage"]["prompt_tokens"], expected,
            "{format:?}: {body}"
        );
        check_tool_calls(&server, most).await;
        server.stop().await;
    }
}

/// Tool calls on `server` (serving a tiny model, 4096 tokens of context): with `required`
/// and a named tool always calls, with `auto` calls or a plain answer, streamed as one
/// `tool_calls` delta, at most `most` calls in one answer; every call parses and its
/// arguments validate. A conversation with a call and its result goes on to an answer, and
/// mistakes are named.
async fn check_tool_calls(server: &Server, most: usize) {
    let mut req = greedy(200);
    req["temperature"] = json!(1.0);
    req["tools"] = weather_tools();

    // `required` and a named tool: always a call, whatever the (random) weights say.
    for (choice, only) in [
        (json!("required"), None),
        (
            json!({"type": "function", "function": {"name": "count"}}),
            Some("count"),
        ),
    ] {
        req["tool_choice"] = choice;
        for seed in 0..3 {
            req["seed"] = json!(seed);
            let (status, body) = post(server, "/v1/chat/completions", &req).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            let choice = &body["choices"][0];
            assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
            assert!(choice["message"]["content"].is_null(), "{body}");
            let calls = choice["message"]["tool_calls"]
                .as_array()
                .expect("tool_calls");
            assert!((1..=most).contains(&calls.len()), "{body}");
            calls.iter().for_each(|c| check_call(c, only));
        }
    }

    // `auto`: either a plain answer or valid calls.
    req["tool_choice"] = json!("auto");
    req["parallel_tool_calls"] = json!(false);
    for seed in 0..4 {
        req["seed"] = json!(seed);
        let (status, body) = post(server, "/v1/chat/completions", &req).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let choice = &body["choices"][0];
        if choice["finish_reason"] == "tool_calls" {
            let calls = choice["message"]["tool_calls"]
                .as_array()
                .expect("tool_calls");
            assert_eq!(calls.len(), 1, "parallel_tool_calls is false: {body}");
            check_call(&calls[0], None);
        } else {
            let text = choice["message"]["content"].as_str().expect("content");
            assert!(!text.trim_start().starts_with(['{', '<']), "{body}");
        }
    }

    // Streamed: role, one tool_calls delta, the finish chunk, [DONE].
    req["tool_choice"] = json!("required");
    req["stream"] = json!(true);
    let chunks = stream_chunks(server, &req).await;
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .collect();
    assert!(!deltas.is_empty(), "{chunks:?}");
    deltas.iter().for_each(|c| check_call(c, None));
    assert!(
        chunks.iter().all(|c| c["choices"][0]["delta"]["content"]
            .as_str()
            .is_none_or(str::is_empty)),
        "{chunks:?}"
    );
    assert_eq!(
        chunks.last().expect("chunks")["choices"][0]["finish_reason"],
        "tool_calls"
    );

    // A conversation that carries a call and its result goes on to an answer.
    let mut follow = greedy(16);
    follow["tools"] = weather_tools();
    follow["messages"] = tool_history();
    follow["tool_choice"] = json!("none");
    let (status, body) = post(server, "/v1/chat/completions", &follow).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        body["choices"][0]["message"]["content"].is_string(),
        "{body}"
    );

    // Mistakes are named.
    for (patch, param) in [
        (
            json!({"tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice.function.name",
        ),
        (
            json!({"response_format": {"type": "json_object"}}),
            "response_format",
        ),
    ] {
        let mut bad = greedy(8);
        bad["tools"] = weather_tools();
        for (k, v) in patch.as_object().expect("patch") {
            bad[k] = v.clone();
        }
        let (status, body) = post(server, "/v1/chat/completions", &bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(error_of(&body)["param"], param, "{body}");
    }
    let mut bad_args = follow.clone();
    bad_args["messages"][1]["tool_calls"][0]["function"]["arguments"] = json!("{not json");
    let (status, body) = post(server, "/v1/chat/completions", &bad_args).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}

#[tokio::test]
async fn ollama_chat_streams_ndjson_that_adds_up_to_the_whole_answer() {
    let (server, _dir) = tiny_server(ApiConfig::default()).await;
    let req = json!({
        "model": "tiny:latest",
        "messages": [{"role": "user", "content": "hello there"}],
        "options": {"temperature": 0, "num_predict": 12, "seed": 1},
        "stream": false,
    });
    let (status, whole) = post(&server, "/api/chat", &req).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    assert_eq!(whole["done"], true);
    assert_eq!(whole["message"]["role"], "assistant");
    let eval_count = whole["eval_count"].as_u64().expect("eval_count");
    assert!(eval_count > 0 && eval_count <= 12);
    assert!(whole["prompt_eval_count"].as_u64().expect("prompt count") > 0);

    let mut streamed = req.clone();
    streamed["stream"] = json!(true);
    let resp = client()
        .post(server.url("/api/chat"))
        .json(&streamed)
        .send()
        .await
        .expect("send");
    assert_eq!(
        resp.headers()["content-type"].to_str().expect("ascii"),
        "application/x-ndjson"
    );
    let body = resp.text().await.expect("body");
    let lines: Vec<Value> = body
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    let (last, pieces) = lines.split_last().expect("lines");
    assert!(pieces.iter().all(|l| l["done"] == false));
    assert_eq!(last["done"], true);
    assert_eq!(last["eval_count"].as_u64(), Some(eval_count));
    let text: String = lines
        .iter()
        .filter_map(|l| l["message"]["content"].as_str())
        .collect();
    assert_eq!(text, whole["message"]["content"].as_str().expect("content"));

    // Ollama's error shape: a plain string, with the status.
    let mut unknown = req.clone();
    unknown["model"] = json!("no-such-model");
    let (status, err) = post(&server, "/api/chat", &unknown).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(err["error"]
        .as_str()
        .expect("string")
        .contains("no-such-model"));
    let (status, tags) = get_json(&server, "/api/tags").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(tags["models"][0]["name"], "tiny:latest");
}

async fn get_json(server: &Server, path: &str) -> (StatusCode, Value) {
    let resp = client().get(server.url(path)).send().await.expect("send");
    let status = resp.status();
    (status, resp.json().await.expect("JSON body"))
}

/// Posts a streamed request and returns its events' JSON (without a final `[DONE]`, if
/// any).
async fn stream_events(server: &Server, path: &str, req: &Value) -> Vec<Value> {
    let resp = client()
        .post(server.url(path))
        .json(req)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::OK);
    SseReader::new(resp)
        .collect()
        .await
        .iter()
        .filter(|e| e.as_str() != "[DONE]")
        .map(|e| serde_json::from_str(e).expect("event JSON"))
        .collect()
}

/// The legacy `token_logprobs` of a text completion's first choice.
fn token_logprobs(body: &Value, choice: usize) -> Vec<Value> {
    body["choices"][choice]["logprobs"]["token_logprobs"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| panic!("no logprobs: {body}"))
}

#[tokio::test]
async fn token_id_prompts_are_the_models_input_as_given_and_max_tokens_zero_only_scores() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = tiny_engine(dir.path(), 256);
    let server = serve_engine(engine.clone()).await;
    let tokenizer = engine.tokenizer();
    let text = "hello there, small friend";
    // What the model reads for this text: BOS (when the model adds one), then its tokens.
    let bos: Vec<u32> = tokenizer
        .bos_id()
        .filter(|_| tokenizer.add_bos())
        .into_iter()
        .collect();
    let mut ids = bos.clone();
    ids.extend(tokenizer.encode(text, false).expect("encode"));
    assert!(ids.len() > 4, "{ids:?}");

    // Scored only (`max_tokens: 0`): the same log-probabilities as the text gives.
    let score = |prompt: Value| json!({"model": "tiny", "prompt": prompt, "max_tokens": 0, "echo": true, "logprobs": 1});
    let (status, by_text) = post(&server, "/v1/completions", &score(json!(text))).await;
    assert_eq!(status, StatusCode::OK, "{by_text}");
    let (status, by_ids) = post(&server, "/v1/completions", &score(json!(ids))).await;
    assert_eq!(status, StatusCode::OK, "{by_ids}");
    for body in [&by_text, &by_ids] {
        let c = &body["choices"][0];
        assert_eq!(c["finish_reason"], "length", "{body}");
        assert_eq!(body["usage"]["completion_tokens"], 0, "{body}");
        assert_eq!(body["usage"]["prompt_tokens"], ids.len(), "{body}");
        let tokens: String = c["logprobs"]["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(c["text"].as_str(), Some(tokens.as_str()), "{body}");
    }
    let (t, i) = (token_logprobs(&by_text, 0), token_logprobs(&by_ids, 0));
    // The ids' first token has nothing before it; the text's BOS (if any) is not echoed.
    assert!(i[0].is_null(), "{by_ids}");
    assert_eq!(i[bos.len()..], t[..], "ids score as their text");
    assert!(i[1..].iter().all(|v| v.as_f64().is_some_and(|v| v <= 0.0)));

    // A batch of id prompts: one choice per prompt, in order, each scored on its own.
    let short = ids[..3].to_vec();
    let (status, batch) = post(&server, "/v1/completions", &score(json!([ids, short]))).await;
    assert_eq!(status, StatusCode::OK, "{batch}");
    let indices: Vec<&Value> = batch["choices"]
        .as_array()
        .expect("choices")
        .iter()
        .map(|c| &c["index"])
        .collect();
    assert_eq!(indices, [0, 1], "{batch}");
    assert_eq!(token_logprobs(&batch, 0), i);
    assert_eq!(
        token_logprobs(&batch, 1),
        i[..3],
        "a prefix scores as in the whole"
    );
    assert_eq!(batch["usage"]["prompt_tokens"], ids.len() + 3);

    // Generation from ids continues exactly what the text gives (greedy).
    let generate = |prompt: Value| json!({"model": "tiny", "prompt": prompt, "max_tokens": 6, "temperature": 0});
    let (_, from_text) = post(&server, "/v1/completions", &generate(json!(text))).await;
    let (status, from_ids) = post(&server, "/v1/completions", &generate(json!(ids))).await;
    assert_eq!(status, StatusCode::OK, "{from_ids}");
    assert_eq!(
        from_ids["choices"][0]["text"],
        from_text["choices"][0]["text"]
    );
    for count in ["prompt_tokens", "completion_tokens"] {
        assert_eq!(from_ids["usage"][count], from_text["usage"][count]);
    }
    // Several text prompts, n answers each: index = prompt × n + answer.
    let mut two = generate(json!([text, "other words"]));
    two["n"] = json!(2);
    let (status, body) = post(&server, "/v1/completions", &two).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let choices = body["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 4);
    assert_eq!(choices[0]["text"], from_text["choices"][0]["text"]);
    assert_eq!(
        choices[1]["text"], from_text["choices"][0]["text"],
        "greedy"
    );

    // Streamed, scored only: the echoed prompt, then the end.
    let mut streamed = score(json!(ids));
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let events = stream_events(&server, "/v1/completions", &streamed).await;
    assert_eq!(events.len(), 3, "{events:?}");
    assert_eq!(
        events[0]["choices"][0]["logprobs"]["token_logprobs"],
        json!(i)
    );
    assert_eq!(events[1]["choices"][0]["finish_reason"], "length");
    assert_eq!(events[2]["usage"]["prompt_tokens"], ids.len());

    // Refused, by name.
    let vocab = 1_000_000_u32;
    for (body, param) in [
        (score(json!([1, vocab])), None),
        (score(json!([[1], []])), Some("prompt")),
        (
            json!({"prompt": ["a", "b"], "stream": true}),
            Some("prompt"),
        ),
        (json!({"prompt": [1, -2]}), Some("prompt")),
    ] {
        let (status, resp) = post(&server, "/v1/completions", &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} → {resp}");
        if let Some(param) = param {
            assert_eq!(error_of(&resp)["param"], param, "{resp}");
        }
        assert!(
            error_of(&resp)["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{resp}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn responses_answer_as_chat_does_whole_streamed_and_with_valid_function_calls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = serve_engine(tiny_engine(dir.path(), 4096)).await;

    // The same answer as a chat completion of the same conversation.
    let req = json!({"model": "tiny", "instructions": "You are tiny.", "input": "hello there",
                     "max_output_tokens": 12, "temperature": 0});
    let (status, whole) = post(&server, "/v1/responses", &req).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let (_, chat) = post(&server, "/v1/chat/completions", &greedy(12)).await;
    assert_eq!(whole["object"], "response");
    assert!(whole["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("resp_")));
    let item = &whole["output"][0];
    assert_eq!(
        (&item["type"], &item["role"]),
        (&json!("message"), &json!("assistant"))
    );
    let text = item["content"][0]["text"].as_str().expect("output_text");
    assert_eq!(
        Some(text),
        chat["choices"][0]["message"]["content"].as_str()
    );
    let incomplete = chat["choices"][0]["finish_reason"] == "length";
    assert_eq!(
        whole["status"],
        if incomplete {
            "incomplete"
        } else {
            "completed"
        }
    );
    assert_eq!(
        whole["usage"]["input_tokens"],
        chat["usage"]["prompt_tokens"]
    );
    assert_eq!(
        whole["usage"]["output_tokens"],
        chat["usage"]["completion_tokens"]
    );

    // Streamed: typed events in order, deltas adding up to the same text.
    let mut streamed = req.clone();
    streamed["stream"] = json!(true);
    let events = stream_events(&server, "/v1/responses", &streamed).await;
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(kinds.first(), Some(&"response.created"), "{kinds:?}");
    let end = if incomplete {
        "response.incomplete"
    } else {
        "response.completed"
    };
    assert_eq!(kinds.last(), Some(&end), "{kinds:?}");
    let seq: Vec<u64> = events
        .iter()
        .filter_map(|e| e["sequence_number"].as_u64())
        .collect();
    assert_eq!(seq, (0..events.len() as u64).collect::<Vec<_>>());
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .filter_map(|e| e["delta"].as_str())
        .collect();
    assert_eq!(deltas, text);
    let last = &events[events.len() - 1]["response"];
    assert_eq!(last["output"][0]["content"][0]["text"], text);

    // Function tools: every call parses and fits its schema, whole and streamed.
    let tools: Vec<Value> = weather_tools()
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| {
            let mut flat = t["function"].clone();
            flat["type"] = json!("function");
            flat
        })
        .collect();
    let check = |item: &Value| {
        assert_eq!(item["type"], "function_call", "{item}");
        let call = json!({"type": "function", "id": item["call_id"],
                          "function": {"name": item["name"], "arguments": item["arguments"]}});
        check_call(&call, None);
    };
    let mut calling = json!({"model": "tiny", "input": "weather?", "max_output_tokens": 200,
                             "temperature": 1.0, "tools": tools, "tool_choice": "required",
                             "parallel_tool_calls": false});
    let (status, body) = post(&server, "/v1/responses", &calling).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let items = body["output"].as_array().expect("output");
    assert!(!items.is_empty(), "{body}");
    items.iter().for_each(check);
    calling["stream"] = json!(true);
    let events = stream_events(&server, "/v1/responses", &calling).await;
    let done = &events[events.len() - 1];
    assert_eq!(done["type"], "response.completed", "{done}");
    done["response"]["output"]
        .as_array()
        .expect("output")
        .iter()
        .for_each(check);
    // The call and its output, sent back, give an answer.
    let call = &items[0];
    let follow = json!({"model": "tiny", "max_output_tokens": 8, "tools": tools, "tool_choice": "none",
        "input": [{"role": "user", "content": "weather?"},
                  {"type": "function_call", "call_id": call["call_id"], "name": call["name"], "arguments": call["arguments"]},
                  {"type": "function_call_output", "call_id": call["call_id"], "output": "4 degrees"}]});
    let (status, body) = post(&server, "/v1/responses", &follow).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["output"][0]["type"], "message", "{body}");

    // A JSON Schema format is obeyed.
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}},
                        "required": ["ok"], "additionalProperties": false});
    let formatted = json!({"model": "tiny", "input": "ok?", "max_output_tokens": 64, "temperature": 1.0,
                           "text": {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": true}}});
    let (status, body) = post(&server, "/v1/responses", &formatted).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let out: Value = serde_json::from_str(
        body["output"][0]["content"][0]["text"]
            .as_str()
            .expect("text"),
    )
    .unwrap_or_else(|e| panic!("{body}: {e}"));
    assert!(out["ok"].is_boolean(), "{out}");

    // What needs stored state, or a field of this API's own, is refused by name.
    for (patch, param) in [
        (
            json!({"previous_response_id": "resp_1"}),
            "previous_response_id",
        ),
        (json!({"max_output_tokens": 0}), "max_output_tokens"),
        (json!({"temperature": 5}), "temperature"),
        (json!({"tools": [{"type": "web_search"}]}), "tools[0].type"),
        (
            json!({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}}}),
            "text.format",
        ),
    ] {
        let mut bad = req.clone();
        for (k, v) in patch.as_object().expect("patch") {
            bad[k] = v.clone();
        }
        let (status, body) = post(&server, "/v1/responses", &bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad} → {body}");
        assert_eq!(error_of(&body)["param"], param, "{body}");
    }
    server.stop().await;
}

#[tokio::test]
async fn ollama_pull_takes_only_registry_names() {
    let (server, _dir) = tiny_server(ApiConfig::default()).await;
    for (body, status) in [
        (json!({"model": "no-such-model"}), StatusCode::NOT_FOUND),
        (json!({"model": "/etc/passwd"}), StatusCode::NOT_FOUND),
        (json!({"model": "pip:six==1.16.0"}), StatusCode::NOT_FOUND),
        (
            json!({"model": "smollm2-135m-instruct", "insecure": true}),
            StatusCode::BAD_REQUEST,
        ),
        // A registry name, but this state has no model cache to pull into.
        (
            json!({"name": "smollm2-135m-instruct:latest"}),
            StatusCode::SERVICE_UNAVAILABLE,
        ),
    ] {
        let (got, resp) = post(&server, "/api/pull", &body).await;
        assert_eq!(got, status, "{body} → {resp}");
        assert!(
            resp["error"].as_str().is_some_and(|m| !m.is_empty()),
            "{resp}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn the_chat_model_switches_at_runtime_to_files_under_the_model_directories_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let models = dir.path().join("models");
    std::fs::create_dir(&models).expect("models dir");
    let first = write_tiny_llama(&models, "first", 256);
    let second = write_tiny_llama(&models, "second", 512);
    let elsewhere = write_tiny_llama(dir.path(), "elsewhere", 256);
    let engine = Engine::load(&first, &EngineConfig::default()).expect("load tiny model");
    let switch = starling_node::api::ModelSwitch {
        dirs: vec![models.clone()],
        load: std::sync::Arc::new(|spec: &str| {
            Engine::load(std::path::Path::new(spec), &EngineConfig::default())
                .map_err(|e| e.to_string())
        }),
    };
    let state = AppState::new(ApiConfig::default())
        .with_chat_model_named(ModelSlot::new(engine), vec![])
        .with_model_switch(switch);
    let server = Server::start(state).await;
    let (status, before) = get_json(&server, "/api/models/active").await;
    assert_eq!(status, StatusCode::OK, "{before}");
    assert_eq!(before["context_length"], 256);

    let put = |spec: &std::path::Path| {
        let body = json!({"model": spec.display().to_string()});
        let url = server.url("/api/models/active");
        async move {
            let resp = client().put(url).json(&body).send().await.expect("send");
            (resp.status(), resp.json::<Value>().await.expect("JSON"))
        }
    };
    let (status, after) = put(&second).await;
    assert_eq!(status, StatusCode::OK, "{after}");
    assert_eq!(after["context_length"], 512);
    let (_, shown) = get_json(&server, "/api/models/active").await;
    assert_eq!(shown["path"], after["path"]);
    // The new model answers.
    let mut req = greedy(4);
    req["model"] = json!(after["id"]);
    let (status, body) = post(&server, "/v1/chat/completions", &req).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // A file elsewhere and a missing one get the same refusal, naming no file.
    let (status, outside) = put(&elsewhere).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{outside}");
    let (_, missing) = put(&models.join("none.gguf")).await;
    assert_eq!(error_of(&outside)["message"], error_of(&missing)["message"]);
    let (_, still) = get_json(&server, "/api/models/active").await;
    assert_eq!(
        still["context_length"], 512,
        "a refused switch changes nothing"
    );
    server.stop().await;

    // A server given no way to switch refuses with 503.
    let (server, _dir) = tiny_server(ApiConfig::default()).await;
    let resp = client()
        .put(server.url("/api/models/active"))
        .json(&json!({"model": "smollm2-135m-instruct"}))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    server.stop().await;
}
