//! Shared probe verdicts among the balancers of one pool, under a probe budget: which
//! balancer probes a target this interval, which peer verdicts it takes, and when it
//! stops trusting them. Sans-IO and pure: the driver passes in the peers' answers, the
//! verdicts they carry, its own probe results and the time.
//!
//! N balancers each probing M targets send N x M probes per interval (Envoy and HAProxy
//! do), and two of them can disagree about a target. With a [`Share`], each balancer
//! publishes the results of the probes it made itself; each target is probed every
//! interval by only `probes_per_interval` balancers, and the others take their verdicts.
//!
//! ## The rules
//!
//! 1. **Assignment.** The probers of a target are the top `probes_per_interval` of
//!    {this balancer} + the live peers by rendezvous weight
//!    ([`crate::shard::Shard`], the controller's sharding): every balancer computes the
//!    same sets from the same live list, and a peer leaving moves only its own targets.
//!    A peer is live while it answered within two intervals ([`Share::peer_answered`]).
//!    An assigned balancer probes every interval, as without sharing.
//! 2. **Taking verdicts.** A balancer not assigned to a target, while an assigned peer's
//!    verdict is younger than two intervals, takes the peers' new **passes** as
//!    observations ([`Plan::Take`]) and probes itself only every `local_every`
//!    intervals ([`Why::Slow`]), so that its own path to the target is never blind. A
//!    peer's **fail** is not believed on its word: it asks for one local confirmation
//!    probe at once ([`Why::Confirm`], also on a [`Turn::Woken`] turn), and the local
//!    result is what the pool observes. Every failing observation that removes a target
//!    is therefore the balancer's own: one prober cut off from a target cannot empty
//!    every balancer, and kill-to-removal stays near the unshared figure (the assigned
//!    prober's cadence, plus one probe).
//! 3. **Fallback.** Not assigned and no assigned peer's verdict younger than two
//!    intervals (that peer died, stopped or its feed went stale): probe every interval
//!    locally at once ([`Why::Fallback`], with `first` set on the turn it starts, for
//!    one log line). A balancer that loses the feed probes as if unshared: it never
//!    routes worse than unshared probing does.
//! 4. **Disagreement of vantage points.** A local result that differs from a fresh peer
//!    verdict puts the target in *doubt*: the balancer trusts only its own probes for it
//!    (full local probing, no verdict taken) until every fresh peer verdict agrees with
//!    its own again. When a peer verdict made *after* the doubt began still differs, the
//!    doubt is a [`Disagreement`] (returned once by [`Share::local`], for a counter and
//!    a log line that names whose path fails): a peer verdict from before the local
//!    probe is only late news (the target died between the two probes), not a second
//!    vantage point.
//!
//! Passive signals (the proxied requests' outcomes) could stand in for the slow local
//! probe later; they do not here.

use crate::Time;
use crate::shard::Shard;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

/// Default probe budget: 1 balancer probes each target every interval; the others take
/// its verdicts (a remote fail is confirmed locally, rule 2).
pub const DEFAULT_PROBES_PER_INTERVAL: usize = 1;

/// Default slow local probe: every 10th interval (20 s at the default 2 s interval), so
/// a balancer's own path to each target is tested at a tenth of the unshared load.
pub const DEFAULT_LOCAL_EVERY: u32 = 10;

/// Intervals without news after which a peer is not live and its verdicts are stale
/// (rules 1 and 3): one missed poll is not a dead peer.
pub const STALE_INTERVALS: u32 = 2;

/// What a [`Share`] needs to know about its pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareSettings {
    /// This balancer's name in the feed.
    pub id: String,
    /// Balancers that probe each target every interval (at least 1).
    pub probes_per_interval: usize,
    /// A target that others probe is probed locally every this many intervals (at
    /// least 1).
    pub local_every: u32,
    /// The pool's health-check interval.
    pub interval: Duration,
}

/// Why a turn's plan is a local probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Why {
    /// This balancer is among the target's probers (rule 1).
    Assigned,
    /// The slow local probe of a target that a peer probes (rule 2).
    Slow,
    /// A peer said the target fails: confirm it locally (rule 2).
    Confirm {
        /// The peer.
        by: String,
    },
    /// No fresh verdict from the target's assigned probers (rule 3).
    Fallback(Fallback),
    /// The local view and the feed differ: only local probes count (rule 4).
    Doubt,
}

/// Why a target is probed locally in fallback (rule 3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fallback {
    /// The target's assigned probers (other than this balancer).
    pub probers: Vec<String>,
    /// How long since their latest verdict on it; `None` when none ever came.
    pub silent_for: Option<Duration>,
    /// The fallback starts with this turn (log it once).
    pub first: bool,
}

/// What a target's checker does this turn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Probe it locally, then report the result with [`Share::local`].
    Probe(Why),
    /// Observe a peer's passing verdict as a probe result.
    Take {
        /// The peer.
        by: String,
        /// What its probe saw.
        detail: String,
    },
    /// Nothing new: do nothing this turn.
    Idle,
}

/// Which turn of a target's checker asks for a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// The turn that comes every interval.
    Scheduled,
    /// A turn out of schedule, because a peer's fail arrived ([`Share::remote`]
    /// returned true): only a confirmation probe is planned on it.
    Woken,
}

/// A local result that a fresh peer verdict made after it contradicts (rule 4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disagreement {
    /// The target.
    pub target: String,
    /// This balancer.
    pub me: String,
    /// The peer that sees it otherwise.
    pub by: String,
    /// Whether the local probe passed (the peer's verdict is the opposite).
    pub local_ok: bool,
}

impl Disagreement {
    /// The balancer from whose vantage point the target fails.
    pub fn failing_from(&self) -> &str {
        if self.local_ok { &self.by } else { &self.me }
    }
}

impl fmt::Display for Disagreement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (fails, passes) = if self.local_ok {
            (&self.by, &self.me)
        } else {
            (&self.me, &self.by)
        };
        write!(
            f,
            "{} fails from {fails} only (it passes from {passes}): {fails}'s path to the target, not the target; {fails} routes around it, the others keep it",
            self.target
        )
    }
}

/// A peer's latest verdict on one target.
#[derive(Clone, Debug)]
struct Verdict {
    seq: u64,
    ok: bool,
    detail: String,
    /// When the peer probed (now minus the age it reported).
    at: Time,
    /// Observed (a pass taken) or covered by a local probe (a fail confirmed).
    used: bool,
}

#[derive(Clone, Debug, Default)]
struct TargetView {
    remote: BTreeMap<String, Verdict>,
    last_local: Option<Time>,
    /// Rule 4: since when the local view differs from the feed, and whether it was
    /// declared a disagreement.
    doubt: Option<(Time, bool)>,
    fallback: bool,
}

/// The sharing state of one pool at one balancer (the module doc has the rules).
#[derive(Clone, Debug)]
pub struct Share {
    settings: ShareSettings,
    /// Each peer (by id) and when it last answered.
    peers: BTreeMap<String, Time>,
    targets: HashMap<String, TargetView>,
}

impl Share {
    /// A share with no peer heard yet: until one answers, this balancer probes every
    /// target itself (rule 1 with one member).
    pub fn new(settings: ShareSettings) -> Share {
        let settings = ShareSettings {
            probes_per_interval: settings.probes_per_interval.max(1),
            local_every: settings.local_every.max(1),
            ..settings
        };
        Share {
            settings,
            peers: BTreeMap::new(),
            targets: HashMap::new(),
        }
    }

    /// The settings.
    pub fn settings(&self) -> &ShareSettings {
        &self.settings
    }

    fn stale_after(&self) -> Duration {
        self.settings.interval.saturating_mul(STALE_INTERVALS)
    }

    /// `peer` answered its feed at `now` (an answer naming this balancer itself is
    /// ignored: a peer URL that leads back here is no second vantage point).
    pub fn peer_answered(&mut self, peer: &str, now: Time) {
        if peer != self.settings.id {
            self.peers.insert(peer.to_string(), now);
        }
    }

    /// The peers live at `now` (answered within two intervals), sorted.
    pub fn live_peers(&self, now: Time) -> Vec<&str> {
        let stale = self.stale_after();
        self.peers
            .iter()
            .filter(|(_, at)| now.since(**at) < stale)
            .map(|(p, _)| p.as_str())
            .collect()
    }

    fn shard(&self, now: Time) -> Shard {
        let members = self
            .live_peers(now)
            .into_iter()
            .chain([self.settings.id.as_str()]);
        Shard::new(members, self.settings.probes_per_interval)
    }

    /// The balancers that probe `target` every interval at `now` (rule 1), highest
    /// weight first.
    pub fn probers_of(&self, target: &str, now: Time) -> Vec<String> {
        self.shard(now)
            .probers_of(target)
            .into_iter()
            .map(str::to_string)
            .collect()
    }

    /// A peer's verdict on `target` from its feed: its `seq` (a new one replaces the
    /// last; the same one again is ignored), whether it passed, what it saw and its
    /// `age` at the peer. Returns true when it is a new fail that this balancer should
    /// confirm at once (wake the target's checker: [`Turn::Woken`]).
    #[allow(clippy::too_many_arguments)]
    pub fn remote(
        &mut self,
        target: &str,
        by: &str,
        seq: u64,
        ok: bool,
        detail: &str,
        age: Duration,
        now: Time,
    ) -> bool {
        if by == self.settings.id {
            return false;
        }
        let view = self.targets.entry(target.to_string()).or_default();
        if view.remote.get(by).is_some_and(|v| v.seq == seq) {
            return false;
        }
        // A verdict older than this balancer's own last probe is covered by it.
        let at = now - age;
        let used = view.last_local.is_some_and(|l| l >= at);
        view.remote.insert(
            by.to_string(),
            Verdict {
                seq,
                ok,
                detail: detail.to_string(),
                at,
                used,
            },
        );
        !ok && !used
    }

    /// What `target`'s checker does on this turn (the module doc's rules).
    pub fn plan(&mut self, target: &str, now: Time, turn: Turn) -> Plan {
        let me = self.settings.id.clone();
        let probers = self.probers_of(target, now);
        let stale = self.stale_after();
        let slow_every = self
            .settings
            .interval
            .saturating_mul(self.settings.local_every);
        // A turn comes every interval +- jitter: a slow probe is due half an interval
        // early rather than one interval late.
        let slow_due = slow_every.saturating_sub(self.settings.interval / 2);
        let view = self.targets.entry(target.to_string()).or_default();
        let fresh = |v: &Verdict| now.since(v.at) < stale;
        let confirm = view
            .remote
            .iter()
            .filter(|(_, v)| fresh(v) && !v.ok && !v.used)
            .max_by_key(|(_, v)| v.at)
            .map(|(by, _)| by.clone());
        if turn == Turn::Woken {
            return match confirm {
                Some(by) if !probers.contains(&me) => Plan::Probe(Why::Confirm { by }),
                _ => Plan::Idle,
            };
        }
        if probers.contains(&me) {
            view.fallback = false;
            return Plan::Probe(Why::Assigned);
        }
        if view.doubt.is_some() {
            return Plan::Probe(Why::Doubt);
        }
        let assigned_fresh = probers
            .iter()
            .any(|p| view.remote.get(p).is_some_and(fresh));
        if !assigned_fresh {
            let silent_for = probers
                .iter()
                .filter_map(|p| view.remote.get(p))
                .map(|v| now.since(v.at))
                .min();
            let first = !view.fallback;
            view.fallback = true;
            return Plan::Probe(Why::Fallback(Fallback {
                probers,
                silent_for,
                first,
            }));
        }
        view.fallback = false;
        if let Some(by) = confirm {
            return Plan::Probe(Why::Confirm { by });
        }
        if view.last_local.is_none_or(|l| now.since(l) >= slow_due) {
            return Plan::Probe(Why::Slow);
        }
        let take = view
            .remote
            .iter_mut()
            .filter(|(_, v)| now.since(v.at) < stale && v.ok && !v.used)
            .max_by_key(|(_, v)| v.at);
        match take {
            Some((by, v)) => {
                v.used = true;
                Plan::Take {
                    by: by.clone(),
                    detail: v.detail.clone(),
                }
            }
            None => Plan::Idle,
        }
    }

    /// This balancer probed `target` at `now` and it passed (`ok`) or not. Returns the
    /// disagreement it completes, once (rule 4).
    pub fn local(&mut self, target: &str, ok: bool, now: Time) -> Option<Disagreement> {
        let me = self.settings.id.clone();
        let stale = self.stale_after();
        let view = self.targets.entry(target.to_string()).or_default();
        view.last_local = Some(now);
        for v in view.remote.values_mut() {
            if v.at <= now {
                v.used = true;
            }
        }
        let differing = view
            .remote
            .iter()
            .filter(|(_, v)| now.since(v.at) < stale && v.ok != ok)
            .max_by_key(|(_, v)| v.at);
        match (differing, view.doubt) {
            (None, _) => {
                view.doubt = None;
                None
            }
            (Some(_), None) => {
                view.doubt = Some((now, false));
                None
            }
            (Some((by, v)), Some((since, false))) if v.at > since => {
                view.doubt = Some((since, true));
                Some(Disagreement {
                    target: target.to_string(),
                    me,
                    by: by.clone(),
                    local_ok: ok,
                })
            }
            (Some(_), Some(_)) => None,
        }
    }

    /// Whether `target` is in doubt: its local view and the feed differ (rule 4).
    pub fn in_doubt(&self, target: &str) -> bool {
        self.targets.get(target).is_some_and(|v| v.doubt.is_some())
    }

    /// The targets probed in fallback (rule 3) as of their last turn.
    pub fn fallback_targets(&self) -> usize {
        self.targets.values().filter(|v| v.fallback).count()
    }
}

#[cfg(test)]
mod tests;
