//! A call and its result: the [`WorkItem`] a worker runs, the [`ToolResult`] it
//! reports, and how a finished call is booked ([`finish`], [`book`]) — by a
//! worker, by the pool for a call whose worker crashed, and by a reply dropped
//! unanswered.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::hooks::{HookChain, RunLedger};
use crate::metrics;
use crate::protocol::{Fragment, RunId, ToolCall, ToolExecutionRecord, ToolOutcome, Usage};
use crate::tool::ToolRegistry;

/// A call to execute, as the worker sees it.
#[derive(Clone)]
pub struct WorkItem {
    /// The run.
    pub run_id: RunId,
    /// The run's tenant.
    pub tenant: String,
    /// The run's agent.
    pub agent: String,
    /// The turn.
    pub turn: u32,
    /// The call's position in the turn, part of its idempotency key.
    pub index: usize,
    /// The call as the model asked for it.
    pub call: ToolCall,
    /// The run's hook state.
    pub ledger: Arc<RunLedger>,
    /// The run's cancellation.
    pub cancel: CancellationToken,
    /// The span the call's span is a child of (its turn's).
    pub span: tracing::Span,
}

/// The result of one call, with everything the session commits.
#[derive(Debug, Clone)]
pub struct ToolResult {
    /// The turn.
    pub turn: u32,
    /// The call's position in the turn.
    pub index: usize,
    /// The call as the model asked for it.
    pub call: ToolCall,
    /// What became of it.
    pub outcome: ToolOutcome,
    /// Its telemetry.
    pub record: ToolExecutionRecord,
    /// Whether this call got its tool blocked.
    pub newly_blocked: bool,
    /// Documents first seen in this result.
    pub new_documents: Vec<Fragment>,
    /// A short human line for the `reasoning_step` event.
    pub summary: String,
    /// What the call spent, charged to the run with the result.
    pub usage: Usage,
}

/// What every worker shares: the tools, the hooks and the default time limit.
pub struct PoolShared {
    /// The tools.
    pub registry: ToolRegistry,
    /// The hook chain.
    pub chain: HookChain,
    /// Time limit for tools that set none.
    pub default_timeout: Duration,
    /// Configured time limits by tool name, ahead of the tool's own.
    pub timeouts: HashMap<String, Duration>,
}

/// A pool with no tools and no hooks, and `call` as the first call of turn 1 of a
/// fresh run of `agent`: a job to hand a pool directly in a test.
#[cfg(test)]
pub(crate) fn bare_job(agent: &str, call: ToolCall) -> (Arc<PoolShared>, WorkItem) {
    let shared = Arc::new(PoolShared {
        registry: ToolRegistry::new(),
        chain: HookChain::new(crate::hooks::HookConfig::default(), Vec::new()),
        default_timeout: Duration::from_secs(30),
        timeouts: HashMap::new(),
    });
    let work = WorkItem {
        run_id: RunId::new(),
        tenant: "default".into(),
        agent: agent.into(),
        turn: 1,
        index: 0,
        call,
        ledger: Arc::new(RunLedger::new()),
        cancel: CancellationToken::new(),
        span: tracing::Span::none(),
    };
    (shared, work)
}

/// The deterministic idempotency key of call `index` of `turn`.
pub fn idempotency_key(run_id: RunId, turn: u32, index: usize) -> String {
    format!("{run_id}:{turn}:{index}")
}

/// Books a finished call (rule 5 of the hook chain) and builds its result. Also used
/// by the pool for calls whose worker crashed.
pub fn finish(
    shared: &PoolShared,
    work: &WorkItem,
    outcome: ToolOutcome,
    started_at: DateTime<Utc>,
    elapsed: Duration,
    usage: Usage,
) -> ToolResult {
    let summary = match shared.registry.get(&work.call.name) {
        Some(registered) => crate::tool::describe_end(registered.tool.as_ref(), &outcome),
        None => format!("{} is not a known tool", work.call.name),
    };
    book(shared, work, Ending { outcome, started_at, elapsed, usage }, summary)
}

/// How a call ended, as [`book`] records it.
#[derive(Debug, Clone)]
pub struct Ending {
    /// What became of it.
    pub outcome: ToolOutcome,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// How long it ran.
    pub elapsed: Duration,
    /// What it spent.
    pub usage: Usage,
}

impl Ending {
    /// A call that ended as it started, without running or costing anything.
    pub fn at_once(outcome: ToolOutcome) -> Self {
        Self { outcome, started_at: Utc::now(), elapsed: Duration::ZERO, usage: Usage::default() }
    }
}

/// Books a call without running any of the tool's code (its summary is given).
/// Safe inside `Drop`.
pub fn book(shared: &PoolShared, work: &WorkItem, ending: Ending, summary: String) -> ToolResult {
    let Ending { outcome, started_at, elapsed, usage } = ending;
    let call = &work.call;
    let status = outcome.status();
    let error = match &outcome {
        ToolOutcome::Ok { .. } => None,
        ToolOutcome::Failed { code, .. } => Some(code.clone()),
        ToolOutcome::Skipped { reason, .. } => Some(reason.as_str().to_owned()),
        ToolOutcome::Interrupted => Some("interrupted".to_owned()),
    };
    let config = &shared.chain.config;
    let newly_blocked =
        work.ledger.record(work.turn, &call.name, &call.call_id, &call.args, status, error.as_deref(), config);
    let new_documents = match &outcome {
        ToolOutcome::Ok { fragments, .. } => work.ledger.add_documents(fragments),
        _ => Vec::new(),
    };
    let duration_ms = if matches!(outcome, ToolOutcome::Skipped { .. }) { 0 } else { elapsed.as_millis() as u64 };
    // The `tool` label takes registered names only: a name the model made up is
    // `unknown`, so the series stay bounded.
    let label = if shared.registry.get(&call.name).is_some() { call.name.as_str() } else { metrics::UNKNOWN_TOOL };
    match &outcome {
        ToolOutcome::Skipped { reason, .. } => metrics::tool_skipped(label, reason.as_str()),
        _ => metrics::tool_call(label, status.as_str(), elapsed),
    }
    if newly_blocked {
        metrics::tool_blocked(label);
    }
    debug!(run_id = %work.run_id, tool = %call.name, status = status.as_str(), duration_ms, "tool call finished");
    let connector = shared.registry.connector(&call.name);
    let mut record = ToolExecutionRecord::started(work.run_id, &work.agent, connector, work.turn, call).ended(&outcome);
    record.started_at = started_at;
    record.duration_ms = duration_ms;
    record.cost_usd = usage.cost_usd;
    record.fragments_added = new_documents.len();
    record.fragment_ids = new_documents.iter().map(|fragment| fragment.id.clone()).collect();
    ToolResult {
        turn: work.turn,
        index: work.index,
        call: call.clone(),
        outcome,
        record,
        newly_blocked,
        new_documents,
        summary,
        usage,
    }
}
