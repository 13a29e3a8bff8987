//! `troupe demo`: one agent run in-process, kept in the configured store, with its
//! events printed as they are committed. Runs a previous process left unfinished in
//! that store are resumed alongside.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use troupe_actors::config::{AgentConfig, RuntimeConfig};
use troupe_actors::llm::ModelRegistry;
use troupe_actors::planner;
use troupe_actors::protocol::{CallStatus, EventKind, RunEvent, RunId, RunStatus};
use troupe_actors::store::RunStore;
use troupe_actors::tool::ToolRegistry;
use troupe_actors::{Deps, Runtime, SubmitRequest};

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
    while let Some(event) = events.next().await {
        let event = event?;
        if args.json {
            println!("{}", serde_json::to_string(&event)?);
        } else if let Some(text) = render(&event) {
            println!("{text}");
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

/// The human view of one event; `None` for events it leaves out.
fn render(event: &RunEvent) -> Option<String> {
    let text = match &event.kind {
        EventKind::RunStarted { agent, input } => format!("▶ run {} · agent {agent}\n  {input}", event.run_id),
        EventKind::TurnStart { turn } => format!("── turn {turn}"),
        EventKind::ReasoningStep { summary, .. } => format!("  · {summary}"),
        EventKind::ToolCallEnd { tool, status, duration_ms, summary, .. } => {
            let mark = if *status == CallStatus::Completed { "✓" } else { "✗" };
            // The plan is shown by `plan_updated`; other results get one short line.
            let shown: String = if tool == "todo_write" {
                String::new()
            } else {
                summary.lines().next().unwrap_or_default().chars().take(100).collect()
            };
            format!("  {mark} {tool} ({duration_ms} ms) {shown}")
        }
        EventKind::ToolSkipped { tool, reason, detail, .. } => {
            format!("  ⊘ {tool} skipped ({}): {detail}", reason.as_str())
        }
        EventKind::PlanUpdated { plan } => {
            let mut lines = vec![format!("  plan v{}:", plan.version)];
            for item in &plan.items {
                lines.push(format!("    {} {}", planner::marker(item.status), item.content));
            }
            lines.join("\n")
        }
        EventKind::Review { review, .. } => format!(
            "  review: {} · quality {:.2} · completeness {:.2}{}",
            review.recommendation.as_str(),
            review.quality_score,
            review.completeness,
            if review.status == troupe_actors::protocol::ReviewStatus::Degraded { " (degraded)" } else { "" }
        ),
        EventKind::WaitingInput { prompt } => format!("  ? {prompt}"),
        EventKind::DecodeError { detail, .. } => format!("  ! could not decode a tool call: {detail}"),
        EventKind::Error { code, message } => format!("  ! {code}: {message}"),
        EventKind::FinalOutput { text, .. } => format!("\n{text}\n"),
        EventKind::RunEnd { status, reason } => {
            format!("■ {}{}", status.as_str(), reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default())
        }
        _ => return None,
    };
    Some(text)
}
