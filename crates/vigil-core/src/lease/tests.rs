//! Scenarios first, then a model of several replicas and the store under random
//! pauses, crashes, partitions and slow answers.

use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

const TTL: Duration = Duration::from_secs(1);

fn ms(n: u64) -> Time {
    Time::from_millis(n)
}

#[test]
fn a_follower_asks_at_once_and_a_grant_makes_it_lead_until_its_local_deadline() {
    let mut l = LeaderLease::new(LeaseConfig::new(TTL), ms(0));
    let r = l.poll(ms(0)).expect("a follower asks at once");
    assert_eq!(r.renew, None);
    assert_eq!(l.poll(ms(1)), None, "one request at a time");
    assert_eq!(l.next_wake(), None, "a follower waits for its answer");
    assert_eq!(
        l.answer(ms(50), StoreReply::Granted(7)),
        Some(Change::Promoted(7))
    );
    assert_eq!(l.leading(ms(50)), Some(7));
    assert_eq!(
        l.next_wake(),
        Some(Time::from_elapsed(TTL / 3)),
        "the renewal comes before the deadline"
    );
    // Trusted from the send: 0 + 1000 - 200.
    assert_eq!(l.leading(ms(799)), Some(7));
    assert_eq!(l.leading(ms(800)), None);
    assert_eq!(l.tick(ms(800)), Some(Change::Demoted(7)));
}

#[test]
fn a_leader_renews_at_a_third_of_the_ttl_and_keeps_its_epoch() {
    let mut l = LeaderLease::new(LeaseConfig::new(TTL), ms(0));
    l.poll(ms(0));
    l.answer(ms(10), StoreReply::Granted(1));
    assert_eq!(l.poll(ms(300)), None);
    assert_eq!(l.poll(ms(333)), None, "due at 333.3 ms");
    let r = l.poll(ms(334)).expect("renewal due");
    assert_eq!(r.renew, Some(1));
    assert_eq!(l.answer(ms(340), StoreReply::Granted(1)), None, "same term");
    assert_eq!(l.leading(ms(1133)), Some(1), "deadline moved to 334 + 800");
    assert_eq!(l.leading(ms(1134)), None);
}

#[test]
fn a_slow_grant_promotes_nobody_and_a_failed_renewal_demotes_at_the_deadline() {
    let mut l = LeaderLease::new(LeaseConfig::new(TTL), ms(0));
    l.poll(ms(0));
    assert_eq!(
        l.answer(ms(900), StoreReply::Granted(1)),
        None,
        "past 0 + 800"
    );
    assert_eq!(l.leading(ms(900)), None);
    l.poll(ms(900)).expect("asks again at once");
    l.answer(ms(910), StoreReply::Granted(2));
    l.poll(ms(1234)).expect("renewal due");
    assert_eq!(l.answer(ms(1240), StoreReply::Failed), None);
    assert_eq!(l.leading(ms(1240)), Some(2), "still inside its term");
    assert!(l.poll(ms(1500)).is_none(), "retry not due yet");
    l.poll(ms(1574))
        .expect("retry a third of the TTL (under a second) after the failure");
    l.answer(ms(1600), StoreReply::Failed);
    assert_eq!(l.tick(ms(1700)), Some(Change::Demoted(2)), "900 + 800");
}

#[test]
fn told_the_lease_is_held_a_leader_steps_down_at_once_and_resigning_returns_the_epoch() {
    let mut l = LeaderLease::new(LeaseConfig::new(TTL), ms(0));
    l.poll(ms(0));
    l.answer(ms(1), StoreReply::Granted(3));
    l.poll(ms(334)).expect("renewal due");
    assert_eq!(
        l.answer(ms(335), StoreReply::Held),
        Some(Change::Demoted(3))
    );
    assert_eq!(l.leading(ms(335)), None);
    l.poll(ms(669)).expect("a follower asks again");
    assert_eq!(
        l.answer(ms(670), StoreReply::Granted(4)),
        Some(Change::Promoted(4))
    );
    assert_eq!(l.resign(), Some(4));
    assert_eq!(l.leading(ms(671)), None);
}

#[test]
fn the_defaults_fit_two_renewals_before_the_deadline() {
    LeaseConfig::new(DEFAULT_TTL).validate().unwrap();
    LeaseConfig::new(TTL).validate().unwrap();
    let mut c = LeaseConfig::new(TTL);
    c.renew_every = Duration::from_millis(500);
    assert_eq!(c.validate().unwrap_err().key, "renew_every");
}

// === the model ===

/// A fault, at a time, on one replica.
#[derive(Clone, Debug)]
enum Fault {
    /// The process stops (SIGSTOP, a GC, a VM migration) for this long; its monotonic
    /// clock keeps running.
    Pause(u64),
    /// The process dies and restarts after this long, knowing nothing.
    Crash(u64),
    /// Its requests and answers are lost for this long.
    Partition(u64),
    /// Its next request takes this long each way.
    Slow(u64),
}

fn fault() -> impl Strategy<Value = Fault> {
    let ttl = TTL.as_millis() as u64;
    prop_oneof![
        (0..=3 * ttl).prop_map(Fault::Pause),
        (0..=3 * ttl).prop_map(Fault::Crash),
        (0..=3 * ttl).prop_map(Fault::Partition),
        (0..=ttl).prop_map(Fault::Slow),
    ]
}

const REPLICAS: usize = 3;
const STEP: u64 = 25;
const FAULTS_UNTIL: u64 = 20_000;
const RUN_UNTIL: u64 = FAULTS_UNTIL + 3 * 1000 + 6_000;
/// Latency of a request each way when nothing is wrong.
const LATENCY: u64 = 5;

#[derive(Default)]
struct Db {
    holder: usize,
    epoch: u64,
    expires: u64,
    /// Decision id -> who applied it under which epoch.
    applied: BTreeMap<u64, (usize, u64)>,
}

impl Db {
    /// The one statement: renew (holder and epoch, unexpired) or acquire (expired).
    fn try_lease(&mut self, now: u64, who: usize, renew: Option<u64>) -> StoreReply {
        let ttl = TTL.as_millis() as u64;
        let live = self.epoch > 0 && self.expires > now;
        if live && self.holder == who && renew == Some(self.epoch) {
            self.expires = now + ttl;
            StoreReply::Granted(self.epoch)
        } else if !live {
            self.epoch += 1;
            self.holder = who;
            self.expires = now + ttl;
            StoreReply::Granted(self.epoch)
        } else {
            StoreReply::Held
        }
    }
}

struct InFlight {
    renew: Option<u64>,
    apply_at: u64,
    answer_at: u64,
    reached: bool,
    answer: Option<StoreReply>,
}

struct Replica {
    lease: LeaderLease,
    offset: u64,
    paused_until: u64,
    down_until: Option<u64>,
    cut_until: u64,
    slow: Option<u64>,
    request: Option<InFlight>,
    /// The next decision this leader makes (read from the store when promoted).
    next_decision: u64,
    /// Decided under an epoch, not yet committed.
    decided: Option<(u64, u64)>,
}

impl Replica {
    fn new(offset: u64, now: u64) -> Replica {
        Replica {
            lease: LeaderLease::new(LeaseConfig::new(TTL), Time::from_millis(offset + now)),
            offset,
            paused_until: 0,
            down_until: None,
            cut_until: 0,
            slow: None,
            request: None,
            next_decision: 0,
            decided: None,
        }
    }

    fn local(&self, t: u64) -> Time {
        Time::from_millis(self.offset + t)
    }
}

struct Outcome {
    commits: usize,
    fenced: usize,
    leader_at_end: bool,
}

fn run(faults: &[(u64, usize, Fault)], offsets: [u64; REPLICAS]) -> Result<Outcome, TestCaseError> {
    let mut db = Db::default();
    let mut rs: Vec<Replica> = offsets.iter().map(|&o| Replica::new(o, 0)).collect();
    let mut faults: Vec<_> = faults.to_vec();
    faults.sort_by_key(|f| f.0);
    let mut next_fault = 0;
    let (mut commits, mut fenced) = (0, 0);
    // Epoch -> replicas that acted (committed) under it, and that believed they led.
    let mut actors: BTreeMap<u64, std::collections::BTreeSet<usize>> = BTreeMap::new();
    let mut t = 0;
    while t <= RUN_UNTIL {
        while next_fault < faults.len() && faults[next_fault].0 <= t {
            let (_, i, f) = &faults[next_fault];
            let r = &mut rs[*i];
            match *f {
                Fault::Pause(d) => r.paused_until = r.paused_until.max(t + d),
                Fault::Crash(d) => r.down_until = Some(t + d),
                Fault::Partition(d) => r.cut_until = r.cut_until.max(t + d),
                Fault::Slow(d) => r.slow = Some(d),
            }
            next_fault += 1;
        }
        // By index: a replica's step reads the store and the others' requests.
        #[allow(clippy::needless_range_loop)]
        for i in 0..REPLICAS {
            // The store applies a request that reached it, whatever its sender does.
            let cut = rs[i].cut_until;
            if let Some(req) = &mut rs[i].request
                && req.answer.is_none()
                && req.apply_at <= t
            {
                req.reached = t >= cut;
                if req.reached {
                    req.answer = Some(db.try_lease(t, i, req.renew));
                }
            }
            let r = &mut rs[i];
            if let Some(up) = r.down_until {
                if t < up {
                    r.request = None;
                    continue;
                }
                *r = Replica::new(r.offset + up, t);
                r.down_until = None;
            }
            if t < r.paused_until {
                continue;
            }
            let now = r.local(t);
            // A decision taken before a pause is committed after it: the fence decides.
            if let Some((epoch, d)) = r.decided.take() {
                if db.holder == i && db.epoch == epoch {
                    prop_assert!(
                        db.applied.insert(d, (i, epoch)).is_none(),
                        "decision {d} applied twice (second by {i} under epoch {epoch})"
                    );
                    actors.entry(epoch).or_default().insert(i);
                    commits += 1;
                    r.next_decision = d + 1;
                } else {
                    fenced += 1;
                }
            }
            if let Some(req) = &r.request
                && req.answer_at <= t
            {
                let lost = t < r.cut_until;
                let answer = match (&req.answer, lost) {
                    (Some(a), false) => a.clone(),
                    _ => StoreReply::Failed,
                };
                r.request = None;
                if let Some(Change::Promoted(_)) = r.lease.answer(now, answer) {
                    // Reload: continue from what the store holds.
                    r.next_decision = db.applied.len() as u64;
                }
            }
            r.lease.tick(now);
            if let Some(e) = r.lease.leading(now) {
                // Belief is safe: the store's lease is this replica's, at this epoch,
                // and unexpired, at this very moment.
                prop_assert!(
                    db.holder == i && db.epoch == e && db.expires > t,
                    "replica {i} believes it leads at epoch {e} at {t} ms; the store says {} at epoch {} until {}",
                    db.holder,
                    db.epoch,
                    db.expires
                );
                r.decided = Some((e, r.next_decision));
            }
            if let Some(req) = r.lease.poll(now) {
                let lat = r.slow.take().unwrap_or(LATENCY);
                r.request = Some(InFlight {
                    renew: req.renew,
                    apply_at: t + lat,
                    answer_at: t + 2 * lat,
                    reached: false,
                    answer: None,
                });
                if t < r.cut_until {
                    // Never reaches the store; the driver's timeout answers it.
                    let timeout = TTL.as_millis() as u64 / 2;
                    let req = r.request.as_mut().expect("just set");
                    req.apply_at = u64::MAX;
                    req.answer_at = t + timeout;
                }
            }
        }
        t += STEP;
    }
    for (epoch, who) in &actors {
        prop_assert!(who.len() <= 1, "epoch {epoch} acted on by {who:?}");
    }
    let ids: Vec<u64> = db.applied.keys().copied().collect();
    prop_assert_eq!(
        ids,
        (0..db.applied.len() as u64).collect::<Vec<_>>(),
        "no gap: each leader continued from the store"
    );
    let end = RUN_UNTIL;
    let leader_at_end = rs.iter().any(|r| r.lease.leading(r.local(end)).is_some());
    Ok(Outcome {
        commits,
        fenced,
        leader_at_end,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// At most one replica acts per epoch, each decision is applied at most once, a
    /// replica that believes it leads is the store's holder at that moment, and once
    /// faults stop a leader is back.
    #[test]
    fn at_most_one_leader_acts_per_epoch_under_pauses_crashes_and_partitions(
        faults in proptest::collection::vec((0..FAULTS_UNTIL, 0..REPLICAS, fault()), 0..40),
        offsets in proptest::array::uniform3(0u64..1_000_000),
    ) {
        let out = run(&faults, offsets)?;
        prop_assert!(out.leader_at_end, "no leader {} ms after the last fault", RUN_UNTIL - FAULTS_UNTIL);
        prop_assert!(out.commits > 0);
        let _ = out.fenced;
    }
}

#[test]
fn a_leader_paused_past_its_term_is_fenced_when_it_wakes() {
    // Replica 0 leads, decides, and is paused for 3 TTL before its commit.
    let out = run(&[(2_000, 0, Fault::Pause(3_000))], [0, 10, 20]).unwrap();
    assert!(
        out.fenced >= 1,
        "the stale commit must be refused by the fence"
    );
    assert!(out.leader_at_end);
}
