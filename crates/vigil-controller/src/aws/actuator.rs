//! The `aws-autoscaling` actuator: an act decision asks the instance's Auto Scaling
//! group to replace it.
//!
//! - `set-unhealthy` (default): `SetInstanceHealth` `Unhealthy`
//!   (`ShouldRespectGracePeriod` from `respect_grace_period`); the group terminates
//!   the instance and launches a replacement by its own rules.
//! - `terminate`: `TerminateInstanceInAutoScalingGroup` with
//!   `ShouldDecrementDesiredCapacity = false`; the group launches a replacement.
//!
//! The target's id is the instance id (`[discovery.aws]` names targets so).
//!
//! ## One call per action, across crashes
//!
//! Neither API takes an idempotency token, so the actuator looks before it acts: every
//! try starts with `DescribeAutoScalingInstances` for the instance, and does not call
//! when the call's effect is already there: the instance is `Unhealthy`
//! (`set-unhealthy`), `Terminating`/`Terminated`, or, on a run after a crash (the
//! action's `attempts` > 0), gone from every group (replaced since). So a controller
//! killed after AWS took the call but before the store recorded it finds the instance
//! Unhealthy when it runs the action again, and records that instead of calling twice.
//! The same look comes before a retry after a timeout or a 5xx (AWS may have done the
//! work and lost the answer). The window left: AWS's read-after-write lag between the
//! call and the describe (seconds at most; a repeated `SetInstanceHealth Unhealthy` or
//! terminate of the same instance does no harm).
//!
//! Retries: throttling, 5xx and connection errors, with backoff and jitter, until
//! `[aws] deadline`; any other 4xx fails the action at once with AWS's code, message
//! and request id in its record.

use crate::aws::client::{Client, Retry, Service, child_text, list};
use crate::aws::config::{AwsActMode, AwsActuatorConfig};
use crate::store::{ActionRecord, ActionState};

/// What the group says about an instance.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    group: String,
    lifecycle: String,
    health: String,
}

/// Runs one replacement. `(Done | Failed, what happened)` for the action's record.
pub async fn act(
    client: &Client,
    cfg: &AwsActuatorConfig,
    action: &ActionRecord,
) -> (ActionState, String) {
    let id = action.target.as_str();
    if !id.starts_with("i-") {
        return (
            ActionState::Failed,
            format!(
                "target {id:?} is not an EC2 instance id: the aws-autoscaling actuator acts on targets named by their instance id (as [discovery.aws] names them)"
            ),
        );
    }
    let (op, params) = match cfg.mode {
        AwsActMode::SetUnhealthy => (
            "SetInstanceHealth",
            vec![
                ("InstanceId".to_string(), id.to_string()),
                ("HealthStatus".to_string(), "Unhealthy".to_string()),
                (
                    "ShouldRespectGracePeriod".to_string(),
                    cfg.respect_grace_period.to_string(),
                ),
            ],
        ),
        AwsActMode::Terminate => (
            "TerminateInstanceInAutoScalingGroup",
            vec![
                ("InstanceId".to_string(), id.to_string()),
                (
                    "ShouldDecrementDesiredCapacity".to_string(),
                    "false".to_string(),
                ),
            ],
        ),
    };
    let mut retry = client.retry();
    // Tries of the call itself (the describes have their own count in `retry`).
    let mut calls: i64 = 0;
    loop {
        let seen = match describe(client, id, &mut retry).await {
            Ok(s) => s,
            Err(e) => {
                return (
                    ActionState::Failed,
                    format!("DescribeAutoScalingInstances {id} failed: {e}"),
                );
            }
        };
        // A call of this run that may have gone through counts like an earlier run.
        if let Some(done) = already(cfg.mode, seen.as_ref(), action.attempts + calls) {
            return (ActionState::Done, format!("{id}: {done}; {op} not called"));
        }
        calls += 1;
        match client
            .once(Service::AutoScaling, op, &params, retry.left())
            .await
        {
            Ok(a) => {
                let group = seen.map(|s| s.group).unwrap_or_default();
                let what = match cfg.mode {
                    AwsActMode::SetUnhealthy => format!(
                        "{op} Unhealthy (ShouldRespectGracePeriod={})",
                        cfg.respect_grace_period
                    ),
                    AwsActMode::Terminate => {
                        format!("{op} (ShouldDecrementDesiredCapacity=false)")
                    }
                };
                return (
                    ActionState::Done,
                    format!(
                        "{what} on {id} in group {group:?}: AWS request id {} (call {calls})",
                        a.request_id
                    ),
                );
            }
            Err(e) if e.retryable() => {
                tracing::warn!(action = action.id, target_id = %id, call = calls, error = %e, "AWS call failed; looking at the instance again before retrying");
                if !retry.wait().await {
                    return (
                        ActionState::Failed,
                        format!("{op} on {id} failed: {e}; gave up after {calls} calls (deadline)"),
                    );
                }
            }
            Err(e) => {
                return (
                    ActionState::Failed,
                    format!("{op} on {id} failed: {e}; not retried"),
                );
            }
        }
    }
}

/// Why the call is not needed, if it is not.
fn already(mode: AwsActMode, seen: Option<&Seen>, attempts: i64) -> Option<String> {
    match seen {
        Some(s) if s.lifecycle.starts_with("Terminat") => {
            Some(format!("already {} in group {:?}", s.lifecycle, s.group))
        }
        Some(s)
            if mode == AwsActMode::SetUnhealthy && s.health.eq_ignore_ascii_case("unhealthy") =>
        {
            Some(format!(
                "already Unhealthy in group {:?} (lifecycle {})",
                s.group, s.lifecycle
            ))
        }
        Some(_) => None,
        // On a first run, an unknown instance is AWS's to refuse (the record then
        // says why); on a later run, it left its group since: replaced.
        None if attempts > 0 => Some(
            "no longer in any Auto Scaling group (replaced since an earlier run of this action)"
                .to_string(),
        ),
        None => None,
    }
}

/// `DescribeAutoScalingInstances` for one instance: None when no group has it.
async fn describe(
    client: &Client,
    id: &str,
    retry: &mut Retry,
) -> Result<Option<Seen>, crate::aws::client::AwsFailure> {
    let a = client
        .call(
            Service::AutoScaling,
            "DescribeAutoScalingInstances",
            &[("InstanceIds.member.1".to_string(), id.to_string())],
            retry,
        )
        .await?;
    let doc = a.doc().map_err(|error| crate::aws::client::AwsFailure {
        error,
        attempts: a.attempts,
    })?;
    let Some(result) = doc
        .descendants()
        .find(|n| n.has_tag_name("DescribeAutoScalingInstancesResult"))
    else {
        return Ok(None);
    };
    Ok(list(result, "AutoScalingInstances")
        .find(|m| child_text(*m, "InstanceId") == Some(id))
        .map(|m| Seen {
            group: child_text(m, "AutoScalingGroupName")
                .unwrap_or("")
                .to_string(),
            lifecycle: child_text(m, "LifecycleState").unwrap_or("").to_string(),
            health: child_text(m, "HealthStatus").unwrap_or("").to_string(),
        }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(lifecycle: &str, health: &str) -> Seen {
        Seen {
            group: "web".into(),
            lifecycle: lifecycle.into(),
            health: health.into(),
        }
    }

    #[test]
    fn the_call_is_skipped_only_when_its_effect_is_there() {
        use AwsActMode::*;
        assert!(already(SetUnhealthy, Some(&seen("InService", "HEALTHY")), 0).is_none());
        assert!(already(SetUnhealthy, Some(&seen("InService", "HEALTHY")), 3).is_none());
        assert!(already(SetUnhealthy, Some(&seen("InService", "UNHEALTHY")), 0).is_some());
        assert!(already(SetUnhealthy, Some(&seen("InService", "Unhealthy")), 1).is_some());
        assert!(
            already(Terminate, Some(&seen("InService", "Unhealthy")), 0).is_none(),
            "an unhealthy instance is still terminated when asked"
        );
        assert!(already(Terminate, Some(&seen("Terminating:Wait", "Healthy")), 0).is_some());
        assert!(already(SetUnhealthy, Some(&seen("Terminated", "Healthy")), 0).is_some());
        assert!(
            already(SetUnhealthy, None, 0).is_none(),
            "a first run lets AWS refuse an unknown instance"
        );
        assert!(
            already(Terminate, None, 1).is_some(),
            "a replay finds it replaced"
        );
    }
}
