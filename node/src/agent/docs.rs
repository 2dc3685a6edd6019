//! A node's local document folder, searchable passage by passage.
//!
//! [`DocIndex`] walks a folder (recursively, in name order) for text files (`.txt`, `.md`,
//! `.markdown`), splits each into passages and indexes them with the node's BM25
//! ([`crate::search::Bm25Index`]). Files that are too large, not UTF-8, hidden, or of another
//! kind are skipped with a debug log; the walk stops at [`DocLimits::max_files`] files and
//! [`DocLimits::max_depth`] folders deep. [`DocIndex::reload`] re-reads the folder on demand.
//!
//! # Passages
//!
//! A file is split at blank lines into paragraphs. A short paragraph (a heading, a one-line
//! note) is joined to the one after it so that it keeps its context, as long as the result
//! stays within [`DocLimits::window_words`]. A paragraph longer than the window is cut into
//! windows of `window_words` words that overlap by [`DocLimits::overlap_words`], so a fact that
//! straddles a cut is whole in at least one window.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tracing::{debug, info, warn};

use crate::search::{tokenize, Bm25Index};

/// Why a document folder cannot be indexed.
#[derive(Debug, thiserror::Error)]
pub enum DocsError {
    /// The folder (or a sub-folder listing) cannot be read.
    #[error("cannot read document folder {path}: {source}")]
    Read {
        /// The folder.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The path is not a folder.
    #[error("document folder {0} is not a directory")]
    NotADirectory(PathBuf),
}

/// Bounds on what is read and how it is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DocLimits {
    /// Files larger than this are skipped (default 1 MiB).
    pub max_file_bytes: u64,
    /// At most this many files are indexed (default 2,000).
    pub max_files: usize,
    /// Sub-folders deeper than this are not entered (default 8).
    pub max_depth: usize,
    /// Words per passage window (default 80).
    pub window_words: usize,
    /// Words shared by consecutive windows of a long paragraph (default 20).
    pub overlap_words: usize,
}

impl Default for DocLimits {
    fn default() -> Self {
        Self {
            max_file_bytes: 1 << 20,
            max_files: 2_000,
            max_depth: 8,
            window_words: 80,
            overlap_words: 20,
        }
    }
}

/// One search hit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Passage {
    /// The file, relative to the document folder.
    pub file: PathBuf,
    /// The passage text, verbatim (whitespace collapsed).
    pub text: String,
    /// BM25 score (corpus-dependent; only comparable within one search).
    pub score: f32,
    /// Share (0 to 1) of the query's distinct terms that occur in the passage: a
    /// corpus-independent measure of how well the passage matches.
    pub coverage: f32,
}

/// Extensions read as text.
const TEXT_EXTENSIONS: &[&str] = &["txt", "md", "markdown"];

/// Paragraphs with fewer words than this are joined to the next one.
const SHORT_PARAGRAPH_WORDS: usize = 12;

/// The passages of one folder and their BM25 index.
#[derive(Debug)]
pub struct DocIndex {
    root: PathBuf,
    limits: DocLimits,
    /// (file relative to root, passage text); the index key is the position here.
    passages: Vec<(PathBuf, String)>,
    index: Bm25Index,
    files: usize,
    /// Citable units (sentences, table rows) of every file, for grounded answers.
    units: std::sync::Arc<Vec<super::grounded::Unit>>,
}

impl DocIndex {
    /// Indexes `root` with the default limits.
    pub fn open(root: &Path) -> Result<Self, DocsError> {
        Self::with_limits(root, DocLimits::default())
    }

    /// Indexes `root` with `limits`.
    pub fn with_limits(root: &Path, limits: DocLimits) -> Result<Self, DocsError> {
        let mut index = Self {
            root: root.to_path_buf(),
            limits,
            passages: Vec::new(),
            index: Bm25Index::new(),
            files: 0,
            units: Default::default(),
        };
        index.reload()?;
        Ok(index)
    }

    /// Re-reads the folder, replacing the index. Returns the number of passages. On error
    /// the previous index is kept.
    pub fn reload(&mut self) -> Result<usize, DocsError> {
        let meta = std::fs::metadata(&self.root).map_err(|source| DocsError::Read {
            path: self.root.clone(),
            source,
        })?;
        if !meta.is_dir() {
            return Err(DocsError::NotADirectory(self.root.clone()));
        }
        let mut files = Vec::new();
        self.collect(&self.root.clone(), 0, &mut files)?;
        let mut passages = Vec::new();
        let mut index = Bm25Index::new();
        let mut units = Vec::new();
        for (rel, text) in &files {
            let name = rel.to_string_lossy().replace('\\', "/");
            units.extend(super::grounded::document_units(&name, text));
            for p in split_passages(text, self.limits.window_words, self.limits.overlap_words) {
                index.insert(passages.len() as u64, &p);
                passages.push((rel.clone(), p));
            }
        }
        info!(
            folder = %self.root.display(),
            files = files.len(),
            passages = passages.len(),
            "indexed documents"
        );
        self.files = files.len();
        self.passages = passages;
        self.index = index;
        self.units = std::sync::Arc::new(units);
        Ok(self.passages.len())
    }

    /// Reads the text files under `dir` into `out` (path relative to the root, text).
    fn collect(
        &self,
        dir: &Path,
        depth: usize,
        out: &mut Vec<(PathBuf, String)>,
    ) -> Result<(), DocsError> {
        let read = std::fs::read_dir(dir).map_err(|source| DocsError::Read {
            path: dir.to_path_buf(),
            source,
        })?;
        let mut entries: Vec<_> = read.filter_map(Result::ok).collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            if out.len() >= self.limits.max_files {
                warn!(
                    folder = %self.root.display(),
                    max_files = self.limits.max_files,
                    "document folder has more files than the limit; the rest are not indexed"
                );
                return Ok(());
            }
            let path = entry.path();
            if entry.file_name().to_string_lossy().starts_with('.') {
                debug!(path = %path.display(), "skipping hidden entry");
                continue;
            }
            // `metadata` follows symlinks; a dangling one is skipped.
            let Ok(meta) = std::fs::metadata(&path) else {
                debug!(path = %path.display(), "skipping unreadable entry");
                continue;
            };
            if meta.is_dir() {
                if depth + 1 > self.limits.max_depth {
                    debug!(path = %path.display(), "skipping folder beyond the depth limit");
                    continue;
                }
                // A sub-folder that cannot be listed is skipped, not fatal.
                if let Err(e) = self.collect(&path, depth + 1, out) {
                    debug!(error = %e, "skipping folder");
                }
                continue;
            }
            let ext = path
                .extension()
                .map(|e| e.to_string_lossy().to_lowercase())
                .unwrap_or_default();
            if !TEXT_EXTENSIONS.contains(&ext.as_str()) {
                debug!(path = %path.display(), "skipping file that is not .txt or .md");
                continue;
            }
            if meta.len() > self.limits.max_file_bytes {
                debug!(
                    path = %path.display(),
                    bytes = meta.len(),
                    limit = self.limits.max_file_bytes,
                    "skipping file larger than the limit"
                );
                continue;
            }
            let text = match std::fs::read(&path).map(String::from_utf8) {
                Ok(Ok(text)) => text,
                Ok(Err(_)) => {
                    debug!(path = %path.display(), "skipping file that is not UTF-8");
                    continue;
                }
                Err(e) => {
                    debug!(path = %path.display(), error = %e, "skipping unreadable file");
                    continue;
                }
            };
            let rel = path.strip_prefix(&self.root).unwrap_or(&path).to_path_buf();
            out.push((rel, text));
        }
        Ok(())
    }

    /// The best `k` passages for `query`, best first. Passages sharing no term with the
    /// query are never returned.
    pub fn search(&self, query: &str, k: usize) -> Vec<Passage> {
        let mut query_terms = tokenize(query);
        query_terms.sort();
        query_terms.dedup();
        self.index
            .search(query, k)
            .into_iter()
            .filter_map(|(key, score)| {
                let (file, text) = self.passages.get(usize::try_from(key).ok()?)?;
                let passage_terms = tokenize(text);
                let matched = query_terms
                    .iter()
                    .filter(|t| passage_terms.contains(t))
                    .count();
                let coverage = if query_terms.is_empty() {
                    0.0
                } else {
                    matched as f32 / query_terms.len() as f32
                };
                Some(Passage {
                    file: file.clone(),
                    text: text.clone(),
                    score,
                    coverage,
                })
            })
            .collect()
    }

    /// The citable units of every indexed file (see [`super::grounded::document_units`]).
    pub fn units(&self) -> std::sync::Arc<Vec<super::grounded::Unit>> {
        self.units.clone()
    }

    /// The indexed folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The limits in force.
    pub fn limits(&self) -> DocLimits {
        self.limits
    }

    /// Number of passages indexed.
    pub fn len(&self) -> usize {
        self.passages.len()
    }

    /// True when no passage is indexed.
    pub fn is_empty(&self) -> bool {
        self.passages.is_empty()
    }

    /// Number of files indexed.
    pub fn files(&self) -> usize {
        self.files
    }
}

/// Splits `text` into passages (see the module docs). Whitespace inside a passage is
/// collapsed to single spaces.
pub fn split_passages(text: &str, window_words: usize, overlap_words: usize) -> Vec<String> {
    let window = window_words.max(1);
    // The step is at least one word, so the loop always advances.
    let step = window.saturating_sub(overlap_words).max(1);
    let paragraphs: Vec<Vec<&str>> = text
        .split("\n\n")
        .flat_map(|p| p.split("\r\n\r\n"))
        .map(|p| p.split_whitespace().collect::<Vec<_>>())
        .filter(|words| !words.is_empty())
        .collect();
    let mut out = Vec::new();
    let mut pending: Vec<&str> = Vec::new();
    for words in paragraphs {
        if !pending.is_empty() && pending.len() + words.len() > window {
            push_windows(&pending, window, step, &mut out);
            pending.clear();
        }
        pending.extend_from_slice(&words);
        if pending.len() >= SHORT_PARAGRAPH_WORDS.min(window) {
            push_windows(&pending, window, step, &mut out);
            pending.clear();
        }
    }
    push_windows(&pending, window, step, &mut out);
    out
}

/// Pushes `words` as one passage, or as overlapping windows when longer than `window`.
fn push_windows(words: &[&str], window: usize, step: usize, out: &mut Vec<String>) {
    if words.is_empty() {
        return;
    }
    let mut start = 0;
    loop {
        let end = (start + window).min(words.len());
        out.push(words[start..end].join(" "));
        if end == words.len() {
            break;
        }
        start += step;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(n: usize, prefix: &str) -> String {
        (0..n)
            .map(|i| format!("{prefix}{i}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn short_paragraphs_join_the_next_and_long_ones_are_windowed() {
        let text = format!(
            "# Reactor notes\n\n{}\n\n{}\n",
            words(30, "a"),
            words(200, "b")
        );
        let p = split_passages(&text, 80, 20);
        // Heading + first paragraph, then 200 words in windows of 80 stepping by 60.
        assert_eq!(p[0].split_whitespace().count(), 33);
        assert!(p[0].starts_with("# Reactor notes a0"));
        let windows = &p[1..];
        assert_eq!(windows.len(), 3, "{windows:?}");
        assert!(windows[0].starts_with("b0 ") && windows[0].ends_with(" b79"));
        assert!(windows[1].starts_with("b60 ") && windows[1].ends_with(" b139"));
        assert!(windows[2].starts_with("b120 ") && windows[2].ends_with(" b199"));
        // Every word survives somewhere.
        for i in 0..200 {
            let w = format!("b{i}");
            assert!(windows.iter().any(|p| p.split(' ').any(|x| x == w)), "{w}");
        }
    }

    #[test]
    fn degenerate_inputs_are_fine() {
        assert!(split_passages("", 80, 20).is_empty());
        assert!(split_passages("\n\n \n\n", 80, 20).is_empty());
        assert_eq!(split_passages("one", 80, 20), vec!["one".to_string()]);
        // Overlap >= window still advances.
        let p = split_passages(&words(10, "w"), 3, 5);
        assert_eq!(p.len(), 8);
    }

    #[test]
    fn folder_is_walked_filtered_and_searched() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(
            root.join("reactor.md"),
            "# Zorblat\n\nThe Zorblat reactor's coolant is liquid argon at 87 K.\n\n\
             Maintenance happens every spring when the valves are replaced by the crew.",
        )
        .unwrap();
        std::fs::create_dir(root.join("garden")).unwrap();
        std::fs::write(
            root.join("garden/roses.txt"),
            "Roses need six hours of sun and well drained soil to bloom in early summer.",
        )
        .unwrap();
        std::fs::write(root.join("image.png"), [0u8, 159, 146, 150]).unwrap();
        std::fs::write(root.join("bad.txt"), [0xffu8, 0xfe, b'a']).unwrap();
        std::fs::write(root.join(".hidden.md"), "zorblat secret").unwrap();
        std::fs::write(root.join("big.txt"), "zorblat ".repeat(200)).unwrap();

        let limits = DocLimits {
            max_file_bytes: 1000,
            ..DocLimits::default()
        };
        let mut idx = DocIndex::with_limits(root, limits).unwrap();
        assert_eq!(idx.files(), 2);
        let hits = idx.search("What coolant does the Zorblat reactor use?", 3);
        assert!(!hits.is_empty());
        assert_eq!(hits[0].file, PathBuf::from("reactor.md"));
        assert!(hits[0].text.contains("liquid argon at 87 K"), "{hits:?}");
        assert!(hits[0].coverage >= 0.5, "{hits:?}");
        let roses = idx.search("roses sun", 3);
        assert_eq!(roses[0].file, PathBuf::from("garden/roses.txt"));
        assert_eq!(roses[0].coverage, 1.0);
        assert!(idx.search("quantum chromodynamics", 3).is_empty());

        // Reload picks up new files and drops removed ones.
        std::fs::remove_file(root.join("garden/roses.txt")).unwrap();
        std::fs::write(
            root.join("new.txt"),
            "Quantum chromodynamics describes the strong force.",
        )
        .unwrap();
        idx.reload().unwrap();
        assert!(idx.search("roses", 3).is_empty());
        assert_eq!(idx.search("chromodynamics", 3).len(), 1);

        // max_files bounds the walk.
        let one = DocIndex::with_limits(
            root,
            DocLimits {
                max_files: 1,
                ..limits
            },
        )
        .unwrap();
        assert_eq!(one.files(), 1);
    }

    #[test]
    fn missing_or_non_folder_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = DocIndex::open(&dir.path().join("nope")).unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
        let file = dir.path().join("f.txt");
        std::fs::write(&file, "x").unwrap();
        assert!(matches!(
            DocIndex::open(&file),
            Err(DocsError::NotADirectory(_))
        ));
    }
}
