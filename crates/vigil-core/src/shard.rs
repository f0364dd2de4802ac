//! Sharded probing among controller replicas: which replicas probe a target, and what
//! their results together say. Sans-IO and pure: the driver passes the live members,
//! the results and their ages in.
//!
//! ## The rules
//!
//! 1. **Rendezvous assignment.** Each target is probed by the `min(r, N)` live replicas
//!    with the highest weight `hash(target, replica)` (highest-random-weight hashing,
//!    Thaler and Ravishankar 1996): every replica computes the same sets from the same
//!    member list, with no coordination and no table of assignments. A replica joining
//!    takes over about `r / (N + 1)` of the targets' slots and moves nothing else; one
//!    leaving hands on only the slots it held (`r / N` of the targets change one
//!    prober). Hash-mod sharding (Prometheus `hashmod`) reshuffles almost every target
//!    on any change (prometheus #4309).
//! 2. **A stable, seed-free hash.** [`weight`] is FNV-1a (64-bit) over the target's
//!    bytes, a 0xFF byte (never in UTF-8, so `("ab", "c")` and `("a", "bc")` differ)
//!    and the replica's bytes, then SplitMix64's finaliser (FNV alone mixes its last
//!    bytes poorly, and replica ids differ in their last byte). No random seed, no
//!    `std` hasher (whose algorithm may change between Rust releases): replicas built
//!    by different compilers, on different machines, agree.
//! 3. **Verdict by agreement.** A target is judged failing only when **every** assigned
//!    prober has a *fresh* failing result ([`agree`]): one prober cut off from the
//!    target (a partition, a bad route, a firewall rule on one host) can never make it
//!    unhealthy alone. A fresh pass from any assigned prober is a pass (the target
//!    served someone). A result is fresh when it is current as of at most `fresh_for`
//!    ago ([`fresh_for`]: two probe intervals plus the probe timeout plus a second of
//!    slack: one missed probe and a slow store write are not staleness). A stale or
//!    missing result does not count either way; with no fresh result at all there is
//!    no new verdict (the guard keeps its state until probers report again).
//! 4. **Doubt counts against acting.** What protects one target from a lone prober
//!    must not hide a shared failure from the fleet's count: a pass beside a fresh
//!    failure is [`Agreement::Split`], and no verdict is [`Agreement::Undecided`]; the
//!    driver tells the guard the target is *in doubt* in both cases
//!    (`vigil_core::guard::Observation::disputed`, `SafetyGuard::doubt`), and the
//!    guard counts it as failing in the eager fraction that holds actions. Without
//!    that, a prober stopped (SIGSTOP) or cut off just as a fleet-wide failure starts
//!    leaves its last passes fresh for `fresh_for` (longer than a lease TTL), its
//!    targets look healthy to a new leader, and the first targets confirmed failing
//!    are acted on although the fleet is about to freeze: the replicas' fault loop
//!    (`controller_chaos`) found exactly that.
//!
//! With one live replica, `min(r, 1) = 1`: that replica alone decides, as a single
//! controller does.

use std::time::Duration;

/// Default number of replicas probing each target: 2, the least that lets one
/// partitioned prober be outvoted.
pub const DEFAULT_PROBERS: usize = 2;

/// Slack on top of two probe intervals and a timeout before a result is stale: a
/// store write or a scheduling delay of a second is not a prober gone quiet.
pub const FRESH_SLACK: Duration = Duration::from_secs(1);

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// The rendezvous weight of `replica` for `target` (rule 2): FNV-1a 64 over
/// `target ++ [0xFF] ++ replica`, then SplitMix64's finaliser.
pub fn weight(target: &str, replica: &str) -> u64 {
    let mut h = FNV_OFFSET;
    for b in target
        .as_bytes()
        .iter()
        .chain(&[0xFF])
        .chain(replica.as_bytes())
    {
        h ^= u64::from(*b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    // SplitMix64's finaliser (Steele, Lea, Flood 2014).
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The live replicas and how many of them probe each target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shard {
    members: Vec<String>,
    probers: usize,
}

impl Shard {
    /// `members` (any order; duplicates dropped), each target probed by `probers` of
    /// them (at least 1).
    pub fn new(members: impl IntoIterator<Item = impl Into<String>>, probers: usize) -> Shard {
        let mut members: Vec<String> = members.into_iter().map(Into::into).collect();
        members.sort();
        members.dedup();
        Shard {
            members,
            probers: probers.max(1),
        }
    }

    /// The live replicas, sorted.
    pub fn members(&self) -> &[String] {
        &self.members
    }

    /// Replicas per target, as configured (fewer when fewer are live).
    pub fn probers(&self) -> usize {
        self.probers
    }

    /// The `min(probers, members)` replicas that probe `target`, highest weight first
    /// (ties, which need a 64-bit collision, broken by id).
    pub fn probers_of(&self, target: &str) -> Vec<&str> {
        let mut ranked: Vec<(u64, &str)> = self
            .members
            .iter()
            .map(|m| (weight(target, m), m.as_str()))
            .collect();
        let k = self.probers.min(ranked.len());
        if k < ranked.len() {
            ranked.select_nth_unstable_by(k, |a, b| b.cmp(a));
            ranked.truncate(k);
        }
        ranked.sort_unstable_by(|a, b| b.cmp(a));
        ranked.into_iter().map(|(_, m)| m).collect()
    }

    /// Whether `replica` probes `target`.
    pub fn assigned(&self, target: &str, replica: &str) -> bool {
        self.probers_of(target).contains(&replica)
    }
}

/// One assigned prober's latest result for a target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report {
    /// Its outcome was a failure.
    pub failing: bool,
    /// How long ago it was last known current (the driver's clock: the store's).
    pub age: Duration,
}

/// What the assigned probers' results say together (rule 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Agreement {
    /// Every assigned prober has a fresh failing result.
    Failing,
    /// At least one assigned prober has a fresh passing result, and none a fresh
    /// failing one.
    Passing,
    /// A fresh pass beside a fresh failure: the target passes (it served someone),
    /// but it is in doubt for the fleet's count (rule 4).
    Split,
    /// Neither: some results are stale or missing, or there is no assigned prober. No
    /// new verdict, and the target is in doubt (rule 4).
    Undecided,
}

impl Agreement {
    /// Whether the target passes (a pass for the guard, [`Agreement::Split`] too).
    pub fn passes(self) -> bool {
        matches!(self, Agreement::Passing | Agreement::Split)
    }
}

/// How long a result stays fresh for a target probed every `interval` with `timeout`:
/// `2 x interval + timeout + FRESH_SLACK`.
pub fn fresh_for(interval: Duration, timeout: Duration) -> Duration {
    interval.saturating_mul(2) + timeout + FRESH_SLACK
}

/// The verdict of a target's assigned probers: one entry per assigned prober, `None`
/// for a prober that has reported nothing.
pub fn agree(reports: &[Option<Report>], fresh_for: Duration) -> Agreement {
    let fresh = |r: &&Option<Report>| r.is_some_and(|r| r.age <= fresh_for);
    let fresh_with = |failing: bool| {
        reports
            .iter()
            .filter(fresh)
            .any(|r| r.is_some_and(|r| r.failing == failing))
    };
    if fresh_with(false) {
        if fresh_with(true) {
            Agreement::Split
        } else {
            Agreement::Passing
        }
    } else if !reports.is_empty()
        && reports
            .iter()
            .all(|r| fresh(&r) && r.is_some_and(|r| r.failing))
    {
        Agreement::Failing
    } else {
        Agreement::Undecided
    }
}

/// The assigned probers (indices into `reports`) that fail the target alone: a fresh
/// failure while another assigned prober has a fresh pass (an [`Agreement::Split`], seen
/// from the side of the failing prober). A prober that does so for most of the targets
/// it probes is likely cut off from the targets, not the targets broken: while it is, its
/// targets are in doubt and the guard holds (rule 4), so its driver says so loudly.
pub fn dissenting(reports: &[Option<Report>], fresh_for: Duration) -> Vec<usize> {
    let fresh = |r: &Option<Report>, failing: bool| {
        r.is_some_and(|r| r.age <= fresh_for && r.failing == failing)
    };
    if !reports.iter().any(|r| fresh(r, false)) {
        return Vec::new();
    }
    (0..reports.len())
        .filter(|&i| fresh(&reports[i], true))
        .collect()
}

/// The verdict on a heartbeat target, which every live replica judges from the
/// heartbeats it received (a worker sends to one address, which may lead to any
/// replica): one fresh pass is a pass that nobody disputes (a replica that heard
/// nothing saw nothing fail), failing only when every replica freshly says it heard
/// nothing; otherwise no verdict.
pub fn heard(reports: &[Option<Report>], fresh_for: Duration) -> Agreement {
    match agree(reports, fresh_for) {
        Agreement::Split => Agreement::Passing,
        other => other,
    }
}

#[cfg(test)]
mod tests;
