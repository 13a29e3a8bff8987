//! Agent steps: calls the runtime makes for an agent before its model takes
//! over, through the same pool, hooks, events and store as the model's calls.

use serde_json::{Value, json};

use crate::llm::ToolChoice;
use crate::protocol::{CallStatus, EventKind, RunEvent, RunStatus};
use crate::testing::{ScriptedModel, calls, text};
use crate::tests::{Setup, tool_messages};

/// Every call's turn, tool, arguments and status, from its telemetry record.
fn executed(events: &[std::sync::Arc<RunEvent>]) -> Vec<(u32, String, Value, CallStatus)> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::ToolMetric { record } => {
                Some((record.turn, record.tool.clone(), record.args.clone(), record.status))
            }
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_run_before_the_model_with_the_request_and_earlier_results_filled_in() {
    let model = ScriptedModel::queue(vec![calls(&[("echo", json!({"text": "written by the model"}))]), text("Two.")]);
    let mut setup = Setup::new(model);
    setup.steps = serde_json::from_value(json!([
        {"tool": "search", "args": {"query": "{input}"}},
        {"tool": "echo", "args": {"text": "found {search.found}"}, "when": {"field": "search.found", "in": ["2"]}},
        {"tool": "echo", "model_writes": true, "args": {"note": "{input}"}},
    ]))
    .unwrap();
    let harness = setup.start().await;
    let (record, events) = harness.run("lamps").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(record.final_output.as_deref(), Some("Two."));
    let calls: Vec<(u32, String, Value)> =
        executed(&events).into_iter().map(|(turn, tool, args, _)| (turn, tool, args)).collect();
    assert_eq!(
        calls,
        vec![
            (1, "search".to_owned(), json!({"query": "lamps"})),
            (2, "echo".to_owned(), json!({"text": "found 2"})),
            (3, "echo".to_owned(), json!({"text": "written by the model", "note": "lamps"})),
        ],
        "the steps' calls, filled from the request and the search's result, then the model's"
    );
    let requests = harness.requests();
    assert_eq!(requests.len(), 2, "the runtime's steps ask the model nothing");
    assert_eq!(requests[0].tool_choice, ToolChoice::Tool("echo".to_owned()), "the model writes this step");
    assert!(tool_messages(&requests[0])[0].contains("\"found\":2"), "the model reads the steps' results");
    assert_eq!(requests[1].tool_choice, ToolChoice::Auto, "after the steps the model decides");
    let reviewed = events.iter().filter(|event| matches!(event.kind, EventKind::Review { .. })).count();
    assert_eq!(reviewed, 4, "every turn is reviewed, the steps' too");
    // Every step leaves its trace: order, name, what went in and came out.
    let traced: Vec<(u32, u32, String, Value, String)> = events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::StepEnd { turn, order, name, input, status, output, .. } => {
                assert!(!output.is_empty(), "{name}: an output");
                Some((*turn, *order, name.clone(), input.clone(), status.clone()))
            }
            _ => None,
        })
        .collect();
    let completed = "completed".to_owned();
    assert_eq!(
        traced,
        vec![
            (1, 1, "search".to_owned(), json!({"query": "lamps"}), completed.clone()),
            (2, 2, "echo".to_owned(), json!({"text": "found 2"}), completed.clone()),
            (3, 3, "echo".to_owned(), json!({"note": "lamps"}), completed),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_whose_source_failed_or_whose_condition_is_false_hands_over_to_the_model() {
    let model = ScriptedModel::queue(vec![text("It failed.")]);
    let mut setup = Setup::new(model);
    setup.config.step_retry_backoff = std::time::Duration::from_millis(5);
    setup.steps = serde_json::from_value(json!([
        {"tool": "flaky", "args": {}},
        {"tool": "echo", "args": {"text": "{flaky.value}"}},
    ]))
    .unwrap();
    let harness = setup.start().await;
    let (record, events) = harness.run("try").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    let tools: Vec<(u32, String, CallStatus)> =
        executed(&events).into_iter().map(|(turn, tool, _, status)| (turn, tool, status)).collect();
    let failed = |turn| (turn, "flaky".to_owned(), CallStatus::Failed);
    assert_eq!(tools, vec![failed(1), failed(2), failed(3)], "tried three times; the echo step had nothing to read");
    let retries: Vec<&str> = events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::ReasoningStep { summary, .. } if summary.contains("trying again") => Some(summary.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(retries.len(), 2, "{retries:?}");
    assert!(retries[1].contains("try 3 of 3"), "{retries:?}");
    let requests = harness.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].tool_choice, ToolChoice::Auto);

    let model = ScriptedModel::queue(vec![text("Nothing to do.")]);
    let mut setup = Setup::new(model);
    setup.steps = serde_json::from_value(json!([
        {"tool": "search", "args": {"query": "{input}"}},
        {"tool": "echo", "args": {"text": "many"}, "when": {"field": "search.found", "in": ["9"]}},
    ]))
    .unwrap();
    let harness = setup.start().await;
    let (_, events) = harness.run("lamps").await;
    let tools: Vec<String> = executed(&events).into_iter().map(|(_, tool, ..)| tool).collect();
    assert_eq!(tools, vec!["search".to_owned()], "a false condition skips its step");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_step_asks_in_its_words_right_before_the_answer_with_no_tool() {
    let model = ScriptedModel::queue(vec![text("Two documents about lamps.")]);
    let mut setup = Setup::new(model);
    setup.steps = serde_json::from_value(json!([
        {"tool": "search", "args": {"query": "{input}"}},
        {"prompt": "From the {search.found} results above, answer: {input}"},
    ]))
    .unwrap();
    let harness = setup.start().await;
    let (record, _) = harness.run("lamps").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(record.final_output.as_deref(), Some("Two documents about lamps."));
    let requests = harness.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].tool_choice, ToolChoice::None, "an answer step calls no tool");
    let last = requests[0].messages.last().map(|message| (message.role, message.content.clone()));
    assert_eq!(last, Some((crate::llm::Role::User, "From the 2 results above, answer: lamps".to_owned())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_repeats_the_steps_words_is_sent_back() {
    let echo = text("Tell me what the 2 results above say.");
    let model = ScriptedModel::queue(vec![echo, text("Two documents about lamps.")]);
    let mut setup = Setup::new(model);
    setup.steps = serde_json::from_value(json!([
        {"tool": "search", "args": {"query": "{input}"}},
        {"prompt": "Tell me what the {search.found} results above say."},
    ]))
    .unwrap();
    let harness = setup.start().await;
    let (record, _) = harness.run("lamps").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(record.final_output.as_deref(), Some("Two documents about lamps."), "the echo was no answer");
    assert_eq!(harness.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finishing_step_ends_the_run_with_its_answer_and_asks_the_model_nothing() {
    let mut setup = Setup::new(ScriptedModel::queue(vec![text("the model was asked")]));
    setup.steps = serde_json::from_value(json!([
        {"tool": "search", "args": {"query": "{input}"}},
        {"finish": "Found {search.found} documents; nothing else is needed.", "when": {"field": "search.found", "at_least": 2}},
        {"prompt": "Say what you found."},
    ]))
    .unwrap();
    let harness = setup.start().await;
    let (record, events) = harness.run("lamps").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(record.final_output.as_deref(), Some("Found 2 documents; nothing else is needed."));
    assert!(harness.requests().is_empty(), "the model is not asked");
    let reviewed = events.iter().filter(|event| matches!(event.kind, EventKind::Review { .. })).count();
    assert_eq!(reviewed, 2, "the finishing turn is reviewed like any");
}

/// Fails its first `failures` calls, then answers `{"value": "ok"}`.
struct RecoveringTool {
    failures: u32,
    calls: std::sync::atomic::AtomicU32,
}

#[async_trait::async_trait]
impl crate::tool::Tool for RecoveringTool {
    fn name(&self) -> &str {
        "recovering"
    }
    fn description(&self) -> &str {
        "Fails at first, then works."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {}})
    }
    async fn call(
        &self,
        _context: crate::tool::ToolContext,
        _args: Value,
    ) -> Result<crate::tool::ToolOutput, crate::tool::ToolError> {
        if self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < self.failures {
            return Err(crate::tool::ToolError::failed("unavailable", "try later"));
        }
        Ok(crate::tool::ToolOutput::value(json!({"value": "ok"})))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_whose_tool_fails_twice_then_succeeds_goes_on_and_each_try_is_traced() {
    let mut setup = Setup::new(ScriptedModel::queue(vec![]));
    setup.config.step_retry_backoff = std::time::Duration::from_millis(5);
    setup.extra_tools = vec![std::sync::Arc::new(RecoveringTool { failures: 2, calls: Default::default() })];
    setup.steps = serde_json::from_value(json!([
        {"tool": "recovering", "args": {}},
        {"finish": "It worked: {recovering.value}."},
    ]))
    .unwrap();
    let harness = setup.start().await;
    let (record, events) = harness.run("try").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(record.final_output.as_deref(), Some("It worked: ok."));
    let tries: Vec<(u32, CallStatus)> =
        executed(&events).into_iter().map(|(turn, _, _, status)| (turn, status)).collect();
    assert_eq!(tries, vec![(1, CallStatus::Failed), (2, CallStatus::Failed), (3, CallStatus::Completed)]);
    let traced: Vec<(u32, u32, String)> = events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::StepEnd { turn, order, status, .. } => Some((*turn, *order, status.clone())),
            _ => None,
        })
        .collect();
    let trace = |turn, order, status: &str| (turn, order, status.to_owned());
    assert_eq!(
        traced,
        vec![trace(1, 1, "failed"), trace(2, 1, "failed"), trace(3, 1, "completed"), trace(4, 2, "completed")]
    );
}
