//! Every `/metrics` endpoint (the library's, served by the example service; `vigil lb`'s
//! admin; `vigil controller`'s) as Prometheus' own tools read it: without an OpenMetrics
//! `Accept` it is the 0.0.4 text format and `promtool check metrics` finds nothing to
//! say; with Prometheus' `Accept` it is OpenMetrics; both carry
//! `vigil_build_info{version,commit} 1`. Skipped, saying so, without promtool (Debian
//! package `prometheus`, installed by scripts/install-test-deps.sh).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What Prometheus 2.x sends.
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn vigil(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vigil"));
    cmd.args(args).stdout(Stdio::null()).stderr(Stdio::null());
    cmd
}

/// The commit `vigil --version` names.
fn commit() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .arg("--version")
        .output()
        .unwrap();
    let v = String::from_utf8_lossy(&out.stdout);
    v.split("(commit ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .unwrap()
        .to_string()
}

async fn scrape(url: &str, accept: Option<&str>) -> Option<(String, String)> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut req = client.get(url);
    if let Some(a) = accept {
        req = req.header("accept", a);
    }
    let r = req.send().await.ok()?;
    if !r.status().is_success() {
        return None;
    }
    let ctype = r.headers().get("content-type")?.to_str().ok()?.to_string();
    Some((ctype, r.text().await.ok()?))
}

async fn wait_scrape(url: &str) -> (String, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(s) = scrape(url, None).await {
            return s;
        }
        assert!(Instant::now() < deadline, "{url} never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn promtool(body: &str) -> (bool, String) {
    let p = vigil_testkit::promtool_check_metrics(body).expect("promtool is installed");
    (p.clean(), p.said)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metrics_endpoint_passes_promtool_and_honours_accept() {
    if Command::new("promtool").arg("--version").output().is_err() {
        eprintln!(
            "SKIPPED: promtool is not installed (Debian package `prometheus`; scripts/install-test-deps.sh installs it)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut daemons = Vec::new();

    // The library, in the example service.
    let mut svc = vigil(&["example-service", "--listen", "127.0.0.1:0"])
        .args(["--health-listen", "127.0.0.1:0"])
        // About the protocol, not this machine's disk (which may be nearly full).
        .args(["--disk-fail-below", "0%", "--disk-warn-below", "off"])
        .args(["--db", "postgres://nobody@127.0.0.1:1/none"])
        .arg("--data-dir")
        .arg(dir.path().join("svc"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let app = vigil_testkit::Listening::read(&mut svc).get("app");
    daemons.push(Daemon(svc));

    // The balancer's admin port.
    let (listen, admin) = (free_port(), free_port());
    let lb_toml = dir.path().join("lb.toml");
    std::fs::write(
        &lb_toml,
        format!(
            "listen = \"127.0.0.1:{listen}\"\nadmin_listen = \"127.0.0.1:{admin}\"\n\n\
             [pools.api]\ntargets = [{{ addr = \"127.0.0.1:1\" }}]\n"
        ),
    )
    .unwrap();
    daemons.push(Daemon(vigil(&["lb", "-c"]).arg(&lb_toml).spawn().unwrap()));

    // The controller.
    let ctl = free_port();
    let fleet = dir.path().join("fleet.toml");
    std::fs::write(
        &fleet,
        format!(
            "listen = \"127.0.0.1:{ctl}\"\ndata_dir = \"{}\"\n\n[[targets]]\nid = \"a\"\nurl = \"http://127.0.0.1:1\"\nzone = \"z\"\n",
            dir.path().join("ctl").display()
        ),
    )
    .unwrap();
    daemons.push(Daemon(
        vigil(&["controller", "-c"]).arg(&fleet).spawn().unwrap(),
    ));

    let build = format!(
        "vigil_build_info{{version=\"{}\",commit=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION"),
        commit()
    );
    for url in [
        format!("{app}/metrics"),
        format!("http://127.0.0.1:{admin}/metrics"),
        format!("http://127.0.0.1:{ctl}/metrics"),
    ] {
        let (ctype, text) = wait_scrape(&url).await;
        assert_eq!(
            ctype, "text/plain; version=0.0.4; charset=utf-8",
            "{url}: the text format for a scraper that does not ask for OpenMetrics"
        );
        let (clean, said) = promtool(&text);
        assert!(clean, "{url}: promtool check metrics says:\n{said}\n{text}");
        assert!(text.contains(&build), "{url}: {build} in\n{text}");

        let (ctype, om) = scrape(&url, Some(PROMETHEUS_ACCEPT)).await.unwrap();
        assert_eq!(
            ctype, "application/openmetrics-text; version=1.0.0; charset=utf-8",
            "{url}: OpenMetrics for Prometheus"
        );
        assert!(
            om.ends_with("# EOF\n"),
            "{url}: OpenMetrics ends with # EOF"
        );
        assert!(om.contains(&build), "{url}: {build} in\n{om}");
    }
}
