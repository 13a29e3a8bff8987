//! Session: one per run, the turn loop. Each turn builds the prompt, calls the
//! model, runs the requested tool calls through the pool, and asks the reviewer,
//! always, from [`Session::request_review`] — the one place that does. The session
//! never waits on a model or a tool in its handler: the model call runs in an
//! offloaded task and tool calls run in the pool; both report back as messages.
//!
//! Its state is a cache of the store. Commit points: the model's reply (with the
//! `started` state of the calls it asks for) commits before any call runs; tool
//! results commit as they arrive while other calls of the turn still run; the
//! review and `turn_end` commit with the next turn's start (or the run's end).
//! What ends a turn (its last results, or a reply without calls) commits before
//! the review is asked if the review takes a model call, and with the review if
//! it is the rule-based one, which the reviewer computes in microseconds
//! ([`review_is_instant`]). A session restarted after a crash rebuilds itself
//! from the store (see `resume.rs`). Events are published only after their commit.

mod prompt;
mod resume;
mod sub_runs;

use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use futures::StreamExt;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span, info, info_span, warn};

use crate::approvals::{self, RunLabels, ToolTraits};
use crate::config::{AgentConfig, ReviewerKind};
use crate::hooks::RunLedger;
use crate::llm::{Message, ModelChunk, ModelClient, ModelDelta, ModelError, ModelReply, Role};
use crate::metrics;
use crate::planner::{Planner, PlannerMsg, TODO_WRITE};
use crate::protocol::{
    CallStatus, EventKind, Limits, Plan, Recommendation, Review, RunEvent, RunId, RunStatus, SkipReason, ToolCall,
    ToolExecutionRecord, ToolOutcome, Usage,
};
use crate::reviewer::{CallSummary, ReviewInput, ReviewReply, ReviewerMsg};
use crate::runtime::{InputError, RunInput, RuntimeShared};
use crate::store::{Commit, RunRecord, RunSnapshot, StoreError, StoreWrite, StoredMessage};
use crate::supervisor::SupervisorMsg;
use crate::tool_pool::{ToolJob, ToolPoolMsg, ToolReply, ToolResult, WorkItem, book};

pub use prompt::{ASK_USER, ask_user_definition, resolve_citations};
pub use sub_runs::{LIST_AGENTS, RUN_AGENT};

/// Messages a session takes.
pub enum SessionMsg {
    /// Load the run from the store and carry on from its last commit (sent to itself).
    Load,
    /// Streamed pieces of the model's reply wait in the inbox; every piece there
    /// is taken at once.
    ModelDeltas {
        /// The turn they belong to.
        turn: u32,
        /// Where the model call leaves them.
        inbox: Arc<DeltaInbox>,
    },
    /// The model call ended.
    ModelDone {
        /// The turn.
        turn: u32,
        /// The reply or the error.
        result: Result<ModelReply, ModelError>,
        /// Wall time of the call.
        elapsed: std::time::Duration,
    },
    /// A tool call ended.
    ToolDone(Box<ToolResult>),
    /// Calls run by the tool pool ended: their results wait in the inbox, and
    /// every result there is taken at once.
    ToolResults(Arc<ToolInbox>),
    /// A sub-run ended having spent `usage`; the caller's budget pays for it.
    SubRunSpent {
        /// What the sub-run spent.
        usage: Usage,
    },
    /// The reviewer's verdict on a turn.
    Reviewed {
        /// The turn.
        turn: u32,
        /// The verdict.
        review: Review,
    },
    /// The user's answer to an `ask_user` question, or a decision on a call
    /// waiting for approval.
    Input {
        /// What the client sent.
        input: RunInput,
        /// Accepted, or why not.
        reply: RpcReplyPort<Result<(), InputError>>,
    },
    /// Stop the run now.
    Cancel {
        /// Called once the cancel is committed.
        reply: RpcReplyPort<()>,
    },
}

/// A session; read-only.
pub struct Session {
    /// What every session shares.
    pub shared: Arc<RuntimeShared>,
}

/// Arguments of a session.
pub struct SessionArgs {
    /// The run to drive.
    pub run_id: RunId,
    /// The run as it was just created; `None`: loaded from the store.
    pub created: Option<Box<RunSnapshot>>,
}

/// A session's state. `live` is `None` until the run is loaded from the store.
pub struct SessionState {
    run_id: RunId,
    span: Span,
    /// The run as created, until `Load` takes it (a restarted session has none).
    created: Option<Box<RunSnapshot>>,
    live: Option<Live>,
}

/// The loaded run.
struct Live {
    run: RunRecord,
    agent: Arc<AgentConfig>,
    model: Arc<dyn ModelClient>,
    /// Spawned on the run's first plan write (or at load, for a run that has a
    /// plan): a run that never plans costs no planner actor.
    planner: Option<ActorRef<PlannerMsg>>,
    /// The last committed plan; the planner is rebuilt from it if it crashes.
    plan: Plan,
    /// The conversation after the system prompt: the request first.
    conversation: Vec<Message>,
    ledger: Arc<RunLedger>,
    outbox: Outbox,
    phase: Phase,
    cancel: CancellationToken,
    /// Cancels `cancel` when the state is dropped, also when the session crashes:
    /// the calls of a dead session stop instead of running on unobserved.
    _cancel_on_drop: tokio_util::sync::DropGuard,
    /// The offloaded model call; dropping it (also when the session is killed)
    /// aborts the call.
    model_task: Option<AbortOnDrop>,
    /// Final answers sent back by `gather_more` reviews so far.
    reflections: u32,
    /// What the run's tools said about it (classification, confidence), for the
    /// approval policy.
    labels: RunLabels,
    /// How deep this run is among sub-runs (0: started by a client).
    depth: u32,
    turn_clock: Instant,
}

/// Where the turn loop stands.
enum Phase {
    Idle,
    Model { turn: u32, synthesis: bool },
    // Boxed: a run spends most of its life waiting on the model, and a session
    // should not carry a tool turn's room while it does.
    Tools(Box<ToolTurn>),
    WaitingInput(Box<ToolTurn>),
    Review { turn: u32, final_answer: Option<String>, synthesis: bool },
    Finished,
}

/// The tool calls of one turn.
struct ToolTurn {
    turn: u32,
    calls: Vec<ToolCall>,
    results: Vec<Option<CallSummary>>,
    /// The next call to dispatch.
    next: usize,
    in_flight: usize,
    /// The turn's `ask_user` call, answered by `Input`.
    ask: Option<usize>,
    /// Calls waiting for a human's approval.
    awaiting: Vec<usize>,
    /// Calls approved and not yet dispatched.
    approved: Vec<usize>,
    /// Tool result messages by call index. They join the conversation in call
    /// order once the turn's calls are all answered, whatever order they finished
    /// in, so a resumed run sees the same conversation as an uninterrupted one.
    messages: Vec<Option<Message>>,
    /// Where the pool leaves the results of the turn's calls.
    inbox: Arc<ToolInbox>,
}

/// Where the tool pool leaves the results of a turn's calls. Only the first
/// result left in an empty inbox wakes the session; results that arrive before
/// the session gets to it wait with it, and the session books them together, in
/// one commit: calls that end at about the same time (parallel calls, a session
/// behind a busy scheduler or a slow commit) cost one write instead of one each.
/// Each result is still committed before the session acts on it.
pub type ToolInbox = Inbox<ToolResult>;

/// Where a model call leaves the pieces of its reply as they stream in; as with
/// [`ToolInbox`], pieces that arrive while the session is busy (committing the
/// earlier ones) are committed together: a reply streamed in many small chunks
/// costs a commit per batch the session takes, not one per chunk.
pub type DeltaInbox = Inbox<ModelDelta>;

/// Items handed to a session from another task. Only the first item left in an
/// empty inbox wakes the session; it takes every item waiting when it gets to it.
pub struct Inbox<T>(std::sync::Mutex<Vec<T>>);

impl<T> Default for Inbox<T> {
    fn default() -> Self {
        Self(std::sync::Mutex::new(Vec::new()))
    }
}

impl<T> Inbox<T> {
    /// Leaves `item`; `true` if the inbox was empty, so the session must be woken.
    fn put(&self, item: T) -> bool {
        let mut items = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        items.push(item);
        items.len() == 1
    }

    /// Takes every item waiting, in the order they arrived.
    fn take(&self) -> Vec<T> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

impl ToolTurn {
    fn new(turn: u32, calls: Vec<ToolCall>) -> Self {
        let results = vec![None; calls.len()];
        let messages = vec![None; calls.len()];
        Self {
            turn,
            calls,
            results,
            next: 0,
            in_flight: 0,
            ask: None,
            awaiting: Vec::new(),
            approved: Vec::new(),
            messages,
            inbox: Arc::default(),
        }
    }
}

/// Events and writes waiting for the next commit.
struct Outbox {
    run_id: RunId,
    parent_run_id: Option<RunId>,
    next_seq: u64,
    events: Vec<RunEvent>,
    writes: Vec<StoreWrite>,
}

impl Outbox {
    fn emit(&mut self, kind: EventKind) {
        let event = RunEvent {
            run_id: self.run_id,
            seq: self.next_seq,
            ts: Utc::now(),
            parent_run_id: self.parent_run_id,
            kind,
        };
        self.next_seq += 1;
        self.events.push(event);
    }

    fn write(&mut self, write: StoreWrite) {
        self.writes.push(write);
    }
}

impl Actor for Session {
    type Msg = SessionMsg;
    type State = SessionState;
    type Arguments = SessionArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<SessionMsg>,
        args: SessionArgs,
    ) -> Result<SessionState, ActorProcessingErr> {
        // Loading is I/O: it happens in the first handler, so spawning a session
        // never makes the supervisor wait on the store.
        myself.cast(SessionMsg::Load)?;
        let span = info_span!("run", run_id = %args.run_id);
        Ok(SessionState { run_id: args.run_id, span, created: args.created, live: None })
    }

    async fn handle(
        &self,
        myself: ActorRef<SessionMsg>,
        message: SessionMsg,
        state: &mut SessionState,
    ) -> Result<(), ActorProcessingErr> {
        let span = state.span.clone();
        // Boxed: the actor's task is sized for the largest state of the future it
        // awaits, and every live session keeps that task while it waits for its
        // next message. Inline, the handlers' futures made it 7.8 KiB; boxed, it
        // is 2.6 KiB, and the handler's future exists only while a message is
        // handled (one allocation per message, no measurable CPU).
        Box::pin(self.dispatch(myself, message, state)).instrument(span).await
    }

    /// A session stopped (not killed, not crashed: then this is not called)
    /// commits what its outbox still holds: between messages that is whole
    /// commits' worth, such as a turn's last results waiting for an instant
    /// review, which a shutdown would otherwise lose.
    async fn post_stop(
        &self,
        _myself: ActorRef<SessionMsg>,
        state: &mut SessionState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(live) = state.live.as_mut()
            && let Err(error) = self.flush(live).await
        {
            warn!(run_id = %state.run_id, %error, "could not commit what the stopped session held");
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<SessionMsg>,
        event: SupervisionEvent,
        state: &mut SessionState,
    ) -> Result<(), ActorProcessingErr> {
        if let (SupervisionEvent::ActorFailed(cell, reason), Some(live)) = (event, state.live.as_mut())
            && live.planner.as_ref().is_some_and(|planner| planner.get_id() == cell.get_id())
        {
            warn!(run_id = %state.run_id, %reason, "planner crashed; restarting it from the last plan");
            self.restart_planner(&myself, live).await?;
        }
        Ok(())
    }
}

impl Session {
    async fn dispatch(
        &self,
        myself: ActorRef<SessionMsg>,
        message: SessionMsg,
        state: &mut SessionState,
    ) -> Result<(), ActorProcessingErr> {
        if let SessionMsg::Load = message {
            return self.load(&myself, state).await;
        }
        let Some(live) = state.live.as_mut() else {
            // Only `Load` can come first: it was cast in `pre_start`.
            return Ok(());
        };
        if matches!(live.phase, Phase::Finished) {
            match message {
                SessionMsg::Cancel { reply } => drop(reply.send(())),
                SessionMsg::Input { reply, .. } => drop(reply.send(Err(InputError::NotWaiting))),
                _ => {}
            }
            return Ok(());
        }
        match message {
            SessionMsg::Load => Ok(()),
            SessionMsg::ModelDeltas { turn, inbox } => self.on_deltas(live, turn, inbox.take()).await,
            SessionMsg::ModelDone { turn, result, elapsed } => {
                self.on_model_done(&myself, live, turn, result, elapsed).await
            }
            SessionMsg::ToolDone(result) => self.on_tools_done(&myself, live, vec![*result]).await,
            SessionMsg::ToolResults(inbox) => self.on_tools_done(&myself, live, inbox.take()).await,
            SessionMsg::SubRunSpent { usage } => {
                let turn = live.run.turn;
                live.run.usage.add(&usage);
                live.outbox.emit(EventKind::TokenUsage { turn, usage, total: live.run.usage });
                live.outbox.write(StoreWrite::Progress { turn, usage: live.run.usage });
                Ok(())
            }
            SessionMsg::Reviewed { turn, review } => self.on_reviewed(&myself, live, turn, review).await,
            SessionMsg::Input { input: RunInput::Text(text), reply } => self.on_input(&myself, live, text, reply).await,
            SessionMsg::Input { input: RunInput::Approval { call_id, approved, reason }, reply } => {
                self.on_approval(&myself, live, call_id, approved, reason, reply).await
            }
            SessionMsg::Cancel { reply } => {
                self.finish(&myself, live, RunStatus::Cancelled, Some("cancelled by the client".to_owned()), None)
                    .await?;
                let _ = reply.send(());
                Ok(())
            }
        }
    }

    /// Commits the outbox, then publishes its events.
    async fn flush(&self, live: &mut Live) -> Result<(), StoreError> {
        if live.outbox.events.is_empty() && live.outbox.writes.is_empty() {
            return Ok(());
        }
        let run_id = live.outbox.run_id;
        let events = std::mem::take(&mut live.outbox.events);
        let writes = std::mem::take(&mut live.outbox.writes);
        let commit = Commit { run_id, writes, events };
        self.shared.store.commit(&commit).await?;
        // Whether anyone listens is decided after the commit: a subscriber that
        // arrived during it has read the store before this commit landed.
        self.shared.hub.publish(run_id, commit.events);
        Ok(())
    }

    /// Starts turn `turn`: budget check, `turn_start`, commit, model call.
    async fn start_turn(
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
        live.outbox.emit(EventKind::TurnStart { turn });
        live.outbox.write(StoreWrite::Progress { turn, usage: live.run.usage });
        self.flush(live).await?;
        self.call_model(myself, live, turn);
        Ok(())
    }

    /// Offloads the model call of `turn`; its deltas and reply come back as messages.
    fn call_model(&self, myself: &ActorRef<SessionMsg>, live: &mut Live, turn: u32) {
        let synthesis = turn > live.run.limits.max_turns;
        let blocked = live.ledger.blocked_tools(turn);
        let tools = prompt::offered_tools(&live.agent, &self.shared.pool.registry, &blocked);
        let system = prompt::system_prompt(&live.agent, &tools, &self.shared.config.tool_docs);
        // A note that no longer holds is replaced, also by one saying the state is empty.
        let note = prompt::state_note(&live.plan, &blocked)
            .or_else(|| prompt::last_note(&live.conversation).map(|_| prompt::EMPTY_STATE_NOTE.to_owned()));
        if let Some(note) = note
            && prompt::last_note(&live.conversation) != Some(note.as_str())
        {
            self.append_message(live, turn, Message::text(Role::System, note));
        }
        let request = prompt::build_request(system, &live.conversation, tools, synthesis, live.run.limits.max_turns);
        let model = live.model.clone();
        let limit = self.shared.config.model_timeout;
        let done = ModelDoneGuard { session: myself.clone(), turn, started: Instant::now(), sent: false };
        let task = tokio::spawn(async move {
            let reply = stream_reply(model.as_ref(), request, &done.session, turn);
            let result = tokio::time::timeout(limit, reply).await.unwrap_or(Err(ModelError::Timeout(limit)));
            done.send(result);
        });
        live.model_task = Some(AbortOnDrop(task.abort_handle()));
        live.phase = Phase::Model { turn, synthesis };
    }

    /// Commits the pieces of the reply that were waiting, adjacent pieces of the
    /// same kind (text, reasoning) joined into one `assistant_delta`.
    async fn on_deltas(&self, live: &mut Live, turn: u32, deltas: Vec<ModelDelta>) -> Result<(), ActorProcessingErr> {
        if !matches!(live.phase, Phase::Model { turn: current, .. } if current == turn) {
            return Ok(());
        }
        for (text, reasoning) in join_deltas(deltas) {
            live.outbox.emit(EventKind::AssistantDelta { turn, text, reasoning });
        }
        self.flush(live).await?;
        Ok(())
    }

    async fn on_model_done(
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
        let model_name = live.model.name().to_owned();
        let reply = match result {
            Ok(reply) => reply,
            Err(error) => {
                metrics::model_request(&model_name, "error", elapsed);
                live.outbox.emit(EventKind::Error { code: error.code().to_owned(), message: error.to_string() });
                return self.finish(myself, live, RunStatus::Failed, Some(format!("model error: {error}")), None).await;
            }
        };
        metrics::model_request(&model_name, "ok", elapsed);
        let usage = reply.usage;
        metrics::model_usage(&model_name, usage.input_tokens, usage.output_tokens, usage.cost_usd);
        live.run.usage.add(&usage);
        live.outbox.emit(EventKind::TokenUsage { turn, usage, total: live.run.usage });
        live.outbox.write(StoreWrite::Progress { turn, usage: live.run.usage });
        for detail in &reply.decode_errors {
            live.outbox.emit(EventKind::DecodeError { turn, detail: detail.clone() });
        }
        // The synthesis turn answers; any tool calls it makes anyway are ignored.
        let calls = if synthesis { Vec::new() } else { unique_call_ids(turn, reply.tool_calls) };
        let message =
            Message { role: Role::Assistant, content: reply.content, tool_calls: calls.clone(), tool_call_id: None };
        self.append_message(live, turn, message.clone());
        if calls.is_empty() {
            return self.request_review(myself, live, turn, Some(message.content), synthesis).await;
        }
        live.outbox.emit(EventKind::ToolRequests { turn, calls: calls.clone() });
        live.phase = Phase::Tools(Box::new(ToolTurn::new(turn, calls)));
        self.advance_tools(myself, live).await
    }

    fn append_message(&self, live: &mut Live, turn: u32, message: Message) {
        live.outbox.write(StoreWrite::Message(StoredMessage { turn, message: message.clone() }));
        live.conversation.push(message);
    }

    /// Dispatches calls while parallel slots are free: built-ins inline, the rest to
    /// the pool. The `started` records commit before any call is sent.
    async fn advance_tools(&self, myself: &ActorRef<SessionMsg>, live: &mut Live) -> Result<(), ActorProcessingErr> {
        let max_parallel = live.run.limits.max_parallel_tools.max(1);
        let mut jobs = Vec::new();
        let mut sub_run_calls: Vec<WorkItem> = Vec::new();
        // Calls a human just approved go first.
        while let Some(tools) = tools_mut(live)
            && tools.in_flight < max_parallel
            && !tools.approved.is_empty()
        {
            let index = tools.approved.remove(0);
            self.dispatch_call(live, index, &mut jobs, &mut sub_run_calls);
        }
        loop {
            let Some(tools) = tools_mut(live) else {
                return Ok(());
            };
            if tools.next >= tools.calls.len() || tools.in_flight >= max_parallel {
                break;
            }
            let index = tools.next;
            tools.next += 1;
            if tools.results[index].is_some() {
                // Answered before a crash; resumed turns skip it.
                continue;
            }
            let (turn, ask, call) = (tools.turn, tools.ask, tools.calls[index].clone());
            if self.forbidden(live, &call.name) {
                // The model was never offered it: an agent calls only its own tools.
                let detail = format!("{} is not one of this agent's tools", call.name);
                let outcome = ToolOutcome::skipped(SkipReason::Denied, detail);
                let result = self.builtin_result(live, turn, index, call, outcome, Utc::now(), 0);
                self.record_result(live, result);
                continue;
            }
            match call.name.as_str() {
                sub_runs::LIST_AGENTS => {
                    self.emit_call_start(live, turn, &call, "Listing the agents".to_owned());
                    let outcome = sub_runs::list_agents(&self.shared);
                    let result = self.builtin_result(live, turn, index, call, outcome, Utc::now(), 0);
                    self.record_result(live, result);
                }
                TODO_WRITE => {
                    self.emit_call_start(live, turn, &call, "Updating the plan".to_owned());
                    let result = self.todo_write(myself, live, turn, index, call).await?;
                    self.record_result(live, result);
                }
                ASK_USER => {
                    let question = prompt::ask_user_question(&call.args);
                    let summary = format!("Asking the user: {}", question.as_deref().unwrap_or("(no question)"));
                    self.emit_call_start(live, turn, &call, summary);
                    let outcome = match (question, ask) {
                        (Some(_), None) => {
                            if let Some(tools) = tools_mut(live) {
                                tools.ask = Some(index);
                            }
                            continue;
                        }
                        (None, _) => ToolOutcome::skipped(
                            SkipReason::InvalidArgs,
                            "ask_user needs a non-empty \"question\" string",
                        ),
                        (Some(_), Some(_)) => {
                            ToolOutcome::skipped(SkipReason::Denied, "only one ask_user call per turn")
                        }
                    };
                    let result = self.builtin_result(live, turn, index, call, outcome, Utc::now(), 0);
                    self.record_result(live, result);
                }
                _ => {
                    if let Some(reason) = self.approval_reason(live, &call) {
                        self.request_approval(live, turn, index, &call, reason);
                        continue;
                    }
                    self.dispatch_call(live, index, &mut jobs, &mut sub_run_calls);
                }
            }
        }
        // The `started` records of the calls about to run commit before any is
        // sent, and results booked while other calls still run commit now. Once
        // every call has ended, `maybe_end_tools` commits the turn: as it parks,
        // or through `request_review`.
        let settled = jobs.is_empty()
            && sub_run_calls.is_empty()
            && matches!(&live.phase, Phase::Tools(tools) if tools.next >= tools.calls.len() && tools.in_flight == 0);
        if !settled {
            self.flush(live).await?;
        }
        // Their `started` records are committed: the sub-runs may be created.
        let mut refused = false;
        for work in sub_run_calls {
            if let Some(outcome) = self.start_sub_run(myself, live, work.clone()).await? {
                let summary = format!("run_agent failed ({})", outcome.to_model_text());
                let result = book(&self.shared.pool, &work, outcome, Utc::now(), Default::default(), 0.0, summary);
                if let Some(tools) = tools_mut(live) {
                    tools.in_flight = tools.in_flight.saturating_sub(1);
                }
                self.record_result(live, result);
                refused = true;
            }
        }
        if refused {
            self.flush(live).await?;
        }
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
        self.maybe_end_tools(myself, live).await
    }

    /// Counts call `index` in flight, records it `started`, and queues it: a
    /// sub-run is started by the session once `started` is committed; every other
    /// call goes to the pool.
    fn dispatch_call(
        &self,
        live: &mut Live,
        index: usize,
        jobs: &mut Vec<WorkItem>,
        sub_run_calls: &mut Vec<WorkItem>,
    ) {
        if let Some(tools) = tools_mut(live) {
            tools.in_flight += 1;
        }
        let work = self.work_item(live, index);
        self.mark_started(live, &work);
        if work.call.name == sub_runs::RUN_AGENT { sub_run_calls.push(work) } else { jobs.push(work) }
    }

    /// The work item of call `index` of the current turn.
    fn work_item(&self, live: &Live, index: usize) -> WorkItem {
        let (turn, call) = match &live.phase {
            Phase::Tools(tools) | Phase::WaitingInput(tools) => (tools.turn, tools.calls[index].clone()),
            _ => (live.run.turn, ToolCall { call_id: String::new(), name: String::new(), args: Value::Null }),
        };
        WorkItem {
            run_id: live.run.run_id,
            turn,
            index,
            call,
            ledger: live.ledger.clone(),
            cancel: live.cancel.child_token(),
        }
    }

    /// Why `call` must wait for a human, if it must. `run_agent` counts as a call
    /// with side effects: what the sub-run does is what the caller does.
    fn approval_reason(&self, live: &Live, call: &ToolCall) -> Option<String> {
        let traits = match self.shared.pool.registry.get(&call.name) {
            Some(registered) => ToolTraits {
                idempotent: registered.tool.idempotent(),
                requires_approval: registered.tool.requires_approval(),
            },
            None if call.name == sub_runs::RUN_AGENT => ToolTraits { idempotent: false, requires_approval: false },
            None => return None,
        };
        // Arguments a model double-encoded are judged as the tool will see them.
        let parsed = match &call.args {
            Value::String(text) => serde_json::from_str::<Value>(text).ok(),
            _ => None,
        };
        let args = parsed.as_ref().unwrap_or(&call.args);
        approvals::reason(&self.shared.config.approvals, &call.name, &traits, args, &live.labels)
    }

    /// Parks call `index` until a human decides on it.
    fn request_approval(&self, live: &mut Live, turn: u32, index: usize, call: &ToolCall, reason: String) {
        live.outbox.emit(EventKind::ApprovalRequested {
            turn,
            call_id: call.call_id.clone(),
            tool: call.name.clone(),
            args: call.args.clone(),
            reason,
        });
        if let Some(tools) = tools_mut(live) {
            tools.awaiting.push(index);
        }
    }

    /// Whether the call names a tool this agent may not use (one it was not
    /// offered). Unknown tools go on to be reported as unknown.
    fn forbidden(&self, live: &Live, name: &str) -> bool {
        let known = self.shared.pool.registry.get(name).is_some()
            || name == sub_runs::RUN_AGENT
            || name == sub_runs::LIST_AGENTS;
        known && !live.agent.tools.iter().any(|tool| tool == name)
    }

    /// Records a call as `started` with its start events.
    fn mark_started(&self, live: &mut Live, work: &WorkItem) {
        let call = &work.call;
        let summary = match self.shared.pool.registry.get(&call.name) {
            Some(registered) => crate::tool::describe_start(registered.tool.as_ref(), &call.args),
            None => format!("Calling {}", call.name),
        };
        self.emit_call_start(live, work.turn, call, summary);
        live.outbox.write(StoreWrite::ToolExecution(started_record(work)));
    }

    /// The `tool_call_start` and `reasoning_step` events of a call.
    fn emit_call_start(&self, live: &mut Live, turn: u32, call: &ToolCall, summary: String) {
        let start = EventKind::ToolCallStart {
            turn,
            call_id: call.call_id.clone(),
            tool: call.name.clone(),
            args: call.args.clone(),
        };
        live.outbox.emit(start);
        live.outbox.emit(EventKind::ReasoningStep { turn, summary });
    }

    /// After the last call of a turn: park for `ask_user`, or ask for the review.
    async fn maybe_end_tools(&self, myself: &ActorRef<SessionMsg>, live: &mut Live) -> Result<(), ActorProcessingErr> {
        let Phase::Tools(tools) = &live.phase else {
            return Ok(());
        };
        if tools.next < tools.calls.len() || tools.in_flight > 0 {
            return Ok(());
        }
        let question = tools.ask.filter(|ask| tools.results[*ask].is_none());
        if question.is_some() || !tools.awaiting.is_empty() {
            let prompt = match question {
                Some(ask) => prompt::ask_user_question(&tools.calls[ask].args).unwrap_or_default(),
                None => {
                    let waiting: Vec<String> = tools
                        .awaiting
                        .iter()
                        .map(|index| format!("{} ({})", tools.calls[*index].name, tools.calls[*index].call_id))
                        .collect();
                    format!("approve or reject: {}", waiting.join(", "))
                }
            };
            live.outbox.emit(EventKind::WaitingInput { prompt });
            live.outbox.write(StoreWrite::Status { status: RunStatus::WaitingInput, reason: None });
            live.run.status = RunStatus::WaitingInput;
            // A run waiting for a human holds no admission slot: a parked run must
            // not keep other runs out. Input gives it one again.
            if let Some(supervisor) = myself.try_get_supervisor() {
                let _ = ActorRef::<SupervisorMsg>::from(supervisor)
                    .cast(SupervisorMsg::ReleaseSlot { run_id: live.run.run_id });
            }
            if let Phase::Tools(tools) = std::mem::replace(&mut live.phase, Phase::Idle) {
                live.phase = Phase::WaitingInput(tools);
            }
            self.flush(live).await?;
            return Ok(());
        }
        let turn = tools.turn;
        let messages: Vec<Message> = tools.messages.iter().flatten().cloned().collect();
        live.conversation.extend(messages);
        self.request_review(myself, live, turn, None, false).await
    }

    /// Books the results of calls that ended (those of another turn, or of a call
    /// already answered, are dropped), then carries the turn on: the results are
    /// committed together, with the `started` records of any calls dispatched next.
    async fn on_tools_done(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        results: Vec<ToolResult>,
    ) -> Result<(), ActorProcessingErr> {
        let mut booked = false;
        for result in results {
            let Phase::Tools(tools) = &mut live.phase else {
                return Ok(());
            };
            if tools.turn != result.turn || tools.results.get(result.index).is_none_or(Option::is_some) {
                continue;
            }
            tools.in_flight = tools.in_flight.saturating_sub(1);
            self.record_result(live, result);
            booked = true;
        }
        if !booked {
            return Ok(());
        }
        self.advance_tools(myself, live).await
    }

    /// Books a finished call: its events, record, message and documents.
    fn record_result(&self, live: &mut Live, result: ToolResult) {
        let ToolResult { turn, index, call, outcome, record, newly_blocked, new_documents, summary } = result;
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
        let message = Message::tool_result(call.call_id.clone(), outcome.to_model_text());
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

    /// Answers `todo_write` through the planner.
    async fn todo_write(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        turn: u32,
        index: usize,
        call: ToolCall,
    ) -> Result<ToolResult, ActorProcessingErr> {
        let started_at = Utc::now();
        let clock = Instant::now();
        let args = call.args.clone();
        let planner = self.planner(myself, live).await?;
        let reply = ractor::call!(planner, |reply| PlannerMsg::Write { args, reply });
        let outcome = match reply {
            Ok(Ok(plan)) => {
                live.plan = plan.clone();
                live.outbox.write(StoreWrite::Plan(plan.clone()));
                live.outbox.emit(EventKind::PlanUpdated { plan: plan.clone() });
                ToolOutcome::Ok { value: Value::String(crate::planner::render(&plan)), fragments: Vec::new() }
            }
            Ok(Err(error)) => ToolOutcome::failed("invalid_plan", error.to_string()),
            Err(error) => {
                warn!(run_id = %live.run.run_id, %error, "planner unreachable; restarting it");
                self.restart_planner(myself, live).await?;
                ToolOutcome::failed("planner_unavailable", "the planner restarted; write the list again")
            }
        };
        let elapsed = clock.elapsed().as_millis() as u64;
        Ok(self.builtin_result(live, turn, index, call, outcome, started_at, elapsed))
    }

    /// The result of a call the session answered itself.
    #[allow(clippy::too_many_arguments)]
    fn builtin_result(
        &self,
        live: &Live,
        turn: u32,
        index: usize,
        call: ToolCall,
        outcome: ToolOutcome,
        started_at: chrono::DateTime<Utc>,
        duration_ms: u64,
    ) -> ToolResult {
        let summary = match (&outcome, call.name.as_str()) {
            (ToolOutcome::Ok { .. }, TODO_WRITE) => {
                format!("Updated the plan (version {})", live.plan.version)
            }
            (ToolOutcome::Ok { .. }, _) => "Received the user's answer".to_owned(),
            (_, name) => format!("{name} was rejected"),
        };
        let status = outcome.status();
        let error = match &outcome {
            ToolOutcome::Failed { code, .. } => Some(code.clone()),
            ToolOutcome::Skipped { reason, .. } => Some(reason.as_str().to_owned()),
            _ => None,
        };
        let record = ToolExecutionRecord {
            run: live.run.run_id,
            turn,
            call_id: call.call_id.clone(),
            tool: call.name.clone(),
            args: call.args.clone(),
            started_at,
            duration_ms,
            cost_usd: 0.0,
            result_summary: outcome.to_model_text().chars().take(200).collect(),
            fragments_added: 0,
            status,
            error,
        };
        ToolResult { turn, index, call, outcome, record, newly_blocked: false, new_documents: Vec::new(), summary }
    }

    async fn restart_planner(&self, myself: &ActorRef<SessionMsg>, live: &mut Live) -> Result<(), ActorProcessingErr> {
        metrics::actor_restarted("planner");
        live.planner = None;
        self.planner(myself, live).await.map(drop)
    }

    /// The run's planner, spawned from the last committed plan if it has none.
    async fn planner(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
    ) -> Result<ActorRef<PlannerMsg>, ActorProcessingErr> {
        if let Some(planner) = &live.planner {
            return Ok(planner.clone());
        }
        let planner = Planner { config: self.shared.config.planner.clone() };
        let (planner, _) = Actor::spawn_linked(None, planner, live.plan.clone(), myself.get_cell()).await?;
        live.planner = Some(planner.clone());
        Ok(planner)
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
        let result = self.builtin_result(live, turn, ask, call, outcome, Utc::now(), 0);
        self.record_result(live, result);
        self.flush(live).await?;
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
        call_id: Option<String>,
        approved: bool,
        reason: Option<String>,
        reply: RpcReplyPort<Result<(), InputError>>,
    ) -> Result<(), ActorProcessingErr> {
        let Some(tools) = tools_mut(live).filter(|tools| !tools.awaiting.is_empty()) else {
            self.refuse_parked(myself, live, reply, InputError::NotWaiting);
            return Ok(());
        };
        let position = match &call_id {
            Some(id) => tools.awaiting.iter().position(|index| &tools.calls[*index].call_id == id),
            None if tools.awaiting.len() == 1 => Some(0),
            None => {
                let ids: Vec<&str> = tools.awaiting.iter().map(|index| tools.calls[*index].call_id.as_str()).collect();
                let message = format!("several calls wait for approval; name one with call_id: {}", ids.join(", "));
                self.refuse_parked(myself, live, reply, InputError::Invalid(message));
                return Ok(());
            }
        };
        let Some(position) = position else {
            let error = InputError::Invalid("no call with that call_id waits for approval".to_owned());
            self.refuse_parked(myself, live, reply, error);
            return Ok(());
        };
        let index = tools.awaiting.remove(position);
        let (turn, call) = (tools.turn, tools.calls[index].clone());
        if approved {
            tools.approved.push(index);
        }
        if let Phase::WaitingInput(tools) = std::mem::replace(&mut live.phase, Phase::Idle) {
            live.phase = Phase::Tools(tools);
        }
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
            let result = self.builtin_result(live, turn, index, call, outcome, Utc::now(), 0);
            self.record_result(live, result);
        }
        // The decision commits with what it lets run (the `started` record); the
        // client hears back once it is durable, also when it ends the turn (whose
        // commit would otherwise wait for an instant review).
        self.advance_tools(myself, live).await?;
        self.flush(live).await?;
        let _ = reply.send(Ok(()));
        Ok(())
    }

    /// Refuses an input. A parked run stays parked, and gives up the slot the
    /// input took for it (an input to a run that is not parked took none).
    fn refuse_parked(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &Live,
        reply: RpcReplyPort<Result<(), InputError>>,
        error: InputError,
    ) {
        if matches!(live.phase, Phase::WaitingInput(_))
            && let Some(supervisor) = myself.try_get_supervisor()
        {
            let _ = ActorRef::<SupervisorMsg>::from(supervisor)
                .cast(SupervisorMsg::ReleaseSlot { run_id: live.run.run_id });
        }
        let _ = reply.send(Err(error));
    }

    /// Asks the reviewer about `turn`. Every turn of every run passes here exactly
    /// once; the verdict comes back as `Reviewed`.
    async fn request_review(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        turn: u32,
        final_answer: Option<String>,
        synthesis: bool,
    ) -> Result<(), ActorProcessingErr> {
        // What ended the turn commits before a review that takes a model call, and
        // with an instant one (in `on_reviewed`, with the next turn's start or the
        // run's end): nothing acts on it in between but the reviewer.
        if !review_is_instant(live) {
            self.flush(live).await?;
        }
        let calls = match &live.phase {
            Phase::Tools(tools) => tools.results.iter().flatten().cloned().collect(),
            _ => Vec::new(),
        };
        let input = Arc::new(ReviewInput {
            turn,
            request: live.run.input.clone(),
            plan: live.plan.clone(),
            calls,
            final_answer: final_answer.clone(),
            blocked_tools: live.ledger.blocked_tools(turn + 1),
            synthesis,
        });
        live.phase = Phase::Review { turn, final_answer, synthesis };
        let session = myself.clone();
        let reply = ReviewReply::new(input.clone(), move |review| {
            let _ = session.cast(SessionMsg::Reviewed { turn, review });
        });
        let message = ReviewerMsg::Review {
            kind: live.agent.reviewer.clone(),
            agent_model: live.agent.model.clone(),
            input,
            reply,
        };
        // If the reviewer is down, the message (and its reply) is dropped right here,
        // and the reply's drop sends the degraded rule-based review.
        let sent = self.shared.handles.reviewer().is_some_and(|reviewer| reviewer.cast(message).is_ok());
        if !sent {
            warn!(run_id = %live.run.run_id, "reviewer unreachable; using the rules");
        }
        Ok(())
    }

    async fn on_reviewed(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        turn: u32,
        review: Review,
    ) -> Result<(), ActorProcessingErr> {
        let Phase::Review { turn: current, final_answer, synthesis } = std::mem::replace(&mut live.phase, Phase::Idle)
        else {
            return Ok(());
        };
        if current != turn {
            live.phase = Phase::Review { turn: current, final_answer, synthesis };
            return Ok(());
        }
        metrics::review(
            review.recommendation.as_str(),
            review.status == crate::protocol::ReviewStatus::Degraded,
            review.quality_score,
            review.completeness,
            review.relevance,
        );
        if let (Recommendation::Replan, Some(items)) = (review.recommendation, review.updated_plan.clone()) {
            let planner = self.planner(myself, live).await?;
            match ractor::call!(planner, |reply| PlannerMsg::Replace { items, reply }) {
                Ok(Ok(plan)) => {
                    live.plan = plan.clone();
                    live.outbox.write(StoreWrite::Plan(plan.clone()));
                    live.outbox.emit(EventKind::PlanUpdated { plan });
                }
                Ok(Err(error)) => {
                    warn!(run_id = %live.run.run_id, %error, "reviewer's plan rejected")
                }
                Err(error) => warn!(run_id = %live.run.run_id, %error, "planner unreachable"),
            }
        }
        live.outbox.emit(EventKind::Review { turn, review: Box::new(review.clone()) });
        live.outbox.write(StoreWrite::Review { turn, review: review.clone() });
        self.append_message(live, turn, prompt::review_message(turn, &review));
        live.outbox.emit(EventKind::TurnEnd { turn });
        metrics::turn_finished(live.turn_clock.elapsed());
        self.next_step(myself, live, turn, final_answer, synthesis, review.recommendation).await
    }

    /// After a reviewed turn: answer, continue, or force the synthesis turn.
    async fn next_step(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        turn: u32,
        final_answer: Option<String>,
        synthesis: bool,
        recommendation: Recommendation,
    ) -> Result<(), ActorProcessingErr> {
        let max_turns = live.run.limits.max_turns;
        match final_answer {
            Some(answer) => {
                let reflect = !synthesis
                    && recommendation == Recommendation::GatherMore
                    && live.reflections < self.shared.config.max_reflections
                    && turn < max_turns;
                if reflect {
                    live.reflections += 1;
                    self.start_turn(myself, live, turn + 1).await
                } else {
                    self.finish(myself, live, RunStatus::Succeeded, None, Some(answer)).await
                }
            }
            // A tool turn at the limit is followed by the synthesis turn (max_turns + 1).
            None => self.start_turn(myself, live, turn + 1).await,
        }
    }

    /// Ends the run: final output, `run_end`, status; then stops the session.
    async fn finish(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        status: RunStatus,
        reason: Option<String>,
        answer: Option<String>,
    ) -> Result<(), ActorProcessingErr> {
        live.model_task = None;
        live.cancel.cancel();
        if let Phase::Tools(tools) | Phase::WaitingInput(tools) = &live.phase {
            // Calls still running are cut off by the cancel; record them as interrupted.
            for index in 0..tools.next.min(tools.calls.len()) {
                let call = &tools.calls[index];
                if tools.results[index].is_none() && !prompt::is_builtin(&call.name) {
                    let mut record = started_record(&WorkItem {
                        run_id: live.run.run_id,
                        turn: tools.turn,
                        index,
                        call: call.clone(),
                        ledger: live.ledger.clone(),
                        cancel: live.cancel.clone(),
                    });
                    record.status = CallStatus::Interrupted;
                    record.error = Some("interrupted".to_owned());
                    live.outbox.writes.push(StoreWrite::ToolExecution(record));
                }
            }
        }
        if let Some(text) = answer {
            let citations = resolve_citations(&text, &live.ledger.documents());
            live.outbox.write(StoreWrite::FinalOutput(text.clone()));
            live.outbox.emit(EventKind::FinalOutput { text, citations });
        }
        live.outbox.emit(EventKind::RunEnd { status, reason: reason.clone() });
        live.outbox.write(StoreWrite::Status { status, reason: reason.clone() });
        live.run.status = status;
        live.phase = Phase::Finished;
        self.flush(live).await?;
        self.shared.hub.close(live.run.run_id);
        metrics::run_finished(&live.agent.name, status.as_str());
        info!(run_id = %live.run.run_id, status = status.as_str(), reason = reason.as_deref().unwrap_or(""), "run finished");
        // Stopping the session also stops its planner (a linked child).
        myself.stop(None);
        Ok(())
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

/// Aborts an offloaded task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Whether the run's review is the rule-based one: the reviewer computes it in
/// microseconds, in this process, so what ends a turn can wait for it and commit
/// with it (one commit a turn fewer). A model-backed review takes a model call;
/// the turn commits before it is asked.
fn review_is_instant(live: &Live) -> bool {
    matches!(live.agent.reviewer, ReviewerKind::RuleBased)
}

/// The tool calls of the current turn, while it has them.
fn tools_mut(live: &mut Live) -> Option<&mut ToolTurn> {
    match &mut live.phase {
        Phase::Tools(tools) | Phase::WaitingInput(tools) => Some(tools),
        _ => None,
    }
}

/// The record of a call committed as `started` before it runs.
fn started_record(work: &WorkItem) -> ToolExecutionRecord {
    ToolExecutionRecord {
        run: work.run_id,
        turn: work.turn,
        call_id: work.call.call_id.clone(),
        tool: work.call.name.clone(),
        args: work.call.args.clone(),
        started_at: Utc::now(),
        duration_ms: 0,
        cost_usd: 0.0,
        result_summary: String::new(),
        fragments_added: 0,
        status: CallStatus::Started,
        error: None,
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

/// Why the run may not call the model again, if it may not.
pub(crate) fn over_budget(limits: &Limits, usage: &Usage) -> Option<String> {
    if let Some(max) = limits.max_tokens
        && usage.total_tokens() >= max
    {
        return Some(format!("the token budget of {max} is spent ({} used)", usage.total_tokens()));
    }
    if let Some(max) = limits.max_cost_usd
        && usage.cost_usd >= max
    {
        return Some(format!("the cost budget of ${max:.4} is spent (${:.4} used)", usage.cost_usd));
    }
    None
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
