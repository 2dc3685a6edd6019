//! QUIC endpoint, admission handshake and the connection pool.
//!
//! One QUIC connection per peer carries everything (RPC, sync, pushes, SWIM
//! datagrams), multiplexed by a [`StreamHeader`](crate::wire::StreamHeader)
//! on each stream. A connection becomes usable only after admission: both
//! sides exchange a [`Hello`] on the first bidirectional stream, proving
//! knowledge of the swarm secret bound to this TLS session (see
//! [`crate::admission`]). A connection that fails admission is closed with
//! [`CLOSE_REFUSED`] and never reaches the rest of the node.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::admission::{Admission, Role, EXPORTER_LABEL};
use crate::codec::{expect_frame, write_frame, CodecError};
use crate::identity::{Identity, NodeId};
use crate::metrics::Metrics;
use crate::tls;
use crate::wire::{Hello, MemberWire, WIRE_VERSION};

/// The refusal a node gives a peer whose swarm proof is wrong.
pub const BAD_SECRET: &str = "the peer does not hold this swarm's secret";
/// The refusal a node gets from a peer that found its swarm proof wrong.
pub const SECRET_REFUSED: &str =
    "the peer refused this node's swarm secret (the two nodes hold different secrets; \
     join with the other node's invite code or --swarm-secret)";
/// The close reason that tells a peer its swarm proof was wrong.
const SECRET_MISMATCH_REASON: &[u8] = b"swarm secret mismatch";

impl TransportError {
    /// Whether the two ends of a refused connection hold different swarm secrets (on
    /// either side).
    pub fn is_secret_mismatch(&self) -> bool {
        matches!(self, TransportError::Refused(r) if *r == BAD_SECRET || *r == SECRET_REFUSED)
    }
}

/// Application close code: admission refused.
pub const CLOSE_REFUSED: u32 = 0x5701;
/// Application close code: node shutting down.
pub const CLOSE_SHUTDOWN: u32 = 0x5702;
/// Application close code: replaced by a newer connection to the same peer.
pub const CLOSE_REPLACED: u32 = 0x5703;
/// Stream error code: malformed or oversized frame.
pub const STREAM_BAD_FRAME: u32 = 0x5711;

/// Limits and timeouts of the transport.
#[derive(Clone, Debug)]
pub struct TransportLimits {
    /// Largest frame accepted or sent.
    pub max_frame: usize,
    /// Time allowed for QUIC + TLS + admission when dialling or accepting.
    pub connect_timeout: Duration,
    /// Outgoing requests in flight per connection (calls wait for a slot).
    pub max_in_flight: usize,
    /// Incoming streams a peer may have open at once.
    pub max_incoming_streams: u32,
    /// QUIC idle timeout (a dead peer's connection closes after this).
    pub idle_timeout: Duration,
    /// QUIC keep-alive interval.
    pub keep_alive: Duration,
}

impl Default for TransportLimits {
    fn default() -> Self {
        Self {
            max_frame: crate::codec::DEFAULT_MAX_FRAME,
            connect_timeout: Duration::from_secs(5),
            max_in_flight: 64,
            max_incoming_streams: 128,
            idle_timeout: Duration::from_secs(10),
            keep_alive: Duration::from_secs(2),
        }
    }
}

/// Errors dialling or admitting a connection.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// Building the endpoint failed.
    #[error("endpoint: {0}")]
    Endpoint(String),
    /// QUIC refused to start the connection.
    #[error("connect: {0}")]
    Connect(#[from] quinn::ConnectError),
    /// The connection failed or was closed (includes TLS failures such as an
    /// unexpected node id).
    #[error("connection: {0}")]
    Connection(#[from] quinn::ConnectionError),
    /// Dial, handshake or admission took too long.
    #[error("timed out")]
    Timeout,
    /// The admission check failed.
    #[error("admission refused: {0}")]
    Refused(&'static str),
    /// A frame could not be read or written.
    #[error("frame: {0}")]
    Codec(#[from] CodecError),
    /// No address is known for this node.
    #[error("no known address for {0}")]
    NoAddress(NodeId),
    /// The transport is shutting down.
    #[error("shutting down")]
    Closed,
}

/// An admitted connection to a peer.
#[derive(Clone, Debug)]
pub struct PeerConn {
    /// The QUIC connection.
    pub conn: quinn::Connection,
    /// The authenticated peer.
    pub peer: NodeId,
    /// The peer's membership identity from its hello.
    pub member: MemberWire,
    /// Slots for outgoing requests (back-pressure).
    pub in_flight: Arc<Semaphore>,
    /// Whether this side dialled.
    pub dialled: bool,
}

/// The QUIC endpoint plus the pool of admitted connections.
pub struct Transport {
    endpoint: quinn::Endpoint,
    identity: Identity,
    admission: Admission,
    limits: TransportLimits,
    metrics: Arc<Metrics>,
    local_member: RwLock<MemberWire>,
    pool: Mutex<HashMap<NodeId, PeerConn>>,
    dial_locks: Mutex<HashMap<NodeId, Arc<tokio::sync::Mutex<()>>>>,
    admitted_tx: mpsc::UnboundedSender<PeerConn>,
    cancel: CancellationToken,
    /// When a refused peer with another swarm secret was last reported at warn level.
    mismatch_warned: WarnEvery,
}

/// Says a repeated condition at most once per interval.
#[derive(Debug)]
pub struct WarnEvery {
    every: Duration,
    last: Mutex<Option<std::time::Instant>>,
}

impl WarnEvery {
    /// Once per `every`.
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            last: Mutex::new(None),
        }
    }

    /// Whether it is time to say it again (and, if so, it counts as said now).
    pub fn due(&self) -> bool {
        let Ok(mut last) = self.last.lock() else {
            return false;
        };
        let now = std::time::Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < self.every) {
            return false;
        }
        *last = Some(now);
        true
    }
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("node", &self.identity.node_id())
            .finish_non_exhaustive()
    }
}

impl Transport {
    /// Binds the endpoint. Admitted connections (both dialled and accepted)
    /// are reported on the returned receiver, once each.
    pub fn bind(
        identity: Identity,
        listen: SocketAddr,
        admission: Admission,
        limits: TransportLimits,
        metrics: Arc<Metrics>,
        local_member: MemberWire,
        cancel: CancellationToken,
    ) -> Result<(Arc<Self>, mpsc::UnboundedReceiver<PeerConn>), TransportError> {
        let mut tc = quinn::TransportConfig::default();
        tc.max_concurrent_bidi_streams(limits.max_incoming_streams.into())
            .max_concurrent_uni_streams(limits.max_incoming_streams.into())
            .keep_alive_interval(Some(limits.keep_alive))
            .max_idle_timeout(Some(
                limits
                    .idle_timeout
                    .try_into()
                    .map_err(|_| TransportError::Endpoint("idle timeout too large".into()))?,
            ))
            .datagram_receive_buffer_size(Some(256 * 1024));
        let tc = Arc::new(tc);
        let server = tls::server_config(&identity, tc.clone())
            .map_err(|e| TransportError::Endpoint(e.to_string()))?;
        let client = tls::client_config(&identity, tc)
            .map_err(|e| TransportError::Endpoint(e.to_string()))?;
        let mut endpoint = quinn::Endpoint::server(server, listen)
            .map_err(|e| TransportError::Endpoint(e.to_string()))?;
        endpoint.set_default_client_config(client);
        let (admitted_tx, admitted_rx) = mpsc::unbounded_channel();
        let me = Arc::new(Self {
            endpoint,
            identity,
            admission,
            limits,
            metrics,
            local_member: RwLock::new(local_member),
            pool: Mutex::new(HashMap::new()),
            dial_locks: Mutex::new(HashMap::new()),
            admitted_tx,
            cancel,
            mismatch_warned: WarnEvery::new(Duration::from_secs(60)),
        });
        tokio::spawn(me.clone().accept_loop());
        Ok((me, admitted_rx))
    }

    /// The bound socket address.
    pub fn local_addr(&self) -> Result<SocketAddr, TransportError> {
        self.endpoint
            .local_addr()
            .map_err(|e| TransportError::Endpoint(e.to_string()))
    }

    /// Transport limits in force.
    pub fn limits(&self) -> &TransportLimits {
        &self.limits
    }

    /// Updates the membership identity sent in future hellos.
    pub fn set_local_member(&self, member: MemberWire) {
        if let Ok(mut g) = self.local_member.write() {
            *g = member;
        }
    }

    fn local_member(&self) -> MemberWire {
        match self.local_member.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// A live admitted connection to `peer`, if any.
    pub fn get(&self, peer: &NodeId) -> Option<PeerConn> {
        let pool = self.pool.lock().ok()?;
        pool.get(peer)
            .filter(|c| c.conn.close_reason().is_none())
            .cloned()
    }

    /// All live admitted connections.
    pub fn connections(&self) -> Vec<PeerConn> {
        self.pool
            .lock()
            .map(|p| {
                p.values()
                    .filter(|c| c.conn.close_reason().is_none())
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Returns the pooled connection to `peer` or dials `addr`, expecting
    /// exactly that node. Concurrent calls for one peer share a single dial.
    pub async fn connect_to(
        self: &Arc<Self>,
        peer: NodeId,
        addr: SocketAddr,
    ) -> Result<PeerConn, TransportError> {
        if let Some(c) = self.get(&peer) {
            return Ok(c);
        }
        let lock = {
            let mut locks = self.dial_locks.lock().map_err(|_| TransportError::Closed)?;
            locks.entry(peer).or_default().clone()
        };
        let _guard = lock.lock().await;
        if let Some(c) = self.get(&peer) {
            return Ok(c);
        }
        self.dial(addr, Some(peer)).await
    }

    /// Dials `addr`. With `expected`, TLS refuses any other node; without,
    /// any node that passes admission is accepted (bootstrap by address).
    pub async fn dial(
        self: &Arc<Self>,
        addr: SocketAddr,
        expected: Option<NodeId>,
    ) -> Result<PeerConn, TransportError> {
        if self.cancel.is_cancelled() {
            return Err(TransportError::Closed);
        }
        let name = tls::server_name_for(expected.as_ref());
        let fut = async {
            let conn = self.endpoint.connect(addr, &name)?.await?;
            self.admit(conn, Role::Client).await
        };
        let pc = tokio::time::timeout(self.limits.connect_timeout, fut)
            .await
            .map_err(|_| TransportError::Timeout)??;
        tracing::debug!(peer = %pc.peer.short(), %addr, "dialled and admitted");
        Ok(pc)
    }

    async fn accept_loop(self: Arc<Self>) {
        loop {
            let incoming = tokio::select! {
                biased;
                _ = self.cancel.cancelled() => break,
                inc = self.endpoint.accept() => match inc {
                    Some(i) => i,
                    None => break,
                },
            };
            let me = self.clone();
            tokio::spawn(async move {
                let remote = incoming.remote_address();
                let fut = async {
                    let conn = incoming.await?;
                    me.admit(conn, Role::Server).await
                };
                match tokio::time::timeout(me.limits.connect_timeout, fut).await {
                    Ok(Ok(pc)) => {
                        tracing::debug!(peer = %pc.peer.short(), %remote, "accepted and admitted")
                    }
                    Ok(Err(e)) if e.is_secret_mismatch() => {
                        // A user's mistake (a node started with another secret), not an
                        // attack to ignore: said once a minute at most.
                        if me.mismatch_warned.due() {
                            tracing::warn!(%remote, "a node with another swarm secret tried to join; give it this swarm's invite code (`starling invite`)")
                        } else {
                            tracing::debug!(%remote, error = %e, "incoming connection refused")
                        }
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(%remote, error = %e, "incoming connection refused")
                    }
                    Err(_) => tracing::debug!(%remote, "incoming connection timed out"),
                }
            });
        }
    }

    /// Runs the admission exchange on a fresh connection and registers it.
    async fn admit(
        self: &Arc<Self>,
        conn: quinn::Connection,
        role: Role,
    ) -> Result<PeerConn, TransportError> {
        let result = self.admission_exchange(&conn, role).await;
        let (peer, member) = match result {
            Ok(v) => v,
            Err(e) => {
                Metrics::inc(&self.metrics.admission_refused);
                let reason: &[u8] = if matches!(e, TransportError::Refused(BAD_SECRET)) {
                    SECRET_MISMATCH_REASON
                } else {
                    b"admission refused"
                };
                conn.close(CLOSE_REFUSED.into(), reason);
                return Err(e);
            }
        };
        Metrics::inc(&self.metrics.admission_accepted);
        let pc = PeerConn {
            conn,
            peer,
            member,
            in_flight: Arc::new(Semaphore::new(self.limits.max_in_flight)),
            dialled: role == Role::Client,
        };
        self.register(pc.clone());
        Ok(pc)
    }

    async fn admission_exchange(
        &self,
        conn: &quinn::Connection,
        role: Role,
    ) -> Result<(NodeId, MemberWire), TransportError> {
        let me = self.identity.node_id();
        let peer = tls::peer_node_id(conn).ok_or(TransportError::Refused("no peer key"))?;
        if peer == me {
            return Err(TransportError::Refused("connected to self"));
        }
        if !self.admission.allows(&peer) {
            return Err(TransportError::Refused("node not in allowlist"));
        }
        let mut exporter = [0u8; 32];
        conn.export_keying_material(&mut exporter, EXPORTER_LABEL, b"")
            .map_err(|_| TransportError::Refused("no keying material"))?;
        let (client, server) = match role {
            Role::Client => (me, peer),
            Role::Server => (peer, me),
        };
        let their_role = match role {
            Role::Client => Role::Server,
            Role::Server => Role::Client,
        };
        let secret = &self.admission.secret;
        let max = self.limits.max_frame;
        let hello = Hello {
            version: WIRE_VERSION,
            proof: secret.proof(role, &client, &server, &exporter),
            member: self.local_member(),
        };
        let check = |theirs: &Hello| -> Result<(), TransportError> {
            if theirs.version != WIRE_VERSION {
                return Err(TransportError::Refused("wire version mismatch"));
            }
            if theirs.member.id != peer {
                return Err(TransportError::Refused("hello names another node"));
            }
            if !secret.verify_proof(their_role, &client, &server, &exporter, &theirs.proof) {
                return Err(TransportError::Refused(BAD_SECRET));
            }
            Ok(())
        };
        let theirs = match role {
            Role::Client => {
                let (mut send, mut recv) = conn.open_bi().await?;
                write_frame(&mut send, &hello, max).await?;
                let _ = send.finish();
                let theirs: Hello = match expect_frame(&mut recv, max).await {
                    Ok(h) => h,
                    // The server checks our proof first and says why it closed.
                    Err(e) => {
                        let told = matches!(
                            conn.close_reason(),
                            Some(quinn::ConnectionError::ApplicationClosed(ref c))
                                if c.error_code == CLOSE_REFUSED.into()
                                    && c.reason.as_ref() == SECRET_MISMATCH_REASON
                        );
                        return Err(if told {
                            TransportError::Refused(SECRET_REFUSED)
                        } else {
                            e.into()
                        });
                    }
                };
                check(&theirs)?;
                theirs
            }
            Role::Server => {
                let (mut send, mut recv) = conn.accept_bi().await?;
                // Verify the client before revealing anything of ours.
                let theirs: Hello = expect_frame(&mut recv, max).await?;
                check(&theirs)?;
                write_frame(&mut send, &hello, max).await?;
                let _ = send.finish();
                theirs
            }
        };
        Ok((peer, theirs.member))
    }

    /// Of two live connections to one peer (both sides dialled at once),
    /// both ends keep the one dialled by the lower node id.
    fn preferred(&self, a: &PeerConn, b: &PeerConn) -> bool {
        let me = self.identity.node_id();
        let dialler = |c: &PeerConn| if c.dialled { me } else { c.peer };
        dialler(a) <= dialler(b)
    }

    fn register(self: &Arc<Self>, pc: PeerConn) {
        let loser = {
            let Ok(mut pool) = self.pool.lock() else {
                return;
            };
            match pool.get(&pc.peer) {
                Some(old) if old.conn.close_reason().is_none() => {
                    if self.preferred(&pc, old) {
                        pool.insert(pc.peer, pc.clone())
                    } else {
                        Some(pc.clone())
                    }
                }
                _ => pool.insert(pc.peer, pc.clone()),
            }
        };
        if let Some(loser) = loser.filter(|l| l.conn.close_reason().is_none()) {
            // Let streams already running on the duplicate finish, then close it.
            tracing::trace!(peer = %pc.peer.short(), "duplicate connection; closing the loser soon");
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(5)).await;
                loser.conn.close(CLOSE_REPLACED.into(), b"duplicate");
            });
        }
        let me = self.clone();
        let watched = pc.clone();
        tokio::spawn(async move {
            let reason = watched.conn.closed().await;
            tracing::debug!(peer = %watched.peer.short(), %reason, "connection closed");
            if let Ok(mut pool) = me.pool.lock() {
                if pool
                    .get(&watched.peer)
                    .is_some_and(|c| c.conn.stable_id() == watched.conn.stable_id())
                {
                    pool.remove(&watched.peer);
                }
            }
        });
        let _ = self.admitted_tx.send(pc);
    }

    /// Closes every connection and the endpoint.
    pub async fn close(&self) {
        self.endpoint.close(CLOSE_SHUTDOWN.into(), b"shutdown");
        if let Ok(mut pool) = self.pool.lock() {
            pool.clear();
        }
        // Give the close frames a moment to go out, bounded.
        let _ = tokio::time::timeout(Duration::from_millis(500), self.endpoint.wait_idle()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_warning_is_said_once_per_interval() {
        let w = WarnEvery::new(Duration::from_secs(60));
        assert!(w.due());
        assert!(!w.due());
        let never = WarnEvery::new(Duration::ZERO);
        assert!(never.due() && never.due());
        assert!(TransportError::Refused(BAD_SECRET).is_secret_mismatch());
        assert!(TransportError::Refused(SECRET_REFUSED).is_secret_mismatch());
        assert!(!TransportError::Refused("node not in allowlist").is_secret_mismatch());
    }
}
