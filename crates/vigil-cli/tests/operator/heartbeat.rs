//! Issue 34: a heartbeat target is not judged before its TTL. Silence is evidence only
//! once `heartbeat.ttl` has passed since the controller knew the target; with
//! `grace = "0s"` a target that never sent a heartbeat used to be acted on 0.6 s after
//! start although its TTL was an hour.

use crate::controller_support;

use controller_support::*;
use std::time::{Duration, Instant};

/// The TTL of the test: long enough to look at the target well inside it, short enough
/// to see it judged after.
const TTL: Duration = Duration::from_secs(6);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_heartbeat_target_is_pending_until_its_first_ttl_has_passed() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = base_config(&format!(
        "[heartbeat]\nttl = \"{}s\"\nsecret = \"{HEARTBEAT_SECRET}\"\n",
        TTL.as_secs()
    )) + &(1..=4)
        .map(|i| format!("[[targets]]\nid = \"w{i}\"\nheartbeat = true\nzone = \"a\"\n"))
        .collect::<String>();
    let started = Instant::now();
    let c = Controller::start(dir.path(), &cfg);
    let beat_others = || async {
        for id in ["w2", "w3", "w4"] {
            let key = heartbeat_key(HEARTBEAT_SECRET, id);
            assert_eq!(c.beat(&Beat::signed(id, None, &key)).await, 202);
        }
    };
    // Well inside the TTL (200 ms probes: ten and more rounds), w1 has not been judged:
    // no failing probe, no decision, no action.
    while started.elapsed() < TTL / 2 {
        beat_others().await;
        let t = c.get("/api/targets/w1").await;
        let last = &t["target"]["last_probe"];
        assert!(
            last.is_null() || last["ok"] == true,
            "silence within the first TTL is no evidence, yet w1 was judged: {t}"
        );
        assert!(
            !matches!(
                t["target"]["state"].as_str(),
                Some("unhealthy" | "reported" | "failing")
            ),
            "w1 must be pending within its first TTL: {t}"
        );
        assert!(
            c.decisions().await.is_empty(),
            "nothing decided within the TTL"
        );
        assert!(
            c.actions().await.is_empty(),
            "nothing acted on within the TTL"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Past the TTL, silence counts: w1 fails, saying since when it has been silent.
    let c = &c;
    let detail = c
        .wait_for("w1 judged failing after its TTL", || async {
            beat_others().await;
            let t = c.get("/api/targets/w1").await;
            let detail = t["target"]["last_probe"]["detail"].as_str()?.to_string();
            (t["target"]["last_probe"]["ok"] == false).then_some(detail)
        })
        .await;
    assert!(
        started.elapsed() > TTL,
        "judged only once the TTL had passed"
    );
    assert!(
        detail.contains("no heartbeat received in the") && detail.contains("ttl 6s"),
        "the detail says how long it was silent, against which TTL: {detail}"
    );
}
