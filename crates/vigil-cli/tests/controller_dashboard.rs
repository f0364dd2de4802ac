//! The controller's dashboard in a real browser: Debian's headless Chromium loads it,
//! runs its script (virtual time lets its live refresh fire), and dumps the DOM. The
//! page must log nothing to the console but its own greeting, show every target by
//! zone, refresh itself, and show a failed target as such.

mod controller_support;

use controller_support::*;
use std::process::Command;
use std::time::Duration;
use vigil_core::Status;

const CHROMIUM: &str = "chromium";

/// Loads `url` in headless Chromium; returns the DOM after scripts ran for 5 s of
/// virtual time, and the console messages.
fn load(url: &str) -> (String, Vec<String>) {
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("--dump-dom")
        .arg(url)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {CHROMIUM} ({e}): the dashboard test needs Debian's chromium; \
                 install it with `apt-get install -y chromium chromium-driver` \
                 (scripts/install-test-deps.sh does this in CI)"
            )
        });
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let console = stderr
        .lines()
        .filter(|l| l.contains(":CONSOLE") || l.contains("Uncaught"))
        .map(String::from)
        .collect();
    (String::from_utf8_lossy(&out.stdout).into_owned(), console)
}

/// The `data-state` of a target's tile.
fn tile_state(dom: &str, id: &str) -> Option<String> {
    let at = dom.find(&format!("id=\"target-{id}\""))?;
    let start = dom[..at].rfind('<')?;
    let tag = &dom[start..start + dom[start..].find('>')?];
    let s = tag.find("data-state=\"")? + "data-state=\"".len();
    Some(tag[s..s + tag[s..].find('"')?].to_string())
}

fn check_console(console: &[String]) {
    assert!(
        console
            .iter()
            .any(|l| l.contains("\"vigil dashboard live\"")),
        "the page's own console line must be seen (else the console check is blind): {console:#?}"
    );
    let unexpected: Vec<_> = console
        .iter()
        .filter(|l| !l.contains("\"vigil dashboard live\""))
        .collect();
    assert!(
        unexpected.is_empty(),
        "console errors/messages: {unexpected:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_loads_cleanly_shows_targets_by_zone_and_changes_when_one_fails() {
    let dir = tempfile::tempdir().unwrap();
    let bs = backends(6);
    let targets: String = bs
        .iter()
        .enumerate()
        .map(|(i, b)| {
            format!(
                "[[targets]]\nid = \"t{i}\"\nurl = \"http://{}\"\nzone = \"{}\"\n",
                b.addr(),
                if i < 3 { "zone-a" } else { "zone-b" }
            )
        })
        .collect();
    let c = Controller::start(dir.path(), &(base_config("") + &targets));
    c.wait_all(6, "healthy").await;

    let url = c.url("/");
    let (dom, console) = tokio::task::spawn_blocking(move || load(&url))
        .await
        .unwrap();
    check_console(&console);
    for i in 0..6 {
        assert_eq!(
            tile_state(&dom, &format!("t{i}")).as_deref(),
            Some("healthy"),
            "{dom}"
        );
    }
    assert!(
        dom.contains("Zone zone-a") && dom.contains("Zone zone-b"),
        "grouped by zone"
    );
    assert!(dom.contains("Guard armed"), "guard state shown");
    let refreshed: u32 = dom
        .split("data-refreshed=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    assert!(
        refreshed >= 1,
        "the page refreshes itself live (data-refreshed={refreshed})"
    );

    bs[4].set_check("disk:free", Status::Fail);
    c.wait_for("t4 reported", || async {
        c.targets()
            .await
            .iter()
            .any(|t| t["id"] == "t4" && t["state"] == "reported")
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let url = c.url("/");
    let (dom, console) = tokio::task::spawn_blocking(move || load(&url))
        .await
        .unwrap();
    check_console(&console);
    assert_eq!(tile_state(&dom, "t4").as_deref(), Some("reported"));
    assert_eq!(tile_state(&dom, "t0").as_deref(), Some("healthy"));
    assert!(
        dom.contains("act on t4"),
        "the decision is listed with its reasons"
    );
    assert!(dom.contains("local check disk:free failed"));
}
