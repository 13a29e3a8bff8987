//! Context that fits the model: when a prompt would not fit the model's context
//! window (with room left for the reply), older parts are compacted, in this
//! order, until it fits:
//!
//! 1. tool results of the run's older turns are shortened (the latest
//!    `todo_write` result, which holds the plan, is kept);
//! 2. the thread's older exchanges are condensed into one note (the oldest
//!    first left out of it);
//! 3. the run's older turns are left out whole (a reply with its results, so
//!    every call keeps its result);
//! 4. only if the rest is still too large: the last turns' tool results are
//!    shortened too, then the history goes.
//!
//! The system prompt, the request, the turn that wrote the current plan and
//! (unless step 4 is reached) the last turns, where open approvals and questions
//! are, stay verbatim. A prompt
//! that fits is sent unchanged, so compaction costs nothing (and no cached
//! prefix) until it is needed. Tokens are estimated from characters, on the
//! high side (3 characters a token), so an estimate that fits does.

use std::sync::Arc;

use crate::builtin::BuiltinTool;
use crate::llm::{Message, Role, ToolDefinition};

/// Characters per token, counted low so that the estimate is high.
const CHARS_PER_TOKEN: usize = 3;

/// Tokens each message costs beyond its text (role and framing).
const MESSAGE_OVERHEAD: usize = 8;

/// Turns at the end of the run's conversation that always stay verbatim.
const LAST_TURNS: usize = 2;

/// Characters a shortened tool result keeps.
const SHORTENED_RESULT: usize = 240;

/// Characters of a question or an answer kept in the condensed note.
const CONDENSED_TEXT: usize = 160;

/// A compacted prompt's parts, as [`fit`] returns them.
#[derive(Debug, Clone, PartialEq)]
pub struct Fitted {
    /// The thread's history.
    pub history: Vec<Message>,
    /// The run's conversation.
    pub conversation: Vec<Message>,
}

/// Estimated tokens of `text`.
fn tokens(text: &str) -> usize {
    text.chars().count().div_ceil(CHARS_PER_TOKEN)
}

/// Estimated tokens of a message.
fn message_tokens(message: &Message) -> usize {
    let calls: usize = message
        .tool_calls
        .iter()
        .map(|call| tokens(&call.name) + tokens(&call.args.to_string()) + MESSAGE_OVERHEAD)
        .sum();
    tokens(&message.content) + calls + MESSAGE_OVERHEAD
}

/// Estimated tokens of `messages` (high: see the module doc).
pub(crate) fn total(messages: &[Message]) -> usize {
    messages.iter().map(message_tokens).sum()
}

/// Tokens to leave for the reply in a window of `window`.
fn reply_room(window: usize) -> usize {
    (window / 8).clamp(64, 1024)
}

/// The history and conversation of a prompt, compacted as the module doc says
/// until the whole prompt (with `system` and `tools`) fits in `window` tokens
/// with room for the reply; `None` if it fits as it is.
pub fn fit(
    window: usize,
    system: &str,
    tools: &[Arc<ToolDefinition>],
    history: &[Message],
    conversation: &[Message],
) -> Option<Fitted> {
    let fixed = tokens(system)
        + MESSAGE_OVERHEAD
        + tools.iter().map(|tool| tokens(&tool.description) + tokens(&tool.parameters.to_string())).sum::<usize>()
        // What the runtime may add after the conversation (an ask to answer now).
        + 64;
    let budget = window.saturating_sub(reply_room(window)).saturating_sub(fixed);
    if total(history) + total(conversation) <= budget {
        return None;
    }
    let mut fitted = Fitted { history: history.to_vec(), conversation: conversation.to_vec() };
    let over = |fitted: &Fitted| total(&fitted.history) + total(&fitted.conversation) > budget;
    let turns = turn_starts(&fitted.conversation);
    // Where the last turns begin (the first turn, when there are no more).
    let kept_from = turns.len().checked_sub(LAST_TURNS).map_or(0, |index| turns[index]);
    let plan_at = latest_plan(&fitted.conversation);

    // 1. Older tool results, shortened.
    for index in 1..fitted.conversation.len().min(kept_from) {
        let message = &mut fitted.conversation[index];
        if message.role == Role::Tool && Some(index) != plan_at.map(|(_, result)| result) {
            shorten(&mut message.content);
        }
    }
    if !over(&fitted) {
        return Some(fitted);
    }

    // 2. The thread's older exchanges condensed into a note (the oldest left out
    //    first); the newest stay verbatim while they take at most half the room.
    if !fitted.history.is_empty() {
        let exchanges = exchanges(&fitted.history);
        let room = budget.saturating_sub(total(&fitted.conversation));
        let mut verbatim_from = exchanges.len();
        let mut used = 0;
        for (index, (messages, _)) in exchanges.iter().enumerate().rev() {
            let cost = total(messages);
            if used + cost > room / 2 {
                break;
            }
            used += cost;
            verbatim_from = index;
        }
        let mut noted: Vec<&str> = Vec::new();
        for (_, line) in exchanges[..verbatim_from].iter().rev() {
            let note = condensed_note(std::iter::once(line.as_str()).chain(noted.iter().copied()));
            if used + tokens(&note) + MESSAGE_OVERHEAD > room {
                break;
            }
            noted.insert(0, line.as_str());
        }
        let mut history = Vec::new();
        if !noted.is_empty() {
            history.push(Message::text(Role::User, condensed_note(noted.into_iter())));
        }
        history.extend(exchanges[verbatim_from..].iter().flat_map(|(messages, _)| messages.iter().cloned()));
        fitted.history = history;
        if !over(&fitted) {
            return Some(fitted);
        }
    }

    // 3. The run's older turns, left out whole (oldest first), but the plan's.
    let plan_turn = plan_at.map(|(call, _)| turns.iter().rposition(|start| *start <= call).unwrap_or(0));
    let mut dropped = vec![false; turns.len()];
    for turn in 0..turns.len().saturating_sub(LAST_TURNS) {
        if Some(turn) == plan_turn {
            continue;
        }
        dropped[turn] = true;
        let kept = keep_turns(fitted.conversation.clone(), &turns, &dropped);
        if total(&fitted.history) + total(&kept) <= budget {
            fitted.conversation = kept;
            return Some(fitted);
        }
    }
    fitted.conversation = keep_turns(fitted.conversation, &turns, &dropped);

    // 4. A prompt over the window fails outright: the last turns' tool results
    //    are shortened too, and then the history goes.
    let plan_result = latest_plan(&fitted.conversation).map(|(_, result)| result);
    for (index, message) in fitted.conversation.iter_mut().enumerate() {
        if message.role == Role::Tool && Some(index) != plan_result {
            shorten(&mut message.content);
        }
    }
    if over(&fitted) {
        fitted.history.clear();
    }
    Some(fitted)
}

/// The conversation without the turns marked in `dropped` (the request, index
/// 0, always stays), with a note where turns were left out.
fn keep_turns(conversation: Vec<Message>, turns: &[usize], dropped: &[bool]) -> Vec<Message> {
    let mut kept = Vec::with_capacity(conversation.len());
    let mut noted = false;
    for (index, message) in conversation.into_iter().enumerate() {
        let turn = turns.iter().rposition(|start| *start <= index);
        match turn {
            Some(turn) if dropped[turn] => {
                if !noted {
                    kept.push(Message::text(
                        Role::User,
                        "(Earlier steps of this request were left out to fit the context.)",
                    ));
                    noted = true;
                }
            }
            _ => kept.push(message),
        }
    }
    kept
}

/// Where each turn of the run's conversation starts: at each assistant message
/// (the request before the first is not a turn).
fn turn_starts(conversation: &[Message]) -> Vec<usize> {
    conversation.iter().enumerate().filter(|(_, m)| m.role == Role::Assistant).map(|(index, _)| index).collect()
}

/// The latest `todo_write` call: the index of its assistant message and of its
/// result.
fn latest_plan(conversation: &[Message]) -> Option<(usize, usize)> {
    conversation.iter().enumerate().rev().find_map(|(at, message)| {
        let call = message.tool_calls.iter().rev().find(|call| call.name == BuiltinTool::TodoWrite.name())?;
        let result = conversation
            .iter()
            .enumerate()
            .skip(at + 1)
            .find(|(_, m)| m.role == Role::Tool && m.tool_call_id.as_deref() == Some(call.call_id.as_str()))?
            .0;
        Some((at, result))
    })
}

fn shorten(content: &mut String) {
    if content.chars().count() > SHORTENED_RESULT {
        let kept: String = content.chars().take(SHORTENED_RESULT).collect();
        *content = format!("{kept} … (shortened to fit the context)");
    }
}

fn clip(text: &str) -> String {
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if text.chars().count() <= CONDENSED_TEXT {
        return text;
    }
    let kept: String = text.chars().take(CONDENSED_TEXT).collect();
    format!("{kept}…")
}

/// The history's exchanges (a question and what followed it), each with its
/// messages and as one line of the condensed note.
fn exchanges(history: &[Message]) -> Vec<(&[Message], String)> {
    let mut starts: Vec<usize> =
        history.iter().enumerate().filter(|(_, m)| m.role == Role::User).map(|(index, _)| index).collect();
    if starts.first() != Some(&0) {
        starts.insert(0, 0);
    }
    let mut exchanges = Vec::with_capacity(starts.len());
    for (position, start) in starts.iter().enumerate() {
        let end = starts.get(position + 1).copied().unwrap_or(history.len());
        let messages = &history[*start..end];
        let mut line = String::from("-");
        for message in messages {
            let who = if message.role == Role::User { "The user asked" } else { "You answered" };
            line.push_str(&format!(" {who}: \"{}\"", clip(&message.content)));
        }
        exchanges.push((messages, line));
    }
    exchanges
}

fn condensed_note<'a>(lines: impl Iterator<Item = &'a str>) -> String {
    let mut note = String::from("Earlier in this conversation (condensed to fit the context):");
    for line in lines {
        note.push('\n');
        note.push_str(line);
    }
    note
}

/// Estimated tokens of a whole request's messages.
#[cfg(test)]
fn estimate(system: &str, tools: &[Arc<ToolDefinition>], messages: &[Message]) -> usize {
    tokens(system)
        + MESSAGE_OVERHEAD
        + tools.iter().map(|tool| tokens(&tool.description) + tokens(&tool.parameters.to_string())).sum::<usize>()
        + total(messages)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::protocol::ToolCall;

    fn call(id: &str, name: &str) -> Message {
        Message {
            role: Role::Assistant,
            content: String::new(),
            tool_calls: vec![ToolCall { call_id: id.into(), name: name.into(), args: json!({"q": "x"}) }],
            tool_call_id: None,
        }
    }

    fn result(id: &str, content: &str) -> Message {
        Message { role: Role::Tool, content: content.into(), tool_calls: Vec::new(), tool_call_id: Some(id.into()) }
    }

    fn long(n: usize) -> String {
        "word ".repeat(n)
    }

    /// With one turn so far, its results are the last turn's: the history is
    /// condensed first, and the results stay whole.
    #[test]
    fn a_first_turn_keeps_its_results_and_condenses_the_history() {
        let history: Vec<Message> = (0..30)
            .flat_map(|n| {
                [Message::text(Role::User, format!("q{n} {}", long(40))), Message::text(Role::Assistant, long(80))]
            })
            .collect();
        let found = format!("found: {}", long(300));
        let conversation = vec![Message::text(Role::User, "the request"), call("s", "search"), result("s", &found)];
        let fitted = fit(4096, "system", &[], &history, &conversation).expect("compacted");
        assert_eq!(fitted.conversation, conversation, "the turn's results stay whole");
        assert!(fitted.history[0].content.starts_with("Earlier in this conversation"));
    }

    /// A run parked on calls waiting for approval: its last reply (the calls,
    /// no results yet) stays whole however much else is left out.
    #[test]
    fn calls_waiting_for_approval_survive_compaction() {
        let mut conversation = vec![Message::text(Role::User, "pay my invoices")];
        for n in 0..8 {
            let id = format!("s{n}");
            conversation.push(call(&id, "search"));
            conversation.push(result(&id, &format!("invoice {n}: {}", long(300))));
        }
        let pending = Message {
            role: Role::Assistant,
            content: String::new(),
            tool_calls: vec![ToolCall { call_id: "p".into(), name: "pay".into(), args: json!({"invoice": 7}) }],
            tool_call_id: None,
        };
        conversation.push(pending.clone());
        let fitted = fit(2048, "system", &[], &[], &conversation).expect("compacted");
        assert_eq!(fitted.conversation.last(), Some(&pending));
        assert_eq!(fitted.conversation[0].content, "pay my invoices");
    }

    #[test]
    fn a_prompt_that_fits_is_unchanged() {
        let history = vec![Message::text(Role::User, "hi"), Message::text(Role::Assistant, "hello")];
        let conversation = vec![Message::text(Role::User, "how are you?")];
        assert_eq!(fit(4096, "system", &[], &history, &conversation), None);
    }

    #[test]
    fn long_threads_and_turns_are_compacted_to_fit_keeping_the_plan_and_the_last_turns() {
        let mut history = Vec::new();
        for n in 0..40 {
            history.push(Message::text(Role::User, format!("question {n}: {}", long(30))));
            history.push(Message::text(Role::Assistant, format!("answer {n}: {}", long(60))));
        }
        let mut conversation = vec![Message::text(Role::User, "the request")];
        conversation.push(call("plan", "todo_write"));
        conversation.push(result("plan", &format!("PLAN: 1. search 2. answer {}", long(50))));
        for n in 0..6 {
            let id = format!("s{n}");
            conversation.push(call(&id, "search"));
            conversation.push(result(&id, &format!("result {n}: {}", long(400))));
        }
        for window in [4096, 8192] {
            let fitted = fit(window, "You are an agent.", &[], &history, &conversation).expect("compacted");
            let mut prompt = fitted.history.clone();
            prompt.extend(fitted.conversation.clone());
            let estimate = estimate("You are an agent.", &[], &prompt);
            assert!(estimate + reply_room(window) <= window, "window {window}: {estimate}");
            assert_eq!(fitted.conversation[0].content, "the request");
            assert!(
                fitted
                    .conversation
                    .iter()
                    .any(|m| m.content.starts_with("PLAN: 1. search 2. answer") && !m.content.contains("shortened")),
                "the plan survives whole"
            );
            let last = &conversation[conversation.len() - 2..];
            assert_eq!(&fitted.conversation[fitted.conversation.len() - 2..], last, "the last turn stays verbatim");
            // Every call keeps its result, and every result its call.
            for message in &fitted.conversation {
                for call in &message.tool_calls {
                    assert!(fitted.conversation.iter().any(|m| m.tool_call_id.as_deref() == Some(&call.call_id)));
                }
                if let Some(id) = &message.tool_call_id {
                    assert!(fitted.conversation.iter().any(|m| m.tool_calls.iter().any(|c| &c.call_id == id)));
                }
            }
        }
        assert_eq!(
            fit(32_000, "You are an agent.", &[], &history, &conversation),
            None,
            "a large window takes it whole"
        );
    }
}
