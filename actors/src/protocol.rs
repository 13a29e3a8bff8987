//! The shared vocabulary of troupe: ids, run specs, plans, tool calls and outcomes,
//! reviews, events and usage. Every type here is plain serde data; actor messages
//! live beside their actors and are never serialized.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

/// A run's id: a UUID v7, so ids sort by creation time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RunId(pub Uuid);

impl RunId {
    /// A new, time-ordered id.
    pub fn new() -> Self {
        Self(Uuid::now_v7())
    }
}

impl Default for RunId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::str::FromStr for RunId {
    type Err = uuid::Error;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(text).map(Self)
    }
}

/// Per-run bounds. Every loop of a run ends on one of these.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Turns before the run is forced into one last tool-free synthesis call.
    pub max_turns: u32,
    /// Tool calls of one turn that run at the same time.
    pub max_parallel_tools: usize,
    /// Total tokens (input + output) the run may spend; `None` means unbounded.
    pub max_tokens: Option<u64>,
    /// Total cost in USD the run may spend; `None` means unbounded.
    pub max_cost_usd: Option<f64>,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_turns: 15, max_parallel_tools: 4, max_tokens: None, max_cost_usd: None }
    }
}

/// What a client asks for: one request to one agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSpec {
    /// The configured agent that answers.
    pub agent: String,
    /// The user's request.
    pub input: String,
    /// Overrides of the agent's limits; `None` keeps the agent's.
    #[serde(default)]
    pub limits: Option<Limits>,
}

/// Where a run is in its life. Terminal states never change again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Accepted, its session not started yet.
    Queued,
    /// A session is driving it.
    Running,
    /// Parked until `input` arrives (an `ask_user` call).
    WaitingInput,
    /// Finished with a final answer.
    Succeeded,
    /// Ended by an error, a budget or a supervision meltdown.
    Failed,
    /// Ended by a client.
    Cancelled,
}

impl RunStatus {
    /// Whether the run can never change again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }

    /// The snake_case name, as used in metrics labels and the store.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::WaitingInput => "waiting_input",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

/// The status of one task of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    /// Not started.
    Pending,
    /// Being worked on; at most one task is.
    InProgress,
    /// Done.
    Completed,
    /// Cannot proceed (a blocked tool, missing input).
    Blocked,
    /// Tried and failed.
    Failed,
}

/// One task of a plan, as written by the model's `todo_write`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TodoItem {
    /// Unique within the plan.
    pub id: String,
    /// What the task is.
    pub content: String,
    /// Where it stands.
    pub status: TaskStatus,
    /// Tools the task expects to use.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<String>,
    /// What the task produced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// Why it failed or is blocked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A run's task list. `version` grows by one on every accepted write.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// 0 for the empty plan of a new run.
    pub version: u64,
    /// The tasks, in the model's order.
    pub items: Vec<TodoItem>,
}

impl Plan {
    /// How many tasks have `status`.
    pub fn count(&self, status: TaskStatus) -> usize {
        self.items.iter().filter(|item| item.status == status).count()
    }
}

/// A tool call as the model asked for it.
///
/// `args` should be a JSON object. A model client that could not parse the
/// model's argument text passes it on as a JSON string; the validation hook
/// turns that into an `invalid_args` result the model sees.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The model's id for the call; tool results refer to it.
    pub call_id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments.
    pub args: Value,
}

/// A document a tool result cites; runs keep them deduplicated by `id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fragment {
    /// Stable id of the document.
    pub id: String,
    /// Where it came from (a URL, a mailbox, a file).
    pub source: String,
    /// Its title.
    #[serde(default)]
    pub title: String,
    /// The cited part.
    #[serde(default)]
    pub snippet: String,
}

/// Why a call did not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// An identical call already succeeded in this run.
    Duplicate,
    /// The tool failed too often in this run and is cooling down.
    Blocked,
    /// Unknown tool, malformed JSON or a schema violation.
    InvalidArgs,
    /// A hook or policy refused it.
    Denied,
}

impl SkipReason {
    /// The snake_case name, as used in metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Duplicate => "duplicate",
            Self::Blocked => "blocked",
            Self::InvalidArgs => "invalid_args",
            Self::Denied => "denied",
        }
    }
}

/// What became of a tool call. Every call ends in exactly one of these.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ToolOutcome {
    /// The tool returned a value.
    Ok {
        /// The result the model sees.
        value: Value,
        /// Documents the result cites.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        fragments: Vec<Fragment>,
    },
    /// The tool ran and failed (an error, a timeout, a crash).
    Failed {
        /// Stable machine-readable code (`timeout`, `worker_crashed`, …).
        code: String,
        /// Human-readable detail the model sees.
        message: String,
    },
    /// The hook chain did not let it run.
    Skipped {
        /// Why.
        reason: SkipReason,
        /// Detail the model sees.
        detail: String,
    },
    /// Cut off by a crash or a cancel; a side-effecting call is never re-run.
    Interrupted,
}

impl ToolOutcome {
    /// A failure with a code and a message.
    pub fn failed(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Failed { code: code.into(), message: message.into() }
    }

    /// A skip with a reason and a detail.
    pub fn skipped(reason: SkipReason, detail: impl Into<String>) -> Self {
        Self::Skipped { reason, detail: detail.into() }
    }

    /// The record status this outcome ends in.
    pub fn status(&self) -> CallStatus {
        match self {
            Self::Ok { .. } => CallStatus::Completed,
            Self::Failed { .. } => CallStatus::Failed,
            Self::Skipped { .. } => CallStatus::Skipped,
            Self::Interrupted => CallStatus::Interrupted,
        }
    }

    /// The text the model sees as the tool's result.
    pub fn to_model_text(&self) -> String {
        match self {
            Self::Ok { value: Value::String(text), .. } => text.clone(),
            Self::Ok { value, .. } => value.to_string(),
            Self::Failed { code, message } => format!("error ({code}): {message}"),
            Self::Skipped { reason, detail } => format!("skipped ({}): {detail}", reason.as_str()),
            Self::Interrupted => {
                "interrupted: the call was cut off and was not repeated; check its effect before retrying".to_owned()
            }
        }
    }
}

/// The life of one tool call: planned → started → completed | failed | skipped | interrupted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallStatus {
    /// Requested by the model, not yet handed to a worker.
    Planned,
    /// Committed as started; a crash now leaves it `started` in the store.
    Started,
    /// Returned a value.
    Completed,
    /// Returned an error.
    Failed,
    /// Stopped by the hook chain.
    Skipped,
    /// Cut off by a crash or a cancel.
    Interrupted,
}

impl CallStatus {
    /// The snake_case name, as used in metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Planned => "planned",
            Self::Started => "started",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Skipped => "skipped",
            Self::Interrupted => "interrupted",
        }
    }
}

/// Telemetry of one tool call, skipped ones included. Written for every call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolExecutionRecord {
    /// The run.
    pub run: RunId,
    /// The turn the call belongs to.
    pub turn: u32,
    /// The model's call id.
    pub call_id: String,
    /// The tool's name as the model gave it.
    pub tool: String,
    /// The arguments as executed (after rewrites).
    pub args: Value,
    /// When the call was started (or skipped).
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub started_at: DateTime<Utc>,
    /// Wall time of the call, 0 for skipped calls.
    pub duration_ms: u64,
    /// Cost the tool reported.
    pub cost_usd: f64,
    /// A short summary of the result.
    pub result_summary: String,
    /// Citable documents the result added.
    pub fragments_added: usize,
    /// Where the call stands.
    pub status: CallStatus,
    /// The error code or skip reason, if any.
    pub error: Option<String>,
}

/// Whether a review came from its intended reviewer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReviewStatus {
    /// The configured reviewer produced it.
    Ok,
    /// The rule-based fallback produced it because the configured one failed.
    Degraded,
}

/// What the reviewer advises after a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Recommendation {
    /// Carry on (or accept the final answer).
    Proceed,
    /// The answer is premature: keep working while turns remain.
    GatherMore,
    /// The request is unclear.
    ClarifyQuery,
    /// The plan no longer fits: revise it.
    Replan,
}

impl Recommendation {
    /// The snake_case name, as used in metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Proceed => "proceed",
            Self::GatherMore => "gather_more",
            Self::ClarifyQuery => "clarify_query",
            Self::Replan => "replan",
        }
    }
}

/// The reviewer's verdict on one turn. Scores are in 0..=1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Review {
    /// Whether the configured reviewer produced it.
    pub status: ReviewStatus,
    /// How well the turn's work went.
    pub quality_score: f64,
    /// How much of the plan is done.
    pub completeness: f64,
    /// How well the output addresses the request.
    pub relevance: f64,
    /// Whether the run lacks information it needs.
    pub needs_more_data: bool,
    /// What is missing.
    pub gaps: Vec<String>,
    /// What to do next.
    pub suggested_actions: Vec<String>,
    /// The advice.
    pub recommendation: Recommendation,
    /// A revised task list, with `replan`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_plan: Option<Vec<TodoItem>>,
    /// Free-form notes, shown to the model next turn.
    pub notes: String,
}

/// Tokens and money spent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Cost in USD.
    pub cost_usd: f64,
}

impl Usage {
    /// Input plus output tokens.
    pub fn total_tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }

    /// Adds `other` to `self`.
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cost_usd += other.cost_usd;
    }
}

/// A citation of the final answer: marker `[n]` resolved to a document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Citation {
    /// The `n` of the `[n]` marker.
    pub marker: usize,
    /// The cited document.
    pub fragment: Fragment,
}

/// One event of a run. `seq` is gap-free and strictly increasing per run;
/// SSE uses it as the event id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunEvent {
    /// The run.
    pub run_id: RunId,
    /// Position in the run's event sequence, from 1.
    pub seq: u64,
    /// When the event was made.
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub ts: DateTime<Utc>,
    /// The run that started this one as a sub-run, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<RunId>,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// What happened, one variant per SSE `event:` name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventKind {
    /// The run was accepted.
    RunStarted {
        /// The agent.
        agent: String,
        /// The request.
        input: String,
    },
    /// A turn began.
    TurnStart {
        /// Its number, from 1.
        turn: u32,
    },
    /// A piece of the model's streamed reply.
    AssistantDelta {
        /// The turn.
        turn: u32,
        /// The text.
        text: String,
        /// Whether this is the model's reasoning rather than its answer.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        reasoning: bool,
    },
    /// A short human line on what the agent is doing.
    ReasoningStep {
        /// The turn.
        turn: u32,
        /// E.g. "Searching emails for 'delivery'".
        summary: String,
    },
    /// The model asked for tool calls.
    ToolRequests {
        /// The turn.
        turn: u32,
        /// The calls.
        calls: Vec<ToolCall>,
    },
    /// A tool call was handed to the executor.
    ToolCallStart {
        /// The turn.
        turn: u32,
        /// The call.
        call_id: String,
        /// The tool.
        tool: String,
        /// Its arguments.
        args: Value,
    },
    /// A tool call finished (completed, failed or interrupted).
    ToolCallEnd {
        /// The turn.
        turn: u32,
        /// The call.
        call_id: String,
        /// The tool.
        tool: String,
        /// How it ended.
        status: CallStatus,
        /// Wall time.
        duration_ms: u64,
        /// Short summary of the result.
        summary: String,
    },
    /// The hook chain stopped a call.
    ToolSkipped {
        /// The turn.
        turn: u32,
        /// The call.
        call_id: String,
        /// The tool.
        tool: String,
        /// Why.
        reason: SkipReason,
        /// Detail.
        detail: String,
    },
    /// Telemetry of one call.
    ToolMetric {
        /// The record (boxed: it is the largest payload, and events are moved often).
        record: Box<ToolExecutionRecord>,
    },
    /// The plan changed.
    PlanUpdated {
        /// The new plan.
        plan: Plan,
    },
    /// The reviewer's verdict on a turn.
    Review {
        /// The turn.
        turn: u32,
        /// The verdict (boxed, like the tool metric record).
        review: Box<Review>,
    },
    /// Tokens spent by one model call, and the run's totals.
    TokenUsage {
        /// The turn.
        turn: u32,
        /// This call.
        usage: Usage,
        /// The run so far.
        total: Usage,
    },
    /// A model's tool call could not be decoded.
    DecodeError {
        /// The turn.
        turn: u32,
        /// What was wrong.
        detail: String,
    },
    /// The run is parked until input arrives.
    WaitingInput {
        /// The question for the user.
        prompt: String,
    },
    /// Input arrived for a parked run.
    InputReceived {
        /// The input.
        text: String,
    },
    /// A turn ended.
    TurnEnd {
        /// The turn.
        turn: u32,
    },
    /// The final answer.
    FinalOutput {
        /// The answer.
        text: String,
        /// Its resolved citations.
        citations: Vec<Citation>,
    },
    /// The run reached a terminal state; the last event of every run.
    RunEnd {
        /// The terminal status.
        status: RunStatus,
        /// Why, for anything but success.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// A call waits for a human's approval (`POST /v1/runs/{id}/input` with
    /// `approve`); the run parks once its other calls are done.
    ApprovalRequested {
        /// The turn.
        turn: u32,
        /// The call.
        call_id: String,
        /// The tool.
        tool: String,
        /// Its arguments.
        args: Value,
        /// Why it needs approval.
        reason: String,
    },
    /// A human approved or rejected a call.
    ApprovalDecided {
        /// The turn.
        turn: u32,
        /// The call.
        call_id: String,
        /// The tool.
        tool: String,
        /// Approved (it runs) or rejected (the model is told why).
        approved: bool,
        /// The human's reason, if given.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Something went wrong that the client should see.
    Error {
        /// Stable code.
        code: String,
        /// Detail.
        message: String,
    },
}

impl EventKind {
    /// The SSE `event:` name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::RunStarted { .. } => "run_started",
            Self::TurnStart { .. } => "turn_start",
            Self::AssistantDelta { .. } => "assistant_delta",
            Self::ReasoningStep { .. } => "reasoning_step",
            Self::ToolRequests { .. } => "tool_requests",
            Self::ToolCallStart { .. } => "tool_call_start",
            Self::ToolCallEnd { .. } => "tool_call_end",
            Self::ToolSkipped { .. } => "tool_skipped",
            Self::ToolMetric { .. } => "tool_metric",
            Self::PlanUpdated { .. } => "plan_updated",
            Self::Review { .. } => "review",
            Self::TokenUsage { .. } => "token_usage",
            Self::DecodeError { .. } => "decode_error",
            Self::WaitingInput { .. } => "waiting_input",
            Self::InputReceived { .. } => "input_received",
            Self::TurnEnd { .. } => "turn_end",
            Self::FinalOutput { .. } => "final_output",
            Self::RunEnd { .. } => "run_end",
            Self::ApprovalRequested { .. } => "approval_requested",
            Self::ApprovalDecided { .. } => "approval_decided",
            Self::Error { .. } => "error",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_serialize_with_kind_tag_and_seq() {
        let event = RunEvent {
            run_id: RunId::new(),
            seq: 7,
            ts: Utc::now(),
            parent_run_id: None,
            kind: EventKind::TurnStart { turn: 2 },
        };
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(json["kind"], "turn_start");
        assert_eq!(json["seq"], 7);
        assert_eq!(json["turn"], 2);
        let back: RunEvent = serde_json::from_value(json).unwrap();
        assert_eq!(back, event);
    }

    #[test]
    fn outcome_text_names_the_reason() {
        let skipped = ToolOutcome::skipped(SkipReason::Duplicate, "same as call c1");
        assert_eq!(skipped.to_model_text(), "skipped (duplicate): same as call c1");
        assert_eq!(skipped.status(), CallStatus::Skipped);
    }
}
