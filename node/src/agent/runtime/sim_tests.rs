//! The runtime on a simulated cluster: N agents in one process over an in-memory swarm
//! ([`SimNet`]), with faults injected at exact points of the protocol (a member dies as
//! its task reaches it, the host dies mid-chat). The same `Agent` code runs here as over
//! QUIC; only the swarm differs, so a run takes milliseconds and a fault lands where the
//! test says, not where a timer happens to fire. Every test runs on tokio's paused clock
//! (`start_paused`): time is virtual, so a two-minute turn timeout passes at once and
//! in order with every other timer (see `SimNet`).

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use candle_core::quantized::GgmlDType;
use starling_models::engine::{Engine, EngineConfig, ModelSlot};

use super::*;
use crate::agent::chat::{Message, MessageType, TaskMode, TaskState};
use crate::agent::executor::{Executor, ExecutorConfig};
use crate::agent::peers::sim::{Fault, SimNet};
use crate::agent::tools::ToolBox;
use crate::llm::{Decide, LlmError};

const BERTH: &str = "# Quays\n\nQuay Nine at Port Ellery has a berth length of 214 metres.\n";
const PILOT: &str =
    "# Pilots\n\nThe pilot on duty at Port Ellery this week is Morwenna Tregenza.\n";
const QUESTION: &str =
    "How long is the berth at Quay Nine, and who is the pilot on duty at Port Ellery?";

/// A cluster of agents on one simulated network.
struct Cluster {
    net: Arc<SimNet>,
    agents: Vec<(String, Agent)>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts one agent per `(name, document)`; a node without a document only asks.
    async fn start(nodes: &[(&str, Option<&str>)]) -> Self {
        Self::start_with(nodes, &[]).await
    }

    /// [`Cluster::start`], with the nodes named in `people` fronted by a person (a human
    /// agent, asked through the API, that waits the default five minutes for an answer).
    async fn start_with(nodes: &[(&str, Option<&str>)], people: &[&str]) -> Self {
        Self::start_scripted(nodes, people, HashMap::new()).await
    }

    /// [`Cluster::start_with`], with the chat turns of the nodes named in `scripts`
    /// decided by those scripts instead of the model.
    async fn start_scripted(
        nodes: &[(&str, Option<&str>)],
        people: &[&str],
        mut scripts: HashMap<&str, Arc<dyn Decide>>,
    ) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let model = dir.path().join("tiny.gguf");
        starling_models::testing::write_tiny_llama(&model, GgmlDType::Q8_0, 256);
        let engine = Engine::load(&model, &EngineConfig::default()).expect("tiny model");
        let net = SimNet::new();
        let mut agents = Vec::new();
        for (name, doc) in nodes {
            let person = people.contains(name);
            let script = scripts.remove(name);
            let agent = start_agent(&net, dir.path(), (name, *doc, person), &engine, script).await;
            agents.push((name.to_string(), agent));
        }
        // Every agent knows every card before the test asks anything.
        for _ in 0..1000 {
            if agents
                .iter()
                .all(|(_, a)| a.known_cards().len() == nodes.len())
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for (name, a) in &agents {
            assert_eq!(a.known_cards().len(), nodes.len(), "{name} misses cards");
        }
        Self {
            net,
            agents,
            _dir: dir,
        }
    }

    fn agent(&self, name: &str) -> &Agent {
        &self
            .agents
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no agent {name}"))
            .1
    }

    /// A chat among `names` (in that order), hosted by the first, with `config` and up to
    /// `max_turns` turns.
    fn talk(&self, names: &[&str], max_turns: u32, config: ChatConfig) -> LaunchParams {
        LaunchParams {
            group_id: new_group_id(),
            goal: "Talk it through.".into(),
            members: names
                .iter()
                .map(|n| MemberRef {
                    id: self.agent(n).node_id().to_owned(),
                    name: n.to_string(),
                })
                .collect(),
            initiator: self.agent(names[0]).node_id().to_owned(),
            team_up_depth: 0,
            max_depth: 0,
            max_turns,
            config,
        }
    }

    /// The senders of the `member_left` messages in `host`'s log of `group`.
    async fn left(&self, host: &str, group: &str) -> Vec<String> {
        let log = self
            .agent(host)
            .store()
            .messages::<Message>(group)
            .await
            .expect("messages");
        log.into_iter()
            .filter(|m| m.body.msg_type == MessageType::MemberLeft)
            .map(|m| m.body.sender)
            .collect()
    }

    /// The names of the nodes cited by `result`.
    fn cited(result: &TaskResult) -> Vec<String> {
        result.citations.iter().map(|c| c.node.clone()).collect()
    }
}

async fn start_agent(
    net: &Arc<SimNet>,
    dir: &Path,
    (name, doc, person): (&str, Option<&str>, bool),
    engine: &Engine,
    decide: Option<Arc<dyn Decide>>,
) -> Agent {
    let mut config = NodeConfig::default();
    config.node.name = Some(name.to_owned());
    if person {
        config.agent.kind = AgentKind::Human;
    }
    if let Some(text) = doc {
        let docs = dir.join(format!("{name}-docs"));
        std::fs::create_dir_all(&docs).expect("docs dir");
        std::fs::write(docs.join("harbour.md"), text).expect("doc");
        config.agent.docs = Some(docs);
    }
    config.agent.tools = vec!["search_docs".into(), "calculator".into()];
    let llm = Llm::new(ModelSlot::new(engine.clone()));
    let tools = ToolBox::from_config(&config.agent).expect("tools");
    let executor = Executor::with_config(llm.clone(), tools, ExecutorConfig::default());
    Agent::start(
        net.join(name),
        config,
        llm,
        None,
        executor,
        Store::open_in_memory().expect("store"),
        vec!["tiny".into()],
        AgentOptions {
            decide,
            ..AgentOptions::default()
        },
        CancellationToken::new(),
    )
    .await
    .expect("agent starts")
}

#[tokio::test(start_paused = true)]
async fn a_team_answers_with_each_holders_cited_fact() {
    let c = Cluster::start(&[("ada", None), ("bea", Some(BERTH)), ("cal", Some(PILOT))]).await;
    let r = c.agent("ada").submit(QUESTION).await.expect("answered");
    assert!(
        r.answer.contains("214") && r.answer.contains("Morwenna Tregenza"),
        "{}",
        r.answer
    );
    let cited = Cluster::cited(&r);
    assert!(
        cited.contains(&"bea".to_string()) && cited.contains(&"cal".to_string()),
        "{cited:?}"
    );
    // Grounded: no model token spent.
    assert_eq!(r.tokens, 0);
    // The members were asked through the protocol: each got its task.
    let calls = c.net.calls();
    for member in ["bea", "cal"] {
        assert!(
            calls
                .iter()
                .any(|(from, to, m)| from == "ada" && to == member && m == "task"),
            "{member} got no task: {calls:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_member_killed_as_its_task_reaches_it_hands_the_question_to_another_holder() {
    let c = Cluster::start(&[
        ("ada", None),
        ("bea", Some(BERTH)),
        ("cal", Some(PILOT)),
        ("dov", Some(BERTH)),
    ])
    .await;
    // Whichever berth holder gets the berth task first dies as it arrives.
    let killed = Arc::new(Mutex::new(None::<String>));
    let k = killed.clone();
    c.net.on_call(move |_, to, method| {
        let mut k = k.lock().unwrap_or_else(|p| p.into_inner());
        if method == "task" && (to == "bea" || to == "dov") && k.is_none() {
            *k = Some(to.to_owned());
            return Some(Fault::KillTarget);
        }
        None
    });
    let started = tokio::time::Instant::now();
    let r = c.agent("ada").submit(QUESTION).await.expect("answered");
    let dead = killed
        .lock()
        .expect("lock")
        .clone()
        .expect("a berth holder was killed");
    let survivor = if dead == "bea" { "dov" } else { "bea" };
    assert!(
        r.answer.contains("214") && r.answer.contains("Morwenna Tregenza"),
        "{}",
        r.answer
    );
    let cited = Cluster::cited(&r);
    assert!(cited.contains(&survivor.to_string()), "{cited:?}");
    assert!(!cited.contains(&dead), "{cited:?}");
    // The survivor got the task after the death, in virtual time.
    assert!(c
        .net
        .calls()
        .iter()
        .any(|(_, to, m)| to == survivor && m == "task"));
    eprintln!(
        "member killed as its task started: concluded after {:.2} s (virtual)",
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test(start_paused = true)]
async fn a_group_whose_host_dies_mid_chat_is_concluded_by_its_successor() {
    let c = Cluster::start(&[("ada", None), ("bea", Some(BERTH)), ("cal", Some(PILOT))]).await;
    // The host dies on its first message after each member has one (both hold the log).
    let mut got: HashMap<String, usize> = HashMap::new();
    let mut dead = false;
    c.net.on_call(move |from, to, method| {
        if from != "ada" || method != "message" || dead {
            return None;
        }
        if ["bea", "cal"]
            .iter()
            .all(|m| got.get(*m).copied().unwrap_or(0) > 0)
        {
            dead = true;
            return Some(Fault::KillCaller);
        }
        *got.entry(to.to_owned()).or_default() += 1;
        None
    });
    let group = new_group_id();
    let ada = c.agent("ada").clone();
    let (q, g) = (QUESTION.to_owned(), group.clone());
    let orphan = tokio::spawn(async move { ada.submit_as(&q, g).await });
    let started = tokio::time::Instant::now();
    let (successor, result) = loop {
        if let Some(found) = ["bea", "cal"]
            .iter()
            .find_map(|n| c.agent(n).task_result(&group).map(|r| (n.to_string(), r)))
        {
            break found;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no member concluded the group; calls: {:?}",
            c.net.calls()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    orphan.abort();
    assert!(
        result.answer.contains("214") && result.answer.contains("Morwenna Tregenza"),
        "{}: {}",
        successor,
        result.answer
    );
    // The successor is the first member in the host's order: the one that resumed.
    assert!(result.members.iter().all(|m| m != c.agent("ada").node_id()));
    // The handover is in the successor's log, in the lost host's name.
    let log = c
        .agent(&successor)
        .store()
        .messages::<Message>(&group)
        .await
        .expect("messages");
    assert!(
        log.iter()
            .any(|m| m.body.msg_type == MessageType::MemberLeft
                && m.body.sender == c.agent("ada").node_id()),
        "{log:?}"
    );
    eprintln!(
        "host killed mid-chat: {successor} concluded after {:.2} s (virtual)",
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_task_withdraws_the_question_to_the_members_person() {
    let c = Cluster::start_with(
        &[("ada", None), ("bea", Some(BERTH)), ("cal", Some(PILOT))],
        &["cal"],
    )
    .await;
    let mut events = c.agent("cal").events();
    let ada = c.agent("ada").clone();
    let task = tokio::spawn(async move { ada.submit(QUESTION).await });
    // cal's person is asked for its part: the task is running there.
    let started = tokio::time::Instant::now();
    while c.agent("cal").pending_human().is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "cal was never asked"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Cancelling drops the task at the host, and with it the call to cal.
    task.abort();
    let cancelled = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match events.recv().await {
                Ok(AgentEvent::TaskState {
                    state: TaskState::Cancelled,
                    ..
                }) => break,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => panic!("cal stopped"),
            }
        }
    })
    .await;
    assert!(cancelled.is_ok(), "cal never saw its task cancelled");
    // The person is no longer asked.
    let t = tokio::time::Instant::now();
    while !c.agent("cal").pending_human().is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "cal's person is still asked"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Turn decisions from a script: `f(n)` decides the node's `n`-th turn (from 0).
struct Script<F>(Mutex<(usize, F)>);

impl<F> Decide for Script<F>
where
    F: FnMut(usize) -> Result<serde_json::Value, LlmError> + Send + 'static,
{
    fn decide_json<'a>(
        &'a self,
        _messages: Vec<ChatMessage>,
        _schema: &'a serde_json::Value,
        _max_tokens: usize,
    ) -> futures::future::BoxFuture<'a, Result<serde_json::Value, LlmError>> {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let (n, f) = &mut *g;
        let out = f(*n);
        *n += 1;
        Box::pin(async move { out })
    }
}

fn script<F>(f: F) -> Arc<dyn Decide>
where
    F: FnMut(usize) -> Result<serde_json::Value, LlmError> + Send + 'static,
{
    Arc::new(Script(Mutex::new((0, f))))
}

#[tokio::test(start_paused = true)]
async fn a_member_whose_turns_fail_is_dropped_after_the_missed_turn_limit_and_the_host_concludes() {
    // ada hosts a model-led chat whose turns are scripted: she gives the floor to bea
    // until bea has failed her turns, then concludes. Every one of bea's turns fails.
    let failed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let bea_id = Arc::new(Mutex::new(String::new()));
    let (f, id) = (failed.clone(), bea_id.clone());
    let ada = script(move |_| {
        let bea = id.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Ok(if f.load(std::sync::atomic::Ordering::SeqCst) >= 2 {
            serde_json::json!({"type": "conclude", "content": "Scripted conclusion."})
        } else {
            serde_json::json!({"type": "discuss", "content": "Bea, your view?",
                               "next_speakers": [bea]})
        })
    });
    let f = failed.clone();
    let bea = script(move |_| {
        f.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Err(LlmError::Decode("a scripted failure".into()))
    });
    let cal = script(|n| {
        Ok(serde_json::json!({"type": "discuss", "content": format!("Nothing to add ({n}).")}))
    });
    let c = Cluster::start_scripted(
        &[("ada", None), ("bea", Some(BERTH)), ("cal", Some(PILOT))],
        &[],
        HashMap::from([("ada", ada), ("bea", bea), ("cal", cal)]),
    )
    .await;
    *bea_id.lock().expect("lock") = c.agent("bea").node_id().to_owned();
    let config = ChatConfig::default();
    let limit = config.max_missed_turns as usize;
    let params = c.talk(&["ada", "bea", "cal"], 10, config);
    let group = params.group_id.clone();
    let r = tokio::time::timeout(
        Duration::from_secs(30),
        c.agent("ada").host_group(params, None, None),
    )
    .await
    .expect("the group ends")
    .expect("the group concludes");
    assert_eq!(r.conclusion, "Scripted conclusion.");
    // bea was asked exactly as many times as the limit allows, then counted out.
    assert_eq!(failed.load(std::sync::atomic::Ordering::SeqCst), limit);
    assert_eq!(c.left("ada", &group).await, [c.agent("bea").node_id()]);
}

#[tokio::test(start_paused = true)]
async fn progress_notes_are_taken_only_from_the_assignee_of_a_running_task() {
    let c = Cluster::start(&[("ada", None), ("bea", None), ("cal", None)]).await;
    let ada = c.agent("ada");
    let bea: NodeId = c.agent("bea").node_id().parse().expect("node id");
    let cal: NodeId = c.agent("cal").node_id().parse().expect("node id");
    let mut task = Task {
        id: "t1".into(),
        assignee: bea.to_string(),
        assigner: ada.node_id().to_owned(),
        task_abstract: None,
        desc: "How full are the tanks?".into(),
        mode: TaskMode::Sync,
        state: TaskState::Running,
        assigned_turn: 1,
        deadline: 0,
        result: None,
        child_group: None,
    };
    ada.persist_task("g000000000001", &task).await;
    let note = |state: &str, task_id: &str| ProgressNote {
        group_id: "g000000000001".into(),
        task_id: task_id.into(),
        agent: "tank_log".into(),
        state: state.into(),
        progress: Some("reading the gauges".repeat(20)),
    };
    let send = |from: NodeId, n: ProgressNote| {
        ada.handle_rpc(Request {
            from,
            service: SERVICE.into(),
            method: "progress".into(),
            body: serde_json::to_vec(&n).expect("json").into(),
        })
    };
    let mut events = ada.events();

    send(bea, note("working", "t1"))
        .await
        .expect("from the assignee");
    match events.try_recv() {
        Ok(AgentEvent::AgentProgress {
            group_id,
            task_id,
            assignee,
            agent,
            state,
            progress,
        }) => {
            assert_eq!(
                (group_id.as_str(), task_id.as_str()),
                ("g000000000001", "t1")
            );
            assert_eq!((assignee.as_str(), agent.as_str()), ("bea", "tank_log"));
            assert_eq!(state, "working");
            assert_eq!(
                progress.map(|p| p.chars().count()),
                Some(PROGRESS_CHARS),
                "cut to the progress limit"
            );
        }
        other => panic!("{other:?}"),
    }
    let refused = [
        (cal, note("working", "t1")),
        (bea, note("working", "t2")),
        (bea, note("done", "t1")),
    ];
    for (from, n) in refused {
        let e = send(from, n.clone()).await.expect_err("refused");
        assert_eq!(e.code, RpcErrorCode::BadRequest, "{n:?}: {e}");
    }
    task.state = TaskState::Done;
    ada.persist_task("g000000000001", &task).await;
    let e = send(bea, note("working", "t1"))
        .await
        .expect_err("task done");
    assert_eq!(e.code, RpcErrorCode::BadRequest);
    assert!(events.try_recv().is_err(), "no event for a refused note");
}

#[tokio::test(start_paused = true)]
async fn a_person_slower_than_the_turn_timeout_misses_turns_until_counted_out() {
    // bea is a person who does not answer: her node waits five minutes (the default) for
    // her, the host only two (the default turn timeout). ada gives her the floor until
    // the missed-turn limit has passed, then concludes.
    let config = ChatConfig::default();
    let limit = config.max_missed_turns as usize;
    assert!(
        Duration::from_secs(NodeConfig::default().agent.human_timeout_secs)
            > Duration::from_millis(config.turn_timeout_ms)
    );
    let bea_id = Arc::new(Mutex::new(String::new()));
    let id = bea_id.clone();
    let ada = script(move |n| {
        let bea = id.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Ok(if n >= limit {
            serde_json::json!({"type": "conclude", "content": "Scripted conclusion."})
        } else {
            serde_json::json!({"type": "discuss", "content": "Bea, your view?",
                               "next_speakers": [bea]})
        })
    });
    let c = Cluster::start_scripted(
        &[("ada", None), ("bea", Some(BERTH))],
        &["bea"],
        HashMap::from([("ada", ada)]),
    )
    .await;
    *bea_id.lock().expect("lock") = c.agent("bea").node_id().to_owned();
    let mut bea_events = c.agent("bea").events();
    let params = c.talk(&["ada", "bea"], 10, config.clone());
    let group = params.group_id.clone();
    let (started, real) = (tokio::time::Instant::now(), std::time::Instant::now());
    let r = c
        .agent("ada")
        .host_group(params, None, None)
        .await
        .expect("the group concludes");
    let waited = started.elapsed();
    assert_eq!(r.conclusion, "Scripted conclusion.");
    // Each missed turn took the host's whole turn timeout, in virtual time.
    assert!(
        waited >= Duration::from_millis(config.turn_timeout_ms) * limit as u32,
        "{waited:?}"
    );
    // bea's person was asked once per turn, and each question was withdrawn unanswered
    // when the host stopped waiting.
    let (mut asked, mut unanswered) = (0, 0);
    while let Ok(e) = bea_events.try_recv() {
        match e {
            AgentEvent::HumanInputRequested { .. } => asked += 1,
            AgentEvent::HumanInputClosed {
                answered: false, ..
            } => unanswered += 1,
            _ => {}
        }
    }
    assert_eq!((asked, unanswered), (limit, limit));
    assert!(c.agent("bea").pending_human().is_empty());
    // Counted out after its missed turns: it left the group.
    assert_eq!(c.left("ada", &group).await, [c.agent("bea").node_id()]);
    eprintln!(
        "a silent person: {} missed turns, concluded after {:.0} s of virtual time in {:.2} s",
        limit,
        waited.as_secs_f64(),
        real.elapsed().as_secs_f64()
    );
}

/// A model slower than any turn timeout for its first `slow` decisions, then one that
/// concludes at once.
struct Stalling {
    slow: usize,
    calls: std::sync::atomic::AtomicUsize,
}

impl Decide for Stalling {
    fn decide_json<'a>(
        &'a self,
        _messages: Vec<ChatMessage>,
        _schema: &'a serde_json::Value,
        _max_tokens: usize,
    ) -> futures::future::BoxFuture<'a, Result<serde_json::Value, LlmError>> {
        let n = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async move {
            if n < self.slow {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            Ok(serde_json::json!({"type": "conclude", "content": "Scripted conclusion."}))
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_host_whose_own_model_is_too_slow_loses_turns_never_its_group() {
    let config = ChatConfig::default();
    let limit = config.max_missed_turns as usize;
    // ada's model misses the turn timeout one more time than the limit allows a member.
    let ada = Arc::new(Stalling {
        slow: limit + 1,
        calls: Default::default(),
    });
    let ada_id = Arc::new(Mutex::new(String::new()));
    let id = ada_id.clone();
    let bea = script(move |n| {
        let ada = id.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Ok(
            serde_json::json!({"type": "discuss", "content": format!("Over to you ({n})."),
                              "next_speakers": [ada]}),
        )
    });
    let c = Cluster::start_scripted(
        &[("ada", None), ("bea", Some(BERTH))],
        &[],
        HashMap::from([("ada", ada.clone() as Arc<dyn Decide>), ("bea", bea)]),
    )
    .await;
    *ada_id.lock().expect("lock") = c.agent("ada").node_id().to_owned();
    let params = c.talk(&["ada", "bea"], 20, config.clone());
    let group = params.group_id.clone();
    let started = tokio::time::Instant::now();
    let r = c
        .agent("ada")
        .host_group(params, None, None)
        .await
        .expect("the group concludes");
    // The host's own conclusion, after its late turns were lost.
    assert_eq!(r.conclusion, "Scripted conclusion.");
    assert_eq!(
        ada.calls.load(std::sync::atomic::Ordering::SeqCst),
        limit + 2
    );
    assert!(
        started.elapsed() >= Duration::from_millis(config.turn_timeout_ms) * (limit as u32 + 1)
    );
    assert!(c.left("ada", &group).await.is_empty());
}
