//! The SQL run store: SQLite (the embedded default, a file in the data dir, WAL) or
//! PostgreSQL (production), chosen by URL. One schema, one set of queries (bound
//! parameters only); each backend has its own migration files because their
//! column types differ.
//!
//! A commit is one transaction: one `UPDATE … RETURNING` claims the run, checks it
//! is not over and that the events continue its sequence, and moves `last_seq`;
//! then the state changes and one multi-row insert of the events. On SQLite it
//! begins `IMMEDIATE` (no upgrade deadlocks); on PostgreSQL the update locks the
//! run's row until the commit.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::postgres::{PgPoolOptions, PgRow};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous};
use sqlx::{PgPool, Row, SqlitePool};
use troupe_actors::protocol::{Plan, RunEvent, RunId};
use troupe_actors::store::{
    Commit, RunQuery, RunRecord, RunSnapshot, RunStore, StoreError, StoreWrite, check_sequence,
};

/// Migrations, in order, per backend.
const SQLITE_MIGRATIONS: &[(i64, &str)] = &[(1, include_str!("../../migrations/sqlite/0001_runs.sql"))];
const POSTGRES_MIGRATIONS: &[(i64, &str)] = &[(1, include_str!("../../migrations/postgres/0001_runs.sql"))];

/// Statuses of runs that have ended (what retention may delete).
const TERMINAL: [&str; 3] = ["succeeded", "failed", "cancelled"];

#[derive(Clone)]
enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// Runs the same code against either backend: `$pool` is the backend's pool and
/// `$postgres` tells which one it is.
macro_rules! with_pool {
    ($store:expr, |$pool:ident, $postgres:ident| $body:expr) => {
        match &$store.pool {
            Pool::Sqlite($pool) => {
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

/// Inserts one event into the run's log.
macro_rules! insert_event {
    ($tx:ident, $tenant:expr, $event:expr) => {{
        let event: &RunEvent = $event;
        sqlx::query("INSERT INTO run_events (run_id, seq, tenant, kind, body) VALUES ($1, $2, $3, $4, $5)")
            .bind(event.run_id.to_string())
            .bind(event.seq as i64)
            .bind($tenant)
            .bind(event.kind.name())
            .bind(json(event)?)
            .execute(&mut *$tx)
            .await
            .map_err(backend)?;
    }};
}

/// Applies one state change inside a commit's transaction.
macro_rules! apply {
    ($tx:ident, $id:expr, $tenant:expr, $now:expr, $write:expr) => {{
        let id: &str = $id;
        let query = match $write {
            StoreWrite::Status { status, reason } => {
                sqlx::query("UPDATE runs SET status = $1, reason = $2, updated_at = $3 WHERE run_id = $4")
                    .bind(status.as_str())
                    .bind(reason.clone())
                    .bind($now)
                    .bind(id)
            }
            StoreWrite::Progress { turn, usage } => {
                sqlx::query("UPDATE runs SET turn = $1, usage = $2, updated_at = $3 WHERE run_id = $4")
                    .bind(i64::from(*turn))
                    .bind(json(usage)?)
                    .bind($now)
                    .bind(id)
            }
            StoreWrite::FinalOutput(text) => {
                sqlx::query("UPDATE runs SET final_output = $1, updated_at = $2 WHERE run_id = $3")
                    .bind(text.clone())
                    .bind($now)
                    .bind(id)
            }
            StoreWrite::Message(message) => sqlx::query(
                "INSERT INTO messages (run_id, idx, tenant, turn, body) \
                 VALUES ($1, (SELECT COALESCE(MAX(idx), 0) + 1 FROM messages WHERE run_id = $1), $2, $3, $4)",
            )
            .bind(id)
            .bind($tenant)
            .bind(i64::from(message.turn))
            .bind(json(message)?),
            StoreWrite::Plan(plan) => sqlx::query(
                "INSERT INTO plans (run_id, version, tenant, body) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (run_id, version) DO UPDATE SET body = excluded.body",
            )
            .bind(id)
            .bind(plan.version as i64)
            .bind($tenant)
            .bind(json(plan)?),
            StoreWrite::ToolExecution(record) => sqlx::query(
                "INSERT INTO tool_executions (run_id, turn, call_id, idx, tenant, status, body) \
                 VALUES ($1, $2, $3, (SELECT COALESCE(MAX(idx), 0) + 1 FROM tool_executions WHERE run_id = $1), $4, $5, $6) \
                 ON CONFLICT (run_id, turn, call_id) DO UPDATE SET status = excluded.status, body = excluded.body",
            )
            .bind(id)
            .bind(i64::from(record.turn))
            .bind(record.call_id.clone())
            .bind($tenant)
            .bind(record.status.as_str())
            .bind(json(record)?),
            StoreWrite::Review { turn, review } => sqlx::query(
                "INSERT INTO reviews (run_id, turn, tenant, body) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (run_id, turn) DO UPDATE SET body = excluded.body",
            )
            .bind(id)
            .bind(i64::from(*turn))
            .bind($tenant)
            .bind(json(&(*turn, review))?),
            StoreWrite::Documents(fragments) => {
                for fragment in fragments {
                    sqlx::query(
                        "INSERT INTO documents (run_id, idx, tenant, body) \
                         VALUES ($1, (SELECT COALESCE(MAX(idx), 0) + 1 FROM documents WHERE run_id = $1), $2, $3)",
                    )
                    .bind(id)
                    .bind($tenant)
                    .bind(json(fragment)?)
                    .execute(&mut *$tx)
                    .await
                    .map_err(backend)?;
                }
                continue;
            }
        };
        query.execute(&mut *$tx).await.map_err(backend)?;
    }};
}

/// Why a commit's claim on its run matched no row: no such run, it has ended, or
/// its events do not continue the sequence.
macro_rules! why_refused {
    ($tx:ident, $run_id:expr, $id:expr, $expected:expr) => {{
        let row = sqlx::query("SELECT status, last_seq FROM runs WHERE run_id = $1")
            .bind($id)
            .fetch_optional(&mut *$tx)
            .await
            .map_err(backend)?;
        match row {
            None => StoreError::NotFound($run_id),
            Some(row) => {
                let status: String = row.try_get("status").map_err(backend)?;
                let last_seq: i64 = row.try_get("last_seq").map_err(backend)?;
                if TERMINAL.contains(&status.as_str()) {
                    StoreError::Terminal($run_id)
                } else {
                    let got = $expected.map_or(0, |last: u64| last + 1);
                    StoreError::SeqConflict { run_id: $run_id, expected: last_seq as u64 + 1, got }
                }
            }
        }
    }};
}

/// A run store on SQLite or PostgreSQL.
#[derive(Clone)]
pub struct SqlStore {
    pool: Pool,
    /// This process's exclusive claim on the store, held while any clone lives.
    _owner: Arc<Owner>,
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

fn already_owned(what: &str) -> StoreError {
    StoreError::Backend(format!(
        "another troupe process is using {what}; one process drives a store at a time (stop it, or use another store)"
    ))
}

fn backend(error: sqlx::Error) -> StoreError {
    StoreError::Backend(error.to_string())
}

fn json<T: Serialize>(value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|error| StoreError::Backend(format!("cannot encode: {error}")))
}

fn parse<T: DeserializeOwned>(text: &str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|error| StoreError::Backend(format!("cannot decode a stored row: {error}")))
}

/// Decodes every JSON body a query returned.
fn parse_all<T: DeserializeOwned>(bodies: Result<Vec<String>, sqlx::Error>) -> Result<Vec<T>, StoreError> {
    bodies.map_err(backend)?.iter().map(|body| parse(body)).collect()
}

/// A stored time: RFC 3339 in UTC with a fixed width (microseconds, `Z`), so that
/// comparing the text compares the times (retention relies on it).
fn stamp(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

fn time(text: &str) -> Result<DateTime<Utc>, StoreError> {
    DateTime::parse_from_rfc3339(text)
        .map(|time| time.with_timezone(&Utc))
        .map_err(|error| StoreError::Backend(format!("bad stored time {text:?}: {error}")))
}

impl SqlStore {
    /// Connects to `url` (`sqlite://PATH` or `postgres://…`) and applies the
    /// migrations. A SQLite file and its folder are created if missing.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let (pool, owner) = if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)
                .map_err(backend)?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                // WAL + NORMAL survives process crashes (what kill -9 tests prove);
                // a power loss may roll back the last commits.
                .synchronous(SqliteSynchronous::Normal)
                .busy_timeout(Duration::from_secs(10))
                .foreign_keys(true);
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
            let pool = SqlitePoolOptions::new().max_connections(4).acquire_timeout(Duration::from_secs(10));
            (Pool::Sqlite(pool.connect_with(options).await.map_err(backend)?), Owner::File(lock))
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            // One plain connection first: a server that is down or refuses us fails
            // at once with its own reason, not with a pool timeout.
            let probe = <sqlx::PgConnection as sqlx::Connection>::connect(url).await.map_err(backend)?;
            sqlx::Connection::close(probe).await.map_err(backend)?;
            let pool = PgPoolOptions::new().max_connections(16).acquire_timeout(Duration::from_secs(10));
            let pool = pool.connect(url).await.map_err(backend)?;
            let mut owner = pool.acquire().await.map_err(backend)?;
            let owned: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
                .bind(OWNER_LOCK)
                .fetch_one(&mut *owner)
                .await
                .map_err(backend)?;
            if !owned {
                return Err(already_owned("this PostgreSQL database"));
            }
            (Pool::Postgres(pool), Owner::Postgres(std::sync::Mutex::new(owner)))
        } else {
            return Err(StoreError::Backend(format!("unsupported store URL {url:?}: use sqlite://… or postgres://…")));
        };
        let store = Self { pool, _owner: Arc::new(owner) };
        store.migrate().await?;
        Ok(store)
    }

    /// Whether the database answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        with_pool!(self, |pool, _postgres| sqlx::query("SELECT 1").execute(pool).await.map(drop).map_err(backend))
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let migrations = match self.pool {
            Pool::Sqlite(_) => SQLITE_MIGRATIONS,
            Pool::Postgres(_) => POSTGRES_MIGRATIONS,
        };
        with_pool!(self, |pool, _postgres| {
            sqlx::query(
                "CREATE TABLE IF NOT EXISTS troupe_migrations (version BIGINT PRIMARY KEY, applied_at TEXT NOT NULL)",
            )
            .execute(pool)
            .await
            .map_err(backend)?;
            for (version, sql) in migrations {
                let mut tx = pool.begin().await.map_err(backend)?;
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

/// Typed column access shared by both backends' rows.
trait Columns {
    fn text(&self, column: &str) -> Result<String, StoreError>;
    fn optional(&self, column: &str) -> Result<Option<String>, StoreError>;
    fn int(&self, column: &str) -> Result<i64, StoreError>;
}

macro_rules! columns_for {
    ($row:ty) => {
        impl Columns for $row {
            fn text(&self, column: &str) -> Result<String, StoreError> {
                self.try_get(column).map_err(backend)
            }
            fn optional(&self, column: &str) -> Result<Option<String>, StoreError> {
                self.try_get(column).map_err(backend)
            }
            fn int(&self, column: &str) -> Result<i64, StoreError> {
                self.try_get(column).map_err(backend)
            }
        }
    };
}
columns_for!(SqliteRow);
columns_for!(PgRow);

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
    })
}

const RUN_COLUMNS: &str = "run_id, tenant, parent_run_id, agent, input, limits, status, reason, turn, usage, \
                           final_output, created_at, updated_at";

#[async_trait]
impl RunStore for SqlStore {
    async fn create_run(&self, run: RunRecord, events: Vec<RunEvent>) -> Result<(), StoreError> {
        check_sequence(run.run_id, 0, &events)?;
        let run_id = run.run_id.to_string();
        with_pool!(self, |pool, _postgres| {
            let mut tx = pool.begin().await.map_err(backend)?;
            let inserted = sqlx::query(
                "INSERT INTO runs (run_id, tenant, parent_run_id, agent, input, limits, status, reason, turn, usage, \
                 final_output, last_seq, created_at, updated_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) ON CONFLICT (run_id) DO NOTHING",
            )
            .bind(&run_id)
            .bind(&run.tenant)
            .bind(run.parent_run_id.map(|id| id.to_string()))
            .bind(&run.agent)
            .bind(&run.input)
            .bind(json(&run.limits)?)
            .bind(run.status.as_str())
            .bind(&run.reason)
            .bind(i64::from(run.turn))
            .bind(json(&run.usage)?)
            .bind(&run.final_output)
            .bind(events.len() as i64)
            .bind(stamp(run.created_at))
            .bind(stamp(run.updated_at))
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
            if inserted.rows_affected() == 0 {
                return Err(StoreError::Exists(run.run_id));
            }
            for event in &events {
                insert_event!(tx, &run.tenant, event);
            }
            tx.commit().await.map_err(backend)
        })
    }

    async fn commit(&self, commit: &Commit) -> Result<(), StoreError> {
        let run_id = commit.run_id;
        let id = run_id.to_string();
        let now = stamp(Utc::now());
        // The seq the events continue from; a commit without events checks none.
        let expected = commit.events.first().map(|event| event.seq.saturating_sub(1));
        if let Some(expected) = expected {
            check_sequence(run_id, expected, &commit.events)?;
        }
        let new_last = expected.map(|last| (last + commit.events.len() as u64) as i64);
        with_pool!(self, |pool, postgres| {
            let mut tx = if postgres { pool.begin().await } else { pool.begin_with("BEGIN IMMEDIATE").await }
                .map_err(backend)?;
            // One statement claims the run (on PostgreSQL it locks the row), checks it
            // is not over and continues its sequence, and moves `last_seq`.
            let claimed: Option<String> = sqlx::query_scalar(
                "UPDATE runs SET last_seq = COALESCE($1, last_seq), updated_at = $2 \
                 WHERE run_id = $3 AND ($4 IS NULL OR last_seq = $4) \
                 AND status NOT IN ('succeeded', 'failed', 'cancelled') RETURNING tenant",
            )
            .bind(new_last)
            .bind(&now)
            .bind(&id)
            .bind(expected.map(|last| last as i64))
            .fetch_optional(&mut *tx)
            .await
            .map_err(backend)?;
            let Some(tenant) = claimed else {
                return Err(why_refused!(tx, run_id, &id, expected));
            };
            for write in &commit.writes {
                apply!(tx, &id, &tenant, &now, write);
            }
            if !commit.events.is_empty() {
                let mut insert = sqlx::QueryBuilder::new("INSERT INTO run_events (run_id, seq, tenant, kind, body) ");
                let mut rows = Vec::with_capacity(commit.events.len());
                for event in &commit.events {
                    rows.push((event.seq as i64, event.kind.name(), json(event)?));
                }
                insert.push_values(rows, |mut row, (seq, kind, body)| {
                    row.push_bind(id.clone()).push_bind(seq).push_bind(tenant.clone()).push_bind(kind).push_bind(body);
                });
                insert.build().execute(&mut *tx).await.map_err(backend)?;
            }
            tx.commit().await.map_err(backend)
        })
    }

    async fn get_run(&self, run_id: RunId) -> Result<Option<RunRecord>, StoreError> {
        let id = run_id.to_string();
        with_pool!(self, |pool, _postgres| {
            let sql = sqlx::AssertSqlSafe(format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = $1"));
            let row = sqlx::query(sql).bind(&id).fetch_optional(pool).await.map_err(backend)?;
            row.as_ref().map(run_from_row).transpose()
        })
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
            let sql = sqlx::AssertSqlSafe(format!("SELECT {RUN_COLUMNS}, last_seq FROM runs WHERE run_id = $1"));
            let Some(row) = sqlx::query(sql).bind(&id).fetch_optional(&mut *tx).await.map_err(backend)? else {
                return Ok(None);
            };
            let run = run_from_row(&row)?;
            let last_seq = row.int("last_seq")?;
            let bodies = |sql: &'static str| sqlx::query_scalar::<_, String>(sql).bind(id.clone());
            let messages = parse_all(
                bodies("SELECT body FROM messages WHERE run_id = $1 ORDER BY idx").fetch_all(&mut *tx).await,
            )?;
            let plan: Plan = match bodies("SELECT body FROM plans WHERE run_id = $1 ORDER BY version DESC LIMIT 1")
                .fetch_optional(&mut *tx)
                .await
                .map_err(backend)?
            {
                Some(body) => parse(&body)?,
                None => Plan::default(),
            };
            let tool_executions = parse_all(
                bodies("SELECT body FROM tool_executions WHERE run_id = $1 ORDER BY idx").fetch_all(&mut *tx).await,
            )?;
            let reviews = parse_all(
                bodies("SELECT body FROM reviews WHERE run_id = $1 ORDER BY turn").fetch_all(&mut *tx).await,
            )?;
            let documents = parse_all(
                bodies("SELECT body FROM documents WHERE run_id = $1 ORDER BY idx").fetch_all(&mut *tx).await,
            )?;
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
        let id = run_id.to_string();
        with_pool!(self, |pool, _postgres| {
            let exists: Option<String> = sqlx::query_scalar("SELECT run_id FROM runs WHERE run_id = $1")
                .bind(&id)
                .fetch_optional(pool)
                .await
                .map_err(backend)?;
            if exists.is_none() {
                return Err(StoreError::NotFound(run_id));
            }
            parse_all(
                sqlx::query_scalar("SELECT body FROM run_events WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3")
                    .bind(&id)
                    .bind(after as i64)
                    .bind(limit.min(i64::MAX as usize) as i64)
                    .fetch_all(pool)
                    .await,
            )
        })
    }

    async fn list_runs(&self, query: RunQuery) -> Result<Vec<RunRecord>, StoreError> {
        with_pool!(self, |pool, _postgres| {
            let sql = sqlx::AssertSqlSafe(format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE ($1 IS NULL OR tenant = $1) AND ($2 IS NULL OR status = $2) \
                 ORDER BY run_id DESC LIMIT $3"
            ));
            let rows = sqlx::query(sql)
                .bind(query.tenant.clone())
                .bind(query.status.map(|status| status.as_str().to_owned()))
                .bind(query.limit.min(i64::MAX as usize) as i64)
                .fetch_all(pool)
                .await
                .map_err(backend)?;
            rows.iter().map(run_from_row).collect()
        })
    }

    async fn unfinished_runs(&self) -> Result<Vec<RunId>, StoreError> {
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

    async fn delete_finished(&self, before: DateTime<Utc>, limit: usize) -> Result<usize, StoreError> {
        with_pool!(self, |pool, _postgres| {
            let deleted = sqlx::query(
                "DELETE FROM runs WHERE run_id IN (SELECT run_id FROM runs \
                 WHERE status IN ('succeeded', 'failed', 'cancelled') AND updated_at < $1 ORDER BY updated_at LIMIT $2)",
            )
            .bind(stamp(before))
            .bind(limit.min(i64::MAX as usize) as i64)
            .execute(pool)
            .await
            .map_err(backend)?;
            Ok(deleted.rows_affected() as usize)
        })
    }
}
