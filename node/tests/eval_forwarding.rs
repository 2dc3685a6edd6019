//! `starling eval …` runs the separate `starling-eval` executable (the benchmarks do not
//! ship in the node): found beside `starling`, given the data directory and every argument
//! unchanged, its exit code kept; without it, a clear error that says how to build it.
//! The real benchmarks run through this path in CI (`.ci/run`, swarm-QA section); here a
//! small script stands in for `starling-eval` so that what it receives can be read back.

#![cfg(unix)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

/// The tests write executables and run them: one at a time, since a child forked while
/// another thread holds such a file open for writing makes its `exec` fail (`ETXTBSY`).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A copy of `starling` in `dir`, so that "beside `starling`" is `dir`.
fn starling_in(dir: &Path) -> std::path::PathBuf {
    let exe = dir.join("starling");
    std::fs::copy(env!("CARGO_BIN_EXE_starling"), &exe).expect("copy starling");
    exe
}

#[test]
fn eval_runs_starling_eval_beside_it_with_the_home_and_every_argument() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = starling_in(dir.path());
    let log = dir.path().join("args.txt");
    let script = dir.path().join("starling-eval");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do echo \"$a\" >> {}; done\nexit 3\n",
            log.display()
        ),
    )
    .expect("write script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let home = dir.path().join("home");
    let out = Command::new(&exe)
        .args(["--home"])
        .arg(&home)
        .args(["eval", "swarm-qa", "--data", "a b.jsonl", "--json", "-v"])
        .env("PATH", dir.path().join("nowhere"))
        .output()
        .expect("run starling");
    assert_eq!(out.status.code(), Some(3), "the child's exit code is kept");
    let got = std::fs::read_to_string(&log).expect("the script ran");
    let args: Vec<&str> = got.lines().collect();
    assert_eq!(
        args,
        vec![
            "--home",
            home.to_str().expect("utf-8 path"),
            "swarm-qa",
            "--data",
            "a b.jsonl",
            "--json",
            "-v"
        ]
    );
    // Nothing added to what the child printed.
    assert!(
        String::from_utf8_lossy(&out.stderr).trim().is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn without_starling_eval_the_error_says_how_to_build_it() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = starling_in(dir.path());
    let out = Command::new(&exe)
        .args(["eval", "swarm-qa", "--help"])
        .env("PATH", dir.path().join("nowhere"))
        .output()
        .expect("run starling");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("starling-eval") && err.contains("cargo build --release -p starling-eval"),
        "{err}"
    );
}
