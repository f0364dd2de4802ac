use super::*;
use crate::config::TargetConfig;
use crate::store::SqliteStore;
use vigil_core::HealthState;

#[test]
fn tokens_match_only_byte_for_byte() {
    assert!(same(b"s3cret-token", b"s3cret-token"));
    assert!(!same(b"s3cret-token", b"s3cret-tokeN"), "last byte differs");
    assert!(
        !same(b"s3cret-token", b"s3cret"),
        "a prefix is not the token"
    );
    assert!(!same(b"", b"x"));
    assert!(same(b"", b""));
}

fn info(id: &str, zone: &str, state: Standing) -> TargetInfo {
    TargetInfo {
        spec: Arc::new(TargetConfig {
            id: id.into(),
            url: format!("http://{id}"),
            zone: zone.into(),
            group: String::new(),
            heartbeat: false,
            interval: None,
        }),
        state,
        health: HealthState::Healthy,
        consecutive_failures: 0,
        failing_since_ms: None,
        failing_checks: Vec::new(),
        endpoint_failed: false,
        penalty: 0,
        flapping: false,
        hold: None,
        reported_at_ms: None,
        in_doubt: false,
        last_probe: None,
    }
}

/// t00..t09, zones a/b alternating, t03 and t06 failing.
fn fleet() -> FleetView {
    let targets: Vec<TargetInfo> = (0..10)
        .map(|i| {
            let state = if i == 3 || i == 6 {
                Standing::Failing
            } else {
                Standing::Healthy
            };
            info(&format!("t{i:02}"), ["a", "b"][i % 2], state)
        })
        .collect();
    FleetView {
        counts: FleetView::count_states(&targets),
        targets,
        ..FleetView::empty()
    }
}

/// An API on real loopback HTTP whose engine never answers (a busy engine), with
/// `view` published.
async fn serve(view: FleetView) -> (String, mpsc::Receiver<Command>, tempfile::TempDir) {
    serve_with(view, Arc::new(Metrics::new())).await
}

/// [`serve`] with these metrics.
async fn serve_with(
    view: FleetView,
    metrics: Arc<Metrics>,
) -> (String, mpsc::Receiver<Command>, tempfile::TempDir) {
    serve_permits(view, metrics, crate::actuator::Permits::default()).await
}

/// [`serve_with`] handing out these restart permits.
async fn serve_permits(
    view: FleetView,
    metrics: Arc<Metrics>,
    permits: crate::actuator::Permits,
) -> (String, mpsc::Receiver<Command>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let (store, _thread) = StoreHandle::spawn(Box::new(
        SqliteStore::open(&dir.path().join("v.db")).unwrap(),
    ));
    let (engine, engine_rx) = mpsc::channel(1);
    let (_plan_tx, plan) = watch::channel(Arc::new(Plan {
        targets: Vec::new(),
        probe: Default::default(),
        heartbeat_ttl: Duration::from_secs(30),
    }));
    let app = router(AppState {
        engine,
        store,
        discovery: Arc::new(crate::discovery::DiscoveryStatus::new(metrics.clone())),
        metrics,
        token: Arc::new(RwLock::new(None)),
        heartbeats: Arc::new(Default::default()),
        plan,
        heartbeat_auth: Arc::new(RwLock::new(HeartbeatAuth {
            secret: None,
            max_skew: Duration::from_secs(30),
        })),
        store_health: Arc::new(Default::default()),
        views: FleetViews::new(view),
        config: watch::channel(Arc::new(crate::config::ControllerConfig::default())).1,
        balancers: Arc::default(),
        leadership: watch::channel(crate::leader::Leadership::alone("test".into())).1,
        probing: watch::channel(Arc::new(crate::probing::Probing::alone("test".into()))).1,
        permits,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, engine_rx, dir)
}

/// A replacement the actuator fails (exec `false`) and an alert it finishes (exec
/// does not run for alerts): both counted by kind and result on `/metrics`, which
/// `promtool check metrics` passes.
#[tokio::test]
async fn metrics_count_finished_actions_by_kind_and_result() {
    use crate::store::{ActionState, Batch, NewDecision, Store};
    use vigil_core::fleet::DecisionKind;
    let dir = tempfile::tempdir().unwrap();
    let mut db = SqliteStore::open(&dir.path().join("a.db")).unwrap();
    let decision = |target: &str, outcome, kind: &str| NewDecision {
        at_ms: 1,
        target: target.into(),
        zone: "z".into(),
        outcome,
        reasons: json!([]),
        summary: format!("{kind} {target}"),
        action: Some(json!({"kind": kind, "target": target})),
    };
    let actions = db
        .commit(&Batch {
            decisions: vec![
                decision("t1", DecisionKind::Act, "replace"),
                decision("fleet", DecisionKind::Alert, crate::engine::ALERT),
            ],
            ..Batch::default()
        })
        .unwrap();
    assert_eq!(actions.len(), 2);
    let (store, _thread) = StoreHandle::spawn(Box::new(db));
    let mut config = crate::config::ControllerConfig::default();
    config.actuator.kind = crate::config::ActuatorKind::Exec;
    config.actuator.exec.command = vec!["false".into()];
    let (_config_tx, config) = watch::channel(Arc::new(config));
    let metrics = Arc::new(Metrics::new());
    let (tx, rx) = mpsc::unbounded_channel();
    let tasks = tokio_util::task::TaskTracker::new();
    tokio::spawn(crate::actuator::run(
        rx,
        config,
        store.clone(),
        metrics.clone(),
        tasks.clone(),
        crate::actuator::Permits::default(),
    ));
    for a in actions {
        tx.send(a).unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let done = store.call(|s| s.actions(10)).await.unwrap();
        if done.iter().all(|a| a.state != ActionState::Intended) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "actions never finished"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tasks.close();
    tasks.wait().await;

    let (base, _engine, _dir) = serve_with(fleet(), metrics).await;
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "# TYPE vigil_controller_actions_total counter\n",
        "vigil_controller_actions_total{kind=\"replace\",result=\"failed\"} 1\n",
        "vigil_controller_actions_total{kind=\"alert\",result=\"done\"} 1\n",
    ] {
        assert!(text.contains(line), "/metrics lacks {line:?}:\n{text}");
    }
    match vigil_testkit::promtool_check_metrics(&text) {
        Some(p) => assert!(p.clean(), "promtool: {}", p.said),
        None => eprintln!("promtool not installed: not checked"),
    }
}

fn ids(v: &serde_json::Value) -> Vec<String> {
    v["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn the_target_list_is_read_from_the_published_view_while_the_engine_is_busy() {
    // The engine's mailbox is never read: a list read that asked the engine would
    // wait forever.
    let (base, _engine, _dir) = serve(fleet()).await;
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        reqwest::get(format!("{base}/api/targets")),
    )
    .await
    .expect("a list read must not wait for the engine")
    .unwrap();
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(ids(&v).len(), 10);
    assert_eq!(v["total"], 10);
    assert_eq!(v["counts"]["failing"], 2);
    assert_eq!(v["counts"]["healthy"], 8);
    assert_eq!(v["targets"][0]["url"], "http://t00", "{v}");
    let g: serde_json::Value = reqwest::get(format!("{base}/api/guard"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(g["counts"]["failing"], 2, "{g}");
}

#[tokio::test]
async fn target_pages_follow_next_after_and_filters_combine() {
    let (base, _engine, _dir) = serve(fleet()).await;
    let get = |q: &'static str| {
        let base = base.clone();
        async move {
            let r = reqwest::get(format!("{base}/api/targets{q}"))
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{q}");
            r.json::<serde_json::Value>().await.unwrap()
        }
    };
    let p1 = get("?limit=4").await;
    assert_eq!(ids(&p1), ["t00", "t01", "t02", "t03"]);
    assert_eq!(p1["next_after"], "t03");
    let p3 = get("?limit=4&after=t07").await;
    assert_eq!(ids(&p3), ["t08", "t09"]);
    assert!(p3["next_after"].is_null(), "the last page says so");
    let exact = get("?limit=5&after=t04").await;
    assert_eq!(ids(&exact), ["t05", "t06", "t07", "t08", "t09"]);
    assert!(
        exact["next_after"].is_null(),
        "nothing after a full last page"
    );
    assert_eq!(ids(&get("?state=failing").await), ["t03", "t06"]);
    assert_eq!(ids(&get("?state=failing&zone=a").await), ["t06"]);
    assert_eq!(
        ids(&get("?state=healthy,failing&zone=b&limit=2&after=t03").await),
        ["t05", "t07"]
    );
    assert!(ids(&get("?zone=nowhere").await).is_empty());
}

#[tokio::test]
async fn a_bad_target_query_is_a_422_naming_the_parameter() {
    let (base, _engine, _dir) = serve(fleet()).await;
    for (q, param) in [
        ("?state=sick", "state"),
        ("?state=failing,", "state"),
        ("?limit=0", "limit"),
        ("?limit=1001", "limit"),
        ("?limit=ten", "limit"),
        ("?limit=5&limit=6", "limit"),
        ("?status=failing", "status"),
    ] {
        let r = reqwest::get(format!("{base}/api/targets{q}"))
            .await
            .unwrap();
        assert_eq!(r.status(), 422, "{q}");
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["parameter"], param, "{q}: {v}");
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{param}: ")),
            "{q}: {v}"
        );
    }
}

#[tokio::test]
async fn a_decision_or_action_limit_out_of_range_is_a_422_not_a_silent_clamp() {
    let (base, _engine, _dir) = serve(fleet()).await;
    for list in ["decisions", "actions"] {
        for q in ["?limit=0", "?limit=5000"] {
            let r = reqwest::get(format!("{base}/api/{list}{q}")).await.unwrap();
            assert_eq!(r.status(), 422, "{list}{q}");
            let v: serde_json::Value = r.json().await.unwrap();
            assert_eq!(v["parameter"], "limit", "{list}{q}: {v}");
        }
        for q in ["", "?limit=1000"] {
            let r = reqwest::get(format!("{base}/api/{list}{q}")).await.unwrap();
            assert_eq!(r.status(), 200, "{list}{q}");
        }
    }
}

#[tokio::test]
async fn heavy_reads_beyond_the_cap_are_refused_at_once_with_retry_after() {
    // Readers held inside the gate until released: the cap is reached for real.
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let inside = Arc::new(tokio::sync::Semaphore::new(0));
    let (r2, i2) = (release.clone(), inside.clone());
    let app = Router::new()
        .route(
            "/slow",
            get(move || {
                let (release, inside) = (r2.clone(), i2.clone());
                async move {
                    inside.add_permits(1);
                    release.acquire().await.expect("never closed").forget();
                    "done"
                }
            }),
        )
        .route_layer(middleware::from_fn_with_state(
            Arc::new(Semaphore::new(2)),
            at_most,
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/slow", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let held: Vec<_> = (0..2)
        .map(|_| tokio::spawn(reqwest::get(url.clone())))
        .collect();
    // Both are inside before the third asks.
    let _both = inside.acquire_many(2).await.unwrap();
    let refused = reqwest::get(&url).await.unwrap();
    assert_eq!(refused.status(), 503, "a third read at a cap of 2");
    assert_eq!(refused.headers()[header::RETRY_AFTER], RETRY_AFTER_S);
    release.add_permits(2);
    for h in held {
        assert_eq!(h.await.unwrap().unwrap().status(), 200);
    }
    let after = tokio::spawn(reqwest::get(url.clone()));
    let _inside = inside.acquire().await.unwrap();
    release.add_permits(1);
    assert_eq!(
        after.await.unwrap().unwrap().status(),
        200,
        "a permit comes back when its read is done"
    );
}

/// The liveness endpoint: a permit answers restart (every ask while it lives), a held
/// back target alive with the guard's reason, an unknown one 404; answered while the
/// engine is busy (it reads the published view).
#[tokio::test]
async fn liveness_answers_restart_with_a_permit_and_alive_with_the_guard_reason() {
    let mut view = fleet();
    view.targets[6].state = Standing::Unhealthy;
    view.guard.frozen = true;
    view.guard.reasons = vec!["fleet-wide failure: 2 fail sqlite:query (dependency)".into()];
    let permits = crate::actuator::Permits::default();
    let (base, _engine, _dir) =
        serve_permits(view, Arc::new(Metrics::new()), permits.clone()).await;
    let ask = |id: &str| {
        let url = format!("{base}/api/targets/{id}/liveness");
        async move {
            let r = reqwest::get(url).await.unwrap();
            (
                r.status().as_u16(),
                r.json::<serde_json::Value>().await.unwrap(),
            )
        }
    };
    let (code, body) = ask("t03").await;
    assert_eq!((code, &body["verdict"]), (200, &json!("alive")), "{body}");
    assert!(
        body["reason"]
            .as_str()
            .unwrap()
            .contains("not failing long enough"),
        "{body}"
    );
    let (_, body) = ask("t06").await;
    assert_eq!(body["verdict"], "alive", "{body}");
    let reason = body["reason"].as_str().unwrap();
    assert!(
        reason.contains("frozen") && reason.contains("sqlite:query"),
        "the guard's reason: {reason}"
    );
    assert!(
        reason.contains("not \"liveness\""),
        "the log actuator grants nothing: {reason}"
    );
    let mut collected = permits.grant(
        "t03",
        7,
        Duration::from_secs(60),
        tokio::time::Instant::now(),
    );
    for _ in 0..2 {
        let (code, body) = ask("t03").await;
        assert_eq!((code, &body["verdict"]), (200, &json!("restart")), "{body}");
        assert_eq!(body["action"], 7);
    }
    assert!(collected.try_recv().is_ok(), "the first ask collects it");
    let (code, _) = ask("nope").await;
    assert_eq!(code, 404);
}
