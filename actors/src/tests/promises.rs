//! Promises of the actor tree that only a fault shows: the shared pool and
//! reviewer restarted with work in flight, the planner restarted from its last
//! plan, the escalation of a meltdown of the shared actors, a reviewer's new
//! plan, the caps on parallel tool calls, and a model-backed review that works.
//!
//! Faults are injected, never waited for: an actor is made to panic in its own
//! handler by a message whose reply panics when answered ([`crash_tool_pool`],
//! [`crash_reviewer`]), and tools block on semaphores the test opens.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use ractor::{ActorRef, SupervisionEvent};
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::config::{AgentConfig, RestartPolicy, ReviewerKind, RuntimeConfig};
use crate::llm::{ModelRegistry, ModelReply};
use crate::metrics::{ACTOR_RESTARTS_TOTAL, SUPERVISOR_MELTDOWNS_TOTAL};
use crate::planner::PlannerMsg;
use crate::protocol::{
    CallStatus, EventKind, Limits, Plan, Recommendation, Review, ReviewStatus, RunEvent, RunId, RunStatus, TaskStatus,
    TodoItem, ToolCall,
};
use crate::reviewer::{ReviewInput, ReviewReply, ReviewerMsg};
use crate::runtime::{Deps, Runtime, SubmitError, SubmitRequest};
use crate::session::SessionMsg;
use crate::store::{MemoryStore, RunSnapshot, RunStore};
use crate::testing::{
    EchoTool, ScriptedModel, Step, StreamHold, calls, capture_metrics, counter, eventually, text, todo,
};
use crate::tests::{AGENT, Harness, Setup, tool_messages, wait_for};
use crate::tool::{Tool, ToolContext, ToolError, ToolOutput, ToolRegistry};
use crate::tool_pool::{ToolJob, ToolPoolConfig, ToolPoolMsg, ToolReply};

/// How long a test waits for anything.
const WITHIN: Duration = Duration::from_secs(60);

/// What the model reads of a call the crashed pool held.
const POOL_UNAVAILABLE: &str =
    "error (tool_pool_unavailable): the tool executor stopped before answering this call; try again";

/// What the model reads of a call refused by a full pool queue.
const POOL_OVERLOADED: &str = "error (pool_overloaded): too many tool calls are waiting; try again later";

/// A tool pool that restarts with a call in flight answers that call
/// `tool_pool_unavailable` (the model reads it), the run goes on, and its next
/// call runs on the restarted pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_crash_answers_the_call_in_flight_and_the_run_goes_on() {
    capture_metrics();
    let restarts = counter(ACTOR_RESTARTS_TOTAL, &[("actor", "tool_pool")]);
    let hold = Arc::new(StreamHold::default());
    let after_the_crash = Step::Streamed {
        deltas: Vec::new(),
        reply: reply_of(calls(&[("echo", json!({"text": "after the restart"}))])),
        hold: Some(hold.clone()),
    };
    let model = ScriptedModel::per_turn(vec![calls(&[("turnstile", json!({"n": 1}))]), after_the_crash, text("done")]);
    let (turnstile, mut entered) = Turnstile::new();
    let mut setup = Setup::new(model);
    setup.extra_tools = vec![Arc::new(turnstile.clone())];
    let harness = setup.start().await;
    let run_id = harness.submit("wait, then echo").await;

    assert_eq!(next_entry(&mut entered).await, 1, "the call runs on a worker");
    let pool = harness.runtime.tool_pool().expect("the tool pool runs");
    crash_tool_pool(&pool);
    let restarted = eventually(WITHIN, "the pool to restart", || async {
        harness.runtime.tool_pool().filter(|new| new.get_id() != pool.get_id())
    })
    .await;
    // Turn 2 calls echo only once the restarted pool is in place.
    hold.finish.add_permits(1);
    let (record, events) = harness.finish(run_id).await;

    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(record.final_output.as_deref(), Some("done"));
    let requests = harness.requests();
    assert_eq!(tool_messages(&requests[1]), [POOL_UNAVAILABLE], "the model read why the call failed");
    assert_eq!(tool_messages(&requests[2]).last().map(String::as_str), Some("after the restart"));
    assert_eq!(
        call_ends(&events),
        [("turnstile".to_owned(), CallStatus::Failed), ("echo".to_owned(), CallStatus::Completed)]
    );
    let snapshot = snapshot(&harness.runtime, run_id).await;
    assert_eq!(snapshot.tool_executions[0].error.as_deref(), Some("tool_pool_unavailable"));
    assert_eq!(turnstile.entries(), 1, "the call was answered, not run again");
    assert_eq!(counter(ACTOR_RESTARTS_TOTAL, &[("actor", "tool_pool")]) - restarts, 1);
    let (queued, busy, _) = ractor::call!(restarted, |reply| ToolPoolMsg::Stats { reply }).unwrap();
    assert_eq!((queued, busy), (0, 0), "nothing of the old pool lingers in the new one");
}

/// A reviewer that crashes with a turn's review waiting in its mailbox: that
/// turn gets the degraded rule-based review, the run ends with its answer, and
/// the restarted reviewer serves the next run with the model's review.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reviewer_crash_with_a_review_in_flight_falls_back_and_the_run_ends() {
    capture_metrics();
    let restarts = counter(ACTOR_RESTARTS_TOTAL, &[("actor", "reviewer")]);
    let judge = ScriptedModel::per_turn(vec![verdict(0.9, 0.8, 0.7, "proceed", None)]);
    let harness = start_judged(ScriptedModel::per_turn(vec![text("the answer")]), judge).await;
    let judge = harness.judge.clone();
    let reviewer = eventually(WITHIN, "the reviewer", || async { reviewer_of(&harness.runtime) }).await;
    // The reviewer is held in a poisoned review until the run's review waits
    // behind it in its mailbox; then it panics.
    let (release, released) = std::sync::mpsc::channel::<()>();
    crash_reviewer(&reviewer, move || {
        tokio::task::block_in_place(|| released.recv().ok());
    });
    let run_id = harness.submit("answer me").await;
    let mut events = harness.runtime.subscribe(run_id, 0);
    // A model-backed review is asked right after the reply commits, in the same
    // handler: once the session answers the next message, the review is sent.
    wait_for(&mut events, |kind| matches!(kind, EventKind::TokenUsage { turn: 1, .. })).await;
    let session = harness.runtime.session(run_id).await.unwrap().expect("the run's session");
    ractor::call!(session, |reply| SessionMsg::WaitingOn { reply }).unwrap();
    release.send(()).unwrap();
    let (record, _) = harness.finish(run_id).await;

    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(record.final_output.as_deref(), Some("the answer"));
    let reviews = snapshot(&harness.runtime, run_id).await.reviews;
    assert_eq!(reviews.len(), 1);
    assert_eq!(reviews[0].1.status, ReviewStatus::Degraded);
    assert!(reviews[0].1.notes.starts_with("the reviewer failed"), "{:?}", reviews[0].1.notes);
    assert_eq!(judge.request_count(), 0, "the review died with the reviewer's mailbox");

    eventually(WITHIN, "the reviewer to restart", || async {
        reviewer_of(&harness.runtime).is_some_and(|new| new.get_id() != reviewer.get_id())
    })
    .await;
    assert_eq!(counter(ACTOR_RESTARTS_TOTAL, &[("actor", "reviewer")]) - restarts, 1);
    let next = harness.submit("answer me again").await;
    let (record, _) = harness.finish(next).await;
    assert_eq!(record.status, RunStatus::Succeeded);
    let reviews = snapshot(&harness.runtime, next).await.reviews;
    assert_eq!(reviews[0].1.status, ReviewStatus::Ok, "{:?}", reviews[0].1);
    assert_eq!(judge.request_count(), 1);
}

/// A planner that crashes is restarted from the run's last plan: the next
/// `todo_write` succeeds and numbers its plan after the last one, and the run
/// goes on with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_planner_restarts_from_the_last_plan() {
    capture_metrics();
    let restarts = counter(ACTOR_RESTARTS_TOTAL, &[("actor", "planner")]);
    let hold = Arc::new(StreamHold::default());
    let progress = todo(&[("a", "look it up", "completed"), ("b", "answer", "in_progress")]);
    let model = ScriptedModel::per_turn(vec![
        calls(&[("todo_write", todo(&[("a", "look it up", "in_progress"), ("b", "answer", "pending")]))]),
        Step::Streamed {
            deltas: Vec::new(),
            reply: reply_of(calls(&[("todo_write", progress)])),
            hold: Some(hold.clone()),
        },
        text("done"),
    ]);
    let harness = Setup::new(model).start().await;
    let run_id = harness.submit("plan, then answer").await;
    // Turn 2 asks the model: turn 1's plan is committed.
    tokio::time::timeout(WITHIN, hold.streamed.notified()).await.expect("turn 2's model call");
    let session = harness.runtime.session(run_id).await.unwrap().expect("the run's session");
    let planner = planner_of(&session).expect("the run's planner");
    // The planner validates every input, so no message makes it panic: the test
    // sends its session the `ActorFailed` report a panic would, and kills it.
    planner.get_cell().notify_supervisor(SupervisionEvent::ActorFailed(planner.get_cell(), "injected fault".into()));
    planner.get_cell().kill_and_wait(None).await.unwrap();
    eventually(WITHIN, "a new planner", || async {
        planner_of(&session).is_some_and(|new| new.get_id() != planner.get_id())
    })
    .await;
    hold.finish.add_permits(1);
    let (record, events) = harness.finish(run_id).await;

    assert_eq!(record.status, RunStatus::Succeeded);
    let versions: Vec<u64> = events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::PlanUpdated { plan } => Some(plan.version),
            _ => None,
        })
        .collect();
    assert_eq!(versions, [1, 2], "the restarted planner went on from version 1");
    let snapshot = snapshot(&harness.runtime, run_id).await;
    assert_eq!(snapshot.plan.version, 2);
    let statuses: Vec<TaskStatus> = snapshot.plan.items.iter().map(|item| item.status).collect();
    assert_eq!(statuses, [TaskStatus::Completed, TaskStatus::InProgress]);
    assert!(snapshot.tool_executions.iter().all(|call| call.status == CallStatus::Completed), "no todo_write failed");
    let plan = tool_messages(&harness.requests()[2]).pop().unwrap();
    assert!(plan.contains("<plan version=\"2\">") && plan.contains("✓ [a] look it up"), "{plan}");
    assert_eq!(counter(ACTOR_RESTARTS_TOTAL, &[("actor", "planner")]) - restarts, 1);
}

/// More crashes of the shared actors (pool and reviewer, counted together) than
/// `max_restarts` within `period`: the supervisor gives up, the runtime refuses
/// runs, a run under way keeps its last commit in the store (its stream ends,
/// it is not failed), and the next runtime on that store finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_meltdown_of_the_shared_actors_stops_the_runtime_and_keeps_its_runs() {
    capture_metrics();
    let meltdowns = counter(SUPERVISOR_MELTDOWNS_TOTAL, &[("level", "root")]);
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let script = |last: Step| ScriptedModel::per_turn(vec![calls(&[("echo", json!({"text": "kept"}))]), last]);
    let mut setup = Setup::new(script(Step::Hang));
    setup.store = store.clone();
    setup.config.restarts = RestartPolicy { max_restarts: 1, period: Duration::from_secs(3600) };
    let first = setup.start().await;
    let run_id = first.submit("echo, then think").await;
    let mut events = first.runtime.subscribe(run_id, 0);
    wait_for(&mut events, |kind| matches!(kind, EventKind::TurnStart { turn: 2 })).await;

    let pool = first.runtime.tool_pool().expect("the tool pool runs");
    crash_tool_pool(&pool);
    let reviewer = eventually(WITHIN, "the pool to restart", || async {
        first.runtime.tool_pool().filter(|new| new.get_id() != pool.get_id())?;
        reviewer_of(&first.runtime)
    })
    .await;
    assert!(first.runtime.accepting(), "one restart is within the intensity");
    crash_reviewer(&reviewer, || {});
    eventually(WITHIN, "the runtime to stop accepting", || async { !first.runtime.accepting() }).await;
    tokio::time::timeout(WITHIN, first.runtime.stopped()).await.expect("stopped() resolves: a daemon exits on it");

    let refused = first.runtime.submit(SubmitRequest::new(AGENT, "anyone there?")).await;
    assert_eq!(refused, Err(SubmitError::Unavailable));
    assert_eq!(counter(SUPERVISOR_MELTDOWNS_TOTAL, &[("level", "root")]) - meltdowns, 1);
    let rest: Vec<Arc<RunEvent>> = tokio::time::timeout(WITHIN, events.map(|event| event.unwrap()).collect())
        .await
        .expect("a follower's stream ends with the supervisor");
    assert!(rest.iter().all(|event| !matches!(event.kind, EventKind::RunEnd { .. })), "{rest:?}");
    // A follower that comes later is served what is stored, and its stream ends too.
    let later = first.runtime.subscribe(run_id, 0).map(|event| event.unwrap()).collect::<Vec<_>>();
    let later = tokio::time::timeout(WITHIN, later).await.expect("a later follower's stream ends");
    let seqs: Vec<u64> = later.iter().map(|event| event.seq).collect();
    assert_eq!(seqs, (1..=later.len() as u64).collect::<Vec<_>>(), "everything the store holds, in order");
    assert!(matches!(later.last().map(|event| &event.kind), Some(EventKind::TurnStart { turn: 2 })), "{later:?}");
    let kept = store.get_run(run_id).await.unwrap().expect("the run is kept");
    assert_eq!((kept.status, kept.turn), (RunStatus::Running, 2), "kept at its last commit, not failed");

    let mut setup = Setup::new(script(text("recovered")));
    setup.store = store.clone();
    let second = setup.start().await;
    let (record, _) = second.finish(run_id).await;
    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(record.final_output.as_deref(), Some("recovered"));
    assert_eq!(second.requests().len(), 1, "only the turn cut off is asked again");
    assert_eq!(tool_messages(&second.requests()[0]), ["kept"], "turn 1's result survived");
}

/// A model-backed review recommending `replan` with an `updated_plan` replaces
/// the run's plan: a `plan_updated` event and the stored plan show the
/// reviewer's tasks, numbered after the model's own plan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reviewers_replan_replaces_the_plan() {
    let model = ScriptedModel::per_turn(vec![
        calls(&[("todo_write", todo(&[("1", "guess the answer", "in_progress")]))]),
        text("the answer, checked"),
    ]);
    let new_plan = json!([
        {"id": "1", "content": "look the answer up", "status": "in_progress"},
        {"id": "2", "content": "check it", "status": "pending"}
    ]);
    let judge = ScriptedModel::queue(vec![
        verdict(0.4, 0.0, 0.5, "replan", Some(new_plan.clone())),
        verdict(1.0, 1.0, 1.0, "proceed", None),
    ]);
    let harness = start_judged(model, judge).await;
    let (record, events) = harness.run("what is the answer?").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    let expected: Vec<TodoItem> = serde_json::from_value(new_plan).unwrap();
    let plans: Vec<&Plan> = events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::PlanUpdated { plan } => Some(plan),
            _ => None,
        })
        .collect();
    assert_eq!(plans.len(), 2, "the model's plan, then the reviewer's");
    assert_eq!((plans[1].version, &plans[1].items), (2, &expected));
    let review = events.iter().position(|e| matches!(e.kind, EventKind::Review { turn: 1, .. }));
    let replaced = events.iter().rposition(|e| matches!(e.kind, EventKind::PlanUpdated { .. }));
    let turn_end = events.iter().position(|e| matches!(e.kind, EventKind::TurnEnd { turn: 1 }));
    assert!(replaced < review && review < turn_end, "the plan changes with turn 1's review");
    let snapshot = snapshot(&harness.runtime, record.run_id).await;
    assert_eq!(snapshot.plan, Plan { version: 2, items: expected.clone() });
    let (turn, review) = &snapshot.reviews[0];
    assert_eq!((*turn, review.status, review.recommendation), (1, ReviewStatus::Ok, Recommendation::Replan));
    assert_eq!(review.updated_plan.as_ref(), Some(&expected));
    let shown = harness.requests()[1].messages.last().unwrap().content.clone();
    assert!(shown.starts_with("Review of turn 1 by the runtime (not the user): replan."), "{shown}");
    assert!(shown.contains("New plan: 1 [InProgress] look the answer up\nNew plan: 2 [Pending] check it"), "{shown}");
}

/// A run whose limits allow 2 parallel tool calls never has more than 2 running,
/// though its model asks for 4 in one turn; all 4 run, in order, as slots free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_parallel_tools_caps_the_calls_running_at_once() {
    let four = (1..=4).map(|n| ("turnstile", json!({"n": n}))).collect::<Vec<_>>();
    let mut setup = Setup::new(ScriptedModel::per_turn(vec![calls(&four), text("done")]));
    setup.limits = Limits { max_parallel_tools: 2, ..Limits::default() };
    let (turnstile, mut entered) = Turnstile::new();
    setup.extra_tools = vec![Arc::new(turnstile.clone())];
    let harness = setup.start().await;
    let run_id = harness.submit("four calls, two at a time").await;

    let mut first_two = [next_entry(&mut entered).await, next_entry(&mut entered).await];
    first_two.sort_unstable();
    assert_eq!(first_two, [1, 2], "the first two calls run together");
    // The pool answers this after every job cast before it: it got only 2.
    let pool = harness.runtime.tool_pool().expect("the tool pool runs");
    let (queued, busy, _) = ractor::call!(pool, |reply| ToolPoolMsg::Stats { reply }).unwrap();
    assert_eq!((queued, busy), (0, 2), "the session holds the other calls back");
    for n in 3..=4 {
        turnstile.gate.add_permits(1);
        assert_eq!(next_entry(&mut entered).await, n, "one call ended, the next started");
        assert_eq!(turnstile.inside.load(Ordering::SeqCst), 2);
    }
    turnstile.gate.add_permits(2);
    let (record, events) = harness.finish(run_id).await;

    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(turnstile.most.load(Ordering::SeqCst), 2, "never more than 2 at once");
    assert_eq!(call_ends(&events).iter().filter(|(_, status)| *status == CallStatus::Completed).count(), 4);
    let results = tool_messages(&harness.requests()[1]);
    assert_eq!(results, ["passed 1", "passed 2", "passed 3", "passed 4"], "the results join in call order");
}

/// A pool with 1 worker and room for 1 waiting call, given 4 calls at once, runs
/// 2 and fails the other 2 at once with `pool_overloaded` (while the first still
/// runs), which the model reads as their results.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_tool_queue_fails_the_extra_calls_at_once_with_pool_overloaded() {
    let four = (1..=4).map(|n| ("turnstile", json!({"n": n}))).collect::<Vec<_>>();
    let mut setup = Setup::new(ScriptedModel::per_turn(vec![calls(&four), text("done")]));
    setup.config.tool_pool = ToolPoolConfig { workers: 1, queue_limit: 1, ..ToolPoolConfig::default() };
    let (turnstile, mut entered) = Turnstile::new();
    setup.extra_tools = vec![Arc::new(turnstile.clone())];
    let harness = setup.start().await;
    let run_id = harness.submit("four calls, one worker").await;
    let mut events = harness.runtime.subscribe(run_id, 0);

    assert_eq!(next_entry(&mut entered).await, 1);
    for _ in 0..2 {
        let refused = |kind: &EventKind| matches!(kind, EventKind::ToolCallEnd { status: CallStatus::Failed, .. });
        wait_for(&mut events, refused).await;
    }
    let pool = harness.runtime.tool_pool().expect("the tool pool runs");
    let (queued, busy, idle) = ractor::call!(pool, |reply| ToolPoolMsg::Stats { reply }).unwrap();
    assert_eq!((queued, busy, idle), (1, 1, 0), "the first call runs and the second waits");
    turnstile.gate.add_permits(2);
    let (record, _) = harness.finish(run_id).await;

    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(turnstile.entries(), 2, "the refused calls never ran");
    let results = tool_messages(&harness.requests()[1]);
    assert_eq!(results, ["passed 1", "passed 2", POOL_OVERLOADED, POOL_OVERLOADED]);
    let snapshot = snapshot(&harness.runtime, run_id).await;
    let errors: Vec<Option<&str>> = snapshot.tool_executions.iter().map(|call| call.error.as_deref()).collect();
    assert_eq!(errors, [None, None, Some("pool_overloaded"), Some("pool_overloaded")]);
}

/// A model-backed review that answers valid JSON is stored as the model's: status
/// `ok`, not `degraded`, with the model's scores, on every turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_backed_review_keeps_the_models_verdict() {
    let model = ScriptedModel::per_turn(vec![calls(&[("echo", json!({"text": "x"}))]), text("x it is")]);
    let judge =
        ScriptedModel::queue(vec![verdict(0.9, 0.25, 0.75, "proceed", None), verdict(0.8, 1.0, 0.6, "proceed", None)]);
    let harness = start_judged(model, judge).await;
    let (record, events) = harness.run("echo x").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(record.final_output.as_deref(), Some("x it is"));
    let stored = snapshot(&harness.runtime, record.run_id).await.reviews;
    let scores: Vec<(u32, ReviewStatus, f64, f64, f64)> = stored
        .iter()
        .map(|(turn, review)| (*turn, review.status, review.quality_score, review.completeness, review.relevance))
        .collect();
    assert_eq!(scores, [(1, ReviewStatus::Ok, 0.9, 0.25, 0.75), (2, ReviewStatus::Ok, 0.8, 1.0, 0.6)]);
    assert!(stored.iter().all(|(_, review)| review.notes == "judged by the model"));
    let published: Vec<&Review> = events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::Review { review, .. } => Some(review.as_ref()),
            _ => None,
        })
        .collect();
    assert_eq!(published, stored.iter().map(|(_, review)| review).collect::<Vec<_>>(), "clients see the same");
    let asked = harness.judge.requests();
    assert_eq!(asked.len(), 2, "one model review per turn");
    assert!(asked[1].messages[1].content.contains("x it is"), "the judge read the answer it judged");
}

/// A [`Harness`] whose agent (tools: `echo`) is reviewed by the model `judge`.
struct Judged {
    harness: Harness,
    judge: Arc<ScriptedModel>,
}

impl std::ops::Deref for Judged {
    type Target = Harness;
    fn deref(&self) -> &Harness {
        &self.harness
    }
}

/// A runtime on a memory store whose agent answers with `model` and is reviewed
/// by `judge`.
async fn start_judged(model: ScriptedModel, judge: ScriptedModel) -> Judged {
    let (model, judge) = (Arc::new(model), Arc::new(judge));
    let mut agent = AgentConfig::new(AGENT, "You are a test agent.", vec!["echo".into()]);
    agent.reviewer = ReviewerKind::Model { model: Some("judge".to_owned()) };
    let deps = Deps {
        store: Arc::new(MemoryStore::new()),
        models: ModelRegistry::new(model.clone()).with("judge", judge.clone()),
        tools: ToolRegistry::new().with(Arc::new(EchoTool)).unwrap(),
        hooks: Vec::new(),
        agents: vec![agent],
    };
    let runtime = Runtime::start(RuntimeConfig::default(), deps).await.unwrap();
    Judged { harness: Harness { runtime, model, ledger: Default::default() }, judge }
}

/// A reviewer model's reply: the review JSON with these scores.
fn verdict(quality: f64, completeness: f64, relevance: f64, recommendation: &str, plan: Option<Value>) -> Step {
    let review = json!({
        "quality_score": quality, "completeness": completeness, "relevance": relevance,
        "needs_more_data": recommendation != "proceed", "gaps": [], "suggested_actions": [],
        "recommendation": recommendation, "updated_plan": plan, "notes": "judged by the model",
    });
    text(&review.to_string())
}

/// The reply of a scripted step.
fn reply_of(step: Step) -> ModelReply {
    match step {
        Step::Reply(reply) => reply,
        _ => unreachable!("a reply step"),
    }
}

/// The run as the store has it.
async fn snapshot(runtime: &Runtime, run_id: RunId) -> RunSnapshot {
    runtime.store().load(run_id).await.unwrap().expect("the run is stored")
}

/// (tool, status) of every `tool_call_end`, in order.
fn call_ends(events: &[Arc<RunEvent>]) -> Vec<(String, CallStatus)> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::ToolCallEnd { tool, status, .. } => Some((tool.clone(), *status)),
            _ => None,
        })
        .collect()
}

/// Makes the tool pool's actor panic in its own handler: it runs a call whose
/// reply panics when the pool answers it. What the pool held dies with it.
fn crash_tool_pool(pool: &ActorRef<ToolPoolMsg>) {
    let call = ToolCall { call_id: "poison".into(), name: "echo".into(), args: json!({"text": "poison"}) };
    let (shared, work) = crate::tool_pool::bare_job(AGENT, call);
    let reply = ToolReply::new(shared, work.clone(), |_| panic!("injected tool pool fault"));
    assert!(pool.cast(ToolPoolMsg::Execute(Box::new(ToolJob { work, reply }))).is_ok());
}

/// Makes the reviewer's actor panic in its own handler: a review whose reply
/// runs `before` and then panics. Reviews behind it in its mailbox die with it.
fn crash_reviewer(reviewer: &ActorRef<ReviewerMsg>, before: impl FnOnce() + Send + 'static) {
    let input = Arc::new(ReviewInput {
        turn: 1,
        request: "poison".into(),
        plan: Plan::default(),
        calls: Vec::new(),
        final_answer: None,
        blocked_tools: Vec::new(),
        synthesis: false,
        ungrounded: false,
        ended: None,
    });
    let reply = ReviewReply::new(input.clone(), move |_| {
        before();
        panic!("injected reviewer fault")
    });
    let review = ReviewerMsg::Review {
        kind: ReviewerKind::RuleBased,
        agent_model: None,
        input,
        reply,
        span: tracing::Span::none(),
    };
    assert!(reviewer.cast(review).is_ok());
}

/// The live reviewer, found among the supervisor's children (beside the pool).
fn reviewer_of(runtime: &Runtime) -> Option<ActorRef<ReviewerMsg>> {
    let supervisor = runtime.tool_pool()?.get_cell().try_get_supervisor()?;
    live_child(supervisor.get_children())
}

/// The session's live planner.
fn planner_of(session: &ActorRef<SessionMsg>) -> Option<ActorRef<PlannerMsg>> {
    live_child(session.get_cell().get_children())
}

/// The running actor of message type `M` among `children`.
fn live_child<M: ractor::Message>(children: Vec<ractor::ActorCell>) -> Option<ActorRef<M>> {
    children
        .into_iter()
        .find(|child| {
            child.is_message_type_of::<M>() == Some(true) && ractor::ACTIVE_STATES.contains(&child.get_status())
        })
        .map(ActorRef::from)
}

/// `turnstile`: each call tells the test it entered (its `n`), then waits for a
/// permit of `gate`; it counts the calls inside at once and the most there were.
#[derive(Clone)]
struct Turnstile {
    gate: Arc<Semaphore>,
    inside: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    entered: UnboundedSender<u64>,
    total: Arc<AtomicUsize>,
}

impl Turnstile {
    /// The tool, closed, and where its entries are told.
    fn new() -> (Self, UnboundedReceiver<u64>) {
        let (entered, entries) = unbounded_channel();
        let tool = Self {
            gate: Arc::new(Semaphore::new(0)),
            inside: Arc::default(),
            most: Arc::default(),
            entered,
            total: Arc::default(),
        };
        (tool, entries)
    }

    /// Calls that entered so far.
    fn entries(&self) -> usize {
        self.total.load(Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl Tool for Turnstile {
    fn name(&self) -> &str {
        "turnstile"
    }
    fn description(&self) -> &str {
        "Waits until the test lets it through."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    }
    async fn call(&self, _context: ToolContext, args: Value) -> Result<ToolOutput, ToolError> {
        let n = args["n"].as_u64().unwrap_or_default();
        let inside = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(inside, Ordering::SeqCst);
        self.total.fetch_add(1, Ordering::SeqCst);
        let _ = self.entered.send(n);
        let permit = self.gate.acquire().await;
        self.inside.fetch_sub(1, Ordering::SeqCst);
        permit.map_err(|error| ToolError::failed("closed", error.to_string()))?.forget();
        Ok(ToolOutput::value(json!(format!("passed {n}"))))
    }
}

/// The `n` of the next call to enter the turnstile.
async fn next_entry(entered: &mut UnboundedReceiver<u64>) -> u64 {
    tokio::time::timeout(WITHIN, entered.recv()).await.expect("a call entered").expect("the tool lives")
}
