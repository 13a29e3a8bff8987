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
    TaskStatus, ThreadId, TodoItem, ToolCall, ToolExecutionRecord, Usage,
};
use troupe_actors::store::{
    Commit, Idempotency, MemoryStore, Metadata, RunQuery, RunRecord, RunSnapshot, RunStore, StoreError, StoreWrite,
    StoredMessage, ThreadQuery, ThreadRecord, ThreadSummary,
};
use troupe_actors::testing::{EchoTool, LedgerTool, ScriptedModel, calls, text, todo};
use troupe_actors::tool::ToolRegistry;
use troupe_actors::{Deps, Runtime, SubmitRequest};

pub(crate) async fn sqlite() -> (SqlStore, std::path::PathBuf) {
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
pub(crate) async fn postgres_database() -> Option<String> {
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

pub(crate) fn record(run_id: RunId, tenant: &str) -> RunRecord {
    let limits = Limits { max_tokens: Some(1000), ..Limits::default() };
    RunRecord::accepted(run_id, tenant.into(), "agent".into(), "question ✓".into(), limits, Utc::now())
}

pub(crate) fn event(run_id: RunId, seq: u64, kind: EventKind) -> RunEvent {
    RunEvent { run_id, seq, ts: Utc::now(), parent_run_id: None, kind }
}

fn execution(run_id: RunId, call_id: &str, status: CallStatus) -> ToolExecutionRecord {
    let call = ToolCall { call_id: call_id.into(), name: "echo".into(), args: json!({"text": "x"}) };
    let mut record = ToolExecutionRecord::started(run_id, "a", "local".into(), 1, &call);
    record.duration_ms = 3;
    record.result_summary = "x".into();
    record.status = status;
    record.error_message = Some("a detail".into()).filter(|_| status == CallStatus::Failed);
    record
}

fn review() -> Review {
    Review {
        status: ReviewStatus::Ok,
        quality_score: 1.0,
        completeness: 0.5,
        relevance: 1.0,
        needs_more_data: false,
        gaps: vec!["one gap".into()],
        suggested_actions: vec![troupe_actors::protocol::SuggestedAction::reason("answer")],
        recommendation: Recommendation::Proceed,
        question: Some("which one?".into()),
        updated_plan: None,
        notes: "fine".into(),
        usage: Default::default(),
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
    let (tenant, events) = store.tenant_and_events_after(run_id, 0, 10).await.unwrap().expect("the run");
    assert_eq!(tenant, "acme");
    assert_eq!(events.iter().map(|event| event.seq).collect::<Vec<_>>(), vec![1]);
    let (_, events) = store.tenant_and_events_after(run_id, 1, 10).await.unwrap().expect("the run");
    assert!(events.is_empty(), "nothing after the last event, and the run is still known");
    assert_eq!(store.tenant_and_events_after(RunId::new(), 0, 10).await.unwrap(), None, "no such run");

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
    let acme = store
        .list_runs(RunQuery {
            tenant: Some("acme".into()),
            status: None,
            limit: 10,
            after: None,
            ..RunQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(acme.iter().map(|r| r.run_id).collect::<Vec<_>>(), vec![run_id]);
    let all_runs = store
        .list_runs(RunQuery {
            tenant: None,
            status: Some(RunStatus::Running),
            limit: 10,
            after: None,
            ..RunQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(all_runs.iter().map(|r| r.run_id).collect::<Vec<_>>(), vec![other, run_id]);
    let older = RunQuery {
        tenant: None,
        status: Some(RunStatus::Running),
        limit: 10,
        after: Some(other),
        ..RunQuery::default()
    };
    let older = store.list_runs(older).await.unwrap();
    assert_eq!(older.iter().map(|r| r.run_id).collect::<Vec<_>>(), vec![run_id], "after: only older runs");
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
    assert_eq!(store.tenant_and_events_after(run_id, 0, 10).await.unwrap(), None, "a deleted run belongs to no one");
    assert_eq!(store.events_after(run_id, 0, 10).await, Err(StoreError::NotFound(run_id)));
    assert!(store.get_run(other).await.unwrap().is_some(), "an unfinished run is kept");
    progress_is_read_back(store.as_ref(), other).await;

    // One run deleted: refused while it runs, then gone with everything it owns.
    let doomed = RunId::new();
    store.create_run(record(doomed, "acme"), vec![event(doomed, 1, EventKind::TurnStart { turn: 1 })]).await.unwrap();
    assert_eq!(store.delete_ended(doomed).await, Ok(false), "a running run is not deleted");
    assert!(store.get_run(doomed).await.unwrap().is_some());
    let said = troupe_actors::llm::Message::text(troupe_actors::llm::Role::Assistant, "bye");
    let end = Commit {
        run_id: doomed,
        writes: vec![
            StoreWrite::Message(StoredMessage { turn: 1, message: said }),
            StoreWrite::Status { status: RunStatus::Failed, reason: Some("gave up".into()) },
        ],
        events: vec![event(doomed, 2, EventKind::RunEnd { status: RunStatus::Failed, reason: Some("gave up".into()) })],
    };
    store.commit(&end).await.unwrap();
    assert_eq!(store.delete_ended(doomed).await, Ok(true));
    assert_eq!(store.get_run(doomed).await.unwrap(), None);
    assert!(store.load(doomed).await.unwrap().is_none(), "its messages and events went with it");
    assert_eq!(store.events_after(doomed, 0, 10).await, Err(StoreError::NotFound(doomed)));
    assert_eq!(store.delete_ended(doomed).await, Err(StoreError::NotFound(doomed)));

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
    let listed = store
        .list_runs(RunQuery {
            tenant: Some("globex".into()),
            status: None,
            limit: 10,
            after: None,
            ..RunQuery::default()
        })
        .await
        .unwrap();
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

/// What every store must do with threads, a run's thread and metadata, and
/// idempotency keys.
async fn thread_contract(store: Arc<dyn RunStore>) {
    let threads = store.threads();
    let metadata = |pairs: &[(&str, serde_json::Value)]| -> Metadata {
        pairs.iter().map(|(key, value)| ((*key).to_owned(), value.clone())).collect()
    };
    let thread = |tenant: &str, key: Option<&str>| ThreadRecord {
        thread_id: ThreadId::new(),
        tenant: tenant.into(),
        agent: "agent".into(),
        metadata: metadata(&[("user", json!("ada")), ("priority", json!(2))]),
        created_at: Utc::now(),
        updated_at: Utc::now(),
        idempotency: key.map(|key| Idempotency { key: key.into(), fingerprint: format!("print-{key}") }),
        summary: None,
    };
    let first = thread("acme", Some("k1"));
    let second = thread("acme", None);
    let other = thread("globex", Some("k1"));
    for created in [&first, &second, &other] {
        threads.create_thread(created.clone()).await.unwrap();
    }
    let stored = threads.get_thread(first.thread_id).await.unwrap().unwrap();
    assert_eq!((stored.thread_id, &stored.tenant, &stored.metadata), (first.thread_id, &first.tenant, &first.metadata));
    assert_eq!(threads.get_thread(ThreadId::new()).await.unwrap(), None);

    // Pages, newest first, of one tenant.
    let page = |after| ThreadQuery { tenant: Some("acme".into()), limit: 1, after };
    let newest = threads.list_threads(page(None)).await.unwrap();
    assert_eq!(newest.iter().map(|t| t.thread_id).collect::<Vec<_>>(), vec![second.thread_id]);
    let older = threads.list_threads(page(Some(second.thread_id))).await.unwrap();
    assert_eq!(older.iter().map(|t| t.thread_id).collect::<Vec<_>>(), vec![first.thread_id]);
    assert!(threads.list_threads(page(Some(first.thread_id))).await.unwrap().is_empty());

    // Idempotency keys are per tenant and within the window.
    let since = Utc::now() - chrono::TimeDelta::hours(24);
    let found = threads.thread_by_idempotency_key("acme", "k1", since).await.unwrap().unwrap();
    assert_eq!((found.0.thread_id, found.1.as_str()), (first.thread_id, "print-k1"));
    assert!(threads.thread_by_idempotency_key("acme", "k2", since).await.unwrap().is_none());
    let later = Utc::now() + chrono::TimeDelta::seconds(5);
    assert!(threads.thread_by_idempotency_key("acme", "k1", later).await.unwrap().is_none(), "outside the window");

    let changed = metadata(&[("user", json!("grace"))]);
    let updated = threads.update_thread(first.thread_id, changed.clone(), Utc::now()).await.unwrap().unwrap();
    assert_eq!(updated.metadata, changed);
    assert_eq!(threads.get_thread(first.thread_id).await.unwrap().unwrap().metadata, changed);
    assert_eq!(threads.update_thread(ThreadId::new(), changed, Utc::now()).await.unwrap(), None);
    let summary = ThreadSummary { text: "Ada asked about parcels.".into(), through: RunId::new() };
    assert!(threads.set_thread_summary(first.thread_id, summary.clone()).await.unwrap());
    assert_eq!(threads.get_thread(first.thread_id).await.unwrap().unwrap().summary, Some(summary.clone()));
    assert!(!threads.set_thread_summary(ThreadId::new(), summary).await.unwrap());

    // Runs of the thread, with metadata and an idempotency key.
    let mut runs = Vec::new();
    for (index, label) in ["inbox", "calendar", "inbox"].into_iter().enumerate() {
        let run_id = RunId::new();
        let mut run = record(run_id, "acme");
        run.thread_id = Some(first.thread_id);
        run.metadata = metadata(&[("source", json!(label)), ("n", json!(index))]);
        run.idempotency = Some(Idempotency { key: format!("run-{index}"), fingerprint: format!("f{index}") });
        store.create_run(run, vec![event(run_id, 1, EventKind::TurnStart { turn: 1 })]).await.unwrap();
        runs.push(run_id);
    }
    let loose = RunId::new();
    store.create_run(record(loose, "acme"), vec![]).await.unwrap();
    let read = store.get_run(runs[1]).await.unwrap().unwrap();
    assert_eq!(read.thread_id, Some(first.thread_id));
    assert_eq!(read.metadata, metadata(&[("source", json!("calendar")), ("n", json!(1))]));
    assert_eq!(store.get_run(loose).await.unwrap().unwrap().metadata, Metadata::new(), "no metadata reads as {{}}");

    let listed = |query: RunQuery| {
        let store = store.clone();
        async move { store.list_runs(query).await.unwrap().into_iter().map(|run| run.run_id).collect::<Vec<_>>() }
    };
    let of_thread = RunQuery { thread_id: Some(first.thread_id), limit: 10, ..RunQuery::default() };
    assert_eq!(listed(of_thread.clone()).await, vec![runs[2], runs[1], runs[0]]);
    let inbox = RunQuery { metadata: vec![("source".into(), "inbox".into())], limit: 10, ..RunQuery::default() };
    assert_eq!(listed(inbox).await, vec![runs[2], runs[0]]);
    let both = RunQuery {
        metadata: vec![("source".into(), "inbox".into()), ("user".into(), "x".into())],
        limit: 10,
        ..RunQuery::default()
    };
    assert!(listed(both).await.is_empty(), "every filter must hold");
    let number = RunQuery { metadata: vec![("n".into(), "1".into())], limit: 10, ..RunQuery::default() };
    assert!(listed(number).await.is_empty(), "a filter matches string values only");
    let found = threads.run_by_idempotency_key("acme", "run-1", since).await.unwrap().unwrap();
    assert_eq!((found.0.run_id, found.1.as_str()), (runs[1], "f1"));
    assert!(threads.run_by_idempotency_key("globex", "run-1", since).await.unwrap().is_none());

    // A thread with a run that has not ended is not deleted; once they end, it
    // goes with its runs (and nothing else).
    assert_eq!(threads.delete_thread(first.thread_id).await, Ok(false));
    assert!(threads.get_thread(first.thread_id).await.unwrap().is_some());
    for run_id in &runs {
        let end = Commit {
            run_id: *run_id,
            writes: vec![StoreWrite::Status { status: RunStatus::Succeeded, reason: None }],
            events: vec![event(*run_id, 2, EventKind::RunEnd { status: RunStatus::Succeeded, reason: None })],
        };
        store.commit(&end).await.unwrap();
    }
    assert_eq!(threads.delete_thread(first.thread_id).await, Ok(true));
    assert_eq!(threads.get_thread(first.thread_id).await.unwrap(), None);
    for run_id in &runs {
        assert_eq!(store.get_run(*run_id).await.unwrap(), None);
    }
    assert!(store.get_run(loose).await.unwrap().is_some(), "a run of no thread stays");
    assert!(threads.get_thread(second.thread_id).await.unwrap().is_some(), "other threads stay");
    assert_eq!(threads.delete_thread(first.thread_id).await, Err(StoreError::ThreadNotFound(first.thread_id)));

    // Retention ages a thread as a whole: an ended run of a thread that goes on
    // stays; once every run has ended, the runs go, and then the thread.
    let aged = thread("acme", None);
    threads.create_thread(aged.clone()).await.unwrap();
    let (early, late) = (RunId::new(), RunId::new());
    for run_id in [early, late] {
        let mut run = record(run_id, "acme");
        run.thread_id = Some(aged.thread_id);
        store.create_run(run, vec![]).await.unwrap();
    }
    let end = |run_id| Commit {
        run_id,
        writes: vec![StoreWrite::Status { status: RunStatus::Succeeded, reason: None }],
        events: vec![event(run_id, 1, EventKind::RunEnd { status: RunStatus::Succeeded, reason: None })],
    };
    store.commit(&end(early)).await.unwrap();
    let later = Utc::now() + chrono::Duration::seconds(5);
    assert_eq!(store.delete_finished(later, 10).await.unwrap(), 0, "the thread goes on: its first run stays");
    assert!(store.get_run(early).await.unwrap().is_some());
    store.commit(&end(late)).await.unwrap();
    assert_eq!(store.delete_finished(later, 10).await.unwrap(), 2);
    assert_eq!(threads.get_thread(aged.thread_id).await.unwrap(), None, "then the thread goes");
    assert!(store.get_run(loose).await.unwrap().is_some(), "a run that has not ended stays");
}

#[tokio::test]
async fn the_memory_store_keeps_the_contract() {
    contract(Arc::new(MemoryStore::new())).await;
    thread_contract(Arc::new(MemoryStore::new())).await;
}

#[tokio::test]
async fn the_sqlite_store_keeps_the_contract() {
    let (store, dir) = sqlite().await;
    contract(Arc::new(store)).await;
    let (store, threads_dir) = sqlite().await;
    thread_contract(Arc::new(store)).await;
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(threads_dir);
}

#[tokio::test]
async fn the_postgres_store_keeps_the_contract() {
    if let Some(store) = postgres().await {
        contract(Arc::new(store)).await;
    }
    if let Some(store) = postgres().await {
        thread_contract(Arc::new(store)).await;
    }
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

/// A store is durable: an in-memory SQLite database is refused, with what to use.
#[tokio::test]
async fn an_in_memory_sqlite_url_is_refused_clearly() {
    for url in ["sqlite::memory:", "sqlite://:memory:", "sqlite://runs.db?mode=memory&cache=shared"] {
        let error = match SqlStore::connect(url).await {
            Ok(_) => panic!("{url} was accepted"),
            Err(error) => error.to_string(),
        };
        assert!(error.contains("in-memory SQLite database") && error.contains("use sqlite://PATH"), "{url}: {error}");
    }
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

/// The SQLite writer runs its statements on the task's own thread: while another
/// connection holds the database's write lock, a commit waits asleep (the runtime,
/// here a single thread, goes on) and lands once the lock is released.
#[tokio::test(flavor = "current_thread")]
async fn a_sqlite_commit_waits_for_the_write_lock_without_holding_the_runtime() {
    let (store, dir) = sqlite().await;
    let store = Arc::new(store);
    let run_id = RunId::new();
    store.create_run(record(run_id, "acme"), vec![event(run_id, 1, EventKind::TurnStart { turn: 1 })]).await.unwrap();
    let path = dir.join("nested").join("troupe.db");
    let mut holder =
        <sqlx::SqliteConnection as sqlx::Connection>::connect(&format!("sqlite://{}", path.display())).await.unwrap();
    sqlx::query("BEGIN IMMEDIATE").execute(&mut holder).await.unwrap();

    let committing = tokio::spawn({
        let store = store.clone();
        async move {
            let events = vec![event(run_id, 2, EventKind::TurnStart { turn: 2 })];
            store.commit(&Commit { run_id, writes: vec![], events }).await
        }
    });
    // A writer stuck in SQLite's busy wait would hold this thread until the commit
    // gave up (10 s): this short sleep would end that late.
    let slept = std::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(slept.elapsed() < Duration::from_secs(3), "the runtime was held for {:?}", slept.elapsed());
    assert!(!committing.is_finished(), "the commit landed while another connection held the write lock");
    // Reads go on meanwhile.
    assert_eq!(store.events_after(run_id, 0, 10).await.unwrap().len(), 1);

    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
    committing.await.unwrap().expect("the commit lands once the lock is free");
    let seqs: Vec<u64> = store.events_after(run_id, 0, 10).await.unwrap().iter().map(|event| event.seq).collect();
    assert_eq!(seqs, [1, 2]);
    drop(store);
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
    deleted_run_leaves_no_row(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_deleted_by_id_leaves_no_row_on_sqlite() {
    deleted_run_leaves_no_row(true).await;
}

/// A run that wrote a row to every child table, deleted by retention or by its
/// id (`by_id`), leaves none behind.
async fn deleted_run_leaves_no_row(by_id: bool) {
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
    if by_id {
        assert_eq!(store.delete_ended(run_id).await, Ok(true));
    } else {
        assert_eq!(store.delete_finished(Utc::now() + chrono::Duration::seconds(5), 10).await.unwrap(), 1);
    }
    for (table, count) in child_rows(&path, key).await {
        assert_eq!(count, 0, "{table} keeps rows of a deleted run");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A bounded soak: rounds of runs, each followed by retention (a sweep, then the
/// store gives the space back): the SQLite store stays the size of one round
/// instead of growing with every round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_keeps_a_sqlite_store_bounded_under_a_steady_load() {
    let (store, dir) = sqlite().await;
    let store = Arc::new(store);
    let ledger = LedgerTool::default();
    let model = Arc::new(ScriptedModel::per_turn(vec![
        calls(&[("echo", json!({"text": "a line of some length, ".repeat(40)}))]),
        text(&"an answer of some length; ".repeat(40)),
    ]));
    let runtime = runtime(store.clone(), model, &ledger).await;
    let mut sizes = Vec::new();
    for _round in 0..6 {
        let mut ids = Vec::new();
        for index in 0..60 {
            ids.push(runtime.submit(SubmitRequest::new("default", format!("run {index}"))).await.unwrap());
        }
        for id in ids {
            assert_eq!(runtime.wait(id).await.unwrap().status, RunStatus::Succeeded);
        }
        let deleted = troupe::store::retention::sweep(store.as_ref(), 0.0, 25).await.unwrap();
        assert_eq!(deleted, 60, "every finished run of the round, in batches of 25");
        sizes.push(store.compact().await.unwrap().expect("SQLite knows its size"));
    }
    runtime.shutdown(Duration::from_secs(5)).await;
    let first = sizes[0];
    assert!(sizes.iter().all(|size| *size <= first + first / 2), "the store grew round after round: {sizes:?}");
    assert!(store.list_runs(RunQuery::default()).await.unwrap().is_empty());
    let _ = std::fs::remove_dir_all(dir);
}
