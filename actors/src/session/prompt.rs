//! What the model sees: the system prompt (the agent's instructions), the tools
//! on offer (each described by its tool guide entry), and the conversation; plus
//! the built-in `ask_user` tool and citation resolution for the final answer.
//!
//! A prompt is append-only: each turn's prompt starts with the whole previous one,
//! so a model's prompt cache (a provider's, or the local model's KV cache) serves
//! it and only the new tokens are processed. The plan is read in `todo_write`'s
//! result; the blocked tools join the conversation as a note when they change,
//! instead of being rewritten in the system prompt; the synthesis turn keeps the tools on
//! offer (with tool choice `none`) so that it too extends the previous prompt.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock};

use serde_json::Value;

use crate::builtin::BuiltinTool;
use crate::config::AgentConfig;
use crate::llm::{ChatRequest, Message, Role, ToolChoice, ToolDefinition};
use crate::planner;
use crate::protocol::{Citation, Fragment, Review};
use crate::tool::ToolRegistry;

/// What `ask_user` takes.
#[derive(serde::Deserialize, schemars::JsonSchema)]
#[allow(dead_code)]
struct AskUserArgs {
    /// One question for the user, ending with "?".
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

/// The question of an `ask_user` call, if its arguments carry one (a text that
/// ends with `?`).
pub fn ask_user_question(args: &Value) -> Option<String> {
    let parsed;
    let args = match args {
        Value::String(text) => {
            parsed = serde_json::from_str::<Value>(text).ok()?;
            &parsed
        }
        other => other,
    };
    // A question ends with a question mark: "Thank you" is an answer written
    // into the wrong place, and is sent back instead of parking the run.
    args.get("question").and_then(Value::as_str).filter(|q| q.trim_end().ends_with('?')).map(str::to_owned)
}

/// Every tool the runtime can offer (the built-ins and `registry`'s), each
/// described by its tool guide entry (`docs`, by name) when it has one: the guide
/// is read where the model looks for a tool's purpose, once, rather than a second
/// time in the system prompt. Built once, when the runtime starts.
pub fn described_tools(
    registry: &ToolRegistry,
    docs: &BTreeMap<String, String>,
) -> HashMap<String, Arc<ToolDefinition>> {
    let builtins = [
        planner::todo_write_definition(),
        ask_user_definition(),
        super::sub_runs::list_agents_definition(),
        super::sub_runs::run_agent_definition(),
    ];
    let registered = registry.names().into_iter().filter_map(|name| registry.definition(&name));
    builtins
        .into_iter()
        .chain(registered)
        .map(|tool| {
            let described = match docs.get(&tool.name) {
                Some(entry) => Arc::new(ToolDefinition {
                    name: tool.name.clone(),
                    description: guide_description(entry),
                    parameters: tool.parameters.clone(),
                }),
                None => tool,
            };
            (described.name.clone(), described)
        })
        .collect()
}

/// Tools offered this turn, from `described` ([`described_tools`]): `todo_write`
/// and `ask_user` (unless the agent leaves them out), then the agent's tools; a
/// tool blocked after repeated failures (a built-in too) is not offered.
pub fn offered_tools(
    agent: &AgentConfig,
    described: &HashMap<String, Arc<ToolDefinition>>,
    blocked: &[String],
) -> Vec<Arc<ToolDefinition>> {
    let always = [BuiltinTool::TodoWrite.name(), BuiltinTool::AskUser.name()]
        .into_iter()
        .filter(|name| !agent.without_builtins.iter().any(|left_out| left_out == name));
    always
        .chain(agent.tools.iter().map(String::as_str))
        .filter(|name| !blocked.iter().any(|tool| tool == name))
        .filter_map(|name| described.get(name).cloned())
        .collect()
}

/// A tool guide entry as a tool's description: its text, without markdown bold.
fn guide_description(entry: &str) -> String {
    entry.trim().replace("**", "")
}

/// The system prompt: the agent's instructions. The tools are described where
/// they are offered ([`offered_tools`]); the prompt stays the same from turn to
/// turn, so a prompt cache serves it to every run of the agent.
pub fn system_prompt(agent: &AgentConfig) -> String {
    agent.instructions.clone()
}

/// The state of the run as of this turn: the tools blocked for now; `None` while
/// none is. It joins the conversation when it changes. The plan is not part of
/// it: the model reads its plan in `todo_write`'s result, where it wrote it, and
/// a note placed last before its turn is what a small model copies as its answer.
pub fn state_note(blocked: &[String]) -> Option<String> {
    if blocked.is_empty() {
        return None;
    }
    Some(format!("Tools blocked for now after repeated failures: {}. Do not call them.", blocked.join(", ")))
}

/// The note that replaces an earlier one once there is no plan and nothing blocked.
pub const EMPTY_STATE_NOTE: &str = "No tool is blocked any more.";

/// The last state note of the conversation.
pub fn last_note(conversation: &[Message]) -> Option<&str> {
    conversation.iter().rev().find(|message| message.role == Role::System).map(|message| message.content.as_str())
}

/// Why a turn must answer without calling a tool (the synthesis turn): its run
/// used all its turns, or the model asked again for calls that had already
/// succeeded, which means it has what it gathered and is going round in circles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerNow {
    /// Every turn of the run is used; the number of turns.
    TurnsUsed(u32),
    /// The last turn's calls were all repeats of calls that had succeeded.
    CallsRepeated,
}

/// Whether `turn`, which follows `conversation`, must answer without a tool.
pub fn answer_now(conversation: &[Message], turn: u32, max_turns: u32) -> Option<AnswerNow> {
    if turn > max_turns {
        return Some(AnswerNow::TurnsUsed(max_turns));
    }
    let at = conversation.iter().rposition(|message| message.role == Role::Assistant)?;
    let calls = conversation[at].tool_calls.len();
    let results: Vec<&Message> = conversation[at + 1..].iter().filter(|message| message.role == Role::Tool).collect();
    let repeated = calls > 0
        && results.len() == calls
        && results.iter().all(|result| result.content.starts_with("skipped (duplicate)"));
    repeated.then_some(AnswerNow::CallsRepeated)
}

/// The request for a turn: the system prompt, the thread's history (what was said
/// in the runs before this one, empty for a run of no thread) and the run's
/// conversation. A turn that must answer lets the model call no tool (they stay
/// listed, the prompt unchanged) and asks for the answer.
pub fn build_request(
    system: String,
    history: &[Message],
    conversation: &[Message],
    tools: Vec<Arc<ToolDefinition>>,
    answer_now: Option<AnswerNow>,
) -> ChatRequest {
    let mut messages = Vec::with_capacity(history.len() + conversation.len() + 2);
    messages.push(Message::text(Role::System, system));
    messages.extend_from_slice(history);
    if answer_now == Some(AnswerNow::CallsRepeated)
        && let Some(request) = conversation.first().filter(|first| first.role == Role::User)
        && only_planned(conversation)
    {
        // A run that only wrote (and rewrote) its plan found nothing out: it
        // answers the request as a turn without tools would, from the request
        // alone (a small model told to answer after its plan describes the plan).
        messages.push(request.clone());
        return ChatRequest {
            messages,
            tools: Vec::new(),
            tool_choice: ToolChoice::None,
            max_tokens: None,
            temperature: None,
        };
    }
    messages.extend_from_slice(conversation);
    let ask = match answer_now {
        Some(AnswerNow::TurnsUsed(max_turns)) => Some(format!(
            "You have used all {max_turns} turns. Write the best final answer you can from what you have \
             found so far. Do not call tools."
        )),
        Some(AnswerNow::CallsRepeated) => Some(match conversation.first().filter(|first| first.role == Role::User) {
            // The request again, then what to do: a small model answers what it
            // read last, and echoes a question it read last.
            Some(request) => format!(
                "My request was: \"{}\"\nAnswer it now in one or two sentences, from the tool results above. \
                 Do not call a tool.",
                request.content
            ),
            None => {
                "Answer my request now in one sentence, using the tool results above. Do not call a tool.".to_owned()
            }
        }),
        None => None,
    };
    if let Some(ask) = ask {
        messages.push(Message::text(Role::User, ask));
    }
    ChatRequest {
        messages,
        tools,
        tool_choice: if answer_now.is_some() { ToolChoice::None } else { ToolChoice::Auto },
        max_tokens: None,
        temperature: None,
    }
}

/// Whether every call of `conversation` was a `todo_write`: the run has planned,
/// and found nothing out.
fn only_planned(conversation: &[Message]) -> bool {
    conversation
        .iter()
        .flat_map(|message| &message.tool_calls)
        .all(|call| BuiltinTool::from_name(&call.name) == Some(BuiltinTool::TodoWrite))
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
        let call = match (&action.tool, &action.arguments) {
            (Some(tool), Some(arguments)) => format!(" (call {tool} with {arguments})"),
            (Some(tool), None) => format!(" ({tool})"),
            _ => String::new(),
        };
        text.push_str(&format!("Suggested: {}{call}\n", action.reason));
    }
    // A replan's tasks are the run's plan from now on: the model reads them here.
    for item in review.updated_plan.iter().flatten() {
        text.push_str(&format!("New plan: {} [{:?}] {}\n", item.id, item.status, item.content));
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
        assert_eq!(ask_user_question(&json!({"question": "Merci"})), None, "an answer is not a question");
    }
}
