//! Events: what a run reports, in order (`RunEvent`, `EventKind`); the SSE
//! stream and the store's event log carry them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::protocol::{
    CallStatus, Citation, Plan, Review, RunId, RunStatus, SkipReason, ToolCall, ToolExecutionRecord, Usage,
};

/// One event of a run. `seq` is gap-free and strictly increasing per run;
/// SSE uses it as the event id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RunEvent {
    /// The run.
    pub run_id: RunId,
    /// Position in the run's event sequence, from 1.
    pub seq: u64,
    /// When the event was made.
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    #[schemars(with = "String")]
    pub ts: DateTime<Utc>,
    /// The run that started this one as a sub-run, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<RunId>,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// What happened, one variant per SSE `event:` name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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
    /// A reflecting agent's reasoning (`reflect = true`): about the request
    /// before its first action, about its answer after each one.
    Thought {
        /// The turn it comes before (`before_acting`) or after (`after_response`).
        turn: u32,
        /// When it was made.
        stage: ThoughtStage,
        /// What it concluded (boxed, like the review).
        thought: Box<Thought>,
    },
    /// An agent step's turn ended (see `[[steps]]`): its trace record. The run id
    /// is the trace's id.
    StepEnd {
        /// The turn it took.
        turn: u32,
        /// Its place among the agent's steps, from 1.
        order: u32,
        /// The tool it calls, or `answer` (the model answers) or `finish`.
        name: String,
        /// What went in: the call's arguments, the prompt or the answer.
        input: Value,
        /// What came out: the call's result or the answer (at most 500 characters).
        output: String,
        /// Whether it did its work (`completed`), or how it ended (`failed`, …).
        status: String,
        /// From the turn's start to its end, retries' pauses included.
        latency_ms: u64,
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
        /// The sub-run that waits, when it is one of this run's sub-runs (input
        /// sent to this run goes to it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sub_run: Option<RunId>,
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
        /// The sub-run whose call it is, when it is one of this run's sub-runs
        /// (a decision sent to this run goes to it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sub_run: Option<RunId>,
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
    /// The model provider failed in a way that may pass (overloaded, unreachable):
    /// the run waits and asks again; it fails only once `runtime.model_outage_wait`
    /// is spent.
    ModelRetry {
        /// The turn whose model call failed.
        turn: u32,
        /// Failures in a row so far.
        attempt: u32,
        /// The failure's stable code (`model_status`, `model_transport`, …).
        code: String,
        /// Detail.
        message: String,
        /// Milliseconds until the next try.
        retry_in_ms: u64,
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
            Self::Thought { .. } => "thought",
            Self::StepEnd { .. } => "step_end",
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
            Self::ModelRetry { .. } => "model_retry",
            Self::Error { .. } => "error",
        }
    }
}

/// When a reflecting agent reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ThoughtStage {
    /// About the request, before the run's first action.
    BeforeActing,
    /// About the answer the agent just gave.
    AfterResponse,
}

/// A reflecting agent's structured reasoning, as the model wrote it (checked
/// against this shape).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Thought {
    /// What the user asks for, in the agent's words.
    pub understanding: String,
    /// What is needed to answer it (after a response: what is still missing).
    #[serde(default)]
    pub needs: Vec<String>,
    /// The tools to use next.
    #[serde(default)]
    pub tools: Vec<String>,
    /// Why.
    pub why: String,
    /// Whether the response fully answers the request (after a response; before
    /// acting, nothing has been answered yet).
    pub complete: bool,
}
