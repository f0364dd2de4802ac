//! `vigil controller` and its store in trouble, as a real process on a real file
//! system: a store that fills up while running, files that are not a store at start.
//!
//! A full disk is made for real: the controller runs in its own mount namespace
//! (`unshare -m`) with its data directory on a small tmpfs, which the test fills
//! through `/proc/<pid>/root` and empties again. That needs root (as CI and the
//! development machines run); without it these tests say so and pass without
//! checking. Why not a read-only file: root writes through file permissions, and a
//! fault-injection hook in the store would test the hook rather than SQLite's
//! behaviour on a full disk (some writes failing, reads still working).

mod controller_support;

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
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(c.guard().await["budget_left"], 1);
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
