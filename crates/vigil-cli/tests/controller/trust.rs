//! `vigil controller` as a real process against input it must not trust: forged
//! heartbeats, hostile API clients, hostile target ids. Real HTTP on loopback, real
//! SQLite, the real binary.

use crate::controller_support;

use controller_support::*;
use serde_json::{Value, json};
use std::time::Duration;

fn heartbeat_config(ttl: &str) -> String {
    base_config(&format!(
        "[heartbeat]\nttl = \"{ttl}\"\nsecret = \"{HEARTBEAT_SECRET}\"\nmax_skew = \"5s\"\n"
    )) + "[[targets]]\nid = \"w1\"\nheartbeat = true\n[[targets]]\nid = \"w2\"\nheartbeat = true\n"
}

fn passing() -> Value {
    json!({"status": "pass", "checks": {"disk:free": [{"status": "pass"}]}})
}

fn failing() -> Value {
    json!({"status": "fail", "checks": {"disk:free": [{"status": "fail", "output": "forged"}]}})
}

/// Waits a millisecond, so two heartbeats signed one after the other have distinct
/// timestamps (a second one in the same millisecond is a replay).
async fn next_ms() {
    tokio::time::sleep(Duration::from_millis(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_stale_and_replayed_heartbeats_change_nothing_and_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::start(dir.path(), &heartbeat_config("3s"));
    let k1 = heartbeat_key(HEARTBEAT_SECRET, "w1");
    let k2 = heartbeat_key(HEARTBEAT_SECRET, "w2");
    let legit = |id: &'static str, key: String| {
        let c = &c;
        async move {
            next_ms().await;
            let code = c.beat(&Beat::signed(id, Some(passing()), &key)).await;
            assert_eq!(code, 202, "a heartbeat signed with {id}'s key is accepted");
        }
    };
    c.wait_for("w1 and w2 healthy on signed heartbeats", || async {
        legit("w1", k1.clone()).await;
        legit("w2", k2.clone()).await;
        let t = c.targets().await;
        (t.len() == 2 && t.iter().all(|t| t["state"] == "healthy")).then_some(())
    })
    .await;
    let since = now_ms();

    // Forged failing reports for w1, between w1's own passing heartbeats: each would be
    // the latest heartbeat for ~100 ms, over a 200 ms probe interval, if it counted.
    const ROUNDS: usize = 20;
    for _ in 0..ROUNDS {
        let now = now_ms();
        let forgeries = [
            ("unsigned", Beat::unsigned("w1", Some(failing()))),
            (
                "signed with the master secret itself",
                Beat::signed("w1", Some(failing()), HEARTBEAT_SECRET),
            ),
            (
                "signed with w2's key",
                Beat::signed("w1", Some(failing()), &k2),
            ),
            ("garbage signature", {
                let mut b = Beat::unsigned("w1", Some(failing()));
                b.signed = Some((now, "sha256=zz".into()));
                b
            }),
            (
                "a minute old",
                Beat::signed_at("w1", Some(failing()), &k1, now - 60_000),
            ),
            (
                "a minute ahead",
                Beat::signed_at("w1", Some(failing()), &k1, now + 60_000),
            ),
        ];
        for (what, beat) in &forgeries {
            assert_eq!(c.beat(beat).await, 401, "heartbeat {what} must be refused");
        }
        // A heartbeat of w1's own, delivered, then sent again: a replay.
        next_ms().await;
        let delivered = Beat::signed("w1", Some(failing()), &k1);
        let mut replay_of_passing = Beat::signed("w1", Some(passing()), &k1);
        assert_eq!(c.beat(&replay_of_passing).await, 202);
        assert_eq!(
            c.beat(&replay_of_passing).await,
            401,
            "the same heartbeat twice"
        );
        // Older than the last accepted (signed before it, delivered after).
        assert_eq!(c.beat(&delivered).await, 401, "an older heartbeat");
        replay_of_passing.body = replay_of_passing.body.replace("pass", "fail");
        assert_eq!(c.beat(&replay_of_passing).await, 401, "a tampered body");
        tokio::time::sleep(Duration::from_millis(100)).await;
        legit("w1", k1.clone()).await;
        legit("w2", k2.clone()).await;
    }
    let w1 = c.get("/api/targets/w1").await;
    assert_eq!(w1["target"]["state"], "healthy", "{w1}");
    let history = w1["target"]["history"].as_array().unwrap();
    assert!(
        history
            .iter()
            .filter(|p| p["at_ms"].as_i64().unwrap() > since)
            .all(|p| p["ok"] == true),
        "no forged report reached the guard: {history:#?}"
    );
    assert!(
        w1["transitions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["at_ms"].as_i64().unwrap() > since)
            .all(|t| t["to"] != "failing"),
        "w1 never failed: {w1}"
    );
    assert!(c.decisions().await.is_empty());
    let m = c.metrics_text().await;
    let count = |result: &str| {
        sample(
            &m,
            &format!("vigil_controller_heartbeats_total{{result=\"{result}\"}}"),
        )
        .unwrap_or(0.0) as usize
    };
    assert_eq!(count("unsigned"), ROUNDS, "{m}");
    assert_eq!(count("bad_signature"), 4 * ROUNDS, "{m}");
    assert_eq!(count("stale"), 2 * ROUNDS, "{m}");
    assert_eq!(count("replayed"), 2 * ROUNDS, "{m}");
    assert!(count("accepted") >= 3 * ROUNDS, "{m}");

    // Passing forgeries cannot keep a silent worker in service: w2 stops, a forger
    // speaks for it, and it fails on its heartbeat TTL all the same.
    c.wait_for(
        "w2 unhealthy despite unsigned passing heartbeats",
        || async {
            assert_eq!(c.beat(&Beat::unsigned("w2", Some(passing()))).await, 401);
            legit("w1", k1.clone()).await;
            let t = c.get("/api/targets/w2").await["target"].clone();
            matches!(t["state"].as_str(), Some("unhealthy" | "reported")).then_some(())
        },
    )
    .await;
}

/// A request with a raw `Authorization` header and JSON body text; status and body.
async fn call(
    c: &Controller,
    method: reqwest::Method,
    path: &str,
    authorization: &str,
    body: &str,
) -> (u16, Value) {
    let r = reqwest::Client::new()
        .request(method, c.url(path))
        .header("authorization", authorization)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("request");
    let code = r.status().as_u16();
    (code, r.json().await.unwrap_or(Value::Null))
}

async fn hold_of(c: &Controller, id: &str) -> Value {
    c.get(&format!("/api/targets/{id}")).await["target"]["hold"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_silence_lifts_only_a_silence_and_delete_maintenance_only_a_maintenance() {
    let dir = tempfile::tempdir().unwrap();
    let bs = backends(2);
    let c = Controller::start(dir.path(), &(base_config("") + &targets_toml(&bs)));
    c.wait_all(2, "healthy").await;
    let hold = |path: &'static str| {
        let c = &c;
        async move {
            let (code, body) = c.post(path, Some(TOKEN), json!({"reason": path})).await;
            assert_eq!(code, 200, "{path}: {body}");
        }
    };
    hold("/api/targets/t0/maintenance").await;
    hold("/api/targets/t1/silence").await;

    assert_eq!(
        c.delete("/api/targets/t0/silence", Some(TOKEN)).await,
        409,
        "DELETE silence on a target in maintenance"
    );
    assert_eq!(hold_of(&c, "t0").await["kind"], "maintenance");
    assert_eq!(
        c.delete("/api/targets/t1/maintenance", Some(TOKEN)).await,
        409,
        "DELETE maintenance on a silenced target"
    );
    assert_eq!(hold_of(&c, "t1").await["kind"], "silenced");

    assert_eq!(
        c.delete("/api/targets/t0/maintenance", Some(TOKEN)).await,
        200
    );
    assert_eq!(hold_of(&c, "t0").await, Value::Null);
    assert_eq!(
        c.delete("/api/targets/t0/maintenance", Some(TOKEN)).await,
        404,
        "no maintenance left to lift"
    );
    assert_eq!(c.delete("/api/targets/t1/silence", Some(TOKEN)).await, 200);
    assert_eq!(hold_of(&c, "t1").await, Value::Null);
    assert_eq!(
        c.delete("/api/targets/nope/silence", Some(TOKEN)).await,
        404
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_scheme_is_case_insensitive_and_bad_hold_bodies_get_422_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let bs = backends(1);
    let c = Controller::start(dir.path(), &(base_config("") + &targets_toml(&bs)));
    c.wait_all(1, "healthy").await;
    use reqwest::Method;
    for auth in [
        format!("bearer {TOKEN}"),
        format!("BEARER {TOKEN}"),
        format!("Bearer   {TOKEN}"),
    ] {
        let (code, body) = call(&c, Method::POST, "/api/freeze", &auth, "{}").await;
        assert_eq!(code, 200, "Authorization: {auth:?}: {body}");
        assert_eq!(c.guard().await["manual_freeze"], "frozen by operator");
        let (code, _) = call(&c, Method::DELETE, "/api/freeze", &auth, "").await;
        assert_eq!(code, 200, "Authorization: {auth:?}");
        assert_eq!(c.guard().await["manual_freeze"], Value::Null);
    }
    for auth in [
        format!("Basic {TOKEN}"),
        format!("Bearer{TOKEN}"),
        TOKEN.into(),
    ] {
        let (code, _) = call(&c, Method::POST, "/api/freeze", &auth, "{}").await;
        assert_eq!(code, 401, "Authorization: {auth:?}");
    }

    let auth = format!("Bearer {TOKEN}");
    let long = "x".repeat(5000);
    for (body, field) in [
        (json!({"for": "0s"}), "for"),
        (json!({"for": "31days"}), "for"),
        (json!({"for": "2 parsecs"}), "for"),
        (json!({"for": 7200}), "for"),
        (json!({"reason": long}), "reason"),
        (json!({"reason": ["a"]}), "reason"),
        (json!({"fro": "2h"}), "fro"),
    ] {
        for path in ["/api/targets/t0/silence", "/api/targets/t0/maintenance"] {
            let (code, answer) = call(&c, Method::POST, path, &auth, &body.to_string()).await;
            assert_eq!(code, 422, "POST {path} {body}: {answer}");
            assert_eq!(answer["field"], field, "POST {path} {body}: {answer}");
            assert!(
                answer["error"].as_str().unwrap().starts_with(field),
                "{answer}"
            );
        }
    }
    let (code, answer) = call(
        &c,
        Method::POST,
        "/api/freeze",
        &auth,
        &json!({"reason": long}).to_string(),
    )
    .await;
    assert_eq!(
        (code, &answer["field"]),
        (422, &json!("reason")),
        "{answer}"
    );
    assert_eq!(hold_of(&c, "t0").await, Value::Null, "nothing was applied");
    assert_eq!(c.guard().await["manual_freeze"], Value::Null);
    // At the limits: accepted.
    let body = json!({"for": "30days", "reason": "r".repeat(4096)}).to_string();
    let (code, answer) = call(&c, Method::POST, "/api/targets/t0/silence", &auth, &body).await;
    assert_eq!(code, 200, "{answer}");
    assert_eq!(hold_of(&c, "t0").await["kind"], "silenced");
}

/// Checks a metrics text line by line as the exposition formats define a sample
/// (`name{label="value",...} number`, label values with only `\\`, `\"`, `\n`
/// escapes); returns the samples as (name, [(label, unescaped value)], value).
#[allow(clippy::type_complexity)]
fn parse_samples(text: &str) -> Vec<(String, Vec<(String, String)>, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let bad = |why: &str| -> ! { panic!("line {}: {why}: {line:?}\n{text}", n + 1) };
        let name_end = line.find(['{', ' ']).unwrap_or_else(|| bad("no value"));
        let name = &line[..name_end];
        if !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        {
            bad("bad metric name");
        }
        let mut rest = &line[name_end..];
        let mut labels = Vec::new();
        if let Some(r) = rest.strip_prefix('{') {
            rest = r;
            loop {
                if let Some(r) = rest.strip_prefix('}') {
                    rest = r;
                    break;
                }
                let eq = rest
                    .find("=\"")
                    .unwrap_or_else(|| bad("label without value"));
                let key = rest[..eq].to_string();
                let mut value = String::new();
                let mut chars = rest[eq + 2..].char_indices();
                let end = loop {
                    match chars.next() {
                        Some((_, '\\')) => match chars.next() {
                            Some((_, '\\')) => value.push('\\'),
                            Some((_, '"')) => value.push('"'),
                            Some((_, 'n')) => value.push('\n'),
                            _ => bad("bad escape"),
                        },
                        Some((i, '"')) => break eq + 2 + i + 1,
                        Some((_, c)) => value.push(c),
                        None => bad("unterminated label value"),
                    }
                };
                labels.push((key, value));
                rest = &rest[end..];
                rest = rest.strip_prefix(',').unwrap_or(rest);
            }
        }
        let value = rest
            .strip_prefix(' ')
            .unwrap_or_else(|| bad("no space before the value"));
        if value.parse::<f64>().is_err() && !["+Inf", "-Inf", "NaN"].contains(&value) {
            bad("value is not a number");
        }
        out.push((name.to_string(), labels, value.to_string()));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_target_ids_cannot_break_or_forge_the_metrics_scrape() {
    let dir = tempfile::tempdir().unwrap();
    let hostile = [
        "quote\"d",
        "back\\slash",
        "new\nline",
        "x\"} 1\nvigil_controller_guard_frozen 1\n# ",
        "evil\",zone=\"forged",
    ];
    let bs = backends(hostile.len());
    let list: Vec<Value> = hostile
        .iter()
        .zip(&bs)
        .map(|(id, b)| {
            json!({"id": id, "url": format!("http://{}", b.addr()), "zone": format!("z\"{}\\\n", id.len()), "group": "g\"\\\n"})
        })
        .collect();
    std::fs::write(
        dir.path().join("targets.json"),
        serde_json::to_string(&list).unwrap(),
    )
    .unwrap();
    let cfg = base_config("[discovery]\npath = \"targets.json\"\n");
    let c = Controller::start(dir.path(), &cfg);
    c.wait_all(hostile.len(), "healthy").await;
    let client = reqwest::Client::new();
    for accept in ["*/*", "application/openmetrics-text; version=1.0.0"] {
        let text = client
            .get(c.url("/metrics"))
            .header("accept", accept)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let samples = parse_samples(&text);
        let frozen: Vec<_> = samples
            .iter()
            .filter(|s| s.0 == "vigil_controller_guard_frozen")
            .collect();
        assert_eq!(frozen.len(), 1, "one guard_frozen series, not forged ones");
        assert_eq!(frozen[0].2, "0");
        let mut up: Vec<(String, String)> = samples
            .iter()
            .filter(|s| s.0 == "vigil_controller_target_up")
            .map(|s| {
                assert_eq!(s.1.len(), 2, "target and zone only: {s:?}");
                assert_eq!(s.2, "1");
                (s.1[0].1.clone(), s.1[1].1.clone())
            })
            .collect();
        up.sort();
        let mut want: Vec<(String, String)> = hostile
            .iter()
            .map(|id| (id.to_string(), format!("z\"{}\\\n", id.len())))
            .collect();
        want.sort();
        assert_eq!(up, want, "each id and zone read back as it is, once");
        if accept == "*/*" {
            promtool_check(&text);
        } else {
            assert!(text.ends_with("# EOF\n"));
        }
    }
}

/// `promtool check metrics` on the text, when promtool is installed (Debian's
/// `prometheus` package); skipped with a message otherwise.
fn promtool_check(text: &str) {
    let Some(p) = vigil_testkit::promtool_check_metrics(text) else {
        eprintln!("SKIPPED promtool check: promtool not installed (apt-get install -y prometheus)");
        return;
    };
    assert!(p.success, "promtool check metrics: {}\n{text}", p.said);
}

#[test]
fn heartbeat_key_prints_the_documented_key_and_a_heartbeat_target_needs_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.toml");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(vigil_bin())
            .args(["controller", "-c"])
            .arg(&path)
            .args(args)
            .env_remove("VIGIL_HEARTBEAT_SECRET")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    std::fs::write(&path, heartbeat_config("30s")).unwrap();
    let (code, key, err) = run(&["heartbeat-key", "w1"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(key, heartbeat_key(HEARTBEAT_SECRET, "w1"));
    // Without a secret, a heartbeat target could never be heard: refused.
    std::fs::write(&path, "[[targets]]\nid = \"w1\"\nheartbeat = true\n").unwrap();
    let (code, _, err) = run(&["check-config"]);
    assert_eq!(code, Some(78), "{err}");
    assert!(
        err.contains("targets[0]") && err.contains("heartbeat.secret"),
        "{err}"
    );
}
