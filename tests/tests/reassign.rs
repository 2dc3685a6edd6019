//! A grounded task whose chosen member fails still gets its fact from another holder:
//! three nodes on loopback, two of them holding the fact; the better match (bea, a human
//! proxy whose person never answers, so its task fails) is asked first, and the
//! sub-question goes to the other holder (cal, whose sentence matches less of the
//! question), which joins the group, before the answer is composed.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use starling_models::embed::{BertEmbedder, EmbedHandle};
use starling_node::agent::chat::TaskState;
use starling_node::agent::runtime::AgentEvent;
use starling_node::daemon::{Node, SharedModels};

mod support;

async fn node(
    dir: &Path,
    name: &str,
    doc: Option<&str>,
    human: bool,
    models: &SharedModels,
    secret: &str,
    boot: Option<&Node>,
) -> Node {
    let mut c = support::loopback_config(dir, name, secret, boot);
    c.agent.tools = vec!["search_docs".into(), "calculator".into()];
    c.agent.description = format!("{name}'s notes about the harbour");
    if let Some(text) = doc {
        let docs = dir.join(format!("{name}-docs"));
        std::fs::create_dir_all(&docs).unwrap();
        std::fs::write(docs.join("harbour.md"), text).unwrap();
        c.agent.docs = Some(docs);
    }
    if human {
        // Tasks go to a person who never answers: the task fails after a second.
        support::human_proxy(&mut c, 1);
    }
    support::start(c, models).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_member_s_sub_question_goes_to_another_holder() {
    let dir = tempfile::tempdir().unwrap();
    let embedder = EmbedHandle::spawn(
        BertEmbedder::load(starling_models::testing::embedding_model()).unwrap(),
    )
    .unwrap();
    let models = SharedModels {
        chat: support::tiny_chat_model(dir.path()),
        aliases: vec![],
        embedder: Some(embedder),
    };
    let secret = starling_discovery::SwarmSecret::generate().to_string();
    let d = dir.path();
    let ada = node(d, "ada", None, false, &models, &secret, None).await;
    let bea = node(
        d,
        "bea",
        Some("# Harbour staff\n\nThe harbour master at Port Ellery is Morwenna Tregenza.\n"),
        true,
        &models,
        &secret,
        Some(&ada),
    )
    .await;
    let cal = node(
        d,
        "cal",
        Some("# Notes\n\nPort Ellery harbour office: Morwenna Tregenza is in charge.\n"),
        false,
        &models,
        &secret,
        Some(&ada),
    )
    .await;
    support::wait_for_cards(&ada, 3).await;
    let mut events = ada.agent.events();
    let result = tokio::time::timeout(
        Duration::from_secs(60),
        ada.agent
            .submit("Who is the harbour master at Port Ellery?"),
    )
    .await
    .expect("the task concludes")
    .expect("the task runs");
    // bea was asked first and failed; cal answered.
    let mut states = Vec::new();
    while let Ok(e) = events.try_recv() {
        if let AgentEvent::TaskState {
            assignee, state, ..
        } = e
        {
            states.push((assignee, state));
        }
    }
    assert!(
        states.contains(&("bea".to_owned(), TaskState::Failed)),
        "bea's task did not fail first: {states:?}"
    );
    assert!(
        result.answer.contains("Morwenna Tregenza"),
        "answer: {} ({:?})",
        result.answer,
        result.citations
    );
    assert!(
        result.citations.iter().any(|c| c.node == "cal"),
        "not cited from cal: {:?}",
        result.citations
    );
    assert!(
        result.members.iter().any(|m| m == "cal"),
        "{:?}",
        result.members
    );
    for n in [&ada, &bea, &cal] {
        n.shutdown().await;
    }
}
