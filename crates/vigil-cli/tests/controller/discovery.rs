//! `vigil controller` with a discovery file that is broken, missing or changing while
//! the controller starts: the real binary, real files, real SQLite.

use crate::controller_support;

use controller_support::*;
use serde_json::{Value, json};
use std::path::Path;
use vigil_core::Status;

fn list(entries: &[(&str, String)]) -> String {
    let v: Vec<Value> = entries
        .iter()
        .map(|(id, addr)| json!({"id": id, "url": format!("http://{addr}"), "zone": "z"}))
        .collect();
    serde_json::to_string(&v).unwrap()
}

async fn state_of(c: &Controller, id: &str) -> Value {
    c.get(&format!("/api/targets/{id}")).await["target"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_or_missing_discovery_file_at_start_keeps_the_guard_state_until_a_good_one() {
    let dir = tempfile::tempdir().unwrap();
    let bs = backends(3);
    let entries: Vec<(&str, String)> = ["d0", "d1", "d2"]
        .into_iter()
        .zip(bs.iter().map(|b| b.addr().to_string()))
        .collect();
    let file = dir.path().join("targets.json");
    std::fs::write(&file, list(&entries)).unwrap();
    let cfg = base_config("[discovery]\npath = \"targets.json\"\npoll = \"100ms\"\n");
    let c = Controller::start(dir.path(), &cfg);
    c.wait_all(3, "healthy").await;
    let (code, _) = c
        .post(
            "/api/targets/d1/silence",
            Some(TOKEN),
            json!({"reason": "keep me"}),
        )
        .await;
    assert_eq!(code, 200);
    bs[0].set_check("disk:free", Status::Fail);
    c.wait_for_actions("an action on d0").await;
    let penalty = state_of(&c, "d0").await["penalty"].as_u64().unwrap();
    assert!(penalty > 0);
    assert!(c.sigterm().success());

    for (case, broken) in [
        ("malformed", Some("[{\"id\": \"d0\", \"url\": ")),
        ("missing", None),
    ] {
        match broken {
            Some(text) => std::fs::write(&file, text).unwrap(),
            None => std::fs::remove_file(&file).unwrap(),
        }
        let c = Controller::start_existing(dir.path());
        let t = c.targets().await;
        assert_eq!(
            t.len(),
            3,
            "{case} file: the store's targets are kept: {t:#?}"
        );
        let d1 = state_of(&c, "d1").await;
        assert_eq!(
            d1["hold"]["reason"], "keep me",
            "{case}: the hold is kept: {d1}"
        );
        assert_eq!(
            c.guard().await["budget_left"],
            1,
            "{case}: the budget is kept"
        );
        let d0 = state_of(&c, "d0").await;
        assert!(
            d0["penalty"].as_u64().unwrap() > 0 && d0["state"] == "reported",
            "{case}: damping and the report are kept: {d0}"
        );
        assert!(
            c.logs().contains("the targets the store knows are kept"),
            "{}",
            c.logs()
        );
        // The API and the metrics say the file fails, and why.
        let d = c.get("/api/discovery").await;
        let file_status = &d["sources"][0];
        assert!(
            file_status["source"] == "file"
                && file_status["ok"] == false
                && file_status["last_error"]
                    .as_str()
                    .is_some_and(|e| e.contains("targets.json")),
            "{case}: {d:#}"
        );
        assert!(
            c.metrics_text()
                .await
                .contains("vigil_controller_discovery_up{source=\"file\"} 0\n"),
            "{case}"
        );
        // A good file arrives: it is applied, and what it drops is forgotten.
        std::fs::write(&file, list(&entries[..2])).unwrap();
        c.wait_for("d2 forgotten once a good file arrives", || async {
            let t = c.targets().await;
            (t.len() == 2 && t.iter().all(|t| t["id"] != "d2")).then_some(())
        })
        .await;
        let d = c.get("/api/discovery").await;
        assert!(
            d["sources"][0]["ok"] == true && d["sources"][0]["targets"] == 2,
            "{case}: a good file clears the failure: {d:#}"
        );
        assert_eq!(state_of(&c, "d1").await["hold"]["reason"], "keep me");
        assert_eq!(state_of(&c, "d0").await["state"], "reported");
        // The next round starts from the same store with d2 back in the file.
        std::fs::write(&file, list(&entries)).unwrap();
        c.wait_for("d2 back", || async {
            (c.targets().await.len() == 3).then_some(())
        })
        .await;
        assert!(c.sigterm().success());
    }
}

/// Writes a list of `n` targets that are never probed within the test (a 1000 h
/// interval), plus `extra`.
fn quiet_list(n: usize, extra: Option<(&str, String)>) -> String {
    let mut v: Vec<Value> = (0..n)
        .map(|i| json!({"id": format!("q{i:05}"), "url": "http://127.0.0.1:9", "zone": "z", "interval": "1000h"}))
        .collect();
    if let Some((id, addr)) = extra {
        v.push(json!({"id": id, "url": format!("http://{addr}"), "zone": "z"}));
    }
    serde_json::to_string(&v).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discovery_change_during_start_up_is_applied() {
    let dir = tempfile::tempdir().unwrap();
    let late = backends(1);
    // A list large enough that start-up takes a while between reading the file and
    // the watcher's first poll.
    const N: usize = 3000;
    let file = dir.path().join("targets.json");
    std::fs::write(&file, quiet_list(N, None)).unwrap();
    std::fs::write(
        dir.path().join("fleet.toml"),
        base_config("[discovery]\npath = \"targets.json\"\npoll = \"1000h\"\n"),
    )
    .unwrap();
    let changed = quiet_list(N, Some(("late", late[0].addr().to_string())));
    let path = file.clone();
    let mut written = false;
    // The file changes right after the controller has read it at start: at the first
    // "target added" (logged as the start-up list is applied, one line per target,
    // before the watcher's first poll).
    let c = Controller::start_watching(
        dir.path(),
        Box::new(move |line: &str| {
            if !written && line.contains("target added") {
                std::fs::write(&path, &changed).unwrap();
                written = true;
            }
        }),
    );
    assert_written(&file);
    c.wait_for("the target added during start-up", || async {
        let t = c.targets().await;
        t.iter()
            .any(|t| t["id"] == "late" && t["state"] == "healthy")
            .then_some(())
    })
    .await;
}

fn assert_written(file: &Path) {
    let text = std::fs::read_to_string(file).unwrap();
    assert!(text.contains("\"late\""), "the change was written");
}
