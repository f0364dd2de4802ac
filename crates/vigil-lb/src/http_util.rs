//! HTTP helpers shared by both sides of the proxy: which fields are hop-by-hop, what
//! `Connection` names, which methods are idempotent, the `Via` value, why an attempt failed
//! ([`AttemptFailure`]) and an error displayed with its sources ([`ErrorChain`]).
//!
//! Floor 7, shared (floors: the crate doc): imports no other module of this crate.

use vigil_core::outlier::RequestOutcome;
use vigil_core::retry::AttemptEnd;

/// Why an attempt failed, and what that allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptFailure {
    /// No connection: nothing was sent; any request may be retried.
    Connect,
    /// The connection broke before a response header: only idempotent requests may be
    /// retried (the target may have acted on it).
    Reset,
    /// The target answered something that is not HTTP: 502, no retry (the target is
    /// broken, and the request may have been acted on).
    Garbage,
    /// No response header within the attempt's time (`timeouts.per_try`, bounded by
    /// what is left of `timeouts.response_header`): retried like a reset while the
    /// overall time allows, else 504.
    Timeout,
    /// The target took none of the request for `timeouts.send` (it stopped reading: a
    /// frozen target, or one refusing an upload without answering): 504, held against
    /// the target as a timeout, retried like [`AttemptFailure::Timeout`].
    SendStall,
    /// The request's overall deadline (`timeouts.request`) passed during a streamed
    /// upload: 504, held against no one (the client may be the slow one), not retried.
    Deadline,
    /// The client's streamed body broke (it stalled, closed, or sent a malformed chunk):
    /// this status (408 or 400) to the client, and nothing held against the target.
    Client(u16),
}

impl AttemptFailure {
    /// What outlier detection hears of this failure: nothing when it is the client's.
    pub(crate) fn outcome(self) -> Option<RequestOutcome> {
        match self {
            AttemptFailure::Connect => Some(RequestOutcome::ConnectFailure),
            AttemptFailure::Reset | AttemptFailure::Garbage => Some(RequestOutcome::Reset),
            AttemptFailure::Timeout | AttemptFailure::SendStall => Some(RequestOutcome::Timeout),
            AttemptFailure::Client(_) | AttemptFailure::Deadline => None,
        }
    }

    /// The status the client gets when this ends the request.
    pub(crate) fn status(self) -> u16 {
        match self {
            AttemptFailure::Timeout | AttemptFailure::SendStall | AttemptFailure::Deadline => 504,
            AttemptFailure::Client(code) => code,
            _ => 502,
        }
    }

    /// The end of the attempt as the retry rules see it (`vigil_core::retry`).
    pub(crate) fn end(self) -> AttemptEnd {
        match self {
            AttemptFailure::Connect => AttemptEnd::Connect,
            AttemptFailure::Reset => AttemptEnd::Reset,
            AttemptFailure::Garbage => AttemptEnd::Garbage,
            AttemptFailure::Timeout => AttemptEnd::Timeout,
            AttemptFailure::SendStall => AttemptEnd::SendStall,
            AttemptFailure::Deadline => AttemptEnd::Deadline,
            AttemptFailure::Client(_) => AttemptEnd::Client,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        self.end().name()
    }
}

/// Whether a request with this method may be sent twice (RFC 9110 9.2.2).
pub fn is_idempotent(method: &str) -> bool {
    matches!(
        method,
        "GET" | "HEAD" | "OPTIONS" | "TRACE" | "PUT" | "DELETE"
    )
}

/// The header names a `Connection` field value lists, to be removed with it: not the
/// usual `keep-alive` and `close` tokens, and never `Host`, `Content-Length` or
/// `Transfer-Encoding` (a client or target naming those would take away the host the
/// request was routed by, or the framing the message is read by).
pub(crate) fn connection_options(value: &[u8]) -> impl Iterator<Item = &[u8]> + '_ {
    const KEPT: [&[u8]; 5] = [
        b"keep-alive",
        b"close",
        b"host",
        b"content-length",
        b"transfer-encoding",
    ];
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|n| !n.is_empty() && !KEPT.iter().any(|k| k.eq_ignore_ascii_case(n)))
}

/// Fields that describe one connection (RFC 9110 7.6.1 and the usual non-standard
/// ones) and are never forwarded; `Connection` first.
const HOP_BY_HOP: [&[u8]; 9] = [
    b"connection",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
    b"proxy-authorization",
    b"proxy-authenticate",
    b"keep-alive",
    b"proxy-connection",
];

/// The index of `Upgrade` in [`HOP_BY_HOP`].
pub(crate) const UPGRADE: usize = 4;

/// The index of the field name `name` (any case) in [`HOP_BY_HOP`]; 0 is `Connection`.
/// Lengths are compared first, so most names cost a few integer comparisons.
pub(crate) fn hop_by_hop(name: &[u8]) -> Option<usize> {
    HOP_BY_HOP
        .iter()
        .position(|h| h.len() == name.len() && h.eq_ignore_ascii_case(name))
}

/// `Via` as vigil adds it.
pub const VIA: &str = "1.1 vigil";

/// What went wrong, as the client's message and the log say it.
pub(crate) fn describe(f: AttemptFailure) -> &'static str {
    match f {
        AttemptFailure::Connect => "connection failed",
        AttemptFailure::Reset => "connection reset before the response",
        AttemptFailure::Garbage => "invalid HTTP response",
        AttemptFailure::Timeout => "no response header in time (timeouts.per_try, response_header)",
        AttemptFailure::SendStall => "the target took none of the request within timeouts.send",
        AttemptFailure::Deadline => "the request's deadline (timeouts.request) passed",
        AttemptFailure::Client(_) => "the request body did not arrive whole from the client",
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
    fn hop_by_hop_names_match_in_any_case_and_only_whole() {
        for (i, n) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_by_hop(n), Some(i));
            assert_eq!(hop_by_hop(&n.to_ascii_uppercase()), Some(i));
        }
        for other in [
            &b"host"[..],
            b"tee",
            b"connections",
            b"x-forwarded-for",
            b"",
        ] {
            assert_eq!(
                hop_by_hop(other),
                None,
                "{}",
                String::from_utf8_lossy(other)
            );
        }
    }

    #[test]
    fn connection_options_leave_out_keep_alive_close_host_and_framing() {
        let named: Vec<&[u8]> = connection_options(
            b" Keep-Alive, x-secret ,close,,Upgrade, Host, content-length,Transfer-Encoding",
        )
        .collect();
        assert_eq!(named, vec![&b"x-secret"[..], b"Upgrade"]);
    }

    #[test]
    fn idempotent_methods_per_rfc_9110() {
        assert!(is_idempotent("GET") && is_idempotent("PUT") && is_idempotent("DELETE"));
        assert!(!is_idempotent("POST") && !is_idempotent("PATCH") && !is_idempotent("get"));
    }
}
