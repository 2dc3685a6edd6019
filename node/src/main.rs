//! The `starling` command.

use std::process::ExitCode;

use clap::Parser;

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
