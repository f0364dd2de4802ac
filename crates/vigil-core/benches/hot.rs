//! Micro-benchmarks of the pure functions on the hot paths: a regression in time per call
//! shows here in seconds, without a full proxy run (`bench/lb/run.sh`, which measures the
//! balancer beside HAProxy and nginx, stays the judge of the whole).
//!
//! - `http1::parse_request`: once per request the balancer reads;
//! - `RoutingSet::pick_p2c`: once per request it routes (a pool of 16, 4 of them skipped
//!   as already tried);
//! - `SafetyGuard::observe`: once per probe result the controller feeds it (a fleet of 1,000
//!   in 3 zones, a passing probe and a failing one).
//!
//! Run: `cargo bench -p vigil-core --bench hot` (add `-- --quick` for a short run).

// criterion_group! and criterion_main! generate undocumented public functions.
#![allow(missing_docs)]

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use std::mem::MaybeUninit;
use std::time::Duration;
use vigil_core::Time;
use vigil_core::guard::{GuardConfig, Observation, SafetyGuard};
use vigil_core::http1::{MAX_HEADERS, parse_request};
use vigil_core::pool::{Pool, PoolConfig, TargetSpec};

const REQUEST: &[u8] = b"GET /api/v1/orders/12345?expand=items HTTP/1.1\r\n\
Host: api.example.com\r\n\
User-Agent: wrk/4.2\r\n\
Accept: application/json\r\n\
Accept-Encoding: gzip, br\r\n\
Connection: keep-alive\r\n\
X-Request-Id: 5b0e3c9a-8d1f-4f7e-9a51-0c2d7f1e6b42\r\n\r\n";

fn parse(c: &mut Criterion) {
    c.bench_function("http1::parse_request (7 fields)", |b| {
        b.iter(|| {
            let mut fields = [const { MaybeUninit::uninit() }; MAX_HEADERS];
            let parsed = parse_request(black_box(REQUEST), &mut fields);
            black_box(parsed.map(|p| p.map(|(head, f)| (head.method.len(), f.len()))))
        })
    });
}

fn pick(c: &mut Criterion) {
    let mut pool = Pool::new("bench", PoolConfig::default());
    for i in 0..16u32 {
        pool.add_target(i, TargetSpec::default(), Time::ZERO);
    }
    // Healthy after their first passing checks, past slow start.
    for j in 0..5u64 {
        for i in 0..16u32 {
            pool.observe_probe(&i, Time::from_secs(j), true, "bench");
        }
    }
    let now = Time::from_secs(120);
    let set = pool.routing_set(now);
    assert_eq!(set.len(), 16, "every target routable");
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    c.bench_function("RoutingSet::pick_p2c (16 targets, 4 skipped)", |b| {
        b.iter(|| {
            // xorshift: two fresh random numbers per pick, as the balancer draws them.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let r = [x, x.rotate_left(32)];
            black_box(set.pick_p2c(now, r, |k| u64::from(*k % 5), |k| *k % 4 == 0))
        })
    });
}

fn observe(c: &mut Criterion) {
    let mut guard = SafetyGuard::new(GuardConfig::default());
    let zones = ["zone-a", "zone-b", "zone-c"];
    let ids: Vec<String> = (0..1000).map(|i| format!("web-{i:04}")).collect();
    for (i, id) in ids.iter().enumerate() {
        guard.add_target(Time::ZERO, id, zones[i % 3]);
    }
    let mut now = Time::from_secs(600);
    let mut i = 0usize;
    let pass: Vec<Observation> = ids
        .iter()
        .enumerate()
        .map(|(n, id)| Observation::pass(id.clone(), zones[n % 3]))
        .collect();
    c.bench_function("SafetyGuard::observe (1,000 targets, passing)", |b| {
        b.iter(|| {
            now = now + Duration::from_millis(10);
            i = (i + 1) % pass.len();
            black_box(guard.observe(now, &pass[i]))
        })
    });
    let fail = Observation {
        target: ids[7].clone(),
        zone: zones[7 % 3].to_string(),
        endpoint_failed: false,
        failing_checks: vec!["disk:utilization".to_string()],
        disputed: false,
    };
    c.bench_function("SafetyGuard::observe (1,000 targets, one failing)", |b| {
        b.iter(|| {
            now = now + Duration::from_millis(10);
            black_box(guard.observe(now, &fail))
        })
    });
}

criterion_group! {
    name = hot;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = parse, pick, observe
}
criterion_main!(hot);
