//! Team formation (Internet of Agents, "regular team formation"): given a task, the node's
//! model loops over two tools, `search_agents(queries)` and `launch_group(members)`, with
//! every call produced by grammar-constrained decoding, so even a 135M model always emits a
//! valid call. An empty member list means "work alone".
//!
//! Bounds: at most [`FormationConfig::max_calls`] calls. The first call is always a search
//! (whether to work alone is decided knowing who is available; searching the local card
//! book costs no network traffic). The last call may only be `launch_group` (so is any call
//! after two searches in a row that found nobody new), and a forced launch must name at
//! least one candidate its searches found. With [`FormationConfig::require_team`] (the
//! node already tried alone and could not support its answer) every launch must name a
//! candidate when there is one.
//!
//! The first search also runs each sentence of the task as a query of its own
//! ([`MAX_TASK_SENTENCES`]): a small model's queries tend to copy its worked example, while a
//! task's sentences usually state one need each.
//!
//! The launch call is one yes/no decision per shown candidate (not a list to fill, which a
//! small model tends to stop after one name). A team the model launched is led by the
//! *skill cover* ([`FormationConfig::cover_skills`]): the best match of each sentence of
//! the task, strongest first, then the best match of each of the model's queries when a
//! search for one of the task's sentences also found that agent; the model's picks fill what
//! room is left. (On the team-formation benchmark with the default 135M model, a sentence's
//! best match is a gold agent 32% of the time, a candidate the model said yes to 17%, and its
//! own queries' best match 2%, since they copy its worked example: ungrounded, they only
//! padded teams.)
//! Candidate members are shown to the model under short labels (`A1`,
//! `A2`, ...) and the schema's enum only allows labels it has seen, so a launch can never
//! name an agent that does not exist. The contact book (past collaborators and how the
//! work went) is part of the prompt.
//!
//! The loop is generic over how agents are searched ([`AgentSearch`]), so the same code
//! runs against the live card book of a node and against an offline registry
//! (`starling eval team-formation --full`).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use starling_models::chat::ChatMessage;

use super::card::CardHit;
use crate::llm::{Decide, LlmError};

/// Limits of the loop.
#[derive(Debug, Clone)]
pub struct FormationConfig {
    /// Tool calls before launch is forced (the paper: 10).
    pub max_calls: usize,
    /// Results shown per search query.
    pub per_query: usize,
    /// Most members of a launched team (besides this node).
    pub max_members: usize,
    /// Working alone is not an option while any candidate was found.
    pub require_team: bool,
    /// Lead a launched team with the skill cover: the best match of each task sentence
    /// (at cosine >= 0.4), strongest first, then of each model query (when it really
    /// matches, see [`covers`], and a task sentence's search also found the agent). The
    /// model's picks fill the rest. Off: the team is the model's picks alone.
    pub cover_skills: bool,
}

/// Whether a search hit really matches its query: they share a term, or their embeddings
/// are close (all-MiniLM-L6-v2 puts unrelated short texts below about 0.3).
pub fn covers(hit: &CardHit) -> bool {
    hit.bm25 > 0.0 || hit.cosine >= 0.4
}

impl Default for FormationConfig {
    fn default() -> Self {
        Self {
            max_calls: 10,
            per_query: 4,
            max_members: 4,
            require_team: false,
            cover_skills: true,
        }
    }
}

/// A past collaborator, as the prompt shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContactLine {
    /// Node id.
    pub node_id: String,
    /// Name.
    pub name: String,
    /// Tasks done together.
    pub tasks: u64,
    /// Of which successful.
    pub successes: u64,
}

/// Searches agent cards for one query.
pub trait AgentSearch {
    /// The best cards for `query`, best first.
    fn search(&self, query: &str, k: usize) -> impl Future<Output = Vec<CardHit>> + Send;
}

/// One tool call the model made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "tool", rename_all = "snake_case")]
pub enum ToolCall {
    /// Search the swarm's cards.
    SearchAgents {
        /// Queries (1 to 3).
        queries: Vec<String>,
    },
    /// Launch the group (empty: work alone).
    LaunchGroup {
        /// Labels of the chosen candidates.
        members: Vec<String>,
    },
}

/// A chosen member.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recruit {
    /// Node id.
    pub node_id: String,
    /// Name.
    pub name: String,
    /// Best search score it had.
    pub score: f32,
}

/// The result of team formation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Formation {
    /// The team (without this node); empty = work alone.
    pub members: Vec<Recruit>,
    /// Every call, in order.
    pub calls: Vec<ToolCall>,
    /// Whether launch was forced by the call limit.
    pub forced: bool,
    /// Candidates seen, by label.
    pub candidates: Vec<(String, Recruit)>,
}

#[derive(Debug, Deserialize)]
struct RawCall {
    tool: String,
    #[serde(default)]
    queries: Vec<String>,
    #[serde(default)]
    members: BTreeMap<String, bool>,
}

/// Which tools the next call may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallStep {
    /// Only `search_agents` (the first call).
    SearchFirst,
    /// Either tool.
    Free,
    /// Only `launch_group`.
    ForcedLaunch,
}

/// Candidates the launch call decides on (the best-scored ones); more would make the
/// prompt and the call too long for a small model's context.
pub const MAX_SHOWN: usize = 12;

/// The JSON Schema of the next call: `{"tool": "search_agents", "queries": [...]}` with 1-3
/// plain-word queries, or `{"tool": "launch_group", "members": {"A1": true, ...}}` with one
/// yes/no decision per shown candidate `labels` (all "no" means working alone). A decision
/// per candidate, instead of a list to fill, keeps a small model from stopping after the
/// first name it writes.
pub fn call_schema(labels: &[String], step: CallStep) -> Value {
    let search = json!({
        "type": "object",
        "properties": {
            "tool": {"const": "search_agents"},
            "queries": {
                "type": "array",
                // Plain words only: a small model otherwise drifts into URLs and code.
                "items": {"type": "string", "pattern": "^[A-Za-z][A-Za-z ,-]{2,39}$"},
                "minItems": 1,
                "maxItems": 3
            }
        },
        "required": ["tool", "queries"],
        "additionalProperties": false
    });
    let decisions: serde_json::Map<String, Value> = labels
        .iter()
        .map(|l| (l.clone(), json!({"type": "boolean"})))
        .collect();
    let launch = json!({
        "type": "object",
        "properties": {
            "tool": {"const": "launch_group"},
            "members": {
                "type": "object",
                "properties": decisions,
                "required": labels,
                "additionalProperties": false
            }
        },
        "required": ["tool", "members"],
        "additionalProperties": false
    });
    match step {
        CallStep::SearchFirst => search,
        CallStep::ForcedLaunch => launch,
        CallStep::Free => json!({"anyOf": [search, launch]}),
    }
}

const SYSTEM: &str = "You form a team of agents for a task. Tools:\n\
- search_agents: find agents whose skills match; give 1-3 short queries, one per skill the task needs.\n\
- launch_group: start the team; say true for every candidate whose skill the task needs and false for the others. All false means you work alone.\n\
Search first for every skill the task needs, then launch. Answer with one JSON tool call.";

/// Most sentences of a task that the first search runs as queries of their own.
pub const MAX_TASK_SENTENCES: usize = 6;

/// Cosine from which a task sentence's best match counts as covering a skill.
const SENTENCE_COVER_COSINE: f32 = 0.4;

/// The sentences of `task` the first search adds to the model's `queries` (at most
/// [`MAX_TASK_SENTENCES`], each cut to 300 characters, none the model already asked).
fn task_sentences(task: &str, queries: &[String]) -> Vec<String> {
    crate::search::split_sentences(task)
        .into_iter()
        .map(|s| s.chars().take(300).collect::<String>())
        .filter(|s| !queries.iter().any(|q| q.eq_ignore_ascii_case(s)))
        .take(MAX_TASK_SENTENCES)
        .collect()
}

/// Labels of the candidates a launch decides on: the [`MAX_SHOWN`] best-scored, in label
/// order.
fn shown_labels(cands: &BTreeMap<String, (Recruit, String)>) -> Vec<String> {
    let mut by_score: Vec<(&String, f32)> = cands.iter().map(|(l, (r, _))| (l, r.score)).collect();
    by_score.sort_by(|a, b| b.1.total_cmp(&a.1));
    let mut labels: Vec<String> = by_score
        .into_iter()
        .take(MAX_SHOWN)
        .map(|(l, _)| l.clone())
        .collect();
    labels.sort_by_key(|l| {
        l.trim_start_matches('A')
            .parse::<usize>()
            .unwrap_or(usize::MAX)
    });
    labels
}

fn render_candidates(cands: &BTreeMap<String, (Recruit, String)>, labels: &[String]) -> String {
    if labels.is_empty() {
        return "Candidates: none yet.\n".into();
    }
    let mut s = String::from("Candidates:\n");
    for label in labels {
        if let Some((r, desc)) = cands.get(label) {
            s.push_str(&format!("{label}: {} - {desc}\n", r.name));
        }
    }
    s
}

/// The skills a task needs, as the searches found them.
#[derive(Debug, Default)]
struct SkillCover {
    /// The best match of each task sentence that really matches it, with its cosine.
    sentence_tops: Vec<(String, f32)>,
    /// Every candidate a task sentence found.
    sentence_found: BTreeSet<String>,
    /// The best match of each model query that really matches it and that a task sentence
    /// also found (the model's own words are only trusted where the task backs them).
    query_tops: Vec<String>,
}

impl SkillCover {
    /// Records that a search for a task sentence (`sentence`) or a model query found
    /// `label`; `top` when it is that search's best hit and really matches it.
    fn observe(&mut self, label: &str, sentence: bool, top: bool, cosine: f32) {
        if sentence {
            self.sentence_found.insert(label.to_owned());
            if top {
                self.sentence_tops.push((label.to_owned(), cosine));
            }
        } else if top
            && self.sentence_found.contains(label)
            && !self.query_tops.iter().any(|l| l == label)
        {
            self.query_tops.push(label.to_owned());
        }
    }

    /// The cover in the order it joins a team: the sentences' best matches, closest first
    /// (a weak match is the first the member limit cuts), then the queries' in the order
    /// they were asked; each candidate once.
    fn ordered(&self) -> Vec<String> {
        let mut by_cosine = self.sentence_tops.clone();
        by_cosine.sort_by(|a, b| b.1.total_cmp(&a.1));
        let mut cover: Vec<String> = Vec::new();
        for label in by_cosine
            .into_iter()
            .map(|(l, _)| l)
            .chain(self.query_tops.iter().cloned())
        {
            if !cover.contains(&label) {
                cover.push(label);
            }
        }
        cover
    }
}

/// The launched members, at most [`FormationConfig::max_members`]: nobody when the model
/// chose nobody and no team is required (it works alone); otherwise the skill `cover` in
/// order, then the chosen labels, best-scored first. When a team is required (a forced
/// launch follows searches the model chose to make; `require_team` after an unsupported
/// answer alone) and there is neither a choice nor a cover, the best-scored candidate.
fn pick_members(
    cands: &BTreeMap<String, (Recruit, String)>,
    mut chosen: Vec<String>,
    cover: &[String],
    need_one: bool,
    config: &FormationConfig,
) -> Vec<String> {
    let score = |l: &String| cands.get(l).map_or(f32::MIN, |(r, _)| r.score);
    if chosen.is_empty() && !need_one {
        return Vec::new();
    }
    chosen.sort_by(|a, b| score(b).total_cmp(&score(a)));
    let mut team: Vec<String> = Vec::new();
    for l in cover.iter().chain(&chosen) {
        if !team.contains(l) && cands.contains_key(l) {
            team.push(l.clone());
        }
    }
    if team.is_empty() {
        team.extend(
            shown_labels(cands)
                .into_iter()
                .max_by(|a, b| score(a).total_cmp(&score(b))),
        );
    }
    team.truncate(config.max_members.max(1));
    team
}

/// Runs the loop. `self_id` is left out of every search result.
pub async fn form_team<S: AgentSearch>(
    decide: &dyn Decide,
    search: &S,
    task: &str,
    self_id: &str,
    contacts: &[ContactLine],
    config: &FormationConfig,
) -> Result<Formation, LlmError> {
    // label -> (recruit, short description); insertion order kept by numbering.
    let mut cands: BTreeMap<String, (Recruit, String)> = BTreeMap::new();
    let mut by_node: BTreeMap<String, String> = BTreeMap::new();
    let mut calls = Vec::new();
    let mut history: Vec<String> = Vec::new();
    let max_calls = config.max_calls.max(1);
    // Searches in a row that found no new candidate; after two, launch is forced.
    let mut dry_searches = 0;
    let mut skills = SkillCover::default();
    for i in 0..max_calls {
        let force = i + 1 == max_calls || (dry_searches >= 2 && !cands.is_empty());
        let step = if force {
            CallStep::ForcedLaunch
        } else if i == 0 {
            CallStep::SearchFirst
        } else {
            CallStep::Free
        };
        let labels = shown_labels(&cands);
        let schema = call_schema(&labels, step);
        let mut user = format!("Task: {task}\n");
        if !contacts.is_empty() {
            user.push_str("Past collaborators: ");
            let parts: Vec<String> = contacts
                .iter()
                .take(8)
                .map(|c| {
                    format!(
                        "{} ({} of {} tasks went well)",
                        c.name, c.successes, c.tasks
                    )
                })
                .collect();
            user.push_str(&parts.join("; "));
            user.push('\n');
        }
        user.push_str(&render_candidates(&cands, &labels));
        if !history.is_empty() {
            user.push_str("Calls so far: ");
            user.push_str(&history.join("; "));
            user.push('\n');
        }
        if force {
            user.push_str("This is your last call: launch the group now.\n");
        }
        // One worked example: small models imitate far better than they follow rules. It
        // shows a candidate turned down, so "everyone" is not the pattern to copy.
        let messages = vec![
            ChatMessage::system(SYSTEM),
            ChatMessage::user(
                "Task: Translate our contract into German and check the tax figures.\nCandidates: none yet.\n",
            ),
            ChatMessage::assistant(
                r#"{"tool": "search_agents", "queries": ["legal translation German", "tax accounting check"]}"#,
            ),
            ChatMessage::user(
                "Task: Translate our contract into German and check the tax figures.\nCandidates:\nA1: lena - Translates legal documents between English and German.\nA2: mira - Paints murals and designs posters.\nA3: otto - Accountant who reviews tax returns and figures.\nCalls so far: search_agents(legal translation German | tax accounting check) found 3 new\n",
            ),
            ChatMessage::assistant(
                r#"{"tool": "launch_group", "members": {"A1": true, "A2": false, "A3": true}}"#,
            ),
            ChatMessage::user(user),
        ];
        // Room for the longest call the schema allows, even spelled one character per token.
        let budget = 200 + 16 * labels.len();
        let raw = decide.decide_json(messages, &schema, budget).await?;
        let raw: RawCall = serde_json::from_value(raw.clone())
            .map_err(|e| LlmError::Decode(format!("{e}: {raw}")))?;
        tracing::debug!(
            call = i + 1,
            tool = %raw.tool,
            queries = ?raw.queries,
            members = ?raw.members,
            candidates = cands.len(),
            "team formation call"
        );
        let call = if raw.tool == "search_agents" && !force {
            let queries: Vec<String> = raw
                .queries
                .into_iter()
                .map(|q| q.trim().to_owned())
                .filter(|q| !q.is_empty())
                .collect();
            // An empty search still costs a call; it finds nothing new.
            let queries = if queries.is_empty() {
                vec![task.chars().take(60).collect()]
            } else {
                queries
            };
            // The first search also runs the task's own sentences: a small model's queries
            // drift towards its worked example, while each sentence of a task usually states
            // one thing it needs. Their best matches count for the cover only when close in
            // meaning, since a sentence shares some word with nearly every card.
            let sentences = if i == 0 {
                task_sentences(task, &queries)
            } else {
                Vec::new()
            };
            // Sentences first, so a query's best match can be checked against what they
            // found.
            let runs = sentences
                .iter()
                .map(|q| (q, true))
                .chain(queries.iter().map(|q| (q, false)));
            let mut found = 0;
            for (q, sentence) in runs {
                let mut first = true;
                for hit in search.search(q, config.per_query + 1).await {
                    let id = hit.card.node_id.clone();
                    if id == self_id {
                        continue;
                    }
                    let matches = if sentence {
                        hit.cosine >= SENTENCE_COVER_COSINE
                    } else {
                        covers(&hit)
                    };
                    let top = std::mem::take(&mut first) && matches;
                    let label = match by_node.get(&id) {
                        Some(label) => {
                            if let Some((r, _)) = cands.get_mut(label) {
                                r.score = r.score.max(hit.score);
                            }
                            label.clone()
                        }
                        None => {
                            let label = format!("A{}", cands.len() + 1);
                            let desc: String =
                                hit.card.card.description.chars().take(120).collect();
                            by_node.insert(id.clone(), label.clone());
                            let recruit = Recruit {
                                node_id: id,
                                name: hit.card.card.name.clone(),
                                score: hit.score,
                            };
                            cands.insert(label.clone(), (recruit, desc));
                            found += 1;
                            label
                        }
                    };
                    skills.observe(&label, sentence, top, hit.cosine);
                }
            }
            let with = if sentences.is_empty() {
                ""
            } else {
                " and the task's sentences"
            };
            history.push(format!(
                "search_agents({}){with} found {found} new",
                queries.join(" | ")
            ));
            if found == 0 {
                dry_searches += 1;
            } else {
                dry_searches = 0;
            }
            ToolCall::SearchAgents { queries }
        } else {
            let chosen: Vec<String> = labels
                .iter()
                .filter(|l| raw.members.get(*l).copied().unwrap_or(false))
                .cloned()
                .collect();
            let cover = if config.cover_skills {
                skills.ordered()
            } else {
                Vec::new()
            };
            let members =
                pick_members(&cands, chosen, &cover, force || config.require_team, config);
            calls.push(ToolCall::LaunchGroup {
                members: members.clone(),
            });
            let recruits = members
                .iter()
                .filter_map(|l| cands.get(l).map(|(r, _)| r.clone()))
                .collect();
            return Ok(Formation {
                members: recruits,
                calls,
                forced: force,
                candidates: cands.into_iter().map(|(l, (r, _))| (l, r)).collect(),
            });
        };
        calls.push(call);
    }
    // Unreachable in practice (the last call is forced to launch); launch alone.
    Ok(Formation {
        members: Vec::new(),
        calls,
        forced: true,
        candidates: cands.into_iter().map(|(l, (r, _))| (l, r)).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::card::{AgentCard, CardBook};
    use crate::config::AgentKind;
    use crate::llm::Llm;
    use starling_models::engine::{Engine, EngineConfig, ModelSlot};
    use std::sync::Mutex;

    struct Book(Mutex<CardBook>);

    /// Decisions read from a list, one per call, recording what each call was shown.
    struct Script(Mutex<(Vec<Value>, Vec<String>)>);

    impl Decide for Script {
        fn decide_json<'a>(
            &'a self,
            messages: Vec<ChatMessage>,
            _schema: &'a Value,
            _max_tokens: usize,
        ) -> futures::future::BoxFuture<'a, Result<Value, LlmError>> {
            let mut g = self.0.lock().unwrap();
            g.1.push(
                messages
                    .last()
                    .map(|m| m.content.clone())
                    .unwrap_or_default(),
            );
            let next = match g.0.is_empty() {
                true => Err(LlmError::Decode("the script is over".into())),
                false => Ok(g.0.remove(0)),
            };
            Box::pin(async move { next })
        }
    }

    fn book(cards: &[(&str, &str)]) -> Book {
        let mut book = CardBook::new(0);
        for (i, (name, desc)) in cards.iter().enumerate() {
            let card = AgentCard {
                name: name.to_string(),
                description: desc.to_string(),
                skills: vec![],
                kind: AgentKind::Tool,
                tools: vec![],
                models: vec![],
                agent: None,
            };
            book.upsert(&format!("n{i}"), 1, card, vec![]);
        }
        Book(Mutex::new(book))
    }

    #[tokio::test]
    async fn the_team_is_the_one_the_decisions_launch() {
        let book = book(&[
            ("chem", "chemistry lab analysis of soil samples"),
            ("astro", "astronomy telescope data"),
        ]);
        let script = Script(Mutex::new((
            vec![
                json!({"tool": "search_agents", "queries": ["chemistry lab analysis"]}),
                json!({"tool": "launch_group", "members": {"A1": true}}),
            ],
            Vec::new(),
        )));
        let cfg = FormationConfig {
            cover_skills: false,
            ..FormationConfig::default()
        };
        let task = "analyse the soil samples in a chemistry lab";
        let f = form_team(&script, &book, task, "me", &[], &cfg)
            .await
            .unwrap();
        let (left, shown) = script.0.into_inner().unwrap();
        assert!(left.is_empty(), "every decision was asked for");
        // The second call was shown what the first one's search found, as A1.
        assert!(shown[1].contains("A1: chem"), "{}", shown[1]);
        assert!(matches!(f.calls[0], ToolCall::SearchAgents { .. }), "{f:?}");
        let team: Vec<&str> = f.members.iter().map(|m| m.node_id.as_str()).collect();
        assert_eq!(team, ["n0"], "{f:?}");
        assert!(!f.forced);
    }

    impl AgentSearch for Book {
        async fn search(&self, query: &str, k: usize) -> Vec<CardHit> {
            self.0.lock().unwrap().search(query, &[], k, &[])
        }
    }

    #[tokio::test]
    async fn loop_always_ends_with_a_valid_launch() {
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
        let book = book(&[
            ("chem", "chemistry lab analysis"),
            ("astro", "astronomy telescope data"),
            ("me", "the searching node"),
        ]);
        for max_calls in [1, 3] {
            let cfg = FormationConfig {
                max_calls,
                ..FormationConfig::default()
            };
            let f = form_team(
                &llm,
                &book,
                "analyse chemistry and astronomy data",
                "n2",
                &[],
                &cfg,
            )
            .await
            .unwrap();
            assert!(f.calls.len() <= max_calls, "{f:?}");
            if max_calls > 1 {
                assert!(
                    matches!(f.calls[0], ToolCall::SearchAgents { .. }),
                    "the first call searches: {f:?}"
                );
            }
            assert!(
                matches!(f.calls.last(), Some(ToolCall::LaunchGroup { .. })),
                "{f:?}"
            );
            assert!(
                f.members.iter().all(|m| m.node_id != "n2"),
                "never itself: {f:?}"
            );
            for m in &f.members {
                assert!(f.candidates.iter().any(|(_, r)| r.node_id == m.node_id));
            }
        }
    }

    #[test]
    fn the_first_search_adds_the_tasks_own_sentences() {
        let task = "Translate the contract into German. Check the tax figures! Thanks.";
        assert_eq!(
            task_sentences(task, &["check the tax figures!".into()]),
            vec!["Translate the contract into German.", "Thanks."]
        );
        let long = "Need one thing. ".repeat(20);
        assert_eq!(task_sentences(&long, &[]).len(), MAX_TASK_SENTENCES);
        let huge = "x".repeat(1000);
        assert_eq!(task_sentences(&huge, &[])[0].chars().count(), 300);
    }

    #[test]
    fn skill_cover_orders_sentence_matches_by_closeness_and_grounds_queries() {
        let mut c = SkillCover::default();
        // Sentence 1 finds A1 (best, 0.45) and A3; sentence 2 finds A2 (best, 0.7);
        // sentence 3's best (A4) is too far to count but A4 is still "found".
        c.observe("A1", true, true, 0.45);
        c.observe("A3", true, false, 0.41);
        c.observe("A2", true, true, 0.7);
        c.observe("A4", true, false, 0.2);
        // Query tops: A5 no sentence found (ungrounded), A3 grounded, A2 already in, A4
        // grounded but not a real match of its query.
        c.observe("A5", false, true, 0.9);
        c.observe("A3", false, true, 0.5);
        c.observe("A2", false, true, 0.8);
        c.observe("A4", false, false, 0.3);
        assert_eq!(c.ordered(), vec!["A2", "A1", "A3"]);
        assert!(SkillCover::default().ordered().is_empty());
    }

    #[test]
    fn schema_only_allows_known_labels_and_forced_launch() {
        let labels = vec!["A1".to_string(), "A2".to_string()];
        let s = call_schema(&labels, CallStep::ForcedLaunch);
        assert_eq!(s["properties"]["tool"]["const"], json!("launch_group"));
        assert_eq!(s["properties"]["members"]["required"], json!(["A1", "A2"]));
        assert_eq!(
            s["properties"]["members"]["additionalProperties"],
            json!(false)
        );
        let s = call_schema(&[], CallStep::SearchFirst);
        assert_eq!(s["properties"]["tool"]["const"], json!("search_agents"));
        let s = call_schema(&labels, CallStep::Free);
        assert_eq!(s["anyOf"].as_array().map(Vec::len), Some(2));
    }

    fn cand(label: &str, score: f32) -> (String, (Recruit, String)) {
        (
            label.to_string(),
            (
                Recruit {
                    node_id: format!("n-{label}"),
                    name: label.to_lowercase(),
                    score,
                },
                String::new(),
            ),
        )
    }

    #[test]
    fn launch_keeps_the_best_chosen_and_falls_back_only_when_a_team_is_needed() {
        let cands: BTreeMap<_, _> = [cand("A1", 0.2), cand("A2", 0.9), cand("A3", 0.5)]
            .into_iter()
            .collect();
        let cfg = FormationConfig {
            max_members: 2,
            ..FormationConfig::default()
        };
        let all = vec!["A1".to_string(), "A2".to_string(), "A3".to_string()];
        assert_eq!(
            pick_members(&cands, all, &[], false, &cfg),
            vec!["A2", "A3"]
        );
        assert!(pick_members(&cands, vec![], &[], false, &cfg).is_empty());
        assert_eq!(pick_members(&cands, vec![], &[], true, &cfg), vec!["A2"]);
        // The skill cover leads a team, the model's picks fill the room left; the cover
        // never turns "alone" into a team, but is the team when one is required.
        let cover = vec!["A1".to_string(), "A2".to_string()];
        assert_eq!(
            pick_members(&cands, vec!["A2".into()], &cover, false, &cfg),
            vec!["A1", "A2"]
        );
        assert_eq!(
            pick_members(&cands, vec!["A3".into()], &cover[..1], false, &cfg),
            vec!["A1", "A3"]
        );
        assert_eq!(
            pick_members(&cands, vec!["A3".into()], &cover, false, &cfg),
            vec!["A1", "A2"]
        );
        assert!(pick_members(&cands, vec![], &cover, false, &cfg).is_empty());
        assert_eq!(pick_members(&cands, vec![], &cover, true, &cfg), cover);
        let many: BTreeMap<_, _> = (1..=20).map(|i| cand(&format!("A{i}"), i as f32)).collect();
        let shown = shown_labels(&many);
        assert_eq!(shown.len(), MAX_SHOWN);
        assert_eq!(shown.first().map(String::as_str), Some("A9"));
        assert_eq!(shown.last().map(String::as_str), Some("A20"));
    }
}
