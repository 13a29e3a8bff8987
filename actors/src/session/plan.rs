//! The run's plan: `todo_write` calls answered through the planner, the planner
//! spawned on first use and restarted from the last committed plan, and a plan
//! the reviewer replaces.

use std::time::Instant;

use chrono::Utc;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use serde_json::Value;
use tracing::warn;

use crate::metrics;
use crate::planner::{Planner, PlannerMsg};
use crate::protocol::{EventKind, TodoItem, ToolCall, ToolOutcome};
use crate::session::results::Answered;
use crate::session::state::Live;
use crate::session::{Session, SessionMsg};
use crate::store::StoreWrite;
use crate::tool_pool::ToolResult;

impl Session {
    /// Answers `todo_write` through the planner.
    pub(super) async fn todo_write(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        turn: u32,
        index: usize,
        call: ToolCall,
    ) -> Result<ToolResult, ActorProcessingErr> {
        let started_at = Utc::now();
        let clock = Instant::now();
        let args = call.args.clone();
        let planner = self.planner(myself, live).await?;
        let reply = ractor::call!(planner, |reply| PlannerMsg::Write { args, reply });
        let outcome = match reply {
            Ok(Ok(plan)) => {
                live.plan = plan.clone();
                live.outbox.write(StoreWrite::Plan(plan.clone()));
                live.outbox.emit(EventKind::PlanUpdated { plan: plan.clone() });
                ToolOutcome::Ok { value: Value::String(crate::planner::render(&plan)), fragments: Vec::new() }
            }
            Ok(Err(error)) => ToolOutcome::failed("invalid_plan", error.to_string()),
            Err(error) => {
                warn!(run_id = %live.run.run_id, %error, "planner unreachable; restarting it");
                self.restart_planner(myself, live).await?;
                ToolOutcome::failed("planner_unavailable", "the planner restarted; write the list again")
            }
        };
        let elapsed = clock.elapsed().as_millis() as u64;
        Ok(self.builtin_result(live, Answered { turn, index, call, outcome, started_at, duration_ms: elapsed }))
    }

    pub(super) async fn restart_planner(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
    ) -> Result<(), ActorProcessingErr> {
        metrics::actor_restarted("planner");
        live.planner = None;
        self.planner(myself, live).await.map(drop)
    }

    /// The run's planner, spawned from the last committed plan if it has none.
    pub(super) async fn planner(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
    ) -> Result<ActorRef<PlannerMsg>, ActorProcessingErr> {
        if let Some(planner) = &live.planner {
            return Ok(planner.clone());
        }
        let planner = Planner { config: self.shared.config.planner.clone() };
        let (planner, _) = Actor::spawn_linked(None, planner, live.plan.clone(), myself.get_cell()).await?;
        live.planner = Some(planner.clone());
        Ok(planner)
    }

    /// Replaces the plan with the reviewer's (a `replan` review); a plan the
    /// planner rejects, or an unreachable planner, leaves the plan as it was.
    pub(super) async fn replan(
        &self,
        myself: &ActorRef<SessionMsg>,
        live: &mut Live,
        items: Vec<TodoItem>,
    ) -> Result<(), ActorProcessingErr> {
        let planner = self.planner(myself, live).await?;
        match ractor::call!(planner, |reply| PlannerMsg::Replace { items, reply }) {
            Ok(Ok(plan)) => {
                live.plan = plan.clone();
                live.outbox.write(StoreWrite::Plan(plan.clone()));
                live.outbox.emit(EventKind::PlanUpdated { plan });
            }
            Ok(Err(error)) => {
                warn!(run_id = %live.run.run_id, %error, "reviewer's plan rejected")
            }
            Err(error) => warn!(run_id = %live.run.run_id, %error, "planner unreachable"),
        }
        Ok(())
    }
}
