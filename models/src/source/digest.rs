//! SHA-256 digests, hashing files and directories, and `.sha256` stamps that
//! remember a hash until the file's size or modification time changes.

use std::fmt;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::UNIX_EPOCH;

use sha2::{Digest as _, Sha256};

use super::error::{IoContext as _, SourceError};
use super::progress::Progress;

/// A SHA-256 digest, written as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sha256Digest(pub [u8; 32]);

/// Why a string is not a SHA-256 digest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a SHA-256 digest (expected 64 hex digits)")]
pub struct BadDigest(String);

impl FromStr for Sha256Digest {
    type Err = BadDigest;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut bytes = [0u8; 32];
        if s.len() != 64 {
            return Err(BadDigest(s.to_string()));
        }
        hex::decode_to_slice(s, &mut bytes).map_err(|_| BadDigest(s.to_string()))?;
        Ok(Sha256Digest(bytes))
    }
}

impl fmt::Display for Sha256Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for Sha256Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sha256Digest({self})")
    }
}

impl Sha256Digest {
    pub(crate) fn from_hasher(hasher: Sha256) -> Self {
        Sha256Digest(hasher.finalize().into())
    }
}

/// A writer that hashes what passes through it and ticks a progress bar.
pub(crate) struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    bar: indicatif::ProgressBar,
}

impl<W: Write> HashingWriter<W> {
    pub(crate) fn new(inner: W, bar: indicatif::ProgressBar) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            bar,
        }
    }

    pub(crate) fn finish(self) -> (W, Sha256Digest) {
        (self.inner, Sha256Digest::from_hasher(self.hasher))
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bar.inc(n as u64);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Size, file count and newest modification time of a file or directory tree:
/// cheap to read, and changes whenever the content is replaced or edited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fingerprint {
    pub size: u64,
    pub files: u64,
    pub mtime_ns: u128,
}

impl Fingerprint {
    pub(crate) fn of(path: &Path) -> io::Result<Fingerprint> {
        let meta = fs::metadata(path)?;
        if meta.is_dir() {
            let mut total = Fingerprint {
                size: 0,
                files: 0,
                mtime_ns: 0,
            };
            for (_, file) in list_files(path)? {
                let fp = Fingerprint::of(&file)?;
                total.size += fp.size;
                total.files += 1;
                total.mtime_ns = total.mtime_ns.max(fp.mtime_ns);
            }
            Ok(total)
        } else {
            let mtime_ns = meta
                .modified()?
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            Ok(Fingerprint {
                size: meta.len(),
                files: 1,
                mtime_ns,
            })
        }
    }
}

/// All regular files under `dir`, as (`/`-separated relative path, full path),
/// sorted by relative path bytes.
pub(crate) fn list_files(dir: &Path) -> io::Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    let mut stack = vec![(String::new(), dir.to_path_buf())];
    while let Some((prefix, path)) = stack.pop() {
        for entry in fs::read_dir(&path)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let rel = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            let kind = entry.file_type()?;
            if kind.is_dir() {
                stack.push((rel, entry.path()));
            } else {
                out.push((rel, entry.path()));
            }
        }
    }
    out.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    Ok(out)
}

/// The digest of a directory: SHA-256 of its `sha256sum`-style manifest.
pub(crate) fn manifest_digest<'a>(
    entries: impl IntoIterator<Item = (&'a str, &'a Sha256Digest)>,
) -> Sha256Digest {
    let mut sorted: Vec<_> = entries.into_iter().collect();
    sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut hasher = Sha256::new();
    for (rel, digest) in sorted {
        hasher.update(format!("{digest}  {rel}\n").as_bytes());
    }
    Sha256Digest::from_hasher(hasher)
}

/// Hashes a file, or a directory by its manifest, showing progress.
pub(crate) fn hash_path(path: &Path, progress: &Progress) -> Result<Sha256Digest, SourceError> {
    let fp = Fingerprint::of(path).ctx(|| format!("reading {}", path.display()))?;
    let bar = progress.bytes_bar(fp.size, &format!("verifying {}", display_name(path)));
    let result = if path.is_dir() {
        let files = list_files(path).ctx(|| format!("listing {}", path.display()))?;
        let mut digests = Vec::with_capacity(files.len());
        for (rel, full) in files {
            digests.push((rel, hash_file(&full, &bar)?));
        }
        manifest_digest(digests.iter().map(|(r, d)| (r.as_str(), d)))
    } else {
        hash_file(path, &bar)?
    };
    bar.finish_and_clear();
    Ok(result)
}

fn hash_file(path: &Path, bar: &indicatif::ProgressBar) -> Result<Sha256Digest, SourceError> {
    let mut file = File::open(path).ctx(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .ctx(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bar.inc(n as u64);
    }
    Ok(Sha256Digest::from_hasher(hasher))
}

pub(crate) fn display_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// A remembered hash of a file or directory, valid while its fingerprint holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stamp {
    pub digest: Sha256Digest,
    pub fingerprint: Fingerprint,
}

impl Stamp {
    fn render(&self) -> String {
        format!(
            "sha256={} size={} files={} mtime_ns={}\n",
            self.digest, self.fingerprint.size, self.fingerprint.files, self.fingerprint.mtime_ns
        )
    }

    fn parse(text: &str) -> Option<Stamp> {
        let mut digest = None;
        let (mut size, mut files, mut mtime_ns) = (None, None, None);
        for field in text.split_whitespace() {
            let (key, value) = field.split_once('=')?;
            match key {
                "sha256" => digest = value.parse().ok(),
                "size" => size = value.parse().ok(),
                "files" => files = value.parse().ok(),
                "mtime_ns" => mtime_ns = value.parse().ok(),
                _ => {}
            }
        }
        Some(Stamp {
            digest: digest?,
            fingerprint: Fingerprint {
                size: size?,
                files: files?,
                mtime_ns: mtime_ns?,
            },
        })
    }

    /// The stamp at `stamp_path`, if present, well-formed and still matching `target`.
    pub(crate) fn load_fresh(stamp_path: &Path, target: &Path) -> Option<Stamp> {
        let text = fs::read_to_string(stamp_path).ok()?;
        let stamp = Stamp::parse(&text)?;
        let now = Fingerprint::of(target).ok()?;
        (now == stamp.fingerprint).then_some(stamp)
    }

    /// Records `digest` for `target` at `stamp_path` (written atomically).
    pub(crate) fn store(stamp_path: &Path, target: &Path, digest: Sha256Digest) -> io::Result<()> {
        let stamp = Stamp {
            digest,
            fingerprint: Fingerprint::of(target)?,
        };
        if let Some(parent) = stamp_path.parent() {
            fs::create_dir_all(parent)?;
        }
        let dir = stamp_path.parent().unwrap_or(Path::new("."));
        let mut tmp = tempfile::Builder::new()
            .prefix(".tmp-stamp-")
            .tempfile_in(dir)?;
        tmp.write_all(stamp.render().as_bytes())?;
        tmp.persist(stamp_path).map_err(|e| e.error)?;
        Ok(())
    }
}

/// Returns the verified digest of `target`, from a fresh stamp or by hashing
/// (and then stamping) it.
pub(crate) fn digest_with_stamp(
    target: &Path,
    stamp_path: &Path,
    progress: &Progress,
) -> Result<Sha256Digest, SourceError> {
    if let Some(stamp) = Stamp::load_fresh(stamp_path, target) {
        tracing::debug!(path = %target.display(), "sha256 taken from stamp");
        return Ok(stamp.digest);
    }
    let digest = hash_path(target, progress)?;
    if let Err(error) = Stamp::store(stamp_path, target, digest) {
        tracing::warn!(path = %stamp_path.display(), %error, "could not write sha256 stamp");
    }
    Ok(digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_parses_and_prints() {
        let hex = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
        let d: Sha256Digest = hex.parse().expect("valid");
        assert_eq!(d.to_string(), hex);
        assert!("abc".parse::<Sha256Digest>().is_err());
        assert!(hex.replace('b', "g").parse::<Sha256Digest>().is_err());
    }

    #[test]
    fn stamp_round_trips_and_goes_stale() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("f");
        fs::write(&file, b"hello").expect("write");
        let stamp_path = dir.path().join("f.sha256");
        let digest = hash_path(&file, &Progress::quiet()).expect("hash");
        assert_eq!(
            digest.to_string(),
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        Stamp::store(&stamp_path, &file, digest).expect("store");
        assert_eq!(
            Stamp::load_fresh(&stamp_path, &file).map(|s| s.digest),
            Some(digest)
        );
        fs::write(&file, b"hello world").expect("rewrite");
        assert_eq!(Stamp::load_fresh(&stamp_path, &file), None);
    }

    #[test]
    fn directory_digest_is_sha256sum_manifest() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::create_dir_all(dir.path().join("sub")).expect("mkdir");
        fs::write(dir.path().join("b.txt"), b"hello").expect("write");
        fs::write(dir.path().join("sub/a.txt"), b"").expect("write");
        let got = hash_path(dir.path(), &Progress::quiet()).expect("hash");
        let manifest = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824  b.txt\n\
                        e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855  sub/a.txt\n";
        let want = Sha256Digest::from_hasher(Sha256::new().chain_update(manifest.as_bytes()));
        assert_eq!(got, want);
    }
}
