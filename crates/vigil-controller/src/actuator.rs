//! Actuators: what happens when the guard acts. `log` (a dry run, the default),
//! `webhook` (a signed JSON POST, retried with backoff, with an idempotency key) and
//! `exec` (a command with the target in its environment, under a timeout).
//!
//! Every action reaching here was committed to the store as `intended` first; the
//! runner counts the attempt in the store before running and marks the outcome after.

use crate::clock::wall_ms;
use crate::config::{ActuatorConfig, ActuatorKind, ExecConfig, WebhookConfig};
use crate::metrics::Metrics;
use crate::store::{ActionRecord, ActionState, StoreHandle};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// Header carrying the body's HMAC-SHA256, as `sha256=<hex>`.
pub const SIGNATURE_HEADER: &str = "X-Vigil-Signature";
/// Header carrying the action's idempotency key.
pub const IDEMPOTENCY_HEADER: &str = "Idempotency-Key";
/// Longest backoff between webhook retries, however many: 30 s keeps a long outage of
/// the receiver from stretching one action over hours.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Bytes of an exec command's output kept in the action's result.
const EXEC_OUTPUT_KEEP: usize = 1024;

/// `sha256=<hex>` of the body under `secret`: what [`SIGNATURE_HEADER`] carries.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any size");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Runs actions as they come, each on its own task (they are rare: the budget says so).
pub async fn run(
    mut rx: mpsc::UnboundedReceiver<ActionRecord>,
    config: watch::Receiver<Arc<ActuatorConfig>>,
    store: StoreHandle,
    metrics: Arc<Metrics>,
    tasks: tokio_util::task::TaskTracker,
) {
    let http = reqwest::Client::builder()
        .build()
        .expect("a reqwest client without TLS builds");
    while let Some(action) = rx.recv().await {
        let cfg = config.borrow().clone();
        let (store, http, metrics) = (store.clone(), http.clone(), metrics.clone());
        tasks.spawn(async move {
            let id = action.id;
            if let Err(e) = store.call(move |s| s.start_attempt(id)).await {
                // Not running an action whose attempt could not be counted: the intent
                // stays and the next start runs it.
                tracing::error!(action = id, error = %e, "cannot record the attempt; action not run");
                return;
            }
            let (state, result) = execute(&cfg, &http, &action).await;
            metrics.action(state);
            let r = result.clone();
            match store
                .call(move |s| s.finish_action(id, state, wall_ms(), &r))
                .await
            {
                Ok(()) => tracing::info!(action = id, target_id = %action.target, state = ?state, result = %result, "action finished"),
                Err(e) => tracing::error!(action = id, error = %e, "action ran but its outcome was not recorded; it will run again after a restart (same idempotency key)"),
            }
        });
    }
}

async fn execute(
    cfg: &ActuatorConfig,
    http: &reqwest::Client,
    action: &ActionRecord,
) -> (ActionState, String) {
    match cfg.kind {
        ActuatorKind::Log => {
            tracing::warn!(
                action = action.id,
                target_id = %action.target,
                key = %action.idempotency_key,
                summary = %action.event["summary"].as_str().unwrap_or(""),
                "REPLACE target (dry run: the log actuator only logs)"
            );
            (ActionState::Done, "logged (dry run)".into())
        }
        ActuatorKind::Webhook => webhook(&cfg.webhook, http, action).await,
        ActuatorKind::Exec => exec(&cfg.exec, action).await,
    }
}

async fn webhook(
    cfg: &WebhookConfig,
    http: &reqwest::Client,
    action: &ActionRecord,
) -> (ActionState, String) {
    let body = action.event.to_string();
    let secret = std::env::var("VIGIL_WEBHOOK_SECRET")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| cfg.secret.clone());
    let mut backoff = cfg.backoff;
    let mut last = String::new();
    for attempt in 0..=cfg.retries {
        if attempt > 0 {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
        let mut req = http
            .post(&cfg.url)
            .timeout(cfg.timeout)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(IDEMPOTENCY_HEADER, &action.idempotency_key)
            .body(body.clone());
        if let Some(secret) = &secret {
            req = req.header(SIGNATURE_HEADER, sign(secret.as_bytes(), body.as_bytes()));
        }
        match req.send().await {
            Ok(resp) if resp.status().is_success() => {
                return (
                    ActionState::Done,
                    format!(
                        "webhook answered {} (attempt {})",
                        resp.status(),
                        attempt + 1
                    ),
                );
            }
            Ok(resp) => {
                let code = resp.status().as_u16();
                last = format!("webhook answered {code}");
                // A client error other than timeout/throttling will not get better.
                if (400..500).contains(&code) && code != 408 && code != 429 {
                    return (ActionState::Failed, format!("{last}; not retried"));
                }
            }
            Err(e) => last = format!("webhook request failed: {e}"),
        }
        tracing::warn!(action = action.id, attempt = attempt + 1, error = %last, "webhook attempt failed");
    }
    (
        ActionState::Failed,
        format!("{last}; gave up after {} attempts", cfg.retries + 1),
    )
}

async fn exec(cfg: &ExecConfig, action: &ActionRecord) -> (ActionState, String) {
    let Some((program, args)) = cfg.command.split_first() else {
        return (ActionState::Failed, "no command configured".into());
    };
    let ev = &action.event;
    let field = |k: &str| ev[k].as_str().unwrap_or("").to_string();
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .env("VIGIL_TARGET_ID", &action.target)
        .env("VIGIL_TARGET_URL", field("url"))
        .env("VIGIL_TARGET_ZONE", field("zone"))
        .env("VIGIL_TARGET_GROUP", field("group"))
        .env("VIGIL_ACTION_ID", action.id.to_string())
        .env("VIGIL_IDEMPOTENCY_KEY", &action.idempotency_key)
        .env("VIGIL_REASON", field("summary"))
        .env("VIGIL_EVENT", ev.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return (ActionState::Failed, format!("cannot run {program:?}: {e}")),
    };
    match tokio::time::timeout(cfg.timeout, child.wait_with_output()).await {
        Err(_) => (
            ActionState::Failed,
            format!(
                "{program:?} killed after {}",
                humantime::format_duration(cfg.timeout)
            ),
        ),
        Ok(Err(e)) => (ActionState::Failed, format!("{program:?}: {e}")),
        Ok(Ok(out)) => {
            let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&out.stderr));
            let tail: String = text
                .chars()
                .rev()
                .take(EXEC_OUTPUT_KEEP)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            let state = if out.status.success() {
                ActionState::Done
            } else {
                ActionState::Failed
            };
            (
                state,
                format!("{program:?} exited {}: {}", out.status, tail.trim()),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_is_rfc4231_hmac_sha256() {
        // RFC 4231 test case 2.
        assert_eq!(
            sign(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
