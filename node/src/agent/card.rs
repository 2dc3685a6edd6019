//! Agent cards: who a node's agent is (name, description, skills, kind, tools, models),
//! published as a signed `card` record that the swarm replicates, and searched by
//! meaning over every card a node knows.
//!
//! Records are immutable, so a changed card is a new record; [`CardBook`] keeps the newest
//! card per author (by record timestamp) and indexes it for hybrid search (BM25 over the
//! card text + cosine of its embedding, fused as in [`crate::search`]).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use serde::{Deserialize, Serialize};
use starling_discovery::Record;

use crate::config::{AgentKind, NodeConfig};
use crate::search::{chunks, HybridIndex, HybridOptions, CHUNK_WORDS};

/// Record kind of agent cards.
pub const CARD_KIND: &str = "card";
/// Longest accepted card body.
pub const MAX_CARD_BYTES: usize = 16 * 1024;

/// An agent card, as published (JSON body of a `card` record).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentCard {
    /// Agent name (the node name).
    pub name: String,
    /// What it knows and does.
    pub description: String,
    /// Skills or tags.
    #[serde(default)]
    pub skills: Vec<String>,
    /// Who answers: its model and tools, or a person.
    pub kind: AgentKind,
    /// Tools it offers to other members.
    #[serde(default)]
    pub tools: Vec<String>,
    /// Models it serves.
    #[serde(default)]
    pub models: Vec<String>,
    /// The third-party agent that answers the tasks assigned to this node
    /// (`[agent] executor = "external:NAME"`): a whole task may be handed to it verbatim.
    /// Left out of the JSON when there is none, so such cards read the same as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

/// Why a card record was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum CardError {
    /// Not a card record.
    #[error("record kind is `{0}`, not `card`")]
    Kind(String),
    /// Too large or not valid JSON of a card.
    #[error("invalid card: {0}")]
    Invalid(String),
}

impl AgentCard {
    /// The card a node's config describes. A node whose executor is an external agent
    /// advertises that agent: its description and skills (where the entry gives them)
    /// and its name in `agent`.
    pub fn from_config(config: &NodeConfig, models: Vec<String>) -> Self {
        let fronted = config.agent.fronted().ok().flatten();
        let description = match fronted {
            Some(x) if !x.description.trim().is_empty() => x.description.clone(),
            _ => config.agent.description.clone(),
        };
        let skills = match fronted {
            Some(x) if !x.skills.is_empty() => x.skills.clone(),
            _ => config.agent.skills.clone(),
        };
        Self {
            name: config.node_name(),
            description,
            skills,
            kind: config.agent.kind,
            tools: config.agent.tools.clone(),
            models,
            agent: fronted.map(|x| x.name.clone()),
        }
    }

    /// The text that is embedded: what the agent does (description and skills). The name
    /// is left out: it is an identifier, and in an embedding it only pulls together cards
    /// with similar-sounding names (on a 1,200-card benchmark, leaving names and types out
    /// of the embedded text raised the share of requirements whose best match is the right
    /// agent from 32% to 41%). A card with neither description nor skills embeds its name.
    pub fn search_text(&self) -> String {
        let mut s = self.description.trim().to_owned();
        if !self.skills.is_empty() {
            if !s.is_empty() {
                s.push(' ');
            }
            s.push_str("Skills: ");
            s.push_str(&self.skills.join(", "));
            s.push('.');
        }
        if s.is_empty() {
            s = self.name.clone();
        }
        s
    }

    /// The texts of [`AgentCard::search_text`] that are embedded, one vector each: the whole
    /// text, or its [`chunks`] when it is long (see [`crate::search`], "Whole texts").
    pub fn passages(&self) -> Vec<String> {
        chunks(&self.search_text(), CHUNK_WORDS)
    }

    /// The text that is indexed for keyword search: the name (so that a search for it finds
    /// the card) and [`AgentCard::search_text`].
    pub fn index_text(&self) -> String {
        format!("{}. {}", self.name, self.search_text())
    }

    /// Encodes for publishing.
    pub fn to_body(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes a received card record (already signature-checked by the swarm).
    pub fn from_record(r: &Record) -> Result<Self, CardError> {
        if r.kind() != CARD_KIND {
            return Err(CardError::Kind(r.kind().to_owned()));
        }
        if r.body().len() > MAX_CARD_BYTES {
            return Err(CardError::Invalid("too large".into()));
        }
        let card: Self =
            serde_json::from_slice(r.body()).map_err(|e| CardError::Invalid(e.to_string()))?;
        if card.name.trim().is_empty() || card.name.chars().count() > 64 {
            return Err(CardError::Invalid("name must be 1 to 64 characters".into()));
        }
        Ok(card)
    }
}

/// How card searches weigh meaning against keywords: the general default (0.7 x cosine +
/// 0.3 x BM25, max-normalised). On team-formation data written independently of this code it
/// beat the 0.9/0.1 that a synthetic benchmark had favoured, by 1 to 2 points of MRR on two
/// sets (`benches/team_formation/README.md`).
const CARD_FUSION: HybridOptions<'static> = HybridOptions {
    semantic_weight: 0.7,
    lexical_weight: 0.3,
    prior: None,
};

/// The weights of the node's card search (for evaluations that reproduce it).
pub fn card_fusion() -> HybridOptions<'static> {
    CARD_FUSION
}

/// A card with its author and when it was published.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KnownCard {
    /// Author node id (text form).
    pub node_id: String,
    /// Record timestamp.
    pub published_ms: u64,
    /// The card.
    pub card: AgentCard,
}

/// A search result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CardHit {
    /// The card.
    pub card: KnownCard,
    /// Fused score (higher is better).
    pub score: f32,
    /// BM25 part.
    pub bm25: f32,
    /// Cosine part.
    pub cosine: f32,
}

/// Every card a node knows (newest per author), indexed for search.
pub struct CardBook {
    cards: HashMap<u64, KnownCard>,
    index: HybridIndex,
}

fn key_of(node_id: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    node_id.hash(&mut h);
    h.finish()
}

impl CardBook {
    /// An empty book for embeddings of `dim` dimensions (0: text search only).
    pub fn new(dim: usize) -> Self {
        Self {
            cards: HashMap::new(),
            index: HybridIndex::new(dim.max(1)),
        }
    }

    /// Adds or replaces the card of `node_id` if `published_ms` is newer than what the book
    /// has. `embeddings` are the card's [`AgentCard::passages`] embedded (none when there
    /// is no embedder); its [`AgentCard::index_text`] is indexed for BM25. Returns whether
    /// the book changed.
    pub fn upsert(
        &mut self,
        node_id: &str,
        published_ms: u64,
        card: AgentCard,
        embeddings: Vec<Vec<f32>>,
    ) -> bool {
        let key = key_of(node_id);
        if let Some(old) = self.cards.get(&key) {
            if old.published_ms >= published_ms {
                return false;
            }
        }
        let text = card.index_text();
        let dim = self.index.dim();
        let vectors = if !embeddings.is_empty() && embeddings.iter().all(|e| e.len() == dim) {
            embeddings
        } else {
            // No embedder (or a mismatched one): a constant unit vector keeps the entry
            // searchable by text; its cosine then carries no signal.
            let mut v = vec![0.0; dim];
            v[0] = 1.0;
            vec![v]
        };
        if let Err(e) = self.index.insert_passages(key, &text, vectors) {
            tracing::warn!(node = node_id, error = %e, "card not indexed");
            return false;
        }
        self.cards.insert(
            key,
            KnownCard {
                node_id: node_id.to_owned(),
                published_ms,
                card,
            },
        );
        true
    }

    /// Forgets a node's card.
    pub fn remove(&mut self, node_id: &str) -> bool {
        let key = key_of(node_id);
        self.index.remove(key);
        self.cards.remove(&key).is_some()
    }

    /// The card of one node.
    pub fn get(&self, node_id: &str) -> Option<&KnownCard> {
        self.cards.get(&key_of(node_id))
    }

    /// All cards, by name.
    pub fn all(&self) -> Vec<KnownCard> {
        let mut v: Vec<KnownCard> = self.cards.values().cloned().collect();
        v.sort_by(|a, b| {
            a.card
                .name
                .cmp(&b.card.name)
                .then(a.node_id.cmp(&b.node_id))
        });
        v
    }

    /// Number of cards.
    pub fn len(&self) -> usize {
        self.cards.len()
    }

    /// Whether the book is empty.
    pub fn is_empty(&self) -> bool {
        self.cards.is_empty()
    }

    /// The `k` best cards for `query` (with its embedding, or empty for text only),
    /// leaving out `exclude` (e.g. the searching node itself).
    pub fn search(
        &self,
        query: &str,
        query_embedding: &[f32],
        k: usize,
        exclude: &[&str],
    ) -> Vec<CardHit> {
        self.search_with_parts(query, query_embedding, &[], k, exclude)
    }

    /// [`CardBook::search`] for a query of several sentences, each given with its embedding
    /// in `parts` ([`HybridIndex::search_with_parts`]: the whole query, plus half of the best
    /// sentence's score).
    pub fn search_with_parts(
        &self,
        query: &str,
        query_embedding: &[f32],
        parts: &[(&str, &[f32])],
        k: usize,
        exclude: &[&str],
    ) -> Vec<CardHit> {
        let skip: Vec<u64> = exclude.iter().map(|id| key_of(id)).collect();
        let prior = |key: u64| if skip.contains(&key) { 0.0 } else { 1.0 };
        let opts = HybridOptions {
            prior: Some(&prior),
            ..CARD_FUSION
        };
        self.index
            .search_with_parts(query, query_embedding, parts, k + skip.len(), &opts)
            .into_iter()
            .filter(|h| !skip.contains(&h.key))
            .filter_map(|h| {
                self.cards.get(&h.key).map(|c| CardHit {
                    card: c.clone(),
                    score: h.score,
                    bm25: h.bm25,
                    cosine: h.cosine,
                })
            })
            .take(k)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(name: &str, desc: &str, skills: &[&str]) -> AgentCard {
        AgentCard {
            name: name.into(),
            description: desc.into(),
            skills: skills.iter().map(|s| s.to_string()).collect(),
            kind: AgentKind::Tool,
            tools: vec![],
            models: vec![],
            agent: None,
        }
    }

    #[test]
    fn newest_card_per_author_wins_and_search_finds_it() {
        let mut b = CardBook::new(2);
        assert!(b.upsert(
            "n1",
            10,
            card("alice", "botany and plants", &["gardening"]),
            vec![vec![1.0, 0.0]]
        ));
        assert!(b.upsert(
            "n2",
            10,
            card("bob", "astronomy and telescopes", &["stars"]),
            vec![vec![0.0, 1.0]]
        ));
        assert!(!b.upsert(
            "n1",
            5,
            card("alice-old", "cooking", &[]),
            vec![vec![1.0, 0.0]]
        ));
        assert!(b.upsert(
            "n1",
            20,
            card("alice", "orchids", &["greenhouse"]),
            vec![vec![1.0, 0.0]]
        ));
        assert_eq!(b.len(), 2);
        assert_eq!(b.get("n1").unwrap().card.description, "orchids");
        let hits = b.search("telescopes for stars", &[0.0, 1.0], 5, &[]);
        assert_eq!(hits[0].card.node_id, "n2");
        let hits = b.search("telescopes for stars", &[0.0, 1.0], 5, &["n2"]);
        assert!(hits.iter().all(|h| h.card.node_id != "n2"));
        assert!(b.remove("n2"));
        assert_eq!(b.len(), 1);
    }

    #[test]
    fn the_name_is_indexed_but_not_embedded() {
        let c = card("Lexi", "translates contracts", &["German", "French"]);
        assert_eq!(
            c.search_text(),
            "translates contracts Skills: German, French."
        );
        assert_eq!(
            c.index_text(),
            "Lexi. translates contracts Skills: German, French."
        );
        assert_eq!(card("Bare", " ", &[]).search_text(), "Bare");
        assert_eq!(card("Bare", " ", &[]).passages(), vec!["Bare"]);
        assert_eq!(
            card(
                "Lexi",
                "Translates contracts. Has also done menus.",
                &["German"]
            )
            .passages(),
            vec!["Translates contracts. Has also done menus. Skills: German."]
        );
        // A search for the name finds the card by keyword.
        let mut b = CardBook::new(2);
        b.upsert("n1", 1, c, vec![vec![1.0, 0.0]]);
        b.upsert(
            "n2",
            1,
            card("Other", "plans events", &[]),
            vec![vec![0.0, 1.0]],
        );
        assert_eq!(b.search("lexi", &[], 1, &[])[0].card.node_id, "n1");
    }

    #[test]
    fn card_records_are_checked() {
        let id = starling_discovery::Identity::generate();
        let good = Record::sign(&id, CARD_KIND, card("a", "d", &[]).to_body()).unwrap();
        assert_eq!(AgentCard::from_record(&good).unwrap().name, "a");
        let bad = Record::sign(&id, CARD_KIND, b"{not json".to_vec()).unwrap();
        assert!(AgentCard::from_record(&bad).is_err());
        let wrong = Record::sign(&id, "memory", card("a", "d", &[]).to_body()).unwrap();
        assert!(matches!(
            AgentCard::from_record(&wrong),
            Err(CardError::Kind(_))
        ));
        let unnamed = Record::sign(&id, CARD_KIND, card(" ", "d", &[]).to_body()).unwrap();
        assert!(AgentCard::from_record(&unnamed).is_err());
    }
}
