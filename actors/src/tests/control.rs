//! Controlling runs: ask_user, cancel, admission.

use std::time::Duration;

use serde_json::json;

use crate::protocol::{CallStatus, EventKind, RunStatus};
use crate::runtime::{CancelError, InputError, SubmitError, SubmitRequest};
use crate::testing::{ScriptedModel, Step, calls, eventually, text};
use crate::tests::{AGENT, Setup, collect, tool_messages, wait_for, wait_status};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_user_parks_the_run_until_input_arrives() {
    let model = ScriptedModel::per_turn(vec![
        calls(&[("ask_user", json!({"question": "which account?"}))]),
        text("paid from work"),
    ]);
    let harness = Setup::new(model).start().await;
    let run_id = harness.submit("pay the bill").await;
    let mut events = harness.runtime.subscribe(run_id, 0);
    let parked = wait_for(&mut events, |kind| matches!(kind, EventKind::WaitingInput { .. })).await;
    assert!(matches!(&parked.kind, EventKind::WaitingInput { prompt, .. } if prompt == "which account?"));
    assert_eq!(harness.runtime.get(run_id).await.unwrap().unwrap().status, RunStatus::WaitingInput);

    harness.runtime.input(run_id, "the work one").await.unwrap();
    let (record, all) = harness.finish(run_id).await;
    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(tool_messages(&harness.requests()[1]), vec!["the work one".to_owned()]);
    assert!(all.iter().any(|e| matches!(&e.kind, EventKind::InputReceived { text } if text == "the work one")));
    assert_eq!(harness.runtime.input(run_id, "late").await, Err(InputError::NotWaiting));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_for_a_run_that_is_not_waiting_is_refused() {
    let harness = Setup::new(ScriptedModel::per_turn(vec![Step::Hang])).start().await;
    let run_id = harness.submit("think").await;
    assert_eq!(harness.runtime.input(run_id, "hello").await, Err(InputError::NotWaiting));
    assert_eq!(harness.runtime.input(crate::protocol::RunId::new(), "x").await, Err(InputError::NotFound));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_a_run_waiting_on_the_model() {
    let harness = Setup::new(ScriptedModel::per_turn(vec![Step::Hang])).start().await;
    let run_id = harness.submit("think forever").await;
    let mut events = harness.runtime.subscribe(run_id, 0);
    wait_for(&mut events, |kind| matches!(kind, EventKind::TurnStart { .. })).await;

    harness.runtime.cancel(run_id).await.unwrap();
    let (record, all) = harness.finish(run_id).await;
    assert_eq!(record.status, RunStatus::Cancelled);
    assert!(matches!(all.last().map(|e| &e.kind), Some(EventKind::RunEnd { status: RunStatus::Cancelled, .. })));
    assert!(all.iter().any(|e| matches!(&e.kind, EventKind::Review { turn: 1, .. })), "the cut turn is reviewed");
    assert_eq!(harness.runtime.cancel(run_id).await, Err(CancelError::AlreadyEnded(RunStatus::Cancelled)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_interrupts_a_running_tool() {
    let model = ScriptedModel::per_turn(vec![calls(&[("slow", json!({}))])]);
    let harness = Setup::new(model).start().await;
    let run_id = harness.submit("slow work").await;
    let mut events = harness.runtime.subscribe(run_id, 0);
    wait_for(&mut events, |kind| matches!(kind, EventKind::ToolCallStart { .. })).await;

    harness.runtime.cancel(run_id).await.unwrap();
    let (record, _) = harness.finish(run_id).await;
    assert_eq!(record.status, RunStatus::Cancelled);
    let snapshot = harness.runtime.store().load(run_id).await.unwrap().unwrap();
    assert_eq!(snapshot.tool_executions[0].status, CallStatus::Interrupted);
    // The cancelled turn is reviewed: its call counts as interrupted.
    let (turn, review) = snapshot.reviews.last().cloned().expect("a review of the cancelled turn");
    assert_eq!(turn, 1);
    assert!(review.gaps.iter().any(|gap| gap.contains("cancelled by the client")), "{review:?}");
    assert!(review.quality_score < 1.0, "the interrupted call lowers its quality: {review:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_refuses_runs_beyond_the_limit_until_a_slot_frees() {
    let mut setup = Setup::new(ScriptedModel::per_turn(vec![Step::Hang]));
    setup.config.max_active_runs = 1;
    setup.config.max_queued_runs = 0;
    let harness = setup.start().await;
    let first = harness.submit("occupy the slot").await;
    let refused = harness.runtime.submit(SubmitRequest::new(AGENT, "one too many")).await;
    assert_eq!(refused, Err(SubmitError::Overloaded { limit: 1 }));
    let unknown = harness.runtime.submit(SubmitRequest::new("nobody", "hi")).await;
    assert_eq!(unknown, Err(SubmitError::UnknownAgent("nobody".into())));

    harness.runtime.cancel(first).await.unwrap();
    collect(harness.runtime.subscribe(first, 0)).await;
    // The slot frees when the session has stopped, just after its last commit.
    eventually(Duration::from_secs(10), "the slot to free", || async {
        match harness.runtime.submit(SubmitRequest::new(AGENT, "next")).await {
            Ok(_) => true,
            Err(SubmitError::Overloaded { .. }) => false,
            Err(error) => panic!("the slot never freed: {error}"),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_to_an_ended_run_replays_what_is_missing_and_ends() {
    let harness = Setup::new(ScriptedModel::per_turn(vec![text("done")])).start().await;
    let (_, all) = harness.run("finish").await;
    let run_id = all[0].run_id;
    let last = all.last().unwrap().seq;
    // A client that saw everything reconnects: nothing to send, and the stream ends.
    assert!(collect(harness.runtime.subscribe(run_id, last)).await.is_empty());
    // One that missed the last two events gets exactly those.
    let tail = collect(harness.runtime.subscribe(run_id, last - 2)).await;
    assert_eq!(tail.iter().map(|event| event.seq).collect::<Vec<_>>(), vec![last - 1, last]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_limit_is_refused_while_another_tenant_is_admitted() {
    let mut setup = Setup::new(ScriptedModel::per_turn(vec![Step::Hang]));
    setup.config.max_active_runs_per_tenant = 1;
    setup.config.max_queued_runs = 0;
    let harness = setup.start().await;
    let request = |tenant: &str| {
        let mut request = SubmitRequest::new(crate::tests::AGENT, "wait");
        request.tenant = tenant.to_owned();
        request
    };
    harness.runtime.submit(request("a")).await.unwrap();
    assert_eq!(harness.runtime.submit(request("a")).await, Err(SubmitError::TenantOverloaded { limit: 1 }));
    harness.runtime.submit(request("b")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_over_the_limit_waits_queued_and_starts_when_a_slot_frees() {
    let mut setup = Setup::new(ScriptedModel::per_turn(vec![Step::Hang]));
    setup.config.max_active_runs = 1;
    setup.config.max_queued_runs = 1;
    let harness = setup.start().await;
    let first = harness.submit("occupy the slot").await;
    let second = harness.submit("wait in line").await;
    assert_eq!(harness.runtime.get(second).await.unwrap().unwrap().status, RunStatus::Queued);
    assert_eq!(harness.runtime.queued_runs(), 1);
    let full = harness.runtime.submit(SubmitRequest::new(AGENT, "no room")).await;
    assert_eq!(full, Err(SubmitError::Overloaded { limit: 1 }));

    harness.runtime.cancel(first).await.unwrap();
    let mut events = harness.runtime.subscribe(second, 0);
    wait_for(&mut events, |kind| matches!(kind, EventKind::TurnStart { .. })).await;
    wait_status(&harness, second, RunStatus::Running).await;
    assert_eq!(harness.runtime.queued_runs(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_run_that_is_cancelled_never_starts() {
    let mut setup = Setup::new(ScriptedModel::per_turn(vec![Step::Hang]));
    setup.config.max_active_runs = 1;
    let harness = setup.start().await;
    let first = harness.submit("occupy the slot").await;
    let second = harness.submit("give up").await;
    harness.runtime.cancel(second).await.unwrap();
    let (record, events) = harness.finish(second).await;
    assert_eq!(record.status, RunStatus::Cancelled);
    assert!(!events.iter().any(|event| matches!(event.kind, EventKind::TurnStart { .. })));

    harness.runtime.cancel(first).await.unwrap();
    harness.finish(first).await;
    // The freed slot goes to nobody: the cancelled run stays ended.
    let third = harness.submit("after").await;
    let mut events = harness.runtime.subscribe(third, 0);
    wait_for(&mut events, |kind| matches!(kind, EventKind::TurnStart { .. })).await;
    assert_eq!(harness.runtime.get(second).await.unwrap().unwrap().status, RunStatus::Cancelled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_runs_queue_again_after_a_restart() {
    let store: std::sync::Arc<dyn crate::store::RunStore> = std::sync::Arc::new(crate::store::MemoryStore::new());
    let mut setup = Setup::new(ScriptedModel::per_turn(vec![Step::Hang]));
    setup.config.max_active_runs = 1;
    setup.store = store.clone();
    let harness = setup.start().await;
    let first = harness.submit("occupy the slot").await;
    let second = harness.submit("wait in line").await;
    harness.runtime.shutdown(Duration::from_secs(5)).await;

    let mut setup = Setup::new(ScriptedModel::per_turn(vec![Step::Hang]));
    setup.config.max_active_runs = 1;
    setup.store = store;
    let harness = setup.start().await;
    assert_eq!(harness.runtime.get(second).await.unwrap().unwrap().status, RunStatus::Queued);
    assert_eq!(harness.runtime.queued_runs(), 1, "the queued run waits again");
    harness.runtime.cancel(first).await.unwrap();
    wait_status(&harness, second, RunStatus::Running).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_parked_on_a_question_frees_its_slot_until_it_is_answered() {
    let model = ScriptedModel::per_turn(vec![calls(&[("ask_user", json!({"question": "which one?"}))]), Step::Hang]);
    let mut setup = Setup::new(model);
    setup.config.max_active_runs = 1;
    let harness = setup.start().await;
    let parked = harness.submit("ask me").await;
    let mut events = harness.runtime.subscribe(parked, 0);
    wait_for(&mut events, |kind| matches!(kind, EventKind::WaitingInput { .. })).await;

    // The slot comes free once the park is seen by the supervisor.
    let other = eventually(Duration::from_secs(10), "the parked run to give up its slot", || async {
        let run_id = harness.submit("another").await;
        if harness.runtime.get(run_id).await.unwrap().unwrap().status == RunStatus::Running {
            return Some(run_id);
        }
        harness.runtime.cancel(run_id).await.unwrap();
        None
    })
    .await;
    // The answer is taken although the slot is used: the parked run was admitted.
    harness.runtime.input(parked, "the first").await.unwrap();
    wait_for(&mut events, |kind| matches!(kind, EventKind::InputReceived { .. })).await;
    assert_ne!(harness.runtime.get(other).await.unwrap().unwrap().status, RunStatus::Queued);
    assert_eq!(harness.runtime.queued_runs(), 0);
}

/// `held`: a side-effecting call that counts itself done only once the test
/// releases it.
#[derive(Clone)]
struct HeldTool {
    release: std::sync::Arc<tokio::sync::Semaphore>,
    done: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Default for HeldTool {
    fn default() -> Self {
        Self { release: std::sync::Arc::new(tokio::sync::Semaphore::new(0)), done: Default::default() }
    }
}

#[async_trait::async_trait]
impl crate::tool::Tool for HeldTool {
    fn name(&self) -> &str {
        "held"
    }
    fn description(&self) -> &str {
        "Does something outside the run, slowly."
    }
    fn parameters(&self) -> serde_json::Value {
        json!({"type": "object", "properties": {}})
    }
    async fn call(
        &self,
        _context: crate::tool::ToolContext,
        _args: serde_json::Value,
    ) -> Result<crate::tool::ToolOutput, crate::tool::ToolError> {
        let _permit = self.release.acquire().await.map_err(|_| crate::tool::ToolError::failed("closed", "closed"))?;
        self.done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(crate::tool::ToolOutput::value(json!("done")))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_shutdown_lets_calls_in_flight_finish_and_records_them_completed() {
    let held = HeldTool::default();
    let store: std::sync::Arc<dyn crate::store::RunStore> = std::sync::Arc::new(crate::store::MemoryStore::new());
    let mut setup = Setup::new(ScriptedModel::per_turn(vec![calls(&[("held", json!({}))]), text("done")]));
    setup.extra_tools = vec![std::sync::Arc::new(held.clone())];
    setup.store = store.clone();
    let harness = setup.start().await;
    let mut runs = Vec::new();
    for index in 0..3 {
        let run_id = harness.submit(&format!("job {index}")).await;
        let mut events = harness.runtime.subscribe(run_id, 0);
        wait_for(&mut events, |kind| matches!(kind, EventKind::ToolCallStart { .. })).await;
        runs.push(run_id);
    }

    let runtime = std::sync::Arc::new(harness.runtime);
    let stopping = tokio::spawn({
        let runtime = runtime.clone();
        async move { runtime.shutdown(Duration::from_secs(30)).await }
    });
    // Draining sessions refuse input: the shutdown has begun, with the calls still held.
    eventually(Duration::from_secs(10), "the sessions never drained", || async {
        runtime.input(runs[2], "x").await == Err(InputError::Unavailable)
    })
    .await;
    assert_eq!(held.done.load(std::sync::atomic::Ordering::SeqCst), 0);
    held.release.add_permits(3);
    stopping.await.unwrap();

    assert_eq!(held.done.load(std::sync::atomic::Ordering::SeqCst), 3);
    for run_id in runs {
        let snapshot = store.load(run_id).await.unwrap().unwrap();
        let statuses: Vec<CallStatus> = snapshot.tool_executions.iter().map(|record| record.status).collect();
        assert_eq!(statuses, [CallStatus::Completed], "the call that ran is recorded as it ended");
        assert!(!snapshot.run.status.is_terminal(), "the run resumes on the next start");
    }
}
