//! Interop: a real HAProxy (Debian's `haproxy`) reads vigil's agent-check responder and
//! changes the server's state and weight accordingly, as its stats socket shows.
//!
//! Skipped, saying so, when no `haproxy` binary is installed.
#![cfg(feature = "agent-check")]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vigil::agent::AgentCheck;
use vigil::{Health, Status};

mod support;
use support::{Knob, fast};

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn haproxy() -> Option<&'static str> {
    [
        "/usr/sbin/haproxy",
        "/usr/bin/haproxy",
        "/usr/local/sbin/haproxy",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
}

/// `(status, weight)` of server `app/s1` from `show stat` on the admin socket.
async fn server_state(sock: &std::path::Path) -> Option<(String, String)> {
    let mut s = tokio::net::UnixStream::connect(sock).await.ok()?;
    s.write_all(b"show stat\n").await.ok()?;
    let mut csv = String::new();
    s.read_to_string(&mut csv).await.ok()?;
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next()?.trim_start_matches("# ").split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name);
    let (px, sv, status, weight) = (
        col("pxname")?,
        col("svname")?,
        col("status")?,
        col("weight")?,
    );
    lines.find_map(|l| {
        let f: Vec<&str> = l.split(',').collect();
        (f.get(px) == Some(&"app") && f.get(sv) == Some(&"s1"))
            .then(|| (f[status].to_string(), f[weight].to_string()))
    })
}

/// Polls the stats socket until `pred` holds, for at most 20 s.
async fn wait_state(
    sock: &std::path::Path,
    what: &str,
    pred: impl Fn(&str, &str) -> bool,
) -> (String, String) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = None;
    while Instant::now() < deadline {
        if let Some((status, weight)) = server_state(sock).await {
            if pred(&status, &weight) {
                return (status, weight);
            }
            last = Some((status, weight));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("HAProxy never showed {what}; last (status, weight) {last:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_follows_the_agent_through_warn_fail_and_drain() {
    let Some(haproxy) = haproxy() else {
        eprintln!("SKIPPED: no haproxy binary (apt-get install haproxy)");
        return;
    };
    let knob = Knob::default();
    let health = Health::builder()
        .local("disk:free", knob.check(), fast())
        .start();
    let agent = AgentCheck::new(&health)
        .serve_reserved("127.0.0.1:0".parse().unwrap())
        .unwrap();
    // The server HAProxy balances to (its regular check only needs a TCP accept).
    let backend = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend_addr = backend.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            match backend.accept().await {
                Ok((s, _)) => drop(s),
                Err(_) => return,
            }
        }
    });

    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("admin.sock");
    let cfg = dir.path().join("haproxy.cfg");
    std::fs::write(
        &cfg,
        format!(
            "global\n  stats socket {sock} level admin\n\
             defaults\n  mode tcp\n  timeout connect 1s\n  timeout client 5s\n  timeout server 5s\n\
             backend app\n  server s1 {backend_addr} weight 100 check inter 200ms \
             agent-check agent-addr 127.0.0.1 agent-port {agent_port} agent-inter 100ms\n",
            sock = sock.display(),
            agent_port = agent.local_addr().port(),
        ),
    )
    .unwrap();
    let _haproxy = KillOnDrop(
        Command::new(haproxy)
            .args(["-db", "-f"])
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );

    let (status, weight) =
        wait_state(&sock, "UP at full weight", |s, w| s == "UP" && w == "100").await;
    assert_eq!((status.as_str(), weight.as_str()), ("UP", "100"));

    knob.set(Status::Warn);
    wait_state(&sock, "UP at the warn weight 50", |s, w| {
        s == "UP" && w == "50"
    })
    .await;

    knob.set(Status::Fail);
    let (status, _) = wait_state(&sock, "DOWN", |s, _| s.starts_with("DOWN")).await;
    assert!(
        status.starts_with("DOWN"),
        "a failing readiness must take the server down"
    );

    knob.set(Status::Pass);
    wait_state(&sock, "UP again", |s, w| s == "UP" && w == "100").await;

    health.begin_shutdown();
    // HAProxy shows the agent's drain as the DRAIN state: no new connections.
    wait_state(&sock, "DRAIN", |s, _| s.starts_with("DRAIN")).await;
    agent.shutdown();
}
