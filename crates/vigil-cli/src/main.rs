//! The `vigil` binary: thin glue that parses arguments, sets up logging and runs one
//! component. Each component's arguments and behaviour live in its own crate.
//!
//! Exit codes, the same in every subcommand: 0 success; 1 a runtime failure (a port
//! taken, a store that cannot open); 64 a usage error (sysexits' EX_USAGE: an unknown
//! flag, a missing argument; not clap's usual 2, which `vigil check` uses for "fail");
//! 78 a bad configuration (EX_CONFIG). `vigil check` adds its own: 1 warn (with
//! `--strict`), 2 fail, 3 unreachable or invalid; `vigil deploy run` too: 2 rolled back,
//! 3 rollback failed, 4 aborted, 5 refused.

use clap::{CommandFactory, Parser, Subcommand};
use std::io::Write;
use std::process::ExitCode;

/// Exit code of a usage error (sysexits' EX_USAGE), distinct from `vigil check`'s 2.
pub const EXIT_USAGE: u8 = 64;

mod alloc;
mod check;
mod demo;
mod logging;

/// vigil: health checks that find broken servers fast and never take a whole fleet down.
#[derive(Parser, Debug)]
#[command(
    name = "vigil",
    version = vigil_core::build::LONG_VERSION,
    after_help = "Start here: `vigil demo` runs a fleet, a balancer and a controller on this \
                  machine and lets you break things. Each command has its own --help."
)]
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
    /// Run the whole system on this machine: a fleet of example services, a load
    /// balancer with client traffic, and the controller; break things and watch.
    Demo(demo::DemoArgs),
    /// Run the load balancer: a reverse proxy that ejects failed targets and fails open.
    Lb(vigil_lb::cli::Args),
    /// Run the fleet controller: deep health probing, a safety guard, a store, a dashboard.
    Controller(vigil_controller::cli::Args),
    /// Roll a revision out to hosts in health-gated waves, with report-back and
    /// automatic rollback: plan, run, status, abort, approve, clear-bad, explain.
    Deploy(vigil_controller::deploy::cli::Args),
    /// Simulate a fleet through failures with the real policies, deterministically.
    Sim(vigil_sim::cli::Args),
    /// Run the example service (a vigil-instrumented read service); the demo starts a
    /// fleet of these.
    #[command(hide = true)]
    ExampleService(vigil_example::cli::Args),
    /// Run the example queue worker: consumes a RabbitMQ queue through vigil's worker
    /// gate, with fault injection (disk, black hole, dependency) over HTTP.
    #[command(hide = true)]
    ExampleWorker(vigil_example::worker::Args),
    /// Publish to the example worker's queue at a steady rate, confirmed by the broker;
    /// prints `PUBLISHED <n>` at the end.
    #[command(hide = true)]
    ExampleProducer(vigil_example::producer::Args),
    /// Print a shell completion script on stdout, e.g.
    /// `vigil completions bash > /etc/bash_completion.d/vigil`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) on stdout: `vigil man > vigil.1; man ./vigil.1`.
    Man,
}

fn main() -> ExitCode {
    die_with_parent();
    let cli = match Cli::try_parse_from(help_without_help_flags(std::env::args_os())) {
        Ok(cli) => cli,
        Err(e) => {
            let code = match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => 0,
                _ => EXIT_USAGE,
            };
            // Help piped into `head` may find stdout closed: nothing to report then.
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    logging::init(cli.log_format);
    alloc::return_freed_memory();
    match cli.command {
        Command::Check(args) => check::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Lb(args) => vigil_lb::cli::run(args),
        Command::Controller(args) => vigil_controller::cli::run(args),
        Command::Deploy(args) => vigil_controller::deploy::cli::run(args),
        Command::Sim(args) => vigil_sim::cli::run(args),
        Command::ExampleService(args) => vigil_example::cli::run(args),
        Command::ExampleWorker(args) => vigil_example::worker::run(args),
        Command::ExampleProducer(args) => vigil_example::producer::run(args),
        Command::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "vigil", &mut out);
            print_all(&out)
        }
        Command::Man => {
            let mut out = Vec::new();
            match clap_mangen::Man::new(Cli::command()).render(&mut out) {
                Ok(()) => print_all(&out),
                Err(e) => {
                    eprintln!("vigil man: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// `vigil help --help` (or `vigil help lb -h`) asks for help about help: clap reads the
/// flag as a subcommand named `--help` and fails with a usage error (exit 64). Every
/// `-h`/`--help` after a `help` subcommand is dropped, so that it prints the help asked
/// for and exits 0. Other arguments pass unchanged.
fn help_without_help_flags(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    let mut out = Vec::new();
    let mut after_help = false;
    let mut first_positional = true;
    for (i, a) in args.into_iter().enumerate() {
        let s = a.to_string_lossy();
        if after_help && (s == "--help" || s == "-h") {
            continue;
        }
        if i > 0 && first_positional && !s.starts_with('-') {
            // The first word that is no flag (nor `--log-format`'s value) is the command.
            if out
                .last()
                .is_none_or(|p: &std::ffi::OsString| p != "--log-format")
            {
                first_positional = false;
                after_help = s == "help";
            }
        }
        out.push(a);
    }
    out
}

/// Writes generated text to stdout; a closed pipe (`| head`) is not an error.
fn print_all(bytes: &[u8]) -> ExitCode {
    match std::io::stdout().lock().write_all(bytes) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vigil: cannot write to stdout: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A process started by `vigil demo` (which sets `VIGIL_DIE_WITH_PARENT=1`) asks the
/// kernel for SIGTERM when its parent dies, so even a SIGKILLed demo leaves no process
/// behind.
fn die_with_parent() {
    if std::env::var_os("VIGIL_DIE_WITH_PARENT").is_some_and(|v| v == "1") {
        let parent = rustix::process::getppid();
        if let Err(e) =
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
        {
            eprintln!("vigil: cannot ask to die with the parent process: {e}");
        }
        // The parent may have died before the request took effect.
        if rustix::process::getppid() != parent {
            std::process::exit(0);
        }
    }
}
