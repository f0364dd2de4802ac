//! The controller's dashboard in a real browser: Debian's headless Chromium loads it,
//! runs its script (virtual time lets its live refresh fire), and dumps the DOM. The
//! page must log nothing to the console but its own greeting, show every target by
//! zone, refresh itself, and show a failed target as such, with what fails on its
//! tile, the counts per state, a legend, the action taken, and decisions held back by a
//! freeze that do not repeat the freeze's sentence.
//!
//! At 500 targets, Chromium driven by chromedriver (WebDriver over loopback HTTP) in a
//! 1280x800 window: the failing and held targets come first, most severe first then by
//! zone, all above the fold, their failing check and hold reason in visible text; a
//! screenshot is left in the test's target tmp dir (`dashboard-500.png`) to look at.
//!
//! With queue workers heartbeating, the page lists them in their own section, the black
//! hole first with its failure rate beside its group's.

use crate::controller_support;
use crate::lb_support;

use base64::Engine as _;
use controller_support::*;
use serde_json::{Value, json};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use vigil_core::Status;
use vigil_core::guard::Reason;

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

/// What the live part shows inside a target's tile (its text and markup, not its
/// opening tag, whose tooltip does not count as visible).
fn tile_inner(dom: &str, id: &str) -> String {
    let at = dom
        .find(&format!("id=\"target-{id}\""))
        .unwrap_or_else(|| panic!("no tile for {id}"));
    let body = &dom[at + dom[at..].find('>').expect("tag end") + 1..];
    let end = body
        .find("id=\"target-")
        .unwrap_or(body.len())
        .min(body.find("</section>").unwrap_or(body.len()));
    body[..end].to_string()
}

/// The number the legend shows for `state`.
fn count_of(dom: &str, state: &str) -> Option<u64> {
    let at = dom.find(&format!("id=\"count-{state}\""))?;
    let s = &dom[at + dom[at..].find('>')? + 1..];
    s[..s.find('<')?].trim().parse().ok()
}

/// The element with `id`, up to its closing `tag`.
fn element<'a>(dom: &'a str, tag: &str, id: &str) -> &'a str {
    let at = dom
        .find(&format!(" id=\"{id}\""))
        .unwrap_or_else(|| panic!("no element {id} in {dom}"));
    let start = dom[..at].rfind(&format!("<{tag}")).expect("its tag");
    let end = dom[start..].find(&format!("</{tag}>")).expect("closed");
    &dom[start..start + end]
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
        tile_inner(&dom, "t4").contains("failing: disk:free"),
        "the failing check is on the tile, not only in its tooltip: {}",
        tile_inner(&dom, "t4")
    );
    assert!(
        tile_inner(&dom, "t4").contains(" failed check"),
        "the failure streak is said in words, not a bare count: {}",
        tile_inner(&dom, "t4")
    );
    assert_eq!(count_of(&dom, "reported"), Some(1), "per-state counts");
    assert_eq!(count_of(&dom, "healthy"), Some(5), "per-state counts");
    assert_eq!(count_of(&dom, "unhealthy"), Some(0), "per-state counts");
    let legend = element(&dom, "section", "legend");
    for state in [
        "unhealthy",
        "reported",
        "flapping",
        "failing",
        "silenced",
        "maintenance",
        "unknown",
        "grace",
        "healthy",
    ] {
        assert!(
            legend.contains(&format!("<strong>{state}</strong>: ")),
            "the legend explains {state}: {legend}"
        );
    }
    let decisions = element(&dom, "table", "decisions");
    assert!(
        decisions.contains("<td>t4</td><td class=\"act\">act</td>"),
        "the decision is listed: {decisions}"
    );
    assert!(
        decisions.contains("local check disk:free failed"),
        "with its reasons"
    );
    let actions = element(&dom, "table", "actions");
    assert!(
        actions.contains("data-target=\"t4\"") && actions.contains("replace <strong>t4</strong>"),
        "the action is listed: what was replaced: {actions}"
    );

    // Zone zone-a fails whole: the guard freezes and holds the three back. Its
    // reasons are said once, in the guard's box; each held-back decision points to the
    // freeze in a few words instead of repeating the sentence.
    for b in &bs[0..3] {
        b.set_check("disk:free", Status::Fail);
    }
    let held = c
        .wait_for("t0, t1, t2 held back by the freeze", || async {
            let d = c.decisions().await;
            let held: Vec<Value> = d
                .into_iter()
                .filter(|d| d["outcome"] == "hold_back")
                .filter(|d| ["t0", "t1", "t2"].contains(&d["target"].as_str().unwrap_or("")))
                .collect();
            (held.len() >= 3).then_some(held)
        })
        .await;
    let guard = c
        .wait_for("the guard frozen", || async {
            let g = c.guard().await;
            (g["frozen"] == true).then_some(g)
        })
        .await;
    let url = c.url("/");
    let (dom, console) = tokio::task::spawn_blocking(move || load(&url))
        .await
        .unwrap();
    check_console(&console);
    let guard_box = element(&dom, "section", "guard");
    let decisions = element(&dom, "table", "decisions");
    let mut sentences: Vec<String> = guard["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    assert!(!sentences.is_empty(), "a frozen guard says why: {guard}");
    for s in &sentences {
        assert!(guard_box.contains(s.as_str()), "the guard says why: {s}");
    }
    for d in &held {
        for r in d["reasons"].as_array().unwrap() {
            let r: Reason = serde_json::from_value(r.clone()).unwrap();
            if matches!(r, Reason::FleetFrozen { .. } | Reason::ZoneFrozen { .. }) {
                sentences.push(r.to_string());
            }
        }
    }
    for s in &sentences {
        assert!(
            !decisions.contains(s.as_str()),
            "no decision row repeats the freeze's sentence {s:?}: {decisions}"
        );
    }
    assert!(
        decisions.contains("fleet frozen ("),
        "a held-back row names the freeze in a few words: {decisions}"
    );
    assert_eq!(
        count_of(&dom, "unhealthy"),
        Some(3),
        "{}",
        element(&dom, "section", "legend")
    );
}

// === 500 targets, through chromedriver ===

/// A chromedriver on loopback, killed on drop.
struct Driver {
    child: std::process::Child,
    base: String,
    session: String,
    http: reqwest::Client,
    _profile: tempfile::TempDir,
}

impl Driver {
    /// Starts chromedriver and a headless Chromium session in a `w`x`h` window.
    async fn start(w: u32, h: u32) -> Driver {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run chromedriver ({e}): install it with \
                     `apt-get install -y chromium chromium-driver` (scripts/install-test-deps.sh)"
                )
            });
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let started = Instant::now();
        loop {
            let ready = match http.get(format!("{base}/status")).send().await {
                Ok(r) => r
                    .json::<Value>()
                    .await
                    .is_ok_and(|v| v["value"]["ready"] == true),
                Err(_) => false,
            };
            if ready {
                break;
            }
            assert!(started.elapsed() < DEADLINE, "chromedriver did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let profile = tempfile::tempdir().unwrap();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    format!("--window-size={w},{h}"),
                    format!("--user-data-dir={}", profile.path().display()),
                ]
            }
        }}});
        let v: Value = http
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let session = v["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {v}"))
            .to_string();
        Driver {
            child,
            base,
            session,
            http,
            _profile: profile,
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut req = self.http.request(method, url);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let v: Value = req.send().await.unwrap().json().await.unwrap();
        assert!(v["value"].get("error").is_none(), "WebDriver {path}: {v}");
        v["value"].clone()
    }

    async fn goto(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await;
    }

    async fn script(&self, script: &str) -> Value {
        self.call(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({ "script": script, "args": [] })),
        )
        .await
    }

    async fn screenshot(&self) -> Vec<u8> {
        let b64 = self.call(reqwest::Method::GET, "/screenshot", None).await;
        base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().unwrap())
            .unwrap()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // Ending the session makes chromedriver quit its Chromium; killing chromedriver
        // alone left the browser's processes running after the tests (a synchronous
        // request: this is a destructor).
        use std::io::{Read, Write};
        let addr = self.base.trim_start_matches("http://");
        if let Ok(mut c) = std::net::TcpStream::connect(addr) {
            let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
            let _ = c.set_write_timeout(Some(Duration::from_secs(10)));
            let request = format!(
                "DELETE /session/{} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
                self.session
            );
            if c.write_all(request.as_bytes()).is_ok() {
                let _ = c.read_to_end(&mut Vec::new());
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the page shows, measured by the browser.
const MEASURE: &str = r#"
const tiles = [...document.querySelectorAll('#attention .tile')].map(t => ({
  id: t.id.replace('target-', ''), state: t.dataset.state,
  zone: (t.querySelector('.zone') || {textContent: ''}).textContent,
  text: t.innerText, bottom: t.getBoundingClientRect().bottom }));
const counts = {};
document.querySelectorAll('#legend .entry').forEach(e => {
  counts[e.dataset.state] = Number(e.querySelector('.n').textContent); });
return { height: window.innerHeight, tiles, counts,
  legend: document.getElementById('legend').innerText,
  actions: [...document.querySelectorAll('#actions tr[data-target]')].map(r => ({
    target: r.dataset.target, state: r.dataset.state, text: r.innerText })),
  banner: document.getElementById('store-error') !== null,
  firstCalmTop: (document.querySelector('.tile.small') || {getBoundingClientRect: () => ({top: 1e9})}).getBoundingClientRect().top };
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_500_targets_the_failing_ones_come_first_above_the_fold_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    // One healthy backend per zone: fewer targets on each pooled host:port.
    let healthy: Vec<_> = (0..5)
        .map(|z| vigil_testkit::Backend::start(&format!("healthy-z{z}")))
        .collect();
    let sick = vigil_testkit::Backend::start("sick");
    sick.set_check("disk:free", Status::Fail);
    // Nothing listens there: an endpoint failure.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let disk = [7, 48, 123, 199, 250, 311, 402, 477];
    let refused = [64, 333];
    let mut config = format!(
        r#"
listen = "127.0.0.1:0"
data_dir = "data"
api_token = "{TOKEN}"
[probe]
interval = "1s"
timeout = "3s"
jitter = 0.1
[guard]
grace = "0s"
min_failing = "1s"
[guard.budget]
actions = 2
per = "10m"
"#
    );
    for i in 0..500 {
        // The healthy ones probed every 5 s (a loaded test machine must not time
        // them out), the failing ones every second.
        let (addr, interval) = if disk.contains(&i) {
            (sick.addr(), "1s")
        } else if refused.contains(&i) {
            (dead, "1s")
        } else {
            (healthy[i % 5].addr(), "5s")
        };
        config.push_str(&format!(
            "[[targets]]\nid = \"n{i:03}\"\nurl = \"http://{addr}\"\nzone = \"z{}\"\ninterval = \"{interval}\"\n",
            i % 5
        ));
    }
    let c = Controller::start(dir.path(), &config);
    let (code, body) = c
        .post(
            "/api/targets/n100/silence",
            Some(TOKEN),
            json!({"reason": "kernel patching"}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    c.wait_for(
        "2 reported, 8 unhealthy, 1 silenced, 489 healthy",
        || async {
            let g = c.get("/api/guard").await;
            let n = |s: &str| g["counts"][s].as_u64().unwrap_or(0);
            (n("reported") == 2 && n("unhealthy") == 8 && n("silenced") == 1 && n("healthy") == 489)
                .then_some(())
        },
    )
    .await;
    c.wait_for("both actions done", || async {
        let a = c.actions().await;
        (a.len() == 2 && a.iter().all(|a| a["state"] == "done")).then_some(())
    })
    .await;

    let driver = Driver::start(1280, 800).await;
    driver.goto(&c.url("/")).await;
    let m = driver.script(MEASURE).await;
    let png = driver.screenshot().await;
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-500.png");
    std::fs::write(&shot, &png).unwrap();
    eprintln!("screenshot: {}", shot.display());

    let height = m["height"].as_f64().unwrap();
    let tiles = m["tiles"].as_array().unwrap();
    assert_eq!(
        tiles.len(),
        11,
        "10 failing and 1 silenced need attention: {m}"
    );
    for t in tiles {
        assert!(
            t["bottom"].as_f64().unwrap() <= height,
            "{} is above the fold ({height} px): {t}",
            t["id"]
        );
    }
    let order: Vec<(String, String, String)> = tiles
        .iter()
        .map(|t| {
            (
                t["state"].as_str().unwrap().to_string(),
                t["zone"].as_str().unwrap().to_string(),
                t["id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let rank = |s: &str| {
        ["unhealthy", "reported", "silenced"]
            .iter()
            .position(|x| *x == s)
            .unwrap_or_else(|| panic!("unexpected state {s}"))
    };
    let mut sorted = order.clone();
    sorted.sort_by(|a, b| (rank(&a.0), &a.1, &a.2).cmp(&(rank(&b.0), &b.1, &b.2)));
    assert_eq!(order, sorted, "most severe first, then by zone, then id");
    for t in tiles {
        let id = t["id"].as_str().unwrap();
        let n: usize = id[1..].parse().unwrap();
        let text = t["text"].as_str().unwrap();
        if disk.contains(&n) {
            assert!(text.contains("failing: disk:free"), "{id}: {text:?}");
        } else if refused.contains(&n) {
            assert!(text.contains("failing: endpoint"), "{id}: {text:?}");
        } else {
            assert_eq!(id, "n100");
            assert!(text.contains("silenced: kernel patching"), "{text:?}");
        }
    }
    assert!(
        m["firstCalmTop"].as_f64().unwrap()
            > tiles
                .iter()
                .map(|t| t["bottom"].as_f64().unwrap())
                .fold(0.0, f64::max),
        "the healthy ones come after: {m}"
    );
    for (state, n) in [
        ("healthy", 489),
        ("unhealthy", 8),
        ("reported", 2),
        ("silenced", 1),
        ("failing", 0),
    ] {
        assert_eq!(m["counts"][state], n, "{state}: {}", m["counts"]);
    }
    let actions = m["actions"].as_array().unwrap();
    assert_eq!(actions.len(), 2, "{m}");
    for a in actions {
        assert_eq!(a["state"], "done", "{a}");
        assert!(a["text"].as_str().unwrap().contains("replace"), "{a}");
    }
    assert_eq!(
        m["banner"], false,
        "no store-error banner while the store works"
    );
}

/// The one page shows the whole system: the balancers' pools (in service, unhealthy,
/// ejected, drained, fail-open with its reason, and the success rate of the answers
/// their clients got) beside the guard, a balancer that cannot be read with its error,
/// and that the `log` actuator is a dry run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_the_balancers_pools_beside_the_guard_and_says_dry_run() {
    let dir = tempfile::tempdir().unwrap();
    let bs = backends(3);
    let addrs: Vec<String> = bs
        .iter()
        .map(|b| format!("{{ addr = \"{}\" }}", b.addr()))
        .collect();
    let lb = lb_support::LbProcess::start(&format!(
        "[pools.web]\ntargets = [{}]\n[pools.web.health_check]\ninterval = \"200ms\"\ntimeout = \"300ms\"\nhealthy_threshold = 1\nunhealthy_threshold = 2\n",
        addrs.join(", ")
    ))
    .await;
    let nobody = lb_support::free_port();
    let extra = format!(
        "[dashboard]\nbalancers = [\"http://127.0.0.1:{}\", \"http://127.0.0.1:{nobody}\"]\n",
        lb.admin
    );
    let c = Controller::start(dir.path(), &(base_config(&extra) + &targets_toml(&bs)));
    c.wait_all(3, "healthy").await;

    // The controller reads the balancer every 2 s: await the row, then change the pool.
    let live = c.url("/dashboard/live");
    let client = reqwest::Client::new();
    let fetch = |url: String| {
        let client = client.clone();
        async move { client.get(url).send().await.unwrap().text().await.unwrap() }
    };
    let row = |html: &str| -> Option<String> {
        let at = html.find("data-pool=\"web\"")?;
        let end = html[at..].find("</tr>")? + at;
        Some(html[at..end].to_string())
    };
    let cells = |row: &str| -> Vec<String> {
        row.split("<td class=\"n\">")
            .skip(1)
            .map(|c| c[..c.find('<').unwrap()].to_string())
            .collect()
    };
    let deadline = Instant::now() + DEADLINE;
    loop {
        let html = fetch(live.clone()).await;
        if row(&html).is_some_and(|r| cells(&r) == ["3", "0", "0", "0", "0"]) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no pool row with 3 in service: {html}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Clients through the balancer, one target answering 500 to one request in four
    // (never five in a row, and two peers are too few for the success-rate rule): the
    // pool's client success rate is what these clients got.
    bs[1].set_mode(vigil_testkit::Mode::FailEvery {
        every: 4,
        status: 500,
    });
    let (mut ok, total) = (0u32, 60u32);
    for _ in 0..total {
        let r = client
            .get(format!("http://127.0.0.1:{}/x", lb.port))
            .send()
            .await
            .unwrap();
        ok += u32::from(r.status() == 200);
    }
    let rate = format!(
        "{:.1}% of {total} answers",
        f64::from(ok) * 100.0 / f64::from(total)
    );
    loop {
        let html = fetch(live.clone()).await;
        if row(&html).is_some_and(|r| r.contains(&rate)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the pool's client success rate ({rate}) never showed: {html}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bs[0].set_health_mode(vigil_testkit::Mode::Status(503));
    loop {
        let html = fetch(live.clone()).await;
        if row(&html).is_some_and(|r| cells(&r) == ["2", "1", "0", "0", "0"]) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the unhealthy target never showed: {html}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let url = c.url("/");
    let (dom, console) = tokio::task::spawn_blocking(move || load(&url))
        .await
        .unwrap();
    check_console(&console);
    let pools = element(&dom, "section", "balancers");
    let web = row(pools).expect("the web pool's row in the browser's DOM");
    assert_eq!(cells(&web), ["2", "1", "0", "0", "0"], "{web}");
    assert!(
        web.contains(&format!(": {}</small>", bs[0].addr())),
        "the unhealthy target is named beside its count: {web}"
    );
    assert!(web.contains("healthy targets only"), "{web}");
    assert!(
        web.contains(&rate) && web.contains("data-success-rate="),
        "the pool's client success rate ({rate}) is on the page: {web}"
    );
    assert!(
        pools.contains(&format!("127.0.0.1:{nobody}")) && pools.contains("cannot be read"),
        "an unreadable balancer is shown with its error: {pools}"
    );
    let dry = element(&dom, "div", "dry-run");
    assert!(dry.contains("Dry run"), "{dry}");
}

/// Heartbeat workers w0..w3 (library `Worker`s and heartbeats, as in
/// controller_workers.rs), w3 failing everything: the page, after its live refresh,
/// lists the workers in their own section, the black hole first, its 100% beside its
/// group's rate and its peers' pooled rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_lists_queue_workers_with_their_rate_beside_their_groups() {
    use vigil::heartbeat::{self, HeartbeatConfig};
    use vigil::worker::Worker;
    let dir = tempfile::tempdir().unwrap();
    let mut config = base_config(&format!(
        "[heartbeat]\nttl = \"3s\"\nsecret = \"{HEARTBEAT_SECRET}\"\nmax_skew = \"5s\"\n\
         [anomaly]\nwindow = \"6s\"\nbucket = \"1s\"\nmin_volume = 20\n"
    ));
    for i in 0..4 {
        config += &format!("[[targets]]\nid = \"w{i}\"\nheartbeat = true\ngroup = \"q\"\n");
    }
    let c = Controller::start(dir.path(), &config);
    let health = vigil::Health::builder().start();
    // The kill switch out of the way: only the controller's comparison is shown.
    let mut gate = vigil_core::gate::GateConfig::default();
    gate.kill_switch.min_messages = u64::MAX;
    let mut workers = Vec::new();
    let mut beats = Vec::new();
    for i in 0..4 {
        let id = format!("w{i}");
        let w = Worker::start(id.clone(), &health, gate.clone());
        let mut hb = HeartbeatConfig::new(
            format!("http://{}", c.addr),
            id.clone(),
            heartbeat_key(HEARTBEAT_SECRET, &id),
        );
        hb.every = Duration::from_millis(200);
        beats.push(heartbeat::start(&health, Some(w.clone()), hb).expect("heartbeats start"));
        workers.push(w);
    }
    // Rounds of ten messages every 100 ms, all along (the window is 6 s: the page must
    // be read while the workers work).
    let feeding = tokio::spawn(async move {
        // Bounded: 3,000 rounds (5 minutes), far past the test's deadlines.
        for n in 0u64..3000 {
            for (i, w) in workers.iter().enumerate() {
                for m in 0..10 {
                    let t = w.begin();
                    if i == 3 || (n * 10 + m).is_multiple_of(50) {
                        let _ = w.failed(t, &[]);
                    } else {
                        w.succeeded(t);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    c.wait_for("an action on w3", || async {
        c.actions().await.into_iter().next()
    })
    .await;
    let url = c.url("/");
    let (dom, console) = tokio::task::spawn_blocking(move || load(&url))
        .await
        .unwrap();
    feeding.abort();
    check_console(&console);
    assert!(
        dom.contains("data-refreshed=\"") && !dom.contains("data-refreshed=\"0\""),
        "the page refreshed itself"
    );
    let section = element(&dom, "section", "workers");
    let w3 = section
        .find("data-worker=\"w3\"")
        .unwrap_or_else(|| panic!("w3 listed: {section}"));
    let w0 = section
        .find("data-worker=\"w0\"")
        .unwrap_or_else(|| panic!("w0 listed: {section}"));
    assert!(w3 < w0, "the outlier first: {section}");
    let row = &section[w3..w3 + section[w3..].find("</tr>").unwrap()];
    assert!(
        row.contains("data-outlier=\"true\"") && row.contains("100.0%") && row.contains("3 peers"),
        "its rate beside its peers': {row}"
    );
    assert!(row.contains("outlier: fails far more"), "{row}");
    drop(beats);
    assert!(c.sigterm().success());
}

/// A rollout driven by the policy to its end: 4 hosts in two zones; zone b's hosts
/// report back on `revision`, then turn unhealthy during the bake: rolled back.
fn rolled_back_rollout(revision: &str) -> vigil_core::rollout::Rollout {
    use vigil_core::rollout::{Command, Floor, HostSpec, HostStep, Phase, Rollout, RolloutConfig};
    let hosts = (0..4)
        .map(|i| HostSpec::new(format!("web-{i}"), if i < 2 { "a" } else { "b" }, "v1"))
        .collect();
    let config = RolloutConfig {
        bake: Duration::from_secs(5),
        min_samples: 0,
        min_healthy: Floor::Count(2),
        ..RolloutConfig::default()
    };
    let mut r = Rollout::start(config, hosts, revision, vigil_core::Time::ZERO).unwrap();
    for s in 1..60 {
        let now = vigil_core::Time::from_secs(s);
        for c in r.poll(now) {
            match c {
                Command::Drain { host } => r.drained(now, &host),
                Command::Install { host, revision, .. } => {
                    r.installed(now, &host, Ok(()));
                    r.report(now, &host, &revision, true);
                }
                _ => {}
            }
        }
        for h in ["web-2", "web-3"] {
            if matches!(r.phase(), Phase::Baking { .. })
                && matches!(r.host_step(h), Some(HostStep::Done { .. }))
            {
                r.report(now, h, revision, false);
            }
        }
    }
    assert!(
        matches!(r.phase(), Phase::RolledBack { .. }),
        "{:#?}",
        r.decisions()
    );
    r
}

/// Saves `r` in the store file at `path` as `vigil deploy` does (deployment `web`).
fn save_rollout(path: &std::path::Path, r: &vigil_core::rollout::Rollout, started_ms: i64) {
    let mut s = vigil_controller::store::SqliteStore::open(path).expect("open the store");
    s.save_rollout(&vigil_controller::store::RolloutSave {
        id: r.id().to_string(),
        name: "web".into(),
        revision: r.revision().to_string(),
        phase: r.phase().to_string(),
        finished: r.is_finished(),
        state: serde_json::to_string(r).unwrap(),
        clock_ms: 0,
        now_ms: started_ms,
        ..Default::default()
    })
    .expect("save the rollout");
}

/// Issue 18: the dashboard shows the `vigil deploy` rollouts in the controller's store
/// (a deployer sharing its SQLite file): revision and phase, each wave's hosts with
/// their step, the verdicts and why; a rollout saved after the page loaded appears on
/// its live refresh, newest first, with a hold's reason (here: the controller's own
/// view unreadable, fail closed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_rollouts_with_their_waves_hosts_and_verdicts() {
    let dir = tempfile::tempdir().unwrap();
    let bs = backends(2);
    let c = Controller::start(dir.path(), &(base_config("") + &targets_toml(&bs)));
    c.wait_all(2, "healthy").await;
    let store = dir.path().join("data").join("vigil.db");
    let calm = reqwest::get(c.url("/dashboard/live"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!calm.contains("id=\"rollouts\""), "no rollout, no section");
    save_rollout(&store, &rolled_back_rollout("v2"), 1_000);

    let url = c.url("/");
    let (dom, console) = tokio::task::spawn_blocking(move || load(&url))
        .await
        .unwrap();
    check_console(&console);
    let section = element(&dom, "section", "rollouts");
    assert!(
        section.contains("deployment web: revision v2") && section.contains("rolled back"),
        "revision and phase: {section}"
    );
    for (host, wave) in [("web-0", 1), ("web-1", 1), ("web-2", 2), ("web-3", 2)] {
        assert!(
            section.contains(&format!("data-host=\"{host}\" data-wave=\"{wave}\"")),
            "{host} under wave {wave}: {section}"
        );
    }
    assert!(
        section.contains("web-2 runs v2 and turned unhealthy") && section.contains("marked bad"),
        "why it rolled back: {section}"
    );
    assert!(
        section.contains("wave 1 passes"),
        "the passing verdict with its values: {section}"
    );

    // A newer rollout, held: shown first on the next refresh, saying why.
    let held = vigil_core::rollout::Rollout::start_seeing(
        vigil_core::rollout::RolloutConfig::default(),
        (0..4)
            .map(|i| vigil_core::rollout::HostSpec::new(format!("web-{i}"), "a", "v1"))
            .collect(),
        "v3",
        vigil_core::Time::ZERO,
        Default::default(),
        vigil_core::rollout::ControllerView::Unreadable("connection refused".into()),
    )
    .unwrap();
    save_rollout(&store, &held, 2_000);
    let live = reqwest::get(c.url("/dashboard/live"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let (v3, v2) = (
        live.find("revision v3").expect("the new rollout"),
        live.find("revision v2").expect("the old one"),
    );
    assert!(v3 < v2, "newest first");
    assert!(
        live.contains("the controller cannot be read (connection refused)")
            && live.contains("fail closed"),
        "a hold says why: {live}"
    );
    assert!(live.contains("(not yet)"), "hosts not reached yet: {live}");
}
