//! End-to-end: `vigil demo` starts a fleet, a balancer and a controller; breaking one
//! server gets it ejected and acted on, breaking every dependency makes the balancer
//! fail open and the controller freeze; stopping the demo leaves no process or port.

use serde_json::Value;
use std::io::Write;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A port block unlikely to collide with other tests (each test binary runs in its own
/// process; other tests use ephemeral ports).
const BASE_PORT: u16 = 17700;
const SERVICES: u16 = 6;

async fn get_json(url: &str) -> Option<Value> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .ok()?;
    let r = client.get(url).send().await.ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.json().await.ok()
}

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

struct Demo(Child);

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // Fields after the command (which may contain spaces) start after the last ')'.
        let after = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
        let ppid = after
            .split_whitespace()
            .nth(1)
            .and_then(|x| x.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(p);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_demo_ejects_acts_fails_open_freezes_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["demo", "--base-port", &BASE_PORT.to_string()])
        .args(["--services", &SERVICES.to_string(), "--rps", "20"])
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--db", "postgres://nobody@127.0.0.1:1/none"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start vigil demo");
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let demo_pid = child.id();
    let demo = Demo(child);
    // Keep the demo's narration visible in the test output and drain its pipe.
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            println!("[demo] {line}");
        }
    });

    let admin = format!("http://127.0.0.1:{}", BASE_PORT + 1);
    let ctl = format!("http://127.0.0.1:{}", BASE_PORT + 2);
    let svc1 = format!("127.0.0.1:{}", BASE_PORT + 3);
    let target = |v: &Value, addr: &str| -> Option<Value> {
        v["pools"]["fleet"]["targets"]
            .as_array()?
            .iter()
            .find(|t| t["addr"] == addr)
            .cloned()
    };

    wait_for!(
        "every target in service at the balancer",
        Duration::from_secs(60),
        {
            get_json(&format!("{admin}/admin/targets"))
                .await
                .is_some_and(|v| {
                    v["pools"]["fleet"]["targets"].as_array().is_some_and(|ts| {
                        ts.len() == SERVICES as usize && ts.iter().all(|t| t["health"] == "healthy")
                    })
                })
        }
    );

    // Break one server: kill svc-1.
    writeln!(stdin, "k").unwrap();
    wait_for!(
        "svc-1 out of service at the balancer",
        Duration::from_secs(30),
        {
            get_json(&format!("{admin}/admin/targets"))
                .await
                .and_then(|v| target(&v, &svc1))
                .is_some_and(|t| t["state"] == "unhealthy" || t["state"] == "ejected")
        }
    );
    wait_for!("the controller acted on svc-1", Duration::from_secs(60), {
        get_json(&format!("{ctl}/api/actions"))
            .await
            .is_some_and(|v| {
                v["actions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|a| a["target"] == "svc-1")
            })
    });

    // Break every dependency: fail-open at the balancer, freeze at the controller.
    writeln!(stdin, "a").unwrap();
    wait_for!("the balancer fails open", Duration::from_secs(30), {
        get_json(&format!("{admin}/admin/targets"))
            .await
            .is_some_and(|v| v["pools"]["fleet"]["fail_open"] == true)
    });
    wait_for!("the controller freezes", Duration::from_secs(30), {
        get_json(&format!("{ctl}/api/guard"))
            .await
            .is_some_and(|g| g["guard"]["frozen"] == true)
    });
    let actions_when_frozen = get_json(&format!("{ctl}/api/actions"))
        .await
        .map(|v| v["actions"].as_array().map_or(0, Vec::len))
        .unwrap_or(0);
    assert_eq!(
        actions_when_frozen, 1,
        "a shared dependency outage must cause no action"
    );

    // Stop it: no child process and no port left behind.
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
        wait_for!(format!("child {pid} gone"), Duration::from_secs(5), {
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z "))
        });
    }
    for port in BASE_PORT..BASE_PORT + 3 + 2 * SERVICES {
        wait_for!(format!("port {port} free"), Duration::from_secs(5), {
            TcpListener::bind(("127.0.0.1", port)).is_ok()
        });
    }
}
