//! Settings of the runtime and of agents, as plain serde data. The `troupe` binary
//! reads them from files and the environment; this crate only receives them.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::hooks::HookConfig;
use crate::planner::PlannerConfig;
use crate::protocol::Limits;
use crate::steps::AgentStep;
use crate::tool_pool::ToolPoolConfig;

/// Serde for durations written as seconds; kept here under its old path.
pub use crate::duration_secs;

/// How many restarts a supervised actor gets before its supervisor gives up on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RestartPolicy {
    /// Restarts allowed within `period`; one more is a meltdown.
    pub max_restarts: usize,
    /// The sliding window.
    #[serde(with = "duration_secs")]
    pub period: Duration,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        Self { max_restarts: 3, period: Duration::from_secs(60) }
    }
}

/// Settings of the whole runtime.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RuntimeConfig {
    /// Runs with a live session at once; more wait in the run queue.
    pub max_active_runs: usize,
    /// Of those, runs one tenant may have; 0 for no per-tenant limit.
    pub max_active_runs_per_tenant: usize,
    /// Runs waiting (stored as `queued`) for a slot; beyond it, and beyond the
    /// per-tenant bound, submissions are refused.
    pub max_queued_runs: usize,
    /// Of those, runs of one tenant; 0 for no per-tenant bound.
    pub max_queued_runs_per_tenant: usize,
    /// Restart intensity per run session (a meltdown fails the run) and for the
    /// shared actors (a meltdown stops the runtime).
    pub restarts: RestartPolicy,
    /// The tool pool.
    pub tool_pool: ToolPoolConfig,
    /// The built-in hooks.
    pub hooks: HookConfig,
    /// Which tool calls wait for a human.
    pub approvals: crate::approvals::ApprovalConfig,
    /// The planner.
    pub planner: PlannerConfig,
    /// Live events buffered per run for subscribers; a slower subscriber catches
    /// up from the store.
    pub event_buffer: usize,
    /// Levels of sub-runs (`run_agent`) a run may start below it: 1 lets a run
    /// call agents that cannot call further.
    pub max_agent_depth: u32,
    /// Times a final answer may be sent back by a `gather_more` review.
    pub max_reflections: u32,
    /// Longest a model call may take, streaming included; the model client's own
    /// timeouts (connect, first byte, idle stream) should fire first.
    #[serde(with = "duration_secs")]
    pub model_timeout: Duration,
    /// How long a run waits out a model provider that stays overloaded or
    /// unreachable (after the client's own retries), asking again with growing
    /// pauses (2 s, 4 s, … up to 60 s), before it fails. Zero: it fails at once.
    #[serde(with = "duration_secs")]
    pub model_outage_wait: Duration,
    /// The pause before an agent step's call that failed is tried again (it is
    /// tried [`crate::steps::STEP_ATTEMPTS`] times in all), doubled for each
    /// further try.
    #[serde(with = "duration_secs")]
    pub step_retry_backoff: Duration,
    /// The tool guide: for each tool name, the text the system prompt shows for
    /// it (purpose, when to use it, parameters, an example). Not a config key:
    /// the binary loads it from `config/tools.md`.
    #[serde(skip)]
    pub tool_docs: std::sync::Arc<std::collections::BTreeMap<String, String>>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            max_active_runs: 64,
            max_active_runs_per_tenant: 16,
            max_queued_runs: 256,
            max_queued_runs_per_tenant: 64,
            restarts: RestartPolicy::default(),
            tool_pool: ToolPoolConfig::default(),
            hooks: HookConfig::default(),
            approvals: crate::approvals::ApprovalConfig::default(),
            planner: PlannerConfig::default(),
            event_buffer: 256,
            max_agent_depth: 2,
            max_reflections: 1,
            model_timeout: Duration::from_secs(600),
            model_outage_wait: Duration::from_secs(300),
            step_retry_backoff: Duration::from_secs(1),
            tool_docs: Default::default(),
        }
    }
}

/// Which reviewer judges an agent's turns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ReviewerKind {
    /// Deterministic rules (see `reviewer::rule_based`).
    #[default]
    RuleBased,
    /// A model judges, with the rules as the fallback.
    Model {
        /// The model's name; `None` uses the agent's model.
        #[serde(default)]
        model: Option<String>,
    },
}

impl ReviewerKind {
    /// `rule_based` or `model`, as configured.
    pub fn name(&self) -> &'static str {
        match self {
            Self::RuleBased => "rule_based",
            Self::Model { .. } => "model",
        }
    }
}

/// An agent: instructions, a model, tools and limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// Unique name.
    pub name: String,
    /// The system prompt.
    #[serde(default)]
    pub instructions: String,
    /// The model's name; `None` uses the default model.
    #[serde(default)]
    pub model: Option<String>,
    /// Tools it may call, beyond the built-in `todo_write` and `ask_user`.
    #[serde(default)]
    pub tools: Vec<String>,
    /// Default limits of its runs.
    #[serde(default)]
    pub limits: Limits,
    /// Its reviewer.
    #[serde(default)]
    pub reviewer: ReviewerKind,
    /// Its answers must rest on what its tools return: an answer given before any
    /// of its tools returned a result is sent back once by the rule-based review.
    #[serde(default)]
    pub grounded: bool,
    /// Built-ins offered to every agent that this one is not offered
    /// (`todo_write`, `ask_user`): an agent that should never ask the user, say.
    #[serde(default)]
    pub without_builtins: Vec<String>,
    /// Tool calls its runs open with, in order, before the model takes over
    /// (see [`crate::steps`]).
    #[serde(default)]
    pub steps: Vec<AgentStep>,
    /// It reasons before its first action and after each answer (see
    /// `session/reflect.rs`): a `thought` event each time, and an answer its
    /// reasoning finds incomplete gets another turn. Not with `steps`.
    #[serde(default)]
    pub reflect: bool,
    /// Calls of tools that ask for a human which go without one in a confidently
    /// classified run (see [`crate::approvals::AutoApproval`]).
    #[serde(default)]
    pub auto_approve: Vec<crate::approvals::AutoApproval>,
}

impl AgentConfig {
    /// An agent with default limits and the rule-based reviewer.
    pub fn new(name: impl Into<String>, instructions: impl Into<String>, tools: Vec<String>) -> Self {
        Self {
            name: name.into(),
            instructions: instructions.into(),
            model: None,
            tools,
            limits: Limits::default(),
            reviewer: ReviewerKind::RuleBased,
            grounded: false,
            without_builtins: Vec::new(),
            steps: Vec::new(),
            reflect: false,
            auto_approve: Vec::new(),
        }
    }
}
