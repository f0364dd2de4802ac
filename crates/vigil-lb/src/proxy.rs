//! The data path: pick a target, forward, retry, hedge, and answer. The client side
//! ([`crate::downstream`]) has already matched a route to a pool, serialised the request
//! (hop-by-hop fields removed, `X-Forwarded-For`, `X-Forwarded-Proto` and `Via` added)
//! and read a small body whole; a large one is streamed from the client by the attempt.
//!
//! Floor 4, proxy (floors: the crate doc): imports pool, upstream, and the shared body,
//! http_util, config and metrics.
//!
//! One request's life here:
//! 1. pick a target (P2C or round-robin over the pool's routing snapshot); none: 503
//!    with `Retry-After`;
//! 2. forward with a response-header timeout; meanwhile, watch for the target leaving
//!    service and for the hedge delay;
//! 3. on a connect failure (always safe: nothing was sent), or a reset or a per-try
//!    timeout before the response of an idempotent request (any buffered one with
//!    `retries.methods = "all"`), retry on another target within the pool's retry
//!    budget and, for a timeout, within the overall response-header time; when the target is ejected while the request waits, an idempotent
//!    request moves to another target at once; past the hedge delay, an idempotent
//!    request is also sent to a second target and the first answer wins;
//! 4. report every outcome to outlier detection; answer 502 (connect failure, reset,
//!    garbage), 504 (no response header in time), or the target's response.
//!
//! Errors record where they came from and whether a retry is allowed ([`AttemptFailure`]).

use crate::body::BodyReader;
use crate::config::RetryMethods;
use crate::http_util::{AttemptFailure, describe};
use crate::metrics::{Metrics, PoolLabels, RequestLabels, RetryLabels};
use crate::pool::{AttemptVerdict, PoolRt, TargetRt};
use crate::upstream::{AttemptTimeouts, Outgoing, UpstreamResponse};
use smallvec::SmallVec;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::futures::OwnedNotified;
use vigil_core::outlier::RequestOutcome;
use vigil_core::retry::{self, Retry, Trigger};

/// What the proxy needs from the current configuration, per request.
pub struct ProxyTable {
    /// Routing rules in order.
    pub routes: Vec<RouteRule>,
    /// Time to a response header, every attempt included (the client's wait).
    pub response_header_timeout: Duration,
    /// Time one attempt has for its response header (at most the above), when set;
    /// else each pool derives its own from its retries
    /// ([`vigil_core::retry::default_per_try`]).
    pub per_try_timeout: Option<Duration>,
    /// Whether a client's own deadline is honoured (`headers.deadline`).
    pub client_deadline: crate::config::ClientDeadline,
    /// Longest wait for a target to take more of a request.
    pub send_timeout: Duration,
    /// Longest wait for more of a response body, once its head was forwarded.
    pub response_body_timeout: Duration,
    /// The whole exchange, from the request head to the last byte of the answer.
    pub request_timeout: Option<Duration>,
    /// Largest body buffered for retries.
    pub max_retry_body_bytes: usize,
    /// Time a client has to send a buffered body.
    pub client_body_timeout: Duration,
    /// Connect timeout to targets.
    pub connect_timeout: Duration,
    /// Idle time after which a pooled target connection is closed.
    pub idle_timeout: Duration,
    /// What is done with request fields whose name has an underscore.
    pub underscores: crate::config::Underscores,
    /// Longest quiet time of a tunnel (after a `101`).
    pub tunnel_idle_timeout: Duration,
    /// This configuration's access log, when `[access_log]` is enabled.
    pub access_log: Option<crate::access_log::AccessLog>,
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
    /// The time one attempt of a pool retrying up to `max_retries` times has for its
    /// response header.
    pub fn per_try(&self, max_retries: u32) -> Duration {
        self.per_try_timeout.unwrap_or_else(|| {
            vigil_core::retry::default_per_try(self.response_header_timeout, max_retries)
        })
    }

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

/// What the client gets for a request.
// The target's head (its field spans inline) is moved twice per request; boxing it
// would cost an allocation each time to save copying ~300 bytes.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Reply {
    /// The target's response.
    Target(UpstreamResponse),
    /// One of vigil's own: a status code and a one-line message.
    Local(u16, String),
}

/// Who answered a forwarded request, for the access log: known here at no cost, and
/// dropped unread when access logs are off.
#[derive(Default)]
pub struct Served {
    /// The target whose response is forwarded; `None` when vigil answers itself.
    pub target: Option<Arc<TargetRt>>,
    /// Targets tried, retries and hedges included.
    pub attempts: u32,
    /// From the winning attempt's start to its response head.
    pub upstream: Option<Duration>,
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

type AttemptResult = Result<UpstreamResponse, AttemptFailure>;
type AttemptFuture<'a> = Pin<Box<dyn Future<Output = AttemptResult> + Send + 'a>>;

/// An attempt in flight: one with a buffered body owns everything it uses (it can be
/// left to finish on its own when a hedge wins); one streaming the client's body
/// borrows the client connection.
enum AttemptFut<'a> {
    Buffered(AttemptFuture<'static>),
    Streamed(AttemptFuture<'a>),
}

impl AttemptFut<'_> {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<AttemptResult> {
        match self {
            AttemptFut::Buffered(f) => f.as_mut().poll(cx),
            AttemptFut::Streamed(f) => f.as_mut().poll(cx),
        }
    }
}

struct Attempt<'a> {
    target: Arc<TargetRt>,
    fut: AttemptFut<'a>,
    /// Fires when the target leaves service; `None` once ignored.
    left: Option<Pin<Box<OwnedNotified>>>,
    started: Instant,
    /// When the response header is due (the per-try timeout, bounded by the overall
    /// response-header time and the request's deadline).
    deadline: tokio::time::Instant,
    guard: OutstandingGuard,
}

#[allow(clippy::large_enum_variant)] // as Reply: not boxed on purpose
enum Event {
    Done(usize, AttemptResult),
    Left(usize),
    Hedge,
}

impl Proxy {
    /// Sends one client request to `pool` (`out`: the request serialised once;
    /// `streamed`: its body when too large to buffer, read from the client as it is
    /// sent) and returns what the client gets, by `deadline` (the request's, if any),
    /// and who answered.
    pub async fn forward<'a, 'b>(
        &self,
        table: &ProxyTable,
        pool: &Arc<PoolRt>,
        out: Outgoing,
        mut streamed: Option<&'a mut BodyReader<'b>>,
        deadline: Option<tokio::time::Instant>,
    ) -> (Reply, Served) {
        let start = Instant::now();
        pool.budget.lock().expect("budget lock").deposit(pool.now());
        let section = pool.section.load_full();

        // Inline: one attempt is the rule, a retry or a hedge the exception.
        let mut tried: SmallVec<[Arc<TargetRt>; 3]> = SmallVec::new();
        let mut attempts: SmallVec<[Attempt<'a>; 2]> = SmallVec::new();
        let mut retries = 0u32;
        let mut last_failure: Option<(AttemptFailure, String)>;
        let replay = retry::Replay {
            buffered: streamed.is_none(),
            idempotent: out.is_idempotent(),
            all_methods: section.retries.methods == RetryMethods::All,
            upgrade: out.is_upgrade(),
        };
        // The client's wait for a response header, every attempt included.
        let now = tokio::time::Instant::now();
        let header_due = now + table.response_header_timeout;
        // A trusted client deadline (headers.deadline) bounds it too.
        let client_due = out.client_deadline().map(|d| now + d);
        let overall = [deadline, client_due]
            .into_iter()
            .flatten()
            .fold(header_due, tokio::time::Instant::min);
        let per_try = table.per_try(section.retries.max_retries);
        let soft_per_try = table.per_try_timeout.is_none();
        // What bounds a streamed upload's wait: the request's deadline, the client's.
        let bound = [deadline, client_due].into_iter().flatten().min();
        // Where the request stands, for the retry rules (vigil_core::retry).
        let progress = |retries| retry::Progress {
            retries,
            max_retries: section.retries.max_retries,
            time_left: tokio::time::Instant::now() < overall,
            hedging: section.hedge.enabled,
        };
        // Serialised once; every attempt (retry, hedge) sends the same bytes.
        let out = Arc::new(out);
        let hedge_delay = replay.hedgeable(section.hedge.enabled).then(|| {
            pool.latency
                .hedge_delay(section.hedge.min_delay, section.hedge.max_delay)
        });
        // One timer per request serves the hedge delay and every attempt's
        // response-header deadline: it is re-armed for the earliest of them.
        let mut hedge_at = hedge_delay.map(|d| tokio::time::Instant::now() + d);
        let timer = tokio::time::sleep(table.response_header_timeout);
        tokio::pin!(timer);

        let mut start_attempt = |tried: &mut SmallVec<[Arc<TargetRt>; 3]>,
                                 attempts: &mut SmallVec<[Attempt<'a>; 2]>|
         -> bool {
            let Some(target) = pool.pick(tried) else {
                return false;
            };
            tried.push(target.clone());
            let left = target.left_service.clone().notified_owned();
            let (t, out, body) = (target.clone(), out.clone(), streamed.take());
            let now = tokio::time::Instant::now();
            // When this attempt's response header is due: its per-try time, within the
            // overall wait. A streamed upload's answer is timed from the body's end
            // (`head`), bounded only by the request's deadline from here.
            let due = match body {
                Some(_) => bound.unwrap_or_else(|| now + Duration::from_secs(365 * 86_400)),
                None => (now + per_try).min(overall),
            };
            // What the target is told (vigil_core::admission::DEADLINE_HEADER): the
            // time this balancer will still wait for the attempt's header.
            let told = match body {
                Some(_) => table
                    .response_header_timeout
                    .min(due.saturating_duration_since(now)),
                None => due.saturating_duration_since(now),
            };
            let timeouts = AttemptTimeouts {
                connect: table.connect_timeout,
                idle: table.idle_timeout,
                head: table.response_header_timeout,
                send: table.send_timeout,
                deadline: told,
            };
            let fut = match body {
                // An upload can take longer than the response-header timeout: the
                // attempt times its answer from the end of the body itself; only the
                // request's deadline bounds it from here.
                Some(body) => AttemptFut::Streamed(Box::pin(async move {
                    t.conns
                        .send(&out, t.host_header.as_bytes(), Some(body), timeouts)
                        .await
                })),
                None => AttemptFut::Buffered(Box::pin(async move {
                    t.conns
                        .send(&out, t.host_header.as_bytes(), None, timeouts)
                        .await
                })),
            };
            target.outstanding.fetch_add(1, Ordering::Relaxed);
            // Racing: the target may have left service between the pick and now; then
            // its notification is already gone, and `in_service` says so.
            let in_service = target.in_service.load(Ordering::Relaxed);
            attempts.push(Attempt {
                guard: OutstandingGuard(target.clone()),
                target,
                fut,
                left: in_service.then(|| Box::pin(left)),
                started: Instant::now(),
                deadline: due,
            });
            true
        };

        // Local shedding (the pool's `throttle`): while the targets refuse most of what
        // they are sent, answer part of the requests at once instead of adding to it.
        if pool.shedding.sheds(pool.now(), rand::random::<f64>()) {
            self.metrics
                .requests_shed
                .get_or_create(&PoolLabels {
                    pool: pool.name.clone(),
                })
                .inc();
            self.count_local(&pool.name, 503);
            pool.clients.record(503, true);
            let msg = format!(
                "pool {}: shed locally, its targets refuse most requests (throttle)",
                pool.name
            );
            return (Reply::Local(503, msg), Served::default());
        }
        if !start_attempt(&mut tried, &mut attempts) {
            self.count_local(&pool.name, 503);
            pool.clients.record(503, true);
            let msg = format!("pool {}: no target available", pool.name);
            return (Reply::Local(503, msg), Served::default());
        }

        loop {
            let ev = std::future::poll_fn(|cx: &mut Context<'_>| {
                for (i, a) in attempts.iter_mut().enumerate() {
                    if let Poll::Ready(r) = a.fut.poll(cx) {
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
                        let f = match attempts[i].fut {
                            AttemptFut::Buffered(_) => AttemptFailure::Timeout,
                            AttemptFut::Streamed(_) => AttemptFailure::Deadline,
                        };
                        return Poll::Ready(Event::Done(i, Err(f)));
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
                    let code = resp.head.status;
                    pool.observe_request(&a.target, RequestOutcome::Response(code));
                    pool.throttle.record(AttemptVerdict::of_status(code));
                    pool.shedding.record(pool.now(), !matches!(code, 429 | 503));
                    a.target.count(&self.metrics, code);
                    pool.clients.record(code, false);
                    // Losing attempts (hedges) finish on their own: being slower than
                    // a hedge is not a failure (latency is for a latency-aware policy),
                    // so they are judged by how they end, an answer or their per-try
                    // timeout (a frozen target is still ejected, a slow one is not).
                    for loser in attempts.drain(..) {
                        finish_alone(pool, loser);
                    }
                    let served = Served {
                        target: Some(a.target),
                        attempts: tried.len() as u32,
                        upstream: Some(elapsed),
                    };
                    return (Reply::Target(resp), served);
                }
                Event::Done(i, Err(f)) => {
                    let a = attempts.swap_remove(i);
                    // A derived per-try time (no `timeouts.per_try`) is a cue to try
                    // another target, not a limit: when no retry can go (no other
                    // target, the throttle or the budget says no), the attempt keeps
                    // the rest of the client's wait, as it had before per-try times
                    // were derived. Otherwise a one-target pool, or any pool whose
                    // retries the throttle stopped in an overload, would cut every
                    // answer slower than the share.
                    let soft = soft_per_try && f == AttemptFailure::Timeout && a.deadline < overall;
                    // The client's failures are not the target's: not counted. Nor is
                    // a connect failure: nothing was sent, so retrying it adds no work
                    // to the fleet (a killed target among four would otherwise drain
                    // the bucket and turn its refused connects into 502s); checks and
                    // outlier detection take that target out. A try past its share is
                    // slow enough to count against retries.
                    if f.outcome().is_some() && f != AttemptFailure::Connect {
                        pool.throttle.record(AttemptVerdict::Failure);
                    }
                    let retried = if let Retry::Go(reason) =
                        retry::decide(&replay, Trigger::Failed(f.end()), &progress(retries))
                        && self.withdraw(pool, reason)
                    {
                        retries += 1;
                        tracing::debug!(pool = %pool.name, target_id = %a.target.addr, failure = f.name(), "retrying on another target");
                        start_attempt(&mut tried, &mut attempts)
                    } else {
                        false
                    };
                    if soft && !retried {
                        tracing::debug!(pool = %pool.name, target_id = %a.target.addr, "past the derived per-try time, no retry possible: waiting on");
                        // Judged by how it ends, like a hedge's loser.
                        attempts.push(Attempt {
                            deadline: overall,
                            ..a
                        });
                        continue;
                    }
                    if let Some(outcome) = f.outcome() {
                        pool.observe_request(&a.target, outcome);
                        pool.shedding.record(pool.now(), false);
                    }
                    let kind = match f {
                        AttemptFailure::Timeout if a.deadline < overall => Some("per_try"),
                        AttemptFailure::Timeout
                            if client_due == Some(overall) && overall < header_due =>
                        {
                            Some("deadline")
                        }
                        AttemptFailure::Timeout if overall < header_due => Some("request"),
                        AttemptFailure::Timeout => Some("response_header"),
                        AttemptFailure::SendStall => Some("send"),
                        AttemptFailure::Deadline => Some("request"),
                        _ => None,
                    };
                    if let Some(kind) = kind {
                        self.count_timeout(&pool.name, kind);
                    }
                    last_failure = Some((f, a.target.addr.clone()));
                    if retried {
                        continue;
                    }
                    if attempts.is_empty() {
                        break;
                    }
                }
                Event::Left(i) => {
                    // The target was ejected or went unhealthy while this request waits
                    // on it: an idempotent request moves now rather than waiting for a
                    // target we already believe broken.
                    if let Retry::Go(reason) =
                        retry::decide(&replay, Trigger::TargetLeft, &progress(retries))
                        && self.withdraw(pool, reason)
                    {
                        retries += 1;
                        let before = attempts.len();
                        if start_attempt(&mut tried, &mut attempts) {
                            tracing::debug!(pool = %pool.name, target_id = %attempts[i].target.addr, moved_to = %attempts[before].target.addr, "target left service: request moved");
                            let _abandoned = attempts.swap_remove(i);
                            debug_assert_eq!(attempts.len(), before);
                        }
                    }
                }
                Event::Hedge => {
                    let due = Trigger::HedgeDue {
                        in_flight: attempts.len(),
                    };
                    if let Retry::Go(reason) = retry::decide(&replay, due, &progress(retries))
                        && self.withdraw(pool, reason)
                    {
                        start_attempt(&mut tried, &mut attempts);
                    }
                }
            }
        }
        let (f, addr) = last_failure.expect("the loop ends only after a failure");
        let code = f.status();
        self.count_local(&pool.name, code);
        pool.clients.record(code, true);
        pool.duration.observe(start.elapsed().as_secs_f64());
        let served = Served {
            target: None,
            attempts: tried.len() as u32,
            upstream: None,
        };
        let msg = format!("pool {}: target {addr}: {}", pool.name, describe(f));
        (Reply::Local(code, msg), served)
    }

    /// Whether a retry or hedge (for `reason`) may go: the retry throttle must allow it
    /// (not most attempts failing), then the budget must grant it. Refusals are counted
    /// by which of the two refused.
    fn withdraw(&self, pool: &PoolRt, reason: &str) -> bool {
        if !pool.throttle.allows() {
            self.metrics
                .retries_throttled
                .get_or_create(&PoolLabels {
                    pool: pool.name.clone(),
                })
                .inc();
            tracing::debug!(pool = %pool.name, reason, "retry refused by the retry throttle");
            return false;
        }
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

    /// Counts a timeout of `kind` (per_try, response_header, send, response_body, request).
    pub fn count_timeout(&self, pool: &str, kind: &str) {
        self.metrics
            .timeouts
            .get_or_create(&crate::metrics::TimeoutLabels {
                pool: pool.to_string(),
                kind: kind.to_string(),
            })
            .inc();
    }

    /// Counts a TLS handshake by how it ended (ok, error, timeout).
    pub fn count_handshake(&self, result: &str) {
        self.metrics
            .tls_handshakes
            .get_or_create(&crate::metrics::HandshakeLabels {
                result: result.to_string(),
            })
            .inc();
    }

    /// Counts `n` client request fields not forwarded, for `reason`.
    pub fn count_dropped(&self, reason: &str, n: u32) {
        self.metrics
            .fields_dropped
            .get_or_create(&crate::metrics::DropLabels {
                reason: reason.to_string(),
            })
            .inc_by(u64::from(n));
    }

    /// Counts an answer vigil made itself.
    pub fn count_local(&self, pool: &str, code: u16) {
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

/// Lets an attempt a hedge overtook run to its end (an answer, a failure, or its
/// deadline) on its own, and tells outlier detection how it ended. Only attempts with a
/// buffered body are ever overtaken (hedging needs the body twice).
fn finish_alone(pool: &Arc<PoolRt>, loser: Attempt<'_>) {
    let Attempt {
        target,
        fut,
        deadline,
        guard,
        ..
    } = loser;
    let AttemptFut::Buffered(fut) = fut else {
        return;
    };
    let pool = pool.clone();
    tokio::spawn(async move {
        // Still outstanding on its target until it ends: balancing sees the load.
        let _guard = guard;
        let outcome = match tokio::time::timeout_at(deadline, fut).await {
            // Dropped unread: the connection closes unless the body came whole.
            Ok(Ok(resp)) => Some(RequestOutcome::Response(resp.head.status)),
            Ok(Err(f)) => f.outcome(),
            Err(_) => Some(RequestOutcome::Timeout),
        };
        if let Some(o) = outcome {
            pool.observe_request(&target, o);
            match o {
                RequestOutcome::Response(code) => {
                    pool.throttle.record(AttemptVerdict::of_status(code))
                }
                RequestOutcome::ConnectFailure => {}
                _ => pool.throttle.record(AttemptVerdict::Failure),
            }
            let accepted = matches!(o, RequestOutcome::Response(c) if c != 429 && c != 503);
            pool.shedding.record(pool.now(), accepted);
        }
    });
}
