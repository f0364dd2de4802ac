//! `vigil check URL`: probe a health endpoint once, print what it said, and exit with a
//! code a script or a Kubernetes exec probe can act on.
//!
//! Exit codes: 0 pass (and warn, unless `--strict`), 1 warn with `--strict`, 2 fail,
//! 3 unreachable or invalid response (the reason goes to stderr). Note that clap's own
//! usage errors also exit 2; a probe should be configured once and tested.
//!
//! How an answer is judged: by vigil-core's one judge ([`vigil_core::judge`](mod@vigil_core::judge), shared with
//! the balancer, the controller and the library's `HttpGet`; its doc has the rule table).
//! In short: 2xx takes the health+json body's status (a plain or empty body passes);
//! any 4xx-5xx with a health+json body, and any 5xx, is a fail (a 503 saying "pass" too,
//! with a note); anything else (a page that is not a health answer, a 404 without a
//! report, a redirect, not HTTP, a body over 64 KiB, no answer within `--timeout`) is
//! invalid or unreachable, exit 3.
//!
//! The probe is vigil-probe's client, the controller's (one GET, no redirects, no
//! proxy). `https://` URLs are verified against the system's roots and `--ca-file`;
//! a certificate that is not trusted is unreachable, exit 3, with the reason
//! (`certificate not trusted: UnknownIssuer`).
//!
//! With `--fleet URL --target ID` (an exec `livenessProbe` for Kubernetes), a failing
//! local verdict is put to the controller before it is reported: the controller answers
//! `restart` only when its guard would act on the target (failing on its own, within
//! the fleet's budget and cap), and the check then exits failing as before; otherwise
//! it answers `alive` with the guard's reason (a shared cause, a freeze, a spent
//! budget), and the check exits 0, saying why on stderr. A controller that does not
//! answer within `--fleet-timeout` (or answers nonsense) leaves the local verdict
//! standing: a dead controller never keeps a hung instance alive. A passing check never
//! asks. docs/controller.md, "Liveness restarts under the fleet's budget".

use clap::Args;
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use vigil_core::report::MAX_REPORT_BYTES;
use vigil_core::{HealthReport, Judgement, Status};
use vigil_probe::{CaFile, ErrorKind, ProbeError};

/// Default probe timeout: 2 s is the budget a Kubernetes exec probe or a script usually
/// allows, and far above a healthy endpoint's answer time (it reads a snapshot).
pub const DEFAULT_CHECK_TIMEOUT: &str = "2s";

/// Default bound on asking the controller (`--fleet-timeout`): 2 s, so that local check
/// and question together fit the 5 s `timeoutSeconds` the help's livenessProbe example
/// gives the probe; a controller that cannot answer a map lookup in 2 s is as good as
/// down, and the local verdict then stands.
pub const DEFAULT_FLEET_TIMEOUT: &str = "2s";

/// Exit code for an unreachable endpoint or an invalid answer.
const EXIT_INVALID: u8 = 3;

/// What `vigil check --help` adds after the options: the liveness probe.
const LIVENESS_HELP: &str = "\
Liveness under a fleet budget (--fleet):
  A failing local check asks the controller whether this instance may be restarted
  now. It says \"restart\" only when the instance fails on its own and the fleet's
  restart budget and cap allow it (controller: [actuator] kind = \"liveness\"); then
  the check exits failing. When the cause is shared, the fleet frozen or the budget
  spent it says \"alive\": the check exits 0 and says why on stderr. No answer within
  --fleet-timeout (2s): the local verdict stands, said on stderr. A pass never asks.

  Kubernetes (the controller probes the pod too; the target id is the pod's name,
  which is the pod's hostname; a shell reads it, since the kubelet expands only
  static env values in an exec probe's command):
    livenessProbe:
      exec:
        command: [\"sh\", \"-c\", \"exec vigil check http://127.0.0.1:8081/health
                  --fleet http://vigil-controller:9400 --target \\\"$HOSTNAME\\\"\"]
      periodSeconds: 10
      timeoutSeconds: 5
      failureThreshold: 3
  Several --fleet URLs (replicas) are asked in order until one that leads answers.";

/// Arguments of `vigil check`.
#[derive(Args, Debug)]
#[command(after_long_help = LIVENESS_HELP)]
pub struct CheckArgs {
    /// The health endpoint, e.g. http://127.0.0.1:8081/health or
    /// https://10.0.0.5:8443/health (http:// is assumed when no scheme is given).
    pub url: String,

    /// Trust the CA certificates of this PEM file for https:// (a private CA), besides
    /// the system's roots.
    #[arg(long, value_name = "PEM")]
    pub ca_file: Option<PathBuf>,

    /// Give up after this long (connect, request and body), e.g. 500ms, 2s.
    #[arg(long, default_value = DEFAULT_CHECK_TIMEOUT, value_parser = humantime::parse_duration)]
    pub timeout: Duration,

    /// Print the outcome as one JSON object on stdout instead of a summary.
    #[arg(long)]
    pub json: bool,

    /// Exit 1 on warn (degraded) instead of 0.
    #[arg(long)]
    pub strict: bool,

    /// The controller to ask before reporting a failure (a liveness probe under the
    /// fleet's restart budget), e.g. http://vigil-controller:9400; repeat for replicas.
    #[arg(long, value_name = "URL", requires = "target")]
    pub fleet: Vec<String>,

    /// This instance's target id at the controller (with --fleet).
    #[arg(long, value_name = "ID", requires = "fleet")]
    pub target: Option<String>,

    /// Give up asking the controller after this long; the local verdict then stands.
    #[arg(long, default_value = DEFAULT_FLEET_TIMEOUT, value_parser = humantime::parse_duration)]
    pub fleet_timeout: Duration,
}

/// What the controller said about a failing instance.
#[derive(Debug, PartialEq)]
enum FleetAnswer {
    /// Restart it: the guard allows it.
    Restart(String),
    /// Keep it: the guard's reason.
    Alive(String),
    /// No usable answer (why): the local verdict stands.
    NoAnswer(String),
}

/// What a probe found.
#[derive(Debug)]
struct Outcome {
    http_status: u16,
    latency: Duration,
    status: Status,
    /// The parsed report (None for a status-only text endpoint).
    report: Option<HealthReport>,
    /// Disagreement between the HTTP code and the body, worth a note.
    note: Option<String>,
}

/// Why a probe has no verdict.
#[derive(Debug)]
struct Invalid {
    reason: String,
    http_status: Option<u16>,
    latency: Duration,
}

/// Runs `vigil check`.
pub fn run(args: CheckArgs) -> ExitCode {
    let url = normalise(&args.url);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("vigil check: cannot start a runtime: {e}");
            return ExitCode::from(EXIT_INVALID);
        }
    };
    let ca = match args.ca_file.as_deref().map(CaFile::read).transpose() {
        Ok(ca) => ca,
        Err(e) => {
            eprintln!("vigil check: --ca-file {e}");
            return ExitCode::from(EXIT_INVALID);
        }
    };
    let result = rt.block_on(probe(&url, args.timeout, ca));
    let local = match &result {
        Ok(o) => exit_code(o.status, args.strict),
        Err(_) => EXIT_INVALID,
    };
    let fleet = match (&args.target, local) {
        (Some(target), 1..) if !args.fleet.is_empty() => {
            Some(rt.block_on(ask_fleet(&args.fleet, target, args.fleet_timeout)))
        }
        _ => None,
    };
    let code = match &fleet {
        Some(FleetAnswer::Alive(_)) => 0,
        _ => local,
    };
    match &result {
        Ok(o) => {
            if let Some(note) = &o.note {
                eprintln!("vigil check: {url}: {note}");
            }
            if args.json {
                let mut j = outcome_json(&url, o, code);
                if let Some(f) = &fleet {
                    j["fleet"] = fleet_json(f);
                }
                println!("{j}");
            } else {
                print!("{}", summary(&url, o));
            }
        }
        Err(e) => {
            eprintln!("vigil check: {url}: {}", e.reason);
            if args.json {
                let mut j = json!({
                    "url": url,
                    "status": "invalid",
                    "httpStatus": e.http_status,
                    "latencyMs": ms(e.latency),
                    "error": e.reason,
                    "exitCode": code,
                });
                if let Some(f) = &fleet {
                    j["fleet"] = fleet_json(f);
                }
                println!("{j}");
            }
        }
    }
    match &fleet {
        Some(FleetAnswer::Restart(why)) => {
            eprintln!("vigil check: the controller says restart (exit {local}): {why}");
        }
        Some(FleetAnswer::Alive(why)) => {
            eprintln!(
                "vigil check: failing locally (exit {local}), but the controller says alive (exit 0): {why}"
            );
        }
        Some(FleetAnswer::NoAnswer(why)) => {
            eprintln!(
                "vigil check: no answer from the controller ({why}): the local verdict stands (exit {local})"
            );
        }
        None => {}
    }
    ExitCode::from(code)
}

fn fleet_json(f: &FleetAnswer) -> serde_json::Value {
    match f {
        FleetAnswer::Restart(r) => json!({"verdict": "restart", "reason": r}),
        FleetAnswer::Alive(r) => json!({"verdict": "alive", "reason": r}),
        FleetAnswer::NoAnswer(r) => json!({"verdict": null, "error": r}),
    }
}

/// Asks the controllers at `fleet`, in order, whether `target` may be restarted now,
/// all within `timeout`: the first that leads answers (a replica that does not lead
/// answers 503 and the next is asked).
async fn ask_fleet(fleet: &[String], target: &str, timeout: Duration) -> FleetAnswer {
    let client = match reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .no_proxy()
        .build()
    {
        Ok(c) => c,
        Err(e) => return FleetAnswer::NoAnswer(format!("cannot build an HTTP client: {e}")),
    };
    let ask = async {
        let mut why = Vec::new();
        for base in fleet {
            match ask_one(&client, base, target, timeout).await {
                FleetAnswer::NoAnswer(w) => why.push(format!("{base}: {w}")),
                answer => return answer,
            }
        }
        FleetAnswer::NoAnswer(why.join("; "))
    };
    match tokio::time::timeout(timeout, ask).await {
        Ok(a) => a,
        Err(_) => FleetAnswer::NoAnswer(format!(
            "timed out after {}",
            humantime::format_duration(timeout)
        )),
    }
}

/// Asks one controller: `GET {base}/api/targets/{target}/liveness`.
async fn ask_one(
    client: &reqwest::Client,
    base: &str,
    target: &str,
    timeout: Duration,
) -> FleetAnswer {
    let mut url = match reqwest::Url::parse(&normalise(base)) {
        Ok(u) if u.scheme() == "http" => u,
        Ok(_) => return FleetAnswer::NoAnswer("only http:// URLs are supported".into()),
        Err(e) => return FleetAnswer::NoAnswer(format!("bad URL: {e}")),
    };
    match url.path_segments_mut() {
        Ok(mut p) => {
            p.pop_if_empty()
                .extend(["api", "targets", target, "liveness"]);
        }
        Err(()) => return FleetAnswer::NoAnswer("bad URL: cannot be a base".into()),
    }
    let resp = match client.get(url).send().await {
        Ok(r) => r,
        Err(e) => return FleetAnswer::NoAnswer(describe_asking(&e, timeout)),
    };
    let code = resp.status().as_u16();
    let body: serde_json::Value = match resp.json().await {
        Ok(b) => b,
        Err(e) => return FleetAnswer::NoAnswer(format!("HTTP {code}, not JSON: {e}")),
    };
    fleet_answer(code, &body)
}

/// Reads the controller's answer: only a 200 saying `restart` or `alive` counts.
fn fleet_answer(code: u16, body: &serde_json::Value) -> FleetAnswer {
    let reason = body["reason"].as_str().unwrap_or("").to_string();
    match (code, body["verdict"].as_str()) {
        (200, Some("restart")) => FleetAnswer::Restart(reason),
        (200, Some("alive")) => FleetAnswer::Alive(reason),
        _ => FleetAnswer::NoAnswer(format!(
            "HTTP {code}: {}",
            body["error"].as_str().unwrap_or("no verdict")
        )),
    }
}

fn exit_code(status: Status, strict: bool) -> u8 {
    match status {
        Status::Pass => 0,
        Status::Warn if strict => 1,
        Status::Warn => 0,
        Status::Fail => 2,
    }
}

fn normalise(url: &str) -> String {
    if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    }
}

async fn probe(url: &str, timeout: Duration, ca: Option<CaFile>) -> Result<Outcome, Invalid> {
    let start = Instant::now();
    let invalid = |reason: String, http_status: Option<u16>| Invalid {
        reason,
        http_status,
        latency: start.elapsed(),
    };
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(invalid(
            "only http:// and https:// URLs are supported".into(),
            None,
        ));
    }
    let uri: http::Uri = url
        .parse()
        .map_err(|e| invalid(format!("bad URL: {e}"), None))?;
    // One probe: no connection to keep. No proxy either: a health probe goes straight
    // to the instance, never through an HTTP_PROXY.
    let client = vigil_probe::Client::new(vigil_probe::Options {
        reuse_connection: false,
        ca,
        ..vigil_probe::Options::default()
    });
    let limits = vigil_probe::Limits {
        timeout,
        max_body: MAX_REPORT_BYTES,
        // A health endpoint is what `vigil check` checks: anything else is invalid
        // (exit 3), whatever a controller configured for plain status would say.
        answers: vigil_core::Answers::HealthJson,
    };
    let seen = client
        .get(&uri, limits)
        .await
        .map_err(|e| invalid(describe(&e), None))?;
    let latency = start.elapsed();
    let code = seen.status;
    verdict(seen.judgement).map_or_else(
        |reason| {
            Err(Invalid {
                reason,
                http_status: Some(code),
                latency,
            })
        },
        |(status, report, note)| {
            Ok(Outcome {
                http_status: code,
                latency,
                status,
                report,
                note,
            })
        },
    )
}

type Verdict = (Status, Option<HealthReport>, Option<String>);

/// Judges an answer with vigil-core's one judge ([`vigil_core::judge`](mod@vigil_core::judge), whose doc holds
/// the rule table); an *invalid* answer is an error (exit 3).
#[cfg(test)]
fn judge(code: u16, content_type: &str, body: &[u8]) -> Result<Verdict, String> {
    verdict(vigil_core::judge(
        vigil_core::Answers::HealthJson,
        code,
        (!content_type.is_empty()).then_some(content_type),
        body,
    ))
}

/// The verdict of a judged answer; an *invalid* one is an error (exit 3).
fn verdict(j: Judgement) -> Result<Verdict, String> {
    if j.invalid {
        return Err(j.detail);
    }
    // Say so when the code and the body disagree (a 503 whose body says pass).
    let note = j
        .report
        .as_ref()
        .filter(|r| r.status != j.status)
        .map(|_| j.detail.clone());
    Ok((j.status, j.report, note))
}

/// Says why a probe got no answer, in the words an operator looks for: no connection
/// is `unreachable`, an answer that is not HTTP is `invalid response`.
fn describe(e: &ProbeError) -> String {
    match e.kind {
        // A TLS failure names itself: `certificate not trusted: UnknownIssuer`.
        ErrorKind::Timeout | ErrorKind::Url | ErrorKind::Tls => e.message.clone(),
        ErrorKind::Connect => format!("unreachable: {}", e.message),
        ErrorKind::Request | ErrorKind::Response => format!("invalid response: {}", e.message),
        ErrorKind::TooLarge => format!("body larger than {} KiB", MAX_REPORT_BYTES / 1024),
    }
}

/// Says why asking the controller failed, in the words an operator looks for.
fn describe_asking(e: &reqwest::Error, timeout: Duration) -> String {
    if e.is_timeout() {
        return format!("timed out after {}", humantime::format_duration(timeout));
    }
    // reqwest's Display is terse ("error sending request for url (...)") and its chain
    // repeats itself: the root cause is what an operator needs ("Connection refused").
    let mut root: &dyn std::error::Error = e;
    while let Some(s) = root.source() {
        root = s;
    }
    if e.is_connect() {
        format!("unreachable: {root}")
    } else if std::error::Error::source(e).is_none() {
        format!("invalid response: {e}")
    } else {
        format!("invalid response: {root}")
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

fn outcome_json(url: &str, o: &Outcome, code: u8) -> serde_json::Value {
    let report = o
        .report
        .as_ref()
        .map(|r| serde_json::from_str::<serde_json::Value>(&r.to_json()).unwrap_or_default());
    json!({
        "url": url,
        "status": o.status.as_str(),
        "httpStatus": o.http_status,
        "latencyMs": ms(o.latency),
        "exitCode": code,
        "report": report,
    })
}

/// The human-readable summary: a headline, then one line per check.
fn summary(url: &str, o: &Outcome) -> String {
    let mut out = format!(
        "{}  {url}  (HTTP {}, {:.1} ms)\n",
        o.status.as_str().to_uppercase(),
        o.http_status,
        o.latency.as_secs_f64() * 1e3
    );
    let Some(report) = &o.report else {
        out.push_str("  (status-only endpoint: judged by its HTTP code)\n");
        return out;
    };
    if let Some(output) = &report.output {
        out.push_str(&format!("  {output}\n"));
    }
    let width = report.checks.keys().map(|k| k.len()).max().unwrap_or(0);
    for (name, results) in &report.checks {
        for r in results {
            let observed = match (&r.observed_value, &r.observed_unit) {
                (Some(v), Some(u)) => format!("{} {u}", plain(v)),
                (Some(v), None) => plain(v),
                _ => String::new(),
            };
            let mut line = format!("  {:<4}  {name:<width$}", r.status.as_str());
            if !observed.is_empty() {
                line.push_str(&format!("  {observed}"));
            }
            if let Some(output) = &r.output {
                line.push_str(&format!("  {output}"));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    out
}

/// A JSON value as a person would write it (strings without quotes).
fn plain(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judge_follows_the_body_made_worse_by_the_code() {
        let pass = br#"{"status":"pass"}"#;
        let fail = br#"{"status":"fail"}"#;
        assert_eq!(judge(200, HEALTH, pass).unwrap().0, Status::Pass);
        assert_eq!(judge(503, HEALTH, fail).unwrap().0, Status::Fail);
        let (s, _, note) = judge(503, HEALTH, pass).unwrap();
        assert_eq!(s, Status::Fail, "a 503 is never a pass");
        assert!(note.is_some());
        assert_eq!(judge(200, HEALTH, fail).unwrap().0, Status::Fail);
        // The draft allows any 4xx-5xx for fail: a 500 with a failing report is a fail
        // (exit 2), not an invalid answer (the Kubernetes API server answers 500).
        assert_eq!(judge(500, HEALTH, fail).unwrap().0, Status::Fail);
        assert_eq!(judge(404, HEALTH, fail).unwrap().0, Status::Fail);
        assert!(judge(301, HEALTH, pass).is_err());
    }

    const HEALTH: &str = "application/health+json";

    #[test]
    fn status_only_text_endpoints_are_judged_by_code_and_garbage_is_invalid() {
        assert_eq!(judge(200, "text/plain", b"ok").unwrap().0, Status::Pass);
        assert_eq!(
            judge(503, "text/plain; charset=utf-8", b"no").unwrap().0,
            Status::Fail
        );
        assert_eq!(judge(500, "text/plain", b"oops").unwrap().0, Status::Fail);
        let err = judge(200, "text/html", b"<html>").unwrap_err();
        assert!(err.contains("not health+json"), "{err}");
        assert!(judge(404, "text/plain", b"not found").is_err());
    }

    #[test]
    fn only_a_200_verdict_of_the_controller_counts() {
        let said = |code, body: serde_json::Value| fleet_answer(code, &body);
        assert_eq!(
            said(200, json!({"verdict": "restart", "reason": "r"})),
            FleetAnswer::Restart("r".into())
        );
        assert_eq!(
            said(200, json!({"verdict": "alive", "reason": "frozen"})),
            FleetAnswer::Alive("frozen".into())
        );
        for (code, body) in [
            (200, json!({"verdict": "maybe"})),
            (200, json!({})),
            (404, json!({"error": "unknown target \"x\""})),
            (503, json!({"verdict": "alive", "error": "busy"})),
        ] {
            assert!(
                matches!(said(code, body.clone()), FleetAnswer::NoAnswer(_)),
                "{code} {body}"
            );
        }
    }

    #[test]
    fn exit_codes() {
        assert_eq!(exit_code(Status::Pass, true), 0);
        assert_eq!(exit_code(Status::Warn, false), 0);
        assert_eq!(exit_code(Status::Warn, true), 1);
        assert_eq!(exit_code(Status::Fail, false), 2);
    }
}
