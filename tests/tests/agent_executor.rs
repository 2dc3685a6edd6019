//! A node whose executor is a third-party agent (`[agent] executor = "external:NAME"`):
//! three nodes on loopback. dora fronts the example command agent of
//! examples/agents/notes_agent.py and advertises it on her card; basil holds a document;
//! ada, who holds nothing, is asked. A question no document holds goes to dora's agent
//! verbatim and its answer comes back verbatim, cited as the agent's; a question basil's
//! document answers stays with the document; dora, asked herself, hands the task to her
//! agent.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use starling_models::embed::{BertEmbedder, EmbedHandle};
use starling_node::agent::grounded::AnswerStatus;
use starling_node::agent::runtime::AgentEvent;
use starling_node::config::{ExternalAgentConfig, NodeConfig};
use starling_node::daemon::SharedModels;

mod support;

const FILTER_NOTE: &str =
    "The north greenhouse air filters were replaced on 12 March; the next change is due on 12 June.";
const TANK_NOTE: &str =
    "The hydroponic bay's nutrient tanks hold 220 litres each and are flushed every 14 days.";

fn notes_agent() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/agents/notes_agent.py")
}

/// The example agent behind a wrapper that appends each task it is given to `log`.
fn logged_agent(log: &Path) -> Vec<String> {
    let wrapper = format!(
        "import subprocess, sys\n\
         task = sys.stdin.read()\n\
         open({log:?}, 'a').write(task.replace('\\n', ' ') + '\\n')\n\
         out = subprocess.run([sys.executable, {agent:?}], input=task, capture_output=True, text=True)\n\
         sys.stdout.write(out.stdout)\n",
        log = log.to_string_lossy(),
        agent = notes_agent().to_string_lossy(),
    );
    vec!["python3".into(), "-c".into(), wrapper]
}

fn tasks_logged(log: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The tiny chat model and the real embedder (cards are matched by meaning).
/// The third-party agent of these tests, `station_notes`, with no way to reach it yet.
fn station_notes() -> ExternalAgentConfig {
    ExternalAgentConfig {
        name: "station_notes".into(),
        description: "Knows the station's maintenance notes: filters, pumps, inspections.".into(),
        skills: Vec::new(),
        command: None,
        url: None,
        a2a: None,
        ca_file: None,
        timeout_secs: 30,
        max_output_bytes: 64 * 1024,
    }
}

/// Makes `agent` the executor of the node configured by `c`.
fn front_station_notes(c: &mut NodeConfig, agent: ExternalAgentConfig) {
    c.agent.executor = format!("external:{}", agent.name);
    c.agent.external.push(agent);
}

fn models_with_embedder(d: &Path) -> SharedModels {
    let embedder = EmbedHandle::spawn(
        BertEmbedder::load(starling_models::testing::embedding_model()).unwrap(),
    )
    .unwrap();
    SharedModels {
        chat: support::tiny_chat_model(d),
        aliases: vec![],
        embedder: Some(embedder),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_third_party_agent_is_recruited_and_quoted_verbatim() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let models = models_with_embedder(d);
    let secret = starling_discovery::SwarmSecret::generate().to_string();
    let log = d.join("tasks.log");

    let mut c = support::loopback_config(d, "ada", &secret, None);
    c.agent.description = "Coordinates the station's questions.".into();
    let ada = support::start(c, &models).await;

    let mut c = support::loopback_config(d, "basil", &secret, Some(&ada));
    let docs = d.join("basil-docs");
    std::fs::create_dir_all(&docs).unwrap();
    std::fs::write(
        docs.join("harbour.md"),
        "# Port Ellery\n\nThe harbour master at Port Ellery is Ines Varga.\n",
    )
    .unwrap();
    c.agent.docs = Some(docs);
    c.agent.description = "Notes about the harbour.".into();
    let basil = support::start(c, &models).await;

    let mut c = support::loopback_config(d, "dora", &secret, Some(&ada));
    front_station_notes(
        &mut c,
        ExternalAgentConfig {
            skills: vec!["greenhouse filters".into(), "irrigation pumps".into()],
            command: Some(logged_agent(&log)),
            url: None,
            timeout_secs: 30,
            ..station_notes()
        },
    );
    let dora = support::start(c, &models).await;

    support::wait_for_cards(&ada, 3).await;
    let dora_id = dora.swarm.node_id().to_string();
    let card = ada
        .agent
        .known_cards()
        .into_iter()
        .find(|k| k.node_id == dora_id)
        .unwrap()
        .card;
    assert_eq!(card.agent.as_deref(), Some("station_notes"));
    assert!(card.description.contains("maintenance notes"), "{card:?}");
    assert_eq!(card.skills, ["greenhouse filters", "irrigation pumps"]);

    // Nobody's documents hold it: dora's agent gets the question as asked.
    let q = "When is the next air filter change due in the north greenhouse?";
    let r = tokio::time::timeout(Duration::from_secs(120), ada.agent.submit(q))
        .await
        .expect("answered in time")
        .unwrap();
    assert_eq!(r.answer, FILTER_NOTE, "{r:?}");
    assert_eq!(r.status, AnswerStatus::Answered);
    assert_eq!(r.citations.len(), 1, "{r:?}");
    assert_eq!(r.citations[0].node, "dora");
    assert_eq!(r.citations[0].agent.as_deref(), Some("station_notes"));
    assert!(r.members.contains(&"dora".to_owned()), "{r:?}");
    let sent = tasks_logged(&log);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["description"], q, "the task goes verbatim");

    // basil's document answers this one: no agent is asked.
    let r = tokio::time::timeout(
        Duration::from_secs(120),
        ada.agent
            .submit("Who is the harbour master at Port Ellery?"),
    )
    .await
    .expect("answered in time")
    .unwrap();
    assert!(r.answer.contains("Ines Varga"), "{r:?}");
    assert_eq!(r.citations[0].node, "basil");
    assert_eq!(r.citations[0].document, "harbour.md");
    assert_eq!(r.citations[0].agent, None);
    assert_eq!(tasks_logged(&log).len(), 1, "the agent was not asked");

    // Asked herself, dora hands the task to her agent.
    let q = "How much do the hydroponic bay's nutrient tanks hold?";
    let r = tokio::time::timeout(Duration::from_secs(60), dora.agent.submit(q))
        .await
        .expect("answered in time")
        .unwrap();
    assert_eq!(r.answer, TANK_NOTE, "{r:?}");
    assert_eq!(r.members, ["dora"]);
    assert_eq!(r.citations[0].agent.as_deref(), Some("station_notes"));
    let sent = tasks_logged(&log);
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(sent[1]["description"], q);
    drop(basil);
}

/// Whether process `pid` is still running (a zombie waiting to be reaped is not).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            let state = s.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        })
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_task_stops_the_members_work_on_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let models = SharedModels {
        chat: support::tiny_chat_model(d),
        aliases: vec![],
        embedder: Some(
            EmbedHandle::spawn(
                BertEmbedder::load(starling_models::testing::embedding_model()).unwrap(),
            )
            .unwrap(),
        ),
    };
    let secret = starling_discovery::SwarmSecret::generate().to_string();
    let mut c = support::loopback_config(d, "ada", &secret, None);
    c.agent.description = "Coordinates the station's questions.".into();
    let ada = support::start(c, &models).await;

    // dora's agent says it started (its pid) and then works far longer than the test.
    let pid_file = d.join("agent.pid");
    let slow = format!(
        "import os, sys, time\n\
         sys.stdin.read()\n\
         open({pid:?}, 'w').write(str(os.getpid()))\n\
         time.sleep(300)\n",
        pid = pid_file.to_string_lossy()
    );
    let mut c = support::loopback_config(d, "dora", &secret, Some(&ada));
    front_station_notes(
        &mut c,
        ExternalAgentConfig {
            skills: vec!["greenhouse filters".into()],
            command: Some(vec!["python3".into(), "-c".into(), slow]),
            url: None,
            timeout_secs: 600,
            ..station_notes()
        },
    );
    let dora = support::start(c, &models).await;
    support::wait_for_cards(&ada, 2).await;

    // The task reaches dora's agent; then the user cancels it on ada (as `DELETE
    // /api/tasks/{id}` does: the task's future is aborted).
    let agent = ada.agent.clone();
    let task = tokio::spawn(async move {
        agent
            .submit("When is the next air filter change due in the north greenhouse?")
            .await
    });
    let start = Instant::now();
    let pid: u32 = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            break pid;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the task never reached dora's agent"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(running(pid));
    task.abort();
    let start = Instant::now();
    while running(pid) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "dora's agent still works on a cancelled task"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(dora);
}

/// A long task at the agent a node fronts (IoA's submit-and-poll contract, here the
/// example HTTP agent with `--delay`): while the node waits, where the task stands goes
/// out on the node's event stream, and the answer still comes back verbatim.
/// The `agent_progress` events received so far, each checked to be about `group_id` and
/// from eve's `station_notes`: `(task_id, state, progress)` in order.
fn eves_progress(
    events: &mut tokio::sync::broadcast::Receiver<AgentEvent>,
    group_id: &str,
) -> Vec<(String, String, Option<String>)> {
    let mut seen = Vec::new();
    while let Ok(ev) = events.try_recv() {
        if let AgentEvent::AgentProgress {
            group_id: group,
            task_id,
            assignee,
            agent,
            state,
            progress,
        } = ev
        {
            assert_eq!(group, group_id);
            assert_eq!(
                (assignee.as_str(), agent.as_str()),
                ("eve", "station_notes")
            );
            seen.push((task_id, state, progress));
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_task_at_the_fronted_agent_shows_its_progress() {
    use std::io::BufRead;

    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let models = models_with_embedder(d);
    /// The example agent's process, stopped when dropped.
    struct Service(std::process::Child);
    impl Drop for Service {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/agents/http_agent.py");
    let mut service = Service(
        std::process::Command::new("python3")
            .arg(&script)
            .args(["--port", "0", "--delay", "1.5"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs"),
    );
    // Kept open to the end: the agent writes a line per task it takes.
    let mut output = std::io::BufReader::new(service.0.stdout.take().unwrap());
    let mut first = String::new();
    output.read_line(&mut first).unwrap();
    let url = first
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .to_owned();

    let secret = starling_discovery::SwarmSecret::generate().to_string();
    let mut c = support::loopback_config(d, "ada", &secret, None);
    c.agent.description = "Coordinates the station's questions.".into();
    let ada = support::start(c, &models).await;
    let mut c = support::loopback_config(d, "eve", &secret, Some(&ada));
    front_station_notes(
        &mut c,
        ExternalAgentConfig {
            skills: vec!["hydroponics".into()],
            command: None,
            url: Some(format!("{url}/")),
            timeout_secs: 30,
            ..station_notes()
        },
    );
    let eve = support::start(c, &models).await;
    support::wait_for_cards(&eve, 1).await;
    let mut events = eve.agent.events();

    let q = "How much do the hydroponic bay's nutrient tanks hold?";
    let r = tokio::time::timeout(Duration::from_secs(60), eve.agent.submit(q))
        .await
        .expect("answered in time")
        .unwrap();
    assert_eq!(r.answer, TANK_NOTE, "{r:?}");
    let seen = eves_progress(&mut events, &r.group_id);
    assert_eq!(
        seen.first()
            .map(|(_, state, progress)| (state.as_str(), progress)),
        Some(("working", &None)),
        "{seen:?}"
    );
    assert!(
        seen.iter()
            .any(|(_, _, p)| p.as_deref().is_some_and(|p| p.ends_with(" s left"))),
        "{seen:?}"
    );

    // Asked of ada, who hosts the group and routes the question to eve's agent: ada's
    // watchers see the progress too, in eve's name.
    support::wait_for_cards(&ada, 2).await;
    let mut events = ada.agent.events();
    let r = tokio::time::timeout(Duration::from_secs(60), ada.agent.submit(q))
        .await
        .expect("answered in time")
        .unwrap();
    assert_eq!(r.answer, TANK_NOTE, "{r:?}");
    assert_eq!(r.citations[0].node, "eve", "{r:?}");
    let seen = eves_progress(&mut events, &r.group_id);
    for (task_id, _, _) in &seen {
        assert!(!task_id.is_empty(), "a task of ada's group");
    }
    assert!(
        seen.iter()
            .any(|(_, _, p)| p.as_deref().is_some_and(|p| p.ends_with(" s left"))),
        "{seen:?}"
    );
    drop((service, output, eve));
}
