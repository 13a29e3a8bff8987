//! Supervisor: the root of the actor tree. It owns the shared ToolPool and Reviewer
//! and one Session per live run, and restarts them one-for-one:
//!
//! - a Session that fails is restarted from the store at its last commit; one
//!   failure more than `restarts.max_restarts` within `restarts.period` fails the
//!   run (a per-run meltdown is absorbed: other runs are untouched);
//! - the ToolPool or the Reviewer that fails is restarted under the same intensity,
//!   counted across both; beyond it the supervisor fails itself (escalation) and
//!   the runtime stops accepting runs.
//!
//! It never awaits the store: a session loads itself after it starts, and a run
//! failed by a meltdown is written by an offloaded task.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tracing::{error, warn};

use crate::admission::Slot;
use crate::metrics;
use crate::protocol::{RunId, RunStatus};
use crate::reviewer::Reviewer;
use crate::session::{Session, SessionArgs, SessionMsg};
use crate::shared::{RuntimeShared, end_run};
use crate::store::{RunSnapshot, StoreError};
use crate::tool_pool::ToolPool;

/// The refs of the shared actors live with the shared state; kept here under their old path.
pub use crate::shared::Handles;

/// Tries at recording a run failed by a meltdown.
const END_RUN_ATTEMPTS: u32 = 4;

/// How often a run given up while the store was away is offered back.
const RELEASE_RETRY: Duration = Duration::from_secs(5);

/// Time limit of a model-backed review.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(120);

/// Why a session could not be started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("could not start the session: {0}")]
pub struct StartError(pub String);

/// Messages the supervisor takes.
pub enum SupervisorMsg {
    /// Start a session for a run already in the store.
    Start {
        /// The run.
        run_id: RunId,
        /// Its admission slot, released when the session ends.
        permit: Option<Slot>,
        /// The run as it was just created, so that its session need not read it
        /// back; `None`: the session loads it from the store.
        created: Option<Box<RunSnapshot>>,
        /// Started, or why not.
        reply: RpcReplyPort<Result<(), StartError>>,
    },
    /// The live session of a run, if it has one.
    Session {
        /// The run.
        run_id: RunId,
        /// The session.
        reply: RpcReplyPort<Option<ActorRef<SessionMsg>>>,
    },
    /// The run parked (it waits for a human): its admission slot is freed.
    ReleaseSlot {
        /// The run.
        run_id: RunId,
    },
    /// The run goes on after parking: it holds `slot` again.
    AttachSlot {
        /// The run.
        run_id: RunId,
        /// Its new slot.
        slot: Slot,
    },
    /// Kills the run's session if it has one, without letting it commit: the
    /// node has just claimed the run anew, so a session it still has is stale
    /// (another node drove the run in between).
    Discard {
        /// The run.
        run_id: RunId,
        /// Done.
        reply: RpcReplyPort<()>,
    },
    /// How many runs have a live session.
    ActiveRuns {
        /// The count.
        reply: RpcReplyPort<usize>,
    },
    /// Shutdown's first step: every session lets its tool calls in flight end,
    /// commits them and stops (see `SessionMsg::Drain`).
    Drain {
        /// The sessions told to drain, to wait for.
        reply: RpcReplyPort<Vec<ActorCell>>,
    },
}

/// The supervisor; read-only.
pub struct Supervisor {
    /// What the runtime shares.
    pub shared: Arc<RuntimeShared>,
}

/// A run with a live session.
struct LiveRun {
    session: ActorRef<SessionMsg>,
    /// Dropped with the entry, which frees the run's admission slot.
    slot: Option<Slot>,
    /// Recent restarts, for the intensity check.
    restarts: VecDeque<Instant>,
}

/// The supervisor's state.
pub struct SupervisorState {
    runs: HashMap<RunId, LiveRun>,
    sessions: HashMap<ActorId, RunId>,
    tool_pool: ActorCell,
    reviewer: ActorCell,
    /// Restarts of the shared actors, for the intensity check.
    shared_restarts: VecDeque<Instant>,
}

impl Actor for Supervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = ();

    async fn pre_start(&self, myself: ActorRef<SupervisorMsg>, _: ()) -> Result<SupervisorState, ActorProcessingErr> {
        let tool_pool = self.spawn_tool_pool(&myself).await?;
        let reviewer = self.spawn_reviewer(&myself).await?;
        Ok(SupervisorState {
            runs: HashMap::new(),
            sessions: HashMap::new(),
            tool_pool,
            reviewer,
            shared_restarts: VecDeque::new(),
        })
    }

    async fn post_stop(
        &self,
        myself: ActorRef<SupervisorMsg>,
        _state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        // Children left running would be killed once this returns; stopped, each
        // session first commits what it holds (`Session::post_stop`). Runtime::shutdown
        // bounds the wait, and kills the tree past its deadline.
        myself.stop_children_and_wait(Some("shutdown".to_owned()), None).await;
        self.shared.handles.set_tool_pool(None);
        self.shared.handles.set_reviewer(None);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<SupervisorMsg>,
        message: SupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SupervisorMsg::Start { run_id, permit, created, reply } => {
                let result = if state.runs.contains_key(&run_id) {
                    Ok(())
                } else {
                    match self.spawn_session(&myself, run_id, created).await {
                        Ok(session) => {
                            state.sessions.insert(session.get_id(), run_id);
                            state.runs.insert(run_id, LiveRun { session, slot: permit, restarts: VecDeque::new() });
                            metrics::runs_active(state.runs.len());
                            Ok(())
                        }
                        Err(error) => Err(StartError(error.to_string())),
                    }
                };
                let _ = reply.send(result);
            }
            SupervisorMsg::Session { run_id, reply } => {
                let _ = reply.send(state.runs.get(&run_id).map(|run| run.session.clone()));
            }
            SupervisorMsg::ReleaseSlot { run_id } => {
                if let Some(run) = state.runs.get_mut(&run_id) {
                    run.slot = None;
                }
            }
            SupervisorMsg::AttachSlot { run_id, slot } => {
                if let Some(run) = state.runs.get_mut(&run_id).filter(|run| run.slot.is_none()) {
                    run.slot = Some(slot);
                }
            }
            SupervisorMsg::Discard { run_id, reply } => {
                if let Some(run) = state.runs.remove(&run_id) {
                    state.sessions.remove(&run.session.get_id());
                    run.session.kill();
                    metrics::runs_active(state.runs.len());
                    warn!(run_id = %run_id, "a stale session of a run claimed anew was killed");
                }
                let _ = reply.send(());
            }
            SupervisorMsg::ActiveRuns { reply } => {
                let _ = reply.send(state.runs.len());
            }
            SupervisorMsg::Drain { reply } => {
                let sessions = state.runs.values().map(|run| run.session.clone()).collect::<Vec<_>>();
                for session in &sessions {
                    let _ = session.cast(SessionMsg::Drain);
                }
                let _ = reply.send(sessions.into_iter().map(|session| session.get_cell()).collect());
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<SupervisorMsg>,
        event: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorTerminated(cell, _, _) => {
                if let Some(run_id) = state.sessions.remove(&cell.get_id()) {
                    state.runs.remove(&run_id);
                    metrics::runs_active(state.runs.len());
                }
            }
            SupervisionEvent::ActorFailed(cell, reason) => {
                let id = cell.get_id();
                if let Some(run_id) = state.sessions.remove(&id) {
                    if let Some(StoreError::Fenced(_)) = reason.downcast_ref::<StoreError>() {
                        // Another node drives the run now: this one lets it go
                        // without restarting or ending it.
                        self.fenced(state, run_id);
                        return Ok(());
                    }
                    self.session_failed(&myself, state, run_id, reason.to_string()).await;
                } else if id == state.tool_pool.get_id() {
                    self.shared_failed(state, "tool_pool", &reason.to_string())?;
                    self.shared.handles.set_tool_pool(None);
                    state.tool_pool = self.spawn_tool_pool(&myself).await?;
                } else if id == state.reviewer.get_id() {
                    self.shared_failed(state, "reviewer", &reason.to_string())?;
                    self.shared.handles.set_reviewer(None);
                    state.reviewer = self.spawn_reviewer(&myself).await?;
                }
            }
            _ => {}
        }
        Ok(())
    }
}

impl Supervisor {
    async fn spawn_session(
        &self,
        myself: &ActorRef<SupervisorMsg>,
        run_id: RunId,
        created: Option<Box<RunSnapshot>>,
    ) -> Result<ActorRef<SessionMsg>, ActorProcessingErr> {
        let session = Session { shared: self.shared.clone() };
        let (session, _) =
            Actor::spawn_linked(None, session, SessionArgs { run_id, created }, myself.get_cell()).await?;
        Ok(session)
    }

    async fn spawn_tool_pool(&self, myself: &ActorRef<SupervisorMsg>) -> Result<ActorCell, ActorProcessingErr> {
        let pool = ToolPool { shared: self.shared.pool.clone(), config: self.shared.config.tool_pool.clone() };
        let (pool, _) = Actor::spawn_linked(None, pool, (), myself.get_cell()).await?;
        self.shared.handles.set_tool_pool(Some(pool.clone()));
        Ok(pool.get_cell())
    }

    async fn spawn_reviewer(&self, myself: &ActorRef<SupervisorMsg>) -> Result<ActorCell, ActorProcessingErr> {
        let reviewer = Reviewer { models: self.shared.models.clone(), timeout: REVIEW_TIMEOUT };
        let (reviewer, _) = Actor::spawn_linked(None, reviewer, (), myself.get_cell()).await?;
        self.shared.handles.set_reviewer(Some(reviewer.clone()));
        Ok(reviewer.get_cell())
    }

    /// Forgets a run whose commit was fenced: another node took it over (this one
    /// lost its lease), so its session stopped and its streams here end (clients
    /// resume from the store, on any node).
    fn fenced(&self, state: &mut SupervisorState, run_id: RunId) {
        state.runs.remove(&run_id);
        metrics::runs_active(state.runs.len());
        warn!(run_id = %run_id, "the run is driven by another node now; its session here stopped");
        self.shared.hub.close(run_id);
    }

    /// Restarts a failed session, or fails its run after too many restarts.
    async fn session_failed(
        &self,
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
        run_id: RunId,
        reason: String,
    ) {
        let Some(run) = state.runs.get_mut(&run_id) else {
            return;
        };
        let policy = &self.shared.config.restarts;
        let now = Instant::now();
        run.restarts.retain(|at| now.duration_since(*at) < policy.period);
        if run.restarts.len() < policy.max_restarts {
            run.restarts.push_back(now);
            metrics::actor_restarted("session");
            warn!(run_id = %run_id, %reason, restarts = run.restarts.len(), "session crashed; restarting it from the store");
            match self.spawn_session(myself, run_id, None).await {
                Ok(session) => {
                    state.sessions.insert(session.get_id(), run_id);
                    run.session = session;
                    return;
                }
                Err(error) => error!(run_id = %run_id, %error, "session restart failed"),
            }
        }
        state.runs.remove(&run_id);
        metrics::runs_active(state.runs.len());
        metrics::supervisor_meltdown("run");
        error!(run_id = %run_id, %reason, "session crashed too often; failing the run");
        let shared = self.shared.clone();
        let why = format!(
            "supervisor_meltdown: the run's session crashed more than {} times in {:?}",
            policy.max_restarts, policy.period
        );
        // Offloaded: the supervisor does not wait on the store. A store that is down
        // gets a few tries; after that the run stays unfinished and is handed back
        // (`RunStore::release`) to be resumed.
        tokio::spawn(async move {
            for attempt in 1..=END_RUN_ATTEMPTS {
                match end_run(&shared, run_id, RunStatus::Failed, why.clone()).await {
                    Ok(()) => return,
                    Err(error) if attempt == END_RUN_ATTEMPTS => {
                        error!(run_id = %run_id, %error, "could not record the failed run; it is handed back");
                        shared.hub.close(run_id);
                        // Once the store answers, the run is resumed: by another
                        // node of a cluster (or this one), or at the next start.
                        while let Err(error) = shared.store.release(run_id).await {
                            warn!(run_id = %run_id, %error, "could not hand the run back; retrying");
                            tokio::time::sleep(RELEASE_RETRY).await;
                        }
                    }
                    Err(error) => {
                        warn!(run_id = %run_id, %error, attempt, "could not record the failed run; retrying");
                        tokio::time::sleep(Duration::from_millis(200) * 4u32.pow(attempt)).await;
                    }
                }
            }
        });
    }

    /// Counts a restart of a shared actor; past the intensity, escalates.
    fn shared_failed(
        &self,
        state: &mut SupervisorState,
        actor: &'static str,
        reason: &str,
    ) -> Result<(), ActorProcessingErr> {
        let policy = &self.shared.config.restarts;
        let now = Instant::now();
        state.shared_restarts.retain(|at| now.duration_since(*at) < policy.period);
        if state.shared_restarts.len() >= policy.max_restarts {
            metrics::supervisor_meltdown("root");
            error!(actor, reason, "shared actor crashed too often; the supervisor gives up");
            // Every session dies with the supervisor: no live stream may wait for them.
            self.shared.hub.close_all();
            return Err(
                format!("{actor} crashed more than {} times in {:?}", policy.max_restarts, policy.period).into()
            );
        }
        state.shared_restarts.push_back(now);
        metrics::actor_restarted(actor);
        warn!(actor, reason, "shared actor crashed; restarting it");
        Ok(())
    }
}
