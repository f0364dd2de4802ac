//! End-to-end: `vigil demo --replicas 2` on the machine's real PostgreSQL (every machine
//! has it, CI's included). `c` SIGKILLs the controller replica that leads: the other
//! takes the lease over and the narration says so; then `k` kills svc-1 and the new
//! leader acts on it, once. Stopping the demo drops the schemas it created and leaves
//! none of its processes behind.

use crate::demo_support;

use demo_support::{children_of, get_json, said, spawn_demo, wait_until};
use std::io::Write;
use std::time::{Duration, Instant};

// A port block away from tests/demo.rs' (17800, 17900) and demo_queue's (18000).
const BASE: u16 = 18100;
const SERVICES: u16 = 4;
const DEADLINE: Duration = Duration::from_secs(60);

fn pg_url() -> String {
    std::env::var("VIGIL_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// The demo's schemas still on the server (`vigil_demo_<pid>_<run>`), asked from a
/// thread of its own (the blocking client cannot run on the test's runtime).
fn schemas_of(pid: u32) -> Vec<String> {
    std::thread::spawn(move || schemas_now(pid)).join().unwrap()
}

fn schemas_now(pid: u32) -> Vec<String> {
    let mut c = postgres::Client::connect(&pg_url(), postgres::NoTls).unwrap_or_else(|e| {
        panic!("PostgreSQL at {} is unreachable ({e}): this test needs it (127.0.0.1:5432, trust, database `test`; VIGIL_TEST_POSTGRES for another)", pg_url())
    });
    c.query(
        "SELECT schema_name::TEXT FROM information_schema.schemata WHERE schema_name LIKE $1",
        &[&format!("vigil_demo_{pid}_%")],
    )
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// The replica that says it leads, among the demo's two (`r1` on BASE + 2, `r2` after
/// the services' ports).
async fn leading() -> Option<String> {
    for port in [BASE + 2, BASE + 3 + 2 * SERVICES] {
        if let Some(l) = get_json(&format!("http://127.0.0.1:{port}/api/leader")).await
            && l["leading"].as_bool() == Some(true)
        {
            return l["replica"].as_str().map(str::to_string);
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_demo_with_two_replicas_fails_over_when_the_leader_is_killed_and_acts_on() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--replicas",
        "2",
        "--base-port",
        &BASE.to_string(),
        "--services",
        &SERVICES.to_string(),
        "--rps",
        "20",
        "--data-dir",
        &dir.path().display().to_string(),
        "--db",
        "postgres://nobody@127.0.0.1:1/none",
        "--postgres",
        &pg_url(),
    ]
    .map(String::from);
    let (mut demo, mut stdin, narration) = spawn_demo(&args);
    let pid = demo.0.id();
    let mut key = |k: &str| {
        println!("[test] key {k}");
        writeln!(stdin, "{k}").unwrap();
    };
    wait_until("one replica leads", DEADLINE, || async {
        leading().await.is_some()
    })
    .await;
    let first = leading().await.unwrap();
    assert_eq!(schemas_of(pid), [format!("vigil_demo_{pid}_1")]);
    wait_until(
        "every service in service at the controller",
        DEADLINE,
        || async {
            get_json(&format!("http://127.0.0.1:{}/api/targets", BASE + 2))
                .await
                .and_then(|v| {
                    v["targets"].as_array().map(|ts| {
                        ts.len() == usize::from(SERVICES)
                            && ts.iter().all(|t| t["health"] == "healthy")
                    })
                })
                .unwrap_or(false)
        },
    )
    .await;

    key("c");
    wait_until(
        "the narration names the killed leader",
        DEADLINE,
        || async {
            said(
                &narration,
                &["BREAK kill-leader", &format!("replica {first}")],
            )
        },
    )
    .await;
    wait_until("the other replica leads", DEADLINE, || async {
        leading().await.is_some_and(|l| l != first)
    })
    .await;
    let second = leading().await.unwrap();
    wait_until(
        "the narration says who leads now and how soon",
        DEADLINE,
        || async {
            said(
                &narration,
                &[
                    &format!("replica {second} LEADS NOW"),
                    &format!("after {first} was killed"),
                ],
            )
        },
    )
    .await;

    // The new leader acts: svc-1 killed is acted on, once, by it.
    key("k");
    wait_until("the new leader acts on svc-1", DEADLINE, || async {
        said(&narration, &["controller: act svc-1"])
    })
    .await;
    let port = if second == "r1" {
        BASE + 2
    } else {
        BASE + 3 + 2 * SERVICES
    };
    let actions = get_json(&format!("http://127.0.0.1:{port}/api/decisions?limit=50"))
        .await
        .expect("the leader's decisions");
    let acts: Vec<&serde_json::Value> = actions["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["outcome"] == "act")
        .collect();
    assert_eq!(acts.len(), 1, "{acts:?}");
    assert_eq!(acts[0]["target"], "svc-1");

    key("q");
    let deadline = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(s) = demo.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the demo did not stop on q");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "{status}");
    assert!(children_of(pid).is_empty(), "{:?}", children_of(pid));
    assert_eq!(
        schemas_of(pid),
        Vec::<String>::new(),
        "the schemas are dropped"
    );
}
