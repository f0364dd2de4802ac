//! Shared harness for the `vigil demo` process tests (tests/demo.rs, tests/demo/queue.rs):
//! start the real binary with its narration echoed and kept, read its endpoints, find
//! what it left behind.
#![allow(dead_code)]

use serde_json::Value;
use std::io::BufRead;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running `vigil demo`, killed (and reaped) when dropped.
pub struct Demo(pub Child);

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What the demo printed on stdout so far, a line each.
pub type Narration = Arc<Mutex<Vec<String>>>;

/// Whether the demo has printed a line containing every one of `needles`.
pub fn said(narration: &Narration, needles: &[&str]) -> bool {
    narration
        .lock()
        .unwrap()
        .iter()
        .any(|l| needles.iter().all(|n| l.contains(n)))
}

/// Starts `vigil demo` with `args` (after `demo`) and a piped stdin for its keys; its
/// narration is echoed (`[demo] ...`) and kept. Its stderr goes to the test's.
pub fn spawn_demo(args: &[String]) -> (Demo, ChildStdin, Narration) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .arg("demo")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start vigil demo");
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let narration = Narration::default();
    let kept = narration.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            println!("[demo] {line}");
            kept.lock().unwrap().push(line);
        }
    });
    (Demo(child), stdin, narration)
}

/// The JSON body of a successful GET of `url`, or None (no answer in 3 s, not a 2xx,
/// not JSON).
pub async fn get_json(url: &str) -> Option<Value> {
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

/// The pids whose parent is `pid`, read from /proc.
pub fn children_of(pid: u32) -> Vec<u32> {
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

/// Polls `cond` every 250 ms until it holds; panics naming `what` after `deadline`.
pub async fn wait_until<F: std::future::Future<Output = bool>>(
    what: &str,
    deadline: Duration,
    mut cond: impl FnMut() -> F,
) {
    let until = Instant::now() + deadline;
    while !cond().await {
        assert!(
            Instant::now() < until,
            "timed out after {deadline:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
