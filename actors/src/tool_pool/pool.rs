//! The pool actor: it queues calls (up to `queue_limit`), hands them to idle
//! workers, holds each call's reply until its worker reports, and answers the
//! call of a worker that crashed before replacing it.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};
use tracing::{error, warn};

use crate::metrics;
use crate::protocol::ToolOutcome;
use crate::tool_pool::work::{PoolShared, WorkItem, finish};
use crate::tool_pool::worker::{ToolWorker, ToolWorkerMsg};
use crate::tool_pool::{ToolJob, ToolPoolConfig, ToolPoolMsg, ToolReply};

/// The pool; read-only.
pub struct ToolPool {
    /// Tools, hooks and the default time limit.
    pub shared: Arc<PoolShared>,
    /// Sizes.
    pub config: ToolPoolConfig,
}

/// A call a worker is running, kept so a crash can still answer it.
struct InFlight {
    work: WorkItem,
    reply: ToolReply,
    started: Instant,
}

/// The pool's mutable state.
pub struct ToolPoolState {
    idle: Vec<ActorRef<ToolWorkerMsg>>,
    busy: HashMap<ActorId, (ActorRef<ToolWorkerMsg>, InFlight)>,
    queue: VecDeque<ToolJob>,
}

impl Actor for ToolPool {
    type Msg = ToolPoolMsg;
    type State = ToolPoolState;
    type Arguments = ();

    async fn pre_start(&self, myself: ActorRef<ToolPoolMsg>, _: ()) -> Result<ToolPoolState, ActorProcessingErr> {
        let mut idle = Vec::with_capacity(self.config.workers);
        for _ in 0..self.config.workers.max(1) {
            idle.push(self.spawn_worker(&myself).await?);
        }
        Ok(ToolPoolState { idle, busy: HashMap::new(), queue: VecDeque::new() })
    }

    async fn handle(
        &self,
        _myself: ActorRef<ToolPoolMsg>,
        message: ToolPoolMsg,
        state: &mut ToolPoolState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            ToolPoolMsg::Execute(job) => {
                if state.idle.is_empty() && state.queue.len() >= self.config.queue_limit {
                    warn!(run_id = %job.work.run_id, tool = %job.work.call.name, "tool queue full");
                    let outcome =
                        ToolOutcome::failed("pool_overloaded", "too many tool calls are waiting; try again later");
                    let result =
                        finish(&self.shared, &job.work, outcome, Utc::now(), Duration::ZERO, Default::default());
                    job.reply.send(result);
                } else {
                    state.queue.push_back(*job);
                }
            }
            ToolPoolMsg::Done { worker, result } => {
                if let Some((worker_ref, in_flight)) = state.busy.remove(&worker) {
                    in_flight.reply.send(*result);
                    state.idle.push(worker_ref);
                }
            }
            ToolPoolMsg::Stats { reply } => {
                let _ = reply.send((state.queue.len(), state.busy.len(), state.idle.len()));
            }
        }
        self.dispatch(state);
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<ToolPoolMsg>,
        event: SupervisionEvent,
        state: &mut ToolPoolState,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorFailed(cell, reason) => {
                let id = cell.get_id();
                state.idle.retain(|worker| worker.get_id() != id);
                if let Some((_, in_flight)) = state.busy.remove(&id) {
                    error!(run_id = %in_flight.work.run_id, tool = %in_flight.work.call.name, %reason, "tool worker crashed");
                    let outcome = ToolOutcome::failed("worker_crashed", "the tool crashed while running this call");
                    let result = finish(
                        &self.shared,
                        &in_flight.work,
                        outcome,
                        Utc::now(),
                        in_flight.started.elapsed(),
                        Default::default(),
                    );
                    in_flight.reply.send(result);
                }
                metrics::actor_restarted("tool_worker");
                state.idle.push(self.spawn_worker(&myself).await?);
                self.dispatch(state);
            }
            SupervisionEvent::ActorTerminated(cell, _, _) => {
                let id = cell.get_id();
                state.idle.retain(|worker| worker.get_id() != id);
                state.busy.remove(&id);
            }
            _ => {}
        }
        Ok(())
    }
}

impl ToolPool {
    async fn spawn_worker(
        &self,
        myself: &ActorRef<ToolPoolMsg>,
    ) -> Result<ActorRef<ToolWorkerMsg>, ActorProcessingErr> {
        let worker = ToolWorker { shared: self.shared.clone(), pool: myself.clone() };
        let (worker_ref, _) = Actor::spawn_linked(None, worker, (), myself.get_cell()).await?;
        Ok(worker_ref)
    }

    /// Hands queued calls to idle workers.
    fn dispatch(&self, state: &mut ToolPoolState) {
        while !state.queue.is_empty() {
            let Some(worker) = state.idle.pop() else {
                break;
            };
            let Some(job) = state.queue.pop_front() else {
                state.idle.push(worker);
                break;
            };
            if let Err(error) = worker.cast(ToolWorkerMsg::Run(job.work.clone())) {
                // The worker died between its failure and our supervision event; its
                // replacement is on the way. Put the call back at the front.
                warn!(%error, "tool worker unreachable");
                state.queue.push_front(job);
                continue;
            }
            let in_flight = InFlight { work: job.work, reply: job.reply, started: Instant::now() };
            state.busy.insert(worker.get_id(), (worker, in_flight));
        }
        metrics::tool_queue_depth(state.queue.len());
    }
}
