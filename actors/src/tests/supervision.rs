//! Supervision: sessions restarted from the store, meltdowns, resumption.

use std::sync::Arc;

use serde_json::json;

use crate::config::{AgentConfig, RestartPolicy, RuntimeConfig};
use crate::llm::ModelRegistry;
use crate::metrics::ACTOR_RESTARTS_TOTAL;
use crate::protocol::{CallStatus, EventKind, RunStatus};
use crate::runtime::{Deps, Runtime, SubmitRequest};
use crate::store::{Commit, MemoryStore, RunStore};
use crate::testing::{EchoTool, FaultyStore, ScriptedModel, calls, capture_metrics, counter, text};
use crate::tests::{AGENT, Setup, collect, tool_messages, wait_for};
use crate::tool::ToolRegistry;

/// Whether the commit records the end of a call of `tool`.
fn ends_call_of(tool: &'static str) -> impl Fn(&Commit) -> bool {
    move |commit| {
        commit.events.iter().any(|e| matches!(&e.kind, EventKind::ToolCallEnd { tool: name, .. } if name == tool))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_session_resumes_from_its_last_commit() {
    capture_metrics();
    let before = counter(ACTOR_RESTARTS_TOTAL, &[("actor", "session")]);
    let model = ScriptedModel::per_turn(vec![calls(&[("echo", json!({"text": "once"}))]), text("done")]);
    let mut setup = Setup::new(model);
    // The session crashes while committing the echo result: the reply and the
    // `started` call are committed, the result is not.
    setup.store = Arc::new(FaultyStore::new(1, ends_call_of("echo")));
    let harness = setup.start().await;
    let (record, events) = harness.run("crash mid-turn").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(harness.requests().len(), 2, "the committed reply of turn 1 is not requested again");
    let ends: Vec<CallStatus> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCallEnd { status, .. } => Some(*status),
            _ => None,
        })
        .collect();
    assert_eq!(ends, vec![CallStatus::Completed], "the idempotent call is re-run once");
    assert_eq!(counter(ACTOR_RESTARTS_TOTAL, &[("actor", "session")]) - before, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_side_effect_cut_off_by_a_crash_is_reported_interrupted_not_repeated() {
    let model = ScriptedModel::per_turn(vec![calls(&[("ledger", json!({"entry": "pay 10"}))]), text("done")]);
    let mut setup = Setup::new(model);
    setup.store = Arc::new(FaultyStore::new(1, ends_call_of("ledger")));
    let harness = setup.start().await;
    let (record, events) = harness.run("pay once").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    let lines = harness.ledger.lines.lock().unwrap().clone();
    assert_eq!(lines.len(), 1, "the side effect happened exactly once: {lines:?}");
    assert_eq!(lines[0].0, format!("{}:1:0", record.run_id), "with the deterministic idempotency key");
    assert!(events.iter().any(|e| matches!(&e.kind, EventKind::ToolCallEnd { status: CallStatus::Interrupted, .. })));
    assert!(tool_messages(&harness.requests()[1])[0].starts_with("interrupted"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_keeps_crashing_fails_its_run_and_spares_the_others() {
    capture_metrics();
    let before = counter(ACTOR_RESTARTS_TOTAL, &[("actor", "session")]);
    let doomed = Arc::new(ScriptedModel::per_turn(vec![calls(&[("echo", json!({"text": "trigger"}))])]));
    let healthy = Arc::new(ScriptedModel::per_turn(vec![calls(&[("echo", json!({"text": "fine"}))]), text("ok")]));
    // Every commit that starts the "trigger" call panics.
    let store = Arc::new(FaultyStore::new(usize::MAX, |commit: &Commit| {
        commit
            .events
            .iter()
            .any(|e| matches!(&e.kind, EventKind::ToolCallStart { args, .. } if args["text"] == "trigger"))
    }));
    let mut doomed_agent = AgentConfig::new("doomed", "", vec!["echo".into()]);
    doomed_agent.model = Some("doomed".into());
    let mut healthy_agent = AgentConfig::new("healthy", "", vec!["echo".into()]);
    healthy_agent.model = Some("healthy".into());
    let deps = Deps {
        store,
        models: ModelRegistry::new(healthy.clone()).with("doomed", doomed.clone()).with("healthy", healthy.clone()),
        tools: ToolRegistry::new().with(Arc::new(EchoTool)).unwrap(),
        hooks: Vec::new(),
        agents: vec![doomed_agent, healthy_agent],
    };
    let config = RuntimeConfig {
        restarts: RestartPolicy { max_restarts: 2, ..RestartPolicy::default() },
        ..RuntimeConfig::default()
    };
    let runtime = Runtime::start(config, deps).await.unwrap();
    let doomed_run = runtime.submit(SubmitRequest::new("doomed", "crash")).await.unwrap();
    let healthy_run = runtime.submit(SubmitRequest::new("healthy", "work")).await.unwrap();

    let doomed_record = runtime.wait(doomed_run).await.unwrap();
    let healthy_record = runtime.wait(healthy_run).await.unwrap();
    assert_eq!(doomed_record.status, RunStatus::Failed);
    assert!(doomed_record.reason.as_deref().unwrap().starts_with("supervisor_meltdown"), "{:?}", doomed_record.reason);
    assert_eq!(doomed.request_count(), 3, "first start and two restarts each asked again (the reply never committed)");
    assert_eq!(healthy_record.status, RunStatus::Succeeded);
    assert_eq!(counter(ACTOR_RESTARTS_TOTAL, &[("actor", "session")]) - before, 2);
    let events = collect(runtime.subscribe(doomed_run, 0)).await;
    assert!(matches!(events.last().map(|e| &e.kind), Some(EventKind::RunEnd { status: RunStatus::Failed, .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_run_survives_a_restart_of_the_runtime() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let script =
        || ScriptedModel::per_turn(vec![calls(&[("ask_user", json!({"question": "which account?"}))]), text("done")]);
    let mut setup = Setup::new(script());
    setup.store = store.clone();
    let first = setup.start().await;
    let run_id = first.submit("pay the bill").await;
    let mut events = first.runtime.subscribe(run_id, 0);
    wait_for(&mut events, |kind| matches!(kind, EventKind::WaitingInput { .. })).await;
    first.runtime.shutdown(std::time::Duration::from_secs(5)).await;

    let mut setup = Setup::new(script());
    setup.store = store.clone();
    let second = setup.start().await;
    assert_eq!(second.runtime.get(run_id).await.unwrap().unwrap().status, RunStatus::WaitingInput, "still parked");
    second.runtime.input(run_id, "the work one").await.unwrap();
    let (record, events) = second.finish(run_id).await;

    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(second.requests().len(), 1, "only turn 2 was asked of the new runtime");
    assert_eq!(tool_messages(&second.requests()[0]), vec!["the work one".to_owned()]);
    assert_eq!(events.iter().filter(|e| e.kind.name() == "waiting_input").count(), 1);
    assert_eq!(AGENT, "tester");
}

/// A session stopped by a shutdown commits what it still held (here: a sub-run's
/// spending, booked between commits), instead of losing it with the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_stopped_by_a_shutdown_commits_what_it_held() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let mut setup = Setup::new(ScriptedModel::per_turn(vec![crate::testing::Step::Hang]));
    setup.store = store.clone();
    let harness = setup.start().await;
    let run_id = harness.submit("think forever").await;
    let mut events = harness.runtime.subscribe(run_id, 0);
    wait_for(&mut events, |kind| matches!(kind, EventKind::TurnStart { .. })).await;

    let session = harness.runtime.session(run_id).await.unwrap().expect("the run's session");
    let spent = crate::protocol::Usage { input_tokens: 7, output_tokens: 5, cost_usd: 0.25 };
    session.cast(crate::session::SessionMsg::SubRunSpent { usage: spent }).unwrap();
    // Handled in order: once this is answered, the spending waits in the outbox.
    let text = crate::runtime::RunInput::Text("not now".to_owned());
    let answer = ractor::call!(session, |reply| crate::session::SessionMsg::Input { input: text, reply }).unwrap();
    assert!(answer.is_err(), "the run is not waiting for input");
    let before = store.events_after(run_id, 0, 1_000).await.unwrap();
    assert!(!before.iter().any(|event| matches!(event.kind, EventKind::TokenUsage { .. })), "not yet committed");

    harness.runtime.shutdown(std::time::Duration::from_secs(5)).await;
    let after = store.events_after(run_id, 0, 1_000).await.unwrap();
    let usage = after.iter().find_map(|event| match &event.kind {
        EventKind::TokenUsage { usage, .. } => Some(*usage),
        _ => None,
    });
    assert_eq!(usage, Some(spent), "the spending was committed as the session stopped");
    let seqs: Vec<u64> = after.iter().map(|event| event.seq).collect();
    assert_eq!(seqs, (1..=after.len() as u64).collect::<Vec<_>>());
    assert_eq!(store.get_run(run_id).await.unwrap().unwrap().usage, spent, "and the run's usage with it");
}
