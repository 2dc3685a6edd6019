//! What the multi-node tests share: a node's config on loopback (no mDNS, the test's swarm
//! secret, bootstrapped from another node of the test) and starting it with shared models.

#![allow(dead_code, clippy::unwrap_used)]

use std::path::Path;

use starling_node::config::{AgentKind, HumanFallback, NodeConfig};
use starling_node::daemon::{Node, SharedModels, StartOptions};

/// A node named `name` with its data under `dir/name`, listening on loopback only, joining
/// through `boot` when given.
pub fn loopback_config(dir: &Path, name: &str, secret: &str, boot: Option<&Node>) -> NodeConfig {
    let mut c = NodeConfig::default();
    c.node.name = Some(name.into());
    c.node.data_dir = Some(dir.join(name));
    c.network.listen = "127.0.0.1:0".parse().unwrap();
    c.network.mdns = false;
    c.network.swarm_secret = Some(secret.into());
    c.api.listen = "127.0.0.1:0".parse().unwrap();
    if let Some(b) = boot {
        c.network.bootstrap = vec![format!(
            "{}@{}",
            b.swarm.node_id(),
            b.swarm.advertised_addr()
        )];
    }
    c
}

/// Makes `c` a human proxy whose person has `timeout_secs` to answer, then is skipped.
pub fn human_proxy(c: &mut NodeConfig, timeout_secs: u64) {
    c.agent.kind = AgentKind::Human;
    c.agent.human_timeout_secs = timeout_secs;
    c.agent.human_fallback = HumanFallback::Skip;
}

/// Starts a node with `models` shared with the test's other nodes.
pub async fn start(c: NodeConfig, models: &SharedModels) -> Node {
    Node::start(
        c,
        StartOptions {
            models: Some(models.clone()),
            ..StartOptions::default()
        },
    )
    .await
    .expect("start node")
}

/// Models for tests whose flow does not depend on what the model says: the tiny chat
/// model of [`tiny_chat_model`], no embedder.
pub fn tiny_models(dir: &Path) -> SharedModels {
    SharedModels {
        chat: tiny_chat_model(dir),
        aliases: vec![],
        embedder: None,
    }
}

/// A tiny random-weight llama written under `dir`, loaded as a chat model (for tests whose
/// flow does not depend on what the model says).
pub fn tiny_chat_model(dir: &Path) -> starling_models::engine::ModelSlot {
    use starling_models::engine::{Engine, EngineConfig, ModelSlot};
    let path = dir.join("tiny.gguf");
    starling_models::testing::write_tiny_llama(
        &path,
        candle_core::quantized::GgmlDType::Q8_0,
        2048,
    );
    ModelSlot::new(Engine::load(&path, &EngineConfig::default()).unwrap())
}

/// Waits until `node` knows `n` agent cards (its own included). A card the exchange on
/// connect misses comes with the next periodic sync (every 30 s), so the wait allows 60 s;
/// a 20 s wait ran out once in a full test run on a 2-core machine.
pub async fn wait_for_cards(node: &Node, n: usize) {
    let start = std::time::Instant::now();
    while node.agent.known_cards().len() < n {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "{} of {n} cards known after 60 s",
            node.agent.known_cards().len()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
