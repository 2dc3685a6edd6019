//! Team formation (Internet of Agents, "regular team formation"): given a task, the node's
//! model loops over two tools, `search_agents(queries)` and `launch_group(members)`, with
//! every call produced by grammar-constrained decoding, so even a 135M model always emits a
//! valid call. An empty member list means "work alone".
//!
//! Bounds: at most [`FormationConfig::max_calls`] calls; the last one may only be
//! `launch_group` (so is any call after two searches in a row that found nobody new).
//! Candidate members are shown to the model under short labels (`A1`,
//! `A2`, ...) and the schema's enum only allows labels it has seen, so a launch can never
//! name an agent that does not exist. The contact book (past collaborators and how the
//! work went) is part of the prompt.
//!
//! The loop is generic over how agents are searched ([`AgentSearch`]), so the same code
//! runs against the live card book of a node and against an offline registry
//! (`starling eval team-formation --full`).

use std::collections::BTreeMap;
use std::future::Future;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use starling_models::chat::ChatMessage;

use super::card::CardHit;
use super::llm::{Llm, LlmError};

/// Limits of the loop.
#[derive(Debug, Clone)]
pub struct FormationConfig {
    /// Tool calls before launch is forced (the paper: 10).
    pub max_calls: usize,
    /// Results shown per search query.
    pub per_query: usize,
    /// Most members of a launched team (besides this node).
    pub max_members: usize,
}

impl Default for FormationConfig {
    fn default() -> Self {
        Self {
            max_calls: 10,
            per_query: 4,
            max_members: 4,
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
    members: Vec<String>,
}

/// The JSON Schema of the next call: `search_agents` with 1-3 short queries, or
/// `launch_group` with members drawn from `labels` (only launch when `force`).
pub fn call_schema(labels: &[String], force: bool, max_members: usize) -> Value {
    let tools: Vec<&str> = if force {
        vec!["launch_group"]
    } else {
        vec!["search_agents", "launch_group"]
    };
    let member_items = if labels.is_empty() {
        // No candidates yet: only an empty team is possible.
        json!({"type": "string", "enum": ["none"]})
    } else {
        json!({"type": "string", "enum": labels})
    };
    json!({
        "type": "object",
        "properties": {
            "tool": {"type": "string", "enum": tools},
            "queries": {
                "type": "array",
                // Plain words only: a small model otherwise drifts into URLs and code.
                "items": {"type": "string", "pattern": "^[A-Za-z][A-Za-z ,-]{2,59}$"},
                "maxItems": 3
            },
            "members": {
                "type": "array",
                "items": member_items,
                "maxItems": if labels.is_empty() { 0 } else { max_members }
            }
        },
        "required": ["tool", "queries", "members"],
        "additionalProperties": false
    })
}

const SYSTEM: &str = "You form a team of agents for a task. Tools:\n\
- search_agents: find agents whose skills match; give 1-3 short queries, one per skill the task needs.\n\
- launch_group: start the team with the chosen candidates (labels like A1). An empty list means you work alone.\n\
Search first for every skill the task needs, then launch with the best candidate for each skill. \
Answer with one JSON tool call.";

fn render_candidates(cands: &BTreeMap<String, (Recruit, String)>) -> String {
    if cands.is_empty() {
        return "Candidates: none yet.".into();
    }
    let mut s = String::from("Candidates:\n");
    for (label, (r, desc)) in cands {
        s.push_str(&format!("{label}: {} - {desc}\n", r.name));
    }
    s
}

/// Runs the loop. `self_id` is left out of every search result.
pub async fn form_team<S: AgentSearch>(
    llm: &Llm,
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
    for i in 0..max_calls {
        let force = i + 1 == max_calls || (dry_searches >= 2 && !cands.is_empty());
        let labels: Vec<String> = cands.keys().cloned().collect();
        let schema = call_schema(&labels, force, config.max_members);
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
        user.push_str(&render_candidates(&cands));
        if !history.is_empty() {
            user.push_str("Calls so far: ");
            user.push_str(&history.join("; "));
            user.push('\n');
        }
        if force {
            user.push_str("This is your last call: launch the group now.\n");
        }
        // One worked example: small models imitate far better than they follow rules.
        let messages = vec![
            ChatMessage::system(SYSTEM),
            ChatMessage::user(
                "Task: Translate our contract into German and check the tax figures.\nCandidates: none yet.\n",
            ),
            ChatMessage::assistant(
                r#"{"tool": "search_agents", "queries": ["legal translation German", "tax accounting check"], "members": []}"#,
            ),
            ChatMessage::user(user),
        ];
        let raw: RawCall = llm.decide(messages, &schema, 160).await?;
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
            let mut found = 0;
            for q in &queries {
                for hit in search.search(q, config.per_query + 1).await {
                    let id = hit.card.node_id.clone();
                    if id == self_id {
                        continue;
                    }
                    if let Some(label) = by_node.get(&id) {
                        if let Some((r, _)) = cands.get_mut(label) {
                            r.score = r.score.max(hit.score);
                        }
                        continue;
                    }
                    let label = format!("A{}", cands.len() + 1);
                    let desc: String = hit.card.card.description.chars().take(120).collect();
                    by_node.insert(id.clone(), label.clone());
                    cands.insert(
                        label,
                        (
                            Recruit {
                                node_id: id,
                                name: hit.card.card.name.clone(),
                                score: hit.score,
                            },
                            desc,
                        ),
                    );
                    found += 1;
                }
            }
            history.push(format!(
                "search_agents({}) found {found} new",
                queries.join(" | ")
            ));
            if found == 0 {
                dry_searches += 1;
            } else {
                dry_searches = 0;
            }
            ToolCall::SearchAgents { queries }
        } else {
            let mut members: Vec<String> = Vec::new();
            for m in raw.members {
                if cands.contains_key(&m) && !members.contains(&m) {
                    members.push(m);
                }
            }
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
    use starling_models::engine::{Engine, EngineConfig, ModelSlot};
    use std::sync::Mutex;

    struct Book(Mutex<CardBook>);

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
            1024,
        );
        let llm = Llm::new(ModelSlot::new(
            Engine::load(&path, &EngineConfig::default()).unwrap(),
        ));
        let mut book = CardBook::new(0);
        for (i, (name, desc)) in [
            ("chem", "chemistry lab analysis"),
            ("astro", "astronomy telescope data"),
            ("me", "the searching node"),
        ]
        .iter()
        .enumerate()
        {
            let card = AgentCard {
                name: name.to_string(),
                description: desc.to_string(),
                skills: vec![],
                kind: AgentKind::Tool,
                tools: vec![],
                models: vec![],
            };
            book.upsert(&format!("n{i}"), 1, card, vec![]);
        }
        let book = Book(Mutex::new(book));
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
    fn schema_only_allows_known_labels_and_forced_launch() {
        let s = call_schema(&["A1".into(), "A2".into()], true, 3);
        assert_eq!(s["properties"]["tool"]["enum"], json!(["launch_group"]));
        assert_eq!(
            s["properties"]["members"]["items"]["enum"],
            json!(["A1", "A2"])
        );
        let s = call_schema(&[], false, 3);
        assert_eq!(s["properties"]["members"]["maxItems"], json!(0));
        assert_eq!(
            s["properties"]["tool"]["enum"],
            json!(["search_agents", "launch_group"])
        );
    }
}
