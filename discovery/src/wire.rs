//! Wire types: what goes over QUIC streams and datagrams.
//!
//! These are separate from the internal types ([`crate::records::Record`],
//! [`crate::membership::Member`], ...) and are converted at the boundary, where
//! they are validated ("parse, don't validate"). Every stream starts with a
//! [`StreamHeader`] carrying [`WIRE_VERSION`]; the admission [`Hello`] carries it too.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::identity::NodeId;

/// Version of the wire protocol spoken by this build.
pub const WIRE_VERSION: u16 = 1;

/// First byte of a QUIC datagram carrying a SWIM (foca) packet.
pub const DATAGRAM_GOSSIP: u8 = 1;

/// A node's membership identity as gossiped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberWire {
    /// The node id.
    pub id: NodeId,
    /// The address other members should dial.
    pub addr: SocketAddr,
    /// Incremented on each start and on rejoin.
    pub generation: u64,
    /// Human-readable node name.
    pub name: String,
}

/// First frame on the admission stream, sent by each side.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The sender's wire version.
    pub version: u16,
    /// HMAC proof of the swarm secret (see [`crate::admission`]).
    pub proof: [u8; 32],
    /// The sender's membership identity.
    pub member: MemberWire,
}

/// What a stream carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StreamKind {
    /// One [`RpcRequest`] then one [`RpcResponse`] (bidirectional).
    Rpc,
    /// Set reconciliation, [`SyncMsg`] frames both ways (bidirectional).
    Sync,
    /// Pushed records, [`RecordWire`] frames (unidirectional).
    Push,
    /// One SWIM packet too large for a datagram (unidirectional).
    Gossip,
}

/// First frame of every stream after admission.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamHeader {
    /// The sender's wire version.
    pub version: u16,
    /// The protocol spoken on this stream.
    pub kind: StreamKind,
}

/// An RPC request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RpcRequest {
    /// Service name, e.g. `"chat"`.
    pub service: String,
    /// Method within the service.
    pub method: String,
    /// Opaque request body.
    pub body: Vec<u8>,
}

/// Error classes an RPC can fail with on the remote side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RpcErrorCode {
    /// No handler for that service.
    UnknownService,
    /// The handler does not know the method.
    UnknownMethod,
    /// The request body was not understood.
    BadRequest,
    /// The handler failed.
    Internal,
    /// The remote is overloaded or refused.
    Unavailable,
}

/// An RPC response.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RpcResponse {
    /// Success with an opaque body.
    Ok(Vec<u8>),
    /// Failure.
    Err {
        /// Error class.
        code: RpcErrorCode,
        /// Human-readable detail.
        message: String,
    },
}

/// A signed record as transmitted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordWire {
    /// Author node id.
    pub author: NodeId,
    /// Record kind tag.
    pub kind: String,
    /// Author's timestamp, milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
    /// Opaque body.
    pub body: Vec<u8>,
    /// Ed25519 signature (64 bytes) by `author`.
    pub signature: Vec<u8>,
}

/// Frames of the reconciliation protocol.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SyncMsg {
    /// A negentropy message.
    Neg(Vec<u8>),
    /// Initiator asks for the records whose ids start with these 16 bytes
    /// (at most 1024; ids the responder reported during negentropy).
    Want(Vec<[u8; 16]>),
    /// Records (answer to a `Want` or a `Take`).
    Records(Vec<RecordWire>),
    /// End of this batch of `Records` for a `Want` or a `Take`.
    WantDone,
    /// The initiator is finished.
    Done,
    /// Initiator offers records the responder lacks (ids, at most 1024).
    Offer(Vec<[u8; 32]>),
    /// Responder takes these entries (indices) of the current `Offer`; the
    /// initiator answers with `Records`…`WantDone`. An empty `Take` ends the
    /// offer.
    Take(Vec<u32>),
}
