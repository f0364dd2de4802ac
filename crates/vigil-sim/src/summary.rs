//! A run's numbers, and how they are shown in a terminal (one column per run).

use std::fmt::Write as _;
use std::time::Duration;

/// What one run measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    /// Scenario name.
    pub scenario: String,
    /// `vigil` or `naive`.
    pub policies: &'static str,
    /// Seed.
    pub seed: u64,
    /// Fleet size.
    pub servers: u32,
    /// Simulated time.
    pub duration: Duration,
    /// Discrete events processed (ticks, probes, faults, boots, ...).
    pub events: u64,
    /// Client requests that ended (a success, or a failure with no attempt left).
    pub requests: u64,
    /// Client requests that failed.
    pub client_errors: u64,
    /// New client requests (retries excluded).
    pub fresh_requests: u64,
    /// Attempts sent to the servers: new requests, client retries, balancer retries.
    pub tries: u64,
    /// Whether the clients or the balancer retry.
    pub has_retries: bool,
    /// Retries the clients sent.
    pub client_retries: u64,
    /// Retries the balancer sent.
    pub lb_retries: u64,
    /// Balancer retries its retry budget or its retry throttle refused.
    pub lb_retries_denied: u64,
    /// Of those, the ones the retry throttle refused (the bucket was half empty).
    pub lb_retries_throttled: u64,
    /// Attempts the servers' admission control refused before starting them (their
    /// deadline passed or could not be met, or they waited past the queue-time bound).
    pub admission_refused: u64,
    /// Requests a server answered in its degraded mode (a dependency's breaker open):
    /// served from a cache, or failed at once, instead of waiting on the dependency.
    pub degraded: u64,
    /// Times a server's dependency breaker opened.
    pub breaker_opens: u64,
    /// Client requests that ended while a fault was active, and those that failed.
    pub during_faults: (u64, u64),
    /// Attempts answered too late (the balancer or the client had given up).
    pub request_timeouts: u64,
    /// Health checks (balancer and controller) whose answer came after their timeout.
    pub check_timeouts: u64,
    /// From the end of the last fault to the last tick with under 99% successes (zero
    /// when there was none); `None` when no fault ended or the run ended in such a tick.
    pub recovered_after: Option<Duration>,
    /// Successful / all client requests (1 when there were none).
    pub availability: f64,
    /// Fewest servers in service (routed to and up) at any tick.
    pub min_in_service: u32,
    /// Mean servers in service.
    pub mean_in_service: f64,
    /// Largest fraction of the fleet that could serve but was out of service (not routed,
    /// or being replaced by the controller), at any tick.
    pub max_removed_fraction: f64,
    /// Faulty servers taken out of service (or replaced), and how fast.
    pub detected: u32,
    /// Mean time to detect.
    pub detect_mean: Option<Duration>,
    /// Slowest detection.
    pub detect_max: Option<Duration>,
    /// Faulty servers never taken out of service.
    pub undetected: u32,
    /// Active-check verdicts that took a server out of the load balancer.
    pub lb_removals: u32,
    /// Outlier ejections.
    pub ejections: u32,
    /// Outlier ejections refused by `max_ejection_percent`.
    pub ejections_skipped: u32,
    /// Servers the controller replaced.
    pub controller_actions: u32,
    /// Replacements the guard held back (distinct decisions).
    pub controller_holds: u32,
    /// Guard freezes (fleet or zone) that started.
    pub freezes: u32,
    /// Freezes that lasted long enough to raise the guard's alert.
    pub freeze_alerts: u32,
    /// Times the load balancer entered fail-open.
    pub fail_open_episodes: u32,
    /// Time spent in fail-open.
    pub fail_open_time: Duration,
    /// From the first fault to the first fail-open.
    pub first_fail_open_after_fault: Option<Duration>,
    /// Whether the scenario has a queue.
    pub has_queue: bool,
    /// Message deliveries (pulls).
    pub messages_delivered: u64,
    /// Deliveries that failed (and were redelivered).
    pub message_failures: u64,
    /// Largest queue backlog.
    pub max_queue_backlog: u64,
    /// Times a worker gate stopped its worker pulling (readiness or kill switch).
    pub worker_pauses: u32,
    /// Messages dead-lettered (poison or not).
    pub dead_letters: u64,
    /// Healthy (not poison) messages dead-lettered.
    pub healthy_dead_letters: u64,
    /// From the end of the last fault with a duration to the first tick every worker
    /// that is up pulls again.
    pub workers_resumed_after: Option<Duration>,
    /// Whether a fault of the scenario ends (has a duration).
    pub fault_ends: bool,
    /// Rollout waves that went out.
    pub deploy_waves: u32,
    /// Rollouts halted and rolled back.
    pub rollbacks: u32,
}

impl Summary {
    /// Computes the derived figures once the run is over.
    pub fn finish(&mut self) {
        self.availability = if self.requests == 0 {
            1.0
        } else {
            (self.requests - self.client_errors) as f64 / self.requests as f64
        };
    }

    /// The metric an expectation names (see [`crate::expect::METRICS`]).
    pub fn metric(&self, name: &str) -> Option<f64> {
        Some(match name {
            "availability" => self.availability,
            "client_errors" => self.client_errors as f64,
            "min_in_service" => f64::from(self.min_in_service),
            "mean_in_service" => self.mean_in_service,
            "max_removed_fraction" => self.max_removed_fraction,
            "time_to_detect" => self.detect_max?.as_secs_f64(),
            "undetected" => f64::from(self.undetected),
            "lb_removals" => f64::from(self.lb_removals),
            "ejections" => f64::from(self.ejections),
            "controller_actions" => f64::from(self.controller_actions),
            "controller_holds" => f64::from(self.controller_holds),
            "freezes" => f64::from(self.freezes),
            "freeze_alerts" => f64::from(self.freeze_alerts),
            "fail_open_episodes" => f64::from(self.fail_open_episodes),
            "fail_open_seconds" => self.fail_open_time.as_secs_f64(),
            "message_failure_rate" => {
                if self.messages_delivered == 0 {
                    0.0
                } else {
                    self.message_failures as f64 / self.messages_delivered as f64
                }
            }
            "max_queue_backlog" => self.max_queue_backlog as f64,
            "worker_pauses" => f64::from(self.worker_pauses),
            "dead_letters" => self.dead_letters as f64,
            "healthy_dead_letters" => self.healthy_dead_letters as f64,
            "deploy_waves" => f64::from(self.deploy_waves),
            "rollbacks" => f64::from(self.rollbacks),
            "client_retries" => self.client_retries as f64,
            "lb_retries" => self.lb_retries as f64,
            "lb_retries_denied" => self.lb_retries_denied as f64,
            "lb_retries_throttled" => self.lb_retries_throttled as f64,
            "admission_refused" => self.admission_refused as f64,
            "degraded" => self.degraded as f64,
            "breaker_opens" => self.breaker_opens as f64,
            "availability_during_faults" => self.availability_during_faults(),
            "amplification" => self.amplification(),
            "request_timeouts" => self.request_timeouts as f64,
            "check_timeouts" => self.check_timeouts as f64,
            _ => return None,
        })
    }

    /// Successful / all client requests that ended while a fault was active (1 when
    /// there were none).
    pub fn availability_during_faults(&self) -> f64 {
        let (n, failed) = self.during_faults;
        if n == 0 {
            1.0
        } else {
            (n - failed) as f64 / n as f64
        }
    }

    /// Attempts sent to the servers per new client request (1 without retries).
    pub fn amplification(&self) -> f64 {
        if self.fresh_requests == 0 {
            1.0
        } else {
            self.tries as f64 / self.fresh_requests as f64
        }
    }

    /// The rows of the terminal table and the report: (label, value).
    pub fn rows(&self) -> Vec<(&'static str, String)> {
        let pct = |v: f64| format!("{:.3}%", v * 100.0);
        let mut rows = vec![
            ("availability", pct(self.availability)),
            (
                "availability during faults",
                pct(self.availability_during_faults()),
            ),
            (
                "refused early / degraded (breaker opens)",
                format!(
                    "{} / {} ({})",
                    group(self.admission_refused),
                    group(self.degraded),
                    group(self.breaker_opens)
                ),
            ),
            (
                "client errors",
                format!("{} of {}", group(self.client_errors), group(self.requests)),
            ),
            (
                "servers in service min/mean",
                format!(
                    "{} / {:.1} of {}",
                    self.min_in_service, self.mean_in_service, self.servers
                ),
            ),
            (
                "max removed fraction",
                format!("{:.3}", self.max_removed_fraction),
            ),
            (
                "time to detect mean/max",
                match (self.detect_mean, self.detect_max) {
                    (Some(m), Some(x)) => format!(
                        "{} / {}{}",
                        format_duration(m),
                        format_duration(x),
                        if self.undetected > 0 {
                            format!(" ({} never)", self.undetected)
                        } else {
                            String::new()
                        }
                    ),
                    _ if self.undetected > 0 => format!("never ({} servers)", self.undetected),
                    _ => "-".into(),
                },
            ),
            (
                "lb removals / ejections",
                format!(
                    "{} / {}{}",
                    self.lb_removals,
                    self.ejections,
                    if self.ejections_skipped > 0 {
                        format!(" ({} capped)", self.ejections_skipped)
                    } else {
                        String::new()
                    }
                ),
            ),
            (
                "controller actions / held",
                format!("{} / {}", self.controller_actions, self.controller_holds),
            ),
            (
                "guard freezes / alerts",
                format!("{} / {}", self.freezes, self.freeze_alerts),
            ),
            (
                "fail-open episodes",
                if self.fail_open_episodes == 0 {
                    "0".into()
                } else {
                    format!(
                        "{} ({}{})",
                        self.fail_open_episodes,
                        format_duration(self.fail_open_time),
                        self.first_fail_open_after_fault
                            .map(|d| format!("; {} after fault", format_duration(d)))
                            .unwrap_or_default()
                    )
                },
            ),
        ];
        if self.request_timeouts > 0 || self.check_timeouts > 0 {
            rows.push((
                "timeouts requests / checks",
                format!(
                    "{} / {}",
                    group(self.request_timeouts),
                    group(self.check_timeouts)
                ),
            ));
        }
        if self.has_retries {
            rows.push((
                "retries client / lb (denied)",
                format!(
                    "{} / {} ({})",
                    group(self.client_retries),
                    group(self.lb_retries),
                    group(self.lb_retries_denied)
                ),
            ));
            rows.push(("lb retries throttled", group(self.lb_retries_throttled)));
            rows.push((
                "load amplification",
                format!("{:.2}x", self.amplification()),
            ));
            rows.push((
                "recovered after last fault",
                self.recovered_after
                    .map_or_else(|| "never".into(), format_duration),
            ));
        }
        if self.has_queue {
            rows.push((
                "message failure rate",
                format!(
                    "{} ({} of {})",
                    pct(self.metric("message_failure_rate").unwrap_or(0.0)),
                    group(self.message_failures),
                    group(self.messages_delivered)
                ),
            ));
            rows.push(("max queue backlog", group(self.max_queue_backlog)));
            rows.push(("worker pauses", self.worker_pauses.to_string()));
            rows.push((
                "dead letters (healthy messages)",
                format!(
                    "{} ({})",
                    group(self.dead_letters),
                    group(self.healthy_dead_letters)
                ),
            ));
            if self.fault_ends {
                rows.push((
                    "all workers pulling after last fault",
                    self.workers_resumed_after
                        .map_or_else(|| "never".into(), format_duration),
                ));
            }
        }
        if self.deploy_waves > 0 || self.rollbacks > 0 {
            rows.push((
                "deploy waves / rollbacks",
                format!("{} / {}", self.deploy_waves, self.rollbacks),
            ));
        }
        rows.push(("events simulated", group(self.events)));
        rows
    }
}

/// `1234567` as `1,234,567`.
pub fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Result of checking one expectation.
#[derive(Clone, Debug, PartialEq)]
pub struct ExpectationVerdict {
    /// `vigil` or `naive`.
    pub policies: &'static str,
    /// The expectation, as written.
    pub expectation: String,
    /// Kept?
    pub ok: bool,
    /// What the run measured.
    pub measured: String,
}

/// The terminal summary: one column per run, then the expectations.
pub fn render_text(runs: &[&Summary], verdicts: &[ExpectationVerdict]) -> String {
    let mut out = String::new();
    let Some(first) = runs.first() else {
        return out;
    };
    let _ = writeln!(
        out,
        "scenario {}: {} servers, {} simulated, seed {}",
        first.scenario,
        first.servers,
        format_duration(first.duration),
        first.seed
    );
    let rows: Vec<Vec<(&str, String)>> = runs.iter().map(|s| s.rows()).collect();
    let label_w = rows[0].iter().map(|(l, _)| l.len()).max().unwrap_or(0);
    let widths: Vec<usize> = rows
        .iter()
        .map(|r| r.iter().map(|(_, v)| v.len()).max().unwrap_or(0).max(8))
        .collect();
    if runs.len() > 1 {
        let _ = write!(out, "  {:label_w$}", "");
        for (s, w) in runs.iter().zip(&widths) {
            let _ = write!(out, "  {:>w$}", s.policies);
        }
        out.push('\n');
    }
    for (k, (label, _)) in rows[0].iter().enumerate() {
        let _ = write!(out, "  {label:label_w$}");
        for (r, w) in rows.iter().zip(&widths) {
            let v = r.get(k).map_or("", |(_, v)| v.as_str());
            let _ = write!(out, "  {v:>w$}");
        }
        out.push('\n');
    }
    if !verdicts.is_empty() {
        out.push_str("expectations:\n");
        for v in verdicts {
            let _ = writeln!(
                out,
                "  {} {:5} {} (measured {})",
                if v.ok { "ok  " } else { "FAIL" },
                v.policies,
                v.expectation,
                v.measured
            );
        }
    }
    out
}

/// Which policies a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policies {
    /// The scenario's (vigil's) policies.
    Vigil,
    /// The naive ones ([`crate::scenario::ScenarioConfig::naive`]).
    Naive,
}

impl Policies {
    /// `vigil` or `naive`, as the summary and the report label a run.
    pub fn as_str(self) -> &'static str {
        match self {
            Policies::Vigil => "vigil",
            Policies::Naive => "naive",
        }
    }
}

/// A duration for people: milliseconds under 10 s, tenths under a minute, whole
/// seconds above.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis() as u64;
    if ms < 10_000 {
        humantime::format_duration(Duration::from_millis(ms)).to_string()
    } else if ms < 60_000 && !ms.is_multiple_of(1000) {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else {
        humantime::format_duration(Duration::from_secs(ms / 1000)).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_thousands() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1234567), "1,234,567");
    }
}
