//! Actuators: what happens when the guard acts. `log` (a dry run, the default),
//! `webhook` (a signed JSON POST, retried with backoff, with an idempotency key),
//! `exec` (a command with the target in its environment, under a timeout),
//! `aws-autoscaling` (the instance's Auto Scaling group replaces it:
//! [`crate::aws::actuator`]) and `liveness` (a restart permit that the instance's own
//! liveness probe collects: [`Permits`]).
//!
//! Besides replacements (event kind `replace`), the guard raises freeze alerts (kind
//! `alert`, see [`crate::engine::ALERT`]): the webhook delivers them, `log` logs them,
//! `exec`, `aws-autoscaling` and `liveness` never run for one.
//!
//! Every action reaching here was committed to the store as `intended` first; the
//! runner counts the attempt in the store before running and marks the outcome after.

use crate::aws::client::Client as AwsClient;
use crate::clock::wall_ms;
use crate::config::{
    ActuatorConfig, ActuatorKind, AwsConfig, ControllerConfig, ExecConfig, LivenessConfig,
    WebhookConfig,
};
use crate::metrics::{ActionKind, Metrics};
use crate::store::{ActionRecord, ActionState, StoreHandle};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use vigil_core::backoff::Backoff;

/// Header carrying the body's HMAC-SHA256, as `sha256=<hex>`.
pub use vigil_core::signature::SIGNATURE_HEADER;
/// Header carrying the action's idempotency key.
pub const IDEMPOTENCY_HEADER: &str = "Idempotency-Key";
/// Longest backoff between webhook retries, however many: 30 s keeps a long outage of
/// the receiver from stretching one action over hours.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Share of each webhook backoff that is random: equal jitter (each wait between half
/// and all of its doubling), so that actions and replicas whose webhooks failed on one
/// receiver outage do not all knock again at the same instant, while a retry still
/// waits at least half as long as before jitter.
const WEBHOOK_JITTER: f64 = vigil_core::backoff::EQUAL_JITTER;
/// While the store cannot count an action's attempt, how often it is tried again: as
/// often as the engine retries a failing store.
const ATTEMPT_RETRY_EVERY: Duration = Duration::from_secs(1);
/// Bytes of an exec command's output kept in the action's result.
const EXEC_OUTPUT_KEEP: usize = 1024;

/// `sha256=<hex>` of the body under `secret`: what [`SIGNATURE_HEADER`] carries.
/// ([`vigil_core::signature::sign_body`]).
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    vigil_core::signature::sign_body(secret, body)
}

/// What an action runs with: the actuator's settings, and an AWS client for
/// `aws-autoscaling` (or why there is none).
struct Tools {
    http: reqwest::Client,
    aws: Option<Result<AwsClient, String>>,
    permits: Permits,
}

/// Runs actions as they come, each on its own task (they are rare: the budget says so).
/// `config`: the controller's config in force (its `[actuator]` and `[aws]`);
/// `permits`: where the `liveness` actuator leaves its restart permits (the API hands
/// them out).
pub async fn run(
    mut rx: mpsc::UnboundedReceiver<ActionRecord>,
    config: watch::Receiver<Arc<ControllerConfig>>,
    store: StoreHandle,
    metrics: Arc<Metrics>,
    tasks: tokio_util::task::TaskTracker,
    permits: Permits,
) {
    let http = reqwest::Client::builder()
        .build()
        .expect("a reqwest client with the default settings builds");
    // The AWS client of the `[aws]` it was built from, rebuilt when that changes.
    let mut aws: Option<(AwsConfig, Result<AwsClient, String>)> = None;
    while let Some(action) = rx.recv().await {
        let full = config.borrow().clone();
        let cfg = Arc::new(full.actuator.clone());
        if full.actuator.kind == ActuatorKind::AwsAutoscaling
            && aws.as_ref().is_none_or(|(c, _)| *c != full.aws)
        {
            aws = Some((full.aws.clone(), AwsClient::new(&full.aws)));
        }
        let tools = Tools {
            http: http.clone(),
            aws: aws.as_ref().map(|(_, c)| c.clone()),
            permits: permits.clone(),
        };
        let (store, metrics) = (store.clone(), metrics.clone());
        tasks.spawn(async move {
            let id = action.id;
            // Not running an action whose attempt could not be counted: the intent
            // stays, and the attempt is tried again until the store takes it (a store
            // that failed just after the intent was committed must not leave the action
            // waiting for a restart). A shutdown meanwhile leaves it intended: the next
            // start runs it.
            let mut logged = false;
            while let Err(e) = store.call(move |s| s.start_attempt(id)).await {
                metrics.store_error();
                if matches!(e, crate::store::StoreError::Gone) {
                    tracing::error!(action = id, error = %e, "cannot record the attempt; action not run (it runs after a restart)");
                    return;
                }
                if matches!(e, crate::store::StoreError::Fenced { .. }) {
                    // Another replica leads: it resumes the action (same idempotency key).
                    tracing::warn!(action = id, error = %e, "not the leader: action not run here; the leader resumes it");
                    return;
                }
                if !logged {
                    tracing::error!(action = id, error = %e, "cannot record the attempt; action not run yet, retrying until the store works");
                    logged = true;
                }
                tokio::time::sleep(ATTEMPT_RETRY_EVERY).await;
            }
            let (state, result) = execute(&cfg, &tools, &action).await;
            metrics.action(kind(&action), state);
            let r = result.clone();
            match store
                .call(move |s| s.finish_action(id, state, wall_ms(), &r))
                .await
            {
                Ok(()) => tracing::info!(action = id, target_id = %action.target, state = ?state, result = %result, "action finished"),
                Err(e) => {
                    metrics.store_error();
                    tracing::error!(action = id, error = %e, "action ran but its outcome was not recorded; it will run again after a restart (same idempotency key)");
                }
            }
        });
    }
}

/// What `action` does, as `execute` tells: an alert by its event's kind, anything else
/// a replacement.
fn kind(action: &ActionRecord) -> ActionKind {
    if action.event["kind"] == crate::engine::ALERT {
        ActionKind::Alert
    } else {
        ActionKind::Replace
    }
}

async fn execute(
    cfg: &ActuatorConfig,
    tools: &Tools,
    action: &ActionRecord,
) -> (ActionState, String) {
    let http = &tools.http;
    if kind(action) == ActionKind::Alert {
        return alert(cfg, http, action).await;
    }
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
        ActuatorKind::AwsAutoscaling => match &tools.aws {
            Some(Ok(client)) => crate::aws::actuator::act(client, &cfg.aws, action).await,
            Some(Err(e)) => (ActionState::Failed, format!("no AWS client: {e}")),
            None => (
                ActionState::Failed,
                "no AWS client: the actuator changed while the action was queued".into(),
            ),
        },
        ActuatorKind::Liveness => liveness(&cfg.liveness, &tools.permits, action).await,
    }
}

/// A freeze alert (event kind `alert`): a human should decide. The webhook delivers it
/// like a replacement (signed, retried, same idempotency rule: receivers tell the two
/// apart by `kind`); `log` logs it; `exec`, `aws-autoscaling` and `liveness` do not run for it,
/// because they replace the target they are given and an alert has none.
async fn alert(
    cfg: &ActuatorConfig,
    http: &reqwest::Client,
    action: &ActionRecord,
) -> (ActionState, String) {
    let summary = action.event["summary"].as_str().unwrap_or("");
    match cfg.kind {
        ActuatorKind::Webhook => webhook(&cfg.webhook, http, action).await,
        ActuatorKind::Log => {
            tracing::error!(action = action.id, key = %action.idempotency_key, summary = %summary, "ALERT: a human should decide (the log actuator only logs)");
            (ActionState::Done, "alert logged".into())
        }
        ActuatorKind::Exec | ActuatorKind::AwsAutoscaling | ActuatorKind::Liveness => {
            let name = match cfg.kind {
                ActuatorKind::Exec => "exec",
                ActuatorKind::Liveness => "liveness",
                _ => "aws-autoscaling",
            };
            tracing::error!(action = action.id, summary = %summary, "ALERT: a human should decide (not sent: the {name} actuator runs only for replacements)");
            (
                ActionState::Done,
                format!("alert not sent: the {name} actuator runs only for replacements"),
            )
        }
    }
}

async fn webhook(
    cfg: &WebhookConfig,
    http: &reqwest::Client,
    action: &ActionRecord,
) -> (ActionState, String) {
    let label = format!("action {}", action.id);
    match post_signed(
        cfg,
        http,
        &action.idempotency_key,
        action.event.to_string(),
        &label,
    )
    .await
    {
        Ok(r) => (ActionState::Done, r),
        Err(r) => (ActionState::Failed, r),
    }
}

/// POSTs `body` (JSON) to the webhook: signed with the secret (`VIGIL_WEBHOOK_SECRET`
/// wins over the config's) in [`SIGNATURE_HEADER`], `key` in [`IDEMPOTENCY_HEADER`],
/// retried with doubling, jittered backoff ([`webhook_backoff`]) on errors, timeouts,
/// 408, 429 and 5xx. `Ok` with what the receiver answered, `Err` with why it gave up.
/// `label` names the caller's work in the retry logs. Shared by the controller's
/// actuator and `vigil deploy`'s install hook.
pub async fn post_signed(
    cfg: &WebhookConfig,
    http: &reqwest::Client,
    key: &str,
    body: String,
    label: &str,
) -> Result<String, String> {
    let secret = std::env::var("VIGIL_WEBHOOK_SECRET")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| cfg.secret.clone());
    let backoff = webhook_backoff(cfg);
    let mut last = String::new();
    for attempt in 0..=cfg.retries {
        if attempt > 0 {
            tokio::time::sleep(backoff.next(attempt - 1, rand::random())).await;
        }
        let mut req = http
            .post(&cfg.url)
            .timeout(cfg.timeout)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(IDEMPOTENCY_HEADER, key)
            .body(body.clone());
        if let Some(secret) = &secret {
            req = req.header(SIGNATURE_HEADER, sign(secret.as_bytes(), body.as_bytes()));
        }
        match req.send().await {
            Ok(resp) if resp.status().is_success() => {
                return Ok(format!(
                    "webhook answered {} (attempt {})",
                    resp.status(),
                    attempt + 1
                ));
            }
            Ok(resp) => {
                let code = resp.status().as_u16();
                last = format!("webhook answered {code}");
                // A client error other than timeout/throttling will not get better.
                if (400..500).contains(&code) && code != 408 && code != 429 {
                    return Err(format!("{last}; not retried"));
                }
            }
            Err(e) => last = format!("webhook request failed: {e}"),
        }
        tracing::warn!(work = %label, attempt = attempt + 1, error = %last, "webhook attempt failed");
    }
    Err(format!(
        "{last}; gave up after {} attempts",
        cfg.retries + 1
    ))
}

/// The webhook's waits between attempts: `backoff` doubling up to 30 s, equal jitter.
pub fn webhook_backoff(cfg: &WebhookConfig) -> Backoff {
    Backoff::new(cfg.backoff, MAX_BACKOFF).with_jitter(WEBHOOK_JITTER)
}

async fn exec(cfg: &ExecConfig, action: &ActionRecord) -> (ActionState, String) {
    let ev = &action.event;
    let field = |k: &str| ev[k].as_str().unwrap_or("").to_string();
    let env = [
        ("VIGIL_TARGET_ID", action.target.clone()),
        ("VIGIL_TARGET_URL", field("url")),
        ("VIGIL_TARGET_ZONE", field("zone")),
        ("VIGIL_TARGET_GROUP", field("group")),
        ("VIGIL_ACTION_ID", action.id.to_string()),
        ("VIGIL_IDEMPOTENCY_KEY", action.idempotency_key.clone()),
        // The lease epoch the action was decided under: a receiver that remembers the
        // highest it saw can refuse a deposed leader's late action. Empty without a
        // lease (SQLite, one controller).
        (
            "VIGIL_EPOCH",
            action.epoch.map(|e| e.to_string()).unwrap_or_default(),
        ),
        ("VIGIL_REASON", field("summary")),
        ("VIGIL_EVENT", ev.to_string()),
    ];
    match run_command(&cfg.command, cfg.timeout, &env).await {
        Ok(r) => (ActionState::Done, r),
        Err(r) => (ActionState::Failed, r),
    }
}

/// Runs `command` (program and arguments) with `env` added to its environment, stdin
/// closed, killed after `timeout`. `Ok` when it exits 0, `Err` otherwise; both carry
/// its exit status and the last 1 KiB of its output. Shared by the
/// controller's exec actuator and `vigil deploy`'s hooks.
pub async fn run_command(
    command: &[String],
    timeout: Duration,
    env: &[(&str, String)],
) -> Result<String, String> {
    let Some((program, args)) = command.split_first() else {
        return Err("no command configured".into());
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Err(format!("cannot run {program:?}: {e}")),
    };
    match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Err(_) => Err(format!(
            "{program:?} killed after {}",
            humantime::format_duration(timeout)
        )),
        Ok(Err(e)) => Err(format!("{program:?}: {e}")),
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
            let said = format!("{program:?} exited {}: {}", out.status, tail.trim());
            if out.status.success() {
                Ok(said)
            } else {
                Err(said)
            }
        }
    }
}

// === impl Permits ===

/// The `liveness` actuator's restart permits, by target id, shared by the actuator
/// (which grants them) and the API (whose `GET /api/targets/{id}/liveness` hands them
/// to the instance's liveness probe, `vigil check --fleet`).
///
/// The guard decided the action as for any actuator (own failure, budget, cap, no
/// shared cause), so a permit is the guard's decision, not a second budget: the
/// controller cannot restart a container, only the kubelet can, and it does so when the
/// container's liveness probe fails. A permit is valid for `ttl` from its grant; every
/// ask within it answers "restart" (the kubelet needs `failureThreshold` failed probes
/// in a row), and the first ask finishes its action as done. A permit nobody asked for
/// within `ttl` fails its action (the instance is not probing through `--fleet`, or
/// cannot reach the controller and restarts on its local verdict anyway): the guard's
/// ordinary rules apply, the token is spent and the target is not acted on again until
/// it has recovered.
///
/// Kept in memory only: a restart while a permit waits leaves its action started in
/// the store, and the next start runs it again, granting a fresh permit. With several
/// replicas only the leader runs actions, so only the leader holds permits.
#[derive(Clone, Default)]
pub struct Permits(Arc<Mutex<HashMap<String, Permit>>>);

/// One restart permit.
struct Permit {
    action: i64,
    granted: Instant,
    expires: Instant,
    /// Told at the first collection (then taken): the action finishes done.
    waiting: Option<oneshot::Sender<Instant>>,
}

/// A permit as its collector sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Collected {
    /// The action it belongs to.
    pub action: i64,
    /// How long ago it was granted.
    pub age: Duration,
    /// How long it still answers "restart".
    pub left: Duration,
}

impl Permits {
    /// Grants `target` a permit for `action`, valid until `now + ttl` (replacing an
    /// older one, whose action then fails); the receiver is told when it is first
    /// collected.
    pub fn grant(
        &self,
        target: &str,
        action: i64,
        ttl: Duration,
        now: Instant,
    ) -> oneshot::Receiver<Instant> {
        let (tx, rx) = oneshot::channel();
        self.0.lock().expect("permits lock").insert(
            target.to_string(),
            Permit {
                action,
                granted: now,
                expires: now + ttl,
                waiting: Some(tx),
            },
        );
        rx
    }

    /// The permit `target` holds at `now`, if any, marking it collected. An expired
    /// permit is dropped, and answers nothing.
    pub fn collect(&self, target: &str, now: Instant) -> Option<Collected> {
        let mut all = self.0.lock().expect("permits lock");
        let p = all.get_mut(target)?;
        if now >= p.expires {
            all.remove(target);
            return None;
        }
        if let Some(tx) = p.waiting.take() {
            // The action may have given up at this very instant (its timeout and this
            // ask raced): then it fails, and this answer still says restart, which
            // the guard already allowed.
            let _ = tx.send(now);
        }
        Some(Collected {
            action: p.action,
            age: now - p.granted,
            left: p.expires - now,
        })
    }

    /// Withdraws `action`'s permit for `target` (not a newer one's).
    fn withdraw(&self, target: &str, action: i64) {
        let mut all = self.0.lock().expect("permits lock");
        if all.get(target).is_some_and(|p| p.action == action) {
            all.remove(target);
        }
    }
}

/// The `liveness` actuator: grants the target a restart permit and waits for its
/// liveness probe to collect it (done) or for `ttl` to pass (failed).
async fn liveness(
    cfg: &LivenessConfig,
    permits: &Permits,
    action: &ActionRecord,
) -> (ActionState, String) {
    let granted = Instant::now();
    let collected = permits.grant(&action.target, action.id, cfg.ttl, granted);
    let ttl = humantime::format_duration(cfg.ttl);
    tracing::warn!(action = action.id, target_id = %action.target, ttl = %ttl, summary = %action.event["summary"].as_str().unwrap_or(""), "RESTART permit granted: the instance's liveness probe (vigil check --fleet) collects it");
    match tokio::time::timeout(cfg.ttl, collected).await {
        Ok(Ok(at)) => (
            ActionState::Done,
            format!(
                "restart permit collected by the instance's liveness probe {} ms after its grant",
                (at - granted).as_millis()
            ),
        ),
        _ => {
            permits.withdraw(&action.target, action.id);
            (
                ActionState::Failed,
                format!(
                    "restart permit not collected within {ttl}: the instance did not ask (is its liveness probe `vigil check --fleet`?)"
                ),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_exec_actuator_passes_the_epoch_the_action_was_decided_under() {
        let cfg = ExecConfig {
            command: vec![
                "sh".into(),
                "-c".into(),
                "echo \"epoch=[$VIGIL_EPOCH]\"".into(),
            ],
            timeout: Duration::from_secs(10),
        };
        let mut action = ActionRecord {
            id: 1,
            decision_id: 1,
            target: "web-1".into(),
            idempotency_key: "vigil-1-1".into(),
            state: ActionState::Intended,
            attempts: 0,
            created_ms: 0,
            finished_ms: None,
            result: None,
            event: serde_json::json!({"kind": "replace"}),
            epoch: Some(7),
        };
        let (state, said) = exec(&cfg, &action).await;
        assert_eq!(state, ActionState::Done, "{said}");
        assert!(
            said.contains("epoch=[7]"),
            "VIGIL_EPOCH carries the epoch: {said}"
        );
        action.epoch = None;
        let (_, said) = exec(&cfg, &action).await;
        assert!(said.contains("epoch=[]"), "empty without a lease: {said}");
    }

    #[tokio::test]
    async fn a_permit_is_collected_until_it_expires_and_an_uncollected_one_fails() {
        let permits = Permits::default();
        let t0 = Instant::now();
        let ttl = Duration::from_secs(10);
        let mut told = permits.grant("web-1", 1, ttl, t0);
        assert_eq!(
            permits.collect("web-2", t0),
            None,
            "another target holds none"
        );
        let c = permits
            .collect("web-1", t0 + Duration::from_secs(3))
            .unwrap();
        assert_eq!(c.action, 1);
        assert_eq!(c.left, Duration::from_secs(7));
        assert!(told.try_recv().is_ok(), "the first ask finishes the action");
        assert!(
            permits
                .collect("web-1", t0 + Duration::from_secs(9))
                .is_some(),
            "asked again within its ttl (the kubelet's failureThreshold): still restart"
        );
        assert_eq!(permits.collect("web-1", t0 + ttl), None, "expired");

        // Nobody asks: the action fails once its ttl has passed, and the permit is gone.
        let cfg = LivenessConfig {
            ttl: Duration::from_millis(50),
        };
        let mut action = ActionRecord {
            id: 2,
            decision_id: 2,
            target: "web-3".into(),
            idempotency_key: "vigil-2-2".into(),
            state: ActionState::Intended,
            attempts: 0,
            created_ms: 0,
            finished_ms: None,
            result: None,
            event: serde_json::json!({"kind": "replace"}),
            epoch: None,
        };
        let (state, said) = liveness(&cfg, &permits, &action).await;
        assert_eq!(state, ActionState::Failed, "{said}");
        assert_eq!(permits.collect("web-3", Instant::now()), None);

        // Collected while it waits: done.
        action.id = 3;
        let cfg = LivenessConfig {
            ttl: Duration::from_secs(30),
        };
        let asker = permits.clone();
        let ask = tokio::spawn(async move {
            loop {
                if let Some(c) = asker.collect("web-3", Instant::now()) {
                    return c.action;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        let (state, said) = liveness(&cfg, &permits, &action).await;
        assert_eq!(state, ActionState::Done, "{said}");
        assert_eq!(ask.await.unwrap(), 3);
    }

    #[test]
    fn signature_is_rfc4231_hmac_sha256() {
        // RFC 4231 test case 2.
        assert_eq!(
            sign(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    /// A webhook receiver on loopback answering each request (one per connection) with
    /// the next status of `statuses` (the last one for ever after); returns its URL and
    /// when each request arrived.
    async fn receiver(
        statuses: &[u16],
    ) -> (String, Arc<std::sync::Mutex<Vec<tokio::time::Instant>>>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let arrivals = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (seen, statuses) = (arrivals.clone(), statuses.to_vec());
        tokio::spawn(async move {
            let mut n = 0;
            while let Ok((mut tcp, _)) = listener.accept().await {
                let mut buf = Vec::new();
                // The head, then as much body as it announces.
                let end = loop {
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                    if tcp.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                        break 0;
                    }
                };
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap());
                while buf.len() < end + length {
                    if tcp.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                        break;
                    }
                }
                seen.lock().unwrap().push(tokio::time::Instant::now());
                let code = statuses[n.min(statuses.len() - 1)];
                n += 1;
                let answer =
                    format!("HTTP/1.1 {code} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                let _ = tcp.write_all(answer.as_bytes()).await;
            }
        });
        (url, arrivals)
    }

    #[test]
    fn webhook_waits_double_from_the_configured_backoff_with_equal_jitter() {
        let cfg = WebhookConfig::default();
        let b = webhook_backoff(&cfg);
        assert_eq!(b.next(0, 0.0), Duration::from_millis(500), "the first wait");
        assert_eq!(b.next(1, 0.0), Duration::from_secs(1), "doubled");
        assert_eq!(b.next(10, 0.0), MAX_BACKOFF, "capped");
        assert_eq!(
            b.next(1, 1.0),
            Duration::from_millis(500),
            "jitter takes at most half"
        );
    }

    #[tokio::test]
    async fn a_webhook_answering_5xx_is_retried_after_jittered_doubling_waits() {
        let (url, arrivals) = receiver(&[503, 500, 200]).await;
        let cfg = WebhookConfig {
            url,
            retries: 5,
            backoff: Duration::from_millis(40),
            ..WebhookConfig::default()
        };
        let http = reqwest::Client::new();
        let said = post_signed(&cfg, &http, "k1", "{}".into(), "test")
            .await
            .expect("the third attempt is answered 200");
        assert!(said.contains("attempt 3"), "{said}");
        let at = arrivals.lock().unwrap().clone();
        assert_eq!(at.len(), 3, "no attempt after the 200");
        // Equal jitter: each wait is at least half its doubling (20 ms, then 40 ms).
        assert!(at[1] - at[0] >= Duration::from_millis(20), "{at:?}");
        assert!(at[2] - at[1] >= Duration::from_millis(40), "{at:?}");

        let (url, arrivals) = receiver(&[500]).await;
        let cfg = WebhookConfig {
            url,
            retries: 2,
            backoff: Duration::from_millis(1),
            ..WebhookConfig::default()
        };
        let why = post_signed(&cfg, &http, "k2", "{}".into(), "test")
            .await
            .unwrap_err();
        assert_eq!(why, "webhook answered 500; gave up after 3 attempts");
        assert_eq!(
            arrivals.lock().unwrap().len(),
            3,
            "the first try and 2 retries"
        );
    }

    /// The SQLite store whose `start_attempt` fails while `fail` is set.
    struct FailingAttempts {
        inner: crate::store::SqliteStore,
        fail: Arc<std::sync::atomic::AtomicBool>,
    }

    impl crate::store::Store for FailingAttempts {
        fn recover(&mut self) -> Result<crate::store::Recovered, crate::store::StoreError> {
            self.inner.recover()
        }
        fn commit(
            &mut self,
            batch: &crate::store::Batch,
        ) -> Result<Vec<ActionRecord>, crate::store::StoreError> {
            self.inner.commit(batch)
        }
        fn start_attempt(&mut self, id: i64) -> Result<(), crate::store::StoreError> {
            if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(crate::store::StoreError::Unusable {
                    path: "test".into(),
                    why: "database or disk is full (injected)".into(),
                });
            }
            self.inner.start_attempt(id)
        }
        fn finish_action(
            &mut self,
            id: i64,
            state: ActionState,
            at_ms: i64,
            result: &str,
        ) -> Result<(), crate::store::StoreError> {
            self.inner.finish_action(id, state, at_ms, result)
        }
        fn decisions(
            &mut self,
            target: Option<&str>,
            limit: usize,
        ) -> Result<Vec<crate::store::DecisionRecord>, crate::store::StoreError> {
            self.inner.decisions(target, limit)
        }
        fn actions(&mut self, limit: usize) -> Result<Vec<ActionRecord>, crate::store::StoreError> {
            self.inner.actions(limit)
        }
        fn transitions(
            &mut self,
            target: &str,
            limit: usize,
        ) -> Result<Vec<crate::store::TransitionRecord>, crate::store::StoreError> {
            self.inner.transitions(target, limit)
        }
    }

    #[tokio::test]
    async fn an_action_whose_attempt_could_not_be_counted_runs_once_the_store_works() {
        use crate::store::{Batch, NewDecision, Store};
        let dir = tempfile::tempdir().unwrap();
        let mut inner = crate::store::SqliteStore::open(&dir.path().join("vigil.db")).unwrap();
        let created = inner
            .commit(&Batch {
                decisions: vec![NewDecision {
                    at_ms: 1,
                    target: "t1".into(),
                    zone: "z".into(),
                    outcome: vigil_core::fleet::DecisionKind::Act,
                    reasons: serde_json::json!([]),
                    summary: "act on t1".into(),
                    action: Some(serde_json::json!({"target": "t1"})),
                }],
                ..Batch::default()
            })
            .unwrap();
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (store, _thread) = StoreHandle::spawn(Box::new(FailingAttempts {
            inner,
            fail: fail.clone(),
        }));
        let (tx, rx) = mpsc::unbounded_channel();
        let (_config_tx, config) = watch::channel(Arc::new(ControllerConfig::default()));
        let tasks = tokio_util::task::TaskTracker::new();
        tokio::spawn(run(
            rx,
            config,
            store.clone(),
            Arc::new(Metrics::new()),
            tasks.clone(),
            Permits::default(),
        ));
        tx.send(created[0].clone()).unwrap();
        let state = |store: StoreHandle| async move {
            store.call(|s| s.actions(1)).await.unwrap()[0].state
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(state(store.clone()).await, ActionState::Intended);
        fail.store(false, std::sync::atomic::Ordering::SeqCst);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while state(store.clone()).await != ActionState::Done {
            assert!(
                std::time::Instant::now() < deadline,
                "the action never ran once the store worked"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let a = store.call(|s| s.actions(1)).await.unwrap().remove(0);
        assert_eq!(a.attempts, 1, "counted once, run once");
    }
}
