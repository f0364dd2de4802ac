//! `vigil controller` actuators as real processes: a webhook receiver that checks the
//! HMAC signature and the idempotency key, an exec command that sees the target.

use crate::controller_support;

use controller_support::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use vigil_core::Status;

#[derive(Clone, Debug)]
struct Received {
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
}

/// A tiny HTTP/1.1 receiver on loopback: answers 500 to the first `fail_first`
/// requests, 200 after, and keeps every request.
fn receiver(fail_first: usize) -> (String, Arc<Mutex<Vec<Received>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/replace", listener.local_addr().unwrap());
    let got = Arc::new(Mutex::new(Vec::new()));
    let sink = got.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let Some(vigil_testkit::RawRequest { headers, body, .. }) =
                vigil_testkit::read_request(&mut reader).unwrap()
            else {
                continue;
            };
            let n = {
                let mut g = sink.lock().unwrap();
                g.push(Received { headers, body });
                g.len()
            };
            let status = if n <= fail_first {
                "500 Internal Server Error"
            } else {
                "200 OK"
            };
            let _ = stream.write_all(
                format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .as_bytes(),
            );
        }
    });
    (url, got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_is_signed_retried_with_the_same_idempotency_key() {
    let dir = tempfile::tempdir().unwrap();
    let bs = backends(5);
    let (url, got) = receiver(1);
    let cfg = base_config(&format!(
        "[actuator]\nkind = \"webhook\"\n[actuator.webhook]\nurl = \"{url}\"\nsecret = \"s3cret\"\nbackoff = \"50ms\"\n"
    )) + &targets_toml(&bs);
    let c = Controller::start(dir.path(), &cfg);
    c.wait_all(5, "healthy").await;
    bs[2].set_check("fd:open", Status::Fail);
    let action = c
        .wait_for("the action done", || async {
            c.actions().await.into_iter().find(|a| a["state"] == "done")
        })
        .await;
    assert!(
        action["result"].as_str().unwrap().contains("attempt 2"),
        "retried after the 500: {action}"
    );
    let got = got.lock().unwrap().clone();
    assert_eq!(got.len(), 2, "one failure, one success");
    assert_eq!(got[0].body, got[1].body, "a retry sends the same body");
    let key = &got[0].headers["idempotency-key"];
    assert_eq!(key, &got[1].headers["idempotency-key"], "and the same key");
    assert_eq!(key, action["idempotency_key"].as_str().unwrap());
    for r in &got {
        let sig = &r.headers["x-vigil-signature"];
        assert_eq!(
            sig,
            &vigil_controller::actuator::sign(b"s3cret", &r.body),
            "HMAC-SHA256 over the exact body"
        );
        assert_ne!(sig, &vigil_controller::actuator::sign(b"other", &r.body));
    }
    let event: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(event["target"], "t2");
    assert_eq!(event["idempotency_key"], key.as_str());
    assert!(
        event["summary"]
            .as_str()
            .unwrap()
            .contains("local check fd:open failed")
    );
    assert_eq!(c.actions().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_runs_the_command_with_the_target_in_its_environment() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("exec.out");
    let bs = backends(5);
    let cfg = base_config(&format!(
        "[actuator]\nkind = \"exec\"\n[actuator.exec]\ncommand = [\"sh\", \"-c\", \"echo \\\"$VIGIL_TARGET_ID $VIGIL_TARGET_ZONE $VIGIL_TARGET_URL $VIGIL_IDEMPOTENCY_KEY\\\" >> {}\"]\n",
        out.display()
    )) + &targets_toml(&bs);
    let c = Controller::start(dir.path(), &cfg);
    c.wait_all(5, "healthy").await;
    bs[1].set_check("memory:used", Status::Fail);
    let action = c
        .wait_for("the action done", || async {
            c.actions().await.into_iter().find(|a| a["state"] == "done")
        })
        .await;
    let text = std::fs::read_to_string(&out).unwrap();
    let key = action["idempotency_key"].as_str().unwrap();
    assert_eq!(
        text.trim(),
        format!("t1 a http://{} {key}", bs[1].addr()),
        "the command saw the target"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_stuck_webhook_exits_cleanly_and_the_action_resumes_after() {
    let dir = tempfile::tempdir().unwrap();
    let bs = backends(5);
    // Nothing listens on port 1: every attempt fails, with long backoffs in between.
    let cfg = base_config(
        "[actuator]\nkind = \"webhook\"\n[actuator.webhook]\nurl = \"http://127.0.0.1:1/\"\nsecret = \"s\"\nretries = 100\nbackoff = \"2s\"\n",
    ) + &targets_toml(&bs);
    let c = Controller::start(dir.path(), &cfg);
    c.wait_all(5, "healthy").await;
    bs[0].set_check("disk:free", Status::Fail);
    c.wait_for("an action attempted", || async {
        c.actions()
            .await
            .iter()
            .any(|a| a["state"] == "intended" && a["attempts"] == 1)
            .then_some(())
    })
    .await;
    let status = tokio::task::spawn_blocking(move || c.sigterm())
        .await
        .unwrap();
    assert!(
        status.success(),
        "SIGTERM must exit 0 even with an action stuck: {status}"
    );
    let c = Controller::start_existing(dir.path());
    c.wait_for("the action resumed", || async {
        c.logs()
            .contains("resuming an action left intended by the last run")
            .then_some(())
    })
    .await;
    let a = c.actions().await;
    assert_eq!(a.len(), 1, "resumed, not duplicated: {a:#?}");
}

/// How long the guard has been frozen, by its metric.
async fn frozen_seconds(c: &Controller) -> f64 {
    sample(
        &c.metrics_text().await,
        "vigil_controller_guard_frozen_seconds",
    )
    .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_freeze_sends_one_signed_alert_through_the_webhook_even_across_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let bs = backends(5);
    let (url, got) = receiver(0);
    let cfg = base_config(&format!(
        "[guard.frozen]\nalert_after = \"1s\"\n[actuator]\nkind = \"webhook\"\n[actuator.webhook]\nurl = \"{url}\"\nsecret = \"s3cret\"\nbackoff = \"50ms\"\n"
    )) + &targets_toml(&bs);
    let c = Controller::start(dir.path(), &cfg);
    c.wait_all(5, "healthy").await;
    // 3 of 5 fail at once: above the 30% cap, the fleet freezes and nobody is replaced.
    for b in &bs[..3] {
        b.set_check("disk:free", Status::Fail);
    }
    let alert = c
        .wait_for("the alert delivered", || async {
            c.actions()
                .await
                .into_iter()
                .find(|a| a["state"] == "done" && a["event"]["kind"] == "alert")
        })
        .await;
    assert!(
        alert["result"]
            .as_str()
            .unwrap()
            .contains("webhook answered 200"),
        "{alert}"
    );
    // Frozen for three times `alert_after` now: one alert per freeze, not one per period.
    c.wait_for("frozen for 3 s", || async {
        (frozen_seconds(&c).await >= 3.0).then_some(())
    })
    .await;
    let received = got.lock().unwrap().clone();
    assert_eq!(
        received.len(),
        1,
        "one alert, and no replacement: {:?}",
        received
            .iter()
            .map(|r| String::from_utf8_lossy(&r.body).into_owned())
            .collect::<Vec<_>>()
    );
    let r = &received[0];
    assert_eq!(
        r.headers["x-vigil-signature"],
        vigil_controller::actuator::sign(b"s3cret", &r.body)
    );
    let event: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(event["kind"], "alert", "{event}");
    assert_eq!(event["scope"], "fleet", "{event}");
    assert_eq!(event["target"], "", "an alert names no target: {event}");
    assert_eq!(event["when_frozen"], "hold", "{event}");
    assert_eq!(event["idempotency_key"], alert["idempotency_key"]);
    assert!(
        event["summary"].as_str().unwrap().contains("disk:free"),
        "the alert says what fails: {event}"
    );
    assert!(
        c.actions()
            .await
            .iter()
            .all(|a| a["event"]["kind"] == "alert"),
        "nobody replaced while frozen"
    );
    let m = c.metrics_text().await;
    assert_eq!(
        sample(&m, "vigil_controller_decisions_total{outcome=\"alert\"}"),
        Some(1.0),
        "{m}"
    );
    // A crash and a restart while still frozen: the alert was raised for this freeze
    // and is not sent again.
    c.sigkill();
    let c = Controller::start_existing(dir.path());
    c.wait_for("frozen again for 2 s after the restart", || async {
        (frozen_seconds(&c).await >= 2.0).then_some(())
    })
    .await;
    assert_eq!(
        got.lock().unwrap().len(),
        1,
        "no second alert after a restart"
    );
    assert!(c.sigterm().success());
}
