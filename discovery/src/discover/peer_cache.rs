//! Last-known peer addresses, so a restarted node rejoins without mDNS or
//! bootstrap configuration. The node may implement [`PeerCache`] on SQLite;
//! [`FilePeerCache`] keeps a small JSON file in the data directory, replaced
//! atomically.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::identity::{write_private_atomic, NodeId};

/// Default file name inside the data directory.
pub const PEER_CACHE_FILE: &str = "peers.json";
/// Most peers remembered (the least recently seen are forgotten first).
pub const MAX_CACHED_PEERS: usize = 256;

/// A remembered peer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedPeer {
    /// Node id.
    pub id: NodeId,
    /// Last address it was reachable at.
    pub addr: SocketAddr,
    /// Node name.
    pub name: String,
    /// When it was last seen alive (ms since the Unix epoch).
    pub last_seen_ms: u64,
}

/// Errors of a peer cache.
#[derive(Debug, thiserror::Error)]
pub enum PeerCacheError {
    /// Reading or writing failed.
    #[error("peer cache {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file is not valid JSON of the expected shape.
    #[error("peer cache {path} is corrupt: {source}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The error.
        source: serde_json::Error,
    },
}

/// Storage of last-known peers.
pub trait PeerCache: Send + Sync + 'static {
    /// All remembered peers, most recently seen first.
    fn load(&self) -> Result<Vec<CachedPeer>, PeerCacheError>;
    /// Records that `peer` was seen alive.
    fn remember(&self, peer: CachedPeer) -> Result<(), PeerCacheError>;
}

/// [`PeerCache`] in a JSON file.
#[derive(Debug)]
pub struct FilePeerCache {
    path: PathBuf,
    entries: Mutex<Option<HashMap<NodeId, CachedPeer>>>,
}

impl FilePeerCache {
    /// A cache at `data_dir/peers.json`.
    pub fn in_dir(data_dir: &Path) -> Self {
        Self::at(data_dir.join(PEER_CACHE_FILE))
    }

    /// A cache at an explicit path.
    pub fn at(path: PathBuf) -> Self {
        Self {
            path,
            entries: Mutex::new(None),
        }
    }

    fn read_file(&self) -> Result<HashMap<NodeId, CachedPeer>, PeerCacheError> {
        match std::fs::read(&self.path) {
            Ok(bytes) => {
                let list: Vec<CachedPeer> =
                    serde_json::from_slice(&bytes).map_err(|source| PeerCacheError::Corrupt {
                        path: self.path.clone(),
                        source,
                    })?;
                Ok(list.into_iter().map(|p| (p.id, p)).collect())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(HashMap::new()),
            Err(source) => Err(PeerCacheError::Io {
                path: self.path.clone(),
                source,
            }),
        }
    }
}

fn sorted(map: &HashMap<NodeId, CachedPeer>) -> Vec<CachedPeer> {
    let mut v: Vec<CachedPeer> = map.values().cloned().collect();
    v.sort_by(|a, b| b.last_seen_ms.cmp(&a.last_seen_ms).then(a.id.cmp(&b.id)));
    v
}

impl PeerCache for FilePeerCache {
    fn load(&self) -> Result<Vec<CachedPeer>, PeerCacheError> {
        let mut g = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            *g = Some(self.read_file()?);
        }
        Ok(g.as_ref().map(sorted).unwrap_or_default())
    }

    fn remember(&self, peer: CachedPeer) -> Result<(), PeerCacheError> {
        let mut g = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            // A corrupt file is replaced rather than blocking the cache forever.
            *g = Some(self.read_file().unwrap_or_default());
        }
        let Some(map) = g.as_mut() else {
            return Ok(());
        };
        map.insert(peer.id, peer);
        let mut list = sorted(map);
        list.truncate(MAX_CACHED_PEERS);
        if map.len() > list.len() {
            *map = list.iter().map(|p| (p.id, p.clone())).collect();
        }
        let json = serde_json::to_vec_pretty(&list).map_err(|source| PeerCacheError::Corrupt {
            path: self.path.clone(),
            source,
        })?;
        write_private_atomic(&self.path, &json).map_err(|source| PeerCacheError::Io {
            path: self.path.clone(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Identity;

    #[test]
    fn remembers_across_instances_and_bounds_size() {
        let dir = tempfile::tempdir().unwrap();
        let cache = FilePeerCache::in_dir(dir.path());
        assert!(cache.load().unwrap().is_empty());
        let ids: Vec<NodeId> = (0..MAX_CACHED_PEERS + 5)
            .map(|_| Identity::generate().node_id())
            .collect();
        for (i, id) in ids.iter().enumerate() {
            cache
                .remember(CachedPeer {
                    id: *id,
                    addr: "127.0.0.1:1000".parse().unwrap(),
                    name: format!("n{i}"),
                    last_seen_ms: i as u64,
                })
                .unwrap();
        }
        let again = FilePeerCache::in_dir(dir.path()).load().unwrap();
        assert_eq!(again.len(), MAX_CACHED_PEERS);
        assert_eq!(again[0].id, *ids.last().unwrap());
        assert!(!again.iter().any(|p| p.id == ids[0]));
    }

    #[test]
    fn corrupt_file_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(PEER_CACHE_FILE), b"{not json").unwrap();
        assert!(matches!(
            FilePeerCache::in_dir(dir.path()).load(),
            Err(PeerCacheError::Corrupt { .. })
        ));
    }
}
