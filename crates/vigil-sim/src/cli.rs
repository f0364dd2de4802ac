//! Command-line entry point of `vigil sim`.

use std::process::ExitCode;

/// Arguments of `vigil sim`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `vigil sim`. Not built yet: says so and exits 2.
pub fn run(_args: Args) -> ExitCode {
    eprintln!("vigil sim: not built yet");
    ExitCode::from(2)
}
