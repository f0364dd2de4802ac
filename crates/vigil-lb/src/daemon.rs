//! The daemon: listeners, the tick loop, health checkers, SIGHUP reload and SIGTERM
//! drain.
//!
//! Floor 2, daemon (floors: the crate doc): imports every floor below (downstream, admin,
//! tls, proxy, checker, pool, upstream) and the shared helpers.
//!
//! Reload builds the new configuration completely (parse, validate) before touching
//! anything; a bad file is logged with its file/line/key error and the running
//! configuration stays. A good one is applied in place: pools that remain keep their
//! `Pool` policy state (verdicts, streaks, ejections, fail-open), so a reload never
//! resets target health; new pools and targets start per `new_targets`. Listener
//! addresses and the worker count need a restart (logged when they change).

use crate::access_log::AccessLog;
use crate::admin;
use crate::checker;
use crate::config::{self, LbConfig};
use crate::downstream::admit::Admission;
use crate::downstream::{self, FrontSettings};
use crate::metrics::Metrics;
use crate::park::Park;
use crate::pool::{Clock, PoolRt};
use crate::proxy::{Proxy, ProxyTable, RouteRule};
use crate::share;
use crate::tls::{self, TlsSlot};
use crate::upstream::tls::TargetTls;
use arc_swap::ArcSwap;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use socket2::{Domain, Protocol, Socket, Type};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

/// Tick period of the pools (readmissions after ejections).
const TICK: Duration = Duration::from_millis(100);
/// Time tunnels get to close (a FIN each way) once the drain time ran out.
const CLOSE_GRACE: Duration = Duration::from_millis(500);
/// Latency quantiles (hedge delays) are recomputed every this many ticks (1 s).
const LATENCY_REFRESH_TICKS: u32 = 10;

/// What the data path needs from `config`, with these routes and this access log.
fn proxy_table(
    config: &LbConfig,
    routes: Vec<RouteRule>,
    access_log: Option<AccessLog>,
) -> ProxyTable {
    let t = &config.timeouts;
    ProxyTable {
        routes,
        response_header_timeout: t.response_header,
        per_try_timeout: t.per_try,
        client_deadline: config.headers.deadline,
        send_timeout: t.send,
        response_body_timeout: t.response_body,
        request_timeout: Some(t.request).filter(|d| !d.is_zero()),
        max_retry_body_bytes: config.limits.max_retry_body_bytes,
        client_body_timeout: t.client_header,
        connect_timeout: t.connect,
        idle_timeout: t.idle,
        underscores: config.headers.underscores,
        tunnel_idle_timeout: t.tunnel_idle,
        access_log,
    }
}

/// A writer for `config`'s `[access_log]`, when enabled: a new one for every
/// configuration, so a reload (SIGHUP) opens the file anew (logrotate).
fn start_access_log(config: &LbConfig, metrics: &Metrics) -> Option<AccessLog> {
    let c = &config.access_log;
    if !c.enabled {
        return None;
    }
    match AccessLog::start(
        &c.path,
        c.query,
        c.buffer,
        metrics.access_log_dropped.clone(),
        metrics.access_log_write_errors.clone(),
    ) {
        Ok(log) => Some(log),
        Err(e) => {
            tracing::error!(path = %c.path.display(), "access log off: cannot start its writer thread: {e}");
            None
        }
    }
}

/// The running load balancer.
pub struct Lb {
    clock: Clock,
    metrics: Arc<Metrics>,
    proxy: Arc<Proxy>,
    pools: ArcSwap<BTreeMap<String, Arc<PoolRt>>>,
    config: Mutex<LbConfig>,
    checks: Mutex<Option<watch::Sender<()>>>,
    /// Shared verdicts with peer balancers (`[share]`), and what stops its pollers.
    feed: Option<(Arc<share::Feed>, watch::Sender<()>)>,
    /// Each TLS listener's configuration (certificates), swapped on reload.
    tls: Vec<TlsSlot>,
}

impl Lb {
    /// Builds the balancer and starts its health checks (call inside a runtime).
    /// `tls`: its TLS configurations, listeners and pools ([`tls::load`] of `config`).
    pub fn start(config: LbConfig, tls: tls::Loaded) -> Arc<Lb> {
        let metrics = Arc::new(Metrics::new());
        let proxy = Arc::new(Proxy {
            table: ArcSwap::from_pointee(proxy_table(&config, Vec::new(), None)),
            metrics: metrics.clone(),
        });
        let lb = Arc::new(Lb {
            clock: Clock::new(),
            proxy,
            pools: ArcSwap::from_pointee(BTreeMap::new()),
            config: Mutex::new(config.clone()),
            checks: Mutex::new(None),
            feed: share::Feed::new(&config, metrics.clone()).map(|f| {
                let (tx, rx) = watch::channel(());
                f.spawn_pollers(rx);
                (f, tx)
            }),
            metrics,
            tls: tls
                .listeners
                .into_iter()
                .map(|sc| Arc::new(ArcSwap::new(sc)))
                .collect(),
        });
        lb.apply(config, &tls.pools);
        lb
    }

    /// Applies a validated configuration, keeping the state of pools and targets that
    /// remain; `pools_tls`: the pools' TLS to their targets, read from the same file.
    pub fn apply(&self, config: LbConfig, pools_tls: &BTreeMap<String, Arc<TargetTls>>) {
        let old = self.pools.load_full();
        let mut pools = BTreeMap::new();
        for (name, section) in &config.pools {
            let pool = match old.get(name) {
                Some(p) => {
                    p.reconfigure(section.clone(), pools_tls.get(name).cloned());
                    p.clone()
                }
                None => {
                    tracing::info!(pool = %name, targets = section.targets.len(), "pool created");
                    Arc::new(PoolRt::new(
                        name,
                        section.clone(),
                        pools_tls.get(name).cloned(),
                        self.clock,
                        self.metrics.clone(),
                    ))
                }
            };
            pools.insert(name.clone(), pool);
        }
        for name in old.keys().filter(|n| !pools.contains_key(*n)) {
            tracing::info!(pool = %name, "pool removed");
        }
        let routes = if config.routes.is_empty() {
            // One pool and no routes: everything goes to it (validated).
            pools
                .values()
                .map(|p| RouteRule {
                    host: None,
                    path_prefix: "/".into(),
                    pool: p.clone(),
                })
                .collect()
        } else {
            config
                .routes
                .iter()
                .map(|r| RouteRule {
                    host: r.host.as_ref().map(|h| h.to_ascii_lowercase()),
                    path_prefix: r.path_prefix.clone().unwrap_or_else(|| "/".into()),
                    pool: pools[&r.pool].clone(),
                })
                .collect()
        };
        self.proxy.table.store(Arc::new(proxy_table(
            &config,
            routes,
            start_access_log(&config, &self.metrics),
        )));
        // Restart the checkers on the new settings: their state lives in the pools.
        let (tx, rx) = watch::channel(());
        let feed = self.feed.as_ref().map(|(f, _)| f);
        if let Some(f) = feed {
            f.configure(&config);
        }
        for pool in pools.values() {
            checker::spawn_checks(pool.clone(), config.timeouts.connect, rx.clone(), feed);
        }
        // Dropping the old sender stops the old checkers.
        *self.checks.lock().expect("checks lock") = Some(tx);
        self.pools.store(Arc::new(pools));
        *self.config.lock().expect("config lock") = config;
    }

    /// The pools now.
    pub fn pools(&self) -> Arc<BTreeMap<String, Arc<PoolRt>>> {
        self.pools.load_full()
    }

    /// Reads, validates and applies `path`, certificates included; a bad file (or
    /// certificate) keeps the running configuration.
    pub fn reload(&self, path: &Path) {
        let loaded = config::load(path).map_err(|e| e.to_string()).and_then(|c| {
            tls::load(&c, config_dir(path))
                .map(|t| (c, t))
                .map_err(|e| format!("{}: {e}", path.display()))
        });
        match loaded {
            Err(e) => {
                tracing::error!("reload rejected, the running configuration stays: {e}");
            }
            Ok((new, tls)) => {
                {
                    let cur = self.config.lock().expect("config lock");
                    if cur.listen != new.listen
                        || cur.admin_listen != new.admin_listen
                        || cur.workers != new.workers
                        || cur.worker_slice != new.worker_slice
                        || cur.timeouts.client_header != new.timeouts.client_header
                        || cur.timeouts.client_write != new.timeouts.client_write
                        || cur.timeouts.client_h2_idle != new.timeouts.client_h2_idle
                        || cur.limits.max_header_bytes != new.limits.max_header_bytes
                        || cur.limits.max_client_connections != new.limits.max_client_connections
                    {
                        tracing::warn!(
                            "listen, admin_listen, workers, worker_slice, timeouts.client_header, \
                             timeouts.client_write, timeouts.client_h2_idle, \
                             limits.max_header_bytes and limits.max_client_connections take \
                             effect only after a restart"
                        );
                    }
                    let addrs = |c: &LbConfig| -> Vec<_> {
                        c.tls_listeners
                            .iter()
                            .map(|(n, l)| (n.clone(), l.listen))
                            .collect()
                    };
                    if addrs(&cur) != addrs(&new) {
                        tracing::warn!(
                            "tls_listeners: listeners added, removed or moved take effect only \
                             after a restart; the certificates of the others are reloaded"
                        );
                    }
                    // New handshakes get the new certificates; open connections keep
                    // the session they have.
                    let new_tls: BTreeMap<&String, _> = new
                        .tls_listeners
                        .iter()
                        .zip(&tls.listeners)
                        .map(|((n, l), sc)| (n, (l, sc)))
                        .collect();
                    for (slot, (name, old)) in self.tls.iter().zip(&cur.tls_listeners) {
                        if let Some((l, sc)) = new_tls.get(name)
                            && l.listen == old.listen
                        {
                            slot.store((*sc).clone());
                        }
                    }
                }
                self.apply(new, &tls.pools);
                tracing::info!(config = %path.display(), "configuration reloaded");
            }
        }
    }

    async fn tick_loop(self: Arc<Self>) {
        let mut n = 0u32;
        let mut interval = tokio::time::interval(TICK);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            n = n.wrapping_add(1);
            for pool in self.pools.load().values() {
                pool.tick();
                if n.is_multiple_of(LATENCY_REFRESH_TICKS) {
                    pool.latency.refresh(pool.section.load().hedge.quantile);
                    pool.evict_idle(self.proxy.table.load().idle_timeout);
                }
            }
        }
    }
}

/// Runs the daemon until SIGTERM/SIGINT; returns the process exit code.
///
/// `workers` threads each run a current-thread runtime of their own with a listener of
/// their own on the same address (`SO_REUSEPORT`: the kernel spreads connections), and
/// keep their own idle target connections: share-nothing, like nginx's worker
/// processes, with the routing tables and the policy state shared. This thread runs the
/// control side on a runtime of its own, as Envoy's main thread does: health checks,
/// the tick loop, the admin listener, signals. Traffic that saturates the workers
/// cannot delay a health check into a false failure.
pub fn run(config: LbConfig, path: PathBuf) -> u8 {
    tls::install_crypto_provider();
    let tls = match tls::load(&config, config_dir(&path)) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{}: {e}", path.display());
            return config::EXIT_BAD_CONFIG;
        }
    };
    let workers = match config.workers {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    crate::upstream::set_workers(workers);
    let rt = match current_thread_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("vigil lb: cannot start the runtime: {e}");
            return 1;
        }
    };
    let code = rt.block_on(serve(config, tls, path, workers));
    rt.shutdown_timeout(Duration::from_secs(1));
    code
}

/// The runtime of the control thread and of each worker.
fn current_thread_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("vigil-lb")
        .build()
}

/// `workers` listeners on `addr` (one, plain, for one worker). With a port of 0 the
/// first one's port is shared by the rest.
fn listeners(addr: SocketAddr, workers: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    if workers > 1 && addr.port() != 0 {
        // Sockets that all ask for SO_REUSEPORT share a port, so another process doing
        // the same (a second vigil lb on this address) would silently split the
        // traffic: a plain bind first, to fail as a single listener would.
        let probe = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        probe.set_reuse_address(true)?;
        probe.bind(&addr.into())?;
    }
    let mut out: Vec<std::net::TcpListener> = Vec::with_capacity(workers);
    for _ in 0..workers {
        let at = out.first().map_or(Ok(addr), |l| l.local_addr())?;
        let socket = Socket::new(Domain::for_address(at), Type::STREAM, Some(Protocol::TCP))?;
        socket.set_reuse_address(true)?;
        if workers > 1 {
            socket.set_reuse_port(true)?;
        }
        socket.bind(&at.into())?;
        socket.listen(1024)?;
        socket.set_nonblocking(true)?;
        out.push(socket.into());
    }
    Ok(out)
}

/// The directory relative paths in the configuration file at `path` start from.
pub fn config_dir(path: &Path) -> &Path {
    path.parent().unwrap_or(Path::new("."))
}

/// A worker's listener: its socket, and its TLS configuration if it terminates TLS.
type WorkerListener = (TcpListener, Option<TlsSlot>);

/// A worker thread's runtime with its listeners registered in it: everything that can
/// fail, done before any worker starts.
fn worker_parts(
    std_listeners: Vec<(std::net::TcpListener, Option<TlsSlot>)>,
) -> std::io::Result<(tokio::runtime::Runtime, Vec<WorkerListener>)> {
    let rt = current_thread_runtime()?;
    let listeners = {
        let _in_rt = rt.enter();
        std_listeners
            .into_iter()
            .map(|(l, tls)| Ok((TcpListener::from_std(l)?, tls)))
            .collect::<std::io::Result<Vec<_>>>()?
    };
    Ok((rt, listeners))
}

/// Asks the scheduler to run this worker thread on turns of `slice` (key
/// `worker_slice`; 0 leaves the kernel's default); `log`: say how that went (the first
/// worker does, for all).
///
/// Under load a worker is always runnable and shares its CPU with the clients and
/// targets it wakes. On the kernel's default turn (1.4 ms on two CPUs here) a request
/// that arrives while another process has the CPU waits for that turn to end; on 300
/// us turns the worker is back sooner, for as long as before in all. Measured in
/// docs/lb.md ("Worker slices").
fn ask_for_slice(slice: Duration, log: bool) {
    if slice.is_zero() {
        return;
    }
    let want = humantime::format_duration(slice);
    match vigil_sys::set_thread_slice(slice) {
        Ok(kept) if log => tracing::info!(
            "worker threads run on {} scheduler turns (worker_slice = \"{want}\")",
            humantime::format_duration(kept)
        ),
        Ok(_) => {}
        // An older kernel (before 6.12) or a real-time policy given by the operator.
        Err(e) if log && e.kind() == std::io::ErrorKind::Unsupported => tracing::info!(
            "worker_slice = \"{want}\" not applied, the kernel's default turn stays: {e}"
        ),
        Err(e) if log => tracing::warn!(
            "worker_slice = \"{want}\" not applied, the kernel's default turn stays: {e}"
        ),
        Err(_) => {}
    }
}

/// Warns when the process's open-file limit would refuse connections before
/// `limits.max_client_connections` does: `max x listeners` client connections (and a
/// few descriptors for the rest) must fit, or `accept` fails with EMFILE first. (Each
/// one in flight takes a second for its target; idle ones do not.) Read from
/// `/proc/self/limits`: no system call wrapper needed.
fn warn_if_open_files_run_out_first(max: usize, listeners: usize) {
    let Ok(limits) = std::fs::read_to_string("/proc/self/limits") else {
        return;
    };
    let soft = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse::<usize>().ok());
    let want = max.saturating_mul(listeners).saturating_add(256);
    if let Some(soft) = soft
        && soft < want
    {
        tracing::warn!(
            "the open-file limit ({soft}) is below what limits.max_client_connections = {max} \
             on {listeners} listener(s) needs (about {want}, and one more per request in \
             flight): accept will fail before the limit refuses connections; raise \
             LimitNOFILE (ulimit -n) or lower limits.max_client_connections"
        );
    }
}

/// Accepts connections until `shutdown`, serving each in a task of this runtime (TLS
/// ones after their handshake, in that task).
async fn accept_loop(
    listener: TcpListener,
    tls: Option<TlsSlot>,
    admission: Arc<Admission>,
    proxy: Arc<Proxy>,
    settings: FrontSettings,
    stop: downstream::Stop,
    connections: TaskTracker,
) {
    // Idle plain connections wait here (downstream.rs parks them); TLS ones keep their task.
    let mut park = match tls {
        None => match Park::new(settings.header_timeout) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!("idle connections keep their tasks (no epoll set for them: {e})");
                None
            }
        },
        Some(_) => None,
    };
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stop.drain.cancelled() => return,
            a = listener.accept() => a,
            woken = async { park.as_mut().expect("checked").woken().await }, if park.is_some() => {
                let sender = park.as_ref().expect("checked").sender();
                for (tcp, peer, admitted) in woken {
                    let Ok(tcp) = TcpStream::from_std(tcp) else { continue };
                    connections.spawn(downstream::serve_parkable(
                        tcp,
                        peer,
                        proxy.clone(),
                        settings,
                        stop.clone(),
                        sender.clone(),
                        false,
                        admitted,
                    ));
                }
                continue;
            }
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // EMFILE and friends: back off a little rather than spin.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        crate::worker::share_cpu();
        let Some(admitted) = admission.admit() else {
            connections.spawn(downstream::refuse(
                tcp,
                peer,
                tls.is_some(),
                admission.clone(),
            ));
            continue;
        };
        match (&tls, &park) {
            (None, Some(park)) => connections.spawn(downstream::serve_parkable(
                tcp,
                peer,
                proxy.clone(),
                settings,
                stop.clone(),
                park.sender(),
                true,
                admitted,
            )),
            (None, None) => connections.spawn(downstream::serve_connection(
                crate::body::ClientStream::Plain(tcp),
                peer,
                proxy.clone(),
                settings,
                stop.clone(),
                admitted,
            )),
            (Some(slot), _) => connections.spawn(downstream::serve_tls(
                tcp,
                peer,
                slot.load_full(),
                proxy.clone(),
                settings,
                stop.clone(),
                admitted,
            )),
        };
    }
}

async fn serve(config: LbConfig, tls: tls::Loaded, path: PathBuf, workers: usize) -> u8 {
    // Per worker: the plain listener's socket, then each TLS listener's.
    let mut per_worker: Vec<Vec<std::net::TcpListener>> = match listeners(config.listen, workers) {
        Ok(l) => l.into_iter().map(|l| vec![l]).collect(),
        Err(e) => {
            tracing::error!("cannot listen on {} (key `listen`): {e}", config.listen);
            return 1;
        }
    };
    for (i, l) in &config.tls_listeners {
        let addr = l.listen.expect("validated: a TLS listener has an address");
        match listeners(addr, workers) {
            Ok(ls) => {
                for (w, l) in per_worker.iter_mut().zip(ls) {
                    w.push(l);
                }
            }
            Err(e) => {
                tracing::error!("cannot listen on {addr} (key `tls_listeners.{i}.listen`): {e}");
                return 1;
            }
        }
    }
    let admin_listener = match TcpListener::bind(config.admin_listen).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(
                "cannot listen on {} (key `admin_listen`): {e}",
                config.admin_listen
            );
            return 1;
        }
    };
    let (mut hup, mut term, mut int) = match (
        signal(SignalKind::hangup()),
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(h), Ok(t), Ok(i)) => (h, t, i),
        _ => {
            tracing::error!("cannot install signal handlers");
            return 1;
        }
    };
    let drain_timeout = config.drain_timeout;
    let settings = FrontSettings {
        header_timeout: config.timeouts.client_header,
        max_header_bytes: config.limits.max_header_bytes,
        write_timeout: config.timeouts.client_write,
        h2_idle_timeout: config.timeouts.client_h2_idle,
    };
    let listen = config.listen;
    let worker_slice = config.worker_slice;
    // One count per listener, over every worker: the plain one, then the TLS ones in
    // the order their sockets are in.
    let max_connections = config.limits.max_client_connections;
    let listener_keys: Vec<String> = std::iter::once("listen".to_string())
        .chain(
            config
                .tls_listeners
                .keys()
                .map(|n| format!("tls_listeners.{n}")),
        )
        .collect();
    warn_if_open_files_run_out_first(max_connections, listener_keys.len());
    tracing::info!(
        listen = %config.listen,
        admin = %config.admin_listen,
        pools = config.pools.len(),
        workers,
        "vigil lb started"
    );
    let lb = Lb::start(config, tls);
    let admissions: Vec<Arc<Admission>> = listener_keys
        .iter()
        .map(|k| Admission::new(k, max_connections, &lb.metrics))
        .collect();
    tokio::spawn(lb.clone().tick_loop());
    let admin_task = tokio::spawn(serve_admin(admin_listener, lb.clone()));

    // `drain` is cancelled on SIGTERM: listeners close, connections finish the request
    // in hand and close; `close` when the drain time ran out: tunnels close.
    let stop = downstream::Stop::default();
    let shutdown = stop.drain.clone();
    let connections = TaskTracker::new();
    let mut parts = Vec::with_capacity(per_worker.len());
    for ls in per_worker {
        // The plain listener has no TLS; the others are the TLS listeners in order.
        let slots = std::iter::once(None).chain(lb.tls.iter().cloned().map(Some));
        match worker_parts(ls.into_iter().zip(slots).collect()) {
            Ok(p) => parts.push(p),
            Err(e) => {
                tracing::error!("cannot start a worker ({workers} asked for, key `workers`): {e}");
                return 1;
            }
        }
    }
    let mut threads = Vec::new();
    for (k, (rt, worker_listeners)) in parts.into_iter().enumerate() {
        let (proxy, stop, tracker) = (lb.proxy.clone(), stop.clone(), connections.clone());
        let admissions = admissions.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("vigil-lb-{k}"))
            .spawn(move || {
                crate::upstream::set_worker(k);
                ask_for_slice(worker_slice, k == 0);
                rt.block_on(async {
                    let loops: Vec<_> = worker_listeners
                        .into_iter()
                        .zip(admissions)
                        .map(|((listener, tls), admission)| {
                            tokio::spawn(accept_loop(
                                listener,
                                tls,
                                admission,
                                proxy.clone(),
                                settings,
                                stop.clone(),
                                tracker.clone(),
                            ))
                        })
                        .collect();
                    for l in loops {
                        let _ = l.await;
                    }
                    // This runtime runs its connections' tasks: it stays until they
                    // are done (the tracker is closed by then) or the drain time is up
                    // and its tunnels have had a moment to close.
                    let _ = tokio::time::timeout(drain_timeout + CLOSE_GRACE, tracker.wait()).await;
                });
                rt.shutdown_timeout(Duration::from_millis(100));
            });
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) => {
                tracing::error!("cannot start worker {k} (key `workers`): {e}");
                shutdown.cancel();
                connections.close();
                for t in threads {
                    let _ = t.join();
                }
                return 1;
            }
        }
    }
    let serving = format!("serving on {}", listen);
    vigil_daemon::systemd::ready(&serving);
    let watchdog = tokio::spawn(vigil_daemon::systemd::watchdog());
    loop {
        tokio::select! {
            _ = term.recv() => { tracing::info!("SIGTERM: draining"); break; }
            _ = int.recv() => { tracing::info!("SIGINT: draining"); break; }
            _ = hup.recv() => {
                tracing::info!("SIGHUP: reloading {}", path.display());
                vigil_daemon::systemd::reloading();
                lb.reload(&path);
                vigil_daemon::systemd::ready(&serving);
            }
        }
    }
    vigil_daemon::systemd::stopping();
    watchdog.abort();
    shutdown.cancel();
    connections.close();
    match tokio::time::timeout(drain_timeout, connections.wait()).await {
        Ok(()) => tracing::info!("drained; exiting"),
        Err(_) => {
            tracing::warn!(
                "drain timeout ({}) ran out with requests or tunnels still open; closing \
                 them and exiting",
                humantime::format_duration(drain_timeout)
            );
            stop.close.cancel();
            let _ = tokio::time::timeout(CLOSE_GRACE, connections.wait()).await;
        }
    }
    for t in threads {
        let _ = t.join();
    }
    admin_task.abort();
    0
}

async fn serve_admin(listener: TcpListener, lb: Arc<Lb>) {
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!("admin accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let lb = lb.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let lb = lb.clone();
                async move {
                    let pools = lb.pools();
                    let feed = lb.feed.as_ref().map(|(f, _)| &**f);
                    Ok::<_, Infallible>(admin::handle(&req, &pools, &lb.metrics, feed).await)
                }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_share_one_port_even_when_it_is_chosen_by_the_system() {
        let ls = listeners("127.0.0.1:0".parse().unwrap(), 3).unwrap();
        assert_eq!(ls.len(), 3);
        let port = ls[0].local_addr().unwrap().port();
        assert_ne!(port, 0);
        for l in &ls {
            assert_eq!(l.local_addr().unwrap().port(), port);
        }
        // Every connection lands on one of them (the kernel spreads them).
        let clients: Vec<_> = (0..12)
            .map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).unwrap())
            .collect();
        let mut accepted = 0;
        for l in &ls {
            // Non-blocking already (tokio takes them over as they are).
            while l.accept().is_ok() {
                accepted += 1;
            }
        }
        assert_eq!(accepted, clients.len());
    }

    #[test]
    fn one_worker_gets_one_plain_listener_and_a_taken_port_is_an_error() {
        let ls = listeners("127.0.0.1:0".parse().unwrap(), 1).unwrap();
        assert_eq!(ls.len(), 1);
        let taken = ls[0].local_addr().unwrap();
        assert!(listeners(taken, 1).is_err(), "{taken} is in use");
        assert!(
            listeners(taken, 2).is_err(),
            "reuseport needs every socket to ask"
        );
    }

    #[test]
    fn a_second_group_of_workers_cannot_share_a_port_already_served() {
        let group = listeners("127.0.0.1:0".parse().unwrap(), 2).unwrap();
        let taken = group[0].local_addr().unwrap();
        let err = listeners(taken, 2).expect_err("a second vigil lb on the same address");
        assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse, "{err}");
    }
}
