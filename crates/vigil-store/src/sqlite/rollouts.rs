//! `vigil deploy`'s rollouts in the SQLite store: the policy's state per rollout, its
//! steps as intents, and the requests humans leave for the driver (the store's module
//! doc, section "Rollouts", has the invariants).

use super::{ActionState, SqliteStore, StoreError};
use rusqlite::{OptionalExtension, params};
use serde::Serialize;

/// A rollout as stored.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StoredRollout {
    /// The policy's id (`revision@start ms`).
    pub id: String,
    /// The deployment it belongs to (the deploy config's `name`).
    pub name: String,
    /// The revision it deploys.
    pub revision: String,
    /// Its phase, in words.
    pub phase: String,
    /// Whether nothing more happens without a human.
    pub finished: bool,
    /// The serialised `vigil_core::rollout::Rollout`.
    #[serde(skip)]
    pub state: String,
    /// The policy time of the last save (UNIX ms).
    pub clock_ms: i64,
    /// When it started (UNIX ms).
    pub started_ms: i64,
    /// When it was last saved (UNIX ms).
    pub updated_ms: i64,
}

/// A step (a command taken from the policy) as stored.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RolloutStep {
    /// Its id.
    pub id: i64,
    /// The rollout.
    pub rollout: String,
    /// The host it concerns (none for an alert).
    pub host: Option<String>,
    /// The `vigil_core::rollout::Command`, as JSON.
    pub command: serde_json::Value,
    /// Intended, done or failed.
    pub state: ActionState,
    /// Runs started.
    pub attempts: i64,
    /// When it was intended (UNIX ms).
    pub created_ms: i64,
    /// When it finished (UNIX ms).
    pub finished_ms: Option<i64>,
    /// The hook's last word.
    pub result: Option<String>,
}

/// A human's request, waiting for the driver.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RolloutRequest {
    /// Its id.
    pub id: i64,
    /// `abort`, `approve` or `clear_bad`.
    pub kind: String,
    /// The reason (abort) or the revision (clear_bad).
    pub detail: String,
    /// When it was made (UNIX ms).
    pub created_ms: i64,
    /// When the driver applied it.
    pub applied_ms: Option<i64>,
    /// What applying it did.
    pub outcome: Option<String>,
}

/// One save of a rollout: its state and what changed with it, in one transaction.
#[derive(Clone, Debug, Default)]
pub struct RolloutSave {
    /// The policy's id.
    pub id: String,
    /// The deployment.
    pub name: String,
    /// The revision.
    pub revision: String,
    /// The phase, in words.
    pub phase: String,
    /// Whether it is finished.
    pub finished: bool,
    /// The serialised state.
    pub state: String,
    /// The policy time now (UNIX ms).
    pub clock_ms: i64,
    /// The wall clock now (UNIX ms).
    pub now_ms: i64,
    /// New intents: the host (if any) and the command JSON, in order.
    pub intents: Vec<(Option<String>, String)>,
    /// Steps whose result the state took: id, outcome, the hook's word.
    pub finished_steps: Vec<(i64, ActionState, String)>,
    /// Requests the state applied: id and what it did.
    pub applied_requests: Vec<(i64, String)>,
}

const STEP_COLUMNS: &str =
    "id, rollout, host, command, state, attempts, created_ms, finished_ms, result";
const ROLLOUT_COLUMNS: &str =
    "id, name, revision, phase, finished, state, clock_ms, started_ms, updated_ms";
const REQUEST_COLUMNS: &str = "id, kind, detail, created_ms, applied_ms, outcome";

fn step_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RolloutStep> {
    let command: String = r.get(3)?;
    let state: String = r.get(4)?;
    Ok(RolloutStep {
        id: r.get(0)?,
        rollout: r.get(1)?,
        host: r.get(2)?,
        command: serde_json::from_str(&command).unwrap_or(serde_json::Value::Null),
        state: ActionState::parse(&state),
        attempts: r.get(5)?,
        created_ms: r.get(6)?,
        finished_ms: r.get(7)?,
        result: r.get(8)?,
    })
}

fn rollout_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<StoredRollout> {
    Ok(StoredRollout {
        id: r.get(0)?,
        name: r.get(1)?,
        revision: r.get(2)?,
        phase: r.get(3)?,
        finished: r.get::<_, i64>(4)? != 0,
        state: r.get(5)?,
        clock_ms: r.get(6)?,
        started_ms: r.get(7)?,
        updated_ms: r.get(8)?,
    })
}

fn request_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RolloutRequest> {
    Ok(RolloutRequest {
        id: r.get(0)?,
        kind: r.get(1)?,
        detail: r.get(2)?,
        created_ms: r.get(3)?,
        applied_ms: r.get(4)?,
        outcome: r.get(5)?,
    })
}

// === impl SqliteStore (rollouts) ===

impl SqliteStore {
    /// The newest rollout of deployment `name`, if any.
    pub fn latest_rollout(&mut self, name: &str) -> Result<Option<StoredRollout>, StoreError> {
        let e = self.err();
        self.conn
            .query_row(
                &format!(
                    "SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE name = ?1
                     ORDER BY started_ms DESC, rowid DESC LIMIT 1"
                ),
                [name],
                rollout_from_row,
            )
            .optional()
            .map_err(e)
    }

    /// The latest rollouts of every deployment, newest first (the dashboard's).
    pub fn recent_rollouts(&mut self, limit: usize) -> Result<Vec<StoredRollout>, StoreError> {
        let e = self.err();
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT {ROLLOUT_COLUMNS} FROM rollouts
                 ORDER BY started_ms DESC, rowid DESC LIMIT ?1"
            ))
            .map_err(&e)?;
        let rows = stmt
            .query_map(params![limit as i64], rollout_from_row)
            .map_err(&e)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(&e)?;
        Ok(rows)
    }

    /// Rollouts of deployment `name`, newest first.
    pub fn rollouts(&mut self, name: &str, limit: usize) -> Result<Vec<StoredRollout>, StoreError> {
        let e = self.err();
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE name = ?1
                 ORDER BY started_ms DESC, rowid DESC LIMIT ?2"
            ))
            .map_err(&e)?;
        let rows = stmt
            .query_map(params![name, limit as i64], rollout_from_row)
            .map_err(&e)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(&e)?;
        Ok(rows)
    }

    /// Saves a rollout (inserting it the first time) with its new intents, finished
    /// steps and applied requests, in one transaction. Returns the new intents as
    /// stored, in order.
    pub fn save_rollout(&mut self, save: &RolloutSave) -> Result<Vec<RolloutStep>, StoreError> {
        let path = self.path.clone();
        let e = |source| StoreError::Sqlite {
            path: path.clone(),
            source,
        };
        let tx = self.conn.transaction().map_err(e)?;
        let mut created = Vec::new();
        {
            tx.execute(
                "INSERT INTO rollouts (id, name, revision, phase, finished, state, clock_ms, started_ms, updated_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8)
                 ON CONFLICT (id) DO UPDATE SET phase = ?4, finished = ?5, state = ?6,
                     clock_ms = ?7, updated_ms = ?8",
                params![
                    save.id,
                    save.name,
                    save.revision,
                    save.phase,
                    i64::from(save.finished),
                    save.state,
                    save.clock_ms,
                    save.now_ms
                ],
            )
            .map_err(e)?;
            for (id, state, result) in &save.finished_steps {
                tx.prepare_cached(
                    "UPDATE rollout_steps SET state = ?2, finished_ms = ?3, result = ?4 WHERE id = ?1",
                )
                .map_err(e)?
                .execute(params![id, state.as_str(), save.now_ms, result])
                .map_err(e)?;
            }
            for (id, outcome) in &save.applied_requests {
                tx.prepare_cached(
                    "UPDATE rollout_requests SET applied_ms = ?2, outcome = ?3 WHERE id = ?1",
                )
                .map_err(e)?
                .execute(params![id, save.now_ms, outcome])
                .map_err(e)?;
            }
            for (host, command) in &save.intents {
                tx.prepare_cached(
                    "INSERT INTO rollout_steps (rollout, host, command, state, created_ms)
                     VALUES (?1, ?2, ?3, 'intended', ?4)",
                )
                .map_err(e)?
                .execute(params![save.id, host, command, save.now_ms])
                .map_err(e)?;
                created.push(RolloutStep {
                    id: tx.last_insert_rowid(),
                    rollout: save.id.clone(),
                    host: host.clone(),
                    command: serde_json::from_str(command).unwrap_or(serde_json::Value::Null),
                    state: ActionState::Intended,
                    attempts: 0,
                    created_ms: save.now_ms,
                    finished_ms: None,
                    result: None,
                });
            }
        }
        tx.commit().map_err(e)?;
        Ok(created)
    }

    /// A rollout's steps in order: every one, or only those still intended.
    pub fn rollout_steps(
        &mut self,
        rollout: &str,
        only_intended: bool,
    ) -> Result<Vec<RolloutStep>, StoreError> {
        let e = self.err();
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                "SELECT {STEP_COLUMNS} FROM rollout_steps
                 WHERE rollout = ?1 AND (?2 = 0 OR state = 'intended') ORDER BY id"
            ))
            .map_err(&e)?;
        let rows = stmt
            .query_map(params![rollout, i64::from(only_intended)], step_from_row)
            .map_err(&e)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(&e)?;
        Ok(rows)
    }

    /// Counts a run of a step (committed before the hook runs).
    pub fn start_step(&mut self, id: i64) -> Result<(), StoreError> {
        let e = self.err();
        self.conn
            .execute(
                "UPDATE rollout_steps SET attempts = attempts + 1 WHERE id = ?1",
                [id],
            )
            .map_err(e)?;
        Ok(())
    }

    /// Records what a step's run said without finishing it (a drain to try again).
    pub fn note_step(&mut self, id: i64, result: &str) -> Result<(), StoreError> {
        let e = self.err();
        self.conn
            .execute(
                "UPDATE rollout_steps SET result = ?2 WHERE id = ?1",
                params![id, result],
            )
            .map_err(e)?;
        Ok(())
    }

    /// Leaves a request for the driver of deployment `name`; returns its id.
    pub fn add_rollout_request(
        &mut self,
        name: &str,
        kind: &str,
        detail: &str,
        now_ms: i64,
    ) -> Result<i64, StoreError> {
        let e = self.err();
        self.conn
            .execute(
                "INSERT INTO rollout_requests (name, kind, detail, created_ms) VALUES (?1, ?2, ?3, ?4)",
                params![name, kind, detail, now_ms],
            )
            .map_err(e)?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Requests of deployment `name` not applied yet, oldest first.
    pub fn pending_rollout_requests(
        &mut self,
        name: &str,
    ) -> Result<Vec<RolloutRequest>, StoreError> {
        let e = self.err();
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                "SELECT {REQUEST_COLUMNS} FROM rollout_requests
                 WHERE name = ?1 AND applied_ms IS NULL ORDER BY id"
            ))
            .map_err(&e)?;
        let rows = stmt
            .query_map([name], request_from_row)
            .map_err(&e)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(&e)?;
        Ok(rows)
    }

    /// One request, as it is now.
    pub fn rollout_request(&mut self, id: i64) -> Result<Option<RolloutRequest>, StoreError> {
        let e = self.err();
        self.conn
            .query_row(
                &format!("SELECT {REQUEST_COLUMNS} FROM rollout_requests WHERE id = ?1"),
                [id],
                request_from_row,
            )
            .optional()
            .map_err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn save(id: &str, state: &str) -> RolloutSave {
        RolloutSave {
            id: id.into(),
            name: "web".into(),
            revision: "v2".into(),
            phase: "deploying wave 1".into(),
            state: state.into(),
            clock_ms: 10,
            now_ms: 10,
            ..RolloutSave::default()
        }
    }

    #[test]
    fn a_rollout_its_intents_and_their_outcomes_are_saved_together() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vigil.db");
        let mut s = SqliteStore::open(&path).unwrap();
        let mut first = save("v2@1", "{\"a\":1}");
        first.intents = vec![
            (
                Some("h1".into()),
                "{\"kind\":\"drain\",\"host\":\"h1\"}".into(),
            ),
            (
                Some("h2".into()),
                "{\"kind\":\"drain\",\"host\":\"h2\"}".into(),
            ),
        ];
        let steps = s.save_rollout(&first).unwrap();
        assert_eq!(steps.len(), 2);
        s.start_step(steps[0].id).unwrap();
        let mut second = save("v2@1", "{\"a\":2}");
        second.finished_steps = vec![(steps[0].id, ActionState::Done, "ok".into())];
        s.save_rollout(&second).unwrap();
        drop(s);

        let mut s = SqliteStore::open(&path).unwrap();
        let r = s.latest_rollout("web").unwrap().expect("saved");
        assert_eq!(r.state, "{\"a\":2}", "the last save wins");
        assert_eq!(r.id, "v2@1");
        let pending = s.rollout_steps("v2@1", true).unwrap();
        assert_eq!(pending.len(), 1, "only h2's drain is still intended");
        assert_eq!(pending[0].host.as_deref(), Some("h2"));
        let all = s.rollout_steps("v2@1", false).unwrap();
        assert_eq!(all[0].attempts, 1);
        assert_eq!(all[0].state, ActionState::Done);
        assert!(s.latest_rollout("other").unwrap().is_none());
    }

    #[test]
    fn requests_wait_until_applied() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = SqliteStore::open(&dir.path().join("vigil.db")).unwrap();
        let id = s.add_rollout_request("web", "abort", "bad", 5).unwrap();
        assert_eq!(s.pending_rollout_requests("web").unwrap().len(), 1);
        assert!(s.pending_rollout_requests("api").unwrap().is_empty());
        let mut sv = save("v2@1", "{}");
        sv.applied_requests = vec![(id, "aborted".into())];
        s.save_rollout(&sv).unwrap();
        assert!(s.pending_rollout_requests("web").unwrap().is_empty());
        let r = s.rollout_request(id).unwrap().unwrap();
        assert_eq!(r.outcome.as_deref(), Some("aborted"));
        assert_eq!(r.applied_ms, Some(10));
    }
}
