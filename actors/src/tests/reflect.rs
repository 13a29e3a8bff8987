//! A reflecting agent (`reflect = true`): a `thought` before its first action
//! and after each answer; an answer its reflection finds incomplete gets another
//! turn, a complete one ends the run; the reviewer still reviews every turn.

use std::sync::Arc;

use serde_json::json;

use crate::answer::{AFTER_RESPONSE, BEFORE_ACTING};
use crate::protocol::{EventKind, Limits, RunEvent, RunStatus, Thought, ThoughtStage};
use crate::testing::{ScriptedModel, Step, calls, text};
use crate::tests::{Setup, turns_and_reviews};

/// A reasoning as the model writes it: a `think` call, or (`as_text`) its JSON as text.
fn thought(complete: bool, why: &str) -> Step {
    let args = thought_args(complete, why);
    calls(&[("think", args)])
}

fn thought_as_text(complete: bool, why: &str) -> Step {
    text(&thought_args(complete, why).to_string())
}

fn thought_args(complete: bool, why: &str) -> serde_json::Value {
    json!({
        "understanding": "the user wants the text echoed",
        "needs": if complete { vec![] } else { vec!["the echo's result"] },
        "tools": ["echo"],
        "complete": complete,
        "why": why,
    })
}

/// The run's thoughts, in order: turn, stage, complete, why.
fn thoughts(events: &[Arc<RunEvent>]) -> Vec<(u32, ThoughtStage, bool, String)> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::Thought { turn, stage, thought } => {
                let Thought { complete, why, .. } = thought.as_ref();
                Some((*turn, *stage, *complete, why.clone()))
            }
            _ => None,
        })
        .collect()
}

fn position(events: &[Arc<RunEvent>], name: &str) -> usize {
    events.iter().position(|event| event.kind.name() == name).unwrap_or(usize::MAX)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reflecting_run_thinks_before_acting_and_an_answer_found_incomplete_gets_another_turn() {
    let model = ScriptedModel::queue(vec![
        thought(false, "nothing is done yet"),
        calls(&[("echo", json!({"text": "hello"}))]),
        text("I will echo it."),
        thought(false, "the answer does not say what the echo returned"),
        text("The echo returned: hello."),
        thought_as_text(true, "it gives the echo's result"),
    ]);
    let mut setup = Setup::new(model);
    setup.reflect = true;
    let harness = setup.start().await;
    let (record, events) = harness.run("Echo hello and tell me what came back").await;

    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(record.final_output.as_deref(), Some("The echo returned: hello."));
    let seen = thoughts(&events);
    let stages: Vec<(u32, ThoughtStage, bool)> =
        seen.iter().map(|(turn, stage, complete, _)| (*turn, *stage, *complete)).collect();
    assert_eq!(
        stages,
        [
            (1, ThoughtStage::BeforeActing, false),
            (2, ThoughtStage::AfterResponse, false),
            (3, ThoughtStage::AfterResponse, true),
        ]
    );
    assert!(position(&events, "thought") < position(&events, "tool_call_start"), "the thought comes before acting");
    let (turns, reviews) = turns_and_reviews(&events);
    assert_eq!((turns.clone(), reviews), (vec![1, 2, 3], vec![1, 2, 3]), "the reviewer still reviews every turn");

    // The model acts on its reasoning, and is told why its answer was not complete.
    let requests = harness.requests();
    assert_eq!(requests.len(), 6, "three turns, three thoughts");
    let first_turn = requests[1].messages.last().unwrap();
    assert!(first_turn.content.starts_with(BEFORE_ACTING) && first_turn.content.contains("Tools: echo"));
    let third_turn = requests[4].messages.last().unwrap();
    assert!(third_turn.content.starts_with(AFTER_RESPONSE), "{}", third_turn.content);
    assert!(third_turn.content.contains("does not say what the echo returned"), "{}", third_turn.content);
    assert_eq!(requests[0].tool_choice, crate::llm::ToolChoice::Tool("think".into()), "held to the thought's shape");
    let reflection = &requests[3].messages[1].content;
    assert!(reflection.contains("The agent's answer: I will echo it.") && reflection.contains("hello"), "{reflection}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reasoning_out_of_shape_is_left_out_and_the_turn_limit_ends_the_reflecting() {
    let model = ScriptedModel::queue(vec![
        text("I think we should echo."),
        text("Hello."),
        thought(false, "it could say more"),
    ]);
    let mut setup = Setup::new(model);
    setup.reflect = true;
    setup.limits = Limits { max_turns: 1, ..Limits::default() };
    let harness = setup.start().await;
    let (record, events) = harness.run("Say hello").await;

    assert_eq!(record.status, RunStatus::Succeeded, "{events:#?}");
    assert_eq!(record.final_output.as_deref(), Some("Hello."), "at the turn limit the answer stands");
    let failed = events.iter().any(|event| {
        matches!(&event.kind, EventKind::ReasoningStep { summary, .. } if summary.starts_with("reasoning failed"))
    });
    assert!(failed, "the failed reasoning is shown");
    let seen: Vec<ThoughtStage> = thoughts(&events).into_iter().map(|(_, stage, ..)| stage).collect();
    assert_eq!(seen, [ThoughtStage::AfterResponse], "only the reasoning in shape is a thought");
    let requests = harness.requests();
    assert!(requests[1].messages.iter().all(|message| !message.content.starts_with(BEFORE_ACTING)));
}
