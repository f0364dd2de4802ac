//! Command-line entry point of `vigil sim`.
//!
//! Exit codes: 0 every expectation held; 1 an expectation broke; 2 usage error (bad
//! arguments, no such file); 78 a scenario file is invalid (the message names file, line
//! and key).

use crate::scenario::Scenario;
use crate::summary::render_text;
use crate::{Checked, check};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Exit code when an expectation broke.
const EXIT_BROKEN: u8 = 1;
/// Exit code on usage errors (sysexits' EX_USAGE, as every `vigil` subcommand: 2 is
/// `vigil check`'s "fail").
const EXIT_USAGE: u8 = 64;
/// Exit code for an invalid scenario (EX_CONFIG).
const EXIT_CONFIG: u8 = 78;

const EXAMPLES: &str = "\
Examples:
  vigil sim run scenarios/shared-dependency-outage.toml
      Run one scenario with vigil's policies; print the summary and its expectations.
  vigil sim run scenarios/shared-dependency-outage.toml --compare naive --report out.html
      Run it twice, with vigil's policies and with naive ones (deep checks on the load
      balancer, no fail-open, no guard, no watchdog, shared health threads, ungated
      queue workers and rollouts), side by side; write an HTML report with both.
  vigil sim check scenarios/
      Run every scenario (and its naive twin when it has [expect.naive]); exit 1 naming
      each broken expectation. CI runs this: the scenarios are regression tests of the
      policies.
  vigil sim --compare naive scenarios/zone-loss.toml    (same as `run ... --compare naive`)
  vigil sim --check scenarios/                          (same as `check scenarios/`)

Scenario files are TOML: [fleet], [clients], [[dependencies]], [queue], [lb] (with
[lb.pool], vigil lb's own pool policy), [controller] (with [controller.guard], vigil
controller's own guard policy), [[faults]] (the timeline) and [expect] /
[expect.naive]. See docs/sim.md.

Same scenario and seed, same output, byte for byte.
Exit: 0 expectations held, 1 an expectation broke, 2 usage, 78 invalid scenario file.";

/// Arguments of `vigil sim`.
#[derive(clap::Args, Debug)]
#[command(
    args_conflicts_with_subcommands = true,
    after_long_help = EXAMPLES,
    about = "Simulate a fleet through failures with vigil's real policies, deterministically",
    long_about = "Simulate a fleet (servers, dependencies, a load balancer, a controller, \
        clients, a queue) through a timeline of faults, driving the very same vigil-core \
        policies as `vigil lb` and `vigil controller`, on a virtual clock with a seeded \
        random stream. Shows whether fail-open triggers when it should, and what naive \
        policies would have done instead."
)]
pub struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Check every scenario under DIR (same as `vigil sim check DIR`).
    #[arg(long, value_name = "DIR")]
    check: Option<PathBuf>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Run one scenario and print its summary (and check its expectations).
    Run(RunArgs),
    /// Run every scenario in the given files or directories and check its expectations;
    /// exit 1 naming each broken one.
    Check(CheckArgs),
}

/// What to compare against.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Compare {
    /// Deep checks on the load balancer, no fail-open, no guard, no watchdog.
    Naive,
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// The scenario file (TOML).
    #[arg(value_name = "SCENARIO")]
    scenario: Option<PathBuf>,
    /// Seed of the random stream (default: the scenario's `seed`, else 1).
    #[arg(long)]
    seed: Option<u64>,
    /// Also run with naive policies and show both side by side.
    #[arg(long, value_enum)]
    compare: Option<Compare>,
    /// Write a self-contained HTML report here.
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// Print the notable events (state changes with their reasons) after the summary.
    #[arg(long)]
    events: bool,
    /// Print wall time and simulated events per second on stderr (not deterministic, so
    /// never on stdout).
    #[arg(long)]
    timing: bool,
}

#[derive(clap::Args, Debug)]
struct CheckArgs {
    /// Scenario files or directories (every `*.toml` in them). Defaults to `scenarios`.
    #[arg(value_name = "PATH")]
    paths: Vec<PathBuf>,
    /// Seed for every scenario (default: each scenario's own).
    #[arg(long)]
    seed: Option<u64>,
}

/// Runs `vigil sim`.
pub fn run(args: Args) -> ExitCode {
    match (args.command, args.check) {
        (Some(Command::Run(r)), _) => run_one(r),
        (Some(Command::Check(c)), _) => check_all(c),
        (None, Some(dir)) => check_all(CheckArgs {
            paths: vec![dir],
            seed: args.run.seed,
        }),
        (None, None) => {
            if args.run.scenario.is_none() {
                eprintln!(
                    "vigil sim: what to simulate? `vigil sim run SCENARIO`, `vigil sim check DIR` (see --help)"
                );
                return ExitCode::from(EXIT_USAGE);
            }
            run_one(args.run)
        }
    }
}

fn load(path: &Path) -> Result<Scenario, ExitCode> {
    Scenario::load(path).map_err(|e| {
        eprintln!("vigil sim: {e}");
        ExitCode::from(if e.kind == vigil_config::ErrorKind::Read {
            EXIT_USAGE
        } else {
            EXIT_CONFIG
        })
    })
}

struct Progress(Option<indicatif::ProgressBar>);

impl Progress {
    fn new(label: &str) -> Self {
        if !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let bar = indicatif::ProgressBar::new(1000);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{prefix} [{bar:40}] {percent}% {elapsed}")
                .expect("static template")
                .progress_chars("=> "),
        );
        bar.set_prefix(label.to_string());
        Progress(Some(bar))
    }

    fn update(&self, f: f64) {
        if let Some(b) = &self.0 {
            b.set_position((f * 1000.0) as u64);
        }
    }

    fn done(self) {
        if let Some(b) = self.0 {
            b.finish_and_clear();
        }
    }
}

fn run_one(args: RunArgs) -> ExitCode {
    let Some(path) = args.scenario else {
        eprintln!("vigil sim run: a SCENARIO file is required (see --help)");
        return ExitCode::from(EXIT_USAGE);
    };
    let scenario = match load(&path) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let seed = args.seed.unwrap_or(scenario.config.seed);
    let progress = Progress::new(&scenario.config.name);
    let (checked, wall) = wall_clock(|| {
        check(
            &scenario,
            seed,
            args.compare == Some(Compare::Naive),
            &mut |f| progress.update(f),
        )
    });
    progress.done();
    print_checked(&checked, args.events);
    if args.timing {
        let events =
            checked.vigil.summary.events + checked.naive.as_ref().map_or(0, |n| n.summary.events);
        eprintln!(
            "wall time {:.3}s, {} events, {:.0} events/s",
            wall.as_secs_f64(),
            events,
            events as f64 / wall.as_secs_f64().max(1e-9)
        );
    }
    if let Some(out) = args.report {
        let html = crate::report::render(&scenario, &checked);
        if let Err(e) = std::fs::write(&out, html) {
            eprintln!("vigil sim: cannot write report {}: {e}", out.display());
            return ExitCode::from(EXIT_USAGE);
        }
        eprintln!("report written to {}", out.display());
    }
    if checked.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_BROKEN)
    }
}

fn print_checked(checked: &Checked, events: bool) {
    let mut runs = vec![&checked.vigil.summary];
    if let Some(n) = &checked.naive {
        runs.push(&n.summary);
    }
    print!("{}", render_text(&runs, &checked.verdicts));
    if events {
        for (name, o) in std::iter::once(("vigil", &checked.vigil))
            .chain(checked.naive.as_ref().map(|n| ("naive", n)))
        {
            println!("events ({name}):");
            for (t, line) in &o.log {
                println!("  {:>10.3}s  {line}", t.as_secs_f64());
            }
        }
    }
}

/// Every `*.toml` under the paths, sorted, directories expanded one level.
fn scenario_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let entries = std::fs::read_dir(p).map_err(|e| format!("{}: {e}", p.display()))?;
            let mut found: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "toml"))
                .collect();
            found.sort();
            files.extend(found);
        } else if p.exists() {
            files.push(p.clone());
        } else {
            return Err(format!("{}: no such file or directory", p.display()));
        }
    }
    Ok(files)
}

fn check_all(args: CheckArgs) -> ExitCode {
    let paths = if args.paths.is_empty() {
        vec![PathBuf::from("scenarios")]
    } else {
        args.paths
    };
    let files = match scenario_files(&paths) {
        Ok(f) if f.is_empty() => {
            eprintln!("vigil sim check: no *.toml scenario under {paths:?}");
            return ExitCode::from(EXIT_USAGE);
        }
        Ok(f) => f,
        Err(e) => {
            eprintln!("vigil sim check: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let mut broken = Vec::new();
    let mut invalid = false;
    for file in &files {
        let scenario = match Scenario::load(file) {
            Ok(s) => s,
            Err(e) => {
                println!("INVALID {}", file.display());
                eprintln!("vigil sim: {e}");
                invalid = true;
                continue;
            }
        };
        let seed = args.seed.unwrap_or(scenario.config.seed);
        let progress = Progress::new(&scenario.config.name);
        let checked = check(&scenario, seed, false, &mut |f| progress.update(f));
        progress.done();
        let n = checked.verdicts.len();
        let failed: Vec<_> = checked.verdicts.iter().filter(|v| !v.ok).collect();
        if failed.is_empty() {
            // The headline figure: client availability, or message failures for a
            // queue-only scenario.
            let headline = |s: &crate::Summary| {
                if s.requests == 0 && s.has_queue {
                    format!(
                        "message failures {:.3}%",
                        s.metric("message_failure_rate").unwrap_or(0.0) * 100.0
                    )
                } else {
                    format!("availability {:.3}%", s.availability * 100.0)
                }
            };
            println!(
                "ok      {} ({n} expectations, {}{})",
                file.display(),
                headline(&checked.vigil.summary),
                checked
                    .naive
                    .as_ref()
                    .map(|o| format!(", naive {}", headline(&o.summary)))
                    .unwrap_or_default()
            );
        } else {
            println!("FAIL    {}", file.display());
            for v in failed {
                println!(
                    "        {} expectation broken: {} (measured {})",
                    v.policies, v.expectation, v.measured
                );
                broken.push(format!(
                    "{}: {} {}",
                    file.display(),
                    v.policies,
                    v.expectation
                ));
            }
        }
    }
    if invalid {
        return ExitCode::from(EXIT_CONFIG);
    }
    if broken.is_empty() {
        println!("{} scenarios, every expectation held", files.len());
        ExitCode::SUCCESS
    } else {
        println!("{} expectations broken:", broken.len());
        for b in &broken {
            println!("  {b}");
        }
        ExitCode::from(EXIT_BROKEN)
    }
}

/// Runs `f` and says how long it took on the wall clock, for `--timing`: the one place
/// the simulator reads a clock (clippy.toml bans it elsewhere), and nothing of it
/// reaches the run.
#[allow(clippy::disallowed_types, clippy::disallowed_methods)]
fn wall_clock<T>(f: impl FnOnce() -> T) -> (T, std::time::Duration) {
    let started = std::time::Instant::now();
    let r = f();
    (r, started.elapsed())
}
