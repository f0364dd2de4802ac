use super::*;
use proptest::prelude::*;
use std::collections::BTreeSet;

const FRESH: Duration = Duration::from_secs(3);

fn r(failing: bool, age_ms: u64) -> Option<Report> {
    Some(Report {
        failing,
        age: Duration::from_millis(age_ms),
    })
}

fn members(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("vigil-{i}")).collect()
}

fn pairs(shard: &Shard, targets: &[String]) -> BTreeSet<(String, String)> {
    targets
        .iter()
        .flat_map(|t| {
            shard
                .probers_of(t)
                .into_iter()
                .map(move |m| (t.clone(), m.to_string()))
        })
        .collect()
}

#[test]
fn the_weight_is_stable_across_builds() {
    // Replicas built apart must agree: these values are the hash's contract (rule 2),
    // checked against an independent implementation (a Python one-liner).
    assert_eq!(weight("", ""), GOLDEN_EMPTY);
    assert_eq!(weight("t0", "r0"), GOLDEN_T0_R0);
    assert_ne!(weight("ab", "c"), weight("a", "bc"), "the separator counts");
}

const GOLDEN_EMPTY: u64 = 5_705_415_379_283_624_141;
const GOLDEN_T0_R0: u64 = 8_486_078_666_278_672_312;

#[test]
fn one_partitioned_prober_cannot_make_a_target_fail_alone() {
    // One fresh failure, one fresh pass: it served someone (a pass, in doubt).
    assert_eq!(agree(&[r(true, 10), r(false, 10)], FRESH), Agreement::Split);
    assert!(Agreement::Split.passes());
    assert_eq!(
        agree(&[r(false, 10), r(false, 2999)], FRESH),
        Agreement::Passing
    );
    // A stale failure beside a fresh pass does not dispute it.
    assert_eq!(
        agree(&[r(true, 5000), r(false, 10)], FRESH),
        Agreement::Passing
    );
    // One fresh failure, the other prober stale or silent: no verdict.
    assert_eq!(
        agree(&[r(true, 10), r(false, 5000)], FRESH),
        Agreement::Undecided
    );
    assert_eq!(
        agree(&[r(true, 10), r(true, 5000)], FRESH),
        Agreement::Undecided
    );
    assert_eq!(agree(&[r(true, 10), None], FRESH), Agreement::Undecided);
    // Both fresh and failing: failing.
    assert_eq!(
        agree(&[r(true, 10), r(true, 3000)], FRESH),
        Agreement::Failing
    );
    // Nothing fresh, or nobody assigned: no verdict.
    assert_eq!(agree(&[r(false, 3001), None], FRESH), Agreement::Undecided);
    assert_eq!(agree(&[], FRESH), Agreement::Undecided);
    // A single live replica decides alone.
    assert_eq!(agree(&[r(true, 0)], FRESH), Agreement::Failing);
}

#[test]
fn a_prober_failing_what_another_passes_dissents() {
    let f = Duration::from_secs(3);
    assert_eq!(dissenting(&[r(true, 100), r(false, 100)], f), [0]);
    assert_eq!(
        dissenting(&[r(false, 100), r(true, 100), r(true, 100)], f),
        [1, 2]
    );
    // Both failing, both passing, or the pass stale: nobody dissents.
    assert!(dissenting(&[r(true, 100), r(true, 100)], f).is_empty());
    assert!(dissenting(&[r(false, 100), r(false, 100)], f).is_empty());
    assert!(dissenting(&[r(true, 100), r(false, 60_000)], f).is_empty());
    // A stale failure beside a pass: not a dissent either.
    assert!(dissenting(&[r(true, 60_000), r(false, 100)], f).is_empty());
    assert!(dissenting(&[r(true, 100), None], f).is_empty());
}

#[test]
fn a_heartbeat_heard_by_one_replica_is_an_undisputed_pass() {
    assert_eq!(
        heard(&[r(true, 10), r(false, 10)], FRESH),
        Agreement::Passing
    );
    assert_eq!(
        heard(&[r(true, 10), r(true, 10)], FRESH),
        Agreement::Failing
    );
    assert_eq!(heard(&[r(true, 10), None], FRESH), Agreement::Undecided);
}

#[test]
fn fresh_is_two_intervals_a_timeout_and_a_second() {
    assert_eq!(
        fresh_for(Duration::from_secs(10), Duration::from_secs(2)),
        Duration::from_secs(23)
    );
}

#[test]
fn a_shard_of_fewer_members_than_probers_gives_every_target_to_all() {
    let s = Shard::new(["b", "a", "a"], 3);
    assert_eq!(s.members(), ["a", "b"]);
    let mut p = s.probers_of("t");
    p.sort();
    assert_eq!(p, ["a", "b"]);
    assert!(
        Shard::new(Vec::<String>::new(), 2)
            .probers_of("t")
            .is_empty()
    );
}

proptest! {
    #[test]
    fn each_target_gets_min_r_n_distinct_replicas(n in 1usize..12, r in 1usize..5, t in "[a-z0-9.:-]{0,24}") {
        let s = Shard::new(members(n), r);
        let p = s.probers_of(&t);
        prop_assert_eq!(p.len(), r.min(n));
        let distinct: BTreeSet<_> = p.iter().collect();
        prop_assert_eq!(distinct.len(), p.len(), "distinct replicas");
        // The same answer from a member list in another order.
        let mut shuffled = members(n);
        shuffled.reverse();
        let other = Shard::new(shuffled, r);
        prop_assert_eq!(other.probers_of(&t), p);
    }

}

proptest! {
    // Each case hashes thousands of pairs: fewer cases keep the debug build quick.
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn a_replica_joining_or_leaving_moves_about_r_over_n_of_the_targets(n in 2usize..10, r in 1usize..4, seed in 0u32..1000) {
        let targets: Vec<String> = (0..1000).map(|i| format!("10.{seed}.{}.{}:8080", i / 256, i % 256)).collect();
        let before = Shard::new(members(n), r);
        // Join: only targets that gained the new replica change, and about r/(n+1) do.
        let joined = Shard::new(members(n + 1), r);
        let newcomer = format!("vigil-{n}");
        let mut changed = 0usize;
        for t in &targets {
            let (a, b) = (before.probers_of(t), joined.probers_of(t));
            let (a, b): (BTreeSet<_>, BTreeSet<_>) = (a.into_iter().collect(), b.into_iter().collect());
            if a != b {
                changed += 1;
                prop_assert!(b.contains(newcomer.as_str()), "a target changed without the newcomer: {a:?} -> {b:?}");
                // One slot moves (none while there were fewer replicas than probers: a slot is added).
                prop_assert_eq!(a.difference(&b).count(), usize::from(n >= r), "one slot moves");
            }
        }
        let expected = r.min(n + 1) as f64 / (n + 1) as f64;
        let fraction = changed as f64 / targets.len() as f64;
        prop_assert!(fraction < 2.0 * expected, "join moved {fraction:.3} of targets, expected about {expected:.3}");
        // Leave: only targets the leaver probed change, each by one slot.
        let left = Shard::new(members(n + 1).into_iter().filter(|m| m != "vigil-0"), r);
        let before = joined;
        let moved = pairs(&before, &targets).difference(&pairs(&left, &targets)).count();
        let held_by_leaver = pairs(&before, &targets).iter().filter(|(_, m)| m == "vigil-0").count();
        prop_assert_eq!(moved, held_by_leaver, "only the leaver's slots move");
        let fraction = held_by_leaver as f64 / targets.len() as f64;
        let expected = r.min(n + 1) as f64 / (n + 1) as f64;
        prop_assert!(fraction < 2.0 * expected, "leave moved {fraction:.3} of targets, expected about {expected:.3}");
    }

    #[test]
    fn agreement_fails_only_when_every_assigned_prober_fails_freshly_and_a_disputed_pass_is_split(reports in proptest::collection::vec(proptest::option::of((any::<bool>(), 0u64..6000)), 0..4)) {
        let reports: Vec<Option<Report>> = reports.into_iter().map(|o| o.and_then(|(f, a)| r(f, a))).collect();
        let verdict = agree(&reports, FRESH);
        let fresh_fail = |x: &Option<Report>| x.is_some_and(|x| x.failing && x.age <= FRESH);
        if verdict == Agreement::Failing {
            prop_assert!(!reports.is_empty() && reports.iter().all(fresh_fail));
        }
        let fresh_pass = |x: &Option<Report>| x.is_some_and(|x| !x.failing && x.age <= FRESH);
        if reports.iter().any(fresh_pass) {
            prop_assert!(verdict.passes(), "{:?}", verdict);
            let disputed = reports.iter().any(fresh_fail);
            prop_assert_eq!(verdict == Agreement::Split, disputed);
        } else {
            prop_assert!(!verdict.passes(), "{:?}", verdict);
        }
    }
}
