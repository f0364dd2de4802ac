//! Tunnels: a client connection and a target connection joined byte for byte after the
//! target switched protocols (`101 Switching Protocols` to a WebSocket or other
//! HTTP/1.1 upgrade), until either side closes, the tunnel idles past
//! `timeouts.tunnel_idle`, or the balancer's drain time runs out.
//!
//! Floor 4, proxy (floors: the crate doc): imports metrics.
//!
//! Only a request that [`crate::downstream`] judged a valid upgrade (a GET without a body,
//! one `Upgrade` field named by `Connection`, not `h2c`) is sent with its `Upgrade`,
//! and only the target's `101` to it opens a tunnel: any other answer is an ordinary
//! response and the client connection goes on as HTTP. The rules of the request path
//! (framing, smuggling) hold up to that point; past it the bytes are the new
//! protocol's, not HTTP, and vigil does not read them.
//!
//! Each direction has a buffer of its own and copies read-then-write (a side that
//! stops reading holds back only its own direction, up to one buffer); the end of one
//! direction is passed on as a half-close (`shutdown(Write)`), and the tunnel ends
//! when both directions have ended. Why not `tokio::io::copy_bidirectional`: it has
//! no idle timeout and says how many bytes moved only when it returns, where a tunnel
//! lives for hours and its bytes are counted as they move
//! (`vigil_lb_tunnel_bytes_total`).

use crate::metrics::{Metrics, PoolLabels, TunnelBytesLabels, TunnelCloseLabels};
use prometheus_client::metrics::counter::Counter;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::CancellationToken;

/// Once one side has closed its direction, how long the other direction may stay
/// quiet before the tunnel closes (at most `timeouts.tunnel_idle`): a WebSocket peer
/// closes its side right after the other's close; one that does not is not waited for
/// an hour (HAProxy's `timeout client-fin` / `server-fin`).
const HALF_CLOSED_IDLE: Duration = Duration::from_secs(10);

/// Buffer of each direction: as a proxy's usual read size, so that a frame of a few
/// kilobytes moves in one read and one write.
const BUF: usize = 16 * 1024;

/// Why a tunnel ended (the `reason` label of `vigil_lb_tunnels_closed_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TunnelEnd {
    /// Both sides closed their direction (the client first, or both at once).
    Closed,
    /// Nothing moved either way for `timeouts.tunnel_idle`.
    Idle,
    /// The balancer's drain time ran out after SIGTERM.
    Drain,
    /// A read or write failed (a reset).
    Error,
}

impl TunnelEnd {
    fn label(self) -> &'static str {
        match self {
            TunnelEnd::Closed => "closed",
            TunnelEnd::Idle => "idle",
            TunnelEnd::Drain => "drain",
            TunnelEnd::Error => "error",
        }
    }
}

/// One direction: what was read from one side and not yet written to the other.
struct Pipe {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// The source ended (read 0).
    eof: bool,
    /// The end was passed on (`shutdown` of the destination's write side).
    done: bool,
    bytes: Counter,
}

impl Pipe {
    /// A pipe whose buffer starts with `ahead` (bytes already read from its source).
    fn new(ahead: &[u8], bytes: Counter) -> Pipe {
        let mut buf = vec![0; BUF.max(ahead.len())];
        buf[..ahead.len()].copy_from_slice(ahead);
        if !ahead.is_empty() {
            bytes.inc_by(ahead.len() as u64);
        }
        Pipe {
            buf,
            start: 0,
            end: ahead.len(),
            eof: false,
            done: false,
            bytes,
        }
    }

    /// Moves what it can from `from` to `to`; `Ready(Ok)` once this direction has
    /// ended. Sets `moved` when any byte moved.
    fn poll_copy<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        from: &mut R,
        to: &mut W,
        moved: &mut bool,
    ) -> Poll<io::Result<()>>
    where
        R: AsyncRead + Unpin + ?Sized,
        W: AsyncWrite + Unpin + ?Sized,
    {
        loop {
            if self.done {
                return Poll::Ready(Ok(()));
            }
            if self.start < self.end {
                let n = ready!(Pin::new(&mut *to).poll_write(cx, &self.buf[self.start..self.end]))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.start += n;
                *moved = true;
                continue;
            }
            if self.eof {
                ready!(Pin::new(&mut *to).poll_shutdown(cx))?;
                self.done = true;
                continue;
            }
            let mut rb = ReadBuf::new(&mut self.buf);
            match Pin::new(&mut *from).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) => {
                    let n = rb.filled().len();
                    (self.start, self.end) = (0, n);
                    if n == 0 {
                        self.eof = true;
                    } else {
                        self.bytes.inc_by(n as u64);
                        *moved = true;
                    }
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    // Nothing more to read now: whatever a buffering writer (TLS)
                    // holds goes out before waiting.
                    let _ = Pin::new(&mut *to).poll_flush(cx)?;
                    return Poll::Pending;
                }
            }
        }
    }
}

/// Joins `client` and `target` until the tunnel ends; says why. `client_ahead`: bytes
/// the client sent after its request head (already read); `target_ahead`: bytes the
/// target sent after its `101` head. `close` is cancelled when the drain time runs out.
#[allow(clippy::too_many_arguments)]
pub async fn run<C, T>(
    client: &mut C,
    client_ahead: &[u8],
    target: &mut T,
    target_ahead: &[u8],
    idle: Duration,
    close: &CancellationToken,
    metrics: &Metrics,
    pool: &str,
) -> TunnelEnd
where
    C: AsyncRead + AsyncWrite + Unpin + ?Sized,
    T: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let labels = PoolLabels {
        pool: pool.to_string(),
    };
    metrics.tunnels.get_or_create(&labels).inc();
    let open = metrics.tunnels_open.get_or_create(&labels).clone();
    open.inc();
    let counter = |direction: &str| {
        metrics
            .tunnel_bytes
            .get_or_create(&TunnelBytesLabels {
                pool: pool.to_string(),
                direction: direction.to_string(),
            })
            .clone()
    };
    let mut up = Pipe::new(client_ahead, counter("to_target"));
    let mut down = Pipe::new(target_ahead, counter("to_client"));
    let timer = tokio::time::sleep(idle);
    tokio::pin!(timer);
    let closing = close.cancelled();
    tokio::pin!(closing);
    let mut limit = idle;
    let end = std::future::poll_fn(|cx| {
        let mut moved = false;
        let a = up.poll_copy(cx, client, target, &mut moved);
        let b = down.poll_copy(cx, target, client, &mut moved);
        match (a, b) {
            (Poll::Ready(Err(e)), _) | (_, Poll::Ready(Err(e))) => {
                tracing::debug!(pool, "tunnel broke: {e}");
                return Poll::Ready(TunnelEnd::Error);
            }
            (Poll::Ready(Ok(())), Poll::Ready(Ok(()))) => return Poll::Ready(TunnelEnd::Closed),
            _ => {}
        }
        if closing.as_mut().poll(cx).is_ready() {
            return Poll::Ready(TunnelEnd::Drain);
        }
        let quiet = if up.done || down.done {
            idle.min(HALF_CLOSED_IDLE)
        } else {
            idle
        };
        if moved || quiet != limit {
            limit = quiet;
            timer.as_mut().reset(tokio::time::Instant::now() + quiet);
        }
        if timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(TunnelEnd::Idle);
        }
        Poll::Pending
    })
    .await;
    if matches!(end, TunnelEnd::Idle | TunnelEnd::Drain) {
        // Closed on purpose: both peers see the end (FIN), not a reset.
        let quick = Duration::from_millis(100);
        let _ = tokio::time::timeout(quick, tokio::io::AsyncWriteExt::shutdown(client)).await;
        let _ = tokio::time::timeout(quick, tokio::io::AsyncWriteExt::shutdown(target)).await;
    }
    open.dec();
    metrics
        .tunnels_closed
        .get_or_create(&TunnelCloseLabels {
            pool: pool.to_string(),
            reason: end.label().to_string(),
        })
        .inc();
    tracing::debug!(pool, reason = end.label(), "tunnel closed");
    end
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, duplex};

    fn sent(m: &Metrics, direction: &str) -> u64 {
        m.tunnel_bytes
            .get_or_create(&TunnelBytesLabels {
                pool: "p".into(),
                direction: direction.into(),
            })
            .get()
    }

    #[tokio::test]
    async fn bytes_move_both_ways_with_what_was_read_ahead_first_and_are_counted() {
        let (mut client, mut client_end) = duplex(64);
        let (mut target, mut target_end) = duplex(64);
        let m = Metrics::new();
        let close = CancellationToken::new();
        let peers = async {
            let mut got = [0u8; 5];
            target_end.read_exact(&mut got).await.unwrap();
            assert_eq!(
                &got, b"early",
                "the client's bytes read with its head go first"
            );
            client_end.write_all(b"hello").await.unwrap();
            target_end.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"hello");
            let mut got = [0u8; 7];
            client_end.read_exact(&mut got).await.unwrap();
            assert_eq!(
                &got, b"greeted",
                "the target's bytes read with its 101 go first"
            );
            target_end.write_all(b"bye").await.unwrap();
            let mut got = [0u8; 3];
            client_end.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"bye");
            // The client closes: the target sees the end, then closes too.
            client_end.shutdown().await.unwrap();
            assert_eq!(target_end.read(&mut got).await.unwrap(), 0);
            drop(target_end);
        };
        let (end, ()) = tokio::join!(
            run(
                &mut client,
                b"early",
                &mut target,
                b"greeted",
                Duration::from_secs(60),
                &close,
                &m,
                "p"
            ),
            peers
        );
        assert_eq!(end, TunnelEnd::Closed);
        assert_eq!(sent(&m, "to_target"), 10);
        assert_eq!(sent(&m, "to_client"), 10);
        let open = m
            .tunnels_open
            .get_or_create(&PoolLabels { pool: "p".into() })
            .get();
        assert_eq!(open, 0, "a closed tunnel is not open");
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_tunnel_closes_after_the_idle_time_and_traffic_keeps_it_open() {
        let (mut client, mut client_end) = duplex(64);
        let (mut target, mut target_end) = duplex(64);
        let m = Metrics::new();
        let close = CancellationToken::new();
        let idle = Duration::from_secs(10);
        let started = tokio::time::Instant::now();
        let peers = async {
            // Traffic every 6 s for 30 s: never 10 s quiet.
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_secs(6)).await;
                client_end.write_all(b"x").await.unwrap();
                let mut b = [0u8; 1];
                target_end.read_exact(&mut b).await.unwrap();
            }
            // Then quiet: the tunnel closes both sides.
            let mut b = [0u8; 1];
            assert_eq!(client_end.read(&mut b).await.unwrap(), 0);
            assert_eq!(target_end.read(&mut b).await.unwrap(), 0);
        };
        let (end, ()) = tokio::join!(
            run(&mut client, b"", &mut target, b"", idle, &close, &m, "p"),
            peers
        );
        assert_eq!(end, TunnelEnd::Idle);
        let lived = started.elapsed();
        assert!(
            lived >= Duration::from_secs(40) && lived < Duration::from_secs(41),
            "lived {lived:?}: 30 s of traffic, then 10 s idle"
        );
    }

    #[tokio::test]
    async fn the_drain_closes_an_open_tunnel() {
        let (mut client, mut client_end) = duplex(64);
        let (mut target, _target_end) = duplex(64);
        let m = Metrics::new();
        let close = CancellationToken::new();
        close.cancel();
        let end = run(
            &mut client,
            b"",
            &mut target,
            b"",
            Duration::from_secs(60),
            &close,
            &m,
            "p",
        )
        .await;
        assert_eq!(end, TunnelEnd::Drain);
        let mut b = [0u8; 1];
        assert_eq!(
            client_end.read(&mut b).await.unwrap(),
            0,
            "the client sees the end"
        );
    }
}
