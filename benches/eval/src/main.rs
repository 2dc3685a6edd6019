//! `starling-eval`: Starling's benchmarks. `starling eval …` runs this executable (found
//! beside `starling` or on `PATH`) with the same arguments.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// As in `starling`: a chat template's memory bound needs this allocator.
#[global_allocator]
static ALLOC: starling_models::budget::Budgeted = starling_models::budget::Budgeted;

/// Starling's evaluations: swarm-QA, team formation, memory retrieval, admission, format.
#[derive(Debug, Parser)]
#[command(name = "starling eval", version, about, long_about = None)]
struct Cli {
    /// More log output (-v: info, -vv: debug). `RUST_LOG` overrides this.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Data directory (models, identity, database). Default: $STARLING_HOME or the platform
    /// data directory (e.g. ~/.local/share/starling).
    #[arg(long, global = true, env = "STARLING_HOME")]
    home: Option<PathBuf>,
    /// The evaluation to run.
    #[command(subcommand)]
    command: starling_eval::cli::EvalCommand,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    starling_node::logging::init(cli.verbose);
    let run = || -> anyhow::Result<()> {
        let home = starling_node::commands::home_dir(cli.home.as_deref())?;
        starling_eval::cli::run(&home, cli.command)
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
