//! Progress reporting for long fetches, extractions and hashes.

use std::io::IsTerminal as _;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How fetches report progress: bars on standard error when it is a terminal,
/// nothing when quiet. Child tools (pip, hf-hub) are told to be quiet too.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    quiet: bool,
}

impl Default for Progress {
    fn default() -> Self {
        Progress::new()
    }
}

impl Progress {
    /// Shows progress when standard error is a terminal.
    pub fn new() -> Self {
        Progress { quiet: false }
    }

    /// Shows nothing (for `--quiet`, `--json`, servers and tests).
    pub fn quiet() -> Self {
        Progress { quiet: true }
    }

    /// Whether output is suppressed.
    pub fn is_quiet(&self) -> bool {
        self.quiet
    }

    /// Whether bars would actually be drawn (not quiet, and stderr is a terminal).
    pub fn is_visible(&self) -> bool {
        !self.quiet && std::io::stderr().is_terminal()
    }

    /// A byte-counting bar of `total` bytes labelled `message` (hidden when not visible).
    pub(crate) fn bytes_bar(&self, total: u64, message: &str) -> ProgressBar {
        if !self.is_visible() {
            return ProgressBar::hidden();
        }
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_message(message.to_string());
        bar
    }
}
