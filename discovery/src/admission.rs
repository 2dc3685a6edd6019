//! Admission: who may join the swarm.
//!
//! Every member knows the [`SwarmSecret`]. After the TLS handshake (which
//! authenticates both node ids) each side proves knowledge of the secret with
//! an HMAC-SHA256 over both node ids and 32 bytes of TLS exporter keying
//! material. The exporter value is unique to the TLS session, so a proof cannot
//! be replayed or relayed to another connection, and the secret itself never
//! crosses the wire. Roles are bound into the MAC so a server cannot reflect
//! the client's proof back.
//!
//! The [`SwarmId`] (a separate hash of the secret) is public: it appears in
//! mDNS announcements so that nodes of different swarms on one LAN can ignore
//! each other. Knowing it does not help to compute a proof, as long as the
//! secret has enough entropy (generated secrets have 256 bits).

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::identity::{decode_base32, encode_base32, NodeId};

/// Label for the TLS keying-material exporter used by the admission proof.
pub(crate) const EXPORTER_LABEL: &[u8] = b"EXPORTER-starling-admission-v1";

/// Errors parsing a swarm secret.
#[derive(Debug, thiserror::Error)]
#[error("invalid swarm secret (expected 52 base32 characters)")]
pub struct InvalidSecret;

/// The shared secret that decides swarm membership.
#[derive(Clone, PartialEq, Eq)]
pub struct SwarmSecret([u8; 32]);

impl SwarmSecret {
    /// A new random secret (256 bits).
    pub fn generate() -> Self {
        Self(rand::random())
    }

    /// A secret from raw bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// Derives a secret from a passphrase. The public [`SwarmId`] allows
    /// offline guessing of weak passphrases; prefer [`SwarmSecret::generate`].
    pub fn from_passphrase(passphrase: &str) -> Self {
        let mut h = Sha256::new();
        h.update(b"starling/swarm-passphrase/v1\0");
        h.update(passphrase.as_bytes());
        Self(h.finalize().into())
    }

    /// The raw secret bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The public swarm id derived from this secret.
    pub fn swarm_id(&self) -> SwarmId {
        let mut h = Sha256::new();
        h.update(b"starling/swarm-id/v1\0");
        h.update(self.0);
        let digest: [u8; 32] = h.finalize().into();
        let mut id = [0u8; 8];
        id.copy_from_slice(&digest[..8]);
        SwarmId(id)
    }

    fn mac_key(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(b"starling/admission-key/v1\0");
        h.update(self.0);
        h.finalize().into()
    }

    /// The admission proof for one side of a connection.
    pub(crate) fn proof(
        &self,
        role: Role,
        client: &NodeId,
        server: &NodeId,
        exporter: &[u8; 32],
    ) -> [u8; 32] {
        // HMAC accepts keys of any length; a 32-byte key cannot fail.
        let mut mac = match <Hmac<Sha256> as Mac>::new_from_slice(&self.mac_key()) {
            Ok(m) => m,
            Err(_) => unreachable!("HMAC-SHA256 takes keys of any length"),
        };
        mac.update(b"starling/admission-proof/v1\0");
        mac.update(&[role as u8]);
        mac.update(client.as_bytes());
        mac.update(server.as_bytes());
        mac.update(exporter);
        mac.finalize().into_bytes().into()
    }

    /// Checks a proof in constant time.
    pub(crate) fn verify_proof(
        &self,
        role: Role,
        client: &NodeId,
        server: &NodeId,
        exporter: &[u8; 32],
        proof: &[u8],
    ) -> bool {
        let Ok(mut mac) = <Hmac<Sha256> as Mac>::new_from_slice(&self.mac_key()) else {
            return false;
        };
        mac.update(b"starling/admission-proof/v1\0");
        mac.update(&[role as u8]);
        mac.update(client.as_bytes());
        mac.update(server.as_bytes());
        mac.update(exporter);
        mac.verify_slice(proof).is_ok()
    }
}

impl fmt::Debug for SwarmSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SwarmSecret(swarm_id={})", self.swarm_id())
    }
}

impl fmt::Display for SwarmSecret {
    /// Prints the secret itself (base32); only use where the user asked for it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&encode_base32(&self.0))
    }
}

impl FromStr for SwarmSecret {
    type Err = InvalidSecret;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bytes = decode_base32(s).ok_or(InvalidSecret)?;
        Ok(Self(bytes.try_into().map_err(|_| InvalidSecret)?))
    }
}

/// Which side of the connection a proof is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Role {
    /// The dialling side.
    Client = 1,
    /// The accepting side.
    Server = 2,
}

/// Public 64-bit identifier of a swarm, derived from its secret.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SwarmId([u8; 8]);

impl fmt::Display for SwarmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for SwarmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SwarmId({self})")
    }
}

/// Admission policy: the swarm secret plus an optional allowlist of node ids.
#[derive(Clone, Debug)]
pub struct Admission {
    /// The swarm secret every member holds.
    pub secret: SwarmSecret,
    /// When set, only these node ids are admitted (in addition to the secret check).
    pub allowlist: Option<HashSet<NodeId>>,
}

impl Admission {
    /// Whether `id` passes the allowlist (always true without one).
    pub fn allows(&self, id: &NodeId) -> bool {
        self.allowlist.as_ref().is_none_or(|set| set.contains(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Identity;

    #[test]
    fn proof_binds_secret_roles_ids_and_session() {
        let s = SwarmSecret::generate();
        let (c, sv) = (
            Identity::generate().node_id(),
            Identity::generate().node_id(),
        );
        let ex = [7u8; 32];
        let p = s.proof(Role::Client, &c, &sv, &ex);
        assert!(s.verify_proof(Role::Client, &c, &sv, &ex, &p));
        assert!(!s.verify_proof(Role::Server, &c, &sv, &ex, &p));
        assert!(!s.verify_proof(Role::Client, &sv, &c, &ex, &p));
        assert!(!s.verify_proof(Role::Client, &c, &sv, &[8u8; 32], &p));
        assert!(!SwarmSecret::generate().verify_proof(Role::Client, &c, &sv, &ex, &p));
        assert!(!s.verify_proof(Role::Client, &c, &sv, &ex, &p[..31]));
    }

    #[test]
    fn secret_text_round_trip_and_swarm_id_differs() {
        let s = SwarmSecret::generate();
        let parsed: SwarmSecret = s.to_string().parse().unwrap();
        assert_eq!(parsed, s);
        assert_ne!(s.swarm_id().to_string(), hex::encode(&s.as_bytes()[..8]));
        assert_eq!(
            SwarmSecret::from_passphrase("x").swarm_id(),
            SwarmSecret::from_passphrase("x").swarm_id()
        );
        assert!(format!("{s:?}").contains("swarm_id"));
        assert!(!format!("{s:?}").contains(&s.to_string()));
    }
}
