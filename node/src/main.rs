//! The `starling` command.

use std::process::ExitCode;

use clap::Parser;

/// Counts what a chat-template render allocates, so a crafted template in a model file is
/// an error at its memory bound instead of an out-of-memory abort
/// (`starling_models::budget`).
#[global_allocator]
static ALLOC: starling_models::budget::Budgeted = starling_models::budget::Budgeted;

fn main() -> ExitCode {
    let cli = starling_node::cli::Cli::parse();
    starling_node::logging::init(cli.verbose);
    match starling_node::cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
