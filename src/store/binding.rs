//! How the writer's statements are built: rows bound straight into a
//! statement's arguments, placeholders for either backend, and how many rows go
//! in one statement.

use sqlx::Arguments;

use crate::store::direct::{Value, Values};

/// At most this many rows per statement (a power of two). With 23 columns at most,
/// far under SQLite's limit of bound parameters (32,766) and PostgreSQL's (65,535).
const MAX_ROWS: usize = 64;

/// Binds one row's values, in order, to a statement's arguments.
pub(super) struct Binder<'a, A> {
    pub(super) arguments: &'a mut A,
    /// The first value that could not be encoded; the statement is not run.
    pub(super) error: Option<sqlx::error::BoxDynError>,
}

impl<A: Arguments> Binder<'_, A> {
    pub(super) fn push_bind<'t, T: sqlx::Encode<'t, A::Database> + sqlx::Type<A::Database>>(
        &mut self,
        value: T,
    ) -> &mut Self {
        if let Err(error) = self.arguments.add(value) {
            self.error.get_or_insert(error);
        }
        self
    }
}

impl Binder<'_, Values> {
    pub(super) fn push_bind(&mut self, value: impl Into<Value>) -> &mut Self {
        self.arguments.push(value.into());
        self
    }
}

/// `head VALUES (…), (…)tail` with `rows` rows of `columns` placeholders: `?` on
/// SQLite, `$1`, `$2`… on PostgreSQL.
pub(super) fn values_sql(head: &str, tail: &str, columns: usize, rows: usize, postgres: bool) -> String {
    let mut sql = String::with_capacity(head.len() + tail.len() + 8 + rows * columns * 6);
    sql.push_str(head);
    sql.push_str("VALUES ");
    let mut number = 0;
    for row in 0..rows {
        sql.push_str(if row == 0 { "(" } else { ", (" });
        for column in 0..columns {
            if column > 0 {
                sql.push_str(", ");
            }
            number += 1;
            if postgres {
                sql.push('$');
                sql.push_str(&number.to_string());
            } else {
                sql.push('?');
            }
        }
        sql.push(')');
    }
    sql.push_str(tail);
    sql
}

/// How many of the `remaining` rows (not empty) the next statement takes: the
/// largest power of two up to [`MAX_ROWS`] whose rows fit in `limit` bytes (by
/// `size`, plus a margin per row), or one row.
///
/// The byte limit is for PostgreSQL: sqlx does not set `TCP_NODELAY`, and a
/// statement whose message spans two TLS records (16 KiB each) or two segments
/// waits out the server's delayed ACK (40 ms) on Nagle's algorithm; 500-row
/// inserts ran at 0.7 ms a row that way.
pub(super) fn chunk_len<R>(remaining: &[R], size: impl Fn(&R) -> usize, limit: usize) -> usize {
    let mut rows = 1 << remaining.len().min(MAX_ROWS).ilog2();
    while rows > 1 && remaining[..rows].iter().map(|row| size(row) + 64).sum::<usize>() > limit {
        rows /= 2;
    }
    rows
}
