//! The fleet's membership: the target lists of the engine's sources (config, discovery
//! file, Auto Scaling) merged into the guard's `Add`/`Remove` ops, in bulk (one
//! snapshot) when many change at once.

use super::*;

impl Engine {
    /// Sets both target sources at start (before `run`), so targets in neither are
    /// forgotten once, and the others keep their state. `discovered` is None when the
    /// discovery file could not be used at start (missing, unreadable, invalid): then
    /// the targets the store knows and the config does not list are kept, with their
    /// guard state (holds, damping, streaks), unprobed (their URLs are the file's),
    /// until a good list arrives. Forgetting them would lose their holds and flap
    /// penalties to a file that was briefly broken.
    pub fn initial_targets(
        &mut self,
        config: Vec<TargetConfig>,
        discovered: Option<Vec<TargetConfig>>,
    ) {
        self.config_targets = shared(config);
        self.discovery_pending = discovered.is_none();
        self.discovered = shared(discovered.unwrap_or_default());
        // Auto Scaling groups are listed by their poller once running: until its
        // first good list, the targets the store knows are kept as for a file.
        self.aws_pending = self
            .config
            .discovery
            .as_ref()
            .is_some_and(|d| d.aws.is_some());
        self.apply_targets();
        if self.aws_pending {
            tracing::info!(
                kept = self.kept_targets(),
                "the targets the store knows keep their guard state, unprobed, until the Auto Scaling groups are listed"
            );
        }
        if self.discovery_pending {
            let kept = self.kept_targets();
            if kept > 0 {
                tracing::warn!(
                    kept,
                    "discovery file unusable at start: the targets the store knows keep their guard state, unprobed, until a good file arrives"
                );
            }
        }
    }

    /// Targets kept from the store while the discovery file is unusable (known to the
    /// guard, listed by no source).
    pub(super) fn kept_targets(&self) -> usize {
        let listed: std::collections::HashSet<&str> = self
            .config_targets
            .iter()
            .chain(&self.discovered)
            .chain(&self.aws_discovered)
            .map(|t| t.id.as_str())
            .collect();
        self.runtime
            .keys()
            .filter(|id| !listed.contains(&***id))
            .count()
    }

    /// Merges the two sources (config wins on a duplicate id), adds, updates and
    /// forgets targets, and publishes the plan to the scheduler.
    pub(super) fn apply_targets(&mut self) {
        // Sorted by id, sharing the sources' `Arc`s (no copy of any id): a stable sort
        // keeps a discovered entry before the config's entry of the same id, and the
        // later one wins.
        let mut all: Vec<(Arc<TargetConfig>, Source)> = Vec::with_capacity(
            self.aws_discovered.len() + self.discovered.len() + self.config_targets.len(),
        );
        // Later sources win a duplicate id: Auto Scaling, the file, the config.
        all.extend(self.aws_discovered.iter().map(|t| (t.clone(), Source::Aws)));
        all.extend(
            self.discovered
                .iter()
                .map(|t| (t.clone(), Source::Discovery)),
        );
        all.extend(
            self.config_targets
                .iter()
                .map(|t| (t.clone(), Source::Config)),
        );
        all.sort_by(|a, b| a.0.id.cmp(&b.0.id));
        let mut merged: Vec<Arc<TargetConfig>> = Vec::with_capacity(all.len());
        for (t, source) in all {
            match merged.last_mut() {
                Some(last) if last.id == t.id => {
                    if source == Source::Config {
                        tracing::warn!(target_id = %t.id, "target in both config and discovery; the config's entry wins");
                    }
                    *last = t;
                }
                _ => merged.push(t),
            }
        }
        let pending = self.discovery_pending || self.aws_pending;
        let guard = self.replica.guard();
        let now = self.clock.now();
        // While the discovery file has not been read right since start, a target the
        // guard knows stays (see `initial_targets`).
        let wanted = |id: &str| {
            merged.binary_search_by(|t| t.id.as_str().cmp(id)).is_ok()
                || (pending && guard.target(now, id).is_some())
        };
        let mut gone: Vec<Arc<str>> = self
            .runtime
            .keys()
            .filter(|id| !wanted(id))
            .cloned()
            .collect();
        // Targets the guard knows without a record here (a removal undone by a failed
        // commit) go as well.
        gone.extend(
            self.replica
                .guard()
                .target_ids()
                .filter(|id| !wanted(id) && !self.runtime.contains_key(*id))
                .map(Arc::from),
        );
        let added = merged
            .iter()
            .filter(|t| !self.runtime.contains_key(t.id.as_str()))
            .count();
        let bulk = gone.len() + added >= BULK_CHANGES;
        if bulk {
            self.replica.start_bulk();
        }
        for id in gone {
            let at = self.clock.now();
            // Only the removed target's own state changes (to gone): no other
            // target's display state depends on it.
            self.op(
                Op::Remove {
                    at,
                    id: id.to_string(),
                },
                Some(&id),
            );
            if let Some(rt) = self.runtime.remove(&id) {
                self.metrics.forget(&rt.labels);
                tracing::info!(target_id = %id, "target removed; forgotten");
            }
        }
        for spec in &merged {
            let id = &spec.id;
            let known = self
                .replica
                .guard()
                .target(self.clock.now(), id)
                .map(|v| v.zone.to_string());
            if known.as_deref() != Some(spec.zone.as_str()) {
                let at = self.clock.now();
                let op = Op::Add {
                    at,
                    id: id.clone(),
                    zone: spec.zone.clone(),
                };
                self.op(op, Some(id));
                if known.is_none() && spec.zone.is_empty() {
                    // No zone is not a zone named "".
                    tracing::info!(target_id = %id, "target added");
                } else if known.is_none() {
                    tracing::info!(target_id = %id, zone = %spec.zone, "target added");
                }
            }
            if !self.runtime.contains_key(id.as_str()) {
                let labels = self.labels(id, &spec.zone);
                self.runtime.insert(
                    labels.target.clone(),
                    TargetRuntime {
                        up: self.metrics.target_up(&labels),
                        labels,
                        spec: spec.clone(),
                        history: History::default(),
                        last_failed: false,
                        gate: None,
                    },
                );
            }
            let rt = self.runtime.get_mut(id.as_str()).expect("inserted above");
            if rt.spec.zone != spec.zone {
                self.metrics.forget(&rt.labels);
                let zone = intern(&mut self.zones, &spec.zone);
                rt.labels = TargetLabels {
                    target: rt.labels.target.clone(),
                    zone,
                };
                rt.up = self.metrics.target_up(&rt.labels);
            }
            rt.spec = spec.clone();
        }
        if bulk {
            // The snapshot covers every op of this batch, logged or not.
            let anomaly = (!self.anomaly.is_empty()).then(|| self.anomaly.state());
            self.replica.end_bulk(self.clock.now(), anomaly);
            self.last_snapshot = Instant::now();
            self.anomaly_changed = false;
            // Maps filled one target at a time in id order keep half-empty nodes.
            let runtime = std::mem::take(&mut self.runtime);
            self.runtime = runtime.into_iter().collect();
        }
        let plan = Plan {
            targets: merged,
            probe: self.config.probe.clone(),
            heartbeat_ttl: self.config.heartbeat.ttl,
        };
        self.plan.send_if_modified(|p| {
            if **p == plan {
                false
            } else {
                *p = Arc::new(plan);
                true
            }
        });
    }
}
