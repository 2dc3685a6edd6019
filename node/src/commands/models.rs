//! `starling models pull|list`.

use std::path::Path;

use anyhow::Context;
use clap::Args;
use starling_models::source::{registry, ModelCache, Progress};

/// Arguments of `starling models pull`.
#[derive(Debug, Args)]
pub struct PullArgs {
    /// Models to fetch: registry names or sources. Default: the default chat and embedding
    /// models.
    pub models: Vec<String>,
    /// Fetch every model in the registry.
    #[arg(long, conflicts_with = "models")]
    pub all: bool,
    /// Print the resulting paths as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `starling models list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Fetches models into the cache.
pub fn pull(home: &Path, args: PullArgs) -> anyhow::Result<()> {
    let cache = ModelCache::new(home);
    let specs: Vec<String> = if args.all {
        registry::known_models()
            .iter()
            .map(|m| m.name.to_string())
            .collect()
    } else if args.models.is_empty() {
        vec![
            registry::default_chat_model().name.to_string(),
            registry::default_embedding_model().name.to_string(),
        ]
    } else {
        args.models.clone()
    };
    let progress = if args.json {
        Progress::quiet()
    } else {
        Progress::new()
    };
    let mut out = Vec::new();
    for spec in &specs {
        let source = registry::parse_spec(spec)?;
        if !args.json {
            eprintln!("pulling {spec}");
        }
        let path = cache
            .resolve(&source, &progress)
            .with_context(|| format!("cannot pull `{spec}`"))?;
        if args.json {
            out.push(serde_json::json!({ "model": spec, "path": path }));
        } else {
            println!("{spec}: {}", path.display());
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    Ok(())
}

/// Lists the registry and what is in the cache.
pub fn list(home: &Path, args: ListArgs) -> anyhow::Result<()> {
    let cache = ModelCache::new(home);
    let cached = cache.list_cached()?;
    let known: Vec<_> = registry::known_models()
        .iter()
        .map(|m| {
            let path = cache.cached(&m.source());
            serde_json::json!({
                "name": m.name,
                "kind": format!("{:?}", m.kind).to_lowercase(),
                "description": m.description,
                "cached": path.is_some(),
                "path": path,
            })
        })
        .collect();
    if args.json {
        let cached_json: Vec<_> = cached
            .iter()
            .map(|c| {
                serde_json::json!({
                    "source": c.source.to_string(),
                    "path": c.path,
                    "size_bytes": c.size,
                    "verified": format!("{:?}", c.verification),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({ "registry": known, "cache": cached_json })
            )?
        );
        return Ok(());
    }
    println!("{:<24} {:<10} {:<7} DESCRIPTION", "NAME", "KIND", "CACHED");
    for m in registry::known_models() {
        let here = cache.cached(&m.source()).is_some();
        println!(
            "{:<24} {:<10} {:<7} {}",
            m.name,
            format!("{:?}", m.kind).to_lowercase(),
            if here { "yes" } else { "no" },
            m.description
        );
    }
    if !cached.is_empty() {
        println!("\nIn the cache ({}):", cache.models_dir().display());
        for c in &cached {
            println!(
                "  {:>8.1} MiB  {:?}  {}",
                c.size as f64 / (1024.0 * 1024.0),
                c.verification,
                c.path.display()
            );
        }
    }
    println!("\nAny GGUF file also works: starling generate --model ./path/to/model.gguf \"...\"");
    Ok(())
}
