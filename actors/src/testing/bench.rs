//! The benchmark workload, shared by the in-process and the durability benches.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::config::{AgentConfig, RuntimeConfig};
use crate::llm::ModelRegistry;
use crate::protocol::CallStatus;
use crate::protocol::RunStatus;
use crate::runtime::{Deps, Runtime, SubmitRequest};
use crate::store::RunStore;
use crate::testing::{EchoTool, ScriptedModel, calls, text, todo};
use crate::tool::ToolRegistry;
use crate::tool_pool::ToolPoolConfig;

/// Turns of every benchmark run: a `todo_write`, two parallel tool calls, an answer.
pub const TURNS_PER_RUN: u64 = 3;

/// Tool calls of every benchmark run that go through the tool pool (the two
/// `echo` calls; `todo_write` is the planner's).
const CALLS_PER_RUN: usize = 2;

/// A runtime on `store` with the benchmark agent, its model answering at once.
pub async fn start(store: Arc<dyn RunStore>, model: ScriptedModel, max_active_runs: usize) -> Result<Runtime, String> {
    let tools = ToolRegistry::new().with(Arc::new(EchoTool)).map_err(|error| error.to_string())?;
    let agent = AgentConfig::new("bench", "You are a benchmark.", vec!["echo".into()]);
    // The scripted answer leaves a task open; no reflection turn, so every run
    // has exactly three turns. Room in the tool queue for both calls of every
    // run: a full queue fails calls at once (`pool_overloaded`), which would
    // make the work measured depend on timing.
    let config = RuntimeConfig {
        max_active_runs,
        max_active_runs_per_tenant: 0,
        max_reflections: 0,
        tool_pool: ToolPoolConfig { queue_limit: CALLS_PER_RUN * max_active_runs, ..ToolPoolConfig::default() },
        ..RuntimeConfig::default()
    };
    let deps =
        Deps { store, models: ModelRegistry::new(Arc::new(model)), tools, hooks: Vec::new(), agents: vec![agent] };
    Runtime::start(config, deps).await.map_err(|error| error.to_string())
}

/// Turns per second and CPU microseconds per turn of `runs` concurrent runs on
/// `store`. `followed`: every run has a live subscriber reading all its events
/// (as an SSE client would); otherwise their end is noticed by polling.
pub async fn throughput(store: Arc<dyn RunStore>, runs: usize, followed: bool) -> Result<(f64, f64), String> {
    let model = ScriptedModel::per_turn(vec![
        calls(&[("todo_write", todo(&[("1", "echo", "in_progress"), ("2", "answer", "pending")]))]),
        calls(&[("echo", json!({"text": "a"})), ("echo", json!({"text": "b"}))]),
        text("done"),
    ])
    .quiet();
    let runtime = Arc::new(start(store.clone(), model, runs.max(1)).await?);
    let cpu_before = cpu_time();
    let clock = Instant::now();
    let mut handles = Vec::with_capacity(runs);
    for index in 0..runs {
        let runtime = runtime.clone();
        handles.push(tokio::spawn(async move {
            let run_id = runtime.submit(SubmitRequest::new("bench", format!("run {index}"))).await;
            let run_id = run_id.map_err(|error| error.to_string())?;
            if followed {
                runtime.wait(run_id).await.map_err(|error| error.to_string())?;
            }
            Ok::<_, String>(run_id)
        }));
    }
    let mut run_ids = Vec::with_capacity(runs);
    for handle in handles {
        run_ids.push(handle.await.map_err(|error| error.to_string())??);
    }
    while runtime.active_runs().await > 0 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let wall = clock.elapsed();
    let cpu = cpu_time().saturating_sub(cpu_before);
    for run_id in run_ids {
        let snapshot = store.load(run_id).await.map_err(|error| error.to_string())?.ok_or("a run vanished")?;
        let record = &snapshot.run;
        if record.status != RunStatus::Succeeded || u64::from(record.turn) != TURNS_PER_RUN {
            return Err(format!("run {run_id} ended {:?} after {} turns", record.status, record.turn));
        }
        let calls = &snapshot.tool_executions;
        let completed = calls.iter().filter(|call| call.tool == "echo" && call.status == CallStatus::Completed);
        if completed.count() != CALLS_PER_RUN {
            let outcomes: Vec<_> = calls.iter().map(|call| (&call.tool, call.status, &call.error)).collect();
            return Err(format!("run {run_id}: its echo calls did not all complete: {outcomes:?}"));
        }
    }
    let turns = runs as u64 * TURNS_PER_RUN;
    Ok((turns as f64 / wall.as_secs_f64(), cpu.as_secs_f64() * 1e6 / turns as f64))
}

/// User plus system CPU time of this process, from /proc (Linux).
pub fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let fields: Vec<&str> =
        stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let ticks: u64 = fields.get(11).and_then(|f| f.parse().ok()).unwrap_or(0)
        + fields.get(12).and_then(|f| f.parse().ok()).unwrap_or(0);
    // The kernel's USER_HZ is 100 on every mainstream Linux build.
    Duration::from_millis(ticks * 10)
}
