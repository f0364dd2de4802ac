//! `TcpConnect`: a TCP connection to an address opens within a timeout.

use crate::{Check, CheckResult};
use std::time::{Duration, Instant};
use vigil_core::Status;

/// Default connect timeout: 1 s. A connect on a LAN takes well under a millisecond and a
/// SYN lost once is retransmitted after 1 s, so a peer that has not accepted by then is
/// not accepting; it also stays under the registry's usual check timeout, so the result
/// says "connect timed out" rather than a generic timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Opens (and at once closes) a TCP connection to `host:port`. Observed value: connect
/// time in milliseconds. Optionally warns when the connect is slower than a level.
#[derive(Clone, Debug)]
pub struct TcpConnect {
    addr: String,
    timeout: Duration,
    warn_slower_than: Option<Duration>,
}

impl TcpConnect {
    /// Connects to `addr` (`"127.0.0.1:5432"`, `"db.internal:5432"`), with a 1 s timeout.
    pub fn new(addr: impl Into<String>) -> Self {
        TcpConnect {
            addr: addr.into(),
            timeout: DEFAULT_CONNECT_TIMEOUT,
            warn_slower_than: None,
        }
    }

    /// Name resolution and connect together must finish within this. Defaults to 1 s.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Warns when the connect takes longer than this. Defaults to never.
    pub fn warn_slower_than(mut self, level: Duration) -> Self {
        self.warn_slower_than = Some(level);
        self
    }
}

impl Check for TcpConnect {
    async fn check(&self) -> CheckResult {
        let started = Instant::now();
        let result =
            tokio::time::timeout(self.timeout, tokio::net::TcpStream::connect(&self.addr)).await;
        let took = started.elapsed();
        let ms = (took.as_secs_f64() * 1000.0 * 100.0).round() / 100.0;
        match result {
            Ok(Ok(stream)) => {
                let peer = stream
                    .peer_addr()
                    .map_or_else(|_| self.addr.clone(), |a| a.to_string());
                drop(stream);
                let slow = self.warn_slower_than.filter(|level| took > *level);
                let (status, tail) = match slow {
                    Some(level) => (
                        Status::Warn,
                        format!(
                            ", slower than the warn level {}",
                            humantime::format_duration(level)
                        ),
                    ),
                    None => (Status::Pass, String::new()),
                };
                CheckResult::new(status)
                    .with_observed(ms, "ms")
                    .with_output(format!("connected to {peer} in {ms} ms{tail}"))
            }
            Ok(Err(e)) => {
                CheckResult::fail(format!("connect to {}: {e}", self.addr)).with_observed(ms, "ms")
            }
            Err(_) => CheckResult::fail(format!(
                "connect to {} timed out after {}",
                self.addr,
                humantime::format_duration(self.timeout)
            ))
            .with_observed(ms, "ms"),
        }
    }
}
