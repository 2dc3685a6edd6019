//! The executor and the shared memories, with the real embedding model and a tiny random
//! chat model: a memory close to the task is shown as a worked example (and gets feedback
//! from the verdict), one about another subject is not.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use starling_models::embed::{BertEmbedder, EmbedHandle};
use starling_models::engine::{Engine, EngineConfig, ModelSlot};
use starling_node::agent::executor::{Executor, ExecutorConfig, TaskSpec};
use starling_node::agent::tools::ToolBox;
use starling_node::llm::Llm;
use starling_node::memory::{BookConfig, Memory, MemoryBook, DEFAULT_DOMAIN};
use starling_node::store::Store;

fn mem(id: &str, prompt: &str, answer: &str) -> Memory {
    Memory {
        id: id.into(),
        author: "n1".into(),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_memories_become_examples_and_get_feedback() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    starling_models::testing::write_tiny_llama(
        &path,
        candle_core::quantized::GgmlDType::Q8_0,
        4096,
    );
    let llm = Llm::new(ModelSlot::new(
        Engine::load(&path, &EngineConfig::default()).unwrap(),
    ));
    let embedder = EmbedHandle::spawn(
        BertEmbedder::load(starling_models::testing::embedding_model()).unwrap(),
    )
    .unwrap();
    let book = MemoryBook::open(
        Store::open_in_memory().unwrap(),
        Some(embedder),
        None,
        BookConfig::default(),
    )
    .await
    .unwrap();
    book.insert(
        mem(
            "close",
            "At what temperature do tomato seeds germinate best?",
            "Tomato seeds germinate best at 25 degrees Celsius.",
        ),
        None,
    )
    .await
    .unwrap();
    book.insert(
        mem(
            "far",
            "Which train leaves Berlin for Prague in the evening?",
            "The 18:40 EuroCity.",
        ),
        None,
    )
    .await
    .unwrap();
    let exec = Executor::with_config(
        llm,
        ToolBox::new(),
        ExecutorConfig {
            answer_tokens: 24,
            ..ExecutorConfig::default()
        },
    )
    .with_memory(book.clone());
    let out = exec
        .run(&TaskSpec {
            task_id: "g1/t1".into(),
            description: "At what temperature do pepper seeds germinate best?".into(),
            context: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(out.examples, vec!["close".to_string()], "{out:?}");
    // Feedback is recorded in the background: helpful when verified, else unhelpful.
    let t = Instant::now();
    loop {
        let m = book.get("close").unwrap();
        if m.helpful + m.unhelpful == 1 {
            assert_eq!(m.helpful == 1, out.verified);
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "no feedback: {m:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let far = book.get("far").unwrap();
    assert_eq!(far.helpful + far.unhelpful, 0);
}
