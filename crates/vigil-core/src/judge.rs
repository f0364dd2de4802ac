//! One judge of an HTTP health answer: status code (+ optional health+json body) -> verdict.
//!
//! The balancer's checker, the controller's prober, the library's `HttpGet` check and
//! `vigil check` all call [`judge`], so one answer gets one verdict everywhere (they used
//! to disagree: a 503 whose body said `pass` was a fail for two of them and a pass for
//! the other two).
//!
//! # What counts as an answer: [`Answers`]
//!
//! Most HTTP servers have no health endpoint: an nginx, a static site, an application
//! without `/health` answers `200` on `/` and `404` on anything else. With
//! [`Answers::PlainStatus`] (the controller's default: `probe.answers`) such a server is
//! judged by its status code like a load balancer would (HAProxy's `httpchk`): 2xx-3xx
//! pass, anything else fails, and a health+json body, when there is one, still decides.
//! With [`Answers::HealthJson`] (`probe.answers = "health+json"`, the balancer's
//! `health_json = true`, the library's `HttpGet::health_json`, `vigil check`) an answer
//! that is not a health answer (a page, a 404 without a report, a redirect) is a fail
//! that is also *invalid*: the endpoint is not a health endpoint as configured.
//!
//! # Rules
//!
//! | HTTP status | body | `health+json` | `plain-status` | why |
//! |---|---|---|---|---|
//! | 2xx | health+json `pass` / `warn` / `fail` | the body's status | the body's status | the draft: pass and warn answer 2xx; a 200 saying `fail` is a fail (the body knows more) |
//! | 2xx | empty, `text/plain`, or no `Content-Type` | pass | pass | a status-only endpoint (`/livez`, `/healthz`, a plain `200 OK`): the code is the answer |
//! | 2xx | declared `application/health+json` that does not parse | fail, *invalid* | fail, *invalid* | a broken health endpoint says so, in either mode |
//! | 2xx | anything else (HTML, JSON that is not health+json) | fail, *invalid* | pass | a page: with `health+json` likely the wrong URL; with `plain-status` a server that answers |
//! | 3xx | health+json | fail, *invalid* | the body's status | a redirect is no health answer unless plain status is enough |
//! | 3xx | anything else | fail, *invalid* | pass | HAProxy's `httpchk` passes 2xx-3xx; redirects are not followed |
//! | 4xx, 5xx | health+json | fail (its failing checks named) | fail (its failing checks named) | the draft allows any 4xx-5xx for fail (the Kubernetes API server answers 500); machines read the code, so a 503 whose body says `pass` is a fail too, and says so |
//! | 5xx | anything else | fail | fail | a status-only endpoint failing |
//! | 4xx | anything else | fail, *invalid* | fail | the request's fault (404 on a mistyped path, 401), not the target's health: invalid when a health answer was demanded |
//! | 1xx, other | anything | fail, *invalid* | fail, *invalid* | not an answer |
//!
//! *Invalid* answers are fails that also say the endpoint is not a health endpoint as
//! configured; `vigil check` exits 3 for them (2 for an ordinary fail). Drivers that need
//! more (a balancer's configured `expected_statuses`) apply it before calling the judge.

use crate::guard::Observation;
use crate::report::{HEALTH_JSON, HealthReport};
use crate::status::Status;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Which answers count as health answers (see the module's rule table).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Answers {
    /// Any HTTP answer: a health+json body decides as always; any other answer is judged
    /// by its status code, 2xx-3xx pass and anything else fails, so an ordinary web
    /// server can be watched as it is. The default: a fleet of plain servers must not
    /// look like a fleet-wide failure.
    #[default]
    #[serde(rename = "plain-status")]
    PlainStatus,
    /// Only health answers: a page, a redirect or a 4xx without a health+json report
    /// fails as *invalid* (not a health endpoint as configured).
    #[serde(rename = "health+json")]
    HealthJson,
}

impl fmt::Display for Answers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Answers::PlainStatus => "plain-status",
            Answers::HealthJson => "health+json",
        })
    }
}

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
/// empty when the driver did not read it), by the rules of `answers`. See the module's
/// rule table.
pub fn judge(answers: Answers, code: u16, content_type: Option<&str>, body: &[u8]) -> Judgement {
    let mime = content_type
        .and_then(|c| c.split(';').next())
        .map(|m| m.trim().to_ascii_lowercase());
    let status_only = body.is_empty()
        || mime
            .as_deref()
            .is_none_or(|m| m.is_empty() || m == "text/plain");
    let declared = mime.as_deref() == Some(HEALTH_JSON);
    let parsed = (!body.is_empty()).then(|| HealthReport::parse(body));
    let parse_error = parsed
        .as_ref()
        .and_then(|p| p.as_ref().err().map(ToString::to_string));
    let report = parsed.and_then(Result::ok);
    let class = code / 100;
    // An answer judged by its code alone, though it is not a status-only endpoint's.
    let plain = answers == Answers::PlainStatus && report.is_none() && !declared;
    let (status, invalid) = match (class, &report) {
        (2, Some(r)) => (r.status, false),
        (3, Some(r)) if answers == Answers::PlainStatus => (r.status, false),
        (2, None) if status_only => (Status::Pass, false),
        (2 | 3, None) if plain => (Status::Pass, false),
        (4 | 5, Some(_)) | (5, None) => (Status::Fail, false),
        (4, None) if plain => (Status::Fail, false),
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
        None if plain && class == 4 => detail.push_str(if code == 404 {
            ", not a health answer: a plain 4xx fails (is the path right?)"
        } else {
            ", not a health answer: a plain 4xx fails"
        }),
        None if plain && class == 3 => {
            detail.push_str(", a redirect (not followed): judged by its status");
        }
        None if plain && class == 2 && !status_only => detail.push_str(&format!(
            ", not health+json ({}): judged by its status",
            mime.as_deref().unwrap_or("no content type")
        )),
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

    /// A verdict and whether it is invalid.
    type Verdict = (Status, bool);
    const PASS_: Verdict = (Status::Pass, false);
    const WARN_: Verdict = (Status::Warn, false);
    const FAIL_: Verdict = (Status::Fail, false);
    const INVALID: Verdict = (Status::Fail, true);

    /// (code, content type, body, with `health+json`, with `plain-status`).
    type Case = (u16, Option<&'static str>, &'static [u8], Verdict, Verdict);

    /// Each row of the module's rule table, in both columns.
    #[test]
    fn the_rule_table() {
        let html = Some("text/html");
        let cases: &[Case] = &[
            (200, JSON, PASS, PASS_, PASS_),
            (200, JSON, WARN, WARN_, WARN_),
            (200, JSON, FAIL, FAIL_, FAIL_),
            (200, Some("application/json"), PASS, PASS_, PASS_),
            (200, TEXT, b"ok", PASS_, PASS_),
            (204, None, b"", PASS_, PASS_),
            (200, JSON, b"", PASS_, PASS_),
            (200, JSON, b"<html>", INVALID, INVALID),
            (200, html, b"<html>", INVALID, PASS_),
            (200, None, b"<html>", PASS_, PASS_),
            (
                200,
                Some("application/json"),
                br#"{"healthy":true}"#,
                INVALID,
                PASS_,
            ),
            (301, None, b"", INVALID, PASS_),
            (302, html, b"<a href=/login>", INVALID, PASS_),
            (302, JSON, PASS, INVALID, PASS_),
            (302, JSON, FAIL, INVALID, FAIL_),
            (404, TEXT, b"not found", INVALID, FAIL_),
            (404, html, b"<h1>Not Found</h1>", INVALID, FAIL_),
            (401, None, b"", INVALID, FAIL_),
            (404, JSON, FAIL, FAIL_, FAIL_),
            (404, JSON, b"{", INVALID, INVALID),
            (503, JSON, FAIL, FAIL_, FAIL_),
            (503, JSON, PASS, FAIL_, FAIL_),
            (500, JSON, FAIL, FAIL_, FAIL_),
            (500, TEXT, b"down", FAIL_, FAIL_),
            (502, html, b"<h1>Bad Gateway</h1>", FAIL_, FAIL_),
            (100, None, b"", INVALID, INVALID),
            (600, None, b"", INVALID, INVALID),
        ];
        for &(code, ct, body, strict, plain) in cases {
            for (answers, want) in [(Answers::HealthJson, strict), (Answers::PlainStatus, plain)] {
                let j = judge(answers, code, ct, body);
                assert_eq!(
                    (j.status, j.invalid),
                    want,
                    "{answers}: HTTP {code} {ct:?} {:?}: {}",
                    String::from_utf8_lossy(body),
                    j.detail
                );
            }
        }
    }

    #[test]
    fn plain_answers_say_how_they_were_judged() {
        let plain = |code, ct, body: &[u8]| judge(Answers::PlainStatus, code, ct, body).detail;
        assert_eq!(
            plain(404, Some("text/html"), b"<h1>Not Found</h1>"),
            "HTTP 404, not a health answer: a plain 4xx fails (is the path right?)"
        );
        assert_eq!(
            plain(403, None, b""),
            "HTTP 403, not a health answer: a plain 4xx fails"
        );
        assert_eq!(
            plain(200, Some("text/html; charset=utf-8"), b"<html>"),
            "HTTP 200, not health+json (text/html): judged by its status"
        );
        assert_eq!(
            plain(301, None, b""),
            "HTTP 301, a redirect (not followed): judged by its status"
        );
        assert_eq!(plain(200, TEXT, b"ok"), "HTTP 200");
        assert_eq!(plain(503, TEXT, b"down"), "HTTP 503");
        assert_eq!(
            judge(Answers::HealthJson, 404, TEXT, b"not found").detail,
            "HTTP 404, not a health answer"
        );
    }

    #[test]
    fn answers_are_spelled_in_configs_as_in_the_docs() {
        #[derive(serde::Deserialize)]
        struct C {
            answers: Answers,
        }
        let read = |t: &str| toml::from_str::<C>(t).map(|c| c.answers);
        assert_eq!(
            read(r#"answers = "plain-status""#).unwrap(),
            Answers::PlainStatus
        );
        assert_eq!(
            read(r#"answers = "health+json""#).unwrap(),
            Answers::HealthJson
        );
        assert!(read(r#"answers = "json""#).is_err());
        assert_eq!(Answers::default(), Answers::PlainStatus);
        assert_eq!(Answers::HealthJson.to_string(), "health+json");
    }

    #[test]
    fn a_503_saying_pass_is_a_fail_that_says_so_and_observes_as_an_endpoint_failure() {
        let j = judge(Answers::HealthJson, 503, JSON, PASS);
        assert_eq!(
            j.detail,
            "HTTP 503, health+json pass: HTTP 503 but the body says pass: counting fail"
        );
        let o = j.observation("t", "a");
        assert!(o.endpoint_failed && !o.is_ok());
        let j = judge(Answers::PlainStatus, 500, JSON, FAIL);
        assert_eq!(j.detail, "HTTP 500, health+json fail (failing: disk:free)");
        assert_eq!(j.observation("t", "a").failing_checks, ["disk:free"]);
        assert!(
            judge(Answers::PlainStatus, 200, JSON, WARN)
                .observation("t", "a")
                .is_ok()
        );
    }
}
