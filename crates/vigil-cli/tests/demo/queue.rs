//! End-to-end: `vigil demo`'s queue on the machine's real RabbitMQ (every machine has it,
//! CI's included). `--break black-hole` makes worker-3 fail every message while its
//! checks pass: its own kill switch pauses it, and the demo's controller finds it by
//! comparing it with its three peers and acts on it once, on it alone. Stopping the
//! demo leaves none of its processes (the workers included) behind.

use crate::demo_support;

use demo_support::{Demo, Narration, children_of, get_json, said, spawn_demo};
use serde_json::Value;
use std::time::{Duration, Instant};

// A port block away from tests/demo.rs' (17800, 17900).
const BASE: u16 = 18000;
const DEADLINE: Duration = Duration::from_secs(60);

/// Polls `cond` every 250 ms until it returns Some; panics naming `what` after DEADLINE.
async fn wait_for<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut cond: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = cond().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {DEADLINE:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn actions(ctl: &str) -> Option<Vec<Value>> {
    get_json(&format!("{ctl}/api/actions")).await?["actions"]
        .as_array()
        .cloned()
}

/// Starts `vigil demo` on `base` with `--break fault` 15 s in; its narration echoed
/// and kept. Returns once its queue runs.
async fn start_demo(
    base: u16,
    fault: &str,
    dir: &std::path::Path,
) -> (Demo, std::process::ChildStdin, Narration) {
    let args = [
        "--base-port".to_string(),
        base.to_string(),
        "--services".into(),
        "2".into(),
        "--rps".into(),
        "5".into(),
        "--break".into(),
        fault.into(),
        "--break-after".into(),
        "15s".into(),
        "--data-dir".into(),
        dir.display().to_string(),
        "--db".into(),
        "postgres://nobody@127.0.0.1:1/none".into(),
    ];
    // No key is pressed: the fault comes from --break; stdin stays open (and unused)
    // for as long as the demo runs.
    let (demo, stdin, narration) = spawn_demo(&args);
    wait_for("the demo runs its queue", || async {
        (said(&narration, &["queue", "4 workers"]) && said(&narration, &["worker-4", "/worker"]))
            .then_some(())
    })
    .await;
    (demo, stdin, narration)
}

/// Worker `id`'s report, at the address the demo's banner gave.
async fn worker_report(narration: &Narration, id: &str) -> Option<Value> {
    let url = narration
        .lock()
        .unwrap()
        .iter()
        .find(|l| l.trim_start().starts_with(&format!("{id} ")))?
        .split_whitespace()
        .nth(1)?
        .to_string();
    get_json(&url).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_demo_black_hole_key_pauses_worker_3_and_the_controller_acts_on_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let (demo, _stdin, narration) = start_demo(BASE, "black-hole", dir.path()).await;
    let ctl = format!("http://127.0.0.1:{}", BASE + 2);
    assert!(
        actions(&ctl).await.is_some_and(|a| a.is_empty()),
        "nothing acted on before the key"
    );
    let acted = wait_for("the controller acts on the black hole", || async {
        actions(&ctl).await.filter(|a| !a.is_empty())
    })
    .await;
    assert!(
        said(&narration, &["BREAK black-hole", "worker-3"]),
        "the key was applied"
    );
    assert_eq!(acted[0]["target"], "worker-3", "{acted:#?}");
    let summary = acted[0]["event"]["summary"].as_str().unwrap_or("");
    assert!(
        summary.contains("worker:failure_rate") && summary.contains("vs 3 peers"),
        "found by comparing it with its peers: {summary}"
    );
    wait_for("worker-3's kill switch paused it", || async {
        said(&narration, &["worker-3 STOPPED PULLING", "kill switch"]).then_some(())
    })
    .await;
    // Its peers are still judged beside it (and pass), and nobody else is acted on.
    let last_record = || async {
        get_json(&format!("{ctl}/api/targets/worker-1")).await?["target"]["history"]
            .as_array()?
            .last()
            .cloned()
    };
    let before = last_record().await;
    wait_for("worker-1 judged again, beside its peers", || async {
        let last = last_record().await?;
        (Some(&last) != before.as_ref() && last["detail"].as_str()?.contains("vs 3 peers"))
            .then_some(())
    })
    .await;
    let acts = actions(&ctl).await.unwrap();
    assert_eq!(acts.len(), 1, "one action, on the black hole: {acts:#?}");

    // SIGTERM: the demo stops every child, the workers included.
    let pid = demo.0.id();
    let children = children_of(pid);
    assert_eq!(
        children.len(),
        2 + 2 + 4,
        "services, lb, controller, workers"
    );
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let mut demo = demo;
    let status = wait_for("the demo exits", || {
        let s = demo.0.try_wait().unwrap();
        async move { s }
    })
    .await;
    assert!(status.success(), "{status}");
    assert!(
        said(&narration, &["messages published"]),
        "the queue's count"
    );
    for pid in children {
        assert!(
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_err(),
            "child {pid} left behind"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_demo_worker_disk_key_stops_worker_2_pulling_and_no_message_fails() {
    let dir = tempfile::tempdir().unwrap();
    let (_demo, _stdin, narration) = start_demo(BASE + 20, "worker-disk", dir.path()).await;
    let ctl = format!("http://127.0.0.1:{}", BASE + 20 + 2);
    wait_for("worker-2 stops pulling on its disk check", || async {
        said(&narration, &["worker-2 STOPPED PULLING", "disk:free"]).then_some(())
    })
    .await;
    let stopped = worker_report(&narration, "worker-2").await.unwrap();
    let peers = |r: &[Value]| -> u64 { r.iter().map(|r| r["processed"].as_u64().unwrap()).sum() };
    let mut before = Vec::new();
    for id in ["worker-1", "worker-3", "worker-4"] {
        before.push(worker_report(&narration, id).await.unwrap());
    }
    // Its peers take the queue: 100 messages more, none of them on worker-2.
    let after = wait_for("its peers process 100 more messages", || async {
        let mut now = Vec::new();
        for id in ["worker-1", "worker-3", "worker-4"] {
            now.push(worker_report(&narration, id).await?);
        }
        (peers(&now) >= peers(&before) + 100).then_some(now)
    })
    .await;
    let sick = worker_report(&narration, "worker-2").await.unwrap();
    assert_eq!(
        sick["processed"], stopped["processed"],
        "a worker that stopped pulling takes nothing: {sick}"
    );
    for r in after.iter().chain([&sick]) {
        assert_eq!(r["failed"], 0, "no message fails: {r}");
    }
    // Its heartbeat's health fails: the controller acts on it as on a full disk.
    let acted = wait_for("the controller acts on worker-2", || async {
        actions(&ctl).await.filter(|a| !a.is_empty())
    })
    .await;
    assert_eq!(acted[0]["target"], "worker-2", "{acted:#?}");
    let summary = acted[0]["event"]["summary"].as_str().unwrap_or("");
    assert!(summary.contains("disk:free"), "{summary}");
}
