//! The signatures of what vigil pushes over plain HTTP: HMAC-SHA256, sent as
//! `X-Vigil-Signature: sha256=<hex>`. One implementation for the signer and the verifier
//! of each, so the two sides cannot drift apart.
//!
//! - **Webhook** ([`sign_body`]): the controller's actuator and `vigil deploy`'s hooks
//!   sign the JSON body with the webhook secret: `sha256=<hex HMAC-SHA256(secret, body)>`.
//! - **Heartbeat** ([`sign_heartbeat`], [`verify_heartbeat`]): a process pushing its
//!   health (the `vigil` library) signs `"<ms>." + body` with its target's key, and sends
//!   `<ms>` in `X-Vigil-Timestamp`: `sha256=<hex HMAC-SHA256(key, "<ms>." + body)>`, the
//!   webhook's format with the timestamp in front, as Stripe and Slack sign theirs. The
//!   controller verifies it and then judges the timestamp (replay window, newer than the
//!   last: `vigil_controller::heartbeat`). `<ms>` is UNIX milliseconds in decimal, an
//!   [`i64`] on both sides (the controller's wall clock type).
//! - **A key per target** ([`heartbeat_key`]): target `id` signs with
//!   `hex(HMAC-SHA256(secret, "heartbeat:" + id))`, the ASCII hex string being the key,
//!   so a worker holds only its own key and the controller only one secret.
//!
//! Verification is constant-time (hmac's `verify_slice`): no byte-by-byte guessing of a
//! signature from response timings.
//!
//! ```
//! use vigil_core::signature::{heartbeat_key, sign_heartbeat, verify_heartbeat};
//!
//! let key = heartbeat_key("s3cret", "worker-1");
//! let body = br#"{"target":"worker-1"}"#;
//! let sig = sign_heartbeat(&key, 1_765_000_000_000, body);
//! assert!(verify_heartbeat(&key, 1_765_000_000_000, body, &sig));
//! assert!(!verify_heartbeat(&key, 1_765_000_000_001, body, &sig), "the time is signed");
//! ```

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::time::{SystemTime, UNIX_EPOCH};

/// The header carrying a signature, `sha256=<hex>`.
pub const SIGNATURE_HEADER: &str = "X-Vigil-Signature";
/// The header carrying a heartbeat's signing time, UNIX milliseconds.
pub const TIMESTAMP_HEADER: &str = "X-Vigil-Timestamp";
/// What a signature's hex digest follows.
const PREFIX: &str = "sha256=";

fn mac(key: &[u8]) -> Hmac<Sha256> {
    Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any size")
}

fn formatted(mac: Hmac<Sha256>) -> String {
    format!("{PREFIX}{}", hex::encode(mac.finalize().into_bytes()))
}

/// `sha256=<hex HMAC-SHA256(secret, body)>`: a webhook's signature.
pub fn sign_body(secret: &[u8], body: &[u8]) -> String {
    let mut m = mac(secret);
    m.update(body);
    formatted(m)
}

/// Target `id`'s heartbeat key: `hex(HMAC-SHA256(secret, "heartbeat:" + id))`.
pub fn heartbeat_key(secret: &str, id: &str) -> String {
    let mut m = mac(secret.as_bytes());
    m.update(b"heartbeat:");
    m.update(id.as_bytes());
    hex::encode(m.finalize().into_bytes())
}

fn heartbeat_mac(key: &str, timestamp_ms: i64, body: &[u8]) -> Hmac<Sha256> {
    let mut m = mac(key.as_bytes());
    m.update(timestamp_ms.to_string().as_bytes());
    m.update(b".");
    m.update(body);
    m
}

/// `sha256=<hex HMAC-SHA256(key, "<timestamp_ms>." + body)>`: a heartbeat's signature.
pub fn sign_heartbeat(key: &str, timestamp_ms: i64, body: &[u8]) -> String {
    formatted(heartbeat_mac(key, timestamp_ms, body))
}

/// Whether `signature` (`sha256=<hex>`, surrounding blanks allowed) is `key`'s over
/// this time and body; compared in constant time.
pub fn verify_heartbeat(key: &str, timestamp_ms: i64, body: &[u8], signature: &str) -> bool {
    let Some(given) = signature
        .trim()
        .strip_prefix(PREFIX)
        .and_then(|h| hex::decode(h).ok())
    else {
        return false;
    };
    heartbeat_mac(key, timestamp_ms, body)
        .verify_slice(&given)
        .is_ok()
}

/// `time` as a heartbeat timestamp: UNIX milliseconds (0 before the epoch, saturated
/// far after it).
pub fn timestamp_ms(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_body_signature_is_rfc4231_hmac_sha256() {
        // RFC 4231 test case 2.
        assert_eq!(
            sign_body(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    /// The wire format, pinned: these bytes were computed by the library's sender and
    /// the controller's verifier before they became this one module (and agree with
    /// Python's `hmac`), so any change of the signed input (timestamp digits,
    /// separator, key derivation) shows here.
    #[test]
    fn a_known_heartbeat_signature_keeps_its_bytes() {
        let key = heartbeat_key("s3cret", "w1");
        assert_eq!(
            key,
            "bd96a43fa9047ca16a44562d290f4d0e6f18152710c35f58588a04fa3056ec4b"
        );
        let body = br#"{"target":"w1","report":{"status":"pass"}}"#;
        let sig = sign_heartbeat(&key, 1_765_000_000_123, body);
        assert_eq!(
            sig,
            "sha256=7cf9ae094f34990c9fd40e8ba37eaee3312127e210119c556c0f8c259b50d313"
        );
        assert!(verify_heartbeat(&key, 1_765_000_000_123, body, &sig));
        assert!(verify_heartbeat(
            &key,
            1_765_000_000_123,
            body,
            &format!(" {sig} ")
        ));
    }

    #[test]
    fn a_heartbeat_verifies_only_for_its_key_time_and_body() {
        let key = heartbeat_key("s3cret", "w1");
        let body = b"{}";
        let sig = sign_heartbeat(&key, 5, body);
        assert!(!verify_heartbeat(
            &heartbeat_key("s3cret", "w2"),
            5,
            body,
            &sig
        ));
        assert!(!verify_heartbeat(&key, 6, body, &sig));
        assert!(!verify_heartbeat(&key, 5, b"{ }", &sig));
        assert!(!verify_heartbeat(
            &key,
            5,
            body,
            sig.trim_start_matches(PREFIX)
        ));
        assert!(!verify_heartbeat(&key, 5, body, "sha256=zz"));
        assert!(!verify_heartbeat(&key, 5, body, &sig[..sig.len() - 2]));
    }

    #[test]
    fn timestamps_are_unix_milliseconds() {
        let t = UNIX_EPOCH + Duration::from_millis(1_765_000_000_123);
        assert_eq!(timestamp_ms(t), 1_765_000_000_123);
        assert_eq!(timestamp_ms(UNIX_EPOCH - Duration::from_secs(1)), 0);
    }
}
