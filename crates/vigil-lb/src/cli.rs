//! Command-line entry point of `vigil lb`: `vigil lb -c lb.toml` runs the balancer,
//! `vigil lb check-config -c lb.toml` validates a file like `nginx -t`.
//!
//! Exit codes: 0 success (and after a SIGTERM drain), 1 runtime failure (cannot listen),
//! 2 usage error, 78 bad configuration (EX_CONFIG).

use crate::config;
use std::path::PathBuf;
use std::process::ExitCode;

/// Exit code of a bad configuration (sysexits' EX_CONFIG).
pub const EXIT_BAD_CONFIG: u8 = 78;
/// Exit code of a usage error.
pub const EXIT_USAGE: u8 = 2;

/// Arguments of `vigil lb`.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Configuration file (TOML; see examples/lb.toml).
    #[arg(short = 'c', long = "config", env = "VIGIL_LB_CONFIG")]
    config: Option<PathBuf>,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Validate a configuration file and exit: 0 when valid, 78 (with the file, line and
    /// key of the problem) when not.
    CheckConfig {
        /// Configuration file.
        #[arg(short = 'c', long = "config")]
        config: PathBuf,
    },
}

/// Runs `vigil lb`.
pub fn run(args: Args) -> ExitCode {
    match args.command {
        Some(Command::CheckConfig { config }) => match config::load(&config) {
            Ok(c) => {
                let targets: usize = c.pools.values().map(|p| p.targets.len()).sum();
                println!(
                    "{}: ok ({} pools, {} targets, {} routes)",
                    config.display(),
                    c.pools.len(),
                    targets,
                    c.routes.len()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(EXIT_BAD_CONFIG)
            }
        },
        None => {
            let Some(path) = args.config else {
                eprintln!("vigil lb: missing -c/--config <FILE> (see `vigil lb --help`)");
                return ExitCode::from(EXIT_USAGE);
            };
            let config = match config::load(&path) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::from(EXIT_BAD_CONFIG);
                }
            };
            let code = crate::server::run(config, path);
            ExitCode::from(code)
        }
    }
}
