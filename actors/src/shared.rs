//! What every actor of the runtime shares: [`RuntimeShared`] (the store, models,
//! tools, agents, settings), the current refs of the shared actors
//! ([`Handles`]), [`end_run`], which ends a run that has no live session, and
//! the budget rule both a session and a submission apply (`over_budget`).
//! It sits below the session, the supervisor and the runtime, which all use it.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use chrono::Utc;
use ractor::ActorRef;

use crate::config::{AgentConfig, RuntimeConfig};
use crate::events::EventHub;
use crate::llm::{ModelRegistry, ToolDefinition};
use crate::metrics;
use crate::protocol::{EventKind, Limits, RunEvent, RunId, RunStatus, Usage};
use crate::reviewer::ReviewerMsg;
use crate::store::{Commit, RunStore, StoreError, StoreWrite};
use crate::tool_pool::{PoolShared, ToolPoolMsg};

/// What every actor of the runtime shares (read-only but for the handles).
pub struct RuntimeShared {
    /// Where runs live.
    pub store: Arc<dyn RunStore>,
    /// The models.
    pub models: ModelRegistry,
    /// Tools, hooks and the default tool time limit.
    pub pool: Arc<PoolShared>,
    /// The agents by name; sessions share them.
    pub agents: HashMap<String, Arc<AgentConfig>>,
    /// Current refs of the shared actors.
    pub handles: Handles,
    /// Live event channels.
    pub hub: Arc<EventHub>,
    /// Settings.
    pub config: RuntimeConfig,
    /// Every tool the runtime can offer, described by the tool guide, by name.
    pub described_tools: HashMap<String, Arc<ToolDefinition>>,
}

/// The current refs of the shared actors; sessions read them on every use, so a
/// restarted pool or reviewer is picked up at once.
#[derive(Default)]
pub struct Handles {
    tool_pool: RwLock<Option<ActorRef<ToolPoolMsg>>>,
    reviewer: RwLock<Option<ActorRef<ReviewerMsg>>>,
    /// Set once the runtime begins to shut down: sessions stopping then are not
    /// runs that ended.
    shutting_down: std::sync::atomic::AtomicBool,
}

impl Handles {
    /// Marks the runtime as shutting down.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the runtime is shutting down.
    pub fn shutting_down(&self) -> bool {
        self.shutting_down.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The tool pool, unless it is being restarted.
    pub fn tool_pool(&self) -> Option<ActorRef<ToolPoolMsg>> {
        self.tool_pool.read().ok().and_then(|guard| guard.clone())
    }

    /// The reviewer, unless it is being restarted.
    pub fn reviewer(&self) -> Option<ActorRef<ReviewerMsg>> {
        self.reviewer.read().ok().and_then(|guard| guard.clone())
    }

    pub(crate) fn set_tool_pool(&self, pool: Option<ActorRef<ToolPoolMsg>>) {
        if let Ok(mut guard) = self.tool_pool.write() {
            *guard = pool;
        }
    }

    pub(crate) fn set_reviewer(&self, reviewer: Option<ActorRef<ReviewerMsg>>) {
        if let Ok(mut guard) = self.reviewer.write() {
            *guard = reviewer;
        }
    }
}

/// Ends a run that has no live session: `run_end` and the status, committed
/// together. Used for meltdowns and for cancels of runs without a session.
pub async fn end_run(
    shared: &RuntimeShared,
    run_id: RunId,
    status: RunStatus,
    reason: String,
) -> Result<(), StoreError> {
    let Some(run) = shared.store.get_run(run_id).await? else {
        return Err(StoreError::NotFound(run_id));
    };
    if run.status.is_terminal() {
        return Ok(());
    }
    let last = shared.store.load(run_id).await?.map_or(0, |snapshot| snapshot.last_seq);
    let mut events = Vec::new();
    if status == RunStatus::Failed {
        events.push(RunEvent {
            run_id,
            seq: last + 1,
            ts: Utc::now(),
            parent_run_id: run.parent_run_id,
            kind: EventKind::Error { code: "run_failed".to_owned(), message: reason.clone() },
        });
    }
    let kind = EventKind::RunEnd { status, reason: Some(reason.clone()) };
    events.push(RunEvent {
        run_id,
        seq: last + 1 + events.len() as u64,
        ts: Utc::now(),
        parent_run_id: run.parent_run_id,
        kind,
    });
    let writes = vec![StoreWrite::Status { status, reason: Some(reason) }];
    let commit = Commit { run_id, writes, events };
    shared.store.commit(&commit).await?;
    shared.hub.publish(run_id, commit.events);
    shared.hub.close(run_id);
    metrics::run_finished(&run.agent, status.as_str());
    Ok(())
}

/// Why the run may not call the model again, if it may not.
pub(crate) fn over_budget(limits: &Limits, usage: &Usage) -> Option<String> {
    if let Some(max) = limits.max_tokens
        && usage.total_tokens() >= max
    {
        return Some(format!("the token budget of {max} is spent ({} used)", usage.total_tokens()));
    }
    if let Some(max) = limits.max_cost_usd
        && usage.cost_usd >= max
    {
        return Some(format!("the cost budget of ${max:.4} is spent (${:.4} used)", usage.cost_usd));
    }
    None
}
