//! `starling eval …`: the benchmarks live in their own executable, `starling-eval` (crate
//! `benches/eval`), so that their code and word lists do not ship in the node. This runs it
//! with the same arguments, as `git` and `cargo` run their external subcommands.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

/// The executable that holds the evaluations.
pub const EVAL_EXE: &str = "starling-eval";

/// Arguments of `starling eval`: everything after `eval`, passed on unchanged.
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// The evaluation and its arguments (`starling eval --help` lists them).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<OsString>,
}

/// Where `starling-eval` is: beside the running `starling` (as `cargo build` and `cargo
/// install` put them), else on `PATH`.
pub fn find_eval_exe() -> Option<PathBuf> {
    let name = format!("{EVAL_EXE}{}", std::env::consts::EXE_SUFFIX);
    let beside = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(&name)));
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(&name));
    beside.into_iter().chain(on_path).find(|p| p.is_file())
}

/// Runs `starling-eval` with `args` (and the data directory); when it fails, `starling`
/// exits with its exit code.
pub fn run(home: &Path, verbose: u8, args: EvalArgs) -> anyhow::Result<()> {
    let exe = find_eval_exe().with_context(|| {
        format!(
            "`starling eval` needs the `{EVAL_EXE}` executable beside `starling` or on PATH; \
             build it with `cargo build --release -p starling-eval` (or install it with \
             `cargo install --path benches/eval`)"
        )
    })?;
    let mut command = std::process::Command::new(&exe);
    command.arg("--home").arg(home);
    if verbose > 0 {
        command.arg(format!("-{}", "v".repeat(usize::from(verbose))));
    }
    let status = command
        .args(&args.args)
        .status()
        .with_context(|| format!("cannot run {}", exe.display()))?;
    if status.success() {
        return Ok(());
    }
    // It has printed its own error: leave with its exit code, adding nothing.
    match status.code() {
        Some(code) => std::process::exit(code),
        None => anyhow::bail!("{EVAL_EXE} was stopped ({status})"),
    }
}
