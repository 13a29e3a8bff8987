//! What the store's files share: the pool of either backend (with SQLite's
//! readers used in place), typed access to
//! its rows' columns, the decoding of stored text, and the store's string and map
//! types.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use foldhash::fast::RandomState;
use rusqlite::{Connection, OpenFlags};
use serde::de::DeserializeOwned;
use sqlx::postgres::PgRow;
use sqlx::sqlite::SqliteRow;
use sqlx::{PgPool, Row, SqlitePool};
use troupe_actors::store::StoreError;

/// Text shared between a job and the rows written from it: a group that fails is
/// written again one job at a time, and binding an `Arc<str>` copies nothing.
pub(super) type Text = Arc<str>;

/// The writer's maps: keyed by run ids, call ids and integers the store makes,
/// not by anything a client chooses, so a fast hash without flooding resistance
/// will do (SipHash over a run's 36-character id was a measurable share of a
/// group's planning).
pub(super) type Map<K, V> = HashMap<K, V, RandomState>;

/// How long a SQLite connection used in place waits for a lock before it fails
/// (as sqlx's `busy_timeout` on the store's other connections).
pub(super) const LOCK_WAIT: Duration = Duration::from_secs(10);

/// How a SQLite store shares its database file with other programs while it is
/// open (`store.sqlite_exclusive` in the config). Every connection of a store
/// uses the same VFS. (Within one process, SQLite keeps one WAL index a file,
/// whichever VFS a connection names: the tests read a store's file through
/// sqlx's default while the store is open.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SqliteFile {
    /// Locked for this process while the store is open (SQLite's `unix-excl`
    /// VFS), which keeps the WAL index in its memory: a transaction takes its
    /// locks without a system call (the default VFS's six `fcntl` calls a
    /// transaction were 24 a run). The store already owns its database alone
    /// (its `.lock` file); another program opening it finds it locked.
    #[default]
    Exclusive,
    /// Open to other programs (SQLite's default VFS, the WAL index in the
    /// `-shm` file): the `sqlite3` shell, a backup or a replication tool may
    /// read it while the store is open.
    Shared,
}

impl SqliteFile {
    /// The SQLite VFS its connections use.
    pub(super) fn vfs(self) -> &'static str {
        match self {
            Self::Exclusive => "unix-excl",
            Self::Shared => "unix",
        }
    }

    /// Opens a connection to the SQLite store at `path`.
    pub(super) fn open(self, path: &Path, flags: OpenFlags) -> rusqlite::Result<Connection> {
        Connection::open_with_flags_and_vfs(path, flags, self.vfs())
    }
}

/// Statuses of runs that have ended (what retention may delete).
pub(super) const TERMINAL: [&str; 3] = ["succeeded", "failed", "cancelled"];

/// The pool of the store's backend; on SQLite with the connections a run's
/// stream reads through ([`Readers`]).
#[derive(Clone)]
pub(super) enum Pool {
    Sqlite(SqlitePool, Arc<Readers>),
    Postgres(PgPool),
}

/// A store error of a failed query.
pub(super) fn backend(error: sqlx::Error) -> StoreError {
    StoreError::Backend(error.to_string())
}

/// A store error of a failed call on a SQLite connection used in place (`direct.rs`).
pub(super) fn failed(error: rusqlite::Error) -> StoreError {
    StoreError::Backend(error.to_string())
}

/// A value stored as JSON text.
pub(super) fn parse<T: DeserializeOwned>(text: &str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|error| StoreError::Backend(format!("cannot decode a stored row: {error}")))
}

/// A time stored as RFC 3339 text.
pub(super) fn time(text: &str) -> Result<DateTime<Utc>, StoreError> {
    DateTime::parse_from_rfc3339(text)
        .map(|time| time.with_timezone(&Utc))
        .map_err(|error| StoreError::Backend(format!("bad stored time {text:?}: {error}")))
}

/// Typed column access shared by both backends' rows.
pub(super) trait Columns {
    fn text(&self, column: &str) -> Result<String, StoreError>;
    fn optional(&self, column: &str) -> Result<Option<String>, StoreError>;
    fn int(&self, column: &str) -> Result<i64, StoreError>;
}

macro_rules! columns_for {
    ($row:ty, $get:ident, $error:path) => {
        impl Columns for $row {
            fn text(&self, column: &str) -> Result<String, StoreError> {
                self.$get(column).map_err($error)
            }
            fn optional(&self, column: &str) -> Result<Option<String>, StoreError> {
                self.$get(column).map_err($error)
            }
            fn int(&self, column: &str) -> Result<i64, StoreError> {
                self.$get(column).map_err($error)
            }
        }
    };
}
columns_for!(SqliteRow, try_get, backend);
columns_for!(PgRow, try_get, backend);
// The rows of the SQLite connections used in place (`direct.rs`).
columns_for!(rusqlite::Row<'_>, get, failed);

/// Reader connections kept open, at most.
const IDLE_READERS: usize = 4;

/// Connections for the reads every run's stream makes (the run, its first
/// events), used in place as the writer's is: through sqlx each read was a
/// hand-off to a connection's thread and back. In WAL mode a read never waits for
/// the writer.
pub(super) struct Readers {
    path: std::path::PathBuf,
    file: SqliteFile,
    idle: std::sync::Mutex<Vec<Connection>>,
}

impl Readers {
    pub(super) fn new(path: &Path, file: SqliteFile) -> Self {
        Self { path: path.to_owned(), file, idle: std::sync::Mutex::new(Vec::new()) }
    }

    /// Runs `read` on an idle connection, or on a new one if none is idle.
    pub(super) fn read<T>(&self, read: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T, StoreError> {
        let idle = self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner).pop();
        let connection = match idle {
            Some(connection) => connection,
            None => self.open()?,
        };
        let outcome = read(&connection).map_err(failed);
        let mut idle = self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if idle.len() < IDLE_READERS {
            idle.push(connection);
        }
        outcome
    }

    fn open(&self) -> Result<Connection, StoreError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let connection = self.file.open(&self.path, flags).map_err(|error| {
            StoreError::Backend(format!("cannot open a reader of {}: {error}", self.path.display()))
        })?;
        connection.busy_timeout(LOCK_WAIT).map_err(failed)?;
        connection.set_prepared_statement_cache_capacity(16);
        // A page cache of 8 MiB: what is read was just written (the operating
        // system's cache has it); `query_only`: this connection never writes.
        connection.execute_batch("PRAGMA cache_size = -8192; PRAGMA query_only = ON;").map_err(failed)?;
        plan_once(&connection)?;
        Ok(connection)
    }
}

/// Plans each cached statement once, whatever the values later bound to it. The
/// bundled SQLite is built with `STAT4`, under which a statement comparing a
/// column to a bound value (`last_seq > ?`) is planned again at each new binding:
/// the events read of every stream paid a full parse. The query planner
/// stability guarantee (QPSG) keeps the first plan; the store gathers no
/// statistics (no `ANALYZE`) that a bound value could have chosen between.
pub(super) fn plan_once(connection: &Connection) -> Result<(), StoreError> {
    connection.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true).map_err(failed)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A cached read comparing a column to a bound value is planned once, not at
    /// each new value (which costs a parse each time under `STAT4`).
    #[test]
    fn a_cached_statement_is_not_planned_again_for_new_values() {
        let reprepares = |once: bool| {
            let connection = Connection::open_in_memory().unwrap();
            if once {
                plan_once(&connection).unwrap();
            }
            connection.execute_batch("CREATE TABLE events (seq INTEGER PRIMARY KEY, body TEXT)").unwrap();
            for seq in [3, 7, 12] {
                let mut statement =
                    connection.prepare_cached("SELECT body FROM events WHERE seq > ?1 ORDER BY seq LIMIT ?2").unwrap();
                let rows: Vec<Option<String>> =
                    statement.query_map((seq, 10), |row| row.get(0)).unwrap().map(Result::unwrap).collect();
                assert!(rows.is_empty());
            }
            let statement =
                connection.prepare_cached("SELECT body FROM events WHERE seq > ?1 ORDER BY seq LIMIT ?2").unwrap();
            statement.get_status(rusqlite::StatementStatus::RePrepare)
        };
        assert!(reprepares(false) >= 2, "SQLite's default plans again at each binding");
        assert_eq!(reprepares(true), 0);
    }
}
