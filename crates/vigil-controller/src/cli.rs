//! Command-line entry point of `vigil controller`.

use std::process::ExitCode;

/// Arguments of `vigil controller`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `vigil controller`. Not built yet: says so and exits 2.
pub fn run(_args: Args) -> ExitCode {
    eprintln!("vigil controller: not built yet");
    ExitCode::from(2)
}
