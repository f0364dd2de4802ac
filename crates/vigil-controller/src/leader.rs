//! The leader lease of several replicas on one PostgreSQL store: the task that keeps
//! it, and what it tells the rest of the controller.
//!
//! The task drives `vigil_core::lease::LeaderLease` (the rules: when to renew, when to
//! stop trusting the lease) with the store's one-statement acquire/renew
//! ([`PostgresStore::try_lease`]) on a connection of its own, so a renewal never waits
//! behind the engine's commits. It publishes a [`Leadership`]: the engine decides and
//! acts only while it holds an epoch, and stamps every batch with it (the store's fence
//! refuses the batch once another replica took over); the API shows who leads and
//! since when (`GET /api/leader`).
//!
//! A graceful stop resigns (the lease expires at once) after the engine's last commit,
//! so another replica takes over at its next attempt, within about a second.

use crate::store::{Fence, LeaseAnswer, LeaseRow, PostgresStore, StoreError};
use serde::Serialize;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::{oneshot, watch};
use vigil_core::Time;
use vigil_core::lease::{Change, LeaderLease, LeaseConfig, StoreReply};

/// Who leads, as this replica knows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Leadership {
    /// `postgres` (several replicas, one leads) or `sqlite` (this process alone).
    pub store: &'static str,
    /// This replica's id.
    pub replica: String,
    /// The lease's name.
    #[serde(skip)]
    pub lease: String,
    /// The epoch this replica leads in, while it does.
    pub epoch: Option<i64>,
    /// The lease as last read from the store (holder, epoch, since, expiry: the
    /// database's clock, UNIX ms).
    pub leader: Option<LeaseRow>,
}

impl Leadership {
    /// A process alone on its SQLite store: it always leads, unfenced.
    pub fn alone(replica: String) -> Leadership {
        Leadership {
            store: "sqlite",
            replica,
            ..Leadership::default()
        }
    }

    /// The fencing token of this replica's term, while it leads.
    pub fn fence(&self) -> Option<Fence> {
        self.epoch.map(|epoch| Fence {
            lease: self.lease.clone(),
            holder: self.replica.clone(),
            epoch,
        })
    }

    /// Who leads, in words.
    pub fn describe(&self) -> String {
        match (&self.epoch, &self.leader) {
            (Some(e), _) => format!("replica {} leads (epoch {e})", self.replica),
            (None, Some(l)) if l.live() => format!(
                "replica {} follows; {} leads (epoch {})",
                self.replica, l.holder, l.epoch
            ),
            _ => format!("replica {} follows; no replica leads now", self.replica),
        }
    }
}

/// Keeps the lease until `stop` fires, then resigns it. `tx` carries the leadership.
pub async fn run(
    store: PostgresStore,
    config: LeaseConfig,
    lease: String,
    replica: String,
    tx: watch::Sender<Leadership>,
    mut stop: oneshot::Receiver<()>,
) {
    let store = Arc::new(Mutex::new(store));
    let start = Instant::now();
    let now = || Time::from_elapsed(start.elapsed());
    let mut keeper = LeaderLease::new(config, now());
    let mut pending: Option<tokio::task::JoinHandle<Result<LeaseAnswer, StoreError>>> = None;
    let mut last_error_logged = false;
    let publish = |keeper: &LeaderLease, row: Option<Option<LeaseRow>>| {
        let epoch = keeper.leading(now()).map(|e| e as i64);
        tx.send_if_modified(|l| {
            let mut changed = l.epoch != epoch;
            l.epoch = epoch;
            if let Some(row) = row
                && l.leader != row
            {
                l.leader = row;
                changed = true;
            }
            changed
        });
    };
    loop {
        if let Some(Change::Demoted(e)) = keeper.tick(now()) {
            tracing::error!(
                epoch = e,
                "leader lease not renewed in time: this replica stops deciding and acting"
            );
        }
        if pending.is_none()
            && let Some(req) = keeper.poll(now())
        {
            let (store, lease, replica) = (store.clone(), lease.clone(), replica.clone());
            let ttl = config.ttl;
            pending = Some(tokio::task::spawn_blocking(move || {
                let mut s = store.lock().expect("lease store lock");
                s.try_lease(&lease, &replica, ttl, req.renew.map(|e| e as i64))
            }));
        }
        publish(&keeper, None);
        // Nothing to wait for but the answer in flight: an hour stands for never.
        let wake = start
            + keeper.next_wake().map_or(
                start.elapsed() + std::time::Duration::from_secs(3600),
                |t| t.as_elapsed(),
            );
        tokio::select! {
            biased;
            _ = &mut stop => break,
            r = async { pending.as_mut().expect("checked by the guard").await }, if pending.is_some() => {
                pending = None;
                let (answer, row) = match r {
                    Ok(Ok(LeaseAnswer::Granted(row))) => (StoreReply::Granted(row.epoch as u64), Some(Some(row))),
                    Ok(Ok(LeaseAnswer::Held(row))) => (StoreReply::Held, Some(Some(row))),
                    Ok(Ok(LeaseAnswer::Vacant)) => (StoreReply::Failed, Some(None)),
                    Ok(Err(e)) => {
                        if !last_error_logged {
                            tracing::error!(error = %e, "leader lease: the store did not answer; retrying");
                            last_error_logged = true;
                        }
                        (StoreReply::Failed, None)
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "leader lease: the store call panicked");
                        (StoreReply::Failed, None)
                    }
                };
                if !matches!(answer, StoreReply::Failed) {
                    last_error_logged = false;
                }
                match keeper.answer(now(), answer) {
                    Some(Change::Promoted(e)) => tracing::warn!(epoch = e, replica = %replica, "leader lease acquired: this replica leads"),
                    Some(Change::Demoted(e)) => tracing::warn!(epoch = e, replica = %replica, "leader lease lost: this replica follows"),
                    None => {}
                }
                publish(&keeper, row);
            }
            _ = tokio::time::sleep_until(wake.into()) => {}
        }
    }
    // Resign: after the engine's last commit (the caller stops this task then).
    if let Some(p) = pending.take() {
        let _answer_no_longer_matters = p.await;
    }
    let epoch = keeper.resign();
    publish(&keeper, None);
    // On a blocking thread: the blocking client (and its own runtime) must be used and
    // dropped outside the async runtime.
    let r = tokio::task::spawn_blocking(move || {
        let mut s = store.lock().expect("lease store lock");
        epoch.map(|e| s.resign(&lease, &replica, e as i64))
    })
    .await;
    match (epoch, r) {
        (None, _) => {}
        (Some(e), Ok(Some(Ok(true)))) => {
            tracing::info!(
                epoch = e,
                "leader lease resigned: another replica takes over at once"
            )
        }
        (Some(e), Ok(Some(Ok(false)))) => {
            tracing::info!(epoch = e, "leader lease was no longer ours to resign")
        }
        (Some(_), Ok(Some(Err(e)))) => {
            tracing::error!(error = %e, "resigning the leader lease failed; another replica takes over when it expires")
        }
        (Some(_), r) => tracing::error!(result = ?r.err(), "resigning the leader lease panicked"),
    }
}
