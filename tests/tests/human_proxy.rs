//! A human-proxy node in a group chat hosted by another node (loopback, tiny model): the
//! person's answers, given through the node API's runtime handle as the dashboard and
//! `starling reply` do, become that member's messages; an unanswered question falls back
//! to the configured behaviour.

#![allow(clippy::unwrap_used)]

use starling_node::agent::chat::{ChatConfig, LaunchParams, MemberRef, Message};
use starling_node::agent::runtime::AgentEvent;
use starling_node::daemon::{Node, SharedModels};

mod support;

async fn node(
    dir: &std::path::Path,
    name: &str,
    models: &SharedModels,
    human: bool,
    secret: &str,
    boot: Option<&Node>,
) -> Node {
    let mut c = support::loopback_config(dir, name, secret, boot);
    c.agent.tools = vec!["calculator".into()];
    if human {
        support::human_proxy(&mut c, 2);
    }
    support::start(c, models).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn human_answers_become_messages_and_silence_loses_the_turn() {
    let dir = tempfile::tempdir().unwrap();
    let models = support::tiny_models(dir.path());
    let secret = starling_discovery::SwarmSecret::generate().to_string();
    let host = node(dir.path(), "host", &models, false, &secret, None).await;
    let person = node(dir.path(), "hannah", &models, true, &secret, Some(&host)).await;
    support::wait_for_cards(&host, 2).await;
    // The person answers the first question only; later ones time out (fallback: skip).
    let mut rx = person.agent.events();
    let answerer = person.agent.clone();
    let answered = tokio::spawn(async move {
        loop {
            if let Ok(AgentEvent::HumanInputRequested { request_id, .. }) = rx.recv().await {
                assert!(answerer.answer_human(&request_id, "Use the north greenhouse.".into()));
                return request_id;
            }
        }
    });
    let members = vec![
        MemberRef {
            id: host.swarm.node_id().to_string(),
            name: "host".into(),
        },
        MemberRef {
            id: person.swarm.node_id().to_string(),
            name: "hannah".into(),
        },
    ];
    let params = LaunchParams {
        group_id: "g-human".into(),
        goal: "Pick a greenhouse.".into(),
        members,
        initiator: host.swarm.node_id().to_string(),
        team_up_depth: 0,
        max_depth: 0,
        max_turns: 5,
        config: ChatConfig {
            turn_timeout_ms: 20_000,
            task_timeout_ms: 20_000,
            opening_assignment: true,
            ..ChatConfig::default()
        },
    };
    let result = host
        .agent
        .host_group(params, None, None)
        .await
        .expect("group");
    answered.await.unwrap();
    let msgs: Vec<Message> = host
        .agent
        .store()
        .messages::<Message>("g-human")
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.body)
        .collect();
    let hannah = person.swarm.node_id().to_string();
    assert!(
        msgs.iter().any(|m| m.content.contains("north greenhouse")
            && (m.sender == hannah || m.assignee.as_deref() == Some(hannah.as_str()))),
        "the person's answer is not in the chat: {msgs:#?}"
    );
    assert!(result.turns <= 5);
    assert!(!result.conclusion.is_empty());
    host.shutdown().await;
    person.shutdown().await;
}
