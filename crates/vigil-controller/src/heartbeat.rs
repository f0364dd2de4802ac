//! Heartbeat signatures: only a target's own key can move its health.
//!
//! A heartbeat decides as much as a probe: a failing report gets a worker replaced, a
//! passing one keeps a broken worker in service. So every heartbeat is signed, and one
//! that is not signed right changes nothing (it is counted in
//! `vigil_controller_heartbeats_total{result}` and answered 401).
//!
//! ## Design
//!
//! - **A key per target, derived:** target `id` signs with
//!   `hex(HMAC-SHA256(secret, "heartbeat:" + id))` (the ASCII hex string is the key),
//!   where `secret` is `heartbeat.secret` (or `VIGIL_HEARTBEAT_SECRET`). One secret to
//!   keep in the controller's config, yet a worker holds only its own key: a worker
//!   taken over cannot speak for another, and no secret has to sit in a discovery file
//!   (often generated and world-readable). `vigil controller heartbeat-key <id>`
//!   prints a target's key.
//! - **HMAC over timestamp and body, not a bearer secret:** the API is plain HTTP (no
//!   TLS stack by design), so a secret sent with each request would be read off the
//!   wire once and usable forever. A signature is only good for its own body and time.
//! - **Replay:** the signed `X-Vigil-Timestamp` (UNIX milliseconds) must be within
//!   `heartbeat.max_skew` of the controller's clock, and greater than the last
//!   accepted timestamp of that target. A heartbeat that was delivered can never be
//!   replayed; one captured and never delivered is good for `max_skew` at most, and
//!   only says what its worker said.
//!
//! The request: `POST /api/heartbeat` with the JSON body, `X-Vigil-Timestamp: <ms>`
//! and `X-Vigil-Signature: sha256=<hex HMAC-SHA256(key, "<ms>." + body)>`, the
//! webhook's signature format with the timestamp in front, as Stripe and Slack sign
//! their webhooks. The signature itself is [`vigil_core::signature`], the very code the
//! library's sender signs with.

use std::time::Duration;
use vigil_core::signature;

/// A queue worker's counters, as the library's heartbeat sends them under `"worker"`
/// (`vigil::worker::WorkerReport`): totals since the worker started. Fields the
/// controller does not use are accepted and ignored, so a newer library can report
/// more.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(default)]
pub struct WorkerCounters {
    /// Messages handled successfully since start.
    pub processed: u64,
    /// Messages that failed since start.
    pub failed: u64,
    /// Whether the worker pulls now (its local gate).
    pub pulling: Option<bool>,
    /// Its gate, in words.
    pub state: Option<String>,
}

impl WorkerCounters {
    /// The totals as the anomaly policy counts them.
    pub fn totals(&self) -> vigil_core::anomaly::Counts {
        vigil_core::anomaly::Counts::new(self.processed, self.failed)
    }

    /// What the engine keeps of a fresh heartbeat's counters: the totals, and the
    /// gate's state when it says the worker does not pull.
    pub fn seen(&self) -> WorkerSeen {
        WorkerSeen {
            totals: self.totals(),
            gate: self.pulling.map(|pulling| {
                (!pulling).then(|| self.state.clone().unwrap_or_else(|| "paused".into()))
            }),
        }
    }
}

/// A queue worker as a fresh heartbeat shows it to the engine.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkerSeen {
    /// Its totals since it started.
    pub totals: vigil_core::anomaly::Counts,
    /// Its gate, when it reports one (`pulling`): `Some(None)` pulling, `Some(Some(state))`
    /// paused, with its state in words.
    pub gate: Option<Option<String>>,
}

pub use vigil_core::signature::{SIGNATURE_HEADER, TIMESTAMP_HEADER};

/// Why a heartbeat was refused (the `result` label of the heartbeat counter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// No timestamp or no signature header.
    Unsigned,
    /// The signature does not match the body, the time and the target's key.
    BadSignature,
    /// The timestamp is outside the replay window.
    Stale,
    /// The timestamp is not after the last accepted one of that target.
    Replayed,
    /// Not a declared heartbeat target.
    UnknownTarget,
    /// The body is not a heartbeat, or its report is not health+json.
    Malformed,
    /// The body is larger than a heartbeat may be.
    TooLarge,
    /// No heartbeat secret is configured: nothing can be verified.
    NoSecret,
}

impl Rejection {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Rejection::Unsigned => "unsigned",
            Rejection::BadSignature => "bad_signature",
            Rejection::Stale => "stale",
            Rejection::Replayed => "replayed",
            Rejection::UnknownTarget => "unknown_target",
            Rejection::Malformed => "malformed",
            Rejection::TooLarge => "too_large",
            Rejection::NoSecret => "no_secret",
        }
    }
}

/// Target `id`'s signing key: `hex(HMAC-SHA256(secret, "heartbeat:" + id))`.
pub fn target_key(secret: &str, id: &str) -> String {
    signature::heartbeat_key(secret, id)
}

/// Checks a heartbeat of target `id` (its body already parsed to learn the id).
/// Returns its timestamp; the caller still checks it is newer than the last accepted.
pub fn verify(
    secret: Option<&str>,
    id: &str,
    timestamp: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    now_ms: i64,
    max_skew: Duration,
) -> Result<i64, Rejection> {
    let secret = secret.ok_or(Rejection::NoSecret)?;
    let (Some(timestamp), Some(given)) = (timestamp, signature) else {
        return Err(Rejection::Unsigned);
    };
    let ts: i64 = timestamp
        .trim()
        .parse()
        .map_err(|_| Rejection::BadSignature)?;
    // Constant time: no byte-by-byte guessing from timings.
    if !signature::verify_heartbeat(&target_key(secret, id), ts, body, given) {
        return Err(Rejection::BadSignature);
    }
    let skew = i64::try_from(max_skew.as_millis()).unwrap_or(i64::MAX);
    if now_ms.abs_diff(ts) > skew.unsigned_abs() {
        return Err(Rejection::Stale);
    }
    Ok(ts)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SKEW: Duration = Duration::from_secs(30);

    /// The library's sender signs (`vigil::heartbeat::sign`, which is this function),
    /// the controller verifies: one protocol. The bytes of a known signature, computed
    /// by both sides before they shared one implementation, are pinned in
    /// `vigil_core::signature`.
    #[test]
    fn a_heartbeat_signed_by_the_library_verifies_at_the_controller() {
        let key = target_key("s3cret", "w1");
        let body = br#"{"target":"w1","report":{"status":"pass"}}"#;
        let now = signature::timestamp_ms(std::time::SystemTime::now());
        let sig = vigil_core::signature::sign_heartbeat(&key, now, body);
        assert_eq!(
            verify(
                Some("s3cret"),
                "w1",
                Some(&now.to_string()),
                Some(&sig),
                body,
                now + 10,
                SKEW
            ),
            Ok(now)
        );
        assert_eq!(
            vigil_core::signature::sign_heartbeat(&key, 1_765_000_000_123, body),
            "sha256=7cf9ae094f34990c9fd40e8ba37eaee3312127e210119c556c0f8c259b50d313",
            "the pinned bytes"
        );
    }

    #[test]
    fn only_the_targets_own_key_over_this_body_and_time_verifies() {
        let key = target_key("s3cret", "w1");
        let body = br#"{"target":"w1"}"#;
        let sig = signature::sign_heartbeat(&key, 1_000_000, body);
        let ok = |id, ts: &str, sig: &str, body: &[u8]| {
            verify(
                Some("s3cret"),
                id,
                Some(ts),
                Some(sig),
                body,
                1_000_500,
                SKEW,
            )
        };
        assert_eq!(ok("w1", "1000000", &sig, body), Ok(1_000_000));
        assert_eq!(
            ok("w2", "1000000", &sig, body),
            Err(Rejection::BadSignature),
            "another target's key"
        );
        assert_eq!(
            ok("w1", "1000001", &sig, body),
            Err(Rejection::BadSignature),
            "the time is signed"
        );
        assert_eq!(
            ok("w1", "1000000", &sig, br#"{"target":"w1" }"#),
            Err(Rejection::BadSignature),
            "the body is signed"
        );
        let old = signature::sign_heartbeat(&key, 1_000_500 - 31_000, body);
        assert_eq!(
            ok("w1", &(1_000_500 - 31_000).to_string(), &old, body),
            Err(Rejection::Stale)
        );
        assert_eq!(
            verify(None, "w1", Some("1"), Some(&sig), body, 0, SKEW),
            Err(Rejection::NoSecret)
        );
        assert_eq!(
            verify(Some("s3cret"), "w1", None, Some(&sig), body, 0, SKEW),
            Err(Rejection::Unsigned)
        );
    }
}
