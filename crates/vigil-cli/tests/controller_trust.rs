//! `vigil controller` as a real process against input it must not trust: forged
//! heartbeats, hostile API clients, hostile target ids. Real HTTP on loopback, real
//! SQLite, the real binary.

mod controller_support;

use controller_support::*;
use serde_json::{Value, json};
use std::time::Duration;

fn heartbeat_config(ttl: &str) -> String {
    base_config(&format!(
        "[heartbeat]\nttl = \"{ttl}\"\nsecret = \"{HEARTBEAT_SECRET}\"\nmax_skew = \"5s\"\n"
    )) + "[[targets]]\nid = \"w1\"\nheartbeat = true\n[[targets]]\nid = \"w2\"\nheartbeat = true\n"
}

fn passing() -> Value {
    json!({"status": "pass", "checks": {"disk:free": [{"status": "pass"}]}})
}

fn failing() -> Value {
    json!({"status": "fail", "checks": {"disk:free": [{"status": "fail", "output": "forged"}]}})
}

/// Waits a millisecond, so two heartbeats signed one after the other have distinct
/// timestamps (a second one in the same millisecond is a replay).
async fn next_ms() {
    tokio::time::sleep(Duration::from_millis(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_stale_and_replayed_heartbeats_change_nothing_and_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::start(dir.path(), &heartbeat_config("3s"));
    let k1 = heartbeat_key(HEARTBEAT_SECRET, "w1");
    let k2 = heartbeat_key(HEARTBEAT_SECRET, "w2");
    let legit = |id: &'static str, key: String| {
        let c = &c;
        async move {
            next_ms().await;
            let code = c.beat(&Beat::signed(id, Some(passing()), &key)).await;
            assert_eq!(code, 202, "a heartbeat signed with {id}'s key is accepted");
        }
    };
    c.wait_for("w1 and w2 healthy on signed heartbeats", || async {
        legit("w1", k1.clone()).await;
        legit("w2", k2.clone()).await;
        let t = c.targets().await;
        (t.len() == 2 && t.iter().all(|t| t["state"] == "healthy")).then_some(())
    })
    .await;
    let since = now_ms();

    // Forged failing reports for w1, between w1's own passing heartbeats: each would be
    // the latest heartbeat for ~100 ms, over a 200 ms probe interval, if it counted.
    const ROUNDS: usize = 20;
    for _ in 0..ROUNDS {
        let now = now_ms();
        let forgeries = [
            ("unsigned", Beat::unsigned("w1", Some(failing()))),
            (
                "signed with the master secret itself",
                Beat::signed("w1", Some(failing()), HEARTBEAT_SECRET),
            ),
            (
                "signed with w2's key",
                Beat::signed("w1", Some(failing()), &k2),
            ),
            ("garbage signature", {
                let mut b = Beat::unsigned("w1", Some(failing()));
                b.signed = Some((now, "sha256=zz".into()));
                b
            }),
            (
                "a minute old",
                Beat::signed_at("w1", Some(failing()), &k1, now - 60_000),
            ),
            (
                "a minute ahead",
                Beat::signed_at("w1", Some(failing()), &k1, now + 60_000),
            ),
        ];
        for (what, beat) in &forgeries {
            assert_eq!(c.beat(beat).await, 401, "heartbeat {what} must be refused");
        }
        // A heartbeat of w1's own, delivered, then sent again: a replay.
        next_ms().await;
        let delivered = Beat::signed("w1", Some(failing()), &k1);
        let mut replay_of_passing = Beat::signed("w1", Some(passing()), &k1);
        assert_eq!(c.beat(&replay_of_passing).await, 202);
        assert_eq!(
            c.beat(&replay_of_passing).await,
            401,
            "the same heartbeat twice"
        );
        // Older than the last accepted (signed before it, delivered after).
        assert_eq!(c.beat(&delivered).await, 401, "an older heartbeat");
        replay_of_passing.body = replay_of_passing.body.replace("pass", "fail");
        assert_eq!(c.beat(&replay_of_passing).await, 401, "a tampered body");
        tokio::time::sleep(Duration::from_millis(100)).await;
        legit("w1", k1.clone()).await;
        legit("w2", k2.clone()).await;
    }
    let w1 = c.get("/api/targets/w1").await;
    assert_eq!(w1["target"]["state"], "healthy", "{w1}");
    let history = w1["target"]["history"].as_array().unwrap();
    assert!(
        history
            .iter()
            .filter(|p| p["at_ms"].as_i64().unwrap() > since)
            .all(|p| p["ok"] == true),
        "no forged report reached the guard: {history:#?}"
    );
    assert!(
        w1["transitions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["at_ms"].as_i64().unwrap() > since)
            .all(|t| t["to"] != "failing"),
        "w1 never failed: {w1}"
    );
    assert!(c.decisions().await.is_empty());
    let m = c.metrics_text().await;
    let count = |result: &str| {
        sample(
            &m,
            &format!("vigil_controller_heartbeats_total{{result=\"{result}\"}}"),
        )
        .unwrap_or(0.0) as usize
    };
    assert_eq!(count("unsigned"), ROUNDS, "{m}");
    assert_eq!(count("bad_signature"), 4 * ROUNDS, "{m}");
    assert_eq!(count("stale"), 2 * ROUNDS, "{m}");
    assert_eq!(count("replayed"), 2 * ROUNDS, "{m}");
    assert!(count("accepted") >= 3 * ROUNDS, "{m}");

    // Passing forgeries cannot keep a silent worker in service: w2 stops, a forger
    // speaks for it, and it fails on its heartbeat TTL all the same.
    c.wait_for(
        "w2 unhealthy despite unsigned passing heartbeats",
        || async {
            assert_eq!(c.beat(&Beat::unsigned("w2", Some(passing()))).await, 401);
            legit("w1", k1.clone()).await;
            let t = c.get("/api/targets/w2").await["target"].clone();
            matches!(t["state"].as_str(), Some("unhealthy" | "reported")).then_some(())
        },
    )
    .await;
}
