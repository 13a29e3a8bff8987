//! Starting sessions: a run admitted at submission or resumed starts at once
//! (`start_session`); a queued run starts when a slot frees, from the dispatcher
//! task (`dispatch`), which runs for the runtime's life.

use std::sync::Arc;
use std::time::Duration;

use ractor::ActorRef;
use tracing::warn;

use crate::admission::{Admission, RunQueue, Slot};
use crate::metrics;
use crate::protocol::{RunId, RunStatus};
use crate::runtime::request::SubmitError;
use crate::shared::{RuntimeShared, end_run};
use crate::store::{Commit, RunSnapshot, StoreError, StoreWrite};
use crate::supervisor::SupervisorMsg;

/// Starts a session for a run in the store.
pub(super) async fn start_session(
    supervisor: &ActorRef<SupervisorMsg>,
    run_id: RunId,
    permit: Option<Slot>,
    created: Option<Box<RunSnapshot>>,
) -> Result<(), SubmitError> {
    let reply = ractor::call!(supervisor, |reply| SupervisorMsg::Start { run_id, permit, created, reply });
    match reply {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => {
            warn!(run_id = %run_id, %error, "session did not start");
            Err(SubmitError::Unavailable)
        }
        Err(_) => Err(SubmitError::Unavailable),
    }
}

/// Starts queued runs as slots free up, oldest first (a tenant at its own limit
/// does not hold up the others). Runs for the runtime's life.
pub(super) async fn dispatch(
    shared: Arc<RuntimeShared>,
    supervisor: ActorRef<SupervisorMsg>,
    admission: Arc<Admission>,
    queue: Arc<RunQueue>,
) {
    let freed = admission.freed();
    loop {
        freed.notified().await;
        while let Some((run_id, tenant, slot)) = queue.take_admissible_with_tenant(&admission) {
            metrics::runs_queued(queue.len());
            match start_queued(&shared, &supervisor, run_id, slot).await {
                Ok(()) => {}
                Err(QueuedStart::StillQueued(error)) => {
                    // The store failed before the run moved: it waits at the front
                    // and is tried again shortly.
                    warn!(run_id = %run_id, %error, "a queued run could not start; retrying");
                    queue.push_front(run_id, &tenant);
                    metrics::runs_queued(queue.len());
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(QueuedStart::NoSession(error)) => {
                    warn!(run_id = %run_id, %error, "a queued run could not start");
                    let reason = "the runtime could not start the run".to_owned();
                    let _ = end_run(&shared, run_id, RunStatus::Failed, reason).await;
                }
            }
        }
    }
}

/// Why a queued run did not start.
enum QueuedStart {
    /// The store failed before the run moved to `running`.
    StillQueued(StoreError),
    /// It is `running` in the store, but its session did not start.
    NoSession(SubmitError),
}

/// Moves a queued run to `running` and starts its session, unless it was
/// cancelled while it waited.
async fn start_queued(
    shared: &RuntimeShared,
    supervisor: &ActorRef<SupervisorMsg>,
    run_id: RunId,
    slot: Slot,
) -> Result<(), QueuedStart> {
    match shared.store.get_run(run_id).await.map_err(QueuedStart::StillQueued)? {
        Some(run) if run.status == RunStatus::Queued => {}
        // An earlier try moved it but reported a failure (the commit landed as the
        // connection broke): it only lacks its session.
        Some(run) if run.status == RunStatus::Running => {
            return start_session(supervisor, run_id, Some(slot), None).await.map_err(QueuedStart::NoSession);
        }
        _ => return Ok(()),
    }
    let writes = vec![StoreWrite::Status { status: RunStatus::Running, reason: None }];
    match shared.store.commit(&Commit { run_id, writes, events: Vec::new() }).await {
        Ok(()) => {}
        // Cancelled between the read and the commit.
        Err(StoreError::Terminal(_)) => return Ok(()),
        Err(error) => return Err(QueuedStart::StillQueued(error)),
    }
    start_session(supervisor, run_id, Some(slot), None).await.map_err(QueuedStart::NoSession)
}
