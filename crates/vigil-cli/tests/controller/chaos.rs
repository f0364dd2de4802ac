//! The fault loop: three `vigil controller` replicas on one PostgreSQL schema, twenty
//! targets of the test's own failing one after another (a rolling failure the guard
//! acts on through an exec actuator that appends to a log), then at least 30 faults
//! chosen at random with a seeded generator (the seed is printed; `VIGIL_CHAOS_SEED`
//! replays a run): SIGKILL the leader and restart it, SIGSTOP the leader past its TTL
//! and SIGCONT it later, or cut one replica off from PostgreSQL.
//!
//! Checked afterwards, from the store and the actuator's log:
//! - no failure was acted on under two keys (one action per failure of a target, and
//!   none on a target that was not failing); a key run more than once only as the
//!   idempotency contract allows (docs/controller.md, "Acting": a re-run carries the
//!   same key and is counted in `attempts`);
//! - every action's epoch was the lease's epoch when it committed (an audit trigger of
//!   the test's own on `actions` reads the lease row inside the committing transaction),
//!   and epochs never go back in commit order;
//! - the budget was never exceeded in any window, across failovers;
//! - nothing was acted on while the fleet was frozen (8 of 20 failing at once);
//! - a replica brought back (restarted, continued, reconnected) rejoins the probing.
//!
//! The cut: replica `r2` runs inside a network namespace the test creates (as root:
//! `ip netns add`, two veth pairs). PostgreSQL listens on 127.0.0.1 only, which a
//! namespace cannot reach, so the test relays: a TCP relay in this process listens on
//! the host end of the "db" veth and forwards to 127.0.0.1:5432; a cut is `ip link set
//! down` on that veth's host end (packets dropped, like a partition: the replica's TCP
//! retransmits until its `tcp_user_timeout`), the heal `ip link set up`. The API and the
//! targets reach `r2` over the other veth, so only the database is cut. The namespace
//! (and its veths) is deleted on exit, on a panic too (a Drop guard). Without root or
//! `ip`, the cut is skipped with a message and the other faults still run.

use crate::controller_support;

use controller_support::*;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TARGETS: usize = 20;
/// The lease TTL: short, so 30 faults fit in a few minutes.
const TTL: Duration = Duration::from_secs(2);
/// `[guard.budget]`: at most this many actions in any window of `BUDGET_PER`.
const BUDGET_ACTIONS: usize = 2;
const BUDGET_PER_MS: i64 = 20_000;
/// The rolling failure: the next target fails every `ROLL_EVERY`, for `FAIL_FOR`.
const ROLL_EVERY: Duration = Duration::from_secs(4);
const FAIL_FOR: Duration = Duration::from_secs(10);
/// The freeze: this many targets (40% > the 30% cap) fail together for `FREEZE_FOR`.
const FREEZE_TARGETS: usize = 8;
const FREEZE_FOR: Duration = Duration::from_secs(12);
/// How long after a failure starts or heals its verdict may still be the old one:
/// a report period and a probe interval, with room for a loaded machine.
const SLACK_MS: i64 = 3_000;

/// SplitMix64: a seeded generator, so a failing run can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo))
    }
}

fn pg_base_url() -> String {
    std::env::var("VIGIL_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

fn pg() -> postgres::Client {
    let base = pg_base_url();
    postgres::Client::connect(&base, postgres::NoTls).unwrap_or_else(|e| {
        panic!("PostgreSQL at {base} is unreachable ({e}): this test needs it (127.0.0.1:5432, trust, database `test`; VIGIL_TEST_POSTGRES for another)")
    })
}

/// A schema of the test's own, dropped when done.
struct Schema {
    name: String,
}

impl Schema {
    fn new() -> Schema {
        let name = format!("vigil_chaos_{}", std::process::id());
        pg().batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {name} CASCADE; CREATE SCHEMA {name}"
        ))
        .unwrap();
        Schema { name }
    }

    /// The store URL through `host:port` (the relay for the namespaced replica).
    fn url_via(&self, host: &str) -> String {
        let base = pg_base_url().replace("127.0.0.1:5432", host);
        let sep = if base.contains('?') { '&' } else { '?' };
        format!("{base}{sep}options=-csearch_path%3D{}", self.name)
    }

    fn client(&self) -> postgres::Client {
        let mut c = pg();
        c.batch_execute(&format!("SET search_path = {}", self.name))
            .unwrap();
        c
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        if let Ok(mut c) = postgres::Client::connect(&pg_base_url(), postgres::NoTls) {
            let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name));
        }
    }
}

// === the namespace and the relay ===

/// A network namespace with two veth pairs to the host: `svc` (the API and the
/// targets) and `db` (PostgreSQL, through the relay). Deleted on drop, which also
/// deletes the veths.
struct Netns {
    name: String,
    db_host_if: String,
    svc_host: Ipv4Addr,
    svc_ns: Ipv4Addr,
    db_host: Ipv4Addr,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip`: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Netns {
    /// Creates the namespace, or says why it cannot (not root, no `ip`).
    fn create() -> Result<Netns, String> {
        if std::env::var("VIGIL_CHAOS_NO_NETNS").is_ok() {
            return Err("VIGIL_CHAOS_NO_NETNS is set".into());
        }
        let pid = std::process::id();
        let tag = pid % 100_000;
        // A /30 per veth in 10.251.0.0/16, picked by pid: addresses of this test's
        // own namespace only, never routed anywhere else.
        let x = (pid % 250) as u8;
        let n = Netns {
            name: format!("vigil-chaos-{pid}"),
            db_host_if: format!("vcd{tag}h"),
            svc_host: Ipv4Addr::new(10, 251, x, 1),
            svc_ns: Ipv4Addr::new(10, 251, x, 2),
            db_host: Ipv4Addr::new(10, 251, x, 5),
        };
        // A run killed before its Drop guards ran (a harness timeout) leaves its
        // namespace behind: delete those whose process is gone.
        if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let name = line.split_whitespace().next().unwrap_or("");
                if let Some(old) = name.strip_prefix("vigil-chaos-")
                    && !Path::new(&format!("/proc/{old}")).exists()
                {
                    eprintln!("deleting namespace {name} left by an earlier run");
                    let _ = ip(&["netns", "del", name]);
                }
            }
        }
        ip(&["netns", "add", &n.name])?;
        let setup = || -> Result<(), String> {
            let (sh, sn) = (format!("vcs{tag}h"), format!("vcs{tag}n"));
            let (dh, dn) = (n.db_host_if.clone(), format!("vcd{tag}n"));
            let db_ns = Ipv4Addr::new(10, 251, x, 6);
            for (h, i, ha, na) in [
                (&sh, &sn, n.svc_host, n.svc_ns),
                (&dh, &dn, n.db_host, db_ns),
            ] {
                ip(&["link", "add", h, "type", "veth", "peer", "name", i])?;
                ip(&["link", "set", i, "netns", &n.name])?;
                ip(&["addr", "add", &format!("{ha}/30"), "dev", h])?;
                ip(&["link", "set", h, "up"])?;
                ip(&["-n", &n.name, "addr", "add", &format!("{na}/30"), "dev", i])?;
                ip(&["-n", &n.name, "link", "set", i, "up"])?;
            }
            ip(&["-n", &n.name, "link", "set", "lo", "up"])
        };
        // On failure `n` is dropped, which deletes what was made.
        setup()?;
        Ok(n)
    }

    fn cut(&self) {
        ip(&["link", "set", &self.db_host_if, "down"]).expect("cutting the db veth");
    }

    fn heal(&self) {
        ip(&["link", "set", &self.db_host_if, "up"]).expect("healing the db veth");
    }

    fn wrapper(&self) -> Vec<String> {
        ["ip", "netns", "exec", &self.name]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!("cleaning up: {e}");
        }
    }
}

/// Forwards every connection to `listen` on to 127.0.0.1:5432: the namespaced
/// replica's only way to PostgreSQL. Runs until the process ends (threads blocked on
/// sockets of a cut link end with it).
fn relay(listen: Ipv4Addr) -> u16 {
    let l = TcpListener::bind((listen, 0)).expect("relay: bind on the db veth");
    let port = l.local_addr().unwrap().port();
    let upstream: SocketAddr = pg_base_url()
        .split('@')
        .nth(1)
        .and_then(|r| r.split('/').next())
        .and_then(|h| h.parse().ok())
        .unwrap_or_else(|| "127.0.0.1:5432".parse().unwrap());
    std::thread::spawn(move || {
        for down in l.incoming() {
            let Ok(down) = down else { continue };
            let Ok(up) = TcpStream::connect(upstream) else {
                continue;
            };
            let pipe = |mut a: TcpStream, mut b: TcpStream| {
                std::thread::spawn(move || {
                    let mut buf = [0u8; 16384];
                    while let Ok(n) = a.read(&mut buf) {
                        if n == 0 || b.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = b.shutdown(std::net::Shutdown::Write);
                });
            };
            pipe(down.try_clone().unwrap(), up.try_clone().unwrap());
            pipe(up, down);
        }
    });
    port
}

// === the targets ===

/// A health endpoint of the test's own: `{"status":"pass"}` (200), or a 500 with a
/// failing report naming no check (an endpoint failure: a local cause) while failing.
/// Listens on loopback and, with a namespace, on the host end of its service veth.
struct Target {
    addrs: Vec<SocketAddr>,
    fail: Arc<AtomicBool>,
}

async fn start_target(ips: &[IpAddr]) -> Target {
    let fail = Arc::new(AtomicBool::new(false));
    let mut addrs = Vec::new();
    for ip in ips {
        let l = tokio::net::TcpListener::bind((*ip, 0)).await.unwrap();
        addrs.push(l.local_addr().unwrap());
        let f = fail.clone();
        tokio::spawn(async move {
            while let Ok((c, _)) = l.accept().await {
                let f = f.clone();
                tokio::spawn(serve_health(c, move |_| f.load(Ordering::Relaxed)));
            }
        });
    }
    Target { addrs, fail }
}

/// One target failing from `from_ms` until `to_ms` (wall clock, UNIX ms).
#[derive(Clone, Debug)]
struct Episode {
    target: String,
    from_ms: i64,
    to_ms: i64,
    freeze: bool,
}

// === the replicas ===

struct Replica {
    id: String,
    dir: tempfile::TempDir,
    wrapper: Vec<String>,
    c: Option<Controller>,
    stopped: bool,
}

impl Replica {
    fn start(&mut self) {
        self.c = Some(Controller::start_wrapped(self.dir.path(), &self.wrapper));
        self.stopped = false;
    }

    fn c(&self) -> &Controller {
        self.c.as_ref().expect("replica running")
    }
}

/// The config of replica `id`: exec actuator appending to `log`, the store at `url`.
fn replica_config(
    dir: &Path,
    id: &str,
    url: &str,
    listen: &str,
    targets: &str,
    log: &Path,
) -> String {
    // The action's log line: key, target, replica, time (UNIX ms), then the action's
    // epoch as stored and the lease's epoch and holder when it ran (read with psql;
    // `?` when the database could not be asked).
    let script = dir.join("act.sh");
    std::fs::write(
        &script,
        format!(
            r#"e=$(timeout 3 psql -XAtq "{url}" -c "SELECT a.epoch || ' ' || l.epoch || ' ' || l.holder FROM actions a, leases l WHERE a.idempotency_key = '$VIGIL_IDEMPOTENCY_KEY' AND l.name = 'controller'" 2>/dev/null)
[ -n "$e" ] || e="? ? ?"
echo "$VIGIL_IDEMPOTENCY_KEY $VIGIL_TARGET_ID {id} $(date +%s%3N) $e" >> {log}
"#,
            log = log.display()
        ),
    )
    .unwrap();
    base_config(&format!(
        r#"[store]
url = "{url}"
[replicas]
id = "{id}"
lease_ttl = "2s"
[guard.thresholds]
unhealthy_threshold = 2
healthy_threshold = 1
[guard.damping]
penalty = 1
[actuator]
kind = "exec"
[actuator.exec]
command = ["sh", "{}"]
timeout = "10s"
"#,
        script.display()
    ))
    .replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"{listen}\""),
    )
    .replace("interval = \"200ms\"", "interval = \"500ms\"")
    // A failure must last as long as a heal may take to be seen (SLACK_MS): after the
    // freeze lifts, its last targets to be seen recovering wait that long (the guard's
    // freeze aftermath) before their failure counts as their own.
    .replace(
        "min_failing = \"1s\"",
        &format!("min_failing = \"{}ms\"", SLACK_MS),
    )
    .replace(
        "per = \"10m\"",
        &format!("per = \"{}s\"", BUDGET_PER_MS / 1000),
    )
    .replace("actions = 2", &format!("actions = {BUDGET_ACTIONS}"))
        + targets
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap()
}

/// `GET path` on a replica, `None` when it does not answer in time (stopped, busy).
async fn try_get(client: &reqwest::Client, c: &Controller, path: &str) -> Option<Value> {
    let r = client.get(c.url(path)).send().await.ok()?;
    r.json().await.ok()
}

/// Waits (bounded) until a running, unstopped replica says it leads; its index.
async fn await_leader(client: &reqwest::Client, rs: &[Replica], why: &str) -> usize {
    let started = Instant::now();
    loop {
        for (i, r) in rs.iter().enumerate() {
            if r.stopped || r.c.is_none() {
                continue;
            }
            if let Some(l) = try_get(client, r.c(), "/api/leader").await
                && l["leading"] == true
            {
                return i;
            }
        }
        assert!(
            started.elapsed() < DEADLINE,
            "no replica leads {why}; logs:\n{}",
            logs(rs)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn logs(rs: &[Replica]) -> String {
    rs.iter()
        .map(|r| {
            let text = r.c.as_ref().map(|c| c.logs()).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(60).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            format!("---- {} (last 60 lines)\n{}", r.id, tail.join("\n"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits (bounded) until the leader counts replica `id` among the live ones again.
async fn await_live(client: &reqwest::Client, rs: &[Replica], id: &str, why: &str) {
    let started = Instant::now();
    loop {
        let lead = await_leader(client, rs, why).await;
        if let Some(p) = try_get(client, rs[lead].c(), "/api/probing").await
            && p["live"]
                .as_array()
                .is_some_and(|l| l.iter().any(|r| r == id))
        {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(45),
            "replica {id} did not rejoin the probing {why} within 45 s; logs:\n{}",
            logs(rs)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

// === the checks ===

/// One action as the store has it, with what the audit trigger saw when it committed.
#[derive(Clone, Debug)]
struct StoredAction {
    id: i64,
    target: String,
    key: String,
    state: String,
    attempts: i64,
    created_ms: i64,
    epoch: Option<i64>,
    /// The lease's epoch and holder inside the committing transaction.
    lease_at_commit: Option<(i64, String)>,
}

/// One line of the exec actuator's log.
#[derive(Clone, Debug)]
struct Run {
    key: String,
    target: String,
    replica: String,
    line: String,
}

/// Everything the checks read: the store's actions, the actuator's runs, the failures
/// the test made, the freeze.
struct History {
    actions: Vec<StoredAction>,
    runs: Vec<Run>,
    episodes: Vec<Episode>,
    freeze: Option<(i64, i64)>,
}

/// Every broken invariant, in words (empty: all hold).
fn violations(h: &History) -> Vec<String> {
    let mut v = Vec::new();
    // Every action's epoch was the lease's when it committed.
    for a in &h.actions {
        match (&a.epoch, &a.lease_at_commit) {
            (Some(e), Some((le, holder))) if e == le => {
                let _ = holder;
            }
            (e, l) => v.push(format!(
                "action {} ({}) committed with epoch {e:?} while the lease was {l:?}",
                a.id, a.key
            )),
        }
    }
    // Epochs never go back in commit order (every fenced commit locks the lease row).
    let mut by_id = h.actions.clone();
    by_id.sort_by_key(|a| a.id);
    for w in by_id.windows(2) {
        if w[1].epoch < w[0].epoch {
            v.push(format!(
                "action {} has epoch {:?} after action {} of epoch {:?}",
                w[1].id, w[1].epoch, w[0].id, w[0].epoch
            ));
        }
    }
    // One action per failure of a target, none on a target that was not failing.
    let mut per_episode: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
    for a in &h.actions {
        let ep = h.episodes.iter().position(|e| {
            e.target == a.target && a.created_ms >= e.from_ms && a.created_ms <= e.to_ms + SLACK_MS
        });
        match ep {
            Some(i) => per_episode.entry(i).or_default().push(&a.key),
            None => v.push(format!(
                "action {} ({}) on {} at {} ms: the target was not failing then",
                a.id, a.key, a.target, a.created_ms
            )),
        }
    }
    for (i, keys) in &per_episode {
        let e = &h.episodes[*i];
        if e.freeze {
            v.push(format!(
                "{} was acted on ({keys:?}) while failing with {FREEZE_TARGETS} others at once (the freeze)",
                e.target
            ));
        }
        if keys.len() > 1 {
            v.push(format!(
                "{} failing from {} to {} ms was acted on under {} keys: {keys:?}",
                e.target,
                e.from_ms,
                e.to_ms,
                keys.len()
            ));
        }
    }
    // The actuator's runs: every key is a stored action for that target, run no more
    // often than attempts were counted (a re-run carries the same key and is counted);
    // every action done ran at least once.
    let stored: BTreeMap<&str, &StoredAction> =
        h.actions.iter().map(|a| (a.key.as_str(), a)).collect();
    let mut runs: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
    for r in &h.runs {
        runs.entry(&r.key).or_default().push(r);
    }
    for (key, rs) in &runs {
        match stored.get(key) {
            None => v.push(format!(
                "{key} ran ({:?}) but is not in the store",
                rs[0].line
            )),
            Some(a) => {
                if rs.iter().any(|r| r.target != a.target) {
                    v.push(format!(
                        "{key} ran for another target than {}: {rs:?}",
                        a.target
                    ));
                }
                if rs.len() as i64 > a.attempts {
                    v.push(format!(
                        "{key} ran {} times but {} attempts were counted: {:?}",
                        rs.len(),
                        a.attempts,
                        rs.iter().map(|r| &r.line).collect::<Vec<_>>()
                    ));
                }
            }
        }
    }
    for a in &h.actions {
        if a.state == "done" && !runs.contains_key(a.key.as_str()) {
            v.push(format!("{} is done but never ran", a.key));
        }
    }
    // The budget, in any window, across failovers.
    let mut at: Vec<(i64, &str)> = h
        .actions
        .iter()
        .map(|a| (a.created_ms, a.key.as_str()))
        .collect();
    at.sort();
    for (i, (t, _)) in at.iter().enumerate() {
        let within: Vec<&str> = at[i..]
            .iter()
            .take_while(|(u, _)| *u < t + BUDGET_PER_MS)
            .map(|(_, k)| *k)
            .collect();
        if within.len() > BUDGET_ACTIONS {
            v.push(format!(
                "{} actions within {} ms from {t}: {within:?} (budget {BUDGET_ACTIONS})",
                within.len(),
                BUDGET_PER_MS
            ));
        }
    }
    // Nothing while frozen.
    if let Some((from, to)) = h.freeze {
        for a in &h.actions {
            if a.created_ms >= from + SLACK_MS && a.created_ms <= to {
                v.push(format!(
                    "action {} ({}) on {} at {} ms while the fleet was frozen ({from}..{to})",
                    a.id, a.key, a.target, a.created_ms
                ));
            }
        }
    }
    v
}

fn read_actions(schema: &Schema) -> Vec<StoredAction> {
    let mut c = schema.client();
    c.query(
        "SELECT a.id, a.target, a.idempotency_key, a.state, a.attempts, a.created_ms, a.epoch,
                x.lease_epoch, x.lease_holder
         FROM actions a LEFT JOIN chaos_audit x ON x.key = a.idempotency_key
         WHERE a.event::jsonb ->> 'kind' = 'replace' ORDER BY a.id",
        &[],
    )
    .unwrap()
    .iter()
    .map(|r| StoredAction {
        id: r.get(0),
        target: r.get(1),
        key: r.get(2),
        state: r.get(3),
        attempts: r.get(4),
        created_ms: r.get(5),
        epoch: r.get(6),
        lease_at_commit: r
            .get::<_, Option<i64>>(7)
            .map(|e| (e, r.get::<_, Option<String>>(8).unwrap_or_default())),
    })
    .collect()
}

/// The stored explanation of every decision to act, one line each.
fn act_decisions(schema: &Schema) -> Vec<String> {
    let mut c = schema.client();
    c.query(
        "SELECT at_ms, target, summary FROM decisions WHERE outcome = 'act' ORDER BY id",
        &[],
    )
    .unwrap()
    .iter()
    .map(|r| {
        format!(
            "{} {}: {}",
            r.get::<_, i64>(0),
            r.get::<_, String>(1),
            r.get::<_, String>(2)
        )
    })
    .collect()
}

fn read_runs(log: &Path) -> Vec<Run> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert!(
                f.len() >= 4 && f[3].parse::<i64>().is_ok(),
                "{}: a malformed line {l:?}",
                log.display()
            );
            Run {
                key: f[0].into(),
                target: f[1].into(),
                replica: f[2].into(),
                line: l.into(),
            }
        })
        .collect()
}

/// The audit: every action insert records the lease row as the committing
/// transaction sees it (the fence has locked that row by then, so it cannot move).
const AUDIT_SQL: &str = "
CREATE TABLE chaos_audit (key TEXT PRIMARY KEY, action_epoch BIGINT, lease_epoch BIGINT,
    lease_holder TEXT, at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION chaos_audit_action() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_audit (key, action_epoch, lease_epoch, lease_holder)
    SELECT NEW.idempotency_key, NEW.epoch, l.epoch, l.holder FROM leases l WHERE l.name = 'controller';
    RETURN NEW;
END $$;
CREATE TRIGGER chaos_audit AFTER INSERT ON actions FOR EACH ROW EXECUTE FUNCTION chaos_audit_action();
";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    Kill,
    Stop,
    Cut,
}

#[test]
fn heavy_three_replicas_under_kills_pauses_and_partitions_never_act_twice_or_past_the_guard() {
    let seed = std::env::var("VIGIL_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| now_ms() as u64);
    let faults: usize = std::env::var("VIGIL_CHAOS_FAULTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    // When the freeze comes: about the middle of 30 faults.
    let freeze_after = Duration::from_secs(
        std::env::var("VIGIL_CHAOS_FREEZE_AFTER")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(90),
    );
    eprintln!("chaos seed {seed} (VIGIL_CHAOS_SEED={seed} replays it), {faults} faults");
    let mut rng = Rng(seed);
    let started = Instant::now();
    // Declared first, dropped last: the namespace outlives the processes inside it.
    let netns = match Netns::create() {
        Ok(n) => Some(n),
        Err(why) => {
            eprintln!(
                "SKIPPING the partition fault: no network namespace ({why}); kills and pauses still run"
            );
            None
        }
    };
    let schema = Schema::new();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut ips: Vec<IpAddr> = vec![Ipv4Addr::LOCALHOST.into()];
    if let Some(n) = &netns {
        ips.push(n.svc_host.into());
    }
    let targets: Vec<Target> = rt.block_on(async {
        let mut v = Vec::new();
        for _ in 0..TARGETS {
            v.push(start_target(&ips).await);
        }
        v
    });
    let toml_for = |via: usize| -> String {
        targets
            .iter()
            .enumerate()
            .map(|(i, t)| {
                format!(
                    "[[targets]]\nid = \"t{i}\"\nurl = \"http://{}\"\nzone = \"a\"\ngroup = \"web\"\n",
                    t.addrs[via]
                )
            })
            .collect()
    };
    let work = tempfile::tempdir().unwrap();
    let log = work.path().join("actions.log");
    let relay_port = netns.as_ref().map(|n| relay(n.db_host));
    let mut rs: Vec<Replica> = (0..3)
        .map(|i| {
            let id = format!("r{i}");
            let dir = tempfile::tempdir().unwrap();
            let (url, listen, via, wrapper) = match (&netns, relay_port) {
                (Some(n), Some(port)) if i == 2 => (
                    schema.url_via(&format!("{}:{port}", n.db_host)),
                    format!("{}:0", n.svc_ns),
                    1,
                    n.wrapper(),
                ),
                _ => (
                    schema.url_via("127.0.0.1:5432"),
                    "127.0.0.1:0".to_string(),
                    0,
                    Vec::new(),
                ),
            };
            let cfg = replica_config(dir.path(), &id, &url, &listen, &toml_for(via), &log);
            std::fs::write(dir.path().join("fleet.toml"), cfg).unwrap();
            Replica {
                id,
                dir,
                wrapper,
                c: None,
                stopped: false,
            }
        })
        .collect();
    for r in &mut rs {
        r.start();
    }
    let client = http();
    rt.block_on(await_leader(&client, &rs, "at start"));
    schema.client().batch_execute(AUDIT_SQL).unwrap();
    for r in &rs {
        rt.block_on(await_live(&client, &rs, &r.id.clone(), "at start"));
    }

    // The scenario: a rolling failure, and once a freeze, until told to stop.
    let episodes: Arc<Mutex<Vec<Episode>>> = Arc::default();
    let freeze: Arc<Mutex<Option<(i64, i64)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let fails: Vec<Arc<AtomicBool>> = targets.iter().map(|t| t.fail.clone()).collect();
    let scenario = {
        let (episodes, freeze, stop, fails) = (
            episodes.clone(),
            freeze.clone(),
            stop.clone(),
            fails.clone(),
        );
        std::thread::spawn(move || {
            let mut k = 0usize;
            let mut failing: Vec<(usize, Instant, i64)> = Vec::new();
            let mut next = Instant::now();
            let freeze_at = Instant::now() + freeze_after;
            let mut froze = false;
            let heal_due = |failing: &mut Vec<(usize, Instant, i64)>, all: bool| {
                failing.retain(|(i, until, from)| {
                    if all || Instant::now() >= *until {
                        fails[*i].store(false, Ordering::SeqCst);
                        episodes.lock().unwrap().push(Episode {
                            target: format!("t{i}"),
                            from_ms: *from,
                            to_ms: now_ms(),
                            freeze: false,
                        });
                        false
                    } else {
                        true
                    }
                });
            };
            while !stop.load(Ordering::SeqCst) {
                heal_due(&mut failing, false);
                if !froze && Instant::now() >= freeze_at && failing.is_empty() {
                    // 8 targets at once (40% > the 30% cap): nobody may be acted on.
                    froze = true;
                    let set: Vec<usize> = (0..FREEZE_TARGETS).map(|j| (k + j) % TARGETS).collect();
                    let from = now_ms();
                    for &i in &set {
                        fails[i].store(true, Ordering::SeqCst);
                    }
                    let until = Instant::now() + FREEZE_FOR;
                    while Instant::now() < until && !stop.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    for &i in &set {
                        fails[i].store(false, Ordering::SeqCst);
                    }
                    let to = now_ms();
                    *freeze.lock().unwrap() = Some((from, to));
                    for &i in &set {
                        episodes.lock().unwrap().push(Episode {
                            target: format!("t{i}"),
                            from_ms: from,
                            to_ms: to,
                            freeze: true,
                        });
                    }
                    k += FREEZE_TARGETS;
                    next = Instant::now() + Duration::from_secs(5);
                }
                let pausing = !froze && Instant::now() + FAIL_FOR >= freeze_at;
                if Instant::now() >= next && !pausing {
                    let i = k % TARGETS;
                    fails[i].store(true, Ordering::SeqCst);
                    failing.push((i, Instant::now() + FAIL_FOR, now_ms()));
                    k += 1;
                    next += ROLL_EVERY;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            heal_due(&mut failing, true);
        })
    };

    // The fault loop.
    let kinds: &[Fault] = if netns.is_some() {
        &[Fault::Kill, Fault::Stop, Fault::Cut]
    } else {
        &[Fault::Kill, Fault::Stop]
    };
    let mut done: BTreeMap<&str, usize> = BTreeMap::new();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for n in 0..faults {
            let lead = rt.block_on(await_leader(&client, &rs, &format!("before fault {n}")));
            let fault = kinds[rng.below(kinds.len() as u64) as usize];
            let at = started.elapsed();
            let victim = match fault {
                Fault::Kill => {
                    rs[lead].c.take().unwrap().sigkill();
                    std::thread::sleep(rng.ms(0, 1500));
                    rs[lead].start();
                    lead
                }
                Fault::Stop => {
                    rs[lead].c().signal("STOP");
                    rs[lead].stopped = true;
                    std::thread::sleep(TTL + rng.ms(300, 2500));
                    rs[lead].c().signal("CONT");
                    rs[lead].stopped = false;
                    lead
                }
                Fault::Cut => {
                    let n = netns.as_ref().expect("cut only with a namespace");
                    n.cut();
                    // Some cuts outlast the store's tcp_user_timeout (5 s): the
                    // replica's connections break and must be made again.
                    std::thread::sleep(rng.ms(1000, 7500));
                    n.heal();
                    2
                }
            };
            *done
                .entry(match fault {
                    Fault::Kill => "SIGKILL the leader, restart",
                    Fault::Stop => "SIGSTOP the leader past its TTL, SIGCONT",
                    Fault::Cut => "cut r2 off from PostgreSQL",
                })
                .or_default() += 1;
            eprintln!(
                "fault {n} at {:.1} s: {fault:?} {} (leader was {})",
                at.as_secs_f64(),
                rs[victim].id,
                rs[lead].id
            );
            let id = rs[victim].id.clone();
            rt.block_on(await_live(
                &client,
                &rs,
                &id,
                &format!("after fault {n} ({fault:?} of {id})"),
            ));
            std::thread::sleep(rng.ms(300, 2500));
        }
    }));
    stop.store(true, Ordering::SeqCst);
    for r in &mut rs {
        if r.stopped {
            r.c().signal("CONT");
            r.stopped = false;
        }
    }
    if let Some(n) = &netns {
        n.heal();
    }
    scenario.join().expect("the scenario thread");
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
    eprintln!(
        "faults done after {:.1} s: {done:?}",
        started.elapsed().as_secs_f64()
    );

    // Settle: one leader, every action finished.
    let lead = rt.block_on(await_leader(&client, &rs, "after the faults"));
    let settled = Instant::now();
    let actions = loop {
        let a = read_actions(&schema);
        if a.iter().all(|a| a.state != "intended") {
            break a;
        }
        assert!(
            settled.elapsed() < DEADLINE,
            "actions still intended after the faults: {:?}\nlogs:\n{}",
            a.iter()
                .filter(|a| a.state == "intended")
                .collect::<Vec<_>>(),
            logs(&rs)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let h = History {
        actions,
        runs: read_runs(&log),
        episodes: episodes.lock().unwrap().clone(),
        freeze: *freeze.lock().unwrap(),
    };
    let replicas_ran: BTreeSet<&str> = h.runs.iter().map(|r| r.replica.as_str()).collect();
    let reruns = h.runs.len() - h.runs.iter().map(|r| &r.key).collect::<BTreeSet<_>>().len();
    let epochs: BTreeSet<i64> = h.actions.iter().filter_map(|a| a.epoch).collect();
    eprintln!(
        "{} actions over {} failures ({} in the freeze), {} runs ({reruns} re-runs of a key), by {replicas_ran:?}, under epochs {epochs:?}; leader at the end {}; freeze {:?}",
        h.actions.len(),
        h.episodes.len(),
        h.episodes.iter().filter(|e| e.freeze).count(),
        h.runs.len(),
        rs[lead].id,
        h.freeze
    );
    let late: Vec<&Run> = h
        .runs
        .iter()
        .filter(|r| !r.line.ends_with(&format!(" {}", r.replica)))
        .collect();
    if !late.is_empty() {
        eprintln!(
            "runs by a replica that did not hold the lease when its command ran (allowed: the attempt was counted while it led): {:?}",
            late.iter().map(|r| &r.line).collect::<Vec<_>>()
        );
    }
    let v = violations(&h);
    assert!(
        v.is_empty(),
        "seed {seed}: {} violations:\n{}\nwhy each action was taken:\n{}\nactions:\n{}\nruns: {:#?}\nlogs:\n{}",
        v.len(),
        v.join("\n"),
        act_decisions(&schema).join("\n"),
        h.actions
            .iter()
            .map(|a| format!("{a:?}"))
            .collect::<Vec<_>>()
            .join("\n"),
        h.runs,
        logs(&rs)
    );
    assert!(
        h.actions.len() >= 5,
        "seed {seed}: the scenario must act: {} actions",
        h.actions.len()
    );
    assert!(h.freeze.is_some(), "seed {seed}: the freeze never happened");
}

/// The checks themselves catch what they are for: a history with a double action, an
/// unfenced commit, a budget overrun and an action while frozen is reported four ways.
#[test]
fn the_checks_catch_a_double_action_a_stale_epoch_a_budget_overrun_and_a_frozen_act() {
    let a = |id: i64, target: &str, at: i64, epoch: i64, lease: i64| StoredAction {
        id,
        target: target.into(),
        key: format!("vigil-{at}-{id}"),
        state: "done".into(),
        attempts: 1,
        created_ms: at,
        epoch: Some(epoch),
        lease_at_commit: Some((lease, "r0".into())),
    };
    let run = |a: &StoredAction| Run {
        key: a.key.clone(),
        target: a.target.clone(),
        replica: "r0".into(),
        line: format!("{} {} r0 {} 1 1 r0", a.key, a.target, a.created_ms),
    };
    let ep = |t: &str, from: i64, to: i64| Episode {
        target: t.into(),
        from_ms: from,
        to_ms: to,
        freeze: false,
    };
    let good = History {
        actions: vec![a(1, "t0", 1_000, 1, 1), a(2, "t1", 30_000, 2, 2)],
        runs: vec![],
        episodes: vec![ep("t0", 0, 5_000), ep("t1", 29_000, 35_000)],
        freeze: Some((50_000, 60_000)),
    };
    let good = History {
        runs: good.actions.iter().map(run).collect(),
        ..good
    };
    assert_eq!(violations(&good), Vec::<String>::new());
    let bad = History {
        actions: vec![
            a(1, "t0", 1_000, 1, 1),
            a(2, "t0", 2_000, 1, 2),  // same failure, second key; stale epoch
            a(3, "t1", 3_000, 2, 2),  // third in 20 s
            a(4, "t2", 55_000, 2, 2), // while frozen
            a(5, "t3", 80_000, 2, 2), // not failing
        ],
        runs: vec![],
        episodes: vec![
            ep("t0", 0, 5_000),
            ep("t1", 2_500, 9_000),
            ep("t2", 50_000, 60_000),
        ],
        freeze: Some((50_000, 60_000)),
    };
    let mut runs: Vec<Run> = bad.actions.iter().map(run).collect();
    runs.push(run(&bad.actions[0])); // run twice, counted once
    let bad = History { runs, ..bad };
    let v = violations(&bad);
    let has = |s: &str| v.iter().any(|x| x.contains(s));
    assert!(
        has("committed with epoch Some(1) while the lease was Some((2"),
        "{v:#?}"
    );
    assert!(has("acted on under 2 keys"), "{v:#?}");
    assert!(has("3 actions within 20000 ms"), "{v:#?}");
    assert!(has("while the fleet was frozen"), "{v:#?}");
    assert!(has("the target was not failing then"), "{v:#?}");
    assert!(has("ran 2 times but 1 attempts were counted"), "{v:#?}");
}
