//! File-descriptor exhaustion in a real child process turns its `/readyz` fail, and
//! closing the descriptors restores pass.
//!
//! The test re-executes its own binary as the child (`VIGIL_FD_CHILD=<limit>` makes the
//! `child_server` entry act as one): the child lowers its soft `RLIMIT_NOFILE`, starts a
//! vigil-instrumented HTTP server on loopback with a [`FileDescriptors`] local check, and
//! prints its address. The parent probes `/readyz` over real HTTP and tells the child to
//! open files until `open` fails with EMFILE (then release a few, so the server can
//! still accept a probe), and later to close them all.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "VIGIL_FD_CHILD";
/// The child's soft descriptor limit: small enough to exhaust in milliseconds, large
/// enough for a runtime, a listener and a few connections.
const CHILD_LIMIT: u64 = 128;
/// Descriptors the child gives back after hitting EMFILE: room to accept probes and to
/// list /proc/self/fd, while still above the check's 95% fail level.
const HEADROOM: usize = 4;

/// The child's entry point, run only by the parent test (with `--ignored`): ignored,
/// so it does not count as a passing test of its own.
#[test]
#[ignore = "child process entry point: run by readyz_fails_when_the_child_runs_out_of_descriptors_and_recovers_when_it_closes_them"]
fn child_server() {
    let Ok(limit) = std::env::var(CHILD_ENV) else {
        return;
    };
    let limit: u64 = limit.parse().expect("VIGIL_FD_CHILD holds the soft limit");
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let hard = getrlimit(Resource::Nofile).maximum;
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(limit),
            maximum: hard,
        },
    )
    .expect("lowering the soft limit is always allowed");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let health = vigil::Health::builder()
            .local(
                "fd:open",
                vigil::checks::FileDescriptors::new(),
                vigil::CheckOptions::every(Duration::from_millis(100))
                    .timeout(Duration::from_secs(1))
                    .jitter(0.0),
            )
            .start();
        let held: Arc<Mutex<Vec<std::fs::File>>> = Arc::default();
        let exhaust = {
            let held = held.clone();
            move || async move {
                let mut held = held.lock().unwrap();
                while let Ok(f) = std::fs::File::open("/proc/self/stat") {
                    held.push(f);
                }
                let opened = held.len();
                let keep = opened.saturating_sub(HEADROOM);
                held.truncate(keep);
                format!("opened {opened}, holding {keep}")
            }
        };
        let release = {
            let held = held.clone();
            move || async move {
                let mut held = held.lock().unwrap();
                let n = held.len();
                held.clear();
                format!("closed {n}")
            }
        };
        let app = health
            .router()
            .route("/control/exhaust", axum::routing::post(exhaust))
            .route("/control/release", axum::routing::post(release));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("LISTENING {}", listener.local_addr().unwrap());
        // The parent kills the child when done.
        axum::serve(listener, app).await.unwrap();
    });
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `/readyz` until it answers `want`, for at most 20 s; returns the last body.
async fn wait_for_readyz(client: &reqwest::Client, base: &str, want: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = String::new();
    while Instant::now() < deadline {
        // A fresh connection per probe (the child has few descriptors to spare).
        match client.get(format!("{base}/readyz?verbose")).send().await {
            Ok(r) => {
                let code = r.status().as_u16();
                last = format!("{code} {}", r.text().await.unwrap_or_default());
                if code == want {
                    return last;
                }
            }
            Err(e) => last = format!("error: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("/readyz never answered {want}; last: {last}");
}

#[tokio::test]
async fn readyz_fails_when_the_child_runs_out_of_descriptors_and_recovers_when_it_closes_them() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let mut child = KillOnDrop(
        Command::new(exe)
            .args([
                "child_server",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, CHILD_LIMIT.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("the child exits before listening")
            .unwrap();
        // libtest prints "test child_server ... " without a newline first.
        if let Some((_, addr)) = line.split_once("LISTENING ") {
            break addr.trim().to_string();
        }
    };
    let base = format!("http://{addr}");
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();

    let ready = wait_for_readyz(&client, &base, 200).await;
    assert!(
        ready.contains("fd:open"),
        "the check must be reported: {ready}"
    );

    let said = client
        .post(format!("{base}/control/exhaust"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(said.starts_with("opened"), "{said}");
    let failing = wait_for_readyz(&client, &base, 503).await;
    assert!(
        failing.contains("file descriptors"),
        "/readyz must say descriptors ran out: {failing}"
    );

    let said = client
        .post(format!("{base}/control/release"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(said.starts_with("closed"), "{said}");
    wait_for_readyz(&client, &base, 200).await;
}
