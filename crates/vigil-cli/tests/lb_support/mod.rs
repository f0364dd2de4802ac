//! Shared harness for the `vigil lb` process tests (`lb.rs`, `lb_front.rs`): start the
//! real binary on a config, wait until it answers, signal it, read its log, stop it.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// A free loopback port (bound, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind an ephemeral port")
        .local_addr()
        .expect("local addr")
        .port()
}

/// A loopback listener (a target for the balancer) whose every connection is handed to
/// `serve` in a task of its own; its address.
pub async fn serve_each<F, Fut>(serve: F) -> std::net::SocketAddr
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("bound address");
    tokio::spawn(async move {
        while let Ok((c, _)) = listener.accept().await {
            tokio::spawn(serve(c));
        }
    });
    addr
}

/// A running `vigil lb` process with its config file and log; killed when dropped.
pub struct LbProcess {
    pub child: Child,
    _dir: tempfile::TempDir,
    /// The config file (rewrite it and send SIGHUP to reload).
    pub config: PathBuf,
    log: PathBuf,
    /// The proxy's port.
    pub port: u16,
    /// The admin listener's port.
    pub admin: u16,
}

impl LbProcess {
    /// Writes `body` (everything but the listen addresses; 2 workers) and starts the
    /// balancer; returns once its admin listener answers `/livez`.
    pub async fn start(body: &str) -> LbProcess {
        let dir = tempfile::tempdir().expect("tempdir");
        let (port, admin) = (free_port(), free_port());
        let config = dir.path().join("lb.toml");
        let log = dir.path().join("lb.log");
        let text = format!(
            "listen = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin}\"\nworkers = 2\n{body}"
        );
        std::fs::write(&config, text).expect("write config");
        let child = Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args(["lb", "-c"])
            .arg(&config)
            .env("RUST_LOG", "info,vigil_lb=debug,hyper=warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn vigil lb");
        let lb = LbProcess {
            child,
            _dir: dir,
            config,
            log,
            port,
            admin,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(mut c) = tokio::net::TcpStream::connect(("127.0.0.1", admin)).await {
                let _ = c
                    .write_all(b"GET /livez HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
                    .await;
                let mut out = Vec::new();
                let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut out)).await;
                if out.starts_with(b"HTTP/1.1 200") {
                    return lb;
                }
            }
            assert!(
                Instant::now() < deadline,
                "vigil lb did not start; log:\n{}",
                lb.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Everything it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends signal `sig` (`HUP`, `TERM`, ...).
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill -{sig} failed");
    }
}

impl Drop for LbProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// Reading HTTP/1.1 off a socket (the scripted targets and the raw clients).

/// Reads more into `buf`; false at the end of the stream (or an error).
pub async fn fill<R: AsyncRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 16 * 1024];
    match r.read(&mut chunk).await {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            true
        }
    }
}

/// A whole head (through its empty line), taken out of `buf`.
pub async fn take_head<R: AsyncRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> Option<String> {
    loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head: Vec<u8> = buf.drain(..p + 4).collect();
            return Some(String::from_utf8_lossy(&head).into_owned());
        }
        if !fill(r, buf).await {
            return None;
        }
    }
}

/// Exactly `n` bytes, taken out of `buf` (`None`: the stream ended first).
pub async fn take_exact<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    n: usize,
) -> Option<Vec<u8>> {
    while buf.len() < n {
        if !fill(r, buf).await {
            return None;
        }
    }
    Some(buf.drain(..n).collect())
}
