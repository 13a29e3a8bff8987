//! ToolPool: the shared executor of every tool call. A bounded FIFO queue feeds N
//! linked [`ToolWorker`]s; the pool holds each call's reply until its worker reports,
//! so a worker that panics still gets its call answered (`Failed{worker_crashed}`)
//! and is replaced. A full queue answers at once with `Failed{pool_overloaded}`:
//! nothing waits in an unbounded mailbox on the pool's behalf.

mod pool;
mod work;
mod worker;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{ActorId, RpcReplyPort};
use serde::{Deserialize, Serialize};

use crate::protocol::ToolOutcome;

pub use pool::{ToolPool, ToolPoolState};
#[cfg(test)]
pub(crate) use work::bare_job;
pub use work::{Ending, PoolShared, ToolResult, WorkItem, book, finish, idempotency_key};
pub use worker::{ToolWorker, ToolWorkerMsg, execute};

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
            send(book(&self.shared, &self.work, Ending::at_once(outcome), summary));
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
    #[serde(with = "crate::duration_secs")]
    pub default_timeout: Duration,
    /// Time limits in seconds by tool name; they override the tool's own.
    pub timeouts: BTreeMap<String, f64>,
}

impl Default for ToolPoolConfig {
    fn default() -> Self {
        Self { workers: 8, queue_limit: 1024, default_timeout: Duration::from_secs(30), timeouts: BTreeMap::new() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ToolCall;

    #[test]
    fn a_reply_dropped_unanswered_answers_tool_pool_unavailable() {
        let call = ToolCall { call_id: "c".into(), name: "echo".into(), args: serde_json::json!({}) };
        let (shared, work) = bare_job("default", call);
        let (sender, receiver) = std::sync::mpsc::channel();
        drop(ToolReply::new(shared, work, move |result| sender.send(result).unwrap()));
        let result = receiver.recv().unwrap();
        assert!(matches!(&result.outcome, ToolOutcome::Failed { code, .. } if code == "tool_pool_unavailable"));
        assert_eq!(result.record.error.as_deref(), Some("tool_pool_unavailable"));
    }
}
