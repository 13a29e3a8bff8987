//! A model call and its stream: a turn starts (budget check, `turn_start`), the
//! call is offloaded to a task that streams the reply back through a
//! [`DeltaInbox`], and the reply's calls become the turn's tool calls (or, with
//! none, the turn goes to review).

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use ractor::{ActorProcessingErr, ActorRef};
use tracing::{Instrument, debug, warn};

use crate::builtin::BuiltinTool;
use crate::llm::{Message, ModelChunk, ModelClient, ModelDelta, ModelError, ModelReply, Role, ToolChoice};
use crate::metrics;
use crate::protocol::{EventKind, RunStatus, ToolCall};
use crate::session::state::{AbortOnDrop, DeltaInbox, Live, Phase, StepStarted, ToolTurn};
use crate::session::{Session, SessionMsg};
use crate::session::{compact, prompt};
use crate::shared::over_budget;
use crate::steps::{self, NextStep};
use crate::store::StoreWrite;

/// How long streamed pieces of a reply wait to be committed together: a reader
/// sees the reply grow in steps this far apart at most (well under what reads as
/// a pause), and a reply that streams in faster commits with its end.
pub const DELTA_WINDOW: std::time::Duration = std::time::Duration::from_millis(20);

impl Session {
    /// Starts turn `turn`: budget check, `turn_start`, commit, model call.
    pub(super) async fn start_turn(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        turn: u32,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(reason) = over_budget(&live.run.limits, &live.run.usage) {
            live.outbox.emit(EventKind::Error { code: "budget_exceeded".to_owned(), message: reason.clone() });
            return self
                .finish(myself, live, RunStatus::Failed, Some(format!("budget_exceeded: {reason}")), None)
                .await;
        }
        live.run.turn = turn;
        live.turn_clock = Instant::now();
        live.turn_span = tracing::info_span!("turn", turn);
        live.outbox.emit(EventKind::TurnStart { turn });
        live.outbox.write(StoreWrite::Progress { turn, usage: live.run.usage });
        live.outbox.flush(&self.shared).await?;
        self.call_model(myself, live, turn);
        Ok(())
    }

    /// The pause before asking the model again after `error`, if the run should
    /// wait the failure out: it may pass, and `model_outage_wait` is not spent.
    /// Counts the failure.
    fn outage_retry(&self, live: &mut Live, error: &crate::llm::ModelError) -> Option<std::time::Duration> {
        let limit = self.shared.config.model_outage_wait;
        if !error.is_transient() || limit.is_zero() {
            return None;
        }
        let now = tokio::time::Instant::now();
        let (since, attempts) = live.outage.get_or_insert((now, 0));
        *attempts += 1;
        let delay = std::time::Duration::from_secs((1u64 << (*attempts).min(6)).min(60));
        (now.duration_since(*since) + delay <= limit).then_some(delay)
    }

    /// The pause after a provider failure is over: ask the model again, unless the
    /// run moved on meanwhile.
    pub(super) fn on_retry_model(&self, myself: &ActorRef<SessionMsg>, live: &mut Live, turn: u32) {
        if matches!(live.phase, Phase::Model { turn: current, .. } if current == turn) && live.model_task.is_none() {
            self.ask_model(myself, live, turn);
        }
    }

    /// Starts `turn`'s work: a reflecting agent's reasoning before it acts, then
    /// (or else) the model call.
    pub(super) fn call_model(&self, myself: &ActorRef<SessionMsg>, live: &mut Live, turn: u32) {
        if let Some(question) = live.clarify.take() {
            // A review found the request unclear: this turn is the runtime's
            // `ask_user` call, which parks the run for the user's answer.
            live.phase = Phase::Model { turn, synthesis: false };
            let args = serde_json::json!({ "question": question });
            let call =
                ToolCall { call_id: format!("clarify_{turn}"), name: BuiltinTool::AskUser.name().to_owned(), args };
            let _ = myself.cast(SessionMsg::RuntimeReply { turn, content: String::new(), calls: vec![call] });
        } else if Self::thinks_first(live, turn) {
            self.think(myself, live, turn, None);
        } else {
            self.ask_model(myself, live, turn);
        }
    }

    /// Offloads the model call of `turn`; its deltas and reply come back as messages.
    pub(super) fn ask_model(&self, myself: &ActorRef<SessionMsg>, live: &mut Live, turn: u32) {
        let answer_now = prompt::answer_now(&live.conversation, turn, live.run.limits.max_turns);
        let synthesis = answer_now.is_some();
        let blocked = live.ledger.blocked_tools(turn);
        let tools = prompt::offered_tools(&live.agent, &self.shared.described_tools, &blocked);
        let system = prompt::system_prompt(&live.agent);
        // A note that no longer holds is replaced, also by one saying the state is empty.
        let note = prompt::state_note(&blocked)
            .or_else(|| prompt::last_note(&live.conversation).map(|_| prompt::EMPTY_STATE_NOTE.to_owned()));
        if let Some(note) = note
            && prompt::last_note(&live.conversation) != Some(note.as_str())
        {
            live.append_message(turn, Message::text(Role::System, note));
        }
        let step =
            if synthesis { None } else { steps::next_indexed(&live.agent.steps, &live.run.input, &live.conversation) };
        live.step = step.as_ref().map(|(index, step)| {
            let (name, input) = match step {
                NextStep::Call { tool, args, .. } => (tool.clone(), args.clone()),
                NextStep::Model { tool, fixed } => (tool.clone(), serde_json::Value::Object(fixed.clone())),
                NextStep::Answer { prompt } => ("answer".to_owned(), serde_json::Value::String(prompt.clone())),
                NextStep::Finish { answer } => ("finish".to_owned(), serde_json::Value::String(answer.clone())),
            };
            let order = u32::try_from(index + 1).unwrap_or(u32::MAX);
            StepStarted { turn, order, name, input, started: live.turn_clock }
        });
        let step = step.map(|(_, step)| step);
        // An answer step before the model has said anything in this run reads no
        // tool definitions: it may call none, and no earlier prompt of the run is
        // cached with them (only the runtime's steps came before).
        let mut drop_tools = false;
        let forced = match step {
            Some(NextStep::Call { tool, args, attempt }) => {
                // The runtime makes this turn's call; it is booked as the model's
                // would be, with a call id of its own. A call tried again waits first.
                live.phase = Phase::Model { turn, synthesis };
                let call = ToolCall { call_id: format!("step_{turn}"), name: tool, args };
                if attempt > 1 {
                    let pause = self.shared.config.step_retry_backoff * 2u32.pow(attempt - 2);
                    let summary = format!(
                        "{} failed; trying again in {:.1} s (try {attempt} of {})",
                        call.name,
                        pause.as_secs_f64(),
                        steps::STEP_ATTEMPTS
                    );
                    live.outbox.emit(EventKind::ReasoningStep { turn, summary });
                    myself.send_after(pause, move || SessionMsg::RuntimeReply {
                        turn,
                        content: String::new(),
                        calls: vec![call],
                    });
                } else {
                    let _ = myself.cast(SessionMsg::RuntimeReply { turn, content: String::new(), calls: vec![call] });
                }
                return;
            }
            Some(NextStep::Finish { answer }) => {
                // The runtime gives this turn's answer; it is reviewed like the model's.
                live.phase = Phase::Model { turn, synthesis };
                let _ = myself.cast(SessionMsg::RuntimeReply { turn, content: answer, calls: Vec::new() });
                return;
            }
            Some(NextStep::Model { tool, .. }) => Some(ToolChoice::Tool(tool)),
            Some(NextStep::Answer { prompt }) => {
                // The request, asked again right before the answer: a small model
                // answers what it read last.
                if live.conversation.last().is_none_or(|last| last.role != Role::User || last.content != prompt) {
                    live.append_message(turn, Message::text(Role::User, prompt));
                }
                drop_tools = !live.conversation.iter().any(from_the_model);
                Some(ToolChoice::None)
            }
            None => None,
        };
        let tools = if drop_tools { Vec::new() } else { tools };
        // A prompt that would not fit the model's window is compacted (and sent
        // whole otherwise, its cached prefix intact).
        let window = live.model.context_window();
        let fitted = window.and_then(|window| compact::fit(window, &system, &tools, &live.history, &live.conversation));
        if fitted.is_some() {
            debug!(run_id = %live.run.run_id, turn, window, "prompt compacted to fit the model's context");
        }
        let (history, conversation) = match &fitted {
            Some(fitted) => (fitted.history.as_slice(), fitted.conversation.as_slice()),
            None => (live.history.as_slice(), live.conversation.as_slice()),
        };
        let mut request = prompt::build_request(system, history, conversation, tools, answer_now);
        if let Some(choice) = forced {
            request.tool_choice = choice;
        }
        let model = live.model.clone();
        let limit = self.shared.config.model_timeout;
        let done = ModelDoneGuard { session: myself.clone(), turn, started: Instant::now(), sent: false };
        // The call's span (a child of the turn's) goes with it: the model client's
        // log lines name the run, and its requests carry the trace.
        let span = crate::spans::chat(&live.turn_parent(), model.model_id());
        let task = tokio::spawn(
            async move {
                let reply = stream_reply(model.as_ref(), request, &done.session, turn);
                let result = tokio::time::timeout(limit, reply).await.unwrap_or(Err(ModelError::Timeout(limit)));
                if let Ok(reply) = &result {
                    crate::spans::record_usage(&tracing::Span::current(), &reply.usage);
                }
                done.send(result);
            }
            .instrument(span),
        );
        live.model_task = Some(AbortOnDrop(task.abort_handle()));
        live.phase = Phase::Model { turn, synthesis };
    }

    /// Commits the pieces of the reply that were waiting, adjacent pieces of the
    /// same kind (text, reasoning) joined into one `assistant_delta`.
    /// Takes streamed pieces of the reply: they commit [`DELTA_WINDOW`] after the
    /// first of them, with those that came meanwhile, or sooner with the reply if
    /// it is in by then (a fast model's whole reply costs one commit, not two).
    pub(super) fn on_deltas(&self, myself: &ActorRef<SessionMsg>, live: &mut Live, turn: u32, deltas: Vec<ModelDelta>) {
        if !matches!(live.phase, Phase::Model { turn: current, .. } if current == turn) {
            return;
        }
        for (text, reasoning) in join_deltas(deltas) {
            live.outbox.emit(EventKind::AssistantDelta { turn, text, reasoning });
        }
        if !live.deltas_held {
            live.deltas_held = true;
            myself.send_after(DELTA_WINDOW, move || SessionMsg::FlushDeltas { turn });
        }
    }

    /// Commits the pieces held since [`on_deltas`](Self::on_deltas), unless the
    /// reply came first (and took them along).
    pub(super) async fn flush_deltas(&self, live: &mut Live, turn: u32) -> Result<(), ActorProcessingErr> {
        live.deltas_held = false;
        if matches!(live.phase, Phase::Model { turn: current, .. } if current == turn) {
            live.outbox.flush(&self.shared).await?;
        }
        Ok(())
    }

    pub(super) async fn on_model_done(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        turn: u32,
        result: Result<ModelReply, ModelError>,
        elapsed: std::time::Duration,
    ) -> Result<(), ActorProcessingErr> {
        let Phase::Model { turn: current, synthesis } = live.phase else {
            return Ok(());
        };
        if current != turn {
            return Ok(());
        }
        live.model_task = None;
        let model_name = live.model.model_id().to_owned();
        let reply = match result {
            Ok(reply) => reply,
            Err(error) => {
                metrics::model_request(&model_name, "error", elapsed);
                if let Some(delay) = self.outage_retry(live, &error) {
                    let attempt = live.outage.map_or(0, |(_, attempts)| attempts);
                    warn!(run_id = %live.run.run_id, turn, attempt, code = error.code(), %error, retry_in = ?delay,
                        "the model provider failed; the turn asks again later");
                    live.outbox.emit(EventKind::ModelRetry {
                        turn,
                        attempt,
                        code: error.code().to_owned(),
                        message: error.to_string(),
                        retry_in_ms: u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    });
                    live.outbox.flush(&self.shared).await?;
                    myself.send_after(delay, move || SessionMsg::RetryModel { turn });
                    return Ok(());
                }
                warn!(run_id = %live.run.run_id, turn, code = error.code(), %error, "the model call failed; the run fails");
                live.outbox.emit(EventKind::Error { code: error.code().to_owned(), message: error.to_string() });
                return self.finish(myself, live, RunStatus::Failed, Some(format!("model error: {error}")), None).await;
            }
        };
        live.outage = None;
        metrics::model_request(&model_name, "ok", elapsed);
        let usage = reply.usage;
        metrics::model_usage(&model_name, usage.input_tokens, usage.output_tokens, usage.cost_usd);
        live.charge(turn, usage);
        for detail in &reply.decode_errors {
            live.outbox.emit(EventKind::DecodeError { turn, detail: detail.clone() });
        }
        // The synthesis turn answers; any tool calls it makes anyway are ignored.
        let mut calls = if synthesis { Vec::new() } else { unique_call_ids(turn, reply.tool_calls) };
        // A step the model writes keeps the arguments the step fixes.
        if let Some(NextStep::Model { tool, fixed }) =
            steps::next(&live.agent.steps, &live.run.input, &live.conversation)
        {
            for call in calls.iter_mut().filter(|call| call.name == tool) {
                if let serde_json::Value::Object(args) = &mut call.args {
                    args.extend(fixed.clone());
                }
            }
        }
        self.on_reply(myself, live, turn, reply.content, calls, synthesis).await
    }

    /// A reply the runtime gives in place of the model's: an agent step's call or
    /// answer (see [`steps`]), or the question of a `clarify_query` review.
    pub(super) async fn on_runtime_reply(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        turn: u32,
        content: String,
        calls: Vec<ToolCall>,
    ) -> Result<(), ActorProcessingErr> {
        if !matches!(live.phase, Phase::Model { turn: current, .. } if current == turn) {
            return Ok(());
        }
        self.on_reply(myself, live, turn, content, calls, false).await
    }

    /// A turn's reply: an answer goes to review; calls go to the tools.
    async fn on_reply(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        turn: u32,
        content: String,
        calls: Vec<ToolCall>,
        synthesis: bool,
    ) -> Result<(), ActorProcessingErr> {
        let message = Message { role: Role::Assistant, content, tool_calls: calls.clone(), tool_call_id: None };
        live.append_message(turn, message.clone());
        if calls.is_empty() {
            return self.request_review(myself, live, turn, Some(message.content), synthesis).await;
        }
        live.outbox.emit(EventKind::ToolRequests { turn, calls: calls.clone() });
        live.phase = Phase::Tools(Box::new(ToolTurn::new(turn, calls)));
        self.advance_tools(myself, live).await
    }
}

/// Reports the end of a model call exactly once. Dropped unsent (the model client
/// panicked, or the task was aborted), it reports a failure, so the session never
/// waits forever for a reply.
struct ModelDoneGuard {
    session: ActorRef<SessionMsg>,
    turn: u32,
    started: Instant,
    sent: bool,
}

impl ModelDoneGuard {
    fn send(mut self, result: Result<ModelReply, ModelError>) {
        self.sent = true;
        let message = SessionMsg::ModelDone { turn: self.turn, result, elapsed: self.started.elapsed() };
        let _ = self.session.cast(message);
    }
}

impl Drop for ModelDoneGuard {
    fn drop(&mut self) {
        if !self.sent {
            let message = SessionMsg::ModelDone {
                turn: self.turn,
                result: Err(ModelError::Crashed),
                elapsed: self.started.elapsed(),
            };
            let _ = self.session.cast(message);
        }
    }
}

/// The calls with usable ids: the store and a resumed turn find a call by its id,
/// so an empty or repeated id from the model is replaced by `call_{turn}_{index}`.
fn unique_call_ids(turn: u32, mut calls: Vec<ToolCall>) -> Vec<ToolCall> {
    let mut seen = std::collections::HashSet::new();
    for (index, call) in calls.iter_mut().enumerate() {
        if call.call_id.trim().is_empty() || !seen.insert(call.call_id.clone()) {
            call.call_id = format!("call_{turn}_{index}");
            seen.insert(call.call_id.clone());
        }
    }
    calls
}

/// `deltas` as `(text, reasoning)`, adjacent pieces of the same kind joined.
fn join_deltas(deltas: Vec<ModelDelta>) -> Vec<(String, bool)> {
    let mut joined: Vec<(String, bool)> = Vec::new();
    for delta in deltas {
        let (text, reasoning) = match delta {
            ModelDelta::Text(text) => (text, false),
            ModelDelta::Reasoning(text) => (text, true),
        };
        match joined.last_mut() {
            Some((last, kind)) if *kind == reasoning => last.push_str(&text),
            _ => joined.push((text, reasoning)),
        }
    }
    joined
}

/// Reads a model stream to its end, leaving its deltas in an inbox for the
/// session (see [`DeltaInbox`]).
async fn stream_reply(
    model: &dyn ModelClient,
    request: crate::llm::ChatRequest,
    session: &ActorRef<SessionMsg>,
    turn: u32,
) -> Result<ModelReply, ModelError> {
    let mut stream = model.chat(request).await?;
    // Made at the first piece: a call that streams none (or has not yet) holds none.
    let mut inbox: Option<Arc<DeltaInbox>> = None;
    while let Some(chunk) = stream.next().await {
        match chunk? {
            ModelChunk::Delta(delta) => {
                let inbox = inbox.get_or_insert_default();
                if inbox.put(delta) {
                    let _ = session.cast(SessionMsg::ModelDeltas { turn, inbox: inbox.clone() });
                }
            }
            ModelChunk::Done(reply) => return Ok(reply),
        }
    }
    Err(ModelError::Incomplete)
}

/// Whether `message` is the model's own turn (not a call the runtime made for a step).
fn from_the_model(message: &Message) -> bool {
    message.role == Role::Assistant
        && (message.tool_calls.is_empty() || !message.tool_calls.iter().all(|call| call.call_id.starts_with("step_")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adjacent_deltas_of_one_kind_are_joined_and_kinds_keep_their_order() {
        let deltas = vec![
            ModelDelta::Reasoning("think".to_owned()),
            ModelDelta::Reasoning("ing".to_owned()),
            ModelDelta::Text("An".to_owned()),
            ModelDelta::Reasoning("more".to_owned()),
            ModelDelta::Text("swer".to_owned()),
            ModelDelta::Text("".to_owned()),
            ModelDelta::Text(" ✓".to_owned()),
        ];
        let joined = join_deltas(deltas);
        let expected = [("thinking", true), ("An", false), ("more", true), ("swer ✓", false)];
        assert_eq!(joined, expected.map(|(text, reasoning)| (text.to_owned(), reasoning)));
        assert!(join_deltas(Vec::new()).is_empty());
    }
}
