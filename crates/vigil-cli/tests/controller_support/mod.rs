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

/// The heartbeat secret tests configure (`[heartbeat] secret`).
pub const HEARTBEAT_SECRET: &str = "hb-secret";

/// Generous deadline for anything that should happen within a few probe intervals, on
/// a loaded 2-core machine.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// The binary under test: this build's, or `VIGIL_TEST_BIN` (to show that a test
/// fails on an older build).
pub fn vigil_bin() -> std::ffi::OsString {
    std::env::var_os("VIGIL_TEST_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_vigil").into())
}

/// Called with each log line of a controller as it is written.
pub type LineHook = Box<dyn FnMut(&str) + Send>;

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
        Self::start_wrapped(dir, &[])
    }

    /// Starts the controller on the config already in `dir`, its command line run by
    /// `wrapper` (e.g. `unshare -m -- sh -c '...; exec "$0" "$@"'`).
    pub fn start_wrapped(dir: &Path, wrapper: &[String]) -> Controller {
        Self::start_full(dir, wrapper, None, &[])
    }

    /// Writes `config` and starts the controller with `env` added to its environment.
    pub fn start_env(dir: &Path, config: &str, env: &[(&str, String)]) -> Controller {
        std::fs::write(dir.join("fleet.toml"), config).expect("write config");
        Self::start_existing_env(dir, env)
    }

    /// Starts the controller on the config already in `dir`, with `env` added.
    pub fn start_existing_env(dir: &Path, env: &[(&str, String)]) -> Controller {
        Self::start_full(dir, &[], None, env)
    }

    /// Starts the controller on the config already in `dir`, calling `on_line` with
    /// each log line as soon as it is written (before the controller listens).
    pub fn start_watching(dir: &Path, on_line: LineHook) -> Controller {
        Self::start_full(dir, &[], Some(on_line), &[])
    }

    fn start_full(
        dir: &Path,
        wrapper: &[String],
        mut on_line: Option<LineHook>,
        env: &[(&str, String)],
    ) -> Controller {
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(vigil_bin());
                c
            }
            None => Command::new(vigil_bin()),
        };
        let mut child = cmd
            .args(["--log-format", "json", "controller", "-c"])
            .arg(dir.join("fleet.toml"))
            .env("RUST_LOG", "info")
            .env_remove("VIGIL_API_TOKEN")
            .env_remove("VIGIL_WEBHOOK_SECRET")
            .env_remove("VIGIL_HEARTBEAT_SECRET")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
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
                if let Some(f) = on_line.as_mut() {
                    f(&line);
                }
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

    /// The process id (of the controller itself once a wrapper has exec'ed it).
    pub fn pid(&self) -> u32 {
        self.child.id()
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

    /// Waits until the published guard shows `left` budget tokens: a decision is in the
    /// store (and in `/api/actions`) before the next published view shows its spending.
    pub async fn wait_budget_left(&self, left: u64) {
        self.wait_for(&format!("budget_left {left}"), || async {
            (self.guard().await["budget_left"] == left).then_some(())
        })
        .await
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

// === heartbeats ===

/// Target `id`'s heartbeat key as docs/controller.md defines it, computed here rather
/// than with the controller's own function: `hex(HMAC-SHA256(secret, "heartbeat:" + id))`.
pub fn heartbeat_key(secret: &str, id: &str) -> String {
    use hmac::Mac;
    let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    m.update(format!("heartbeat:{id}").as_bytes());
    hex::encode(m.finalize().into_bytes())
}

/// `sha256=<hex HMAC-SHA256(key, "<ms>." + body)>`.
pub fn heartbeat_signature(key: &str, ms: i64, body: &str) -> String {
    use hmac::Mac;
    let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(key.as_bytes()).unwrap();
    m.update(format!("{ms}.{body}").as_bytes());
    format!("sha256={}", hex::encode(m.finalize().into_bytes()))
}

/// The wall clock in UNIX milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A heartbeat as a request: body, and optionally (timestamp, signature) headers.
pub struct Beat {
    pub body: String,
    pub signed: Option<(i64, String)>,
}

impl Beat {
    /// `{"target": id, "report": report?}` signed now with `key`.
    pub fn signed(id: &str, report: Option<Value>, key: &str) -> Beat {
        Self::signed_at(id, report, key, now_ms())
    }

    pub fn signed_at(id: &str, report: Option<Value>, key: &str, ms: i64) -> Beat {
        let mut b = Self::unsigned(id, report);
        b.signed = Some((ms, heartbeat_signature(key, ms, &b.body)));
        b
    }

    pub fn unsigned(id: &str, report: Option<Value>) -> Beat {
        let mut v = serde_json::json!({ "target": id });
        if let Some(r) = report {
            v["report"] = r;
        }
        Beat {
            body: v.to_string(),
            signed: None,
        }
    }
}

impl Controller {
    /// Posts a heartbeat; returns the status code.
    pub async fn beat(&self, beat: &Beat) -> u16 {
        let mut req = reqwest::Client::new()
            .post(self.url("/api/heartbeat"))
            .header("content-type", "application/json")
            .body(beat.body.clone());
        if let Some((ms, sig)) = &beat.signed {
            req = req
                .header("X-Vigil-Timestamp", ms.to_string())
                .header("X-Vigil-Signature", sig);
        }
        req.send().await.expect("POST heartbeat").status().as_u16()
    }

    /// `/metrics` as text.
    pub async fn metrics_text(&self) -> String {
        reqwest::get(self.url("/metrics"))
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("metrics text")
    }
}

/// The value of the sample `series` (exact name and labels) in a metrics text, if any.
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        let rest = l.strip_prefix(series)?;
        rest.strip_prefix(' ')?.split(' ').next()?.parse().ok()
    })
}

/// One keep-alive connection to a test's own health endpoint (GETs without bodies,
/// answered in order): each request head goes to `fails`, and the answer is
/// `{"status":"pass"}` (200) or `{"status":"fail"}` (500, a failing report naming no
/// check) as it says.
pub async fn serve_health(mut conn: tokio::net::TcpStream, mut fails: impl FnMut(&str) -> bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_string();
        buf.drain(..end + 4);
        let (status, body) = if fails(&head) {
            ("500 Internal Server Error", r#"{"status":"fail"}"#)
        } else {
            ("200 OK", r#"{"status":"pass"}"#)
        };
        let answer = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/health+json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if conn.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}
