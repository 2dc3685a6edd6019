//! Task execution with the real default model (SmolLM2-135M-Instruct): a fact held only in
//! the node's documents must reach the executor's evidence, and the grounded answer built
//! from it; arithmetic must reach the evidence. The model's free text is printed, never
//! asserted: greedy text from a 135M model changes with the tiny numeric differences between
//! CPU kernel paths (AVX-512 vs AVX2), so only what holds on every CPU is checked.

use std::path::Path;

use starling_models::engine::{Engine, EngineConfig, ModelSlot};
use starling_models::testing;
use starling_node::agent::executor::{Executor, TaskOutcome, TaskSpec};
use starling_node::agent::grounded::decompose;
use starling_node::agent::tools::{SearchDocs, ToolBox};
use starling_node::llm::Llm;

fn real_llm() -> Llm {
    let engine =
        Engine::load(&testing::chat_model(), &EngineConfig::default()).expect("load chat model");
    Llm::new(ModelSlot::new(engine))
}

fn write_docs(dir: &Path) {
    std::fs::write(
        dir.join("reactor.md"),
        "# Zorblat reactor\n\nThe Zorblat reactor's coolant is liquid argon at 87 K. \
         It was commissioned in the Quillon valley.\n",
    )
    .expect("write");
    std::fs::write(
        dir.join("garden.txt"),
        "Roses need six hours of sun a day and well drained soil.\n\n\
         Tomatoes are watered every morning in summer.\n",
    )
    .expect("write");
    std::fs::write(
        dir.join("ships.md"),
        "The cargo ship Meridian carries grain between the northern ports every week.\n",
    )
    .expect("write");
}

fn report(out: &TaskOutcome) {
    eprintln!(
        "answer: {:?}\nverified: {} missing: {:?}\ntokens: {}",
        out.answer, out.verified, out.missing, out.tokens
    );
    for s in &out.steps {
        eprintln!(
            "  step {:?} tool {} args {} grounded {} obs {:?} err {:?}",
            s.step, s.tool, s.args, s.grounded, s.observation, s.error
        );
    }
}

#[tokio::test]
async fn facts_from_documents_and_arithmetic_reach_the_evidence_and_the_grounded_answer() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_docs(dir.path());
    let tools = ToolBox::new()
        .with_calculator()
        .with_docs(SearchDocs::open(dir.path()).expect("index docs"));
    let exec = Executor::new(real_llm(), tools);

    let started = std::time::Instant::now();
    let out = exec
        .run(&TaskSpec {
            task_id: "t1".into(),
            description: "What coolant does the Zorblat reactor use?".into(),
            context: String::new(),
        })
        .await
        .expect("run");
    eprintln!("coolant task took {:?}", started.elapsed());
    report(&out);
    assert!(out.ok);
    assert!(
        out.steps.iter().any(|s| s.tool == "search_docs"
            && s.observation
                .as_deref()
                .is_some_and(|o| o.contains("liquid argon at 87 K"))),
        "the document passage with the fact is not in the evidence"
    );
    // The grounded answer: the span copied from the cited sentence.
    let docs = SearchDocs::open(dir.path()).expect("index docs");
    let subs = decompose("What coolant does the Zorblat reactor use?");
    assert_eq!(subs.len(), 1);
    let found = docs.locate(&subs[0], 3);
    let best = found.first().expect("a unit is located");
    assert_eq!(best.unit.document, "reactor.md");
    assert!(best.unit.text.contains("liquid argon at 87 K"), "{best:?}");

    let started = std::time::Instant::now();
    let out = exec
        .run(&TaskSpec {
            task_id: "t2".into(),
            description: "What is 17 * 23 + 4?".into(),
            context: String::new(),
        })
        .await
        .expect("run");
    eprintln!("arithmetic task took {:?}", started.elapsed());
    report(&out);
    assert!(out.ok);
    // The exact result is in the evidence the answer is composed from. (Whether the 135M
    // model copies it into its sentence varies; the coolant fact above it does copy.)
    assert!(out
        .steps
        .iter()
        .any(|s| s.grounded && s.observation.as_deref() == Some("17 * 23 + 4 = 395")));
}
