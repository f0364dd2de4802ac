//! SIGTERM on the real example service process: readiness fails first while the
//! application port still answers, then the listener closes, and the process exits 0.
//!
//! The test re-executes its own binary as the service (`VIGIL_EXAMPLE_CHILD=1` makes
//! `child_service` run `vigil_example::cli::run`, what `vigil example-service` runs).

use clap::Parser;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "VIGIL_EXAMPLE_CHILD";

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: vigil_example::cli::Args,
}

/// The child's entry point, run only by the parent test (with `--ignored`): ignored,
/// so it does not count as a passing test of its own.
#[test]
#[ignore = "child process entry point: run by sigterm_fails_readiness_then_stops_listening_and_exits_zero"]
fn child_service() {
    if std::env::var(CHILD_ENV).is_err() {
        return;
    }
    let dir = std::env::var("VIGIL_EXAMPLE_DATA_DIR").expect("the parent sets the data dir");
    let cli = Cli::parse_from([
        "service",
        "--listen",
        "127.0.0.1:0",
        "--health-listen",
        "127.0.0.1:0",
        "--check-interval",
        "100ms",
        "--drain-delay",
        "1500ms",
        "--workers",
        "2",
        "--data-dir",
        &dir,
        // Readiness must not depend on how full the machine's disk is: CI's disk is the
        // session's, and a readiness failing on it once cost a run.
        "--disk-fail-below",
        "0%",
        "--disk-warn-below",
        "off",
    ]);
    let code = vigil_example::cli::run(cli.args);
    // libtest would turn a normal return into exit 0 whatever run said: pass it on.
    if code != std::process::ExitCode::SUCCESS {
        std::process::exit(1);
    }
    std::process::exit(0);
}

#[tokio::test]
async fn sigterm_fails_readiness_then_stops_listening_and_exits_zero() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "child_service",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .env("VIGIL_EXAMPLE_DATA_DIR", dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let (app, health) = loop {
        let line = lines
            .next()
            .expect("the service exits before listening")
            .unwrap();
        if let Some((_, rest)) = line.split_once("LISTENING ") {
            let mut app = None;
            let mut health = None;
            for word in rest.split_whitespace() {
                if let Some(v) = word.strip_prefix("app=") {
                    app = Some(v.to_string());
                }
                if let Some(v) = word.strip_prefix("health=") {
                    health = Some(v.to_string());
                }
            }
            break (app.unwrap(), health.unwrap());
        }
    };
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let code = |url: String| {
        let client = client.clone();
        async move { client.get(url).send().await.map(|r| r.status().as_u16()) }
    };

    let deadline = Instant::now() + Duration::from_secs(20);
    while code(format!("{app}/readyz")).await.ok() != Some(200) {
        if Instant::now() > deadline {
            let why = match client.get(format!("{health}/health")).send().await {
                Ok(r) => r.text().await.unwrap_or_default(),
                Err(e) => e.to_string(),
            };
            let _ = child.kill();
            panic!("the service never became ready; its /health says: {why}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();

    // Readiness fails while the application port still answers (the drain delay).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match code(format!("{app}/readyz")).await {
            Ok(503) => break,
            Ok(200) => {}
            other => panic!("readiness must fail before the listener closes, got {other:?}"),
        }
        assert!(
            Instant::now() < deadline,
            "readiness never failed after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        code(format!("{app}/items/1")).await.ok(),
        Some(200),
        "while draining, the service still serves"
    );
    assert_eq!(code(format!("{health}/readyz")).await.ok(), Some(503));

    // Then the listener closes and the process exits 0.
    let deadline = Instant::now() + Duration::from_secs(15);
    while code(format!("{app}/livez")).await.is_ok() {
        assert!(Instant::now() < deadline, "the listener never closed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the service did not exit after closing its listener");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "SIGTERM must exit 0, got {status}");
}
