//! The dependency rules of ARCHITECTURE.md ("Invariants"), checked on the sources: inside
//! `starling-node`, modules depend downward only. A module's code (comments aside) may
//! name `crate::X` only for the modules below it listed here; a new upward import fails
//! this test with the file and line.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Each module of the library and the crate modules it may use (besides itself).
const RULES: &[(&str, &[&str])] = &[
    ("outside", &[]),
    ("owned", &[]),
    ("store", &["outside"]),
    ("search", &[]),
    ("llm", &["outside"]),
    ("logging", &[]),
    ("config", &[]),
    ("memory", &["llm", "owned", "search", "store"]),
    (
        "agent",
        &["config", "llm", "memory", "owned", "search", "store"],
    ),
    (
        "api",
        &[
            "agent", "config", "llm", "memory", "owned", "search", "store",
        ],
    ),
    ("loading", &["api", "config"]),
    (
        "daemon",
        &[
            "agent", "api", "config", "llm", "loading", "memory", "owned", "search", "store",
        ],
    ),
];

/// The files of module `name`: `src/name.rs` and everything under `src/name/`.
fn files_of(src: &Path, name: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let file = src.join(format!("{name}.rs"));
    if file.exists() {
        out.push(file);
    }
    let mut dirs = vec![src.join(name)];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out
}

/// `crate::X` names used by the code of `text` (line comments and doc comments aside),
/// with their line numbers.
fn crate_uses(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            // `starling_crate::` or `some_crate::` are other identifiers.
            let before = rest[..at].chars().last();
            if !name.is_empty() && !before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                out.push((i + 1, name));
            }
            rest = after;
        }
    }
    out
}

#[test]
fn modules_depend_downward_only() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut broken = Vec::new();
    for (module, allowed) in RULES {
        let files = files_of(&src, module);
        assert!(!files.is_empty(), "module `{module}` has no files");
        let allowed: BTreeSet<&str> = allowed.iter().copied().chain([*module]).collect();
        for file in files {
            let text = std::fs::read_to_string(&file).expect("source file");
            for (line, used) in crate_uses(&text) {
                if !allowed.contains(used.as_str()) {
                    broken.push(format!(
                        "{}:{line}: `{module}` uses `crate::{used}`",
                        file.strip_prefix(&src).unwrap_or(&file).display()
                    ));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "upward imports (see ARCHITECTURE.md, Invariants):\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_checker_sees_imports_and_skips_comments() {
    let text = "use crate::api::AppState;\n/// see [`crate::daemon`]\nlet x = crate::loading::f(); // crate::cli\nuse starling_crate::x;\n";
    assert_eq!(
        crate_uses(text),
        vec![(1, "api".to_owned()), (3, "loading".to_owned())]
    );
}
