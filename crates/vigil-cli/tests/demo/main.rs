//! End-to-end: `vigil demo` starts a fleet, a balancer and a controller (`--no-queue`:
//! the queue's keys are tests/demo/queue.rs'). The tour: every service key of the
//! README's table, in order, with a reset between, does what the table says
//! (a killed server is taken out and acted on, a local failure too, a dependency failure
//! on one server too, a brownout is a warn nobody acts on, a flapping server is damped,
//! every dependency failing makes the balancer fail open and the controller freeze), and
//! each reset brings everything back (the killed server too, a full action budget, no
//! flap penalty). Stopping the demo leaves no process or port, also when its output goes
//! through a pipe that Ctrl-C closes first (`vigil demo | tee log`).

#[path = "../demo_support/mod.rs"]
mod demo_support;

use demo_support::{Demo, Narration, children_of, get_json, said, spawn_demo};
use serde_json::Value;
use std::io::Write;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

// Each test takes a port block unlikely to collide with other tests (other tests use
// ephemeral ports): 17800 and 17900.
const SERVICES: u16 = 6;

/// Polls `cond` every 250 ms until it holds; panics naming `what` after `timeout`.
macro_rules! wait_for {
    ($what:expr, $timeout:expr, $cond:expr) => {{
        let deadline = Instant::now() + $timeout;
        loop {
            if $cond {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {:?} waiting for: {}",
                $timeout,
                $what
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }};
}

/// The running demo's endpoints, as the README's table describes them.
struct Tour {
    admin: String,
    ctl: String,
    base: u16,
}

impl Tour {
    fn new(base: u16) -> Tour {
        Tour {
            admin: format!("http://127.0.0.1:{}", base + 1),
            ctl: format!("http://127.0.0.1:{}", base + 2),
            base,
        }
    }

    /// `svc-N`'s application address, the balancer's name for it.
    fn addr(&self, n: u16) -> String {
        format!("127.0.0.1:{}", self.base + 3 + 2 * (n - 1))
    }

    /// svc-N at the balancer.
    async fn lb_target(&self, n: u16) -> Option<Value> {
        let v = get_json(&format!("{}/admin/targets", self.admin)).await?;
        let addr = self.addr(n);
        v["pools"]["fleet"]["targets"]
            .as_array()?
            .iter()
            .find(|t| t["addr"] == addr.as_str())
            .cloned()
    }

    async fn out_at_lb(&self, n: u16) -> bool {
        self.lb_target(n)
            .await
            .is_some_and(|t| t["state"] == "unhealthy" || t["state"] == "ejected")
    }

    async fn acted_on(&self, id: &str) -> bool {
        get_json(&format!("{}/api/actions", self.ctl))
            .await
            .is_some_and(|v| {
                v["actions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|a| a["target"] == id)
            })
    }

    async fn actions(&self) -> usize {
        get_json(&format!("{}/api/actions", self.ctl))
            .await
            .and_then(|v| v["actions"].as_array().map(Vec::len))
            .unwrap_or(usize::MAX)
    }

    async fn decisions(&self, id: &str) -> Vec<Value> {
        get_json(&format!("{}/api/decisions?target={id}", self.ctl))
            .await
            .and_then(|v| v["decisions"].as_array().cloned())
            .unwrap_or_default()
    }

    async fn ctl_target(&self, id: &str) -> Option<Value> {
        get_json(&format!("{}/api/targets/{id}", self.ctl)).await
    }

    /// Everything as at the start: every target in service at the balancer, no
    /// fail-open; at the controller every target healthy, none flapping or held, no
    /// freeze, the whole action budget left. (Not "no penalty at all": on an overloaded
    /// machine a probe timing out now and then earns a small one, which is the damper
    /// doing its job; what a reset must clear is the flapping that earlier faults
    /// caused, which would hold the next fault back.)
    async fn all_clear(&self) -> Result<(), String> {
        let v = get_json(&format!("{}/admin/targets", self.admin))
            .await
            .ok_or("no answer from the balancer")?;
        let pool = &v["pools"]["fleet"];
        if pool["fail_open"] != false {
            return Err("the balancer is failing open".into());
        }
        let ts = pool["targets"].as_array().ok_or("no targets")?;
        if ts.len() != SERVICES as usize || ts.iter().any(|t| t["state"] != "healthy") {
            return Err(format!(
                "balancer states: {:?}",
                ts.iter().map(|t| &t["state"]).collect::<Vec<_>>()
            ));
        }
        let g = get_json(&format!("{}/api/guard", self.ctl))
            .await
            .ok_or("no answer from the controller")?;
        let g = &g["guard"];
        if g["frozen"] != false || g["unhealthy"] != 0 || g["budget_left"] != g["budget_actions"] {
            return Err(format!("controller guard: {g}"));
        }
        let t = get_json(&format!("{}/api/targets", self.ctl))
            .await
            .ok_or("no answer from the controller")?;
        let ts = t["targets"].as_array().ok_or("no targets")?;
        if ts.len() != SERVICES as usize
            || ts
                .iter()
                .any(|t| t["health"] != "healthy" || t["flapping"] != false || !t["hold"].is_null())
        {
            return Err(format!(
                "controller targets: {:?}",
                ts.iter()
                    .map(|t| (
                        &t["id"],
                        &t["health"],
                        &t["flapping"],
                        &t["penalty"],
                        &t["hold"]
                    ))
                    .collect::<Vec<_>>()
            ));
        }
        Ok(())
    }
}

/// Starts `vigil demo` on `base` with piped stdin and its narration echoed and kept.
fn start_demo(base: u16, dir: &std::path::Path) -> (Demo, std::process::ChildStdin, Narration) {
    let args = [
        "--base-port".to_string(),
        base.to_string(),
        "--services".into(),
        SERVICES.to_string(),
        "--rps".into(),
        "20".into(),
        "--data-dir".into(),
        dir.display().to_string(),
        "--db".into(),
        "postgres://nobody@127.0.0.1:1/none".into(),
        // The services' keys (the queue's: tests/demo/queue.rs).
        "--no-queue".into(),
    ];
    spawn_demo(&args)
}

/// Every key of the README's table, in the table's order, each followed by `r`: each does
/// what the table says, and each reset brings back the starting state, whatever came
/// before (a killed server, a spent action budget, flap penalties, a freeze).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_demo_tour_every_key_in_order_with_resets_between() {
    const BASE: u16 = 17800;
    let dir = tempfile::tempdir().unwrap();
    let (demo, mut stdin, narration) = start_demo(BASE, dir.path());
    let tour = Tour::new(BASE);
    let mut key = |k: &str| {
        println!("[test] key {k}");
        narration.lock().unwrap().clear();
        writeln!(stdin, "{k}").unwrap();
    };
    let long = Duration::from_secs(60);
    let mut last_clear = String::new();
    // What the demo says about a decision (it watches the controller that a reset
    // started afresh, whose decisions are numbered from 1 again).
    let says = |needles: &'static [&'static str]| said(&narration, needles);
    macro_rules! reset {
        ($after:expr) => {
            key("r");
            wait_for!(
                format!(
                    "everything back as at the start after `r` following `{}` ({last_clear})",
                    $after
                ),
                long,
                match tour.all_clear().await {
                    Ok(()) => true,
                    Err(e) => {
                        last_clear = e;
                        false
                    }
                }
            );
        };
    }
    wait_for!(
        format!("everything in service at the start ({last_clear})"),
        long,
        match tour.all_clear().await {
            Ok(()) => true,
            Err(e) => {
                last_clear = e;
                false
            }
        }
    );

    // k: svc-1 killed: out of service at the balancer, acted on by the controller.
    key("k");
    wait_for!("svc-1 out at the balancer", long, tour.out_at_lb(1).await);
    wait_for!(
        "the controller acted on svc-1",
        long,
        tour.acted_on("svc-1").await
    );
    wait_for!("the demo says so", long, says(&["controller: act svc-1"]));
    reset!("k");

    // d: svc-2's disk check: a local failure, out at the balancer, acted on.
    key("d");
    wait_for!("svc-2 out at the balancer", long, tour.out_at_lb(2).await);
    wait_for!(
        "the controller acted on svc-2",
        long,
        tour.acted_on("svc-2").await
    );
    wait_for!("the demo says so", long, says(&["controller: act svc-2"]));
    reset!("d");

    // p: svc-3's database: its own problem (no other target fails that check), out at
    // the balancer and acted on: two actions came before, so this needs the reset to
    // have refilled the budget.
    key("p");
    wait_for!("svc-3 out at the balancer", long, tour.out_at_lb(3).await);
    wait_for!(
        "the controller acted on svc-3",
        long,
        tour.acted_on("svc-3").await
    );
    wait_for!("the demo says so", long, says(&["controller: act svc-3"]));
    reset!("p");

    // b: svc-4's brownout: a steady warn, which passes: it stays in service at the
    // balancer and the controller neither acts nor holds anything back.
    let before = tour.ctl_target("svc-4").await.unwrap();
    assert_eq!(
        before["target"]["last_probe"]["health"], "pass",
        "svc-4 passes before the brownout (else the warn below proves nothing): {before}"
    );
    key("b");
    let mut warned_at = 0;
    wait_for!("svc-4's health warns at the controller", long, {
        let t = tour.ctl_target("svc-4").await;
        let p = t.as_ref().map(|t| &t["target"]["last_probe"]);
        if p.is_some_and(|p| p["health"] == "warn") {
            warned_at = p.and_then(|p| p["at_ms"].as_i64()).unwrap_or(0);
            true
        } else {
            false
        }
    });
    wait_for!(
        "four more probes of svc-4 after its first warn",
        long,
        tour.ctl_target("svc-4").await.is_some_and(|t| {
            t["target"]["last_probe"]["at_ms"]
                .as_i64()
                .is_some_and(|at| at >= warned_at + 4000)
        })
    );
    let t = tour.ctl_target("svc-4").await.unwrap();
    assert_eq!(
        t["target"]["last_probe"]["health"], "warn",
        "a brownout must be a steady warn, not a flap: {t}"
    );
    assert_eq!(t["target"]["health"], "healthy", "warn passes: {t}");
    assert_eq!(t["target"]["flapping"], false, "a brownout is no flap: {t}");
    assert!(
        tour.decisions("svc-4").await.is_empty(),
        "nothing is decided about a degraded target: {:?}",
        tour.decisions("svc-4").await
    );
    let lb4 = tour.lb_target(4).await.unwrap();
    assert!(
        lb4["state"] == "healthy",
        "a degraded target stays in service at the balancer: {lb4}"
    );
    reset!("b");

    // f: svc-5's database flaps: the controller damps it (held back as flapping), it
    // is not acted on.
    key("f");
    wait_for!(
        "the controller holds svc-5 back as flapping",
        long,
        tour.decisions("svc-5").await.iter().any(|d| {
            d["outcome"] == "hold_back"
                && d["summary"]
                    .as_str()
                    .is_some_and(|s| s.contains("flapping"))
        })
    );
    wait_for!(
        "the demo says so",
        long,
        says(&["controller: hold_back svc-5", "flapping"])
    );
    assert!(
        !tour.acted_on("svc-5").await,
        "a flapping target must be damped, not acted on: {:?}",
        tour.decisions("svc-5").await
    );
    reset!("f");

    // a: every database: the balancer fails open, the controller freezes, nobody is
    // acted on.
    key("a");
    wait_for!("the balancer fails open", long, {
        get_json(&format!("{}/admin/targets", tour.admin))
            .await
            .is_some_and(|v| v["pools"]["fleet"]["fail_open"] == true)
    });
    wait_for!("the controller freezes", long, {
        get_json(&format!("{}/api/guard", tour.ctl))
            .await
            .is_some_and(|g| g["guard"]["frozen"] == true)
    });
    wait_for!(
        "the demo says both",
        long,
        says(&["lb: pool fleet FAILS OPEN"]) && says(&["controller: FROZEN"])
    );
    assert_eq!(
        tour.actions().await,
        0,
        "a shared dependency outage must cause no action"
    );
    reset!("a");

    // Stop it: no child process and no port left behind.
    let demo_pid = demo.0.id();
    let children = children_of(demo_pid);
    assert!(
        children.len() >= SERVICES as usize,
        "the demo's children were found: {children:?}"
    );
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(demo_pid as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let mut demo = demo;
    let status = {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = demo.0.try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "the demo did not stop within 30s of SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    assert!(
        status.success(),
        "SIGTERM must stop the demo cleanly, got {status}"
    );
    for pid in children {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "child {pid} of the demo left behind (running or a zombie nobody reaps)"
        );
    }
    for port in BASE..BASE + 3 + 2 * SERVICES {
        wait_for!(format!("port {port} free"), Duration::from_secs(5), {
            TcpListener::bind(("127.0.0.1", port)).is_ok()
        });
    }
}

/// `vigil demo | tee log`, then Ctrl-C (SIGINT to the whole foreground group, `tee`
/// included): the demo must not panic on the closed pipe, must stop within its grace,
/// and must reap every child (none left running or as a zombie).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_demo_piped_into_tee_stops_on_ctrl_c_without_panic_or_leftovers() {
    use std::os::unix::process::CommandExt;
    const BASE: u16 = 17900;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let errs = dir.path().join("stderr");
    let mut demo = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["demo", "--base-port", &BASE.to_string()])
        .args(["--services", "2", "--rps", "20"])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["--db", "postgres://nobody@127.0.0.1:1/none"])
        // The services' keys (the queue's: tests/demo/queue.rs).
        .arg("--no-queue")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&errs).unwrap())
        // Its own process group, as a shell pipeline in a terminal gets.
        .process_group(0)
        .spawn()
        .expect("start vigil demo");
    let demo_pid = demo.id();
    let mut tee = Command::new("tee")
        .arg(&log)
        .stdin(demo.stdout.take().unwrap())
        .stdout(Stdio::null())
        .process_group(demo_pid as i32)
        .spawn()
        .expect("start tee");
    let demo = Demo(demo);
    wait_for!("the demo says it is running", Duration::from_secs(60), {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("vigil demo is running"))
    });
    let children = children_of(demo_pid);
    assert_eq!(
        children.len(),
        2 + 2,
        "services, lb and controller: {children:?}"
    );

    // Ctrl-C in a terminal: SIGINT to every process of the foreground group.
    rustix::process::kill_process_group(
        rustix::process::Pid::from_raw(demo_pid as i32).unwrap(),
        rustix::process::Signal::INT,
    )
    .unwrap();
    let _ = tee.wait();
    let mut demo = demo;
    let status = {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = demo.0.try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "the demo did not stop within 30s of Ctrl-C with its stdout closed"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let stderr = std::fs::read_to_string(&errs).unwrap();
    assert!(
        !stderr.contains("panicked"),
        "no panic on the broken pipe:\n{stderr}"
    );
    assert!(
        status.success(),
        "Ctrl-C stops the demo cleanly, got {status}:\n{stderr}"
    );
    assert!(
        stderr.contains("demo: stopped"),
        "the demo says on stderr that it stopped:\n{stderr}"
    );
    // Reaped by the demo itself: gone, not a zombie waiting for someone else.
    for pid in children {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(
            stat.is_empty(),
            "child {pid} of the demo left behind after it exited: {stat}"
        );
    }
}

// The other files of this binary (one binary per component: a 2-core machine
// links a handful of test binaries, not one per file).
mod deploy;
mod queue;
mod replicas;
