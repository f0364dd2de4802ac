//! The leader lease, as one replica sees it: when to ask the store for the lease, and
//! when to stop trusting it. Sans-IO: the driver sends the requests this asks for (one
//! statement each, judged by the database's clock) and passes the answers and its own
//! monotonic time in.
//!
//! ## The rules
//!
//! 1. **One request at a time.** [`LeaderLease::poll`] hands out a request (acquire, or
//!    renew the epoch held) only when none is in flight; the driver answers every one
//!    ([`LeaderLease::answer`]), a timeout or a lost connection as [`StoreReply::Failed`].
//! 2. **Renew at a fraction of the TTL.** A leader renews `renew_every` (default a third
//!    of the TTL) after it *sent* its last successful request; after a failed one it
//!    tries again every `retry_every`. A follower asks every `retry_every`, so a lease
//!    given up (expired at once) is taken within about that.
//! 3. **Trust runs from the send, not the answer.** A grant is good until
//!    `sent + ttl - margin` on the local monotonic clock: the database set its expiry
//!    from its own `now()`, which came after the send, so the local deadline ends first
//!    whatever the request's latency (an answer that arrives after its deadline promotes
//!    nobody). `margin` (default a fifth of the TTL) absorbs the two clocks' rate
//!    difference; NTP slews a clock by at most 0.05%.
//! 4. **Self-demotion on the local deadline.** Past it, [`LeaderLease::leading`] says
//!    no, whatever the store says later; [`LeaderLease::tick`] reports the demotion. A
//!    leader told the lease is someone else's (or ours at another epoch) is demoted at
//!    once.
//! 5. **Every term is its own epoch.** A grant at an epoch other than the one held is a
//!    new term ([`Change::Promoted`]): the driver reloads what the previous leader
//!    committed before deciding anything.
//!
//! The rules bound *belief*; they cannot stop a process paused between checking
//! [`LeaderLease::leading`] and writing. That is the store's fence: every write names
//! the epoch it was decided under and is refused once the lease moved on. The tests
//! below drive replicas through random pauses (up to 3 x TTL), crashes and partitions
//! against a model of that store.
//!
//! Patroni's rule for its settings is `loop_wait + 2 x retry_timeout <= ttl`; here
//! [`LeaseConfig::validate`] asks that two renewals fit before the local deadline:
//! `2 x renew_every <= ttl - margin`.

use crate::{Invalid, Time};
use std::time::Duration;

/// Default lease TTL: 10 s. A failover takes at most about this (plus `retry_every`);
/// shorter makes a slow database demote a healthy leader.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);

/// How a replica keeps a lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    /// How long the store keeps a lease without renewal.
    pub ttl: Duration,
    /// A leader renews this long after its last successful request was sent.
    pub renew_every: Duration,
    /// After a failed request (leader) or between attempts (follower).
    pub retry_every: Duration,
    /// The local deadline is `ttl - margin` after the send.
    pub margin: Duration,
}

impl LeaseConfig {
    /// The defaults for `ttl`: renew at a third of it, a margin of a fifth, retries
    /// every second (or a third of the TTL if shorter).
    pub fn new(ttl: Duration) -> Self {
        LeaseConfig {
            ttl,
            renew_every: ttl / 3,
            retry_every: (ttl / 3).min(Duration::from_secs(1)),
            margin: ttl / 5,
        }
    }

    /// Checks that two renewals fit before the local deadline.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.ttl.is_zero() {
            return Err(Invalid::new("ttl", "must be longer than 0s"));
        }
        if self.renew_every.is_zero() || self.retry_every.is_zero() {
            return Err(Invalid::new("renew_every", "must be longer than 0s"));
        }
        if self.margin >= self.ttl || self.renew_every * 2 > self.ttl - self.margin {
            return Err(Invalid::new(
                "renew_every",
                format!(
                    "{:?} leaves no room for a second renewal before the local deadline (ttl {:?} - margin {:?}): at most half of that",
                    self.renew_every, self.ttl, self.margin
                ),
            ));
        }
        Ok(())
    }
}

/// What to ask the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// When it is sent (the driver's monotonic time).
    pub sent: Time,
    /// The epoch to renew; None: acquire only if the lease has expired.
    pub renew: Option<u64>,
}

/// The store's answer to a [`Request`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreReply {
    /// Ours at this epoch.
    Granted(u64),
    /// Held by someone else (or by us at another epoch).
    Held,
    /// No answer: error, timeout, lost connection.
    Failed,
}

/// A change of role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// A new term began, at this epoch: reload, then lead. It ends any term before it
    /// (which may not have been reported as [`Change::Demoted`]).
    Promoted(u64),
    /// The term at this epoch ended: stop acting.
    Demoted(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Term {
    epoch: u64,
    since: Time,
    deadline: Time,
}

/// One replica's view of the lease; see the module doc.
#[derive(Clone, Debug)]
pub struct LeaderLease {
    config: LeaseConfig,
    term: Option<Term>,
    in_flight: Option<Request>,
    next_request: Time,
}

impl LeaderLease {
    /// A follower that asks at once.
    pub fn new(config: LeaseConfig, now: Time) -> Self {
        LeaderLease {
            config,
            term: None,
            in_flight: None,
            next_request: now,
        }
    }

    /// The settings.
    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    /// The request to send now, if one is due and none is in flight (rule 1).
    pub fn poll(&mut self, now: Time) -> Option<Request> {
        if self.in_flight.is_some() || now < self.next_request {
            return None;
        }
        let r = Request {
            sent: now,
            renew: self.leading(now),
        };
        self.in_flight = Some(r);
        Some(r)
    }

    /// The answer to the request in flight, at `now`. Returns a change of role.
    pub fn answer(&mut self, now: Time, answer: StoreReply) -> Option<Change> {
        let Some(req) = self.in_flight.take() else {
            return None; // Nothing asked: nothing to learn.
        };
        let c = self.config;
        match answer {
            StoreReply::Granted(epoch) => {
                self.next_request = req.sent + c.renew_every;
                let deadline = req.sent + c.ttl.saturating_sub(c.margin);
                // A term past its deadline is over, whatever this answer says (rule 4).
                let ended = self.expire(now);
                if deadline <= now {
                    // Too late to trust (rule 3); ask again at once.
                    self.next_request = now;
                    return ended;
                }
                match self.term {
                    Some(t) if t.epoch == epoch => {
                        self.term = Some(Term {
                            deadline: deadline.max(t.deadline),
                            ..t
                        });
                        None
                    }
                    // No term, one that just ended, or one at another epoch (lost and
                    // won again in between): a new term (rule 5), which ends the old.
                    _ => {
                        self.term = Some(Term {
                            epoch,
                            since: now,
                            deadline,
                        });
                        Some(Change::Promoted(epoch))
                    }
                }
            }
            StoreReply::Held => {
                self.next_request = now + c.retry_every;
                self.term
                    .take()
                    .map(|t| Change::Demoted(t.epoch))
                    .or_else(|| self.expire(now))
            }
            StoreReply::Failed => {
                self.next_request = now + c.retry_every;
                self.expire(now)
            }
        }
    }

    /// Ends the term if its local deadline has passed (rule 4).
    pub fn tick(&mut self, now: Time) -> Option<Change> {
        self.expire(now)
    }

    fn expire(&mut self, now: Time) -> Option<Change> {
        match self.term {
            Some(t) if t.deadline <= now => {
                self.term = None;
                Some(Change::Demoted(t.epoch))
            }
            _ => None,
        }
    }

    /// The epoch this replica may act under at `now`, if it leads.
    pub fn leading(&self, now: Time) -> Option<u64> {
        self.term.filter(|t| now < t.deadline).map(|t| t.epoch)
    }

    /// When the current term began (local time), if leading.
    pub fn since(&self) -> Option<Time> {
        self.term.map(|t| t.since)
    }

    /// When the driver must call again (the next request, or the local deadline); None
    /// while a follower waits for the answer in flight (the answer is the next event).
    pub fn next_wake(&self) -> Option<Time> {
        match (self.term, self.in_flight) {
            (Some(t), None) => Some(t.deadline.min(self.next_request)),
            (Some(t), Some(_)) => Some(t.deadline),
            (None, None) => Some(self.next_request),
            (None, Some(_)) => None,
        }
    }

    /// Gives the term up (graceful stop): returns the epoch to release in the store.
    pub fn resign(&mut self) -> Option<u64> {
        self.term.take().map(|t| t.epoch)
    }
}

#[cfg(test)]
mod tests;
