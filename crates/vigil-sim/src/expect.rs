//! Expectations: what a scenario promises about its outcome, checked after each run.
//!
//! In the scenario file, `[expect]` maps a metric of the [`Summary`] to a comparison
//! (`availability = ">= 0.999"`, `controller_actions = "<= 1"`) or, for the `*_within`
//! keys, to a duration (`fail_open_within = "30s"`: it must happen, and that soon).
//! `[expect.naive]` holds the same for the naive run, which is how a scenario proves
//! that the comparison shows what it should.

use crate::path::PathSeg;
use crate::summary::{ExpectationVerdict, Summary, format_duration};
use std::fmt;
use std::time::Duration;

/// A comparison operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `>=`
    Ge,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `<`
    Lt,
    /// `==`
    Eq,
}

impl Op {
    fn holds(self, a: f64, b: f64) -> bool {
        match self {
            Op::Ge => a >= b,
            Op::Le => a <= b,
            Op::Gt => a > b,
            Op::Lt => a < b,
            Op::Eq => (a - b).abs() < 1e-12,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Op::Ge => ">=",
            Op::Le => "<=",
            Op::Gt => ">",
            Op::Lt => "<",
            Op::Eq => "==",
        }
    }
}

/// One expectation.
#[derive(Clone, Debug, PartialEq)]
pub enum Expectation {
    /// `metric op value`.
    Compare {
        /// The metric's key.
        metric: &'static str,
        /// The operator.
        op: Op,
        /// The bound.
        value: f64,
    },
    /// The event must happen, no later than this after the first fault.
    Within {
        /// The key (`fail_open_within`, `detect_within`).
        key: &'static str,
        /// The bound.
        limit: Duration,
    },
}

/// The numeric metrics an expectation may name, with their meaning.
pub const METRICS: &[(&str, &str)] = &[
    (
        "availability",
        "successful client requests / all client requests",
    ),
    ("client_errors", "failed client requests"),
    (
        "min_in_service",
        "fewest servers the load balancer routed to",
    ),
    (
        "mean_in_service",
        "mean servers the load balancer routed to",
    ),
    (
        "max_removed_fraction",
        "largest fraction of the fleet out of service at once",
    ),
    (
        "time_to_detect",
        "slowest detection of a faulty server, seconds",
    ),
    ("undetected", "faulty servers never taken out of service"),
    (
        "lb_removals",
        "active-check verdicts that took a server out",
    ),
    ("ejections", "outlier ejections"),
    ("controller_actions", "servers the controller replaced"),
    ("controller_holds", "replacements the guard refused"),
    ("freezes", "guard freezes (fleet or zone) that started"),
    (
        "freeze_alerts",
        "freezes that lasted long enough to raise the guard's alert",
    ),
    (
        "fail_open_episodes",
        "times the load balancer entered fail-open",
    ),
    ("fail_open_seconds", "time spent in fail-open, seconds"),
    (
        "message_failure_rate",
        "failed message deliveries / all deliveries",
    ),
    ("max_queue_backlog", "largest queue backlog, messages"),
    (
        "worker_pauses",
        "times a worker gate stopped its worker pulling",
    ),
    ("dead_letters", "messages dead-lettered (poison or not)"),
    (
        "healthy_dead_letters",
        "healthy (not poison) messages dead-lettered",
    ),
    ("deploy_waves", "rollout waves that went out"),
    ("rollbacks", "rollouts that failed and rolled back"),
    ("client_retries", "retries the clients sent"),
    ("lb_retries", "retries the load balancer sent"),
    (
        "lb_retries_denied",
        "load-balancer retries its retry budget refused",
    ),
    (
        "lb_retries_throttled",
        "load-balancer retries its retry throttle refused",
    ),
    (
        "admission_refused",
        "attempts the servers refused before starting (deadline, queue time)",
    ),
    (
        "degraded",
        "requests answered in a degraded mode (a dependency's breaker open)",
    ),
    (
        "breaker_opens",
        "times a server's dependency breaker opened",
    ),
    (
        "availability_during_faults",
        "successful / all client requests while a fault was active",
    ),
    (
        "amplification",
        "attempts sent to the servers per new client request",
    ),
    ("request_timeouts", "attempts answered after their deadline"),
    (
        "check_timeouts",
        "health checks answered after their timeout",
    ),
];

/// The `*_within` keys.
pub const WITHIN: &[(&str, &str)] = &[
    (
        "fail_open_within",
        "fail-open starts no later than this after the first fault",
    ),
    (
        "detect_within",
        "every faulty server is out of service within this",
    ),
    (
        "recover_within",
        "after the last fault ends, the client success rate is back to 99% for good within this",
    ),
    (
        "workers_resume_within",
        "after the last fault ends, every worker that is up pulls again within this",
    ),
];

impl Expectation {
    /// Whether the run kept it, and what was measured.
    pub fn check(&self, s: &Summary) -> (bool, String) {
        match self {
            Expectation::Compare { metric, op, value } => {
                let got = s.metric(metric);
                match got {
                    Some(v) => (op.holds(v, *value), format_number(v)),
                    None => (false, "never happened".into()),
                }
            }
            Expectation::Within { key, limit } => {
                let got = match *key {
                    "fail_open_within" => s.first_fail_open_after_fault,
                    "recover_within" => s.recovered_after,
                    "workers_resume_within" => s.workers_resumed_after,
                    _ => {
                        if s.undetected > 0 {
                            None
                        } else {
                            s.detect_max
                        }
                    }
                };
                match got {
                    Some(d) => (d <= *limit, format_duration(d)),
                    None => (false, "never".into()),
                }
            }
        }
    }
}

impl fmt::Display for Expectation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expectation::Compare { metric, op, value } => {
                write!(f, "{metric} {} {}", op.as_str(), format_number(*value))
            }
            Expectation::Within { key, limit } => {
                write!(f, "{key} {}", format_duration(*limit))
            }
        }
    }
}

/// A number for people: integers without decimals, fractions with enough digits.
pub fn format_number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else if v.abs() < 1.0 {
        let s = format!("{v:.9}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        format!("{v:.2}")
    }
}

type Invalid = (Vec<PathSeg>, String);

/// Parses `[expect]` and `[expect.naive]`.
pub fn parse_expectations(
    table: &toml::Table,
) -> Result<(Vec<Expectation>, Vec<Expectation>), Invalid> {
    let mut vigil = Vec::new();
    let mut naive = Vec::new();
    for (k, v) in table {
        if k == "naive" {
            let t = v.as_table().ok_or_else(|| {
                (
                    vec![PathSeg::Key("expect".into()), PathSeg::Key("naive".into())],
                    "must be a table of expectations on the naive run".into(),
                )
            })?;
            for (k2, v2) in t {
                naive.push(parse_one(k2, v2).map_err(|m| {
                    (
                        vec![
                            PathSeg::Key("expect".into()),
                            PathSeg::Key("naive".into()),
                            PathSeg::Key(k2.clone()),
                        ],
                        m,
                    )
                })?);
            }
        } else {
            vigil.push(parse_one(k, v).map_err(|m| {
                (
                    vec![PathSeg::Key("expect".into()), PathSeg::Key(k.clone())],
                    m,
                )
            })?);
        }
    }
    Ok((vigil, naive))
}

fn parse_one(key: &str, value: &toml::Value) -> Result<Expectation, String> {
    if let Some((name, _)) = WITHIN.iter().find(|(n, _)| *n == key) {
        let s = value
            .as_str()
            .ok_or_else(|| "must be a duration string like \"30s\"".to_string())?;
        let limit = humantime::parse_duration(s).map_err(|e| format!("bad duration {s:?}: {e}"))?;
        return Ok(Expectation::Within { key: name, limit });
    }
    let Some((metric, _)) = METRICS.iter().find(|(n, _)| *n == key) else {
        let known: Vec<&str> = METRICS.iter().chain(WITHIN).map(|(n, _)| *n).collect();
        return Err(format!("unknown expectation; known: {}", known.join(", ")));
    };
    let s = value
        .as_str()
        .ok_or_else(|| "must be a comparison string like \">= 0.999\"".to_string())?;
    let s = s.trim();
    let (op, rest) = [
        (">=", Op::Ge),
        ("<=", Op::Le),
        ("==", Op::Eq),
        (">", Op::Gt),
        ("<", Op::Lt),
    ]
    .iter()
    .find_map(|(p, op)| s.strip_prefix(p).map(|r| (*op, r)))
    .ok_or_else(|| format!("{s:?} must start with >=, <=, >, < or =="))?;
    let rest = rest.trim();
    let value: f64 = match rest.strip_suffix('%') {
        // "99.9%" parses as 99.9e-2: exactly the double nearest 0.999.
        Some(p) => format!("{}e-2", p.trim())
            .parse::<f64>()
            .map_err(|_| format!("{rest:?} is not a number"))?,
        None => rest
            .parse()
            .map_err(|_| format!("{rest:?} is not a number"))?,
    };
    Ok(Expectation::Compare { metric, op, value })
}

/// Checks expectations against a summary.
pub fn verdicts(expect: &[Expectation], s: &Summary) -> Vec<ExpectationVerdict> {
    expect
        .iter()
        .map(|e| {
            let (ok, measured) = e.check(s);
            ExpectationVerdict {
                policies: s.policies,
                expectation: e.to_string(),
                ok,
                measured,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_reachable() {
        let s = Summary {
            detect_max: Some(Duration::from_secs(3)),
            ..Summary::default()
        };
        for (name, _) in METRICS {
            assert!(s.metric(name).is_some(), "metric {name} has no value");
        }
    }

    fn table(src: &str) -> toml::Table {
        toml::from_str(src).unwrap()
    }

    #[test]
    fn parses_comparisons_percentages_and_durations() {
        let (v, n) = parse_expectations(&table(
            "availability = \">= 99.9%\"\ncontroller_actions = \"<= 1\"\nfail_open_within = \"30s\"\n[naive]\navailability = \"< 0.5\"",
        ))
        .unwrap();
        assert_eq!(v.len(), 3);
        assert_eq!(n.len(), 1);
        assert!(v.contains(&Expectation::Compare {
            metric: "availability",
            op: Op::Ge,
            value: 0.999
        }));
        assert!(v.contains(&Expectation::Within {
            key: "fail_open_within",
            limit: Duration::from_secs(30)
        }));
    }

    #[test]
    fn unknown_metric_is_rejected_with_its_key() {
        let (path, msg) = parse_expectations(&table("availabilty = \">= 1\"")).unwrap_err();
        assert_eq!(path.last(), Some(&PathSeg::Key("availabilty".into())));
        assert!(msg.contains("availability"), "lists the known ones: {msg}");
    }
}
