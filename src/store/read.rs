//! What the writer reads of the runs a group commits to: their mutable columns,
//! by id, on either backend.

use troupe_actors::store::StoreError;

use crate::store::direct::{Direct, Values};
use crate::store::group::RunState;
use crate::store::sql::{Columns, Text, backend};

/// The columns of a run the writer reads (see [`state_from_row`]).
const READ_COLUMNS: &str = "run_key, run_id, tenant, status, reason, turn, usage, final_output, last_seq, \
                            message_count, tool_count, document_count, updated_at";

/// Calls `each` with the stored runs among `ids`, on SQLite (the writer's own
/// connection): `IN` over the unique index on `run_id`, each run once.
pub(super) fn read_sqlite(
    db: &mut Direct,
    ids: &[&Text],
    each: impl FnMut(&rusqlite::Row<'_>) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let Some(last) = ids.last() else { return Ok(()) };
    // As many ids as the next power of two (the last one repeated), so that a few
    // statement shapes stay prepared.
    let mut sql = format!("SELECT {READ_COLUMNS} FROM runs_now WHERE run_id IN (");
    let mut values = Values::default();
    for at in 0..ids.len().next_power_of_two() {
        sql.push_str(if at == 0 { "?" } else { ", ?" });
        values.push(Text::clone(ids.get(at).unwrap_or(last)).into());
    }
    sql.push(')');
    db.select(&sql, &mut values, each)
}

/// The stored runs among `ids`, on PostgreSQL: one index lookup per id. With
/// `run_id IN (…)` the planner estimated a sequential scan of `runs` cheaper for a
/// few hundred ids on a table of some thousands of runs, which made every group
/// slower as the table grew (2.7 ms a read at 8,000 runs, against 0.4 ms this
/// way); the `LIMIT` keeps the lateral subquery from being flattened into a join
/// the planner could turn back into that scan.
pub(super) async fn read_postgres(
    connection: &mut sqlx::PgConnection,
    ids: &[&Text],
) -> Result<Vec<sqlx::postgres::PgRow>, StoreError> {
    let ids: Vec<&str> = ids.iter().map(|id| &***id).collect();
    let sql = format!(
        "SELECT now.* FROM unnest($1::text[]) AS wanted (id) \
         CROSS JOIN LATERAL (SELECT {READ_COLUMNS} FROM runs_now WHERE run_id = wanted.id LIMIT 1) now"
    );
    sqlx::query(sqlx::AssertSqlSafe(sql)).bind(ids).fetch_all(connection).await.map_err(backend)
}

/// The mutable columns of a `runs` row.
pub(super) fn state_from_row(row: &impl Columns) -> Result<RunState, StoreError> {
    let text = |column: &str| row.text(column).map(Text::from);
    let optional = |column: &str| row.optional(column).map(|text| text.map(Text::from));
    let int = |column: &str| row.int(column);
    Ok(RunState {
        key: int("run_key")?,
        tenant: text("tenant")?,
        status: text("status")?,
        reason: optional("reason")?,
        turn: int("turn")?,
        usage: text("usage")?,
        final_output: optional("final_output")?,
        last_seq: int("last_seq")?,
        message_count: int("message_count")?,
        tool_count: int("tool_count")?,
        document_count: int("document_count")?,
        updated_at: text("updated_at")?,
    })
}
