//! ToolWorker: runs one call at a time through the hook chain. It owns the wait on
//! the tool (that is what workers exist for) and reports to its pool when done. A
//! panicking tool kills the worker; the pool answers the call and replaces it.

use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::Instrument;

use crate::hooks::{HookContext, HookVerdict};
use crate::protocol::{ToolOutcome, Usage};
use crate::tool::ToolContext;
use crate::tool_pool::ToolPoolMsg;
use crate::tool_pool::work::{PoolShared, ToolResult, WorkItem, finish, idempotency_key};

/// Messages a worker takes.
pub enum ToolWorkerMsg {
    /// Execute a call and report to the pool.
    Run(WorkItem),
}

/// A worker; read-only.
pub struct ToolWorker {
    /// Shared tools and hooks.
    pub shared: Arc<PoolShared>,
    /// The pool to report to.
    pub pool: ActorRef<ToolPoolMsg>,
}

impl Actor for ToolWorker {
    type Msg = ToolWorkerMsg;
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _myself: ActorRef<ToolWorkerMsg>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<ToolWorkerMsg>,
        message: ToolWorkerMsg,
        _state: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        match message {
            ToolWorkerMsg::Run(work) => {
                let span =
                    crate::spans::execute_tool(&work.span, work.run_id, work.turn, &work.call.name, &work.call.call_id);
                let result = execute(&self.shared, work).instrument(span).await;
                // The pool is gone only at shutdown; the result then has nobody to go to.
                let _ = self.pool.cast(ToolPoolMsg::Done { worker: myself.get_id(), result: Box::new(result) });
            }
        }
        Ok(())
    }
}

/// Runs `work` through the hook chain and the tool.
pub async fn execute(shared: &PoolShared, work: WorkItem) -> ToolResult {
    let started_at = Utc::now();
    let clock = Instant::now();
    let registered = shared.registry.get(&work.call.name);
    let context = HookContext {
        run_id: work.run_id,
        tenant: &work.tenant,
        agent: &work.agent,
        turn: work.turn,
        tool: registered.map(Arc::as_ref),
        ledger: &work.ledger,
        config: &shared.chain.config,
    };
    if work.cancel.is_cancelled() {
        // The run was cancelled while this call waited in the queue: it never starts.
        return finish(shared, &work, ToolOutcome::Interrupted, started_at, clock.elapsed(), Usage::default());
    }
    let (outcome, usage, executed) = match (shared.chain.before(&context, &work.call).await, registered) {
        (HookVerdict::Skip(outcome), _) => (outcome, Usage::default(), None),
        (HookVerdict::Run(_), None) => (ToolOutcome::failed("unknown_tool", "no such tool"), Usage::default(), None),
        (HookVerdict::Run(args), Some(registered)) => {
            let tool = &registered.tool;
            let tool_context = ToolContext {
                run_id: work.run_id,
                tenant: work.tenant.clone(),
                agent: work.agent.clone(),
                turn: work.turn,
                call_id: work.call.call_id.clone(),
                idempotency_key: idempotency_key(work.run_id, work.turn, work.index),
                cancel: work.cancel.clone(),
            };
            let configured = shared.timeouts.get(tool.name()).copied();
            let limit = configured.or_else(|| tool.timeout()).unwrap_or(shared.default_timeout);
            let executed = args.clone();
            let (outcome, usage) = tokio::select! {
                biased;
                _ = work.cancel.cancelled() => (ToolOutcome::Interrupted, Usage::default()),
                result = tokio::time::timeout(limit, tool.call(tool_context, args)) => match result {
                    Ok(Ok(output)) => (ToolOutcome::Ok { value: output.value, fragments: output.fragments }, output.usage),
                    Ok(Err(error)) => (error.into_outcome(), Usage::default()),
                    Err(_) => (ToolOutcome::failed("timeout", format!("no result after {limit:?}")), Usage::default()),
                },
            };
            (outcome, usage, Some(executed))
        }
    };
    let outcome = shared.chain.after(&context, &work.call, outcome).await;
    let mut result = finish(shared, &work, outcome, started_at, clock.elapsed(), usage);
    // The record keeps what ran, and what the model asked for when a hook changed it.
    if let Some(executed) = executed.filter(|executed| *executed != result.record.args) {
        result.record.original_args = Some(std::mem::replace(&mut result.record.args, executed));
    }
    result
}
