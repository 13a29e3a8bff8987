//! Answers and approvals: a turn parks for a human (an `ask_user` question, or
//! calls that need approval) and gives up its admission slot; the answer or the
//! decision that comes as `Input` is taken, or refused with the run left parked.

use ractor::{ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::Value;

use crate::approvals::{self, ToolTraits};
use crate::builtin::BuiltinTool;
use crate::protocol::{EventKind, RunId, RunStatus, SkipReason, ToolCall, ToolOutcome};
use crate::run_input::{InputError, RunInput};
use crate::session::results::Answered;
use crate::session::state::{Live, Phase, ToolTurn, tools_mut};
use crate::session::{Session, SessionMsg};
use crate::store::StoreWrite;
use crate::supervisor::SupervisorMsg;

/// A human's decision on a call waiting for approval.
struct Decision {
    /// The call; may be left out when only one call waits.
    call_id: Option<String>,
    /// Run it, or not.
    approved: bool,
    /// Why; the model sees it on a rejection.
    reason: Option<String>,
}

impl Session {
    /// Takes what a client sent: an answer to the turn's question, or a decision
    /// on a call waiting for approval.
    pub(super) async fn on_input_message(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        input: RunInput,
        reply: RpcReplyPort<Result<(), InputError>>,
    ) -> Result<(), ActorProcessingErr> {
        match input {
            RunInput::Text(text) => self.on_input(myself, live, text, reply).await,
            RunInput::Approval { call_id, approved, reason } => {
                self.on_approval(myself, live, Decision { call_id, approved, reason }, reply).await
            }
        }
    }

    async fn on_input(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        text: String,
        reply: RpcReplyPort<Result<(), InputError>>,
    ) -> Result<(), ActorProcessingErr> {
        // Look before taking: a run that is not parked must keep its phase.
        let Phase::WaitingInput(parked) = &live.phase else {
            let _ = reply.send(Err(InputError::NotWaiting));
            return Ok(());
        };
        if parked.ask.filter(|ask| parked.results[*ask].is_none()).is_none() {
            let error = if parked.awaiting.is_empty() {
                InputError::NotWaiting
            } else {
                InputError::Invalid("the run waits for an approval, not for an answer".to_owned())
            };
            self.refuse_parked(myself, live, reply, error);
            return Ok(());
        }
        let Phase::WaitingInput(tools) = std::mem::replace(&mut live.phase, Phase::Idle) else {
            return Ok(());
        };
        let Some(ask) = tools.ask else {
            return Ok(());
        };
        let turn = tools.turn;
        let call = tools.calls[ask].clone();
        live.phase = Phase::Tools(tools);
        live.run.status = RunStatus::Running;
        live.outbox.emit(EventKind::InputReceived { text: text.clone() });
        live.outbox.write(StoreWrite::Status { status: RunStatus::Running, reason: None });
        let outcome = ToolOutcome::Ok { value: Value::String(text), fragments: Vec::new() };
        let result = self.builtin_result(live, Answered::now(turn, ask, call, outcome));
        self.record_result(live, result);
        live.outbox.flush(&self.shared).await?;
        let _ = reply.send(Ok(()));
        // A resumed turn has not walked its calls yet; answered ones are skipped.
        self.advance_tools(myself, live).await
    }

    /// A human's decision on a call waiting for approval: an approved call is
    /// dispatched (its `started` record commits with the decision), a rejected
    /// one is answered with the rejection, which the model sees.
    async fn on_approval(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        decision: Decision,
        reply: RpcReplyPort<Result<(), InputError>>,
    ) -> Result<(), ActorProcessingErr> {
        let Decision { call_id, approved, reason } = decision;
        let Some(tools) = tools_mut(live).filter(|tools| !tools.awaiting.is_empty()) else {
            self.refuse_parked(myself, live, reply, InputError::NotWaiting);
            return Ok(());
        };
        let position = match decided_position(tools, call_id.as_deref()) {
            Ok(position) => position,
            Err(error) => {
                self.refuse_parked(myself, live, reply, error);
                return Ok(());
            }
        };
        let index = tools.awaiting.remove(position);
        let (turn, call) = (tools.turn, tools.calls[index].clone());
        if approved {
            tools.approved.push(index);
        }
        live.phase.unpark();
        if live.run.status == RunStatus::WaitingInput {
            live.run.status = RunStatus::Running;
            live.outbox.write(StoreWrite::Status { status: RunStatus::Running, reason: None });
        }
        live.outbox.emit(EventKind::ApprovalDecided {
            turn,
            call_id: call.call_id.clone(),
            tool: call.name.clone(),
            approved,
            reason: reason.clone(),
        });
        if !approved {
            let detail = match &reason {
                Some(reason) => format!("a human rejected this call: {reason}"),
                None => "a human rejected this call".to_owned(),
            };
            let outcome = ToolOutcome::skipped(SkipReason::Denied, detail);
            let result = self.builtin_result(live, Answered::now(turn, index, call, outcome));
            self.record_result(live, result);
        }
        // The decision commits with what it lets run (the `started` record); the
        // client hears back once it is durable, also when it ends the turn (whose
        // commit would otherwise wait for an instant review).
        self.advance_tools(myself, live).await?;
        live.outbox.flush(&self.shared).await?;
        let _ = reply.send(Ok(()));
        Ok(())
    }

    /// Refuses an input. A parked run stays parked, and gives up the slot the
    /// input took for it (an input to a run that is not parked took none).
    pub(super) fn refuse_parked(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &Live,
        reply: RpcReplyPort<Result<(), InputError>>,
        error: InputError,
    ) {
        if matches!(live.phase, Phase::WaitingInput(_)) {
            release_slot(myself, live.run.run_id);
        }
        let _ = reply.send(Err(error));
    }

    /// Why `call` must wait for a human, if it must. `run_agent` counts as a call
    /// with side effects: what the sub-run does is what the caller does.
    pub(super) fn approval_reason(&self, live: &Live, call: &ToolCall) -> Option<String> {
        let traits = match self.shared.pool.registry.get(&call.name) {
            Some(registered) => ToolTraits {
                idempotent: registered.tool.idempotent(),
                requires_approval: registered.tool.requires_approval(),
            },
            None if BuiltinTool::from_name(&call.name) == Some(BuiltinTool::RunAgent) => {
                ToolTraits { idempotent: false, requires_approval: false }
            }
            None => return None,
        };
        // Arguments a model double-encoded are judged as the tool will see them.
        let parsed = match &call.args {
            Value::String(text) => serde_json::from_str::<Value>(text).ok(),
            _ => None,
        };
        let args = parsed.as_ref().unwrap_or(&call.args);
        approvals::reason(
            &self.shared.config.approvals,
            &call.name,
            &traits,
            args,
            &live.labels,
            &live.agent.auto_approve,
        )
    }

    /// Parks call `index` until a human decides on it.
    pub(super) fn request_approval(&self, live: &mut Live, turn: u32, index: usize, call: &ToolCall, reason: String) {
        live.outbox.emit(EventKind::ApprovalRequested {
            turn,
            call_id: call.call_id.clone(),
            tool: call.name.clone(),
            args: call.args.clone(),
            reason,
            sub_run: None,
        });
        if let Some(tools) = tools_mut(live) {
            tools.awaiting.push(index);
        }
    }

    /// Parks the run until a human answers what `prompt` asks: `waiting_input`
    /// commits, and the run gives up its admission slot.
    pub(super) async fn park(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        prompt: String,
    ) -> Result<(), ActorProcessingErr> {
        live.outbox.emit(EventKind::WaitingInput { prompt, sub_run: None });
        live.outbox.write(StoreWrite::Status { status: RunStatus::WaitingInput, reason: None });
        live.run.status = RunStatus::WaitingInput;
        // A run waiting for a human holds no admission slot: a parked run must
        // not keep other runs out. Input gives it one again.
        release_slot(myself, live.run.run_id);
        live.phase.park();
        live.outbox.flush(&self.shared).await?;
        Ok(())
    }
}

/// Where, among the calls awaiting approval, the call a decision names is (a
/// decision may leave it out when only one call waits), or why it names none.
fn decided_position(tools: &ToolTurn, call_id: Option<&str>) -> Result<usize, InputError> {
    match call_id {
        Some(id) => tools
            .awaiting
            .iter()
            .position(|index| tools.calls[*index].call_id == id)
            .ok_or_else(|| InputError::Invalid("no call with that call_id waits for approval".to_owned())),
        None if tools.awaiting.len() == 1 => Ok(0),
        None => {
            let ids: Vec<&str> = tools.awaiting.iter().map(|index| tools.calls[*index].call_id.as_str()).collect();
            let message = format!("several calls wait for approval; name one with call_id: {}", ids.join(", "));
            Err(InputError::Invalid(message))
        }
    }
}

/// Tells the supervisor that the run gives up its admission slot while it
/// waits for a human.
fn release_slot(myself: &ActorRef<SessionMsg>, run_id: RunId) {
    if let Some(supervisor) = myself.try_get_supervisor() {
        let _ = ActorRef::<SupervisorMsg>::from(supervisor).cast(SupervisorMsg::ReleaseSlot { run_id });
    }
}
