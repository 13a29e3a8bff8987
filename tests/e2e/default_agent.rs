//! The shipped default agent (`config/agents/default.toml`) with a scripted model:
//! a request to measure texts it quotes gets those texts measured by the runtime,
//! each on its own and added up, and the model only answers, the figures given
//! right before; one that quotes nothing has the model write the call first; an
//! arithmetic request is handed to `calculate` in its own words, and the model
//! writes the expression only when those cannot be read.

use std::sync::Arc;

use futures::StreamExt;
use serde_json::json;
use troupe::config::parse_agent;
use troupe_actors::config::RuntimeConfig;
use troupe_actors::llm::{ChatRequest, ModelRegistry, Role, ToolChoice};
use troupe_actors::protocol::{EventKind, RunStatus};
use troupe_actors::store::MemoryStore;
use troupe_actors::testing::{ScriptedModel, Step, calls, text};
use troupe_actors::tool::ToolRegistry;
use troupe_actors::{Deps, Runtime, SubmitRequest};

/// Runs `input` on the shipped default agent, the model following `script`;
/// returns the run's status and answer, the `text_stats` calls made, and what the
/// model was asked.
async fn run(input: &str, script: Vec<Step>) -> (RunStatus, String, Vec<serde_json::Value>, Vec<ChatRequest>) {
    let mut tools = ToolRegistry::new();
    tools.register(Arc::new(troupe::tools::TextStats)).unwrap();
    tools.register(Arc::new(troupe::tools::Calculate)).unwrap();
    let default = parse_agent("default.toml", include_str!("../../config/agents/default.toml")).unwrap();
    let model = Arc::new(ScriptedModel::queue(script));
    let deps = Deps {
        store: Arc::new(MemoryStore::new()),
        models: ModelRegistry::new(model.clone()),
        tools,
        hooks: Vec::new(),
        agents: vec![default],
    };
    let runtime = Runtime::start(RuntimeConfig::default(), deps).await.unwrap();
    let run_id = runtime.submit(SubmitRequest::new("default", input)).await.unwrap();
    let run = runtime.wait(run_id).await.unwrap();
    let events: Vec<_> = runtime.subscribe(run_id, 0).collect().await;
    let measured = events
        .iter()
        .filter_map(|event| match &event.as_ref().unwrap().kind {
            EventKind::ToolCallStart { tool, args, .. } if tool == "text_stats" => Some(args.clone()),
            _ => None,
        })
        .collect();
    (run.status, run.final_output.unwrap_or_default(), measured, model.requests())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_quoted_texts_are_measured_by_the_runtime_and_the_model_answers_from_the_figures() {
    let input = "Which has more words: 'a quick brown fox' or \"the lazy old dog sleeps all day\"?";
    let answer = "'the lazy old dog sleeps all day' has more words: 7 against 4.";
    let (status, output, measured, requests) = run(input, vec![text(answer)]).await;
    assert_eq!((status, output.as_str()), (RunStatus::Succeeded, answer));
    assert_eq!(measured, [json!({"text": "a quick brown fox", "others": ["the lazy old dog sleeps all day"]})]);
    assert_eq!(requests.len(), 1, "the model is asked only for the answer");
    assert_eq!(requests[0].tool_choice, ToolChoice::None);
    let asked = requests[0].messages.last().unwrap();
    assert_eq!(asked.role, Role::User);
    assert!(
        asked.content.contains("'a quick brown fox' has 4 words, 'the lazy old dog sleeps all day' has 7 words")
            && asked.content.contains("'the lazy old dog sleeps all day' has the most words (7)"),
        "the figures, right before the answer: {}",
        asked.content
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_in_no_quotes_is_written_into_the_call_by_the_model() {
    let input = "Count the words of this sentence: the cat saw the dog";
    let call = calls(&[("text_stats", json!({"text": "the cat saw the dog"}))]);
    let answer = "The sentence has 5 words.";
    let (status, output, measured, requests) = run(input, vec![call, text(answer)]).await;
    assert_eq!((status, output.as_str()), (RunStatus::Succeeded, answer));
    assert_eq!(measured, [json!({"text": "the cat saw the dog"})]);
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].tool_choice, ToolChoice::Tool("text_stats".into()), "the model writes the call");
    assert_eq!(requests[1].tool_choice, ToolChoice::None);
    let asked = &requests[1].messages.last().unwrap().content;
    assert!(asked.contains("The text has 5 words, 1 sentence and 19 characters"), "{asked}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arithmetic_in_the_requests_own_words_is_worked_out_by_the_runtime() {
    for (input, exact) in [
        ("What is 17 times 23?", "(17 × 23 = 391)"),
        ("What is 20 percent off 80?", "80 - 20% of 80 = 64"),
        ("What is the average of 12, 15 and 21?", "(12 + 15 + 21) ÷ 3 = 16"),
    ] {
        let answer = format!("The answer: {exact}.");
        let (status, output, measured, requests) = run(input, vec![text(&answer)]).await;
        assert_eq!((status, output.as_str()), (RunStatus::Succeeded, answer.as_str()), "{input}");
        assert!(measured.is_empty(), "nothing is measured as a text");
        assert_eq!(requests.len(), 1, "{input}: the model is asked only for the answer");
        assert_eq!(requests[0].tool_choice, ToolChoice::None);
        let asked = &requests[0].messages.last().unwrap().content;
        assert!(asked.contains(exact), "the exact result, right before the answer: {asked}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arithmetic_the_runtime_cannot_read_is_written_by_the_model() {
    let call = calls(&[("calculate", json!({"expression": "15% of 80"}))]);
    let answer = "The tip is $12.";
    let (status, output, _, requests) =
        run("What is a 15 percent tip on a bill of $80?", vec![call, text(answer)]).await;
    assert_eq!((status, output.as_str()), (RunStatus::Succeeded, answer));
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].tool_choice, ToolChoice::Tool("calculate".into()), "the model writes the expression");
    assert_eq!(requests[1].tool_choice, ToolChoice::None);
    let asked = &requests[1].messages.last().unwrap().content;
    assert!(asked.contains("(15% of 80 = 12)"), "the exact result, right before the answer: {asked}");

    // "average" without "of" is no calculation: the model answers alone.
    let (status, output, _, requests) =
        run("What was the average rainfall in 2020?", vec![text("About 600 mm.")]).await;
    assert_eq!((status, output.as_str()), (RunStatus::Succeeded, "About 600 mm."));
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].tool_choice, ToolChoice::Auto);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_measures_nothing_is_left_to_the_model() {
    let (status, output, measured, requests) = run("Translate 'thank you' into French.", vec![text("Merci.")]).await;
    assert_eq!((status, output.as_str()), (RunStatus::Succeeded, "Merci."));
    assert!(measured.is_empty());
    assert_eq!(requests[0].tool_choice, ToolChoice::Auto);
}
