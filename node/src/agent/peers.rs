//! The swarm as the agent runtime sees it: a narrow trait over what the runtime uses of
//! [`Swarm`] (identity, membership, RPC, records), so that the runtime runs unchanged on
//! the real QUIC swarm and on an in-memory network in tests (a simulated cluster with a
//! virtual clock and injected faults, as quinn tests its connections over a `Pair`).

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use starling_discovery::{
    CallError, Handler, NodeId, PeerInfo, Record, RecordId, Swarm, SwarmError, SwarmEvent,
};
use tokio::sync::broadcast;

/// One result per member of a [`Peers::fan_out`], in the order given.
pub type FanOut = Vec<(NodeId, Result<Vec<u8>, CallError>)>;

/// What the agent runtime needs from the swarm.
pub trait Peers: Send + Sync + 'static {
    /// This node's id.
    fn node_id(&self) -> NodeId;
    /// This node's name.
    fn name(&self) -> &str;
    /// Every known peer and its liveness, as this node's membership sees it.
    fn peers(&self) -> Vec<PeerInfo>;
    /// Membership and record events.
    fn events(&self) -> broadcast::Receiver<SwarmEvent>;
    /// Serves `service` with `handler` (replacing any previous one).
    fn register(&self, service: &str, handler: Arc<dyn Handler>);
    /// The timeout of [`call`](Self::call) and [`fan_out`](Self::fan_out).
    fn rpc_timeout(&self) -> Duration;
    /// Calls `service`/`method` on `node`, waiting at most `timeout`.
    fn call_with_timeout<'a>(
        &'a self,
        node: NodeId,
        service: &'a str,
        method: &'a str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Vec<u8>, CallError>>;
    /// Stored records of one kind, oldest first.
    fn records(&self, kind: &str) -> Result<Vec<Record>, SwarmError>;
    /// One stored record.
    fn record(&self, id: &RecordId) -> Result<Option<Record>, SwarmError>;
    /// Signs, stores and spreads a record authored by this node.
    fn publish<'a>(
        &'a self,
        kind: &'a str,
        body: Vec<u8>,
    ) -> BoxFuture<'a, Result<Record, SwarmError>>;

    /// Calls `service`/`method` on `node` with the default timeout.
    fn call<'a>(
        &'a self,
        node: NodeId,
        service: &'a str,
        method: &'a str,
        body: Vec<u8>,
    ) -> BoxFuture<'a, Result<Vec<u8>, CallError>> {
        self.call_with_timeout(node, service, method, body, self.rpc_timeout())
    }

    /// Sends the same request to every member concurrently; one result per member, in the
    /// order given.
    fn fan_out<'a>(
        &'a self,
        members: &'a [NodeId],
        service: &'a str,
        method: &'a str,
        body: Vec<u8>,
    ) -> BoxFuture<'a, FanOut> {
        Box::pin(async move {
            futures::future::join_all(members.iter().map(|&m| {
                let body = body.clone();
                async move { (m, self.call(m, service, method, body).await) }
            }))
            .await
        })
    }
}

impl Peers for Swarm {
    fn node_id(&self) -> NodeId {
        Swarm::node_id(self)
    }

    fn name(&self) -> &str {
        Swarm::name(self)
    }

    fn peers(&self) -> Vec<PeerInfo> {
        Swarm::peers(self)
    }

    fn events(&self) -> broadcast::Receiver<SwarmEvent> {
        Swarm::events(self)
    }

    fn register(&self, service: &str, handler: Arc<dyn Handler>) {
        self.register_handler(service, ArcHandler(handler));
    }

    fn rpc_timeout(&self) -> Duration {
        Swarm::rpc_timeout(self)
    }

    fn call_with_timeout<'a>(
        &'a self,
        node: NodeId,
        service: &'a str,
        method: &'a str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Vec<u8>, CallError>> {
        Box::pin(Swarm::call_with_timeout(
            self, node, service, method, body, timeout,
        ))
    }

    fn fan_out<'a>(
        &'a self,
        members: &'a [NodeId],
        service: &'a str,
        method: &'a str,
        body: Vec<u8>,
    ) -> BoxFuture<'a, FanOut> {
        Box::pin(Swarm::fan_out(self, members, service, method, body))
    }

    fn records(&self, kind: &str) -> Result<Vec<Record>, SwarmError> {
        Swarm::records(self, kind)
    }

    fn record(&self, id: &RecordId) -> Result<Option<Record>, SwarmError> {
        Swarm::record(self, id)
    }

    fn publish<'a>(
        &'a self,
        kind: &'a str,
        body: Vec<u8>,
    ) -> BoxFuture<'a, Result<Record, SwarmError>> {
        Box::pin(Swarm::publish(self, kind, body))
    }
}

/// A shared handler as the swarm's router takes it.
struct ArcHandler(Arc<dyn Handler>);

impl Handler for ArcHandler {
    fn handle(
        &self,
        req: starling_discovery::Request,
    ) -> BoxFuture<'static, Result<Vec<u8>, starling_discovery::RpcError>> {
        self.0.handle(req)
    }
}

/// An in-memory swarm for tests: every node's RPC handlers, records and events in one
/// process, membership decided by the test (`kill`), and faults injected per call.
///
/// Time is virtual when the test runs on tokio's paused clock (`start_paused`): timers
/// fire in order without waiting, and the store's and the model's threads hold the clock
/// while they work (`crate::outside::Busy`). A call to a dead node fails after
/// [`LOST_AFTER`] (the connection is gone), not after the caller's whole timeout, and the
/// living hear of a death [`DETECTED_AFTER`] it (as from SWIM), so that what the dead node
/// sent just before is handled first, as over a real network.
#[cfg(test)]
pub(crate) mod sim {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use futures::future::BoxFuture;
    use starling_discovery::{
        CallError, Handler, Identity, NodeId, PeerInfo, PeerState, Record, RecordId, Request,
        SwarmError, SwarmEvent,
    };
    use tokio::sync::broadcast;

    use super::Peers;

    /// How long a call to a dead node takes to fail.
    pub(crate) const LOST_AFTER: Duration = Duration::from_millis(50);
    /// How long after a node dies the living are told (`SwarmEvent::PeerDown`).
    pub(crate) const DETECTED_AFTER: Duration = Duration::from_secs(1);

    /// What happens to a call, decided before it is delivered.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(crate) enum Fault {
        /// The target dies just before the call reaches it (it never answers).
        KillTarget,
        /// The caller dies as it makes the call (which is lost).
        KillCaller,
    }

    /// Decides, from (caller name, target name, method), whether a call meets a fault.
    type Rule = Box<dyn FnMut(&str, &str, &str) -> Option<Fault> + Send>;

    struct SimNode {
        identity: Identity,
        name: String,
        handlers: Mutex<HashMap<String, Arc<dyn Handler>>>,
        events: broadcast::Sender<SwarmEvent>,
        records: Mutex<Vec<Record>>,
        down: AtomicBool,
    }

    /// The network: its nodes and the fault rule.
    #[derive(Default)]
    pub(crate) struct SimNet {
        nodes: Mutex<Vec<Arc<SimNode>>>,
        rule: Mutex<Option<Rule>>,
        /// Calls delivered, as (caller, target, method) names.
        log: Mutex<Vec<(String, String, String)>>,
        /// Deaths not yet reported to the living (dropped with the network).
        detections: Mutex<tokio::task::JoinSet<()>>,
    }

    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    impl SimNet {
        pub(crate) fn new() -> Arc<Self> {
            Arc::default()
        }

        /// Adds a node named `name`; returns its view of the network.
        pub(crate) fn join(self: &Arc<Self>, name: &str) -> SimPeer {
            let node = Arc::new(SimNode {
                identity: Identity::generate(),
                name: name.to_owned(),
                handlers: Mutex::default(),
                events: broadcast::channel(1024).0,
                records: Mutex::default(),
                down: AtomicBool::new(false),
            });
            // A newcomer gets the records already spread.
            let known: Vec<Record> = lock(&self.nodes)
                .first()
                .map(|n| lock(&n.records).clone())
                .unwrap_or_default();
            *lock(&node.records) = known;
            lock(&self.nodes).push(node.clone());
            SimPeer {
                net: self.clone(),
                node,
            }
        }

        /// Sets the fault rule (replacing any previous one).
        pub(crate) fn on_call(
            &self,
            rule: impl FnMut(&str, &str, &str) -> Option<Fault> + Send + 'static,
        ) {
            *lock(&self.rule) = Some(Box::new(rule));
        }

        /// Kills the node named `name`: it stops answering, and every other node's
        /// membership declares it down.
        pub(crate) fn kill(&self, name: &str) {
            let nodes = lock(&self.nodes).clone();
            let Some(dead) = nodes.iter().find(|n| n.name == name) else {
                return;
            };
            if dead.down.swap(true, Ordering::SeqCst) {
                return;
            }
            let id = dead.identity.node_id();
            // The living learn of it a moment later, as SWIM's failure detection takes its
            // time: a call the dead node had already made is handled first.
            lock(&self.detections).spawn(async move {
                tokio::time::sleep(DETECTED_AFTER).await;
                for n in nodes.iter().filter(|n| !n.down.load(Ordering::SeqCst)) {
                    let _ = n.events.send(SwarmEvent::PeerDown(id));
                }
            });
        }

        /// The calls delivered so far, as (caller, target, method) names.
        pub(crate) fn calls(&self) -> Vec<(String, String, String)> {
            lock(&self.log).clone()
        }

        fn node(&self, id: NodeId) -> Option<Arc<SimNode>> {
            lock(&self.nodes)
                .iter()
                .find(|n| n.identity.node_id() == id)
                .cloned()
        }
    }

    /// One node's view of a [`SimNet`].
    pub(crate) struct SimPeer {
        net: Arc<SimNet>,
        node: Arc<SimNode>,
    }

    impl Peers for SimPeer {
        fn node_id(&self) -> NodeId {
            self.node.identity.node_id()
        }

        fn name(&self) -> &str {
            &self.node.name
        }

        fn peers(&self) -> Vec<PeerInfo> {
            lock(&self.net.nodes)
                .iter()
                .filter(|n| !Arc::ptr_eq(n, &self.node))
                .map(|n| PeerInfo {
                    id: n.identity.node_id(),
                    name: n.name.clone(),
                    addr: ([127, 0, 0, 1], 0).into(),
                    state: if n.down.load(Ordering::SeqCst) {
                        PeerState::Down
                    } else {
                        PeerState::Alive
                    },
                    generation: 0,
                })
                .collect()
        }

        fn events(&self) -> broadcast::Receiver<SwarmEvent> {
            self.node.events.subscribe()
        }

        fn register(&self, service: &str, handler: Arc<dyn Handler>) {
            lock(&self.node.handlers).insert(service.to_owned(), handler);
        }

        fn rpc_timeout(&self) -> Duration {
            Duration::from_secs(30)
        }

        fn call_with_timeout<'a>(
            &'a self,
            node: NodeId,
            service: &'a str,
            method: &'a str,
            body: Vec<u8>,
            timeout: Duration,
        ) -> BoxFuture<'a, Result<Vec<u8>, CallError>> {
            Box::pin(async move {
                let Some(target) = self.net.node(node) else {
                    return Err(CallError::Stream("unknown node".into()));
                };
                let fault = lock(&self.net.rule)
                    .as_mut()
                    .and_then(|rule| rule(&self.node.name, &target.name, method));
                match fault {
                    Some(Fault::KillTarget) => self.net.kill(&target.name),
                    Some(Fault::KillCaller) => self.net.kill(&self.node.name),
                    None => {}
                }
                let handler = lock(&target.handlers).get(service).cloned();
                let alive =
                    !target.down.load(Ordering::SeqCst) && !self.node.down.load(Ordering::SeqCst);
                let Some(handler) = handler.filter(|_| alive) else {
                    tokio::time::sleep(LOST_AFTER.min(timeout)).await;
                    return Err(CallError::Stream("connection lost".into()));
                };
                lock(&self.net.log).push((
                    self.node.name.clone(),
                    target.name.clone(),
                    method.to_owned(),
                ));
                tracing::debug!(from = %self.node.name, to = %target.name, method, "sim call");
                let req = Request {
                    from: self.node.identity.node_id(),
                    service: service.to_owned(),
                    method: method.to_owned(),
                    body: body.into(),
                };
                match tokio::time::timeout(timeout, handler.handle(req)).await {
                    Err(_) => Err(CallError::Timeout),
                    Ok(Err(e)) => {
                        tracing::debug!(to = %target.name, method, error = %e, "sim call refused");
                        Err(CallError::Remote(e))
                    }
                    Ok(Ok(reply)) => Ok(reply),
                }
            })
        }

        fn records(&self, kind: &str) -> Result<Vec<Record>, SwarmError> {
            Ok(lock(&self.node.records)
                .iter()
                .filter(|r| r.kind() == kind)
                .cloned()
                .collect())
        }

        fn record(&self, id: &RecordId) -> Result<Option<Record>, SwarmError> {
            Ok(lock(&self.node.records)
                .iter()
                .find(|r| r.id() == *id)
                .cloned())
        }

        fn publish<'a>(
            &'a self,
            kind: &'a str,
            body: Vec<u8>,
        ) -> BoxFuture<'a, Result<Record, SwarmError>> {
            Box::pin(async move {
                let record = Record::sign(&self.node.identity, kind, body)?;
                let nodes = lock(&self.net.nodes).clone();
                for n in nodes.iter().filter(|n| !n.down.load(Ordering::SeqCst)) {
                    lock(&n.records).push(record.clone());
                    let _ = n.events.send(SwarmEvent::Record {
                        id: record.id(),
                        author: record.author(),
                        kind: kind.to_owned(),
                    });
                }
                Ok(record)
            })
        }
    }
}
