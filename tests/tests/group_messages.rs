//! Only a group's host may send its messages, tasks and turns: three nodes on loopback; ada
//! sends bea the messages of a group ada hosts, cal (admitted to the same swarm) tries to
//! add one to it, to hand bea one of its tasks and to ask her turn, and bea keeps ada's
//! messages and ada as the host.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use starling_discovery::{PeerState, Swarm};
use starling_node::agent::chat::Message;
use starling_node::agent::runtime::SERVICE;

mod support;

fn note(group: &str, seq: u64, sender: &str, content: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "goal": "Plan the harvest",
        "sender_name": sender,
        "message": {
            "group_id": group,
            "seq": seq,
            "turn": 1,
            "sender": sender,
            "state": "discussion",
            "msg_type": "discuss",
            "content": content,
        },
    }))
    .unwrap()
}

/// Waits until `swarm` sees `n` peers alive (bounded: 30 s).
async fn wait_alive(swarm: &Swarm, n: usize) {
    let start = Instant::now();
    let mut updates = swarm.events();
    loop {
        let alive = swarm
            .peers()
            .iter()
            .filter(|p| p.state == PeerState::Alive)
            .count();
        if alive >= n {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "only {alive} of {n} peers alive"
        );
        let _ = tokio::time::timeout(Duration::from_secs(1), updates.recv()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_recorded_host_may_send_a_groups_messages_tasks_and_turns() {
    let dir = tempfile::tempdir().unwrap();
    let models = support::tiny_models(dir.path());
    let secret = starling_discovery::SwarmSecret::generate().to_string();
    let d = dir.path();
    let ada = support::start(support::loopback_config(d, "ada", &secret, None), &models).await;
    let bea = support::start(
        support::loopback_config(d, "bea", &secret, Some(&ada)),
        &models,
    )
    .await;
    let cal = support::start(
        support::loopback_config(d, "cal", &secret, Some(&ada)),
        &models,
    )
    .await;
    wait_alive(&cal.swarm, 2).await;
    let bea_id = bea.swarm.node_id();
    let (ada_id, cal_id) = (
        ada.swarm.node_id().to_string(),
        cal.swarm.node_id().to_string(),
    );

    ada.swarm
        .call(bea_id, SERVICE, "message", note("g1", 1, &ada_id, "hello"))
        .await
        .expect("the host's first message is taken");
    let forged = cal
        .swarm
        .call(bea_id, SERVICE, "message", note("g1", 2, &cal_id, "forged"))
        .await
        .expect_err("a message from another node is refused");
    assert!(
        forged.to_string().contains("only the group's host"),
        "{forged}"
    );
    // Nor may it hand bea a task or ask her turn in ada's group.
    let bea_str = bea_id.to_string();
    let task = json!({
        "group_id": "g1",
        "goal": "Plan the harvest",
        "task": {"id": "t1", "assignee": bea_str, "assigner": ada_id, "task_abstract": null, "desc": "Ship the crop to cal", "mode": "sync", "state": "running", "assigned_turn": 1, "deadline": 0},
        "sub_team_depth": null,
        "max_depth": 2,
    });
    let forged = cal
        .swarm
        .call(bea_id, SERVICE, "task", serde_json::to_vec(&task).unwrap())
        .await
        .expect_err("a task from another node is refused");
    assert!(
        forged.to_string().contains("only the group's host"),
        "{forged}"
    );
    let speak = json!({
        "group_id": "g1",
        "goal": "Plan the harvest",
        "members": [{"id": bea_str, "name": "bea"}, {"id": cal_id, "name": "cal"}],
        "transcript": [],
        "tasks": [],
        "turn": 2,
        "max_turns": 12,
        "allowed": ["discuss"],
        "retry": null,
        "schema": {},
    });
    let forged = cal
        .swarm
        .call(
            bea_id,
            SERVICE,
            "speak",
            serde_json::to_vec(&speak).unwrap(),
        )
        .await
        .expect_err("a turn asked by another node is refused");
    assert!(
        forged.to_string().contains("only the group's host"),
        "{forged}"
    );
    ada.swarm
        .call(bea_id, SERVICE, "message", note("g1", 2, &ada_id, "second"))
        .await
        .expect("the host's next message is taken");
    // A group bea did not know yet is anyone's to start.
    cal.swarm
        .call(bea_id, SERVICE, "message", note("g2", 1, &cal_id, "mine"))
        .await
        .expect("a new group's first message is taken");

    let store = bea.agent.store();
    let messages: Vec<String> = store
        .messages::<Message>("g1")
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.body.content)
        .collect();
    assert_eq!(messages, ["hello", "second"]);
    let g1 = store.group::<Value>("g1").await.unwrap().expect("g1 kept");
    assert_eq!(g1.body["host"], json!(ada_id));
    let g2 = store.group::<Value>("g2").await.unwrap().expect("g2 kept");
    assert_eq!(g2.body["host"], json!(cal_id));
}
