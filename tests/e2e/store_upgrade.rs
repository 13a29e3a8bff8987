//! Stores that an older (or newer) troupe left: each schema version a release
//! shipped is migrated on open and keeps its runs; a newer schema is refused.

use chrono::Utc;
use troupe::store::SqlStore;
use troupe_actors::protocol::{EventKind, Limits, RunEvent, RunId, Usage};
use troupe_actors::store::{Commit, RunStore, StoreError, StoreWrite, StoredMessage};

use crate::store::{event, postgres_database, record, sqlite};

/// The first `$version` migrations of `$postgres`'s dialect applied to `$pool`, as
/// an older troupe left its database.
macro_rules! migrated_to {
    ($pool:expr, $postgres:expr, $version:expr) => {{
        let migrations = if $postgres {
            [
                include_str!("../../migrations/postgres/0001_runs.sql"),
                include_str!("../../migrations/postgres/0002_run_counters.sql"),
                include_str!("../../migrations/postgres/0003_deferred_run_keys.sql"),
                include_str!("../../migrations/postgres/0004_event_batches.sql"),
                include_str!("../../migrations/postgres/0005_ended_at.sql"),
                include_str!("../../migrations/postgres/0006_progress_on_commits.sql"),
            ]
        } else {
            [
                include_str!("../../migrations/sqlite/0001_runs.sql"),
                include_str!("../../migrations/sqlite/0002_run_counters.sql"),
                include_str!("../../migrations/sqlite/0003_deferred_run_keys.sql"),
                include_str!("../../migrations/sqlite/0004_event_batches.sql"),
                include_str!("../../migrations/sqlite/0005_ended_at.sql"),
                include_str!("../../migrations/sqlite/0006_progress_on_commits.sql"),
            ]
        };
        sqlx::raw_sql("CREATE TABLE troupe_migrations (version BIGINT PRIMARY KEY, applied_at TEXT NOT NULL)")
            .execute(&$pool)
            .await
            .unwrap();
        for (version, sql) in migrations.into_iter().enumerate().take($version) {
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&$pool).await.unwrap();
            sqlx::query("INSERT INTO troupe_migrations (version, applied_at) VALUES ($1, '2026-01-01T00:00:00Z')")
                .bind(version as i64 + 1)
                .execute(&$pool)
                .await
                .unwrap();
        }
    }};
}

/// Schema v3 with a running run that has three events and a run that ended long
/// ago, as an older troupe left them, made with `$pool` (`$postgres`: which
/// backend); then the store opens the database.
macro_rules! upgraded_from_v3 {
    ($pool:expr, $postgres:expr, $run_id:expr, $ended:expr, $events:expr) => {{
        let pool = $pool;
        let dialect = if $postgres { "postgres" } else { "sqlite" };
        migrated_to!(pool, $postgres, 3);
        let id = $run_id.to_string();
        for (run, status, last_seq) in [(id.clone(), "running", 3), ($ended.to_string(), "succeeded", 0)] {
            sqlx::query(
                "INSERT INTO runs (run_id, tenant, agent, input, limits, status, turn, usage, last_seq, created_at, \
                 updated_at) VALUES ($1, 'acme', 'agent', 'question', $2, $3, 1, $4, $5, \
                 '2026-01-01T00:00:00.000000Z', '2026-01-01T00:00:00.000000Z')",
            )
            .bind(run)
            .bind(serde_json::to_string(&Limits::default()).unwrap())
            .bind(status)
            .bind(serde_json::to_string(&Usage::default()).unwrap())
            .bind(last_seq as i64)
            .execute(&pool)
            .await
            .unwrap();
        }
        for event in $events {
            sqlx::query("INSERT INTO run_events (run_id, seq, tenant, kind, body) VALUES ($1, $2, 'acme', $3, $4)")
                .bind(&id)
                .bind(event.seq as i64)
                .bind(event.kind.name())
                .bind(serde_json::to_string(event).unwrap())
                .execute(&pool)
                .await
                .unwrap();
        }
        pool.close().await;
        eprintln!("{dialect}: schema v3 with one run written");
    }};
}

/// What an upgraded store must show: the old events, replayable from any seq, a
/// new commit continuing their sequence, and the old ended run aged by its end.
async fn keeps_the_runs_of_v3(store: SqlStore, run_id: RunId, ended: RunId, events: Vec<RunEvent>) {
    let seqs = |events: Vec<RunEvent>| events.iter().map(|e| e.seq).collect::<Vec<_>>();
    assert_eq!(store.events_after(run_id, 0, 10).await.unwrap(), events, "every event, unchanged");
    assert_eq!(seqs(store.events_after(run_id, 1, 1).await.unwrap()), vec![2]);
    let next =
        vec![event(run_id, 4, EventKind::TurnEnd { turn: 1 }), event(run_id, 5, EventKind::TurnStart { turn: 2 })];
    store.commit(&Commit { run_id, writes: vec![], events: next }).await.unwrap();
    assert_eq!(seqs(store.events_after(run_id, 2, 10).await.unwrap()), vec![3, 4, 5]);
    let gap = Commit { run_id, writes: vec![], events: vec![event(run_id, 4, EventKind::TurnEnd { turn: 2 })] };
    assert_eq!(store.commit(&gap).await, Err(StoreError::SeqConflict { run_id, expected: 6, got: 4 }));
    assert_eq!(store.load(run_id).await.unwrap().unwrap().last_seq, 5);
    assert_eq!(store.delete_finished(Utc::now() - chrono::Duration::days(1), 10).await.unwrap(), 1);
    assert_eq!(store.get_run(ended).await.unwrap(), None, "ended in January: retention deletes it");
    assert!(store.get_run(run_id).await.unwrap().is_some(), "an unfinished run is kept");
}

fn v3_events(run_id: RunId) -> Vec<RunEvent> {
    vec![
        event(run_id, 1, EventKind::RunStarted { agent: "agent".into(), input: "question".into() }),
        event(run_id, 2, EventKind::TurnStart { turn: 1 }),
        event(run_id, 3, EventKind::AssistantDelta { turn: 1, text: "hel".into(), reasoning: false }),
    ]
}

/// A new, empty SQLite file as an older troupe would start from: its folder, its
/// URL and a plain pool on it.
async fn empty_sqlite_file() -> (std::path::PathBuf, String, sqlx::SqlitePool) {
    let dir = std::env::temp_dir().join(format!("troupe-store-{}", RunId::new()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("troupe.db").display());
    let options: sqlx::sqlite::SqliteConnectOptions = url.parse().unwrap();
    let pool = sqlx::SqlitePool::connect_with(options.create_if_missing(true)).await.unwrap();
    (dir, url, pool)
}

#[tokio::test]
async fn a_sqlite_store_of_schema_v3_keeps_its_runs() {
    let (dir, url, pool) = empty_sqlite_file().await;
    let (run_id, ended) = (RunId::new(), RunId::new());
    let events = v3_events(run_id);
    upgraded_from_v3!(pool, false, run_id, ended, &events);
    keeps_the_runs_of_v3(SqlStore::connect(&url).await.unwrap(), run_id, ended, events).await;
    let _ = std::fs::remove_dir_all(dir);
}

/// A store a newer troupe migrated is refused, not written with the wrong schema.
#[tokio::test]
async fn a_store_of_a_newer_schema_is_refused() {
    let (store, dir) = sqlite().await;
    drop(store);
    let path = dir.join("nested").join("troupe.db");
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display())).await.unwrap();
    sqlx::query("INSERT INTO troupe_migrations (version, applied_at) VALUES (999, '2030-01-01T00:00:00Z')")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let refused = match SqlStore::connect(&format!("sqlite://{}", path.display())).await {
        Ok(_) => panic!("a store of schema 999 was opened"),
        Err(error) => error.to_string(),
    };
    assert!(refused.contains("schema version 999, newer than this build"), "{refused}");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_postgres_store_of_schema_v3_keeps_its_runs() {
    let Some(url) = postgres_database().await else { return };
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let (run_id, ended) = (RunId::new(), RunId::new());
    let events = v3_events(run_id);
    upgraded_from_v3!(pool, true, run_id, ended, &events);
    keeps_the_runs_of_v3(SqlStore::connect(&url).await.unwrap(), run_id, ended, events).await;
}

/// Schema v6 as an older troupe left it: a running run whose progress is on the
/// row of its last commit's events (not on its `runs` row), with one message, and
/// a run that ended long ago; then the store opens the database (schema v7 names
/// the child rows' run by an integer key).
macro_rules! upgraded_from_v6 {
    ($pool:expr, $postgres:expr, $run_id:expr, $ended:expr, $events:expr, $message:expr) => {{
        let pool = $pool;
        migrated_to!(pool, $postgres, 6);
        let id = $run_id.to_string();
        for (run, status, last_seq, ended_at) in [
            (id.clone(), "running", 1, None),
            ($ended.to_string(), "succeeded", 0, Some("2026-01-01T00:00:00.000000Z")),
        ] {
            sqlx::query(
                "INSERT INTO runs (run_id, tenant, agent, input, limits, status, turn, usage, last_seq, created_at, \
                 updated_at, ended_at) VALUES ($1, 'acme', 'agent', 'question', $2, $3, 0, $4, $5, \
                 '2026-01-01T00:00:00.000000Z', '2026-01-01T00:00:00.000000Z', $6)",
            )
            .bind(run)
            .bind(serde_json::to_string(&Limits::default()).unwrap())
            .bind(status)
            .bind(serde_json::to_string(&Usage::default()).unwrap())
            .bind(last_seq as i64)
            .bind(ended_at)
            .execute(&pool)
            .await
            .unwrap();
        }
        let progress = Usage { input_tokens: 7, output_tokens: 2, cost_usd: 0.0 };
        for (first, last, turn, usage, messages, at) in [
            (1, 1, 0, Usage::default(), 0, "2026-01-01T00:00:01.000000Z"),
            (2, 3, 1, progress, 1, "2026-01-01T00:00:02.000000Z"),
        ] {
            sqlx::query(
                "INSERT INTO run_events (run_id, last_seq, first_seq, tenant, body, turn, usage, message_count, \
                 tool_count, document_count, committed_at) VALUES ($1, $2, $3, 'acme', $4, $5, $6, $7, 0, 0, $8)",
            )
            .bind(&id)
            .bind(last as i64)
            .bind(first as i64)
            .bind(serde_json::to_string(&$events[first - 1..last]).unwrap())
            .bind(turn as i64)
            .bind(serde_json::to_string(&usage).unwrap())
            .bind(messages as i64)
            .bind(at)
            .execute(&pool)
            .await
            .unwrap();
        }
        sqlx::query("INSERT INTO messages (run_id, idx, tenant, turn, body) VALUES ($1, 1, 'acme', 1, $2)")
            .bind(&id)
            .bind(serde_json::to_string(&$message).unwrap())
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
    }};
}

/// What a store upgraded from v6 must show: the run's progress from its last
/// commit, its events and message; commits and new runs going on from them (a new
/// run's key after those of the old runs), and retention of the old ended run.
async fn keeps_the_runs_of_v6(
    store: SqlStore,
    run_id: RunId,
    ended: RunId,
    events: Vec<RunEvent>,
    before: StoredMessage,
) {
    let run = store.get_run(run_id).await.unwrap().unwrap();
    assert_eq!((run.turn, run.usage.input_tokens), (1, 7), "progress from the row of the last commit");
    assert_eq!(run.updated_at.to_rfc3339(), "2026-01-01T00:00:02+00:00");
    assert_eq!(store.events_after(run_id, 0, 10).await.unwrap(), events, "every event, unchanged");
    let after = StoredMessage {
        turn: 2,
        message: troupe_actors::llm::Message::text(troupe_actors::llm::Role::Assistant, "after"),
    };
    let next = vec![event(run_id, 4, EventKind::TurnStart { turn: 2 })];
    store.commit(&Commit { run_id, writes: vec![StoreWrite::Message(after.clone())], events: next }).await.unwrap();
    let snapshot = store.load(run_id).await.unwrap().unwrap();
    assert_eq!((snapshot.last_seq, snapshot.run.turn), (4, 1));
    assert_eq!(snapshot.messages, vec![before.clone(), after.clone()], "numbered on from the old message");
    let new = RunId::new();
    store.create_run(record(new, "acme"), vec![event(new, 1, EventKind::TurnStart { turn: 1 })]).await.unwrap();
    let said =
        StoredMessage { turn: 1, message: troupe_actors::llm::Message::text(troupe_actors::llm::Role::User, "new") };
    let writes = vec![StoreWrite::Message(said.clone())];
    store.commit(&Commit { run_id: new, writes, events: vec![] }).await.unwrap();
    assert_eq!(store.load(new).await.unwrap().unwrap().messages, vec![said], "a key of its own");
    assert_eq!(store.load(run_id).await.unwrap().unwrap().messages, vec![before, after]);
    assert_eq!(store.delete_finished(Utc::now() - chrono::Duration::days(1), 10).await.unwrap(), 1);
    assert_eq!(store.get_run(ended).await.unwrap(), None, "ended in January: retention deletes it");
    assert_eq!(store.events_after(run_id, 3, 10).await.unwrap().len(), 1, "the other runs keep their rows");
}

fn v6_message() -> StoredMessage {
    StoredMessage { turn: 1, message: troupe_actors::llm::Message::text(troupe_actors::llm::Role::Assistant, "before") }
}

#[tokio::test]
async fn a_sqlite_store_of_schema_v6_keeps_its_runs() {
    let (dir, url, pool) = empty_sqlite_file().await;
    let (run_id, ended) = (RunId::new(), RunId::new());
    let events = v3_events(run_id);
    upgraded_from_v6!(pool, false, run_id, ended, events, v6_message());
    keeps_the_runs_of_v6(SqlStore::connect(&url).await.unwrap(), run_id, ended, events, v6_message()).await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_postgres_store_of_schema_v6_keeps_its_runs() {
    let Some(url) = postgres_database().await else { return };
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let (run_id, ended) = (RunId::new(), RunId::new());
    let events = v3_events(run_id);
    upgraded_from_v6!(pool, true, run_id, ended, events, v6_message());
    keeps_the_runs_of_v6(SqlStore::connect(&url).await.unwrap(), run_id, ended, events, v6_message()).await;
}
