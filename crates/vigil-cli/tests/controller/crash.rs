//! SIGKILL the controller again and again at arbitrary moments while it is acting:
//! the store must open cleanly every time, and no action may be lost or run without
//! being recorded (a re-run after a crash is counted in `attempts` and carries the same
//! idempotency key).

use crate::controller_support;

use controller_support::*;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use vigil_core::Status;

/// A small deterministic generator for kill moments (no rand dependency needed here).
struct Lcg(u64);

impl Lcg {
    fn next_ms(&mut self, lo: u64, hi: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        lo + (self.0 >> 33) % (hi - lo)
    }
}

#[test]
fn heavy_sigkill_at_random_moments_never_loses_or_duplicates_actions() {
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran.log");
    let bs = backends(10);
    // A generous budget and no freeze, so actions happen often; a slow exec (200 ms)
    // widens the window between "intended" and "done" that a kill can hit.
    let cfg = base_config(&format!(
        r#"
[actuator]
kind = "exec"
[actuator.exec]
command = ["sh", "-c", "echo $VIGIL_IDEMPOTENCY_KEY >> {}; sleep 0.2"]
"#,
        ran.display()
    ))
    .replace("actions = 2", "actions = 1000")
    .replace(
        "min_failing = \"1s\"",
        "min_failing = \"300ms\"\nmax_unhealthy_fraction = 1.0",
    ) + "[guard.thresholds]\nunhealthy_threshold = 2\nhealthy_threshold = 1\n"
        + "[guard.damping]\npenalty = 1\n"
        + &targets_toml(&bs);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        // Rotate a failure through the fleet: each target fails ~0.9 s, then heals.
        s.spawn(|| {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                bs[i % 10].set_check("disk:free", Status::Fail);
                std::thread::sleep(Duration::from_millis(900));
                bs[i % 10].clear_checks();
                i += 1;
            }
        });
        let rt = tokio::runtime::Runtime::new().unwrap();
        let mut rng = Lcg(0x5eed);
        std::fs::write(dir.path().join("fleet.toml"), &cfg).unwrap();
        for round in 0..8 {
            let c = Controller::start_existing(dir.path());
            assert!(
                c.logs().contains("guard recovered"),
                "round {round}: {}",
                c.logs()
            );
            std::thread::sleep(Duration::from_millis(rng.next_ms(300, 2500)));
            c.sigkill();
        }
        stop.store(true, Ordering::Relaxed);
        let c = Controller::start_existing(dir.path());
        for b in &bs {
            b.clear_checks();
        }
        let actions = rt.block_on(c.wait_for("every action finished", || async {
            let a = c.actions().await;
            a.iter().all(|a| a["state"] == "done").then_some(a)
        }));
        assert!(
            actions.len() >= 3,
            "the scenario must act: {} actions",
            actions.len()
        );
        let text = std::fs::read_to_string(&ran).unwrap_or_default();
        let mut runs: BTreeMap<&str, i64> = BTreeMap::new();
        for line in text.lines().filter(|l| !l.is_empty()) {
            *runs.entry(line).or_default() += 1;
        }
        let recorded: BTreeMap<&str, i64> = actions
            .iter()
            .map(|a| {
                (
                    a["idempotency_key"].as_str().unwrap(),
                    a["attempts"].as_i64().unwrap(),
                )
            })
            .collect();
        for (key, n) in &runs {
            let attempts = recorded
                .get(key)
                .unwrap_or_else(|| panic!("action {key} ran but is not in the store"));
            assert!(
                n <= attempts,
                "action {key} ran {n} times but only {attempts} attempts were recorded"
            );
        }
        let reruns = recorded.values().filter(|&&a| a > 1).count();
        eprintln!(
            "{} actions, {} re-run after a crash, {} runs in all",
            recorded.len(),
            reruns,
            runs.values().sum::<i64>()
        );
        for key in recorded.keys() {
            assert!(runs.contains_key(key), "action {key} is done but never ran");
        }
        drop(c);
    });
}
