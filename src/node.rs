//! The daemon as a node of a cluster (several daemons on one PostgreSQL store;
//! ownership and fencing are the store's, in `store/cluster.rs`): it claims runs
//! no live node drives, wakes the streams it serves when another node commits to
//! their run, applies the input and cancels other nodes took for its runs, and
//! stops when it loses its lease.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{error, warn};
use troupe_actors::Runtime;

use crate::server::{COMMAND_CHANNEL, apply_commands};
use crate::store::Membership;
use crate::store::cluster::{ORPHANS_CHANNEL, RUN_CHANNEL, announced_run};

/// The node's background tasks; aborted together.
pub struct Tasks(Vec<tokio::task::JoinHandle<()>>);

impl Tasks {
    /// Stops every task.
    pub fn abort(&self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Starts the node's tasks: claiming orphaned runs every `claim_interval`
/// (jittered) and at once when a node leaves; following notifications; and
/// cancelling `shutdown` if the node loses its lease.
pub fn spawn(
    membership: Membership,
    runtime: Arc<Runtime>,
    claim_interval: Duration,
    shutdown: CancellationToken,
) -> Tasks {
    let wake = Arc::new(Notify::new());
    let claims = tokio::spawn(claim(membership.clone(), runtime.clone(), claim_interval, wake.clone()));
    let listen = tokio::spawn(listen(membership.clone(), runtime, wake));
    let lost = tokio::spawn(async move {
        membership.lost.cancelled().await;
        error!(node = %membership.node.id, "stopping: this node lost its lease on the store");
        shutdown.cancel();
    });
    Tasks(vec![claims, listen, lost])
}

/// Resumes the runs this node claims, every `every` (±25 %, so that nodes do not
/// poll in step) or when woken.
async fn claim(membership: Membership, runtime: Arc<Runtime>, every: Duration, wake: Arc<Notify>) {
    loop {
        let jitter = every.mul_f64(0.75 + fastrand::f64() * 0.5);
        tokio::select! {
            _ = tokio::time::sleep(jitter) => {}
            _ = wake.notified() => {}
        }
        if let Err(error) = runtime.resume_unfinished().await {
            warn!(%error, "could not claim orphaned runs");
        }
        if let Err(error) = apply_commands(&membership, &runtime).await {
            warn!(%error, "could not apply the commands sent to this node's runs");
        }
    }
}

/// Follows the cluster's notifications: a commit by another node nudges the
/// streams of its run here; a node leaving wakes the claims. A lost connection
/// (notifications may have been missed) nudges every stream once it is back.
async fn listen(membership: Membership, runtime: Arc<Runtime>, wake: Arc<Notify>) {
    loop {
        let mut listener = match PgListener::connect_with(&membership.pool).await {
            Ok(listener) => listener,
            Err(error) => {
                warn!(%error, "cannot listen for the cluster's notifications; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if let Err(error) = listener.listen_all([RUN_CHANNEL, ORPHANS_CHANNEL, COMMAND_CHANNEL]).await {
            warn!(%error, "cannot listen for the cluster's notifications; retrying");
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        // Anything committed before the listener was up is read from the store.
        runtime.nudge_all();
        wake.notify_one();
        loop {
            match listener.try_recv().await {
                Ok(Some(notification)) if notification.channel() == RUN_CHANNEL => {
                    if let Some(run_id) = announced_run(&membership.node.id, notification.payload()) {
                        runtime.nudge(run_id);
                    }
                }
                Ok(Some(_)) => wake.notify_one(),
                // The connection dropped; the listener reconnects on the next call.
                Ok(None) => {
                    runtime.nudge_all();
                    wake.notify_one();
                }
                Err(error) => {
                    warn!(%error, "lost the cluster's notifications; reconnecting");
                    runtime.nudge_all();
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    break;
                }
            }
        }
    }
}
