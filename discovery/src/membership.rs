//! SWIM membership (foca), driven by one tokio task.
//!
//! foca is sans-IO: this module feeds it packets and timer events and carries
//! out what it asks (send a packet, schedule a timer, report a change).
//! Packets travel inside admitted QUIC connections (datagrams, or a stream
//! when too large), so admission applies to SWIM too: a stranger cannot
//! inject membership updates.
//!
//! The foca identity is [`MemberId`]: node id + address + a generation that
//! grows on every start and on rejoin, plus the node name as metadata. Two
//! identities with the same node id conflict, and the higher generation wins,
//! so a restarted or rejoining node replaces its old entry cleanly.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use foca::{
    AccumulatingRuntime, Config, Foca, NoCustomBroadcast, OwnedNotification, PostcardCodec, Timer,
};
use rand_foca::SeedableRng;
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::identity::NodeId;
use crate::wire::MemberWire;
use crate::SwarmEvent;

/// Longest node name kept (longer names are cut).
pub const MAX_NAME_LEN: usize = 64;

/// Timing presets for failure detection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum MembershipPreset {
    /// Local network: 500 ms probe period, 250 ms probe timeout, ~2.4 s
    /// suspicion: a crashed node is declared down in ~3-4 s.
    #[default]
    Lan,
    /// Wide area: 5 s probe period, longer timeouts.
    Wan,
}

impl MembershipPreset {
    pub(crate) fn config(self, expected_size: u32) -> Config {
        let n = NonZeroU32::new(expected_size.max(1)).unwrap_or(NonZeroU32::MIN);
        match self {
            Self::Lan => {
                // memberlist's LAN timings halved: a 500 ms probe period and
                // a suspicion window of 4 probe periods (x log10 of the
                // cluster size) put detection of a crashed node at ~3-4 s
                // for clusters up to a few dozen nodes, with indirect probes
                // through 3 members protecting a slow-but-alive node.
                let period = Duration::from_millis(500);
                let mut c = Config::new_lan(n);
                c.probe_period = period;
                c.probe_rtt = Duration::from_millis(250);
                c.suspect_to_down_after = Duration::from_secs_f64(
                    f64::from(n.get()).log10().max(1.0) * 4.0 * period.as_secs_f64(),
                );
                c.remove_down_after = Some(Duration::from_secs(3600));
                c
            }
            Self::Wan => {
                let mut c = Config::new_wan(n);
                c.remove_down_after = Some(Duration::from_secs(3600));
                c
            }
        }
    }
}

/// A member's identity as gossiped by SWIM.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MemberId {
    /// Node id.
    pub id: NodeId,
    /// Address to dial.
    pub addr: SocketAddr,
    /// Start/rejoin generation (higher wins).
    pub generation: u64,
    /// Node name.
    pub name: String,
}

impl foca::Identity for MemberId {
    type Addr = NodeId;

    fn renew(&self) -> Option<Self> {
        Some(Self {
            generation: self.generation.saturating_add(1),
            ..self.clone()
        })
    }

    fn addr(&self) -> NodeId {
        self.id
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.generation > adversary.generation
    }
}

impl From<MemberWire> for MemberId {
    fn from(w: MemberWire) -> Self {
        Self {
            id: w.id,
            addr: w.addr,
            generation: w.generation,
            name: w.name,
        }
    }
}

impl From<MemberId> for MemberWire {
    fn from(m: MemberId) -> Self {
        Self {
            id: m.id,
            addr: m.addr,
            generation: m.generation,
            name: m.name,
        }
    }
}

/// Liveness of a peer as seen by this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerState {
    /// Answering probes.
    Alive,
    /// Missed probes; will be declared down unless it refutes.
    Suspect,
    /// Declared down (failed or left).
    Down,
}

/// What this node knows about a peer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerInfo {
    /// Node id.
    pub id: NodeId,
    /// Node name.
    pub name: String,
    /// Address to dial.
    pub addr: SocketAddr,
    /// Liveness.
    pub state: PeerState,
    /// Generation of the identity last seen.
    pub generation: u64,
}

/// Sends SWIM packets to members (implemented over the QUIC transport).
pub(crate) trait GossipSender: Send + Sync + 'static {
    fn send(&self, to: MemberId, data: Bytes);
}

enum Input {
    Data(Bytes),
    Announce(MemberId),
    Timer(Timer<MemberId>),
    Leave(oneshot::Sender<()>),
}

/// Handle to the membership task.
#[derive(Clone)]
pub(crate) struct Membership {
    tx: mpsc::Sender<Input>,
    peers: Arc<RwLock<HashMap<NodeId, PeerInfo>>>,
}

type SwimFoca = Foca<MemberId, PostcardCodec, rand_foca::rngs::StdRng, NoCustomBroadcast>;

struct Actor {
    foca: SwimFoca,
    rt: AccumulatingRuntime<MemberId>,
    sender: Arc<dyn GossipSender>,
    tx: mpsc::Sender<Input>,
    peers: Arc<RwLock<HashMap<NodeId, PeerInfo>>>,
    events: broadcast::Sender<SwarmEvent>,
    on_renew: Box<dyn Fn(MemberId) + Send + Sync>,
    max_members: usize,
    leaving: bool,
    cancel: CancellationToken,
}

impl Membership {
    /// Starts the membership task.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        me: MemberId,
        preset: MembershipPreset,
        max_members: usize,
        sender: Arc<dyn GossipSender>,
        events: broadcast::Sender<SwarmEvent>,
        on_renew: Box<dyn Fn(MemberId) + Send + Sync>,
        cancel: CancellationToken,
    ) -> Self {
        let (tx, rx) = mpsc::channel(1024);
        let peers = Arc::new(RwLock::new(HashMap::new()));
        let rng = rand_foca::rngs::StdRng::from_seed(rand::random());
        let foca = Foca::new(me, preset.config(16), rng, PostcardCodec);
        let actor = Actor {
            foca,
            rt: AccumulatingRuntime::new(),
            sender,
            tx: tx.clone(),
            peers: peers.clone(),
            events,
            on_renew,
            max_members,
            leaving: false,
            cancel,
        };
        tokio::spawn(actor.run(rx));
        Self { tx, peers }
    }

    /// Feeds a SWIM packet received from an admitted peer. Dropped if the
    /// task is saturated (SWIM tolerates loss).
    pub(crate) fn handle_data(&self, data: Bytes) {
        let _ = self.tx.try_send(Input::Data(data));
    }

    /// Announces ourselves to a peer we just connected to.
    pub(crate) fn announce(&self, to: MemberWire) {
        let _ = self.tx.try_send(Input::Announce(to.into()));
    }

    /// Leaves the cluster gracefully (tells peers), then stops the task.
    pub(crate) async fn leave(&self) {
        let (done_tx, done_rx) = oneshot::channel();
        if self.tx.send(Input::Leave(done_tx)).await.is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(2), done_rx).await;
        }
    }

    /// Snapshot of known peers.
    pub(crate) fn peers(&self) -> Vec<PeerInfo> {
        let mut v: Vec<PeerInfo> = self
            .peers
            .read()
            .map(|p| p.values().cloned().collect())
            .unwrap_or_default();
        v.sort_by(|a, b| a.name.cmp(&b.name).then(a.id.cmp(&b.id)));
        v
    }

    /// One peer.
    pub(crate) fn peer(&self, id: &NodeId) -> Option<PeerInfo> {
        self.peers.read().ok()?.get(id).cloned()
    }
}

impl Actor {
    async fn run(mut self, mut rx: mpsc::Receiver<Input>) {
        loop {
            let input = tokio::select! {
                biased;
                _ = self.cancel.cancelled() => break,
                i = rx.recv() => match i { Some(i) => i, None => break },
            };
            let result = match input {
                Input::Data(data) => self.foca.handle_data(&data, &mut self.rt),
                Input::Announce(to) => self.foca.announce(to, &mut self.rt),
                Input::Timer(t) => self.foca.handle_timer(t, &mut self.rt),
                Input::Leave(done) => {
                    self.leaving = true;
                    let r = self.foca.leave_cluster(&mut self.rt);
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "leave_cluster failed");
                    }
                    self.drain();
                    let _ = done.send(());
                    break;
                }
            };
            if let Err(e) = result {
                // Bad packets from peers end up here; they never stop the task.
                tracing::debug!(error = %e, "swim input rejected");
            }
            self.drain();
        }
    }

    fn drain(&mut self) {
        while let Some((to, data)) = self.rt.to_send() {
            self.sender.send(to, data);
        }
        while let Some((after, timer)) = self.rt.to_schedule() {
            let tx = self.tx.clone();
            let cancel = self.cancel.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = cancel.cancelled() => {}
                    _ = tokio::time::sleep(after) => { let _ = tx.send(Input::Timer(timer)).await; }
                }
            });
        }
        while let Some(n) = self.rt.to_notify() {
            self.notify(n);
        }
        self.refresh_states();
    }

    fn notify(&mut self, n: OwnedNotification<MemberId>) {
        match n {
            OwnedNotification::MemberUp(m) | OwnedNotification::Rename(_, m) => {
                self.set_state(&m, PeerState::Alive)
            }
            OwnedNotification::MemberDown(m) => self.set_state(&m, PeerState::Down),
            OwnedNotification::Rejoin(me) => {
                tracing::info!(
                    generation = me.generation,
                    "rejoined the swarm with a renewed identity"
                );
                (self.on_renew)(me);
            }
            OwnedNotification::Defunct if self.leaving => tracing::debug!("left the swarm"),
            OwnedNotification::Defunct => {
                tracing::warn!("declared down by the swarm and could not rejoin")
            }
            OwnedNotification::Active => tracing::debug!("membership active"),
            OwnedNotification::Idle => tracing::debug!("membership idle (no peers)"),
        }
    }

    /// Picks up suspect/alive transitions, which foca does not notify.
    fn refresh_states(&mut self) {
        let states: Vec<(MemberId, foca::State)> = self
            .foca
            .iter_membership_state()
            .map(|m| (m.id().clone(), m.state()))
            .collect();
        for (m, s) in states {
            let state = match s {
                foca::State::Alive => PeerState::Alive,
                foca::State::Suspect => PeerState::Suspect,
                foca::State::Down => PeerState::Down,
            };
            let known = self
                .peers
                .read()
                .ok()
                .and_then(|p| p.get(&m.id).map(|i| (i.state, i.generation)));
            match known {
                Some((old, gen)) if gen > m.generation => {
                    let _ = old; // a stale identity of a peer we already know newer
                }
                Some((old, _)) if old != state => self.set_state(&m, state),
                None if state != PeerState::Down => self.set_state(&m, state),
                _ => {}
            }
        }
    }

    fn set_state(&mut self, m: &MemberId, state: PeerState) {
        let Ok(mut peers) = self.peers.write() else {
            return;
        };
        if let Some(existing) = peers.get(&m.id) {
            if existing.generation > m.generation {
                return; // news about an older incarnation of this node
            }
            if existing.state == state && existing.generation == m.generation {
                return;
            }
        } else if peers.len() >= self.max_members {
            // Bounded table: make room by forgetting a down peer, else ignore.
            let victim = peers
                .values()
                .find(|p| p.state == PeerState::Down)
                .map(|p| p.id);
            match victim {
                Some(v) => {
                    peers.remove(&v);
                }
                None => {
                    tracing::warn!(
                        max = self.max_members,
                        "member table full; ignoring new member"
                    );
                    return;
                }
            }
        }
        let mut name = m.name.clone();
        if name.len() > MAX_NAME_LEN {
            let mut cut = MAX_NAME_LEN;
            while !name.is_char_boundary(cut) {
                cut -= 1;
            }
            name.truncate(cut);
        }
        let info = PeerInfo {
            id: m.id,
            name,
            addr: m.addr,
            state,
            generation: m.generation,
        };
        peers.insert(m.id, info.clone());
        drop(peers);
        tracing::debug!(peer = %m.id.short(), name = %info.name, ?state, "membership change");
        let event = match state {
            PeerState::Alive => SwarmEvent::PeerUp(info),
            PeerState::Suspect => SwarmEvent::PeerSuspect(m.id),
            PeerState::Down => SwarmEvent::PeerDown(m.id),
        };
        let _ = self.events.send(event);
    }
}
