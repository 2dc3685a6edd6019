//! Node identity: an Ed25519 key pair kept in the data directory.
//!
//! The [`NodeId`] is the 32-byte Ed25519 public key. It is printed as
//! lowercase RFC 4648 base32 without padding (52 characters, `a-z2-7`), which
//! is also a valid DNS label, so it doubles as the TLS server name.

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use ed25519_dalek::{Signer, SigningKey, Verifier, VerifyingKey};
use serde::{Deserialize, Serialize};

/// Name of the key file inside the data directory.
pub const KEY_FILE: &str = "node.key";

/// Errors from loading or creating an identity, or parsing a node id.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// Reading or writing the key file failed.
    #[error("key file {path}: {source}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The key file does not hold a 32-byte seed.
    #[error("key file {0} is corrupt (expected 32 bytes)")]
    Corrupt(PathBuf),
    /// A node id string is not 52 base32 characters.
    #[error("invalid node id {0:?}")]
    InvalidNodeId(String),
    /// The bytes are not a valid Ed25519 public key.
    #[error("not a valid Ed25519 public key")]
    InvalidKey,
}

/// A node's public identity: its Ed25519 public key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "[u8; 32]", into = "[u8; 32]")]
pub struct NodeId([u8; 32]);

impl TryFrom<[u8; 32]> for NodeId {
    type Error = IdentityError;

    fn try_from(bytes: [u8; 32]) -> Result<Self, Self::Error> {
        Self::from_bytes(bytes)
    }
}

impl From<NodeId> for [u8; 32] {
    fn from(id: NodeId) -> Self {
        id.0
    }
}

impl NodeId {
    /// Builds a node id from raw public-key bytes, checking that they are a
    /// valid Ed25519 point.
    pub fn from_bytes(bytes: [u8; 32]) -> Result<Self, IdentityError> {
        VerifyingKey::from_bytes(&bytes).map_err(|_| IdentityError::InvalidKey)?;
        Ok(Self(bytes))
    }

    /// The raw public-key bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A short prefix for logs and instance names (first 10 characters).
    pub fn short(&self) -> String {
        let mut s = self.to_string();
        s.truncate(10);
        s
    }

    /// Verifies an Ed25519 signature by this node over `msg`.
    pub fn verify(&self, msg: &[u8], signature: &[u8; 64]) -> bool {
        let Ok(key) = VerifyingKey::from_bytes(&self.0) else {
            return false;
        };
        let sig = ed25519_dalek::Signature::from_bytes(signature);
        key.verify(msg, &sig).is_ok()
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&encode_base32(&self.0))
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeId({})", self.short())
    }
}

impl FromStr for NodeId {
    type Err = IdentityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bytes = decode_base32(s).ok_or_else(|| IdentityError::InvalidNodeId(s.to_owned()))?;
        let arr: [u8; 32] = bytes
            .try_into()
            .map_err(|_| IdentityError::InvalidNodeId(s.to_owned()))?;
        Self::from_bytes(arr)
    }
}

/// Lowercase base32 (RFC 4648 alphabet) without padding.
pub(crate) fn encode_base32(bytes: &[u8]) -> String {
    data_encoding::BASE32_NOPAD
        .encode(bytes)
        .to_ascii_lowercase()
}

/// Decodes [`encode_base32`] output; accepts either case.
pub(crate) fn decode_base32(s: &str) -> Option<Vec<u8>> {
    data_encoding::BASE32_NOPAD
        .decode(s.trim().to_ascii_uppercase().as_bytes())
        .ok()
}

/// The node's secret key and derived public id.
#[derive(Clone)]
pub struct Identity {
    key: SigningKey,
    id: NodeId,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity").field("id", &self.id).finish()
    }
}

impl Identity {
    /// A fresh random identity (not persisted).
    pub fn generate() -> Self {
        Self::from_seed(rand::random())
    }

    /// The identity for a 32-byte Ed25519 seed.
    pub fn from_seed(seed: [u8; 32]) -> Self {
        let key = SigningKey::from_bytes(&seed);
        let id = NodeId(key.verifying_key().to_bytes());
        Self { key, id }
    }

    /// Loads the identity from `data_dir/node.key`, creating it (mode 0600,
    /// written atomically) on first start.
    pub fn load_or_create(data_dir: &Path) -> Result<Self, IdentityError> {
        let path = data_dir.join(KEY_FILE);
        match fs::read(&path) {
            Ok(bytes) => {
                let seed: [u8; 32] = bytes
                    .try_into()
                    .map_err(|_| IdentityError::Corrupt(path.clone()))?;
                warn_if_readable_by_others(&path);
                Ok(Self::from_seed(seed))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let identity = Self::generate();
                write_private_atomic(&path, identity.key.as_bytes())
                    .map_err(|source| IdentityError::Io { path, source })?;
                tracing::info!(node_id = %identity.id, "created new node identity");
                Ok(identity)
            }
            Err(source) => Err(IdentityError::Io { path, source }),
        }
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.id
    }

    /// Signs `msg` with the node key.
    pub fn sign(&self, msg: &[u8]) -> [u8; 64] {
        self.key.sign(msg).to_bytes()
    }

    /// The private key as PKCS#8 v1 DER, for rustls.
    pub(crate) fn pkcs8_der(&self) -> Vec<u8> {
        // RFC 8410 PrivateKeyInfo for Ed25519: fixed 16-byte prefix + seed.
        const PREFIX: [u8; 16] = [
            0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22,
            0x04, 0x20,
        ];
        let mut der = PREFIX.to_vec();
        der.extend_from_slice(self.key.as_bytes());
        der
    }
}

/// DER prefix of an Ed25519 SubjectPublicKeyInfo (RFC 8410); the 32 key bytes follow.
pub(crate) const ED25519_SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// The SubjectPublicKeyInfo DER of a node id (used as the TLS raw public key).
pub(crate) fn spki_der(id: &NodeId) -> Vec<u8> {
    let mut der = ED25519_SPKI_PREFIX.to_vec();
    der.extend_from_slice(id.as_bytes());
    der
}

/// Parses an Ed25519 SubjectPublicKeyInfo; anything else is rejected.
pub(crate) fn node_id_from_spki(der: &[u8]) -> Option<NodeId> {
    let key = der.strip_prefix(&ED25519_SPKI_PREFIX[..])?;
    let arr: [u8; 32] = key.try_into().ok()?;
    NodeId::from_bytes(arr).ok()
}

/// Writes `bytes` to `path` atomically with owner-only permissions:
/// a temporary file in the same directory, fsync, rename, fsync the directory.
pub(crate) fn write_private_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("file"),
        std::process::id()
    ));
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, path)?;
    if let Ok(d) = fs::File::open(dir) {
        // Directory fsync makes the rename durable; not supported everywhere.
        let _ = d.sync_all();
    }
    Ok(())
}

fn warn_if_readable_by_others(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = fs::metadata(path) {
            if meta.permissions().mode() & 0o077 != 0 {
                tracing::warn!(path = %path.display(), "node key is readable by other users");
            }
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_created_once_then_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let a = Identity::load_or_create(dir.path()).unwrap();
        let b = Identity::load_or_create(dir.path()).unwrap();
        assert_eq!(a.node_id(), b.node_id());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(dir.path().join(KEY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn corrupt_key_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(KEY_FILE), b"short").unwrap();
        assert!(matches!(
            Identity::load_or_create(dir.path()),
            Err(IdentityError::Corrupt(_))
        ));
    }

    #[test]
    fn node_id_display_round_trips() {
        let id = Identity::generate().node_id();
        let s = id.to_string();
        assert_eq!(s.len(), 52);
        assert!(s
            .chars()
            .all(|c| c.is_ascii_lowercase() || ('2'..='7').contains(&c)));
        assert_eq!(s.parse::<NodeId>().unwrap(), id);
        assert_eq!(s.to_uppercase().parse::<NodeId>().unwrap(), id);
        assert!("abc".parse::<NodeId>().is_err());
    }

    #[test]
    fn sign_and_verify() {
        let ident = Identity::generate();
        let sig = ident.sign(b"hello");
        assert!(ident.node_id().verify(b"hello", &sig));
        assert!(!ident.node_id().verify(b"hellO", &sig));
        let other = Identity::generate();
        assert!(!other.node_id().verify(b"hello", &sig));
    }

    #[test]
    fn spki_round_trip_and_rejects_garbage() {
        let id = Identity::generate().node_id();
        assert_eq!(node_id_from_spki(&spki_der(&id)), Some(id));
        let mut bad = spki_der(&id);
        bad[5] ^= 1;
        assert_eq!(node_id_from_spki(&bad), None);
        assert_eq!(node_id_from_spki(&bad[..40]), None);
    }
}
