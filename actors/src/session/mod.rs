//! Session: one per run, the turn loop. Each turn builds the prompt, calls the
//! model, runs the requested tool calls through the pool, and asks the reviewer,
//! always, from `Session::request_review` — the one place that does. The session
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
//! (`review_is_instant` in `review.rs`). A session restarted after a crash rebuilds itself
//! from the store (see `resume.rs`). Events are published only after their commit.
//!
//! # Files
//!
//! - `mod.rs`: the messages, the actor and where each message goes;
//! - `state.rs`: what a session holds (the loaded run, the phase of its turn
//!   loop, the inboxes);
//! - `outbox.rs`: what a turn commits and when (`Outbox`, `flush`);
//! - `model.rs`: a model call and its stream;
//! - `tools.rs`: routing a call: refused, built-in, sub-run or pool;
//! - `results.rs`: booking a call's result, and the end of a tool turn;
//! - `input.rs`: parking for a human, answers and approvals;
//! - `plan.rs`: the planner and `todo_write`;
//! - `review.rs`: the review and what follows it, and the run's end;
//! - `reflect.rs`: a reflecting agent's reasoning before it acts and after it answers;
//! - `prompt.rs`, `resume.rs`, `sub_runs.rs`: the prompt, loading a run from the
//!   store, and runs started by `run_agent`.
//!
//! The role files extend [`Session`] and import from this file and from
//! `state.rs` (which imports neither); this file imports only from `state.rs`,
//! and only calls the methods the others add.

pub(crate) mod compact;
mod input;
mod model;
mod outbox;
mod plan;
pub(crate) mod prompt;
mod reflect;
mod results;
mod resume;
mod review;
mod state;
mod sub_runs;
mod tools;

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tracing::{Instrument, Span, warn};

use crate::llm::{ModelError, ModelReply};
use crate::protocol::{EventKind, Review, RunId, RunStatus, Thought, ToolCall, Usage};
use crate::run_input::{InputError, RunInput};
use crate::session::state::{Live, Phase};
use crate::shared::RuntimeShared;
use crate::store::{RunSnapshot, StoreWrite};
use crate::tool_pool::ToolResult;

pub use prompt::{ask_user_definition, resolve_citations};
pub use state::{DeltaInbox, Inbox, SessionState, ToolInbox};

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
    /// A reply the runtime gives in place of the model's (sent to itself): an
    /// agent step's call or answer, or the `ask_user` call of a `clarify_query`.
    RuntimeReply {
        /// The turn.
        turn: u32,
        /// The answer (empty with a call).
        content: String,
        /// The calls.
        calls: Vec<ToolCall>,
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
    /// A reflecting agent's reasoning on a turn came back (see `reflect.rs`).
    Thought {
        /// The turn.
        turn: u32,
        /// The thought and what its call spent, or why there is none.
        result: Result<(Thought, Usage), String>,
    },
    /// The user's answer to an `ask_user` question, or a decision on a call
    /// waiting for approval.
    Input {
        /// What the client sent.
        input: RunInput,
        /// Accepted, or why not.
        reply: RpcReplyPort<Result<(), InputError>>,
    },
    /// A sub-run of this run parked, waiting for a human: this run shows its
    /// question and approvals and waits with it (input to this run goes to it).
    SubRunWaiting {
        /// The sub-run.
        child: RunId,
        /// Its question.
        prompt: String,
        /// Its `approval_requested` events still undecided.
        approvals: Vec<EventKind>,
    },
    /// A sub-run that parked goes on.
    SubRunResumed {
        /// The sub-run.
        child: RunId,
    },
    /// The sub-run this run waits on, if it waits on one.
    WaitingOn {
        /// The sub-run.
        reply: RpcReplyPort<Option<RunId>>,
    },
    /// Commit the streamed pieces of `turn`'s reply held since the first of
    /// them (sent to itself, `DELTA_WINDOW` after it).
    FlushDeltas {
        /// The turn.
        turn: u32,
    },
    /// Ask the model again for `turn`, after a pause that followed a provider
    /// failure (sent to itself).
    RetryModel {
        /// The turn.
        turn: u32,
    },
    /// Stop the run now.
    Cancel {
        /// Why, as the run's end records it.
        reason: String,
        /// Called once the cancel is committed.
        reply: RpcReplyPort<()>,
    },
    /// The runtime is shutting down: start nothing new (a model call in progress
    /// is dropped), let the tool calls in flight end, commit their outcomes, stop.
    /// The run resumes from that commit on the next start.
    Drain,
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
        // The run's span is made once the run is read (`Load`): it joins the
        // run's trace before it is first entered.
        let resumed = args.created.is_none();
        Ok(SessionState { run_id: args.run_id, span: Span::none(), created: args.created, resumed, live: None })
    }

    async fn handle(
        &self,
        myself: ActorRef<SessionMsg>,
        message: SessionMsg,
        state: &mut SessionState,
    ) -> Result<(), ActorProcessingErr> {
        if matches!(message, SessionMsg::Load) && state.live.is_none() && state.span.is_none() {
            self.open_span(state).await?;
        }
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
            && let Err(error) = live.outbox.flush(&self.shared).await
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
            if let SessionMsg::Drain = message {
                myself.stop(Some("shutdown".to_owned()));
            }
            return Ok(());
        };
        if live.draining || matches!(message, SessionMsg::Drain) {
            return self.while_draining(&myself, live, message).await;
        }
        if matches!(live.phase, Phase::Finished) {
            match message {
                SessionMsg::Cancel { reply, .. } => drop(reply.send(())),
                SessionMsg::Input { reply, .. } => drop(reply.send(Err(InputError::NotWaiting))),
                _ => {}
            }
            return Ok(());
        }
        match message {
            SessionMsg::Load => Ok(()),
            SessionMsg::ModelDeltas { turn, inbox } => {
                self.on_deltas(&myself, live, turn, inbox.take());
                Ok(())
            }
            SessionMsg::FlushDeltas { turn } => self.flush_deltas(live, turn).await,
            SessionMsg::ModelDone { turn, result, elapsed } => {
                self.on_model_done(&myself, live, turn, result, elapsed).await
            }
            SessionMsg::RuntimeReply { turn, content, calls } => {
                self.on_runtime_reply(&myself, live, turn, content, calls).await
            }
            SessionMsg::ToolDone(result) => self.on_tools_done(&myself, live, vec![*result]).await,
            SessionMsg::ToolResults(inbox) => self.on_tools_done(&myself, live, inbox.take()).await,
            SessionMsg::SubRunSpent { usage } => {
                let turn = live.run.turn;
                live.charge(turn, usage);
                Ok(())
            }
            SessionMsg::Reviewed { turn, review } => self.on_reviewed(&myself, live, turn, review).await,
            SessionMsg::Thought { turn, result } => self.on_thought(&myself, live, turn, result).await,
            SessionMsg::Input { input, reply } => self.on_input_message(&myself, live, input, reply).await,
            SessionMsg::Cancel { reason, reply } => {
                self.finish(&myself, live, RunStatus::Cancelled, Some(reason), None).await?;
                let _ = reply.send(());
                Ok(())
            }
            SessionMsg::SubRunWaiting { child, prompt, approvals } => {
                self.on_sub_run_waiting(live, child, prompt, approvals).await
            }
            SessionMsg::SubRunResumed { child } => self.on_sub_run_resumed(live, child).await,
            SessionMsg::WaitingOn { reply } => {
                let _ = reply.send(live.waiting_on);
                Ok(())
            }
            SessionMsg::RetryModel { turn } => {
                self.on_retry_model(&myself, live, turn);
                Ok(())
            }
            SessionMsg::Drain => Ok(()),
        }
    }

    /// A message while the runtime shuts down: tool results are booked, input is
    /// refused, anything that would start new work waits for the next start (it is
    /// derived again from what is committed). Once no call is in flight, what the
    /// session holds is committed and it stops.
    async fn while_draining(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        message: SessionMsg,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SessionMsg::Drain => {
                live.draining = true;
                // The model call is dropped: the turn asks again on the next start.
                live.model_task = None;
            }
            // Booked only: the turn goes on after the next start.
            SessionMsg::ToolDone(result) => drop(self.book_results(live, vec![*result], true)),
            SessionMsg::ToolResults(inbox) => drop(self.book_results(live, inbox.take(), true)),
            SessionMsg::SubRunSpent { usage } => {
                live.run.usage.add(&usage);
                live.outbox.write(StoreWrite::Progress { turn: live.run.turn, usage: live.run.usage });
            }
            SessionMsg::Input { reply, .. } => drop(reply.send(Err(InputError::Unavailable))),
            SessionMsg::Cancel { reason, reply } => {
                self.finish(myself, live, RunStatus::Cancelled, Some(reason), None).await?;
                let _ = reply.send(());
                return Ok(());
            }
            _ => {}
        }
        // Sub-runs drain on their own and resume with their caller: only the pool's
        // calls are waited for.
        let in_flight = match &live.phase {
            Phase::Tools(tools) | Phase::WaitingInput(tools) => {
                let sub_runs = (0..tools.next.min(tools.calls.len()))
                    .filter(|&index| tools.results[index].is_none() && tools.calls[index].name == "run_agent")
                    .count();
                tools.in_flight.saturating_sub(sub_runs)
            }
            _ => 0,
        };
        if in_flight == 0 && !matches!(live.phase, Phase::Finished) {
            live.outbox.flush(&self.shared).await?;
            myself.stop(Some("shutdown".to_owned()));
        }
        Ok(())
    }
}
