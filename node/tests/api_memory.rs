//! Worked examples from shared memories in `/v1/chat/completions` (the `[memory] openai`
//! setting): shown when the last user message is close to a memory's prompt, named in the
//! `x-starling-memories` header, and absent for unrelated requests or when turned off.

mod api_support;

use api_support::{write_tiny_llama, Server};
use serde_json::{json, Value};
use starling_models::embed::{BertEmbedder, EmbedHandle};
use starling_models::engine::{Engine, EngineConfig, ModelSlot};
use starling_models::testing;
use starling_node::api::{ApiConfig, AppState, MemoryExamples, MEMORIES_HEADER};
use starling_node::memory::{BookConfig, Inserted, Memory, MemoryBook, DEFAULT_DOMAIN};
use starling_node::store::Store;

fn memory(id: &str, prompt: &str, answer: &str) -> Memory {
    Memory {
        id: id.into(),
        author: "peer".into(),
        domain: DEFAULT_DOMAIN.into(),
        prompt: prompt.into(),
        answer: answer.into(),
        source: None,
        score: 8.0,
        created_at: 1,
        helpful: 0,
        unhelpful: 0,
    }
}

/// (memory ids in the header, prompt tokens).
async fn ask(server: &Server, text: &str) -> (Option<String>, u64) {
    let resp = reqwest::Client::new()
        .post(server.url("/v1/chat/completions"))
        .json(&json!({
            "model": "tiny",
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 2,
            "temperature": 0,
        }))
        .send()
        .await
        .expect("send");
    let status = resp.status();
    let shown = resp
        .headers()
        .get(MEMORIES_HEADER)
        .map(|v| v.to_str().expect("ascii header").to_owned());
    let body: Value = resp.json().await.expect("JSON body");
    assert_eq!(status, 200, "{body}");
    let prompt_tokens = body["usage"]["prompt_tokens"].as_u64().expect("usage");
    (shown, prompt_tokens)
}

#[tokio::test]
async fn chat_completions_show_similar_memories_as_worked_examples() {
    let dir = tempfile::tempdir().expect("tempdir");
    let load = |context| {
        let path = write_tiny_llama(dir.path(), &format!("tiny{context}"), context);
        Engine::load(&path, &EngineConfig::default()).expect("load tiny model")
    };
    let embedder = EmbedHandle::spawn(
        BertEmbedder::load(testing::embedding_model()).expect("embedding model"),
    )
    .expect("embedder");
    let book = MemoryBook::open(
        Store::open_in_memory().expect("store"),
        Some(embedder.clone()),
        None,
        BookConfig::default(),
    )
    .await
    .expect("book");
    let added = book
        .insert(
            memory(
                "m-eggs",
                "How long should I boil an egg for a soft yolk?",
                "Six minutes, then cool it in ice water.",
            ),
            None,
        )
        .await
        .expect("insert");
    assert!(matches!(added, Inserted::Added(_)));

    let state = AppState::new(ApiConfig::default())
        .with_chat_model_named(ModelSlot::new(load(1024)), vec!["tiny".into()])
        .with_embedder(embedder);
    let server = Server::start(state.clone()).await;

    // Off by default: the request goes to the model as sent.
    let (shown, plain) = ask(&server, "How many minutes do soft boiled eggs need?").await;
    assert_eq!(shown, None);

    state.set_memory_examples(Some(MemoryExamples {
        book: book.clone(),
        k: 3,
        min_cosine: 0.6,
    }));
    let (shown, with) = ask(&server, "How many minutes do soft boiled eggs need?").await;
    assert_eq!(shown.as_deref(), Some("m-eggs"));
    assert!(
        with > plain + 10,
        "the example is in the prompt: {with} vs {plain} tokens"
    );

    // An unrelated question gets no example.
    let (shown, unrelated) = ask(&server, "Which port does the QUIC listener use?").await;
    assert_eq!(shown, None);
    let (_, unrelated_plain) = {
        state.set_memory_examples(None);
        ask(&server, "Which port does the QUIC listener use?").await
    };
    assert_eq!(unrelated, unrelated_plain);

    // Examples that do not fit the context window are left out, not an error.
    let room = u32::try_from(plain).expect("small") + 8;
    state.set_chat_model(Some(ModelSlot::new(load(room))), vec!["tiny".into()]);
    state.set_memory_examples(Some(MemoryExamples {
        book,
        k: 3,
        min_cosine: 0.6,
    }));
    let (shown, _) = ask(&server, "How many minutes do soft boiled eggs need?").await;
    assert_eq!(shown, None);
}
