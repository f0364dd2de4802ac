//! Queue workers judged by their peers, end to end: real `vigil::worker::Worker`s send
//! their counters with the library's signed heartbeats to a real `vigil controller`,
//! which compares each worker with the others of its group (`vigil_core::anomaly`) and
//! acts on a black hole through the safety guard, and on nobody when they all fail.

use crate::controller_support;

use controller_support::*;
use serde_json::Value;
use std::time::Duration;
use vigil::heartbeat::{self, HeartbeatConfig};
use vigil::worker::Worker;
use vigil_core::gate::GateConfig;

const WORKERS: usize = 5;

/// Heartbeat targets w0..w4 in group `workers`; a short anomaly window so the test
/// judges in seconds.
fn config() -> String {
    config_window("6s")
}

/// [`config`] with an anomaly window of `window`.
fn config_window(window: &str) -> String {
    let mut c = base_config(&format!(
        "[heartbeat]\nttl = \"3s\"\nsecret = \"{HEARTBEAT_SECRET}\"\nmax_skew = \"5s\"\n\
         [anomaly]\nwindow = \"{window}\"\nbucket = \"1s\"\nmin_volume = 20\n"
    ));
    for i in 0..WORKERS {
        c += &format!("[[targets]]\nid = \"w{i}\"\nheartbeat = true\ngroup = \"workers\"\n");
    }
    c
}

/// A worker whose local kill switch is out of the way (it would pause a worker failing
/// everything by itself): what is tested here is the fleet-relative detection alone.
fn gate() -> GateConfig {
    let mut g = GateConfig::default();
    g.kill_switch.min_messages = u64::MAX;
    g
}

struct Fleet {
    workers: Vec<Worker>,
    _health: vigil::Health,
    _beats: Vec<heartbeat::Heartbeats>,
}

async fn fleet(c: &Controller) -> Fleet {
    fleet_gated(c, gate()).await
}

/// [`fleet`] with the workers' gates set by `gate`.
async fn fleet_gated(c: &Controller, gate: GateConfig) -> Fleet {
    let health = vigil::Health::builder().start();
    let mut workers = Vec::new();
    let mut beats = Vec::new();
    for i in 0..WORKERS {
        let id = format!("w{i}");
        let w = Worker::start(id.clone(), &health, gate.clone());
        let mut hb = HeartbeatConfig::new(
            format!("http://{}", c.addr),
            id.clone(),
            heartbeat_key(HEARTBEAT_SECRET, &id),
        );
        hb.every = Duration::from_millis(200);
        beats.push(heartbeat::start(&health, Some(w.clone()), hb).expect("heartbeats start"));
        workers.push(w);
    }
    Fleet {
        workers,
        _health: health,
        _beats: beats,
    }
}

/// The detail of a target's latest record (its standing among its peers, for a worker).
async fn last_detail(c: &Controller, id: &str) -> String {
    let t: Value = c.get(&format!("/api/targets/{id}")).await;
    t["target"]["history"]
        .as_array()
        .and_then(|h| h.last())
        .and_then(|r| r["detail"].as_str())
        .unwrap_or("")
        .to_string()
}

/// One round of ten messages per worker: `fails(worker, message)` says which fail.
fn round(f: &Fleet, n: u64, fails: impl Fn(usize, u64) -> bool) {
    for (i, w) in f.workers.iter().enumerate() {
        for m in 0..10 {
            let t = w.begin();
            if fails(i, n * 10 + m) {
                let _ = w.failed(t, &[]);
            } else {
                w.succeeded(t);
            }
        }
    }
}

/// Feeds rounds every 100 ms until `done` returns Some (bounded by the helper's
/// deadline).
async fn feed_until<T>(
    c: &Controller,
    f: &Fleet,
    what: &str,
    fails: impl Fn(usize, u64) -> bool,
    done: impl AsyncFn() -> Option<T>,
) -> T {
    let mut n = 0;
    c.wait_for(what, || {
        round(f, n, &fails);
        n += 1;
        async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            done().await
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_hole_worker_is_found_by_its_peers_and_replaced_once() {
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::start(dir.path(), &config());
    let f = fleet(&c).await;
    c.wait_all(WORKERS, "healthy").await;
    // w3 fails every message; its peers one in fifty (2%).
    let fails = |i: usize, m: u64| i == 3 || m.is_multiple_of(50);
    let action = feed_until(&c, &f, "an action on the black hole", fails, async || {
        c.actions().await.into_iter().next()
    })
    .await;
    assert_eq!(action["target"], "w3", "{action}");
    let event = &action["event"];
    assert_eq!(event["peers"]["finding"]["kind"], "outlier", "{event}");
    assert_eq!(event["peers"]["peers"]["count"], 4, "{event}");
    let summary = event["summary"].as_str().unwrap();
    assert!(
        summary.contains("worker:failure_rate") && summary.contains("100.0% failed"),
        "the decision explains itself with the comparison: {summary}"
    );
    // The dashboard lists the workers, the black hole first with its rate beside its
    // group's.
    let page = reqwest::get(c.url("/"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let row = page
        .find("data-worker=\"w3\"")
        .map(|i| &page[i..page[i..].find("</tr>").map_or(page.len(), |e| i + e)])
        .unwrap_or_else(|| panic!("the dashboard lists the black hole: {page}"));
    assert!(
        row.contains("data-outlier=\"true\"") && row.contains("100.0%"),
        "{row}"
    );
    assert!(
        page.find("data-worker=\"w3\"") < page.find("data-worker=\"w0\""),
        "outliers first"
    );
    // Its peers keep passing the comparison, and nobody else is acted on.
    feed_until(
        &c,
        &f,
        "w0's record shows its standing",
        fails,
        async || {
            let detail = last_detail(&c, "w0").await;
            detail.contains("vs 4 peers").then_some(())
        },
    )
    .await;
    let acts = c.actions().await;
    assert_eq!(
        acts.len(),
        1,
        "one action, on the black hole only: {acts:#?}"
    );
    assert!(c.sigterm().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_worker_fails_nobody_is_an_outlier_and_nobody_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::start(dir.path(), &config());
    let f = fleet(&c).await;
    c.wait_all(WORKERS, "healthy").await;
    // A dependency outage: every worker fails every message.
    let verdict = feed_until(
        &c,
        &f,
        "the comparison sees a shared failure",
        |_, _| true,
        async || {
            let detail = last_detail(&c, "w2").await;
            detail.contains("fail together").then_some(detail)
        },
    )
    .await;
    assert!(verdict.contains("a shared cause"), "{verdict}");
    // Judged for three more windows' worth of rounds: still nobody.
    let mut n = 0;
    c.wait_for("a further 3 s of rounds", || {
        round(&f, 1000 + n, |_, _| true);
        n += 1;
        async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            (n >= 30).then_some(())
        }
    })
    .await;
    assert!(
        c.actions().await.is_empty(),
        "a shared failure replaces no one"
    );
    let t = c.targets().await;
    assert!(
        t.iter().all(|t| t["state"] == "healthy"),
        "the workers' own health passes: {t:#?}"
    );
    assert!(c.sigterm().success());
}

/// The dashboard's row of worker `id` when it shows it as an outlier.
async fn outlier_row(c: &Controller, id: &str) -> Option<String> {
    let page = reqwest::get(c.url("/")).await.ok()?.text().await.ok()?;
    let i = page.find(&format!("data-worker=\"{id}\""))?;
    let row = &page[i..page[i..].find("</tr>").map_or(page.len(), |e| i + e)];
    row.contains("data-outlier=\"true\"")
        .then(|| row.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_controller_keeps_the_workers_comparison() {
    let dir = tempfile::tempdir().unwrap();
    // A window far longer than the restart takes.
    let c = Controller::start(dir.path(), &config_window("120s"));
    let f = fleet(&c).await;
    c.wait_all(WORKERS, "healthy").await;
    let fails = |i: usize, m: u64| i == 3 || m.is_multiple_of(50);
    feed_until(&c, &f, "w3 shown as an outlier", fails, async || {
        outlier_row(&c, "w3").await
    })
    .await;
    // The workers stop; the controller stops gracefully and starts again. Nothing
    // reaches the new one (the heartbeats went to the old one's address): what it shows
    // of the workers is what it kept, not what it saw again.
    drop(f);
    assert!(c.sigterm().success());
    let c = Controller::start_existing(dir.path());
    let row = c
        .wait_for(
            "the restarted controller shows w3 as an outlier",
            || async { outlier_row(&c, "w3").await },
        )
        .await;
    assert!(row.contains("100.0%"), "{row}");
    assert!(
        outlier_row(&c, "w0").await.is_none(),
        "its peers are no outliers after the restart either"
    );
    assert!(c.sigterm().success());
}

/// The shared outages `/api/guard` shows.
async fn shared_outages(c: &Controller) -> Vec<Value> {
    c.guard().await["shared_outages"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Worker gates whose kill switch trips after 20 messages and pauses for 10 s: long
/// enough to outlast the checks below, short enough to see the fleet pull again.
fn tripping_gate() -> GateConfig {
    let mut g = GateConfig::default();
    g.kill_switch.min_messages = 20;
    g.kill_switch.restart_after = Duration::from_secs(10);
    g
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_most_workers_pause_themselves_the_guard_shows_one_shared_outage() {
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::start(dir.path(), &config());
    let f = fleet_gated(&c, tripping_gate()).await;
    c.wait_all(WORKERS, "healthy").await;
    // Two of five fail everything: their kill switches pause them, each its own
    // problem as far as anyone can tell (2 of 5 is not most of the cohort).
    let two = |i: usize, _: u64| i == 3 || i == 4;
    let seen_at = feed_until(&c, &f, "w3 and w4 seen paused", two, async || {
        let t3 = last_record(&c, "w3").await;
        let t4 = last_record(&c, "w4").await;
        (t3["detail"].as_str()?.contains("paused: kill switch")
            && t4["detail"].as_str()?.contains("paused: kill switch"))
        .then(|| t3["at_ms"].as_i64().max(t4["at_ms"].as_i64()))
        .flatten()
    })
    .await;
    // A view published well after the engine saw both pauses (ticks are 1 s apart).
    feed_until(&c, &f, "a view 2 s after both pauses", two, async || {
        let g: Value = c.get("/api/guard").await;
        (g["now_ms"].as_i64()? > seen_at + 2000).then_some(())
    })
    .await;
    assert_eq!(
        shared_outages(&c).await,
        Vec::<Value>::new(),
        "2 of 5 paused is not shared"
    );
    // A third pauses: most of the cohort, one shared outage, although no check of
    // the controller fails (every worker's health passes).
    let three = |i: usize, _: u64| i == 0 || i == 3 || i == 4;
    let outage = feed_until(&c, &f, "a shared outage in /api/guard", three, async || {
        shared_outages(&c).await.into_iter().next()
    })
    .await;
    assert_eq!(outage["cohort"], "workers", "{outage}");
    assert_eq!(
        (outage["paused"].as_u64(), outage["of"].as_u64()),
        (Some(3), Some(5)),
        "{outage}"
    );
    assert_eq!(outage["reason"], "kill switch: 3", "{outage}");
    let ids: Vec<&str> = outage["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, ["w0", "w3", "w4"], "{outage}");
    assert!(
        outage["since_ms"].as_i64() >= Some(seen_at),
        "shared since the third paused: {outage}"
    );
    let summary = outage["summary"].as_str().unwrap();
    assert!(
        summary.starts_with("shared outage in cohort workers: 3 of 5 workers paused together"),
        "{summary}"
    );
    // (w3 and w4, two black holes among five, may be acted on as outliers: that is
    // the peer comparison's business.) w0 paused itself and no check of it fails.
    let t0: Value = c.get("/api/targets/w0").await;
    assert_eq!(t0["target"]["state"], "healthy", "{t0}");
    // The dashboard's guard card says it once, with each worker's own words.
    let page = reqwest::get(c.url("/"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let card = page
        .find("id=\"guard\"")
        .map(|i| &page[i..page[i..].find("</section>").map_or(page.len(), |e| i + e)])
        .unwrap_or_else(|| panic!("the guard card: {page}"));
    assert!(
        card.contains("data-cohort=\"workers\"") && card.contains(summary),
        "{card}"
    );
    assert!(
        card.contains("w0</strong>: paused: kill switch"),
        "each paused worker with its gate's state: {card}"
    );
    // Every worker succeeds again: the pauses end (10 s, then probation) and so does
    // the shared outage, said among the guard's events.
    feed_until(
        &c,
        &f,
        "the shared outage over",
        |_, _| false,
        async || shared_outages(&c).await.is_empty().then_some(()),
    )
    .await;
    let g: Value = c.get("/api/guard").await;
    let events: Vec<&str> = g["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["message"].as_str())
        .collect();
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("shared outage in cohort workers: 3 of 5"))
            && events.iter().any(|e| e.contains("cohort workers over")),
        "{events:?}"
    );
    assert!(c.sigterm().success());
}

/// A target's latest record.
async fn last_record(c: &Controller, id: &str) -> Value {
    let t: Value = c.get(&format!("/api/targets/{id}")).await;
    t["target"]["history"]
        .as_array()
        .and_then(|h| h.last())
        .cloned()
        .unwrap_or(Value::Null)
}
