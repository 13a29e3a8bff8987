//! ToolPool: the shared executor of every tool call. A bounded FIFO queue feeds N
//! linked [`ToolWorker`]s; the pool holds each call's reply until its worker reports,
//! so a worker that panics still gets its call answered (`Failed{worker_crashed}`)
//! and is replaced. A full queue answers at once with `Failed{pool_overloaded}`:
//! nothing waits in an unbounded mailbox on the pool's behalf.

mod worker;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use serde::{Deserialize, Serialize};
use tracing::{error, warn};

use crate::metrics;
use crate::protocol::ToolOutcome;

pub use worker::{PoolShared, ToolResult, ToolWorker, ToolWorkerMsg, WorkItem, book, execute, finish, idempotency_key};

/// Where a call's result goes: answered exactly once. Dropped unanswered (the pool
/// died with the call queued or running, or was unreachable), it answers
/// `Failed{tool_pool_unavailable}` itself, so no run waits forever for a call.
pub struct ToolReply {
    shared: Arc<PoolShared>,
    work: WorkItem,
    send: Option<Box<dyn FnOnce(ToolResult) + Send + 'static>>,
}

impl ToolReply {
    /// A reply for `work` that calls `send` once.
    pub fn new(shared: Arc<PoolShared>, work: WorkItem, send: impl FnOnce(ToolResult) + Send + 'static) -> Self {
        Self { shared, work, send: Some(Box::new(send)) }
    }

    /// Answers the call.
    pub fn send(mut self, result: ToolResult) {
        if let Some(send) = self.send.take() {
            send(result);
        }
    }
}

impl Drop for ToolReply {
    fn drop(&mut self) {
        if let Some(send) = self.send.take() {
            let outcome = ToolOutcome::failed(
                "tool_pool_unavailable",
                "the tool executor stopped before answering this call; try again",
            );
            let summary = format!("{} was not answered", self.work.call.name);
            send(worker::book(&self.shared, &self.work, outcome, Utc::now(), Duration::ZERO, 0.0, summary));
        }
    }
}

/// A call for the pool.
pub struct ToolJob {
    /// The call and its run context.
    pub work: WorkItem,
    /// Where the result goes.
    pub reply: ToolReply,
}

/// Messages the pool takes.
pub enum ToolPoolMsg {
    /// Run a call; its reply is called with the result.
    Execute(Box<ToolJob>),
    /// A worker finished a call (internal).
    Done {
        /// The worker.
        worker: ActorId,
        /// The result.
        result: Box<ToolResult>,
    },
    /// Queue depth and busy workers, for tests and health checks.
    Stats {
        /// (queued, busy, idle).
        reply: RpcReplyPort<(usize, usize, usize)>,
    },
}

/// Pool settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolPoolConfig {
    /// Workers, i.e. tool calls running at once across all runs.
    pub workers: usize,
    /// Calls that may wait for a worker; beyond it calls fail with `pool_overloaded`.
    pub queue_limit: usize,
    /// Time limit of a call whose tool sets none.
    #[serde(with = "crate::config::duration_secs")]
    pub default_timeout: Duration,
    /// Time limits in seconds by tool name; they override the tool's own.
    pub timeouts: BTreeMap<String, f64>,
}

impl Default for ToolPoolConfig {
    fn default() -> Self {
        Self { workers: 8, queue_limit: 1024, default_timeout: Duration::from_secs(30), timeouts: BTreeMap::new() }
    }
}

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
                    let result = worker::finish(&self.shared, &job.work, outcome, Utc::now(), Duration::ZERO, 0.0);
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
                    let result = worker::finish(
                        &self.shared,
                        &in_flight.work,
                        outcome,
                        Utc::now(),
                        in_flight.started.elapsed(),
                        0.0,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hooks::{HookChain, HookConfig, RunLedger};
    use crate::protocol::{RunId, ToolCall};
    use crate::tool::ToolRegistry;

    #[test]
    fn a_reply_dropped_unanswered_answers_tool_pool_unavailable() {
        let shared = Arc::new(PoolShared {
            registry: ToolRegistry::new(),
            chain: HookChain::new(HookConfig::default(), Vec::new()),
            default_timeout: Duration::from_secs(30),
            timeouts: HashMap::new(),
        });
        let work = WorkItem {
            run_id: RunId::new(),
            turn: 1,
            index: 0,
            call: ToolCall { call_id: "c".into(), name: "echo".into(), args: serde_json::json!({}) },
            ledger: Arc::new(RunLedger::new()),
            cancel: Default::default(),
        };
        let (sender, receiver) = std::sync::mpsc::channel();
        drop(ToolReply::new(shared, work, move |result| sender.send(result).unwrap()));
        let result = receiver.recv().unwrap();
        assert!(matches!(&result.outcome, ToolOutcome::Failed { code, .. } if code == "tool_pool_unavailable"));
        assert_eq!(result.record.error.as_deref(), Some("tool_pool_unavailable"));
    }
}
