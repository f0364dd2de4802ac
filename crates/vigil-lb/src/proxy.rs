//! The data path: route a client request to a pool, pick a target, forward, retry,
//! hedge, and answer.
//!
//! One request's life:
//! 1. match a route (host, path prefix) to a pool; none: 404;
//! 2. strip hop-by-hop headers, add `X-Forwarded-For`, `X-Forwarded-Proto`, `Via`;
//! 3. buffer a small body (so the request can be retried or hedged), stream a large one;
//! 4. pick a target (P2C or round-robin over the pool's routing snapshot); none: 503
//!    with `Retry-After`;
//! 5. forward with a response-header timeout; meanwhile, watch for the target leaving
//!    service and for the hedge delay;
//! 6. on a connect failure (always safe: nothing was sent), or a reset before the
//!    response of an idempotent request, retry on another target within the pool's
//!    retry budget; when the target is ejected while the request waits, an idempotent
//!    request moves to another target at once; past the hedge delay, an idempotent
//!    request is also sent to a second target and the first answer wins;
//! 7. report every outcome to outlier detection; answer 502 (connect failure, reset,
//!    garbage), 504 (no response header in time), or the target's response.
//!
//! Errors record where they came from and whether a retry is allowed ([`Failure`]).

use crate::balancer::{PoolRt, TargetRt};
use crate::metrics::{Metrics, PoolLabels, RequestLabels, RetryLabels};
use crate::upstream::{Outgoing, OutgoingBody, UpstreamResponseBody};
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use smallvec::SmallVec;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::futures::OwnedNotified;
use vigil_core::outlier::RequestOutcome;

/// Body of a response sent to the client: the target's, or one of ours.
pub type ClientBody = Either<UpstreamResponseBody, Full<Bytes>>;

/// What the proxy needs from the current configuration, per request.
pub struct ProxyTable {
    /// Routing rules in order.
    pub routes: Vec<RouteRule>,
    /// Response-header timeout.
    pub response_header_timeout: Duration,
    /// Largest body buffered for retries.
    pub max_retry_body_bytes: usize,
    /// Time a client has to send a buffered body.
    pub client_body_timeout: Duration,
    /// Connect timeout to targets.
    pub connect_timeout: Duration,
    /// Idle time after which a pooled target connection is closed.
    pub idle_timeout: Duration,
}

/// A compiled routing rule.
pub struct RouteRule {
    /// Lower-case host without port, or any.
    pub host: Option<String>,
    /// Path prefix.
    pub path_prefix: String,
    /// The pool.
    pub pool: Arc<PoolRt>,
}

impl ProxyTable {
    /// The first rule matching `host` and `path`.
    pub fn route(&self, host: Option<&str>, path: &str) -> Option<&Arc<PoolRt>> {
        let host = host.map(|h| {
            h.rsplit_once(':').map_or(h, |(name, port)| {
                if port.bytes().all(|b| b.is_ascii_digit()) {
                    name
                } else {
                    h
                }
            })
        });
        // Rule hosts are lower case; the request's is compared without a lower-cased copy.
        self.routes
            .iter()
            .find(|r| {
                r.host
                    .as_ref()
                    .is_none_or(|want| host.is_some_and(|h| h.eq_ignore_ascii_case(want)))
                    && path.starts_with(&r.path_prefix)
            })
            .map(|r| &r.pool)
    }
}

/// Why an attempt failed, and what that allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No connection: nothing was sent; any request may be retried.
    Connect,
    /// The connection broke before a response header: only idempotent requests may be
    /// retried (the target may have acted on it).
    Reset,
    /// The target answered something that is not HTTP: 502, no retry (the target is
    /// broken, and the request may have been acted on).
    Garbage,
    /// No response header within the response-header timeout: 504, no retry (the client
    /// has waited long enough).
    Timeout,
}

impl Failure {
    pub(crate) fn outcome(self) -> RequestOutcome {
        match self {
            Failure::Connect => RequestOutcome::ConnectFailure,
            Failure::Reset | Failure::Garbage => RequestOutcome::Reset,
            Failure::Timeout => RequestOutcome::Timeout,
        }
    }

    fn status(self) -> StatusCode {
        match self {
            Failure::Timeout => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::BAD_GATEWAY,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Failure::Connect => "connect",
            Failure::Reset => "reset",
            Failure::Garbage => "garbage",
            Failure::Timeout => "timeout",
        }
    }
}

fn is_idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// Headers that describe one connection and must not be forwarded (RFC 9110 7.6.1),
/// plus any header the `Connection` header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One pass over the names (standard names compare as enum tags) marks which are
    // present; most messages carry none, or only `Connection`. No allocation.
    let mut present = 0u16;
    for n in headers.keys() {
        if let Some(i) = hop_by_hop_index(n) {
            present |= 1 << i;
        }
    }
    if present == 0 {
        return;
    }
    if present & 1 != 0 {
        let named: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .flat_map(|v| connection_options(v.as_bytes()))
            .collect();
        for n in named {
            headers.remove(n);
        }
    }
    for (i, n) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(n);
        }
    }
}

/// The header names a `Connection` field value lists, other than the usual
/// `keep-alive` and `close` (those fields describe the connection too).
pub(crate) fn connection_options(value: &[u8]) -> impl Iterator<Item = HeaderName> + '_ {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|n| {
            !n.is_empty()
                && !n.eq_ignore_ascii_case(b"keep-alive")
                && !n.eq_ignore_ascii_case(b"close")
        })
        .filter_map(|n| HeaderName::from_bytes(n).ok())
}

/// The index of `n` in [`HOP_BY_HOP`] (a string match: a length switch, then one
/// comparison); 0 is `Connection`.
pub(crate) fn hop_by_hop_index(n: &HeaderName) -> Option<usize> {
    Some(match n.as_str() {
        "connection" => 0,
        "te" => 1,
        "trailer" => 2,
        "transfer-encoding" => 3,
        "upgrade" => 4,
        "proxy-authorization" => 5,
        "proxy-authenticate" => 6,
        "keep-alive" => 7,
        "proxy-connection" => 8,
        _ => return None,
    })
}

/// Headers that describe one connection (RFC 9110 7.6.1 and the usual non-standard
/// ones); `Connection` first.
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
];

const VIA: &str = "1.1 vigil";
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Appends `value` to a list-valued header: inserted as is (no formatting) when the
/// header is absent, the usual case.
fn append_header_value(headers: &mut HeaderMap, name: HeaderName, value: HeaderValue) {
    match headers.entry(name) {
        header::Entry::Vacant(e) => {
            e.insert(value);
        }
        header::Entry::Occupied(mut e) => {
            let joined = match (e.get().to_str(), value.to_str()) {
                (Ok(prev), Ok(v)) if !prev.is_empty() => {
                    HeaderValue::from_str(&format!("{prev}, {v}")).ok()
                }
                _ => Some(value),
            };
            if let Some(v) = joined {
                e.insert(v);
            }
        }
    }
}

/// An answer made by vigil itself.
pub fn local_response(status: StatusCode, msg: &str) -> Response<ClientBody> {
    let mut r = Response::new(Either::Right(Full::new(Bytes::from(format!("{msg}\n")))));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r.headers_mut()
        .insert(header::VIA, HeaderValue::from_static(VIA));
    if status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

/// Everything a request needs, shared.
pub struct Proxy {
    /// The current table (swapped on reload).
    pub table: arc_swap::ArcSwap<ProxyTable>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
}

struct OutstandingGuard(Arc<TargetRt>);

impl Drop for OutstandingGuard {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Ordering::Relaxed);
    }
}

type AttemptResult = Result<Response<UpstreamResponseBody>, Failure>;
type AttemptFuture = Pin<Box<dyn Future<Output = AttemptResult> + Send>>;

struct Attempt {
    target: Arc<TargetRt>,
    fut: AttemptFuture,
    /// Fires when the target leaves service; `None` once ignored.
    left: Option<Pin<Box<OwnedNotified>>>,
    started: Instant,
    /// When the response header is due (`timeouts.response_header` after the start).
    deadline: tokio::time::Instant,
    _guard: OutstandingGuard,
}

enum Event {
    Done(usize, AttemptResult),
    Left(usize),
    Hedge,
}

impl Proxy {
    /// The `X-Forwarded-For` value of a client address (made once per connection).
    pub fn client_ip_value(client: std::net::SocketAddr) -> HeaderValue {
        HeaderValue::from_str(&client.ip().to_string()).expect("an IP address is a valid value")
    }

    /// Handles one client request; `client_ip` is [`Proxy::client_ip_value`] of the
    /// client's address.
    pub async fn handle(
        self: Arc<Self>,
        client_ip: HeaderValue,
        req: Request<Incoming>,
    ) -> Response<ClientBody> {
        let table = self.table.load_full();
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| req.uri().host());
        let Some(pool) = table.route(host, req.uri().path()).cloned() else {
            self.count_local("none", 404);
            return local_response(StatusCode::NOT_FOUND, "no route for this host and path");
        };
        let (mut parts, body) = req.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        append_header_value(&mut parts.headers, X_FORWARDED_FOR, client_ip);
        parts
            .headers
            .insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
        append_header_value(
            &mut parts.headers,
            header::VIA,
            HeaderValue::from_static(VIA),
        );
        // Targets get the origin form (`/path?query`); a client's absolute form
        // (`GET http://host/path`) is rewritten, with its authority as Host when the
        // request had none.
        if parts.uri.scheme().is_some() || parts.uri.authority().is_some() {
            if !parts.headers.contains_key(header::HOST)
                && let Some(a) = parts.uri.authority()
                && let Ok(v) = HeaderValue::from_str(a.as_str())
            {
                parts.headers.insert(header::HOST, v);
            }
            let pq = parts
                .uri
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
            parts.uri = Uri::from(pq);
        } else if parts.uri.path().is_empty() {
            parts.uri = Uri::from_static("/");
        }

        // Small bodies are buffered so that the request can be sent again.
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        // No Content-Length and not known empty: chunked (its header is already gone).
        let chunked = declared.is_none() && !hyper::body::Body::is_end_stream(&body);
        let body = match declared {
            _ if chunked => Err(body),
            Some(n) if n > table.max_retry_body_bytes => Err(body),
            _ => match tokio::time::timeout(table.client_body_timeout, body.collect()).await {
                Ok(Ok(c)) => Ok(c.to_bytes()),
                Ok(Err(_)) => {
                    self.count_local(&pool.name, 400);
                    return local_response(StatusCode::BAD_REQUEST, "incomplete request body");
                }
                Err(_) => {
                    self.count_local(&pool.name, 408);
                    return local_response(StatusCode::REQUEST_TIMEOUT, "request body too slow");
                }
            },
        };
        let idempotent = is_idempotent(&parts.method);
        let start = Instant::now();
        pool.budget.lock().expect("budget lock").deposit(pool.now());
        let section = pool.section.load_full();

        // Inline: one attempt is the rule, a retry or a hedge the exception.
        let mut tried: SmallVec<[Arc<TargetRt>; 3]> = SmallVec::new();
        let mut attempts: SmallVec<[Attempt; 2]> = SmallVec::new();
        let mut retries = 0u32;
        let mut last_failure: Option<(Failure, String)>;
        let (out_body, mut streamed) = match body {
            Ok(b) => (OutgoingBody::Buffered(b), None),
            Err(b) => (OutgoingBody::Streamed(declared.map(|n| n as u64)), Some(b)),
        };
        let buffered = streamed.is_none();
        // Serialised once; every attempt (retry, hedge) sends the same bytes.
        let out = Arc::new(Outgoing::new(
            &parts.method,
            &parts.uri,
            &parts.headers,
            out_body,
            idempotent,
        ));
        let hedge_delay = (section.hedge.enabled && idempotent && buffered).then(|| {
            pool.latency
                .hedge_delay(section.hedge.min_delay, section.hedge.max_delay)
        });
        // One timer per request serves the hedge delay and every attempt's
        // response-header deadline: it is re-armed for the earliest of them.
        let mut hedge_at = hedge_delay.map(|d| tokio::time::Instant::now() + d);
        let timer = tokio::time::sleep(table.response_header_timeout);
        tokio::pin!(timer);

        let start_attempt = |tried: &mut SmallVec<[Arc<TargetRt>; 3]>,
                             attempts: &mut SmallVec<[Attempt; 2]>,
                             streamed: &mut Option<Incoming>|
         -> bool {
            let Some(target) = pool.pick(tried) else {
                return false;
            };
            tried.push(target.clone());
            let left = target.left_service.clone().notified_owned();
            let (t, out, body) = (target.clone(), out.clone(), streamed.take());
            let (connect_timeout, idle_timeout) = (table.connect_timeout, table.idle_timeout);
            let fut: AttemptFuture = Box::pin(async move {
                t.conns
                    .send(&out, &t.host_header, body, connect_timeout, idle_timeout)
                    .await
            });
            target.outstanding.fetch_add(1, Ordering::Relaxed);
            // Racing: the target may have left service between the pick and now; then
            // its notification is already gone, and `in_service` says so.
            let in_service = target.in_service.load(Ordering::Relaxed);
            attempts.push(Attempt {
                _guard: OutstandingGuard(target.clone()),
                target,
                fut,
                left: in_service.then(|| Box::pin(left)),
                started: Instant::now(),
                deadline: tokio::time::Instant::now() + table.response_header_timeout,
            });
            true
        };

        if !start_attempt(&mut tried, &mut attempts, &mut streamed) {
            self.count_local(&pool.name, 503);
            return local_response(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("pool {}: no target available", pool.name),
            );
        }

        loop {
            let ev = std::future::poll_fn(|cx: &mut Context<'_>| {
                for (i, a) in attempts.iter_mut().enumerate() {
                    if let Poll::Ready(r) = a.fut.as_mut().poll(cx) {
                        return Poll::Ready(Event::Done(i, r));
                    }
                    if let Some(l) = &mut a.left
                        && l.as_mut().poll(cx).is_ready()
                    {
                        a.left = None;
                        return Poll::Ready(Event::Left(i));
                    }
                }
                loop {
                    let next = attempts
                        .iter()
                        .map(|a| a.deadline)
                        .chain(hedge_at)
                        .min()
                        .expect("an attempt is in flight");
                    if timer.deadline() != next {
                        timer.as_mut().reset(next);
                    }
                    if timer.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    // The timer fired: its deadline is reached even if the clock reads
                    // a hair earlier.
                    let now = tokio::time::Instant::now().max(timer.deadline());
                    if hedge_at.is_some_and(|h| h <= now) {
                        hedge_at = None;
                        return Poll::Ready(Event::Hedge);
                    }
                    if let Some(i) = attempts.iter().position(|a| a.deadline <= now) {
                        return Poll::Ready(Event::Done(i, Err(Failure::Timeout)));
                    }
                }
            })
            .await;
            match ev {
                Event::Done(i, Ok(resp)) => {
                    let a = attempts.swap_remove(i);
                    let elapsed = a.started.elapsed();
                    pool.latency.record(elapsed);
                    pool.duration.observe(start.elapsed().as_secs_f64());
                    let code = resp.status().as_u16();
                    pool.observe_request(&a.target, RequestOutcome::Response(code));
                    a.target.count(&self.metrics, code);
                    // Losing attempts (hedges) are dropped here: their connections close.
                    // One that started before the winner was overtaken: outlier
                    // detection hears of it (a frozen target is ejected after a few).
                    // (Not when the winner's answer is itself an error: a fast 503 from
                    // a broken hedge target says nothing against the slower one.)
                    if !RequestOutcome::Response(code).is_error() {
                        for loser in attempts.iter().filter(|l| l.started < a.started) {
                            pool.observe_request(&loser.target, RequestOutcome::Overtaken);
                        }
                    }
                    drop(attempts);
                    // Hop-by-hop fields were left out when the head was read.
                    let (mut rp, rb) = resp.into_parts();
                    // A second `Via` line says the same as one combined value (RFC 9110
                    // 5.3) without a lookup.
                    rp.headers
                        .append(header::VIA, HeaderValue::from_static(VIA));
                    return Response::from_parts(rp, Either::Left(rb));
                }
                Event::Done(i, Err(f)) => {
                    let a = attempts.swap_remove(i);
                    pool.observe_request(&a.target, f.outcome());
                    last_failure = Some((f, a.target.addr.clone()));
                    let retryable = buffered
                        && match f {
                            Failure::Connect => true,
                            Failure::Reset => idempotent,
                            Failure::Garbage | Failure::Timeout => false,
                        };
                    if retryable
                        && retries < section.retries.max_retries
                        && self.withdraw(&pool, f.name())
                    {
                        retries += 1;
                        tracing::debug!(pool = %pool.name, target = %a.target.addr, failure = f.name(), "retrying on another target");
                        if start_attempt(&mut tried, &mut attempts, &mut streamed) {
                            continue;
                        }
                    }
                    if attempts.is_empty() {
                        break;
                    }
                }
                Event::Left(i) => {
                    // The target was ejected or went unhealthy while this request waits
                    // on it: an idempotent request moves now rather than waiting for a
                    // target we already believe broken.
                    if idempotent
                        && buffered
                        && retries < section.retries.max_retries
                        && self.withdraw(&pool, "ejected")
                    {
                        retries += 1;
                        let before = attempts.len();
                        if start_attempt(&mut tried, &mut attempts, &mut streamed) {
                            tracing::debug!(pool = %pool.name, target = %attempts[i].target.addr, "target left service: request moved");
                            let _abandoned = attempts.swap_remove(i);
                            debug_assert_eq!(attempts.len(), before);
                        }
                    }
                }
                Event::Hedge => {
                    if attempts.len() == 1 && self.withdraw(&pool, "hedge") {
                        start_attempt(&mut tried, &mut attempts, &mut streamed);
                    }
                }
            }
        }
        let (f, addr) = last_failure.expect("the loop ends only after a failure");
        let code = f.status();
        self.count_local(&pool.name, code.as_u16());
        pool.duration.observe(start.elapsed().as_secs_f64());
        local_response(
            code,
            &format!("pool {}: target {addr}: {}", pool.name, describe(f)),
        )
    }

    fn withdraw(&self, pool: &PoolRt, reason: &str) -> bool {
        let ok = pool
            .budget
            .lock()
            .expect("budget lock")
            .try_withdraw(pool.now());
        if ok {
            self.metrics
                .retries
                .get_or_create(&RetryLabels {
                    pool: pool.name.clone(),
                    reason: reason.to_string(),
                })
                .inc();
        } else {
            self.metrics
                .retries_denied
                .get_or_create(&PoolLabels {
                    pool: pool.name.clone(),
                })
                .inc();
        }
        ok
    }

    fn count_local(&self, pool: &str, code: u16) {
        self.metrics
            .requests
            .get_or_create(&RequestLabels {
                pool: pool.to_string(),
                target: "none".into(),
                code: code.to_string(),
            })
            .inc();
    }
}

fn describe(f: Failure) -> &'static str {
    match f {
        Failure::Connect => "connection failed",
        Failure::Reset => "connection reset before the response",
        Failure::Garbage => "invalid HTTP response",
        Failure::Timeout => "no response header within the response-header timeout",
    }
}

/// Displays an error with its sources.
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut s = self.0.source();
        while let Some(e) = s {
            write!(f, ": {e}")?;
            s = e.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_removed_with_those_connection_names() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert("x-keep", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        let left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, vec!["x-keep"], "only end-to-end headers may pass");
    }

    #[test]
    fn forwarding_header_values_append_or_insert() {
        let mut h = HeaderMap::new();
        append_header_value(&mut h, header::VIA, HeaderValue::from_static(VIA));
        assert_eq!(h[header::VIA], "1.1 vigil");
        append_header_value(&mut h, header::VIA, HeaderValue::from_static("1.1 other"));
        assert_eq!(h[header::VIA], "1.1 vigil, 1.1 other");
    }

    #[test]
    fn messages_without_hop_by_hop_headers_are_left_alone() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("a"));
        h.insert("x-keep", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 2);
        h.insert("proxy-connection", HeaderValue::from_static("keep-alive"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 2, "proxy-connection is hop-by-hop");
    }

    #[test]
    fn forwarding_headers_append() {
        let mut h = HeaderMap::new();
        append_header_value(&mut h, header::VIA, HeaderValue::from_static(VIA));
        assert_eq!(h[header::VIA], "1.1 vigil");
        h.insert("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        append_header_value(
            &mut h,
            X_FORWARDED_FOR,
            HeaderValue::from_static("127.0.0.1"),
        );
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 127.0.0.1");
    }

    #[test]
    fn hop_by_hop_index_matches_the_table() {
        for (i, n) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_by_hop_index(n), Some(i), "{n}");
        }
        assert_eq!(hop_by_hop_index(&header::HOST), None);
    }

    #[test]
    fn idempotent_methods_per_rfc_9110() {
        assert!(is_idempotent(&Method::GET) && is_idempotent(&Method::PUT));
        assert!(!is_idempotent(&Method::POST) && !is_idempotent(&Method::PATCH));
    }
}
