//! `vigil controller` as a real process: real HTTP targets (vigil-testkit backends on
//! loopback), real SQLite, signals. Every wait polls with a generous deadline.

#[path = "../controller_support/mod.rs"]
mod controller_support;

use controller_support::*;
use serde_json::{Value, json};
use std::time::Duration;
use vigil_core::Status;
use vigil_testkit::Mode;

fn acts(actions: &[Value]) -> Vec<String> {
    actions
        .iter()
        .map(|a| a["target"].as_str().unwrap_or("").to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_of_ten_failing_gets_exactly_one_action_after_the_thresholds() {
    let dir = tempfile::tempdir().unwrap();
    let bs = backends(10);
    let c = Controller::start(dir.path(), &(base_config("") + &targets_toml(&bs)));
    c.wait_all(10, "healthy").await;
    // Degraded (warn) is healthy for replacement purposes.
    bs[6].set_check("cache:hits", Status::Warn);
    bs[3].set_check("disk:free", Status::Fail);
    let actions = c.wait_for_actions("one action").await;
    assert_eq!(acts(&actions), ["t3"]);
    // Another 15 probe intervals: still exactly one (the target stays failing).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let actions = c.actions().await;
    assert_eq!(acts(&actions), ["t3"], "acted more than once: {actions:#?}");
    let a = &actions[0];
    assert_eq!(a["state"], "done", "the log actuator finishes: {a}");
    let reasons = &a["event"]["reasons"];
    let failing = &reasons[0];
    assert_eq!(failing["kind"], "failing");
    assert!(failing["failures"].as_u64().unwrap() >= 3, "N=3: {failing}");
    let summary = a["event"]["summary"].as_str().unwrap();
    assert!(
        summary.contains("local check disk:free failed"),
        "{summary}"
    );
    let t3 = c.get("/api/targets/t3").await;
    assert_eq!(t3["target"]["state"], "reported");
    assert!(
        t3["transitions"].as_array().unwrap().len() >= 2,
        "history of t3: {t3}"
    );
    assert!(
        c.logs().contains("REPLACE target (dry run"),
        "log actuator logs"
    );
    let t6 = c.get("/api/targets/t6").await;
    assert_eq!(t6["target"]["state"], "healthy", "warn is healthy: {t6}");
    assert_eq!(t6["target"]["last_probe"]["health"], "warn");
    let metrics = reqwest::get(c.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "vigil_controller_target_up{target=\"t3\",zone=\"a\"} 0",
        "vigil_controller_target_up{target=\"t6\",zone=\"a\"} 1",
        "vigil_controller_decisions_total{outcome=\"act\"} 1",
        "vigil_controller_guard_frozen 0",
        "vigil_controller_guard_budget_left 1",
        "vigil_controller_actions_total{kind=\"replace\",result=\"done\"} 1",
    ] {
        assert!(
            metrics.contains(line),
            "/metrics lacks {line:?}:\n{metrics}"
        );
    }
    assert!(metrics.contains("vigil_controller_probe_duration_seconds_bucket{le="));
    assert!(metrics.contains("vigil_controller_probes_total{result=\"fail\"}"));
    assert!(c.sigterm().success(), "SIGTERM exits 0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_of_ten_failing_freezes_with_the_reason_and_unfreezes_on_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let bs = backends(10);
    let c = Controller::start(dir.path(), &(base_config("") + &targets_toml(&bs)));
    c.wait_all(10, "healthy").await;
    for b in &bs[..5] {
        b.set_check("disk:free", Status::Fail);
    }
    // The freeze starts at 4/10 (above 30%); its reason follows the count to 5/10.
    let g = c
        .wait_for("frozen with 5/10", || async {
            let g = c.guard().await;
            (g["frozen"] == true && g["reasons"][0].as_str()?.contains("5/10")).then_some(g)
        })
        .await;
    let reason = g["reasons"][0].as_str().unwrap().to_string();
    // The reason names what fails, and a local check is no shared dependency.
    assert!(
        reason.starts_with("fleet-wide failure: 5/10 unhealthy")
            && reason.contains("5 of 5 fail disk:free (local)")
            && !reason.contains("shared dependency or"),
        "{reason}"
    );
    // Long enough for every failing target to pass N and T several times over.
    c.wait_for("hold-back decisions for all five", || async {
        let d = c.decisions().await;
        (d.len() >= 5).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(c.actions().await.is_empty(), "acted while frozen");
    // How long the freeze has lasted is a metric (to alert on).
    let metrics = reqwest::get(c.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let frozen_for: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("vigil_controller_guard_frozen_seconds "))
        .unwrap_or_else(|| panic!("no frozen_seconds gauge:\n{metrics}"))
        .trim()
        .parse()
        .unwrap();
    assert!(frozen_for > 0.0, "frozen for {frozen_for} s");
    let d = c.decisions().await;
    assert!(d.iter().all(|d| d["outcome"] == "hold_back"));
    assert!(
        d.iter().all(|d| d["summary"]
            .as_str()
            .unwrap()
            .contains("fleet-wide failure")),
        "every decision says why: {d:#?}"
    );
    for b in &bs[..5] {
        b.clear_checks();
    }
    c.wait_for("unfrozen", || async {
        (c.guard().await["frozen"] == false).then_some(())
    })
    .await;
    c.wait_all(10, "healthy").await;
    assert!(c.actions().await.is_empty());
    let events = c.get("/api/guard").await["events"].to_string();
    assert!(events.contains("fleet unfrozen"), "{events}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_dependency_failure_is_attributed_and_nobody_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let bs = backends(10);
    let c = Controller::start(dir.path(), &(base_config("") + &targets_toml(&bs)));
    c.wait_all(10, "healthy").await;
    // Two of ten fail the same dependency check: under the cap, but shared.
    bs[0].set_check("postgres:connect", Status::Fail);
    bs[1].set_check("postgres:connect", Status::Fail);
    c.wait_for("attribution decisions", || async {
        let d = c.decisions().await;
        (d.len() >= 2).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        c.actions().await.is_empty(),
        "replaced for a shared dependency"
    );
    let d = c.decisions().await;
    assert!(
        d.iter().all(|d| d["summary"]
            .as_str()
            .unwrap()
            .contains("failure attributed to shared dependency postgres:connect")),
        "{d:#?}"
    );
    assert_eq!(c.guard().await["frozen"], false, "2/10 is under the cap");
    // Now all ten: frozen as well, still nobody replaced.
    for b in &bs {
        b.set_check("postgres:connect", Status::Fail);
    }
    c.wait_for("frozen", || async {
        (c.guard().await["frozen"] == true).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(c.actions().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_and_restart_keep_budget_damping_and_decisions_without_a_burst() {
    let dir = tempfile::tempdir().unwrap();
    let bs = backends(10);
    let c = Controller::start(dir.path(), &(base_config("") + &targets_toml(&bs)));
    c.wait_all(10, "healthy").await;
    // Two failures one after the other: the budget (2 per 10 minutes) is spent.
    for (i, want) in [(1, 1), (2, 2)] {
        bs[i].set_check("disk:free", Status::Fail);
        c.wait_for(&format!("{want} actions"), || async {
            (c.actions().await.len() == want).then_some(())
        })
        .await;
    }
    // The guard's view is published after the actions are committed.
    c.wait_for("the budget spent", || async {
        (c.guard().await["budget_left"] == 0).then_some(())
    })
    .await;
    let penalty_before = c.get("/api/targets/t1").await["target"]["penalty"]
        .as_u64()
        .unwrap();
    assert!(penalty_before > 0, "a failure earns a flap penalty");
    let decisions_before = c.decisions().await;
    c.sigkill();

    // A third target fails while the controller is down; then it restarts.
    bs[3].set_check("disk:free", Status::Fail);
    let c = Controller::start_existing(dir.path());
    assert!(
        c.logs().contains("guard recovered"),
        "restart recovers: {}",
        c.logs()
    );
    let held = c
        .wait_for("t3 held back by the budget", || async {
            c.decisions().await.into_iter().find(|d| {
                d["target"] == "t3"
                    && d["summary"]
                        .as_str()
                        .unwrap()
                        .contains("action budget exhausted")
            })
        })
        .await;
    assert_eq!(held["outcome"], "hold_back");
    // A fourth, too: still only the budget's worth.
    bs[4].set_check("disk:free", Status::Fail);
    c.wait_for("t4 held back", || async {
        c.decisions()
            .await
            .iter()
            .any(|d| d["target"] == "t4" && d["outcome"] == "hold_back")
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let actions = c.actions().await;
    assert_eq!(
        acts(&actions),
        ["t2", "t1"],
        "no burst after a restart: {actions:#?}"
    );
    assert_eq!(
        c.guard().await["budget_left"],
        0,
        "the budget was not reset"
    );
    let penalty_after = c.get("/api/targets/t1").await["target"]["penalty"]
        .as_u64()
        .unwrap();
    assert!(
        penalty_after > 0 && penalty_after <= penalty_before,
        "damping survives (decays only): {penalty_before} -> {penalty_after}"
    );
    let decisions_after = c.decisions().await;
    for d in &decisions_before {
        assert!(
            decisions_after
                .iter()
                .any(|a| a["id"] == d["id"] && a["summary"] == d["summary"]),
            "decision {} lost across SIGKILL",
            d["id"]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutating_api_calls_without_the_token_get_401_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let bs = backends(2);
    let c = Controller::start(dir.path(), &(base_config("") + &targets_toml(&bs)));
    c.wait_all(2, "healthy").await;
    for token in [None, Some("wrong-token")] {
        let (code, body) = c.post("/api/freeze", token, json!({"reason": "x"})).await;
        assert_eq!(code, 401, "{body}");
        let (code, _) = c
            .post("/api/targets/t0/maintenance", token, json!({"reason": "x"}))
            .await;
        assert_eq!(code, 401);
        assert_eq!(c.delete("/api/freeze", token).await, 401);
    }
    let g = c.guard().await;
    assert_eq!(g["manual_freeze"], Value::Null, "nothing changed: {g}");
    assert!(c.targets().await.iter().all(|t| t["hold"].is_null()));
    assert!(c.decisions().await.is_empty());
    // With the token: it works, and is persisted across a restart.
    let (code, _) = c
        .post("/api/freeze", Some(TOKEN), json!({"reason": "incident 42"}))
        .await;
    assert_eq!(code, 200);
    let (code, _) = c
        .post(
            "/api/targets/t1/silence",
            Some(TOKEN),
            json!({"reason": "known issue", "for": "1h"}),
        )
        .await;
    assert_eq!(code, 200);
    let (code, _) = c
        .post("/api/targets/nope/silence", Some(TOKEN), json!({}))
        .await;
    assert_eq!(code, 404);
    assert!(c.sigterm().success());
    let c = Controller::start_existing(dir.path());
    let g = c.guard().await;
    assert_eq!(g["manual_freeze"], "incident 42");
    assert_eq!(g["frozen"], true);
    let t1 = c.get("/api/targets/t1").await;
    assert_eq!(t1["target"]["hold"]["reason"], "known issue");
    assert_eq!(t1["target"]["state"], "silenced");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_health_responses_count_as_failures() {
    let dir = tempfile::tempdir().unwrap();
    let bs = backends(5);
    let c = Controller::start(dir.path(), &(base_config("") + &targets_toml(&bs)));
    c.wait_all(5, "healthy").await;
    bs[2].set_health_mode(Mode::Garbage);
    let a = c.wait_for_actions("an action on t2").await;
    assert_eq!(acts(&a), ["t2"]);
    let t2 = c.get("/api/targets/t2").await;
    let detail = t2["target"]["last_probe"]["detail"].as_str().unwrap();
    assert!(detail.contains("garbage health response"), "{detail}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_flapping_every_probe_is_damped_not_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let bs = backends(10);
    let cfg = base_config("[guard.damping]\nhalf_life = \"10m\"\n") + &targets_toml(&bs);
    let c = Controller::start(dir.path(), &cfg);
    c.wait_all(10, "healthy").await;
    // Fail, pass, fail, ... on every probe, whatever the timing: never three failures in
    // a row, a new failure episode every other probe.
    bs[5].flap_check("disk:free", Status::Fail);
    let t = c
        .wait_for("t5 flapping", || async {
            let t = c.get("/api/targets/t5").await["target"].clone();
            (t["flapping"] == true).then_some(t)
        })
        .await;
    assert!(t["penalty"].as_u64().unwrap() >= 2000, "{t}");
    bs[5].set_check("disk:free", Status::Fail);
    // It now fails steadily: still damped, reported as flapping, not replaced.
    c.wait_for("a flapping decision", || async {
        c.decisions()
            .await
            .iter()
            .any(|d| d["target"] == "t5" && d["summary"].as_str().unwrap().contains("flapping"))
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        c.actions().await.is_empty(),
        "a flapping target was replaced"
    );
    assert!(c.logs().contains("is flapping"), "the flap is logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_target_from_discovery_forgets_it_and_a_bad_file_keeps_the_old_list() {
    let dir = tempfile::tempdir().unwrap();
    let bs = backends(3);
    let list = |n: usize| {
        let v: Vec<Value> = bs[..n]
            .iter()
            .enumerate()
            .map(|(i, b)| json!({"id": format!("d{i}"), "url": format!("http://{}", b.addr()), "zone": "z"}))
            .collect();
        serde_json::to_string(&v).unwrap()
    };
    let file = dir.path().join("targets.json");
    std::fs::write(&file, list(3)).unwrap();
    let cfg = base_config("[discovery]\npath = \"targets.json\"\npoll = \"100ms\"\n");
    let c = Controller::start(dir.path(), &cfg);
    c.wait_all(3, "healthy").await;
    std::fs::write(&file, list(2)).unwrap();
    c.wait_for("d2 forgotten", || async {
        let t = c.targets().await;
        (t.len() == 2 && t.iter().all(|t| t["id"] != "d2")).then_some(())
    })
    .await;
    let metrics = reqwest::get(c.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !metrics.contains("target=\"d2\""),
        "removed target's series forgotten"
    );
    std::fs::write(&file, "[{\"id\": \"broken\", \"url\": ").unwrap();
    c.wait_for("the rejection logged", || async {
        c.logs()
            .contains("discovery file rejected; keeping the previous target list")
            .then_some(())
    })
    .await;
    assert_eq!(c.targets().await.len(), 2, "the old list stays");
}

#[test]
fn bad_config_exits_78_naming_file_line_and_key_for_syntax_and_range_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.toml");
    std::fs::write(&path, "[probe]\ninterval = \"1s\"\nintervall = \"2s\"\n").unwrap();
    for verb in [
        &["controller", "check-config", "-c"][..],
        &["controller", "-c"][..],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args(verb)
            .arg(&path)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{err}");
        assert!(
            err.contains("fleet.toml:3:1: key `probe.intervall`: unknown field")
                && err.contains("    3 | intervall = \"2s\""),
            "{err}"
        );
    }
    std::fs::write(&path, "[guard]\nmax_unhealthy_fraction = 3.0\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["controller", "check-config", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    // A value out of range is located like a syntax error: file, line, column, key and
    // the line itself (the balancer's and the simulator's errors read the same).
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "fleet.toml:2:1: key `guard.max_unhealthy_fraction`: must be within 0..1, got 3"
        ) && err.contains("    2 | max_unhealthy_fraction = 3.0"),
        "{err}"
    );
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/fleet.toml");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["controller", "check-config", "-c", example])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_a_good_config_and_keeps_the_old_one_when_bad() {
    let dir = tempfile::tempdir().unwrap();
    let bs = backends(3);
    let c = Controller::start(dir.path(), &(base_config("") + &targets_toml(&bs[..2])));
    c.wait_all(2, "healthy").await;
    std::fs::write(
        dir.path().join("fleet.toml"),
        base_config("") + &targets_toml(&bs),
    )
    .unwrap();
    c.signal("HUP");
    c.wait_all(3, "healthy").await;
    std::fs::write(dir.path().join("fleet.toml"), "[probe]\njitter = 7\n").unwrap();
    c.signal("HUP");
    c.wait_for("rejection logged", || async {
        c.logs()
            .contains("SIGHUP: new config rejected; keeping the old one")
            .then_some(())
    })
    .await;
    assert_eq!(c.targets().await.len(), 3, "the old config stays in force");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_targets_fail_when_heartbeats_stop() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = base_config(&format!(
        "[heartbeat]\nttl = \"600ms\"\nsecret = \"{HEARTBEAT_SECRET}\"\n"
    )) + "[[targets]]\nid = \"w1\"\nheartbeat = true\n[[targets]]\nid = \"w2\"\nheartbeat = true\n";
    let c = Controller::start(dir.path(), &cfg);
    let beat = |id: &'static str| {
        let c = &c;
        async move {
            c.beat(&Beat::signed(
                id,
                None,
                &heartbeat_key(HEARTBEAT_SECRET, id),
            ))
            .await
        }
    };
    assert_eq!(beat("nope").await, 404, "only declared heartbeat targets");
    // Both beat for a while, then w2 stops.
    for _ in 0..15 {
        assert_eq!(beat("w1").await, 202);
        assert_eq!(beat("w2").await, 202);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.wait_all(2, "healthy").await;
    let c = &c;
    c.wait_for("w2 unhealthy, w1 healthy", || async move {
        beat("w1").await;
        let t = c.targets().await;
        let st = |id: &str| t.iter().find(|t| t["id"] == id).map(|t| t["state"].clone());
        (st("w1") == Some(json!("healthy"))
            && matches!(
                st("w2").as_ref().and_then(|s| s.as_str()),
                Some("unhealthy" | "reported")
            ))
        .then_some(())
    })
    .await;
    let t = c.get("/api/targets/w2").await;
    assert!(
        t["target"]["last_probe"]["detail"]
            .as_str()
            .unwrap()
            .contains("no heartbeat for"),
        "{t}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_target_is_not_judged_during_its_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let bs = backends(5);
    bs[0].set_check("disk:free", Status::Fail);
    let cfg = (base_config("") + &targets_toml(&bs)).replace("grace = \"0s\"", "grace = \"5s\"");
    let c = Controller::start(dir.path(), &cfg);
    // Failing from the first probe, yet in grace: shown as such, nothing decided.
    let t = c.get("/api/targets/t0").await["target"].clone();
    assert_eq!(t["state"], "grace", "{t}");
    assert!(c.decisions().await.is_empty());
    assert!(c.actions().await.is_empty());
    // After the grace period it is judged like any other.
    let a = c.wait_for_actions("an action on t0 after grace").await;
    assert_eq!(acts(&a), ["t0"]);
    let waited = a[0]["created_ms"].as_i64().unwrap();
    let started = c.get("/api/targets/t0").await["transitions"]
        .as_array()
        .unwrap()
        .last()
        .map(|t| t["at_ms"].as_i64().unwrap())
        .unwrap();
    assert!(waited >= started, "acted only after leaving grace");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_with_its_own_interval_is_probed_at_it() {
    let dir = tempfile::tempdir().unwrap();
    let bs = backends(2);
    let cfg = base_config("")
        + &format!(
            "[[targets]]\nid = \"fast\"\nurl = \"http://{}\"\n[[targets]]\nid = \"slow\"\nurl = \"http://{}\"\ninterval = \"1000h\"\n",
            bs[0].addr(),
            bs[1].addr()
        );
    let c = Controller::start(dir.path(), &cfg);
    c.wait_for("the fast target probed 10 times", || async {
        (bs[0].health_requests() >= 10).then_some(())
    })
    .await;
    assert_eq!(
        bs[1].health_requests(),
        0,
        "a 1000h interval is not probed within seconds (its first slot is random within it)"
    );
    drop(c);
}

/// A config for ordinary web servers (no health endpoint, no zone): `probe` keys and
/// the guard's grace as given.
fn plain_fleet(sites: &[vigil_testkit::Backend], probe: &str, grace: &str) -> String {
    let mut cfg = format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = \"data\"\n[probe]\ninterval = \"200ms\"\ntimeout = \"1s\"\n{probe}\n[guard]\ngrace = \"{grace}\"\nmin_failing = \"1s\"\n"
    );
    for (i, s) in sites.iter().enumerate() {
        cfg.push_str(&format!(
            "[[targets]]\nid = \"site-{i}\"\nurl = \"http://{}\"\n",
            s.addr()
        ));
    }
    cfg
}

/// The JSON log lines of `c` whose message is `message`.
fn log_lines(c: &Controller, message: &str) -> Vec<Value> {
    c.logs()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["message"] == message)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_web_servers_are_judged_by_their_status_and_a_wrong_path_is_logged_at_once() {
    let sites: Vec<_> = (0..3)
        .map(|i| vigil_testkit::Backend::start_plain(&format!("site-{i}")))
        .collect();
    // The default path (/health) on servers without it, in the default 60 s grace:
    // each target's first failure is logged with its reason within seconds.
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::start(dir.path(), &plain_fleet(&sites, "", "60s"));
    let failed = c
        .wait_for("a 'probe failed' line per target", || async {
            let l = log_lines(&c, "probe failed");
            (l.len() >= 3).then_some(l)
        })
        .await;
    for (i, line) in failed.iter().enumerate() {
        let reason = line["reason"].as_str().unwrap_or_default();
        assert!(
            reason.starts_with("HTTP 404") && reason.contains("is the path right?"),
            "{line}"
        );
        assert!(
            line["probe"]
                .as_str()
                .unwrap_or_default()
                .ends_with("/health"),
            "{line}"
        );
        assert_eq!(line["level"], "INFO", "{line}");
        if i == 0 {
            let t = c
                .get(&format!(
                    "/api/targets/{}",
                    line["target_id"].as_str().unwrap()
                ))
                .await;
            assert_eq!(t["target"]["state"], "grace", "still in grace: {t}");
        }
    }
    // Failing again is not logged again.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(log_lines(&c, "probe failed").len(), 3, "{}", c.logs());
    drop(c);

    // On a path they serve, plain statuses are health answers by default.
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::start(dir.path(), &plain_fleet(&sites, "path = \"/\"", "0s"));
    c.wait_all(3, "healthy").await;
    let t = c.get("/api/targets/site-0").await;
    assert_eq!(t["target"]["last_probe"]["status"], 200, "{t}");
    drop(c);

    // Demanding health+json fails them as garbage: the fleet freezes, and no message
    // names a zone they are not in.
    let dir = tempfile::tempdir().unwrap();
    let cfg = plain_fleet(&sites, "path = \"/\"\nanswers = \"health+json\"", "0s");
    let c = Controller::start(dir.path(), &cfg);
    c.wait_all(3, "unhealthy").await;
    let g = c
        .wait_for("the fleet frozen", || async {
            let g = c.guard().await;
            (g["frozen"] == true).then_some(g)
        })
        .await;
    let t = c.get("/api/targets/site-1").await;
    let detail = t["target"]["last_probe"]["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("garbage health response: HTTP 200"),
        "{detail}"
    );
    let logs = c.logs();
    for line in logs.lines() {
        let v: Value = serde_json::from_str(line).unwrap_or(Value::Null);
        assert!(v["zone"] != "", "a log line names the empty zone: {line}");
        let text = line.replace("zone-wide", "");
        assert!(
            !text.contains("zone  ") && !text.contains("zone :") && !text.contains("zone \""),
            "a log line names the empty zone: {line}"
        );
    }
    assert!(
        logs.contains("fleet frozen: fleet-wide failure: "),
        "{logs}\n{g}"
    );
}

#[path = "../aws_support/mod.rs"]
mod aws_support;

#[path = "../lb_support/mod.rs"]
mod lb_support;

// The other files of this binary (one binary per component: a 2-core machine
// links a handful of test binaries, not one per file).
mod actuators;
mod aws;
mod chaos;
mod crash;
mod dashboard;
mod discovery;
mod example_workers;
mod https;
mod liveness;
mod replicas;
mod store;
mod trust;
mod workers;
