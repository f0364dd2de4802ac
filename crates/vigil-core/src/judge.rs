//! One judge of an HTTP health answer: status code (+ optional health+json body) -> verdict.
//!
//! The balancer's checker, the controller's prober, the library's `HttpGet` check and
//! `vigil check` all call [`judge`], so one answer gets one verdict everywhere (they used
//! to disagree: a 503 whose body said `pass` was a fail for two of them and a pass for
//! the other two).
//!
//! # Rules
//!
//! | HTTP status | body | verdict | why |
//! |---|---|---|---|
//! | 2xx | health+json `pass` / `warn` / `fail` | the body's status | the draft: pass and warn answer 2xx; a 200 saying `fail` is a fail (the body knows more) |
//! | 2xx | empty, `text/plain`, or no `Content-Type` | pass | a status-only endpoint (`/livez`, `/healthz`, a plain `200 OK`): the code is the answer |
//! | 2xx | anything else (HTML, JSON that is not health+json, a declared health+json that does not parse) | fail, *invalid* | a page, not a health answer: likely the wrong URL |
//! | 4xx, 5xx | health+json | fail (its failing checks named) | the draft allows any 4xx-5xx for fail (the Kubernetes API server answers 500); machines read the code, so a 503 whose body says `pass` is a fail too, and says so |
//! | 5xx | anything else | fail | a status-only endpoint failing |
//! | 4xx | anything else | fail, *invalid* | the request's fault (404 on a mistyped path, 401), not the target's health |
//! | 1xx, 3xx, other | anything | fail, *invalid* | not a health answer (a redirect to a login page is not health) |
//!
//! *Invalid* answers are fails that also say the endpoint is not a health endpoint as
//! configured; `vigil check` exits 3 for them (2 for an ordinary fail). Drivers that need
//! more (a balancer's configured `expected_statuses`) apply it before calling the judge.

use crate::guard::Observation;
use crate::report::HealthReport;
use crate::status::Status;

/// What [`judge`] decided about one answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Judgement {
    /// Pass, warn or fail.
    pub status: Status,
    /// The answer is not a health answer at all (see the rule table): a fail that also
    /// says the endpoint is misconfigured or foreign.
    pub invalid: bool,
    /// The health+json report, when the body was one.
    pub report: Option<HealthReport>,
    /// What was seen, for logs: `HTTP 503, health+json fail (failing: disk:free)`.
    pub detail: String,
}

impl Judgement {
    /// Whether the target is serving (pass or warn: degraded still serves).
    pub fn is_serving(&self) -> bool {
        self.status.is_serving()
    }

    /// The guard's observation of this answer: pass, the failing checks of its report,
    /// or a failure of the endpoint as a whole (a fail naming no failing check, e.g. a
    /// 503 whose body says `pass`).
    pub fn observation(&self, target: &str, zone: &str) -> Observation {
        if self.is_serving() {
            return Observation::pass(target, zone);
        }
        let checks: Vec<String> = self
            .report
            .as_ref()
            .map(|r| r.failing_checks().map(String::from).collect())
            .unwrap_or_default();
        if checks.is_empty() {
            Observation::endpoint_failure(target, zone)
        } else {
            Observation::failed_checks(target, zone, checks)
        }
    }
}

/// Judges an answer: its status code, its `Content-Type` (if any) and its body (may be
/// empty when the driver did not read it). See the module's rule table.
pub fn judge(code: u16, content_type: Option<&str>, body: &[u8]) -> Judgement {
    let mime = content_type
        .and_then(|c| c.split(';').next())
        .map(|m| m.trim().to_ascii_lowercase());
    let status_only = body.is_empty()
        || mime
            .as_deref()
            .is_none_or(|m| m.is_empty() || m == "text/plain");
    let parsed = (!body.is_empty()).then(|| HealthReport::parse(body));
    let parse_error = parsed
        .as_ref()
        .and_then(|p| p.as_ref().err().map(ToString::to_string));
    let report = parsed.and_then(Result::ok);
    let class = code / 100;
    let (status, invalid) = match (class, &report) {
        (2, Some(r)) => (r.status, false),
        (2, None) if status_only => (Status::Pass, false),
        (2, None) => (Status::Fail, true),
        (4 | 5, Some(_)) | (5, None) => (Status::Fail, false),
        _ => (Status::Fail, true),
    };
    let mut detail = format!("HTTP {code}");
    match &report {
        Some(r) => {
            detail.push_str(&format!(", health+json {}", r.status));
            let failing: Vec<&str> = r.failing_checks().collect();
            if !failing.is_empty() {
                detail.push_str(&format!(" (failing: {})", failing.join(", ")));
            } else if r.status == Status::Warn {
                let warn: Vec<&str> = r
                    .checks
                    .iter()
                    .filter(|(_, rs)| rs.iter().any(|x| x.status == Status::Warn))
                    .map(|(n, _)| n.as_str())
                    .collect();
                if !warn.is_empty() {
                    detail.push_str(&format!(" (warn: {})", warn.join(", ")));
                }
            }
            if status == Status::Fail && r.status != Status::Fail {
                detail.push_str(&format!(
                    ": HTTP {code} but the body says {}: counting fail",
                    r.status
                ));
            }
        }
        None if invalid && class == 2 => detail.push_str(&format!(
            ", body is not health+json ({}): {}",
            mime.as_deref().unwrap_or("no content type"),
            parse_error.as_deref().unwrap_or("empty")
        )),
        None if invalid => detail.push_str(", not a health answer"),
        None => {}
    }
    Judgement {
        status,
        invalid,
        report,
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASS: &[u8] = br#"{"status":"pass"}"#;
    const WARN: &[u8] = br#"{"status":"warn","checks":{"cache:hit":[{"status":"warn"}]}}"#;
    const FAIL: &[u8] = br#"{"status":"fail","checks":{"disk:free":[{"status":"fail"}]}}"#;
    const JSON: Option<&str> = Some("application/health+json");
    const TEXT: Option<&str> = Some("text/plain; charset=utf-8");

    /// (code, content type, body, verdict, invalid).
    type Case = (u16, Option<&'static str>, &'static [u8], Status, bool);

    /// Each row of the module's rule table.
    #[test]
    fn the_rule_table() {
        let cases: &[Case] = &[
            (200, JSON, PASS, Status::Pass, false),
            (200, JSON, WARN, Status::Warn, false),
            (200, JSON, FAIL, Status::Fail, false),
            (200, TEXT, b"ok", Status::Pass, false),
            (204, None, b"", Status::Pass, false),
            (200, JSON, b"<html>", Status::Fail, true),
            (200, Some("text/html"), b"<html>", Status::Fail, true),
            (
                200,
                Some("application/json"),
                br#"{"healthy":true}"#,
                Status::Fail,
                true,
            ),
            (404, TEXT, b"not found", Status::Fail, true),
            (503, JSON, FAIL, Status::Fail, false),
            (503, JSON, PASS, Status::Fail, false),
            (500, JSON, FAIL, Status::Fail, false),
            (500, TEXT, b"down", Status::Fail, false),
            (401, None, b"", Status::Fail, true),
            (404, JSON, FAIL, Status::Fail, false),
            (301, None, b"", Status::Fail, true),
            (302, JSON, PASS, Status::Fail, true),
        ];
        for &(code, ct, body, status, invalid) in cases {
            let j = judge(code, ct, body);
            assert_eq!(
                (j.status, j.invalid),
                (status, invalid),
                "HTTP {code} {ct:?} {:?}: {}",
                String::from_utf8_lossy(body),
                j.detail
            );
        }
    }

    #[test]
    fn a_503_saying_pass_is_a_fail_that_says_so_and_observes_as_an_endpoint_failure() {
        let j = judge(503, JSON, PASS);
        assert_eq!(
            j.detail,
            "HTTP 503, health+json pass: HTTP 503 but the body says pass: counting fail"
        );
        let o = j.observation("t", "a");
        assert!(o.endpoint_failed && !o.is_ok());
        let j = judge(500, JSON, FAIL);
        assert_eq!(j.detail, "HTTP 500, health+json fail (failing: disk:free)");
        assert_eq!(j.observation("t", "a").failing_checks, ["disk:free"]);
        assert!(judge(200, JSON, WARN).observation("t", "a").is_ok());
    }
}
