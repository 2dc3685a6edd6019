//! Discovery sources: static bootstrap peers, the persistent peer cache and
//! mDNS. Any one of them is enough to join: it yields an address (and maybe a
//! node id) to dial; admission and membership do the rest.

pub mod mdns;
pub mod peer_cache;

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::identity::NodeId;

pub use peer_cache::{CachedPeer, FilePeerCache, PeerCache, PeerCacheError};

/// A peer to dial at start: an address, optionally with the node id expected there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootstrapPeer {
    /// Address to dial.
    pub addr: SocketAddr,
    /// When set, TLS refuses any other node at that address.
    pub node_id: Option<NodeId>,
}

/// Error parsing a [`BootstrapPeer`].
#[derive(Debug, thiserror::Error)]
#[error("invalid bootstrap peer {0:?} (expected HOST:PORT or NODEID@HOST:PORT)")]
pub struct InvalidBootstrap(String);

impl FromStr for BootstrapPeer {
    type Err = InvalidBootstrap;

    /// Parses `IP:PORT` or `NODEID@IP:PORT`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || InvalidBootstrap(s.to_owned());
        let (node_id, addr) = match s.split_once('@') {
            Some((id, addr)) => (Some(id.parse().map_err(|_| err())?), addr),
            None => (None, s),
        };
        Ok(Self {
            addr: addr.trim().parse().map_err(|_| err())?,
            node_id,
        })
    }
}

impl fmt::Display for BootstrapPeer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.node_id {
            Some(id) => write!(f, "{id}@{}", self.addr),
            None => write!(f, "{}", self.addr),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Identity;

    #[test]
    fn bootstrap_parse() {
        let id = Identity::generate().node_id();
        let p: BootstrapPeer = format!("{id}@127.0.0.1:4000").parse().unwrap();
        assert_eq!(p.node_id, Some(id));
        assert_eq!(p.to_string().parse::<BootstrapPeer>().unwrap(), p);
        let q: BootstrapPeer = "[::1]:9".parse().unwrap();
        assert_eq!(q.node_id, None);
        assert!("nope".parse::<BootstrapPeer>().is_err());
        assert!("abc@127.0.0.1:1".parse::<BootstrapPeer>().is_err());
    }
}
