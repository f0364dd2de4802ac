//! Sharded probing among several replicas: which targets this replica probes, what it
//! writes to the store so the leader hears it, and how the leader turns its probers'
//! results into one observation per target. The rules (rendezvous assignment, verdict
//! by agreement, freshness) are `vigil_core::shard`'s; this is their driver.
//!
//! ## Who writes what
//!
//! ```text
//!  every replica (engine, every report_every = min(probe.interval, lease_ttl / 3)):
//!    one transaction: replicas.seen_at = now()            "alive; my unchanged results
//!                     upsert probe_results that changed     are current as of now"
//!                     delete rows of targets it no longer probes
//!                     read the live replicas (seen within lease_ttl)  -> its Shard
//!  the leader, in the same transaction, also reads every live replica's results
//!    -> per target due (its probe interval): agree() over its assigned probers
//!    -> Op::Observe into the guard (logged, fenced, as any decision), a disputed
//!       pass when one of them sees it failing, Op::Doubt when they agree on nothing
//!  the scheduler probes only the targets the Shard gives this replica
//! ```
//!
//! A result row is written only when its outcome changes (pass to fail, or another
//! set of failing checks), so 10,000 healthy targets cost each replica one small
//! transaction per report, not 10,000 rows per interval. A result is current as of the
//! later of its change and its prober's last report, each stamped with when the report
//! was *composed* on the database's clock (estimated from the replica's last answer,
//! never later than the truth), not when it arrived: a report that waited in a cut
//! connection, a paused process or a busy store thread would otherwise make passes
//! from before a failure look fresh (`controller_chaos` found that: a prober cut off
//! for seconds made its old pass current on reconnecting, and the target, acted on
//! already, "recovered" and was acted on again). The leader reads ages on the
//! database's clock, adding the time since its report was composed, so replicas'
//! clocks never meet and no age is younger than the truth.

use crate::config::TargetConfig;
use crate::store::{MemberRow, ProbeResultRow, ReplicaReport, ReplicaState, StoredResult};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use vigil_core::fleet::{DissentTally, tally_dissent};
use vigil_core::guard::Observation;
use vigil_core::shard::{Report, Shard, agree, fresh_for, heard};

/// The quickest a replica reports, whatever its probe interval: twenty small
/// transactions a second per replica is the most a store should see from probing.
const MIN_REPORT_EVERY: Duration = Duration::from_millis(50);

/// What this replica probes, as the scheduler and the API see it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Probing {
    /// This replica's id.
    pub replica: String,
    /// The live replicas and how many probe each target; None: this process alone
    /// probes every target (SQLite).
    #[serde(skip)]
    pub shard: Option<Shard>,
    /// The live replicas as the store last answered (empty until it has).
    pub members: Vec<MemberRow>,
}

impl Probing {
    /// A process alone: it probes everything.
    pub fn alone(replica: String) -> Probing {
        Probing {
            replica,
            shard: None,
            members: Vec::new(),
        }
    }

    /// Whether this replica probes `target`. Heartbeat targets are judged by every
    /// replica from the heartbeats it receives (not sharded).
    pub fn probes(&self, target: &TargetConfig) -> bool {
        target.heartbeat
            || self
                .shard
                .as_ref()
                .is_none_or(|s| s.assigned(&target.id, &self.replica))
    }
}

/// What the leader's probers say of a target due for a verdict (the engine's
/// composition, in vigil-core).
pub use vigil_core::fleet::Judged;

/// The engine's part of sharded probing (several replicas on PostgreSQL).
pub struct Sharding {
    replica: String,
    probers: usize,
    member_ttl: Duration,
    report_every: Duration,
    tx: watch::Sender<Arc<Probing>>,
    shard: Shard,
    /// What this replica last wrote (or will write) per target: (ok, observation).
    written: HashMap<Arc<str>, (bool, Option<String>)>,
    /// Changes not yet in the store: a row to upsert, or None to remove.
    pending: BTreeMap<Arc<str>, Option<ProbeResultRow>>,
    first: bool,
    /// When the next report is due.
    pub next_report: Instant,
    /// The leader's reading: results by target, and the database's now when read.
    results: HashMap<String, Vec<StoredResult>>,
    now_ms: i64,
    /// The last answer: its database now (UNIX ms) and when it arrived here, from
    /// which a report's `as_of_ms` is estimated (never later than the truth).
    anchor: Option<(i64, Instant)>,
    /// When the report in flight was composed.
    composed: Instant,
    /// The leader's next evaluation of each target.
    due: HashMap<Arc<str>, Instant>,
    /// Per prober, since the last `take_dissent`: (failed alone, fresh results).
    dissent: DissentTally,
    error_logged: bool,
}

impl Sharding {
    /// This replica's sharding, publishing what it probes on `tx`.
    pub fn new(
        replica: String,
        probers: usize,
        member_ttl: Duration,
        probe_interval: Duration,
        tx: watch::Sender<Arc<Probing>>,
    ) -> Sharding {
        let shard = Shard::new([replica.clone()], probers);
        tx.send_replace(Arc::new(Probing {
            replica: replica.clone(),
            shard: Some(shard.clone()),
            members: Vec::new(),
        }));
        Sharding {
            report_every: probe_interval.min(member_ttl / 3).max(MIN_REPORT_EVERY),
            replica,
            probers,
            member_ttl,
            tx,
            shard,
            written: HashMap::new(),
            pending: BTreeMap::new(),
            first: true,
            next_report: Instant::now(),
            results: HashMap::new(),
            now_ms: 0,
            anchor: None,
            composed: Instant::now(),
            due: HashMap::new(),
            dissent: DissentTally::new(),
            error_logged: false,
        }
    }

    /// A reloaded config's number of probers per target.
    pub fn set_probers(&mut self, probers: usize) {
        self.probers = probers;
    }

    /// A probe of `id` finished: queued for the store if its outcome changed (and the
    /// target is still this replica's: a probe in flight across a membership change
    /// is dropped). A heartbeat target (`heartbeat`) is every replica's: each judges
    /// the heartbeats it receives itself.
    pub fn record(&mut self, id: &Arc<str>, obs: &Observation, heartbeat: bool) {
        if !heartbeat && !self.shard.assigned(id, &self.replica) {
            return;
        }
        let ok = obs.is_ok();
        let observation =
            (!ok).then(|| serde_json::to_string(obs).expect("observations serialise"));
        if self
            .written
            .get(id)
            .is_some_and(|w| w.0 == ok && w.1 == observation)
        {
            return;
        }
        self.written.insert(id.clone(), (ok, observation.clone()));
        self.pending.insert(
            id.clone(),
            Some(ProbeResultRow {
                target: id.to_string(),
                ok,
                observation,
            }),
        );
    }

    /// Targets that are gone, or no longer this replica's: their rows go. `kind` says
    /// whether a target exists, and whether it is a heartbeat target (every replica's).
    fn drop_unassigned(&mut self, kind: &dyn Fn(&str) -> Option<bool>) {
        let gone: Vec<Arc<str>> = self
            .written
            .keys()
            .filter(|id| match kind(id) {
                None => true,
                Some(heartbeat) => !heartbeat && !self.shard.assigned(id, &self.replica),
            })
            .cloned()
            .collect();
        for id in gone {
            self.written.remove(&id);
            self.pending.insert(id, None);
        }
    }

    /// The report to send now (`leading`: with everyone's results back).
    /// `kind` says whether a target exists, and whether it is a heartbeat target
    /// (every replica's).
    ///
    /// The report says as of when its results hold on the database's clock (see
    /// `ReplicaReport::as_of_ms`); until this replica has heard the store once it
    /// carries no results, which wait for the next report.
    pub fn report(&mut self, leading: bool, kind: &dyn Fn(&str) -> Option<bool>) -> ReplicaReport {
        let now = Instant::now();
        self.next_report = now + self.report_every;
        self.composed = now;
        self.drop_unassigned(kind);
        let as_of_ms = self.anchor.map(|(db_ms, at)| {
            db_ms.saturating_add(
                i64::try_from(now.saturating_duration_since(at).as_millis()).unwrap_or(i64::MAX),
            )
        });
        let mut upserts = Vec::new();
        let mut removed = Vec::new();
        if as_of_ms.is_some() {
            for (id, row) in std::mem::take(&mut self.pending) {
                match row {
                    Some(r) => upserts.push(r),
                    None => removed.push(id.to_string()),
                }
            }
        }
        ReplicaReport {
            as_of_ms,
            replica: self.replica.clone(),
            first: self.first,
            upserts,
            removed,
            member_ttl: self.member_ttl,
            read_results: leading,
        }
    }

    /// The report failed: what it carried is sent with the next one (newer changes
    /// of the same target win).
    pub fn failed(&mut self, report: ReplicaReport, error: &dyn std::fmt::Display) {
        if !self.error_logged {
            tracing::error!(error = %error, "probe results cannot be reported to the store; retrying (the leader judges this replica's targets stale meanwhile)");
            self.error_logged = true;
        }
        for r in report.upserts {
            self.pending
                .entry(Arc::from(r.target.as_str()))
                .or_insert(Some(r));
        }
        for t in report.removed {
            self.pending.entry(Arc::from(t.as_str())).or_insert(None);
        }
    }

    /// The store answered a report. Returns whether the live membership changed.
    pub fn answered(&mut self, state: ReplicaState, leading: bool) -> bool {
        if self.error_logged {
            tracing::info!("probe results reach the store again");
            self.error_logged = false;
        }
        self.first = false;
        self.now_ms = state.now_ms;
        self.anchor = Some((state.now_ms, Instant::now()));
        self.results.clear();
        if leading {
            for r in state.results {
                self.results.entry(r.target.clone()).or_default().push(r);
            }
        }
        let shard = Shard::new(state.members.iter().map(|m| m.id.clone()), self.probers);
        let changed = shard != self.shard;
        if changed {
            tracing::info!(replicas = ?shard.members(), probers = self.probers, "probing membership changed: targets are shared anew");
            self.shard = shard.clone();
        }
        self.tx.send_if_modified(|p| {
            let new = Probing {
                replica: self.replica.clone(),
                shard: Some(shard),
                members: state.members,
            };
            if **p == new {
                return false;
            }
            *p = Arc::new(new);
            true
        });
        changed
    }

    /// Every target is due for a verdict now (a new term starts judging).
    pub fn all_due(&mut self) {
        self.due.clear();
    }

    /// The leader's verdict on `id` (zone `zone`, probed every `interval` with
    /// `timeout`) if one is due now: the observation to feed the guard when its
    /// probers agree on one (disputed when one of them sees it failing), or doubt when
    /// they do not. Not due again before `interval`.
    ///
    /// A heartbeat target (`heartbeat`) is judged by every live replica, each from the
    /// heartbeats it received (a worker sends to one address, which may lead to any
    /// replica): one fresh pass is a pass, and a replica that heard nothing disputes
    /// nothing; it fails only when every live replica says it heard no heartbeat.
    pub fn verdict(
        &mut self,
        id: &Arc<str>,
        zone: &str,
        interval: Duration,
        timeout: Duration,
        heartbeat: bool,
        now: Instant,
    ) -> Option<Judged> {
        if self.due.get(id).is_some_and(|d| *d > now) {
            return None;
        }
        self.due.insert(id.clone(), now + interval);
        let probers: Vec<&str> = if heartbeat {
            self.shard.members().iter().map(String::as_str).collect()
        } else {
            self.shard.probers_of(id)
        };
        let rows = self.results.get(&**id);
        let find = |p: &str| rows.and_then(|rs| rs.iter().find(|r| r.replica == p));
        let reports: Vec<Option<Report>> =
            probers.iter().map(|p| self.report_of(id, p, now)).collect();
        let fresh = fresh_for(interval, timeout);
        if !heartbeat {
            tally_dissent(&mut self.dissent, &probers, &reports, fresh);
        }
        let judge = if heartbeat { heard } else { agree };
        Some(Judged::of(judge(&reports, fresh), id, zone, || {
            probers.iter().find_map(|p| {
                find(p)
                    .and_then(|r| r.observation.as_deref())
                    .and_then(|o| serde_json::from_str(o).ok())
            })
        }))
    }

    /// The tally since the last call, per live replica: (targets it failed alone
    /// while another prober passed them, targets it had a fresh result for), counted as
    /// [`Sharding::verdict`] judges the probed targets (each once per its interval); see
    /// `vigil_core::shard::dissenting`. A replica that fails most of its targets alone
    /// is likely cut off from them.
    pub fn take_dissent(&mut self) -> BTreeMap<String, (u32, u32)> {
        let mut out: BTreeMap<String, (u32, u32)> = self
            .shard
            .members()
            .iter()
            .map(|m| (m.clone(), (0, 0)))
            .collect();
        for (replica, counts) in std::mem::take(&mut self.dissent) {
            if let Some(c) = out.get_mut(&replica) {
                *c = counts;
            }
        }
        out
    }

    /// Prober `p`'s latest result for target `id` as the leader last read it, aged as
    /// of `now` and never younger than the truth: the database's now was read after
    /// this replica's report was composed, so the time since then is added whole.
    fn report_of(&self, id: &str, p: &str, now: Instant) -> Option<Report> {
        let r = self.results.get(id)?.iter().find(|r| r.replica == p)?;
        Some(Report {
            failing: !r.ok,
            age: Duration::from_millis(
                u64::try_from(self.now_ms.saturating_sub(r.as_of_ms)).unwrap_or(0),
            ) + now.saturating_duration_since(self.composed),
        })
    }

    /// Forgets the evaluation times of targets that are gone.
    pub fn retain(&mut self, exists: impl Fn(&str) -> bool) {
        self.due.retain(|id, _| exists(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{MemberRow, ReplicaState, StoredResult};

    const NOW_MS: i64 = 1_000_000;

    fn result(target: &str, replica: &str, ok: bool, age_ms: i64) -> StoredResult {
        StoredResult {
            target: target.into(),
            replica: replica.into(),
            ok,
            observation: None,
            as_of_ms: NOW_MS - age_ms,
        }
    }

    /// Replica r0's sharding: 2 probers per target, a 2 s TTL, 500 ms probes.
    fn sharding() -> Sharding {
        let (tx, _rx) = watch::channel(Arc::new(Probing::alone("r0".into())));
        Sharding::new(
            "r0".into(),
            2,
            Duration::from_secs(2),
            Duration::from_millis(500),
            tx,
        )
    }

    /// The store's answer at NOW_MS: these live members, these results.
    fn answer(members: &[&str], results: Vec<StoredResult>) -> ReplicaState {
        ReplicaState {
            now_ms: NOW_MS,
            members: members
                .iter()
                .map(|id| MemberRow {
                    id: (*id).into(),
                    since_ms: 0,
                    seen_ms: NOW_MS,
                })
                .collect(),
            results,
        }
    }

    /// The leader r0's judgement of t1, probed by r0 and r1 whose results are these.
    fn judged(results: Vec<StoredResult>) -> Option<Judged> {
        judged_as(results, false)
    }

    /// `judged`, t1 a heartbeat target (`heartbeat`) or a probed one.
    fn judged_as(results: Vec<StoredResult>, heartbeat: bool) -> Option<Judged> {
        let mut sh = sharding();
        sh.answered(answer(&["r0", "r1"], results), true);
        let id: Arc<str> = Arc::from("t1");
        let (i, t) = (Duration::from_millis(500), Duration::from_secs(1));
        let first = sh.verdict(&id, "a", i, t, heartbeat, Instant::now());
        assert_eq!(
            sh.verdict(&id, "a", i, t, heartbeat, Instant::now()),
            None,
            "not due again before its interval"
        );
        first
    }

    #[test]
    fn the_leader_doubts_what_its_probers_do_not_agree_on() {
        let pass = Judged::Seen(Observation::pass("t1", "a"));
        assert_eq!(
            judged(vec![
                result("t1", "r0", true, 100),
                result("t1", "r1", true, 100)
            ]),
            Some(pass.clone())
        );
        // One prober fails it: still a pass (it served someone), disputed.
        assert_eq!(
            judged(vec![
                result("t1", "r0", true, 100),
                result("t1", "r1", false, 100)
            ]),
            Some(Judged::Seen(Observation::pass("t1", "a").disputed()))
        );
        // Both fail it: a failure.
        assert_eq!(
            judged(vec![
                result("t1", "r0", false, 100),
                result("t1", "r1", false, 100)
            ]),
            Some(Judged::Seen(Observation::endpoint_failure("t1", "a")))
        );
        // A fresh failure beside a silent prober, or nothing fresh: in doubt.
        assert_eq!(
            judged(vec![result("t1", "r0", false, 100)]),
            Some(Judged::InDoubt)
        );
        assert_eq!(
            judged(vec![
                result("t1", "r0", true, 60_000),
                result("t1", "r1", true, 60_000)
            ]),
            Some(Judged::InDoubt)
        );
        assert_eq!(judged(Vec::new()), Some(Judged::InDoubt));
    }

    #[test]
    fn a_report_says_as_of_when_it_was_composed_on_the_databases_clock() {
        let mut sh = sharding();
        let id: Arc<str> = Arc::from("t1");
        sh.record(&id, &Observation::pass("t1", "a"), false);
        let kind = |_: &str| Some(false);
        // Nothing heard yet: no clock to stamp results with, so none are sent.
        let first = sh.report(false, &kind);
        assert_eq!(first.as_of_ms, None);
        assert!(first.upserts.is_empty(), "{:?}", first.upserts);
        sh.answered(answer(&["r0"], Vec::new()), false);
        let before = Instant::now();
        let second = sh.report(false, &kind);
        let waited = i64::try_from(before.elapsed().as_millis()).unwrap();
        let as_of = second.as_of_ms.expect("stamped once the store answered");
        assert!(
            (NOW_MS..=NOW_MS + waited + 1).contains(&as_of),
            "{as_of} vs {NOW_MS}"
        );
        assert_eq!(second.upserts.len(), 1, "the held result goes now");
    }

    #[test]
    fn the_leader_finds_a_replica_that_fails_alone_what_others_pass() {
        let mut sh = sharding();
        let shard = Shard::new(["r0", "r1", "r2"], 2);
        let targets: Vec<String> = (0..12).map(|i| format!("t{i}")).collect();
        // r1 fails every target it probes; their other probers pass them. t0 also
        // fails for its other prober: a real failure, not a dissent.
        let mut results = Vec::new();
        for t in &targets {
            for p in shard.probers_of(t) {
                let ok = p != "r1" && t != "t0";
                results.push(result(t, p, ok, 100));
            }
        }
        sh.answered(answer(&["r0", "r1", "r2"], results), true);
        let (i, timeout) = (Duration::from_millis(500), Duration::from_secs(1));
        for t in &targets {
            let id: Arc<str> = Arc::from(t.as_str());
            assert!(
                sh.verdict(&id, "a", i, timeout, false, Instant::now())
                    .is_some()
            );
        }
        let tally = sh.take_dissent();
        let r1_share = targets.iter().filter(|t| shard.assigned(t, "r1")).count() as u32;
        let r1_real = u32::from(shard.assigned("t0", "r1"));
        assert_eq!(tally["r1"], (r1_share - r1_real, r1_share), "{tally:?}");
        assert_eq!(tally["r0"].0, 0, "{tally:?}");
        assert_eq!(tally["r2"].0, 0, "{tally:?}");
        assert!(tally["r0"].1 > 0 && tally["r2"].1 > 0, "{tally:?}");
        assert_eq!(sh.take_dissent()["r1"], (0, 0), "taken: counted afresh");
    }

    #[test]
    fn a_heartbeat_heard_by_one_replica_is_a_pass_nobody_disputes() {
        // The worker beats to r1 only: r0 heard nothing, which disputes nothing.
        assert_eq!(
            judged_as(
                vec![
                    result("t1", "r0", false, 100),
                    result("t1", "r1", true, 100)
                ],
                true
            ),
            Some(Judged::Seen(Observation::pass("t1", "a")))
        );
        // Nobody heard it: a failure.
        assert_eq!(
            judged_as(
                vec![
                    result("t1", "r0", false, 100),
                    result("t1", "r1", false, 100)
                ],
                true
            ),
            Some(Judged::Seen(Observation::endpoint_failure("t1", "a")))
        );
        // One replica has not said yet: no verdict.
        assert_eq!(
            judged_as(vec![result("t1", "r0", false, 100)], true),
            Some(Judged::InDoubt)
        );
    }
}
