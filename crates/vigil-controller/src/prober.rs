//! Deep-health probes: `GET {url}{path}` over pooled HTTP/1.1 connections, plain or
//! https, bounded in time and body size, judged as a guard [`Observation`].
//!
//! The client is vigil-probe's (shared with `vigil check`): its doc says why it is
//! hand-written (an idle pooled connection is a bare socket: at 10,000 targets hyper's
//! client was most of the controller's memory and CPU) and how https is verified.

use crate::config::ProbeConfig;
use serde::Serialize;
#[cfg(test)]
use std::sync::Arc;
use std::time::{Duration, Instant};
use vigil_core::guard::Observation;
use vigil_core::judge::Answers;
use vigil_probe::{CaError, CaFile, Client, ErrorKind, Limits, Options, ProbeError};

/// One probe, as the API and dashboard show it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProbeRecord {
    /// When it finished (UNIX ms).
    pub at_ms: i64,
    /// Whether it passed.
    pub ok: bool,
    /// How long it took.
    pub duration_ms: f64,
    /// HTTP status, if any came back.
    pub status: Option<u16>,
    /// The report's status (`pass`, `warn`, `fail`) if it parsed.
    pub health: Option<vigil_core::Status>,
    /// What failed: the error, or the failing checks.
    pub detail: String,
}

/// The `User-Agent` of every probe.
pub const USER_AGENT: &str = "vigil-controller";

/// The HTTP(S) prober (cheap to clone: the pool is shared): vigil-probe's [`Client`],
/// its answers turned into guard observations and [`ProbeRecord`]s.
#[derive(Clone)]
pub struct Prober {
    client: Client,
}

impl Default for Prober {
    fn default() -> Self {
        Self::new(true)
    }
}

impl Prober {
    /// A prober with its own connection pool; without `keep_alive`, every probe opens
    /// (and closes) its own connection. https targets are trusted by the system's roots.
    pub fn new(keep_alive: bool) -> Prober {
        Prober::with_ca(keep_alive, None)
    }

    /// The prober `[probe]` asks for: `keep_alive`, and `ca_file` read now (a CA file
    /// that cannot be read is an error at start, not a failure of every https probe).
    pub fn for_config(probe: &ProbeConfig) -> Result<Prober, CaError> {
        let ca = probe.ca_file.as_deref().map(CaFile::read).transpose()?;
        Ok(Prober::with_ca(probe.keep_alive, ca))
    }

    fn with_ca(keep_alive: bool, ca: Option<CaFile>) -> Prober {
        Prober {
            client: Client::new(Options {
                reuse_connection: keep_alive,
                user_agent: USER_AGENT.into(),
                ca,
            }),
        }
    }

    /// Sends `User-Agent: vigil-controller (replica <id>)`, so a target's logs tell
    /// the replicas that probe it apart.
    pub fn for_replica(self, id: &str) -> Prober {
        Prober {
            client: self
                .client
                .with_user_agent(&format!("{USER_AGENT} (replica {id})")),
        }
    }

    /// Idle connections in the pool now.
    pub fn idle_connections(&self) -> usize {
        self.client.idle_connections()
    }

    /// Probes `base` + `path`, judging the answer by the rules of `answers`. Never
    /// fails: every failure is an observation.
    pub async fn probe(
        &self,
        target: &str,
        zone: &str,
        uri: http::Uri,
        timeout: Duration,
        max_body: usize,
        answers: Answers,
    ) -> (Observation, ProbeRecord) {
        let started = Instant::now();
        let limits = Limits {
            timeout,
            max_body,
            answers,
        };
        let result = self.client.get(&uri, limits).await;
        let duration_ms = started.elapsed().as_secs_f64() * 1000.0;
        let mut record = ProbeRecord {
            at_ms: crate::clock::wall_ms(),
            ok: false,
            duration_ms,
            status: None,
            health: None,
            detail: String::new(),
        };
        let obs = match result {
            Err(e) => {
                record.detail = detail(e);
                Observation::endpoint_failure(target, zone)
            }
            Ok(seen) => {
                record.status = Some(seen.status);
                // vigil-core's one judge (its doc has the rule table), by the configured
                // `probe.answers`: with `plain-status` (the default) a server without a
                // health endpoint is judged by its code, 2xx-3xx pass; with
                // `health+json` an answer that is not a health answer is garbage. Any
                // 4xx-5xx with a report is a fail either way.
                let j = seen.judgement;
                record.health = j.report.as_ref().map(|r| r.status);
                let obs = j.observation(target, zone);
                if j.invalid {
                    record.detail = format!("garbage health response: {}", j.detail);
                } else if obs.endpoint_failed && j.report.is_some() {
                    record.detail = format!("{}: fail without a failing check", j.detail);
                } else if obs.endpoint_failed {
                    // A plain status failing: "HTTP 503", "HTTP 404, not a health
                    // answer: a plain 4xx fails (is the path right?)".
                    record.detail = j.detail;
                } else if !obs.failing_checks.is_empty() {
                    record.detail = format!("failing: {}", obs.failing_checks.join(", "));
                }
                obs
            }
        };
        record.ok = obs.is_ok();
        (obs, record)
    }

    /// Fetches `uri` and judges the answer with vigil-core's one judge, keeping the
    /// health+json report (its `version`, `releaseId`, checks): what `vigil deploy` reads
    /// to see a host report back. `Err` when no answer came (refused, timed out, not
    /// HTTP).
    pub async fn answer(
        &self,
        uri: &http::Uri,
        timeout: Duration,
        max_body: usize,
    ) -> Result<vigil_core::judge::Judgement, String> {
        // A report-back is a health+json report (its `releaseId` or `version`): the
        // body is read as one whatever its Content-Type says.
        let answers = Answers::HealthJson;
        let limits = Limits {
            timeout,
            max_body,
            answers,
        };
        let seen = self.client.get(uri, limits).await.map_err(detail)?;
        Ok(vigil_core::judge(
            answers,
            seen.status,
            Some(vigil_core::HEALTH_JSON),
            &seen.body,
        ))
    }

    /// The observation for a target whose URL does not parse (config validation makes
    /// this unreachable for configured targets; it is a failure, never a panic).
    pub fn bad_url(target: &str, zone: &str, url: &str) -> (Observation, ProbeRecord) {
        let record = ProbeRecord {
            at_ms: crate::clock::wall_ms(),
            ok: false,
            duration_ms: 0.0,
            status: None,
            health: None,
            detail: format!("bad URL {url:?}"),
        };
        (Observation::endpoint_failure(target, zone), record)
    }
}

/// A probe's failure as a record's detail: no answer to the request is `request
/// failed: ...` (as the dashboard has always said), the rest as vigil-probe words it.
fn detail(e: ProbeError) -> String {
    match e.kind {
        ErrorKind::Connect | ErrorKind::Request => format!("request failed: {}", e.message),
        _ => e.message,
    }
}

#[cfg(test)]
mod tests;
