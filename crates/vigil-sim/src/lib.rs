//! vigil sim: a deterministic fleet simulator driving vigil-core's policies.
//!
//! The article this project follows admits that nobody has a general proof that fail-open
//! triggers as expected under every kind of overload, partial or gray failure. `vigil
//! sim` answers with measurements: it simulates a fleet (servers, shared dependencies, a
//! load balancer, a central controller, clients that may retry, a queue) through a timeline
//! of faults, driving **the very same** vigil-core state machines the real load balancer
//! and controller run ([`vigil_core::pool::Pool`], [`vigil_core::outlier`],
//! [`vigil_core::guard::SafetyGuard`], [`vigil_core::Thresholds`]), and checks the
//! outcome against the scenario's expectations. Run against naive policies (deep checks
//! on the load balancer, no fail-open, no guard, no watchdog), the same scenario shows
//! in numbers what the article argues in words.
//!
//! - [`scenario`]: the TOML scenario format, with errors that name file, line and key.
//! - [`sim`]: the discrete-event engine and the models (see its docs for what is
//!   modelled and how honestly).
//! - [`clients`]: clients that retry, and the balancer's retries within its budget.
//! - [`latency`]: worker time as a distribution (median and p99), and late answers.
//! - [`expect`]: expectations such as `availability >= 0.999`.
//! - [`summary`]: the numbers of a run, and the terminal table.
//! - [`report`]: the self-contained HTML report.
//! - [`cli`]: `vigil sim`.

pub mod cli;
pub mod clients;
pub mod expect;
pub mod latency;
pub mod path;
pub mod report;
pub mod rng;
pub mod scenario;
pub mod sim;
pub mod summary;

pub use scenario::{Scenario, ScenarioError};
pub use sim::RunOutcome;
pub use summary::{ExpectationVerdict, Policies, Summary};

/// Runs a scenario with the given policies and seed.
pub fn run(
    scenario: &Scenario,
    policies: Policies,
    seed: u64,
    progress: &mut dyn FnMut(f64),
) -> RunOutcome {
    match policies {
        Policies::Vigil => sim::run(&scenario.config, seed, policies, progress),
        Policies::Naive => sim::run(&scenario.config.naive(), seed, policies, progress),
    }
}

/// The result of checking a scenario: both runs (naive only when `[expect.naive]` asks
/// for it) and every expectation's verdict.
pub struct Checked {
    /// The vigil run.
    pub vigil: RunOutcome,
    /// The naive run, when the scenario has naive expectations or a comparison was asked.
    pub naive: Option<RunOutcome>,
    /// Verdicts, vigil's first.
    pub verdicts: Vec<ExpectationVerdict>,
}

impl Checked {
    /// True when every expectation held.
    pub fn passed(&self) -> bool {
        self.verdicts.iter().all(|v| v.ok)
    }
}

/// Runs a scenario (and its naive twin when `compare` or when it has naive expectations)
/// and checks its expectations.
pub fn check(
    scenario: &Scenario,
    seed: u64,
    compare: bool,
    progress: &mut dyn FnMut(f64),
) -> Checked {
    let both = compare || !scenario.expect_naive.is_empty();
    let vigil = run(scenario, Policies::Vigil, seed, &mut |f| {
        progress(if both { f / 2.0 } else { f })
    });
    let mut verdicts = expect::verdicts(&scenario.expect, &vigil.summary);
    let naive = both.then(|| {
        run(scenario, Policies::Naive, seed, &mut |f| {
            progress(0.5 + f / 2.0)
        })
    });
    if let Some(n) = &naive {
        verdicts.extend(expect::verdicts(&scenario.expect_naive, &n.summary));
    }
    Checked {
        vigil,
        naive,
        verdicts,
    }
}
