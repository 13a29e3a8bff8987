//! The turn loop: planning, parallel tools, the reviewer on every turn, synthesis.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::sync::{Notify, Semaphore};

use crate::config::ReviewerKind;
use crate::llm::ToolChoice;
use crate::llm::{ModelDelta, ModelReply, Role};
use crate::protocol::{CallStatus, EventKind, Limits, ReviewStatus, RunStatus};
use crate::store::{Commit, StoreWrite};
use crate::testing::{FaultyStore, ScriptedModel, Step, StreamHold, calls, eventually, text, todo};
use crate::tests::{Setup, count, kinds, offered, tool_messages, turns_and_reviews};
use crate::tool::{Tool, ToolContext, ToolError, ToolOutput};
use crate::tool_pool::ToolPoolMsg;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_run_calls_two_tools_in_parallel_and_answers() {
    let model = ScriptedModel::per_turn(vec![
        calls(&[("todo_write", todo(&[("1", "echo both words", "in_progress"), ("2", "answer", "pending")]))]),
        calls(&[("echo", json!({"text": "alpha"})), ("echo", json!({"text": "beta"}))]),
        calls(&[("todo_write", todo(&[("1", "echo both words", "completed"), ("2", "answer", "completed")]))]),
        text("alpha and beta"),
    ]);
    let harness = Setup::new(model).start().await;
    let (record, events) = harness.run("echo alpha and beta").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(record.final_output.as_deref(), Some("alpha and beta"));
    let names = kinds(&events);
    let starts: Vec<usize> = positions(&events, "tool_call_start");
    let ends: Vec<usize> = positions(&events, "tool_call_end");
    assert_eq!((starts.len(), ends.len()), (2, 2));
    assert!(starts[1] < ends[0], "both calls start before either ends: {names:?}");
    assert_eq!(count(&events, "plan_updated"), 2);
    let steps: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ReasoningStep { summary, .. } => Some(summary.clone()),
            _ => None,
        })
        .collect();
    assert!(steps.contains(&"Echoing 'alpha'".to_owned()), "{steps:?}");
    assert!(
        matches!(events.iter().rev().nth(1).map(|e| &e.kind), Some(EventKind::FinalOutput { text, .. }) if text == "alpha and beta")
    );

    let requests = harness.requests();
    assert_eq!(requests.len(), 4);
    // The model reads its plan in todo_write's result, where it wrote it; the
    // runtime adds no note of its own after it, and a review that asks for
    // nothing is not shown: each turn's prompt ends with what the model did last.
    let plan = &tool_messages(&requests[1])[0];
    assert!(plan.contains("→ [1] echo both words") && plan.contains("○ [2] answer"), "{plan}");
    assert!(tool_messages(&requests[3]).last().is_some_and(|plan| plan.contains("✓ [2] answer")));
    for request in &requests {
        assert_eq!(state_note(request), "", "no state note while no tool is blocked");
        let last = request.messages.last().map(|message| message.role);
        assert!(matches!(last, Some(Role::User | Role::Tool)), "the prompt ends with the request or a result");
    }
    // The plan changed, the system prompt did not: each turn's prompt starts with
    // the whole previous one, which prompt caches reuse.
    for pair in requests.windows(2) {
        let kept = pair[0].messages.len();
        assert_eq!(pair[1].messages[..kept], pair[0].messages[..], "each prompt extends the previous one");
    }
    assert_eq!(tool_messages(&requests[2])[1..], ["alpha".to_owned(), "beta".to_owned()]);
}

/// The last state note of a request (the blocked tools), after the system prompt.
pub(crate) fn state_note(request: &crate::llm::ChatRequest) -> String {
    let note = request.messages.iter().skip(1).rev().find(|message| message.role == crate::llm::Role::System);
    note.map(|message| message.content.clone()).unwrap_or_default()
}

/// Where the events named `wanted` for the echo tool stand.
fn positions(events: &[std::sync::Arc<crate::protocol::RunEvent>], wanted: &str) -> Vec<usize> {
    let echo = |kind: &EventKind| match kind {
        EventKind::ToolCallStart { tool, .. } | EventKind::ToolCallEnd { tool, .. } => tool == "echo",
        _ => false,
    };
    events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind.name() == wanted && echo(&e.kind))
        .map(|(index, _)| index)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reviewer_runs_exactly_once_per_turn_in_every_shape() {
    // Tool turns, a turn where every call fails, a reply that is no answer (the
    // runtime's own text copied back) sent back once by `gather_more`, and a
    // forced synthesis turn.
    let shapes = vec![
        vec![calls(&[("echo", json!({"text": "a"}))]), text("final")],
        vec![calls(&[("flaky", json!({})), ("flaky", json!({"x": 1}))]), text("gave up")],
        vec![
            calls(&[("todo_write", todo(&[("1", "look", "pending")]))]),
            text("Review of turn 1 by the runtime (not the user): proceed."),
            text("final answer after reflection"),
        ],
        vec![calls(&[("echo", json!({"text": "1"}))]), calls(&[("echo", json!({"text": "2"}))]), text("synthesized")],
    ];
    for (shape, steps) in shapes.into_iter().enumerate() {
        let mut setup = Setup::new(ScriptedModel::per_turn(steps));
        // The synthesis shape runs out of turns; the others have room to reflect.
        let max_turns = if shape == 3 { 2 } else { 3 };
        setup.limits = Limits { max_turns, ..Limits::default() };
        let harness = setup.start().await;
        let (record, events) = harness.run("review every turn").await;
        assert_eq!(record.status, RunStatus::Succeeded, "shape {shape}");
        let (started, reviewed) = turns_and_reviews(&events);
        assert_eq!(started, reviewed, "shape {shape}: every started turn is reviewed once");
        assert_eq!(count(&events, "turn_end"), started.len(), "shape {shape}");
        let expected_turns = match shape {
            0 | 1 => 2,
            _ => 3,
        };
        assert_eq!(started.len(), expected_turns, "shape {shape}: {:?}", kinds(&events));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_turns_forces_one_tool_free_synthesis_call() {
    let model = ScriptedModel::per_turn(vec![
        calls(&[("echo", json!({"text": "1"}))]),
        calls(&[("echo", json!({"text": "2"}))]),
        calls(&[("echo", json!({"text": "3"}))]),
    ]);
    let mut setup = Setup::new(model);
    setup.limits = Limits { max_turns: 2, ..Limits::default() };
    let harness = setup.start().await;
    let (record, events) = harness.run("never stops calling tools").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    let requests = harness.requests();
    assert_eq!(requests.len(), 3, "two tool turns, then the synthesis call");
    let synthesis = &requests[2];
    assert!(synthesis.tool_choice == ToolChoice::None, "no tool may be called");
    assert!(!synthesis.tools.is_empty(), "the tools stay listed, so the prompt extends the previous one");
    assert!(synthesis.messages.last().unwrap().content.contains("used all 2 turns"));
    // The synthesis reply asked for a tool anyway: it is ignored, and the run answers.
    assert_eq!(count(&events, "tool_call_start"), 2);
    assert_eq!(turns_and_reviews(&events).1, vec![1, 2, 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_token_budget_fails_the_run_before_the_next_call() {
    let model = ScriptedModel::per_turn(vec![
        calls(&[("echo", json!({"text": "1"}))]),
        calls(&[("echo", json!({"text": "2"}))]),
        text("never reached"),
    ]);
    let mut setup = Setup::new(model);
    // Each scripted reply costs 120 tokens.
    setup.limits = Limits { max_tokens: Some(200), ..Limits::default() };
    let harness = setup.start().await;
    let (record, events) = harness.run("spend").await;

    assert_eq!(record.status, RunStatus::Failed);
    assert!(record.reason.as_deref().unwrap().starts_with("budget_exceeded"), "{:?}", record.reason);
    assert_eq!(harness.requests().len(), 2);
    assert!(events.iter().any(|e| matches!(&e.kind, EventKind::Error { code, .. } if code == "budget_exceeded")));
    assert_eq!(record.usage.total_tokens(), 240);
}

/// A run admitted when it is submitted starts its first turn in the commit that
/// creates it: a client reading it right after submitting sees turn 1 under way,
/// and the session's first commit is what the model streamed or replied, not a
/// lone `turn_start`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_admitted_at_once_starts_its_first_turn_with_its_creation() {
    let first_commit: Arc<Mutex<Option<Written>>> = Arc::default();
    let seen = first_commit.clone();
    let store = FaultyStore::before_commit(move |commit| {
        seen.lock().unwrap().get_or_insert_with(|| Written::of(commit));
        Box::pin(async {})
    });
    // The model holds its reply until the test has read the run.
    let hold = Arc::new(StreamHold::default());
    let reply = ModelReply { content: "hello".to_owned(), ..Default::default() };
    let deltas = vec![ModelDelta::Text("hello".to_owned())];
    let model = ScriptedModel::per_turn(vec![Step::Streamed { deltas, reply, hold: Some(hold.clone()) }]);
    let mut setup = Setup::new(model);
    setup.store = Arc::new(store);
    let harness = setup.start().await;
    let run_id = harness.submit("greet").await;
    let created = harness.runtime.get(run_id).await.unwrap().unwrap();
    assert_eq!((created.status, created.turn), (RunStatus::Running, 1));
    hold.finish.add_permits(1);

    let (record, events) = harness.finish(run_id).await;
    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(kinds(&events)[..2], ["run_started", "turn_start"]);
    assert_eq!(count(&events, "turn_start"), 1);
    let first = first_commit.lock().unwrap().take().expect("the session committed");
    let from_the_model = first.reply || first.has("assistant_delta");
    assert!(from_the_model && !first.has("turn_start"), "the first commit is turn 1's stream or reply: {first:?}");
    assert_eq!(harness.requests().len(), 1);
}

/// A run whose budget is spent before it begins (a token budget of 0) starts no
/// turn and never asks the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_with_no_budget_fails_before_its_first_turn() {
    let mut setup = Setup::new(ScriptedModel::per_turn(vec![text("never reached")]));
    setup.limits = Limits { max_tokens: Some(0), ..Limits::default() };
    let harness = setup.start().await;
    let (record, events) = harness.run("spend nothing").await;

    assert_eq!(record.status, RunStatus::Failed);
    assert!(record.reason.as_deref().is_some_and(|reason| reason.starts_with("budget_exceeded")), "{record:?}");
    assert_eq!(kinds(&events), ["run_started", "error", "run_end"]);
    assert_eq!(record.turn, 0);
    assert!(harness.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seen_documents_are_excluded_from_later_searches_and_cited() {
    let model = ScriptedModel::per_turn(vec![
        calls(&[("search", json!({"query": "a"}))]),
        calls(&[("search", json!({"query": "a", "excluded_ids": []}))]),
        text("see [2] and [1], not [7]"),
    ]);
    let harness = Setup::new(model).start().await;
    let (record, events) = harness.run("find a").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    let second = &tool_messages(&harness.requests()[2])[1];
    assert!(second.contains("a-1") && second.contains("a-2") && second.contains("\"found\":0"), "{second}");
    let Some(EventKind::FinalOutput { citations, .. }) =
        events.iter().map(|e| &e.kind).find(|k| k.name() == "final_output")
    else {
        panic!("no final output");
    };
    let cited: Vec<(usize, &str)> = citations.iter().map(|c| (c.marker, c.fragment.id.as_str())).collect();
    assert_eq!(cited, vec![(2, "a-2"), (1, "a-1")]);
    assert!(offered(&harness.requests()[0]).contains(&"search".to_owned()));
    // The telemetry keeps the arguments that ran, and the model's beside them.
    let snapshot = harness.runtime.store().load(record.run_id).await.unwrap().unwrap();
    let records = &snapshot.tool_executions;
    assert_eq!((&records[0].args, &records[0].original_args), (&json!({"query": "a"}), &None), "not rewritten");
    assert_eq!(records[1].args, json!({"query": "a", "excluded_ids": ["a-1", "a-2"]}));
    assert_eq!(records[1].original_args, Some(json!({"query": "a", "excluded_ids": []})));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_error_fails_the_run_with_a_typed_error_event() {
    let failure = crate::llm::ModelError::Status { status: 401, message: "bad key".into() };
    let harness = Setup::new(ScriptedModel::per_turn(vec![crate::testing::Step::Fail(failure)])).start().await;
    let (record, events) = harness.run("anything").await;

    assert_eq!(record.status, RunStatus::Failed);
    assert_eq!(record.reason.as_deref(), Some("model error: model returned status 401: bad key"));
    assert!(events.iter().any(|e| matches!(&e.kind, EventKind::Error { code, .. } if code == "model_status")));
    // The turn the error cut short is reviewed, saying why, and ends before the run.
    let kinds: Vec<&EventKind> = events.iter().map(|e| &e.kind).collect();
    let review = kinds.iter().position(|k| {
        matches!(k, EventKind::Review { turn: 1, review }
        if review.gaps.iter().any(|gap| gap.contains("model returned status 401")))
    });
    let turn_end = kinds.iter().position(|k| matches!(k, EventKind::TurnEnd { turn: 1 }));
    let run_end = kinds.iter().position(|k| matches!(k, EventKind::RunEnd { .. }));
    assert!(review < turn_end && turn_end < run_end && review.is_some(), "{kinds:#?}");
    let snapshot = harness.runtime.store().load(record.run_id).await.unwrap().unwrap();
    assert_eq!(snapshot.reviews.len(), 1, "the review is stored");
    assert!(!events.iter().any(|e| matches!(e.kind, EventKind::ModelRetry { .. })), "a refusal is not retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_tool_calls_are_reported_and_the_run_goes_on() {
    let reply = crate::llm::ModelReply {
        content: "I tried to call a tool".into(),
        decode_errors: vec!["call 0: arguments are not JSON: {\"text\": ".into()],
        ..Default::default()
    };
    let harness = Setup::new(ScriptedModel::per_turn(vec![crate::testing::Step::Reply(reply)])).start().await;
    let (record, events) = harness.run("anything").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    let decode: Vec<&str> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::DecodeError { detail, .. } => Some(detail.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(decode, vec!["call 0: arguments are not JSON: {\"text\": "]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_model_client_fails_the_run_instead_of_hanging_it() {
    let harness = Setup::new(ScriptedModel::per_turn(vec![crate::testing::Step::Panic])).start().await;
    let (record, _) = harness.run("anything").await;
    assert_eq!(record.status, RunStatus::Failed);
    assert_eq!(record.reason.as_deref(), Some("model error: the model client crashed"));
}

#[tokio::test(start_paused = true)]
async fn a_model_call_that_never_ends_times_out() {
    let mut setup = Setup::new(ScriptedModel::per_turn(vec![crate::testing::Step::Hang]));
    setup.config.model_timeout = std::time::Duration::from_secs(30);
    let harness = setup.start().await;
    let (record, _) = harness.run("anything").await;
    assert_eq!(record.status, RunStatus::Failed);
    assert_eq!(record.reason.as_deref(), Some("model error: model timed out after 30s"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_or_repeated_call_ids_from_the_model_are_made_unique() {
    let mut reply = match calls(&[
        ("echo", json!({"text": "a"})),
        ("echo", json!({"text": "b"})),
        ("echo", json!({"text": "c"})),
    ]) {
        crate::testing::Step::Reply(reply) => reply,
        _ => unreachable!(),
    };
    reply.tool_calls[0].call_id = "same".into();
    reply.tool_calls[1].call_id = "same".into();
    reply.tool_calls[2].call_id = String::new();
    let harness =
        Setup::new(ScriptedModel::per_turn(vec![crate::testing::Step::Reply(reply), text("done")])).start().await;
    let (record, events) = harness.run("three calls").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    let mut ended: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCallEnd { call_id, .. } => Some(call_id.clone()),
            _ => None,
        })
        .collect();
    ended.sort();
    assert_eq!(ended, vec!["call_1_1".to_owned(), "call_1_2".to_owned(), "same".to_owned()]);
    assert_eq!(tool_messages(&harness.requests()[1]), vec!["a".to_owned(), "b".to_owned(), "c".to_owned()]);
}

/// `wait`: each call waits for a permit the test hands out.
struct WaitTool(Arc<Semaphore>);

#[async_trait::async_trait]
impl Tool for WaitTool {
    fn name(&self) -> &str {
        "wait"
    }
    fn description(&self) -> &str {
        "Waits until released."
    }
    fn parameters(&self) -> serde_json::Value {
        json!({"type": "object", "properties": {"n": {"type": "integer"}}})
    }
    async fn call(&self, _context: ToolContext, _args: serde_json::Value) -> Result<ToolOutput, ToolError> {
        self.0.acquire().await.map_err(|error| ToolError::failed("closed", error.to_string()))?.forget();
        Ok(ToolOutput::value(json!("released")))
    }
}

/// What the test's store saw and when it holds a commit.
#[derive(Default)]
struct Held {
    /// `(tool, status)` of each commit's tool records, by commit.
    commits: Mutex<Vec<Vec<(String, &'static str)>>>,
    /// Told when the commit that completes `echo` is held.
    held: Notify,
    /// Lets that commit through.
    release: Notify,
}

/// A memory store that records the tool records of every commit and holds the
/// commit that completes `echo` until the test lets it through.
fn holding_store(held: Arc<Held>) -> FaultyStore {
    FaultyStore::before_commit(move |commit| {
        let records: Vec<(String, &'static str)> = commit
            .writes
            .iter()
            .filter_map(|write| match write {
                StoreWrite::ToolExecution(record) => Some((record.tool.clone(), record.status.as_str())),
                _ => None,
            })
            .collect();
        let hold = records.contains(&("echo".to_owned(), "completed"));
        held.commits.lock().unwrap().push(records);
        let held = held.clone();
        Box::pin(async move {
            if hold {
                let released = held.release.notified();
                held.held.notify_one();
                released.await;
            }
        })
    })
}

/// Calls that end while the session is busy (here: waiting for the commit of an
/// earlier result) are booked together when it gets to them: one commit holds
/// both results, instead of one commit each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_that_arrive_while_the_session_is_busy_are_committed_together() {
    let model = ScriptedModel::per_turn(vec![
        calls(&[("echo", json!({"text": "first"})), ("wait", json!({"n": 1})), ("wait", json!({"n": 2}))]),
        text("done"),
    ]);
    let gate = Arc::new(Semaphore::new(0));
    let store = Arc::new(Held::default());
    let mut setup = Setup::new(model);
    setup.store = Arc::new(holding_store(store.clone()));
    setup.extra_tools = vec![Arc::new(WaitTool(gate.clone()))];
    let harness = setup.start().await;
    let run_id = harness.submit("three calls").await;

    // The session waits for the commit of echo's result; both waits end meanwhile.
    tokio::time::timeout(Duration::from_secs(60), store.held.notified()).await.expect("echo's result was committed");
    gate.add_permits(2);
    let pool = harness.runtime.tool_pool().expect("the tool pool runs");
    eventually(Duration::from_secs(60), "the wait calls to end", || async {
        let (queued, busy, _) = ractor::call!(pool, |reply| ToolPoolMsg::Stats { reply }).unwrap();
        queued == 0 && busy == 0
    })
    .await;
    store.release.notify_one();

    let (record, _) = harness.finish(run_id).await;
    assert_eq!(record.status, RunStatus::Succeeded);
    let completions: Vec<Vec<(String, &str)>> = store
        .commits
        .lock()
        .unwrap()
        .iter()
        .map(|records| records.iter().filter(|(_, status)| *status == "completed").cloned().collect::<Vec<_>>())
        .filter(|completed| !completed.is_empty())
        .collect();
    let wait = ("wait".to_owned(), "completed");
    assert_eq!(
        completions,
        vec![vec![("echo".to_owned(), "completed")], vec![wait.clone(), wait]],
        "echo's result alone, then both waits' in one commit"
    );
}

/// What one commit held: the tools whose calls it completed, whether it wrote
/// an answer (the assistant's reply without calls), and its events' kinds in order.
#[derive(Debug)]
struct Written {
    completed: Vec<String>,
    reply: bool,
    events: Vec<&'static str>,
}

impl Written {
    fn of(commit: &Commit) -> Self {
        let completed = commit
            .writes
            .iter()
            .filter_map(|write| match write {
                StoreWrite::ToolExecution(record) if record.status == CallStatus::Completed => {
                    Some(record.tool.clone())
                }
                _ => None,
            })
            .collect();
        let reply = commit.writes.iter().any(|write| {
            matches!(write, StoreWrite::Message(stored) if stored.message.role == Role::Assistant
                && stored.message.tool_calls.is_empty())
        });
        let events = commit.events.iter().map(|event| event.kind.name()).collect();
        Self { completed, reply, events }
    }

    fn has(&self, kind: &str) -> bool {
        self.events.contains(&kind)
    }
}

/// The commits of a run that calls `echo` once, then answers, with `reviewer` as
/// its agent's reviewer; and the status of its first review.
async fn commits_of_one_call_and_an_answer(reviewer: ReviewerKind) -> (Vec<Written>, ReviewStatus) {
    let written = Arc::new(Mutex::new(Vec::new()));
    let seen = written.clone();
    let store = FaultyStore::before_commit(move |commit| {
        seen.lock().unwrap().push(Written::of(commit));
        Box::pin(async {})
    });
    let mut setup = Setup::new(ScriptedModel::per_turn(vec![calls(&[("echo", json!({"text": "a"}))]), text("done")]));
    setup.store = Arc::new(store);
    setup.reviewer = reviewer;
    let harness = setup.start().await;
    let (record, events) = harness.run("one call, then an answer").await;
    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(record.final_output.as_deref(), Some("done"));
    let first_review = events
        .iter()
        .find_map(|event| match &event.kind {
            EventKind::Review { turn: 1, review } => Some(review.status),
            _ => None,
        })
        .expect("turn 1 was reviewed");
    let written = std::mem::take(&mut *written.lock().unwrap());
    (written, first_review)
}

/// With the rule-based reviewer (computed in microseconds, in process), what ends
/// a turn commits with its review: the last result with the review, the turn's
/// end and the next turn's start; the answer with its review and the run's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_ends_in_one_commit_with_its_rule_based_review() {
    let (commits, status) = commits_of_one_call_and_an_answer(ReviewerKind::RuleBased).await;
    assert_eq!(status, ReviewStatus::Ok);
    let result = commits.iter().find(|commit| commit.completed == ["echo"]).expect("echo's result was committed");
    assert_eq!(
        result.events,
        ["tool_call_end", "reasoning_step", "tool_metric", "review", "turn_end", "turn_start"],
        "{commits:?}"
    );
    let answer = commits.iter().find(|commit| commit.reply).expect("the answer was committed");
    for kind in ["review", "turn_end", "final_output", "run_end"] {
        assert!(answer.has(kind), "the answer's commit holds {kind}: {commits:?}");
    }
}

/// A model-backed review takes a model call: what ends the turn commits before
/// the review is asked, so a crash meanwhile loses no result and no reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_commits_before_a_model_backed_review_is_asked() {
    // A model the registry lacks: the review falls back to the rules, marked degraded.
    let reviewer = ReviewerKind::Model { model: Some("no-such-model".to_owned()) };
    let (commits, status) = commits_of_one_call_and_an_answer(reviewer).await;
    assert_eq!(status, ReviewStatus::Degraded);
    let result = commits.iter().position(|commit| commit.completed == ["echo"]).expect("echo's result was committed");
    assert!(!commits[result].has("review"), "{commits:?}");
    let answer = commits.iter().position(|commit| commit.reply).expect("the answer was committed");
    assert!(!commits[answer].has("review"), "{commits:?}");
    let reviews: Vec<usize> = (0..commits.len()).filter(|index| commits[*index].has("review")).collect();
    assert_eq!(reviews.len(), 2, "{commits:?}");
    assert!(result < reviews[0] && answer < reviews[1], "{commits:?}");
}

/// Pieces of a reply that stream in while the session commits earlier ones wait
/// and are committed together, adjacent text joined into one `assistant_delta`:
/// a reply streamed in many chunks costs a commit per batch, not one per chunk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deltas_that_stream_in_during_a_commit_are_committed_together() {
    let hold = Arc::new(StreamHold::default());
    let deltas = ["Hel", "lo", ", wor", "ld"].map(|piece| ModelDelta::Text(piece.to_owned())).to_vec();
    let reply = ModelReply { content: "Hello, world".to_owned(), ..Default::default() };
    let model = ScriptedModel::per_turn(vec![Step::Streamed { deltas, reply, hold: Some(hold.clone()) }]);
    // The texts of each commit's deltas; the first such commit is held.
    let committed: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
    let (held, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let store = {
        let (committed, held, release) = (committed.clone(), held.clone(), release.clone());
        FaultyStore::before_commit(move |commit| {
            let texts: Vec<String> = commit
                .events
                .iter()
                .filter_map(|event| match &event.kind {
                    EventKind::AssistantDelta { text, .. } => Some(text.clone()),
                    _ => None,
                })
                .collect();
            let mut committed = committed.lock().unwrap();
            let first = !texts.is_empty() && committed.is_empty();
            if !texts.is_empty() {
                committed.push(texts);
            }
            let (held, release) = (held.clone(), release.clone());
            Box::pin(async move {
                if first {
                    let released = release.notified();
                    held.notify_one();
                    released.await;
                }
            })
        })
    };
    let mut setup = Setup::new(model);
    setup.store = Arc::new(store);
    let harness = setup.start().await;
    let run_id = harness.submit("say hello").await;

    let within = Duration::from_secs(60);
    // The session commits the first piece; the others stream in meanwhile.
    tokio::time::timeout(within, held.notified()).await.expect("the first delta's commit");
    hold.resume.add_permits(1);
    tokio::time::timeout(within, hold.streamed.notified()).await.expect("the model streamed every delta");
    release.notify_one();
    hold.finish.add_permits(1);

    let (record, events) = harness.finish(run_id).await;
    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(record.final_output.as_deref(), Some("Hello, world"));
    let expected = vec![vec!["Hel".to_owned()], vec!["lo, world".to_owned()]];
    assert_eq!(*committed.lock().unwrap(), expected, "the first piece alone, then the three that waited, joined");
    let streamed: Vec<&str> = events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::AssistantDelta { text, reasoning: false, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(streamed, ["Hel", "lo, world"]);
}

fn overloaded() -> crate::testing::Step {
    crate::testing::Step::Fail(crate::llm::ModelError::Status { status: 503, message: "overloaded".into() })
}

/// (attempt, pause in ms) of each `model_retry` event.
fn model_retries(events: &[Arc<crate::protocol::RunEvent>]) -> Vec<(u32, u64)> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::ModelRetry { attempt, retry_in_ms, code, .. } => {
                assert_eq!(code, "model_status");
                Some((*attempt, *retry_in_ms))
            }
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_provider_outage_is_waited_out_and_the_run_goes_on() {
    let model = ScriptedModel::queue(vec![overloaded(), overloaded(), text("All done.")]);
    let harness = Setup::new(model).start().await;
    let (record, events) = harness.run("anything").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(record.final_output.as_deref(), Some("All done."));
    assert_eq!(model_retries(&events), [(1, 2_000), (2, 4_000)], "growing pauses, each announced");
    assert!(!events.iter().any(|e| matches!(e.kind, EventKind::Error { .. })), "no error reaches the client");
    assert_eq!(harness.requests().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_provider_outage_longer_than_the_wait_fails_the_run() {
    let mut setup = Setup::new(ScriptedModel::queue(vec![overloaded(), overloaded(), text("too late")]));
    setup.config.model_outage_wait = std::time::Duration::from_secs(5);
    let harness = setup.start().await;
    let (record, events) = harness.run("anything").await;

    assert_eq!(record.status, RunStatus::Failed);
    assert_eq!(record.reason.as_deref(), Some("model error: model returned status 503: overloaded"));
    assert_eq!(model_retries(&events), [(1, 2_000)], "a second pause of 4 s would pass the 5 s wait");
    assert_eq!(harness.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calls_record_names_its_agent_connector_documents_and_error() {
    let model = ScriptedModel::per_turn(vec![
        calls(&[
            ("search", json!({"query": "a"})),
            ("flaky", json!({})),
            ("todo_write", crate::testing::todo(&[("1", "look", "in_progress")])),
        ]),
        text("done"),
    ]);
    let harness = Setup::new(model).start().await;
    let (record, _) = harness.run("find a").await;
    assert_eq!(record.status, RunStatus::Succeeded);
    let snapshot = harness.runtime.store().load(record.run_id).await.unwrap().unwrap();
    let by_tool = |tool: &str| snapshot.tool_executions.iter().find(|call| call.tool == tool).unwrap().clone();
    let (search, flaky, plan) = (by_tool("search"), by_tool("flaky"), by_tool("todo_write"));
    assert_eq!((search.agent.as_str(), search.connector.as_str()), ("tester", "local"));
    assert_eq!(search.fragment_ids, ["a-1", "a-2"], "the documents it added, by id");
    assert_eq!((search.error, search.error_message), (None, None));
    assert_eq!(flaky.error.as_deref(), Some("boom"));
    assert_eq!(flaky.error_message.as_deref(), Some("the service is down"), "the failure in words, not only a code");
    assert_eq!((plan.connector.as_str(), plan.agent.as_str()), ("builtin", "tester"));
}
