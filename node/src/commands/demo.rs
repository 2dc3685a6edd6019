//! `starling demo`: three local nodes with different personas and different documents
//! form a team for a task that needs facts only the *other* two hold, live.
//!
//! The personas and documents are the ones in `configs/` (compiled into the binary, so the
//! demo runs from anywhere). All nodes listen on loopback (no mDNS, nothing leaves the
//! machine) and share one copy of the models.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use starling_discovery::SwarmSecret;
use starling_models::source::registry;

use crate::config::NodeConfig;
use crate::daemon::{Node, SharedModels, StartOptions};
use crate::loading::ModelOptions;

use super::task::{Follower, Step};

/// The demo task: the moonflower temperature is only in basil's documents, the shuttle
/// day only in cyra's.
pub const DEMO_TASK: &str = "We are starting the Lumen greenhouse. At what temperature do moonflower seeds germinate best, and on which day does the supply shuttle Kestrel dock at Lumen station?";

/// A persona: name, config TOML, documents (file name, text).
type Persona = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

const PERSONAS: &[Persona] = &[
    (
        "ada",
        include_str!("../../../configs/ada.toml"),
        &[(
            "handbook.md",
            include_str!("../../../configs/docs/ada/handbook.md"),
        )],
    ),
    (
        "basil",
        include_str!("../../../configs/basil.toml"),
        &[(
            "moonflower.md",
            include_str!("../../../configs/docs/basil/moonflower.md"),
        )],
    ),
    (
        "cyra",
        include_str!("../../../configs/cyra.toml"),
        &[(
            "shuttle.md",
            include_str!("../../../configs/docs/cyra/shuttle.md"),
        )],
    ),
];

/// Arguments of `starling demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// The task given to the first node.
    #[arg(long, default_value = DEMO_TASK)]
    pub task: String,
    /// Chat model for all three nodes.
    #[arg(
        short,
        long,
        env = "STARLING_MODEL",
        default_value = "smollm2-135m-instruct"
    )]
    pub model: String,
    /// Where the demo nodes keep their data (default: a fresh temporary directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// HTTP API port of the first node (the others take the next two); 0 picks free ports.
    #[arg(long, default_value_t = 7431)]
    pub api_port: u16,
    /// Keep the nodes running after the conclusion (to browse the dashboard) until Ctrl-C.
    #[arg(long)]
    pub keep_running: bool,
    /// Turn the group chat's repetition guard off (to measure what it saves).
    #[arg(long)]
    pub no_repetition_guard: bool,
    /// Print events as JSON lines, then a JSON summary.
    #[arg(long)]
    pub json: bool,
}

/// Writes the personas' configs and documents under `dir`, with loopback addresses.
pub fn write_personas(dir: &Path, api_port: u16) -> anyhow::Result<Vec<NodeConfig>> {
    let mut out = Vec::new();
    for (i, (name, toml, docs)) in PERSONAS.iter().enumerate() {
        let docs_dir = dir.join("docs").join(name);
        std::fs::create_dir_all(&docs_dir)
            .with_context(|| format!("cannot create {}", docs_dir.display()))?;
        for (file, text) in docs.iter() {
            std::fs::write(docs_dir.join(file), text)?;
        }
        let mut c = NodeConfig::parse(toml).with_context(|| format!("persona {name}"))?;
        c.node.data_dir = Some(dir.join("data").join(name));
        c.agent.docs = Some(docs_dir);
        c.network.listen = "127.0.0.1:0".parse()?;
        c.network.bootstrap.clear();
        c.network.mdns = false;
        let port = if api_port == 0 {
            0
        } else {
            api_port + i as u16
        };
        c.api.listen = format!("127.0.0.1:{port}").parse()?;
        out.push(c);
    }
    Ok(out)
}

/// Summary printed with `--json`.
#[derive(Debug, serde::Serialize)]
struct Summary {
    answer: String,
    group_id: String,
    seconds: f64,
    tokens_all_nodes: u64,
    completion_tokens_all_nodes: u64,
    api: Vec<String>,
}

/// Runs the demo.
pub fn run(home: &Path, args: DemoArgs) -> anyhow::Result<()> {
    let tmp;
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::tempdir().context("cannot create a temporary directory")?;
            tmp.path().to_path_buf()
        }
    };
    let mut configs = write_personas(&dir, args.api_port)?;
    let secret = SwarmSecret::generate().to_string();
    for c in &mut configs {
        c.network.swarm_secret = Some(secret.clone());
        c.models.chat = args.model.clone();
    }
    let first = configs
        .first()
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no personas"))?;
    eprintln!("loading models (shared by the three nodes)...");
    let engine = crate::loading::load_engine(home, &ModelOptions::from_config(&first))?;
    let aliases = registry::find(&args.model)
        .map(|k| vec![k.name.to_owned()])
        .unwrap_or_default();
    let embedder = crate::loading::load_embedder(
        home,
        &first.models.embedding,
        ModelOptions::from_config(&first).embed_backend,
    )?;
    let shared = SharedModels {
        chat: starling_models::engine::ModelSlot::new(engine),
        aliases,
        embedder: Some(embedder),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let opts = |shared: &SharedModels| StartOptions {
            join: None,
            home: home.to_path_buf(),
            models: Some(shared.clone()),
            no_repetition_guard: args.no_repetition_guard,
        };
        let mut nodes: Vec<Node> = Vec::new();
        for (i, mut c) in configs.into_iter().enumerate() {
            if let Some(first) = nodes.first() {
                c.network.bootstrap = vec![format!(
                    "{}@{}",
                    first.swarm.node_id(),
                    first.swarm.advertised_addr()
                )];
            }
            let node = Node::start(c, opts(&shared))
                .await
                .with_context(|| format!("cannot start demo node {}", i + 1))?;
            eprintln!(
                "node {:<6} {}  dashboard http://{}/",
                node.swarm.name(),
                node.swarm.node_id().short(),
                node.api_addr
            );
            nodes.push(node);
        }
        let ada = nodes[0].clone();
        // Wait until the first node knows both other cards (replicated records).
        let t = Instant::now();
        while ada.agent.known_cards().len() < 3 {
            anyhow::ensure!(
                t.elapsed() < Duration::from_secs(30),
                "the demo nodes did not exchange their agent cards within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (p0, c0) = tokens(&nodes);
        let started = Instant::now();
        let group_id = crate::agent::runtime::new_group_id();
        let mut follower = Follower::new(group_id.clone(), args.json, true);
        let mut rx = ada.agent.events();
        let agent = ada.agent.clone();
        let task = args.task.clone();
        let gid = group_id.clone();
        let job = tokio::spawn(async move { agent.submit_as(&task, gid).await });
        let answer = loop {
            match rx.recv().await {
                Ok(ev) => match follower.on(&ev) {
                    Step::More => {}
                    Step::Done(c) => break c,
                    Step::Failed(e) => anyhow::bail!("the demo task failed: {e}"),
                },
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                    anyhow::bail!("the node stopped")
                }
            }
        };
        let _ = job.await;
        let (p1, c1) = tokens(&nodes);
        let summary = Summary {
            answer,
            group_id,
            seconds: started.elapsed().as_secs_f64(),
            tokens_all_nodes: (p1 - p0) + (c1 - c0),
            completion_tokens_all_nodes: c1 - c0,
            api: nodes
                .iter()
                .map(|n| format!("http://{}", n.api_addr))
                .collect(),
        };
        if args.json {
            println!("{}", serde_json::to_string(&summary)?);
        } else {
            println!(
                "\ndone in {:.1} s; the shared model processed {} tokens ({} generated)",
                summary.seconds, summary.tokens_all_nodes, summary.completion_tokens_all_nodes
            );
        }
        if args.keep_running {
            eprintln!("nodes keep running; Ctrl-C to stop");
            super::wait_for_stop_signal().await;
        }
        for n in &nodes {
            n.shutdown().await;
        }
        Ok(())
    })
}

/// Tokens processed by the shared model so far (all nodes use one model, so any node's
/// counters... are per `Llm`; sum them).
fn tokens(nodes: &[Node]) -> (u64, u64) {
    nodes.iter().fold((0, 0), |(p, c), n| {
        let (np, nc, _) = n.agent.llm().counters().snapshot();
        (p + np, c + nc)
    })
}
