//! SQLite connections used in place on the task that needs them: the writer's
//! (a group's statements run where the group was planned) and the readers of a
//! run's stream (`sql::Readers`), with no hand-off to a connection's thread and
//! back (sqlx runs each SQLite connection on a thread of its own, which cost two
//! thread wake-ups a commit or read: most of a commit's cost with one client).
//!
//! A statement here holds the task's thread for as long as SQLite works on it
//! (tens of microseconds for a small group). What could take long does not: the
//! wait for the database's write lock while another connection of the store
//! holds it (retention's deletes, a thread's changes) is an asynchronous sleep
//! between tries of `BEGIN IMMEDIATE`, and the copy of a full WAL into the
//! database runs on a blocking thread ([`Direct::commit`]).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use rusqlite::types::{ToSql, ToSqlOutput, ValueRef};
use rusqlite::{Connection, ErrorCode, OpenFlags};
use troupe_actors::store::StoreError;

use crate::store::sql::{LOCK_WAIT, SqliteFile, Text, failed, plan_once};
use crate::store::wal_vfs;

/// The statements a connection keeps prepared: every shape a group writes (a
/// handful per table, see `binding::chunk_len`), and the reads.
const STATEMENT_CACHE: usize = 256;

/// A value bound to a statement of the writer.
pub(super) enum Value {
    Int(i64),
    Text(Text),
    Static(&'static str),
    Null,
}

impl ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self {
            Value::Int(value) => ValueRef::Integer(*value),
            Value::Text(text) => ValueRef::Text(text.as_bytes()),
            Value::Static(text) => ValueRef::Text(text.as_bytes()),
            Value::Null => ValueRef::Null,
        }))
    }
}

impl From<i64> for Value {
    fn from(value: i64) -> Self {
        Value::Int(value)
    }
}

impl From<Text> for Value {
    fn from(text: Text) -> Self {
        Value::Text(text)
    }
}

impl From<Option<Text>> for Value {
    fn from(text: Option<Text>) -> Self {
        text.map_or(Value::Null, Value::Text)
    }
}

impl From<&'static str> for Value {
    fn from(text: &'static str) -> Self {
        Value::Static(text)
    }
}

/// The values of the statement being built, in order.
#[derive(Default)]
pub(super) struct Values(Vec<Value>);

impl Values {
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    pub(super) fn push(&mut self, value: Value) {
        self.0.push(value);
    }

    /// Binds the values, in order, to `statement`, and empties them.
    fn bind(&mut self, statement: &mut rusqlite::Statement<'_>) -> Result<(), StoreError> {
        for (index, value) in self.0.drain(..).enumerate() {
            statement.raw_bind_parameter(index + 1, value).map_err(failed)?;
        }
        Ok(())
    }
}

/// The states of a WAL's checkpoint (see [`Direct::commit`]).
const IDLE: u8 = 0;
const COPYING: u8 = 1;
const COPIED: u8 = 2;

std::thread_local! {
    /// The pages in the WAL after the last commit on this thread (SQLite's WAL
    /// hook, called inside `COMMIT`, sets it; the writer reads it right after).
    static WAL_PAGES: std::cell::Cell<i64> = const { std::cell::Cell::new(0) };
}

fn note_wal_pages(_: &rusqlite::hooks::Wal, pages: std::ffi::c_int) -> rusqlite::Result<()> {
    WAL_PAGES.set(i64::from(pages));
    Ok(())
}

/// The writer's connection to a SQLite store.
pub(super) struct Direct {
    connection: Connection,
    path: std::path::PathBuf,
    file: SqliteFile,
    checkpoint_bytes: i64,
    /// The WAL's size, in pages, past which a checkpoint starts.
    checkpoint_pages: i64,
    /// Where the checkpoint of a full WAL is: [`IDLE`], [`COPYING`] (on a blocking
    /// thread), [`COPIED`] (the writer copies what was committed meanwhile).
    checkpoint: Arc<AtomicU8>,
}

impl Direct {
    /// Opens the store at `path` (shared with other programs as `file` says),
    /// which the store's pool has created (page size, WAL and auto-vacuum are
    /// the database's own settings by then). The WAL is
    /// copied back into the database once it holds `checkpoint_bytes`: not by the
    /// commit that filled it, as SQLite would (tens of milliseconds holding the
    /// task's thread), but by a connection of its own on a blocking thread, which
    /// writers do not wait for (`PASSIVE`).
    ///
    /// The connection does not enforce foreign keys: every job it writes names a
    /// run the group has read (or knows) and refuses it if there is none
    /// (`group::plan`), so each child row's lookup of its run would repeat that
    /// check (5 % of a durable turn's instructions). The store's other
    /// connections enforce them, and retention's deletes, made there, cascade.
    pub(super) fn open(path: &Path, file: SqliteFile, checkpoint_bytes: i64) -> Result<Self, StoreError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        wal_vfs::register(file).map_err(StoreError::Backend)?;
        let connection = Connection::open_with_flags_and_vfs(path, flags, wal_vfs::name(file)).map_err(|error| {
            StoreError::Backend(format!("cannot open the store's writer on {}: {error}", path.display()))
        })?;
        // No busy handler: a taken write lock is waited for by `begin`, asleep.
        connection.busy_timeout(Duration::ZERO).map_err(failed)?;
        connection.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        // WAL + NORMAL survives process crashes (what kill -9 tests prove); a power
        // loss may roll back the last commits. A page cache of 8 MiB (instead of
        // 2 MiB) keeps the pages a group descends in memory, and statement journals
        // stay in memory instead of spilling to temp files. Not larger: a commit
        // whose b-tree rebalanced scans the whole cache's hash table as it ends (a
        // 64 MiB cache cost ~4 % of the daemon's CPU at 50 runs in flight).
        let page_size: i64 = connection.pragma_query_value(None, "page_size", |row| row.get(0)).map_err(failed)?;
        connection
            .execute_batch(
                "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = OFF; \
                 PRAGMA cache_size = -8192; PRAGMA temp_store = MEMORY;",
            )
            .map_err(failed)?;
        plan_once(&connection)?;
        // Replaces SQLite's own checkpoints (its default WAL hook checkpoints in the
        // committing connection every 1,000 pages).
        connection.wal_hook(Some(note_wal_pages));
        Ok(Self {
            connection,
            path: path.to_owned(),
            file,
            checkpoint_bytes,
            checkpoint_pages: checkpoint_bytes / page_size.max(512),
            checkpoint: Arc::new(AtomicU8::new(IDLE)),
        })
    }

    /// Begins the group's transaction, waiting (asleep, not in SQLite) for as long
    /// as another connection holds the write lock, up to [`LOCK_WAIT`].
    pub(super) async fn begin(&mut self) -> Result<(), StoreError> {
        let deadline = tokio::time::Instant::now() + LOCK_WAIT;
        let mut pause = Duration::from_micros(200);
        loop {
            match self.run("BEGIN IMMEDIATE") {
                Err(error)
                    if matches!(
                        error.sqlite_error_code(),
                        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
                    ) && tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                outcome => return outcome.map_err(failed),
            }
        }
    }

    /// Runs `sql` (no values, no rows) as a cached statement.
    fn run(&mut self, sql: &str) -> rusqlite::Result<()> {
        self.connection.prepare_cached(sql)?.raw_execute().map(drop)
    }

    /// Runs `sql` with `values` (consumed) as a cached statement.
    pub(super) fn statement(&mut self, sql: &str, values: &mut Values) -> Result<(), StoreError> {
        let mut statement = self.connection.prepare_cached(sql).map_err(failed)?;
        values.bind(&mut statement)?;
        statement.raw_execute().map_err(failed)?;
        Ok(())
    }

    /// Commits the group's transaction, and checkpoints a full WAL in two steps: a
    /// blocking thread copies its pages into the database, then the writer copies
    /// the few committed meanwhile, so that the next transaction starts the WAL
    /// over (SQLite restarts it only once every page was copied, which a copy
    /// racing the writer's commits never achieves alone).
    pub(super) fn commit(&mut self) -> Result<(), StoreError> {
        WAL_PAGES.set(0);
        self.run("COMMIT").map_err(failed)?;
        match self.checkpoint.load(Ordering::Acquire) {
            COPIED => {
                if let Err(error) = self.connection.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                    tracing::warn!(%error, "a checkpoint of the store's WAL failed; the next full WAL tries again");
                }
                self.checkpoint.store(IDLE, Ordering::Release);
            }
            IDLE if WAL_PAGES.get() >= self.checkpoint_pages => {
                self.checkpoint.store(COPYING, Ordering::Release);
                let (path, file, state) = (self.path.clone(), self.file, self.checkpoint.clone());
                tokio::task::spawn_blocking(move || {
                    if let Err(error) = checkpoint(&path, file) {
                        tracing::warn!(%error, "a checkpoint of the store's WAL failed; the next full WAL tries again");
                    }
                    state.store(COPIED, Ordering::Release);
                });
            }
            _ => {}
        }
        Ok(())
    }

    /// Undoes what a failed group began. A connection that cannot roll back is
    /// replaced by a new one, so the next group starts clean.
    pub(super) fn roll_back(&mut self) {
        if self.connection.is_autocommit() {
            return;
        }
        if self.run("ROLLBACK").is_ok() && self.connection.is_autocommit() {
            return;
        }
        match Self::open(&self.path, self.file, self.checkpoint_bytes) {
            Ok(fresh) => *self = fresh,
            Err(error) => tracing::error!(%error, "the store's writer could not roll back nor reconnect"),
        }
    }

    /// The largest run key stored (0 for none).
    pub(super) fn largest_key(&mut self) -> Result<i64, StoreError> {
        let mut statement = self.connection.prepare_cached("SELECT MAX(run_key) FROM runs").map_err(failed)?;
        let largest: Option<i64> = statement.query_row([], |row| row.get(0)).map_err(failed)?;
        Ok(largest.unwrap_or(0))
    }

    /// Whether a run with this id is stored.
    pub(super) fn stored(&mut self, run_id: &str) -> Result<bool, StoreError> {
        let mut statement = self.connection.prepare_cached("SELECT 1 FROM runs WHERE run_id = ?").map_err(failed)?;
        statement.exists([run_id]).map_err(failed)
    }

    /// Calls `each` with every row of `sql` (with `values`, consumed).
    pub(super) fn select(
        &mut self,
        sql: &str,
        values: &mut Values,
        mut each: impl FnMut(&rusqlite::Row<'_>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut statement = self.connection.prepare_cached(sql).map_err(failed)?;
        values.bind(&mut statement)?;
        let mut rows = statement.raw_query();
        while let Some(row) = rows.next().map_err(failed)? {
            each(row)?;
        }
        Ok(())
    }
}

/// Copies the WAL of the store at `path` into the database, as far as no reader
/// needs it, without waiting for anyone.
fn checkpoint(path: &Path, file: SqliteFile) -> rusqlite::Result<()> {
    let connection = file.open(path, OpenFlags::SQLITE_OPEN_READ_WRITE)?;
    connection.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use troupe_actors::testing::eventually;

    use super::*;

    /// Once the WAL holds more than the limit, it is copied into the database by
    /// a checkpoint of its own, off the writer's thread; commits go on meanwhile,
    /// and the writer's next commit after the copy copies what they added, so that
    /// the database then holds every committed row.
    #[tokio::test]
    async fn a_full_wal_is_checkpointed_off_the_writers_thread() {
        const ROW: usize = 8 * 1024;
        let dir = std::env::temp_dir().join(format!("troupe-direct-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("store.db");
        let setup = SqliteFile::Exclusive.open(&path, OpenFlags::default()).unwrap();
        setup.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE rows (body TEXT NOT NULL);").unwrap();
        let database_bytes = || std::fs::metadata(&path).unwrap().len();

        let mut writer = Direct::open(&path, SqliteFile::Exclusive, 64 * 1024).unwrap();
        let mut rows = 0;
        let commit = async |writer: &mut Direct| {
            writer.begin().await.unwrap();
            let mut values = Values::default();
            values.push(Value::Text("x".repeat(ROW).into()));
            writer.statement("INSERT INTO rows (body) VALUES (?)", &mut values).unwrap();
            writer.commit().unwrap();
        };
        let mut copies = 0;
        for _ in 0..20 {
            commit(&mut writer).await;
            rows += 1;
            copies += usize::from(writer.checkpoint.load(Ordering::Acquire) != IDLE);
        }
        assert!(copies > 0, "20 rows of 8 KiB fill a WAL of 64 KiB: a copy started");
        // The copy runs on a blocking thread; the writer's first commit after it
        // ended copies the rest (a commit that finds the state idle may start
        // another copy, which ends the same way).
        let mut finished = false;
        for _ in 0..10 {
            let state = &writer.checkpoint;
            eventually(Duration::from_secs(10), "the copy to end", || async {
                state.load(Ordering::Acquire) != COPYING
            })
            .await;
            let copied = writer.checkpoint.load(Ordering::Acquire) == COPIED;
            commit(&mut writer).await;
            rows += 1;
            if copied {
                finished = true;
                break;
            }
        }
        assert!(finished, "a copy ended and the writer's next commit finished it");
        // Nothing but a checkpoint writes the database file in WAL mode, and no
        // reader held the WAL back: every committed row is in the file.
        assert!(database_bytes() >= (rows * ROW) as u64, "{} bytes hold {rows} rows of {ROW}", database_bytes());
        let stored: i64 = setup.query_row("SELECT COUNT(*) FROM rows", [], |row| row.get(0)).unwrap();
        assert_eq!(stored, rows as i64);
        drop((writer, setup));
        let _ = std::fs::remove_dir_all(dir);
    }
}
