//! Tool calls: what the model asks for, what became of it (`ToolOutcome`,
//! `CallStatus`), its telemetry record, and the documents results carry and
//! answers cite.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::protocol::RunId;

/// A tool call as the model asked for it.
///
/// `args` should be a JSON object. A model client that could not parse the
/// model's argument text passes it on as a JSON string; the validation hook
/// turns that into an `invalid_args` result the model sees.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ToolCall {
    /// The model's id for the call; tool results refer to it.
    pub call_id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments.
    pub args: Value,
}

/// A document a tool result cites; runs keep them deduplicated by `id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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
            // The same text as `value.to_string()`, written into a buffer directly
            // rather than through a formatter.
            Self::Ok { value, .. } => serde_json::to_string(value).unwrap_or_default(),
            Self::Failed { code, message } => format!("error ({code}): {message}"),
            Self::Skipped { reason, detail } => format!("skipped ({}): {detail}", reason.as_str()),
            Self::Interrupted => {
                "interrupted: the call was cut off and was not repeated; check its effect before retrying".to_owned()
            }
        }
    }
}

/// The life of one tool call: planned → started → completed | failed | skipped | interrupted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ToolExecutionRecord {
    /// The run.
    pub run: RunId,
    /// The turn the call belongs to.
    pub turn: u32,
    /// The model's call id.
    pub call_id: String,
    /// The tool's name as the model gave it.
    pub tool: String,
    /// The arguments as executed, after the hooks' rewrites (in a `started`
    /// record, written before the hooks run: as the model gave them).
    pub args: Value,
    /// The arguments as the model gave them, when a hook rewrote them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_args: Option<Value>,
    /// When the call was started (or skipped).
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    #[schemars(with = "String")]
    pub started_at: DateTime<Utc>,
    /// Wall time of the call, 0 for skipped calls.
    pub duration_ms: u64,
    /// Cost the tool reported.
    pub cost_usd: f64,
    /// A short summary of the result.
    pub result_summary: String,
    /// Citable documents the result added.
    pub fragments_added: usize,
    /// Their ids.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fragment_ids: Vec<String>,
    /// Where the call stands.
    pub status: CallStatus,
    /// The error code or skip reason, if any.
    pub error: Option<String>,
    /// What went wrong, in words (the failure's message, the skip's detail).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    /// The agent whose run made the call.
    #[serde(default)]
    pub agent: String,
    /// Where the tool lives: `builtin` (the runtime answers it), `local` (a tool
    /// of this daemon), `mcp:SERVER` (an MCP server's), or what the tool says.
    #[serde(default)]
    pub connector: String,
}

impl ToolExecutionRecord {
    /// The record of `call`, `started` now, with its arguments as the model gave them.
    pub fn started(run: RunId, agent: &str, connector: String, turn: u32, call: &ToolCall) -> Self {
        Self {
            run,
            turn,
            call_id: call.call_id.clone(),
            tool: call.name.clone(),
            args: call.args.clone(),
            original_args: None,
            started_at: Utc::now(),
            duration_ms: 0,
            cost_usd: 0.0,
            result_summary: String::new(),
            fragments_added: 0,
            fragment_ids: Vec::new(),
            status: CallStatus::Started,
            error: None,
            error_message: None,
            agent: agent.to_owned(),
            connector,
        }
    }

    /// The record as `outcome` ended the call: its status, error and summary (at
    /// most 200 characters of what the model reads).
    pub fn ended(mut self, outcome: &ToolOutcome) -> Self {
        self.status = outcome.status();
        (self.error, self.error_message) = match outcome {
            ToolOutcome::Ok { .. } => (None, None),
            ToolOutcome::Failed { code, message } => (Some(code.clone()), Some(message.clone())),
            ToolOutcome::Skipped { reason, detail } => (Some(reason.as_str().to_owned()), Some(detail.clone())),
            ToolOutcome::Interrupted => {
                (Some("interrupted".to_owned()), Some("the call was cut off before it ended".to_owned()))
            }
        };
        let text = outcome.to_model_text();
        self.result_summary = match text.char_indices().nth(200) {
            Some((cut, _)) => format!("{}…", &text[..cut]),
            None => text,
        };
        self
    }
}

/// A citation of the final answer: marker `[n]` resolved to a document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Citation {
    /// The `n` of the `[n]` marker.
    pub marker: usize,
    /// The cited document.
    pub fragment: Fragment,
}
