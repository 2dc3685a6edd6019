//! Log output: `tracing` to stderr, filtered by `RUST_LOG` (default: warnings, plus info
//! from Starling's own crates with `-v`).

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. Call once, from `main`.
pub fn init(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "warn,starling_node=info,starling_models=info,starling_discovery=info",
        _ => "info,starling_node=debug,starling_models=debug,starling_discovery=debug",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
