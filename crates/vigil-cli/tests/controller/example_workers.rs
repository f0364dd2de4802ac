//! The whole queue-worker story in real processes: four `vigil example-worker`s consume
//! the machine's real RabbitMQ (127.0.0.1:5672, guest/guest, on every machine, CI's
//! included) under a steady producer, and send their counters and local health in signed
//! heartbeats (`--controller`, `--heartbeat-key`) to a real `vigil controller`. One
//! switched to a black hole over its HTTP fault switch is found by comparing it with its
//! peers and acted on once (the log actuator); when all four lose their shared dependency
//! nobody is acted on, no healthy message is dead-lettered and the fleet pulls again
//! within seconds of the dependency's return, while a poison message is still
//! dead-lettered (issue 36).

use crate::controller_support;

use controller_support::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use vigil_example::broker::Broker;
use vigil_example::producer::Producer;
use vigil_example::worker::{DEFAULT_AMQP, DEFAULT_NATS};

const WORKERS: usize = 4;
/// 10 messages a second per worker, as the benchmark runs them.
const RATE: f64 = 40.0;
/// How long the shared dependency is down (issue 36's done-when).
const OUTAGE: std::time::Duration = std::time::Duration::from_secs(30);

/// Heartbeat targets w0..w3 in group `q`; a 10 s anomaly window so the test judges in
/// seconds (a black hole fails its 100 messages in a few seconds before its own kill
/// switch pauses it; the window must still hold them when the controller judges).
fn config() -> String {
    let mut c = base_config(&format!(
        "[heartbeat]\nttl = \"3s\"\nsecret = \"{HEARTBEAT_SECRET}\"\nmax_skew = \"5s\"\n\
         [anomaly]\nwindow = \"10s\"\nbucket = \"1s\"\nmin_volume = 20\n"
    ));
    for i in 0..WORKERS {
        c += &format!("[[targets]]\nid = \"w{i}\"\nheartbeat = true\ngroup = \"q\"\n");
    }
    c
}

/// A running `vigil example-worker` process.
struct ExampleWorker {
    child: Child,
    addr: SocketAddr,
}

impl ExampleWorker {
    fn start(queue: &str, id: &str, controller: &Controller, url: &str) -> ExampleWorker {
        let mut child = Command::new(vigil_bin())
            .args([
                "example-worker",
                "--queue",
                queue,
                "--id",
                id,
                "--broker",
                url,
            ])
            .args(["--listen", "127.0.0.1:0", "--work-time", "20ms"])
            .args(["--check-interval", "200ms", "--heartbeat-every", "200ms"])
            .args(["--controller", &format!("http://{}", controller.addr)])
            .args(["--heartbeat-key", &heartbeat_key(HEARTBEAT_SECRET, id)])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn vigil example-worker");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped stdout"))
            .read_line(&mut line)
            .expect("read the worker's first line");
        let addr = line
            .trim()
            .strip_prefix("LISTENING worker=http://")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| {
                panic!("worker {id} must print its address first (is the broker reachable at {url}?): {line:?}")
            });
        ExampleWorker { child, addr }
    }

    async fn fault(&self, path: &str) {
        let r = reqwest::Client::new()
            .post(format!("http://{}{path}", self.addr))
            .send()
            .await
            .expect("POST a fault");
        assert!(r.status().is_success(), "{path}: {}", r.status());
    }

    async fn report(&self) -> Value {
        reqwest::get(format!("http://{}/worker", self.addr))
            .await
            .expect("GET /worker")
            .json()
            .await
            .expect("a JSON report")
    }
}

impl Drop for ExampleWorker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A controller, four workers heartbeating to it, a producer at [`RATE`] on a fresh queue,
/// every worker past its first messages and every target healthy.
struct Setup {
    c: Controller,
    workers: Vec<ExampleWorker>,
    producer: Option<Producer>,
    queue: String,
    /// The broker's URL.
    url: String,
    _dir: tempfile::TempDir,
}

async fn setup(test: &str) -> Setup {
    setup_on(test, DEFAULT_AMQP).await
}

/// [`setup`] on the broker at `url` (RabbitMQ or NATS JetStream).
async fn setup_on(test: &str, url: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::start(dir.path(), &config());
    let queue = format!("vigil-cli-{test}-{}", std::process::id());
    let broker = broker_at(url).await;
    broker.declare(&queue).await.unwrap();
    broker.purge(&queue).await.unwrap();
    drop(broker);
    let workers: Vec<_> = (0..WORKERS)
        .map(|i| ExampleWorker::start(&queue, &format!("w{i}"), &c, url))
        .collect();
    c.wait_all(WORKERS, "healthy").await;
    let producer = Producer::start(url, &queue, RATE)
        .await
        .expect("the broker must be reachable");
    let s = Setup {
        c,
        workers,
        producer: Some(producer),
        queue,
        url: url.to_string(),
        _dir: dir,
    };
    s.wait_reports("every worker processed 20 messages", |r| {
        r.iter().all(|r| r["processed"].as_u64().unwrap() >= 20)
    })
    .await;
    s
}

async fn broker_at(url: &str) -> Broker {
    Broker::connect(url)
        .await
        .unwrap_or_else(|e| panic!("the broker must be reachable at {url}: {e}"))
}

impl Setup {
    async fn reports(&self) -> Vec<Value> {
        let mut r = Vec::new();
        for w in &self.workers {
            r.push(w.report().await);
        }
        r
    }

    async fn wait_reports(&self, what: &str, cond: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        self.c
            .wait_for(what, || async {
                assert!(
                    !self.producer.as_ref().is_some_and(|p| p.is_finished()),
                    "the producer stopped (a broker error)"
                );
                let r = self.reports().await;
                cond(&r).then_some(r)
            })
            .await
    }

    /// The detail of target `id`'s latest record (its standing among its peers).
    async fn last_detail(&self, id: &str) -> String {
        let t: Value = self.c.get(&format!("/api/targets/{id}")).await;
        t["target"]["history"]
            .as_array()
            .and_then(|h| h.last())
            .and_then(|r| r["detail"].as_str())
            .unwrap_or("")
            .to_string()
    }

    async fn finish(mut self) {
        if let Some(p) = self.producer.take() {
            p.stop().await.unwrap();
        }
        self.workers.clear();
        let _ = broker_at(&self.url).await.delete(&self.queue).await;
        assert!(self.c.sigterm().success());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_hole_example_worker_is_found_by_the_controller_and_acted_on_once() {
    let s = setup("black-hole").await;
    assert!(s.c.actions().await.is_empty(), "healthy workers: no action");
    s.workers[2].fault("/fault/black-hole?on=true").await;
    let actions = s.c.wait_for_actions("an action on the black hole").await;
    let action = &actions[0];
    assert_eq!(action["target"], "w2", "{action}");
    let summary = action["event"]["summary"].as_str().unwrap_or("");
    assert!(
        summary.contains("worker:failure_rate") && summary.contains("vs 3 peers"),
        "found by comparing it with its peers, and the decision says so: {action}"
    );
    // The peers keep being judged beside it, and nobody else is acted on.
    s.c.wait_for("w0's record shows its standing", || async {
        s.last_detail("w0")
            .await
            .contains("vs 3 peers")
            .then_some(())
    })
    .await;
    let before = s.reports().await;
    s.wait_reports("the healthy workers processed 50 more messages each", |r| {
        [0, 1, 3].iter().all(|&i| {
            r[i]["processed"].as_u64().unwrap() >= before[i]["processed"].as_u64().unwrap() + 50
        })
    })
    .await;
    let acts = s.c.actions().await;
    assert_eq!(
        acts.len(),
        1,
        "one action, on the black hole only: {acts:#?}"
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_example_worker_loses_its_dependency_nobody_is_acted_on() {
    let s = setup("dependency").await;
    for w in &s.workers {
        w.fault("/fault/dependency?on=true").await;
    }
    let verdict =
        s.c.wait_for("the comparison sees a shared failure", || async {
            let d = s.last_detail("w1").await;
            d.contains("fail together").then_some(d)
        })
        .await;
    assert!(verdict.contains("a shared cause"), "{verdict}");
    // Every worker fails until its own kill switch pauses it (100 messages, all failed):
    // the whole outage, judged by the controller all along.
    s.wait_reports("every worker's kill switch paused it", |r| {
        r.iter().all(|r| {
            r["pulling"] == false && r["state"].as_str().unwrap_or("").contains("kill switch")
        })
    })
    .await;
    assert!(
        s.c.actions().await.is_empty(),
        "a shared failure replaces no one"
    );
    for w in &s.workers {
        let r = reqwest::get(format!("http://{}/health", w.addr))
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            503,
            "each worker's own check sees the dependency down"
        );
        assert!(r.text().await.unwrap().contains("db:connect"));
    }
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_a_shared_dependency_outage_dead_letters_nothing_and_poison_still_is() {
    shared_outage(DEFAULT_AMQP, "shared-outage").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_a_shared_dependency_outage_dead_letters_nothing_and_poison_still_is() {
    shared_outage(DEFAULT_NATS, "shared-outage-nats").await;
}

/// Issue 36's done-when on the broker at `url`: every worker loses its dependency for
/// [`OUTAGE`] under a steady producer; nothing is dead-lettered, every message is
/// processed once, the fleet pulls again within seconds, and a poison message is
/// still dead-lettered.
async fn shared_outage(url: &str, test: &str) {
    let s = setup_on(test, url).await;
    let outage = tokio::time::Instant::now();
    for w in &s.workers {
        w.fault("/fault/dependency?on=true").await;
    }
    s.wait_reports("every worker's kill switch paused it", |r| {
        r.iter().all(|r| {
            r["pulling"] == false && r["state"].as_str().unwrap_or("").contains("kill switch")
        })
    })
    .await;
    let during = s.reports().await;
    assert!(
        during.iter().all(|r| r["failed"].as_u64().unwrap() > 0),
        "every worker failed messages of the outage: {during:#?}"
    );
    // The 30 s outage, under the steady producer (the workers stay paused).
    tokio::time::sleep_until(outage + OUTAGE).await;
    // The dependency comes back: each worker's own check passes again and ends its
    // shared pause (rule 4), long before its 60 s run out.
    let back = std::time::Instant::now();
    for w in &s.workers {
        w.fault("/fault/dependency?on=false").await;
    }
    s.wait_reports("every worker pulls again", |r| {
        r.iter().all(|r| r["pulling"] == true)
    })
    .await;
    let resumed = back.elapsed();
    assert!(
        resumed < std::time::Duration::from_secs(30),
        "the fleet pulls again with its dependency, not after its 60 s pauses: {resumed:?}"
    );
    // A poison message among the healthy ones is still dead-lettered.
    let broker = broker_at(url).await;
    broker
        .publish(
            &s.queue,
            String::from_utf8(vigil_example::worker::POISON.to_vec()).unwrap(),
        )
        .await
        .unwrap();
    let dead =
        s.c.wait_for("the poison message is dead-lettered", || async {
            let (_, dead) = broker.depths(&s.queue).await.unwrap();
            (dead > 0).then_some(dead)
        })
        .await;
    assert_eq!(dead, 1, "only the poison message is dead-lettered");
    let mut s = s;
    let published = s.producer.take().unwrap().stop().await.unwrap();
    // Every message of the producer processed once; the poison message alone is dead.
    let r = s
        .wait_reports("every published message processed", |r| {
            let processed: u64 = r.iter().map(|r| r["processed"].as_u64().unwrap()).sum();
            processed >= published
        })
        .await;
    let processed: u64 = r.iter().map(|r| r["processed"].as_u64().unwrap()).sum();
    let dead_lettered: u64 = r.iter().map(|r| r["dead_lettered"].as_u64().unwrap()).sum();
    assert_eq!(
        processed, published,
        "each message processed exactly once: {r:#?}"
    );
    assert_eq!(dead_lettered, 1, "{r:#?}");
    let (queued, dead) = broker.depths(&s.queue).await.unwrap();
    assert_eq!(
        (queued, dead),
        (0, 1),
        "the broker holds only the dead letter"
    );
    assert!(s.c.actions().await.is_empty(), "nobody was acted on");
    eprintln!(
        "{url}: shared outage of {OUTAGE:?}: {published} published, {processed} processed, {dead} dead \
         (the poison), fleet pulling {resumed:?} after the dependency came back"
    );
    drop(broker);
    s.finish().await;
}
