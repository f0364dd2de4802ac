//! What the guard remembers: per-target state, holds and freezes, the serialisable
//! [`GuardState`], and the counts derived from it (kept incrementally, rebuilt on restore).

use super::budget::Budget;
use super::cause::{CauseConfig, SharedIndex};
use super::damping::FlapDamper;
use crate::thresholds::{HealthState, Thresholds};
use crate::time::Time;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// What an operator's hold on a target means.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldKind {
    /// Never act on it; it still counts towards the fraction cap.
    Silenced,
    /// Never act on it and leave it out of every count (it may be down on purpose).
    Maintenance,
}

/// An operator's hold on a target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    /// Silenced or maintenance.
    pub kind: HoldKind,
    /// Why (shown in decisions).
    pub reason: String,
    /// When it lifts by itself; `None` until cleared.
    pub until: Option<Time>,
}

/// What a freeze covers.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "scope", content = "zone", rename_all = "snake_case")]
pub enum FreezeScope {
    /// The whole fleet.
    Fleet,
    /// One zone.
    Zone(String),
}

impl fmt::Display for FreezeScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FreezeScope::Fleet => f.write_str("fleet"),
            FreezeScope::Zone(z) => write!(f, "zone {z}"),
        }
    }
}

/// An automatic freeze in force.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Freeze {
    /// What it covers.
    pub scope: FreezeScope,
    /// Since when.
    pub since: Time,
    /// Unhealthy targets in the scope, as of the last observation.
    pub unhealthy: u32,
    /// Targets counted in the scope.
    pub total: u32,
    /// Whether this freeze has raised its alert ([`GuardEvent::FreezeAlert`](super::GuardEvent::FreezeAlert)).
    #[serde(default, skip_serializing_if = "is_false")]
    pub alerted: bool,
}

/// An operator's freeze.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManualFreeze {
    /// The operator's reason.
    pub reason: String,
    /// Since when.
    pub since: Time,
}
// === State ===

/// Everything the guard knows about one target (serialised as part of [`GuardState`]).
///
/// Fields at their default (a healthy target's usual state) are left out of the
/// serialised form and read back as the default, so a large healthy fleet's snapshot
/// stays small; states written with every field still load.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct GuardTarget {
    /// Shared by every target of the zone (interned by the guard).
    #[serde(with = "shared_str")]
    pub(super) zone: Arc<str>,
    pub(super) first_seen: Time,
    #[serde(default, skip_serializing_if = "is_false")]
    pub(super) in_grace: bool,
    #[serde(with = "thresholds_serde")]
    pub(super) thresholds: Thresholds,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) last_ok: Option<bool>,
    /// Consecutive failed probes (the thresholds' own streak is only replayed up to the
    /// threshold on restore, so the full count lives here).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) failures: u32,
    #[serde(default, skip_serializing_if = "is_false")]
    pub(super) endpoint_failed: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) failing_checks: Vec<String>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub(super) damper: FlapDamper,
    /// Boxed: most targets have none, and a `Hold` is six words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) hold: Option<Box<Hold>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) reported: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) last_signature: Option<Box<str>>,
    /// The driver cannot tell it passes: its probers disagree, or their results are
    /// stale ([`super::SafetyGuard::doubt`], [`super::Observation::disputed`]). Counted as
    /// failing in the eager fraction, nowhere else; an undisputed observation clears it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub(super) in_doubt: bool,
    /// The last time it failed while a freeze held its fleet or zone, and its count of
    /// consecutive failures then: once the freeze lifts, it is acted on only after it
    /// failed again on its own (see `Reason::FreezeAftermath`). Cleared by a pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) frozen_with: Option<(Time, u32)>,
}

pub(super) fn is_false(b: &bool) -> bool {
    !*b
}

pub(super) fn is_zero(n: &u32) -> bool {
    *n == 0
}

pub(super) fn is_default<T: Default + PartialEq>(t: &T) -> bool {
    *t == T::default()
}

impl GuardTarget {
    pub(super) fn counted(&self) -> bool {
        !self.in_grace
            && !matches!(
                self.hold.as_deref(),
                Some(Hold {
                    kind: HoldKind::Maintenance,
                    ..
                })
            )
    }

    /// Unhealthy by the thresholds: what the fraction cap counts (a single failed probe
    /// is noise, see rule 1).
    pub(super) fn unhealthy(&self) -> bool {
        self.thresholds.health() == HealthState::Unhealthy
    }

    /// Failing now, or possibly: its last probe failed, it is unhealthy, or its
    /// driver cannot tell that it passes (in doubt).
    pub(super) fn failing(&self) -> bool {
        self.last_ok == Some(false) || self.unhealthy() || self.in_doubt
    }
}

/// The guard's whole state, serialisable (serde) so a driver can persist and restore it.
/// Its format is the serde derive of private fields: treat it as opaque, and store it
/// whole.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct GuardState {
    pub(super) targets: BTreeMap<Box<str>, GuardTarget>,
    pub(super) budget: Budget,
    pub(super) manual_freeze: Option<ManualFreeze>,
    pub(super) frozen: Vec<Freeze>,
    /// Tokens spent acting in a frozen scope (`frozen.action = "act-slowly"`); absent in
    /// states written before it existed.
    #[serde(default, skip_serializing_if = "is_default")]
    pub(super) frozen_budget: Budget,
}

/// Counts derived from the state, kept up to date incrementally (every observation
/// removes the target's old contribution and adds its new one), rebuilt on restore.
#[derive(Clone, Debug, Default)]
pub(super) struct Index {
    pub(super) total: u32,
    pub(super) unhealthy: u32,
    /// Targets whose last probe failed, or unhealthy: the eager count that guards an
    /// action (rule 1), never a freeze.
    pub(super) failing: u32,
    /// Per zone: (total, unhealthy, failing).
    pub(super) zones: BTreeMap<Arc<str>, (u32, u32, u32)>,
    /// What the unhealthy targets fail, fleet-wide and per zone (a freeze's evidence).
    pub(super) tally: FailTally,
    pub(super) zone_tally: BTreeMap<Arc<str>, FailTally>,
    pub(super) shared: SharedIndex,
    /// Earliest `until` of any hold (a lower bound: may be stale-early, never late), so
    /// observations sweep expired holds of every target in O(1) when none is due.
    pub(super) next_hold_expiry: Option<Time>,
}

impl Index {
    pub(super) fn apply(&mut self, cause: &CauseConfig, t: &GuardTarget, add: bool) {
        if add && let Some(until) = t.hold.as_ref().and_then(|h| h.until) {
            self.next_hold_expiry = Some(self.next_hold_expiry.map_or(until, |n| n.min(until)));
        }
        if !t.counted() {
            return;
        }
        let sick = u32::from(t.unhealthy());
        // Targets without a zone (`""`) are in no zone: only the fleet counts them, so
        // no zone named "" is ever frozen or blamed.
        let zoned = !t.zone.is_empty();
        if t.unhealthy() {
            self.tally.apply(cause, t, add);
            if zoned {
                let z = self.zone_tally.entry(t.zone.clone()).or_default();
                z.apply(cause, t, add);
                if z.is_empty() {
                    self.zone_tally.remove(&*t.zone);
                }
            }
        }
        let failing = u32::from(t.failing());
        if add {
            self.total += 1;
            self.unhealthy += sick;
            self.failing += failing;
        } else {
            self.total -= 1;
            self.unhealthy -= sick;
            self.failing -= failing;
        }
        if zoned {
            let zone = self.zones.entry(t.zone.clone()).or_default();
            if add {
                zone.0 += 1;
                zone.1 += sick;
                zone.2 += failing;
            } else {
                zone.0 -= 1;
                zone.1 -= sick;
                zone.2 -= failing;
                if zone.0 == 0 {
                    self.zones.remove(&*t.zone);
                }
            }
        }
        if t.last_ok == Some(false) {
            for c in t.failing_checks.iter().filter(|c| !cause.is_local(c)) {
                if add {
                    self.shared.add(c);
                } else {
                    self.shared.remove(c);
                }
            }
        }
    }
}

/// Counts of what the unhealthy targets of a scope fail (derived, rebuilt on restore).
#[derive(Clone, Debug, Default)]
pub(super) struct FailTally {
    /// Unhealthy targets whose last probe failed.
    pub(super) failing: u32,
    /// ... whose endpoint failed as a whole (or reported fail naming no check).
    pub(super) endpoint: u32,
    /// ... failing at least one local check.
    pub(super) local: u32,
    /// ... whose last probe passed.
    pub(super) recovering: u32,
    /// Targets failing each check.
    pub(super) checks: BTreeMap<String, u32>,
}

impl FailTally {
    pub(super) fn apply(&mut self, cause: &CauseConfig, t: &GuardTarget, add: bool) {
        fn step(n: &mut u32, add: bool) {
            if add {
                *n += 1;
            } else {
                *n = n.saturating_sub(1);
            }
        }
        if t.last_ok != Some(false) {
            step(&mut self.recovering, add);
            return;
        }
        step(&mut self.failing, add);
        if t.endpoint_failed || t.failing_checks.is_empty() {
            step(&mut self.endpoint, add);
        }
        if t.failing_checks.iter().any(|c| cause.is_local(c)) {
            step(&mut self.local, add);
        }
        for c in &t.failing_checks {
            if add {
                *self.checks.entry(c.clone()).or_default() += 1;
            } else if let Some(n) = self.checks.get_mut(c) {
                *n -= 1;
                if *n == 0 {
                    self.checks.remove(c);
                }
            }
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.failing == 0 && self.recovering == 0
    }
}
// === serde helpers ===

/// Serde for a shared `Arc<str>`, as a plain string.
mod shared_str {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::sync::Arc;

    pub fn serialize<S: Serializer>(s: &Arc<str>, ser: S) -> Result<S::Ok, S::Error> {
        ser.serialize_str(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<str>, D::Error> {
        String::deserialize(d).map(Arc::from)
    }
}

/// Serde for `Thresholds`, which keeps its fields private: saved as a snapshot of what
/// its accessors expose, restored by replaying the streak into a fresh machine (the
/// replay cannot cross a threshold: a saved streak that had crossed one would already
/// have changed the verdict).
mod thresholds_serde {
    use crate::thresholds::{HealthState, Thresholds, ThresholdsConfig};
    use crate::time::Time;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// Fields at their default are left out (and read back as the default).
    #[derive(Serialize, Deserialize)]
    struct Snapshot {
        #[serde(default, skip_serializing_if = "super::is_default")]
        config: ThresholdsConfig,
        health: HealthState,
        since: Time,
        #[serde(default, skip_serializing_if = "super::is_zero")]
        failures: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        failing_since: Option<Time>,
        #[serde(default, skip_serializing_if = "super::is_zero")]
        successes: u32,
    }

    pub fn serialize<S: Serializer>(t: &Thresholds, s: S) -> Result<S::Ok, S::Error> {
        Snapshot {
            config: t.config(),
            health: t.health(),
            since: t.since(),
            failures: t.consecutive_failures(),
            failing_since: t.failing_since(),
            successes: t.consecutive_successes(),
        }
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Thresholds, D::Error> {
        let s = Snapshot::deserialize(d)?;
        let mut t = Thresholds::with_health(s.config, s.health, s.since);
        let start = s.failing_since.unwrap_or(s.since);
        // Beyond the threshold a longer streak changes nothing in the machine.
        for _ in 0..s.failures.min(s.config.unhealthy_threshold) {
            t.observe(start, false);
        }
        for _ in 0..s.successes.min(s.config.healthy_threshold) {
            t.observe(s.since, true);
        }
        if t.health() != s.health || t.since() != s.since {
            return Err(serde::de::Error::custom(
                "inconsistent thresholds snapshot: its streak crosses its threshold",
            ));
        }
        Ok(t)
    }
}
