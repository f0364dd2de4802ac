//! The dashboard's rollouts: the `vigil deploy` rollouts in the store (a deployer and
//! the controller share the SQLite file), newest first. Each says its revision and
//! phase in words (why it holds, why it rolled back), then its waves in order with each
//! host's step, revision and health, the hosts not reached yet, and the policy's
//! verdicts with their values (sample counts, medians, U, p): the decisions that
//! passed, failed or held a wave, or marked the revision bad. The whole decision log
//! of the newest rollout is one click away (`details`), the others' in
//! `vigil deploy explain`.

use crate::clock::rfc3339_ms;
use crate::store::StoredRollout;
use maud::{Markup, html};
use vigil_core::rollout::{HostStep, Phase, Rollout, RolloutHost};

/// Rollouts shown (the newest first; `vigil deploy status` has them all).
pub const RECENT_ROLLOUTS: usize = 3;

/// The rollouts section (nothing when the store holds none).
pub fn rollouts(stored: &[StoredRollout]) -> Markup {
    html! {
        @if !stored.is_empty() {
            section #rollouts {
                h2 { "Rollouts " small { "(newest first; " code { "vigil deploy explain" } " has every decision)" } }
                @for (i, r) in stored.iter().enumerate() {
                    (rollout(r, i == 0))
                }
            }
        }
    }
}

/// The CSS class of a phase: calm, moving, or needing a human.
fn phase_class(p: &Phase) -> &'static str {
    match p {
        Phase::Completed => "ok",
        Phase::Deploying { .. } | Phase::Baking { .. } => "moving",
        Phase::Held { .. } | Phase::RollingBack { .. } | Phase::RolledBack { .. } => "warn",
        Phase::RollbackFailed { .. } | Phase::Aborted { .. } => "bad",
    }
}

fn rollout(stored: &StoredRollout, newest: bool) -> Markup {
    let policy: Result<Rollout, String> =
        serde_json::from_str(&stored.state).map_err(|e| e.to_string());
    html! {
        div .rollout id={ "rollout-" (stored.id) } data-phase=(stored.phase) {
            @match &policy {
                Err(e) => {
                    div .rollout-head {
                        strong { (stored.name) ": " (stored.revision) } " " (stored.phase)
                    }
                    p .failed { "its stored state cannot be read (" (e) "): written by another vigil version?" }
                }
                Ok(r) => {
                    div .rollout-head .(phase_class(r.phase())) {
                        strong { "deployment " (stored.name) ": revision " (r.revision()) }
                        " " span .phase { (r.phase()) }
                        span .calm { " rollout " (stored.id) ", started " (rfc3339_ms(stored.started_ms))
                            ", saved " (rfc3339_ms(stored.updated_ms)) }
                    }
                    @if let Some(why) = r.controller_unreadable() {
                        p .failed { "the controller cannot be read (" (why) "): no new wave (fail closed)" }
                    }
                    @if !r.bad_revisions().is_empty() {
                        p { "marked bad (not deployed again until a human clears it): "
                            @for (i, b) in r.bad_revisions().iter().enumerate() {
                                @if i > 0 { ", " } code { (b) }
                            }
                        }
                    }
                    (waves(r))
                    (verdicts(r))
                    @if newest {
                        details {
                            summary { "every decision (" (r.decisions().len()) ")" }
                            ol .decisions {
                                @for d in r.decisions() {
                                    li { span .calm { (d.at) " " } (d.what) }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Each wave's hosts with their step, then the hosts not in a wave yet.
fn waves(r: &Rollout) -> Markup {
    let hosts: Vec<RolloutHost<'_>> = r.hosts().collect();
    let find = |id: &str| hosts.iter().find(|h| h.id == id);
    let in_wave: std::collections::BTreeSet<&str> =
        r.waves().iter().flatten().map(String::as_str).collect();
    let rest: Vec<&RolloutHost<'_>> = hosts.iter().filter(|h| !in_wave.contains(h.id)).collect();
    html! {
        table .waves {
            tr { th { "wave" } th { "host" } th { "zone" } th { "step" } th { "runs" } th { "was" } th { "health" } }
            @for (i, wave) in r.waves().iter().enumerate() {
                @for (j, id) in wave.iter().enumerate() {
                    @if let Some(h) = find(id) {
                        tr data-host=(h.id) data-wave=(i + 1) {
                            td { @if j == 0 { (i + 1) } }
                            (host_cells(h))
                        }
                    }
                }
            }
            @for h in &rest {
                tr data-host=(h.id) data-wave="" {
                    td .calm { @if matches!(h.step, HostStep::Done { .. }) { "(already on it)" } @else { "(not yet)" } }
                    (host_cells(h))
                }
            }
        }
    }
}

fn host_cells(h: &RolloutHost<'_>) -> Markup {
    html! {
        td { (h.id) }
        td { (h.zone) }
        td .(step_class(h.step)) { (step_words(h.step)) @if h.held { " (held by the controller)" } }
        td { code { (h.revision) } }
        td { code { (h.previous) } }
        td { @if h.healthy { "passing" } @else { span .failed { "failing" } } }
    }
}

fn step_class(s: &HostStep) -> &'static str {
    match s {
        HostStep::Done { .. } => "done",
        HostStep::Pending => "calm",
        _ => "intended",
    }
}

/// A host's step in words.
pub fn step_words(s: &HostStep) -> &'static str {
    match s {
        HostStep::Pending => "pending",
        HostStep::Draining { .. } => "draining",
        HostStep::Installing { .. } => "installing",
        HostStep::AwaitingReport { .. } => "awaiting report-back",
        HostStep::Done { .. } => "reported back",
    }
}

/// The decisions that judged a wave or the rollout: passes, fails, holds, bad marks,
/// rollbacks and the end, with their values.
fn verdicts(r: &Rollout) -> Markup {
    let judged: Vec<_> = r
        .decisions()
        .iter()
        .filter(|d| {
            let w = &d.what;
            w.contains(" passes: ")
                || w.contains(" fails: ")
                || w.contains(" held: ")
                || w.contains("marked bad")
                || w.starts_with("rolled back")
                || w.starts_with("rollback failed")
                || w.starts_with("completed")
                || w.starts_with("aborted")
                || w.contains("approved by a human")
        })
        .collect();
    html! {
        @if !judged.is_empty() {
            ul .verdicts {
                @for d in judged {
                    li .(verdict_class(&d.what)) { (d.what) }
                }
            }
        }
    }
}

fn verdict_class(what: &str) -> &'static str {
    if what.contains(" fails: ")
        || what.contains("marked bad")
        || what.starts_with("rollback failed")
    {
        "failed"
    } else if what.contains(" held: ")
        || what.starts_with("rolled back")
        || what.starts_with("aborted")
    {
        "intended"
    } else {
        "done"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use vigil_core::Time;
    use vigil_core::rollout::{Command, HostSpec, RolloutConfig};

    /// A rollout of `revision` over 4 hosts in two zones whose first wave passes and
    /// whose second reports back failing: rolled back.
    pub(crate) fn rolled_back() -> Rollout {
        let hosts = (0..4)
            .map(|i| HostSpec::new(format!("h{i}"), if i < 2 { "a" } else { "b" }, "v1"))
            .collect();
        let config = RolloutConfig {
            bake: Duration::from_secs(5),
            min_samples: 0,
            min_healthy: vigil_core::rollout::Floor::Count(2),
            ..RolloutConfig::default()
        };
        let mut r = Rollout::start(config, hosts, "v2", Time::ZERO).unwrap();
        for s in 1..40 {
            let now = Time::from_secs(s);
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
            // Zone b's hosts report back, then turn unhealthy on v2.
            for h in ["h2", "h3"] {
                if matches!(r.phase(), Phase::Baking { .. } | Phase::Deploying { .. })
                    && matches!(r.host_step(h), Some(HostStep::Done { .. }))
                {
                    r.report(now, h, "v2", false);
                }
            }
        }
        r
    }

    fn stored(r: &Rollout) -> StoredRollout {
        StoredRollout {
            id: r.id().to_string(),
            name: "web".into(),
            revision: r.revision().to_string(),
            phase: r.phase().to_string(),
            finished: r.is_finished(),
            state: serde_json::to_string(r).unwrap(),
            clock_ms: 0,
            started_ms: 0,
            updated_ms: 0,
        }
    }

    #[test]
    fn a_rolled_back_rollout_shows_its_waves_hosts_steps_and_why() {
        let r = rolled_back();
        assert!(
            matches!(r.phase(), Phase::RolledBack { .. }),
            "{:#?}",
            r.decisions()
        );
        let html = rollouts(&[stored(&r)]).into_string();
        assert!(html.contains("id=\"rollouts\""), "{html}");
        assert!(html.contains("revision v2"), "{html}");
        assert!(html.contains("rolled back"), "the phase in words: {html}");
        assert!(
            html.contains("data-host=\"h0\" data-wave=\"1\"")
                && html.contains("data-host=\"h2\" data-wave=\"2\""),
            "each host under its wave: {html}"
        );
        assert!(
            html.contains("turned unhealthy") || html.contains("fails"),
            "why it failed: {html}"
        );
        assert!(html.contains("marked bad"), "{html}");
        assert!(
            html.contains("class=\"failed\""),
            "the failure stands out: {html}"
        );
        assert!(html.contains("every decision ("), "the log one click away");
    }

    #[test]
    fn no_rollout_no_section_and_an_unreadable_state_says_so() {
        assert_eq!(rollouts(&[]).into_string(), "");
        let mut s = stored(&rolled_back());
        s.state = "{".into();
        let html = rollouts(&[s]).into_string();
        assert!(html.contains("cannot be read"), "{html}");
    }
}
