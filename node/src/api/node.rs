//! The node API (`/api/...`): what a running node knows about itself and its swarm. The
//! CLI (`starling peers`, `starling invite`, ...) and the dashboard talk to the node
//! through these routes. Bodies are this module's own serde types, so internal types can
//! change without changing the wire.

use axum::extract::{FromRef, State};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use starling_discovery::{PeerInfo, PeerState};

use super::state::AppState;
use crate::daemon::Node;

/// State of the node routes: the node, plus the API state the shared extractors need.
#[derive(Clone)]
pub struct NodeApi {
    /// The running node.
    pub node: Node,
}

impl FromRef<NodeApi> for AppState {
    fn from_ref(s: &NodeApi) -> AppState {
        s.node.app.clone()
    }
}

/// The node routes, ready to merge with [`super::router_with`].
pub fn router(node: Node) -> Router {
    Router::new()
        .route("/api/node", get(node_info))
        .route("/api/peers", get(peers))
        .route("/api/invite", get(invite))
        .with_state(NodeApi { node })
}

/// `GET /api/node`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeInfoBody {
    /// Node id (Ed25519 public key, base32).
    pub id: String,
    /// Node name.
    pub name: String,
    /// QUIC address peers dial.
    pub addr: String,
    /// Public id of the swarm (not the secret).
    pub swarm_id: String,
    /// HTTP API address.
    pub api: String,
    /// Starling version.
    pub version: String,
    /// Seconds since start.
    pub uptime_secs: u64,
    /// Peers currently alive.
    pub peers_alive: usize,
}

/// One peer in `GET /api/peers`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PeerBody {
    /// Node id.
    pub id: String,
    /// Node name.
    pub name: String,
    /// Address to dial.
    pub addr: String,
    /// `alive`, `suspect` or `down`.
    pub state: String,
    /// Identity generation (grows on restart and rejoin).
    pub generation: u64,
}

impl From<&PeerInfo> for PeerBody {
    fn from(p: &PeerInfo) -> Self {
        Self {
            id: p.id.to_string(),
            name: p.name.clone(),
            addr: p.addr.to_string(),
            state: state_name(p.state).to_owned(),
            generation: p.generation,
        }
    }
}

/// Wire name of a peer state.
pub fn state_name(s: PeerState) -> &'static str {
    match s {
        PeerState::Alive => "alive",
        PeerState::Suspect => "suspect",
        PeerState::Down => "down",
    }
}

/// `GET /api/invite`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InviteBody {
    /// The join code (secret + this node's id and address): treat it like a password.
    pub code: String,
    /// The swarm secret alone (for `--swarm-secret` in scripts).
    pub secret: String,
    /// This node as a bootstrap address (`NODEID@HOST:PORT`).
    pub bootstrap: String,
}

async fn node_info(State(s): State<NodeApi>) -> Json<NodeInfoBody> {
    let n = &s.node;
    let code = n.swarm.join_code();
    Json(NodeInfoBody {
        id: n.swarm.node_id().to_string(),
        name: n.swarm.name().to_owned(),
        addr: n.swarm.advertised_addr().to_string(),
        swarm_id: code.secret.swarm_id().to_string(),
        api: n.api_addr.to_string(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        uptime_secs: n.started.elapsed().as_secs(),
        peers_alive: n
            .swarm
            .peers()
            .iter()
            .filter(|p| p.state == PeerState::Alive)
            .count(),
    })
}

async fn peers(State(s): State<NodeApi>) -> Json<Vec<PeerBody>> {
    Json(s.node.swarm.peers().iter().map(PeerBody::from).collect())
}

async fn invite(State(s): State<NodeApi>) -> Json<InviteBody> {
    let code = s.node.swarm.join_code();
    Json(InviteBody {
        code: code.to_string(),
        secret: code.secret.to_string(),
        bootstrap: format!("{}@{}", code.node_id, s.node.swarm.advertised_addr()),
    })
}
