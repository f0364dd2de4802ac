//! Command-line entry point of `vigil lb`: `vigil lb -c lb.toml` runs the balancer,
//! `vigil lb check-config -c lb.toml` validates a file like `nginx -t`.
//!
//! Floor 1, command (floors: the crate doc): imports the daemon, the checker's path
//! warnings, tls and config.
//!
//! The config path follows the rule of every vigil daemon: `-c/--config FILE`, before
//! or after the verb, else `$VIGIL_LB_CONFIG`, else `lb.toml` in the current directory
//! (`vigil controller`: `$VIGIL_CONTROLLER_CONFIG`, `fleet.toml`).
//!
//! Exit codes: 0 success (and after a SIGTERM drain), 1 runtime failure (cannot listen),
//! 64 usage error (sysexits' EX_USAGE), 78 bad configuration (EX_CONFIG).

use crate::config;
use std::path::PathBuf;
use std::process::ExitCode;

/// The config file when neither `-c` nor `$VIGIL_LB_CONFIG` names one.
pub const DEFAULT_CONFIG: &str = "lb.toml";

/// Arguments of `vigil lb`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Configuration file (TOML; see examples/lb.toml).
    #[arg(
        short = 'c',
        long = "config",
        global = true,
        default_value = DEFAULT_CONFIG,
        env = "VIGIL_LB_CONFIG"
    )]
    config: PathBuf,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Validate a configuration file and exit: 0 when valid, 78 (with the file, line and
    /// key of the problem) when not. Pools checking the default path (/readyz) have
    /// each target checked once: a 404 there is a warning on stderr.
    CheckConfig,
}

/// Runs `vigil lb`.
pub fn run(args: Args) -> ExitCode {
    match args.command {
        Some(Command::CheckConfig) => match config::check(&args.config)
            .map_err(|e| e.to_string())
            .and_then(|c| {
                crate::tls::install_crypto_provider();
                // Certificates too, as `nginx -t` reads them.
                crate::tls::load(&c, crate::daemon::config_dir(&args.config))
                    .map(|t| (c, t))
                    .map_err(|e| format!("{}: {e}", args.config.display()))
            }) {
            Ok((c, tls)) => {
                // A warning, not an error: the file is valid, the targets may change.
                for w in crate::checker::default_path_warnings(&c, &tls.pools) {
                    eprintln!("{}: warning: {w}", args.config.display());
                }
                let targets: usize = c.pools.values().map(|p| p.targets.len()).sum();
                println!(
                    "{}: ok ({} pools, {} targets, {} routes)",
                    args.config.display(),
                    c.pools.len(),
                    targets,
                    c.routes.len()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(config::EXIT_BAD_CONFIG)
            }
        },
        None => {
            let path = args.config;
            let config = match config::load(&path) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::from(config::EXIT_BAD_CONFIG);
                }
            };
            let code = crate::daemon::run(config, path);
            ExitCode::from(code)
        }
    }
}
