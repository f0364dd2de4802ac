//! May a request go again to another target, and why: the balancer's retry, move and
//! hedge eligibility as one pure function.
//!
//! The retry *budget* (how many extra attempts the pool can afford) is
//! [`RetryBudget`](crate::pool::RetryBudget), stateful and timed; this module decides
//! whether a request is *eligible* for another attempt at all, from what the request is
//! and how its last attempt ended. The balancer asks [`decide`] first and withdraws from
//! the budget only on [`Retry::Go`], with the reason as the metric label.
//!
//! # The rules
//!
//! A request may be sent again only if it can be sent again: its body is
//! **buffered** (a streamed upload was consumed by the attempt that read it, so it never
//! goes twice, not even after a connect failure) and it is not over its retry limit
//! (`max_retries` extra attempts, moves included). Then, by trigger:
//!
//! | trigger | may go again when |
//! |---|---|
//! | connect failed | always: nothing was sent |
//! | connection reset before a response header | the request is **replayable**: idempotent (RFC 9110 9.2.2), or the pool marks every method retriable |
//! | per-try timeout or send stall (a frozen target) | replayable, and the request's overall time is not used up |
//! | garbage answer (not HTTP) | never: the target is broken and may have acted on it |
//! | the client's body broke, or the request's deadline passed | never: not the target's doing |
//! | the target left service (ejected, unhealthy) while the request waits on it | replayable: the request *moves* rather than waiting on a target believed broken |
//! | the hedge delay passed | hedging is on for the pool, the request is idempotent, buffered and not an upgrade (two copies of an upgrade would open two tunnels), and only one attempt is in flight |
//!
//! A hedge draws on the budget but not on the retry limit (at most one hedge per request:
//! it goes only while one attempt is in flight). An attempt overtaken by a hedge is not a
//! failure (see the outlier module): eligibility says nothing about ejection.

use std::time::Duration;

/// What a request is, as far as sending it again is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replay {
    /// The body is held in memory (or there is none), so it can be sent again.
    pub buffered: bool,
    /// The method is idempotent (GET, HEAD, PUT, DELETE, OPTIONS, TRACE).
    pub idempotent: bool,
    /// The pool marks every method retriable (`retries.methods = "all"`).
    pub all_methods: bool,
    /// The request asks to switch protocols (`Upgrade`).
    pub upgrade: bool,
}

impl Replay {
    /// Whether a target may see this request a second time after one may have acted on
    /// it: buffered, and idempotent or every method allowed.
    pub fn replayable(&self) -> bool {
        self.buffered && (self.idempotent || self.all_methods)
    }

    /// Whether this request may be hedged when the pool hedges (`hedging`).
    pub fn hedgeable(&self, hedging: bool) -> bool {
        hedging && self.idempotent && self.buffered && !self.upgrade
    }
}

/// How an attempt ended without a response header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptEnd {
    /// No connection: nothing was sent.
    Connect,
    /// The connection broke before a response header.
    Reset,
    /// The target answered something that is not HTTP.
    Garbage,
    /// No response header within the attempt's time (the per-try timeout).
    Timeout,
    /// The target stopped taking the request's bytes.
    SendStall,
    /// The request's own deadline passed.
    Deadline,
    /// The client's body broke.
    Client,
}

impl AttemptEnd {
    /// The metric label of a retry after this end.
    pub fn name(self) -> &'static str {
        match self {
            AttemptEnd::Connect => "connect",
            AttemptEnd::Reset => "reset",
            AttemptEnd::Garbage => "garbage",
            AttemptEnd::Timeout => "timeout",
            AttemptEnd::SendStall => "send",
            AttemptEnd::Deadline => "request",
            AttemptEnd::Client => "client",
        }
    }
}

/// What asks for another attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// An attempt ended without a response header.
    Failed(AttemptEnd),
    /// The target of an attempt in flight left service.
    TargetLeft,
    /// The hedge delay passed with `in_flight` attempts still waiting.
    HedgeDue {
        /// Attempts in flight.
        in_flight: usize,
    },
}

/// Where the request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Extra attempts made so far (retries and moves; hedges are not counted).
    pub retries: u32,
    /// The pool's limit on extra attempts.
    pub max_retries: u32,
    /// Whether the request's overall time (response header or deadline) is not used up.
    pub time_left: bool,
    /// Whether the pool hedges.
    pub hedging: bool,
}

/// Why a request may not go again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The body was streamed: it cannot be sent again.
    Streamed,
    /// A target may have acted on it, and it is not idempotent (nor marked retriable).
    NotReplayable,
    /// The request's overall time is used up.
    NoTimeLeft,
    /// The retry limit is reached.
    Limit,
    /// The target answered garbage: broken, and it may have acted on the request.
    Garbage,
    /// The failure was the client's, or the request's deadline: not the target's doing.
    NotTheTarget,
    /// The request may not be hedged (not idempotent, streamed, an upgrade, hedging off),
    /// or an attempt besides the first is already in flight.
    NoHedge,
}

/// The answer of [`decide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Another attempt may go, if the budget allows; the reason is its metric label
    /// (`connect`, `reset`, `timeout`, `send`, `ejected`, `hedge`).
    Go(&'static str),
    /// No other attempt, and why.
    No(Refusal),
}

/// Whether `req` may go to another target after `trigger`, given `progress`: the rules
/// of the module doc.
pub fn decide(req: &Replay, trigger: Trigger, progress: &Progress) -> Retry {
    use AttemptEnd::*;
    let reason = match trigger {
        Trigger::HedgeDue { in_flight } if !req.hedgeable(progress.hedging) || in_flight != 1 => {
            return Retry::No(Refusal::NoHedge);
        }
        // A hedge is bounded by the budget and by the one-in-flight rule, not by the
        // retry limit: the two copies race, and the loser is left to finish.
        Trigger::HedgeDue { .. } => return Retry::Go("hedge"),
        _ if !req.buffered => return Retry::No(Refusal::Streamed),
        Trigger::Failed(Garbage) => return Retry::No(Refusal::Garbage),
        Trigger::Failed(Client | Deadline) => return Retry::No(Refusal::NotTheTarget),
        Trigger::Failed(Connect) => Connect.name(),
        _ if !req.replayable() => return Retry::No(Refusal::NotReplayable),
        Trigger::Failed(Timeout | SendStall) if !progress.time_left => {
            return Retry::No(Refusal::NoTimeLeft);
        }
        Trigger::Failed(end) => end.name(),
        Trigger::TargetLeft => "ejected",
    };
    if progress.retries >= progress.max_retries {
        return Retry::No(Refusal::Limit);
    }
    Retry::Go(reason)
}

/// The shortest per-try timeout [`default_per_try`] derives: 500 ms. A try cut shorter
/// would also cut an ordinary slow answer (a p99 of a few hundred milliseconds) and send
/// it again, doubling the load of exactly the requests that are already expensive.
pub const MIN_DEFAULT_PER_TRY: Duration = Duration::from_millis(500);

/// The time one attempt has for its response header when the balancer's configuration
/// sets none (`timeouts.per_try` absent): the client's wait (`response_header`) shared
/// among every try the pool may make, `response_header / (max_retries + 1)`, at least
/// [`MIN_DEFAULT_PER_TRY`] and at most `response_header` (so without retries, an attempt
/// has all of it). A frozen target (it accepts, never answers) then costs a request one
/// try and the next target still has time to answer: with `response_header = "2s"` and
/// 2 retries, a try has 666 ms. The trade-off: an endpoint that normally answers in more
/// than that share is cut and sent again; such a pool sets its per-try time explicitly
/// (the retry throttle, [`RetryThrottle`](crate::throttle::RetryThrottle), keeps a fleet
/// that is slow everywhere from being sent every request three times).
pub fn default_per_try(response_header: Duration, max_retries: u32) -> Duration {
    if max_retries == 0 {
        return response_header;
    }
    // Whole milliseconds: the figure an operator reads in logs and headers.
    let share = response_header.as_millis() / (u128::from(max_retries) + 1);
    Duration::from_millis(u64::try_from(share).unwrap_or(u64::MAX))
        .max(MIN_DEFAULT_PER_TRY)
        .min(response_header)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GET: Replay = Replay {
        buffered: true,
        idempotent: true,
        all_methods: false,
        upgrade: false,
    };
    const POST: Replay = Replay {
        idempotent: false,
        ..GET
    };
    const FRESH: Progress = Progress {
        retries: 0,
        max_retries: 2,
        time_left: true,
        hedging: true,
    };

    #[test]
    fn the_default_per_try_shares_the_header_wait_among_the_tries() {
        let s = Duration::from_secs;
        assert_eq!(default_per_try(s(2), 2), Duration::from_millis(666));
        assert_eq!(default_per_try(s(10), 1), s(5));
        assert_eq!(
            default_per_try(s(10), 0),
            s(10),
            "no retries: the whole wait"
        );
        assert_eq!(default_per_try(s(1), 4), MIN_DEFAULT_PER_TRY, "floored");
        let short = Duration::from_millis(300);
        assert_eq!(
            default_per_try(short, 2),
            short,
            "never past response_header"
        );
        assert_eq!(default_per_try(s(3), u32::MAX), MIN_DEFAULT_PER_TRY);
    }

    #[test]
    fn the_rule_table() {
        use AttemptEnd::*;
        let failed = |req: Replay, end| decide(&req, Trigger::Failed(end), &FRESH);
        assert_eq!(failed(POST, Connect), Retry::Go("connect"));
        assert_eq!(failed(POST, Reset), Retry::No(Refusal::NotReplayable));
        assert_eq!(failed(GET, Reset), Retry::Go("reset"));
        let post_all = Replay {
            all_methods: true,
            ..POST
        };
        assert_eq!(failed(post_all, Reset), Retry::Go("reset"));
        assert_eq!(failed(GET, Timeout), Retry::Go("timeout"));
        assert_eq!(failed(GET, SendStall), Retry::Go("send"));
        assert_eq!(failed(GET, Garbage), Retry::No(Refusal::Garbage));
        assert_eq!(failed(GET, Client), Retry::No(Refusal::NotTheTarget));
        assert_eq!(failed(GET, Deadline), Retry::No(Refusal::NotTheTarget));
        let late = Progress {
            time_left: false,
            ..FRESH
        };
        assert_eq!(
            decide(&GET, Trigger::Failed(Timeout), &late),
            Retry::No(Refusal::NoTimeLeft)
        );
        assert_eq!(
            decide(&GET, Trigger::Failed(Reset), &late),
            Retry::Go("reset"),
            "a reset is answered at once: the time left does not matter"
        );
        let streamed = Replay {
            buffered: false,
            ..GET
        };
        assert_eq!(failed(streamed, Connect), Retry::No(Refusal::Streamed));
        assert_eq!(
            decide(&GET, Trigger::TargetLeft, &FRESH),
            Retry::Go("ejected")
        );
        assert_eq!(
            decide(&POST, Trigger::TargetLeft, &FRESH),
            Retry::No(Refusal::NotReplayable)
        );
        let hedge = |req: &Replay, in_flight| decide(req, Trigger::HedgeDue { in_flight }, &FRESH);
        assert_eq!(hedge(&GET, 1), Retry::Go("hedge"));
        assert_eq!(hedge(&GET, 2), Retry::No(Refusal::NoHedge));
        assert_eq!(hedge(&POST, 1), Retry::No(Refusal::NoHedge));
        let upgrade = Replay {
            upgrade: true,
            ..GET
        };
        assert_eq!(hedge(&upgrade, 1), Retry::No(Refusal::NoHedge));
        let spent = Progress {
            retries: 2,
            ..FRESH
        };
        assert_eq!(
            decide(&GET, Trigger::Failed(Connect), &spent),
            Retry::No(Refusal::Limit)
        );
        assert_eq!(
            decide(&GET, Trigger::HedgeDue { in_flight: 1 }, &spent),
            Retry::Go("hedge"),
            "a hedge is bounded by the budget, not the retry limit"
        );
    }

    fn end() -> impl Strategy<Value = AttemptEnd> {
        use AttemptEnd::*;
        prop::sample::select(vec![
            Connect, Reset, Garbage, Timeout, SendStall, Deadline, Client,
        ])
    }

    fn trigger() -> impl Strategy<Value = Trigger> {
        prop_oneof![
            end().prop_map(Trigger::Failed),
            Just(Trigger::TargetLeft),
            (0usize..4).prop_map(|in_flight| Trigger::HedgeDue { in_flight }),
        ]
    }

    proptest! {
        /// The safety properties, whatever the request, trigger and progress: nothing
        /// past the limit; a streamed body never twice; a request a target may have
        /// acted on goes again only if replayable; garbage and the client's failures
        /// never; a hedge only of a hedgeable request with one attempt in flight.
        #[test]
        fn never_unsafe(
            buffered: bool, idempotent: bool, all_methods: bool, upgrade: bool,
            retries in 0u32..4, max_retries in 0u32..4, time_left: bool, hedging: bool,
            trigger in trigger(),
        ) {
            let req = Replay { buffered, idempotent, all_methods, upgrade };
            let progress = Progress { retries, max_retries, time_left, hedging };
            if let Retry::Go(reason) = decide(&req, trigger, &progress) {
                prop_assert!(buffered);
                if !matches!(trigger, Trigger::HedgeDue { .. }) {
                    prop_assert!(retries < max_retries);
                }
                match trigger {
                    Trigger::Failed(AttemptEnd::Connect) => prop_assert_eq!(reason, "connect"),
                    Trigger::Failed(e) => {
                        prop_assert!(req.replayable());
                        prop_assert!(!matches!(e, AttemptEnd::Garbage | AttemptEnd::Client | AttemptEnd::Deadline));
                        if matches!(e, AttemptEnd::Timeout | AttemptEnd::SendStall) {
                            prop_assert!(time_left);
                        }
                    }
                    Trigger::TargetLeft => prop_assert!(req.replayable()),
                    Trigger::HedgeDue { in_flight } => {
                        prop_assert!(req.hedgeable(hedging) && in_flight == 1);
                    }
                }
            }
        }
    }
}
