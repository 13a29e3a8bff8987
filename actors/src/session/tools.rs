//! Routing a call: the one place a call goes by its name. A tool the agent may
//! not use is refused; the built-ins `list_agents`, `todo_write` and `ask_user`
//! are answered here; any other call waits for approval if it must, and is then
//! dispatched: `run_agent` as a sub-run the session starts, the rest to the tool
//! pool. The `started` records of the calls commit before any is sent.

use ractor::{ActorProcessingErr, ActorRef};
use serde_json::Value;
use tracing::warn;

use crate::builtin::BuiltinTool;
use crate::protocol::{EventKind, SkipReason, ToolCall, ToolOutcome};
use crate::session::outbox::started_record;
use crate::session::results::Answered;
use crate::session::state::{Live, Phase, tools_mut};
use crate::session::{Session, SessionMsg, prompt, sub_runs};
use crate::store::StoreWrite;
use crate::tool_pool::{Ending, ToolJob, ToolPoolMsg, ToolReply, ToolResult, WorkItem, book};

/// The calls a walk over the turn dispatched: sub-runs the session starts, and
/// jobs for the pool.
#[derive(Default)]
struct Dispatch {
    jobs: Vec<WorkItem>,
    sub_runs: Vec<WorkItem>,
}

impl Session {
    /// Dispatches calls while parallel slots are free: built-ins inline, the rest to
    /// the pool. The `started` records commit before any call is sent.
    pub(super) async fn advance_tools(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
    ) -> Result<(), ActorProcessingErr> {
        if tools_mut(live).is_none() {
            return Ok(());
        }
        let mut dispatch = Dispatch::default();
        // Calls a human just approved go first.
        self.dispatch_approved(live, &mut dispatch);
        self.walk_calls(myself, live, &mut dispatch).await?;
        self.commit_started(live, &dispatch).await?;
        // Their `started` records are committed: the sub-runs may be created.
        self.start_sub_runs(myself, live, dispatch.sub_runs).await?;
        self.send_to_pool(myself, live, dispatch.jobs);
        self.maybe_end_tools(myself, live).await
    }

    /// Dispatches the calls a human just approved, while parallel slots are free.
    fn dispatch_approved(&self, live: &mut Live, dispatch: &mut Dispatch) {
        let max_parallel = live.run.limits.max_parallel_tools.max(1);
        while let Some(tools) = tools_mut(live)
            && tools.in_flight < max_parallel
            && !tools.approved.is_empty()
        {
            let index = tools.approved.remove(0);
            self.dispatch_call(live, index, dispatch);
        }
    }

    /// Walks the calls not yet routed, in order, while parallel slots are free.
    async fn walk_calls(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        dispatch: &mut Dispatch,
    ) -> Result<(), ActorProcessingErr> {
        let max_parallel = live.run.limits.max_parallel_tools.max(1);
        while let Some(tools) = tools_mut(live)
            && tools.next < tools.calls.len()
            && tools.in_flight < max_parallel
        {
            let index = tools.next;
            tools.next += 1;
            if tools.results[index].is_some() {
                // Answered before a crash; resumed turns skip it.
                continue;
            }
            self.route_call(myself, live, index, dispatch).await?;
        }
        Ok(())
    }

    /// Routes call `index` by its name: refused, answered here, parked for
    /// approval, or dispatched.
    async fn route_call(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        index: usize,
        dispatch: &mut Dispatch,
    ) -> Result<(), ActorProcessingErr> {
        let Some(tools) = tools_mut(live) else {
            return Ok(());
        };
        let (turn, ask, call) = (tools.turn, tools.ask, tools.calls[index].clone());
        if self.forbidden(live, &call.name) {
            // The model was never offered it: an agent calls only its own tools.
            let detail = format!("{} is not one of this agent's tools", call.name);
            let outcome = ToolOutcome::skipped(SkipReason::Denied, detail);
            let result = self.builtin_result(live, Answered::now(turn, index, call, outcome));
            self.record_result(live, result);
            return Ok(());
        }
        let builtin = BuiltinTool::from_name(&call.name);
        if builtin.is_some_and(|builtin| builtin != BuiltinTool::RunAgent)
            && let Some(outcome) = self.builtin_gate(live, turn, &call)
        {
            self.emit_call_start(live, turn, &call, format!("Calling {}", call.name));
            let result = self.builtin_result(live, Answered::now(turn, index, call, outcome));
            self.record_result(live, result);
            return Ok(());
        }
        match builtin {
            Some(BuiltinTool::ListAgents) => {
                self.emit_call_start(live, turn, &call, "Listing the agents".to_owned());
                let outcome = sub_runs::list_agents(&self.shared);
                let result = self.builtin_result(live, Answered::now(turn, index, call, outcome));
                self.record_result(live, result);
            }
            Some(BuiltinTool::TodoWrite) => {
                self.emit_call_start(live, turn, &call, "Updating the plan".to_owned());
                let result = self.todo_write(myself, live, turn, index, call).await?;
                self.record_result(live, result);
            }
            Some(BuiltinTool::AskUser) => self.ask_user(live, turn, index, call, ask),
            Some(BuiltinTool::RunAgent) | None => match self.approval_reason(live, &call) {
                Some(reason) => self.request_approval(live, turn, index, &call, reason),
                None => self.dispatch_call(live, index, dispatch),
            },
        }
        Ok(())
    }

    /// The hook chain's gates for a built-in the session answers itself, as for
    /// any tool: a built-in blocked after repeated failures is skipped, and so is
    /// a call identical to one that already succeeded (a model that pastes the
    /// same plan again, or asks the same question twice, is stopped there).
    fn builtin_gate(&self, live: &Live, turn: u32, call: &ToolCall) -> Option<ToolOutcome> {
        let hooks = &self.shared.config.hooks;
        if live.ledger.is_blocked(&call.name, turn) {
            let detail = format!("{} is blocked after {} failures; do not call it", call.name, hooks.failure_threshold);
            return Some(ToolOutcome::skipped(SkipReason::Blocked, detail));
        }
        let (earlier_turn, call_id) =
            live.ledger.earlier_success(&call.name, &call.args, turn, hooks.dedupe_window_turns)?;
        let detail =
            format!("identical call already succeeded as call {call_id} in turn {earlier_turn}; use its result above");
        Some(ToolOutcome::skipped(SkipReason::Duplicate, detail))
    }

    /// An `ask_user` call: its question waits for the turn's other calls, then
    /// parks the run; one without a question, or a second one in the turn, is
    /// refused. `ask` is the turn's question so far.
    fn ask_user(&self, live: &mut Live, turn: u32, index: usize, call: ToolCall, ask: Option<usize>) {
        let question = prompt::ask_user_question(&call.args);
        let summary = format!("Asking the user: {}", question.as_deref().unwrap_or("(no question)"));
        self.emit_call_start(live, turn, &call, summary);
        let outcome = match (question, ask) {
            (Some(_), None) => {
                if let Some(tools) = tools_mut(live) {
                    tools.ask = Some(index);
                }
                return;
            }
            (None, _) => {
                let detail =
                    "ask_user needs a \"question\" that ends with \"?\"; if you can answer the request, answer it";
                ToolOutcome::skipped(SkipReason::InvalidArgs, detail)
            }
            (Some(_), Some(_)) => ToolOutcome::skipped(SkipReason::Denied, "only one ask_user call per turn"),
        };
        let result = self.builtin_result(live, Answered::now(turn, index, call, outcome));
        self.record_result(live, result);
    }

    /// Counts call `index` in flight, records it `started`, and queues it: a
    /// sub-run is started by the session once `started` is committed; every other
    /// call goes to the pool.
    fn dispatch_call(&self, live: &mut Live, index: usize, dispatch: &mut Dispatch) {
        if let Some(tools) = tools_mut(live) {
            tools.in_flight += 1;
        }
        let work = self.work_item(live, index);
        self.mark_started(live, &work);
        if BuiltinTool::from_name(&work.call.name) == Some(BuiltinTool::RunAgent) {
            dispatch.sub_runs.push(work)
        } else {
            dispatch.jobs.push(work)
        }
    }

    /// The `started` records of the calls about to run commit before any is
    /// sent, and results booked while other calls still run commit now. Once
    /// every call has ended, `maybe_end_tools` commits the turn: as it parks,
    /// or through `request_review`.
    async fn commit_started(&self, live: &mut Live, dispatch: &Dispatch) -> Result<(), ActorProcessingErr> {
        let settled = dispatch.jobs.is_empty()
            && dispatch.sub_runs.is_empty()
            && matches!(&live.phase, Phase::Tools(tools) if tools.next >= tools.calls.len() && tools.in_flight == 0);
        if !settled {
            live.outbox.flush(&self.shared).await?;
        }
        Ok(())
    }

    /// Starts the sub-runs of `run_agent` calls; a call whose sub-run is refused
    /// is answered with the refusal, and the refusals commit together.
    async fn start_sub_runs(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        calls: Vec<WorkItem>,
    ) -> Result<(), ActorProcessingErr> {
        let mut refused = false;
        for work in calls {
            if let Some(outcome) = self.start_sub_run(myself, live, work.clone()).await? {
                let summary = format!("run_agent failed ({})", outcome.to_model_text());
                let result = book(&self.shared.pool, &work, Ending::at_once(outcome), summary);
                if let Some(tools) = tools_mut(live) {
                    tools.in_flight = tools.in_flight.saturating_sub(1);
                }
                self.record_result(live, result);
                refused = true;
            }
        }
        if refused {
            live.outbox.flush(&self.shared).await?;
        }
        Ok(())
    }

    /// Sends calls to the tool pool; their results come back through the turn's
    /// inbox.
    fn send_to_pool(&self, myself: &ActorRef<SessionMsg>, live: &mut Live, jobs: Vec<WorkItem>) {
        let pool = self.shared.handles.tool_pool();
        let inbox = tools_mut(live).map(|tools| tools.inbox.clone()).unwrap_or_default();
        for work in jobs {
            let (session, inbox) = (myself.clone(), inbox.clone());
            let reply = ToolReply::new(self.shared.pool.clone(), work.clone(), move |result: ToolResult| {
                if inbox.put(result) {
                    let _ = session.cast(SessionMsg::ToolResults(inbox));
                }
            });
            let job = ToolPoolMsg::Execute(Box::new(ToolJob { work, reply }));
            // Unsent, the job is dropped here and its reply answers `tool_pool_unavailable`.
            let sent = pool.as_ref().is_some_and(|pool| pool.cast(job).is_ok());
            if !sent {
                warn!(run_id = %live.run.run_id, "tool pool unreachable");
            }
        }
    }

    /// The work item of call `index` of the current turn.
    pub(super) fn work_item(&self, live: &Live, index: usize) -> WorkItem {
        let (turn, call) = match &live.phase {
            Phase::Tools(tools) | Phase::WaitingInput(tools) => (tools.turn, tools.calls[index].clone()),
            _ => (live.run.turn, ToolCall { call_id: String::new(), name: String::new(), args: Value::Null }),
        };
        live.work(turn, index, call, live.cancel.child_token())
    }

    /// Whether the call names a tool this agent may not use (one it was not
    /// offered). Unknown tools go on to be reported as unknown.
    pub(super) fn forbidden(&self, live: &Live, name: &str) -> bool {
        if live.agent.without_builtins.iter().any(|tool| tool == name) {
            return true;
        }
        let known = self.shared.pool.registry.get(name).is_some()
            || BuiltinTool::from_name(name).is_some_and(BuiltinTool::opt_in);
        known && !live.agent.tools.iter().any(|tool| tool == name)
    }

    /// Records a call as `started` with its start events.
    pub(super) fn mark_started(&self, live: &mut Live, work: &WorkItem) {
        let call = &work.call;
        let summary = match self.shared.pool.registry.get(&call.name) {
            Some(registered) => crate::tool::describe_start(registered.tool.as_ref(), &call.args),
            None => format!("Calling {}", call.name),
        };
        self.emit_call_start(live, work.turn, call, summary);
        live.outbox.write(StoreWrite::ToolExecution(started_record(&self.shared, work)));
    }

    /// The `tool_call_start` and `reasoning_step` events of a call.
    pub(super) fn emit_call_start(&self, live: &mut Live, turn: u32, call: &ToolCall, summary: String) {
        let start = EventKind::ToolCallStart {
            turn,
            call_id: call.call_id.clone(),
            tool: call.name.clone(),
            args: call.args.clone(),
        };
        live.outbox.emit(start);
        live.outbox.emit(EventKind::ReasoningStep { turn, summary });
    }
}
