//! The store's one writer: a task that takes every pending [`Job`] (run creations
//! and commits, from all sessions) off its channel and writes them in ONE
//! transaction, then answers each caller only after that transaction committed.
//! A commit still returns only once it is durable; what changes is that many
//! commits share a transaction and its fsync, and that a group costs a fixed
//! number of statements (one read of the runs, one multi-row statement per
//! table), not one per event and state change.
//!
//! Failures: a job the group refuses (no such run, run ended, seq conflict) is
//! checked in memory before anything is written and contributes no row, so it
//! fails alone. If the group's transaction itself fails (a statement or the
//! commit), it is rolled back and every job of the group is written again alone,
//! each in its own transaction, so one bad commit fails only its own caller and
//! no caller is told `Ok` for a write that did not land.

use std::sync::Arc;

use chrono::Utc;
use sqlx::Arguments;
use tokio::sync::{mpsc, oneshot};
use troupe_actors::protocol::RunId;
use troupe_actors::store::StoreError;

use crate::store::binding::{Binder, chunk_len, values_sql};
use crate::store::cluster::{self, Node};
use crate::store::direct::{Direct, Values};
use crate::store::encode::stamp;
use crate::store::group::{EventRow, Fixed, GroupWrite, Job, Progress, RunState, Slot, plan};
use crate::store::read::{read_postgres, read_sqlite, state_from_row};
use crate::store::sql::{Columns, Map, TERMINAL, Text, backend};

/// At most this many jobs share a transaction, by backend. On SQLite, groups of
/// 256 cost less CPU per commit than groups of 1,024 (1 – 7 µs a turn less in
/// paired runs of the durability bench): the commits of a group are answered
/// together, and the sessions they wake then run with less of their state pushed
/// out of the CPU's caches. On PostgreSQL, where each group also pays a round
/// trip per statement and an fsync, smaller groups were no better.
const MAX_GROUP_SQLITE: usize = 256;
const MAX_GROUP_POSTGRES: usize = 1024;

/// At most about this many bytes of values per PostgreSQL statement (see
/// [`chunk_len`]): one TLS record with room for the statement's other messages.
const PG_STATEMENT_BYTES: usize = 12 * 1024;

/// Jobs waiting for the writer; senders wait when it is full.
const QUEUE: usize = 4096;

/// A job and where its outcome goes.
pub(super) struct Request {
    job: Job,
    reply: oneshot::Sender<Result<(), StoreError>>,
}

/// The connection the writer writes through: SQLite's its own, used in place
/// (see `direct.rs`); PostgreSQL's a pool of one connection.
pub(super) enum Backend {
    Sqlite(Box<Direct>),
    Postgres(sqlx::PgPool),
}

/// The handle to a store's writer task.
#[derive(Clone)]
pub(super) struct Writer {
    queue: mpsc::Sender<Request>,
}

impl Writer {
    /// Spawns the writer on the current tokio runtime; it stops when every handle
    /// is dropped and the queue is drained. It does not hold the store's owner
    /// claim, so that dropping the store frees it at once: a queued job's caller is
    /// waiting on a borrowed store, so the claim outlives every write whose caller
    /// still waits for it.
    pub(super) fn spawn(backend: Backend, node: Option<Arc<Node>>) -> Self {
        let (queue, inbox) = mpsc::channel(QUEUE);
        tokio::spawn(run(backend, node, inbox));
        Self { queue }
    }

    /// Hands `job` to the writer and waits until it is committed (or refused).
    pub(super) async fn write(&self, job: Job) -> Result<(), StoreError> {
        let (reply, outcome) = oneshot::channel();
        let stopped = || StoreError::Backend("the store writer has stopped".to_owned());
        self.queue.send(Request { job, reply }).await.map_err(|_| stopped())?;
        outcome.await.unwrap_or_else(|_| Err(stopped()))
    }
}

/// At most this many runs are kept in the writer's [`Known`] cache.
const MAX_KNOWN: usize = 1 << 16;

/// The rows of unfinished runs as the writer last committed them, by id: a group
/// reads from the database only the runs it does not know yet. This holds because
/// the writer is the only one that changes a run row while the store is open (the
/// process owns the store, and retention deletes only ended runs, which are not
/// kept). In a cluster, another node changes a run only after claiming it, which
/// fences this node off it (its next commit is refused and drops it from here),
/// and a run this node claims is dropped from here before its next group (it may
/// have been driven elsewhere since). It is updated only after a transaction
/// committed, and emptied when one fails, so it never holds a state the database
/// does not.
type Known = Map<RunId, RunState>;

/// What the writer keeps between groups.
#[derive(Default)]
struct Memory {
    known: Known,
    /// SQLite: the key the next run created takes: one more than the largest in
    /// the database, read by the first group (after the migrations ran) and again
    /// after a group failed; the writer is the only one that creates runs.
    /// (PostgreSQL takes keys from a sequence.)
    next_key: Option<i64>,
}

async fn run(mut target: Backend, node: Option<Arc<Node>>, mut inbox: mpsc::Receiver<Request>) {
    let max_group = match target {
        Backend::Sqlite(_) => MAX_GROUP_SQLITE,
        Backend::Postgres(_) => MAX_GROUP_POSTGRES,
    };
    let mut requests = Vec::with_capacity(max_group);
    let mut memory = Memory::default();
    while inbox.recv_many(&mut requests, max_group).await > 0 {
        // A commit's sender woke this task, which tokio runs next on the sender's
        // thread: the tasks already woken run first, so that the commits they are
        // about to send share this group (on SQLite the group is written right
        // here, not while waiting for a connection's thread, and a group of one a
        // commit cost 1.7 times the CPU a turn at 50 runs in flight).
        if requests.len() < max_group {
            behind_woken_tasks().await;
            while requests.len() < max_group
                && let Ok(request) = inbox.try_recv()
            {
                requests.push(request);
            }
        }
        let (jobs, replies): (Vec<Job>, Vec<_>) =
            requests.drain(..).map(|request| (request.job, request.reply)).unzip();
        let outcomes = write_jobs(&mut target, node.as_deref(), &jobs, &mut memory).await;
        for (reply, outcome) in replies.into_iter().zip(outcomes) {
            let _ = reply.send(outcome);
        }
    }
}

/// Lets the tasks already woken on this worker run before the caller goes on.
/// Unlike `tokio::task::yield_now`, which first polls the I/O driver (an
/// `epoll_wait` a group, most of it for nothing with one run in flight), the task
/// wakes itself: tokio puts it at the back of the worker's queue, and when
/// nothing else is queued it goes on at once.
fn behind_woken_tasks() -> impl std::future::Future<Output = ()> {
    let mut queued = false;
    std::future::poll_fn(move |context| {
        if queued {
            return std::task::Poll::Ready(());
        }
        queued = true;
        context.waker().wake_by_ref();
        std::task::Poll::Pending
    })
}

/// Writes `jobs` as one group; if the group fails, writes each alone.
async fn write_jobs(
    target: &mut Backend,
    node: Option<&Node>,
    jobs: &[Job],
    memory: &mut Memory,
) -> Vec<Result<(), StoreError>> {
    let error = match write_group(target, node, jobs, memory).await {
        Ok(outcomes) => return outcomes,
        Err(error) => error,
    };
    // Whether a failed commit left anything behind is for the database to say.
    *memory = Memory::default();
    if let [job] = jobs {
        return vec![Err(refused(target, job, error).await)];
    }
    tracing::warn!(%error, jobs = jobs.len(), "a group commit failed; writing its commits one by one");
    let mut outcomes = Vec::with_capacity(jobs.len());
    for job in jobs {
        let outcome = match write_group(target, node, std::slice::from_ref(job), memory).await {
            Ok(mut single) => single.pop().unwrap_or(Ok(())),
            Err(error) => Err(refused(target, job, error).await),
        };
        outcomes.push(outcome);
    }
    outcomes
}

/// Why a job written alone failed. The writer does not read the runs it creates,
/// so creating a run that is already stored shows up as a failed insert: it is
/// reported as [`StoreError::Exists`]. Any other failure is returned as it is.
async fn refused(target: &mut Backend, job: &Job, error: StoreError) -> StoreError {
    let Job::Create { run_id, fixed, .. } = job else {
        return error;
    };
    let id = &*fixed.run_id;
    let stored = match target {
        Backend::Sqlite(db) => db.stored(id),
        Backend::Postgres(pool) => sqlx::query_scalar::<_, i64>("SELECT run_key FROM runs WHERE run_id = $1")
            .bind(id)
            .fetch_optional(&*pool)
            .await
            .map(|key| key.is_some())
            .map_err(backend),
    };
    match stored {
        Ok(true) => StoreError::Exists(*run_id),
        _ => error,
    }
}

/// Where PostgreSQL's statements go: each is run in the transaction as it is
/// made, with the arguments bound so far.
struct PgStatements<'a, 'c> {
    tx: &'a mut sqlx::Transaction<'c, sqlx::Postgres>,
    arguments: sqlx::postgres::PgArguments,
}

impl PgStatements<'_, '_> {
    async fn statement(&mut self, sql: String) -> Result<(), StoreError> {
        let arguments = std::mem::take(&mut self.arguments);
        sqlx::query_with(sqlx::AssertSqlSafe(sql), arguments).execute(&mut **self.tx).await.map_err(backend)?;
        Ok(())
    }
}

/// Where SQLite's statements go: each is run on the writer's connection as it
/// is made, with the values bound so far.
struct SqliteStatements<'a> {
    db: &'a mut Direct,
    arguments: Values,
}

impl SqliteStatements<'_> {
    async fn statement(&mut self, sql: String) -> Result<(), StoreError> {
        self.db.statement(&sql, &mut self.arguments)
    }
}

/// Binds the rows of one table as multi-row `INSERT … VALUES (…), (…)` statements.
/// Only placeholders are added to the SQL text ([`values_sql`]); every value is a
/// bound parameter. Rows go in chunks of a power of two (at most [`MAX_ROWS`]),
/// so each table has a handful of statement shapes that stay prepared: parsing a
/// fresh 500-row statement cost as much as running it. The values are bound
/// straight into the statement's arguments ([`Binder`]): `QueryBuilder` wrote
/// each placeholder and separator through `fmt` as it bound the value.
/// `$size` estimates a row's bytes on the wire (see [`chunk_len`]).
macro_rules! insert_rows {
    ($tx:ident, $limit:expr, $postgres:expr, $rows:expr, $size:expr, $head:expr, $tail:expr, |$builder:ident, $row:pat_param| $bind:expr) => {{
        let mut rest = &$rows[..];
        while !rest.is_empty() {
            let (chunk, tail) = rest.split_at(chunk_len(rest, $size, $limit));
            rest = tail;
            let bound = $tx.arguments.len();
            let mut $builder = Binder { arguments: &mut $tx.arguments, error: None };
            for $row in chunk {
                $bind;
            }
            if let Some(error) = $builder.error {
                return Err(StoreError::Backend(format!("cannot bind a value: {error}")));
            }
            let columns = ($tx.arguments.len() - bound) / chunk.len();
            let sql = values_sql($head, $tail, columns, chunk.len(), $postgres);
            $tx.statement(sql).await?;
        }
    }};
}

/// Writes every row of a planned group inside `$tx`: new runs, changed runs (one
/// `UPDATE … FROM` a `VALUES` list), then the children of each table in one
/// multi-row statement. Rows keyed by a primary key are upserts.
macro_rules! write_rows {
    ($tx:ident, $limit:expr, $postgres:expr, $rows:expr) => {{
        // SQLite: OR FAIL, so that a statement needs no statement journal (see migration 3).
        let or = if $postgres { "" } else { "OR FAIL " };
        let GroupWrite {
            created,
            updated,
            progressed,
            carried: _,
            events,
            messages,
            tool_executions,
            plans,
            reviews,
            documents,
        } = $rows;
        insert_rows!(
            $tx,
            $limit,
            $postgres,
            created,
            |(_, fixed, state): &(RunId, Fixed, RunState)| fixed.run_id.len()
                + fixed.input.len()
                + fixed.limits.len()
                + fixed.metadata.as_ref().map_or(0, |text| text.len())
                + state.usage.len()
                + state.final_output.as_ref().map_or(0, |text| text.len())
                + state.reason.as_ref().map_or(0, |text| text.len())
                + 128,
            &format!(
                "INSERT {or}INTO runs (run_key, run_id, tenant, parent_run_id, agent, input, limits, status, reason, \
             turn, usage, final_output, last_seq, message_count, tool_count, document_count, created_at, updated_at, \
             ended_at, thread_id, metadata, idempotency_key, request_fingerprint, traceparent) "
            ),
            "",
            |row, (_, fixed, state)| {
                row.push_bind(state.key)
                    .push_bind(fixed.run_id.clone())
                    .push_bind(state.tenant.clone())
                    .push_bind(fixed.parent_run_id.clone())
                    .push_bind(fixed.agent.clone())
                    .push_bind(fixed.input.clone())
                    .push_bind(fixed.limits.clone())
                    .push_bind(state.status.clone())
                    .push_bind(state.reason.clone())
                    .push_bind(state.turn)
                    .push_bind(state.usage.clone())
                    .push_bind(state.final_output.clone())
                    .push_bind(state.last_seq)
                    .push_bind(state.message_count)
                    .push_bind(state.tool_count)
                    .push_bind(state.document_count)
                    .push_bind(fixed.created_at.clone())
                    .push_bind(state.updated_at.clone())
                    .push_bind(ended_at(state))
                    .push_bind(fixed.thread_id.clone())
                    .push_bind(fixed.metadata.clone())
                    .push_bind(fixed.idempotency_key.clone())
                    .push_bind(fixed.request_fingerprint.clone())
                    .push_bind(fixed.traceparent.clone())
            }
        );
        insert_rows!(
            $tx,
            $limit,
            $postgres,
            updated,
            |(_, state): &(RunId, RunState)| state.usage.len()
                + state.final_output.as_ref().map_or(0, |text| text.len())
                + state.reason.as_ref().map_or(0, |text| text.len())
                + 128,
            "WITH changed (run_key, status, reason, turn, usage, final_output, last_seq, message_count, tool_count, \
             document_count, updated_at, ended_at) AS (",
            &format!(
                ") UPDATE {or}runs SET status = changed.status, reason = changed.reason, turn = changed.turn, \
             usage = changed.usage, final_output = changed.final_output, last_seq = changed.last_seq, \
             message_count = changed.message_count, tool_count = changed.tool_count, \
             document_count = changed.document_count, updated_at = changed.updated_at, ended_at = changed.ended_at \
             FROM changed WHERE runs.run_key = changed.run_key"
            ),
            |row, (_, state)| {
                row.push_bind(state.key)
                    .push_bind(state.status.clone())
                    .push_bind(state.reason.clone())
                    .push_bind(state.turn)
                    .push_bind(state.usage.clone())
                    .push_bind(state.final_output.clone())
                    .push_bind(state.last_seq)
                    .push_bind(state.message_count)
                    .push_bind(state.tool_count)
                    .push_bind(state.document_count)
                    .push_bind(state.updated_at.clone())
                    .push_bind(ended_at(state))
            }
        );
        // Not `status` (nor `ended_at`): SQLite rewrites the entries of every index
        // on a column an `UPDATE` sets, whether or not its value changed.
        insert_rows!(
            $tx,
            $limit,
            $postgres,
            progressed,
            |(_, state): &(RunId, RunState)| state.usage.len() + 96,
            "WITH changed (run_key, turn, usage, last_seq, message_count, tool_count, document_count, updated_at) AS (",
            &format!(
                ") UPDATE {or}runs SET turn = changed.turn, usage = changed.usage, last_seq = changed.last_seq, \
             message_count = changed.message_count, tool_count = changed.tool_count, \
             document_count = changed.document_count, updated_at = changed.updated_at \
             FROM changed WHERE runs.run_key = changed.run_key"
            ),
            |row, (_, state)| {
                row.push_bind(state.key)
                    .push_bind(state.turn)
                    .push_bind(state.usage.clone())
                    .push_bind(state.last_seq)
                    .push_bind(state.message_count)
                    .push_bind(state.tool_count)
                    .push_bind(state.document_count)
                    .push_bind(state.updated_at.clone())
            }
        );
        insert_rows!(
            $tx,
            $limit,
            $postgres,
            events,
            |row: &EventRow| row.body.len() + row.progress.usage.len() + 96,
            &format!(
                "INSERT {or}INTO run_events (run_key, last_seq, first_seq, tenant, body, turn, usage, \
             message_count, tool_count, document_count, committed_at) "
            ),
            "",
            |row, EventRow { last, first, body, progress }| {
                let Progress { key, tenant, turn, usage, message_count, tool_count, document_count, updated_at } =
                    progress;
                row.push_bind(*key)
                    .push_bind(*last)
                    .push_bind(*first)
                    .push_bind(tenant.clone())
                    .push_bind(body.clone())
                    .push_bind(*turn)
                    .push_bind(usage.clone())
                    .push_bind(*message_count)
                    .push_bind(*tool_count)
                    .push_bind(*document_count)
                    .push_bind(updated_at.clone())
            }
        );
        insert_rows!(
            $tx,
            $limit,
            $postgres,
            messages,
            |row: &(i64, i64, Text, i64, Text)| row.4.len(),
            &format!("INSERT {or}INTO messages (run_key, idx, tenant, turn, body) "),
            "",
            |row, (key, idx, tenant, turn, body)| {
                row.push_bind(*key).push_bind(*idx).push_bind(tenant.clone()).push_bind(*turn).push_bind(body.clone())
            }
        );
        insert_rows!(
            $tx,
            $limit,
            $postgres,
            tool_executions,
            |row: &(i64, i64, Text, i64, Text, &str, Text)| row.6.len(),
            &format!("INSERT {or}INTO tool_executions (run_key, turn, call_id, idx, tenant, status, body) "),
            " ON CONFLICT (run_key, turn, call_id) DO UPDATE SET status = excluded.status, body = excluded.body",
            |row, (key, turn, call_id, idx, tenant, status, body)| {
                row.push_bind(*key)
                    .push_bind(*turn)
                    .push_bind(call_id.clone())
                    .push_bind(*idx)
                    .push_bind(tenant.clone())
                    .push_bind(*status)
                    .push_bind(body.clone())
            }
        );
        insert_rows!(
            $tx,
            $limit,
            $postgres,
            plans,
            |row: &(i64, i64, Text, Text)| row.3.len(),
            &format!("INSERT {or}INTO plans (run_key, version, tenant, body) "),
            " ON CONFLICT (run_key, version) DO UPDATE SET body = excluded.body",
            |row, (key, version, tenant, body)| {
                row.push_bind(*key).push_bind(*version).push_bind(tenant.clone()).push_bind(body.clone())
            }
        );
        insert_rows!(
            $tx,
            $limit,
            $postgres,
            reviews,
            |row: &(i64, i64, Text, Text)| row.3.len(),
            &format!("INSERT {or}INTO reviews (run_key, turn, tenant, body) "),
            " ON CONFLICT (run_key, turn) DO UPDATE SET body = excluded.body",
            |row, (key, turn, tenant, body)| {
                row.push_bind(*key).push_bind(*turn).push_bind(tenant.clone()).push_bind(body.clone())
            }
        );
        insert_rows!(
            $tx,
            $limit,
            $postgres,
            documents,
            |row: &(i64, i64, Text, Text)| row.3.len(),
            &format!("INSERT {or}INTO documents (run_key, idx, tenant, body) "),
            "",
            |row, (key, idx, tenant, body)| {
                row.push_bind(*key).push_bind(*idx).push_bind(tenant.clone()).push_bind(body.clone())
            }
        );
    }};
}

/// Writes a planned group in one transaction on SQLite; on failure, what it
/// began is rolled back.
async fn write_sqlite(db: &mut Direct, rows: &GroupWrite) -> Result<(), StoreError> {
    db.begin().await?;
    let written = async {
        let mut statements = SqliteStatements { db: &mut *db, arguments: Values::default() };
        write_rows!(statements, usize::MAX, false, rows);
        statements.db.commit()
    }
    .await;
    if written.is_err() {
        db.roll_back();
    }
    written
}

/// One transaction: read the group's runs (as `runs_now` gives them; nothing else
/// writes a run while the store is open, so they need no lock), check and
/// merge the jobs in memory, write the rows, commit. `Err` means nothing of the
/// group was written; `Ok` carries each job's outcome.
async fn write_group(
    target: &mut Backend,
    node: Option<&Node>,
    jobs: &[Job],
    memory: &mut Memory,
) -> Result<Vec<Result<(), StoreError>>, StoreError> {
    if let Some(node) = node {
        for run_id in node.take_claimed() {
            memory.known.remove(&run_id);
        }
    }
    let mut runs = Map::with_capacity_and_hasher(jobs.len(), Default::default());
    // Runs this group creates: there is nothing to read for them, nor for their
    // commits that follow in the group. (A run created twice fails its insert;
    // see `refused`.)
    let mut created: std::collections::HashSet<RunId, foldhash::fast::RandomState> = Default::default();
    let mut ids: Vec<&Text> = Vec::new();
    for job in jobs {
        let run_id = job.run_id();
        if let Job::Create { .. } = job {
            created.insert(run_id);
        }
        if runs.contains_key(&run_id) || created.contains(&run_id) {
            continue;
        }
        // Taken out of the cache: `remember` puts back what the group committed
        // (a run no job of the group changed is read again next time).
        match memory.known.remove(&run_id) {
            Some(state) => {
                runs.insert(run_id, Slot::read(state));
            }
            None => ids.push(job.id()),
        }
    }
    ids.sort_unstable();
    ids.dedup();
    let now: Text = stamp(Utc::now()).into();
    match target {
        Backend::Sqlite(db) => {
            // The reads come before the transaction: nothing else writes a run
            // while the store is open (retention deletes only ended runs, which
            // refuse every job anyway).
            let mut next_key = match memory.next_key {
                Some(key) => key,
                None => db.largest_key()? + 1,
            };
            if !ids.is_empty() {
                read_sqlite(db, &ids, |row| read_into(&mut runs, row))?;
            }
            let (rows, outcomes) = plan(jobs, runs, &now, &mut next_key);
            write_sqlite(db, &rows).await?;
            memory.next_key = Some(next_key);
            remember(&mut memory.known, rows);
            Ok(outcomes)
        }
        Backend::Postgres(pool) => {
            let mut tx = pool.begin().await.map_err(backend)?;
            // Keys come from a sequence, a block of MAX_GROUP_POSTGRES per group
            // that creates runs: other processes may create runs too (a cluster).
            let mut next_key = if created.is_empty() {
                0
            } else {
                sqlx::query_scalar::<_, i64>("SELECT nextval('run_keys')").fetch_one(&mut *tx).await.map_err(backend)?
            };
            // The runs it does not know yet, in statements of at most
            // PG_STATEMENT_BYTES of ids.
            let mut rest = &ids[..];
            while !rest.is_empty() {
                let (chunk, tail) = rest.split_at(chunk_len(rest, |id| id.len(), PG_STATEMENT_BYTES));
                rest = tail;
                for row in read_postgres(&mut tx, chunk).await? {
                    read_into(&mut runs, &row)?;
                }
            }
            let fenced = match node {
                Some(node) => {
                    let held: Vec<(RunId, i64)> = runs.iter().map(|(id, slot)| (*id, slot.state.key)).collect();
                    let fenced = cluster::fence(&mut tx, node, &held).await?;
                    for run_id in &fenced {
                        runs.remove(run_id);
                    }
                    fenced
                }
                None => Vec::new(),
            };
            let (rows, mut outcomes) = plan(jobs, runs, &now, &mut next_key);
            for (job, outcome) in jobs.iter().zip(&mut outcomes) {
                if fenced.contains(&job.run_id()) {
                    *outcome = Err(StoreError::Fenced(job.run_id()));
                }
            }
            let mut statements = PgStatements { tx: &mut tx, arguments: Default::default() };
            write_rows!(statements, PG_STATEMENT_BYTES, true, &rows);
            let mut owned = Vec::new();
            if let Some(node) = node {
                owned = rows.created.iter().map(|(id, _, state)| (*id, state.key)).collect();
                cluster::own_created(&mut tx, node, &owned).await?;
                let mut written: Vec<&Text> = jobs
                    .iter()
                    .zip(&outcomes)
                    .filter(|(_, outcome)| outcome.is_ok())
                    .map(|(job, _)| job.id())
                    .collect();
                written.sort_unstable();
                written.dedup();
                cluster::announce(&mut tx, node, &written).await?;
            }
            tx.commit().await.map_err(backend)?;
            if let Some(node) = node {
                let ended = rows
                    .created
                    .iter()
                    .map(|(id, _, state)| (id, state))
                    .chain(rows.updated.iter().map(|(id, state)| (id, state)));
                let ended: Vec<RunId> =
                    ended.filter(|(_, state)| TERMINAL.contains(&&*state.status)).map(|(id, _)| *id).collect();
                cluster::committed(node, &owned, ended);
            }
            remember(&mut memory.known, rows);
            Ok(outcomes)
        }
    }
}

/// Adds a run read from the database to the group's runs.
fn read_into(runs: &mut Map<RunId, Slot>, row: &impl Columns) -> Result<(), StoreError> {
    let slot = Slot::read(state_from_row(row)?);
    let run_id = row
        .text("run_id")?
        .parse::<RunId>()
        .map_err(|error| StoreError::Backend(format!("a stored run id is not a UUID: {error}")))?;
    runs.insert(run_id, slot);
    Ok(())
}

/// Keeps the committed state of every run a group wrote, and forgets the runs
/// that ended (no commit can change them again).
fn remember(known: &mut Known, rows: GroupWrite) {
    if known.len() > MAX_KNOWN {
        known.clear();
    }
    let created = rows.created.into_iter().map(|(id, _, state)| (id, state));
    for (id, state) in created.chain(rows.updated).chain(rows.progressed).chain(rows.carried) {
        if TERMINAL.contains(&&*state.status) {
            known.remove(&id);
        } else {
            known.insert(id, state);
        }
    }
}

/// When a run ended (what retention ages it by): the time of the commit that gave
/// it a terminal status; `None` while it has not ended.
fn ended_at(state: &RunState) -> Option<Text> {
    TERMINAL.contains(&&*state.status).then(|| state.updated_at.clone())
}
