//! The balancers beside the guard: the dashboard shows the pools of the `vigil lb`
//! instances listed in `[dashboard] balancers`, so that one page shows the whole system
//! (what the balancers route around, what the controller replaces).
//!
//! A task reads each balancer's `/admin/targets` every [`POLL_EVERY`] (timeout
//! [`POLL_TIMEOUT`], at most [`MAX_BODY`] read) and publishes a summary per pool: targets
//! in service (healthy or in slow start), unhealthy, ejected, not checked yet, drained,
//! whether the pool fails open with the fraction that made it, and its clients' success
//! rate over the balancer's recent window (`requests.recent`). A balancer that cannot be
//! read is shown with the error, never dropped silently, and never changes a decision:
//! the controller judges targets by its own probes only.

use crate::config::ControllerConfig;
use arc_swap::ArcSwap;
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often each balancer is read.
pub const POLL_EVERY: Duration = Duration::from_secs(2);
/// How long one read may take.
pub const POLL_TIMEOUT: Duration = Duration::from_secs(1);
/// The largest `/admin/targets` document read (a pool of thousands of targets fits).
pub const MAX_BODY: usize = 4 << 20;

/// One balancer as last read.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BalancerView {
    /// Its admin address, as configured.
    pub url: String,
    /// Its pools, by name (empty when it could not be read).
    pub pools: Vec<PoolSummary>,
    /// Why it could not be read, if it could not.
    pub error: Option<String>,
}

/// One pool of a balancer.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PoolSummary {
    /// The pool's name.
    pub name: String,
    /// Targets taking traffic (healthy or in slow start).
    pub in_service: usize,
    /// Targets failing their active checks.
    pub unhealthy: usize,
    /// Targets ejected by outlier detection.
    pub ejected: usize,
    /// The addresses of the unhealthy targets, so the page names what is out, not only
    /// how many (at most [`NAMED`]).
    pub unhealthy_targets: Vec<String>,
    /// The addresses of the ejected targets (at most [`NAMED`]).
    pub ejected_targets: Vec<String>,
    /// Targets not checked yet.
    pub unknown: usize,
    /// Targets drained through the balancer's admin API (draining or drained).
    pub drained: usize,
    /// Whether the pool fails open (routes to every target because too few are healthy).
    pub fail_open: bool,
    /// With `fail_open`: why, in words (`1/4 healthy, under the panic threshold 50%`).
    pub fail_open_reason: Option<String>,
    /// The share of the pool's client answers that were not errors (5xx, gateway
    /// errors) over the balancer's recent window; `None` without answers in it (or from
    /// a balancer that does not count them).
    pub success_rate: Option<f64>,
    /// Client answers in that window.
    pub answered: u64,
    /// How long that window is, in seconds.
    pub window_seconds: u64,
}

/// How many out-of-service targets a pool's summary names (a fleet-wide outage of
/// hundreds is a count, not a list).
pub const NAMED: usize = 8;

/// The latest reads, shared with the dashboard.
pub type BalancerViews = Arc<ArcSwap<Vec<BalancerView>>>;

/// Summarises a balancer's `/admin/targets` document.
pub fn summarize(doc: &serde_json::Value) -> Result<Vec<PoolSummary>, String> {
    let pools = doc["pools"]
        .as_object()
        .ok_or("not a vigil lb /admin/targets document (no \"pools\" object)")?;
    let mut out = Vec::with_capacity(pools.len());
    for (name, pool) in pools {
        let mut s = PoolSummary {
            name: name.clone(),
            fail_open: pool["fail_open"].as_bool().unwrap_or(false),
            ..PoolSummary::default()
        };
        for t in pool["targets"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
            let addr = || t["addr"].as_str().unwrap_or("?").to_string();
            match t["state"].as_str().unwrap_or("unknown") {
                "healthy" | "slow-start" => s.in_service += 1,
                "unhealthy" => {
                    s.unhealthy += 1;
                    if s.unhealthy_targets.len() < NAMED {
                        s.unhealthy_targets.push(addr());
                    }
                }
                "ejected" => {
                    s.ejected += 1;
                    if s.ejected_targets.len() < NAMED {
                        s.ejected_targets.push(addr());
                    }
                }
                "draining" | "drained" => s.drained += 1,
                _ => s.unknown += 1,
            }
        }
        let recent = &pool["requests"]["recent"];
        s.success_rate = recent["success_rate"].as_f64();
        s.answered = recent["answered"].as_u64().unwrap_or(0);
        s.window_seconds = recent["seconds"].as_f64().unwrap_or(0.0) as u64;
        if s.fail_open {
            let threshold = pool["panic_threshold"].as_f64().unwrap_or(0.0);
            s.fail_open_reason = Some(format!(
                "{}/{} healthy, under the panic threshold {:.0}%: routing to every target",
                pool["healthy"].as_u64().unwrap_or(0),
                pool["targets"].as_array().map_or(0, Vec::len),
                threshold * 100.0
            ));
        }
        out.push(s);
    }
    Ok(out)
}

async fn read(client: &reqwest::Client, url: &str) -> Result<Vec<PoolSummary>, String> {
    let admin = format!("{}/admin/targets", url.trim_end_matches('/'));
    let mut resp = client
        .get(&admin)
        .send()
        .await
        .map_err(|e| format!("{admin}: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("{admin}: HTTP {}", resp.status().as_u16()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| format!("{admin}: {e}"))? {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(format!("{admin}: answer larger than {MAX_BODY} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    let doc: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| format!("{admin}: not JSON: {e}"))?;
    summarize(&doc).map_err(|e| format!("{admin}: {e}"))
}

/// Reads the configured balancers every [`POLL_EVERY`] into `views` until `shutdown`
/// changes; follows `config` (a reload changes the list).
pub async fn run(
    mut config: watch::Receiver<Arc<ControllerConfig>>,
    views: BalancerViews,
    mut shutdown: watch::Receiver<bool>,
) {
    let client = match reqwest::Client::builder().timeout(POLL_TIMEOUT).build() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the balancers' HTTP client: the dashboard shows no balancer");
            return;
        }
    };
    let mut tick = tokio::time::interval(POLL_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = config.changed() => {}
            _ = shutdown.changed() => return,
        }
        let urls = config.borrow_and_update().dashboard.balancers.clone();
        let mut next = Vec::with_capacity(urls.len());
        for url in urls {
            let (pools, error) = match read(&client, &url).await {
                Ok(pools) => (pools, None),
                Err(e) => (Vec::new(), Some(e)),
            };
            next.push(BalancerView { url, pools, error });
        }
        views.store(Arc::new(next));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_is_counted_by_state_and_fail_open_says_why() {
        let doc = serde_json::json!({"pools": {"web": {
            "fail_open": true, "healthy": 1, "panic_threshold": 0.5,
            "targets": [
                {"state": "healthy"}, {"state": "slow-start"},
                {"state": "unhealthy", "addr": "10.0.0.3:80"},
                {"state": "ejected", "addr": "10.0.0.4:80"}, {"state": "unknown"}, {"state": "draining"},
                {"state": "drained"}
            ],
            "requests": {"answered": 500, "recent": {
                "seconds": 60.0, "answered": 200, "errors": 3, "success_rate": 0.985
            }}
        }}});
        let pools = summarize(&doc).unwrap();
        assert_eq!(pools.len(), 1);
        let p = &pools[0];
        assert_eq!(
            (p.in_service, p.unhealthy, p.ejected, p.unknown, p.drained),
            (2, 1, 1, 1, 2)
        );
        assert_eq!(
            (&p.unhealthy_targets[..], &p.ejected_targets[..]),
            (
                &["10.0.0.3:80".to_string()][..],
                &["10.0.0.4:80".to_string()][..]
            ),
            "the targets out of service are named"
        );
        assert_eq!(
            (p.success_rate, p.answered, p.window_seconds),
            (Some(0.985), 200, 60)
        );
        assert_eq!(
            p.fail_open_reason.as_deref(),
            Some("1/7 healthy, under the panic threshold 50%: routing to every target")
        );
    }

    #[test]
    fn a_document_that_is_not_the_balancers_is_an_error() {
        assert!(summarize(&serde_json::json!({"status": "pass"})).is_err());
    }
}
