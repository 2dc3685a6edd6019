//! mDNS (DNS-SD) announcement and browsing of `_starling._udp.local.`.
//!
//! The listen address decides where mDNS runs ([`plan`]):
//! - a loopback listener (127.0.0.0/8, ::1) never starts the mDNS daemon at
//!   all, so nothing is multicast anywhere (the daemon would join the mDNS
//!   group on every interface at start, before any interface filter applies);
//! - a listener on one address announces and browses only on the interface
//!   that holds that address;
//! - a wildcard listener (0.0.0.0 / ::) uses every non-loopback interface.
//!
//! TXT records carry `id` (node id, public anyway in TLS), `swarm` (the public
//! [`SwarmId`](crate::admission::SwarmId), never the secret) and `v` (wire
//! version). Browsers ignore instances of other swarms.

use std::net::{IpAddr, SocketAddr};

use mdns_sd::{IfKind, ServiceDaemon, ServiceEvent, ServiceInfo};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::admission::SwarmId;
use crate::identity::NodeId;
use crate::wire::WIRE_VERSION;

/// The DNS-SD service type.
pub const SERVICE_TYPE: &str = "_starling._udp.local.";

/// Where mDNS runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MdnsPlan {
    /// mDNS does not run.
    Off(&'static str),
    /// Only on the interface holding this address.
    Only(IpAddr),
    /// On every non-loopback interface.
    AllExternal,
}

/// Chooses where mDNS runs from the listen address.
pub fn plan(listen: SocketAddr, enabled: bool) -> MdnsPlan {
    let ip = listen.ip();
    if !enabled {
        MdnsPlan::Off("disabled in config")
    } else if ip.is_loopback() {
        MdnsPlan::Off("listening on loopback only")
    } else if ip.is_unspecified() {
        MdnsPlan::AllExternal
    } else {
        MdnsPlan::Only(ip)
    }
}

/// Errors starting mDNS.
#[derive(Debug, thiserror::Error)]
#[error("mdns: {0}")]
pub struct MdnsError(String);

impl From<mdns_sd::Error> for MdnsError {
    fn from(e: mdns_sd::Error) -> Self {
        Self(e.to_string())
    }
}

/// A node found by mDNS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// Its node id.
    pub id: NodeId,
    /// Its announced addresses.
    pub addrs: Vec<SocketAddr>,
}

/// A running mDNS responder + browser; stopped on drop.
pub struct Mdns {
    daemon: ServiceDaemon,
}

impl std::fmt::Debug for Mdns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mdns").finish_non_exhaustive()
    }
}

impl Mdns {
    /// Starts announcing this node and browsing for others of the same swarm.
    /// Returns `Ok(None)` when the plan is [`MdnsPlan::Off`].
    pub fn start(
        plan: &MdnsPlan,
        me: NodeId,
        swarm: SwarmId,
        port: u16,
        found: mpsc::UnboundedSender<Found>,
        cancel: CancellationToken,
    ) -> Result<Option<Self>, MdnsError> {
        let ip = match plan {
            MdnsPlan::Off(why) => {
                tracing::debug!(reason = why, "mDNS off");
                return Ok(None);
            }
            MdnsPlan::Only(ip) => Some(*ip),
            MdnsPlan::AllExternal => None,
        };
        let daemon = ServiceDaemon::new()?;
        // Interface selections apply in order; the last match wins.
        daemon.disable_interface(IfKind::All)?;
        match ip {
            Some(ip) => daemon.enable_interface(IfKind::Addr(ip))?,
            None => {
                daemon.enable_interface(IfKind::All)?;
                daemon.disable_interface(vec![IfKind::LoopbackV4, IfKind::LoopbackV6])?;
            }
        }
        let id = me.to_string();
        let host = format!("{}.local.", me.short());
        let props = [
            ("id", id.as_str()),
            ("swarm", &swarm.to_string()),
            ("v", &WIRE_VERSION.to_string()),
        ];
        let info = match ip {
            Some(ip) => ServiceInfo::new(SERVICE_TYPE, &me.short(), &host, ip, port, &props[..])?,
            None => ServiceInfo::new(SERVICE_TYPE, &me.short(), &host, "", port, &props[..])?
                .enable_addr_auto(),
        };
        daemon.register(info)?;
        let events = daemon.browse(SERVICE_TYPE)?;
        let swarm_tag = swarm.to_string();
        tokio::spawn(async move {
            loop {
                let ev = tokio::select! {
                    biased;
                    _ = cancel.cancelled() => break,
                    ev = events.recv_async() => match ev { Ok(e) => e, Err(_) => break },
                };
                let ServiceEvent::ServiceResolved(svc) = ev else {
                    continue;
                };
                if svc.get_property_val_str("swarm") != Some(swarm_tag.as_str()) {
                    continue;
                }
                let Some(Ok(id)) = svc.get_property_val_str("id").map(str::parse::<NodeId>) else {
                    continue;
                };
                if id == me {
                    continue;
                }
                let port = svc.get_port();
                let addrs: Vec<SocketAddr> = svc
                    .get_addresses()
                    .iter()
                    .map(|a| SocketAddr::new(a.to_ip_addr(), port))
                    .collect();
                if addrs.is_empty() {
                    continue;
                }
                tracing::debug!(peer = %id.short(), ?addrs, "found by mDNS");
                if found.send(Found { id, addrs }).is_err() {
                    break;
                }
            }
        });
        tracing::info!(?plan, "mDNS announcing {SERVICE_TYPE}");
        Ok(Some(Self { daemon }))
    }
}

impl Drop for Mdns {
    fn drop(&mut self) {
        let _ = self.daemon.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_address_drives_the_plan() {
        let p = |s: &str, on| plan(s.parse().unwrap(), on);
        assert!(matches!(p("127.0.0.1:1", true), MdnsPlan::Off(_)));
        assert!(matches!(p("[::1]:1", true), MdnsPlan::Off(_)));
        assert!(matches!(p("10.1.2.3:1", false), MdnsPlan::Off(_)));
        assert_eq!(
            p("10.1.2.3:1", true),
            MdnsPlan::Only("10.1.2.3".parse().unwrap())
        );
        assert_eq!(p("0.0.0.0:1", true), MdnsPlan::AllExternal);
        assert_eq!(p("[::]:1", true), MdnsPlan::AllExternal);
    }
}
