//! Threads: a follow-up sees the thread's earlier exchange; one active run per
//! thread, with each multitask strategy; the order holds under many concurrent
//! messages and across a restart; idempotency keys.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::llm::Role;
use crate::protocol::{RunStatus, ThreadId};
use crate::runtime::{SubmitError, ThreadRun};
use crate::store::{Idempotency, Metadata};
use crate::testing::{Step, StreamHold, text};
use crate::threads::{INTERRUPTED, MultitaskStrategy, ROLLED_BACK, messages};

async fn thread(harness: &Harness) -> ThreadId {
    let (thread, replayed) =
        harness.runtime.create_thread("default".into(), AGENT.into(), Metadata::new(), None).await.unwrap();
    assert!(!replayed);
    thread.thread_id
}

fn message(thread_id: ThreadId, input: &str, strategy: MultitaskStrategy) -> SubmitRequest {
    let mut request = SubmitRequest::new(AGENT, input);
    request.thread = Some(ThreadRun { thread_id, strategy });
    request
}

async fn send(harness: &Harness, thread_id: ThreadId, input: &str, strategy: MultitaskStrategy) -> RunId {
    harness.runtime.submit(message(thread_id, input, strategy)).await.unwrap()
}

/// The (role, content) pairs of a request after its system prompt.
fn said(request: &ChatRequest) -> Vec<(Role, String)> {
    request.messages.iter().skip(1).map(|message| (message.role, message.content.clone())).collect()
}

/// The thread's conversation as (role, content, interrupted).
async fn conversation(harness: &Harness, thread_id: ThreadId) -> Vec<(Role, String, bool)> {
    let runs = harness.runtime.thread_runs(thread_id).await.unwrap();
    messages(&runs).into_iter().map(|m| (m.role, m.content, m.interrupted)).collect()
}

/// Waits until the model has been asked `count` times.
async fn model_asked(harness: &Harness, count: usize) {
    crate::testing::eventually(Duration::from_secs(10), "the model to be asked", || async {
        harness.model.request_count() >= count
    })
    .await;
}

fn user(text: &str) -> (Role, String) {
    (Role::User, text.to_owned())
}

fn assistant(text: &str) -> (Role, String) {
    (Role::Assistant, text.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_sees_the_earlier_exchange_and_the_thread_lists_both_in_order() {
    let model = ScriptedModel::queue(vec![
        text("You have two parcels arriving today."),
        text("The first parcel comes with DHL."),
    ]);
    let harness = Setup::new(model).start().await;
    let thread_id = thread(&harness).await;
    let first = send(&harness, thread_id, "Am I expecting deliveries today?", MultitaskStrategy::Reject).await;
    assert_eq!(harness.finish(first).await.0.status, RunStatus::Succeeded);
    let second = send(&harness, thread_id, "Which carrier brings the first one?", MultitaskStrategy::Reject).await;
    let (record, _) = harness.finish(second).await;
    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(record.thread_id, Some(thread_id));

    let requests = harness.requests();
    assert_eq!(said(&requests[0]), vec![user("Am I expecting deliveries today?")], "the first run has no history");
    assert_eq!(
        said(&requests[1]),
        vec![
            user("Am I expecting deliveries today?"),
            assistant("You have two parcels arriving today."),
            user("Which carrier brings the first one?"),
        ]
    );
    assert_eq!(
        conversation(&harness, thread_id).await,
        vec![
            (Role::User, "Am I expecting deliveries today?".into(), false),
            (Role::Assistant, "You have two parcels arriving today.".into(), false),
            (Role::User, "Which carrier brings the first one?".into(), false),
            (Role::Assistant, "The first parcel comes with DHL.".into(), false),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_refuses_a_message_while_a_run_is_active_and_names_it() {
    let harness = Setup::new(ScriptedModel::queue(vec![Step::Hang])).start().await;
    let thread_id = thread(&harness).await;
    let active = send(&harness, thread_id, "first", MultitaskStrategy::Reject).await;
    let refused = harness.runtime.submit(message(thread_id, "second", MultitaskStrategy::Reject)).await;
    assert_eq!(refused, Err(SubmitError::ThreadBusy { active_run_id: active }));
    assert_eq!(harness.runtime.thread_runs(thread_id).await.unwrap().len(), 1, "nothing was created");
    harness.runtime.cancel(active).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_runs_the_message_after_the_active_run_with_its_answer_in_the_history() {
    let hold = Arc::new(StreamHold::default());
    let slow = Step::Streamed {
        deltas: vec![crate::llm::ModelDelta::Text("It is ".into())],
        reply: crate::llm::ModelReply { content: "It is sunny in Paris.".into(), ..Default::default() },
        hold: Some(hold.clone()),
    };
    let harness = Setup::new(ScriptedModel::queue(vec![slow, text("Take sunglasses.")])).start().await;
    let thread_id = thread(&harness).await;
    let first = send(&harness, thread_id, "What is the weather in Paris?", MultitaskStrategy::Reject).await;
    hold.streamed.notified().await;
    let second = send(&harness, thread_id, "What should I take?", MultitaskStrategy::Enqueue).await;
    assert_eq!(harness.runtime.get(second).await.unwrap().unwrap().status, RunStatus::Queued);
    assert_eq!(harness.model.request_count(), 1, "the queued message waits for the active run");

    hold.finish.add_permits(1);
    assert_eq!(harness.finish(first).await.0.status, RunStatus::Succeeded);
    assert_eq!(harness.finish(second).await.0.status, RunStatus::Succeeded);
    let requests = harness.requests();
    assert_eq!(
        said(&requests[1]),
        vec![user("What is the weather in Paris?"), assistant("It is sunny in Paris."), user("What should I take?"),]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_cancels_the_active_run_which_stays_in_the_history_marked() {
    let harness = Setup::new(ScriptedModel::queue(vec![Step::Hang, text("Here is the short version.")])).start().await;
    let thread_id = thread(&harness).await;
    let first = send(&harness, thread_id, "Summarise my inbox", MultitaskStrategy::Reject).await;
    model_asked(&harness, 1).await;
    let second = send(&harness, thread_id, "Actually, keep it short", MultitaskStrategy::Interrupt).await;
    let (interrupted, _) = harness.finish(first).await;
    assert_eq!((interrupted.status, interrupted.reason.as_deref()), (RunStatus::Cancelled, Some(INTERRUPTED)));
    assert_eq!(harness.finish(second).await.0.status, RunStatus::Succeeded);
    let note = "(interrupted by the next message before answering)";
    assert_eq!(
        conversation(&harness, thread_id).await,
        vec![
            (Role::User, "Summarise my inbox".into(), false),
            (Role::Assistant, note.into(), true),
            (Role::User, "Actually, keep it short".into(), false),
            (Role::Assistant, "Here is the short version.".into(), false),
        ]
    );
    let last = harness.requests().pop().unwrap();
    assert_eq!(said(&last), vec![user("Summarise my inbox"), assistant(note), user("Actually, keep it short")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_cancels_the_active_run_and_removes_it_from_the_history() {
    let harness = Setup::new(ScriptedModel::queue(vec![Step::Hang, text("Berlin is cloudy.")])).start().await;
    let thread_id = thread(&harness).await;
    let first = send(&harness, thread_id, "Weather in Paris?", MultitaskStrategy::Reject).await;
    model_asked(&harness, 1).await;
    let second = send(&harness, thread_id, "No, in Berlin?", MultitaskStrategy::Rollback).await;
    let (rolled_back, _) = harness.finish(first).await;
    assert_eq!(rolled_back.reason.as_deref(), Some(ROLLED_BACK));
    assert_eq!(harness.finish(second).await.0.status, RunStatus::Succeeded);
    assert_eq!(
        conversation(&harness, thread_id).await,
        vec![(Role::User, "No, in Berlin?".into(), false), (Role::Assistant, "Berlin is cloudy.".into(), false)]
    );
    assert_eq!(said(&harness.requests().pop().unwrap()), vec![user("No, in Berlin?")]);
}

/// Many messages sent at once with `enqueue`: the runs run one at a time, in the
/// order they were accepted, each seeing every earlier exchange and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_messages_run_one_at_a_time_in_order_and_never_interleave() {
    let answers: Vec<Step> = (0..12).map(|n| text(&format!("Answer number {n}."))).collect();
    let harness = Arc::new(Setup::new(ScriptedModel::queue(answers)).start().await);
    let thread_id = thread(&harness).await;
    let sends = (0..12).map(|n| {
        let harness = harness.clone();
        tokio::spawn(
            async move { send(&harness, thread_id, &format!("Message {n}"), MultitaskStrategy::Enqueue).await },
        )
    });
    let mut runs = Vec::new();
    for sent in futures::future::join_all(sends).await {
        runs.push(sent.unwrap());
    }
    runs.sort();
    for run_id in &runs {
        assert_eq!(harness.finish(*run_id).await.0.status, RunStatus::Succeeded);
    }
    let inputs: Vec<String> = {
        let stored = harness.runtime.thread_runs(thread_id).await.unwrap();
        assert_eq!(stored.iter().map(|run| run.run_id).collect::<Vec<_>>(), runs);
        stored.into_iter().map(|run| run.input).collect()
    };
    let requests = harness.requests();
    assert_eq!(requests.len(), 12);
    for (index, request) in requests.iter().enumerate() {
        let mut expected = Vec::new();
        for (earlier, input) in inputs[..index].iter().enumerate() {
            expected.push(user(input));
            expected.push(assistant(&format!("Answer number {earlier}.")));
        }
        expected.push(user(&inputs[index]));
        assert_eq!(said(request), expected, "request {index}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueued_message_waits_for_the_active_run_across_a_restart() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let mut setup = Setup::new(ScriptedModel::queue(vec![Step::Hang]));
    setup.store = store.clone();
    let harness = setup.start().await;
    let thread_id = thread(&harness).await;
    let first = send(&harness, thread_id, "Find the invoice from March", MultitaskStrategy::Reject).await;
    model_asked(&harness, 1).await;
    let second = send(&harness, thread_id, "And the one from April", MultitaskStrategy::Enqueue).await;
    harness.runtime.shutdown(Duration::from_secs(1)).await;

    let mut setup =
        Setup::new(ScriptedModel::queue(vec![text("The March invoice is #12."), text("The April invoice is #19.")]));
    setup.store = store;
    let harness = setup.start().await;
    assert_eq!(harness.finish(first).await.0.status, RunStatus::Succeeded);
    assert_eq!(harness.finish(second).await.0.status, RunStatus::Succeeded);
    let requests = harness.requests();
    assert_eq!(said(&requests[0]), vec![user("Find the invoice from March")], "the active run resumed first");
    assert_eq!(
        said(&requests[1]),
        vec![
            user("Find the invoice from March"),
            assistant("The March invoice is #12."),
            user("And the one from April"),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_returns_the_first_run_also_after_a_restart() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let mut setup = Setup::new(ScriptedModel::queue(vec![text("Done once.")]));
    setup.store = store.clone();
    let harness = setup.start().await;
    let keyed = |fingerprint: &str| {
        let mut request = SubmitRequest::new(AGENT, "send the weekly report");
        request.idempotency = Some(Idempotency { key: "report-42".into(), fingerprint: fingerprint.into() });
        request
    };
    let first = harness.runtime.submit_with(keyed("a")).await.unwrap();
    assert!(!first.replayed);
    let again = harness.runtime.submit_with(keyed("a")).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.run.run_id, first.run.run_id);
    assert_eq!(harness.runtime.submit_with(keyed("b")).await.unwrap_err(), SubmitError::IdempotencyKeyReused);
    harness.finish(first.run.run_id).await;
    harness.runtime.shutdown(Duration::from_secs(1)).await;

    let mut setup = Setup::new(ScriptedModel::queue(vec![]));
    setup.store = store.clone();
    let harness = setup.start().await;
    let after_restart = harness.runtime.submit_with(keyed("a")).await.unwrap();
    assert!(after_restart.replayed);
    assert_eq!(after_restart.run.run_id, first.run.run_id);
    assert_eq!(after_restart.run.status, RunStatus::Succeeded);
    let all = store.list_runs(crate::store::RunQuery { limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(all.len(), 1, "one run in all");
}

/// A thread longer than the model's context window: every run still gets a
/// prompt that fits (the older exchanges summarised by the model, the summary
/// stored on the thread), and the newest exchanges stay verbatim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_thread_keeps_its_prompts_within_the_context_window() {
    let window = 2048;
    let answer = |n: usize| format!("Answer {n}: {}", "the parcel is on its way. ".repeat(24));
    let answers: Vec<Step> = (0..24).map(|n| text(&answer(n))).collect();
    let summary = "Ada asked where her parcels are; each is on its way.";
    let mut setup = Setup::new(ScriptedModel::queue(answers).with_context_window(window).summarising(summary));
    setup.agent_tools = Some(vec!["echo".to_owned()]);
    let harness = setup.start().await;
    let thread_id = thread(&harness).await;
    for n in 0..24 {
        let run = send(&harness, thread_id, &format!("Where is parcel {n}?"), MultitaskStrategy::Reject).await;
        assert_eq!(harness.finish(run).await.0.status, RunStatus::Succeeded, "message {n}");
    }
    let requests = harness.requests();
    let asked_to_summarise = requests.iter().filter(|r| r.messages[0].content == crate::runtime::SUMMARISE).count();
    assert!(asked_to_summarise > 0, "the long history was summarised");
    let stored = harness.runtime.store().threads().get_thread(thread_id).await.unwrap().unwrap();
    assert_eq!(stored.summary.map(|summary| summary.text), Some(summary.to_owned()));
    for (n, request) in requests.iter().enumerate() {
        // Three characters a token is the estimate's floor: a prompt within it fits.
        let chars: usize = request.messages.iter().map(|m| m.content.chars().count()).sum::<usize>()
            + request.tools.iter().map(|t| t.description.len() + t.parameters.to_string().len()).sum::<usize>();
        assert!(chars / 3 < window, "request {n}: {chars} characters");
    }
    let last = said(requests.last().unwrap());
    assert_eq!(last[0].1, format!("{}{summary}", crate::threads::SUMMARY_LEAD), "the summary opens the history");
    assert!(!last.iter().any(|(_, content)| content == "Where is parcel 2?"), "older messages are summarised");
    assert_eq!(
        last[last.len() - 3..],
        [user("Where is parcel 22?"), assistant(&answer(22)), user("Where is parcel 23?")]
    );
}

/// An interrupting message runs next: the active run and the runs waiting
/// before it are cancelled (all marked interrupted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_runs_next_cancelling_the_runs_waiting_before_it_too() {
    let harness = Setup::new(ScriptedModel::queue(vec![Step::Hang, text("Only the last one.")])).start().await;
    let thread_id = thread(&harness).await;
    let first = send(&harness, thread_id, "first", MultitaskStrategy::Reject).await;
    model_asked(&harness, 1).await;
    let second = send(&harness, thread_id, "second", MultitaskStrategy::Enqueue).await;
    let third = send(&harness, thread_id, "third", MultitaskStrategy::Interrupt).await;
    for run in [first, second] {
        let (record, _) = harness.finish(run).await;
        assert_eq!((record.status, record.reason.as_deref()), (RunStatus::Cancelled, Some(INTERRUPTED)));
    }
    assert_eq!(harness.finish(third).await.0.final_output.as_deref(), Some("Only the last one."));
    assert_eq!(harness.model.request_count(), 2, "the second message never reached the model");
}
