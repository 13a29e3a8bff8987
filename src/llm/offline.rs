//! The built-in offline model: a deterministic, rule-based stand-in for a language
//! model, so `troupe demo` runs a complete agent run with no API key and no model
//! file. It plans with `todo_write`, measures the request with `text_stats`, marks
//! the plan done and answers from the measurement; asked for a `calculate` call
//! (the default agent's step for arithmetic), it passes the request's words, which
//! that tool reads, and answers with the result. It understands nothing; it
//! exercises the real runtime (planner, tool pool, hooks, reviewer, events).

use async_trait::async_trait;
use futures::stream;
use serde_json::{Value, json};
use troupe_actors::llm::{
    ChatRequest, ModelChunk, ModelClient, ModelDelta, ModelError, ModelReply, ModelStream, Role, ToolChoice,
};
use troupe_actors::protocol::{ToolCall, Usage};

/// The offline model.
#[derive(Debug, Default)]
pub struct OfflineModel;

#[async_trait]
impl ModelClient for OfflineModel {
    fn name(&self) -> &str {
        "offline"
    }

    async fn chat(&self, request: ChatRequest) -> Result<ModelStream, ModelError> {
        let reply = reply_to(&request);
        let mut chunks: Vec<Result<ModelChunk, ModelError>> = reply
            .content
            .split_inclusive(' ')
            .map(|word| Ok(ModelChunk::Delta(ModelDelta::Text(word.to_owned()))))
            .collect();
        chunks.push(Ok(ModelChunk::Done(reply)));
        Ok(Box::pin(stream::iter(chunks)))
    }
}

/// The next step, read off the conversation: plan, measure, close the plan, answer.
fn reply_to(request: &ChatRequest) -> ModelReply {
    // In a thread, earlier exchanges come first, each ending with an answer (an
    // assistant message without calls): this run's part begins after the last.
    let start = request
        .messages
        .iter()
        .rposition(|m| m.role == Role::Assistant && m.tool_calls.is_empty())
        .map_or(0, |answer| answer + 1);
    let own = &request.messages[start..];
    let question = own.iter().find(|m| m.role == Role::User).map_or("", |m| m.content.as_str());
    let turn = own.iter().filter(|m| m.role == Role::Assistant).count() + 1;
    let offers = |name: &str| request.tools.iter().any(|tool| tool.name == name);
    let input_tokens = request.messages.iter().map(|m| m.content.split_whitespace().count() as u64).sum();
    let call = |name: &str, args: Value| ToolCall { call_id: format!("call_{turn}"), name: name.to_owned(), args };
    let plan = |measured: &str| {
        json!({"todos": [
            {"id": "1", "content": "Measure the request with text_stats", "status": measured},
            {"id": "2", "content": "Answer from the measurement", "status": if measured == "completed" { "completed" } else { "pending" }},
        ]})
    };
    let stats = own.iter().rev().find(|m| m.role == Role::Tool && m.content.contains("\"words\""));
    let calculated = own.iter().rev().filter(|m| m.role == Role::Tool).find_map(|m| {
        let result = serde_json::from_str::<Value>(&m.content).ok()?;
        result.get("expression").and(result.get("summary")).and_then(Value::as_str).map(str::to_owned)
    });
    let (content, tool_calls) = match (&request.tool_choice, turn, stats) {
        (ToolChoice::Tool(tool), _, _) if tool == "calculate" => {
            (String::new(), vec![call("calculate", json!({"expression": question}))])
        }
        (ToolChoice::None, _, None) if let Some(summary) = calculated => {
            (format!("Offline mode: {summary}. Configure a model provider for real answers."), Vec::new())
        }
        (ToolChoice::Auto, 1, _) if offers("todo_write") => {
            (String::new(), vec![call("todo_write", plan("in_progress"))])
        }
        (ToolChoice::Auto, _, None) if offers("text_stats") => {
            (String::new(), vec![call("text_stats", json!({"text": question, "top": 3}))])
        }
        (ToolChoice::Auto, 3, Some(_)) if offers("todo_write") => {
            (String::new(), vec![call("todo_write", plan("completed"))])
        }
        (_, _, stats) => (answer(stats.map(|m| m.content.as_str())), Vec::new()),
    };
    let output_tokens = content.split_whitespace().count() as u64 + 10;
    ModelReply {
        content,
        tool_calls,
        usage: Usage { input_tokens, output_tokens, cost_usd: 0.0 },
        decode_errors: Vec::new(),
    }
}

fn answer(stats: Option<&str>) -> String {
    let Some(stats) = stats.and_then(|text| serde_json::from_str::<Value>(text).ok()) else {
        return "Offline mode: no measurement was available. Configure a model provider for real answers.".to_owned();
    };
    let frequent: Vec<String> = stats["most_frequent"]
        .as_array()
        .map(|words| {
            words.iter().filter_map(|w| Some(format!("\"{}\" ({})", w["word"].as_str()?, w["count"]))).collect()
        })
        .unwrap_or_default();
    format!(
        "Offline mode: your request has {} words, {} characters and {} sentence(s); its most frequent words are {}. \
         Configure a model provider for real answers.",
        stats["words"],
        stats["characters"],
        stats["sentences"],
        if frequent.is_empty() { "none".to_owned() } else { frequent.join(", ") }
    )
}
