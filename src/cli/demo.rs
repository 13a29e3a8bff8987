//! `troupe demo`: one agent run in-process, kept in the configured store, with its
//! events printed as they are committed. Runs a previous process left unfinished in
//! that store are resumed alongside.

use std::sync::Arc;
use std::time::Duration;

use std::io::Write;

use futures::StreamExt;
use troupe_actors::config::{AgentConfig, RuntimeConfig};
use troupe_actors::llm::ModelRegistry;
use troupe_actors::protocol::{EventKind, RunId, RunStatus};
use troupe_actors::store::RunStore;
use troupe_actors::tool::ToolRegistry;
use troupe_actors::{Deps, Runtime, SubmitRequest};

use crate::cli::view::View;

/// What to run and how to show it.
pub struct DemoArgs {
    /// The agent.
    pub agent: String,
    /// The request.
    pub question: String,
    /// One JSON event per line instead of the human view.
    pub json: bool,
}

/// Runs the demo; returns the run's terminal status.
pub async fn run(
    config: RuntimeConfig,
    store: Arc<dyn RunStore>,
    models: ModelRegistry,
    tools: ToolRegistry,
    agents: Vec<AgentConfig>,
    args: DemoArgs,
) -> anyhow::Result<RunStatus> {
    let deps = Deps { store, models, tools, hooks: Vec::new(), agents };
    let runtime = Runtime::start(config, deps).await?;
    let run_id = runtime.submit(SubmitRequest::new(args.agent, args.question)).await?;
    let mut events = runtime.subscribe(run_id, 0);
    let mut view = View::new(false);
    let mut out = std::io::stdout().lock();
    while let Some(event) = events.next().await {
        let event = event?;
        if args.json {
            writeln!(out, "{}", serde_json::to_string(&event)?)?;
        } else {
            view.event(&mut out, &event)?;
        }
        if matches!(event.kind, EventKind::WaitingInput { .. }) {
            // The demo has no way to answer; the run stays parked in the store.
            break;
        }
    }
    let status = runtime.get(run_id).await?.map_or(RunStatus::Failed, |run| run.status);
    runtime.shutdown(Duration::from_secs(5)).await;
    Ok(status)
}

/// Starts the runtime on `store`, which resumes every unfinished run there, and
/// waits until they have all ended (parked runs stay parked). Returns each run with
/// its status.
pub async fn resume(
    config: RuntimeConfig,
    store: Arc<dyn RunStore>,
    models: ModelRegistry,
    tools: ToolRegistry,
    agents: Vec<AgentConfig>,
) -> anyhow::Result<Vec<(RunId, RunStatus)>> {
    let unfinished = store.unfinished_runs().await?;
    let deps = Deps { store, models, tools, hooks: Vec::new(), agents };
    let runtime = Runtime::start(config, deps).await?;
    let mut ended = Vec::with_capacity(unfinished.len());
    for run_id in unfinished {
        // A run that parks on a question waits for input, not for us.
        ended.push((run_id, runtime.wait_settled(run_id).await?.status));
    }
    runtime.shutdown(Duration::from_secs(5)).await;
    Ok(ended)
}
