//! Several `vigil controller` processes on one PostgreSQL schema: one leads (decides,
//! acts), the others follow and serve the API; a leader killed with SIGKILL is replaced
//! within the lease TTL plus a renewal period, one stopped with SIGTERM resigns and is
//! replaced in about a second; the replicas share the probing, two per target, and a
//! target failing for only one of its probers is not made unhealthy. Real processes, real PostgreSQL (127.0.0.1:5432 on every
//! machine, CI's included: an unreachable server fails these tests, it does not skip
//! them), a schema of each test's own, dropped after.

use crate::controller_support;

use controller_support::*;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vigil_testkit::Mode;

/// The PostgreSQL the tests use (`VIGIL_TEST_POSTGRES` overrides).
fn pg_base_url() -> String {
    std::env::var("VIGIL_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// A schema of one test's own, dropped when done.
struct Schema {
    name: String,
    url: String,
}

impl Schema {
    /// On a thread of its own: the blocking client cannot run inside the test's runtime.
    fn new(test: &str) -> Schema {
        let test = test.to_string();
        std::thread::spawn(move || Schema::create(&test))
            .join()
            .expect("creating the schema")
    }

    fn create(test: &str) -> Schema {
        let name = format!("vigil_r_{test}_{}", std::process::id());
        let base = pg_base_url();
        let mut c = postgres::Client::connect(&base, postgres::NoTls).unwrap_or_else(|e| {
            panic!("PostgreSQL at {base} is unreachable ({e}): these tests need it on every machine (127.0.0.1:5432, trust, database `test`; VIGIL_TEST_POSTGRES for another)")
        });
        c.batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {name} CASCADE; CREATE SCHEMA {name}"
        ))
        .unwrap();
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}options=-csearch_path%3D{name}");
        Schema { name, url }
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            if let Ok(mut c) = postgres::Client::connect(&pg_base_url(), postgres::NoTls) {
                let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"));
            }
        })
        .join();
    }
}

fn replica_config(schema: &Schema, id: &str, ttl: &str, targets: &str) -> String {
    base_config(&format!(
        "[store]\nurl = \"{}\"\n[replicas]\nid = \"{id}\"\nlease_ttl = \"{ttl}\"\n",
        schema.url
    )) + targets
}

async fn leader(c: &Controller) -> Value {
    c.get("/api/leader").await
}

/// Waits until exactly one of `cs` says it leads; returns its index.
async fn one_leader(cs: &[&Controller]) -> usize {
    let started = Instant::now();
    loop {
        let mut leading = Vec::new();
        for (i, c) in cs.iter().enumerate() {
            if leader(c).await["leading"] == true {
                leading.push(i);
            }
        }
        assert!(leading.len() <= 1, "two replicas lead at once: {leading:?}");
        if let [i] = leading[..] {
            return i;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "no replica leads; logs:\n{}",
            cs.iter()
                .map(|c| c.logs())
                .collect::<Vec<_>>()
                .join("\n----\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `n` replicas `r0`, `r1`, ... on `schema`, each in its own data directory (kept alive
/// by the returned guards); a test takes a replica out to kill or stop it.
fn start_replicas(
    n: usize,
    schema: &Schema,
    ttl: &str,
    targets: &str,
) -> (Vec<tempfile::TempDir>, Vec<Option<Controller>>) {
    let dirs: Vec<_> = (0..n).map(|_| tempfile::tempdir().unwrap()).collect();
    let cs = dirs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            Some(Controller::start(
                d.path(),
                &replica_config(schema, &format!("r{i}"), ttl, targets),
            ))
        })
        .collect();
    (dirs, cs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_leads_and_a_sigkilled_leader_is_replaced_within_ttl_plus_a_renewal() {
    let schema = Schema::new("kill");
    // Eight: two failing (25%) stay under the guard's 30% cap.
    let bs = backends(8);
    let targets = targets_toml(&bs);
    let ttl = Duration::from_secs(2);
    let (_dirs, mut cs) = start_replicas(3, &schema, "2s", &targets);
    let all: Vec<&Controller> = cs.iter().map(|c| c.as_ref().unwrap()).collect();
    let first = one_leader(&all).await;
    let l = all[first];
    l.wait_all(8, "healthy").await;
    // Followers say who leads, serve reads from the store, and refuse mutations.
    let follower = all[(first + 1) % 3];
    let seen = follower
        .wait_for("the follower has read the lease", || async {
            let l = leader(follower).await;
            (!l["leader"].is_null()).then_some(l)
        })
        .await;
    assert_eq!(seen["leading"], false);
    assert_eq!(seen["leader"]["holder"], format!("r{first}"), "{seen}");
    assert!(seen["leader"]["since_ms"].as_i64().unwrap() > 0, "{seen}");
    let (code, body) = follower
        .post(
            "/api/targets/t1/silence",
            Some(TOKEN),
            serde_json::json!({"for": "1h", "reason": "x"}),
        )
        .await;
    assert_eq!(code, 503, "a follower does not take mutations: {body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .starts_with("not the leader: "),
        "{body}"
    );
    assert_eq!(
        body["leader"],
        format!("r{first}"),
        "the refusal names the leader: {body}"
    );

    // The leader acts on a failing target; a follower shows the action from the store.
    bs[0].set_health_mode(Mode::Status(500));
    let acted = l.wait_for_actions("the leader acts on t0").await;
    assert_eq!(acted[0]["target"], "t0");
    follower
        .wait_for("the follower shows the leader's action", || async {
            (!follower.actions().await.is_empty()).then_some(())
        })
        .await;

    // SIGKILL the leader: nobody resigns; another replica must lead within the TTL plus
    // a renewal period (the follower's retry), and act.
    let killed_at = Instant::now();
    cs[first].take().unwrap().sigkill();
    let rest: Vec<&Controller> = cs.iter().flatten().collect();
    let next = one_leader(&rest).await;
    let took = killed_at.elapsed();
    let renew = ttl / 3;
    eprintln!("failover after SIGKILL: {took:?} (ttl {ttl:?}, renew {renew:?})");
    assert!(
        took <= ttl + renew + Duration::from_millis(1500),
        "failover took {took:?}, more than ttl {ttl:?} + renew {renew:?} (+1.5 s for a loaded machine)"
    );
    let n = rest[next];
    let epoch = leader(n).await["epoch"].as_i64().unwrap();
    assert!(epoch >= 2, "a new term: {epoch}");
    bs[1].set_health_mode(Mode::Status(500));
    n.wait_for("the new leader acts on t1", || async {
        n.actions()
            .await
            .iter()
            .any(|a| a["target"] == "t1")
            .then_some(())
    })
    .await;
    // Nothing was decided twice: one action per target.
    let actions = n.actions().await;
    let mut targets: Vec<&str> = actions
        .iter()
        .map(|a| a["target"].as_str().unwrap())
        .collect();
    targets.sort();
    assert_eq!(targets, ["t0", "t1"], "{actions:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_stopped_with_sigterm_resigns_and_another_leads_in_about_a_second() {
    let schema = Schema::new("term");
    let bs = backends(2);
    let targets = targets_toml(&bs);
    // A long TTL: only resigning explains a quick takeover.
    let (_dirs, mut cs) = start_replicas(2, &schema, "30s", &targets);
    let all: Vec<&Controller> = cs.iter().map(|c| c.as_ref().unwrap()).collect();
    let first = one_leader(&all).await;
    let stopped_at = Instant::now();
    let status = cs[first].take().unwrap().sigterm();
    assert!(status.success(), "SIGTERM exits 0: {status}");
    let other = cs.iter().flatten().next().unwrap();
    other
        .wait_for("the other replica leads", || async {
            (leader(other).await["leading"] == true).then_some(())
        })
        .await;
    let took = stopped_at.elapsed();
    eprintln!("takeover after SIGTERM: {took:?} (ttl 30s)");
    assert!(
        took < Duration::from_secs(5),
        "took {took:?}: the lease was not resigned (TTL 30 s)"
    );
}

/// A target of the test's own on loopback: counts the probes of each replica (by the
/// `(replica <id>)` in their User-Agent) and answers 500 to the replicas it is told to
/// fail for (`*`: everyone), 200 with a passing health+json body to the others.
struct Counted {
    addr: std::net::SocketAddr,
    hits: Arc<Mutex<HashMap<String, u64>>>,
    fail_for: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Counted {
    async fn start() -> Counted {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
        let fail_for: Arc<Mutex<Vec<String>>> = Arc::default();
        let (h, f) = (hits.clone(), fail_for.clone());
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (h, f) = (h.clone(), f.clone());
                tokio::spawn(serve_health(conn, move |head| Self::fails(head, &h, &f)));
            }
        });
        Counted {
            addr,
            hits,
            fail_for,
            task,
        }
    }

    /// Counts a request by the replica its User-Agent names, and fails it when
    /// `fail_for` names that replica (or `*`).
    fn fails(
        head: &str,
        hits: &Mutex<HashMap<String, u64>>,
        fail_for: &Mutex<Vec<String>>,
    ) -> bool {
        let replica = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("user-agent").then_some(v)
            })
            .and_then(|ua| ua.split("(replica ").nth(1))
            .map(|r| r.trim_end_matches(')').to_string())
            .unwrap_or_default();
        *hits.lock().unwrap().entry(replica.clone()).or_default() += 1;
        let f = fail_for.lock().unwrap();
        f.iter().any(|x| x == "*" || *x == replica)
    }

    fn hits(&self) -> HashMap<String, u64> {
        self.hits.lock().unwrap().clone()
    }

    fn reset(&self) {
        self.hits.lock().unwrap().clear();
    }

    fn fail_for(&self, who: &[&str]) {
        *self.fail_for.lock().unwrap() = who.iter().map(|s| s.to_string()).collect();
    }
}

fn counted_targets_toml(servers: &[Counted]) -> String {
    servers
        .iter()
        .enumerate()
        .map(|(i, s)| {
            format!(
                "[[targets]]\nid = \"t{i}\"\nurl = \"http://{}\"\nzone = \"a\"\ngroup = \"web\"\n",
                s.addr
            )
        })
        .collect()
}

/// Each target's probers as `c` says (`GET /api/probing`), once it sees `n` live
/// replicas; every replica of `cs` must give the same answer.
async fn assignments(cs: &[&Controller], n: usize) -> BTreeMap<String, BTreeSet<String>> {
    let mut seen = Vec::new();
    for c in cs {
        let p = c
            .wait_for(&format!("{n} live replicas share the probing"), || async {
                let p = c.get("/api/probing").await;
                (p["live"].as_array().map(Vec::len) == Some(n)).then_some(p)
            })
            .await;
        assert_eq!(p["sharded"], true, "{p}");
        let a: BTreeMap<String, BTreeSet<String>> = p["targets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                (
                    t["id"].as_str().unwrap().to_string(),
                    t["probers"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|r| r.as_str().unwrap().to_string())
                        .collect(),
                )
            })
            .collect();
        seen.push(a);
    }
    for other in &seen[1..] {
        assert_eq!(other, &seen[0], "replicas disagree on who probes what");
    }
    seen.swap_remove(0)
}

/// Resets the counts, waits until every target was probed at least `min` times by
/// each of its probers, then asserts nobody else probed it.
async fn probed_exactly_by(
    c: &Controller,
    servers: &[Counted],
    expected: &BTreeMap<String, BTreeSet<String>>,
    min: u64,
) {
    for s in servers {
        s.reset();
    }
    c.wait_for("every target probed by each of its probers", || async {
        servers
            .iter()
            .enumerate()
            .all(|(i, s)| {
                let h = s.hits();
                expected[&format!("t{i}")]
                    .iter()
                    .all(|r| h.get(r).copied().unwrap_or(0) >= min)
            })
            .then_some(())
    })
    .await;
    for (i, s) in servers.iter().enumerate() {
        let probed: BTreeSet<String> = s.hits().keys().cloned().collect();
        assert_eq!(
            &probed,
            &expected[&format!("t{i}")],
            "t{i} must be probed by its probers and nobody else: {:?}",
            s.hits()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_probe_each_target_twice_and_one_prober_alone_cannot_fail_a_target() {
    let schema = Schema::new("shard");
    let servers: Vec<Counted> = futures_join(20).await;
    let targets = counted_targets_toml(&servers);
    let (_dirs, mut cs) = start_replicas(3, &schema, "2s", &targets);
    let all: Vec<&Controller> = cs.iter().map(|c| c.as_ref().unwrap()).collect();
    let lead = one_leader(&all).await;
    let leader_id = format!("r{lead}");
    let expected = assignments(&all, 3).await;
    assert!(
        expected.values().all(|p| p.len() == 2),
        "two probers per target: {expected:?}"
    );
    for r in ["r0", "r1", "r2"] {
        let share = expected.values().filter(|p| p.contains(r)).count();
        assert!(share > 0, "{r} probes nothing: {expected:?}");
    }
    probed_exactly_by(all[lead], &servers, &expected, 3).await;

    // A target that fails only for the leader's probes (its other prober sees it pass)
    // is never made unhealthy; a target failing for both its probers is acted on.
    let (lying, _) = expected
        .iter()
        .find(|(_, p)| p.contains(&leader_id))
        .expect("the leader probes some target");
    let (broken, _) = expected
        .iter()
        .find(|(t, _)| t != &lying)
        .expect("20 targets");
    let index = |t: &str| t[1..].parse::<usize>().unwrap();
    servers[index(lying)].fail_for(&[&leader_id]);
    servers[index(broken)].fail_for(&["*"]);
    let acted = all[lead]
        .wait_for_actions("the leader acts on the broken target")
        .await;
    assert_eq!(acted.len(), 1, "{acted:?}");
    assert_eq!(&acted[0]["target"], broken.as_str(), "{acted:?}");
    let refused = servers[index(lying)].hits()[&leader_id];
    assert!(
        refused >= 5,
        "the leader's probes of {lying} failed {refused} times"
    );
    let t = all[lead].get(&format!("/api/targets/{lying}")).await;
    assert_eq!(
        t["target"]["state"], "healthy",
        "{lying} failed only for one of its two probers ({refused} probes): {t}"
    );
    assert_eq!(t["target"]["consecutive_failures"], 0, "{t}");
    let decided: Vec<Value> = all[lead]
        .decisions()
        .await
        .into_iter()
        .filter(|d| d["target"] == lying.as_str())
        .collect();
    assert!(decided.is_empty(), "no decision on {lying}: {decided:?}");
    servers[index(broken)].fail_for(&[]);

    // SIGKILL a follower: once its heartbeat is older than the TTL, its targets are
    // probed by the two survivors, each target by both.
    let victim = (lead + 1) % 3;
    cs[victim].take().unwrap().sigkill();
    let rest: Vec<&Controller> = cs.iter().flatten().collect();
    let l = rest[if victim < lead { lead - 1 } else { lead }];
    let after = assignments(&rest, 2).await;
    let survivors: BTreeSet<String> = [0, 1, 2]
        .iter()
        .filter(|&&i| i != victim)
        .map(|i| format!("r{i}"))
        .collect();
    assert!(
        after.values().all(|p| *p == survivors),
        "every target probed by both survivors: {after:?}"
    );
    let moved = expected
        .values()
        .filter(|p| p.contains(&format!("r{victim}")))
        .count();
    eprintln!("a follower killed: {moved} of 20 targets moved to the survivors");
    probed_exactly_by(l, &servers, &after, 3).await;
    let t = l.get(&format!("/api/targets/{lying}")).await;
    assert_eq!(t["target"]["state"], "healthy", "{t}");
}

/// A follower cut off from every target (each fails only its probes) cannot fail
/// any of them, and the leader says so: its dissent ratio reaches 1, a WARN names it,
/// and nothing is acted on (its targets are in doubt: the guard holds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_failing_every_target_alone_is_named_by_the_leader() {
    let schema = Schema::new("dissent");
    let servers: Vec<Counted> = futures_join(12).await;
    let targets = counted_targets_toml(&servers);
    let (_dirs, cs) = start_replicas(3, &schema, "2s", &targets);
    let all: Vec<&Controller> = cs.iter().map(|c| c.as_ref().unwrap()).collect();
    let lead = one_leader(&all).await;
    let cut = format!("r{}", (lead + 1) % 3);
    all[lead].wait_all(12, "healthy").await;
    for s in &servers {
        s.fail_for(&[&cut]);
    }
    let series = format!("vigil_controller_prober_dissent_ratio{{replica=\"{cut}\"}}");
    all[lead]
        .wait_for(
            &format!("the leader names {cut} as failing alone"),
            || async {
                let m = all[lead].metrics_text().await;
                let named = all[lead].logs().contains(&format!("replica {cut} fails "));
                (sample(&m, &series).is_some_and(|r| r >= 0.99) && named).then_some(())
            },
        )
        .await;
    for r in (0..3).map(|i| format!("r{i}")).filter(|r| *r != cut) {
        let m = all[lead].metrics_text().await;
        let s = format!("vigil_controller_prober_dissent_ratio{{replica=\"{r}\"}}");
        assert_eq!(sample(&m, &s), Some(0.0), "{r} agrees with the others");
    }
    assert!(all[lead].actions().await.is_empty(), "nothing acted on");
    let t = all[lead].targets().await;
    assert!(
        t.iter().all(|t| t["state"] == "healthy"),
        "one prober alone fails no target: {t:?}"
    );
}

async fn futures_join(n: usize) -> Vec<Counted> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(Counted::start().await);
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_controller_on_sqlite_probes_every_target_itself() {
    let servers: Vec<Counted> = futures_join(5).await;
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::start(
        dir.path(),
        &(base_config("") + &counted_targets_toml(&servers)),
    );
    let p = c.get("/api/probing").await;
    assert_eq!(p["sharded"], false, "{p}");
    assert_eq!(p["share"], 5, "{p}");
    let expected: BTreeMap<String, BTreeSet<String>> = (0..5)
        .map(|i| (format!("t{i}"), BTreeSet::from([String::new()])))
        .collect();
    // Alone, it names no replica in its User-Agent.
    probed_exactly_by(&c, &servers, &expected, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_on_the_lease_table_fails_the_leaders_calls_in_time_and_it_demotes() {
    let schema = Schema::new("lock");
    let bs = backends(2);
    let ttl = Duration::from_secs(2);
    let (_dirs, cs) = start_replicas(1, &schema, "2s", &targets_toml(&bs));
    let c = cs[0].as_ref().unwrap();
    one_leader(&[c]).await;
    // Another session takes the lease table: every statement on it waits for the lock.
    let (release, released) = std::sync::mpsc::channel::<()>();
    let (locked_tx, locked) = std::sync::mpsc::channel::<()>();
    let url = schema.url.clone();
    let holder = std::thread::spawn(move || {
        let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let mut tx = client.transaction().unwrap();
        tx.batch_execute("LOCK TABLE leases IN ACCESS EXCLUSIVE MODE")
            .unwrap();
        locked_tx.send(()).unwrap();
        // Bounded: a test that fails must not leave the lock behind.
        let _ = released.recv_timeout(Duration::from_secs(60));
        tx.rollback().unwrap();
    });
    locked.recv().unwrap();
    let locked_at = Instant::now();
    // A mutation's commit locks the lease row (the fence): it must fail in time, not
    // hang until the lock goes.
    let answered = tokio::time::timeout(
        Duration::from_secs(10),
        c.post(
            "/api/targets/t0/silence",
            Some(TOKEN),
            serde_json::json!({"for": "1h", "reason": "x"}),
        ),
    )
    .await;
    let took = locked_at.elapsed();
    let (code, body) = answered.unwrap_or_else(|_| {
        let _ = release.send(());
        panic!("a mutation hung behind the lock for {took:?}: statements are not bounded")
    });
    assert_eq!(code, 503, "{body}");
    assert!(body.to_string().contains("lock timeout"), "{body}");
    assert!(
        took < ttl,
        "the store answered after {took:?}, past the lease TTL {ttl:?}"
    );
    // The lease cannot be renewed: the leader stops leading before it could expire.
    c.wait_for("the leader demotes", || async {
        (leader(c).await["leading"] == false).then_some(())
    })
    .await;
    let demoted = locked_at.elapsed();
    eprintln!("store error after {took:?}, demoted after {demoted:?} (ttl {ttl:?})");
    assert!(
        demoted < ttl + Duration::from_millis(1500),
        "demoted after {demoted:?} (ttl {ttl:?}, +1.5 s for a loaded machine)"
    );
    release.send(()).unwrap();
    holder.join().unwrap();
    c.wait_for("it leads again once the lock is gone", || async {
        (leader(c).await["leading"] == true).then_some(())
    })
    .await;
}

/// Heartbeats reach whichever replica a worker's address leads to: the leader judges
/// heartbeat targets by every replica's heartbeats (through the store), so workers
/// beating only to a follower are healthy, and the one that stops is the one acted on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_heartbeating_to_a_follower_are_judged_by_the_leader_from_its_heartbeats() {
    let schema = Schema::new("beats");
    let workers: Vec<String> = (0..5).map(|i| format!("w{i}")).collect();
    let targets = format!("[heartbeat]\nttl = \"1s\"\nsecret = \"{HEARTBEAT_SECRET}\"\n")
        + &workers
            .iter()
            .map(|w| format!("[[targets]]\nid = \"{w}\"\nheartbeat = true\nzone = \"a\"\n"))
            .collect::<String>();
    let (_dirs, cs) = start_replicas(2, &schema, "2s", &targets);
    let all: Vec<&Controller> = cs.iter().map(|c| c.as_ref().unwrap()).collect();
    let lead = one_leader(&all).await;
    let (leader, follower) = (all[lead], all[1 - lead]);
    let beat_to_follower = |ids: Vec<String>| async move {
        for id in ids {
            let beat = Beat::signed(&id, None, &heartbeat_key(HEARTBEAT_SECRET, &id));
            assert_eq!(follower.beat(&beat).await, 202, "{id}");
        }
    };
    let state = |t: &[Value], id: &str| {
        t.iter()
            .find(|t| t["id"] == id)
            .and_then(|t| t["state"].as_str().map(String::from))
    };
    // Every worker beats to the follower alone: the leader sees them all healthy.
    leader
        .wait_for("the leader sees every worker healthy", || {
            let ids = workers.clone();
            async move {
                beat_to_follower(ids.clone()).await;
                let t = leader.targets().await;
                ids.iter()
                    .all(|w| state(&t, w).as_deref() == Some("healthy"))
                    .then_some(())
            }
        })
        .await;
    // w4 stops beating: the leader finds it unhealthy and acts on it, on it alone.
    let beating: Vec<String> = workers[..4].to_vec();
    let acted = leader
        .wait_for("the leader acts on w4", || {
            let ids = beating.clone();
            async move {
                beat_to_follower(ids).await;
                let a = leader.actions().await;
                (!a.is_empty()).then_some(a)
            }
        })
        .await;
    assert_eq!(acted.len(), 1, "{acted:?}");
    assert_eq!(acted[0]["target"], "w4", "{acted:?}");
    beat_to_follower(beating.clone()).await;
    let t = leader.targets().await;
    for w in &beating {
        assert_eq!(state(&t, w).as_deref(), Some("healthy"), "{w}: {t:?}");
    }
    let decided: Vec<Value> = leader
        .decisions()
        .await
        .into_iter()
        .filter(|d| d["target"] != "w4")
        .collect();
    assert!(decided.is_empty(), "only w4 is decided on: {decided:?}");
}
