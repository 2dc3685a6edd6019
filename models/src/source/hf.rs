//! `hf:` sources, fetched through the `hf-hub` crate and kept in its cache.

use std::path::{Path, PathBuf};

use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, Repo, RepoType};

use super::error::SourceError;
use super::progress::Progress;
use super::HfSource;

/// Where and how Hugging Face files are fetched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HfOptions {
    /// The hub cache directory (the `hub` folder: `models--OWNER--REPO/...`).
    pub cache_dir: Option<PathBuf>,
    /// Hub URL; `None` means hf-hub's default (`https://huggingface.co`).
    pub endpoint: Option<String>,
    /// Never touch the network; only the cache is consulted.
    pub offline: bool,
    /// Access token for gated repositories.
    pub token: Option<String>,
}

impl Default for HfOptions {
    fn default() -> Self {
        HfOptions::from_env()
    }
}

impl HfOptions {
    /// Reads `HF_HUB_CACHE`, `HF_HOME`, `HF_ENDPOINT`, `HF_HUB_OFFLINE` and
    /// `HF_TOKEN` from the process environment.
    pub fn from_env() -> Self {
        HfOptions::from_vars(|key| std::env::var(key).ok())
    }

    /// Like [`HfOptions::from_env`], reading variables through `var`.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let non_empty = |key: &str| var(key).filter(|v| !v.trim().is_empty());
        let cache_dir = non_empty("HF_HUB_CACHE")
            .map(PathBuf::from)
            .or_else(|| non_empty("HF_HOME").map(|home| PathBuf::from(home).join("hub")))
            .or_else(|| {
                directories::BaseDirs::new()
                    .map(|d| d.home_dir().join(".cache").join("huggingface").join("hub"))
            });
        let offline = non_empty("HF_HUB_OFFLINE")
            .map(|v| {
                matches!(
                    v.trim().to_ascii_lowercase().as_str(),
                    "1" | "true" | "yes" | "on"
                )
            })
            .unwrap_or(false);
        HfOptions {
            cache_dir,
            endpoint: non_empty("HF_ENDPOINT"),
            offline,
            token: non_empty("HF_TOKEN"),
        }
    }

    fn cache_dir(&self) -> Result<&Path, SourceError> {
        self.cache_dir.as_deref().ok_or(SourceError::NoDirectory {
            what: "the Hugging Face cache directory (no home directory)",
            hint: "HF_HOME",
        })
    }

    /// The cached copy of `source`, if present; never uses the network.
    pub(crate) fn cached(&self, source: &HfSource) -> Result<Option<PathBuf>, SourceError> {
        let cache = Cache::new(self.cache_dir()?.to_path_buf());
        let revision = source.revision_or_default();
        let repo = cache.repo(repo_of(source));
        if let Some(path) = repo.get(&source.file) {
            return Ok(Some(path));
        }
        // A commit hash has no `refs/` entry: look in its snapshot directly.
        let snapshot = self
            .cache_dir()?
            .join(format!("models--{}--{}", source.owner, source.repo))
            .join("snapshots")
            .join(revision)
            .join(&source.file);
        Ok(snapshot.exists().then_some(snapshot))
    }

    /// The local path of `source`, downloading it unless offline.
    pub(crate) fn fetch(
        &self,
        source: &HfSource,
        progress: &Progress,
    ) -> Result<PathBuf, SourceError> {
        if let Some(path) = self.cached(source)? {
            tracing::debug!(path = %path.display(), "hf file found in cache");
            return Ok(path);
        }
        let cache_dir = self.cache_dir()?.to_path_buf();
        if self.offline {
            return Err(SourceError::HfOfflineMiss {
                repo: source.repo_id(),
                file: source.file.clone(),
                revision: source.revision_or_default().to_string(),
                cache_dir,
            });
        }
        let mut builder =
            ApiBuilder::from_cache(Cache::new(cache_dir)).with_progress(progress.is_visible());
        if let Some(endpoint) = &self.endpoint {
            builder = builder.with_endpoint(endpoint.clone());
        }
        if self.token.is_some() {
            builder = builder.with_token(self.token.clone());
        }
        let wrap = |e: hf_hub::api::sync::ApiError| SourceError::HfDownload {
            repo: source.repo_id(),
            file: source.file.clone(),
            source: Box::new(e),
        };
        let api = builder.build().map_err(wrap)?;
        tracing::info!(repo = %source.repo_id(), file = %source.file, "downloading from the Hugging Face hub");
        api.repo(repo_of(source)).get(&source.file).map_err(wrap)
    }
}

fn repo_of(source: &HfSource) -> Repo {
    Repo::with_revision(
        source.repo_id(),
        RepoType::Model,
        source.revision_or_default().to_string(),
    )
}
