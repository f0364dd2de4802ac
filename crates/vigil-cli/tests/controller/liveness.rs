//! Liveness restarts under the fleet's budget (issue 33), with real processes: example
//! services (`vigil example-service`) probed by a controller whose actuator is
//! `liveness`, and a loop standing in for the kubelet that runs each pod's exec probe,
//! `vigil check <health> --fleet <controller> --target <id>`, every 2 s, counting a
//! "restart" for every failing exit (a `failureThreshold` of 1: the strictest kubelet).
//!
//! The naive twin is counted in the same loop: the probe's `--json` output carries the
//! local verdict, what a plain `vigil check <health>` (today's livenessProbe) would
//! have exited with, so every local failure is a restart the naive setup makes.
//!
//! `VIGIL_LIVENESS_SOAK_SECS` sets how long the shared fault lasts (default 20 s; the
//! issue's figure is 600).

use crate::controller_support::*;
use serde_json::Value;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The kubelet's `periodSeconds` in the loop.
const PERIOD: Duration = Duration::from_secs(2);
/// Example services in the fleet.
const SERVICES: usize = 8;
/// The guard's budget in this fleet (`guard.budget.actions` of `base_config`).
const BUDGET: usize = 2;

/// A running `vigil example-service` (killed on drop).
struct Service {
    child: Child,
    app: String,
    health: String,
}

impl Service {
    /// Starts one on loopback ports of its own, SQLite in `dir`, the dependency check
    /// critical (a dependency down fails `/health`, as a liveness endpoint that checks
    /// its database does).
    fn start(dir: &std::path::Path, name: &str) -> Service {
        let mut child = Command::new(vigil_bin())
            .args(["example-service", "--listen", "127.0.0.1:0"])
            .args(["--health-listen", "127.0.0.1:0", "--name", name])
            // About the guard, not this machine's disk (which may be nearly full).
            .args(["--disk-fail-below", "0%", "--disk-warn-below", "off"])
            .args(["--db", "postgres://nobody@127.0.0.1:1/none"])
            .args(["--dependency-critical", "--check-interval", "200ms"])
            .arg("--data-dir")
            .arg(dir.join(name))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start vigil example-service");
        let line = vigil_testkit::Listening::read(&mut child);
        Service {
            app: line.get("app"),
            health: line.get("health"),
            child,
        }
    }

    /// Switches one of its fault knobs (docs/example.md), e.g. `dependency?on=true`.
    async fn fault(&self, knob: &str) {
        let r = reqwest::Client::new()
            .post(format!("{}/fault/{knob}", self.app))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .unwrap_or_else(|e| panic!("fault {knob}: {e}"));
        assert!(r.status().is_success(), "fault {knob}: {}", r.status());
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One run of a pod's liveness probe.
#[derive(Debug)]
struct Probe {
    at: Instant,
    id: String,
    /// The local verdict failed: the naive probe (`vigil check <health>`) restarts.
    local_failed: bool,
    /// The probe with `--fleet` failed: the kubelet restarts.
    restart: bool,
    /// The controller's verdict, or null (no answer, or not asked).
    verdict: Value,
    stderr: String,
}

/// Runs every pod's probe once, together, as a kubelet would on its nodes.
async fn probe_all(controller: &str, pods: &[(String, String)]) -> Vec<Probe> {
    let runs = pods.iter().map(|(id, health)| async move {
        let at = Instant::now();
        let out = tokio::process::Command::new(vigil_bin())
            .args(["check", &format!("{health}/health"), "--json"])
            .args(["--fleet", controller, "--target", id])
            .kill_on_drop(true)
            .output()
            .await
            .expect("run vigil check");
        let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "vigil check --json: {e}: {}",
                String::from_utf8_lossy(&out.stdout)
            )
        });
        Probe {
            at,
            id: id.clone(),
            local_failed: json["status"] != "pass" && json["status"] != "warn",
            restart: !out.status.success(),
            verdict: json["fleet"]["verdict"].clone(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    });
    futures::future::join_all(runs).await
}

/// The kubelet loop: every pod's probe every [`PERIOD`] until `stop` says so (given
/// what every probe so far said) or `limit` has passed.
async fn kubelet(
    controller: &str,
    pods: &[(String, String)],
    limit: Duration,
    mut stop: impl FnMut(&[Probe]) -> bool,
) -> Vec<Probe> {
    let start = Instant::now();
    let mut all = Vec::new();
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while start.elapsed() < limit {
        tick.tick().await;
        all.extend(probe_all(controller, pods).await);
        if stop(&all) {
            break;
        }
    }
    all
}

/// `n` example services in `dir` probed by a controller with the liveness actuator
/// (budget `budget` per 10 min), all healthy; the pods as (target id, health URL).
async fn fleet(
    dir: &std::path::Path,
    n: usize,
    budget: usize,
) -> (Vec<Service>, Controller, String, Vec<(String, String)>) {
    let services: Vec<Service> = (0..n)
        .map(|i| Service::start(dir, &format!("svc{i}")))
        .collect();
    let targets: String = services
        .iter()
        .enumerate()
        .map(|(i, s)| {
            format!(
                "[[targets]]\nid = \"t{i}\"\nurl = \"{}\"\nzone = \"a\"\ngroup = \"web\"\n",
                s.health
            )
        })
        .collect();
    // A probe timeout of 2 s, as a real fleet's; a permit lives 10 s (5 kubelet periods).
    let config =
        base_config("[actuator]\nkind = \"liveness\"\n[actuator.liveness]\nttl = \"10s\"\n")
            .replace("timeout = \"1s\"", "timeout = \"2s\"")
            .replace("actions = 2", &format!("actions = {budget}"))
            + &targets;
    let c = Controller::start(dir, &config);
    c.wait_all(n, "healthy").await;
    let controller = c.url("").trim_end_matches('/').to_string();
    let pods = services
        .iter()
        .enumerate()
        .map(|(i, s)| (format!("t{i}"), s.health.clone()))
        .collect();
    (services, c, controller, pods)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn liveness_restarts_stay_within_the_budget_under_a_shared_fault_and_a_hung_pod_restarts() {
    let soak = Duration::from_secs(
        std::env::var("VIGIL_LIVENESS_SOAK_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(20),
    );
    let dir = tempfile::tempdir().unwrap();
    let (services, c, controller, pods) = fleet(dir.path(), SERVICES, BUDGET).await;

    // A healthy pod never asks: its check passes on its own.
    let calm = probe_all(&controller, &pods).await;
    assert!(
        calm.iter().all(|p| !p.restart && p.verdict.is_null()),
        "{calm:#?}"
    );

    // (a) The shared dependency goes down under every pod; the kubelet keeps probing.
    for s in &services {
        s.fault("dependency?on=true").await;
    }
    let shared = kubelet(&controller, &pods, soak, |_| false).await;
    let restarts = shared.iter().filter(|p| p.restart).count();
    let naive = shared.iter().filter(|p| p.local_failed).count();
    let answered = shared
        .iter()
        .filter(|p| p.local_failed && p.verdict == "alive")
        .count();
    let alive: Vec<&str> = shared
        .iter()
        .filter(|p| p.verdict == "alive")
        .map(|p| p.stderr.as_str())
        .collect();
    if let (Some(first), Some(last)) = (alive.first(), alive.last()) {
        eprintln!("first answer: {first}last answer: {last}");
    }
    eprintln!(
        "shared dependency fault for {}s, {SERVICES} pods probed every {}s: {restarts} restarts with --fleet (budget {BUDGET}), {naive} with a plain local check; {answered} failing probes kept alive by the controller",
        soak.as_secs(),
        PERIOD.as_secs()
    );
    assert!(
        restarts <= BUDGET,
        "restarts beyond the budget under a shared fault: {:#?}",
        shared.iter().filter(|p| p.restart).collect::<Vec<_>>()
    );
    // The fault was real: the naive probe restarts every pod, again and again.
    assert!(
        naive >= 2 * SERVICES,
        "the shared fault did not fail the pods' local checks: {shared:#?}"
    );
    // And the controller answered (it was not a fallback) with a shared cause.
    assert!(
        alive
            .iter()
            .any(|e| e.contains("frozen") || e.contains("shared") || e.contains("peers")),
        "no shared-cause answer: {alive:#?}"
    );
    assert!(
        !shared.iter().any(|p| p.stderr.contains("no answer")),
        "the controller did not answer: {shared:#?}"
    );
    let t0 = c.get("/api/targets/t0/liveness").await;
    assert_eq!(t0["verdict"], "alive", "{t0}");

    // The dependency recovers; the whole fleet is healthy again.
    for s in &services {
        s.fault("reset").await;
    }
    c.wait_all(SERVICES, "healthy").await;

    // (b) One pod really hangs: its workers are blocked, its health checker stalls.
    let hung = 3;
    let fault = Instant::now();
    {
        // The freeze answers once the workers are blocked; bounded, so it stops itself.
        let app = services[hung].app.clone();
        tokio::spawn(async move {
            let _ = reqwest::Client::new()
                .post(format!("{app}/fault/freeze?ms=120000"))
                .timeout(Duration::from_secs(5))
                .send()
                .await;
        });
    }
    let hung_id = format!("t{hung}");
    let probes = kubelet(&controller, &pods, 3 * DEADLINE, |all| {
        all.iter().any(|p| p.id == hung_id && p.restart)
    })
    .await;
    let restarted = probes
        .iter()
        .find(|p| p.id == hung_id && p.restart)
        .unwrap_or_else(|| panic!("the hung pod was never restarted: {probes:#?}"));
    let first_failed = probes
        .iter()
        .find(|p| p.id == hung_id && p.local_failed)
        .expect("the hung pod failed its local check");
    assert_eq!(restarted.verdict, "restart", "{restarted:#?}");
    let others: Vec<&Probe> = probes
        .iter()
        .filter(|p| p.id != hung_id && p.restart)
        .collect();
    assert!(others.is_empty(), "other pods restarted: {others:#?}");
    eprintln!(
        "one hung pod: restarted {:.1} s after its hang began, {:.1} s after its first failing local probe ({} probes of it)",
        (restarted.at - fault).as_secs_f64(),
        (restarted.at - first_failed.at).as_secs_f64(),
        probes.iter().filter(|p| p.id == hung_id).count()
    );
    // Its permit was collected: the action is done, counted in the guard's budget.
    let actions = c
        .wait_for("the permit's action done", || async {
            let a = c.actions().await;
            a.iter()
                .any(|a| a["target"] == hung_id.as_str() && a["state"] == "done")
                .then_some(a)
        })
        .await;
    assert_eq!(actions.len(), 1, "one action, the hung pod's: {actions:#?}");
    c.wait_budget_left(BUDGET as u64 - 1).await;
    assert!(c.sigterm().success());

    // (c) A controller that never answers (a listener nobody serves): the hung pod's
    // probe gives up after its 2 s and the local verdict stands; so does a controller
    // that is gone (connection refused).
    let black_hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent = format!("http://{}", black_hole.local_addr().unwrap());
    let hung_pod = [pods[hung].clone()];
    for (controller, what) in [(silent.as_str(), "timed out"), (&controller, "unreachable")] {
        let started = Instant::now();
        let p = probe_all(controller, &hung_pod).await.remove(0);
        assert!(p.local_failed && p.restart, "{p:#?}");
        assert!(
            p.stderr.contains("no answer from the controller") && p.stderr.contains(what),
            "{what}: {p:#?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the probe waits about its --fleet-timeout, not more: {:?}",
            started.elapsed()
        );
    }
    drop(black_hole);
}

/// Two pods failing on their own at once (2 of 8: under the cap), a budget of 1: the
/// first to be judged is restarted, the other is kept alive because the budget is
/// spent, and says so, until its token returns (10 min: after this test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn liveness_restarts_beyond_the_budget_are_refused_with_the_budget_as_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (services, c, controller, pods) = fleet(dir.path(), SERVICES, 1).await;
    let failing = [2, 5];
    for i in failing {
        services[i].fault("disk?on=true").await;
    }
    let ids: Vec<String> = failing.iter().map(|i| format!("t{i}")).collect();
    let is_failing = |p: &Probe| ids.contains(&p.id);
    // Until one of them was restarted and the other refused for the budget, then three
    // more periods: no second restart comes.
    let mut settled_at: Option<usize> = None;
    let probes = kubelet(&controller, &pods, 3 * DEADLINE, |all| {
        let restarted = all.iter().filter(|p| is_failing(p) && p.restart).count();
        let refused = all
            .iter()
            .any(|p| is_failing(p) && p.verdict == "alive" && p.stderr.contains("budget spent"));
        if restarted >= 1 && refused && settled_at.is_none() {
            settled_at = Some(all.len());
        }
        settled_at.is_some_and(|n| all.len() >= n + 3 * pods.len())
    })
    .await;
    let restarted: std::collections::BTreeSet<&str> = probes
        .iter()
        .filter(|p| p.restart)
        .map(|p| p.id.as_str())
        .collect();
    eprintln!(
        "two pods failing alone, budget 1: restarted {restarted:?}; {} failing probes kept alive",
        probes
            .iter()
            .filter(|p| p.local_failed && p.verdict == "alive")
            .count()
    );
    assert_eq!(restarted.len(), 1, "one restart, the budget's: {probes:#?}");
    assert!(
        ids.iter().any(|id| restarted.contains(id.as_str())),
        "the restarted pod is one of the failing ones: {restarted:?}"
    );
    let kept = ids
        .iter()
        .find(|id| !restarted.contains(id.as_str()))
        .unwrap();
    let answer = c.get(&format!("/api/targets/{kept}/liveness")).await;
    assert_eq!(answer["verdict"], "alive", "{answer}");
    assert!(
        answer["reason"].as_str().unwrap().contains("budget spent"),
        "{answer}"
    );
    assert!(c.sigterm().success());
}
