//! The hooks that touch hosts: install (exec or signed webhook, the controller's
//! actuator code), drain and undrain (exec or an HTTP call), alerts.
//!
//! # The install hook's contract
//!
//! The hook is given the host, the revision and an **idempotency key** (rollout id,
//! host and revision; a rollback's key says `rollback`). The same key may come more
//! than once: the driver records its intent before running the hook and the outcome
//! after, so a deployer killed in between runs the hook again with the same key after a
//! restart (`VIGIL_ATTEMPT` is then above 1). The hook must treat a key it has already
//! completed as done (exit 0 without installing again), e.g. by recording the keys it
//! completed beside what it installs:
//!
//! ```sh
//! grep -qxF "$VIGIL_IDEMPOTENCY_KEY" /var/lib/app/installed-keys && exit 0
//! install-release "$VIGIL_HOST_ID" "$VIGIL_REVISION"
//! echo "$VIGIL_IDEMPOTENCY_KEY" >> /var/lib/app/installed-keys
//! ```
//!
//! A webhook receiver deduplicates on the `Idempotency-Key` header the same way.

use super::config::{DeployConfig, DrainKind, HostConfig, InstallKind};
use crate::actuator::{post_signed, run_command};
use std::sync::Arc;

/// Environment of a hook: what it is about.
#[derive(Clone, Debug)]
pub struct HookContext<'a> {
    /// The rollout's id.
    pub rollout: &'a str,
    /// The host.
    pub host: &'a HostConfig,
    /// The revision to install (for a drain: the revision being rolled out).
    pub revision: &'a str,
    /// The run of this step (1 the first time; more after a crash or a retry).
    pub attempt: i64,
}

/// Runs hooks for one deploy config.
#[derive(Clone)]
pub struct Hooks {
    cfg: Arc<DeployConfig>,
    http: reqwest::Client,
}

impl Hooks {
    /// Hooks for `cfg`.
    pub fn new(cfg: Arc<DeployConfig>) -> Hooks {
        Hooks {
            cfg,
            http: reqwest::Client::builder()
                .build()
                .expect("a reqwest client without TLS builds"),
        }
    }

    /// Installs `ctx.revision` on `ctx.host` with idempotency key `key`. `Ok` with what
    /// the hook said, `Err` with why it failed.
    pub async fn install(
        &self,
        ctx: &HookContext<'_>,
        key: &str,
        rollback: bool,
    ) -> Result<String, String> {
        match self.cfg.install.kind {
            InstallKind::Exec => {
                let env = self.env(
                    ctx,
                    &[
                        ("VIGIL_IDEMPOTENCY_KEY", key.to_string()),
                        (
                            "VIGIL_ROLLBACK",
                            if rollback { "1" } else { "0" }.to_string(),
                        ),
                    ],
                );
                let command = substitute(&self.cfg.install.exec.command, ctx, key);
                run_command(&command, self.cfg.install.exec.timeout, &env).await
            }
            InstallKind::Webhook => {
                let body = serde_json::json!({
                    "kind": "install",
                    "deployment": self.cfg.name,
                    "rollout": ctx.rollout,
                    "host": ctx.host.id,
                    "url": ctx.host.url,
                    "zone": ctx.host.zone,
                    "revision": ctx.revision,
                    "rollback": rollback,
                    "attempt": ctx.attempt,
                    "idempotency_key": key,
                });
                let label = format!("install of {} on {}", ctx.revision, ctx.host.id);
                post_signed(
                    &self.cfg.install.webhook.as_webhook(),
                    &self.http,
                    key,
                    body.to_string(),
                    &label,
                )
                .await
            }
        }
    }

    /// Takes the host out of service (`drain = true`) or puts it back.
    pub async fn drain(&self, ctx: &HookContext<'_>, drain: bool) -> Result<String, String> {
        let verb = if drain { "drain" } else { "undrain" };
        let d = &self.cfg.drain;
        match d.kind {
            DrainKind::None => Ok(format!("no drain hook configured: nothing to {verb}")),
            DrainKind::Exec => {
                let env = self.env(ctx, &[("VIGIL_DRAIN", verb.to_string())]);
                let command = substitute(&d.command, ctx, "");
                run_command(&command, d.timeout, &env).await
            }
            DrainKind::Http => {
                let url = d.url.replace("{host}", &ctx.host.id);
                let req = if drain {
                    self.http.post(&url)
                } else {
                    self.http.delete(&url)
                };
                let token = std::env::var("VIGIL_DRAIN_TOKEN")
                    .ok()
                    .filter(|t| !t.is_empty())
                    .or_else(|| d.token.clone().filter(|t| !t.is_empty()));
                let req = match token {
                    Some(t) => req.bearer_auth(t),
                    None => req,
                };
                match req.timeout(d.timeout).send().await {
                    Ok(r) if r.status().is_success() => {
                        Ok(format!("{verb}: {url} answered {}", r.status()))
                    }
                    Ok(r) => Err(format!("{verb}: {url} answered {}", r.status())),
                    Err(e) => Err(format!("{verb}: {url}: {e}")),
                }
            }
        }
    }

    /// Raises an alert: always logged; also POSTed to the install webhook (event kind
    /// `alert`) when installs go through one. An exec install hook is not run for it: it
    /// is written to install, and an alert installs nothing.
    pub async fn alert(&self, rollout: &str, step: i64, reason: &str) -> Result<String, String> {
        tracing::error!(rollout = %rollout, reason = %reason, "ALERT: a human should decide");
        match self.cfg.install.kind {
            InstallKind::Webhook => {
                let key = format!("{rollout}:alert:{step}");
                let body = serde_json::json!({
                    "kind": "alert",
                    "deployment": self.cfg.name,
                    "rollout": rollout,
                    "summary": reason,
                    "idempotency_key": key,
                });
                post_signed(
                    &self.cfg.install.webhook.as_webhook(),
                    &self.http,
                    &key,
                    body.to_string(),
                    "alert",
                )
                .await
            }
            InstallKind::Exec => Ok("alert logged".into()),
        }
    }

    fn env(
        &self,
        ctx: &HookContext<'_>,
        extra: &[(&'static str, String)],
    ) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("VIGIL_DEPLOY_NAME", self.cfg.name.clone()),
            ("VIGIL_ROLLOUT_ID", ctx.rollout.to_string()),
            ("VIGIL_HOST_ID", ctx.host.id.clone()),
            ("VIGIL_HOST_URL", ctx.host.url.clone()),
            ("VIGIL_HOST_ZONE", ctx.host.zone.clone()),
            ("VIGIL_REVISION", ctx.revision.to_string()),
            ("VIGIL_ATTEMPT", ctx.attempt.to_string()),
        ];
        env.extend(extra.iter().cloned());
        env
    }
}

/// The command with `{host}`, `{url}`, `{zone}`, `{revision}` and `{key}` replaced in
/// each argument.
fn substitute(command: &[String], ctx: &HookContext<'_>, key: &str) -> Vec<String> {
    command
        .iter()
        .map(|a| {
            a.replace("{host}", &ctx.host.id)
                .replace("{url}", &ctx.host.url)
                .replace("{zone}", &ctx.host.zone)
                .replace("{revision}", ctx.revision)
                .replace("{key}", key)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_in_arguments_are_replaced() {
        let host = HostConfig {
            id: "web-1".into(),
            url: "http://10.0.0.1:8080".into(),
            zone: "a".into(),
        };
        let ctx = HookContext {
            rollout: "v2@1",
            host: &host,
            revision: "v2",
            attempt: 1,
        };
        let cmd = vec![
            "deploy.sh".to_string(),
            "{host}={revision}".into(),
            "--key={key}".into(),
        ];
        assert_eq!(
            substitute(&cmd, &ctx, "v2@1:web-1:v2"),
            ["deploy.sh", "web-1=v2", "--key=v2@1:web-1:v2"]
        );
    }
}
