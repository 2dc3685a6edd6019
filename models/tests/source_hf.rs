//! `hf:` sources in offline mode, against a Hugging Face cache laid out the
//! way hf-hub (and the Python `huggingface_hub`) write it.

#![cfg(unix)]

use std::fs;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};
use starling_models::source::{HfOptions, ModelCache, ModelSource, Progress, SourceError};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// `hub/models--OWNER--REPO/{refs/main, blobs/<etag>, snapshots/<commit>/<file> -> blob}`.
fn populate(hub: &Path, owner: &str, repo: &str, file: &str, data: &[u8]) -> PathBuf {
    let root = hub.join(format!("models--{owner}--{repo}"));
    fs::create_dir_all(root.join("refs")).expect("refs");
    fs::write(root.join("refs/main"), COMMIT).expect("ref");
    fs::create_dir_all(root.join("blobs")).expect("blobs");
    let blob = root.join("blobs").join(hex::encode(Sha256::digest(data)));
    fs::write(&blob, data).expect("blob");
    let pointer = root.join("snapshots").join(COMMIT).join(file);
    fs::create_dir_all(pointer.parent().expect("parent")).expect("snapshot");
    std::os::unix::fs::symlink(&blob, &pointer).expect("symlink");
    pointer
}

fn offline(hub: &Path) -> HfOptions {
    HfOptions::from_vars(|key| match key {
        "HF_HOME" => Some(hub.parent().expect("home").display().to_string()),
        "HF_HUB_OFFLINE" => Some("1".into()),
        // Unroutable: any network attempt would fail, not reach the hub.
        "HF_ENDPOINT" => Some("http://127.0.0.1:9".into()),
        _ => None,
    })
}

fn source(text: &str) -> ModelSource {
    text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
}

#[test]
fn environment_is_read_like_hf_hub() {
    let opts = offline(Path::new("/tmp/hfhome/hub"));
    assert_eq!(
        opts.cache_dir.as_deref(),
        Some(Path::new("/tmp/hfhome/hub"))
    );
    assert!(opts.offline);
    assert_eq!(opts.endpoint.as_deref(), Some("http://127.0.0.1:9"));
    let opts = HfOptions::from_vars(|key| match key {
        "HF_HUB_CACHE" => Some("/c".into()),
        "HF_HOME" => Some("/h".into()),
        "HF_HUB_OFFLINE" => Some("0".into()),
        _ => None,
    });
    assert_eq!(opts.cache_dir.as_deref(), Some(Path::new("/c")));
    assert!(!opts.offline);
}

#[test]
fn offline_hit_resolves_from_the_hf_cache_without_network() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let hub = tmp.path().join("hf/hub");
    let data = b"GGUF tiny".as_slice();
    let pointer = populate(&hub, "someone", "tiny-GGUF", "q/tiny.gguf", data);
    let cache = ModelCache::new(tmp.path().join("data")).with_hf_options(offline(&hub));

    let src = source("hf:someone/tiny-GGUF/q/tiny.gguf");
    assert_eq!(
        cache
            .resolve(&src, &Progress::quiet())
            .expect("offline hit"),
        pointer
    );

    // By commit hash (no refs entry needed), and pinned.
    let digest = hex::encode(Sha256::digest(data));
    let pinned = source(&format!(
        "hf:someone/tiny-GGUF/q/tiny.gguf@{COMMIT}?sha256={digest}"
    ));
    assert_eq!(
        cache
            .resolve(&pinned, &Progress::quiet())
            .expect("by commit"),
        pointer
    );

    let listed = cache.list_cached().expect("list");
    assert!(listed.iter().any(|m| m.path == pointer), "{listed:?}");

    let wrong = source(&format!(
        "hf:someone/tiny-GGUF/q/tiny.gguf?sha256={}",
        hex::encode(Sha256::digest(b"x"))
    ));
    let err = cache
        .resolve(&wrong, &Progress::quiet())
        .expect_err("mismatch");
    assert!(matches!(err, SourceError::ShaMismatch { .. }), "{err}");
    assert!(pointer.exists(), "the hf cache is not modified");
}

#[test]
fn offline_miss_explains_how_to_fix_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let hub = tmp.path().join("hf/hub");
    populate(&hub, "someone", "tiny-GGUF", "tiny.gguf", b"x");
    let cache = ModelCache::new(tmp.path().join("data")).with_hf_options(offline(&hub));
    for text in [
        "hf:someone/tiny-GGUF/other.gguf",
        "hf:someone/absent/tiny.gguf",
        "hf:someone/tiny-GGUF/tiny.gguf@v2",
    ] {
        let err = cache
            .resolve(&source(text), &Progress::quiet())
            .expect_err("miss");
        let message = err.to_string();
        assert!(
            matches!(err, SourceError::HfOfflineMiss { .. }),
            "{message}"
        );
        assert!(message.contains("HF_HUB_OFFLINE"), "{message}");
        assert!(message.contains(&hub.display().to_string()), "{message}");
        assert!(message.contains("local path"), "{message}");
    }
}
