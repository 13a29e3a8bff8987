//! Drives each task of an eval through the runtime, one at a time, and follows
//! its events until the run ends or parks.

use std::time::{Duration, Instant};

use futures::StreamExt;
use troupe_actors::protocol::EventKind;
use troupe_actors::{Runtime, SubmitRequest};

use crate::eval::report::{Report, TaskResult};
use crate::eval::{Outcome, Task, judge};

/// How to run an eval.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    /// A task's wall-time limit unless it sets its own.
    pub timeout: Duration,
}

impl Default for EvalOptions {
    fn default() -> Self {
        Self { timeout: Duration::from_secs(300) }
    }
}

/// Runs `tasks` in order on `runtime`, calling `progress` after each, and returns
/// the report. Tasks run one at a time, so their times do not disturb each other.
pub async fn run(
    runtime: &Runtime,
    tasks: &[Task],
    options: &EvalOptions,
    mut progress: impl FnMut(&TaskResult),
) -> Report {
    let started = Instant::now();
    let mut results = Vec::with_capacity(tasks.len());
    for task in tasks {
        let result = run_task(runtime, task, options).await;
        progress(&result);
        results.push(result);
    }
    Report { results, wall: started.elapsed() }
}

async fn run_task(runtime: &Runtime, task: &Task, options: &EvalOptions) -> TaskResult {
    let started = Instant::now();
    let run_id = match runtime.submit(SubmitRequest::new(task.agent.clone(), task.input.clone())).await {
        Ok(run_id) => run_id,
        Err(error) => return TaskResult::not_run(task, format!("not submitted: {error}")),
    };
    let mut outcome = Outcome::default();
    let limit = task.timeout(options.timeout);
    let followed = tokio::time::timeout(limit, follow(runtime, run_id, &mut outcome)).await;
    let wall = started.elapsed();
    let mut failures = match followed {
        Err(_) => vec![format!("timed out after {} s", limit.as_secs())],
        Ok(Err(error)) => vec![format!("lost the run's events: {error}")],
        Ok(Ok(())) => Vec::new(),
    };
    if !failures.is_empty() || outcome.status.is_some_and(|status| !status.is_terminal()) {
        // A parked or overdue run is of no further use to the eval.
        let _ = runtime.cancel(run_id).await;
    }
    if failures.is_empty()
        && let Err(reasons) = judge(&task.expect, &outcome)
    {
        failures = reasons;
    }
    TaskResult::new(task, run_id.to_string(), outcome, failures, wall)
}

/// Follows the run's events into `outcome` until it ends or parks.
async fn follow(
    runtime: &Runtime,
    run_id: troupe_actors::protocol::RunId,
    outcome: &mut Outcome,
) -> anyhow::Result<()> {
    let mut events = runtime.subscribe(run_id, 0);
    while let Some(event) = events.next().await {
        let event = event?;
        outcome.observe(&event);
        if matches!(event.kind, EventKind::RunEnd { .. } | EventKind::WaitingInput { .. }) {
            return Ok(());
        }
    }
    anyhow::bail!("the event stream ended before the run did")
}
