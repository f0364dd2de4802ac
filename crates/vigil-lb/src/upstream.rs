//! Connections to targets: a per-target pool of hyper HTTP/1 connections.
//!
//! What hyper-util's legacy client does, minus what a proxy does not need: no URI
//! parsing or rewriting per request (the target is known), no pool-wide hash map keyed
//! by scheme and authority, no task spawned per request to give the connection back.
//! Each target keeps a LIFO list of idle `SendRequest` handles; a response body hands
//! its connection back when it has been read to the end ([`UpstreamResponseBody`]), and
//! a connection whose body was abandoned is dropped (hyper closes it). Idle connections
//! older than `timeouts.idle` are closed by [`ConnPool::evict_idle`] (the tick loop).

use crate::proxy::{Failure, UpstreamBody};
use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

#[derive(Debug)]
struct Idle {
    tx: SendRequest<UpstreamBody>,
    since: Instant,
}

/// The connections of one target.
#[derive(Debug)]
pub struct ConnPool {
    /// `host:port` as configured (resolved at connect time when not an IP address).
    addr: String,
    /// The address when `addr` is an IP address (no resolution per connect).
    sock: Option<SocketAddr>,
    idle: Mutex<Vec<Idle>>,
}

impl ConnPool {
    /// An empty pool for `addr` (`host:port`).
    pub fn new(addr: &str) -> Arc<Self> {
        Arc::new(ConnPool {
            addr: addr.to_string(),
            sock: addr.parse().ok(),
            idle: Mutex::new(Vec::new()),
        })
    }

    /// Idle connections now.
    pub fn idle_count(&self) -> usize {
        self.idle.lock().expect("idle lock").len()
    }

    /// Closes idle connections unused for `max_idle` or more.
    pub fn evict_idle(&self, max_idle: Duration) {
        let now = Instant::now();
        self.idle
            .lock()
            .expect("idle lock")
            .retain(|i| now.duration_since(i.since) < max_idle && !i.tx.is_closed());
    }

    /// The most recently used idle connection that is ready (LIFO: warm connections
    /// stay warm, the others age out).
    fn checkout(&self, max_idle: Duration) -> Option<SendRequest<UpstreamBody>> {
        let mut idle = self.idle.lock().expect("idle lock");
        while let Some(i) = idle.pop() {
            if i.tx.is_ready() && i.since.elapsed() < max_idle {
                return Some(i.tx);
            }
        }
        None
    }

    /// Gives back a connection whose exchange ended: to the idle list when it can take a
    /// request now (normally: its task saw the response end before the body's reader
    /// did), else once it can (a task waits for it: rare, e.g. a request body still
    /// being sent after the response ended).
    fn checkin(self: Arc<Self>, mut tx: SendRequest<UpstreamBody>) {
        if tx.is_ready() {
            self.idle.lock().expect("idle lock").push(Idle {
                tx,
                since: Instant::now(),
            });
        } else if !tx.is_closed()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(async move {
                if tx.ready().await.is_ok() {
                    self.idle.lock().expect("idle lock").push(Idle {
                        tx,
                        since: Instant::now(),
                    });
                }
            });
        }
    }

    async fn connect(&self, timeout: Duration) -> Result<SendRequest<UpstreamBody>, Failure> {
        let connecting = async {
            let tcp = match self.sock {
                Some(sa) => TcpStream::connect(sa).await,
                None => TcpStream::connect(self.addr.as_str()).await,
            }?;
            tcp.set_nodelay(true)?;
            Ok::<_, std::io::Error>(tcp)
        };
        let tcp = match tokio::time::timeout(timeout, connecting).await {
            Ok(Ok(tcp)) => tcp,
            Ok(Err(e)) => {
                tracing::debug!(target_addr = %self.addr, "connect failed: {e}");
                return Err(Failure::Connect);
            }
            Err(_) => {
                tracing::debug!(target_addr = %self.addr, "connect timed out");
                return Err(Failure::Connect);
            }
        };
        let (tx, conn) = http1::handshake(TokioIo::new(tcp)).await.map_err(|e| {
            tracing::debug!(target_addr = %self.addr, "handshake failed: {e}");
            Failure::Connect
        })?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("target connection ended: {e}");
            }
        });
        Ok(tx)
    }

    /// Sends `req` on an idle connection (a closed one is skipped: nothing was sent) or
    /// on a new one, and waits for the response header.
    pub async fn send(
        self: &Arc<Self>,
        mut req: Request<UpstreamBody>,
        connect_timeout: Duration,
        max_idle: Duration,
    ) -> Result<Response<UpstreamResponseBody>, Failure> {
        loop {
            let (mut tx, fresh) = match self.checkout(max_idle) {
                Some(tx) => (tx, false),
                None => (self.connect(connect_timeout).await?, true),
            };
            // A new connection is ready after its handshake (pooled ones already are).
            if fresh && tx.ready().await.is_err() {
                return Err(Failure::Connect);
            }
            match tx.try_send_request(req).await {
                Ok(resp) => {
                    let pool = self.clone();
                    return Ok(resp.map(|inner| UpstreamResponseBody {
                        inner,
                        ret: Some((pool, tx)),
                        ended: false,
                    }));
                }
                Err(mut e) => match e.take_message() {
                    // Not sent: the connection closed meanwhile; another one may do.
                    Some(r) if !fresh => req = r,
                    Some(_) => return Err(Failure::Connect),
                    None => {
                        let f = classify(e.error());
                        tracing::debug!(target_addr = %self.addr, error = %crate::proxy::ErrorChain(e.error()), failure = f.name(), "attempt failed");
                        return Err(f);
                    }
                },
            }
        }
    }
}

fn classify(err: &hyper::Error) -> Failure {
    if err.is_parse() {
        Failure::Garbage
    } else {
        Failure::Reset
    }
}

/// A target's response body; gives its connection back to the pool once read to the end.
#[derive(Debug)]
pub struct UpstreamResponseBody {
    inner: Incoming,
    ret: Option<(Arc<ConnPool>, SendRequest<UpstreamBody>)>,
    ended: bool,
}

impl Body for UpstreamResponseBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let r = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        match &r {
            None => self.ended = true,
            Some(Ok(_)) => self.ended = self.inner.is_end_stream(),
            // A broken body: hyper closes the connection; nothing to give back.
            Some(Err(_)) => self.ret = None,
        }
        Poll::Ready(r)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for UpstreamResponseBody {
    fn drop(&mut self) {
        if let Some((pool, tx)) = self.ret.take()
            && (self.ended || self.inner.is_end_stream())
        {
            pool.checkin(tx);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Either, Full};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A loopback HTTP/1.1 server answering "hello"; counts the connections it accepted.
    async fn server() -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(|_req| async {
                        Ok::<_, std::convert::Infallible>(Response::new(Full::new(
                            Bytes::from_static(b"hello"),
                        )))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        (addr, accepted)
    }

    fn get() -> Request<UpstreamBody> {
        let mut r = Request::new(Either::Left(Full::new(Bytes::new())));
        *r.uri_mut() = http::Uri::from_static("/");
        r.headers_mut()
            .insert(http::header::HOST, http::HeaderValue::from_static("t"));
        r
    }

    const SECOND: Duration = Duration::from_secs(1);
    const MINUTE: Duration = Duration::from_secs(60);

    #[tokio::test]
    async fn a_connection_is_reused_once_its_response_was_read_to_the_end() {
        let (addr, accepted) = server().await;
        let pool = ConnPool::new(&addr.to_string());
        for _ in 0..20 {
            let resp = pool.send(get(), SECOND, MINUTE).await.unwrap();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], b"hello");
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one keep-alive connection"
        );
        assert_eq!(pool.idle_count(), 1);
    }

    #[tokio::test]
    async fn an_abandoned_body_does_not_give_its_connection_back_and_idle_ones_age_out() {
        let (addr, accepted) = server().await;
        let pool = ConnPool::new(&addr.to_string());
        let first = pool.send(get(), SECOND, MINUTE).await.unwrap();
        // Two exchanges at once need two connections.
        let second = pool.send(get(), SECOND, MINUTE).await.unwrap();
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        drop(first);
        let body = second.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"hello");
        assert_eq!(pool.idle_count(), 1, "only the fully read one is pooled");
        pool.evict_idle(MINUTE);
        assert_eq!(pool.idle_count(), 1, "not idle for a minute yet");
        pool.evict_idle(Duration::ZERO);
        assert_eq!(pool.idle_count(), 0, "idle past the limit: closed");
    }

    #[tokio::test]
    async fn nothing_listening_is_a_connect_failure() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let pool = ConnPool::new(&format!("127.0.0.1:{port}"));
        let err = pool.send(get(), SECOND, MINUTE).await.err();
        assert_eq!(err, Some(Failure::Connect));
    }
}
