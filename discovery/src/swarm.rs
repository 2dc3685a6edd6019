//! The [`Swarm`] handle: wires identity, transport, discovery, membership,
//! RPC and replication together and runs their tasks.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use futures::future::join_all;
use rand::seq::SliceRandom;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use crate::admission::{Admission, SwarmSecret};
use crate::codec::{expect_frame, write_frame, CodecError};
use crate::discover::mdns::{self, Found, Mdns};
use crate::discover::{BootstrapPeer, CachedPeer, FilePeerCache, PeerCache};
use crate::identity::{Identity, IdentityError, NodeId};
use crate::join_code::JoinCode;
use crate::membership::{
    GossipSender, MemberId, Membership, MembershipPreset, PeerInfo, PeerState,
};
use crate::metrics::{Metrics, MetricsSnapshot};
use crate::records::{MemRecordStore, Record, RecordError, RecordId, RecordStore, StoreError};
use crate::replication::{Replicator, SyncError, SyncStats, PUSH_BATCH};
use crate::rpc::{call_on, CallError, Handler, Router};
use crate::transport::{PeerConn, Transport, TransportError, TransportLimits, STREAM_BAD_FRAME};
use crate::wire::{
    MemberWire, RecordWire, RpcRequest, StreamHeader, StreamKind, DATAGRAM_GOSSIP, WIRE_VERSION,
};

/// Default QUIC port.
pub const DEFAULT_PORT: u16 = 7420;

/// Everything needed to start a [`Swarm`]. Build with [`SwarmConfig::new`]
/// and adjust fields.
#[derive(Clone, Debug)]
pub struct SwarmConfig {
    /// Directory for the node key and the peer cache.
    pub data_dir: PathBuf,
    /// Node name shown to peers.
    pub name: String,
    /// UDP address to listen on (port 0 picks one). Also decides where mDNS runs.
    pub listen: SocketAddr,
    /// Address peers should dial, if not the listen address (e.g. when
    /// listening on 0.0.0.0). Default: derived from `listen`.
    pub advertise: Option<SocketAddr>,
    /// Static peers to dial at start.
    pub bootstrap: Vec<BootstrapPeer>,
    /// Swarm secret: only nodes that know it are admitted.
    pub secret: SwarmSecret,
    /// Optional allowlist of node ids (checked in addition to the secret).
    pub allowlist: Option<HashSet<NodeId>>,
    /// Announce and browse via mDNS (never on loopback listeners; see [`mdns::plan`]).
    pub mdns: bool,
    /// Failure-detection timing.
    pub membership: MembershipPreset,
    /// Bound on the member table.
    pub max_members: usize,
    /// Transport limits (frame size, in-flight requests, timeouts).
    pub limits: TransportLimits,
    /// Default timeout of an RPC.
    pub rpc_timeout: Duration,
    /// Interval between background reconciliations with a random peer.
    pub sync_interval: Duration,
    /// Interval between attempts to reach bootstrap/cached peers while alone.
    pub rejoin_interval: Duration,
}

impl SwarmConfig {
    /// Defaults: listen on 0.0.0.0:7420, mDNS on, LAN timing.
    pub fn new(data_dir: impl Into<PathBuf>, secret: SwarmSecret) -> Self {
        Self {
            data_dir: data_dir.into(),
            name: "starling".into(),
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), DEFAULT_PORT),
            advertise: None,
            bootstrap: Vec::new(),
            secret,
            allowlist: None,
            mdns: true,
            membership: MembershipPreset::Lan,
            max_members: 1024,
            limits: TransportLimits::default(),
            rpc_timeout: Duration::from_secs(30),
            sync_interval: Duration::from_secs(30),
            rejoin_interval: Duration::from_secs(5),
        }
    }
}

/// Something that happened in the swarm.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SwarmEvent {
    /// A peer joined or became alive again.
    PeerUp(PeerInfo),
    /// A peer missed probes.
    PeerSuspect(NodeId),
    /// A peer failed or left.
    PeerDown(NodeId),
    /// A new verified record was stored (published here or received).
    Record {
        /// Record id.
        id: RecordId,
        /// Author.
        author: NodeId,
        /// Kind tag.
        kind: String,
    },
}

/// Errors of swarm operations.
#[derive(Debug, thiserror::Error)]
pub enum SwarmError {
    /// Loading the identity failed.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// The endpoint could not start, or a dial failed.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The data directory could not be created.
    #[error("data dir {path}: {source}")]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The record store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The record is invalid.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// Reconciliation failed.
    #[error(transparent)]
    Sync(#[from] SyncError),
    /// mDNS failed to start.
    #[error(transparent)]
    Mdns(#[from] mdns::MdnsError),
}

/// A running node in the swarm. Cheap to clone.
#[derive(Clone)]
pub struct Swarm {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Swarm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Swarm")
            .field("node_id", &self.inner.identity.node_id())
            .finish_non_exhaustive()
    }
}

struct Inner {
    identity: Identity,
    name: String,
    secret: SwarmSecret,
    transport: Arc<Transport>,
    membership: Membership,
    router: Router,
    replicator: Replicator,
    events: broadcast::Sender<SwarmEvent>,
    metrics: Arc<Metrics>,
    peer_cache: Arc<dyn PeerCache>,
    /// Last known address per node from any source.
    addrs: RwLock<HashMap<NodeId, SocketAddr>>,
    bootstrap: Vec<BootstrapPeer>,
    advertised: SocketAddr,
    rpc_timeout: Duration,
    mdns: Mutex<Option<Mdns>>,
    cancel: CancellationToken,
    /// Records this node published, for the [`pusher`].
    push_tx: mpsc::UnboundedSender<Arc<RecordWire>>,
    /// When a peer refusing this node's secret was last reported at warn level.
    refused_warned: crate::transport::WarnEvery,
}

impl Swarm {
    /// Starts a node with an in-memory record store and the file peer cache
    /// in `config.data_dir`.
    pub async fn start(config: SwarmConfig) -> Result<Self, SwarmError> {
        let cache = Arc::new(FilePeerCache::in_dir(&config.data_dir));
        Self::start_with(config, Arc::new(MemRecordStore::new()), cache).await
    }

    /// Starts a node with the given record store and peer cache.
    pub async fn start_with(
        config: SwarmConfig,
        store: Arc<dyn RecordStore>,
        peer_cache: Arc<dyn PeerCache>,
    ) -> Result<Self, SwarmError> {
        std::fs::create_dir_all(&config.data_dir).map_err(|source| SwarmError::DataDir {
            path: config.data_dir.clone(),
            source,
        })?;
        let identity = Identity::load_or_create(&config.data_dir)?;
        let me = identity.node_id();
        let cancel = CancellationToken::new();
        let metrics = Arc::new(Metrics::default());
        let admission = Admission {
            secret: config.secret.clone(),
            allowlist: config.allowlist.clone(),
        };
        // Generation: start time, so a restarted node always supersedes its
        // previous incarnation.
        let generation = crate::records::now_ms();
        let placeholder = MemberWire {
            id: me,
            addr: config.listen,
            generation,
            name: config.name.clone(),
        };
        let (transport, admitted_rx) = Transport::bind(
            identity.clone(),
            config.listen,
            admission.clone(),
            config.limits.clone(),
            metrics.clone(),
            placeholder,
            cancel.child_token(),
        )?;
        let local = transport.local_addr()?;
        let advertised = config.advertise.unwrap_or_else(|| advertised_addr(local));
        let me_member = MemberId {
            id: me,
            addr: advertised,
            generation,
            name: config.name.clone(),
        };
        transport.set_local_member(me_member.clone().into());

        let (events, _) = broadcast::channel(1024);
        let renew_transport = transport.clone();
        let membership = Membership::start(
            me_member,
            config.membership,
            config.max_members,
            Arc::new(QuicGossip {
                transport: transport.clone(),
            }),
            events.clone(),
            Box::new(move |m: MemberId| renew_transport.set_local_member(m.into())),
            cancel.child_token(),
        );
        let (push_tx, push_rx) = mpsc::unbounded_channel();
        let replicator = Replicator {
            store,
            admission,
            metrics: metrics.clone(),
            events: events.clone(),
            max_frame: config.limits.max_frame,
            in_flight: Default::default(),
        };
        let inner = Arc::new(Inner {
            identity,
            name: config.name.clone(),
            secret: config.secret.clone(),
            transport,
            membership,
            router: Router::default(),
            replicator,
            events,
            metrics,
            peer_cache,
            addrs: RwLock::new(HashMap::new()),
            bootstrap: config.bootstrap.clone(),
            advertised,
            rpc_timeout: config.rpc_timeout,
            mdns: Mutex::new(None),
            refused_warned: crate::transport::WarnEvery::new(Duration::from_secs(60)),
            cancel,
            push_tx,
        });
        tokio::spawn(pusher(inner.clone(), push_rx));

        tokio::spawn(connection_dispatcher(inner.clone(), admitted_rx));
        tokio::spawn(peer_cache_writer(inner.clone()));
        tokio::spawn(rejoin_loop(inner.clone(), config.rejoin_interval));
        tokio::spawn(sync_loop(inner.clone(), config.sync_interval));

        let plan = mdns::plan(local, config.mdns);
        let (found_tx, found_rx) = mpsc::unbounded_channel();
        // mDNS is one discovery source among several: failing to start it
        // (no multicast-capable interface, port in use) is not fatal.
        let m = match Mdns::start(
            &plan,
            me,
            config.secret.swarm_id(),
            local.port(),
            found_tx,
            inner.cancel.child_token(),
        ) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "mDNS unavailable; using bootstrap peers and the peer cache");
                None
            }
        };
        if m.is_some() {
            tokio::spawn(mdns_dialer(inner.clone(), found_rx));
        }
        if let Ok(mut g) = inner.mdns.lock() {
            *g = m;
        }
        tracing::info!(node_id = %me, %local, %advertised, name = %config.name, "swarm node started");
        Ok(Self { inner })
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.inner.identity.node_id()
    }

    /// This node's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The bound UDP address.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner
            .transport
            .local_addr()
            .unwrap_or(self.inner.advertised)
    }

    /// The address announced to peers.
    pub fn advertised_addr(&self) -> SocketAddr {
        self.inner.advertised
    }

    /// Known peers (alive, suspect and recently down), sorted by name.
    pub fn peers(&self) -> Vec<PeerInfo> {
        self.inner.membership.peers()
    }

    /// Subscribes to swarm events.
    pub fn events(&self) -> broadcast::Receiver<SwarmEvent> {
        self.inner.events.subscribe()
    }

    /// Counters.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner.metrics.snapshot()
    }

    /// A join code for this node: the swarm secret plus this node's id and
    /// advertised address.
    pub fn join_code(&self) -> JoinCode {
        JoinCode {
            secret: self.inner.secret.clone(),
            node_id: self.node_id(),
            addrs: vec![self.inner.advertised],
        }
    }

    /// Registers the handler of an RPC service (replacing any previous one).
    pub fn register_handler(&self, service: &str, handler: impl Handler) {
        self.inner.router.register(service, Arc::new(handler));
    }

    /// The timeout of [`Swarm::call`] and [`Swarm::fan_out`].
    pub fn rpc_timeout(&self) -> Duration {
        self.inner.rpc_timeout
    }

    /// Calls `service`/`method` on `node` with the default timeout.
    pub async fn call(
        &self,
        node: NodeId,
        service: &str,
        method: &str,
        body: Vec<u8>,
    ) -> Result<Vec<u8>, CallError> {
        self.call_with_timeout(node, service, method, body, self.inner.rpc_timeout)
            .await
    }

    /// Calls `service`/`method` on `node` with an explicit timeout.
    pub async fn call_with_timeout(
        &self,
        node: NodeId,
        service: &str,
        method: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, CallError> {
        let req = RpcRequest {
            service: service.to_owned(),
            method: method.to_owned(),
            body,
        };
        call_node(&self.inner, node, &req, timeout).await
    }

    /// Sends the same request to every member concurrently; one result per
    /// member, in the order given.
    pub async fn fan_out(
        &self,
        members: &[NodeId],
        service: &str,
        method: &str,
        body: Vec<u8>,
    ) -> Vec<(NodeId, Result<Vec<u8>, CallError>)> {
        let req = RpcRequest {
            service: service.to_owned(),
            method: method.to_owned(),
            body,
        };
        let req = &req;
        let inner = &self.inner;
        let timeout = inner.rpc_timeout;
        join_all(
            members
                .iter()
                .map(|m| async move { (*m, call_node(inner, *m, req, timeout).await) }),
        )
        .await
    }

    /// Signs and stores a new record authored by this node, and pushes it to
    /// live peers in the background (a peer that misses the push gets it at
    /// the next reconciliation). Records published in quick succession share
    /// push streams (see [`pusher`]).
    ///
    /// Fails, with nothing stored or sent, when the record store cannot write it.
    pub async fn publish(&self, kind: &str, body: Vec<u8>) -> Result<Record, SwarmError> {
        let record = self.sign(kind, body)?;
        self.publish_signed(&record).await?;
        Ok(record)
    }

    /// Signs a record as this node without storing or sending it (to commit what it
    /// describes locally first, then [`Swarm::publish_signed`] it).
    pub fn sign(&self, kind: &str, body: Vec<u8>) -> Result<Record, SwarmError> {
        Ok(Record::sign(&self.inner.identity, kind, body)?)
    }

    /// Stores a record signed by [`Swarm::sign`] and pushes it to live peers, as
    /// [`Swarm::publish`] does. Fails, with nothing sent, when the store cannot write it.
    pub async fn publish_signed(&self, record: &Record) -> Result<(), SwarmError> {
        if self.inner.replicator.store_checked(record.clone())? {
            // The pusher lives as long as the swarm; after shutdown, reconciliation
            // is the only way out anyway.
            let _ = self.inner.push_tx.send(Arc::new(record.to_wire()));
        }
        Ok(())
    }

    /// Stored records of one kind, oldest first.
    pub fn records(&self, kind: &str) -> Result<Vec<Record>, SwarmError> {
        Ok(self.inner.replicator.store.by_kind(kind)?)
    }

    /// One stored record.
    pub fn record(&self, id: &RecordId) -> Result<Option<Record>, SwarmError> {
        Ok(self.inner.replicator.store.get(id)?)
    }

    /// Reconciles records with `node` now (normally done on connect and
    /// periodically).
    pub async fn reconcile_with(&self, node: NodeId) -> Result<SyncStats, SwarmError> {
        let pc = connect(&self.inner, node).await?;
        Ok(self.inner.replicator.sync_with(&pc.conn, node).await?)
    }

    /// Dials a peer and joins the swarm through it. With `peer.node_id` set,
    /// any other node at that address is refused. Returns the peer's id.
    pub async fn join(&self, peer: &BootstrapPeer) -> Result<NodeId, SwarmError> {
        let pc = match peer.node_id {
            Some(id) => self.inner.transport.connect_to(id, peer.addr).await?,
            None => self.inner.transport.dial(peer.addr, None).await?,
        };
        Ok(pc.peer)
    }

    /// Leaves the swarm gracefully and stops every task of this node.
    pub async fn shutdown(&self) {
        self.inner.membership.leave().await;
        // The leave packets go out from spawned tasks; give them a moment
        // before the endpoint closes.
        tokio::time::sleep(Duration::from_millis(150)).await;
        self.inner.cancel.cancel();
        if let Ok(mut g) = self.inner.mdns.lock() {
            g.take();
        }
        self.inner.transport.close().await;
        tracing::info!(node_id = %self.node_id().short(), "swarm node stopped");
    }
}

/// Pushes this node's new records to its live peers: everything published since the
/// last round goes out on one stream per peer (up to [`PUSH_BATCH`] records), so a
/// burst of publishes costs a few streams, not one per record and peer, while a single
/// publish still leaves at once.
async fn pusher(inner: Arc<Inner>, mut rx: mpsc::UnboundedReceiver<Arc<RecordWire>>) {
    loop {
        let first = tokio::select! {
            _ = inner.cancel.cancelled() => return,
            r = rx.recv() => match r {
                Some(r) => r,
                None => return,
            },
        };
        let mut batch = vec![first];
        while batch.len() < PUSH_BATCH {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        let batch = Arc::new(batch);
        let peers: Vec<NodeId> = inner
            .membership
            .peers()
            .into_iter()
            .filter(|p| p.state != PeerState::Down)
            .map(|p| p.id)
            .collect();
        for id in peers {
            let inner = inner.clone();
            let batch = batch.clone();
            tokio::spawn(async move {
                match connect(&inner, id).await {
                    Ok(pc) => {
                        if let Err(e) = inner.replicator.push_to(&pc.conn, &batch).await {
                            tracing::debug!(peer = %id.short(), error = %e, "push failed");
                        }
                    }
                    Err(e) => tracing::debug!(peer = %id.short(), error = %e, "push: unreachable"),
                }
            });
        }
    }
}

/// Best guess at a dialable address for a listener.
fn advertised_addr(local: SocketAddr) -> SocketAddr {
    if !local.ip().is_unspecified() {
        return local;
    }
    // A connected UDP socket only performs a route lookup; nothing is sent.
    let probe = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))
        .and_then(|s| s.connect((Ipv4Addr::new(192, 0, 2, 1), 9)).map(|_| s))
        .and_then(|s| s.local_addr());
    match probe {
        Ok(a) if !a.ip().is_unspecified() => SocketAddr::new(a.ip(), local.port()),
        _ => SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), local.port()),
    }
}

fn known_addr(inner: &Inner, node: &NodeId) -> Option<SocketAddr> {
    inner
        .membership
        .peer(node)
        .map(|p| p.addr)
        .or_else(|| inner.addrs.read().ok()?.get(node).copied())
}

async fn connect(inner: &Arc<Inner>, node: NodeId) -> Result<PeerConn, TransportError> {
    if let Some(pc) = inner.transport.get(&node) {
        return Ok(pc);
    }
    let addr = known_addr(inner, &node).ok_or(TransportError::NoAddress(node))?;
    inner.transport.connect_to(node, addr).await
}

async fn call_node(
    inner: &Arc<Inner>,
    node: NodeId,
    req: &RpcRequest,
    timeout: Duration,
) -> Result<Vec<u8>, CallError> {
    let pc = connect(inner, node).await?;
    call_on(&pc, req, inner.transport.limits().max_frame, timeout).await
}

/// Sends SWIM packets as QUIC datagrams (or a stream when too large),
/// dialling the member if needed.
struct QuicGossip {
    transport: Arc<Transport>,
}

impl GossipSender for QuicGossip {
    fn send(&self, to: MemberId, data: Bytes) {
        let transport = self.transport.clone();
        tokio::spawn(async move {
            let pc = match transport.connect_to(to.id, to.addr).await {
                Ok(pc) => pc,
                Err(e) => {
                    tracing::trace!(peer = %to.id.short(), error = %e, "gossip: unreachable");
                    return;
                }
            };
            let mut framed = Vec::with_capacity(data.len() + 1);
            framed.push(DATAGRAM_GOSSIP);
            framed.extend_from_slice(&data);
            if pc
                .conn
                .max_datagram_size()
                .is_some_and(|m| framed.len() <= m)
            {
                let _ = pc.conn.send_datagram(Bytes::from(framed));
                return;
            }
            let max = transport.limits().max_frame;
            let res: Result<(), CodecError> = async {
                let mut s = pc
                    .conn
                    .open_uni()
                    .await
                    .map_err(|e| CodecError::Io(e.into()))?;
                let header = StreamHeader {
                    version: WIRE_VERSION,
                    kind: StreamKind::Gossip,
                };
                write_frame(&mut s, &header, max).await?;
                write_frame(&mut s, &data.to_vec(), max).await?;
                let _ = s.finish();
                Ok(())
            }
            .await;
            if let Err(e) = res {
                tracing::trace!(peer = %to.id.short(), error = %e, "gossip stream failed");
            }
        });
    }
}

async fn connection_dispatcher(inner: Arc<Inner>, mut rx: mpsc::UnboundedReceiver<PeerConn>) {
    loop {
        let pc = tokio::select! {
            biased;
            _ = inner.cancel.cancelled() => break,
            pc = rx.recv() => match pc { Some(pc) => pc, None => break },
        };
        if let Ok(mut a) = inner.addrs.write() {
            a.insert(pc.peer, pc.member.addr);
        }
        inner.membership.announce(pc.member.clone());
        tokio::spawn(serve_connection(inner.clone(), pc.clone()));
        if pc.dialled {
            let inner = inner.clone();
            tokio::spawn(async move {
                if let Err(e) = inner.replicator.sync_with(&pc.conn, pc.peer).await {
                    tracing::debug!(peer = %pc.peer.short(), error = %e, "sync on connect failed");
                }
            });
        }
    }
}

async fn serve_connection(inner: Arc<Inner>, pc: PeerConn) {
    let conn = pc.conn.clone();
    loop {
        tokio::select! {
            biased;
            _ = inner.cancel.cancelled() => break,
            bi = conn.accept_bi() => match bi {
                Ok((send, recv)) => { tokio::spawn(handle_bi(inner.clone(), pc.peer, send, recv)); }
                Err(_) => break,
            },
            uni = conn.accept_uni() => match uni {
                Ok(recv) => { tokio::spawn(handle_uni(inner.clone(), pc.peer, recv)); }
                Err(_) => break,
            },
            dg = conn.read_datagram() => match dg {
                Ok(d) => {
                    if d.first() == Some(&DATAGRAM_GOSSIP) {
                        inner.membership.handle_data(d.slice(1..));
                    }
                }
                Err(_) => break,
            },
        }
    }
}

fn bad_stream(inner: &Inner, peer: NodeId, what: &str, e: &dyn std::fmt::Display) {
    Metrics::inc(&inner.metrics.bad_frames);
    tracing::debug!(peer = %peer.short(), error = %e, "{what}: closing stream");
}

async fn handle_bi(
    inner: Arc<Inner>,
    peer: NodeId,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) {
    let max = inner.transport.limits().max_frame;
    // Buffered: the header and a small request arrive together and are
    // taken in one read of the stream instead of four.
    let mut reader = tokio::io::BufReader::with_capacity(4096, &mut recv);
    let result: Result<(), String> = async {
        let header: StreamHeader = expect_frame(&mut reader, max)
            .await
            .map_err(|e| e.to_string())?;
        if header.version != WIRE_VERSION {
            return Err(format!("unsupported wire version {}", header.version));
        }
        match header.kind {
            StreamKind::Rpc => inner
                .router
                .serve(peer, &mut send, &mut reader, max)
                .await
                .map_err(|e| e.to_string()),
            StreamKind::Sync => inner
                .replicator
                .serve_sync(peer, &mut send, &mut reader)
                .await
                .map_err(|e| e.to_string()),
            other => Err(format!("{other:?} is not a bidirectional protocol")),
        }
    }
    .await;
    drop(reader);
    if let Err(e) = result {
        bad_stream(&inner, peer, "bidi stream", &e);
        let _ = send.reset(STREAM_BAD_FRAME.into());
        let _ = recv.stop(STREAM_BAD_FRAME.into());
    }
}

async fn handle_uni(inner: Arc<Inner>, peer: NodeId, mut recv: quinn::RecvStream) {
    let max = inner.transport.limits().max_frame;
    let result: Result<(), CodecError> = async {
        let header: StreamHeader = expect_frame(&mut recv, max).await?;
        if header.version != WIRE_VERSION {
            return Err(CodecError::Malformed(format!(
                "wire version {}",
                header.version
            )));
        }
        match header.kind {
            StreamKind::Push => inner.replicator.serve_push(peer, &mut recv).await,
            StreamKind::Gossip => {
                let data: Vec<u8> = expect_frame(&mut recv, max).await?;
                inner.membership.handle_data(Bytes::from(data));
                Ok(())
            }
            other => Err(CodecError::Malformed(format!(
                "{other:?} is not unidirectional"
            ))),
        }
    }
    .await;
    if let Err(e) = result {
        bad_stream(&inner, peer, "uni stream", &e);
        let _ = recv.stop(STREAM_BAD_FRAME.into());
    }
}

/// Remembers peers that came up, for reconnecting after a restart.
async fn peer_cache_writer(inner: Arc<Inner>) {
    let mut rx = inner.events.subscribe();
    loop {
        let ev = tokio::select! {
            biased;
            _ = inner.cancel.cancelled() => break,
            ev = rx.recv() => ev,
        };
        match ev {
            Ok(SwarmEvent::PeerUp(p)) => {
                let cache = inner.peer_cache.clone();
                let entry = CachedPeer {
                    id: p.id,
                    addr: p.addr,
                    name: p.name,
                    last_seen_ms: crate::records::now_ms(),
                };
                let res = tokio::task::spawn_blocking(move || cache.remember(entry)).await;
                if let Ok(Err(e)) = res {
                    tracing::warn!(error = %e, "peer cache write failed");
                }
            }
            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
            Err(broadcast::error::RecvError::Closed) => break,
        }
    }
}

/// Dials bootstrap and cached peers at start and whenever this node has no
/// live peer, and re-contacts a few peers it believes down on every tick.
///
/// Every contact ends with a SWIM announce, also over a connection that
/// already existed: after a partition heals, the QUIC connection may come
/// back before membership does, and the announce is what lets each side
/// learn that the other is alive again (foca answers a down member with
/// `TurnUndead`, which makes it renew its identity and announce again on
/// the next tick).
async fn rejoin_loop(inner: Arc<Inner>, every: Duration) {
    /// Down peers re-contacted per tick (bounded work on a big swarm).
    const DOWN_PER_TICK: usize = 3;
    let mut first = true;
    loop {
        let peers = inner.membership.peers();
        let alone = !peers.iter().any(|p| p.state != PeerState::Down);
        let mut targets: Vec<BootstrapPeer> = Vec::new();
        if first || alone {
            targets.extend(inner.bootstrap.iter().cloned());
            let cache = inner.peer_cache.clone();
            if let Ok(Ok(cached)) = tokio::task::spawn_blocking(move || cache.load()).await {
                for c in cached {
                    if let Ok(mut a) = inner.addrs.write() {
                        a.entry(c.id).or_insert(c.addr);
                    }
                    targets.push(BootstrapPeer {
                        addr: c.addr,
                        node_id: Some(c.id),
                    });
                }
            }
        }
        if !first {
            let mut down: Vec<&PeerInfo> = peers
                .iter()
                .filter(|p| p.state == PeerState::Down)
                .collect();
            down.shuffle(&mut rand::thread_rng());
            for p in down.into_iter().take(DOWN_PER_TICK) {
                if !targets.iter().any(|t| t.node_id == Some(p.id)) {
                    targets.push(BootstrapPeer {
                        addr: p.addr,
                        node_id: Some(p.id),
                    });
                }
            }
        }
        let inner2 = &inner;
        join_all(targets.into_iter().map(|t| async move {
            let res = match t.node_id {
                Some(id) => inner2.transport.connect_to(id, t.addr).await,
                None => inner2.transport.dial(t.addr, None).await,
            };
            match res {
                Ok(pc) => inner2.membership.announce(pc.member.clone()),
                Err(e) if e.is_secret_mismatch() && inner2.refused_warned.due() => {
                    tracing::warn!(peer = %t, error = %e, "cannot join the swarm")
                }
                Err(e) => tracing::debug!(peer = %t, error = %e, "rejoin dial failed"),
            }
        }))
        .await;
        first = false;
        tokio::select! {
            biased;
            _ = inner.cancel.cancelled() => break,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// Reconciles with one random live peer every `every`.
async fn sync_loop(inner: Arc<Inner>, every: Duration) {
    loop {
        tokio::select! {
            biased;
            _ = inner.cancel.cancelled() => break,
            _ = tokio::time::sleep(every) => {}
        }
        let mut live: Vec<NodeId> = inner
            .membership
            .peers()
            .into_iter()
            .filter(|p| p.state == PeerState::Alive)
            .map(|p| p.id)
            .collect();
        live.shuffle(&mut rand::thread_rng());
        let Some(peer) = live.first().copied() else {
            continue;
        };
        match connect(&inner, peer).await {
            Ok(pc) => {
                if let Err(e) = inner.replicator.sync_with(&pc.conn, peer).await {
                    tracing::debug!(peer = %peer.short(), error = %e, "periodic sync failed");
                }
            }
            Err(e) => {
                tracing::debug!(peer = %peer.short(), error = %e, "periodic sync: unreachable")
            }
        }
    }
}

/// Dials nodes found by mDNS.
async fn mdns_dialer(inner: Arc<Inner>, mut rx: mpsc::UnboundedReceiver<Found>) {
    loop {
        let found = tokio::select! {
            biased;
            _ = inner.cancel.cancelled() => break,
            f = rx.recv() => match f { Some(f) => f, None => break },
        };
        if inner.transport.get(&found.id).is_some() {
            continue;
        }
        let inner = inner.clone();
        tokio::spawn(async move {
            for addr in found.addrs {
                match inner.transport.connect_to(found.id, addr).await {
                    Ok(_) => break,
                    Err(e) => {
                        tracing::debug!(peer = %found.id.short(), %addr, error = %e, "mDNS dial failed")
                    }
                }
            }
        });
    }
}
