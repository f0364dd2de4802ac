//! The item store: PostgreSQL when reachable at start-up, else a local SQLite file.
//!
//! Faults switch real mechanisms, never a reported status:
//! - "dependency down" points the store at a closed port (PostgreSQL) or at a file in a
//!   directory that does not exist (SQLite) and drops the open connection, so every
//!   query really fails to connect;
//! - "brownout" makes every query really slow: `pg_sleep` on the PostgreSQL server, a
//!   sleep on the SQLite thread.
//!
//! The health check's round trip ([`Store::ping`]) has a connection of its own, apart
//! from the one the reads share: a PostgreSQL connection runs its queries one after the
//! other, so a `SELECT 1` sent behind a burst of slowed reads would measure their queue,
//! not the database (issue 34: the demo's brownout made the check alternate between
//! "took 798 ms" and "no answer within 1s"). A dependency check must not wait behind the
//! traffic it judges.

use serde::Serialize;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_postgres::NoTls;

/// How long a connection attempt may take: a database on the same host or LAN answers a
/// connect in milliseconds; a second means it is not there.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How long startup keeps trying a PostgreSQL that answers slowly (a busy machine, a
/// database still starting) before falling back to SQLite. A refused connection (nothing
/// listens) falls back at once: waiting would not change it.
pub const STARTUP_WINDOW: Duration = Duration::from_secs(10);

/// The table the example owns (prefixed: the `test` database is shared).
pub const TABLE: &str = "vigil_example_items";

/// How many items the table is seeded with.
pub const SEEDED_ITEMS: i64 = 100;

/// Where the store points while the dependency fault is on: a port nothing listens on.
const CLOSED_PORT: u16 = 1;

/// One item.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Item {
    /// Identifier.
    pub id: i64,
    /// Name.
    pub name: String,
    /// Price in cents.
    pub price_cents: i64,
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// PostgreSQL said no, or could not be reached.
    #[error("postgres: {}", chain(.0))]
    Postgres(#[from] tokio_postgres::Error),
    /// SQLite said no, or the file could not be opened.
    #[error("sqlite: {}", chain(.0))]
    Sqlite(#[from] rusqlite::Error),
    /// The operation did not finish in time.
    #[error("{0} timed out after {1:?}")]
    Timeout(&'static str, Duration),
    /// The blocking task running SQLite failed.
    #[error("sqlite task: {0}")]
    Task(String),
}

enum Backend {
    Postgres {
        config: Box<tokio_postgres::Config>,
        broken: Box<tokio_postgres::Config>,
        /// The reads' connection.
        reads: PgSlot,
        /// The health check's own connection.
        check: PgSlot,
    },
    Sqlite {
        path: PathBuf,
        /// The reads' connection.
        reads: SqliteSlot,
        /// The health check's own connection.
        check: SqliteSlot,
    },
}

type PgSlot = tokio::sync::Mutex<Option<Arc<tokio_postgres::Client>>>;
type SqliteSlot = Arc<Mutex<Option<rusqlite::Connection>>>;

/// Which connection a query uses (see the module docs).
#[derive(Clone, Copy)]
enum Use {
    Reads,
    Check,
}

/// The store; see the module docs.
pub struct Store {
    backend: Backend,
    down: AtomicBool,
    brownout_ms: AtomicU64,
    fallback: Option<String>,
}

impl Store {
    /// Connects to PostgreSQL at `url`, creating and seeding the table; when PostgreSQL
    /// is unreachable (or the URL is not a PostgreSQL URL), opens the SQLite file at
    /// `sqlite_path` instead and logs why, once.
    pub async fn open(url: &str, sqlite_path: PathBuf) -> anyhow::Result<Store> {
        let config = match url.parse::<tokio_postgres::Config>() {
            Ok(config) => config,
            Err(e) => {
                let e = anyhow::Error::from(e).context("not a PostgreSQL URL");
                return Self::fall_back(url, sqlite_path, e).await;
            }
        };
        let deadline = tokio::time::Instant::now() + STARTUP_WINDOW;
        let mut attempt = 1u32;
        loop {
            match Self::open_postgres(url, config.clone()).await {
                Ok(store) => return Ok(store),
                Err(e) if !refused(&e) && tokio::time::Instant::now() < deadline => {
                    tracing::warn!(
                        url = %redact(url), error = %e, attempt,
                        "PostgreSQL did not answer: trying again"
                    );
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(250 * u64::from(attempt))).await;
                }
                Err(e) => return Self::fall_back(url, sqlite_path, e).await,
            }
        }
    }

    async fn fall_back(url: &str, sqlite_path: PathBuf, e: anyhow::Error) -> anyhow::Result<Store> {
        tracing::info!(
            url = %redact(url), error = %format!("{e:#}"), sqlite = %sqlite_path.display(),
            "PostgreSQL unreachable: using a local SQLite file instead"
        );
        let mut store = Self::open_sqlite(sqlite_path).await?;
        store.fallback = Some(format!("{e:#}"));
        Ok(store)
    }

    /// Why the store is SQLite although a PostgreSQL URL was given (None when it is not).
    pub fn fallback_reason(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    async fn open_postgres(url: &str, mut config: tokio_postgres::Config) -> anyhow::Result<Store> {
        config.connect_timeout(CONNECT_TIMEOUT);
        // Same user, but a port nobody listens on.
        let broken = {
            let mut b = tokio_postgres::Config::new();
            b.host("127.0.0.1")
                .port(CLOSED_PORT)
                .connect_timeout(CONNECT_TIMEOUT);
            if let Some(user) = config.get_user() {
                b.user(user);
            }
            b
        };
        let client = connect_pg(&config).await?;
        client
            // Serialised by an advisory lock: concurrent CREATE TABLE IF NOT EXISTS in
            // PostgreSQL can still fail with a unique violation on the catalog.
            .batch_execute(&format!(
                "SET client_min_messages TO warning; BEGIN; SELECT pg_advisory_xact_lock(7411001);
                 CREATE TABLE IF NOT EXISTS {TABLE} (id BIGINT PRIMARY KEY, name TEXT NOT NULL, price_cents BIGINT NOT NULL);
                 INSERT INTO {TABLE} (id, name, price_cents)
                   SELECT i, 'item ' || i, i * 100 + 99 FROM generate_series(1, {SEEDED_ITEMS}) AS i
                   ON CONFLICT (id) DO NOTHING;
                 COMMIT;"
            ))
            .await?;
        tracing::info!(url = %redact(url), "store: PostgreSQL");
        Ok(Store {
            backend: Backend::Postgres {
                config: Box::new(config),
                broken: Box::new(broken),
                reads: tokio::sync::Mutex::new(Some(Arc::new(client))),
                check: tokio::sync::Mutex::new(None),
            },
            down: AtomicBool::new(false),
            brownout_ms: AtomicU64::new(0),
            fallback: None,
        })
    }

    async fn open_sqlite(path: PathBuf) -> anyhow::Result<Store> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let p = path.clone();
        let conn = tokio::task::spawn_blocking(move || -> rusqlite::Result<_> {
            let conn = rusqlite::Connection::open(&p)?;
            conn.pragma_update(None, "journal_mode", "WAL")?;
            conn.execute_batch(&format!(
                "CREATE TABLE IF NOT EXISTS {TABLE} (id INTEGER PRIMARY KEY, name TEXT NOT NULL, price_cents INTEGER NOT NULL);
                 WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < {SEEDED_ITEMS})
                 INSERT OR IGNORE INTO {TABLE} (id, name, price_cents) SELECT i, 'item ' || i, i * 100 + 99 FROM s;"
            ))?;
            Ok(conn)
        })
        .await??;
        tracing::info!(path = %path.display(), "store: SQLite");
        Ok(Store {
            backend: Backend::Sqlite {
                path,
                reads: Arc::new(Mutex::new(Some(conn))),
                check: Arc::new(Mutex::new(None)),
            },
            down: AtomicBool::new(false),
            brownout_ms: AtomicU64::new(0),
            fallback: None,
        })
    }

    /// `postgres` or `sqlite`.
    pub fn kind(&self) -> &'static str {
        match self.backend {
            Backend::Postgres { .. } => "postgres",
            Backend::Sqlite { .. } => "sqlite",
        }
    }

    /// Turns the dependency fault on or off (see the module docs).
    pub async fn set_down(&self, down: bool) {
        let was = self.down.swap(down, Ordering::SeqCst);
        if down && !was {
            // Drop the live connection: the next query must connect, and fail.
            match &self.backend {
                Backend::Postgres { reads, check, .. } => {
                    *reads.lock().await = None;
                    *check.lock().await = None;
                }
                Backend::Sqlite { reads, check, .. } => {
                    for slot in [reads, check] {
                        *slot.lock().unwrap_or_else(|e| e.into_inner()) = None;
                    }
                }
            }
        }
    }

    /// Drops the reads' connection after a read was given up (cut at its budget): the
    /// query still runs on the server, and a PostgreSQL connection runs its queries one
    /// after the other, so every later read would wait behind the abandoned ones (after a
    /// brownout, trial reads stayed slow until that queue drained). The next read
    /// connects anew. Never waits: while another read holds the slot it is connecting
    /// (a new connection is on its way), and a read given up must answer at once.
    pub fn abandon_reads(&self) {
        if let Backend::Postgres { reads, .. } = &self.backend
            && let Ok(mut slot) = reads.try_lock()
        {
            *slot = None;
        }
    }

    /// Whether the dependency fault is on.
    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::SeqCst)
    }

    /// Adds this much latency to every query (0: none).
    pub fn set_brownout(&self, latency: Duration) {
        self.brownout_ms
            .store(latency.as_millis() as u64, Ordering::SeqCst);
    }

    /// The added latency.
    pub fn brownout(&self) -> Duration {
        Duration::from_millis(self.brownout_ms.load(Ordering::SeqCst))
    }

    async fn pg_client(&self, on: Use) -> Result<Arc<tokio_postgres::Client>, StoreError> {
        let Backend::Postgres {
            config,
            broken,
            reads,
            check,
        } = &self.backend
        else {
            unreachable!("pg_client on a SQLite store");
        };
        let mut slot = match on {
            Use::Reads => reads.lock().await,
            Use::Check => check.lock().await,
        };
        if let Some(c) = slot.as_ref()
            && !c.is_closed()
        {
            return Ok(c.clone());
        }
        let target = if self.is_down() { broken } else { config };
        let c = Arc::new(connect_pg(target).await?);
        *slot = Some(c.clone());
        Ok(c)
    }

    /// Runs `f` on the SQLite connection, (re)opening it as needed, on the blocking pool.
    async fn with_sqlite<T: Send + 'static>(
        &self,
        on: Use,
        f: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, StoreError> {
        let Backend::Sqlite { path, reads, check } = &self.backend else {
            unreachable!("with_sqlite on a PostgreSQL store");
        };
        let conn = match on {
            Use::Reads => reads,
            Use::Check => check,
        };
        let path = if self.is_down() {
            PathBuf::from("/nonexistent/vigil-example/store.sqlite")
        } else {
            path.clone()
        };
        let conn = conn.clone();
        let brownout = self.brownout();
        tokio::task::spawn_blocking(move || {
            std::thread::sleep(brownout);
            let mut slot = conn.lock().unwrap_or_else(|e| e.into_inner());
            if slot.is_none() {
                *slot = Some(rusqlite::Connection::open_with_flags(
                    &path,
                    rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE,
                )?);
            }
            let c = slot.as_ref().expect("connection just opened");
            Ok(f(c)?)
        })
        .await
        .map_err(|e| StoreError::Task(e.to_string()))?
    }

    async fn pg_brownout(&self, client: &tokio_postgres::Client) -> Result<(), StoreError> {
        let b = self.brownout();
        if !b.is_zero() {
            client
                .execute("SELECT pg_sleep($1)", &[&b.as_secs_f64()])
                .await?;
        }
        Ok(())
    }

    /// One item by id.
    pub async fn get(&self, id: i64) -> Result<Option<Item>, StoreError> {
        match &self.backend {
            Backend::Postgres { .. } => {
                let client = self.pg_client(Use::Reads).await?;
                self.pg_brownout(&client).await?;
                let row = client
                    .query_opt(
                        &format!("SELECT id, name, price_cents FROM {TABLE} WHERE id = $1"),
                        &[&id],
                    )
                    .await?;
                Ok(row.map(|r| Item {
                    id: r.get(0),
                    name: r.get(1),
                    price_cents: r.get(2),
                }))
            }
            Backend::Sqlite { .. } => {
                self.with_sqlite(Use::Reads, move |c| {
                    use rusqlite::OptionalExtension;
                    c.query_row(
                        &format!("SELECT id, name, price_cents FROM {TABLE} WHERE id = ?1"),
                        [id],
                        |r| {
                            Ok(Item {
                                id: r.get(0)?,
                                name: r.get(1)?,
                                price_cents: r.get(2)?,
                            })
                        },
                    )
                    .optional()
                })
                .await
            }
        }
    }

    /// Every item (to warm the cache).
    pub async fn all(&self) -> Result<Vec<Item>, StoreError> {
        match &self.backend {
            Backend::Postgres { .. } => {
                let client = self.pg_client(Use::Reads).await?;
                let rows = client
                    .query(
                        &format!("SELECT id, name, price_cents FROM {TABLE} ORDER BY id"),
                        &[],
                    )
                    .await?;
                Ok(rows
                    .iter()
                    .map(|r| Item {
                        id: r.get(0),
                        name: r.get(1),
                        price_cents: r.get(2),
                    })
                    .collect())
            }
            Backend::Sqlite { .. } => {
                self.with_sqlite(Use::Reads, |c| {
                    let mut stmt = c.prepare(&format!(
                        "SELECT id, name, price_cents FROM {TABLE} ORDER BY id"
                    ))?;
                    let items = stmt
                        .query_map([], |r| {
                            Ok(Item {
                                id: r.get(0)?,
                                name: r.get(1)?,
                                price_cents: r.get(2)?,
                            })
                        })?
                        .collect::<rusqlite::Result<Vec<_>>>()?;
                    Ok(items)
                })
                .await
            }
        }
    }

    /// A round trip to the database (`SELECT 1`, plus any brownout), on the check's own
    /// connection (see the module docs).
    pub async fn ping(&self) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Postgres { .. } => {
                let client = self.pg_client(Use::Check).await?;
                self.pg_brownout(&client).await?;
                client.execute("SELECT 1", &[]).await?;
                Ok(())
            }
            Backend::Sqlite { .. } => {
                self.with_sqlite(Use::Check, |c| c.query_row("SELECT 1", [], |_| Ok(())))
                    .await
            }
        }
    }
}

async fn connect_pg(config: &tokio_postgres::Config) -> Result<tokio_postgres::Client, StoreError> {
    // connect_timeout covers the socket; this covers the whole handshake.
    let (client, connection) = tokio::time::timeout(CONNECT_TIMEOUT * 2, config.connect(NoTls))
        .await
        .map_err(|_| StoreError::Timeout("postgres connect", CONNECT_TIMEOUT * 2))??;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "postgres connection closed");
        }
    });
    Ok(client)
}

/// Whether opening PostgreSQL failed because nothing listens there: trying again within
/// the startup window would not help.
fn refused(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
    })
}

/// An error and its sources on one line ("error connecting to server: Connection refused").
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.ends_with(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

/// The URL without its password, for logs.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{user}@{}", &url[..s + 3], &url[at + 1..])
        }
        _ => url.to_string(),
    }
}
