//! Shared harness for the `vigil controller` process tests: start the real binary on a
//! config, find its address from its JSON logs, talk to its API, kill it.
#![allow(dead_code)]

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vigil_testkit::Backend;

/// The token tests use for mutating calls.
pub const TOKEN: &str = "test-token";

/// Generous deadline for anything that should happen within a few probe intervals, on
/// a loaded 2-core machine.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// A running `vigil controller`.
pub struct Controller {
    child: Child,
    pub addr: SocketAddr,
    pub dir: PathBuf,
    logs: Arc<Mutex<Vec<String>>>,
}

/// The config every test starts from: fast probes, no grace, log actuator.
pub fn base_config(extra: &str) -> String {
    format!(
        r#"
listen = "127.0.0.1:0"
data_dir = "data"
api_token = "{TOKEN}"
[probe]
interval = "200ms"
timeout = "1s"
jitter = 0.1
[guard]
grace = "0s"
min_failing = "1s"
[guard.budget]
actions = 2
per = "10m"
{extra}
"#
    )
}

/// `[[targets]]` tables for these backends, ids t0.., all in zone `a`.
pub fn targets_toml(backends: &[Backend]) -> String {
    backends
        .iter()
        .enumerate()
        .map(|(i, b)| {
            format!(
                "[[targets]]\nid = \"t{i}\"\nurl = \"http://{}\"\nzone = \"a\"\ngroup = \"web\"\n",
                b.addr()
            )
        })
        .collect()
}

pub fn backends(n: usize) -> Vec<Backend> {
    (0..n).map(|i| Backend::start(&format!("t{i}"))).collect()
}

impl Controller {
    /// Writes `config` to `dir/fleet.toml` and starts the controller on it.
    pub fn start(dir: &Path, config: &str) -> Controller {
        std::fs::write(dir.join("fleet.toml"), config).expect("write config");
        Self::start_existing(dir)
    }

    /// Starts the controller on the config already in `dir` (a restart).
    pub fn start_existing(dir: &Path) -> Controller {
        let mut child = Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args(["--log-format", "json", "controller", "-c"])
            .arg(dir.join("fleet.toml"))
            .env("RUST_LOG", "info")
            .env_remove("VIGIL_API_TOKEN")
            .env_remove("VIGIL_WEBHOOK_SECRET")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn vigil controller");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("piped stderr");
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        let started = Instant::now();
        let addr = loop {
            let found = logs.lock().unwrap().iter().find_map(|l| {
                let v: Value = serde_json::from_str(l).ok()?;
                (v["message"] == "vigil controller listening")
                    .then(|| v["addr"].as_str()?.parse().ok())?
            });
            if let Some(a) = found {
                break a;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "controller exited with {status} before listening; logs:\n{}",
                    logs.lock().unwrap().join("\n")
                );
            }
            assert!(
                started.elapsed() < DEADLINE,
                "controller did not start listening; logs:\n{}",
                logs.lock().unwrap().join("\n")
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        Controller {
            child,
            addr,
            dir: dir.to_path_buf(),
            logs,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn logs(&self) -> String {
        self.logs.lock().unwrap().join("\n")
    }

    pub async fn get(&self, path: &str) -> Value {
        let r = reqwest::get(self.url(path)).await.expect("GET");
        assert!(r.status().is_success(), "GET {path}: {}", r.status());
        r.json().await.expect("JSON")
    }

    /// A POST with an optional bearer token; returns status and JSON body.
    pub async fn post(&self, path: &str, token: Option<&str>, body: Value) -> (u16, Value) {
        let mut req = reqwest::Client::new().post(self.url(path)).json(&body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.expect("POST");
        let code = r.status().as_u16();
        (code, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn delete(&self, path: &str, token: Option<&str>) -> u16 {
        let mut req = reqwest::Client::new().delete(self.url(path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        req.send().await.expect("DELETE").status().as_u16()
    }

    /// Every target, page after page.
    pub async fn targets(&self) -> Vec<Value> {
        let mut all = Vec::new();
        let mut path = "/api/targets?limit=1000".to_string();
        loop {
            let page = self.get(&path).await;
            all.extend(page["targets"].as_array().cloned().unwrap_or_default());
            match page["next_after"].as_str() {
                Some(after) => path = format!("/api/targets?limit=1000&after={after}"),
                None => return all,
            }
        }
    }

    pub async fn actions(&self) -> Vec<Value> {
        self.get("/api/actions?limit=1000").await["actions"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Waits until at least one action was taken (`what` says which, for the failure
    /// message); returns the actions.
    pub async fn wait_for_actions(&self, what: &str) -> Vec<Value> {
        self.wait_for(what, || async {
            let a = self.actions().await;
            (!a.is_empty()).then_some(a)
        })
        .await
    }

    pub async fn decisions(&self) -> Vec<Value> {
        self.get("/api/decisions?limit=1000").await["decisions"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    pub async fn guard(&self) -> Value {
        self.get("/api/guard").await["guard"].clone()
    }

    /// Polls `check` until it returns Some, or fails with `what` and the logs.
    pub async fn wait_for<T, F, Fut>(&self, what: &str, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let started = Instant::now();
        loop {
            if let Some(v) = check().await {
                return v;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "timed out waiting for: {what}\nlogs:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until every target's state is `state`.
    pub async fn wait_all(&self, n: usize, state: &str) {
        self.wait_for(&format!("all {n} targets {state}"), || async {
            let t = self.targets().await;
            (t.len() == n && t.iter().all(|t| t["state"] == state)).then_some(())
        })
        .await;
    }

    /// SIGKILL, like a crash.
    pub fn sigkill(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(ok.success(), "kill -{sig} failed");
    }

    /// SIGTERM and wait for the exit status.
    pub fn sigterm(mut self) -> ExitStatus {
        self.signal("TERM");
        let started = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                return s;
            }
            assert!(started.elapsed() < DEADLINE, "no exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
