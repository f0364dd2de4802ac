//! The client connections of one listener, counted against
//! `limits.max_client_connections` (issue 38: before it, the open-file limit was the
//! only cap, and 3,000 slow HTTP/2 clients held 64 MiB).
//!
//! Floor 3, downstream, a child of [`crate::downstream`]: imports metrics only.
//!
//! One `Admission` per listener (the plain `listen`, each TLS listener), shared by
//! every worker: the workers' sockets on one address are one listener to the operator.
//! An accepted connection takes an [`Admitted`] and keeps it for as long as its socket
//! is open, through its stay in the park ([`crate::park`]) if it idles; dropping it
//! gives the place back. Over the limit, the connection is refused at once
//! ([`crate::downstream::refuse`]): a plain one gets `503` with `Retry-After: 1` and is
//! closed, a TLS one is closed before its handshake (answering would cost a handshake
//! exactly when the balancer is full); past `ANSWERED_AT_ONCE` refusals being
//! answered, a plain one is closed unanswered too. HAProxy's `maxconn` leaves such connections in
//! the kernel's backlog instead; a clear refusal tells a client to go elsewhere now.

use crate::metrics::{ListenerLabels, Metrics};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Refusals are logged at most this often (each line says how many since the last).
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Refused connections answered at once per listener (each holds its socket for the
/// answer and up to a second of lingering, [`crate::downstream::refuse`]); past them a
/// refused connection is closed without an answer, so a flood over the limit cannot
/// hold more than this many descriptors beyond it.
const ANSWERED_AT_ONCE: usize = 64;

/// A listener's connection count and limit.
#[derive(Debug)]
pub struct Admission {
    /// The listener's key in lb.toml: `listen` or `tls_listeners.<name>`.
    listener: String,
    max: usize,
    /// Open connections (`vigil_lb_client_connections`): the count itself.
    open: Gauge,
    /// `vigil_lb_client_connections_refused_total`.
    refused: Counter,
    /// When a refusal was last logged, and refusals since.
    warned: Mutex<(Option<Instant>, u64)>,
    /// Refused connections being answered now.
    answering: AtomicUsize,
}

/// A connection's place under its listener's limit, given back when dropped.
#[derive(Debug)]
pub struct Admitted(Arc<Admission>);

/// A refused connection's place among those being answered
/// ([`Admission::answer_refusal`]), given back when dropped.
#[derive(Debug)]
pub struct Answering(Arc<Admission>);

impl Admission {
    /// The count of `listener` (its key in lb.toml), at most `max` open at once.
    pub fn new(listener: &str, max: usize, metrics: &Metrics) -> Arc<Admission> {
        let labels = ListenerLabels {
            listener: listener.to_string(),
        };
        Arc::new(Admission {
            listener: listener.to_string(),
            max,
            open: metrics.client_connections.get_or_create(&labels).clone(),
            refused: metrics
                .client_connections_refused
                .get_or_create(&labels)
                .clone(),
            warned: Mutex::new((None, 0)),
            answering: AtomicUsize::new(0),
        })
    }

    /// Whether a refused connection may be answered (at most `ANSWERED_AT_ONCE` at
    /// once), or must be closed without an answer.
    pub fn answer_refusal(self: &Arc<Self>) -> Option<Answering> {
        let before = self.answering.fetch_add(1, Ordering::AcqRel);
        if before < ANSWERED_AT_ONCE {
            return Some(Answering(self.clone()));
        }
        self.answering.fetch_sub(1, Ordering::AcqRel);
        None
    }

    /// A place for a new connection, or `None` (counted and logged) when `max` are
    /// open. Racing admissions may both be refused at the last place, never both let
    /// in past it.
    pub fn admit(self: &Arc<Self>) -> Option<Admitted> {
        let before = self.open.inc();
        if usize::try_from(before).is_ok_and(|n| n < self.max) {
            return Some(Admitted(self.clone()));
        }
        self.open.dec();
        self.refused.inc();
        let mut warned = self.warned.lock().expect("admission log lock");
        warned.1 += 1;
        let now = Instant::now();
        if warned
            .0
            .is_none_or(|at| now.duration_since(at) >= WARN_EVERY)
        {
            tracing::warn!(
                listener = %self.listener,
                "{} connections open on {}, its limits.max_client_connections: {} new \
                 connection(s) refused since the last such line",
                self.max,
                self.listener,
                warned.1
            );
            *warned = (Some(now), 0);
        }
        None
    }

    /// The limit.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        usize::try_from(self.open.get()).unwrap_or(0)
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.open.dec();
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.answering.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_admits_up_to_its_limit_and_each_close_gives_a_place_back() {
        let metrics = Metrics::new();
        let a = Admission::new("listen", 2, &metrics);
        let first = a.admit().expect("1 of 2");
        let second = a.admit().expect("2 of 2");
        assert!(a.admit().is_none(), "a third is refused");
        assert_eq!(a.open(), 2, "a refusal takes no place");
        drop(first);
        let third = a.admit().expect("a place was given back");
        let answered: Vec<Answering> = (0..ANSWERED_AT_ONCE)
            .map(|_| a.answer_refusal().expect("answered"))
            .collect();
        assert!(a.answer_refusal().is_none(), "past them: closed unanswered");
        drop(answered);
        assert!(a.answer_refusal().is_some(), "answering places come back");
        drop((second, third));
        assert_eq!(a.open(), 0);
        let text = metrics.encode();
        assert!(
            text.contains("vigil_lb_client_connections_refused_total{listener=\"listen\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("vigil_lb_client_connections{listener=\"listen\"} 0"),
            "{text}"
        );
    }
}
