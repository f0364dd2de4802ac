//! What the clients got from each host, as the balancers in front of them counted it:
//! the deployer scrapes each `vigil lb`'s admin `/metrics` and sums
//! `vigil_lb_requests_total{pool,target,code}` per target over pools and balancers:
//! every answer a target gave is a request, a 5xx among them an error. The rollout
//! policy keeps the differences between two reads (`Rollout::outcomes`) and judges a
//! wave by errors per request ([`vigil_core::rollout::requests`]).
//!
//! Why the existing metric and not a new stats endpoint: the balancer already counts
//! every answer per target and code on its data path (a cached counter per code, no
//! new lock), so the deployer needs nothing more of it, and any `vigil lb` of the last
//! releases can be read. The price is a text parse of the whole exposition per probe
//! round: a few hundred lines for a pool of dozens of targets, microseconds. Latency
//! per target is not in that metric (its histogram is per pool), so it is not judged.
//!
//! A host is found among the targets by its id (when the hosts are named `host:port`,
//! as a balancer names its targets and as `drain.kind = "http"` needs), else by its
//! URL's `host:port`. Vigil's own answers (`target="none"`: no target could answer)
//! belong to no host and are left out.

use super::config::{DeployLbConfig, HostConfig};
use std::collections::BTreeMap;
use vigil_core::rollout::RequestCounts;

/// The metric read, as the 0.0.4 text format names its samples.
const METRIC: &str = "vigil_lb_requests_total";

/// Reads the balancers' counts.
#[derive(Clone)]
pub struct BalancerClient {
    admins: Vec<String>,
    http: reqwest::Client,
}

impl BalancerClient {
    /// A client for `cfg` (None when no balancer is configured).
    pub fn new(cfg: &DeployLbConfig) -> Option<BalancerClient> {
        (!cfg.admin.is_empty()).then(|| BalancerClient {
            admins: cfg.admin.clone(),
            http: reqwest::Client::builder()
                .timeout(cfg.timeout)
                .build()
                .expect("a reqwest client without TLS builds"),
        })
    }

    /// The admin addresses read.
    pub fn admins(&self) -> &[String] {
        &self.admins
    }

    /// Every target's counts, summed over every balancer; `Err` (why) when one of them
    /// cannot be read: a partial sum would look like a counter reset.
    pub async fn counts(&self) -> Result<BTreeMap<String, RequestCounts>, String> {
        let mut set = tokio::task::JoinSet::new();
        for a in &self.admins {
            let (me, a) = (self.clone(), a.clone());
            set.spawn(async move { me.read(&a).await });
        }
        let mut total: BTreeMap<String, RequestCounts> = BTreeMap::new();
        while let Some(r) = set.join_next().await {
            let r = r.map_err(|e| format!("reading a balancer: {e}"))?;
            for (target, c) in r? {
                let e = total.entry(target).or_default();
                *e = e.plus(c);
            }
        }
        Ok(total)
    }

    async fn read(&self, admin: &str) -> Result<BTreeMap<String, RequestCounts>, String> {
        let url = format!("{}/metrics", admin.trim_end_matches('/'));
        let what = format!("GET {url}");
        let resp = self
            .http
            .get(&url)
            .header("accept", "text/plain; version=0.0.4")
            .send()
            .await
            .map_err(|e| format!("{what}: {e}"))?;
        if !resp.status().is_success() {
            return Err(format!("{what}: HTTP {}", resp.status()));
        }
        let text = resp.text().await.map_err(|e| format!("{what}: {e}"))?;
        let counts = parse_requests(&text);
        if counts.is_empty() && !text.contains("vigil_lb_") {
            return Err(format!("{what}: not a vigil lb's metrics"));
        }
        Ok(counts)
    }
}

/// The counts of `host` among the `targets`: by its id, else by its URL's `host:port`.
pub fn host_counts(
    host: &HostConfig,
    targets: &BTreeMap<String, RequestCounts>,
) -> Option<RequestCounts> {
    targets.get(&host.id).copied().or_else(|| {
        let authority = host.url.strip_prefix("http://")?.split('/').next()?;
        targets.get(authority).copied()
    })
}

/// Per target, the requests and 5xx answers of `vigil_lb_requests_total` in a text
/// exposition (0.0.4 or OpenMetrics), summed over pools.
pub fn parse_requests(text: &str) -> BTreeMap<String, RequestCounts> {
    let mut out: BTreeMap<String, RequestCounts> = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(METRIC).and_then(|r| r.strip_prefix('{')) else {
            continue;
        };
        let Some((labels, value)) = split_labels(rest) else {
            continue;
        };
        let (Some(target), Some(code)) = (labels.get("target"), labels.get("code")) else {
            continue;
        };
        if target == "none" {
            continue;
        }
        let Some(n) = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| v.is_finite() && *v >= 0.0)
        else {
            continue;
        };
        let n = n as u64;
        let errors = if code.starts_with('5') { n } else { 0 };
        let e = out.entry(target.clone()).or_default();
        *e = e.plus(RequestCounts::new(n, errors));
    }
    out
}

/// `k="v",k2="v2"} value` into the labels and what follows the `}`.
fn split_labels(s: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start_matches(',');
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let (key, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        labels.insert(key.trim().to_string(), value);
        rest = &after[end + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_5xx_are_summed_per_target_over_pools() {
        let text = r#"# HELP vigil_lb_requests Client requests answered.
# TYPE vigil_lb_requests counter
vigil_lb_requests_total{pool="web",target="127.0.0.1:81",code="200"} 40
vigil_lb_requests_total{pool="web",target="127.0.0.1:81",code="500"} 2
vigil_lb_requests_total{pool="api",target="127.0.0.1:81",code="503"} 1
vigil_lb_requests_total{pool="web",target="127.0.0.1:82",code="404"} 7
vigil_lb_requests_total{pool="web",target="none",code="502"} 9
vigil_lb_request_duration_seconds_count{pool="web"} 59
"#;
        let c = parse_requests(text);
        assert_eq!(c["127.0.0.1:81"], RequestCounts::new(43, 3));
        assert_eq!(
            c["127.0.0.1:82"],
            RequestCounts::new(7, 0),
            "a 4xx is no error"
        );
        assert!(!c.contains_key("none"), "vigil's own answers are no host's");
    }

    #[test]
    fn a_host_is_found_by_its_id_else_by_its_url() {
        let targets: BTreeMap<String, RequestCounts> = [
            ("127.0.0.1:81".to_string(), RequestCounts::new(5, 1)),
            ("10.0.0.2:80".to_string(), RequestCounts::new(9, 0)),
        ]
        .into();
        let h = |id: &str, url: &str| HostConfig {
            id: id.into(),
            url: url.into(),
            zone: String::new(),
        };
        assert_eq!(
            host_counts(&h("127.0.0.1:81", "http://127.0.0.1:9000"), &targets),
            Some(RequestCounts::new(5, 1))
        );
        assert_eq!(
            host_counts(&h("web-2", "http://10.0.0.2:80/"), &targets),
            Some(RequestCounts::new(9, 0))
        );
        assert_eq!(
            host_counts(&h("web-3", "http://10.0.0.3:80"), &targets),
            None
        );
    }
}
