//! Starling networking: identity, QUIC transport with swarm admission,
//! discovery (bootstrap, peer cache, mDNS), SWIM membership, RPC and
//! fan-out, signed records and their replication.
//!
//! This crate knows nothing about models or agents. The node binary starts a
//! [`Swarm`] from a [`SwarmConfig`] and uses its handle. See `README.md` in
//! this crate for the wire protocol and what a stranger can observe.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod admission;
pub mod codec;
pub mod discover;
pub mod identity;
pub mod join_code;
pub mod membership;
pub mod metrics;
pub mod records;
pub mod replication;
pub mod rpc;
pub mod sqlite_store;
mod swarm;
pub mod tls;
pub mod transport;
pub mod wire;

pub use admission::{SwarmId, SwarmSecret};
pub use discover::BootstrapPeer;
pub use identity::{Identity, NodeId};
pub use join_code::JoinCode;
pub use membership::{MembershipPreset, PeerInfo, PeerState};
pub use metrics::MetricsSnapshot;
pub use records::{MemRecordStore, Record, RecordId, RecordStore};
pub use replication::SyncStats;
pub use rpc::{CallError, Handler, Request, RpcError};
pub use sqlite_store::SqliteRecordStore;
pub use swarm::{Swarm, SwarmConfig, SwarmError, SwarmEvent, DEFAULT_PORT};
pub use wire::RpcErrorCode;
