//! `vigil deploy` against a real fleet: five example services (`vigil example-service`)
//! on loopback, an install hook that "installs" a revision by having the service
//! restarted with `--revision R` (it reports it back as health+json `releaseId`), and a
//! drain hook that logs. A supervisor thread in the test owns the services: it restarts
//! a host when the install hook asked for another revision, and records any restart of
//! a host that is not drained at that moment (a floor violation).
//!
//! - a good revision completes; every host ends on it; at most `fleet - floor` hosts are
//!   ever drained at once and none is restarted in service;
//! - a bad revision is halted in its first wave and rolled back, marked bad, and a
//!   second `run` of it is refused, whether its hosts report back failing, never show
//!   it (the install "worked" but the old revision still runs: the progress deadline),
//!   or its install fails (at once);
//! - SIGKILL of the deployer (and its hook) mid-rollout, twice (once after an install
//!   finished but before its outcome was recorded), then `run` again: the rollout
//!   resumes, every host ends on the revision, none is installed twice (the hook's log
//!   of completed installs), and the deployer re-ran only the step in flight at each
//!   kill (the hook's log of invocations);
//! - the same rollout through a signed install webhook and an HTTP drain API;
//! - the same rollout draining its hosts through a real `vigil lb`'s admin API
//!   (`drain.kind = "http"`): the balancer never routes to a host being restarted;
//! - a second `run` while one drives is refused; `abort` reaches the running one;
//! - with a real `vigil controller`: a host it holds counts against the floor and is
//!   not touched, the hosts can be its targets, and a controller that cannot be read
//!   holds the rollout (fail closed) until it answers.
//! - issue 37, judged by what the clients see: six services behind a real `vigil lb`
//!   with its defaults (slow start included), ~165 requests/s of GET and POST through
//!   it, the rollout's defaults but the bake, `[lb] admin` read for the verdict: a
//!   revision answering 500 to 5% of its POSTs while its health passes is halted in
//!   wave 1 with a 15 s and a 40 s bake (its host drained before its reinstall), and
//!   the good revision completes, every wave passing by the balancer's counts, with no
//!   client error.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

mod lb_support;

/// Generous bound for a whole rollout of five hosts on a loaded 2-core machine.
const DEADLINE: Duration = Duration::from_secs(120);
/// Hosts and zones: three in `a`, two in `b`.
const ZONES: [&str; 5] = ["a", "a", "a", "b", "b"];
/// The floor: 60% of 5 = 3 in service, so at most 2 hosts drained at once.
const MIN_HEALTHY: &str = "60%";
const MAX_DRAINED: usize = 2;

fn vigil_bin() -> std::ffi::OsString {
    std::env::var_os("VIGIL_TEST_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_vigil").into())
}

/// A port free now, below the kernel's ephemeral range (32768 and up by default): the
/// services are restarted on the same port, and in the moment between two runs a port
/// from the ephemeral range can be taken as the local port of some outgoing connection
/// (a probe), which would keep the service from listening again.
fn free_port() -> u16 {
    use std::sync::atomic::AtomicU16;
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let seed = (std::process::id() as u64 * 7919
        + std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos() as u64)
        % 10_000;
    let _ = NEXT.compare_exchange(0, seed as u16, Ordering::SeqCst, Ordering::SeqCst);
    loop {
        let port = 20_000 + NEXT.fetch_add(1, Ordering::SeqCst) % 10_000;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

struct Host {
    id: String,
    port: u16,
    /// The application listener's port, when a balancer routes to it (else any port).
    app: Option<u16>,
    revision: String,
    child: Option<Child>,
}

/// Five example services and the supervisor that "installs" revisions on them.
struct Fleet {
    dir: PathBuf,
    hosts: Arc<Mutex<Vec<Host>>>,
    violations: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    supervisor: Option<std::thread::JoinHandle<()>>,
    /// With a real balancer in front: its admin port. A host is then drained when the
    /// balancer says so, not when the drain hook's log does.
    lb_admin: Arc<OnceLock<u16>>,
}

/// Starts a host's service on `revision` (its application listener on `app`, else any
/// port); a revision named `bad*` fails its health (its disk check's floor is 100%
/// free), as a broken build would. (A revision named `leaky*` answers 500 to 5% of its
/// POSTs while its health passes: [`leak_posts`], once it listens.)
fn start_service(dir: &Path, id: &str, app: Option<u16>, port: u16, revision: &str) -> Child {
    let data = dir.join(format!("data-{id}"));
    std::fs::create_dir_all(&data).unwrap();
    let fail_below = if revision.starts_with("bad") {
        "100%"
    } else {
        "0%"
    };
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("service-{id}.log")))
        .unwrap();
    Command::new(vigil_bin())
        .args(["example-service", "--listen"])
        .arg(format!("127.0.0.1:{}", app.unwrap_or(0)))
        .arg("--health-listen")
        .arg(format!("127.0.0.1:{port}"))
        .args(["--db", "postgres://nobody@127.0.0.1:1/none"])
        .arg("--data-dir")
        .arg(&data)
        .args(["--disk-fail-below", fail_below, "--disk-warn-below", "off"])
        .args(["--check-interval", "100ms", "--drain-delay", "0s"])
        .args(["--workers", "1", "--name", id, "--revision", revision])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start vigil example-service")
}

/// The hosts drained now, from the drain hook's log (`drain h` / `undrain h` lines).
fn drained_now(dir: &Path) -> BTreeSet<String> {
    let mut drained = BTreeSet::new();
    for line in std::fs::read_to_string(dir.join("drains.log"))
        .unwrap_or_default()
        .lines()
    {
        match line.split_once(' ') {
            Some(("drain", h)) => {
                drained.insert(h.to_string());
            }
            Some(("undrain", h)) => {
                drained.remove(h);
            }
            _ => {}
        }
    }
    drained
}

/// The most hosts ever drained at once, from the drain hook's log.
fn max_drained(dir: &Path) -> usize {
    let mut drained = BTreeSet::new();
    let mut max = 0;
    for line in std::fs::read_to_string(dir.join("drains.log"))
        .unwrap_or_default()
        .lines()
    {
        match line.split_once(' ') {
            Some(("drain", h)) => {
                drained.insert(h.to_string());
            }
            Some(("undrain", h)) => {
                drained.remove(h);
            }
            _ => {}
        }
        max = max.max(drained.len());
    }
    max
}

/// Whether the balancer at admin port `admin` has `target` drained (in any pool).
fn lb_drained(admin: u16, target: &str) -> bool {
    let Some((200, body)) = http_get::get(admin, "/admin/targets") else {
        return false;
    };
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    v["pools"].as_object().is_some_and(|pools| {
        pools.values().any(|p| {
            p["targets"].as_array().is_some_and(|ts| {
                ts.iter()
                    .any(|t| t["addr"] == target && t["drained"] == true)
            })
        })
    })
}

impl Fleet {
    /// The hosts' ids (`host:port`), and each as a `vigil lb` target (`{ addr = "..." }`).
    fn lb_targets(&self) -> (Vec<String>, Vec<String>) {
        let ids: Vec<String> = self
            .hosts
            .lock()
            .unwrap()
            .iter()
            .map(|h| h.id.clone())
            .collect();
        let targets = ids
            .iter()
            .map(|id| format!("{{ addr = \"{id}\" }}"))
            .collect();
        (ids, targets)
    }

    fn start(dir: &Path, revision: &str) -> Fleet {
        Self::start_ids(dir, revision, false)
    }

    /// Five hosts named `h0`..`h4`, or with `addr_ids` by the `host:port` a balancer
    /// knows them by (their health listener's).
    fn start_ids(dir: &Path, revision: &str, addr_ids: bool) -> Fleet {
        let hosts: Vec<Host> = ZONES
            .iter()
            .enumerate()
            .map(|(i, _)| {
                let port = free_port();
                let id = if addr_ids {
                    format!("127.0.0.1:{port}")
                } else {
                    format!("h{i}")
                };
                let child = start_service(dir, &id, None, port, revision);
                Host {
                    id,
                    port,
                    app: None,
                    revision: revision.to_string(),
                    child: Some(child),
                }
            })
            .collect();
        Self::supervise(dir, hosts, revision)
    }

    /// `n` hosts behind a balancer, each named by its application listener's
    /// `host:port` (the balancer's target) and probed on its health listener.
    fn start_behind_lb(dir: &Path, revision: &str, n: usize) -> Fleet {
        let hosts = (0..n)
            .map(|_| {
                let (app, port) = (free_port(), free_port());
                let id = format!("127.0.0.1:{app}");
                let child = start_service(dir, &id, Some(app), port, revision);
                Host {
                    id,
                    port,
                    app: Some(app),
                    revision: revision.to_string(),
                    child: Some(child),
                }
            })
            .collect();
        Self::supervise(dir, hosts, revision)
    }

    /// Starts the supervisor of `hosts` and waits until they all serve `revision`.
    fn supervise(dir: &Path, hosts: Vec<Host>, revision: &str) -> Fleet {
        let hosts = Arc::new(Mutex::new(hosts));
        let violations = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let lb_admin = Arc::new(OnceLock::new());
        let supervisor = {
            let (dir, hosts, violations, stop, lb_admin) = (
                dir.to_path_buf(),
                hosts.clone(),
                violations.clone(),
                stop.clone(),
                lb_admin.clone(),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for h in hosts.lock().unwrap().iter_mut() {
                        let want = std::fs::read_to_string(dir.join(format!("want-{}", h.id)))
                            .map(|s| s.trim().to_string())
                            .unwrap_or_default();
                        if want.is_empty() || want == h.revision {
                            continue;
                        }
                        let drained = match lb_admin.get() {
                            Some(&admin) => lb_drained(admin, &h.id),
                            None => drained_now(&dir).contains(&h.id),
                        };
                        if !drained {
                            violations.lock().unwrap().push(format!(
                                "{} restarted onto {want} while in service (not drained)",
                                h.id
                            ));
                        }
                        if let Some(mut c) = h.child.take() {
                            let _ = c.kill();
                            let _ = c.wait();
                        }
                        h.child = Some(start_service(&dir, &h.id, h.app, h.port, &want));
                        if let (Some(app), true) = (h.app, want.starts_with("leaky")) {
                            leak_posts(app);
                        }
                        h.revision = want;
                    }
                    std::thread::sleep(Duration::from_millis(30));
                }
            })
        };
        let fleet = Fleet {
            dir: dir.to_path_buf(),
            hosts,
            violations,
            stop,
            supervisor: Some(supervisor),
            lb_admin,
        };
        fleet.write_hooks();
        fleet.wait_serving(revision);
        fleet
    }

    /// The install and drain hooks. The install hook keeps the idempotency contract of
    /// docs/deploy.md: a key it completed is done (exit 0, nothing installed again).
    fn write_hooks(&self) {
        let d = self.dir.display();
        std::fs::write(
            self.dir.join("install.sh"),
            format!(
                r#"set -e
echo "$VIGIL_HOST_ID $VIGIL_REVISION $VIGIL_IDEMPOTENCY_KEY $VIGIL_ATTEMPT" >> {d}/invocations.log
if grep -qF " $VIGIL_IDEMPOTENCY_KEY" {d}/installs.log 2>/dev/null; then exit 0; fi
case "$VIGIL_REVISION" in
  stuck*) exit 0 ;;  # says installed, leaves the old revision running
  broken*) echo "no such release: $VIGIL_REVISION" >&2; exit 1 ;;
esac
sleep 0.2
echo "$VIGIL_REVISION" > {d}/want-$VIGIL_HOST_ID.tmp
mv {d}/want-$VIGIL_HOST_ID.tmp {d}/want-$VIGIL_HOST_ID
echo "$VIGIL_HOST_ID $VIGIL_REVISION $VIGIL_IDEMPOTENCY_KEY" >> {d}/installs.log
if [ -f {d}/pause-after-install ]; then sleep 30; fi
"#
            ),
        )
        .unwrap();
        std::fs::write(
            self.dir.join("drain.sh"),
            format!("echo \"$VIGIL_DRAIN $VIGIL_HOST_ID\" >> {d}/drains.log\n"),
        )
        .unwrap();
    }

    /// deploy.toml with the exec hooks.
    fn config(&self, progress_deadline: &str) -> PathBuf {
        let d = self.dir.display();
        self.config_with(
            &format!("bake = \"1s\"\nprogress_deadline = \"{progress_deadline}\""),
            &format!(
                r#"[install.exec]
command = ["sh", "{d}/install.sh"]
timeout = "20s"
[drain]
kind = "exec"
command = ["sh", "{d}/drain.sh"]
"#
            ),
        )
    }

    /// deploy.toml with these `[rollout]` keys and these hook tables.
    fn config_with(&self, rollout: &str, hooks: &str) -> PathBuf {
        let mut text = format!(
            r#"name = "web"
store = "data/vigil.db"
[rollout]
min_healthy = "{MIN_HEALTHY}"
min_samples = 3
{rollout}
[probe]
interval = "200ms"
timeout = "1s"
{hooks}
"#
        );
        for (h, zone) in self.hosts.lock().unwrap().iter().zip(ZONES) {
            text.push_str(&format!(
                "[[hosts]]\nid = \"{}\"\nurl = \"http://127.0.0.1:{}\"\nzone = \"{zone}\"\n",
                h.id, h.port
            ));
        }
        let path = self.dir.join("deploy.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Each host's health answer now: (HTTP status, releaseId).
    fn answers(&self) -> Vec<(String, u16, String)> {
        let ports: Vec<(String, u16)> = self
            .hosts
            .lock()
            .unwrap()
            .iter()
            .map(|h| (h.id.clone(), h.port))
            .collect();
        ports
            .into_iter()
            .map(|(id, port)| {
                let (code, rev) = match http_get::health(port) {
                    Some((code, body)) => {
                        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                        (code, v["releaseId"].as_str().unwrap_or("").to_string())
                    }
                    None => (0, String::new()),
                };
                (id, code, rev)
            })
            .collect()
    }

    /// Waits until every host answers 200 with `revision`.
    fn wait_serving(&self, revision: &str) {
        let started = Instant::now();
        loop {
            let a = self.answers();
            if a.iter()
                .all(|(_, code, rev)| *code == 200 && rev == revision)
            {
                return;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "hosts never all served {revision}: {a:?}\n{}",
                self.diagnostics()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap_or_default()
    }

    /// Completed installs per (host, revision).
    fn installs(&self) -> BTreeMap<(String, String), usize> {
        let mut n = BTreeMap::new();
        for l in self.log("installs.log").lines() {
            let mut w = l.split(' ');
            if let (Some(h), Some(r)) = (w.next(), w.next()) {
                *n.entry((h.to_string(), r.to_string())).or_default() += 1;
            }
        }
        n
    }

    /// Everything a failed assertion should show: the deployer's log, the hooks' logs
    /// and the end of each service's log.
    fn diagnostics(&self) -> String {
        let mut out = format!(
            "--- deploy.log\n{}\n--- installs.log\n{}\n--- invocations.log\n{}\n--- drains.log\n{}",
            self.log("deploy.log"),
            self.log("installs.log"),
            self.log("invocations.log"),
            self.log("drains.log")
        );
        for h in self.hosts.lock().unwrap().iter() {
            let log = self.log(&format!("service-{}.log", h.id));
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            out.push_str(&format!(
                "\n--- service-{}.log (last lines, newest first)\n{}",
                h.id,
                tail.join("\n")
            ));
        }
        out
    }

    fn violations(&self) -> Vec<String> {
        self.violations.lock().unwrap().clone()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(s) = self.supervisor.take() {
            let _ = s.join();
        }
        for h in self.hosts.lock().unwrap().iter_mut() {
            if let Some(mut c) = h.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Turns on the example service's POST fault (5% of `POST /orders` answer 500) on the
/// application port `app`, waiting up to 10 s for it to listen.
fn leak_posts(app: u16) {
    let started = Instant::now();
    while http_get::call(app, "POST", "/fault/post-errors?percent=5", None, "") != 200 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the service on {app} never took the POST fault"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A tiny blocking HTTP GET of `/health` on a port (no client runtime needed).
mod http_get {
    use std::io::{Read, Write};

    pub fn health(port: u16) -> Option<(u16, String)> {
        get(port, "/health")
    }

    /// `method path` with a bearer token and a JSON body: the status (0: no answer).
    pub fn call(port: u16, method: &str, path: &str, token: Option<&str>, body: &str) -> u16 {
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            return 0;
        };
        let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(5)));
        let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if s.write_all(req.as_bytes()).is_err() {
            return 0;
        }
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        text.split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0)
    }

    /// GET `path`: the status and the JSON body.
    pub fn get(port: u16, path: &str) -> Option<(u16, String)> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.set_read_timeout(Some(std::time::Duration::from_secs(2)))
            .ok()?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        let code = text.split(' ').nth(1)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n")?.1;
        // The body may be chunked: keep from the first `{` to the last `}`.
        let body = body.get(body.find('{')?..=body.rfind('}')?)?.to_string();
        Some((code, body))
    }
}

/// A `vigil deploy` run in its own process group (so a SIGKILL takes its hook too, as
/// a machine crash would), its stderr kept in a file.
struct Deploy {
    child: Child,
}

fn deploy(dir: &Path, config: &Path, args: &[&str]) -> Deploy {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("deploy.log"))
        .unwrap();
    let child = Command::new(vigil_bin())
        .arg("deploy")
        .arg("-c")
        .arg(config)
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .process_group(0)
        .spawn()
        .expect("start vigil deploy");
    Deploy { child }
}

impl Deploy {
    /// Waits for the exit code.
    fn wait(mut self, dir: &Path) -> i32 {
        let started = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code().unwrap_or(-1);
            }
            assert!(
                started.elapsed() < DEADLINE,
                "vigil deploy did not finish; its log:\n{}",
                std::fs::read_to_string(dir.join("deploy.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL the deployer and everything it started (its hooks).
    fn kill_group(mut self) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        rustix::process::kill_process_group(pid, rustix::process::Signal::KILL)
            .expect("SIGKILL the deployer's group");
        self.child.wait().unwrap();
    }
}

impl Drop for Deploy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `vigil deploy ARGS` to its end: (exit code, stdout, stderr).
fn deploy_output(config: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(vigil_bin())
        .arg("deploy")
        .arg("-c")
        .arg(config)
        .args(args)
        .output()
        .expect("run vigil deploy");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn status_json(config: &Path) -> Value {
    let (code, out, err) = deploy_output(config, &["status", "--json"]);
    assert_eq!(code, 0, "status: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("status --json: {e}: {out}"))
}

/// Waits until the hook's log of completed installs has `n` lines.
fn wait_installs(fleet: &Fleet, n: usize) {
    let started = Instant::now();
    while fleet.log("installs.log").lines().count() < n {
        assert!(
            started.elapsed() < DEADLINE,
            "never {n} installs\n{}",
            fleet.diagnostics()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn assert_floor_kept(fleet: &Fleet) {
    assert!(
        fleet.violations().is_empty(),
        "hosts were restarted in service: {:?}",
        fleet.violations()
    );
    let max = max_drained(&fleet.dir);
    assert!(
        max <= MAX_DRAINED,
        "{max} hosts drained at once: the floor ({MIN_HEALTHY} of 5) allows {MAX_DRAINED}\n{}",
        fleet.log("drains.log")
    );
    assert!(
        drained_now(&fleet.dir).is_empty(),
        "every host is back in service at the end: {:?}",
        drained_now(&fleet.dir)
    );
}

#[test]
fn a_good_revision_rolls_out_in_waves_within_the_floor() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = Fleet::start(dir.path(), "v1");
    let config = fleet.config("30s");

    let (code, plan, err) = deploy_output(&config, &["plan", "--revision", "v2"]);
    assert_eq!(code, 0, "plan: {err}");
    assert!(
        plan.contains("wave 1 of v2: h0, h1 (2 hosts")
            && plan.contains("wave 2 of v2: h2 (1 hosts")
            && plan.contains("wave 3 of v2: h3, h4 (2 hosts"),
        "the plan shows the waves, one zone at a time within the floor:\n{plan}"
    );
    assert!(
        fleet.log("installs.log").is_empty() && fleet.log("drains.log").is_empty(),
        "a plan changes nothing"
    );

    let code = deploy(dir.path(), &config, &["run", "--revision", "v2"]).wait(dir.path());
    let log = fleet.log("deploy.log");
    assert_eq!(code, 0, "the rollout completes\n{}", fleet.diagnostics());
    assert!(log.contains("completed: every host runs v2"), "{log}");
    fleet.wait_serving("v2");
    let installs = fleet.installs();
    assert_eq!(installs.len(), 5, "every host installed once: {installs:?}");
    assert!(installs.values().all(|n| *n == 1), "{installs:?}");
    assert_floor_kept(&fleet);

    let s = status_json(&config);
    assert_eq!(s["phase"]["phase"], "completed", "{s}");
    assert_eq!(s["rollout"]["finished"], true, "{s}");
    let (code, explain, _) = deploy_output(&config, &["explain"]);
    assert_eq!(code, 0);
    assert!(
        explain.contains("wave 3 of v2") && explain.contains("passes"),
        "explain shows the stored decisions:\n{explain}"
    );
}

/// Deploys a bad `revision`: the first wave (h0, h1) must be halted and rolled back,
/// the revision marked bad, a second run refused, the other hosts never touched.
fn bad_revision_is_rolled_back(revision: &str, deadline: &str, installed_bad: bool) {
    let dir = tempfile::tempdir().unwrap();
    let fleet = Fleet::start(dir.path(), "v1");
    let config = fleet.config(deadline);

    let code = deploy(dir.path(), &config, &["run", "--revision", revision]).wait(dir.path());
    let log = fleet.log("deploy.log");
    assert_eq!(
        code,
        2,
        "a rolled back rollout exits 2\n{}",
        fleet.diagnostics()
    );
    assert!(
        log.contains(&format!("revision {revision} marked bad")) && log.contains("rolled back"),
        "{log}"
    );
    fleet.wait_serving("v1");
    let installs = fleet.installs();
    let bad: BTreeSet<&str> = installs
        .keys()
        .filter(|(_, r)| r == revision)
        .map(|(h, _)| h.as_str())
        .collect();
    let expected: BTreeSet<&str> = if installed_bad {
        BTreeSet::from(["h0", "h1"])
    } else {
        BTreeSet::new()
    };
    assert_eq!(
        bad, expected,
        "only the first wave got the bad revision: {installs:?}"
    );
    let touched: BTreeSet<&str> = fleet
        .log("invocations.log")
        .lines()
        .filter_map(|l| l.split(' ').next())
        .map(|h| match h {
            "h0" => "h0",
            "h1" => "h1",
            _ => "other",
        })
        .collect();
    assert!(
        !touched.contains("other"),
        "the install hook ran only for the first wave\n{}",
        fleet.diagnostics()
    );
    for h in ["h0", "h1"] {
        assert_eq!(
            installs.get(&(h.to_string(), "v1".to_string())),
            Some(&1),
            "{h} got its previous revision back: {installs:?}"
        );
    }
    assert_floor_kept(&fleet);

    let s = status_json(&config);
    assert_eq!(s["phase"]["phase"], "rolled_back", "{s}");
    assert_eq!(s["bad_revisions"], serde_json::json!([revision]), "{s}");

    let (code, _, err) = deploy_output(&config, &["run", "--revision", revision]);
    assert_eq!(code, 5, "a second run of a bad revision is refused: {err}");
    assert!(err.contains("marked bad"), "{err}");
    assert_eq!(fleet.installs(), installs, "a refused run installs nothing");
}

#[test]
fn a_revision_whose_hosts_report_back_failing_is_rolled_back_and_refused_after() {
    bad_revision_is_rolled_back("bad2", "8s", true);
}

#[test]
fn a_revision_that_never_shows_up_on_its_hosts_is_rolled_back_at_the_progress_deadline() {
    bad_revision_is_rolled_back("stuck2", "5s", false);
}

#[test]
fn a_failed_install_rolls_back_at_once() {
    let started = Instant::now();
    // A 60 s deadline that is never reached: the failed install decides.
    bad_revision_is_rolled_back("broken2", "60s", false);
    assert!(
        started.elapsed() < Duration::from_secs(50),
        "the rollback did not wait for the progress deadline"
    );
}

#[test]
fn a_deployer_killed_mid_rollout_resumes_without_skipping_or_repeating_a_host() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = Fleet::start(dir.path(), "v1");
    let config = fleet.config("30s");

    // The first kill lands after the hook installed but before it exited: the
    // deployer has not recorded the outcome, so it must run the hook again with the
    // same key, and the hook must not install again.
    std::fs::write(dir.path().join("pause-after-install"), "").unwrap();
    let d = deploy(dir.path(), &config, &["run", "--revision", "v2"]);
    wait_installs(&fleet, 1);
    d.kill_group();
    std::fs::remove_file(dir.path().join("pause-after-install")).unwrap();
    let after_first_kill = status_json(&config);
    assert_eq!(
        after_first_kill["rollout"]["finished"], false,
        "killed mid-rollout: {after_first_kill}"
    );

    // Resumed by naming the same revision; killed again a little later.
    let d = deploy(dir.path(), &config, &["run", "--revision", "v2"]);
    wait_installs(&fleet, 3);
    std::thread::sleep(Duration::from_millis(150));
    d.kill_group();

    // Resumed without naming it.
    let code = deploy(dir.path(), &config, &["run"]).wait(dir.path());
    let log = fleet.log("deploy.log");
    assert_eq!(
        code,
        0,
        "the resumed rollout completes\n{}",
        fleet.diagnostics()
    );
    assert!(log.contains("resuming the rollout in progress"), "{log}");
    fleet.wait_serving("v2");

    let installs = fleet.installs();
    assert_eq!(installs.len(), 5, "no host skipped: {installs:?}");
    assert!(
        installs.values().all(|n| *n == 1),
        "no host installed twice: {installs:?}\n{}",
        fleet.log("installs.log")
    );
    // The deployer itself re-runs at most the install in flight at each kill.
    let invocations = fleet.log("invocations.log");
    let keys: BTreeSet<&str> = invocations
        .lines()
        .filter_map(|l| l.split(' ').nth(2))
        .collect();
    assert_eq!(
        keys.len(),
        5,
        "one key per host and revision:\n{invocations}"
    );
    let reruns = invocations.lines().count() - keys.len();
    assert!(
        (1..=2).contains(&reruns),
        "{reruns} installs re-run: the one the first kill interrupted, and at most one more\n{invocations}"
    );
    assert_floor_kept(&fleet);
}

/// An install webhook and a drain API on loopback, as a deployment service and a
/// balancer would run them: checks the signature, deduplicates on the idempotency key,
/// and does what the exec hooks do (asks the supervisor for the revision, logs drains).
fn webhook_receiver(dir: &Path, secret: &'static str) -> String {
    use std::io::{BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let dir = dir.to_path_buf();
    std::thread::spawn(move || {
        let append = |name: &str, line: String| {
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join(name))
                .unwrap();
            writeln!(f, "{line}").unwrap();
        };
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let Ok(Some(req)) = vigil_testkit::read_request(&mut reader) else {
                continue;
            };
            let (headers, body) = (&req.headers, &req.body);
            let status = match (req.method.as_str(), req.path.as_str()) {
                ("POST", "/install") => {
                    let sig = headers
                        .get("x-vigil-signature")
                        .cloned()
                        .unwrap_or_default();
                    let event: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
                    let key = headers.get("idempotency-key").cloned().unwrap_or_default();
                    if sig != vigil_controller::actuator::sign(secret.as_bytes(), body)
                        || key.is_empty()
                        || event["idempotency_key"] != key.as_str()
                    {
                        append(
                            "violations.log",
                            format!("bad install request: {sig} {key} {event}"),
                        );
                        "401 Unauthorized"
                    } else if event["kind"] == "install" {
                        let (h, r) = (
                            event["host"].as_str().unwrap_or("").to_string(),
                            event["revision"].as_str().unwrap_or("").to_string(),
                        );
                        append("invocations.log", format!("{h} {r} {key}"));
                        let done = std::fs::read_to_string(dir.join("installs.log"))
                            .unwrap_or_default()
                            .lines()
                            .any(|l| l.ends_with(&format!(" {key}")));
                        if !done {
                            std::fs::write(dir.join(format!("want-{h}")), &r).unwrap();
                            append("installs.log", format!("{h} {r} {key}"));
                        }
                        "200 OK"
                    } else {
                        "200 OK"
                    }
                }
                ("POST", p) if p.starts_with("/drain/") => {
                    append("drains.log", format!("drain {}", &p["/drain/".len()..]));
                    "200 OK"
                }
                ("DELETE", p) if p.starts_with("/drain/") => {
                    append("drains.log", format!("undrain {}", &p["/drain/".len()..]));
                    "200 OK"
                }
                _ => "404 Not Found",
            };
            let _ = stream.write_all(
                format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .as_bytes(),
            );
        }
    });
    base
}

#[test]
fn a_signed_install_webhook_and_an_http_drain_api_drive_a_rollout() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = Fleet::start(dir.path(), "v1");
    let base = webhook_receiver(dir.path(), "s3cret");
    let config = fleet.config_with(
        "bake = \"1s\"\nprogress_deadline = \"30s\"",
        &format!(
            r#"[install]
kind = "webhook"
[install.webhook]
url = "{base}/install"
secret = "s3cret"
[drain]
kind = "http"
url = "{base}/drain/{{host}}"
"#
        ),
    );
    let code = deploy(dir.path(), &config, &["run", "--revision", "v2"]).wait(dir.path());
    assert_eq!(code, 0, "the rollout completes\n{}", fleet.diagnostics());
    assert!(
        fleet.log("violations.log").is_empty(),
        "every install request is signed and keyed: {}",
        fleet.log("violations.log")
    );
    fleet.wait_serving("v2");
    let installs = fleet.installs();
    assert_eq!(installs.len(), 5, "every host installed: {installs:?}");
    assert!(installs.values().all(|n| *n == 1), "{installs:?}");
    assert_eq!(
        fleet.log("drains.log").lines().count(),
        10,
        "each host drained and undrained through the API once\n{}",
        fleet.log("drains.log")
    );
    assert_floor_kept(&fleet);
}

#[test]
fn abort_stops_a_running_rollout_between_waves() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = Fleet::start(dir.path(), "v1");
    let d = fleet.dir.display().to_string();
    // A long bake: the first wave sits baking until the abort.
    let config = fleet.config_with(
        "bake = \"10m\"\nprogress_deadline = \"30s\"",
        &format!(
            "[install.exec]\ncommand = [\"sh\", \"{d}/install.sh\"]\n[drain]\nkind = \"exec\"\ncommand = [\"sh\", \"{d}/drain.sh\"]\n"
        ),
    );
    let run = deploy(dir.path(), &config, &["run", "--revision", "v2"]);
    let started = Instant::now();
    while status_json(&config)["phase"]["phase"] != "baking" {
        assert!(
            started.elapsed() < DEADLINE,
            "the first wave never baked\n{}",
            fleet.diagnostics()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (code, _, err) = deploy_output(&config, &["run", "--revision", "v2"]);
    assert_eq!(code, 5, "one deployer per deployment: {err}");
    assert!(err.contains("another `vigil deploy run`"), "{err}");
    let (code, out, err) = deploy_output(&config, &["abort", "--reason", "the test says stop"]);
    assert_eq!(code, 0, "abort: {out}{err}");
    assert!(
        out.contains("a deployer is running") && out.contains("aborted: the test says stop"),
        "the running deployer applied it: {out}"
    );
    assert_eq!(
        run.wait(dir.path()),
        4,
        "an aborted rollout exits 4\n{}",
        fleet.diagnostics()
    );
    let installs = fleet.installs();
    assert_eq!(
        installs
            .keys()
            .map(|(h, _)| h.as_str())
            .collect::<BTreeSet<_>>(),
        BTreeSet::from(["h0", "h1"]),
        "no wave after the abort: {installs:?}"
    );
    let (_, explain, _) = deploy_output(&config, &["explain"]);
    assert!(
        explain.contains("aborted by a human: the test says stop"),
        "{explain}"
    );
    let (code, _, err) = deploy_output(&config, &["abort"]);
    assert_eq!(code, 5, "nothing left to abort: {err}");
    assert_floor_kept(&fleet);
}

/// Issue 18: `drain.kind = "http"` against a real `vigil lb` (its admin API's
/// `POST`/`DELETE /admin/targets/<host:port>/drain`): every host is drained before its
/// install and undrained after it reported back, the balancer never routes to a host
/// being restarted, never more than the floor allows are drained at once, and all are
/// back in service at the end.
#[test]
fn a_rollout_drains_its_hosts_through_vigil_lb() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = Fleet::start_ids(dir.path(), "v1", true);
    let (ids, targets) = fleet.lb_targets();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let lb = rt.block_on(lb_support::LbProcess::start(&format!(
        "[pools.web]\ntargets = [{}]\nslow_start_window = \"0s\"\n\
         [pools.web.health_check]\ninterval = \"200ms\"\ntimeout = \"500ms\"\n\
         healthy_threshold = 1\nunhealthy_threshold = 2\n",
        targets.join(", ")
    )));
    let admin = lb.admin;
    let states = || -> Vec<(String, String, bool)> {
        let body = http_get::get(admin, "/admin/targets")
            .map(|(_, b)| b)
            .unwrap_or_default();
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        v["pools"]["web"]["targets"]
            .as_array()
            .map(|ts| {
                ts.iter()
                    .map(|t| {
                        (
                            t["addr"].as_str().unwrap_or("").to_string(),
                            t["state"].as_str().unwrap_or("").to_string(),
                            t["drained"] == true,
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let started = Instant::now();
    while !(states().len() == 5 && states().iter().all(|(_, s, _)| s == "healthy")) {
        assert!(
            started.elapsed() < DEADLINE,
            "the balancer never had every host in service: {:?}\n{}",
            states(),
            lb.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    fleet.lb_admin.set(admin).unwrap();
    // An observer of the balancer: the most hosts drained at once, and which ever were.
    let stop = Arc::new(AtomicBool::new(false));
    let observer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut max, mut seen) = (0, BTreeSet::new());
            while !stop.load(Ordering::Relaxed) {
                let body = http_get::get(admin, "/admin/targets")
                    .map(|(_, b)| b)
                    .unwrap_or_default();
                let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                let drained: Vec<String> = v["pools"]["web"]["targets"]
                    .as_array()
                    .map(|ts| {
                        ts.iter()
                            .filter(|t| t["drained"] == true)
                            .map(|t| t["addr"].as_str().unwrap_or("").to_string())
                            .collect()
                    })
                    .unwrap_or_default();
                max = max.max(drained.len());
                seen.extend(drained);
                std::thread::sleep(Duration::from_millis(10));
            }
            (max, seen)
        })
    };
    let d = fleet.dir.display().to_string();
    let config = fleet.config_with(
        "bake = \"1s\"\nprogress_deadline = \"30s\"",
        &format!(
            r#"[install.exec]
command = ["sh", "{d}/install.sh"]
timeout = "20s"
[drain]
kind = "http"
url = "http://127.0.0.1:{admin}/admin/targets/{{host}}/drain?wait=10s"
"#
        ),
    );
    let code = deploy(dir.path(), &config, &["run", "--revision", "v2"]).wait(dir.path());
    stop.store(true, Ordering::Relaxed);
    let (max, seen) = observer.join().unwrap();
    assert_eq!(
        code,
        0,
        "the rollout completes\n{}\n--- lb log\n{}",
        fleet.diagnostics(),
        lb.log()
    );
    fleet.wait_serving("v2");
    assert!(
        fleet.violations().is_empty(),
        "a host was restarted while the balancer routed to it: {:?}\n{}",
        fleet.violations(),
        lb.log()
    );
    assert!(
        max <= MAX_DRAINED,
        "{max} hosts drained at once: the floor allows {MAX_DRAINED}"
    );
    assert_eq!(
        seen,
        ids.iter().cloned().collect::<BTreeSet<_>>(),
        "the balancer saw every host drained"
    );
    let log = lb.log();
    for id in &ids {
        assert!(
            log.contains(&format!("target {id} drained by the admin API"))
                && log.contains(&format!("target {id} undrained by the admin API")),
            "{id} drained and undrained through the balancer:\n{log}"
        );
    }
    let started = Instant::now();
    while !states()
        .iter()
        .all(|(_, s, drained)| s == "healthy" && !drained)
    {
        assert!(
            started.elapsed() < DEADLINE,
            "every host back in service in the balancer: {:?}",
            states()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A real `vigil controller` probing the fleet's hosts (group `web`) and one more target
/// of another group, on `port`. Its guard is slow to judge (a host restarted by its
/// wave fails a probe or two; only an operator's hold should count here).
struct ControllerProc {
    child: Child,
    port: u16,
}

const CONTROLLER_TOKEN: &str = "deploy-test-token";

impl ControllerProc {
    fn start(fleet: &Fleet, port: u16) -> ControllerProc {
        let dir = fleet.dir.join("controller");
        std::fs::create_dir_all(&dir).unwrap();
        let mut text = format!(
            r#"listen = "127.0.0.1:{port}"
data_dir = "data"
api_token = "{CONTROLLER_TOKEN}"
[probe]
interval = "200ms"
timeout = "1s"
[guard]
grace = "0s"
min_failing = "60s"
[guard.thresholds]
healthy_threshold = 1
unhealthy_threshold = 50
[[targets]]
id = "db0"
url = "http://127.0.0.1:1"
zone = "a"
group = "db"
"#
        );
        for (h, zone) in fleet.hosts.lock().unwrap().iter().zip(ZONES) {
            text.push_str(&format!(
                "[[targets]]\nid = \"{}\"\nurl = \"http://127.0.0.1:{}\"\nzone = \"{zone}\"\ngroup = \"web\"\n",
                h.id, h.port
            ));
        }
        std::fs::write(dir.join("fleet.toml"), text).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(fleet.dir.join("controller.log"))
            .unwrap();
        let child = Command::new(vigil_bin())
            .args(["controller", "-c"])
            .arg(dir.join("fleet.toml"))
            .env("RUST_LOG", "info")
            .env_remove("VIGIL_API_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start vigil controller");
        let c = ControllerProc { child, port };
        // Up once it lists every host with a state from a probe.
        let started = Instant::now();
        loop {
            let states = c.states();
            if states.len() == 6
                && states
                    .iter()
                    .filter(|(id, _)| id.starts_with('h'))
                    .all(|(_, s)| s == "healthy")
            {
                return c;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "the controller never saw the fleet healthy: {states:?}\n{}",
                fleet.log("controller.log")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Each target's display state.
    fn states(&self) -> BTreeMap<String, String> {
        let Some((200, body)) = http_get::get(self.port, "/api/targets") else {
            return BTreeMap::new();
        };
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        v["targets"]
            .as_array()
            .map(|ts| {
                ts.iter()
                    .map(|t| {
                        (
                            t["id"].as_str().unwrap_or("").to_string(),
                            t["state"].as_str().unwrap_or("").to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Puts `host` in maintenance (`true`) or lifts it, through the API with the token.
    fn maintenance(&self, host: &str, on: bool) {
        let (method, body) = if on {
            ("POST", r#"{"reason": "disk swap"}"#)
        } else {
            ("DELETE", "")
        };
        let code = http_get::call(
            self.port,
            method,
            &format!("/api/targets/{host}/maintenance"),
            Some(CONTROLLER_TOKEN),
            body,
        );
        assert!(
            (200..300).contains(&code),
            "{method} maintenance of {host}: HTTP {code}"
        );
        let want = if on { "maintenance" } else { "healthy" };
        let started = Instant::now();
        while self.states().get(host).map(String::as_str) != Some(want) {
            assert!(started.elapsed() < DEADLINE, "{host} never {want}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ControllerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// deploy.toml with the exec hooks and `controller` as its `[controller]` table; with
/// `hosts_from_controller` the `[[hosts]]` tables are left out (the controller's
/// `web` targets are the hosts).
fn controller_config(fleet: &Fleet, controller: &str, hosts_from_controller: bool) -> PathBuf {
    let path = fleet.config("30s");
    let mut text = std::fs::read_to_string(&path).unwrap();
    if hosts_from_controller {
        text.truncate(text.find("[[hosts]]").expect("hosts tables"));
    }
    text.push_str(&format!("[controller]\n{controller}\n"));
    std::fs::write(&path, text).unwrap();
    path
}

/// Waits until the deployer's log says `what`.
fn wait_log(fleet: &Fleet, what: &str) {
    let started = Instant::now();
    while !fleet.log("deploy.log").contains(what) {
        assert!(
            started.elapsed() < DEADLINE / 2,
            "the deployer never said {what:?}\n{}",
            fleet.diagnostics()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Issue 18: a host the controller holds (an operator's maintenance here) counts as out
/// of service against the floor: 5 hosts, floor 3, one held leaves room for one host a
/// wave, not two; the held host is never touched while held, and is deployed once the
/// hold is lifted. The hosts are the controller's `web` targets (its `db` target is
/// left out).
#[test]
fn hosts_the_controller_holds_count_against_the_floor_and_are_not_touched() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = Fleet::start(dir.path(), "v1");
    let controller = ControllerProc::start(&fleet, free_port());
    controller.maintenance("h1", true);
    let config = controller_config(
        &fleet,
        &format!(
            "url = \"http://127.0.0.1:{}\"\nhosts = \"controller\"\ngroup = \"web\"\ntoken = \"{CONTROLLER_TOKEN}\"",
            controller.port
        ),
        true,
    );

    let (code, plan, err) = deploy_output(&config, &["plan", "--revision", "v2"]);
    assert_eq!(code, 0, "plan: {err}");
    assert!(
        plan.contains("host h1: held by the controller")
            && plan.contains("wave 1 of v2: h0 (1 hosts")
            && !plan.contains("db0"),
        "the plan counts the held host: one host a wave, and only the web group:\n{plan}"
    );

    let d = deploy(dir.path(), &config, &["run", "--revision", "v2"]);
    wait_log(
        &fleet,
        "every host left to deploy is held by the controller (h1)",
    );
    let log = fleet.log("deploy.log");
    assert!(
        log.contains("wave 1 of v2: h0 (1 hosts") && log.contains("wave 2 of v2: h2 (1 hosts"),
        "waves of one host while h1 is held, its zone's turn not kept waiting:\n{log}"
    );
    assert!(
        !fleet.log("drains.log").contains(" h1") && !fleet.log("installs.log").contains("h1 "),
        "a held host is never touched:\n{}",
        fleet.diagnostics()
    );
    assert!(
        max_drained(&fleet.dir) <= 1,
        "floor 3 of 5 with one held: at most one host out for the rollout\n{}",
        fleet.log("drains.log")
    );
    controller.maintenance("h1", false);
    let code = d.wait(dir.path());
    assert_eq!(
        code,
        0,
        "released, h1 is deployed and the rollout completes\n{}",
        fleet.diagnostics()
    );
    fleet.wait_serving("v2");
    let log = fleet.log("deploy.log");
    assert!(log.contains("h1 released by the controller"), "{log}");
    assert_eq!(fleet.installs().len(), 5, "{:?}", fleet.installs());
    assert_floor_kept(&fleet);
}

/// Issue 18: a controller that cannot be read holds the rollout before any wave (fail
/// closed, said in the decision log with why), then the rollout goes on once the
/// controller answers; and a deployer that takes its hosts from a controller that is
/// down does not start (exit 1, `run` again later).
#[test]
fn an_unreadable_controller_holds_the_rollout_until_it_answers() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = Fleet::start(dir.path(), "v1");
    let port = free_port();
    let url = format!("url = \"http://127.0.0.1:{port}\"\ntimeout = \"500ms\"");

    let listing = controller_config(&fleet, &format!("{url}\nhosts = \"controller\""), true);
    let (code, _, err) = deploy_output(&listing, &["run", "--revision", "v2"]);
    assert_eq!(code, 1, "no hosts without the controller: {err}");
    assert!(
        err.contains("cannot list the hosts from the controller"),
        "{err}"
    );

    let config = controller_config(&fleet, &url, false);
    let d = deploy(dir.path(), &config, &["run", "--revision", "v2"]);
    wait_log(&fleet, "wave 1 held: the controller cannot be read");
    // Several probe rounds later: still no wave, and said once.
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        fleet.log("drains.log").is_empty() && fleet.log("installs.log").is_empty(),
        "no host touched while the controller cannot be read\n{}",
        fleet.diagnostics()
    );
    let (code, explain, _) = deploy_output(&config, &["explain"]);
    assert_eq!(code, 0);
    assert_eq!(
        explain
            .matches("held: the controller cannot be read")
            .count(),
        1,
        "the hold is stored and said once:\n{explain}"
    );
    assert!(explain.contains("fail closed"), "{explain}");

    let _controller = ControllerProc::start(&fleet, port);
    let code = d.wait(dir.path());
    assert_eq!(
        code,
        0,
        "the rollout goes on once the controller answers\n{}",
        fleet.diagnostics()
    );
    assert!(
        fleet
            .log("deploy.log")
            .contains("the controller can be read again"),
        "{}",
        fleet.log("deploy.log")
    );
    fleet.wait_serving("v2");
    assert_floor_kept(&fleet);
}

// === issue 37: judged by what the clients see ===

/// Client requests per second through the balancer in the issue 37 tests, half `GET /`,
/// half `POST /orders` (the tester's ~165/s over 6 hosts).
const LOAD_RATE: f64 = 165.0;
/// Client connections the load is spread over (kept alive, as browsers and SDKs do).
const LOAD_CONNECTIONS: usize = 4;
/// The load stops by itself after this, whatever the test does.
const LOAD_LIMIT: Duration = Duration::from_secs(420);

/// What the clients got, counted by the load generator.
#[derive(Default)]
struct ClientTally {
    /// (status, when) of every answer; 0: the connection failed.
    answers: Vec<(u16, Instant)>,
}

/// A bounded load of GETs and POSTs through the balancer's port on keep-alive
/// connections, paced to [`LOAD_RATE`]; stops when told or after [`LOAD_LIMIT`].
struct Load {
    stop: Arc<AtomicBool>,
    tally: Arc<Mutex<ClientTally>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(port: u16) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let tally = Arc::new(Mutex::new(ClientTally::default()));
        let every = Duration::from_secs_f64(LOAD_CONNECTIONS as f64 / LOAD_RATE);
        let threads = (0..LOAD_CONNECTIONS)
            .map(|i| {
                let (stop, tally) = (stop.clone(), tally.clone());
                std::thread::spawn(move || {
                    let started = Instant::now();
                    let mut next = started + every.mul_f64(i as f64 / LOAD_CONNECTIONS as f64);
                    let mut conn: Option<std::net::TcpStream> = None;
                    let mut n = i;
                    while !stop.load(Ordering::Relaxed) && started.elapsed() < LOAD_LIMIT {
                        let now = Instant::now();
                        if now < next {
                            std::thread::sleep(next - now);
                        }
                        next += every;
                        n += 1;
                        let req: &[u8] = if n % 2 == 0 {
                            b"GET / HTTP/1.1\r\nHost: web\r\n\r\n"
                        } else {
                            b"POST /orders HTTP/1.1\r\nHost: web\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
                        };
                        let status = keep_alive_call(&mut conn, port, req);
                        tally.lock().unwrap().answers.push((status, Instant::now()));
                    }
                })
            })
            .collect();
        Load {
            stop,
            tally,
            threads,
        }
    }

    /// (answers, 5xx answers, failed connections) between `from` and `to`.
    fn count(&self, from: Instant, to: Instant) -> (usize, usize, usize) {
        let t = self.tally.lock().unwrap();
        let within = t.answers.iter().filter(|(_, at)| *at >= from && *at <= to);
        let (mut n, mut errors, mut failed) = (0, 0, 0);
        for (status, _) in within {
            n += 1;
            match status {
                0 => failed += 1,
                500..=599 => errors += 1,
                _ => {}
            }
        }
        (n, errors, failed)
    }

    fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            t.join().unwrap();
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One request on a kept-alive connection (made again when it broke): the answer's
/// status, 0 when there was none. Reads the head and a `Content-Length` body.
fn keep_alive_call(conn: &mut Option<std::net::TcpStream>, port: u16, req: &[u8]) -> u16 {
    use std::io::{BufRead, BufReader, Read, Write};
    for _ in 0..2 {
        if conn.is_none() {
            let Ok(c) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
                return 0;
            };
            let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
            let _ = c.set_nodelay(true);
            *conn = Some(c);
        }
        let c = conn.as_mut().unwrap();
        if c.write_all(req).is_err() {
            *conn = None;
            continue;
        }
        let mut r = BufReader::new(c.try_clone().unwrap());
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            // Closed before an answer (an idle connection the server dropped): again.
            *conn = None;
            continue;
        }
        let status: u16 = line
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let (mut length, mut close) = (0usize, false);
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                close = true;
                break;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let lower = h.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
            if lower.starts_with("connection:") && lower.contains("close") {
                close = true;
            }
        }
        let mut body = vec![0; length];
        if r.read_exact(&mut body).is_err() || !r.buffer().is_empty() || close {
            *conn = None;
        }
        return status;
    }
    0
}

/// Six example services behind a real `vigil lb` (its defaults: slow start, active
/// checks on `/readyz`, outlier detection) with [`Load`] through it, and a deploy.toml
/// with the rollout's defaults but `bake`, reading the balancer's counts (`[lb]`) and
/// draining through its admin API.
struct LbRollout {
    fleet: Fleet,
    lb: lb_support::LbProcess,
    load: Option<Load>,
    config: PathBuf,
    _rt: tokio::runtime::Runtime,
}

impl LbRollout {
    fn start(dir: &Path, bake: &str) -> LbRollout {
        Self::start_judging(dir, bake, true)
    }

    /// With `by_lb` false, no `[lb]`: the verdict is the host-reported rule.
    fn start_judging(dir: &Path, bake: &str, by_lb: bool) -> LbRollout {
        let fleet = Fleet::start_behind_lb(dir, "v1", 6);
        let (ids, targets) = fleet.lb_targets();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let lb = rt.block_on(lb_support::LbProcess::start(&format!(
            "[pools.web]\ntargets = [{}]\n",
            targets.join(", ")
        )));
        let admin = lb.admin;
        // Every target in service before the load and the rollout start.
        let started = Instant::now();
        loop {
            let body = http_get::get(admin, "/admin/targets")
                .map(|(_, b)| b)
                .unwrap_or_default();
            let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            let healthy = v["pools"]["web"]["targets"].as_array().map_or(0, |ts| {
                ts.iter().filter(|t| t["state"] == "healthy").count()
            });
            if healthy == ids.len() {
                break;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "the balancer never had every host in service: {body}\n{}",
                lb.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        fleet.lb_admin.set(admin).unwrap();
        let d = fleet.dir.display().to_string();
        let lb_table = if by_lb {
            format!("[lb]\nadmin = [\"http://127.0.0.1:{admin}\"]")
        } else {
            String::new()
        };
        let lb_ = &lb_table;
        let mut text = format!(
            r#"name = "web"
store = "data/vigil.db"
[rollout]
bake = "{bake}"
{lb_}
[install.exec]
command = ["sh", "{d}/install.sh"]
timeout = "20s"
[drain]
kind = "http"
url = "http://127.0.0.1:{admin}/admin/targets/{{host}}/drain?wait=10s"
"#
        );
        for h in fleet.hosts.lock().unwrap().iter() {
            text.push_str(&format!(
                "[[hosts]]\nid = \"{}\"\nurl = \"http://127.0.0.1:{}\"\nzone = \"a\"\n",
                h.id, h.port
            ));
        }
        let config = dir.join("deploy.toml");
        std::fs::write(&config, text).unwrap();
        let load = Load::start(lb.port);
        LbRollout {
            fleet,
            lb,
            load: Some(load),
            config,
            _rt: rt,
        }
    }

    /// Runs `vigil deploy run --revision` to its end (bounded by `limit`): the exit code.
    fn run(&self, revision: &str, limit: Duration) -> i32 {
        let mut d = deploy(
            &self.fleet.dir,
            &self.config,
            &["run", "--revision", revision],
        );
        let started = Instant::now();
        loop {
            if let Some(s) = d.child.try_wait().unwrap() {
                return s.code().unwrap_or(-1);
            }
            assert!(
                started.elapsed() < limit,
                "vigil deploy did not finish within {limit:?}\n{}\n--- lb log (end)\n{}",
                self.fleet.diagnostics(),
                self.lb
                    .log()
                    .lines()
                    .rev()
                    .take(40)
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn explain(&self) -> Vec<String> {
        let (code, out, err) = deploy_output(&self.config, &["explain"]);
        assert_eq!(code, 0, "explain: {err}");
        out.lines().map(str::to_string).collect()
    }
}

impl Drop for LbRollout {
    fn drop(&mut self) {
        if let Some(l) = self.load.take() {
            l.stop();
        }
    }
}

/// Issue 37: a revision whose health passes but which answers 500 to 5% of POSTs (half
/// the traffic) is halted in wave 1, judged by the balancer's counts, and rolled back.
fn leaky_revision_is_halted_in_wave_one(bake: &str) {
    let dir = tempfile::tempdir().unwrap();
    let r = LbRollout::start(dir.path(), bake);
    let started = Instant::now();
    let code = r.run("leaky", Duration::from_secs(300));
    let ended = Instant::now();
    let load = r.load.as_ref().unwrap();
    let (answers, errors, failed) = load.count(started, ended);
    let explain = r.explain();
    let text = explain.join("\n");
    eprintln!(
        "bake {bake}: exit {code} after {:.1}s; clients got {answers} answers during the rollout, {errors} 5xx, {failed} failed connections",
        (ended - started).as_secs_f64()
    );
    for l in explain
        .iter()
        .filter(|l| l.contains("fails") || l.contains("wave "))
    {
        eprintln!("  {l}");
    }
    assert_eq!(code, 2, "rolled back\n{text}\n{}", r.fleet.diagnostics());
    assert!(text.contains("wave 1 of leaky"), "{text}");
    assert!(
        !text.contains("wave 2 of leaky"),
        "halted in wave 1: {text}"
    );
    let failed_at = explain
        .iter()
        .find(|l| l.contains("wave 1 fails"))
        .unwrap_or_else(|| panic!("wave 1 fails by its clients' errors: {text}"));
    assert!(
        failed_at.contains("by the balancer's counts"),
        "{failed_at}"
    );
    let installs = r.fleet.installs();
    let leaky: Vec<&(String, String)> = installs.keys().filter(|(_, rev)| rev == "leaky").collect();
    assert_eq!(leaky.len(), 1, "one host got the revision: {installs:?}");
    r.fleet.wait_serving("v1");
    assert!(
        errors < 40,
        "the clients' 500s stop with wave 1 (the host-reported rule let 88 through): {errors}"
    );
    assert_eq!(failed, 0, "no client connection failed");
    assert!(
        r.fleet.violations().is_empty(),
        "{:?}",
        r.fleet.violations()
    );
}

#[test]
fn a_revision_failing_five_percent_of_posts_is_halted_in_wave_one_with_a_15s_bake() {
    leaky_revision_is_halted_in_wave_one("15s");
}

#[test]
fn a_revision_failing_five_percent_of_posts_is_halted_in_wave_one_with_a_40s_bake() {
    leaky_revision_is_halted_in_wave_one("40s");
}

/// Issue 37: the good revision, under the same load and the same rule, completes: every
/// wave passes by the balancer's counts and no client gets an error.
#[test]
fn a_good_revision_behind_vigil_lb_completes_judged_by_its_clients() {
    let dir = tempfile::tempdir().unwrap();
    let r = LbRollout::start(dir.path(), "15s");
    let started = Instant::now();
    let code = r.run("v2", Duration::from_secs(400));
    let ended = Instant::now();
    let (answers, errors, failed) = r.load.as_ref().unwrap().count(started, ended);
    let explain = r.explain();
    let text = explain.join("\n");
    eprintln!(
        "good revision: exit {code} after {:.1}s; clients got {answers} answers, {errors} 5xx, {failed} failed connections",
        (ended - started).as_secs_f64()
    );
    for l in explain
        .iter()
        .filter(|l| l.contains("passes") || l.contains("held"))
    {
        eprintln!("  {l}");
    }
    assert_eq!(code, 0, "completed\n{text}\n{}", r.fleet.diagnostics());
    r.fleet.wait_serving("v2");
    let passes = explain
        .iter()
        .filter(|l| l.contains(" passes: ") && l.contains("by the balancer's counts"))
        .count();
    assert_eq!(
        passes, 6,
        "every wave passes by its clients' answers: {text}"
    );
    assert_eq!((errors, failed), (0, 0), "no client error: {text}");
    assert!(answers > 1000, "the load ran: {answers}");
    assert!(
        r.fleet.violations().is_empty(),
        "{:?}",
        r.fleet.violations()
    );
}

/// The comparison behind issue 37, measured rather than asserted as a fix: without
/// `[lb]` the verdict falls back to the hosts' own samples, which cannot see the leaky
/// revision (its health passes), and wave 1 passes after its bake and the samples it
/// needs. Run it with `--run-ignored only`: it takes the 50 samples per side the
/// host-reported rule needs (about 100 s at the default 2 s probe interval).
#[test]
#[ignore = "a measurement of the fallback (about 2 minutes): --run-ignored only"]
fn the_host_reported_fallback_lets_the_leaky_revision_through_wave_one() {
    let dir = tempfile::tempdir().unwrap();
    let r = LbRollout::start_judging(dir.path(), "15s", false);
    let started = Instant::now();
    let d = deploy(&r.fleet.dir, &r.config, &["run", "--revision", "leaky"]);
    // Until wave 2 starts (a second host gets the revision) or the run ends.
    while r
        .fleet
        .installs()
        .keys()
        .filter(|(_, rev)| rev == "leaky")
        .count()
        < 2
    {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "wave 2 never started\n{}",
            r.fleet.diagnostics()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (answers, errors, _) = r.load.as_ref().unwrap().count(started, Instant::now());
    d.kill_group();
    let text = r.explain().join("\n");
    eprintln!(
        "host-reported rule: wave 1 of leaky passed after {:.1}s; clients got {answers} answers, {errors} 5xx by then\n{text}",
        started.elapsed().as_secs_f64()
    );
    assert!(text.contains("wave 1 passes"), "{text}");
    assert!(errors > 0, "the leaky host served 500s meanwhile");
}
