//! Benchmark (not a test): `vigil controller` probing a large fake fleet.
//!
//! A fake fleet in this process answers health+json on 100 ports bound to 0.0.0.0 and
//! is addressed as 127.0.0.1..127.0.0.N, so every target is a distinct host:port with
//! its own pooled connection, while this process needs only 100 listening sockets.
//! The controller runs as its own process, pinned to one core with `taskset`, probing
//! every target at the configured interval. After a warm-up, the benchmark samples the
//! controller's `/metrics` and `/proc` over the measuring window and prints achieved
//! probes/s, scheduling lag p99 (from the lag histogram's buckets), CPU and memory per
//! target.
//!
//! With `--blackbox /usr/bin/prometheus-blackbox-exporter` the Prometheus blackbox
//! exporter then probes the same fleet, pinned to the same core with `GOMAXPROCS=1`,
//! driven closed-loop by `/probe` requests from this process; its own CPU is read from
//! `/proc/<pid>/stat` (the driver's is not counted), and the ratios are printed.
//!
//! ```sh
//! bench/controller/run.sh            # builds, runs both, prints figures and ratios
//! cargo build --release -p vigil-cli --bin vigil
//! cargo build --release -p vigil-controller --example controller_bench
//! target/release/examples/controller_bench --targets 10000 --interval 500ms --seconds 30 \
//!     --core 1 --blackbox /usr/bin/prometheus-blackbox-exporter
//! ```
//!
//! With `--readers N` it measures instead what reading the API costs probing: after the
//! warm-up, an idle window (nobody reads), then a loaded window with N clients in this
//! process looping on the API (`--read-mix`: `list` = `GET /api/targets` as is, `walk` =
//! every page of it with `?limit=1000&after=`, `mixed` = list, a filtered list, the
//! dashboard, the guard, the decision log and one target in turn), then a cool-down
//! with no reader; it prints each window's probes/s, failed probes (the fleet never
//! fails: each one is false), schedule lag, CPU and RSS side by side, and the ratios.
//! `bench/controller/load.sh` runs it.
//!
//! Needs `ulimit -n` above the target count (each target is a connection on both sides).

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Ports the fake fleet listens on.
const PORTS: usize = 100;
/// The health answer of every fake target.
const BODY: &str = r#"{"status":"pass","checks":{"disk:free":[{"status":"pass"}]}}"#;

struct Opts {
    targets: usize,
    interval: Duration,
    seconds: u64,
    warmup: u64,
    vigil: PathBuf,
    core: String,
    keep_alive: bool,
    /// The blackbox exporter binary to measure beside vigil (None: vigil only).
    blackbox: Option<PathBuf>,
    /// Concurrent `/probe` requests the blackbox driver keeps in flight.
    blackbox_concurrency: usize,
    /// Also run the same controller with one target, for the marginal memory per target.
    baseline: bool,
    /// How long that baseline controller runs before its memory is read.
    baseline_seconds: u64,
    /// API readers looping during a loaded window (0: the probing benchmark instead).
    readers: usize,
    /// What they read: `list`, `walk` or `mixed`.
    read_mix: String,
    /// Seconds without readers after the loaded window, before RSS is read again.
    cooldown: u64,
}

fn opts() -> Opts {
    let mut o = Opts {
        targets: 10_000,
        interval: Duration::from_secs(1),
        seconds: 60,
        warmup: 10,
        vigil: PathBuf::from("target/release/vigil"),
        core: "0".into(),
        keep_alive: true,
        blackbox: None,
        blackbox_concurrency: 64,
        baseline: true,
        baseline_seconds: 5,
        readers: 0,
        read_mix: "list".into(),
        cooldown: 10,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut v = || it.next().cloned().expect("a value after the flag");
        match a.as_str() {
            "--targets" => o.targets = v().parse().expect("--targets N"),
            "--interval" => o.interval = humantime::parse_duration(&v()).expect("--interval 1s"),
            "--seconds" => o.seconds = v().parse().expect("--seconds N"),
            "--warmup" => o.warmup = v().parse().expect("--warmup N"),
            "--vigil" => o.vigil = PathBuf::from(v()),
            "--core" => o.core = v(),
            "--no-keep-alive" => o.keep_alive = false,
            "--no-baseline" => o.baseline = false,
            "--baseline-seconds" => o.baseline_seconds = v().parse().expect("--baseline-seconds N"),
            "--blackbox" => o.blackbox = Some(PathBuf::from(v())),
            "--readers" => o.readers = v().parse().expect("--readers N"),
            "--read-mix" => o.read_mix = v(),
            "--cooldown" => o.cooldown = v().parse().expect("--cooldown N"),
            "--blackbox-concurrency" => {
                o.blackbox_concurrency = v().parse().expect("--blackbox-concurrency N")
            }
            other => panic!("unknown flag {other}"),
        }
    }
    o
}

fn fleet(ports: &[u16]) {
    let ports = ports.to_vec();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("fleet runtime");
        rt.block_on(async move {
            for port in ports {
                let l = tokio::net::TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], port)))
                    .await
                    .expect("bind fleet port");
                tokio::spawn(async move {
                    loop {
                        let Ok((s, _)) = l.accept().await else {
                            continue;
                        };
                        let _ = s.set_nodelay(true);
                        tokio::spawn(async move {
                            let svc = service_fn(|_req| async {
                                Ok::<_, Infallible>(
                                    hyper::Response::builder()
                                        .header("content-type", "application/health+json")
                                        .body(Full::new(Bytes::from_static(BODY.as_bytes())))
                                        .expect("response"),
                                )
                            });
                            let _ = http1::Builder::new()
                                .serve_connection(TokioIo::new(s), svc)
                                .await;
                        });
                    }
                });
            }
            std::future::pending::<()>().await;
        });
    });
}

fn free_ports(n: usize) -> Vec<u16> {
    let ls: Vec<_> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("probe a free port"))
        .collect();
    ls.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn lag_buckets(text: &str) -> Vec<(f64, f64)> {
    buckets(text, "vigil_controller_schedule_lag_seconds_bucket")
}

/// A histogram's cumulative buckets (summed over its label sets), by upper bound.
fn buckets(text: &str, name: &str) -> Vec<(f64, f64)> {
    let mut out: Vec<(f64, f64)> = Vec::new();
    for (le, n) in raw_buckets(text, name) {
        match out.iter_mut().find(|(l, _)| *l == le) {
            Some(b) => b.1 += n,
            None => out.push((le, n)),
        }
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// The upper bound of the bucket holding quantile `q` of the difference of two
/// snapshots of a histogram.
fn quantile_between(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> f64 {
    let delta: Vec<(f64, f64)> = after
        .iter()
        .map(|a| {
            let b = before.iter().find(|b| b.0 == a.0).map_or(0.0, |b| b.1);
            (a.0, a.1 - b)
        })
        .collect();
    let total = delta.last().map_or(0.0, |d| d.1);
    delta
        .iter()
        .find(|(_, n)| *n >= q * total)
        .map_or(f64::NAN, |d| d.0)
}

fn raw_buckets(text: &str, name: &str) -> Vec<(f64, f64)> {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect()
}

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("proc stat");
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// A process's memory now, KiB (from `/proc/<pid>/status`).
struct Memory {
    /// Resident set.
    rss: u64,
    /// Resident anonymous memory (heap, stacks).
    anon: u64,
    /// Resident file-backed pages (the mapped binary and libraries).
    file: u64,
    /// Peak resident set since start (VmHWM).
    peak: u64,
}

fn memory(pid: u32) -> Memory {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or(0)
    };
    Memory {
        rss: field("VmRSS:"),
        anon: field("RssAnon:"),
        file: field("RssFile:") + field("RssShmem:"),
        peak: field("VmHWM:"),
    }
}

fn rss_kib(pid: u32) -> u64 {
    memory(pid).rss
}

/// Writes the fleet's config and targets under `dir` and starts `vigil controller`
/// pinned to the measured core. Returns the child, its pid and its base URL.
fn start_controller(
    o: &Opts,
    dir: &std::path::Path,
    targets: &[serde_json::Value],
) -> (std::process::Child, u32, String) {
    std::fs::write(
        dir.join("targets.json"),
        serde_json::to_string(targets).unwrap(),
    )
    .unwrap();
    let listen = free_ports(1)[0];
    std::fs::write(
        dir.join("fleet.toml"),
        format!(
            "listen = \"127.0.0.1:{listen}\"\ndata_dir = \"data\"\n[probe]\ninterval = \"{}\"\ntimeout = \"2s\"\nconcurrency = 1024\nkeep_alive = {}\n[guard]\ngrace = \"0s\"\n[discovery]\npath = \"targets.json\"\n",
            humantime::format_duration(o.interval),
            o.keep_alive
        ),
    )
    .unwrap();
    let child = Command::new("taskset")
        .args(["-c", &o.core])
        .arg(&o.vigil)
        .args(["controller", "-c"])
        .arg(dir.join("fleet.toml"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn taskset vigil controller");
    let pid = child.id();
    (child, pid, format!("http://127.0.0.1:{listen}"))
}

fn wait_live(base: &str) {
    let started = Instant::now();
    while reqwest_ok(&format!("{base}/livez")).is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "controller did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn stop(child: &mut std::process::Child, pid: u32) {
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = child.wait();
}

fn get(url: &str) -> String {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        reqwest::get(url)
            .await
            .expect("GET")
            .text()
            .await
            .expect("body")
    })
}

/// The cores in a `taskset -c` list (`1`, `0,2`, `1-3`).
fn cores(list: &str) -> Vec<usize> {
    list.split(',')
        .flat_map(|part| match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().expect("core"), b.parse().expect("core"));
                (a..=b).collect::<Vec<_>>()
            }
            None => vec![part.parse().expect("core")],
        })
        .collect()
}

/// Pins this process (the fake fleet, the blackbox driver) to every core but the
/// measured ones, before any thread starts, so the threads it spawns inherit it and the
/// prober's core runs the prober alone. Returns the cores it kept (empty: not pinned).
fn pin_self_away_from(measured: &str) -> String {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    let taken = cores(measured);
    let others: Vec<String> = (0..n)
        .filter(|c| !taken.contains(c))
        .map(|c| c.to_string())
        .collect();
    if others.is_empty() {
        eprintln!("warning: no core left for the fake fleet; it shares the prober's core");
        return String::new();
    }
    let list = others.join(",");
    let ok = Command::new("taskset")
        .args(["-p", "-c", &list, &std::process::id().to_string()])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("warning: could not pin the fake fleet to cores {list}");
        return String::new();
    }
    list
}

fn main() {
    let o = opts();
    let fleet_cores = pin_self_away_from(&o.core);
    let ports = free_ports(PORTS);
    fleet(&ports);
    let dir = tempfile::tempdir().expect("tempdir");
    let targets: Vec<serde_json::Value> = (0..o.targets)
        .map(|i| {
            let host = format!("127.0.{}.{}", 1 + (i / PORTS) / 250, 1 + (i / PORTS) % 250);
            serde_json::json!({
                "id": format!("t{i}"),
                "url": format!("http://{host}:{}", ports[i % PORTS]),
                "zone": format!("z{}", i % 3),
            })
        })
        .collect();
    // The same controller with one target: its memory is what N targets add to.
    let (base_rss, base_mem) = if o.baseline {
        let base_dir = tempfile::tempdir().expect("tempdir");
        let (mut child, pid, base) = start_controller(&o, base_dir.path(), &targets[..1]);
        wait_live(&base);
        std::thread::sleep(Duration::from_secs(o.baseline_seconds));
        let mem = memory(pid);
        stop(&mut child, pid);
        eprintln!(
            "baseline: the same controller with 1 target: rss {} KiB (anon {}, file {})",
            mem.rss, mem.anon, mem.file
        );
        (Some(mem.rss), Some(mem))
    } else {
        (None, None)
    };
    let (mut child, pid, base) = start_controller(&o, dir.path(), &targets);
    wait_live(&base);
    eprintln!(
        "controller pid {pid} on core {}; warming up {} s",
        o.core, o.warmup
    );
    std::thread::sleep(Duration::from_secs(o.warmup));
    if o.readers > 0 {
        load(&o, &base, pid, &fleet_cores);
        stop(&mut child, pid);
        return;
    }
    let m0 = get(&format!("{base}/metrics"));
    let (t0, c0) = (Instant::now(), cpu_ticks(pid));
    std::thread::sleep(Duration::from_secs(o.seconds));
    let m1 = get(&format!("{base}/metrics"));
    let (wall, c1) = (t0.elapsed().as_secs_f64(), cpu_ticks(pid));
    let mem = memory(pid);
    let probes =
        metric(&m1, "vigil_controller_probes_total") - metric(&m0, "vigil_controller_probes_total");
    let failed = metric(&m1, "vigil_controller_probes_total{result=\"fail\"}")
        - metric(&m0, "vigil_controller_probes_total{result=\"fail\"}");
    let (b0, b1) = (lag_buckets(&m0), lag_buckets(&m1));
    let delta: Vec<(f64, f64)> = b1.iter().zip(&b0).map(|(a, b)| (a.0, a.1 - b.1)).collect();
    let total = delta.last().map_or(0.0, |d| d.1);
    let quantile = |q: f64| {
        delta
            .iter()
            .find(|(_, n)| *n >= q * total)
            .map_or(f64::NAN, |d| d.0)
    };
    let (p50, p99, p999) = (quantile(0.5), quantile(0.99), quantile(0.999));
    let (d0, d1) = (
        buckets(&m0, "vigil_controller_probe_duration_seconds_bucket"),
        buckets(&m1, "vigil_controller_probe_duration_seconds_bucket"),
    );
    let (dur50, dur99) = (
        quantile_between(&d0, &d1, 0.5),
        quantile_between(&d0, &d1, 0.99),
    );
    let cpu = (c1 - c0) as f64 / HZ / wall;
    stop(&mut child, pid);
    let vigil = Figures {
        probes_per_s: probes / wall,
        cpu,
        rss_kib: mem.rss,
    };
    println!(
        "== vigil controller (pinned to core {}; fake fleet and drivers on core(s) {}) ==",
        o.core,
        if fleet_cores.is_empty() {
            "any (NOT pinned away)"
        } else {
            &fleet_cores
        }
    );
    println!("targets            {}", o.targets);
    println!(
        "interval           {}",
        humantime::format_duration(o.interval)
    );
    println!(
        "window             {wall:.1} s after {} s warm-up",
        o.warmup
    );
    println!(
        "probes/s           {:.0} (scheduled {:.0}); failed {:.0}",
        probes / wall,
        o.targets as f64 / o.interval.as_secs_f64(),
        failed
    );
    println!(
        "schedule lag       p50 <= {} ms, p99 <= {} ms, p99.9 <= {} ms (upper bounds of the lag histogram's buckets)",
        p50 * 1e3,
        p99 * 1e3,
        p999 * 1e3
    );
    println!(
        "probe duration     p50 <= {} ms, p99 <= {} ms (the fake fleet's answer time as the controller sees it: a slow fleet shows here)",
        dur50 * 1e3,
        dur99 * 1e3
    );
    vigil.print(o.targets);
    println!(
        "rss split          anon {} KiB, file-backed {} KiB (the mapped binary and libraries); peak rss {} KiB (VmHWM, since start)",
        mem.anon, mem.file, mem.peak
    );
    if let (Some(b), Some(bm)) = (base_rss, &base_mem) {
        let n = o.targets.saturating_sub(1).max(1) as f64;
        println!(
            "marginal memory    {:.0} bytes per target = (rss {} KiB - rss {} KiB of the same controller with 1 target) / {} (anon only: {:.0} bytes per target; peak: {:.0} bytes per target)",
            (mem.rss as f64 - b as f64) * 1024.0 / n,
            mem.rss,
            b,
            o.targets - 1,
            (mem.anon as f64 - bm.anon as f64) * 1024.0 / n,
            (mem.peak as f64 - bm.peak as f64) * 1024.0 / n,
        );
    }
    let Some(bb) = &o.blackbox else { return };
    let urls: Vec<String> = targets
        .iter()
        .map(|t| format!("{}/health", t["url"].as_str().expect("url")))
        .collect();
    let peer = blackbox(&o, bb, dir.path(), &urls);
    println!();
    println!(
        "== prometheus-blackbox-exporter (pinned to core {}, GOMAXPROCS=1, driven by {} concurrent /probe requests from this process) ==",
        o.core, o.blackbox_concurrency
    );
    println!(
        "probes/s           {:.0} (closed loop: as fast as it answers); failed {}",
        peer.figures.probes_per_s, peer.failed
    );
    peer.figures.print(o.targets);
    println!();
    println!("== ratios (vigil / blackbox exporter) ==");
    println!(
        "CPU per probe      {:.2}x",
        vigil.us_per_probe() / peer.figures.us_per_probe()
    );
    println!(
        "probes/s per core  {:.2}x",
        vigil.per_core() / peer.figures.per_core()
    );
    println!(
        "memory per target  {:.2}x (the exporter keeps no per-target state: Prometheus holds the targets and the schedule)",
        vigil.rss_kib as f64 / peer.figures.rss_kib as f64
    );
}

/// USER_HZ on Linux: the unit of `/proc/<pid>/stat` CPU times.
const HZ: f64 = 100.0;

/// What one prober achieved.
struct Figures {
    probes_per_s: f64,
    /// Cores used on average.
    cpu: f64,
    rss_kib: u64,
}

impl Figures {
    fn us_per_probe(&self) -> f64 {
        self.cpu * 1e6 / self.probes_per_s
    }

    /// Probes one fully used core would sustain at this CPU cost.
    fn per_core(&self) -> f64 {
        1e6 / self.us_per_probe()
    }

    fn print(&self, targets: usize) {
        println!(
            "cpu                {:.2} cores ({:.1} us per probe)",
            self.cpu,
            self.us_per_probe()
        );
        println!("probes/s per core  {:.0} (budget 20000)", self.per_core());
        println!(
            "rss                {} KiB = {:.2} KiB per target (budget 2)",
            self.rss_kib,
            self.rss_kib as f64 / targets as f64
        );
    }
}

struct Peer {
    figures: Figures,
    failed: u64,
}

/// Runs the blackbox exporter on the same core against the same fleet, driven by
/// `/probe` requests from this process (the driver's own CPU is not counted: the
/// exporter's CPU is read from `/proc/<pid>/stat`).
fn blackbox(o: &Opts, bin: &PathBuf, dir: &std::path::Path, urls: &[String]) -> Peer {
    let listen = free_ports(1)[0];
    let config = dir.join("blackbox.yml");
    // The closest module to vigil's probe: GET, 200 or 503, and a health status in
    // the body (the exporter cannot parse health+json; a regexp stands in for it).
    std::fs::write(
        &config,
        "modules:\n  health:\n    prober: http\n    timeout: 2s\n    http:\n      preferred_ip_protocol: ip4\n      valid_status_codes: [200, 503]\n      fail_if_body_not_matches_regexp: ['\"status\": ?\"(pass|warn)\"']\n",
    )
    .expect("write blackbox.yml");
    let mut child = Command::new("taskset")
        .args(["-c", &o.core])
        .arg(bin)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--web.listen-address=127.0.0.1:{listen}"))
        .arg("--log.level=warn")
        .env("GOMAXPROCS", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn taskset prometheus-blackbox-exporter");
    let pid = child.id();
    let base = format!("http://127.0.0.1:{listen}");
    let started = Instant::now();
    while reqwest_ok(&format!("{base}/-/healthy")).is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "blackbox exporter did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "blackbox exporter pid {pid} on core {}; warming up {} s",
        o.core, o.warmup
    );
    let probe_urls: Vec<String> = urls
        .iter()
        .map(|u| format!("{base}/probe?module=health&target={u}"))
        .collect();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let failed = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let driver = {
        let (done, failed, stop) = (done.clone(), failed.clone(), stop.clone());
        let k = o.blackbox_concurrency;
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("driver runtime");
            rt.block_on(async move {
                let client = reqwest::Client::new();
                let urls = std::sync::Arc::new(probe_urls);
                let mut tasks = Vec::new();
                for w in 0..k {
                    let (client, urls) = (client.clone(), urls.clone());
                    let (done, failed, stop) = (done.clone(), failed.clone(), stop.clone());
                    tasks.push(tokio::spawn(async move {
                        let mut i = w;
                        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                            let ok = match client.get(&urls[i % urls.len()]).send().await {
                                Ok(r) => r
                                    .text()
                                    .await
                                    .is_ok_and(|t| t.contains("\nprobe_success 1")),
                                Err(_) => false,
                            };
                            done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if !ok {
                                failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                            i += k;
                        }
                    }));
                }
                for t in tasks {
                    let _ = t.await;
                }
            });
        })
    };
    std::thread::sleep(Duration::from_secs(o.warmup));
    let (t0, c0) = (Instant::now(), cpu_ticks(pid));
    let (n0, f0) = (
        done.load(std::sync::atomic::Ordering::Relaxed),
        failed.load(std::sync::atomic::Ordering::Relaxed),
    );
    std::thread::sleep(Duration::from_secs(o.seconds));
    let (wall, c1) = (t0.elapsed().as_secs_f64(), cpu_ticks(pid));
    let (n1, f1) = (
        done.load(std::sync::atomic::Ordering::Relaxed),
        failed.load(std::sync::atomic::Ordering::Relaxed),
    );
    let rss = rss_kib(pid);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = driver.join();
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = child.wait();
    Peer {
        figures: Figures {
            probes_per_s: (n1 - n0) as f64 / wall,
            cpu: (c1 - c0) as f64 / HZ / wall,
            rss_kib: rss,
        },
        failed: f1 - f0,
    }
}

fn reqwest_ok(url: &str) -> Option<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    rt.block_on(async {
        reqwest::get(url)
            .await
            .ok()?
            .status()
            .is_success()
            .then_some(())
    })
}

// === reading the API while probing (--readers) ===

/// One measuring window of the controller.
struct Window {
    wall: f64,
    probes_per_s: f64,
    failed: f64,
    lag_p99: f64,
    lag_p999: f64,
    /// Probe duration p99 (the fake fleet's answer time as the controller sees it).
    duration_p99: f64,
    cpu: f64,
    mem: Memory,
    /// The largest RSS seen in the window (sampled every 200 ms), KiB.
    max_rss: u64,
    /// Time the controller's threads were runnable but waiting for a CPU, per second
    /// (other processes on its core: the machine is shared).
    run_wait: f64,
}

/// Nanoseconds the process's threads spent waiting on a run queue
/// (`/proc/<pid>/task/*/schedstat`, second field), summed.
fn run_wait_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

/// Measures the controller over `seconds` from now.
fn window(base: &str, pid: u32, seconds: u64) -> Window {
    let m0 = get(&format!("{base}/metrics"));
    let (t0, c0, w0) = (Instant::now(), cpu_ticks(pid), run_wait_ns(pid));
    let mut max_rss = 0;
    while t0.elapsed() < Duration::from_secs(seconds) {
        max_rss = max_rss.max(rss_kib(pid));
        std::thread::sleep(Duration::from_millis(200));
    }
    let m1 = get(&format!("{base}/metrics"));
    let (wall, c1) = (t0.elapsed().as_secs_f64(), cpu_ticks(pid));
    let fail = "vigil_controller_probes_total{result=\"fail\"}";
    let (b0, b1) = (lag_buckets(&m0), lag_buckets(&m1));
    Window {
        wall,
        probes_per_s: (metric(&m1, "vigil_controller_probes_total")
            - metric(&m0, "vigil_controller_probes_total"))
            / wall,
        failed: metric(&m1, fail) - metric(&m0, fail),
        lag_p99: quantile_between(&b0, &b1, 0.99),
        lag_p999: quantile_between(&b0, &b1, 0.999),
        duration_p99: quantile_between(
            &buckets(&m0, "vigil_controller_probe_duration_seconds_bucket"),
            &buckets(&m1, "vigil_controller_probe_duration_seconds_bucket"),
            0.99,
        ),
        cpu: (c1 - c0) as f64 / HZ / wall,
        mem: memory(pid),
        max_rss,
        run_wait: run_wait_ns(pid).saturating_sub(w0) as f64 / 1e9 / wall,
    }
}

/// What the readers did.
#[derive(Default)]
struct Reads {
    ok: u64,
    refused: u64,
    other: u64,
    errors: u64,
    bytes: u64,
    /// Latencies of answered reads (ms).
    latencies: Vec<f64>,
}

/// The URLs one round of `mix` reads (a `walk` follows `next_after` itself).
fn mix_urls(base: &str, mix: &str, reader: usize) -> Vec<String> {
    match mix {
        "list" | "walk" => vec![format!("{base}/api/targets")],
        "mixed" => vec![
            format!("{base}/api/targets"),
            format!("{base}/api/targets?state=failing,unhealthy"),
            format!("{base}/"),
            format!("{base}/api/guard"),
            format!("{base}/api/decisions"),
            format!("{base}/api/targets/t{reader}"),
        ],
        other => panic!("unknown --read-mix {other} (list, walk, mixed)"),
    }
}

/// `readers` clients looping on the API until `stop`, each on its own thread and
/// connection.
fn readers(
    o: &Opts,
    base: &str,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<std::thread::JoinHandle<Reads>> {
    (0..o.readers)
        .map(|r| {
            let (base, mix, stop) = (base.to_string(), o.read_mix.clone(), stop.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("reader runtime");
                rt.block_on(async move {
                    let client = reqwest::Client::builder()
                        .timeout(Duration::from_secs(30))
                        .build()
                        .expect("client");
                    let mut reads = Reads::default();
                    let urls = mix_urls(&base, &mix, r);
                    let mut next: Option<String> = None;
                    let mut i = 0;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let url = match (&next, mix.as_str()) {
                            (Some(after), "walk") => {
                                format!("{base}/api/targets?limit=1000&after={after}")
                            }
                            (None, "walk") => format!("{base}/api/targets?limit=1000"),
                            _ => urls[i % urls.len()].clone(),
                        };
                        i += 1;
                        let t0 = Instant::now();
                        match client.get(&url).send().await {
                            Ok(r) => {
                                let status = r.status().as_u16();
                                match r.bytes().await {
                                    Ok(body) => {
                                        reads.bytes += body.len() as u64;
                                        if mix == "walk" && status == 200 {
                                            next = next_after(&body);
                                        }
                                    }
                                    Err(_) => reads.errors += 1,
                                }
                                match status {
                                    200 => {
                                        reads.ok += 1;
                                        reads.latencies.push(t0.elapsed().as_secs_f64() * 1e3);
                                    }
                                    503 => reads.refused += 1,
                                    _ => reads.other += 1,
                                }
                            }
                            Err(_) => reads.errors += 1,
                        }
                    }
                    reads
                })
            })
        })
        .collect()
}

/// A page's `next_after`, found from its end (the page's last field) without parsing
/// the page: the readers share their core with the fake fleet, which must stay fast.
fn next_after(body: &[u8]) -> Option<String> {
    let key = b"\"next_after\":";
    let at = body.windows(key.len()).rposition(|w| w == key)? + key.len();
    let rest = std::str::from_utf8(&body[at..]).ok()?;
    let v: serde_json::Value = serde_json::from_str(rest.trim_end().strip_suffix('}')?).ok()?;
    v.as_str().map(String::from)
}

fn pct_of(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// Idle window, loaded window (readers looping), cool-down: figures side by side.
fn load(o: &Opts, base: &str, pid: u32, fleet_cores: &str) {
    eprintln!("idle window: {} s", o.seconds);
    let idle = window(base, pid, o.seconds);
    eprintln!(
        "loaded window: {} readers ({}) for {} s",
        o.readers, o.read_mix, o.seconds
    );
    let stop_readers = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let handles = readers(o, base, stop_readers.clone());
    let loaded = window(base, pid, o.seconds);
    stop_readers.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut reads = Reads::default();
    for h in handles {
        let r = h.join().expect("reader thread");
        reads.ok += r.ok;
        reads.refused += r.refused;
        reads.other += r.other;
        reads.errors += r.errors;
        reads.bytes += r.bytes;
        reads.latencies.extend(r.latencies);
    }
    reads.latencies.sort_by(f64::total_cmp);
    eprintln!("cool-down: {} s without readers", o.cooldown);
    let after = window(base, pid, o.cooldown);
    println!(
        "== reading the API while probing: {} targets every {}, controller on core {}, {} readers ({}) on core(s) {} ==",
        o.targets,
        humantime::format_duration(o.interval),
        o.core,
        o.readers,
        o.read_mix,
        if fleet_cores.is_empty() {
            "any"
        } else {
            fleet_cores
        }
    );
    println!(
        "{:<22} {:>12} {:>12} {:>12} {:>14}",
        "", "idle", "loaded", "loaded/idle", "after (no reads)"
    );
    let row = |name: &str, a: f64, b: f64, c: f64, unit: &str| {
        println!(
            "{name:<22} {:>12} {:>12} {:>12} {:>14}",
            format!("{a:.0}{unit}"),
            format!("{b:.0}{unit}"),
            format!("{:.2}", b / a),
            format!("{c:.0}{unit}"),
        );
    };
    row(
        "probes/s",
        idle.probes_per_s,
        loaded.probes_per_s,
        after.probes_per_s,
        "",
    );
    println!(
        "{:<22} {:>12} {:>12} {:>12} {:>14}",
        "failed probes (false)", idle.failed, loaded.failed, "", after.failed
    );
    row(
        "schedule lag p99 <=",
        idle.lag_p99 * 1e3,
        loaded.lag_p99 * 1e3,
        after.lag_p99 * 1e3,
        " ms",
    );
    row(
        "schedule lag p99.9 <=",
        idle.lag_p999 * 1e3,
        loaded.lag_p999 * 1e3,
        after.lag_p999 * 1e3,
        " ms",
    );
    row(
        "probe duration p99 <=",
        idle.duration_p99 * 1e3,
        loaded.duration_p99 * 1e3,
        after.duration_p99 * 1e3,
        " ms",
    );
    println!(
        "{:<22} {:>12} {:>12} {:>12} {:>14}",
        "controller cpu",
        format!("{:.2}", idle.cpu),
        format!("{:.2}", loaded.cpu),
        format!("{:.2}", loaded.cpu / idle.cpu),
        format!("{:.2}", after.cpu)
    );
    println!(
        "{:<22} {:>12} {:>12} {:>12} {:>14}",
        "waiting for a cpu",
        format!("{:.2}", idle.run_wait),
        format!("{:.2}", loaded.run_wait),
        "",
        format!("{:.2}", after.run_wait)
    );
    row(
        "rss (KiB)",
        idle.mem.rss as f64,
        loaded.mem.rss as f64,
        after.mem.rss as f64,
        "",
    );
    row(
        "max rss seen (KiB)",
        idle.max_rss as f64,
        loaded.max_rss as f64,
        after.max_rss as f64,
        "",
    );
    row(
        "peak rss since start",
        idle.mem.peak as f64,
        loaded.mem.peak as f64,
        after.mem.peak as f64,
        " KiB",
    );
    let secs = loaded.wall;
    println!(
        "reads                  {:.0}/s answered, {:.0}/s refused (503), {:.0}/s other status, {} errors; {:.1} MB/s read; answered in p50 {:.1} ms, p99 {:.1} ms",
        reads.ok as f64 / secs,
        reads.refused as f64 / secs,
        reads.other as f64 / secs,
        reads.errors,
        reads.bytes as f64 / secs / 1e6,
        pct_of(&reads.latencies, 0.5),
        pct_of(&reads.latencies, 0.99),
    );
    println!(
        "budget                 probes/s loaded/idle {:.2} (>= 0.90: {}), false probe failures {} (0: {}), largest rss seen loaded or after / idle {:.2} (< 2: {})",
        loaded.probes_per_s / idle.probes_per_s,
        if loaded.probes_per_s >= 0.9 * idle.probes_per_s {
            "met"
        } else {
            "NOT met"
        },
        loaded.failed + after.failed,
        if loaded.failed + after.failed == 0.0 {
            "met"
        } else {
            "NOT met"
        },
        loaded.max_rss.max(after.max_rss) as f64 / idle.mem.rss as f64,
        if (loaded.max_rss.max(after.max_rss) as f64) < 2.0 * idle.mem.rss as f64 {
            "met"
        } else {
            "NOT met"
        },
    );
}
