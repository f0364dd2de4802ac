//! What readers see: the [`FleetView`] published at most every [`PUBLISH_EVERY`]
//! while something changes, and one target's detail.

use super::*;
use crate::view::SharedOutage;

impl Engine {
    /// Publishes a new view when the last one is [`PUBLISH_EVERY`] old and something
    /// changed since ([`PUBLISH_SOON`] if that was a decision), or [`PUBLISH_QUIET`]
    /// old anyway. Called after each commit: a decision is in the store before a view
    /// shows it.
    pub(super) fn publish_if_due(&mut self) {
        let age = self.last_publish.elapsed();
        let due = if self.decided {
            PUBLISH_SOON
        } else {
            PUBLISH_EVERY
        };
        if (self.view_dirty && age >= due) || age >= PUBLISH_QUIET {
            self.publish();
        }
    }

    /// Builds the view of the fleet as it is now and publishes it.
    pub(super) fn publish(&mut self) {
        let view = Arc::new(self.build_view());
        self.views.store(view);
        self.last_publish = Instant::now();
        self.view_dirty = false;
        self.decided = false;
    }

    pub(super) fn build_view(&self) -> FleetView {
        let now = self.clock.now();
        let guard = self.replica.guard();
        let st = guard.status(now);
        let cfg = guard.config();
        let guard = GuardView {
            frozen: st.fleet_frozen,
            frozen_zones: st
                .freezes
                .iter()
                .filter_map(|f| match &f.scope {
                    vigil_core::guard::FreezeScope::Zone(z) => Some(z.clone()),
                    vigil_core::guard::FreezeScope::Fleet => None,
                })
                .collect(),
            reasons: st.reasons.iter().map(ToString::to_string).collect(),
            reasons_detail: st.reasons.clone(),
            manual_freeze: st.manual_freeze.as_ref().map(|m| m.reason.clone()),
            budget_left: st.budget_left,
            budget_actions: cfg.budget.actions,
            budget_per: cfg.budget.per,
            next_token_at_ms: st.next_token_at.map(unix_ms),
            unhealthy: st.unhealthy,
            total: st.total,
            shared_outages: self
                .shared_pauses
                .iter()
                .map(|s| SharedOutage::of(s, unix_ms))
                .collect(),
        };
        // Exactly sized: a view lives on while readers hold it.
        let mut targets = Vec::with_capacity(self.runtime.len());
        targets.extend(
            self.runtime
                .iter()
                .filter_map(|(id, rt)| self.target_info(now, id, rt)),
        );
        FleetView {
            now_ms: unix_ms(now),
            guard,
            counts: FleetView::count_states(&targets),
            targets,
            events: self.events.iter().cloned().collect(),
            store_error: self.replica.mode().halted(),
            workers: self.verdicts.values().cloned().collect(),
            answers: Default::default(),
        }
    }

    pub(super) fn target_info(
        &self,
        now: Time,
        id: &str,
        rt: &TargetRuntime,
    ) -> Option<TargetInfo> {
        let v = self.replica.guard().target(now, id)?;
        Some(TargetInfo {
            spec: rt.spec.clone(),
            state: Standing::of(&v),
            health: v.health,
            consecutive_failures: v.consecutive_failures,
            failing_since_ms: v.failing_since.map(unix_ms),
            failing_checks: v.failing_checks.to_vec(),
            endpoint_failed: v.endpoint_failed,
            penalty: v.penalty,
            flapping: v.flapping,
            hold: v.hold.map(|h| {
                Box::new(HoldInfo {
                    kind: h.kind,
                    reason: h.reason.clone(),
                    until_ms: h.until.map(unix_ms),
                })
            }),
            reported_at_ms: v.reported_at.map(unix_ms),
            in_doubt: v.in_doubt,
            last_probe: rt.history.last(),
        })
    }

    /// One target as it is now, with its probe history.
    pub(super) fn target_detail(&self, id: &str) -> Option<TargetDetail> {
        let rt = self.runtime.get(id)?;
        let info = self.target_info(self.clock.now(), id, rt)?;
        Some(TargetDetail {
            info,
            history: rt.history.records(),
        })
    }
}
