//! What the model sees: the system prompt (instructions and `<available_tools>`),
//! the conversation, and the tools on offer; plus the built-in `ask_user` tool and
//! citation resolution for the final answer.
//!
//! A prompt is append-only: each turn's prompt starts with the whole previous one,
//! so a model's prompt cache (a provider's, or the local model's KV cache) serves
//! it and only the new tokens are processed. State that changes (the plan, the
//! blocked tools) joins the conversation as a note when it changes, instead of
//! being rewritten in the system prompt; the synthesis turn keeps the tools on
//! offer (with tool choice `none`) so that it too extends the previous prompt.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use serde_json::Value;

use crate::builtin::BuiltinTool;
use crate::config::AgentConfig;
use crate::llm::{ChatRequest, Message, Role, ToolChoice, ToolDefinition};
use crate::planner;
use crate::protocol::{Citation, Fragment, Plan, Review};
use crate::tool::ToolRegistry;

/// What `ask_user` takes.
#[derive(serde::Deserialize, schemars::JsonSchema)]
#[allow(dead_code)]
struct AskUserArgs {
    /// The question for the user.
    question: String,
}

/// The `ask_user` tool as offered to the model (built once).
pub fn ask_user_definition() -> Arc<ToolDefinition> {
    static DEFINITION: LazyLock<Arc<ToolDefinition>> = LazyLock::new(|| Arc::new(build_ask_user_definition()));
    DEFINITION.clone()
}

fn build_ask_user_definition() -> ToolDefinition {
    ToolDefinition {
        name: BuiltinTool::AskUser.name().to_owned(),
        description: "Ask the user a clarifying question and wait for the answer. \
            Use it only when the request cannot be answered without it."
            .to_owned(),
        parameters: crate::tool::schema_of::<AskUserArgs>(),
    }
}

/// The question of an `ask_user` call, if its arguments carry one.
pub fn ask_user_question(args: &Value) -> Option<String> {
    let parsed;
    let args = match args {
        Value::String(text) => {
            parsed = serde_json::from_str::<Value>(text).ok()?;
            &parsed
        }
        other => other,
    };
    args.get("question").and_then(Value::as_str).filter(|q| !q.trim().is_empty()).map(str::to_owned)
}

/// Tools offered this turn: the built-ins, then the agent's registered tools that
/// are not blocked.
pub fn offered_tools(agent: &AgentConfig, registry: &ToolRegistry, blocked: &[String]) -> Vec<Arc<ToolDefinition>> {
    let mut tools = vec![planner::todo_write_definition(), ask_user_definition()];
    tools.extend(agent.tools.iter().filter(|name| !blocked.contains(name)).filter_map(|name| {
        match BuiltinTool::from_name(name) {
            Some(BuiltinTool::ListAgents) => Some(super::sub_runs::list_agents_definition()),
            Some(BuiltinTool::RunAgent) => Some(super::sub_runs::run_agent_definition()),
            _ => registry.definition(name),
        }
    }));
    tools
}

/// The system prompt: instructions and the tools on offer, each with its entry of
/// the tool guide (`docs`, by tool name) or else its one-line description. It stays
/// the same from turn to turn while the tools on offer do.
pub fn system_prompt(agent: &AgentConfig, tools: &[Arc<ToolDefinition>], docs: &BTreeMap<String, String>) -> String {
    let mut text = String::with_capacity(agent.instructions.len() + 512);
    text.push_str(&agent.instructions);
    text.push_str("\n\n<available_tools>\n");
    for tool in tools {
        match docs.get(&tool.name) {
            Some(entry) => text.push_str(&format!("## {}\n{}\n\n", tool.name, entry.trim())),
            None => text.push_str(&format!("- {}: {}\n", tool.name, tool.description)),
        }
    }
    text.push_str("</available_tools>");
    text
}

/// The state of the run as of this turn: the plan and the tools blocked for now;
/// `None` before there is either. It joins the conversation when it changes.
pub fn state_note(plan: &Plan, blocked: &[String]) -> Option<String> {
    if plan.items.is_empty() && blocked.is_empty() {
        return None;
    }
    let mut text = String::from("The run so far (updated every turn; todo_write changes the plan):\n");
    if !plan.items.is_empty() {
        text.push_str(&planner::render(plan));
    }
    if !blocked.is_empty() {
        text.push_str(&format!("\n(blocked for now after repeated failures: {})", blocked.join(", ")));
    }
    Some(text)
}

/// The note that replaces an earlier one once there is no plan and nothing blocked.
pub const EMPTY_STATE_NOTE: &str = "The run so far: no plan, and no tool is blocked.";

/// The last state note of the conversation.
pub fn last_note(conversation: &[Message]) -> Option<&str> {
    conversation.iter().rev().find(|message| message.role == Role::System).map(|message| message.content.as_str())
}

/// The request for a turn: the system prompt and the conversation. The synthesis
/// turn lets the model call no tool (they stay listed, the prompt unchanged) and
/// asks for the answer.
pub fn build_request(
    system: String,
    conversation: &[Message],
    tools: Vec<Arc<ToolDefinition>>,
    synthesis: bool,
    max_turns: u32,
) -> ChatRequest {
    let mut messages = Vec::with_capacity(conversation.len() + 2);
    messages.push(Message::text(Role::System, system));
    messages.extend_from_slice(conversation);
    if synthesis {
        messages.push(Message::text(
            Role::User,
            format!(
                "You have used all {max_turns} turns. Write the best final answer you can from what you have \
                 found so far. Do not call tools."
            ),
        ));
    }
    ChatRequest {
        messages,
        tools,
        tool_choice: if synthesis { ToolChoice::None } else { ToolChoice::Auto },
        max_tokens: None,
        temperature: None,
    }
}

/// The review as the model reads it next turn: plain sentences (small models
/// answer in the format of the last thing they read, so no markup), ending with
/// what to do next.
pub fn review_message(turn: u32, review: &Review) -> Message {
    let mut text = format!(
        "Review of turn {turn} by the runtime (not the user): {}. {}\n",
        review.recommendation.as_str().replace('_', " "),
        review.notes
    );
    for gap in &review.gaps {
        text.push_str(&format!("Missing: {gap}\n"));
    }
    for action in &review.suggested_actions {
        text.push_str(&format!("Suggested: {action}\n"));
    }
    text.push_str("Go on: call a tool if more is needed; otherwise answer the user's request in plain words.");
    Message::text(Role::User, text)
}

/// The `[n]` markers of `text` that name one of `documents` (1-based), in order
/// of first use; out-of-range markers are dropped.
pub fn resolve_citations(text: &str, documents: &[Fragment]) -> Vec<Citation> {
    let mut citations: Vec<Citation> = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        rest = &rest[open + 1..];
        let Some(close) = rest.find(']') else { break };
        if let Ok(marker) = rest[..close].trim().parse::<usize>() {
            let known = marker >= 1 && marker <= documents.len();
            if known && !citations.iter().any(|c| c.marker == marker) {
                citations.push(Citation { marker, fragment: documents[marker - 1].clone() });
            }
        }
        rest = &rest[close + 1..];
    }
    citations
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn citations_keep_known_markers_once() {
        let doc = |id: &str| Fragment {
            id: id.into(),
            source: format!("mail:{id}"),
            title: String::new(),
            snippet: String::new(),
        };
        let citations = resolve_citations("A [2], B [1] and [2] again, C [9], D [x]", &[doc("a"), doc("b")]);
        let markers: Vec<usize> = citations.iter().map(|c| c.marker).collect();
        assert_eq!(markers, vec![2, 1]);
        assert_eq!(citations[0].fragment.id, "b");
    }

    #[test]
    fn ask_user_reads_the_question_from_text_or_object() {
        assert_eq!(ask_user_question(&json!({"question": "which?"})).as_deref(), Some("which?"));
        assert_eq!(ask_user_question(&json!("{\"question\": \"why?\"}")).as_deref(), Some("why?"));
        assert_eq!(ask_user_question(&json!({"q": 1})), None);
    }
}
