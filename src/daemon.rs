//! `troupe serve`: the runtime behind the HTTP API until a shutdown signal.
//!
//! Shutdown order: stop accepting connections and end every event stream, let
//! requests in flight finish (bounded by `server.shutdown_timeout`), then stop the
//! actor tree (same bound). Every run keeps its last commit; the next start
//! resumes the unfinished ones.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};
use troupe_actors::config::RuntimeConfig;
use troupe_actors::{Deps, Runtime};

use crate::server::{self, AppState, Auth, ConnectionTimeouts, QuotaConfig, ServerConfig};
use crate::store::Membership;

/// What `serve` runs.
pub struct Daemon {
    /// The runtime's settings.
    pub runtime: RuntimeConfig,
    /// The server's settings.
    pub server: ServerConfig,
    /// Tenants' daily quotas.
    pub quotas: QuotaConfig,
    /// Who may call.
    pub auth: Auth,
    /// Store, models, tools, agents.
    pub deps: Deps,
    /// Renders `/metrics`; `None` leaves it out.
    pub prometheus: Option<PrometheusHandle>,
    /// This daemon as a node of a cluster, and how often it looks for orphaned runs.
    pub cluster: Option<(Membership, Duration)>,
}

impl Daemon {
    /// Starts the runtime (resuming unfinished runs), binds, calls `ready` with the
    /// bound address, and serves until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken, ready: impl FnOnce(SocketAddr)) -> anyhow::Result<()> {
        let timing = self.server.timing()?;
        if self.auth.is_open() {
            warn!(
                "AUTHENTICATION IS OFF (--insecure-no-auth): anyone who can reach {} can start, read and cancel runs",
                self.server.bind
            );
        }
        // Bound first: a port in use fails here, before any run is resumed.
        let (listener, local) = server::bind(&self.server.bind).await?;
        let runtime = Arc::new(Runtime::start(self.runtime, self.deps).await?);
        let cluster = self.cluster.map(|(membership, claim_interval)| {
            runtime.follow_remote_runs();
            info!(node = %membership.node.id, name = %membership.node.name, "joined the cluster");
            let tasks = crate::node::spawn(membership.clone(), runtime.clone(), claim_interval, shutdown.clone());
            (membership, tasks)
        });
        let state =
            AppState::new(runtime.clone(), self.auth, self.server, self.quotas, self.prometheus, shutdown.clone())?
                .in_cluster(cluster.as_ref().map(|(membership, _)| membership.clone()));
        ready(local);
        // A runtime that stops by itself (its shared actors crashed too often) takes
        // no more runs: the daemon stops serving and exits non-zero, for its service
        // manager to start a fresh one (which resumes the runs), instead of answering
        // 503 forever.
        let melted = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watch = tokio::spawn({
            let (runtime, shutdown, melted) = (runtime.clone(), shutdown.clone(), melted.clone());
            async move {
                runtime.stopped().await;
                if !shutdown.is_cancelled() {
                    error!("the runtime stopped after its shared actors crashed too often; the daemon exits");
                    melted.store(true, std::sync::atomic::Ordering::SeqCst);
                    shutdown.cancel();
                }
            }
        });
        let timeouts = ConnectionTimeouts { header_read: timing.header_read_timeout, write: timing.write_timeout };
        server::serve(listener, server::router(state), timeouts, shutdown, timing.shutdown_timeout).await;
        watch.abort();
        info!("stopping the runtime");
        runtime.shutdown(timing.shutdown_timeout).await;
        if let Some((membership, tasks)) = cluster {
            tasks.abort();
            if membership.lost.is_cancelled() {
                anyhow::bail!(
                    "this node lost its place in the cluster (it was away for over an hour); other nodes took its runs \
                     over: start it again to rejoin"
                );
            }
            match membership.node.leave(&membership.pool).await {
                Ok(runs) => info!(runs, "left the cluster; its runs go to the other nodes"),
                Err(error) => {
                    warn!(%error, "could not leave the cluster; other nodes take its runs once its lease expires")
                }
            }
        }
        info!("stopped");
        if melted.load(std::sync::atomic::Ordering::SeqCst) {
            anyhow::bail!("the runtime stopped after its shared actors crashed too often (supervisor meltdown)");
        }
        Ok(())
    }
}
