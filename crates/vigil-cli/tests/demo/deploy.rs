//! End-to-end: `vigil demo`'s rollouts. `u` rolls v2 out to the six services with
//! `vigil deploy` (three waves of two, one zone at a time, drained at the demo's
//! balancer): every service ends on v2, reported by its own health answer. `e` rolls a
//! broken v3-bad out: its first wave reports back failing, it is rolled back and marked
//! bad, no second wave ever starts, every service is back on v2. The demo's traffic
//! through the balancer loses no request in either.

use crate::demo_support;

use demo_support::{Narration, get_json, said, spawn_demo, wait_until};
use std::io::Write;
use std::time::{Duration, Instant};

// A port block away from the other demo tests' (17800, 17900, 18000, 18100).
const BASE: u16 = 18300;
const SERVICES: u16 = 6;
const DEADLINE: Duration = Duration::from_secs(90);

/// The revision each service reports in its health answer (`releaseId`).
async fn revisions() -> Vec<Option<String>> {
    let mut out = Vec::new();
    for i in 0..SERVICES {
        let health = BASE + 4 + 2 * i;
        out.push(
            get_json(&format!("http://127.0.0.1:{health}/health"))
                .await
                .and_then(|v| v["releaseId"].as_str().map(str::to_string)),
        );
    }
    out
}

fn lines(narration: &Narration, needle: &str) -> Vec<String> {
    narration
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(needle))
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_demo_deploys_a_good_revision_in_waves_and_rolls_a_bad_one_back() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--base-port",
        &BASE.to_string(),
        "--services",
        &SERVICES.to_string(),
        "--rps",
        "20",
        "--data-dir",
        &dir.path().display().to_string(),
        "--db",
        "postgres://nobody@127.0.0.1:1/none",
        "--no-queue",
    ]
    .map(String::from);
    let (mut demo, mut stdin, narration) = spawn_demo(&args);
    let mut key = |k: &str| {
        println!("[test] key {k}");
        writeln!(stdin, "{k}").unwrap();
    };
    let all_on = |rev: &'static str| async move {
        revisions().await.iter().all(|r| r.as_deref() == Some(rev))
    };
    wait_until("every service up on v1", DEADLINE, || all_on("v1")).await;

    key("u");
    wait_until("the rollout of v2 completes", DEADLINE, || async {
        said(&narration, &["deploy: completed: every host runs v2"])
    })
    .await;
    assert!(all_on("v2").await, "{:?}", revisions().await);
    let waves = lines(&narration, "deploy: wave ");
    for n in 1..=3 {
        assert!(
            waves.iter().any(|l| l.contains(&format!("wave {n} of v2"))),
            "{waves:?}"
        );
    }

    key("e");
    wait_until("v3-bad is rolled back", DEADLINE, || async {
        said(
            &narration,
            &["deploy: rolled back: every host that got v3-bad runs its previous revision"],
        )
    })
    .await;
    let why = lines(&narration, "did not report back with revision v3-bad");
    assert!(
        why.iter().any(|l| l.contains("marked bad")),
        "the narration says why: {why:?}"
    );
    let bad_waves = lines(&narration, "of v3-bad:");
    assert_eq!(
        bad_waves.len(),
        1,
        "halted in its first wave: {bad_waves:?}"
    );
    wait_until("every service back on v2", DEADLINE, || all_on("v2")).await;

    key("q");
    let deadline = Instant::now() + DEADLINE;
    while demo.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the demo did not stop on q");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let traffic = lines(&narration, "demo: traffic through the balancer:");
    assert!(
        traffic.len() == 1 && traffic[0].contains(" 0 errors"),
        "no client error through both rollouts: {traffic:?}"
    );
}
