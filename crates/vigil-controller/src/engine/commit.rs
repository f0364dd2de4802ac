//! Committing: each turn's batch written in one transaction, then its actions handed
//! to the actuator and its commands answered; a failed commit undone by reading the
//! store back, and the store retried once a second while it fails.

use super::*;

impl Engine {
    /// Commits the batch; then runs its actions and answers its commands.
    pub(super) async fn flush(&mut self) {
        // Nothing logged since the last snapshot (a healthy fleet passing its probes):
        // the stored state is current; rewriting it would only churn memory and disk.
        // Now and then all the same, so the stored guard time keeps up.
        let since = self.last_snapshot.elapsed();
        if self.replica.mode().judges()
            && since >= self.config.store.snapshot_every
            && (self.replica.ops_since_snapshot() > 0
                || since >= QUIET_SNAPSHOT_EVERY
                || (self.anomaly_changed && since >= ANOMALY_SNAPSHOT_EVERY))
        {
            self.snapshot();
        }
        let now = self.clock.now();
        let st = self.replica.guard().status(now);
        self.metrics.guard(
            st.fleet_frozen,
            st.budget_left,
            st.unhealthy,
            self.runtime.len(),
        );
        self.metrics.frozen_for(
            st.freezes
                .iter()
                .map(|f| now.since(f.since).as_secs_f64())
                .fold(0.0, f64::max),
        );
        let replies = std::mem::take(&mut self.replies);
        // A follower's changes are dropped: nothing is its to commit.
        let Some(uncommitted) = self.replica.take() else {
            self.answer(replies);
            return;
        };
        let n_events = uncommitted.events().count();
        let batch = self.batch(uncommitted);
        let n_actions = batch
            .decisions
            .iter()
            .filter(|d| d.action.is_some())
            .count();
        let counts = DecisionKind::ALL.map(|k| {
            let n = batch.decisions.iter().filter(|d| d.outcome == k).count();
            (k, n as u64)
        });
        match self.store.call(move |s| s.commit(&batch)).await {
            Ok(created) => {
                for (kind, n) in counts {
                    self.metrics.decision(kind.as_str(), n);
                }
                if self.replica.committed(Commit::Done) == AfterCommit::Recovered {
                    tracing::warn!(
                        "store works again: the committed guard state is current; judging resumes"
                    );
                    self.health.set_ok();
                    self.metrics.store_healthy(true);
                }
                for a in created {
                    if self.actions.send(a).is_err() {
                        tracing::error!(
                            "actuator gone; the action stays intended and runs after a restart"
                        );
                    }
                }
                self.answer(replies);
            }
            Err(e @ StoreError::Fenced { .. }) => {
                tracing::error!(error = %e, actions_not_run = n_actions, "another replica took over: this batch is rolled back and its actions are NOT run; following");
                for (tx, _) in replies {
                    let _asker_may_be_gone = tx.send(Err(self.not_leader(e.to_string())));
                }
                self.replica.committed(Commit::Fenced(e.to_string()));
                self.follow(e.to_string());
            }
            Err(e) => {
                let after = self.replica.committed(Commit::Failed(e.to_string()));
                let first = matches!(after, AfterCommit::Undo { first: true });
                // A failed retry is not news: the failing state is logged once.
                if first {
                    log_store_error(&e, n_actions);
                }
                for (tx, _) in replies {
                    let _asker_may_be_gone = tx.send(Err(EngineError::Store(e.to_string())));
                }
                self.undo(&e, first, n_events).await;
            }
        }
    }

    /// A commit failed: the batch never happened. The replica is failing; put the
    /// guard back where the store has it, and its `n_events` guard events off the
    /// dashboard. `first`: the store worked until this commit.
    pub(super) async fn undo(&mut self, e: &StoreError, first: bool, n_events: usize) {
        self.metrics.store_error();
        self.metrics.store_healthy(false);
        let message = e.to_string();
        self.health.set_failing(message.clone());
        if first {
            tracing::error!(error = %message, "store failing: no actions are taken until it works again");
        }
        self.retry_at = Instant::now() + STORE_RETRY_EVERY;
        for _ in 0..n_events.min(self.events.len()) {
            self.events.pop_back();
        }
        if self.reload().await && first {
            tracing::info!("guard put back at its last committed state");
        }
    }

    /// Rebuilds the guard from the store (the committed state). Returns whether it
    /// could; if not, the guard stays ahead of the store (`dirty`) and nothing is
    /// judged or written until it can.
    pub(super) async fn reload(&mut self) -> bool {
        let mut rec = match self.store.call(|s| s.recover()).await {
            Ok(rec) => rec,
            Err(e) => {
                self.metrics.store_error();
                tracing::error!(error = %e, "cannot read the store to undo a failed commit; retrying");
                return false;
            }
        };
        // The workers' comparison stays this replica's own: a leader undoing a failed
        // commit has a newer one than the store's.
        match self.replica.restore(&stored(&mut rec), self.clock.now()) {
            Ok(replayed) => {
                tracing::debug!(ops_replayed = replayed, "guard rebuilt from the store");
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot rebuild the guard from the store; retrying");
                false
            }
        }
    }

    /// While failing: applies what waited and tries the store with a snapshot of the
    /// committed state; [`Engine::flush`] commits it and leaves the failing state, or
    /// undoes it all again.
    pub(super) async fn retry_store(&mut self) {
        self.retry_at = Instant::now() + STORE_RETRY_EVERY;
        if self.replica.mode().dirty() && !self.reload().await {
            return;
        }
        self.replica.retry();
        let config = self.config.clone();
        self.reconfigure_guard(&config);
        // Target changes waited in every mode but this one's.
        self.apply_targets();
        self.snapshot();
    }

    /// Answers the operator commands of a committed batch, after publishing the view
    /// they changed: a client reads its own writes.
    pub(super) fn answer(&mut self, replies: Vec<Reply>) {
        if replies.is_empty() {
            return;
        }
        self.publish();
        for (tx, r) in replies {
            let _asker_may_be_gone = tx.send(r);
        }
    }
}
