//! One `RunStore` contract, run against the memory store, SQLite and PostgreSQL,
//! and whole runs on the SQL stores.
//!
//! PostgreSQL: `TROUPE_TEST_PG_URL` (an admin URL; each test creates its own
//! database) or, without it, the local server at 127.0.0.1:5432. Under CI a missing
//! PostgreSQL fails the tests; elsewhere they say they skipped it.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use serde_json::json;
use troupe::store::SqlStore;
use troupe_actors::config::{AgentConfig, RuntimeConfig};
use troupe_actors::llm::ModelRegistry;
use troupe_actors::protocol::{
    CallStatus, EventKind, Fragment, Limits, Plan, Recommendation, Review, ReviewStatus, RunEvent, RunId, RunStatus,
    TaskStatus, TodoItem, ToolExecutionRecord, Usage,
};
use troupe_actors::store::{
    Commit, MemoryStore, RunQuery, RunRecord, RunSnapshot, RunStore, StoreError, StoreWrite, StoredMessage,
};
use troupe_actors::testing::{EchoTool, LedgerTool, ScriptedModel, calls, text, todo};
use troupe_actors::tool::ToolRegistry;
use troupe_actors::{Deps, Runtime, SubmitRequest};

async fn sqlite() -> (SqlStore, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("troupe-store-{}", RunId::new()));
    let path = dir.join("nested").join("troupe.db");
    let store = SqlStore::connect(&format!("sqlite://{}", path.display())).await.unwrap();
    assert!(path.exists(), "the file and its folders are created");
    (store, dir)
}

/// A store on a fresh PostgreSQL database, or `None` (outside CI) without a server.
async fn postgres() -> Option<SqlStore> {
    let url = postgres_database().await?;
    Some(SqlStore::connect(&url).await.unwrap())
}

/// The URL of a fresh, empty PostgreSQL database, or `None` (outside CI) without a
/// server.
async fn postgres_database() -> Option<String> {
    let configured = std::env::var("TROUPE_TEST_PG_URL").ok();
    let admin = configured.clone().unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let required = configured.is_some() || std::env::var("CI").is_ok();
    let pool = match sqlx::PgPool::connect(&admin).await {
        Ok(pool) => pool,
        Err(error) if required => panic!("PostgreSQL is required here and {admin} failed: {error}"),
        Err(error) => {
            eprintln!("SKIPPED the PostgreSQL half: no server at {admin}: {error}");
            return None;
        }
    };
    let name = format!("troupe_test_{}", RunId::new().to_string().replace('-', ""));
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&pool).await.unwrap();
    let (base, _) = admin.rsplit_once('/').unwrap();
    Some(format!("{base}/{name}"))
}

fn record(run_id: RunId, tenant: &str) -> RunRecord {
    let limits = Limits { max_tokens: Some(1000), ..Limits::default() };
    RunRecord::accepted(run_id, tenant.into(), "agent".into(), "question ✓".into(), limits, Utc::now())
}

fn event(run_id: RunId, seq: u64, kind: EventKind) -> RunEvent {
    RunEvent { run_id, seq, ts: Utc::now(), parent_run_id: None, kind }
}

fn execution(run_id: RunId, call_id: &str, status: CallStatus) -> ToolExecutionRecord {
    ToolExecutionRecord {
        run: run_id,
        turn: 1,
        call_id: call_id.into(),
        tool: "echo".into(),
        args: json!({"text": "x"}),
        started_at: Utc::now(),
        duration_ms: 3,
        cost_usd: 0.0,
        result_summary: "x".into(),
        fragments_added: 0,
        status,
        error: None,
    }
}

fn review() -> Review {
    Review {
        status: ReviewStatus::Ok,
        quality_score: 1.0,
        completeness: 0.5,
        relevance: 1.0,
        needs_more_data: false,
        gaps: vec!["one gap".into()],
        suggested_actions: vec![],
        recommendation: Recommendation::Proceed,
        updated_plan: None,
        notes: "fine".into(),
    }
}

/// What every store must do.
async fn contract(store: Arc<dyn RunStore>) {
    let run_id = RunId::new();
    store.create_run(record(run_id, "acme"), vec![event(run_id, 1, EventKind::TurnStart { turn: 1 })]).await.unwrap();
    assert_eq!(
        store.create_run(record(run_id, "acme"), vec![]).await,
        Err(StoreError::Exists(run_id)),
        "a run id is created once"
    );

    // A commit with everything in it.
    let plan = Plan {
        version: 1,
        items: vec![TodoItem {
            id: "1".into(),
            content: "look".into(),
            status: TaskStatus::InProgress,
            tools: vec![],
            result: None,
            error: None,
        }],
    };
    let message = StoredMessage {
        turn: 1,
        message: troupe_actors::llm::Message::text(troupe_actors::llm::Role::Assistant, "hi"),
    };
    let fragment = Fragment { id: "d1".into(), source: "doc://1".into(), title: "One".into(), snippet: String::new() };
    let writes = vec![
        StoreWrite::Progress { turn: 1, usage: Usage { input_tokens: 10, output_tokens: 5, cost_usd: 0.25 } },
        StoreWrite::Message(message.clone()),
        StoreWrite::Plan(plan.clone()),
        StoreWrite::ToolExecution(execution(run_id, "b", CallStatus::Started)),
        StoreWrite::ToolExecution(execution(run_id, "a", CallStatus::Started)),
        StoreWrite::ToolExecution(execution(run_id, "b", CallStatus::Completed)),
        StoreWrite::Review { turn: 1, review: review() },
        StoreWrite::Documents(vec![fragment.clone()]),
    ];
    let events =
        vec![event(run_id, 2, EventKind::TurnEnd { turn: 1 }), event(run_id, 3, EventKind::TurnStart { turn: 2 })];
    store.commit(&Commit { run_id, writes, events }).await.unwrap();

    // A commit with a seq gap changes nothing.
    let gap = Commit {
        run_id,
        writes: vec![StoreWrite::FinalOutput("never".into())],
        events: vec![event(run_id, 5, EventKind::TurnEnd { turn: 2 })],
    };
    assert_eq!(store.commit(&gap).await, Err(StoreError::SeqConflict { run_id, expected: 4, got: 5 }));
    let missing = RunId::new();
    assert_eq!(
        store.commit(&Commit { run_id: missing, writes: vec![], events: vec![] }).await,
        Err(StoreError::NotFound(missing))
    );

    let snapshot = store.load(run_id).await.unwrap().unwrap();
    assert_eq!(snapshot.last_seq, 3);
    assert_eq!(snapshot.run.input, "question ✓");
    assert_eq!(snapshot.run.limits.max_tokens, Some(1000));
    assert_eq!((snapshot.run.turn, snapshot.run.usage.output_tokens), (1, 5));
    assert_eq!(snapshot.run.final_output, None);
    assert_eq!(snapshot.messages, vec![message]);
    assert_eq!(snapshot.plan, plan);
    let executions: Vec<(String, CallStatus)> =
        snapshot.tool_executions.iter().map(|r| (r.call_id.clone(), r.status)).collect();
    assert_eq!(
        executions,
        vec![("b".into(), CallStatus::Completed), ("a".into(), CallStatus::Started)],
        "upserted in place"
    );
    assert_eq!(snapshot.reviews, vec![(1, review())]);
    assert_eq!(snapshot.documents, vec![fragment]);

    // Events replay in order, after any seq, in pages.
    let all = store.events_after(run_id, 0, 100).await.unwrap();
    assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert_eq!(all[1].kind, EventKind::TurnEnd { turn: 1 });
    assert_eq!(store.events_after(run_id, 1, 1).await.unwrap().iter().map(|e| e.seq).collect::<Vec<_>>(), vec![2]);
    assert_eq!(
        store.events_after(run_id, 2, 10).await.unwrap().iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![3],
        "from the middle of a commit's events"
    );
    assert!(store.events_after(run_id, 3, 10).await.unwrap().is_empty());
    assert!(store.events_after(run_id, 1, 0).await.unwrap().is_empty(), "a limit of none");
    assert_eq!(store.events_after(missing, 0, 10).await, Err(StoreError::NotFound(missing)));

    // Listing is per tenant, by status, newest first; unfinished runs are found.
    // `other` is accepted queued and then started: a status change alone, with
    // no event, is a valid commit.
    let other = RunId::new();
    let mut queued = record(other, "globex");
    queued.status = RunStatus::Queued;
    store.create_run(queued, vec![]).await.unwrap();
    assert_eq!(store.unfinished_runs().await.unwrap(), vec![run_id, other], "queued runs are unfinished");
    let start = vec![StoreWrite::Status { status: RunStatus::Running, reason: None }];
    store.commit(&Commit { run_id: other, writes: start, events: vec![] }).await.unwrap();
    let acme = store.list_runs(RunQuery { tenant: Some("acme".into()), status: None, limit: 10 }).await.unwrap();
    assert_eq!(acme.iter().map(|r| r.run_id).collect::<Vec<_>>(), vec![run_id]);
    let all_runs =
        store.list_runs(RunQuery { tenant: None, status: Some(RunStatus::Running), limit: 10 }).await.unwrap();
    assert_eq!(all_runs.iter().map(|r| r.run_id).collect::<Vec<_>>(), vec![other, run_id]);
    assert_eq!(store.unfinished_runs().await.unwrap(), vec![run_id, other]);

    // An ended run takes no more commits, is not unfinished, and retention removes it.
    let end = vec![event(run_id, 4, EventKind::RunEnd { status: RunStatus::Succeeded, reason: None })];
    let writes = vec![
        StoreWrite::FinalOutput("answer".into()),
        StoreWrite::Status { status: RunStatus::Succeeded, reason: None },
    ];
    store.commit(&Commit { run_id, writes, events: end }).await.unwrap();
    let late = Commit { run_id, writes: vec![], events: vec![event(run_id, 5, EventKind::TurnStart { turn: 3 })] };
    assert_eq!(store.commit(&late).await, Err(StoreError::Terminal(run_id)));
    assert_eq!(store.get_run(run_id).await.unwrap().unwrap().final_output.as_deref(), Some("answer"));
    assert_eq!(store.unfinished_runs().await.unwrap(), vec![other]);
    assert_eq!(store.delete_finished(Utc::now() - chrono::Duration::hours(1), 10).await.unwrap(), 0, "too recent");
    assert_eq!(store.delete_finished(Utc::now() + chrono::Duration::seconds(5), 10).await.unwrap(), 1);
    assert_eq!(store.get_run(run_id).await.unwrap(), None);
    assert_eq!(store.events_after(run_id, 0, 10).await, Err(StoreError::NotFound(run_id)));
    assert!(store.get_run(other).await.unwrap().is_some(), "an unfinished run is kept");
    progress_is_read_back(store.as_ref(), other).await;

    // Creations submitted together (one write group on the SQL stores, which do not
    // read the runs they create): a stored run is refused, the new ones are created.
    let stored = RunId::new();
    store.create_run(record(stored, "initech"), vec![]).await.unwrap();
    let fresh: Vec<RunId> = (0..8).map(|_| RunId::new()).collect();
    let creations = fresh.iter().chain([&stored]).map(|id| store.create_run(record(*id, "initech"), vec![]));
    let outcomes = futures::future::join_all(creations).await;
    assert_eq!(outcomes[..8], vec![Ok(()); 8], "the new runs are created");
    assert_eq!(outcomes[8], Err(StoreError::Exists(stored)), "alongside others, a stored run is still refused");
    for id in &fresh {
        assert_eq!(store.get_run(*id).await.unwrap().map(|run| run.status), Some(RunStatus::Running));
    }
}

/// A running run's turn, usage, time and numbering as reads give them, whether its
/// last commit had events or not (the SQL stores keep the first kind on the row of
/// the commit's events, the other on the run's row).
async fn progress_is_read_back(store: &dyn RunStore, run_id: RunId) {
    let usage = |output_tokens| Usage { input_tokens: 1, output_tokens, cost_usd: 0.0 };
    let said = |turn, text: &str| {
        let message = troupe_actors::llm::Message::text(troupe_actors::llm::Role::Assistant, text);
        StoreWrite::Message(StoredMessage { turn, message })
    };
    let before = store.get_run(run_id).await.unwrap().unwrap().updated_at;
    let writes = vec![StoreWrite::Progress { turn: 1, usage: usage(3) }, said(1, "one")];
    let events = vec![event(run_id, 1, EventKind::TurnStart { turn: 1 })];
    store.commit(&Commit { run_id, writes, events }).await.unwrap();
    let run = store.get_run(run_id).await.unwrap().unwrap();
    assert_eq!((run.turn, run.usage.output_tokens), (1, 3), "progress with events");
    assert!(run.updated_at >= before, "the commit's time");
    let writes = vec![StoreWrite::Progress { turn: 2, usage: usage(9) }, said(2, "two")];
    store.commit(&Commit { run_id, writes, events: vec![] }).await.unwrap();
    let run = store.get_run(run_id).await.unwrap().unwrap();
    assert_eq!((run.turn, run.usage.output_tokens), (2, 9), "progress without events");
    let events = vec![event(run_id, 2, EventKind::TurnEnd { turn: 2 })];
    store.commit(&Commit { run_id, writes: vec![said(2, "three")], events }).await.unwrap();
    let snapshot = store.load(run_id).await.unwrap().unwrap();
    assert_eq!((snapshot.run.turn, snapshot.run.usage.output_tokens, snapshot.last_seq), (2, 9, 2));
    let texts: Vec<String> = snapshot.messages.iter().map(|m| m.message.content.clone()).collect();
    assert_eq!(texts, vec!["one", "two", "three"], "numbered in order across both kinds of commit");
    let listed = store.list_runs(RunQuery { tenant: Some("globex".into()), status: None, limit: 10 }).await.unwrap();
    assert_eq!(listed.iter().map(|run| (run.run_id, run.turn)).collect::<Vec<_>>(), vec![(run_id, 2)]);
}

/// A store opened again (its writer knows no run) goes on from what is on disk:
/// the next seq, the next message number and the progress of a run whose last
/// commit had events.
async fn a_reopened_store_continues(url: &str) {
    let run_id = RunId::new();
    let store = SqlStore::connect(url).await.unwrap();
    store.create_run(record(run_id, "acme"), vec![event(run_id, 1, EventKind::TurnStart { turn: 1 })]).await.unwrap();
    let message = |text: &str| StoredMessage {
        turn: 1,
        message: troupe_actors::llm::Message::text(troupe_actors::llm::Role::Assistant, text),
    };
    let writes = vec![
        StoreWrite::Progress { turn: 1, usage: Usage { input_tokens: 4, output_tokens: 2, cost_usd: 0.0 } },
        StoreWrite::Message(message("before")),
    ];
    let events = vec![event(run_id, 2, EventKind::TurnEnd { turn: 1 })];
    store.commit(&Commit { run_id, writes, events }).await.unwrap();
    drop(store);
    let store = SqlStore::connect(url).await.unwrap();
    let stale = Commit { run_id, writes: vec![], events: vec![event(run_id, 2, EventKind::TurnStart { turn: 2 })] };
    assert_eq!(store.commit(&stale).await, Err(StoreError::SeqConflict { run_id, expected: 3, got: 2 }));
    let events = vec![event(run_id, 3, EventKind::TurnStart { turn: 2 })];
    store.commit(&Commit { run_id, writes: vec![StoreWrite::Message(message("after"))], events }).await.unwrap();
    let snapshot = store.load(run_id).await.unwrap().unwrap();
    assert_eq!((snapshot.run.turn, snapshot.run.usage.input_tokens, snapshot.last_seq), (1, 4, 3));
    let texts: Vec<String> = snapshot.messages.iter().map(|m| m.message.content.clone()).collect();
    assert_eq!(texts, vec!["before", "after"]);
    // A run created by the reopened store gets rows of its own.
    let new = RunId::new();
    store.create_run(record(new, "acme"), vec![]).await.unwrap();
    store
        .commit(&Commit { run_id: new, writes: vec![StoreWrite::Message(message("new"))], events: vec![] })
        .await
        .unwrap();
    let texts = |snapshot: RunSnapshot| snapshot.messages.iter().map(|m| m.message.content.clone()).collect::<Vec<_>>();
    assert_eq!(texts(store.load(new).await.unwrap().unwrap()), vec!["new"]);
    assert_eq!(texts(store.load(run_id).await.unwrap().unwrap()), vec!["before", "after"]);
}

#[tokio::test]
async fn a_reopened_sqlite_store_continues_its_runs() {
    let (store, dir) = sqlite().await;
    drop(store);
    a_reopened_store_continues(&format!("sqlite://{}", dir.join("nested").join("troupe.db").display())).await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_reopened_postgres_store_continues_its_runs() {
    if let Some(url) = postgres_database().await {
        a_reopened_store_continues(&url).await;
    }
}

#[tokio::test]
async fn the_memory_store_keeps_the_contract() {
    contract(Arc::new(MemoryStore::new())).await;
}

#[tokio::test]
async fn the_sqlite_store_keeps_the_contract() {
    let (store, dir) = sqlite().await;
    contract(Arc::new(store)).await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn the_postgres_store_keeps_the_contract() {
    if let Some(store) = postgres().await {
        contract(Arc::new(store)).await;
    }
}

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

/// A runtime on `store` whose agent may echo and write to a ledger.
async fn runtime(store: Arc<dyn RunStore>, model: Arc<ScriptedModel>, ledger: &LedgerTool) -> Runtime {
    let tools = ToolRegistry::new().with(Arc::new(EchoTool)).unwrap().with(Arc::new(ledger.clone())).unwrap();
    let deps = Deps {
        store,
        models: ModelRegistry::new(model),
        tools,
        hooks: Vec::new(),
        agents: vec![AgentConfig::new("default", "", vec!["echo".into(), "ledger".into()])],
    };
    Runtime::start(RuntimeConfig::default(), deps).await.unwrap()
}

/// A run through the whole runtime on `store`, then a restart of the runtime
/// that resumes a parked run from the store.
async fn runs_on(store: Arc<dyn RunStore>) {
    let ledger = LedgerTool::default();
    let model = Arc::new(ScriptedModel::per_turn(vec![
        calls(&[("echo", json!({"text": "a"})), ("ledger", json!({"entry": "one"}))]),
        text("done"),
    ]));
    let first = runtime(store.clone(), model.clone(), &ledger).await;
    let run_id = first.submit(SubmitRequest::new("default", "work")).await.unwrap();
    let record = first.wait(run_id).await.unwrap();
    assert_eq!(record.status, RunStatus::Succeeded);
    let events = store.events_after(run_id, 0, 1000).await.unwrap();
    assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), (1..=events.len() as u64).collect::<Vec<_>>());
    assert_eq!(ledger.lines.lock().unwrap().len(), 1);

    let parked_model =
        Arc::new(ScriptedModel::per_turn(vec![calls(&[("ask_user", json!({"question": "which?"}))]), text("ok")]));
    let second = runtime(store.clone(), parked_model.clone(), &ledger).await;
    let parked = second.submit(SubmitRequest::new("default", "ask me")).await.unwrap();
    let mut stream = second.subscribe(parked, 0);
    while let Some(event) = stream.next().await {
        if matches!(event.unwrap().kind, EventKind::WaitingInput { .. }) {
            break;
        }
    }
    second.shutdown(Duration::from_secs(5)).await;

    let third = runtime(store.clone(), parked_model.clone(), &ledger).await;
    third.input(parked, "this one").await.unwrap();
    assert_eq!(third.wait(parked).await.unwrap().status, RunStatus::Succeeded);
    assert_eq!(parked_model.request_count(), 2, "the committed turn-1 reply was not asked again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_persist_and_resume_on_sqlite() {
    let (store, dir) = sqlite().await;
    runs_on(Arc::new(store)).await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_persist_and_resume_on_postgres() {
    if let Some(store) = postgres().await {
        runs_on(Arc::new(store)).await;
    }
}

#[tokio::test]
async fn an_unsupported_url_is_refused_clearly() {
    let error = match SqlStore::connect("mysql://localhost/x").await {
        Ok(_) => panic!("accepted"),
        Err(error) => error.to_string(),
    };
    assert!(error.contains("use sqlite://… or postgres://…"), "{error}");
}

#[tokio::test]
async fn one_process_drives_a_store_at_a_time() {
    let (first, dir) = sqlite().await;
    let url = format!("sqlite://{}", dir.join("nested").join("troupe.db").display());
    let refused = match SqlStore::connect(&url).await {
        Ok(_) => panic!("a second owner was let in"),
        Err(error) => error.to_string(),
    };
    assert!(refused.contains("another troupe process is using"), "{refused}");
    drop(first);
    SqlStore::connect(&url).await.expect("the store is free again once its owner is gone");
    let _ = std::fs::remove_dir_all(dir);
}

/// The integer key of a run's rows in the child tables, read straight from the file.
async fn run_key(path: &std::path::Path, run_id: RunId) -> i64 {
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display())).await.unwrap();
    let key = sqlx::query_scalar("SELECT run_key FROM runs WHERE run_id = ?")
        .bind(run_id.to_string())
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    key
}

/// The rows of the run of `key` in each child table, read straight from the file.
async fn child_rows(path: &std::path::Path, key: i64) -> Vec<(&'static str, i64)> {
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display())).await.unwrap();
    let mut counts = Vec::new();
    for table in ["run_events", "messages", "tool_executions", "plans", "reviews"] {
        let sql = format!("SELECT COUNT(*) FROM {table} WHERE run_key = ?");
        let count: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).bind(key).fetch_one(&pool).await.unwrap();
        counts.push((table, count));
    }
    pool.close().await;
    counts
}

/// The writer's connection does not enforce foreign keys (it checks each commit's
/// run itself); retention, on the other connections, still deletes a run's rows in
/// every child table with it.
#[tokio::test]
async fn retention_leaves_no_row_of_a_deleted_run_on_sqlite() {
    let (store, dir) = sqlite().await;
    let store = Arc::new(store);
    let ledger = LedgerTool::default();
    let model = Arc::new(ScriptedModel::per_turn(vec![
        calls(&[("todo_write", todo(&[("1", "echo", "in_progress")]))]),
        calls(&[("echo", json!({"text": "a"}))]),
        text("done"),
    ]));
    let runtime = runtime(store.clone(), model, &ledger).await;
    let run_id = runtime.submit(SubmitRequest::new("default", "work")).await.unwrap();
    assert_eq!(runtime.wait(run_id).await.unwrap().status, RunStatus::Succeeded);
    runtime.shutdown(Duration::from_secs(5)).await;
    let path = dir.join("nested").join("troupe.db");
    let key = run_key(&path, run_id).await;
    for (table, count) in child_rows(&path, key).await {
        assert!(count > 0, "the run wrote no row to {table}");
    }
    assert_eq!(store.delete_finished(Utc::now() + chrono::Duration::seconds(5), 10).await.unwrap(), 1);
    for (table, count) in child_rows(&path, key).await {
        assert_eq!(count, 0, "{table} keeps rows of a deleted run");
    }
    let _ = std::fs::remove_dir_all(dir);
}
