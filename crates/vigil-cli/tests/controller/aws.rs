//! `vigil controller` on AWS Auto Scaling, against moto in server mode: the real
//! binary discovers a group's instances and acts on them through the Auto Scaling
//! API, with a fault proxy in front of moto for throttling, 5xx, an outage and a
//! crash in the middle of a call. moto must be installed
//! (scripts/install-test-deps.sh).

use crate::aws_support;
use crate::controller_support;

use aws_support::*;
use controller_support::*;
use serde_json::Value;
use std::net::SocketAddr;
use vigil_core::Status;
use vigil_testkit::Backend;

/// The access key the controller signs with in most tests.
const ACCESS_KEY: &str = "AKIDVIGILTEST";

fn env_credentials() -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_string()),
        ("AWS_SECRET_ACCESS_KEY", "test-secret".to_string()),
    ]
}

/// The base config with `[aws]` pointing at `endpoint` (fast timeouts and retries)
/// and `extra` after it.
fn aws_config(endpoint: &str, aws_extra: &str, extra: &str) -> String {
    base_config(&format!(
        "[aws]\nendpoint = \"{endpoint}\"\ntimeout = \"2s\"\ndeadline = \"20s\"\nbackoff = \"50ms\"\n{aws_extra}\n{extra}"
    ))
}

/// `[discovery.aws]` of these groups, URLs `http://{private_ip}:port`.
fn discovery(groups: &[&str], port: u16) -> String {
    let groups: Vec<String> = groups.iter().map(|g| format!("{g:?}")).collect();
    format!(
        "[discovery.aws]\ngroups = [{}]\nurl = \"http://{{private_ip}}:{port}\"\npoll = \"200ms\"\n",
        groups.join(", ")
    )
}

/// A health backend on each instance's (loopback) private address, all on `port`.
fn backends_on(instances: &[Instance], port: u16) -> Vec<Backend> {
    instances
        .iter()
        .map(|i| {
            let addr: SocketAddr = format!("{}:{port}", i.private_ip).parse().unwrap();
            Backend::start_on(&i.id, addr)
        })
        .collect()
}

async fn done_action_on(c: &Controller, id: &str) -> Value {
    c.wait_for(&format!("an action on {id} finished"), || async {
        c.actions()
            .await
            .into_iter()
            .find(|a| a["target"] == id && (a["state"] == "done" || a["state"] == "failed"))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_act_decision_marks_the_instance_unhealthy_through_throttling_and_5xx() {
    let aws = Aws::start().await;
    let instances = aws.create_group("web", 'a', 5).await;
    let port = free_port();
    let bs = backends_on(&instances, port);
    let proxy = FaultProxy::start(aws.moto.addr);
    let dir = tempfile::tempdir().unwrap();
    let cfg = aws_config(
        &proxy.url(),
        &format!("region = \"{REGION}\""),
        &format!(
            "[actuator]\nkind = \"aws-autoscaling\"\n{}",
            discovery(&["web"], port)
        ),
    );
    let c = Controller::start_env(dir.path(), &cfg, &env_credentials());
    c.wait_all(5, "healthy").await;
    for t in c.targets().await {
        let i = instances
            .iter()
            .find(|i| t["id"] == i.id.as_str())
            .unwrap_or_else(|| panic!("a target that is no instance of the group: {t}"));
        assert_eq!(t["zone"], "eu-west-1a", "{t}");
        assert_eq!(t["group"], "web", "{t}");
        assert_eq!(t["url"], format!("http://{}:{port}", i.private_ip), "{t}");
    }
    // AWS is busy when the action comes: one 503 on the look, two throttlings on the
    // call.
    proxy.refuse_next("DescribeAutoScalingInstances", 1, UNAVAILABLE);
    proxy.refuse_next("SetInstanceHealth", 2, THROTTLING);
    bs[2].set_check("disk:free", Status::Fail);
    let victim = &instances[2].id;
    let action = done_action_on(&c, victim).await;
    assert_eq!(action["state"], "done", "{action}");
    let result = action["result"].as_str().unwrap();
    assert!(
        result.contains("SetInstanceHealth Unhealthy (ShouldRespectGracePeriod=true)")
            && result.contains("call 3")
            && result.contains("AWS request id"),
        "{result}"
    );
    assert_eq!(
        aws.health(victim).await,
        Some(("InService".to_string(), "Unhealthy".to_string())),
        "the group sees the instance Unhealthy"
    );
    for i in instances.iter().filter(|i| &i.id != victim) {
        assert_eq!(aws.health(&i.id).await.unwrap().1, "Healthy", "{i:?}");
    }
    assert_eq!(
        proxy.count("DescribeAutoScalingInstances", "refused 503"),
        1
    );
    assert_eq!(proxy.count("SetInstanceHealth", "refused 400"), 2);
    assert_eq!(
        proxy.count("SetInstanceHealth", "forwarded"),
        1,
        "one call reached AWS: {:#?}",
        proxy.seen()
    );
    assert!(
        proxy.seen().iter().all(|s| s.access_key == ACCESS_KEY),
        "signed with the environment's key: {:#?}",
        proxy.seen()
    );
    assert!(c.sigterm().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_mode_terminates_the_instance_and_keeps_the_desired_capacity() {
    let aws = Aws::start().await;
    let instances = aws.create_group("web", 'a', 5).await;
    let port = free_port();
    let bs = backends_on(&instances, port);
    let dir = tempfile::tempdir().unwrap();
    let cfg = aws_config(
        &aws.url(),
        &format!("region = \"{REGION}\""),
        &format!(
            "[actuator]\nkind = \"aws-autoscaling\"\n[actuator.aws]\nmode = \"terminate\"\n{}",
            discovery(&["web"], port)
        ),
    );
    let c = Controller::start_env(dir.path(), &cfg, &env_credentials());
    c.wait_all(5, "healthy").await;
    bs[1].set_check("memory:used", Status::Fail);
    let victim = &instances[1].id;
    let action = done_action_on(&c, victim).await;
    assert_eq!(action["state"], "done", "{action}");
    assert!(
        action["result"]
            .as_str()
            .unwrap()
            .contains("TerminateInstanceInAutoScalingGroup (ShouldDecrementDesiredCapacity=false)"),
        "{action}"
    );
    assert_eq!(aws.health(victim).await, None, "no longer in the group");
    assert_eq!(aws.desired("web").await, 5, "the desired capacity is kept");
    let ids = aws.group_instance_ids("web").await;
    assert!(
        ids.len() == 5 && !ids.contains(victim),
        "a replacement was launched: {ids:?}"
    );
    c.wait_for("the terminated instance no longer a target", || async {
        (!c.targets().await.iter().any(|t| t["id"] == victim.as_str())).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_instance_fails_the_action_with_the_aws_error_code() {
    let aws = Aws::start().await;
    // What this moto answers for an instance it does not know (real AWS says
    // ValidationError): the record must carry the same code.
    let unknown = "i-0123456789abcdef0";
    let (status, body) = query_status(
        &aws.url(),
        "autoscaling",
        "SetInstanceHealth",
        &[("InstanceId", unknown), ("HealthStatus", "Unhealthy")],
    )
    .await;
    assert!((400..500).contains(&status), "{status} {body}");
    let code = texts(&body, "Code").remove(0);
    let proxy = FaultProxy::start(aws.moto.addr);
    let bs = backends(5);
    let mut targets = targets_toml(&bs[..4]);
    targets.push_str(&format!(
        "[[targets]]\nid = \"{unknown}\"\nurl = \"http://{}\"\nzone = \"a\"\n",
        bs[4].addr()
    ));
    let dir = tempfile::tempdir().unwrap();
    let cfg = aws_config(
        &proxy.url(),
        &format!("region = \"{REGION}\""),
        &format!("[actuator]\nkind = \"aws-autoscaling\"\n{targets}"),
    );
    let c = Controller::start_env(dir.path(), &cfg, &env_credentials());
    c.wait_all(5, "healthy").await;
    bs[4].set_check("disk:free", Status::Fail);
    let action = done_action_on(&c, unknown).await;
    assert_eq!(action["state"], "failed", "{action}");
    let result = action["result"].as_str().unwrap();
    assert!(
        result.contains(&format!("{code}: "))
            && result.contains("HTTP 400")
            && result.contains("not retried"),
        "the record carries AWS's code {code:?} and message: {result}"
    );
    assert_eq!(
        proxy.count("SetInstanceHealth", ""),
        1,
        "a 4xx is not retried: {:#?}",
        proxy.seen()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_lists_in_service_instances_with_zones_and_urls_using_the_shared_files() {
    let aws = Aws::start().await;
    let a = aws.create_group("web-a", 'a', 3).await;
    let b = aws.create_group("web-b", 'b', 2).await;
    // One instance of web-a goes to Standby: not in service, not judged.
    query(
        &aws.url(),
        "autoscaling",
        "EnterStandby",
        &[
            ("AutoScalingGroupName", "web-a"),
            ("InstanceIds.member.1", &a[0].id),
            ("ShouldDecrementDesiredCapacity", "true"),
        ],
    )
    .await;
    let in_service: Vec<Instance> = a[1..].iter().chain(&b).cloned().collect();
    let port = free_port();
    let _bs = backends_on(&in_service, port);
    let proxy = FaultProxy::start(aws.moto.addr);
    // Credentials and region from the profile `vigil` of the shared files.
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir(home.path().join(".aws")).unwrap();
    std::fs::write(
        home.path().join(".aws/credentials"),
        "[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key = x\n\n[vigil]\naws_access_key_id = AKIDFROMFILE\naws_secret_access_key = s\n",
    )
    .unwrap();
    std::fs::write(
        home.path().join(".aws/config"),
        format!("[profile vigil]\nregion = {REGION}\n"),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = aws_config(&proxy.url(), "", &discovery(&["web-a", "web-b"], port));
    let env = vec![
        ("HOME", home.path().display().to_string()),
        ("AWS_PROFILE", "vigil".to_string()),
    ];
    let c = Controller::start_env(dir.path(), &cfg, &env);
    c.wait_all(4, "healthy").await;
    let mut seen: Vec<(String, String, String, String)> = c
        .targets()
        .await
        .iter()
        .map(|t| {
            let s = |k: &str| t[k].as_str().unwrap().to_string();
            (s("id"), s("zone"), s("group"), s("url"))
        })
        .collect();
    seen.sort();
    let mut want: Vec<(String, String, String, String)> = a[1..]
        .iter()
        .map(|i| (i, "web-a"))
        .chain(b.iter().map(|i| (i, "web-b")))
        .map(|(i, g)| {
            (
                i.id.clone(),
                i.zone.clone(),
                g.to_string(),
                format!("http://{}:{port}", i.private_ip),
            )
        })
        .collect();
    want.sort();
    assert_eq!(
        seen, want,
        "InService instances only, with zone, group and URL"
    );
    assert_eq!(
        want.iter()
            .map(|w| w.1.as_str())
            .collect::<std::collections::BTreeSet<_>>(),
        ["eu-west-1a", "eu-west-1b"].into(),
        "two zones"
    );
    let keys: std::collections::BTreeSet<String> =
        proxy.seen().into_iter().map(|s| s.access_key).collect();
    assert_eq!(
        keys,
        ["AKIDFROMFILE".to_string()].into(),
        "signed with the profile's key from the credentials file"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_aws_api_keeps_the_last_list_until_it_answers_again() {
    let aws = Aws::start().await;
    let instances = aws.create_group("web", 'a', 5).await;
    let port = free_port();
    let _bs = backends_on(&instances, port);
    let proxy = FaultProxy::start(aws.moto.addr);
    let dir = tempfile::tempdir().unwrap();
    let cfg = aws_config(
        &proxy.url(),
        &format!("region = \"{REGION}\"\n"),
        &discovery(&["web"], port),
    )
    .replace("deadline = \"20s\"", "deadline = \"300ms\"");
    let c = Controller::start_env(dir.path(), &cfg, &env_credentials());
    c.wait_all(5, "healthy").await;
    proxy.refuse_all("DescribeAutoScalingGroups", Some(UNAVAILABLE));
    // While AWS fails, an instance leaves the group: not seen until AWS answers.
    query(
        &aws.url(),
        "autoscaling",
        "TerminateInstanceInAutoScalingGroup",
        &[
            ("InstanceId", &instances[0].id),
            ("ShouldDecrementDesiredCapacity", "true"),
        ],
    )
    .await;
    c.wait_for("two failed polls", || async {
        (c.logs()
            .matches("Auto Scaling discovery failed; keeping the last list")
            .count()
            >= 2)
            .then_some(())
    })
    .await;
    let t = c.targets().await;
    assert_eq!(t.len(), 5, "no target forgotten while AWS fails: {t:#?}");
    assert!(
        t.iter().all(|t| t["state"] == "healthy"),
        "and all still probed: {t:#?}"
    );
    proxy.refuse_all("DescribeAutoScalingGroups", None);
    c.wait_for("the list of a working API applied", || async {
        let t = c.targets().await;
        (t.len() == 4 && !t.iter().any(|t| t["id"] == instances[0].id.as_str())).then_some(())
    })
    .await;
    assert!(c.logs().contains("Auto Scaling discovery works again"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_replayed_after_a_crash_does_not_call_aws_twice() {
    let aws = Aws::start().await;
    let instances = aws.create_group("web", 'a', 5).await;
    let port = free_port();
    let bs = backends_on(&instances, port);
    let proxy = FaultProxy::start(aws.moto.addr);
    // AWS takes the call; its answer never comes back.
    proxy.hold("SetInstanceHealth", true);
    let dir = tempfile::tempdir().unwrap();
    let cfg = aws_config(
        &proxy.url(),
        &format!("region = \"{REGION}\""),
        &format!(
            "[actuator]\nkind = \"aws-autoscaling\"\n{}",
            discovery(&["web"], port)
        ),
    )
    .replace("timeout = \"2s\"", "timeout = \"60s\"")
    .replace("deadline = \"20s\"", "deadline = \"60s\"");
    let c = Controller::start_env(dir.path(), &cfg, &env_credentials());
    c.wait_all(5, "healthy").await;
    let victim = instances[3].id.clone();
    bs[3].set_check("disk:free", Status::Fail);
    c.wait_for("the call taken by AWS, its answer held", || async {
        (proxy.count("SetInstanceHealth", "held") == 1).then_some(())
    })
    .await;
    let a = c.actions().await;
    assert!(
        a.len() == 1 && a[0]["state"] == "intended" && a[0]["attempts"] == 1,
        "{a:#?}"
    );
    assert_eq!(aws.health(&victim).await.unwrap().1, "Unhealthy");
    c.sigkill();
    proxy.hold("SetInstanceHealth", false);
    let c = Controller::start_existing_env(dir.path(), &env_credentials());
    let action = done_action_on(&c, &victim).await;
    assert_eq!(action["state"], "done", "{action}");
    let result = action["result"].as_str().unwrap();
    assert!(
        result.contains("already Unhealthy") && result.contains("SetInstanceHealth not called"),
        "{result}"
    );
    assert_eq!(
        proxy.count("SetInstanceHealth", ""),
        1,
        "one call per action, across the crash: {:#?}",
        proxy.seen()
    );
    assert_eq!(c.actions().await.len(), 1);
    assert!(c.sigterm().success());
}

/// A health backend on 127.0.0.1 (a port of its own) for each instance, named by the
/// instance's `vigil:health-url` tag, the default URL template.
async fn tagged_backends(aws: &Aws, instances: &[Instance]) -> Vec<Backend> {
    let mut out = Vec::new();
    for i in instances {
        let b = Backend::start(&i.id);
        aws.tag(&i.id, "vigil:health-url", &format!("http://{}", b.addr()))
            .await;
        out.push(b);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_dependency_failing_on_every_instance_calls_aws_never_and_a_local_failure_once() {
    let aws = Aws::start().await;
    let instances = aws.create_group("web", 'a', 6).await;
    let bs = tagged_backends(&aws, &instances).await;
    let proxy = FaultProxy::start(aws.moto.addr);
    let dir = tempfile::tempdir().unwrap();
    // No `url`: each instance's vigil:health-url tag.
    let cfg = aws_config(
        &proxy.url(),
        &format!("region = \"{REGION}\""),
        "[actuator]\nkind = \"aws-autoscaling\"\n[discovery.aws]\ngroups = [\"web\"]\npoll = \"200ms\"\n",
    );
    let c = Controller::start_env(dir.path(), &cfg, &env_credentials());
    c.wait_all(6, "healthy").await;
    for (i, b) in instances.iter().zip(&bs) {
        let t = c
            .targets()
            .await
            .into_iter()
            .find(|t| t["id"] == i.id.as_str())
            .unwrap_or_else(|| panic!("{} is no target", i.id));
        assert_eq!(
            t["url"],
            format!("http://{}", b.addr()),
            "from the tag: {t}"
        );
    }

    // The database goes away: all six fail the same dependency check.
    for b in &bs {
        b.set_check("db:connect", Status::Fail);
    }
    c.wait_for(
        "every instance held back, for the shared dependency db:connect",
        || async {
            let d = c.decisions().await;
            instances
                .iter()
                .all(|i| {
                    d.iter().any(|d| {
                        d["target"] == i.id.as_str()
                            && d["outcome"] == "hold_back"
                            && d["summary"]
                                .as_str()
                                .unwrap_or_default()
                                .contains("shared dependency db:connect")
                    })
                })
                .then_some(())
        },
    )
    .await;
    // Long enough for every instance to pass N and T several times over.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let d = c.decisions().await;
    assert!(
        d.iter().all(|d| d["outcome"] == "hold_back"),
        "only hold-backs: {d:#?}"
    );
    assert!(c.actions().await.is_empty(), "acted on a shared dependency");
    let g = c.guard().await;
    assert!(
        g["reasons"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| r.as_str().unwrap_or_default().contains("db:connect")),
        "the guard names the shared check: {g}"
    );
    assert_eq!(
        proxy.count("SetInstanceHealth", ""),
        0,
        "no SetInstanceHealth: {:#?}",
        proxy.seen()
    );
    for i in &instances {
        assert_eq!(
            aws.health(&i.id).await,
            Some(("InService".to_string(), "Healthy".to_string())),
            "{i:?} untouched"
        );
    }

    // The database is back; then one instance's disk fills: its own failure.
    for b in &bs {
        b.clear_checks();
    }
    c.wait_all(6, "healthy").await;
    c.wait_for("unfrozen", || async {
        (c.guard().await["frozen"] == false).then_some(())
    })
    .await;
    let victim = &instances[4].id;
    bs[4].set_check("disk:free", Status::Fail);
    let action = done_action_on(&c, victim).await;
    assert_eq!(action["state"], "done", "{action}");
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(c.actions().await.len(), 1, "{:#?}", c.actions().await);
    let calls: Vec<Seen> = proxy
        .seen()
        .into_iter()
        .filter(|s| s.action == "SetInstanceHealth")
        .collect();
    assert_eq!(calls.len(), 1, "exactly one call: {calls:#?}");
    assert_eq!(
        aws.health(victim).await,
        Some(("InService".to_string(), "Unhealthy".to_string()))
    );
    for i in instances.iter().filter(|i| &i.id != victim) {
        assert_eq!(aws.health(&i.id).await.unwrap().1, "Healthy", "{i:?}");
    }
    assert!(c.sigterm().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_follows_the_group_as_it_grows_and_shrinks_and_keeps_its_list_when_aws_dies() {
    let mut aws = Aws::start().await;
    let first = aws.create_group("web", 'a', 3).await;
    let port = free_port();
    let _bs = backends_on(&first, port);
    let dir = tempfile::tempdir().unwrap();
    // A grace period long enough to see new instances in it.
    let cfg = aws_config(
        &aws.url(),
        &format!("region = \"{REGION}\""),
        &discovery(&["web"], port),
    )
    .replace("grace = \"0s\"", "grace = \"3s\"")
    .replace("deadline = \"20s\"", "deadline = \"300ms\"");
    let c = Controller::start_env(dir.path(), &cfg, &env_credentials());
    c.wait_all(3, "healthy").await;

    // The group grows by two.
    aws.set_desired("web", 5).await;
    let added: Vec<Instance> = aws
        .instances("web")
        .await
        .into_iter()
        .filter(|i| !first.iter().any(|f| f.id == i.id))
        .collect();
    assert_eq!(added.len(), 2, "{added:?}");
    let _added_bs = backends_on(&added, port);
    let t = c
        .wait_for("the two new instances listed, in grace", || async {
            let t = c.targets().await;
            (t.len() == 5
                && added.iter().all(|i| {
                    t.iter()
                        .any(|t| t["id"] == i.id.as_str() && t["state"] == "grace")
                }))
            .then_some(t)
        })
        .await;
    for i in &added {
        let t = t.iter().find(|t| t["id"] == i.id.as_str()).unwrap();
        assert_eq!(t["zone"], "eu-west-1a", "{t}");
        assert_eq!(t["group"], "web", "{t}");
        assert_eq!(t["url"], format!("http://{}:{port}", i.private_ip), "{t}");
    }
    c.wait_all(5, "healthy").await;

    // One leaves the group (detached, still running): no longer a target.
    let gone = &first[1].id;
    aws.detach("web", gone).await;
    c.wait_for("the detached instance forgotten", || async {
        let t = c.targets().await;
        (t.len() == 4 && !t.iter().any(|t| t["id"] == gone.as_str())).then_some(())
    })
    .await;

    // AWS dies (connections refused): the list stays, the error is logged.
    aws.moto.kill();
    c.wait_for("two failed polls", || async {
        (c.logs()
            .matches("Auto Scaling discovery failed; keeping the last list")
            .count()
            >= 2)
            .then_some(())
    })
    .await;
    // Each failure is an error naming what failed and how many targets are kept.
    let failed: Vec<Value> = c
        .logs()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["message"] == "Auto Scaling discovery failed; keeping the last list")
        .collect();
    assert!(
        failed.len() >= 2
            && failed.iter().all(|v| v["level"] == "ERROR"
                && v["kept"] == 4
                && !v["error"].as_str().unwrap_or_default().is_empty()),
        "{failed:#?}"
    );
    // And it shows outside the logs: the API and the metrics say AWS discovery fails.
    let d = c.get("/api/discovery").await;
    let aws_status = d["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["source"] == "aws")
        .cloned()
        .unwrap_or_else(|| panic!("no aws source in {d:#}"));
    assert!(
        aws_status["ok"] == false
            && aws_status["targets"] == 4
            && aws_status["consecutive_failures"].as_u64() >= Some(2)
            && !aws_status["last_error"]
                .as_str()
                .unwrap_or_default()
                .is_empty()
            && aws_status["last_success_at"].is_string(),
        "{d:#}"
    );
    assert!(d["summary"].as_str().unwrap().contains("aws"), "{d:#}");
    let m = c.metrics_text().await;
    assert!(
        m.contains("vigil_controller_discovery_up{source=\"aws\"} 0\n")
            && m.contains("vigil_controller_discovery_targets{source=\"aws\"} 4\n"),
        "{m}"
    );
    let t = c.targets().await;
    assert_eq!(t.len(), 4, "no target forgotten while AWS is down: {t:#?}");
    assert!(
        t.iter().all(|t| t["state"] == "healthy"),
        "and all still probed: {t:#?}"
    );
    assert!(c.sigterm().success());
}

/// The `aws` source of `GET /api/discovery`, and the summary.
async fn aws_discovery(c: &Controller) -> (Value, String) {
    let d: Value = c.get("/api/discovery").await;
    let aws = d["sources"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["source"] == "aws")
        .cloned()
        .unwrap_or(Value::Null);
    (aws, d["summary"].as_str().unwrap_or_default().to_string())
}

/// `vigil_controller_discovery_skipped{source="aws"}` from `/metrics`.
async fn skipped_metric(c: &Controller) -> Option<f64> {
    let text = reqwest::get(c.url("/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text");
    sample(&text, "vigil_controller_discovery_skipped{source=\"aws\"}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_in_service_without_a_good_health_url_tag_are_named_and_counted() {
    let aws = Aws::start().await;
    let instances = aws.create_group("web", 'a', 4).await;
    let _bs = tagged_backends(&aws, &instances[..2]).await;
    // instances[2] has no tag; instances[3] one that is no URL.
    aws.tag(&instances[3].id, "vigil:health-url", "not a url")
        .await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = aws_config(
        &aws.url(),
        &format!("region = \"{REGION}\""),
        "[discovery.aws]\ngroups = [\"web\"]\npoll = \"200ms\"\n",
    );
    let c = Controller::start_env(dir.path(), &cfg, &env_credentials());
    c.wait_all(2, "healthy").await;
    let (aws_source, summary) = c
        .wait_for("two instances listed as skipped", || async {
            let (s, summary) = aws_discovery(&c).await;
            (s["skipped"].as_array().map(Vec::len) == Some(2)).then_some((s, summary))
        })
        .await;
    let skipped = aws_source["skipped"].as_array().unwrap();
    let of = |id: &str| {
        skipped
            .iter()
            .find(|s| s["instance"] == id)
            .unwrap_or_else(|| panic!("{id} listed as skipped: {aws_source}"))
    };
    let missing = of(&instances[2].id);
    assert_eq!(missing["group"], "web", "{missing}");
    assert!(
        missing["why"]
            .as_str()
            .unwrap()
            .contains("it has no tag \"vigil:health-url\""),
        "{missing}"
    );
    let bad = of(&instances[3].id);
    assert!(
        bad["why"].as_str().unwrap().contains("not a url"),
        "the bad value named: {bad}"
    );
    assert_eq!(aws_source["targets"], 2, "{aws_source}");
    assert!(
        summary.contains("2 instances in service are not targets: ")
            && summary.contains(instances[2].id.as_str())
            && summary.contains(instances[3].id.as_str()),
        "{summary}"
    );
    assert_eq!(skipped_metric(&c).await, Some(2.0));
    // The missing tag is added: a target now, one instance left out.
    let b = Backend::start(&instances[2].id);
    aws.tag(
        &instances[2].id,
        "vigil:health-url",
        &format!("http://{}", b.addr()),
    )
    .await;
    c.wait_all(3, "healthy").await;
    let summary = c
        .wait_for("one instance left out", || async {
            let (s, summary) = aws_discovery(&c).await;
            (s["skipped"].as_array().map(Vec::len) == Some(1)).then_some(summary)
        })
        .await;
    assert!(
        summary.contains("1 instance in service is not a target: ")
            && summary.contains(instances[3].id.as_str()),
        "{summary}"
    );
    assert_eq!(skipped_metric(&c).await, Some(1.0));
    assert!(c.sigterm().success());
}
