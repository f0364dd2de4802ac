//! Command-line entry point of `vigil lb`.

use std::process::ExitCode;

/// Arguments of `vigil lb`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `vigil lb`. Not built yet: says so and exits 2.
pub fn run(_args: Args) -> ExitCode {
    eprintln!("vigil lb: not built yet");
    ExitCode::from(2)
}
