//! The SQL run store: SQLite (the embedded default, a file in the data dir, WAL) or
//! PostgreSQL (production), chosen by URL. One schema, one set of queries (bound
//! parameters only); each backend has its own migration files because their
//! column types differ.
//!
//! Writes (run creations and commits) go through one writer task per store
//! (`writer.rs`), which commits every write pending at the time in one transaction
//! (group commit) and answers each caller after it committed; `group.rs` checks
//! and merges a group in memory, `read.rs` reads the runs a group commits to,
//! `binding.rs` builds its multi-row statements, `encode.rs` encodes events and
//! times, and `sql.rs` holds what these files share (the pool, column access).
//! On SQLite the writer has a connection of its own that it uses in place, on its
//! task (`direct.rs`), as do the reads every run's stream makes (the run, its
//! events; `sql::Readers`); other reads use sqlx's pool. The writer's connection
//! hands the WAL a commit's frames in one write (its VFS, `wal_vfs.rs`). A write transaction
//! begins `IMMEDIATE` (no upgrade deadlocks). The writer keeps the committed row of
//! every unfinished run, so a group reads only the runs it does not know yet (and
//! not those it creates), and allocates each new run's integer key (`run_key`),
//! which the child tables name their run by (schema v7); reads find a run by its
//! id, then its rows by its key.
//!
//! # Tuning
//!
//! SQLite runs in WAL mode with `synchronous = NORMAL`: a commit survives a killed
//! process, but a power loss may lose the last commits (PostgreSQL's commits are
//! durable when they return). A database the store creates has 4 KiB pages (as
//! SQLite's default; one created with 16 KiB pages keeps them): a commit of one
//! run writes each page it changes whole into the WAL, and most commits are
//! small. The WAL is checkpointed into the database once it holds 32 MiB
//! (`CHECKPOINT_WAL_BYTES`, turned into pages from the database's page size;
//! the writer's checkpoints run on a blocking thread, see `direct.rs`) rather
//! than SQLite's default of 1,000 pages: a group
//! writes hundreds of pages, many of them the same index pages group after group,
//! and a longer WAL copies each of those once per checkpoint instead of once per
//! group. A group holds at most 256 commits on SQLite and 1,024 on PostgreSQL
//! (`MAX_GROUP_SQLITE`, `MAX_GROUP_POSTGRES` in `writer.rs`). A commit the group
//! refuses (unknown run, run ended, seq conflict) is checked before anything is
//! written and fails alone; if a group's transaction fails, every commit of the
//! group is written again alone, each in its own transaction, so each caller gets
//! its own outcome. The writer's connection has a page cache of 8 MiB (a group's
//! index pages stay in memory; `direct.rs` says why not more); each reader's is
//! 8 MiB too, so that large values read back (a long final output) are not held
//! by every connection. SQLite's
//! connections are not pinged before use (a local file cannot go stale). By
//! default all of them use SQLite's `unix-excl` VFS (`SqliteFile::Exclusive`): the
//! process holds the database file locked while the store is open (it owns the
//! store alone anyway, see `Owner`) and keeps the WAL index in its memory, so a
//! transaction takes its locks without system calls; `SqliteFile::Shared` leaves
//! the file open to other programs (a backup, a replication tool).

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteAutoVacuum, SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use troupe_actors::protocol::{Plan, RunEvent, RunId, ThreadId, Usage};
use troupe_actors::store::{
    Commit, Idempotency, Metadata, RunQuery, RunRecord, RunSnapshot, RunStore, StoreError, ThreadQuery, ThreadRecord,
    ThreadStore, ThreadSummary,
};

pub use crate::store::cluster::{ClusterOptions, Node};
use crate::store::direct::Direct;
use crate::store::encode::{read_batch, stamp};
use crate::store::group::Job;
pub use crate::store::sql::SqliteFile;
use crate::store::sql::{Columns, Pool, Readers, backend, parse, time};
use crate::store::writer::{Backend, Writer};

mod binding;
pub mod cluster;
mod direct;
mod encode;
pub(crate) use encode::event_json;
mod group;
mod read;
mod recent;
pub(crate) use recent::write_json as recent_event_json;
pub mod retention;
mod sql;
mod wal_vfs;
mod writer;

/// Migrations, in order, per backend.
const SQLITE_MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../../migrations/sqlite/0001_runs.sql")),
    (2, include_str!("../../migrations/sqlite/0002_run_counters.sql")),
    (3, include_str!("../../migrations/sqlite/0003_deferred_run_keys.sql")),
    (4, include_str!("../../migrations/sqlite/0004_event_batches.sql")),
    (5, include_str!("../../migrations/sqlite/0005_ended_at.sql")),
    (6, include_str!("../../migrations/sqlite/0006_progress_on_commits.sql")),
    (7, include_str!("../../migrations/sqlite/0007_run_keys.sql")),
    (8, include_str!("../../migrations/sqlite/0008_threads.sql")),
    (9, include_str!("../../migrations/sqlite/0009_traceparent.sql")),
];
const POSTGRES_MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../../migrations/postgres/0001_runs.sql")),
    (2, include_str!("../../migrations/postgres/0002_run_counters.sql")),
    (3, include_str!("../../migrations/postgres/0003_deferred_run_keys.sql")),
    (4, include_str!("../../migrations/postgres/0004_event_batches.sql")),
    (5, include_str!("../../migrations/postgres/0005_ended_at.sql")),
    (6, include_str!("../../migrations/postgres/0006_progress_on_commits.sql")),
    (7, include_str!("../../migrations/postgres/0007_run_keys.sql")),
    (8, include_str!("../../migrations/postgres/0008_threads.sql")),
    (9, include_str!("../../migrations/postgres/0009_traceparent.sql")),
    (10, include_str!("../../migrations/postgres/0010_cluster.sql")),
];

/// The page size of a SQLite database the store creates.
const PAGE_SIZE: u32 = 4 * 1024;

/// The size of WAL at which SQLite copies it back into the database (a checkpoint).
const CHECKPOINT_WAL_BYTES: i64 = 32 * 1024 * 1024;

/// Sets a SQLite connection to checkpoint once the WAL holds [`CHECKPOINT_WAL_BYTES`]
/// (the setting counts pages, whose size depends on the database) instead of 1,000
/// pages: a group commit writes hundreds of pages, so the default copied every
/// group's pages back at once; a longer WAL copies a page rewritten by many groups
/// (the index pages of running runs) once per checkpoint.
async fn checkpoint_at_wal_size(connection: &mut sqlx::SqliteConnection) -> Result<(), sqlx::Error> {
    let page_size: i64 = sqlx::query_scalar("PRAGMA page_size").fetch_one(&mut *connection).await?;
    // A pragma's value cannot be bound; this one is a number computed here.
    let pages = CHECKPOINT_WAL_BYTES / page_size.max(512);
    let sql = format!("PRAGMA wal_autocheckpoint = {pages}");
    sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&mut *connection).await?;
    Ok(())
}

/// Runs the same code against either backend: `$pool` is the backend's pool and
/// `$postgres` tells which one it is.
macro_rules! with_pool {
    ($store:expr, |$pool:ident, $postgres:ident| $body:expr) => {
        match &$store.pool {
            Pool::Sqlite($pool, _) => {
                let $postgres = false;
                $body
            }
            Pool::Postgres($pool) => {
                let $postgres = true;
                $body
            }
        }
    };
}

/// A run store on SQLite or PostgreSQL.
#[derive(Clone)]
pub struct SqlStore {
    pool: Pool,
    /// Every write (run creations and commits) goes through the one writer task.
    writer: Writer,
    /// This process's claim on the store, held while any clone lives: exclusive,
    /// or shared by the nodes of a cluster.
    _owner: Arc<Owner>,
    /// This process as a node of a cluster (PostgreSQL only).
    node: Option<Arc<Node>>,
    /// Cancelled when the node lost its lease.
    lost: tokio_util::sync::CancellationToken,
    /// Stops the node's heartbeat once the last clone is dropped.
    _heartbeat: Arc<HeartbeatGuard>,
}

/// Cancels its token when dropped.
struct HeartbeatGuard(tokio_util::sync::CancellationToken);

impl HeartbeatGuard {
    fn token(&self) -> tokio_util::sync::CancellationToken {
        self.0.clone()
    }
}

impl Drop for HeartbeatGuard {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// What the daemon needs of a store it shares with other nodes.
#[derive(Clone)]
pub struct Membership {
    /// This node.
    pub node: Arc<Node>,
    /// The store's pool (claims, notifications, leaving).
    pub pool: sqlx::PgPool,
    /// Cancelled when the node lost its lease: it must stop.
    pub lost: tokio_util::sync::CancellationToken,
}

/// What makes a process the only one driving a store's runs: every process
/// resumes every unfinished run, so two on one store would run the same runs (and
/// their side effects) twice. SQLite: an OS lock on `PATH.lock`; PostgreSQL: a
/// session advisory lock. Both vanish with the process, also on `kill -9`.
#[allow(dead_code)]
enum Owner {
    File(std::fs::File),
    Postgres(std::sync::Mutex<sqlx::pool::PoolConnection<sqlx::Postgres>>),
}

/// The advisory lock key of a troupe store ("troupe" in ASCII).
const OWNER_LOCK: i64 = 0x74_72_6f_75_70_65;
/// The advisory lock key taken while migrating ("troupeM").
const MIGRATION_LOCK: i64 = 0x74_72_6f_75_70_65_4d;

/// Whether a SQLite URL names an in-memory database (`sqlite::memory:`,
/// `mode=memory`), which a store cannot be.
pub fn in_memory(url: &str) -> bool {
    let rest = url.trim_start_matches("sqlite:").trim_start_matches("//");
    let (database, params) = rest.split_once('?').unwrap_or((rest, ""));
    database == ":memory:" || params.split('&').any(|param| param == "mode=memory")
}

fn already_owned(what: &str) -> StoreError {
    StoreError::Backend(format!(
        "another troupe process is using {what}; one process drives a store at a time (stop it, or use another store; \
         several daemons share a PostgreSQL store only with [cluster] enabled on each)"
    ))
}

impl SqlStore {
    /// Hands `job` (which encodes `events`) to the writer; once it is committed,
    /// its events' text is kept for the streams that send them next ([`recent`]).
    async fn write(&self, run_id: RunId, events: &[RunEvent], mut job: Job) -> Result<(), StoreError> {
        let text = job.take_events();
        self.writer.write(job).await?;
        if let Some((body, spans)) = text {
            recent::remember(run_id, events, &body, &spans);
        }
        Ok(())
    }

    /// Connects to `url` (`sqlite://PATH` or `postgres://…`) and applies the
    /// migrations. A SQLite file and its folder are created if missing.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::open(url, None, SqliteFile::default()).await
    }

    /// As [`SqlStore::connect`], with a SQLite file shared with other programs
    /// as `file` says (PostgreSQL ignores it).
    pub async fn connect_with(url: &str, file: SqliteFile) -> Result<Self, StoreError> {
        Self::open(url, None, file).await
    }

    /// Connects to the PostgreSQL store at `url` as a node of a cluster: other
    /// daemons may use it at the same time, each driving the runs it owns (see
    /// `cluster.rs`). The node joins with a lease, renewed every `heartbeat`
    /// until the store is dropped; [`SqlStore::membership`] tells when it is lost.
    pub async fn connect_cluster(url: &str, options: &ClusterOptions, heartbeat: Duration) -> Result<Self, StoreError> {
        if !(url.starts_with("postgres:") || url.starts_with("postgresql:")) {
            return Err(StoreError::Backend(
                "a cluster needs a PostgreSQL store (cluster.enabled with a SQLite store): SQLite is single-node"
                    .to_owned(),
            ));
        }
        let store = Self::open(url, Some(options), SqliteFile::default()).await?;
        if let (Some(node), Pool::Postgres(pool)) = (&store.node, &store.pool) {
            node.join(pool).await?;
            let dropped = store._heartbeat.token();
            tokio::spawn(cluster::heartbeat(node.clone(), pool.clone(), heartbeat, store.lost.clone(), dropped));
        }
        Ok(store)
    }

    /// This node of a cluster, if the store was opened as one.
    pub fn membership(&self) -> Option<Membership> {
        let (Some(node), Pool::Postgres(pool)) = (&self.node, &self.pool) else { return None };
        Some(Membership { node: node.clone(), pool: pool.clone(), lost: self.lost.clone() })
    }

    async fn open(url: &str, cluster: Option<&ClusterOptions>, file: SqliteFile) -> Result<Self, StoreError> {
        // The writer has a connection of its own: every group runs on the same
        // connection, so its statements stay prepared (a shared pool hands out its
        // connections in turn, each preparing every shape again), and reads never
        // wait behind a group's transaction for a connection.
        let (pool, writer, owner) = if url.starts_with("sqlite:") {
            if in_memory(url) {
                return Err(StoreError::Backend(format!(
                    "{url:?} is an in-memory SQLite database, which a store cannot be: its runs must outlive the \
                     process; use sqlite://PATH (a file)"
                )));
            }
            let options = SqliteConnectOptions::from_str(url)
                .map_err(backend)?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                // WAL + NORMAL survives process crashes (what kill -9 tests prove);
                // a power loss may roll back the last commits.
                .synchronous(SqliteSynchronous::Normal)
                .busy_timeout(Duration::from_secs(10))
                // Readers keep a page cache of 8 MiB each: what they read was just
                // written (the operating system's cache has it), and large replies
                // read back (final outputs, events) would otherwise stay held by
                // every one. (The writer's connection is configured in `direct.rs`.)
                .pragma("cache_size", "-8192")
                .pragma("temp_store", "memory")
                // Pages of 4 KiB (for a database this creates; an existing one
                // keeps its own): the WAL takes each page a commit changes whole,
                // and most commits are of one run, a few rows. With 16 KiB pages a
                // run with one client cost 15 % more CPU a turn (BENCHMARKS.md).
                .page_size(PAGE_SIZE)
                // A database this creates can give deleted rows' pages back
                // (`compact`, after retention); an existing one keeps its mode.
                .auto_vacuum(SqliteAutoVacuum::Incremental)
                .foreign_keys(true)
                .vfs(file.vfs());
            if let Some(parent) = options.get_filename().parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)
                    .map_err(|error| StoreError::Backend(format!("cannot create {}: {error}", parent.display())))?;
            }
            let lock_path = format!("{}.lock", options.get_filename().display());
            let lock = std::fs::File::create(&lock_path)
                .map_err(|error| StoreError::Backend(format!("cannot create {lock_path}: {error}")))?;
            if lock.try_lock().is_err() {
                return Err(already_owned(&options.get_filename().display().to_string()));
            }
            let pool = SqlitePoolOptions::new()
                .max_connections(4)
                // A connection to a local file cannot go stale: no ping (a round
                // trip to its thread) before each use.
                .test_before_acquire(false)
                .acquire_timeout(Duration::from_secs(10));
            let pool = pool.after_connect(|connection, _| Box::pin(checkpoint_at_wal_size(connection)));
            // Connecting opens a connection, which creates the database with the
            // settings above before the writer opens it.
            let pool = pool.connect_with(options.clone()).await.map_err(backend)?;
            let writer = Direct::open(options.get_filename(), file, CHECKPOINT_WAL_BYTES)?;
            let readers = Arc::new(Readers::new(options.get_filename(), file));
            (Pool::Sqlite(pool, readers), Backend::Sqlite(Box::new(writer)), Owner::File(lock))
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            // One plain connection first: a server that is down or refuses us fails
            // at once with its own reason, not with a pool timeout.
            let probe = <sqlx::PgConnection as sqlx::Connection>::connect(url).await.map_err(backend)?;
            sqlx::Connection::close(probe).await.map_err(backend)?;
            let pool = PgPoolOptions::new().max_connections(16).acquire_timeout(Duration::from_secs(10));
            let pool = pool.connect(url).await.map_err(backend)?;
            let mut owner = pool.acquire().await.map_err(backend)?;
            // A single process takes the lock alone; the nodes of a cluster share it.
            let lock = if cluster.is_some() {
                "SELECT pg_try_advisory_lock_shared($1)"
            } else {
                "SELECT pg_try_advisory_lock($1)"
            };
            let owned: bool =
                sqlx::query_scalar(lock).bind(OWNER_LOCK).fetch_one(&mut *owner).await.map_err(backend)?;
            if !owned && cluster.is_some() {
                return Err(StoreError::Backend(
                    "a troupe process without [cluster] drives this PostgreSQL database alone; stop it, or enable \
                     cluster on it too"
                        .to_owned(),
                ));
            }
            if !owned {
                return Err(already_owned("this PostgreSQL database"));
            }
            let writer = PgPoolOptions::new().max_connections(1).acquire_timeout(Duration::from_secs(10));
            let writer = writer.connect(url).await.map_err(backend)?;
            (Pool::Postgres(pool), Backend::Postgres(writer), Owner::Postgres(std::sync::Mutex::new(owner)))
        } else {
            return Err(StoreError::Backend(format!("unsupported store URL {url:?}: use sqlite://… or postgres://…")));
        };
        let node = match (&pool, cluster) {
            (Pool::Postgres(_), Some(options)) => Some(Arc::new(Node::new(options))),
            _ => None,
        };
        let store = Self {
            writer: Writer::spawn(writer, node.clone()),
            pool,
            _owner: Arc::new(owner),
            node,
            lost: tokio_util::sync::CancellationToken::new(),
            _heartbeat: Arc::new(HeartbeatGuard(tokio_util::sync::CancellationToken::new())),
        };
        store.migrate().await?;
        Ok(store)
    }

    /// Whether the database answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        with_pool!(self, |pool, _postgres| sqlx::query("SELECT 1").execute(pool).await.map(drop).map_err(backend))
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let migrations = match self.pool {
            Pool::Sqlite(..) => SQLITE_MIGRATIONS,
            Pool::Postgres(_) => POSTGRES_MIGRATIONS,
        };
        with_pool!(self, |pool, postgres| {
            // Nodes of a cluster may start together: each step of migrating runs in
            // a transaction under one advisory lock, so one node creates the table
            // and migrates while the others wait (`CREATE TABLE IF NOT EXISTS` is
            // not safe against a concurrent one).
            macro_rules! locked {
                () => {{
                    let mut tx = pool.begin().await.map_err(backend)?;
                    if postgres {
                        sqlx::query("SELECT pg_advisory_xact_lock($1)")
                            .bind(MIGRATION_LOCK)
                            .execute(&mut *tx)
                            .await
                            .map_err(backend)?;
                    }
                    tx
                }};
            }
            let mut tx = locked!();
            sqlx::query(
                "CREATE TABLE IF NOT EXISTS troupe_migrations (version BIGINT PRIMARY KEY, applied_at TEXT NOT NULL)",
            )
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
            tx.commit().await.map_err(backend)?;
            // A database a newer troupe migrated has tables this build would write
            // wrongly (or not at all): refuse it before touching anything.
            let newest: Option<i64> = sqlx::query_scalar("SELECT MAX(version) FROM troupe_migrations")
                .fetch_one(pool)
                .await
                .map_err(backend)?;
            let known = migrations.last().map_or(0, |(version, _)| *version);
            if let Some(newest) = newest.filter(|newest| *newest > known) {
                return Err(StoreError::Backend(format!(
                    "this store has schema version {newest}, newer than this build of troupe knows ({known}): \
                     use the troupe that wrote it, or a newer one"
                )));
            }
            for (version, sql) in migrations {
                let mut tx = locked!();
                let done: Option<i64> = sqlx::query_scalar("SELECT version FROM troupe_migrations WHERE version = $1")
                    .bind(*version)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(backend)?;
                if done.is_none() {
                    sqlx::raw_sql(*sql).execute(&mut *tx).await.map_err(backend)?;
                    sqlx::query("INSERT INTO troupe_migrations (version, applied_at) VALUES ($1, $2)")
                        .bind(*version)
                        .bind(stamp(Utc::now()))
                        .execute(&mut *tx)
                        .await
                        .map_err(backend)?;
                }
                tx.commit().await.map_err(backend)?;
            }
            Ok(())
        })
    }
}

/// The columns of a `runs` row, decoded.
fn run_from_row(row: &impl Columns) -> Result<RunRecord, StoreError> {
    let bad_id = |_| StoreError::Backend("bad stored run id".to_owned());
    let parent_run_id = match row.optional("parent_run_id")? {
        Some(id) => Some(id.parse().map_err(bad_id)?),
        None => None,
    };
    Ok(RunRecord {
        run_id: row.text("run_id")?.parse().map_err(bad_id)?,
        tenant: row.text("tenant")?,
        parent_run_id,
        agent: row.text("agent")?,
        input: row.text("input")?,
        limits: parse(&row.text("limits")?)?,
        status: parse(&format!("\"{}\"", row.text("status")?))?,
        reason: row.optional("reason")?,
        turn: u32::try_from(row.int("turn")?).unwrap_or(0),
        usage: parse(&row.text("usage")?)?,
        final_output: row.optional("final_output")?,
        created_at: time(&row.text("created_at")?)?,
        updated_at: time(&row.text("updated_at")?)?,
        thread_id: row.optional("thread_id")?.map(|id| id.parse()).transpose().map_err(|_| bad_thread_id())?,
        metadata: metadata_from(row.optional("metadata")?)?,
        idempotency: idempotency_from(row)?,
        traceparent: row.optional("traceparent")?,
    })
}

fn bad_thread_id() -> StoreError {
    StoreError::Backend("bad stored thread id".to_owned())
}

fn metadata_from(text: Option<String>) -> Result<Metadata, StoreError> {
    text.map(|text| parse(&text)).transpose().map(Option::unwrap_or_default)
}

/// The idempotency key a run or thread row was created under, if any.
fn idempotency_from(row: &impl Columns) -> Result<Option<Idempotency>, StoreError> {
    Ok(match (row.optional("idempotency_key")?, row.optional("request_fingerprint")?) {
        (Some(key), Some(fingerprint)) => Some(Idempotency { key, fingerprint }),
        _ => None,
    })
}

/// The columns of a `threads` row, decoded.
fn thread_from_row(row: &impl Columns) -> Result<ThreadRecord, StoreError> {
    Ok(ThreadRecord {
        thread_id: row.text("thread_id")?.parse().map_err(|_| bad_thread_id())?,
        tenant: row.text("tenant")?,
        agent: row.text("agent")?,
        metadata: metadata_from(row.optional("metadata")?)?,
        created_at: time(&row.text("created_at")?)?,
        updated_at: time(&row.text("updated_at")?)?,
        idempotency: idempotency_from(row)?,
        summary: match (row.optional("summary")?, row.optional("summary_through")?) {
            (Some(text), Some(through)) => Some(ThreadSummary {
                text,
                through: through.parse().map_err(|_| StoreError::Backend("bad stored run id".to_owned()))?,
            }),
            _ => None,
        },
    })
}

const RUN_COLUMNS: &str = "run_id, tenant, parent_run_id, agent, input, limits, status, reason, turn, usage, \
                           final_output, created_at, updated_at, thread_id, metadata, idempotency_key, \
                           request_fingerprint, traceparent";

const THREAD_COLUMNS: &str = "thread_id, tenant, agent, metadata, idempotency_key, request_fingerprint, summary, summary_through, created_at, \
     updated_at";

#[async_trait]
impl RunStore for SqlStore {
    async fn create_run(&self, run: RunRecord, events: Vec<RunEvent>) -> Result<(), StoreError> {
        self.write(run.run_id, &events, Job::create(&run, &events)?).await
    }

    async fn commit(&self, commit: &Commit) -> Result<(), StoreError> {
        self.write(commit.run_id, &commit.events, Job::commit(commit)?).await
    }

    async fn get_run(&self, run_id: RunId) -> Result<Option<RunRecord>, StoreError> {
        let id = run_id.to_string();
        let sql = format!("SELECT {RUN_COLUMNS} FROM runs_now WHERE run_id = $1");
        match &self.pool {
            // SQLite reads `$N` as a parameter named so.
            Pool::Sqlite(_, readers) => readers
                .read(|connection| {
                    let mut statement = connection.prepare_cached(&sql)?;
                    let mut rows = statement.query(rusqlite::named_params! {"$1": id})?;
                    Ok(rows.next()?.map(run_from_row))
                })?
                .transpose(),
            Pool::Postgres(pool) => {
                let row =
                    sqlx::query(sqlx::AssertSqlSafe(sql)).bind(&id).fetch_optional(pool).await.map_err(backend)?;
                row.as_ref().map(run_from_row).transpose()
            }
        }
    }

    async fn load(&self, run_id: RunId) -> Result<Option<RunSnapshot>, StoreError> {
        let id = run_id.to_string();
        with_pool!(self, |pool, postgres| {
            // One consistent view for every table read (SQLite's read transaction is one).
            let mut tx = if postgres {
                pool.begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY").await
            } else {
                pool.begin().await
            }
            .map_err(backend)?;
            let sql =
                sqlx::AssertSqlSafe(format!("SELECT {RUN_COLUMNS}, run_key, last_seq FROM runs_now WHERE run_id = $1"));
            let Some(row) = sqlx::query(sql).bind(&id).fetch_optional(&mut *tx).await.map_err(backend)? else {
                return Ok(None);
            };
            let run = run_from_row(&row)?;
            let (key, last_seq) = (row.int("run_key")?, row.int("last_seq")?);
            // Every child row in one statement (one round trip instead of five), by part.
            let rows: Vec<(i64, String)> = sqlx::query_as(
                "SELECT CAST(1 AS BIGINT) AS part, idx AS ord, body FROM messages WHERE run_key = $1 \
                 UNION ALL SELECT 2, version, body FROM plans WHERE run_key = $1 \
                 AND version = (SELECT MAX(version) FROM plans WHERE run_key = $1) \
                 UNION ALL SELECT 3, idx, body FROM tool_executions WHERE run_key = $1 \
                 UNION ALL SELECT 4, turn, body FROM reviews WHERE run_key = $1 \
                 UNION ALL SELECT 5, idx, body FROM documents WHERE run_key = $1 \
                 ORDER BY part, ord",
            )
            .bind(key)
            .fetch_all(&mut *tx)
            .await
            .map_err(backend)?
            .into_iter()
            .map(|(part, _ord, body): (i64, i64, String)| (part, body))
            .collect();
            let part = |wanted: i64| rows.iter().filter(move |(part, _)| *part == wanted).map(|(_, body)| body);
            let messages = part(1).map(|body| parse(body)).collect::<Result<_, _>>()?;
            let plan: Plan = part(2).next().map(|body| parse(body)).transpose()?.unwrap_or_default();
            let tool_executions = part(3).map(|body| parse(body)).collect::<Result<_, _>>()?;
            let reviews = part(4).map(|body| parse(body)).collect::<Result<_, _>>()?;
            let documents = part(5).map(|body| parse(body)).collect::<Result<_, _>>()?;
            tx.commit().await.map_err(backend)?;
            Ok(Some(RunSnapshot {
                run,
                messages,
                plan,
                tool_executions,
                reviews,
                documents,
                last_seq: last_seq as u64,
            }))
        })
    }

    async fn events_after(&self, run_id: RunId, after: u64, limit: usize) -> Result<Vec<RunEvent>, StoreError> {
        match self.tenant_and_events_after(run_id, after, limit).await? {
            Some((_, events)) => Ok(events),
            None => Err(StoreError::NotFound(run_id)),
        }
    }

    async fn tenant_and_events_after(
        &self,
        run_id: RunId,
        after: u64,
        limit: usize,
    ) -> Result<Option<(String, Vec<RunEvent>)>, StoreError> {
        let id = run_id.to_string();
        // One query: a run with nothing after `after` gives one row with no body,
        // an unknown run none. A row of `run_events` holds the events of one
        // commit (at least one): `limit` rows from the one holding `after + 1`
        // hold at least `limit` events after it. (SQLite reads `$N` as a parameter
        // named so.)
        const SQL: &str = "SELECT runs.tenant, run_events.body FROM runs LEFT JOIN run_events \
                           ON run_events.run_key = runs.run_key AND run_events.last_seq > $2 \
                           WHERE runs.run_id = $1 ORDER BY run_events.last_seq LIMIT $3";
        let (after_key, limit_key) = (after as i64, limit.clamp(1, i64::MAX as usize) as i64);
        let rows: Vec<(String, Option<String>)> = match &self.pool {
            Pool::Sqlite(_, readers) => readers.read(|connection| {
                let mut statement = connection.prepare_cached(SQL)?;
                let values = rusqlite::named_params! {"$1": id, "$2": after_key, "$3": limit_key};
                let rows = statement.query_map(values, |row| Ok((row.get(0)?, row.get(1)?)))?;
                rows.collect()
            })?,
            Pool::Postgres(pool) => {
                sqlx::query_as(SQL).bind(&id).bind(after_key).bind(limit_key).fetch_all(pool).await.map_err(backend)?
            }
        };
        let mut rows = rows.into_iter();
        let Some((tenant, first)) = rows.next() else { return Ok(None) };
        let mut events = Vec::new();
        for body in std::iter::once(first).chain(rows.map(|(_, body)| body)).flatten() {
            events.extend(read_batch(&body, run_id)?.into_iter().filter(|event| event.seq > after));
        }
        events.truncate(limit);
        Ok(Some((tenant, events)))
    }

    async fn list_runs(&self, query: RunQuery) -> Result<Vec<RunRecord>, StoreError> {
        with_pool!(self, |pool, postgres| {
            let mut sql = format!(
                "SELECT {RUN_COLUMNS} FROM runs_now WHERE ($1 IS NULL OR tenant = $1) AND ($2 IS NULL OR status = $2) \
                 AND ($4 IS NULL OR run_id < $4)"
            );
            // A thread's runs are read through its index (`$5 IS NULL OR …` would
            // scan every run).
            if query.thread_id.is_some() {
                sql.push_str(" AND thread_id = $5");
            } else {
                sql.push_str(" AND $5 IS NULL");
            }
            // Each metadata filter: a key (checked by `filterable_key`, and bound)
            // with the string value it must have (not a number or boolean written
            // the same: SQLite compares a string only with a string).
            for index in 0..query.metadata.len() {
                let (key, value) = (6 + 2 * index, 7 + 2 * index);
                if postgres {
                    sql.push_str(&format!(
                        " AND jsonb_typeof(metadata::jsonb -> ${key}) = 'string' AND (metadata::jsonb ->> ${key}) = ${value}"
                    ));
                } else {
                    sql.push_str(&format!(" AND json_extract(metadata, ${key}) = ${value}"));
                }
            }
            sql.push_str(" ORDER BY run_id DESC LIMIT $3");
            // Run ids are UUIDv7: by their text, newest last, as by their bytes.
            let mut select = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(query.tenant.clone())
                .bind(query.status.map(|status| status.as_str().to_owned()))
                .bind(query.limit.min(i64::MAX as usize) as i64)
                .bind(query.after.map(|after| after.to_string()))
                .bind(query.thread_id.map(|thread| thread.to_string()));
            for (key, value) in &query.metadata {
                let key = if postgres { key.clone() } else { format!("$.\"{key}\"") };
                select = select.bind(key).bind(value.clone());
            }
            let rows = select.fetch_all(pool).await.map_err(backend)?;
            rows.iter().map(run_from_row).collect()
        })
    }

    async fn unfinished_runs(&self) -> Result<Vec<RunId>, StoreError> {
        if let (Some(node), Pool::Postgres(pool)) = (&self.node, &self.pool) {
            // In a cluster, the unfinished runs this node may drive are those it claims.
            return node.claim(pool).await;
        }
        with_pool!(self, |pool, _postgres| {
            let ids: Vec<String> = sqlx::query_scalar(
                "SELECT run_id FROM runs WHERE status NOT IN ('succeeded', 'failed', 'cancelled') ORDER BY run_id",
            )
            .fetch_all(pool)
            .await
            .map_err(backend)?;
            ids.iter().map(|id| id.parse().map_err(|_| StoreError::Backend("bad stored run id".to_owned()))).collect()
        })
    }

    async fn release(&self, run_id: RunId) -> Result<(), StoreError> {
        match (&self.node, &self.pool) {
            (Some(node), Pool::Postgres(pool)) => node.release(pool, run_id).await,
            // One process drives the store: its next start resumes the run.
            _ => Ok(()),
        }
    }

    async fn tenant_usage(&self, tenant: &str, since: DateTime<Utc>) -> Result<Usage, StoreError> {
        // Run ids are UUIDv7, so "created at or after `since`" is a range of the
        // (tenant, run_id) index: from the lowest id of that millisecond.
        let millis = u64::try_from(since.timestamp_millis()).unwrap_or(0);
        let first = format!("{:08x}-{:04x}-7000-8000-000000000000", millis >> 16, millis & 0xffff);
        with_pool!(self, |pool, _postgres| {
            let rows: Vec<String> = sqlx::query_scalar(
                "SELECT usage FROM runs_now WHERE tenant = $1 AND run_id >= $2 AND parent_run_id IS NULL",
            )
            .bind(tenant)
            .bind(&first)
            .fetch_all(pool)
            .await
            .map_err(backend)?;
            let mut total = Usage::default();
            for text in rows {
                total.add(&parse::<Usage>(&text)?);
            }
            Ok(total)
        })
    }

    async fn delete_finished(&self, before: DateTime<Utc>, limit: usize) -> Result<usize, StoreError> {
        with_pool!(self, |pool, _postgres| {
            // A thread ages as a whole: its runs go once the newest has ended
            // before `before` (a long conversation keeps its first messages while
            // it goes on), then the thread itself.
            let deleted = sqlx::query(
                "DELETE FROM runs WHERE run_id IN \
                 (SELECT r.run_id FROM runs r WHERE r.ended_at < $1 AND (r.thread_id IS NULL OR NOT EXISTS \
                 (SELECT 1 FROM runs t WHERE t.thread_id = r.thread_id AND (t.ended_at IS NULL OR t.ended_at >= $1))) \
                 ORDER BY r.ended_at LIMIT $2)",
            )
            .bind(stamp(before))
            .bind(limit.min(i64::MAX as usize) as i64)
            .execute(pool)
            .await
            .map_err(backend)?;
            sqlx::query(
                "DELETE FROM threads WHERE updated_at < $1 \
                 AND NOT EXISTS (SELECT 1 FROM runs WHERE runs.thread_id = threads.thread_id)",
            )
            .bind(stamp(before))
            .execute(pool)
            .await
            .map_err(backend)?;
            Ok(deleted.rows_affected() as usize)
        })
    }

    async fn compact(&self) -> Result<Option<u64>, StoreError> {
        let bytes: i64 = match &self.pool {
            Pool::Sqlite(pool, _) => {
                // Frees the pages of deleted rows (a database made with
                // auto_vacuum = incremental; one made before keeps reusing them).
                sqlx::query("PRAGMA incremental_vacuum").execute(pool).await.map_err(backend)?;
                sqlx::query_scalar("SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()")
                    .fetch_one(pool)
                    .await
                    .map_err(backend)?
            }
            Pool::Postgres(pool) => sqlx::query_scalar("SELECT pg_database_size(current_database())")
                .fetch_one(pool)
                .await
                .map_err(backend)?,
        };
        Ok(u64::try_from(bytes).ok())
    }

    async fn delete_ended(&self, run_id: RunId) -> Result<bool, StoreError> {
        let id = run_id.to_string();
        with_pool!(self, |pool, _postgres| {
            // Its children go with it (ON DELETE CASCADE). Only an ended run: the
            // writer never writes to one again, so nothing it holds goes stale.
            let deleted =
                sqlx::query("DELETE FROM runs WHERE run_id = $1 AND status IN ('succeeded', 'failed', 'cancelled')")
                    .bind(&id)
                    .execute(pool)
                    .await
                    .map_err(backend)?;
            if deleted.rows_affected() > 0 {
                return Ok(true);
            }
            let stored: Option<i64> = sqlx::query_scalar("SELECT run_key FROM runs WHERE run_id = $1")
                .bind(&id)
                .fetch_optional(pool)
                .await
                .map_err(backend)?;
            match stored {
                Some(_) => Ok(false),
                None => Err(StoreError::NotFound(run_id)),
            }
        })
    }

    fn threads(&self) -> &dyn ThreadStore {
        self
    }
}

#[async_trait]
impl ThreadStore for SqlStore {
    async fn run_by_idempotency_key(
        &self,
        tenant: &str,
        key: &str,
        since: DateTime<Utc>,
    ) -> Result<Option<(RunRecord, String)>, StoreError> {
        with_pool!(self, |pool, _postgres| {
            let sql = sqlx::AssertSqlSafe(format!(
                "SELECT {RUN_COLUMNS} FROM runs_now WHERE tenant = $1 AND idempotency_key = $2 AND created_at >= $3 \
                 ORDER BY run_id DESC LIMIT 1"
            ));
            let row = sqlx::query(sql).bind(tenant).bind(key).bind(stamp(since)).fetch_optional(pool).await;
            let Some(row) = row.map_err(backend)? else { return Ok(None) };
            let run = run_from_row(&row)?;
            let fingerprint = run.idempotency.as_ref().map(|idempotency| idempotency.fingerprint.clone());
            Ok(fingerprint.map(|fingerprint| (run, fingerprint)))
        })
    }

    async fn create_thread(&self, thread: ThreadRecord) -> Result<(), StoreError> {
        let metadata = if thread.metadata.is_empty() { None } else { Some(encode::json(&thread.metadata)?) };
        let idempotency = thread.idempotency.as_ref();
        with_pool!(self, |pool, _postgres| {
            sqlx::query(
                "INSERT INTO threads (thread_id, tenant, agent, metadata, idempotency_key, request_fingerprint, \
                 created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind(thread.thread_id.to_string())
            .bind(&thread.tenant)
            .bind(&thread.agent)
            .bind(metadata.clone())
            .bind(idempotency.map(|idempotency| idempotency.key.clone()))
            .bind(idempotency.map(|idempotency| idempotency.fingerprint.clone()))
            .bind(stamp(thread.created_at))
            .bind(stamp(thread.updated_at))
            .execute(pool)
            .await
            .map(drop)
            .map_err(backend)
        })
    }

    async fn get_thread(&self, thread_id: ThreadId) -> Result<Option<ThreadRecord>, StoreError> {
        with_pool!(self, |pool, _postgres| {
            let sql = sqlx::AssertSqlSafe(format!("SELECT {THREAD_COLUMNS} FROM threads WHERE thread_id = $1"));
            let row = sqlx::query(sql).bind(thread_id.to_string()).fetch_optional(pool).await.map_err(backend)?;
            row.as_ref().map(thread_from_row).transpose()
        })
    }

    async fn thread_by_idempotency_key(
        &self,
        tenant: &str,
        key: &str,
        since: DateTime<Utc>,
    ) -> Result<Option<(ThreadRecord, String)>, StoreError> {
        with_pool!(self, |pool, _postgres| {
            let sql = sqlx::AssertSqlSafe(format!(
                "SELECT {THREAD_COLUMNS} FROM threads WHERE tenant = $1 AND idempotency_key = $2 AND created_at >= $3 \
                 ORDER BY thread_id DESC LIMIT 1"
            ));
            let row = sqlx::query(sql).bind(tenant).bind(key).bind(stamp(since)).fetch_optional(pool).await;
            let Some(row) = row.map_err(backend)? else { return Ok(None) };
            let thread = thread_from_row(&row)?;
            let fingerprint = thread.idempotency.as_ref().map(|idempotency| idempotency.fingerprint.clone());
            Ok(fingerprint.map(|fingerprint| (thread, fingerprint)))
        })
    }

    async fn list_threads(&self, query: ThreadQuery) -> Result<Vec<ThreadRecord>, StoreError> {
        with_pool!(self, |pool, _postgres| {
            let sql = sqlx::AssertSqlSafe(format!(
                "SELECT {THREAD_COLUMNS} FROM threads WHERE ($1 IS NULL OR tenant = $1) \
                 AND ($2 IS NULL OR thread_id < $2) ORDER BY thread_id DESC LIMIT $3"
            ));
            let rows = sqlx::query(sql)
                .bind(query.tenant.clone())
                .bind(query.after.map(|after| after.to_string()))
                .bind(query.limit.min(i64::MAX as usize) as i64)
                .fetch_all(pool)
                .await
                .map_err(backend)?;
            rows.iter().map(thread_from_row).collect()
        })
    }

    async fn update_thread(
        &self,
        thread_id: ThreadId,
        metadata: Metadata,
        now: DateTime<Utc>,
    ) -> Result<Option<ThreadRecord>, StoreError> {
        let encoded = if metadata.is_empty() { None } else { Some(encode::json(&metadata)?) };
        with_pool!(self, |pool, _postgres| {
            sqlx::query("UPDATE threads SET metadata = $2, updated_at = $3 WHERE thread_id = $1")
                .bind(thread_id.to_string())
                .bind(encoded.clone())
                .bind(stamp(now))
                .execute(pool)
                .await
                .map(drop)
                .map_err(backend)
        })?;
        self.get_thread(thread_id).await
    }

    async fn set_thread_summary(&self, thread_id: ThreadId, summary: ThreadSummary) -> Result<bool, StoreError> {
        with_pool!(self, |pool, _postgres| {
            sqlx::query("UPDATE threads SET summary = $2, summary_through = $3 WHERE thread_id = $1")
                .bind(thread_id.to_string())
                .bind(&summary.text)
                .bind(summary.through.to_string())
                .execute(pool)
                .await
                .map(|done| done.rows_affected() > 0)
                .map_err(backend)
        })
    }

    async fn delete_thread(&self, thread_id: ThreadId) -> Result<bool, StoreError> {
        let id = thread_id.to_string();
        with_pool!(self, |pool, postgres| {
            // SQLite: a write transaction from the start (a read one could not
            // become one while the writer writes).
            let mut tx = pool.begin_with(if postgres { "BEGIN" } else { "BEGIN IMMEDIATE" }).await.map_err(backend)?;
            let found: Option<String> = sqlx::query_scalar("SELECT thread_id FROM threads WHERE thread_id = $1")
                .bind(&id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(backend)?;
            if found.is_none() {
                return Err(StoreError::ThreadNotFound(thread_id));
            }
            let unfinished: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM runs WHERE thread_id = $1 AND status NOT IN ('succeeded', 'failed', 'cancelled')",
            )
            .bind(&id)
            .fetch_one(&mut *tx)
            .await
            .map_err(backend)?;
            if unfinished > 0 {
                return Ok(false);
            }
            // The runs' children go with them (ON DELETE CASCADE); the writer holds
            // no ended run.
            sqlx::query("DELETE FROM runs WHERE thread_id = $1").bind(&id).execute(&mut *tx).await.map_err(backend)?;
            sqlx::query("DELETE FROM threads WHERE thread_id = $1")
                .bind(&id)
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
            tx.commit().await.map_err(backend)?;
            Ok(true)
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use sqlx::SqlitePool;

    use super::*;

    /// The page size recorded in a SQLite file's header (bytes 16 and 17).
    fn page_size_on_disk(path: &std::path::Path) -> u32 {
        let header = std::fs::read(path).unwrap();
        u32::from(u16::from_be_bytes([header[16], header[17]]))
    }

    async fn wal_autocheckpoint(pool: &SqlitePool) -> i64 {
        sqlx::query_scalar("PRAGMA wal_autocheckpoint").fetch_one(pool).await.unwrap()
    }

    /// A store the daemon creates has 4 KiB pages; one created before with 16 KiB
    /// pages keeps them; both checkpoint at 32 MiB of WAL, whatever their page size.
    #[tokio::test]
    async fn new_stores_have_small_pages_and_every_store_checkpoints_at_32_mib() {
        let dir = std::env::temp_dir().join(format!("troupe-pages-{}", RunId::new()));
        let (new, old) = (dir.join("new.db"), dir.join("old.db"));
        let store = SqlStore::connect(&format!("sqlite://{}", new.display())).await.unwrap();
        let Pool::Sqlite(pool, _) = &store.pool else { unreachable!() };
        assert_eq!(wal_autocheckpoint(pool).await, 8192);
        drop(store);
        assert_eq!(page_size_on_disk(&new), 4096);

        std::fs::create_dir_all(&dir).unwrap();
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", old.display())).unwrap();
        let options = options.create_if_missing(true).journal_mode(SqliteJournalMode::Wal).page_size(16 * 1024);
        let before = SqlitePool::connect_with(options).await.unwrap();
        sqlx::query("CREATE TABLE made_before (x INTEGER)").execute(&before).await.unwrap();
        before.close().await;
        let store = SqlStore::connect(&format!("sqlite://{}", old.display())).await.unwrap();
        let Pool::Sqlite(pool, _) = &store.pool else { unreachable!() };
        assert_eq!(wal_autocheckpoint(pool).await, 2048);
        drop(store);
        assert_eq!(page_size_on_disk(&old), 16 * 1024);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A stream copies the text of events this store committed; a refused
    /// commit's events are not kept, so a stream never sends what was not stored.
    #[tokio::test]
    async fn only_committed_events_are_kept_for_streams() {
        use troupe_actors::protocol::{EventKind, Limits};
        let dir = std::env::temp_dir().join(format!("troupe-recent-{}", RunId::new()));
        let store = SqlStore::connect(&format!("sqlite://{}", dir.join("t.db").display())).await.unwrap();
        let run_id = RunId::new();
        let event = |seq, text: &str| RunEvent {
            run_id,
            seq,
            ts: chrono::Utc::now(),
            parent_run_id: None,
            kind: EventKind::AssistantDelta { turn: 1, text: text.into(), reasoning: false },
        };
        let run =
            RunRecord::accepted(run_id, "t".into(), "a".into(), "i".into(), Limits::default(), chrono::Utc::now());
        store.create_run(run, vec![event(1, "first")]).await.unwrap();
        let stored = event(2, "say \"hi\"\n");
        store.commit(&Commit { run_id, writes: vec![], events: vec![stored.clone()] }).await.unwrap();
        let refused = event(4, "never stored");
        let outcome = store.commit(&Commit { run_id, writes: vec![], events: vec![refused.clone()] }).await;
        assert!(matches!(outcome, Err(StoreError::SeqConflict { .. })), "{outcome:?}");

        let mut sent = Vec::new();
        assert!(recent::write_json(&mut sent, &stored));
        assert_eq!(String::from_utf8(sent).unwrap(), serde_json::to_string(&stored).unwrap());
        assert!(!recent::write_json(&mut Vec::new(), &refused), "a refused commit's event is not kept");
        drop(store);
        let _ = std::fs::remove_dir_all(dir);
    }
}
