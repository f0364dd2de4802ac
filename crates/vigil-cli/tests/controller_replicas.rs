//! Several `vigil controller` processes on one PostgreSQL schema: one leads (decides,
//! acts), the others follow and serve the API; a leader killed with SIGKILL is replaced
//! within the lease TTL plus a renewal period, one stopped with SIGTERM resigns and is
//! replaced in about a second. Real processes, real PostgreSQL (127.0.0.1:5432 on every
//! machine, CI's included: an unreachable server fails these tests, it does not skip
//! them), a schema of each test's own, dropped after.

mod controller_support;

use controller_support::*;
use serde_json::Value;
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
    assert!(body.to_string().contains("not the leader"), "{body}");

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
