//! Calls that wait for a human: declared by the tool, or by the seed policy for a
//! run classified as a complaint or with low confidence.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::protocol::{CallStatus, EventKind, RunStatus};
use crate::runtime::{InputError, RunInput};
use crate::store::{MemoryStore, RunStore};
use crate::testing::{ClassifierTool, GatedTool, ScriptedModel, calls, text};
use crate::tests::{Harness, Setup, tool_messages, wait_for};

fn approval(approved: bool, reason: Option<&str>) -> RunInput {
    RunInput::Approval { call_id: None, approved, reason: reason.map(str::to_owned) }
}

async fn gated(model: ScriptedModel, store: Option<Arc<dyn RunStore>>) -> (Harness, GatedTool) {
    let gate = GatedTool::default();
    let mut setup = Setup::new(model);
    setup.extra_tools = vec![Arc::new(gate.clone()), Arc::new(ClassifierTool)];
    if let Some(store) = store {
        setup.store = store;
    }
    (setup.start().await, gate)
}

fn pay_then_answer() -> ScriptedModel {
    ScriptedModel::per_turn(vec![calls(&[("pay", json!({"entry": "invoice 7"}))]), text("Paid.")])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_needs_approval_parks_the_run_and_runs_once_approved() {
    let (harness, gate) = gated(pay_then_answer(), None).await;
    let run_id = harness.submit("pay invoice 7").await;
    let mut events = harness.runtime.subscribe(run_id, 0);
    let requested = wait_for(&mut events, |kind| matches!(kind, EventKind::ApprovalRequested { .. })).await;
    assert!(matches!(&requested.kind, EventKind::ApprovalRequested { tool, reason, .. }
        if tool == "pay" && reason.contains("always needs approval")));
    wait_for(&mut events, |kind| matches!(kind, EventKind::WaitingInput { .. })).await;
    assert_eq!(harness.runtime.get(run_id).await.unwrap().unwrap().status, RunStatus::WaitingInput);
    assert!(gate.ledger.lines.lock().unwrap().is_empty(), "nothing ran before the approval");
    assert!(matches!(
        harness.runtime.input(run_id, "an answer").await,
        Err(InputError::Invalid(message)) if message.contains("approval")
    ));

    harness.runtime.input(run_id, approval(true, None)).await.unwrap();
    let (record, all) = harness.finish(run_id).await;
    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(gate.ledger.lines.lock().unwrap().len(), 1, "the approved call ran once");
    assert!(all.iter().any(|e| matches!(&e.kind, EventKind::ApprovalDecided { approved: true, .. })));
    assert!(all.iter().any(|e| matches!(&e.kind,
        EventKind::ToolCallEnd { tool, status: CallStatus::Completed, .. } if tool == "pay")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_call_never_runs_and_the_model_is_told_why() {
    let (harness, gate) = gated(pay_then_answer(), None).await;
    let run_id = harness.submit("pay invoice 7").await;
    let mut events = harness.runtime.subscribe(run_id, 0);
    wait_for(&mut events, |kind| matches!(kind, EventKind::WaitingInput { .. })).await;
    let unknown = RunInput::Approval { call_id: Some("nope".into()), approved: true, reason: None };
    assert!(matches!(harness.runtime.input(run_id, unknown).await, Err(InputError::Invalid(_))));

    harness.runtime.input(run_id, approval(false, Some("over budget this month"))).await.unwrap();
    let (record, _) = harness.finish(run_id).await;
    assert_eq!(record.status, RunStatus::Succeeded);
    assert!(gate.ledger.lines.lock().unwrap().is_empty());
    let told = tool_messages(&harness.requests()[1]);
    assert!(told[0].contains("rejected") && told[0].contains("over budget this month"), "{told:?}");
}

/// A rejection that ends the turn is durable when the client hears back, though
/// the turn's next commit (its review, with the next turn's start) is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejection_that_ends_the_turn_is_committed_before_the_client_hears_back() {
    let release = Arc::new(tokio::sync::Notify::new());
    let store = {
        let release = release.clone();
        crate::testing::FaultyStore::before_commit(move |commit| {
            let next_turn = commit.events.iter().any(|event| matches!(event.kind, EventKind::TurnStart { turn: 2 }));
            let release = release.clone();
            Box::pin(async move {
                if next_turn {
                    release.notified().await;
                }
            })
        })
    };
    let store: Arc<dyn RunStore> = Arc::new(store);
    let (harness, gate) = gated(pay_then_answer(), Some(store.clone())).await;
    let run_id = harness.submit("pay invoice 7").await;
    let mut events = harness.runtime.subscribe(run_id, 0);
    wait_for(&mut events, |kind| matches!(kind, EventKind::WaitingInput { .. })).await;

    harness.runtime.input(run_id, approval(false, Some("not this one"))).await.unwrap();
    assert_eq!(store.get_run(run_id).await.unwrap().unwrap().status, RunStatus::Running);
    let stored = store.events_after(run_id, 0, 1_000).await.unwrap();
    assert!(stored.iter().any(|e| matches!(e.kind, EventKind::ApprovalDecided { approved: false, .. })));
    let snapshot = store.load(run_id).await.unwrap().unwrap();
    assert_eq!(snapshot.tool_executions.iter().map(|record| record.status).collect::<Vec<_>>(), [CallStatus::Skipped]);

    release.notify_one();
    let (record, _) = harness.finish(run_id).await;
    assert_eq!(record.status, RunStatus::Succeeded);
    assert!(gate.ledger.lines.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_rule_sends_side_effects_of_a_complaint_to_a_human() {
    let script = |label: &str, confidence: f64| {
        ScriptedModel::per_turn(vec![
            calls(&[("classify", json!({"label": label, "confidence": confidence}))]),
            calls(&[("ledger", json!({"entry": "refund"}))]),
            text("Done."),
        ])
    };
    for (label, confidence, gated_call) in
        [("complaint", 0.95, true), ("question", 0.5, true), ("question", 0.95, false)]
    {
        let (harness, _) = gated(script(label, confidence), None).await;
        let run_id = harness.submit("handle this email").await;
        if gated_call {
            let mut events = harness.runtime.subscribe(run_id, 0);
            let requested = wait_for(&mut events, |kind| matches!(kind, EventKind::ApprovalRequested { .. })).await;
            assert!(matches!(&requested.kind, EventKind::ApprovalRequested { tool, .. } if tool == "ledger"));
            assert!(harness.ledger.lines.lock().unwrap().is_empty(), "{label} {confidence}");
            harness.runtime.input(run_id, approval(true, None)).await.unwrap();
        }
        let (record, all) = harness.finish(run_id).await;
        assert_eq!(record.status, RunStatus::Succeeded);
        assert_eq!(harness.ledger.lines.lock().unwrap().len(), 1);
        let asked = all.iter().any(|e| matches!(e.kind, EventKind::ApprovalRequested { .. }));
        assert_eq!(asked, gated_call, "{label} {confidence}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_awaiting_approval_survives_a_restart() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let (first, _) = gated(pay_then_answer(), Some(store.clone())).await;
    let run_id = first.submit("pay invoice 7").await;
    let mut events = first.runtime.subscribe(run_id, 0);
    wait_for(&mut events, |kind| matches!(kind, EventKind::WaitingInput { .. })).await;
    first.runtime.shutdown(Duration::from_secs(5)).await;

    let (second, gate) = gated(pay_then_answer(), Some(store)).await;
    second.runtime.input(run_id, approval(true, None)).await.unwrap();
    let (record, _) = second.finish(run_id).await;
    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(gate.ledger.lines.lock().unwrap().len(), 1);
}

/// A decision that comes while an approved call of the same turn still runs
/// keeps the turn: the running call's result is booked and the run goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_while_an_approved_call_still_runs_keeps_the_turn() {
    let hold = Arc::new(tokio::sync::Semaphore::new(0));
    let gate = GatedTool { hold: Some(hold.clone()), ..GatedTool::default() };
    let model = ScriptedModel::per_turn(vec![
        calls(&[("pay", json!({"entry": "a"})), ("pay", json!({"entry": "b"}))]),
        text("Paid a, not b."),
    ]);
    let mut setup = Setup::new(model);
    setup.extra_tools = vec![Arc::new(gate.clone())];
    let harness = setup.start().await;
    let run_id = harness.submit("pay a and b").await;
    let mut events = harness.runtime.subscribe(run_id, 0);
    wait_for(&mut events, |kind| matches!(kind, EventKind::WaitingInput { .. })).await;
    let decide = |call_id: &str, approved: bool| RunInput::Approval {
        call_id: Some(call_id.to_owned()),
        approved,
        reason: None,
    };

    harness.runtime.input(run_id, decide("pay_0", true)).await.unwrap();
    wait_for(&mut events, |kind| matches!(kind, EventKind::ToolCallStart { call_id, .. } if call_id == "pay_0")).await;
    // pay_0 is held running while the second decision comes.
    harness.runtime.input(run_id, decide("pay_1", false)).await.unwrap();
    hold.add_permits(1);
    let (record, all) = harness.finish(run_id).await;
    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(record.final_output.as_deref(), Some("Paid a, not b."));
    assert_eq!(gate.ledger.lines.lock().unwrap().len(), 1, "the approved call ran once");
    let ended: Vec<(&str, CallStatus)> = all
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCallEnd { call_id, status, .. } => Some((call_id.as_str(), *status)),
            _ => None,
        })
        .collect();
    assert_eq!(ended, [("pay_0", CallStatus::Completed)]);
}
