//! The HAProxy agent-check responder over loopback TCP: the line follows readiness.
#![cfg(feature = "agent-check")]

use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use vigil::agent::AgentCheck;
use vigil::{CheckOptions, CheckResult, CheckerFault, FnCheck, Health, Status};

mod support;
use support::{Knob, fast};

/// Reads the one line the agent writes, then the connection must be closed.
async fn read_line(addr: std::net::SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut text = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut text))
        .await
        .expect("the agent closes the connection after its line")
        .unwrap();
    text
}

/// Polls the agent until its line satisfies `pred`, for at most 10 s.
async fn wait_line(addr: std::net::SocketAddr, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = String::new();
    while Instant::now() < deadline {
        last = read_line(addr).await;
        if pred(&last) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the agent never answered as expected; last line {last:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_line_follows_readiness_through_warn_fail_and_shutdown() {
    let knob = Knob::default();
    let health = Health::builder()
        .local("disk:free", knob.check(), fast())
        .start();
    let agent = AgentCheck::new(&health)
        .warn_weight(30)
        .serve_reserved("127.0.0.1:0".parse().unwrap())
        .unwrap();
    let addr = agent.local_addr();

    assert_eq!(
        wait_line(addr, |l| l.starts_with("up")).await,
        "up ready 100%\n"
    );

    knob.set(Status::Warn);
    assert_eq!(
        wait_line(addr, |l| l != "up ready 100%\n").await,
        "up ready 30%\n",
        "warn keeps the server up at a reduced weight"
    );

    knob.set(Status::Fail);
    let down = wait_line(addr, |l| l.starts_with("down")).await;
    assert!(down.starts_with("down #"), "{down:?}");
    assert_eq!(
        down.matches("disk:free").count(),
        1,
        "the reason names the failing check, once: {down:?}"
    );
    assert!(
        down.ends_with('\n') && down.lines().count() == 1,
        "{down:?}"
    );

    knob.set(Status::Pass);
    wait_line(addr, |l| l == "up ready 100%\n").await;

    health.begin_shutdown();
    assert_eq!(read_line(addr).await, "drain\n", "shutdown drains at once");
    agent.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_says_down_when_the_health_checker_stalls() {
    let health = Health::builder()
        .local(
            "disk:free",
            FnCheck::new(|| std::future::ready(CheckResult::new(Status::Pass))),
            CheckOptions::every(Duration::from_millis(50)).jitter(0.0),
        )
        .start();
    let agent = AgentCheck::new(&health)
        .serve_reserved("127.0.0.1:0".parse().unwrap())
        .unwrap();
    let addr = agent.local_addr();
    wait_line(addr, |l| l == "up ready 100%\n").await;
    health.inject_fault(CheckerFault::Hang);
    let down = wait_line(addr, |l| l.starts_with("down")).await;
    assert!(down.contains("stalled"), "{down:?}");
}
