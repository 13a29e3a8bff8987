//! What a session holds: its state ([`SessionState`], the loaded run in `Live`),
//! where its turn loop stands (`Phase`, the calls of a tool turn in `ToolTurn`),
//! and the inboxes other tasks leave its model deltas and tool results in.

use std::sync::Arc;
use std::time::Instant;

use ractor::ActorRef;
use tokio_util::sync::CancellationToken;
use tracing::Span;

use crate::approvals::RunLabels;
use crate::config::AgentConfig;
use crate::hooks::RunLedger;
use crate::llm::{Message, ModelClient, ModelDelta};
use crate::planner::PlannerMsg;
use crate::protocol::{EventKind, Plan, RunId, ToolCall, Usage};
use crate::reviewer::CallSummary;
use crate::session::outbox::Outbox;
use crate::store::{RunRecord, RunSnapshot, StoreWrite, StoredMessage};
use crate::tool_pool::{ToolResult, WorkItem};

/// A session's state. `live` is `None` until the run is loaded from the store.
pub struct SessionState {
    pub(super) run_id: RunId,
    /// The run's span, once `Load` has read the run (see `open_span`).
    pub(super) span: Span,
    /// The run as created (or, once `Load` has begun, as read), until `Load`
    /// takes it.
    pub(super) created: Option<Box<RunSnapshot>>,
    /// The session resumes a run from the store (a restart, a queued run).
    pub(super) resumed: bool,
    pub(super) live: Option<Live>,
}

/// The loaded run.
pub(super) struct Live {
    pub(super) run: RunRecord,
    pub(super) agent: Arc<AgentConfig>,
    pub(super) model: Arc<dyn ModelClient>,
    /// Spawned on the run's first plan write (or at load, for a run that has a
    /// plan): a run that never plans costs no planner actor.
    pub(super) planner: Option<ActorRef<PlannerMsg>>,
    /// The last committed plan; the planner is rebuilt from it if it crashes.
    pub(super) plan: Plan,
    /// What was said in the thread before this run (empty for a run of no
    /// thread): read once when the session loads the run, unchanged while it
    /// runs (its thread starts no other run meanwhile).
    pub(super) history: Vec<Message>,
    /// The run's own conversation: the request first.
    pub(super) conversation: Vec<Message>,
    pub(super) ledger: Arc<RunLedger>,
    pub(super) outbox: Outbox,
    pub(super) phase: Phase,
    pub(super) cancel: CancellationToken,
    /// Cancels `cancel` when the state is dropped, also when the session crashes:
    /// the calls of a dead session stop instead of running on unobserved.
    pub(super) _cancel_on_drop: tokio_util::sync::DropGuard,
    /// The offloaded model call; dropping it (also when the session is killed)
    /// aborts the call.
    pub(super) model_task: Option<AbortOnDrop>,
    /// Final answers sent back by `gather_more` reviews so far.
    pub(super) reflections: u32,
    /// What the run's tools said about it (classification, confidence), for the
    /// approval policy.
    pub(super) labels: RunLabels,
    /// How deep this run is among sub-runs (0: started by a client).
    pub(super) depth: u32,
    pub(super) turn_clock: Instant,
    /// The runtime shuts down: nothing new starts (see `SessionMsg::Drain`).
    pub(super) draining: bool,
    /// The sub-run this run waits on (it parked for a human), if any.
    pub(super) waiting_on: Option<RunId>,
    /// Since when the model provider has failed in a row, and how many times.
    pub(super) outage: Option<(tokio::time::Instant, u32)>,
    /// A question a `clarify_query` review has the next turn ask the user.
    pub(super) clarify: Option<String>,
    /// The agent step the current turn takes, for its trace record.
    pub(super) step: Option<StepStarted>,
    /// The current turn's span (a child of the run's): its model call, tool calls
    /// and review are its children.
    pub(super) turn_span: Span,
    /// Streamed pieces of the reply wait in the outbox for a `FlushDeltas`.
    pub(super) deltas_held: bool,
}

/// An agent step under way: what its `step_end` event reports.
pub(super) struct StepStarted {
    pub(super) turn: u32,
    pub(super) order: u32,
    pub(super) name: String,
    pub(super) input: serde_json::Value,
    pub(super) started: Instant,
}

impl Live {
    /// Charges `usage` (a model call of `turn`, the reviewer's, a sub-run's) to the
    /// run: `token_usage` with the new total, which commits with the outbox.
    pub(super) fn charge(&mut self, turn: u32, usage: Usage) {
        self.run.usage.add(&usage);
        self.outbox.emit(EventKind::TokenUsage { turn, usage, total: self.run.usage });
        self.outbox.write(StoreWrite::Progress { turn, usage: self.run.usage });
    }

    /// Adds `message` to the conversation; it commits with the outbox.
    pub(super) fn append_message(&mut self, turn: u32, message: Message) {
        self.outbox.write(StoreWrite::Message(StoredMessage { turn, message: message.clone() }));
        self.conversation.push(message);
    }

    /// The work item of `call`, call `index` of `turn`, for the run's tenant and agent.
    pub(super) fn work(&self, turn: u32, index: usize, call: ToolCall, cancel: CancellationToken) -> WorkItem {
        WorkItem {
            run_id: self.run.run_id,
            tenant: self.run.tenant.clone(),
            agent: self.agent.name.clone(),
            turn,
            index,
            call,
            ledger: self.ledger.clone(),
            cancel,
            span: self.turn_parent(),
        }
    }

    /// The span a call of the current turn (a model call, a tool call, the
    /// review) is a child of: the turn's, else (a run resumed mid-turn) the run's.
    pub(super) fn turn_parent(&self) -> Span {
        if self.turn_span.is_none() { Span::current() } else { self.turn_span.clone() }
    }
}

/// Where the turn loop stands.
pub(super) enum Phase {
    Idle,
    Model {
        turn: u32,
        synthesis: bool,
    },
    // Boxed: a run spends most of its life waiting on the model, and a session
    // should not carry a tool turn's room while it does.
    Tools(Box<ToolTurn>),
    WaitingInput(Box<ToolTurn>),
    Review {
        turn: u32,
        final_answer: Option<String>,
        synthesis: bool,
    },
    /// A reflecting agent reasons: before turn `turn` acts (`answer` `None`), or
    /// about the answer turn `turn` gave.
    Think {
        turn: u32,
        answer: Option<String>,
    },
    Finished,
}

impl Phase {
    /// A parked turn goes on; any other phase stays as it is (a decision may
    /// come while an approved call of the same turn still runs).
    pub(super) fn unpark(&mut self) {
        *self = match std::mem::replace(self, Phase::Idle) {
            Phase::WaitingInput(tools) => Phase::Tools(tools),
            other => other,
        };
    }

    /// A turn with tool calls parks for a human; any other phase stays as it is.
    pub(super) fn park(&mut self) {
        *self = match std::mem::replace(self, Phase::Idle) {
            Phase::Tools(tools) => Phase::WaitingInput(tools),
            other => other,
        };
    }
}

/// The tool calls of one turn.
pub(super) struct ToolTurn {
    pub(super) turn: u32,
    pub(super) calls: Vec<ToolCall>,
    pub(super) results: Vec<Option<CallSummary>>,
    /// The next call to dispatch.
    pub(super) next: usize,
    pub(super) in_flight: usize,
    /// The turn's `ask_user` call, answered by `Input`.
    pub(super) ask: Option<usize>,
    /// Calls waiting for a human's approval.
    pub(super) awaiting: Vec<usize>,
    /// Calls approved and not yet dispatched.
    pub(super) approved: Vec<usize>,
    /// Tool result messages by call index. They join the conversation in call
    /// order once the turn's calls are all answered, whatever order they finished
    /// in, so a resumed run sees the same conversation as an uninterrupted one.
    pub(super) messages: Vec<Option<Message>>,
    /// Where the pool leaves the results of the turn's calls.
    pub(super) inbox: Arc<ToolInbox>,
}

impl ToolTurn {
    pub(super) fn new(turn: u32, calls: Vec<ToolCall>) -> Self {
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
    pub(super) fn put(&self, item: T) -> bool {
        let mut items = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        items.push(item);
        items.len() == 1
    }

    /// Takes every item waiting, in the order they arrived.
    pub(super) fn take(&self) -> Vec<T> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

/// Aborts an offloaded task when dropped.
pub(super) struct AbortOnDrop(pub(super) tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The tool calls of the current turn, while it has them.
pub(super) fn tools_mut(live: &mut Live) -> Option<&mut ToolTurn> {
    match &mut live.phase {
        Phase::Tools(tools) | Phase::WaitingInput(tools) => Some(tools),
        _ => None,
    }
}
