//! [`ReplicaStore`] on PostgreSQL: the leader lease as it stands, and each replica's
//! heartbeat and probe results, answered with the live replicas (sharded probing).

use super::*;

impl ReplicaStore for PostgresStore {
    fn lease(&mut self, name: &str) -> Result<Option<LeaseRow>, StoreError> {
        PostgresStore::lease(self, name)
    }

    fn report(&mut self, r: &ReplicaReport) -> Result<ReplicaState, StoreError> {
        let e = self.err("reporting probe results");
        let ttl_ms = i64::try_from(r.member_ttl.as_millis()).unwrap_or(i64::MAX);
        let limits = self.limits.clone();
        let mut tx = begin(self.connection()?, &limits).map_err(&e)?;
        if r.first {
            // A new run: rows of an earlier run of this id say nothing about now, and
            // replicas long gone are forgotten.
            tx.execute(
                "DELETE FROM probe_results WHERE replica = $1",
                &[&r.replica],
            )
            .map_err(&e)?;
            tx.batch_execute(&format!(
                "DELETE FROM probe_results WHERE replica IN (
                    SELECT id FROM replicas WHERE seen_at < now() - INTERVAL '{FORGET_REPLICAS_AFTER}');
                 DELETE FROM replicas WHERE seen_at < now() - INTERVAL '{FORGET_REPLICAS_AFTER}';"
            ))
            .map_err(&e)?;
        }
        // As of when: the report's composition, never later than now (see
        // `ReplicaReport::as_of_ms`), and a heartbeat never goes back.
        let as_of = "LEAST(now(), COALESCE(to_timestamp($3::BIGINT / 1000.0), now()))";
        tx.execute(
            &format!(
                "INSERT INTO replicas AS r (id, started_at, seen_at) VALUES ($1, now(), {as_of})
                 ON CONFLICT (id) DO UPDATE SET seen_at = GREATEST(r.seen_at, {as_of}),
                     started_at = CASE WHEN $2 THEN now() ELSE r.started_at END"
            ),
            &[&r.replica, &r.first, &r.as_of_ms],
        )
        .map_err(&e)?;
        if !r.upserts.is_empty() {
            let targets: Vec<&str> = r.upserts.iter().map(|u| u.target.as_str()).collect();
            let oks: Vec<bool> = r.upserts.iter().map(|u| u.ok).collect();
            let obs: Vec<Option<&str>> =
                r.upserts.iter().map(|u| u.observation.as_deref()).collect();
            let as_of = "LEAST(now(), COALESCE(to_timestamp($5::BIGINT / 1000.0), now()))";
            tx.execute(
                &format!(
                    "INSERT INTO probe_results (target, replica, ok, observation, changed_at)
                     SELECT t, $1, o, b, {as_of} FROM unnest($2::TEXT[], $3::BOOLEAN[], $4::TEXT[]) AS u(t, o, b)
                     ON CONFLICT (target, replica) DO UPDATE SET
                         ok = EXCLUDED.ok, observation = EXCLUDED.observation, changed_at = {as_of}"
                ),
                &[&r.replica, &targets, &oks, &obs, &r.as_of_ms],
            )
            .map_err(&e)?;
        }
        if !r.removed.is_empty() {
            tx.execute(
                "DELETE FROM probe_results WHERE replica = $1 AND target = ANY($2)",
                &[&r.replica, &r.removed],
            )
            .map_err(&e)?;
        }
        let live = "seen_at > now() - $1::BIGINT * INTERVAL '1 millisecond'";
        let members = tx
            .query(
                &format!(
                    "SELECT id, {s}, {n} FROM replicas WHERE {live} ORDER BY id",
                    s = ms_of("started_at"),
                    n = ms_of("seen_at"),
                ),
                &[&ttl_ms],
            )
            .map_err(&e)?
            .iter()
            .map(|row| MemberRow {
                id: row.get(0),
                since_ms: row.get(1),
                seen_ms: row.get(2),
            })
            .collect();
        let now_ms: i64 = tx
            .query_one(&format!("SELECT {}", ms_of("now()")), &[])
            .map_err(&e)?
            .get(0);
        let mut results = Vec::new();
        if r.read_results {
            for row in tx
                .query(
                    &format!(
                        "SELECT p.target, p.replica, p.ok, p.observation, {a}
                         FROM probe_results p JOIN replicas r ON r.id = p.replica
                         WHERE r.{live}",
                        a = ms_of("GREATEST(p.changed_at, r.seen_at)"),
                    ),
                    &[&ttl_ms],
                )
                .map_err(&e)?
            {
                results.push(StoredResult {
                    target: row.get(0),
                    replica: row.get(1),
                    ok: row.get(2),
                    observation: row.get(3),
                    as_of_ms: row.get(4),
                });
            }
        }
        tx.commit().map_err(&e)?;
        Ok(ReplicaState {
            now_ms,
            members,
            results,
        })
    }
}
