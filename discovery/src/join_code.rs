//! Join codes: everything a new node needs to join, as one copy-pasteable
//! string (`starling invite` prints one, `starling up --join CODE` reads it).
//!
//! A join code contains the swarm secret: treat it like a password.
//! Format: `st1` + lowercase base32 of postcard(`{version, secret, node, addrs}`)
//! followed by a 4-byte SHA-256 checksum that catches copy/paste damage.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::admission::SwarmSecret;
use crate::discover::BootstrapPeer;
use crate::identity::{decode_base32, encode_base32, NodeId};

const PREFIX: &str = "st1";
const VERSION: u8 = 1;
/// Most addresses a code carries.
pub const MAX_ADDRS: usize = 8;

/// Error parsing a join code.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JoinCodeError {
    /// Wrong prefix or not base32.
    #[error("not a starling join code")]
    Format,
    /// The checksum does not match (damaged when copied).
    #[error("join code checksum mismatch (was it copied completely?)")]
    Checksum,
    /// Decodes, but the content is invalid or of an unknown version.
    #[error("invalid join code content")]
    Content,
}

/// Secret + node id + reachable addresses of an inviting node.
#[derive(Clone, PartialEq, Eq)]
pub struct JoinCode {
    /// The swarm secret.
    pub secret: SwarmSecret,
    /// The inviting node.
    pub node_id: NodeId,
    /// Addresses the inviting node is reachable at.
    pub addrs: Vec<SocketAddr>,
}

#[derive(Serialize, Deserialize)]
struct Wire {
    version: u8,
    secret: [u8; 32],
    node: NodeId,
    addrs: Vec<SocketAddr>,
}

impl JoinCode {
    /// The bootstrap peers this code describes.
    pub fn bootstrap_peers(&self) -> Vec<BootstrapPeer> {
        self.addrs
            .iter()
            .map(|addr| BootstrapPeer {
                addr: *addr,
                node_id: Some(self.node_id),
            })
            .collect()
    }
}

impl fmt::Debug for JoinCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinCode")
            .field("secret", &self.secret)
            .field("node_id", &self.node_id)
            .field("addrs", &self.addrs)
            .finish()
    }
}

impl fmt::Display for JoinCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let wire = Wire {
            version: VERSION,
            secret: *self.secret.as_bytes(),
            node: self.node_id,
            addrs: self.addrs.iter().take(MAX_ADDRS).copied().collect(),
        };
        let mut bytes = postcard::to_allocvec(&wire).map_err(|_| fmt::Error)?;
        let sum = Sha256::digest(&bytes);
        bytes.extend_from_slice(&sum[..4]);
        write!(f, "{PREFIX}{}", encode_base32(&bytes))
    }
}

impl FromStr for JoinCode {
    type Err = JoinCodeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let body = s.strip_prefix(PREFIX).ok_or(JoinCodeError::Format)?;
        let bytes = decode_base32(body).ok_or(JoinCodeError::Format)?;
        if bytes.len() < 5 {
            return Err(JoinCodeError::Format);
        }
        let (payload, sum) = bytes.split_at(bytes.len() - 4);
        if Sha256::digest(payload)[..4] != *sum {
            return Err(JoinCodeError::Checksum);
        }
        let wire: Wire = postcard::from_bytes(payload).map_err(|_| JoinCodeError::Content)?;
        if wire.version != VERSION || wire.addrs.is_empty() || wire.addrs.len() > MAX_ADDRS {
            return Err(JoinCodeError::Content);
        }
        Ok(Self {
            secret: SwarmSecret::from_bytes(wire.secret),
            node_id: wire.node,
            addrs: wire.addrs,
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::identity::Identity;

    #[test]
    fn round_trip_and_damage_detection() {
        let code = JoinCode {
            secret: SwarmSecret::generate(),
            node_id: Identity::generate().node_id(),
            addrs: vec![
                "192.168.1.5:7420".parse().unwrap(),
                "[fe80::1]:7420".parse().unwrap(),
            ],
        };
        let s = code.to_string();
        assert!(s.starts_with("st1"));
        assert_eq!(s.parse::<JoinCode>().unwrap(), code);
        assert_eq!(
            s.to_uppercase()
                .replacen("ST1", "st1", 1)
                .parse::<JoinCode>()
                .unwrap(),
            code
        );
        let mut damaged: Vec<char> = s.chars().collect();
        let i = damaged.len() / 2;
        damaged[i] = if damaged[i] == 'a' { 'b' } else { 'a' };
        let damaged: String = damaged.into_iter().collect();
        assert_eq!(damaged.parse::<JoinCode>(), Err(JoinCodeError::Checksum));
        assert!(s[..s.len() - 3].parse::<JoinCode>().is_err());
        assert_eq!("hello".parse::<JoinCode>(), Err(JoinCodeError::Format));
    }

    proptest! {
        #[test]
        fn arbitrary_strings_never_panic(s in ".{0,200}") {
            let _ = s.parse::<JoinCode>();
            let _ = format!("st1{s}").parse::<JoinCode>();
        }
    }
}
