//! The example service as a cargo example: `cargo run --release --example service`.
//! Same arguments as `vigil example-service` (`--help`).

use clap::Parser;
use std::io::IsTerminal;
use std::process::ExitCode;

/// vigil's example service: cached reads over PostgreSQL, health on a reserved thread.
#[derive(Parser, Debug)]
#[command(name = "service", version)]
struct Cli {
    #[command(flatten)]
    args: vigil_example::cli::Args,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    vigil_example::cli::run(cli.args)
}
