//! What the engine records: the replica's decisions, alerts and guard events rendered
//! into the store's rows (a batch) and the recent-events list, with the metrics and
//! logs that say why.

use super::*;

impl Engine {
    /// Logs a guard event and keeps it for the dashboard (a freeze alert is recorded
    /// with the batch, as a decision: [`Engine::alert`]).
    pub(super) fn guard_event(&mut self, ev: GuardEvent) {
        let message = ev.to_string();
        match &ev {
            GuardEvent::FreezeAlert { .. } => tracing::error!(event = %message, "guard"),
            GuardEvent::Frozen { .. }
            | GuardEvent::Flapping { .. }
            | GuardEvent::ManualFreeze { .. } => {
                tracing::warn!(event = %message, "guard");
            }
            _ => tracing::info!(event = %message, "guard"),
        }
        if self.events.len() >= RECENT_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(EventInfo {
            at_ms: unix_ms(self.clock.now()),
            message,
        });
    }

    /// A decision's summary: a worker judged by its peers has the comparison with it.
    pub(super) fn summary(&self, d: &Decision) -> (String, Option<&MemberVerdict>) {
        let summary = d.to_string();
        let peers = self
            .verdicts
            .get(d.target.as_str())
            .filter(|v| v.is_outlier());
        match peers {
            Some(v) => (format!("{summary}; peers: {v}"), Some(v)),
            None => (summary, None),
        }
    }

    /// Logs a decision as it is made (it is written with the batch).
    pub(super) fn note_decision(&mut self, kind: DecisionKind, d: &Decision) {
        let (summary, _) = self.summary(d);
        match kind {
            DecisionKind::Act => {
                tracing::warn!(target_id = %d.target, decision = %summary, "guard acts")
            }
            DecisionKind::HoldBack | DecisionKind::Alert => {
                tracing::info!(target_id = %d.target, decision = %summary, "guard holds back")
            }
        }
        self.decided = true;
    }

    /// A decision as the store records it; an act's with its action.
    pub(super) fn decision(&self, kind: DecisionKind, d: Decision) -> NewDecision {
        let (summary, peers) = self.summary(&d);
        let at_ms = unix_ms(d.at);
        let reasons = serde_json::to_value(&d.reasons).expect("reasons serialise");
        let action = (kind == DecisionKind::Act).then(|| {
            let spec = self.runtime.get(d.target.as_str()).map(|r| &r.spec);
            serde_json::json!({
                "peers": peers,
                "kind": "replace",
                "target": d.target,
                "zone": d.zone,
                "group": spec.map(|s| s.group.as_str()).unwrap_or(""),
                "url": spec.map(|s| s.url.as_str()).unwrap_or(""),
                "decided_at": rfc3339_ms(at_ms),
                "summary": summary,
                "reasons": reasons,
            })
        });
        NewDecision {
            at_ms,
            target: d.target,
            zone: d.zone,
            outcome: kind,
            reasons,
            summary,
            action,
        }
    }

    /// A freeze alert as a decision with an action of kind `alert`: committed with
    /// the batch like an act, so it is delivered once, after a crash too (the guard
    /// raises it once per freeze, and that is in its persisted state). It has no
    /// target: its `target` is empty and its scope says what is frozen.
    pub(super) fn alert(
        &self,
        scope: &FreezeScope,
        frozen_for: Duration,
        reason: &Reason,
        doing: WhenFrozen,
        summary: String,
    ) -> NewDecision {
        let at_ms = unix_ms(self.clock.now());
        let zone = match scope {
            FreezeScope::Fleet => String::new(),
            FreezeScope::Zone(z) => z.clone(),
        };
        let reasons = serde_json::to_value([reason]).expect("reasons serialise");
        NewDecision {
            at_ms,
            target: String::new(),
            zone: zone.clone(),
            outcome: DecisionKind::Alert,
            reasons: reasons.clone(),
            summary: summary.clone(),
            action: Some(serde_json::json!({
                "kind": ALERT,
                "target": "",
                "scope": scope.to_string(),
                "zone": zone,
                "frozen_for": humantime::format_duration(frozen_for).to_string(),
                "when_frozen": doing,
                "decided_at": rfc3339_ms(at_ms),
                "summary": summary,
                "reasons": reasons,
            })),
        }
    }

    /// The replica's batch as the store writes it, fenced by its term.
    pub(super) fn batch(&self, u: Uncommitted) -> Batch {
        let mut decisions = Vec::new();
        for e in u.effects {
            match e {
                Effect::Decide(kind, d) => decisions.push(self.decision(kind, d)),
                Effect::Event(ev) => {
                    if let GuardEvent::FreezeAlert {
                        scope,
                        frozen_for,
                        reason,
                        action,
                    } = &ev
                    {
                        decisions.push(self.alert(
                            scope,
                            *frozen_for,
                            reason,
                            *action,
                            ev.to_string(),
                        ));
                    }
                }
                Effect::Log(_) | Effect::Refused(_) => {}
            }
        }
        Batch {
            ops: u
                .ops
                .iter()
                .map(|op| serde_json::to_string(op).expect("guard ops serialise"))
                .collect(),
            decisions,
            transitions: u
                .transitions
                .into_iter()
                .map(|t| NewTransition {
                    at_ms: unix_ms(t.at),
                    target: t.id,
                    from: t.from.name().to_string(),
                    to: t.to.name().to_string(),
                    detail: t.detail,
                })
                .collect(),
            snapshot: u.snapshot.map(|(text, at)| (text, unix_ms(at))),
            fence: self.fence(u.epoch),
        }
    }
}
