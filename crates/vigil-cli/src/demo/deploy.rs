//! The demo's rollouts: `u` rolls a good revision out to the services with
//! `vigil deploy run`, `e` a bad one (its disk check fails, so its hosts report back
//! failing). The deployer drains each host through the demo balancer's admin API and
//! installs through an exec hook that asks the demo to restart the service on the
//! revision (a want-file per host, as a package manager's post-install would restart
//! it); the demo relays the deployer's waves, verdicts and rollback as narration.
//!
//! The deployer keeps its state in the controller's SQLite store (a fresh one per
//! reset), so the controller's dashboard shows the rollout; with `--replicas` it uses a
//! file of its own (rollouts are in SQLite only).

use super::{Fleet, Launcher, Ports, child_command};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use tokio::io::AsyncBufReadExt;
use tokio::process::Child;

/// Waves, bake and deadline short enough to watch: 6 services in 3 zones make 3 waves
/// of 2 (the floor keeps 4 in service), a 3 s bake each; a host that has not reported
/// back passing 8 s after its drain fails its wave (production: minutes).
const ROLLOUT: &str = r#"[rollout]
min_healthy = "66%"
progress_deadline = "8s"
bake = "3s"
min_samples = 3

[probe]
interval = "500ms"
timeout = "1s"
"#;

/// Whether `revision` is one the demo builds broken: its disk check cannot pass.
pub(super) fn is_bad(revision: &str) -> bool {
    revision.contains("bad")
}

/// A host's want-file: the revision the install hook asked for.
fn want_file(dir: &Path, app_port: u16) -> PathBuf {
    dir.join(format!("want-127.0.0.1:{app_port}"))
}

/// The revisions the demo rolls out, one after another: v2, v3, ... (`bad`: v3-bad).
#[derive(Default)]
pub(super) struct Deploys {
    next: u32,
    running: Option<Child>,
    relay: Option<tokio::task::JoinHandle<()>>,
}

impl Deploys {
    /// Starts `vigil deploy run` of the next revision (good or bad), unless one runs.
    pub(super) async fn start(
        &mut self,
        launcher: &Launcher<'_>,
        run: u64,
        bad: bool,
    ) -> Result<()> {
        if let Some(c) = self.running.as_mut()
            && matches!(c.try_wait(), Ok(None))
        {
            say!(
                "demo: a rollout is still running (its narration is the deploy: lines); wait for its end"
            );
            return Ok(());
        }
        self.next = self.next.max(1) + 1;
        let revision = if bad {
            format!("v{}-bad", self.next)
        } else {
            format!("v{}", self.next)
        };
        let config = write_config(launcher, run)?;
        say!(
            "demo: DEPLOY {revision}{}: vigil deploy run, waves of 2 (one zone at a time, 4 of 6 always in service), drained at the balancer, 3 s bake each",
            if bad {
                " (broken: its disk check cannot pass, so its hosts report back failing)"
            } else {
                ""
            }
        );
        let mut cmd = child_command(launcher.exe, launcher.dir, "deploy", true)?;
        cmd.args(["deploy", "run", "-c"])
            .arg(&config)
            .args(["--revision", &revision])
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().context("starting vigil deploy")?;
        let stderr = child.stderr.take().expect("piped");
        let names = host_names(launcher.ports, launcher.names);
        let log = launcher.dir.join("deploy.log");
        self.relay = Some(tokio::spawn(relay(stderr, names, log)));
        self.running = Some(child);
        Ok(())
    }

    /// Stops a running rollout (a reset): SIGTERM saves its state.
    pub(super) async fn stop(&mut self) {
        if let Some(mut c) = self.running.take() {
            super::stop_child("deploy", &mut c).await;
        }
        if let Some(r) = self.relay.take() {
            let _ = r.await;
        }
    }
}

/// `127.0.0.1:<app port>` -> service name, for the narration.
fn host_names(ports: &Ports, names: &[String]) -> Vec<(String, String)> {
    ports
        .services
        .iter()
        .zip(names)
        .map(|((app, _), n)| (format!("127.0.0.1:{app}"), n.clone()))
        .collect()
}

/// Relays the deployer's log: every line to deploy.log, and its decisions (waves,
/// report-back, verdicts, rollback, the outcome) as `deploy: ...` lines, hosts named.
async fn relay(stderr: tokio::process::ChildStderr, names: Vec<(String, String)>, log: PathBuf) {
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .ok();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(f) = file.as_mut() {
            use std::io::Write as _;
            let _ = writeln!(f, "{line}");
        }
        if let Some(said) = narrated(&line, &names) {
            say!("deploy: {said}");
        }
    }
}

/// What the narration says of one line of the deployer's log, if anything: the
/// driver's decisions and the outcome, without their fields, hosts by name.
fn narrated(line: &str, names: &[(String, String)]) -> Option<String> {
    let (_, msg) = line
        .split_once("vigil_controller::deploy::driver: ")
        .or_else(|| line.split_once("vigil_controller::deploy::cli: "))
        .or_else(|| line.split_once("vigil deploy: "))?;
    // Installs are the waves' detail; the outcome comes once (the log's line, not the
    // summary `run` prints after it).
    const DETAIL: [&str; 8] = [
        "installing ",
        "install finished",
        "drained",
        "undrained",
        "host before the rollout",
        "driving",
        "rollout ",
        "completed rollout",
    ];
    if DETAIL.iter().any(|d| msg.starts_with(d)) || msg.trim() == "completed" {
        return None;
    }
    let msg = msg.split(" rollout=").next().unwrap_or(msg);
    let mut msg = msg.to_string();
    for (addr, name) in names {
        msg = msg.replace(addr, name);
    }
    Some(msg)
}

/// deploy.toml for the controller's `run`th store: the hosts are the services (id: the
/// balancer's address of each, so the drain URL names the balancer's target).
fn write_config(launcher: &Launcher<'_>, run: u64) -> Result<PathBuf> {
    let (dir, ports) = (launcher.dir, launcher.ports);
    let store = match launcher.store {
        None => super::controller_dir(dir, run).join("vigil.db"),
        Some(_) => dir.join(format!("deploy-{run}.db")),
    };
    let hook = dir.join("install.sh");
    let d = dir.display();
    std::fs::write(
        &hook,
        format!(
            r#"# Written by `vigil demo`: "installs" a revision by asking the demo to restart the
# service on it. A key already completed is done (the idempotency contract).
set -e
if grep -qxF "$VIGIL_IDEMPOTENCY_KEY" "{d}/installed-keys" 2>/dev/null; then exit 0; fi
echo "$VIGIL_REVISION" > "{d}/want-$VIGIL_HOST_ID.tmp"
mv "{d}/want-$VIGIL_HOST_ID.tmp" "{d}/want-$VIGIL_HOST_ID"
echo "$VIGIL_IDEMPOTENCY_KEY" >> "{d}/installed-keys"
"#
        ),
    )
    .context("writing install.sh")?;
    let mut cfg = format!(
        r#"# Written by `vigil demo`.
name = "demo"
store = "{store}"

{ROLLOUT}
[install.exec]
command = ["sh", "{hook}"]
timeout = "20s"

[drain]
kind = "http"
url = "http://127.0.0.1:{admin}/admin/targets/{{host}}/drain?wait=5s"
"#,
        store = store.display(),
        hook = hook.display(),
        admin = ports.lb_admin,
    );
    for (i, (app, health)) in ports.services.iter().enumerate() {
        cfg.push_str(&format!(
            "\n[[hosts]]\nid = \"127.0.0.1:{app}\"\nurl = \"http://127.0.0.1:{health}\"\nzone = \"{}\"\n",
            super::zone(i)
        ));
    }
    let path = dir.join("deploy.toml");
    std::fs::write(&path, cfg).context("writing deploy.toml")?;
    Ok(path)
}

/// Restarts every service whose want-file asks for another revision than it runs
/// (SIGTERM: it drains; then it starts again on the same ports).
pub(super) async fn install_wanted(launcher: &Launcher<'_>, fleet: &mut Fleet) -> Result<()> {
    for (i, (app, _)) in launcher.ports.services.iter().enumerate() {
        let Ok(want) = std::fs::read_to_string(want_file(launcher.dir, *app)) else {
            continue;
        };
        let want = want.trim();
        if want.is_empty() || launcher.revision(i) == want {
            continue;
        }
        let name = &launcher.names[i];
        if let Some(mut c) = fleet.children.remove(name) {
            super::stop_child(name, &mut c).await;
        }
        launcher.set_revision(i, want);
        fleet
            .children
            .insert(name.clone(), launcher.service(i, true)?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_narration_names_hosts_and_drops_fields_and_installs() {
        let names = vec![("127.0.0.1:7703".to_string(), "svc-1".to_string())];
        assert_eq!(
            narrated(
                "2026-12-04T18:55:51.005455Z  INFO vigil_controller::deploy::driver: wave 1 of v2: 127.0.0.1:7703 (2 hosts) rollout=v2@1",
                &names
            )
            .as_deref(),
            Some("wave 1 of v2: svc-1 (2 hosts)")
        );
        assert_eq!(
            narrated(
                "x INFO vigil_controller::deploy::driver: installing host=127.0.0.1:7703 revision=v2",
                &names
            ),
            None
        );
        assert_eq!(
            narrated(
                "x INFO vigil_controller::deploy::cli: rolled back: 127.0.0.1:7703 did not report back rollout=v3-bad@1 outcome=\"rolled back\"",
                &names
            )
            .as_deref(),
            Some("rolled back: svc-1 did not report back")
        );
        assert_eq!(
            narrated("vigil deploy: rollout v3-bad@1: rolled back: x", &names),
            None,
            "said once"
        );
        assert_eq!(
            narrated("vigil deploy: refused: v3-bad is marked bad", &names).as_deref(),
            Some("refused: v3-bad is marked bad")
        );
        assert_eq!(narrated("unrelated", &names), None);
        for detail in [
            "x INFO vigil_controller::deploy::driver: drained: drain: http://a answered 200 OK host=127.0.0.1:7703",
            "x INFO vigil_controller::deploy::driver: host before the rollout host=127.0.0.1:7703",
            "x INFO vigil_controller::deploy::cli: completed rollout=v2@1 outcome=\"completed\"",
        ] {
            assert_eq!(narrated(detail, &names), None, "{detail}");
        }
    }
}
