//! What a call's result does to the turn: it is booked (events, record,
//! message, documents) and counted, and after the turn's last result the turn
//! parks for a human or goes to review. Calls the session answers itself are
//! booked through [`Answered`].

use chrono::{DateTime, Utc};
use ractor::{ActorProcessingErr, ActorRef};

use crate::builtin::BuiltinTool;
use crate::llm::{Message, Role};
use crate::metrics;
use crate::protocol::{EventKind, SkipReason, ToolCall, ToolExecutionRecord, ToolOutcome};
use crate::reviewer::CallSummary;
use crate::session::prompt;
use crate::session::state::{Live, Phase, ToolTurn, tools_mut};
use crate::session::{Session, SessionMsg};
use crate::store::{StoreWrite, StoredMessage};
use crate::tool_pool::ToolResult;

/// A call the session answered itself, to be booked like a pool's result.
pub(super) struct Answered {
    /// The turn.
    pub(super) turn: u32,
    /// The call's position in the turn.
    pub(super) index: usize,
    /// The call.
    pub(super) call: ToolCall,
    /// The answer.
    pub(super) outcome: ToolOutcome,
    /// When the session took it up.
    pub(super) started_at: DateTime<Utc>,
    /// How long answering it took.
    pub(super) duration_ms: u64,
}

impl Answered {
    /// A call answered at once: it starts now and takes no time.
    pub(super) fn now(turn: u32, index: usize, call: ToolCall, outcome: ToolOutcome) -> Self {
        Self { turn, index, call, outcome, started_at: Utc::now(), duration_ms: 0 }
    }
}

impl Session {
    /// Books the results of calls that ended (those of another turn, or of a call
    /// already answered, are dropped), then carries the turn on: the results are
    /// committed together, with the `started` records of any calls dispatched next.
    pub(super) async fn on_tools_done(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        results: Vec<ToolResult>,
    ) -> Result<(), ActorProcessingErr> {
        if !self.book_results(live, results, false) {
            return Ok(());
        }
        self.advance_tools(myself, live).await
    }

    /// Books the results that belong to the turn's calls still unanswered (also
    /// while it is parked, if `parked_too`); returns whether any was. Nothing
    /// more: the caller decides what follows (at shutdown, nothing).
    pub(super) fn book_results(&self, live: &mut Live, results: Vec<ToolResult>, parked_too: bool) -> bool {
        let mut booked = false;
        for result in results {
            let tools = match &mut live.phase {
                Phase::Tools(tools) => tools,
                Phase::WaitingInput(tools) if parked_too => tools,
                _ => return booked,
            };
            if tools.turn != result.turn || tools.results.get(result.index).is_none_or(Option::is_some) {
                continue;
            }
            tools.in_flight = tools.in_flight.saturating_sub(1);
            self.record_result(live, result);
            booked = true;
        }
        booked
    }

    /// Books a finished call: its events, record, message and documents.
    pub(super) fn record_result(&self, live: &mut Live, result: ToolResult) {
        let ToolResult { turn, index, call, outcome, record, newly_blocked, new_documents, summary, usage } = result;
        if !usage.is_zero() {
            live.charge(turn, usage);
        }
        match &outcome {
            ToolOutcome::Skipped { reason, detail } => live.outbox.emit(EventKind::ToolSkipped {
                turn,
                call_id: call.call_id.clone(),
                tool: call.name.clone(),
                reason: *reason,
                detail: detail.clone(),
            }),
            _ => live.outbox.emit(EventKind::ToolCallEnd {
                turn,
                call_id: call.call_id.clone(),
                tool: call.name.clone(),
                status: record.status,
                duration_ms: record.duration_ms,
                summary: record.result_summary.clone(),
            }),
        }
        live.outbox.emit(EventKind::ReasoningStep { turn, summary });
        if newly_blocked {
            let threshold = self.shared.config.hooks.failure_threshold;
            live.outbox.emit(EventKind::ReasoningStep {
                turn,
                summary: format!("{} is blocked after {threshold} failures", call.name),
            });
        }
        live.outbox.emit(EventKind::ToolMetric { record: Box::new(record.clone()) });
        live.outbox.write(StoreWrite::ToolExecution(record.clone()));
        if !new_documents.is_empty() {
            live.outbox.write(StoreWrite::Documents(new_documents));
        }
        if let ToolOutcome::Ok { value, .. } = &outcome {
            live.labels.absorb(value);
        }
        let message = Message::tool_result(call.call_id.clone(), self.result_text(live, turn, &call, &outcome));
        live.outbox.write(StoreWrite::Message(StoredMessage { turn, message: message.clone() }));
        let skip = match &outcome {
            ToolOutcome::Skipped { reason, .. } => Some(*reason),
            _ => None,
        };
        if let Some(tools) = tools_mut(live)
            && index < tools.calls.len()
        {
            tools.results[index] = Some(CallSummary { tool: call.name, status: record.status.as_str(), skip });
            tools.messages[index] = Some(message);
        }
    }

    /// The result of a call the session answered itself.
    pub(super) fn builtin_result(&self, live: &Live, answered: Answered) -> ToolResult {
        let Answered { turn, index, call, outcome, started_at, duration_ms } = answered;
        let summary = match (&outcome, BuiltinTool::from_name(&call.name)) {
            (ToolOutcome::Ok { .. }, Some(BuiltinTool::TodoWrite)) => {
                format!("Updated the plan (version {})", live.plan.version)
            }
            (ToolOutcome::Ok { .. }, _) => "Received the user's answer".to_owned(),
            (_, _) => format!("{} was rejected", call.name),
        };
        let mut record =
            ToolExecutionRecord::started(live.run.run_id, &live.agent.name, "builtin".to_owned(), turn, &call)
                .ended(&outcome);
        record.started_at = started_at;
        record.duration_ms = duration_ms;
        // A built-in counts in the run's ledger like any tool: its failures strike
        // (three block it), its successes make later identical calls duplicates.
        let newly_blocked = BuiltinTool::from_name(&call.name).is_some() && self.book_builtin(live, &record, &outcome);
        ToolResult {
            turn,
            index,
            call,
            outcome,
            record,
            newly_blocked,
            new_documents: Vec::new(),
            summary,
            usage: Default::default(),
        }
    }

    /// What the model reads of a call's outcome. A repeat of a call that
    /// succeeded carries that call's result again: a model that asks twice has
    /// lost sight of it, and reads it last this way.
    fn result_text(&self, live: &Live, turn: u32, call: &ToolCall, outcome: &ToolOutcome) -> String {
        let text = outcome.to_model_text();
        let ToolOutcome::Skipped { reason: SkipReason::Duplicate, .. } = outcome else { return text };
        let window = self.shared.config.hooks.dedupe_window_turns;
        let Some((_, earlier)) = live.ledger.earlier_success(&call.name, &call.args, turn, window) else { return text };
        let result =
            live.conversation.iter().rev().find(|message| {
                message.role == Role::Tool && message.tool_call_id.as_deref() == Some(earlier.as_str())
            });
        match result {
            Some(result) => format!("{text}; its result was: {}", result.content),
            None => text,
        }
    }

    /// Books a built-in's outcome in the ledger and the metrics, as the tool
    /// pool's after-hooks do for other tools; true when it blocked the tool.
    fn book_builtin(&self, live: &Live, record: &ToolExecutionRecord, outcome: &ToolOutcome) -> bool {
        let blocked = live.ledger.record_execution(record, &self.shared.config.hooks);
        match outcome {
            ToolOutcome::Skipped { reason, .. } => metrics::tool_skipped(&record.tool, reason.as_str()),
            _ => metrics::tool_call(
                &record.tool,
                record.status.as_str(),
                std::time::Duration::from_millis(record.duration_ms),
            ),
        }
        if blocked {
            metrics::tool_blocked(&record.tool);
        }
        blocked
    }

    /// After the last call of a turn: park for `ask_user` or approvals, or ask
    /// for the review.
    pub(super) async fn maybe_end_tools(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
    ) -> Result<(), ActorProcessingErr> {
        let Phase::Tools(tools) = &live.phase else {
            return Ok(());
        };
        if tools.next < tools.calls.len() || tools.in_flight > 0 {
            return Ok(());
        }
        let question = tools.ask.filter(|ask| tools.results[*ask].is_none());
        if question.is_some() || !tools.awaiting.is_empty() {
            let prompt = waiting_prompt(tools, question);
            return self.park(myself, live, prompt).await;
        }
        let turn = tools.turn;
        let messages: Vec<Message> = tools.messages.iter().flatten().cloned().collect();
        live.conversation.extend(messages);
        self.request_review(myself, live, turn, None, false).await
    }
}

/// What a parked turn waits for: the answer to its question (`question`: the
/// `ask_user` call), or decisions on the calls awaiting approval.
fn waiting_prompt(tools: &ToolTurn, question: Option<usize>) -> String {
    match question {
        Some(ask) => prompt::ask_user_question(&tools.calls[ask].args).unwrap_or_default(),
        None => {
            let waiting: Vec<String> = tools
                .awaiting
                .iter()
                .map(|index| format!("{} ({})", tools.calls[*index].name, tools.calls[*index].call_id))
                .collect();
            format!("approve or reject: {}", waiting.join(", "))
        }
    }
}
