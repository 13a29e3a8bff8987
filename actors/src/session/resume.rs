//! Loading a run into a session: a new run starts its first turn; a run resumed
//! after a crash carries on from its last commit. A committed model reply is never
//! requested again; a call left `started` is re-run only if its tool is idempotent,
//! otherwise the model is told it was interrupted; a parked run stays parked.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::approvals::RunLabels;
use crate::builtin::BuiltinTool;
use crate::config::AgentConfig;
use crate::hooks::RunLedger;
use crate::llm::{Message, Role};
use crate::planner::Planner;
use crate::protocol::{CallStatus, RunId, RunStatus, SkipReason, ThreadId, ToolOutcome};
use crate::reviewer::CallSummary;
use crate::session::outbox::Outbox;
use crate::session::review::Verdict;
use crate::session::state::{Live, Phase, SessionState, ToolTurn, tools_mut};
use crate::session::{Session, SessionMsg, prompt};
use crate::store::{RunQuery, RunSnapshot, RunStore, StoreError, StoredMessage};

impl Session {
    /// Reads the run (unless it came as created) and makes its span: the
    /// OpenTelemetry `invoke_agent` span of the GenAI conventions, whose children
    /// are its turns, model calls, tool calls and reviews, in the trace its
    /// `traceparent` names. One per session: a run resumed after a restart gets
    /// another span in the same trace.
    pub(super) async fn open_span(&self, state: &mut SessionState) -> Result<(), ActorProcessingErr> {
        if state.created.is_none() {
            state.created = self.shared.store.load(state.run_id).await?.map(Box::new);
        }
        state.span = crate::spans::run(state.run_id, state.created.as_ref().map(|snapshot| &snapshot.run));
        Ok(())
    }

    /// Loads the run and takes its next step.
    pub(super) async fn load(
        &self,
        myself: &ActorRef<SessionMsg>,
        state: &mut SessionState,
    ) -> Result<(), ActorProcessingErr> {
        if state.live.is_some() {
            return Ok(());
        }
        let resumed = state.resumed;
        let snapshot = match state.created.take() {
            Some(created) => Some(*created),
            None => {
                // A session before this one may have committed events it never
                // published: the run's streams read the store from now on.
                self.shared.hub.forget(state.run_id);
                self.shared.store.load(state.run_id).await?
            }
        };
        let Some(snapshot) = snapshot else {
            warn!(run_id = %state.run_id, "run not in the store; session stops");
            self.shared.hub.close(state.run_id);
            myself.stop(None);
            return Ok(());
        };
        if snapshot.run.status.is_terminal() {
            // Its end may have committed without being published: streams
            // waiting on the channel read the store, which has it.
            self.shared.hub.close(state.run_id);
            myself.stop(None);
            return Ok(());
        }
        let known_agent = self.shared.agents.get(&snapshot.run.agent).cloned();
        let agent = known_agent
            .clone()
            .unwrap_or_else(|| Arc::new(AgentConfig::new(snapshot.run.agent.clone(), "", Vec::new())));
        let model = self.shared.models.get(agent.model.as_deref());
        let planner = if snapshot.plan.items.is_empty() {
            None
        } else {
            let planner = Planner { config: self.shared.config.planner.clone() };
            Some(Actor::spawn_linked(None, planner, snapshot.plan.clone(), myself.get_cell()).await?.0)
        };
        let run = &snapshot.run;
        let conversation = canonical_conversation(&run.input, &snapshot.messages);
        let history = match run.thread_id {
            Some(thread_id) => thread_history(self.shared.store.as_ref(), thread_id, run.run_id).await?,
            None => Vec::new(),
        };
        let cancel = CancellationToken::new();
        let max_turns = run.limits.max_turns;
        let reflections = snapshot
            .messages
            .iter()
            .filter(|m| m.message.role == Role::Assistant && m.message.tool_calls.is_empty())
            .filter(|m| m.turn < run.turn && m.turn <= max_turns)
            .count() as u32;
        let depth = super::sub_runs::depth(&self.shared, &snapshot.run, self.shared.config.max_agent_depth).await?;
        let mut labels = RunLabels::default();
        for stored in snapshot.messages.iter().filter(|m| m.message.role == Role::Tool) {
            labels.absorb_text(&stored.message.content);
        }
        let live = state.live.insert(Live {
            run: run.clone(),
            model: model.clone().unwrap_or_else(|| self.shared.models.fallback()),
            agent,
            planner,
            plan: snapshot.plan.clone(),
            history,
            conversation,
            ledger: Arc::new(RunLedger::rebuild(
                &snapshot.tool_executions,
                &snapshot.documents,
                &self.shared.config.hooks,
            )),
            outbox: Outbox {
                run_id: run.run_id,
                parent_run_id: run.parent_run_id,
                next_seq: snapshot.last_seq + 1,
                events: Vec::new(),
                writes: Vec::new(),
            },
            phase: Phase::Idle,
            _cancel_on_drop: cancel.clone().drop_guard(),
            cancel,
            model_task: None,
            reflections,
            labels,
            depth,
            turn_clock: Instant::now(),
            draining: false,
            waiting_on: None,
            outage: None,
            clarify: None,
            step: None,
            turn_span: tracing::Span::none(),
            deltas_held: false,
        });
        if live.run.turn > 0 {
            live.turn_span = tracing::info_span!("turn", turn = live.run.turn);
        }
        if known_agent.is_none() || model.is_none() {
            let reason = format!("agent {} or its model is not configured", live.run.agent);
            return self.finish(myself, live, RunStatus::Failed, Some(reason), None).await;
        }
        if resumed && live.run.turn > 0 {
            info!(run_id = %live.run.run_id, turn = live.run.turn, "resuming run from the store");
        }
        self.nudge_subscribers(live, &snapshot).await?;
        self.resume(myself, live, &snapshot).await
    }

    async fn resume(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        snapshot: &RunSnapshot,
    ) -> Result<(), ActorProcessingErr> {
        let turn = live.run.turn;
        if turn == 0 {
            return self.start_turn(myself, live, 1).await;
        }
        // Whether the turn had to answer, judged on the conversation before it, as
        // when it started.
        let before: Vec<Message> =
            snapshot.messages.iter().filter(|m| m.turn < turn).map(|m| m.message.clone()).collect();
        let synthesis = prompt::answer_now(&before, turn, live.run.limits.max_turns).is_some();
        let assistant = snapshot
            .messages
            .iter()
            .find(|m| m.turn == turn && m.message.role == Role::Assistant)
            .map(|m| m.message.clone());
        if let Some((_, review)) = snapshot.reviews.iter().rev().find(|(t, _)| *t == turn) {
            let final_answer = assistant.filter(|a| a.tool_calls.is_empty()).map(|a| a.content);
            let verdict = Verdict::of(turn, final_answer, synthesis, review);
            return self.next_step(myself, live, verdict).await;
        }
        let Some(assistant) = assistant else {
            // The turn's reply never committed: this is the one request that is
            // repeated (or, for a run just created, whose first turn started with
            // it, the first request).
            live.turn_clock = Instant::now();
            self.call_model(myself, live, turn);
            return Ok(());
        };
        if assistant.tool_calls.is_empty() {
            return self.request_review(myself, live, turn, Some(assistant.content), synthesis).await;
        }
        self.resume_tools(myself, live, snapshot, turn, assistant).await
    }

    /// A turn whose reply asked for tools: answered calls keep their results, a
    /// side-effecting call left `started` is interrupted, the rest run again.
    async fn resume_tools(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        snapshot: &RunSnapshot,
        turn: u32,
        assistant: Message,
    ) -> Result<(), ActorProcessingErr> {
        let answered: Vec<&str> = snapshot
            .messages
            .iter()
            .filter(|m| m.turn == turn && m.message.role == Role::Tool)
            .filter_map(|m| m.message.tool_call_id.as_deref())
            .collect();
        let records: HashMap<&str, _> = snapshot
            .tool_executions
            .iter()
            .filter(|record| record.turn == turn)
            .map(|record| (record.call_id.as_str(), record))
            .collect();
        // The turn's results wait in the ToolTurn until every call is answered.
        let answered_here = live.conversation.iter().rposition(|m| m.role == Role::Assistant).map_or(0, |at| at + 1);
        live.conversation.truncate(answered_here);
        let mut tools = Box::new(ToolTurn::new(turn, assistant.tool_calls));
        let mut interrupted = Vec::new();
        for (index, call) in tools.calls.iter().enumerate() {
            let record = records.get(call.call_id.as_str());
            if answered.contains(&call.call_id.as_str()) {
                let status = record.map_or("completed", |r| r.status.as_str());
                let skip = record.and_then(|r| r.error.as_deref()).and_then(skip_reason);
                tools.results[index] = Some(CallSummary { tool: call.name.clone(), status, skip });
                tools.messages[index] = snapshot
                    .messages
                    .iter()
                    .find(|m| m.turn == turn && m.message.tool_call_id.as_deref() == Some(call.call_id.as_str()))
                    .map(|m| m.message.clone());
            } else if BuiltinTool::from_name(&call.name) == Some(BuiltinTool::AskUser) {
                if live.run.status == RunStatus::WaitingInput {
                    tools.ask = Some(index);
                }
            } else if record.is_some_and(|r| r.status == CallStatus::Started)
                && !self.idempotent(&call.name)
                && BuiltinTool::from_name(&call.name) != Some(BuiltinTool::RunAgent)
            {
                // (A cut-off `run_agent` is dispatched again: its sub-run has an id
                // derived from the call, so it is found and followed, not repeated.)
                interrupted.push(index);
            } else if record.is_none() && live.run.status == RunStatus::WaitingInput {
                // Parked with this call never started: it waits for approval.
                tools.awaiting.push(index);
            }
        }
        live.phase = Phase::Tools(tools);
        for index in interrupted {
            let Some(call) = tools_mut(live).map(|tools| tools.calls[index].clone()) else {
                break;
            };
            let work = live.work(turn, index, call, live.cancel.clone());
            warn!(run_id = %work.run_id, tool = %work.call.name, "side-effecting call was cut off by a crash; reporting it interrupted");
            let result = crate::tool_pool::finish(
                &self.shared.pool,
                &work,
                ToolOutcome::Interrupted,
                Utc::now(),
                Default::default(),
                Default::default(),
            );
            self.record_result(live, result);
        }
        if live.run.status == RunStatus::WaitingInput
            && let Phase::Tools(tools) = &mut live.phase
        {
            // Every call is answered, asked or awaiting approval: none to walk again.
            tools.next = tools.calls.len();
            live.phase.park();
            return Ok(());
        }
        self.advance_tools(myself, live).await
    }

    /// Re-publishes the last committed event. A previous session may have died
    /// between a commit and its publish; a subscriber waiting on the channel then
    /// sees a gap, or its next event, and catches up from the store.
    async fn nudge_subscribers(&self, live: &Live, snapshot: &RunSnapshot) -> Result<(), ActorProcessingErr> {
        let run_id = live.run.run_id;
        if self.shared.hub.has_subscribers(run_id) {
            let tail = self.shared.store.events_after(run_id, snapshot.last_seq.saturating_sub(1), 1).await?;
            self.shared.hub.publish(run_id, tail);
        }
        Ok(())
    }

    fn idempotent(&self, tool: &str) -> bool {
        self.shared.pool.registry.get(tool).is_some_and(|registered| registered.tool.idempotent())
    }
}

/// The conversation as the model sees it: the request, then each turn's reply,
/// its tool results in call order, and its review.
/// What was said in `thread_id` before run `run_id`: the runs older than it,
/// oldest first (all have ended: a thread starts a run only once the runs before
/// it have ended).
async fn thread_history(store: &dyn RunStore, thread_id: ThreadId, run_id: RunId) -> Result<Vec<Message>, StoreError> {
    let query = RunQuery { thread_id: Some(thread_id), after: Some(run_id), limit: usize::MAX, ..RunQuery::default() };
    let mut earlier = store.list_runs(query).await?;
    earlier.reverse();
    earlier.retain(|run| run.status.is_terminal());
    let summary = store.threads().get_thread(thread_id).await?.and_then(|thread| thread.summary);
    // A summary covers only runs before this one.
    let summary = summary.filter(|summary| summary.through < run_id);
    Ok(crate::threads::history(&earlier, summary.as_ref()))
}

fn canonical_conversation(input: &str, messages: &[StoredMessage]) -> Vec<Message> {
    let mut ordered: Vec<&StoredMessage> = messages.iter().collect();
    let rank = |stored: &StoredMessage| -> (u32, usize) {
        let message = &stored.message;
        // Within a turn: its state note (written before the model call), the reply,
        // the tool results in call order, then the review.
        let in_turn = match message.role {
            Role::System => 0,
            Role::Assistant => 1,
            Role::Tool => {
                let reply = messages.iter().find(|m| m.turn == stored.turn && m.message.role == Role::Assistant);
                let index = reply.and_then(|reply| {
                    reply
                        .message
                        .tool_calls
                        .iter()
                        .position(|call| Some(call.call_id.as_str()) == message.tool_call_id.as_deref())
                });
                2 + index.unwrap_or(usize::MAX / 2)
            }
            _ => usize::MAX,
        };
        (stored.turn, in_turn)
    };
    ordered.sort_by_key(|stored| rank(stored));
    let mut conversation = vec![Message::text(Role::User, input.to_owned())];
    conversation.extend(ordered.into_iter().map(|stored| stored.message.clone()));
    conversation
}

fn skip_reason(code: &str) -> Option<SkipReason> {
    [SkipReason::Duplicate, SkipReason::Blocked, SkipReason::InvalidArgs, SkipReason::Denied]
        .into_iter()
        .find(|reason| reason.as_str() == code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ToolCall;

    #[test]
    fn a_resumed_conversation_keeps_the_live_order_of_a_turn() {
        let stored = |turn, message| StoredMessage { turn, message };
        let mut reply = Message::text(Role::Assistant, "");
        reply.tool_calls = vec![ToolCall { call_id: "a".into(), name: "t".into(), args: serde_json::json!({}) }];
        // The live order of turn 2: its note (written before the model call), the
        // reply, the result, the review; stored in another order.
        let live = [
            Message::text(Role::System, "plan v2"),
            reply.clone(),
            Message::tool_result("a", "done"),
            Message::text(Role::User, "review of turn 2"),
        ];
        let shuffled = vec![
            stored(2, live[3].clone()),
            stored(2, live[2].clone()),
            stored(2, live[1].clone()),
            stored(2, live[0].clone()),
        ];
        let conversation = canonical_conversation("question", &shuffled);
        assert_eq!(conversation[0], Message::text(Role::User, "question"));
        assert_eq!(conversation[1..], live);
    }
}
