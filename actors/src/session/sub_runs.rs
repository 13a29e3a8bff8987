//! Multi-agent: the built-in `list_agents` and `run_agent` tools, offered to an
//! agent that names them in its `tools`. `run_agent` starts a sub-run of another
//! configured agent: a run of its own (its own plan, reviews and events, which
//! carry `parent_run_id`), for the caller's tenant, with a budget carved from what
//! the caller has left, at most `max_agent_depth` levels deep. Its final answer
//! comes back as the call's result. The session never waits on it: a watcher task
//! follows the sub-run and reports like a tool worker; when the caller ends (or
//! its session dies), the watcher cancels a sub-run still going.

use std::sync::{Arc, LazyLock};
use std::time::Instant;

use chrono::Utc;
use futures::StreamExt;
use ractor::{ActorProcessingErr, ActorRef};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::builtin::BuiltinTool;
use crate::config::AgentConfig;
use crate::events;
use crate::llm::ToolDefinition;
use crate::protocol::{EventKind, Limits, RunEvent, RunId, RunStatus, ToolOutcome};
use crate::session::state::{Live, Phase};
use crate::session::{Session, SessionMsg};
use crate::shared::{RuntimeShared, end_run};
use crate::store::{RunRecord, StoreError, StoreWrite};
use crate::supervisor::SupervisorMsg;
use crate::tool_pool::{Ending, WorkItem, book};

/// What `list_agents` takes: nothing.
#[derive(serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ListAgentsArgs {}

/// What `run_agent` takes.
#[derive(serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct RunAgentArgs {
    /// The agent's name (see list_agents).
    agent: String,
    /// The sub-task, complete in itself.
    input: String,
}

/// `list_agents` as offered to the model.
pub fn list_agents_definition() -> Arc<ToolDefinition> {
    static DEFINITION: LazyLock<Arc<ToolDefinition>> = LazyLock::new(|| {
        Arc::new(ToolDefinition {
            name: BuiltinTool::ListAgents.name().to_owned(),
            description: "List the agents you can hand a sub-task to with run_agent, with what each does.".to_owned(),
            parameters: crate::tool::schema_of::<ListAgentsArgs>(),
        })
    });
    DEFINITION.clone()
}

/// `run_agent` as offered to the model.
pub fn run_agent_definition() -> Arc<ToolDefinition> {
    static DEFINITION: LazyLock<Arc<ToolDefinition>> = LazyLock::new(|| {
        Arc::new(ToolDefinition {
            name: BuiltinTool::RunAgent.name().to_owned(),
            description: "Hand a self-contained sub-task to another agent and get its final answer.".to_owned(),
            parameters: crate::tool::schema_of::<RunAgentArgs>(),
        })
    });
    DEFINITION.clone()
}

/// What `list_agents` answers.
pub fn list_agents(shared: &RuntimeShared) -> ToolOutcome {
    let mut agents: Vec<&Arc<AgentConfig>> = shared.agents.values().collect();
    agents.sort_by(|a, b| a.name.cmp(&b.name));
    let listed: Vec<Value> = agents
        .iter()
        .map(|agent| {
            let about = agent.instructions.lines().map(str::trim).find(|line| !line.is_empty()).unwrap_or_default();
            json!({"name": agent.name, "about": about, "tools": agent.tools})
        })
        .collect();
    ToolOutcome::Ok { value: Value::Array(listed), fragments: Vec::new() }
}

/// How deep `run_id` is: 0 for a top-level run, 1 for its sub-runs, …; stops
/// counting past `limit`.
pub async fn depth(shared: &RuntimeShared, run: &RunRecord, limit: u32) -> Result<u32, StoreError> {
    let mut depth = 0;
    let mut parent = run.parent_run_id;
    while let Some(id) = parent {
        depth += 1;
        if depth > limit {
            break;
        }
        parent = shared.store.get_run(id).await?.and_then(|run| run.parent_run_id);
    }
    Ok(depth)
}

/// The id of the sub-run of call `index` of `turn`: derived from the caller's id
/// (its time prefix kept, the call's position folded into the random part), so a
/// call dispatched again after a crash finds its sub-run instead of starting a
/// second one.
pub fn sub_run_id(parent: RunId, turn: u32, index: usize) -> RunId {
    let mut bytes = *parent.0.as_bytes();
    let tag = ((u64::from(turn) << 20) | (index as u64 & 0xf_ffff)).to_be_bytes();
    for (byte, part) in bytes[8..].iter_mut().zip(tag) {
        *byte ^= part.rotate_left(3) ^ 0x5a;
    }
    // The RFC 9562 variant bits, as in the caller's id.
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    RunId(uuid::Uuid::from_bytes(bytes))
}

/// The sub-run's limits: the agent's own, within what the caller has left.
fn carved(agent: &Limits, parent: &RunRecord) -> Limits {
    let left_tokens = parent.limits.max_tokens.map(|max| max.saturating_sub(parent.usage.total_tokens()));
    let left_cost = parent.limits.max_cost_usd.map(|max| (max - parent.usage.cost_usd).max(0.0));
    Limits {
        max_turns: agent.max_turns,
        max_parallel_tools: agent.max_parallel_tools,
        max_tokens: match (agent.max_tokens, left_tokens) {
            (Some(own), Some(left)) => Some(own.min(left)),
            (own, left) => own.or(left),
        },
        max_cost_usd: match (agent.max_cost_usd, left_cost) {
            (Some(own), Some(left)) => Some(own.min(left)),
            (own, left) => own.or(left),
        },
    }
}

impl Session {
    /// Starts the sub-run of a `run_agent` call. `Some(outcome)` when it cannot
    /// start (the call is answered at once); `None` when it runs and its watcher
    /// will answer.
    pub(super) async fn start_sub_run(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        work: WorkItem,
    ) -> Result<Option<ToolOutcome>, ActorProcessingErr> {
        let args = &work.call.args;
        let (Some(agent), Some(input)) =
            (args.get("agent").and_then(Value::as_str), args.get("input").and_then(Value::as_str))
        else {
            return Ok(Some(ToolOutcome::failed("invalid_args", "run_agent needs \"agent\" and \"input\" strings")));
        };
        let Some(target) = self.shared.agents.get(agent).cloned() else {
            let message = format!("no agent is called {agent:?}; list_agents names them");
            return Ok(Some(ToolOutcome::failed("unknown_agent", message)));
        };
        let limit = self.shared.config.max_agent_depth;
        if live.depth + 1 > limit {
            let message = format!("sub-runs may nest {limit} level(s) deep; do this part yourself");
            return Ok(Some(ToolOutcome::failed("depth_limit", message)));
        }
        let limits = carved(&target.limits, &live.run);
        if limits.max_tokens == Some(0) || limits.max_cost_usd.is_some_and(|cost| cost <= 0.0) {
            return Ok(Some(ToolOutcome::failed("budget_exceeded", "no budget is left for a sub-run")));
        }
        let child = sub_run_id(live.run.run_id, work.turn, work.index);
        if self.shared.store.get_run(child).await?.is_some() {
            // Created before a crash cut the call off: follow it, do not repeat it.
            return self.follow_sub_run(myself, live, work, child).await;
        }
        let now = Utc::now();
        let mut record =
            RunRecord::accepted(child, live.run.tenant.clone(), target.name.clone(), input.to_owned(), limits, now);
        record.parent_run_id = Some(live.run.run_id);
        // The sub-run's spans are children of its caller's turn.
        record.traceparent = crate::spans::traceparent(&live.turn_parent());
        let started = RunEvent {
            run_id: child,
            seq: 1,
            ts: now,
            parent_run_id: Some(live.run.run_id),
            kind: EventKind::RunStarted { agent: target.name.clone(), input: input.to_owned() },
        };
        self.shared.store.create_run(record, vec![started]).await?;
        crate::metrics::run_started(&target.name);
        self.follow_sub_run(myself, live, work, child).await
    }

    /// Starts the sub-run's session (a no-op when it has one) and the watcher
    /// that answers the call.
    async fn follow_sub_run(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &Live,
        work: WorkItem,
        child: RunId,
    ) -> Result<Option<ToolOutcome>, ActorProcessingErr> {
        let Some(supervisor) = myself.try_get_supervisor().map(ActorRef::<SupervisorMsg>::from) else {
            return Ok(Some(ToolOutcome::failed("unavailable", "the runtime is stopping")));
        };
        // Sub-runs take no admission slot: their caller holds one, and waiting for
        // another could deadlock a full runtime.
        let reply = ractor::call!(supervisor, |reply| SupervisorMsg::Start {
            run_id: child,
            permit: None,
            created: None,
            reply
        });
        if !matches!(reply, Ok(Ok(()))) {
            let _ = end_run(&self.shared, child, RunStatus::Failed, "the sub-run could not start".to_owned()).await;
            return Ok(Some(ToolOutcome::failed("unavailable", "the sub-run could not start")));
        }
        let watcher = Watcher {
            shared: self.shared.clone(),
            supervisor,
            session: myself.clone(),
            child,
            work,
            caller_gone: live.cancel.clone(),
        };
        tokio::spawn(watcher.watch());
        Ok(None)
    }
}

impl Session {
    /// A sub-run parked: this run shows the client its question and approvals
    /// (pointing at the sub-run) and waits with it.
    pub(super) async fn on_sub_run_waiting(
        &self,
        live: &mut Live,
        child: RunId,
        prompt: String,
        approvals: Vec<EventKind>,
    ) -> Result<(), ActorProcessingErr> {
        if !matches!(live.phase, Phase::Tools(_)) {
            return Ok(());
        }
        live.waiting_on = Some(child);
        for approval in approvals {
            if let EventKind::ApprovalRequested { turn, call_id, tool, args, reason, .. } = approval {
                let sub_run = Some(child);
                live.outbox.emit(EventKind::ApprovalRequested { turn, call_id, tool, args, reason, sub_run });
            }
        }
        live.outbox.emit(EventKind::WaitingInput { prompt, sub_run: Some(child) });
        live.outbox.write(StoreWrite::Status { status: RunStatus::WaitingInput, reason: None });
        live.run.status = RunStatus::WaitingInput;
        live.outbox.flush(&self.shared).await?;
        Ok(())
    }

    /// The sub-run this run waited on goes on: so does this run.
    pub(super) async fn on_sub_run_resumed(&self, live: &mut Live, child: RunId) -> Result<(), ActorProcessingErr> {
        if live.waiting_on != Some(child) {
            return Ok(());
        }
        live.waiting_on = None;
        if live.run.status == RunStatus::WaitingInput {
            live.run.status = RunStatus::Running;
            live.outbox.write(StoreWrite::Status { status: RunStatus::Running, reason: None });
            live.outbox.flush(&self.shared).await?;
        }
        Ok(())
    }
}

/// Follows a sub-run to its end and answers the `run_agent` call.
struct Watcher {
    shared: Arc<RuntimeShared>,
    supervisor: ActorRef<SupervisorMsg>,
    session: ActorRef<SessionMsg>,
    child: RunId,
    work: WorkItem,
    /// Cancelled when the caller ends or its session dies.
    caller_gone: CancellationToken,
}

impl Watcher {
    async fn watch(self) {
        let started_at = Utc::now();
        let clock = Instant::now();
        let ended = tokio::select! {
            ended = self.child_ended() => ended,
            () = self.caller_gone.cancelled() => false,
        };
        if !ended {
            // A runtime shutting down stops every session: the sub-run resumes with
            // the next start, like its caller. Otherwise the caller ended.
            if self.running() {
                self.cancel_child().await;
            }
            return;
        }
        let child = self.shared.store.get_run(self.child).await;
        if let Ok(Some(run)) = &child {
            // The caller pays for its sub-run: its budget bounds the whole tree.
            let _ = self.session.cast(SessionMsg::SubRunSpent { usage: run.usage });
        }
        let outcome = match child {
            Ok(Some(run)) if run.status == RunStatus::Succeeded => {
                let answer = run.final_output.unwrap_or_default();
                ToolOutcome::Ok { value: Value::String(answer), fragments: Vec::new() }
            }
            Ok(Some(run)) => ToolOutcome::failed(
                "sub_run_failed",
                format!(
                    "the {} agent's run ended {}: {}",
                    run.agent,
                    run.status.as_str(),
                    run.reason.unwrap_or_default()
                ),
            ),
            Ok(None) => ToolOutcome::failed("sub_run_failed", "the sub-run is gone"),
            Err(error) => ToolOutcome::failed("sub_run_failed", format!("the sub-run could not be read: {error}")),
        };
        let summary = format!("sub-run {} ended", self.child);
        let ending = Ending { outcome, started_at, elapsed: clock.elapsed(), usage: Default::default() };
        let result = book(&self.shared.pool, &self.work, ending, summary);
        // The caller may have ended meanwhile; then nobody needs the answer.
        let _ = self.session.cast(SessionMsg::ToolDone(Box::new(result)));
    }

    /// Follows the sub-run until it ends (true), or until the runtime stops
    /// (false). A stream that breaks (a store error, a restarted session) is
    /// opened again: the call is answered only from an ended sub-run.
    async fn child_ended(&self) -> bool {
        let mut last = 0;
        // The sub-run's approval requests not decided yet.
        let mut undecided: Vec<EventKind> = Vec::new();
        loop {
            let mut events = events::subscribe(self.shared.hub.clone(), self.shared.store.clone(), self.child, last);
            while let Some(Ok(event)) = events.next().await {
                last = event.seq;
                self.relay(&event.kind, &mut undecided);
            }
            drop(events);
            match self.shared.store.get_run(self.child).await {
                Ok(Some(run)) if !run.status.is_terminal() => {}
                Ok(_) => return true,
                Err(error) => warn!(run_id = %self.child, %error, "cannot read a sub-run; trying again"),
            }
            if !self.running() {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    /// Tells the caller when the sub-run parks for a human and when it goes on, so
    /// that the question reaches the caller's client and its answer the sub-run.
    fn relay(&self, kind: &EventKind, undecided: &mut Vec<EventKind>) {
        let child = self.child;
        match kind {
            EventKind::ApprovalRequested { .. } => undecided.push(kind.clone()),
            EventKind::ApprovalDecided { call_id, .. } => {
                undecided.retain(
                    |asked| !matches!(asked, EventKind::ApprovalRequested { call_id: id, .. } if id == call_id),
                );
                let _ = self.session.cast(SessionMsg::SubRunResumed { child });
            }
            EventKind::WaitingInput { prompt, .. } => {
                let message = SessionMsg::SubRunWaiting { child, prompt: prompt.clone(), approvals: undecided.clone() };
                let _ = self.session.cast(message);
            }
            EventKind::InputReceived { .. } => {
                let _ = self.session.cast(SessionMsg::SubRunResumed { child });
            }
            _ => {}
        }
    }

    /// Whether the runtime runs on (it is not shutting down).
    fn running(&self) -> bool {
        !self.shared.handles.shutting_down() && ractor::ACTIVE_STATES.contains(&self.supervisor.get_status())
    }

    /// Cancels a sub-run whose caller is gone.
    async fn cancel_child(&self) {
        let session = ractor::call!(self.supervisor, |reply| SupervisorMsg::Session { run_id: self.child, reply });
        match session {
            Ok(Some(session)) => {
                let reason = "its calling run ended".to_owned();
                let cancelled = ractor::call_t!(session, |reply| SessionMsg::Cancel { reason, reply }, 10_000);
                if cancelled.is_err() {
                    warn!(run_id = %self.child, "could not cancel a sub-run whose caller ended");
                }
            }
            _ => {
                let reason = "its calling run ended".to_owned();
                let _ = end_run(&self.shared, self.child, RunStatus::Cancelled, reason).await;
            }
        }
    }
}
