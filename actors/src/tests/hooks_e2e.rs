//! The hook chain inside real runs: duplicates, strikes, invalid arguments,
//! crashing and hanging tools.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::config::RuntimeConfig;
use crate::hooks::HookConfig;
use crate::hooks::{BeforeCall, HookContext, ToolHook};
use crate::metrics::{ACTOR_RESTARTS_TOTAL, TOOL_CALLS_SKIPPED_TOTAL};
use crate::protocol::{CallStatus, EventKind, Limits, RunEvent, RunStatus, SkipReason, ToolCall};
use crate::testing::{ScriptedModel, SlowTool, calls, capture_metrics, counter, text};
use crate::tests::{Setup, offered, tool_messages};

/// Skipped calls, sorted by call id (calls of a turn finish in any order).
fn skips(events: &[Arc<RunEvent>]) -> Vec<(String, SkipReason, String)> {
    let mut skipped: Vec<(String, SkipReason, String)> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolSkipped { call_id, reason, detail, .. } => Some((call_id.clone(), *reason, detail.clone())),
            _ => None,
        })
        .collect();
    skipped.sort_by(|a, b| a.0.cmp(&b.0));
    skipped
}

fn ends(events: &[Arc<RunEvent>]) -> Vec<(String, CallStatus)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCallEnd { call_id, status, .. } => Some((call_id.clone(), *status)),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identical_successful_call_is_skipped_as_a_duplicate() {
    let model = ScriptedModel::per_turn(vec![
        calls(&[("echo", json!({"text": "x"})), ("flaky", json!({"n": 1}))]),
        // Same echo (keys in another order would match too), new echo, and the failed call again.
        calls(&[("echo", json!({"text": "x"})), ("echo", json!({"text": "y"})), ("flaky", json!({"n": 1}))]),
        text("done"),
    ]);
    let harness = Setup::new(model).start().await;
    let (record, events) = harness.run("dedupe").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    let skipped = skips(&events);
    assert_eq!(skipped.len(), 1, "only the repeated success is skipped: {skipped:?}");
    let (call_id, reason, detail) = &skipped[0];
    assert_eq!((call_id.as_str(), *reason), ("echo_0", SkipReason::Duplicate));
    assert!(detail.contains("call echo_0 in turn 1"), "{detail}");
    let finished = ends(&events);
    assert_eq!(
        finished.iter().filter(|(id, _)| id == "flaky_2" || id == "flaky_1").count(),
        2,
        "a failed call is no original: {finished:?}"
    );
    assert!(finished.contains(&("echo_1".to_owned(), CallStatus::Completed)));
    let seen = tool_messages(&harness.requests()[2]);
    assert!(seen[2].starts_with("skipped (duplicate)"), "the model sees why: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_failures_block_a_tool_until_its_cooldown_ends() {
    let flaky = || calls(&[("flaky", json!({}))]);
    let model = ScriptedModel::per_turn(vec![flaky(), flaky(), flaky(), flaky(), flaky(), flaky(), text("done")]);
    let mut setup = Setup::new(model);
    setup.config = RuntimeConfig {
        hooks: HookConfig { failure_threshold: 3, cooldown_turns: 2, dedupe_window_turns: None },
        ..RuntimeConfig::default()
    };
    setup.limits = Limits { max_turns: 10, ..Limits::default() };
    let harness = setup.start().await;
    let (record, events) = harness.run("keep failing").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    let statuses: Vec<(u32, String)> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolMetric { record } => Some((record.turn, record.error.clone().unwrap_or_default())),
            _ => None,
        })
        .collect();
    let expected: Vec<(u32, String)> =
        [(1, "boom"), (2, "boom"), (3, "boom"), (4, "blocked"), (5, "blocked"), (6, "boom")]
            .map(|(t, s)| (t, s.to_owned()))
            .to_vec();
    assert_eq!(statuses, expected);
    let requests = harness.requests();
    for (turn, offered_flaky) in [(1, true), (3, true), (4, false), (5, false), (6, true)] {
        assert_eq!(offered(&requests[turn - 1]).contains(&"flaky".to_owned()), offered_flaky, "turn {turn}");
    }
    let note = super::turn_loop::state_note(&requests[3]);
    assert!(note.contains("blocked for now after repeated failures: flaky"), "{note}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_arguments_become_results_the_model_sees() {
    let model = ScriptedModel::per_turn(vec![
        calls(&[
            ("echo", json!({"text": 5})),
            ("echo", json!("{\"text\": ")),
            ("nosuch", json!({})),
            ("echo", json!("{\"text\": \"ok\"}")),
        ]),
        text("recovered"),
    ]);
    capture_metrics();
    let unknown = [("tool", "unknown"), ("reason", "invalid_args")];
    let before = counter(TOOL_CALLS_SKIPPED_TOTAL, &unknown);
    let harness = Setup::new(model).start().await;
    let (record, events) = harness.run("bad args").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    let skipped = skips(&events);
    assert_eq!(skipped.iter().map(|(_, reason, _)| *reason).collect::<Vec<_>>(), vec![SkipReason::InvalidArgs; 3]);
    assert!(skipped[0].2.contains("/text") && skipped[0].2.contains("schema"), "{}", skipped[0].2);
    assert!(skipped[1].2.contains("not valid JSON"), "{}", skipped[1].2);
    assert!(skipped[2].2.contains("unknown tool \"nosuch\""), "{}", skipped[2].2);
    // A name the model made up is counted under `unknown`: the label stays bounded.
    assert!(counter(TOOL_CALLS_SKIPPED_TOTAL, &unknown) > before);
    assert_eq!(counter(TOOL_CALLS_SKIPPED_TOTAL, &[("tool", "nosuch"), ("reason", "invalid_args")]), 0);
    let seen = tool_messages(&harness.requests()[1]);
    assert_eq!(seen.len(), 4);
    assert!(seen[..3].iter().all(|m| m.starts_with("skipped (invalid_args)")), "{seen:?}");
    assert_eq!(seen[3], "ok", "argument text that parses is accepted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_tool_fails_its_call_and_its_worker_is_replaced() {
    capture_metrics();
    let restarts_before = counter(ACTOR_RESTARTS_TOTAL, &[("actor", "tool_worker")]);
    let model = ScriptedModel::per_turn(vec![
        calls(&[("panics", json!({}))]),
        calls(&[("echo", json!({"text": "still here"}))]),
        text("done"),
    ]);
    let mut setup = Setup::new(model);
    setup.config.tool_pool.workers = 1;
    let harness = setup.start().await;
    let (record, events) = harness.run("crash a worker").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    let metrics: Vec<(String, Option<String>)> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolMetric { record } => Some((record.tool.clone(), record.error.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(metrics, vec![("panics".to_owned(), Some("worker_crashed".to_owned())), ("echo".to_owned(), None)]);
    assert_eq!(counter(ACTOR_RESTARTS_TOTAL, &[("actor", "tool_worker")]) - restarts_before, 1);
}

#[tokio::test(start_paused = true)]
async fn a_hanging_tool_times_out_with_paused_time() {
    let model = ScriptedModel::per_turn(vec![calls(&[("slow", json!({}))]), text("done")]);
    let mut setup = Setup::new(model);
    setup.extra_tools =
        vec![Arc::new(SlowTool { delay: Duration::from_secs(120), timeout: Some(Duration::from_secs(5)) })];
    let harness = setup.start().await;
    let (record, events) = harness.run("wait").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    let failure = events.iter().find_map(|e| match &e.kind {
        EventKind::ToolMetric { record } => record.error.clone(),
        _ => None,
    });
    assert_eq!(failure.as_deref(), Some("timeout"));
    assert!(tool_messages(&harness.requests()[1])[0].contains("no result after 5s"));
}

#[tokio::test(start_paused = true)]
async fn a_configured_time_limit_overrides_the_tool_own() {
    let model = ScriptedModel::per_turn(vec![calls(&[("slow", json!({}))]), text("done")]);
    let mut setup = Setup::new(model);
    setup.extra_tools =
        vec![Arc::new(SlowTool { delay: Duration::from_secs(120), timeout: Some(Duration::from_secs(5)) })];
    setup.config.tool_pool.timeouts.insert("slow".into(), 2.5);
    let harness = setup.start().await;
    let (record, _) = harness.run("wait less").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    assert!(tool_messages(&harness.requests()[1])[0].contains("no result after 2.5s"));
}

/// Refuses every call of one tool, as an application policy would.
struct DenyTool(&'static str);

#[async_trait::async_trait]
impl ToolHook for DenyTool {
    fn name(&self) -> &'static str {
        "deny_tool"
    }
    async fn before_call(&self, _context: &HookContext<'_>, call: &ToolCall) -> BeforeCall {
        if call.name == self.0 {
            BeforeCall::Deny { reason: format!("{} is not allowed here", self.0) }
        } else {
            BeforeCall::Run
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_hook_denies_a_call_before_it_runs() {
    let model = ScriptedModel::per_turn(vec![
        calls(&[("ledger", json!({"entry": "pay"})), ("echo", json!({"text": "ok"}))]),
        text("done"),
    ]);
    let mut setup = Setup::new(model);
    setup.hooks = vec![Arc::new(DenyTool("ledger"))];
    let harness = setup.start().await;
    let (record, events) = harness.run("pay").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    assert!(harness.ledger.lines.lock().unwrap().is_empty(), "the denied tool never ran");
    let skipped = skips(&events);
    assert_eq!(skipped, vec![("ledger_0".to_owned(), SkipReason::Denied, "ledger is not allowed here".to_owned())]);
    assert_eq!(
        tool_messages(&harness.requests()[1]),
        vec!["skipped (denied): ledger is not allowed here".to_owned(), "ok".to_owned()]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_to_a_tool_the_agent_was_not_given_is_denied() {
    let model = ScriptedModel::per_turn(vec![calls(&[("ledger", json!({"entry": "exfiltrate"}))]), text("ok")]);
    let mut setup = Setup::new(model);
    setup.agent_tools = Some(vec!["echo".to_owned()]);
    let harness = setup.start().await;
    let (record, events) = harness.run("try it").await;
    assert_eq!(record.status, RunStatus::Succeeded);
    assert!(harness.ledger.lines.lock().unwrap().is_empty(), "the tool never ran");
    assert!(events.iter().any(|e| matches!(&e.kind,
        EventKind::ToolSkipped { tool, reason: SkipReason::Denied, .. } if tool == "ledger")));
    assert!(tool_messages(&harness.requests()[1])[0].contains("not one of this agent's tools"));
}
