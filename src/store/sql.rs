//! What the store's files share: the pool of either backend, typed access to
//! its rows' columns, the decoding of stored text, and the store's string and map
//! types.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use foldhash::fast::RandomState;
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

/// Statuses of runs that have ended (what retention may delete).
pub(super) const TERMINAL: [&str; 3] = ["succeeded", "failed", "cancelled"];

/// The pool of the store's backend.
#[derive(Clone)]
pub(super) enum Pool {
    Sqlite(SqlitePool),
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
