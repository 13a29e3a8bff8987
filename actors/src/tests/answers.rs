//! What ends a run as its answer: the built-ins under the hook chain's rules, the
//! answer guard, and a review that judges the answer rather than the bookkeeping.

use serde_json::json;

use crate::llm::{Role, ToolChoice};
use crate::protocol::{CallStatus, EventKind, Limits, Recommendation, RunEvent, RunStatus, SkipReason};
use crate::testing::{ScriptedModel, calls, text, todo};
use crate::tests::{Setup, count, tool_messages};

/// The tool, skip reason (if skipped) and turn of every call's telemetry record.
fn records(events: &[std::sync::Arc<RunEvent>]) -> Vec<(u32, String, CallStatus, Option<String>)> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::ToolMetric { record } => {
                Some((record.turn, record.tool.clone(), record.status, record.error.clone()))
            }
            _ => None,
        })
        .collect()
}

fn skips(events: &[std::sync::Arc<RunEvent>]) -> Vec<(String, SkipReason)> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::ToolSkipped { tool, reason, .. } => Some((tool.clone(), *reason)),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_pasted_again_is_a_duplicate_and_invalid_plans_strike_todo_write_out() {
    let plan = || ("todo_write", todo(&[("1", "measure", "in_progress")]));
    let broken = || calls(&[("todo_write", json!({"todos": "Review of turn 1: proceed"}))]);
    let model = ScriptedModel::per_turn(vec![
        calls(&[plan()]),
        calls(&[plan(), ("echo", json!({"text": "go on"}))]),
        broken(),
        broken(),
        broken(),
        broken(),
        text("done"),
    ]);
    let mut setup = Setup::new(model);
    setup.limits = Limits { max_turns: 10, ..Limits::default() };
    let harness = setup.start().await;
    let (record, events) = harness.run("measure it").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(record.final_output.as_deref(), Some("done"));
    let todo_writes: Vec<(u32, CallStatus, Option<String>)> = records(&events)
        .into_iter()
        .filter(|(_, tool, ..)| tool == "todo_write")
        .map(|(turn, _, status, error)| (turn, status, error))
        .collect();
    let invalid = Some("invalid_plan".to_owned());
    assert_eq!(
        todo_writes,
        vec![
            (1, CallStatus::Completed, None),
            (2, CallStatus::Skipped, Some("duplicate".to_owned())),
            (3, CallStatus::Failed, invalid.clone()),
            (4, CallStatus::Failed, invalid.clone()),
            (5, CallStatus::Failed, invalid),
            (6, CallStatus::Skipped, Some("blocked".to_owned())),
        ],
        "the same plan twice is a duplicate; three failures block the built-in"
    );
    assert_eq!(count(&events, "plan_updated"), 1, "a duplicate changes nothing");
    let requests = harness.requests();
    assert!(tool_messages(&requests[2])[1].starts_with("skipped (duplicate)"), "the model sees why");
    let offered = |turn: usize| requests[turn - 1].tools.iter().any(|tool| tool.name == "todo_write");
    assert!(offered(5) && !offered(6), "a blocked built-in is not offered while it is blocked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_asked_again_after_its_answer_is_a_duplicate() {
    let ask = || calls(&[("ask_user", json!({"question": "Which text?"}))]);
    let model = ScriptedModel::per_turn(vec![ask(), ask(), text("Five words.")]);
    let harness = Setup::new(model).start().await;
    let run_id = harness.submit("count the words").await;
    crate::testing::eventually(std::time::Duration::from_secs(10), "the run parks on its question", || async {
        harness.runtime.get(run_id).await.unwrap().is_some_and(|run| run.status == RunStatus::WaitingInput)
    })
    .await;
    harness.runtime.input(run_id, "the cat saw the dog sleep").await.unwrap();
    let (record, events) = harness.finish(run_id).await;

    assert_eq!(record.status, RunStatus::Succeeded, "the second question does not park the run again");
    assert_eq!(count(&events, "waiting_input"), 1);
    assert_eq!(skips(&events), vec![("ask_user".to_owned(), SkipReason::Duplicate)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_text_or_a_call_written_as_text_never_ends_a_run_as_its_answer() {
    let note = "The run so far (updated every turn; todo_write changes the plan):\n<plan version=\"1\">";
    let call = r#"{"name": "echo", "arguments": {"text": "hi"}}"#;
    let model = ScriptedModel::per_turn(vec![text(note), text(call)]);
    let harness = Setup::new(model).start().await;
    let (record, events) = harness.run("say hi").await;

    assert_eq!(record.status, RunStatus::Failed, "no answer was ever given");
    assert!(record.reason.as_deref().is_some_and(|reason| reason.starts_with("no_answer")), "{:?}", record.reason);
    assert_eq!(record.final_output, None);
    assert_eq!(count(&events, "final_output"), 0);
    assert!(events.iter().any(|e| matches!(&e.kind, EventKind::Error { code, .. } if code == "no_answer")));
    // The first reply was sent back with a review that says why.
    let second = &harness.requests()[1];
    let review = second.messages.last().map(|message| (message.role, message.content.clone()));
    assert!(
        review.as_ref().is_some_and(|(role, text)| *role == Role::User && text.contains("not an answer")),
        "{review:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_after_a_copied_note_succeeds_with_the_real_answer() {
    let note = "Review of turn 1 by the runtime (not the user): proceed.";
    let model = ScriptedModel::per_turn(vec![text(note), text("Hi!")]);
    let harness = Setup::new(model).start().await;
    let (record, _) = harness.run("say hi").await;
    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(record.final_output.as_deref(), Some("Hi!"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_only_rewrote_its_plan_answers_from_the_request_alone() {
    let plan = || calls(&[("todo_write", todo(&[("1", "thank you", "completed")]))]);
    let model = ScriptedModel::queue(vec![plan(), plan(), text("Merci.")]);
    let harness = Setup::new(model).start().await;
    let (record, _) = harness.run("Translate 'thank you' into French.").await;
    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(record.final_output.as_deref(), Some("Merci."));
    let answer = &harness.requests()[2];
    let shown: Vec<(Role, &str)> = answer.messages.iter().map(|m| (m.role, m.content.as_str())).collect();
    assert_eq!(shown.len(), 2, "{shown:?}");
    assert_eq!(shown[1], (Role::User, "Translate 'thank you' into French."));
    assert!(answer.tools.is_empty() && answer.tool_choice == ToolChoice::None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_repeated_is_sent_back_and_never_ends_a_run_as_its_answer() {
    let asked = "Am I expecting any deliveries today?";
    let answered = ScriptedModel::per_turn(vec![text(asked), text("Yes: your books arrive by 8 pm.")]);
    let harness = Setup::new(answered).start().await;
    let (record, _) = harness.run(asked).await;
    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(record.final_output.as_deref(), Some("Yes: your books arrive by 8 pm."));
    let review = harness.requests()[1].messages.last().map(|message| message.content.clone()).unwrap_or_default();
    assert!(review.contains("the request repeated, not an answer"), "{review}");

    let echoing = ScriptedModel::per_turn(vec![text(asked), text(asked), text(asked)]);
    let harness = Setup::new(echoing).start().await;
    let (record, _) = harness.run(asked).await;
    assert_eq!(record.status, RunStatus::Failed);
    assert_eq!(record.reason.as_deref(), Some("no_answer: the model's last reply was the request repeated"));
    assert_eq!(record.final_output, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grounded_agent_answering_from_memory_is_sent_back_to_look_first() {
    let model = ScriptedModel::per_turn(vec![
        text("You have three deliveries today."),
        calls(&[("echo", json!({"text": "one delivery: the chair"}))]),
        text("One delivery today: the chair."),
    ]);
    let mut setup = Setup::new(model);
    setup.grounded = true;
    let harness = setup.start().await;
    let (record, events) = harness.run("any deliveries today?").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(record.final_output.as_deref(), Some("One delivery today: the chair."));
    let verdicts: Vec<Recommendation> = events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::Review { review, .. } => Some(review.recommendation),
            _ => None,
        })
        .collect();
    assert_eq!(verdicts, vec![Recommendation::GatherMore, Recommendation::Proceed, Recommendation::Proceed]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_is_not_grounded_may_answer_at_once() {
    let model = ScriptedModel::per_turn(vec![text("Paris.")]);
    let harness = Setup::new(model).start().await;
    let (record, events) = harness.run("capital of France?").await;
    assert_eq!(record.final_output.as_deref(), Some("Paris."));
    assert_eq!(count(&events, "turn_start"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_repeated_after_it_succeeded_is_followed_by_a_turn_that_must_answer() {
    let echo = || calls(&[("echo", json!({"text": "five words"}))]);
    let model = ScriptedModel::per_turn(vec![echo(), echo(), text("It has five words.")]);
    let harness = Setup::new(model).start().await;
    let (record, events) = harness.run("how many words?").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(record.final_output.as_deref(), Some("It has five words."));
    assert_eq!(skips(&events), vec![("echo".to_owned(), SkipReason::Duplicate)]);
    let requests = harness.requests();
    assert_eq!(requests.len(), 3);
    let repeat = &tool_messages(&requests[2])[1];
    assert!(repeat.starts_with("skipped (duplicate)") && repeat.ends_with("its result was: five words"), "{repeat}");
    let answer_turn = &requests[2];
    assert_eq!(answer_turn.tool_choice, crate::llm::ToolChoice::None, "the repeat's next turn may call no tool");
    let ask = answer_turn.messages.last().map(|m| m.content.clone()).unwrap_or_default();
    assert!(ask.starts_with("My request was: \"how many words?\"\nAnswer it now"), "the request, asked again: {ask}");
    for pair in requests.windows(2) {
        let kept = pair[0].messages.len();
        assert_eq!(pair[1].messages[..kept], pair[0].messages[..], "each prompt extends the previous one");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_without_ask_user_is_not_offered_it_and_cannot_park_on_it() {
    let model = ScriptedModel::per_turn(vec![
        calls(&[("ask_user", json!({"question": "Which mailbox?"}))]),
        text("Nothing to ask: here is the answer."),
    ]);
    let mut setup = Setup::new(model);
    setup.without_builtins = vec!["ask_user".to_owned()];
    let harness = setup.start().await;
    let (record, events) = harness.run("answer from the tools").await;

    assert_eq!(record.status, RunStatus::Succeeded, "the run never parks");
    assert_eq!(count(&events, "waiting_input"), 0);
    assert_eq!(skips(&events), vec![("ask_user".to_owned(), SkipReason::Denied)]);
    assert!(harness.requests().iter().all(|request| request.tools.iter().all(|tool| tool.name != "ask_user")));
}

/// A model reviewer's verdict with `recommendation` and, perhaps, a question.
fn judged(recommendation: &str, question: Option<&str>) -> crate::testing::Step {
    let review = json!({
        "quality_score": 0.5, "completeness": 0.5, "relevance": 0.5, "needs_more_data": false,
        "gaps": ["which country"], "suggested_actions": [{"tool": null, "reason": "ask which country"}],
        "recommendation": recommendation, "question": question, "notes": "judged",
    });
    text(&review.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clarify_query_review_asks_the_user_and_the_answer_reaches_the_model() {
    // One scripted model answers the agent and its model reviewer, in order.
    let model = ScriptedModel::queue(vec![
        text("It depends on the country."),
        judged("clarify_query", Some("Which country's capital do you mean?")),
        judged("proceed", None),
        text("The capital of France is Paris."),
        judged("proceed", None),
    ]);
    let mut setup = Setup::new(model);
    setup.reviewer = crate::config::ReviewerKind::Model { model: None };
    let harness = setup.start().await;
    let run_id = harness.submit("What is the capital?").await;
    let mut stream = harness.runtime.subscribe(run_id, 0);
    let asked = crate::tests::wait_for(&mut stream, |kind| matches!(kind, EventKind::WaitingInput { .. })).await;
    let EventKind::WaitingInput { prompt, .. } = &asked.kind else { unreachable!() };
    assert_eq!(prompt, "Which country's capital do you mean?", "the reviewer's question, asked as ask_user asks");

    let answer = crate::runtime::RunInput::Text("France".to_owned());
    harness.runtime.input(run_id, answer).await.unwrap();
    let (record, events) = harness.finish(run_id).await;
    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(record.final_output.as_deref(), Some("The capital of France is Paris."));
    assert_eq!(count(&events, "review"), 3, "every turn reviewed, the asking one too");
    let last = harness.requests().into_iter().rev().nth(1).expect("the agent's last turn");
    assert!(tool_messages(&last).iter().any(|result| result.contains("France")), "the user's answer reaches the model");
}
