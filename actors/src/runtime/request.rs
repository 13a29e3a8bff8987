//! What a caller hands the runtime ([`SubmitRequest`]) and why the runtime may
//! refuse it: the errors of starting, submitting and cancelling.

use crate::protocol::{RunId, RunSpec, RunStatus, ThreadId};
use crate::store::{Idempotency, Metadata, RunRecord, StoreError};
use crate::threads::MultitaskStrategy;

/// A submission.
#[derive(Debug, Clone)]
pub struct SubmitRequest {
    /// What to run.
    pub spec: RunSpec,
    /// Who asks; the run belongs to this tenant.
    pub tenant: String,
    /// The run this one serves as a sub-run, if any.
    pub parent_run_id: Option<RunId>,
    /// The thread this run is a message of: it sees what was said in the
    /// thread's runs before it, and starts once they have ended. An empty agent
    /// in `spec` means the thread's.
    pub thread: Option<ThreadRun>,
    /// The client's labels.
    pub metadata: Metadata,
    /// Its idempotency key: a request under a key already used by this tenant
    /// in the last 24 hours returns that run (same request) or is refused.
    pub idempotency: Option<Idempotency>,
    /// The W3C trace context the run joins (its spans are children of that
    /// span), kept with the run.
    pub traceparent: Option<String>,
}

/// A run's place in a thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadRun {
    /// The thread.
    pub thread_id: ThreadId,
    /// What happens if the thread has an active run.
    pub strategy: MultitaskStrategy,
}

impl SubmitRequest {
    /// A request of the `default` tenant.
    pub fn new(agent: impl Into<String>, input: impl Into<String>) -> Self {
        let spec = RunSpec { agent: agent.into(), input: input.into(), limits: None };
        Self {
            spec,
            tenant: "default".to_owned(),
            parent_run_id: None,
            thread: None,
            metadata: Metadata::new(),
            idempotency: None,
            traceparent: None,
        }
    }
}

/// A run accepted, or found as an earlier request under the same idempotency
/// key created it.
#[derive(Debug, Clone)]
pub struct Submitted {
    /// The run.
    pub run: RunRecord,
    /// Whether it was created by an earlier request.
    pub replayed: bool,
}

/// Why the runtime could not start.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The configuration is inconsistent.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The actor tree could not start.
    #[error("the supervisor could not start: {0}")]
    Spawn(String),
}

/// Why a submission was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SubmitError {
    /// No agent has that name.
    #[error("unknown agent {0:?}")]
    UnknownAgent(String),
    /// The limits make no sense.
    #[error("invalid limits: {0}")]
    InvalidLimits(String),
    /// Too many runs are active and the queue is full; try again later.
    #[error("too many active runs (limit {limit}) and the run queue is full; try again later")]
    Overloaded {
        /// The limit.
        limit: usize,
    },
    /// The tenant has too many active runs and queued ones; try again later.
    #[error("too many active runs for this tenant (limit {limit}) and its queue is full; try again later")]
    TenantOverloaded {
        /// The limit.
        limit: usize,
    },
    /// The runtime is stopping or broken.
    #[error("the runtime is not accepting runs")]
    Unavailable,
    /// No such thread for this tenant.
    #[error("thread not found")]
    UnknownThread,
    /// The thread has an active run and the strategy is `reject`.
    #[error("the thread has an active run ({active_run_id}); wait for it, or send with another multitask_strategy")]
    ThreadBusy {
        /// The active run.
        active_run_id: RunId,
    },
    /// Too many runs wait on the thread.
    #[error("{limit} runs already wait on this thread; try again later")]
    ThreadQueueFull {
        /// The limit.
        limit: usize,
    },
    /// The idempotency key was used for another request.
    #[error("this Idempotency-Key was used for a different request in the last 24 hours")]
    IdempotencyKeyReused,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why a cancel was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CancelError {
    /// No such run.
    #[error("run not found")]
    NotFound,
    /// The run had already ended.
    #[error("the run has already ended ({})", .0.as_str())]
    AlreadyEnded(RunStatus),
    /// The runtime is stopping or broken.
    #[error("the runtime is not accepting cancels")]
    Unavailable,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}
