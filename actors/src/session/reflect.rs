//! A reflecting agent (`reflect = true`): before its first action the model
//! reasons about the request (what the user needs, what to do, with which
//! tools); after each answer, about that answer (does it fully answer the
//! request, what is missing). Each reasoning is one model call that must call
//! `think`, a tool of the [`Thought`]'s shape offered to it alone (so a provider's
//! forced tool choice, or the local model's grammar, holds the reply to that
//! shape; a JSON object of that shape as text is taken too). It is streamed as a `thought` event
//! and joins the conversation, so the model acts on it and a resumed run finds
//! it. An answer found incomplete gets another turn, within `max_turns`; one
//! found complete ends the run. The reviewer still reviews every turn, before
//! the reflection on it. A reasoning call that fails or replies out of shape is
//! logged and shown as a `reasoning_step`, and the run goes on as without it (it
//! acts, or ends with its answer).

use std::sync::Arc;

use futures::StreamExt;
use ractor::{ActorProcessingErr, ActorRef};
use serde_json::{Value, json};
use tracing::{Instrument, warn};

use crate::answer::{AFTER_RESPONSE, BEFORE_ACTING};
use crate::llm::{ChatRequest, Message, ModelChunk, ModelClient, Role, ToolChoice, ToolDefinition};
use crate::protocol::{EventKind, RunStatus, Thought, ThoughtStage, Usage};
use crate::session::state::{AbortOnDrop, Live, Phase};
use crate::session::{Session, SessionMsg};

/// The tool the reasoning call must call.
const THINK: &str = "think";

/// Tool results shown to the reflection on an answer: the last ones, each cut.
const RESULTS_SHOWN: usize = 8;
const RESULT_CHARS: usize = 600;

impl Session {
    /// Whether turn `turn` reasons before its model call: a reflecting agent's
    /// first turn, until its reasoning is in the conversation.
    pub(super) fn thinks_first(live: &Live, turn: u32) -> bool {
        live.agent.reflect
            && turn == 1
            && !live.conversation.iter().any(|message| message.content.starts_with(BEFORE_ACTING))
    }

    /// Starts the reasoning of `turn`: before it acts (`answer` `None`), or about
    /// the answer it gave.
    pub(super) fn think(&self, myself: &ActorRef<SessionMsg>, live: &mut Live, turn: u32, answer: Option<String>) {
        let request = reasoning_request(live, answer.as_deref());
        let model = live.model.clone();
        let limit = self.shared.config.model_timeout;
        let session = myself.clone();
        let span = crate::spans::chat(&live.turn_parent(), model.model_id());
        let task = tokio::spawn(
            async move {
                let result = tokio::time::timeout(limit, reason(model.as_ref(), request))
                    .await
                    .unwrap_or_else(|_| Err(format!("the reasoning call took longer than {limit:?}")));
                if let Ok((_, usage)) = &result {
                    crate::spans::record_usage(&tracing::Span::current(), usage);
                }
                let _ = session.cast(SessionMsg::Thought { turn, result });
            }
            .instrument(span),
        );
        live.model_task = Some(AbortOnDrop(task.abort_handle()));
        live.phase = Phase::Think { turn, answer };
    }

    /// The reasoning of `turn` came back: shown, then the turn acts, or the run
    /// goes on or ends by what it concluded about the answer.
    pub(super) async fn on_thought(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        turn: u32,
        result: Result<(Thought, Usage), String>,
    ) -> Result<(), ActorProcessingErr> {
        if !matches!(live.phase, Phase::Think { turn: current, .. } if current == turn) {
            return Ok(());
        }
        let Phase::Think { answer, .. } = std::mem::replace(&mut live.phase, Phase::Idle) else {
            return Ok(());
        };
        live.model_task = None;
        let stage = if answer.is_some() { ThoughtStage::AfterResponse } else { ThoughtStage::BeforeActing };
        let thought = match result {
            Ok((thought, usage)) => {
                live.charge(turn, usage);
                live.outbox.emit(EventKind::Thought { turn, stage, thought: Box::new(thought.clone()) });
                Some(thought)
            }
            Err(why) => {
                warn!(run_id = %live.run.run_id, turn, %why, "the agent's reasoning failed; the run goes on without it");
                live.outbox.emit(EventKind::ReasoningStep { turn, summary: format!("reasoning failed: {why}") });
                None
            }
        };
        let Some(answer) = answer else {
            if let Some(thought) = &thought {
                live.append_message(turn, Message::text(Role::User, before_acting(thought)));
            }
            // The thought streams before the turn acts, not with its reply.
            live.outbox.flush(&self.shared).await?;
            self.ask_model(myself, live, turn);
            return Ok(());
        };
        match thought {
            Some(thought) if !thought.complete && turn < live.run.limits.max_turns => {
                live.append_message(turn, Message::text(Role::User, incomplete(&thought)));
                self.start_turn(myself, live, turn + 1).await
            }
            _ => self.finish(myself, live, RunStatus::Succeeded, None, Some(answer)).await,
        }
    }
}

/// The reasoning call: the agent's instructions and tools, the request, and,
/// after an answer, what the tools returned and the answer.
fn reasoning_request(live: &Live, answer: Option<&str>) -> ChatRequest {
    let system = format!(
        "You are the reasoning step of an AI agent. Its instructions:\n{}\n\nWrite your reasoning down with \
         the think tool: understanding (what the user asks for), needs (what is needed to answer), tools (the \
         agent's tools to use next), why, complete (whether the request is fully answered).",
        live.agent.instructions.trim()
    );
    let mut asked = format!("Request: {}\nTools: {}\n", live.run.input, live.agent.tools.join(", "));
    match answer {
        None => asked.push_str(
            "Before acting: what does the user need, what should be done, and with which tools? Nothing is \
             answered yet: complete is false.",
        ),
        Some(answer) => {
            let results: Vec<&Message> =
                live.conversation.iter().filter(|message| message.role == Role::Tool).collect();
            if !results.is_empty() {
                asked.push_str("What the tools returned:\n");
            }
            for result in &results[results.len().saturating_sub(RESULTS_SHOWN)..] {
                let shown: String = result.content.chars().take(RESULT_CHARS).collect();
                asked.push_str(&format!("- {shown}\n"));
            }
            asked.push_str(&format!(
                "The agent's answer: {answer}\nDoes this answer fully answer the request? complete: true if so; \
                 if not, say why and list in needs what is still missing."
            ));
        }
    }
    ChatRequest {
        messages: vec![Message::text(Role::System, system), Message::text(Role::User, asked)],
        tools: vec![Arc::new(think_tool())],
        tool_choice: ToolChoice::Tool(THINK.to_owned()),
        max_tokens: Some(400),
        temperature: Some(0.0),
    }
}

/// Asks `model` and reads its reply as a [`Thought`].
async fn reason(model: &dyn ModelClient, request: ChatRequest) -> Result<(Thought, Usage), String> {
    let mut stream = model.chat(request).await.map_err(|error| error.to_string())?;
    let mut reply = None;
    while let Some(chunk) = stream.next().await {
        if let ModelChunk::Done(done) = chunk.map_err(|error| error.to_string())? {
            reply = Some(done);
        }
    }
    let reply = reply.ok_or("the model stream ended without a reply")?;
    let thought = match reply.tool_calls.into_iter().find(|call| call.name == THINK) {
        Some(call) => checked(
            serde_json::from_value(call.args)
                .map_err(|error| format!("the reasoning does not match the thought's shape: {error}"))?,
        )?,
        None => parse(&reply.content)?,
    };
    Ok((thought, reply.usage))
}

/// The `think` tool: the [`Thought`]'s shape, every field required, in the
/// order a model should write them (its reasons before its verdict).
fn think_tool() -> ToolDefinition {
    let strings = json!({"type": "array", "items": {"type": "string"}});
    let parameters: Value = json!({
        "type": "object",
        "properties": {
            "understanding": {"type": "string"},
            "needs": strings,
            "tools": strings,
            "why": {"type": "string"},
            "complete": {"type": "boolean"},
        },
        "required": ["understanding", "needs", "tools", "why", "complete"],
        "additionalProperties": false,
    });
    ToolDefinition { name: THINK.to_owned(), description: "Writes down the agent's reasoning.".to_owned(), parameters }
}

/// The [`Thought`] in `reply`: its one JSON object, of that shape.
fn parse(reply: &str) -> Result<Thought, String> {
    let start = reply.find('{').ok_or("the reply has no JSON object")?;
    let end = reply.rfind('}').filter(|end| *end > start).ok_or("the reply has no JSON object")?;
    let thought: Thought = serde_json::from_str(&reply[start..=end])
        .map_err(|error| format!("the reply does not match the thought's shape: {error}"))?;
    checked(thought)
}

/// `thought`, unless it says nothing.
fn checked(thought: Thought) -> Result<Thought, String> {
    if thought.understanding.trim().is_empty() {
        return Err("the thought's understanding is empty".to_owned());
    }
    Ok(thought)
}

/// The reasoning before acting, as the model reads it.
fn before_acting(thought: &Thought) -> String {
    let mut text = format!("{BEFORE_ACTING} {}", thought.understanding.trim());
    if !thought.needs.is_empty() {
        text.push_str(&format!("\nNeeded: {}", thought.needs.join("; ")));
    }
    if !thought.tools.is_empty() {
        text.push_str(&format!("\nTools: {}", thought.tools.join(", ")));
    }
    text.push_str("\nNow act on it.");
    text
}

/// A reflection that found the answer incomplete, as the model reads it.
fn incomplete(thought: &Thought) -> String {
    let mut text = format!("{AFTER_RESPONSE} it is not complete yet: {}", thought.why.trim());
    if !thought.needs.is_empty() {
        text.push_str(&format!("\nStill missing: {}", thought.needs.join("; ")));
    }
    text.push_str("\nGo on: call a tool if more is needed; otherwise answer the user's request in plain words.");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thought_is_read_from_its_json_object_and_held_to_its_shape() {
        let reply = "Sure.\n{\"understanding\": \"count words\", \"needs\": [\"the text\"], \"tools\": \
            [\"text_stats\"], \"complete\": false, \"why\": \"nothing measured yet\"}";
        let thought = parse(reply).unwrap();
        assert_eq!(thought.tools, ["text_stats"]);
        assert!(!thought.complete);
        assert!(parse("no json").unwrap_err().contains("no JSON object"));
        let unknown = r#"{"understanding": "x", "complete": true, "why": "y", "mood": "good"}"#;
        assert!(parse(unknown).unwrap_err().contains("shape"), "unknown fields are refused");
        let missing = r#"{"understanding": "x", "why": "y"}"#;
        assert!(parse(missing).unwrap_err().contains("complete"), "complete is required");
        assert!(parse(r#"{"understanding": " ", "complete": true, "why": "y"}"#).is_err());
    }
}
