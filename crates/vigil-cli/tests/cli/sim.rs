//! `vigil sim`: determinism, scenarios as regression tests of the policies, policy
//! regressions caught, scenario errors that point at the line, exit codes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use vigil_sim::scenario::{Balance, ControllerMode, GuardStateStore, RetryLimit, Switch};
use vigil_sim::{Policies, Scenario};

fn vigil() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vigil"))
}

fn scenarios_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios")
}

fn scenario(name: &str) -> PathBuf {
    scenarios_dir().join(format!("{name}.toml"))
}

fn run(args: &[&str]) -> Output {
    vigil()
        .arg("sim")
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("the vigil binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn load(name: &str) -> Scenario {
    Scenario::load(&scenario(name)).unwrap_or_else(|e| panic!("{e}"))
}

fn broken(s: &Scenario, policies: Policies) -> Vec<String> {
    let o = vigil_sim::run(s, policies, s.config.seed, &mut |_| {});
    let expect = match policies {
        Policies::Vigil => &s.expect,
        Policies::Naive => &s.expect_naive,
    };
    vigil_sim::expect::verdicts(expect, &o.summary)
        .into_iter()
        .filter(|v| !v.ok)
        .map(|v| format!("{} (measured {})", v.expectation, v.measured))
        .collect()
}

/// Asserts that running `s` with vigil's policies breaks each of the expectations
/// `names`; `why` says what regression they stand for.
fn assert_breaks(s: &Scenario, names: &[&str], why: &str) {
    let b = broken(s, Policies::Vigil);
    for name in names {
        assert!(
            b.iter().any(|e| e.starts_with(name)),
            "{name}: {why}: {b:?}"
        );
    }
}

#[test]
fn heavy_same_scenario_and_seed_give_byte_identical_output_and_report() {
    let dir = tempfile::tempdir().unwrap();
    let (r1, r2) = (dir.path().join("a.html"), dir.path().join("b.html"));
    let file = scenario("shared-dependency-outage");
    let file = file.to_str().unwrap();
    let a = run(&[
        "run",
        file,
        "--compare",
        "naive",
        "--events",
        "--report",
        r1.to_str().unwrap(),
    ]);
    let b = run(&[
        "run",
        file,
        "--compare",
        "naive",
        "--events",
        "--report",
        r2.to_str().unwrap(),
    ]);
    assert!(a.status.success(), "{}{}", stdout(&a), stderr(&a));
    assert_eq!(
        stdout(&a),
        stdout(&b),
        "same seed must give the same summary and events"
    );
    assert_eq!(
        std::fs::read(&r1).unwrap(),
        std::fs::read(&r2).unwrap(),
        "same seed must give the same report, byte for byte"
    );
}

#[test]
fn a_different_seed_gives_different_output() {
    let file = scenario("one-server-dies");
    let file = file.to_str().unwrap();
    let a = run(&["run", file, "--seed", "1", "--events"]);
    let b = run(&["run", file, "--seed", "2", "--events"]);
    assert_ne!(stdout(&a), stdout(&b), "the seed must matter");
}

#[test]
fn heavy_every_scenario_keeps_its_expectations() {
    let o = run(&["check", scenarios_dir().to_str().unwrap()]);
    assert!(
        o.status.success(),
        "vigil sim check failed:\n{}{}",
        stdout(&o),
        stderr(&o)
    );
    let out = stdout(&o);
    let n = out.lines().filter(|l| l.starts_with("ok ")).count();
    assert!(n >= 10, "at least the ten scenarios of the issue: {out}");
}

#[test]
fn every_scenario_has_expectations_for_both_runs_or_says_why_not() {
    for entry in std::fs::read_dir(scenarios_dir()).unwrap() {
        let path = entry.unwrap().path();
        let s = Scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(!s.expect.is_empty(), "{} has no [expect]", path.display());
        assert!(
            !s.expect_naive.is_empty() || s.config.description.contains("naive"),
            "{}: no [expect.naive] and the description does not say why",
            path.display()
        );
    }
}

#[test]
fn heavy_fail_open_regression_is_caught() {
    // The pool policy loses fail-open (panic threshold 0): the shared-dependency scenario
    // must break its expectations.
    let mut s = load("shared-dependency-outage");
    assert!(broken(&s, Policies::Vigil).is_empty(), "baseline holds");
    s.config.lb.pool.panic_threshold = 0.0;
    assert_breaks(
        &s,
        &["fail_open_within", "availability"],
        "must break without fail-open",
    );
}

#[test]
fn heavy_guard_regressions_are_caught() {
    // A controller without its guard replaces the fleet during a shared outage.
    let mut s = load("shared-dependency-outage");
    s.config.controller.mode = ControllerMode::Naive;
    assert_breaks(
        &s,
        &["controller_actions"],
        "an unguarded controller must break controller_actions",
    );
    // A guard whose state is not persisted refills its budget on restart.
    let mut s = load("controller-restart");
    assert!(broken(&s, Policies::Vigil).is_empty(), "baseline holds");
    s.config.controller.state = GuardStateStore::InMemory;
    assert_breaks(
        &s,
        &["controller_actions"],
        "a budget reset by a restart must show",
    );
}

#[test]
fn heavy_retry_budget_regression_is_caught() {
    // Two defences end the retry storm, each alone: the balancer's retry budget, and
    // the servers' admission control (work whose client has left is refused, not
    // queued). Without both the storm outlives its trigger.
    let mut s = load("retry-storm");
    assert!(broken(&s, Policies::Vigil).is_empty(), "baseline holds");
    s.config.lb.retries.limit = RetryLimit::None;
    let b = broken(&s, Policies::Vigil);
    assert!(
        !b.iter().any(|e| e.starts_with("recover_within")),
        "admission control alone ends the storm: {b:?}"
    );
    let mut s = load("retry-storm");
    s.config.fleet.admission = Switch::Off;
    assert!(
        broken(&s, Policies::Vigil).is_empty(),
        "the budget alone ends the storm"
    );
    s.config.lb.retries.limit = RetryLimit::None;
    assert_breaks(
        &s,
        &["recover_within", "availability", "amplification"],
        "an unbudgeted balancer in front of servers that queue everything must keep the fleet down",
    );
}

#[test]
fn heavy_p2c_and_dependency_guard_regressions_are_caught() {
    // Round-robin keeps sending the slow server its share, which it sheds: P2C on
    // outstanding requests is what steers around it without an ejection.
    let mut s = load("slow-host-beside-gray");
    assert!(broken(&s, Policies::Vigil).is_empty(), "baseline holds");
    s.config.lb.balance = Balance::RoundRobin;
    assert_breaks(
        &s,
        &["availability", "admission_refused"],
        "without P2C the slow server keeps its traffic",
    );
    // Without the dependency guard the slow database's calls hold every worker.
    let mut s = load("dependency-latency-creep");
    assert!(broken(&s, Policies::Vigil).is_empty(), "baseline holds");
    s.config.fleet.dependency_guard = Switch::Off;
    assert_breaks(
        &s,
        &["availability_during_faults", "degraded"],
        "without the guard the servable requests starve",
    );
}

#[test]
fn watchdog_and_worker_gate_regressions_are_caught() {
    let mut s = load("checker-dies");
    s.config.fleet.watchdog = Switch::Off;
    assert_breaks(
        &s,
        &["undetected"],
        "without the watchdog the stale servers stay in service",
    );
    let mut s = load("queue-worker-disk-full");
    s.config.queue.as_mut().unwrap().gate = Switch::Off;
    assert_breaks(
        &s,
        &["message_failure_rate"],
        "without the worker gate the sick worker eats the queue",
    );
}

#[test]
fn check_exits_1_and_names_the_broken_expectation() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("impossible.toml"),
        "duration = \"2m\"\n[fleet]\nservers = 4\n[[faults]]\nat = \"1m\"\nkind = \"kill\"\ntarget = \"servers:0-3\"\n[expect]\navailability = \">= 0.99\"\n",
    )
    .unwrap();
    let o = run(&["check", dir.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let out = stdout(&o);
    assert!(out.contains("impossible.toml"), "names the file: {out}");
    assert!(
        out.contains("availability >= 0.99"),
        "names the expectation: {out}"
    );
}

#[test]
fn bad_scenario_errors_name_file_line_and_key_and_exit_78() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        // (content, line, key or word that must appear)
        ("[fleet]\nservers = 20\nworkrs = 3\n", 3, "workrs"),
        ("[fleet]\nservers = \"many\"\n", 2, "fleet.servers"),
        (
            "[[faults]]\nat = \"1m\"\nkind = \"kill\"\ntarget = \"server:0\"\n[[faults]]\nat = \"2m\"\nkind = \"gray\"\ntarget = \"server:1\"\n",
            5,
            "faults[1].error_rate",
        ),
        (
            "[lb.pool.outlier]\nmax_ejection_percent = 300\n",
            2,
            "lb.pool.outlier.max_ejection_percent",
        ),
        (
            "[expect]\navailabilty = \">= 0.9\"\n",
            2,
            "expect.availabilty",
        ),
        ("duration = \"forever\"\n", 1, "duration"),
    ];
    for (k, (content, line, key)) in cases.iter().enumerate() {
        let file = dir.path().join(format!("bad{k}.toml"));
        std::fs::write(&file, content).unwrap();
        let o = run(&["run", file.to_str().unwrap()]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(78), "case {k}: {err}");
        let loc = format!("bad{k}.toml:{line}:");
        assert!(err.contains(&loc), "case {k}: must name {loc}: {err}");
        assert!(err.contains(key), "case {k}: must name {key}: {err}");
    }
}

#[test]
fn usage_errors_exit_64() {
    assert_eq!(run(&[]).status.code(), Some(64), "nothing to do");
    assert_eq!(
        run(&["run", "/nonexistent/x.toml"]).status.code(),
        Some(64),
        "no such file"
    );
    assert_eq!(
        run(&["run", "x.toml", "--compare", "smart"]).status.code(),
        Some(64),
        "bad value"
    );
    assert_eq!(
        run(&["check", "/nonexistent-dir"]).status.code(),
        Some(64),
        "no such dir"
    );
}

#[test]
fn issue_spellings_work() {
    // `vigil sim --compare naive FILE` and `vigil sim --check DIR`, as the issue has them.
    let file = scenario("one-server-dies");
    let o = run(&["--compare", "naive", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("naive"), "{}", stdout(&o));
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(&file, dir.path().join("a.toml")).unwrap();
    let o = run(&["--check", dir.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", stdout(&o));
}

#[test]
fn report_is_self_contained_and_shows_both_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.html");
    let file = scenario("zone-loss");
    let o = run(&[
        "run",
        file.to_str().unwrap(),
        "--compare",
        "naive",
        "--report",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let html = std::fs::read_to_string(&out).unwrap();
    assert!(html.starts_with("<!doctype html>"));
    assert!(html.matches("<svg").count() >= 2, "timeline charts");
    assert!(!html.contains("<script"), "no script");
    for attr in ["src=\"http", "href=\"http", "url(http", "@import"] {
        assert!(!html.contains(attr), "no external asset ({attr})");
    }
    assert!(
        html.contains("naive") && html.contains("vigil"),
        "both runs"
    );
    assert!(html.contains("zone 0 lost"), "faults are marked");
}

#[test]
fn report_marks_the_policy_decisions_on_the_charts() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.html");
    let file = scenario("shared-dependency-outage");
    let o = run(&[
        "run",
        file.to_str().unwrap(),
        "--report",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let html = std::fs::read_to_string(&out).unwrap();
    // Fail-open entered, with the fraction; the freeze, with its reason.
    assert!(
        html.contains("<title>fail-open at ") && html.contains("healthy &lt; 50% panic threshold"),
        "fail-open is marked with its fraction"
    );
    assert!(
        html.contains("<title>freeze at ") && html.contains("likely the shared dependency"),
        "the freeze is marked with its reason"
    );
}

#[test]
fn help_teaches() {
    let o = run(&["--help"]);
    assert!(o.status.success());
    let h = stdout(&o);
    for needle in ["Examples", "--compare naive", "check scenarios/", "78"] {
        assert!(h.contains(needle), "help must mention {needle}: {h}");
    }
}
