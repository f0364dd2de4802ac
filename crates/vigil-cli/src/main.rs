//! The `vigil` binary: thin glue that parses arguments, sets up logging and runs one
//! component. Each component's arguments and behaviour live in its own crate.
#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod check;
mod logging;

/// vigil: health checks that find broken servers fast and never take a whole fleet down.
#[derive(Parser, Debug)]
#[command(name = "vigil", version, about, long_about = None)]
struct Cli {
    /// Log format on stderr: `text` for people, `json` for one object per line.
    /// Filtered by RUST_LOG (default `info`).
    #[arg(long, global = true, value_enum, default_value_t = logging::LogFormat::Text, env = "VIGIL_LOG_FORMAT")]
    log_format: logging::LogFormat,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Probe a health endpoint once and report (exit 0 pass, 1 warn with --strict, 2 fail,
    /// 3 unreachable or invalid).
    Check(check::CheckArgs),
    /// Run the load balancer: a reverse proxy that ejects failed targets and fails open.
    Lb(vigil_lb::cli::Args),
    /// Run the fleet controller: deep health probing, a safety guard, a store, a dashboard.
    Controller(vigil_controller::cli::Args),
    /// Simulate a fleet through failures with the real policies, deterministically.
    Sim(vigil_sim::cli::Args),
    /// Run the example service (a vigil-instrumented read service); the demo starts a
    /// fleet of these.
    #[command(hide = true)]
    ExampleService(vigil_example::cli::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    match cli.command {
        Command::Check(args) => check::run(args),
        Command::Lb(args) => vigil_lb::cli::run(args),
        Command::Controller(args) => vigil_controller::cli::run(args),
        Command::Sim(args) => vigil_sim::cli::run(args),
        Command::ExampleService(args) => vigil_example::cli::run(args),
    }
}
