//! The demo's queue: four example workers (`vigil example-worker`, each a child) on the
//! machine's RabbitMQ, a steady producer in the demo's own process, and the workers'
//! signed heartbeats to the demo's controller, which compares them with each other.
//!
//! Two keys break a worker: `w` switches worker-2's disk fault (its readiness fails: it
//! stops pulling and sends back what it holds, no message fails; its heartbeat's health
//! fails, so the controller acts on it as on a service's disk), `h` makes worker-3 a black
//! hole (every message fails in 2 ms while every check passes: its own kill switch pauses
//! it, and the controller finds it by comparing it with its peers and acts once).
//!
//! Without RabbitMQ the demo runs without its queue and says so in one line.

use super::{Fleet, Launcher, child_command};
use anyhow::{Context, Result};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncBufReadExt;
use vigil_example::broker::Broker;
use vigil_example::producer::Producer;
use vigil_example::worker::DEFAULT_AMQP;

/// Workers in the demo's queue: enough peers (3) for the controller to judge one.
pub(super) const WORKERS: usize = 4;
/// Messages a second: 10 per worker, as the benchmark runs them.
const RATE: f64 = 40.0;
/// Time per message: 50 ms, so a worker could take 20 a second and three take over a
/// fourth's share without a backlog.
const WORK_TIME: &str = "50ms";
/// The demo controller's heartbeat secret (the demo is local-only).
const HEARTBEAT_SECRET: &str = "vigil-demo-heartbeat";
/// The demo controller's comparison window. The black hole's own kill switch pauses it
/// as soon as more than 10% of its last minute's messages failed, which over the
/// default 60 s window is just at the comparison's 10% floor: it would be found only
/// once its successes from before the fault age out, up to a minute later. Over 20 s
/// they age out within seconds, and its failures keep the volume up meanwhile.
const ANOMALY_WINDOW: &str = "20s";
/// The worker `w` breaks the disk of (worker-2) and the one `h` makes a black hole
/// (worker-3), 0-based.
const DISK_WORKER: usize = 1;
const BLACK_HOLE_WORKER: usize = 2;

/// The running queue.
pub(super) struct Queue {
    name: String,
    /// (id, `http://addr`) per worker.
    workers: Vec<(String, String)>,
    producer: Producer,
    narrator: tokio::task::JoinHandle<()>,
    stop: tokio::sync::watch::Sender<bool>,
}

/// Worker `i`'s id, its target id at the controller.
fn id(i: usize) -> String {
    format!("worker-{}", i + 1)
}

/// Whether RabbitMQ answers within 3 s.
pub(super) async fn reachable() -> Result<()> {
    tokio::time::timeout(Duration::from_secs(3), Broker::connect(DEFAULT_AMQP))
        .await
        .map_err(|_| anyhow::anyhow!("no answer from {DEFAULT_AMQP} within 3s"))??;
    Ok(())
}

/// The controller's config for the queue: the heartbeat secret and one heartbeat target
/// per worker, all in group `queue` (compared with each other).
pub(super) fn controller_toml() -> String {
    let mut t = format!(
        "\n# The queue's workers push signed heartbeats; the controller compares them.\n\
         [heartbeat]\nsecret = \"{HEARTBEAT_SECRET}\"\n\
         # Judged over 20 s (default 60 s): a black hole that paused itself is found in seconds.\n\
         [anomaly]\nwindow = \"{ANOMALY_WINDOW}\"\nbucket = \"2s\"\n"
    );
    for i in 0..WORKERS {
        t += &format!(
            "\n[[targets]]\nid = \"{}\"\nheartbeat = true\ngroup = \"queue\"\n",
            id(i)
        );
    }
    t
}

/// Target `id`'s heartbeat key: `hex(HMAC-SHA256(secret, "heartbeat:" + id))`, what
/// `vigil controller heartbeat-key <id>` prints.
fn heartbeat_key(id: &str) -> String {
    vigil_controller::heartbeat::target_key(HEARTBEAT_SECRET, id)
}

/// Empties the demo's queue, starts the workers (children of the fleet) and the
/// producer, and narrates the workers' gates.
pub(super) async fn start(launcher: &Launcher<'_>, fleet: &mut Fleet) -> Result<Queue> {
    let name = format!("vigil-demo-{}", launcher.ports.lb);
    {
        let broker = Broker::connect(DEFAULT_AMQP).await?;
        broker.declare(&name).await?;
        broker.purge(&name).await?;
    }
    let mut workers = Vec::new();
    for i in 0..WORKERS {
        let url = spawn_worker(
            launcher,
            &mut fleet.children,
            &name,
            i,
            "127.0.0.1:0",
            false,
        )
        .await?;
        workers.push((id(i), url));
    }
    let producer = Producer::start(DEFAULT_AMQP, &name, RATE).await?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let narrator = tokio::spawn(narrate(workers.clone(), stopped));
    Ok(Queue {
        name,
        workers,
        producer,
        narrator,
        stop,
    })
}

/// Starts worker `i` on queue `name`, listening on `listen`, as a child of the fleet
/// (`again`: its log file is appended to). Returns its `http://addr`, once it listens.
async fn spawn_worker(
    launcher: &Launcher<'_>,
    children: &mut BTreeMap<String, tokio::process::Child>,
    name: &str,
    i: usize,
    listen: &str,
    again: bool,
) -> Result<String> {
    let controller = format!("http://127.0.0.1:{}", launcher.ports.controller);
    let wid = id(i);
    let mut cmd = child_command(launcher.exe, launcher.dir, &wid, again)?;
    cmd.arg("example-worker")
        .args(["--queue", name, "--id", &wid])
        .args(["--listen", listen, "--work-time", WORK_TIME])
        .args(["--check-interval", "1s", "--heartbeat-every", "1s"])
        .args(["--controller", &controller])
        .args(["--heartbeat-key", &heartbeat_key(&wid)])
        .arg("--data-dir")
        .arg(launcher.dir)
        // Its address is its first line; its logs go to its log file (stderr).
        .stdout(Stdio::piped());
    let mut child = cmd.spawn().with_context(|| format!("starting {wid}"))?;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().context("piped stdout")?).lines();
    children.insert(wid.clone(), child);
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .with_context(|| format!("{wid} did not start within 30s; see {wid}.log"))??
        .unwrap_or_default();
    let url = line
        .strip_prefix("LISTENING worker=")
        .with_context(|| format!("{wid} did not start ({line:?}); see {wid}.log"))?
        .to_string();
    // Nothing else is written there; keep reading so a late line never blocks it.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(url)
}

impl Queue {
    /// Lines for the demo's banner.
    pub(super) fn banner(&self) -> Vec<String> {
        let mut v = vec![format!(
            "  queue              {} on {DEFAULT_AMQP}: {WORKERS} workers, {RATE} messages/s",
            self.name
        )];
        for (id, url) in &self.workers {
            v.push(format!(
                "  {id:<18} {url}/worker  health {url}/health?verbose"
            ));
        }
        v
    }

    async fn post(&self, client: &reqwest::Client, i: usize, path: &str) {
        let url = format!("{}{path}", self.workers[i].1);
        match client.post(&url).send().await {
            Ok(r) if r.status().is_success() => {}
            Ok(r) => say!("demo: {url} answered {}", r.status()),
            Err(e) => say!("demo: {url}: {e}"),
        }
    }

    /// `w`: worker-2's disk check demands 100% free space.
    pub(super) async fn break_disk(&self, client: &reqwest::Client) {
        say!(
            "demo: BREAK worker-disk: {}'s disk check now demands 100% free space",
            id(DISK_WORKER)
        );
        self.post(client, DISK_WORKER, "/fault/disk?on=true").await;
    }

    /// `h`: worker-3 fails every message in 2 ms, every check passing.
    pub(super) async fn break_black_hole(&self, client: &reqwest::Client) {
        say!(
            "demo: BREAK black-hole: {} fails every message in 2 ms, every check passing",
            id(BLACK_HOLE_WORKER)
        );
        self.post(client, BLACK_HOLE_WORKER, "/fault/black-hole?on=true")
            .await;
    }

    /// `r`: every worker's faults off, and a worker its own kill switch paused (or put on
    /// probation) started again on its address: the switch remembers the black hole's
    /// failures after the fault is off (its first pause is 60 s, then probation), and
    /// only a fresh process forgets them, as a replaced worker would.
    pub(super) async fn reset(
        &self,
        client: &reqwest::Client,
        launcher: &Launcher<'_>,
        children: &mut BTreeMap<String, tokio::process::Child>,
    ) -> Result<()> {
        for i in 0..self.workers.len() {
            self.post(client, i, "/fault/reset").await;
        }
        for (i, (wid, url)) in self.workers.iter().enumerate() {
            let Some(report) = super::get_json(client, &format!("{url}/worker")).await else {
                continue;
            };
            let state = report["state"].as_str().unwrap_or("");
            if !state.contains("kill switch") {
                continue;
            }
            say!("demo: {wid} is held by its own kill switch ({state}): starting it again");
            if let Some(mut c) = children.remove(wid) {
                super::stop_child(wid, &mut c).await;
            }
            let listen = url.strip_prefix("http://").unwrap_or(url);
            let again = spawn_worker(launcher, children, &self.name, i, listen, true).await?;
            debug_assert_eq!(&again, url, "started again on its own address");
        }
        Ok(())
    }

    /// Stops the producer and the narrator (the workers are the fleet's children) and
    /// says how many messages were published.
    pub(super) async fn stop(self) {
        let _ = self.stop.send(true);
        if let Err(e) = self.narrator.await {
            tell!("demo: the queue narrator failed: {e}");
        }
        match self.producer.stop().await {
            Ok(n) => say!("demo: queue {}: {n} messages published", self.name),
            Err(e) => say!("demo: queue {}: the producer failed: {e:#}", self.name),
        }
    }
}

/// Prints every change of a worker's gate (it stopped pulling, and why; it pulls again)
/// and a line of counts every 10 s.
async fn narrate(workers: Vec<(String, String)>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("a client with a timeout builds");
    let mut pulling: BTreeMap<String, bool> = BTreeMap::new();
    let mut pulled: BTreeSet<String> = BTreeSet::new();
    let mut every = tokio::time::interval(Duration::from_millis(500));
    let mut last = std::time::Instant::now();
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = every.tick() => {}
        }
        let mut reports = Vec::new();
        for (id, url) in &workers {
            let Some(r) = super::get_json(&client, &format!("{url}/worker")).await else {
                continue;
            };
            let now = r["pulling"].as_bool().unwrap_or(true);
            let state = r["state"].as_str().unwrap_or("?");
            let changed = pulling
                .insert(id.clone(), now)
                .is_some_and(|was| was != now);
            // A worker pulls once its first checks pass: the start, not news.
            let first = now && pulled.insert(id.clone());
            if changed && !first {
                if now {
                    say!("queue: {id} pulls again ({state})");
                } else {
                    say!("queue: {id} STOPPED PULLING: {state}");
                }
            }
            reports.push((id.clone(), r));
        }
        if last.elapsed() >= Duration::from_secs(10) {
            last = std::time::Instant::now();
            let count = |r: &Value, k: &str| r[k].as_u64().unwrap_or(0);
            say!(
                "queue: processed/failed per worker: {}",
                reports
                    .iter()
                    .map(|(id, r)| format!("{id} {}/{}", count(r, "processed"), count(r, "failed")))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
}
