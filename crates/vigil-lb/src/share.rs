//! Shared verdicts between balancers (`[share]`): this balancer's own probe results,
//! served as `/admin/verdicts`, and the poller that reads every peer's and hands them
//! to each pool's [`vigil_core::share::Share`] (the rules live there; this is the IO).
//!
//! Floor 5, pool (floors: the crate doc): imports config and metrics.
//!
//! Balancer to balancer over each one's admin listener, with no controller between
//! them: nothing new to run, no single point of failure, and a balancer that loses
//! every peer probes as if unshared (rule 3). Each peer is polled every half interval
//! (the shortest pool interval) within an interval's timeout, with hyper's HTTP/1
//! client connection (already the checker's): a feed is a few hundred bytes per target.

use crate::config::{LbConfig, ShareConfig, share::PeerUrl};
use crate::metrics::{Metrics, PoolLabels, TargetLabels};
use bytes::Bytes;
use http::{Request, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, watch};
use vigil_core::Time;
use vigil_core::share::{Disagreement, Plan, STALE_INTERVALS, Share, ShareSettings, Turn};

/// Largest feed read from a peer: 8 MiB, some 50,000 targets' verdicts.
const MAX_FEED_BYTES: usize = 8 << 20;

/// One of this balancer's own probe results, as published.
#[derive(Clone, Debug)]
struct Own {
    seq: u64,
    ok: bool,
    detail: String,
    at: Instant,
}

/// One pool's sharing state at this balancer.
pub struct PoolFeed {
    /// The pool's name.
    pub name: String,
    interval: Duration,
    share: Mutex<Share>,
    own: Mutex<BTreeMap<String, Own>>,
    wake: BTreeMap<String, Arc<Notify>>,
}

impl PoolFeed {
    /// What `target`'s checker does on this turn.
    pub fn plan(&self, feed: &Feed, target: &str, turn: Turn) -> Plan {
        let mut share = self.share.lock().expect("share lock");
        let plan = share.plan(target, feed.now(), turn);
        feed.metrics
            .share_fallback_targets
            .get_or_create(&PoolLabels {
                pool: self.name.clone(),
            })
            .set(share.fallback_targets() as i64);
        plan
    }

    /// This balancer probed `target`: publish it, and tell the policy (which may find
    /// a disagreement, counted and logged here).
    pub fn local(&self, feed: &Feed, target: &str, ok: bool, detail: &str) {
        {
            let mut own = self.own.lock().expect("own lock");
            let seq = own.get(target).map_or(1, |o| o.seq + 1);
            own.insert(
                target.to_string(),
                Own {
                    seq,
                    ok,
                    detail: detail.to_string(),
                    at: Instant::now(),
                },
            );
        }
        let found = self
            .share
            .lock()
            .expect("share lock")
            .local(target, ok, feed.now());
        if let Some(d) = found {
            self.disagreement(feed, &d);
        }
    }

    fn disagreement(&self, feed: &Feed, d: &Disagreement) {
        feed.metrics
            .share_disagreements
            .get_or_create(&TargetLabels {
                pool: self.name.clone(),
                target: d.target.clone(),
            })
            .inc();
        tracing::warn!(
            pool = %self.name,
            target_addr = %d.target,
            from = %d.failing_from(),
            "{d}; {} trusts only its own probes of it until the views agree",
            d.me
        );
    }

    /// What wakes `target`'s checker when a peer's fail asks for confirmation.
    pub fn wake(&self, target: &str) -> Option<Arc<Notify>> {
        self.wake.get(target).cloned()
    }

    /// The pool's health-check interval.
    pub fn interval(&self) -> Duration {
        self.interval
    }
}

/// Sharing at this balancer: its id, its peers, each pool's state.
pub struct Feed {
    id: String,
    epoch: Instant,
    peers: Vec<PeerUrl>,
    settings: ShareConfig,
    pools: arc_swap::ArcSwap<BTreeMap<String, Arc<PoolFeed>>>,
    /// Each peer (by URL) and when it last answered.
    answered: Mutex<BTreeMap<String, Instant>>,
    metrics: Arc<Metrics>,
}

impl Feed {
    /// Sharing per `config`'s `[share]`, or `None` when it has no peers (no sharing:
    /// every target probed locally, as without the section).
    pub fn new(config: &LbConfig, metrics: Arc<Metrics>) -> Option<Arc<Feed>> {
        if !config.share.enabled() {
            return None;
        }
        let feed = Arc::new(Feed {
            id: config.share.id_or(config.admin_listen),
            epoch: Instant::now(),
            peers: config.share.peer_urls(),
            settings: config.share.clone(),
            pools: arc_swap::ArcSwap::from_pointee(BTreeMap::new()),
            answered: Mutex::new(BTreeMap::new()),
            metrics,
        });
        feed.configure(config);
        Some(feed)
    }

    /// The policy's clock: time since this feed started.
    pub fn now(&self) -> Time {
        Time::from_elapsed(self.epoch.elapsed())
    }

    /// This balancer's id in the feed.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Takes the pools of a (re)loaded configuration: a pool with the same interval and
    /// targets keeps its state, others start afresh (every target probed locally until
    /// peers' verdicts come). `[share]` itself is read at start only.
    pub fn configure(&self, config: &LbConfig) {
        if config.share != self.settings {
            tracing::warn!("[share] changed: the new settings take effect after a restart");
        }
        let old = self.pools.load_full();
        let mut pools = BTreeMap::new();
        for (name, section) in &config.pools {
            let hc = &section.health_check;
            if !hc.enabled {
                continue;
            }
            let targets: Vec<&String> = section.targets.iter().map(|t| &t.addr).collect();
            if let Some(p) = old.get(name)
                && p.interval == hc.interval
                && p.wake.keys().eq(targets.iter().copied())
            {
                pools.insert(name.clone(), p.clone());
                continue;
            }
            let share = Share::new(ShareSettings {
                id: self.id.clone(),
                probes_per_interval: self.settings.probes_per_interval,
                local_every: self.settings.local_every,
                interval: hc.interval,
            });
            pools.insert(
                name.clone(),
                Arc::new(PoolFeed {
                    name: name.clone(),
                    interval: hc.interval,
                    share: Mutex::new(share),
                    own: Mutex::new(BTreeMap::new()),
                    wake: targets
                        .into_iter()
                        .map(|t| (t.clone(), Arc::new(Notify::new())))
                        .collect(),
                }),
            );
        }
        self.pools.store(Arc::new(pools));
    }

    /// The sharing state of pool `name` (`None`: not checked).
    pub fn pool(&self, name: &str) -> Option<Arc<PoolFeed>> {
        self.pools.load().get(name).cloned()
    }

    /// The JSON of `/admin/verdicts`: this balancer's id and, per pool and target, the
    /// results of the probes it made itself (`seq` grows by one per probe; `age_ms`:
    /// how long ago it was made).
    pub fn verdicts_json(&self) -> Value {
        let mut pools = serde_json::Map::new();
        for (name, p) in self.pools.load().iter() {
            let own = p.own.lock().expect("own lock");
            let targets: serde_json::Map<String, Value> = own
                .iter()
                .map(|(t, o)| {
                    (
                        t.clone(),
                        json!({
                            "ok": o.ok,
                            "detail": o.detail,
                            "seq": o.seq,
                            "age_ms": o.at.elapsed().as_millis() as u64,
                        }),
                    )
                })
                .collect();
            pools.insert(
                name.clone(),
                json!({
                    "interval_ms": p.interval.as_millis() as u64,
                    "targets": targets,
                }),
            );
        }
        json!({ "id": self.id, "pools": pools })
    }

    /// A peer's feed, handed to every pool that both have.
    fn take(&self, doc: &Value) -> Result<String, String> {
        let by = doc["id"]
            .as_str()
            .filter(|s| !s.is_empty())
            .ok_or("no \"id\" in the answer: not a vigil lb /admin/verdicts")?;
        if by == self.id {
            return Err(format!(
                "it answers with this balancer's own id {by:?}: a peer URL that leads back here, or two balancers with one [share] id"
            ));
        }
        let now = self.now();
        for (name, p) in self.pools.load().iter() {
            let mut share = p.share.lock().expect("share lock");
            share.peer_answered(by, now);
            let Some(targets) = doc["pools"][name]["targets"].as_object() else {
                continue;
            };
            for (t, v) in targets {
                let (Some(ok), Some(seq), Some(age)) =
                    (v["ok"].as_bool(), v["seq"].as_u64(), v["age_ms"].as_u64())
                else {
                    continue;
                };
                let Some(wake) = p.wake.get(t) else {
                    continue;
                };
                let detail = v["detail"].as_str().unwrap_or("");
                if share.remote(t, by, seq, ok, detail, Duration::from_millis(age), now) {
                    wake.notify_one();
                }
            }
        }
        Ok(by.to_string())
    }

    /// The poll period and timeout: half and one of the shortest pool interval.
    fn cadence(&self) -> (Duration, Duration) {
        let shortest = self
            .pools
            .load()
            .values()
            .map(|p| p.interval)
            .min()
            .unwrap_or(crate::config::DEFAULT_HEALTH_INTERVAL);
        (shortest / 2, shortest)
    }

    fn update_live(&self) {
        let (_, interval) = self.cadence();
        let stale = interval.saturating_mul(STALE_INTERVALS);
        let live = self
            .answered
            .lock()
            .expect("answered lock")
            .values()
            .filter(|at| at.elapsed() < stale)
            .count();
        self.metrics.share_peers_live.set(live as i64);
    }

    /// Polls every peer until `stop` changes or is dropped.
    pub fn spawn_pollers(self: &Arc<Self>, stop: watch::Receiver<()>) {
        for peer in self.peers.clone() {
            let (feed, mut stop) = (self.clone(), stop.clone());
            tokio::spawn(async move {
                let mut up: Option<bool> = None;
                loop {
                    let (every, timeout) = feed.cadence();
                    let started = tokio::time::Instant::now();
                    let got = tokio::select! {
                        biased;
                        _ = stop.changed() => return,
                        r = tokio::time::timeout(timeout, fetch(&peer)) => r
                            .unwrap_or_else(|_| Err(format!("no answer within {}", humantime::format_duration(timeout))))
                            .and_then(|doc| feed.take(&doc)),
                    };
                    match got {
                        Ok(by) => {
                            feed.answered
                                .lock()
                                .expect("answered lock")
                                .insert(peer.url.clone(), Instant::now());
                            if up != Some(true) {
                                tracing::info!(peer = %peer.url, id = %by, "share: peer answers; its verdicts are taken");
                            }
                            up = Some(true);
                        }
                        Err(e) => {
                            if up != Some(false) {
                                tracing::warn!(peer = %peer.url, "share: peer's /admin/verdicts failed: {e}; after {STALE_INTERVALS} intervals without an answer its targets are probed here");
                            }
                            up = Some(false);
                        }
                    }
                    feed.update_live();
                    tokio::select! {
                        biased;
                        _ = stop.changed() => return,
                        _ = tokio::time::sleep_until(started + every) => {}
                    }
                }
            });
        }
    }
}

/// GET `/admin/verdicts` of `peer`, as JSON.
async fn fetch(peer: &PeerUrl) -> Result<Value, String> {
    let tcp = tokio::net::TcpStream::connect(&peer.authority)
        .await
        .map_err(|e| format!("connect to {} failed: {e}", peer.authority))?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| format!("handshake failed: {e}"))?;
    tokio::spawn(conn);
    let req = Request::get("/admin/verdicts")
        .header(header::HOST, peer.authority.as_str())
        .header(header::USER_AGENT, "vigil-lb share")
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = send
        .send_request(req)
        .await
        .map_err(|e| format!("request failed: {e}"))?;
    let status = resp.status();
    let body = Limited::new(resp.into_body(), MAX_FEED_BYTES)
        .collect()
        .await
        .map_err(|e| format!("answer unreadable: {e}"))?
        .to_bytes();
    if !status.is_success() {
        return Err(format!(
            "HTTP {} (is it a vigil lb with [share]?)",
            status.as_u16()
        ));
    }
    serde_json::from_slice(&body).map_err(|e| format!("not JSON: {e}"))
}
