//! `vigil check URL`: probe a health endpoint once.

use clap::Args;
use std::process::ExitCode;

/// Arguments of `vigil check`.
#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The health endpoint, e.g. http://127.0.0.1:8080/health
    pub url: String,
}

/// Runs `vigil check`.
pub fn run(_args: CheckArgs) -> ExitCode {
    ExitCode::from(3)
}
