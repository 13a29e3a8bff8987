//! The commands that run the runtime in this process, on an [`App`]: `troupe
//! serve` (the daemon until a signal), `troupe demo`, `troupe resume` and
//! `troupe gc`.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use troupe_actors::Deps;
use troupe_actors::protocol::RunStatus;
use troupe_actors::store::RunStore;

use crate::app::App;
use crate::cli::demo::{self, DemoArgs};
use crate::config::Config;
use crate::daemon::Daemon;
use crate::server::Auth;
use crate::store::Membership;

/// A command that runs on an [`App`].
pub enum Local {
    /// `troupe serve`.
    Serve,
    /// `troupe demo`.
    Demo(DemoArgs),
    /// `troupe resume`.
    Resume,
    /// `troupe gc`, with `--older-than-days`.
    Gc {
        /// Overrides `store.retention_days`.
        older_than_days: Option<f64>,
    },
}

/// Runs `command` on `app`, then stops the MCP servers.
pub async fn run(app: App, command: Local) -> anyhow::Result<ExitCode> {
    let App { config, agents, models, tools, auth, store, mcp } = app;
    let outcome = match command {
        Local::Serve => {
            let auth = auth.context("serve has its auth")?;
            let membership = store.membership();
            let deps = Deps { store: Arc::new(store), models, tools, hooks: Vec::new(), agents };
            serve(config, auth, deps, membership).await?;
            Ok(ExitCode::SUCCESS)
        }
        Local::Demo(args) => {
            let status = demo::run(config.runtime, Arc::new(store), models, tools, agents, args).await?;
            Ok(if status == RunStatus::Succeeded { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Local::Resume => {
            let ended = demo::resume(config.runtime, Arc::new(store), models, tools, agents).await?;
            let succeeded = ended.iter().filter(|(_, status)| *status == RunStatus::Succeeded).count();
            println!(
                "resumed {} run(s): {succeeded} succeeded, {} ended otherwise",
                ended.len(),
                ended.len() - succeeded
            );
            Ok(ExitCode::SUCCESS)
        }
        Local::Gc { older_than_days } => {
            gc(&config, &store, older_than_days).await?;
            Ok(ExitCode::SUCCESS)
        }
    };
    mcp.shutdown().await;
    outcome
}

/// `troupe gc`: deletes finished runs that ended longer ago than the retention
/// period, in batches, then gives their space back.
async fn gc(config: &Config, store: &impl RunStore, older_than_days: Option<f64>) -> anyhow::Result<()> {
    let days = older_than_days.unwrap_or(config.store.retention_days);
    let deleted = crate::store::retention::sweep(store, days, config.store.gc_batch).await?;
    store.compact().await?;
    println!("deleted {deleted} finished run(s) older than {days} day(s)");
    Ok(())
}

/// `troupe serve` until SIGTERM or Ctrl-C; a second signal exits at once.
async fn serve(config: Config, auth: Auth, deps: Deps, membership: Option<Membership>) -> anyhow::Result<()> {
    let cluster = match membership {
        Some(membership) => Some((membership, config.cluster.timing().map_err(anyhow::Error::msg)?.2)),
        None => None,
    };
    let node = cluster.as_ref().map(|(membership, _)| membership.node.name.clone());
    let prometheus =
        crate::server::install_prometheus(node.as_deref()).context("cannot install the metrics recorder")?;
    let shutdown = CancellationToken::new();
    let signals = shutdown.clone();
    tokio::spawn(async move {
        let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                return;
            }
        };
        for round in 0.. {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
            if round > 0 {
                eprintln!("troupe: second signal; exiting now (runs resume on the next start)");
                std::process::exit(130);
            }
            tracing::info!("shutting down: finishing requests in flight; send the signal again to exit at once");
            signals.cancel();
        }
    });
    // Retention, every store.gc_interval (ended runs only: nothing a run in
    // flight needs); it stops with the daemon.
    tokio::spawn(crate::store::retention::run_periodically(deps.store.clone(), config.store.clone(), shutdown.clone()));
    let daemon = Daemon {
        runtime: config.runtime,
        server: config.server,
        quotas: config.quotas,
        auth,
        deps,
        prometheus: Some(prometheus),
        cluster,
    };
    daemon
        .run(shutdown, |address| {
            // The first line of stdout, for people and for scripts that bind port 0.
            println!("troupe listening on http://{address}");
        })
        .await
}
