//! `vigil controller` and its store in trouble, as a real process on a real file
//! system: a store that fills up while running, files that are not a store at start.
//!
//! A full disk is made for real: the controller runs in its own mount namespace
//! (`unshare -m`) with its data directory on a small tmpfs, which the test fills
//! through `/proc/<pid>/root` and empties again. That needs root (as CI and the
//! development machines run); without it these tests say so and pass without
//! checking. Why a full disk rather than a fault-injection hook in the `Store` trait:
//! it is the failure that happens in practice, and it exercises SQLite's own
//! behaviour (writes failing with SQLITE_FULL while reads keep working), which a hook
//! would only imitate. Files that cannot be written at start are made with
//! `chattr +i` (which stops root too) and a read-only remount.

use crate::controller_support;

use controller_support::*;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;
use vigil_core::Status;

/// Whether this process may mount a tmpfs in a private mount namespace.
fn can_mount() -> bool {
    let probe = tempfile::tempdir().unwrap();
    std::process::Command::new("unshare")
        .args(["-m", "--", "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(probe.path())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

macro_rules! require_mount {
    () => {
        if !can_mount() {
            eprintln!(
                "SKIPPED: needs root and mount namespaces (unshare -m, mount -t tmpfs) to fill a real file system"
            );
            return;
        }
    };
}

/// A wrapper running the controller in its own mount namespace with `data` on a tmpfs
/// of `size`; `then` runs inside before the controller (e.g. copying a store in).
fn on_tmpfs(data: &Path, size: &str, then: &str) -> Vec<String> {
    let d = data.display();
    vec![
        "unshare".into(),
        "-m".into(),
        "--".into(),
        "sh".into(),
        "-c".into(),
        format!("mount -t tmpfs -o size={size} tmpfs '{d}' && {then} exec \"$0\" \"$@\""),
    ]
}

/// Fills the file system holding `path` with one file; returns its size.
fn fill(path: &Path) -> u64 {
    use std::io::Write;
    let mut f = std::fs::File::create(path).expect("create the filler");
    let chunk = vec![0u8; 64 * 1024];
    let mut written = 0u64;
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    let _ = f.flush();
    written
}

async fn readyz(c: &Controller) -> (u16, String) {
    let r = reqwest::get(c.url("/readyz")).await.expect("GET /readyz");
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

/// Runs `vigil controller` (through `wrapper`, with `extra` arguments) on the config in
/// `dir` until it exits; returns its exit code and stderr. A controller that starts
/// instead of refusing is killed and reported.
fn run_to_exit(dir: &Path, wrapper: &[String], extra: &[&str]) -> (Option<i32>, String) {
    let mut cmd = match wrapper.split_first() {
        Some((program, args)) => {
            let mut c = std::process::Command::new(program);
            c.args(args).arg(vigil_bin());
            c
        }
        None => std::process::Command::new(vigil_bin()),
    };
    let mut child = cmd
        .args(["controller", "-c"])
        .arg(dir.join("fleet.toml"))
        .args(extra)
        .env("RUST_LOG", "warn")
        .env_remove("VIGIL_API_TOKEN")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn vigil controller");
    let started = std::time::Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            return (
                out.status.code(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            );
        }
        if started.elapsed() > Duration::from_secs(10) {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!(
                "the controller started instead of refusing its store:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A store written by a real run: a controller that spent one budget token on t1 and
/// silenced t2, stopped with SIGTERM. Returns the config text.
async fn store_with_state(dir: &Path) -> String {
    let bs = backends(3);
    let cfg = base_config("") + &targets_toml(&bs);
    let c = Controller::start(dir, &cfg);
    c.wait_all(3, "healthy").await;
    let (code, _) = c
        .post(
            "/api/targets/t2/silence",
            Some(TOKEN),
            json!({"reason": "kept"}),
        )
        .await;
    assert_eq!(code, 200);
    bs[1].set_check("disk:free", Status::Fail);
    c.wait_for_actions("an action on t1").await;
    c.wait_budget_left(1).await;
    assert!(c.sigterm().success());
    cfg
}

/// The controller's view of a path inside its mount namespace.
fn seen_by(c: &Controller, path: &Path) -> PathBuf {
    PathBuf::from(format!("/proc/{}/root{}", c.pid(), path.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_every_decision_and_mutation_until_the_store_works_again() {
    require_mount!();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let bs = backends(4);
    std::fs::write(
        dir.path().join("fleet.toml"),
        base_config("") + &targets_toml(&bs),
    )
    .unwrap();
    let c = Controller::start_wrapped(dir.path(), &on_tmpfs(&data, "4m", ""));
    c.wait_all(4, "healthy").await;
    assert_eq!(readyz(&c).await.0, 200);

    let filler = seen_by(&c, &data.join("filler"));
    let filled = fill(&filler);
    assert!(filled > 0, "nothing written to {}", filler.display());
    bs[1].set_check("disk:free", Status::Fail);
    let (_, why) = c
        .wait_for("/readyz 503 with the store error", || async {
            let r = readyz(&c).await;
            (r.0 == 503).then_some(r)
        })
        .await;
    assert!(
        why.contains("store failing: no actions are taken") && why.contains("full"),
        "{why}"
    );
    // t1 fails probe after probe, far past the thresholds (3 over 1 s), while the
    // store cannot commit.
    c.wait_for("t1 probed failing 8 times", || async {
        let t = c.get("/api/targets/t1").await["target"].clone();
        let fails = t["history"]
            .as_array()?
            .iter()
            .filter(|p| p["ok"] == false)
            .count();
        (fails >= 8).then_some(())
    })
    .await;
    let t1 = c.get("/api/targets/t1").await;
    assert_eq!(
        t1["target"]["state"], "healthy",
        "the guard is as committed: {t1}"
    );
    assert_eq!(t1["target"]["consecutive_failures"], 0);
    assert!(
        c.actions().await.is_empty(),
        "acted without a durable intent"
    );
    assert!(c.decisions().await.is_empty());
    assert_eq!(c.guard().await["budget_left"], 2, "no budget spent");
    let m = c.metrics_text().await;
    assert!(
        sample(&m, "vigil_controller_store_errors_total").unwrap_or(0.0) >= 1.0,
        "{m}"
    );
    assert_eq!(
        sample(&m, "vigil_controller_store_healthy"),
        Some(0.0),
        "{m}"
    );
    assert_eq!(
        sample(&m, "vigil_controller_decisions_total{outcome=\"act\"}"),
        None,
        "{m}"
    );
    let page = reqwest::get(c.url("/"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("store failing: no actions are taken"),
        "the dashboard says so"
    );
    // Mutations are refused and not applied.
    let (code, body) = c
        .post(
            "/api/targets/t2/silence",
            Some(TOKEN),
            json!({"reason": "x"}),
        )
        .await;
    assert_eq!(code, 503, "{body}");
    let (code, _) = c
        .post("/api/freeze", Some(TOKEN), json!({"reason": "x"}))
        .await;
    assert_eq!(code, 503);
    assert!(c.get("/api/targets/t2").await["target"]["hold"].is_null());
    assert!(c.guard().await["manual_freeze"].is_null());

    // Room again: the store works, readiness returns, t1 is decided again.
    std::fs::remove_file(&filler).unwrap();
    c.wait_for("/readyz 200 again", || async {
        (readyz(&c).await.0 == 200).then_some(())
    })
    .await;
    let actions = c.wait_for_actions("t1 acted on once the store works").await;
    assert_eq!(actions.len(), 1);
    assert_eq!(actions[0]["target"], "t1");
    c.wait_budget_left(1).await;
    assert!(c.get("/api/targets/t2").await["target"]["hold"].is_null());
    assert!(c.guard().await["manual_freeze"].is_null());
    let m = c.metrics_text().await;
    assert_eq!(
        sample(&m, "vigil_controller_store_healthy"),
        Some(1.0),
        "{m}"
    );
    let logs = c.logs();
    assert!(
        logs.contains("store failing: no actions are taken until it works again")
            && logs.contains("guard put back at its last committed state")
            && logs.contains("store works again"),
        "{logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_is_empty_schemaless_or_corrupt_is_refused_with_78_until_reset_store() {
    let dir = tempfile::tempdir().unwrap();
    store_with_state(dir.path()).await;
    let db = dir.path().join("data/vigil.db");
    let good = std::fs::read(&db).unwrap();
    assert!(good.len() > 8 * 4096, "a store of several pages");
    let refused = |why: &str| {
        let (code, err) = run_to_exit(dir.path(), &[], &[]);
        assert_eq!(code, Some(78), "{err}");
        assert!(
            err.contains(&db.display().to_string()) && err.contains(why),
            "names the file and what is wrong ({why}): {err}"
        );
        assert!(
            err.contains("--reset-store") && err.contains("action budget already spent"),
            "says how to start over and what it loses: {err}"
        );
    };
    // 0 bytes (today it starts with a full budget and no warning).
    std::fs::write(&db, b"").unwrap();
    refused("is empty (0 bytes)");
    // A SQLite file without vigil's schema.
    std::fs::remove_file(&db).unwrap();
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch("CREATE TABLE notes (x); INSERT INTO notes VALUES (1);")
        .unwrap();
    refused("holds no vigil store");
    // The real store with pages 3 to 6 overwritten: it fails its integrity check.
    let mut bad = good.clone();
    bad[2 * 4096..6 * 4096].fill(0xA5);
    std::fs::write(&db, &bad).unwrap();
    let (code, err) = run_to_exit(dir.path(), &[], &[]);
    assert_eq!(code, Some(78), "{err}");
    assert!(
        err.contains("quick_check") || err.contains("malformed") || err.contains("not a database"),
        "{err}"
    );
    // The good store again: it starts, with the state the earlier run left.
    std::fs::write(&db, &good).unwrap();
    let c = Controller::start_existing(dir.path());
    assert_eq!(
        c.guard().await["budget_left"],
        1,
        "the spent token stays spent"
    );
    assert_eq!(
        c.get("/api/targets/t2").await["target"]["hold"]["reason"],
        "kept"
    );
    assert!(c.sigterm().success());

    // --reset-store starts over from a refused store, keeps the old file aside and says
    // what is lost.
    std::fs::write(&db, &bad).unwrap();
    let c = start_with_args(dir.path(), &["--reset-store"]);
    assert!(
        c.logs()
            .contains("--reset-store: starting over with an empty store"),
        "{}",
        c.logs()
    );
    assert_eq!(
        c.guard().await["budget_left"],
        2,
        "a new store: a full budget"
    );
    assert!(c.get("/api/targets/t2").await["target"]["hold"].is_null());
    let kept: Vec<_> = std::fs::read_dir(dir.path().join("data"))
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().to_string_lossy().into_owned();
            name.starts_with("vigil.db.reset-").then_some(name)
        })
        .collect();
    assert!(!kept.is_empty(), "the refused file is kept aside");
    assert!(c.sigterm().success());
    // Given again on a usable store, --reset-store keeps it.
    let c = start_with_args(dir.path(), &["--reset-store"]);
    assert!(
        c.logs().contains("the store is usable: kept"),
        "{}",
        c.logs()
    );
    assert!(c.sigterm().success());
}

/// Starts the controller with extra arguments (after `-c fleet.toml`).
fn start_with_args(dir: &Path, args: &[&str]) -> Controller {
    // `sh -c 'exec "$0" "$@" ARGS'` appends arguments after the harness's own.
    let script = format!(
        "exec \"$0\" \"$@\" {}",
        args.iter()
            .map(|a| format!("'{a}'"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    Controller::start_wrapped(dir, &["sh".into(), "-c".into(), script])
}

/// Makes a file immutable (`chattr +i`: even root cannot write it) until dropped.
struct Immutable(PathBuf);

impl Immutable {
    fn set(path: &Path) -> Option<Immutable> {
        let ok = std::process::Command::new("chattr")
            .arg("+i")
            .arg(path)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Immutable(path.to_path_buf()))
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .arg(&self.0)
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_it_cannot_write_is_refused_with_78() {
    let dir = tempfile::tempdir().unwrap();
    store_with_state(dir.path()).await;
    let data = dir.path().join("data");
    let db = data.join("vigil.db");
    // A file that cannot be written: SQLite opens it read-only without a word, and
    // before this check every commit then failed.
    match Immutable::set(&db) {
        Some(_immutable) => {
            let (code, err) = run_to_exit(dir.path(), &[], &[]);
            assert_eq!(code, Some(78), "{err}");
            assert!(
                err.contains("cannot be written") && err.contains("vigil.db"),
                "{err}"
            );
        }
        None => eprintln!("SKIPPED the immutable-file case: chattr +i not possible here"),
    }
    require_mount!();
    // The same store on a file system mounted read-only after it was put there.
    let good = dir.path().join("good.db");
    std::fs::copy(&db, &good).unwrap();
    let wrapper = on_tmpfs(
        &data,
        "4m",
        &format!(
            "cp '{}' '{}' && mount -o remount,ro '{}' &&",
            good.display(),
            db.display(),
            data.display()
        ),
    );
    let (code, err) = run_to_exit(dir.path(), &wrapper, &[]);
    assert_eq!(code, Some(78), "{err}");
    assert!(
        err.contains("vigil.db") && err.contains("refusing to start"),
        "{err}"
    );
}
