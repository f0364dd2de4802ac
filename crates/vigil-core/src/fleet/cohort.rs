//! Shared pauses: when most queue workers of a cohort have paused themselves at once,
//! the cause is one they share, and the controller says so once for the cohort.
//!
//! A worker's gate ([`crate::gate`]) pauses it on its own evidence: its kill switch (it
//! fails most messages), its readiness. Each worker's heartbeat reports its gate
//! (`pulling`, and the state in words), but a pause is no failed check: the
//! controller's guard sees nothing fail, and the peer comparison ([`crate::anomaly`])
//! sees members with no volume. When every worker of a cohort loses the same
//! dependency, or the same bad message kind reaches them all, four separate verdicts
//! ("paused: kill switch ...") are one event, and [`shared_pauses`] names it:
//! `shared outage in cohort q: 4 of 4 workers paused together (kill switch: 4)`.
//!
//! # The rule
//!
//! A cohort's pause is **shared** when at least [`MIN_SHARED_PAUSED`] (2) of the
//! members that report a gate are paused, and more than `shared_fraction` of them (the
//! anomaly's `shared_fraction`, default half: one knob says what "most of the cohort"
//! means, for failures and for pauses alike). One worker paused alone is its own
//! problem, which its gate and the peer comparison handle; 2 of 4 may be two
//! unrelated faults; 3 of 4 is shared. Members whose heartbeat is stale report no gate
//! and are not counted: a worker that is gone is not a paused one.
//!
//! Its `since` is when the pause became shared: the time the last of the first
//! qualifying number of members paused (sorted by when each paused), not the first
//! worker's pause, which may have been its own fault.
//!
//! It is a judgement of the moment, recomputed from the members' reports whenever the
//! driver likes (a pure function: no state, nothing to persist).

use crate::time::Time;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// Fewest paused members a shared pause has: one worker paused alone is its own
/// problem.
pub const MIN_SHARED_PAUSED: usize = 2;

/// What one member's heartbeat says of its gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateReport<'a> {
    /// The member's id.
    pub member: &'a str,
    /// Its cohort (the target's group).
    pub cohort: &'a str,
    /// `Some` when it does not pull: since when (the driver's time of the first report
    /// of this pause), and its gate's state in words (`vigil_core::gate::WorkerGate`'s
    /// `Display`: `paused: kill switch: 23 of 228 messages failed; ...`).
    pub paused: Option<(Time, &'a str)>,
}

/// A paused member of a shared pause.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PausedMember {
    /// Its id.
    pub member: String,
    /// Since when it is paused.
    pub since: Time,
    /// Its gate's state, as it reported it.
    pub state: String,
}

/// Most of a cohort paused together: see the [module docs](self).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedPause {
    /// The cohort.
    pub cohort: String,
    /// Members paused.
    pub paused: usize,
    /// Members reporting a gate.
    pub of: usize,
    /// When the pause became shared.
    pub since: Time,
    /// What paused them, by kind, most common first: `kill switch: 4`.
    pub reason: String,
    /// The paused members, by id.
    pub members: Vec<PausedMember>,
}

impl fmt::Display for SharedPause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "shared outage in cohort {}: {} of {} workers paused together ({}), a cause they share, not one worker's",
            if self.cohort.is_empty() {
                "-"
            } else {
                &self.cohort
            },
            self.paused,
            self.of,
            self.reason
        )
    }
}

/// The kind of a pause, from the gate's state in words: `kill switch`, `local
/// readiness fails`; the words up to the first `": "`, `" ("` or `;`, after `paused: `.
pub fn pause_kind(state: &str) -> &str {
    let s = state.trim();
    let s = s.strip_prefix("paused:").map_or(s, str::trim_start);
    let end = [": ", " (", ";"]
        .iter()
        .filter_map(|sep| s.find(sep))
        .min()
        .unwrap_or(s.len());
    match s[..end].trim() {
        "" => "paused",
        kind => kind,
    }
}

/// The cohorts whose pause is shared, by cohort name, given every member's gate
/// report and the fraction above which most of a cohort is paused (`shared_fraction`
/// of [`crate::anomaly::AnomalyConfig`]). See the [module docs](self).
pub fn shared_pauses<'a>(
    reports: impl IntoIterator<Item = GateReport<'a>>,
    shared_fraction: f64,
) -> Vec<SharedPause> {
    // Per cohort: members reporting a gate, and the paused ones (id, since, state).
    type Paused<'a> = Vec<(&'a str, Time, &'a str)>;
    let mut cohorts: BTreeMap<&str, (usize, Paused<'_>)> = BTreeMap::new();
    for r in reports {
        let c = cohorts.entry(r.cohort).or_default();
        c.0 += 1;
        if let Some((since, state)) = r.paused {
            c.1.push((r.member, since, state));
        }
    }
    let mut out = Vec::new();
    for (cohort, (of, mut paused)) in cohorts {
        let n = paused.len();
        if n < MIN_SHARED_PAUSED || n as f64 <= shared_fraction * of as f64 {
            continue;
        }
        // The fewest paused members that make it shared; it became shared when the
        // last of the first that many paused.
        let needed = (MIN_SHARED_PAUSED..=n)
            .find(|&k| k as f64 > shared_fraction * of as f64)
            .unwrap_or(n);
        paused.sort_by(|a, b| (a.1, a.0).cmp(&(b.1, b.0)));
        let since = paused[needed - 1].1;
        let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
        for (_, _, state) in &paused {
            *kinds.entry(pause_kind(state)).or_default() += 1;
        }
        let mut kinds: Vec<(&str, usize)> = kinds.into_iter().collect();
        kinds.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let reason = kinds
            .iter()
            .map(|(k, n)| format!("{k}: {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        paused.sort_by(|a, b| a.0.cmp(b.0));
        out.push(SharedPause {
            cohort: cohort.to_string(),
            paused: n,
            of,
            since,
            reason,
            members: paused
                .into_iter()
                .map(|(member, since, state)| PausedMember {
                    member: member.to_string(),
                    since,
                    state: state.to_string(),
                })
                .collect(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::anomaly::DEFAULT_SHARED_FRACTION;

    const KILL: &str =
        "paused: kill switch: 23 of 228 messages failed; pulling again on probation at t+82.133s";
    const DISK: &str = "paused: local readiness fails (disk:free 0.1% free)";

    fn report<'a>(
        member: &'a str,
        cohort: &'a str,
        paused: Option<(u64, &'a str)>,
    ) -> GateReport<'a> {
        GateReport {
            member,
            cohort,
            paused: paused.map(|(s, st)| (Time::from_secs(s), st)),
        }
    }

    #[test]
    fn four_of_four_paused_is_one_shared_outage_since_the_third_paused() {
        let reports = [
            report("w0", "q", Some((10, KILL))),
            report("w1", "q", Some((12, KILL))),
            report("w2", "q", Some((11, KILL))),
            report("w3", "q", Some((14, DISK))),
            report("x0", "other", None),
        ];
        let shared = shared_pauses(reports, DEFAULT_SHARED_FRACTION);
        assert_eq!(shared.len(), 1, "{shared:?}");
        let s = &shared[0];
        assert_eq!((s.cohort.as_str(), s.paused, s.of), ("q", 4, 4));
        // 3 of 4 is more than half: shared once the third paused (w1, at 12 s).
        assert_eq!(s.since, Time::from_secs(12));
        assert_eq!(s.reason, "kill switch: 3, local readiness fails: 1");
        let ids: Vec<&str> = s.members.iter().map(|m| m.member.as_str()).collect();
        assert_eq!(ids, ["w0", "w1", "w2", "w3"]);
        assert_eq!(
            s.to_string(),
            "shared outage in cohort q: 4 of 4 workers paused together (kill switch: 3, local readiness fails: 1), a cause they share, not one worker's"
        );
    }

    #[test]
    fn one_worker_paused_alone_or_half_a_cohort_is_not_shared() {
        let alone = [
            report("w0", "q", Some((10, KILL))),
            report("w1", "q", None),
            report("w2", "q", None),
        ];
        assert!(shared_pauses(alone, DEFAULT_SHARED_FRACTION).is_empty());
        let half = [
            report("w0", "q", Some((10, KILL))),
            report("w1", "q", Some((11, KILL))),
            report("w2", "q", None),
            report("w3", "q", None),
        ];
        assert!(
            shared_pauses(half, DEFAULT_SHARED_FRACTION).is_empty(),
            "2 of 4 may be two faults"
        );
        let lone = [report("w0", "q", Some((10, KILL)))];
        assert!(
            shared_pauses(lone, DEFAULT_SHARED_FRACTION).is_empty(),
            "a cohort of one pausing says nothing about a shared cause"
        );
        let pair = [
            report("w0", "q", Some((10, KILL))),
            report("w1", "q", Some((11, KILL))),
        ];
        let s = shared_pauses(pair, DEFAULT_SHARED_FRACTION);
        assert_eq!(
            (s[0].paused, s[0].of, s[0].since),
            (2, 2, Time::from_secs(11))
        );
    }

    #[test]
    fn the_kind_of_a_pause_is_its_first_words() {
        assert_eq!(pause_kind(KILL), "kill switch");
        assert_eq!(pause_kind(DISK), "local readiness fails");
        assert_eq!(
            pause_kind(
                "paused: kill switch: 1 of 2 messages failed; pulling again on probation at t+1.000s; a shared cause (its dependency checks fail): pulling again once they pass"
            ),
            "kill switch"
        );
        assert_eq!(pause_kind(""), "paused");
        assert_eq!(pause_kind("draining"), "draining");
    }

    #[test]
    fn the_gates_own_words_give_their_kind() {
        use crate::gate::{GateConfig, WorkerGate};
        let mut g = WorkerGate::new(GateConfig::default(), Time::ZERO);
        g.observe_readiness(Time::from_secs(1), Err("disk:free 0.1% free".into()));
        assert_eq!(pause_kind(&g.to_string()), "local readiness fails", "{g}");
        let mut g = WorkerGate::new(GateConfig::default(), Time::ZERO);
        for i in 0..200 {
            g.record(Time::from_millis(i * 10), false);
        }
        assert!(!g.may_pull());
        assert_eq!(pause_kind(&g.to_string()), "kill switch", "{g}");
    }
}
