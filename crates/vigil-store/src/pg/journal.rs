//! [`Store`] on PostgreSQL: the journal's statements (recover, commit, actions, reads),
//! the same transactions as SQLite's, fenced by the leader's epoch (the `pg` module doc).

use super::*;

impl Store for PostgresStore {
    fn recover(&mut self) -> Result<Recovered, StoreError> {
        let e = self.err("recovering");
        // One snapshot of the database for the whole read (a leader may be writing).
        let mut tx = self
            .client
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .map_err(&e)?;
        tx.batch_execute(&self.limits).map_err(&e)?;
        let snap = tx
            .query_opt("SELECT seq, state FROM guard_snapshot WHERE id = 1", &[])
            .map_err(&e)?
            .map(|r| (r.get::<_, i64>(0), r.get::<_, String>(1)));
        let snapshot = match snap {
            Some((seq, mut text)) => {
                for r in tx
                    .query("SELECT text FROM guard_snapshot_parts ORDER BY part", &[])
                    .map_err(&e)?
                {
                    text.push_str(r.get::<_, &str>(0));
                }
                Some((seq, text))
            }
            None => None,
        };
        let after = snapshot.as_ref().map_or(0, |s| s.0);
        let ops = tx
            .query(
                "SELECT op FROM guard_ops WHERE seq > $1 ORDER BY seq",
                &[&after],
            )
            .map_err(&e)?
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect();
        let pending = tx
            .query(
                &format!(
                    "SELECT {ACTION_COLUMNS}, epoch FROM actions WHERE state = 'intended' ORDER BY id"
                ),
                &[],
            )
            .map_err(&e)?
            .iter()
            .map(action_from_row)
            .collect();
        tx.commit().map_err(&e)?;
        Ok(Recovered {
            snapshot: snapshot.map(|s| s.1),
            ops,
            pending,
        })
    }

    fn commit(&mut self, batch: &Batch) -> Result<Vec<ActionRecord>, StoreError> {
        let (keep_decisions, keep_transitions) = self.keep;
        let url = self.url.clone();
        let e = |e: postgres::Error| StoreError::Postgres {
            url: url.clone(),
            why: format!("committing a batch: {}", describe(&e)),
            source: e,
        };
        let fenced = |why: String| StoreError::Fenced {
            url: url.clone(),
            why,
        };
        if self.replica.is_some() && batch.fence.is_none() {
            return Err(fenced(
                "a replica commits only as the leader, and this batch carries no lease epoch"
                    .into(),
            ));
        }
        let limits = self.limits.clone();
        let mut tx = begin(self.connection()?, &limits).map_err(e)?;
        let mut epoch = None;
        if let Some(f) = &batch.fence {
            // The fence: the lease row, locked until this transaction ends, must still
            // be the term this batch was decided in.
            let row = tx
                .query_opt(
                    "SELECT holder, epoch FROM leases WHERE name = $1 FOR UPDATE",
                    &[&f.lease],
                )
                .map_err(e)?;
            match row.map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1))) {
                Some((holder, current)) if holder == f.holder && current == f.epoch => {}
                Some((holder, current)) => {
                    return Err(fenced(format!(
                        "lease {:?} is at epoch {current} held by {holder:?}; this batch was decided by {:?} under epoch {}: rolled back",
                        f.lease, f.holder, f.epoch
                    )));
                }
                None => {
                    return Err(fenced(format!(
                        "lease {:?} was never granted; this batch claims epoch {}: rolled back",
                        f.lease, f.epoch
                    )));
                }
            }
            epoch = Some(f.epoch);
        }
        let mut created = Vec::new();
        if !batch.ops.is_empty() {
            let mut row =
                String::with_capacity(batch.ops.iter().map(|o| o.len() + 1).sum::<usize>() + 2);
            row.push('[');
            row.push_str(&batch.ops.join(","));
            row.push(']');
            tx.execute("INSERT INTO guard_ops (op) VALUES ($1)", &[&row])
                .map_err(e)?;
        }
        if !batch.decisions.is_empty() {
            let insert_decision = tx
                .prepare(
                    "INSERT INTO decisions (at_ms, target, zone, outcome, reasons, summary)
                     VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
                )
                .map_err(e)?;
            let insert_action = tx
                .prepare(
                    "INSERT INTO actions (decision_id, target, idempotency_key, state, created_ms, event, epoch)
                     VALUES ($1, $2, $3, 'intended', $4, $5, $6) RETURNING id",
                )
                .map_err(e)?;
            for d in &batch.decisions {
                let decision_id: i64 = tx
                    .query_one(
                        &insert_decision,
                        &[
                            &d.at_ms,
                            &d.target,
                            &d.zone,
                            &d.outcome.as_str(),
                            &d.reasons.to_string(),
                            &d.summary,
                        ],
                    )
                    .map_err(e)?
                    .get(0);
                if let Some(event) = &d.action {
                    let key = format!("vigil-{}-{}", d.at_ms, decision_id);
                    let mut event = event.clone();
                    event["idempotency_key"] = serde_json::Value::String(key.clone());
                    let id: i64 = tx
                        .query_one(
                            &insert_action,
                            &[
                                &decision_id,
                                &d.target,
                                &key,
                                &d.at_ms,
                                &event.to_string(),
                                &epoch,
                            ],
                        )
                        .map_err(e)?
                        .get(0);
                    created.push(ActionRecord {
                        id,
                        decision_id,
                        target: d.target.clone(),
                        idempotency_key: key,
                        state: ActionState::Intended,
                        attempts: 0,
                        created_ms: d.at_ms,
                        finished_ms: None,
                        result: None,
                        event,
                        epoch,
                    });
                }
            }
        }
        if !batch.transitions.is_empty() {
            let insert = tx
                .prepare(
                    "INSERT INTO transitions (at_ms, target, from_state, to_state, detail)
                     VALUES ($1, $2, $3, $4, $5)",
                )
                .map_err(e)?;
            for t in &batch.transitions {
                tx.execute(&insert, &[&t.at_ms, &t.target, &t.from, &t.to, &t.detail])
                    .map_err(e)?;
            }
        }
        if let Some((state, saved_ms)) = &batch.snapshot {
            let seq: i64 = tx
                .query_one("SELECT COALESCE(MAX(seq), 0)::BIGINT FROM guard_ops", &[])
                .map_err(e)?
                .get(0);
            let mut parts = parts(state, SNAPSHOT_PART);
            let first = parts.next().unwrap_or("");
            tx.execute(
                "INSERT INTO guard_snapshot (id, seq, state, saved_ms) VALUES (1, $1, $2, $3)
                 ON CONFLICT (id) DO UPDATE SET seq = $1, state = $2, saved_ms = $3",
                &[&seq, &first, saved_ms],
            )
            .map_err(e)?;
            tx.execute("DELETE FROM guard_snapshot_parts", &[])
                .map_err(e)?;
            let insert = tx
                .prepare("INSERT INTO guard_snapshot_parts (part, text) VALUES ($1, $2)")
                .map_err(e)?;
            for (i, part) in parts.enumerate() {
                tx.execute(&insert, &[&(i as i64 + 1), &part]).map_err(e)?;
            }
            tx.execute("DELETE FROM guard_ops WHERE seq <= $1", &[&seq])
                .map_err(e)?;
            tx.execute(
                "DELETE FROM decisions WHERE id <= (SELECT MAX(id) FROM decisions) - $1
                 AND id NOT IN (SELECT decision_id FROM actions)",
                &[&keep_decisions],
            )
            .map_err(e)?;
            tx.execute(
                "DELETE FROM transitions WHERE id <= (SELECT MAX(id) FROM transitions) - $1",
                &[&keep_transitions],
            )
            .map_err(e)?;
        }
        tx.commit().map_err(e)?;
        Ok(created)
    }

    fn start_attempt(&mut self, id: i64) -> Result<(), StoreError> {
        let Some((lease, holder)) = self.replica.clone() else {
            self.once("counting an attempt", |c| {
                c.execute(
                    "UPDATE actions SET attempts = attempts + 1 WHERE id = $1",
                    &[&id],
                )
            })?;
            return Ok(());
        };
        // A replica runs an action only while it holds the lease: a deposed leader's
        // actuator must not start a run its successor will also start.
        let n = self.once("counting an attempt", |c| {
            c.execute(
                "UPDATE actions SET attempts = attempts + 1 WHERE id = $1 AND EXISTS (
                    SELECT 1 FROM leases WHERE name = $2 AND holder = $3 AND expires_at > now())",
                &[&id, &lease, &holder],
            )
        })?;
        if n == 1 {
            return Ok(());
        }
        Err(StoreError::Fenced {
            url: self.url.clone(),
            why: format!(
                "replica {holder:?} does not hold lease {lease:?} (or action {id} does not exist): the attempt is not counted and the action not run here"
            ),
        })
    }

    fn finish_action(
        &mut self,
        id: i64,
        state: ActionState,
        at_ms: i64,
        result: &str,
    ) -> Result<(), StoreError> {
        // Not fenced: a run that happened is a fact, whoever reports it.
        self.once("finishing an action", |c| {
            c.execute(
                "UPDATE actions SET state = $2, finished_ms = $3, result = $4 WHERE id = $1",
                &[&id, &state.as_str(), &at_ms, &result],
            )
        })?;
        Ok(())
    }

    fn decisions(
        &mut self,
        target: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DecisionRecord>, StoreError> {
        let limit = limit as i64;
        let rows = self.once("reading decisions", |c| {
            c.query(
                "SELECT id, at_ms, target, zone, outcome, reasons, summary FROM decisions
                 WHERE ($1::TEXT IS NULL OR target = $1) ORDER BY id DESC LIMIT $2",
                &[&target, &limit],
            )
        })?;
        Ok(rows
            .iter()
            .map(|r| DecisionRecord {
                id: r.get(0),
                at_ms: r.get(1),
                target: r.get(2),
                zone: r.get(3),
                outcome: r.get(4),
                reasons: serde_json::from_str(r.get::<_, &str>(5))
                    .unwrap_or(serde_json::Value::Null),
                summary: r.get(6),
            })
            .collect())
    }

    fn actions(&mut self, limit: usize) -> Result<Vec<ActionRecord>, StoreError> {
        let limit = limit as i64;
        let rows = self.once("reading actions", |c| {
            c.query(
                &format!("SELECT {ACTION_COLUMNS}, epoch FROM actions ORDER BY id DESC LIMIT $1"),
                &[&limit],
            )
        })?;
        Ok(rows.iter().map(action_from_row).collect())
    }

    fn transitions(
        &mut self,
        target: &str,
        limit: usize,
    ) -> Result<Vec<TransitionRecord>, StoreError> {
        let limit = limit as i64;
        let rows = self.once("reading transitions", |c| {
            c.query(
                "SELECT id, at_ms, target, from_state, to_state, detail FROM transitions
                 WHERE target = $1 ORDER BY id DESC LIMIT $2",
                &[&target, &limit],
            )
        })?;
        Ok(rows
            .iter()
            .map(|r| TransitionRecord {
                id: r.get(0),
                at_ms: r.get(1),
                target: r.get(2),
                from: r.get(3),
                to: r.get(4),
                detail: r.get(5),
            })
            .collect())
    }

    fn replicas(&mut self) -> Option<&mut dyn ReplicaStore> {
        Some(self)
    }
}
