//! Command-line entry point of the example service (`vigil example-service`).

use std::process::ExitCode;

/// Arguments of the example service.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs the example service. Not built yet: says so and exits 2.
pub fn run(_args: Args) -> ExitCode {
    eprintln!("example service: not built yet");
    ExitCode::from(2)
}
