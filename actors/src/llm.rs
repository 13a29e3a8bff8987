//! The model port: how the core talks to a language model. A chat request (messages
//! and tool definitions) becomes a stream of deltas ending in one final reply. The
//! core never retries: retries, pools and timeouts belong to the client behind this
//! trait.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::protocol::{ToolCall, Usage};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Instructions for the model.
    System,
    /// The user (and the reviewer's notes, which speak to the model as input).
    User,
    /// The model.
    Assistant,
    /// A tool result.
    Tool,
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// Its text.
    pub content: String,
    /// Tool calls the assistant asked for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For a tool result: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A message with text only.
    pub fn text(role: Role, content: impl Into<String>) -> Self {
        Self { role, content: content.into(), tool_calls: Vec::new(), tool_call_id: None }
    }

    /// A tool result answering `call_id`.
    pub fn tool_result(call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: Role::Tool, content: content.into(), tool_calls: Vec::new(), tool_call_id: Some(call_id.into()) }
    }
}

/// A tool as offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDefinition {
    /// Its name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON Schema of its arguments.
    pub parameters: Value,
}

/// Whether the model may call tools.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// No tool calls (the synthesis call).
    None,
    /// A call of this tool, and nothing else (an agent step the model writes).
    Tool(String),
}

impl ToolChoice {
    /// The names of the tools of `tools` the model may call.
    pub fn callable(&self, tools: &[Arc<ToolDefinition>]) -> Vec<String> {
        match self {
            Self::Auto => tools.iter().map(|tool| tool.name.clone()).collect(),
            Self::None => Vec::new(),
            Self::Tool(name) => tools.iter().filter(|tool| &tool.name == name).map(|tool| tool.name.clone()).collect(),
        }
    }
}

/// One request to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// The conversation, system prompt first.
    pub messages: Vec<Message>,
    /// Tools on offer; shared, since the same definitions go out every turn.
    pub tools: Vec<Arc<ToolDefinition>>,
    /// Whether tools may be called.
    pub tool_choice: ToolChoice,
    /// Upper bound on the reply's tokens.
    pub max_tokens: Option<u32>,
    /// Sampling temperature.
    pub temperature: Option<f32>,
}

/// A piece of a streamed reply.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelDelta {
    /// Answer text.
    Text(String),
    /// Reasoning text, for models that expose it.
    Reasoning(String),
}

/// The model's complete reply.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelReply {
    /// The answer text (empty when it only calls tools).
    pub content: String,
    /// Tool calls, in the model's order.
    pub tool_calls: Vec<ToolCall>,
    /// Tokens and cost of this call.
    pub usage: Usage,
    /// Tool calls the client could not decode, for `decode_error` events.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decode_errors: Vec<String>,
}

/// One item of a model stream: deltas, then exactly one `Done`.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelChunk {
    /// A piece of the reply as it streams.
    Delta(ModelDelta),
    /// The whole reply; the stream ends after it.
    Done(ModelReply),
}

/// Why a model call failed, after the client's own retries.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The server answered with an error status.
    #[error("model returned status {status}: {message}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// What it said (secrets removed).
        message: String,
    },
    /// The connection failed or broke.
    #[error("model transport error: {0}")]
    Transport(String),
    /// No reply in time.
    #[error("model timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// Too many requests queued for the provider.
    #[error("model overloaded: {0}")]
    Overloaded(String),
    /// The reply could not be understood.
    #[error("model reply could not be decoded: {0}")]
    Decode(String),
    /// The stream ended without a final reply.
    #[error("model stream ended without a reply")]
    Incomplete,
    /// The model client panicked.
    #[error("the model client crashed")]
    Crashed,
    /// The model cannot be used at all (e.g. its file is missing); the message says
    /// how to fix it.
    #[error("model unavailable: {0}")]
    Unavailable(String),
    /// The prompt and the reply do not fit in the model's context.
    #[error("the prompt has {tokens} tokens; with room for the reply it exceeds the model's context of {limit}")]
    ContextOverflow {
        /// Tokens of the prompt.
        tokens: usize,
        /// Tokens the model's context holds for one request.
        limit: usize,
    },
    /// A locally run model failed while computing.
    #[error("model inference failed: {0}")]
    Inference(String),
}

impl ModelError {
    /// Whether the failure may pass if the call is made again later: the provider
    /// is overloaded or unreachable (429 but a spent quota, 408, 5xx, a broken
    /// connection, a stream cut short). A refusal (400, 401, 403, 404, quota), a
    /// call over `model_timeout`, an undecodable reply or an unusable model stays.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Status { status: 429, message } => {
                !(message.contains("insufficient_quota") || message.contains("quota_exceeded"))
            }
            Self::Status { status, .. } => matches!(status, 408 | 500 | 502 | 503 | 504),
            Self::Transport(_) | Self::Overloaded(_) | Self::Incomplete => true,
            Self::Timeout(_)
            | Self::Decode(_)
            | Self::Crashed
            | Self::Unavailable(_)
            | Self::ContextOverflow { .. }
            | Self::Inference(_) => false,
        }
    }

    /// A stable code for events and metrics.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Status { .. } => "model_status",
            Self::Transport(_) => "model_transport",
            Self::Timeout(_) => "model_timeout",
            Self::Overloaded(_) => "model_overloaded",
            Self::Decode(_) => "model_decode",
            Self::Incomplete => "model_incomplete",
            Self::Crashed => "model_crashed",
            Self::Unavailable(_) => "model_unavailable",
            Self::ContextOverflow { .. } => "model_context_overflow",
            Self::Inference(_) => "model_inference",
        }
    }
}

/// The stream a model call returns. Dropping it cancels the call.
pub type ModelStream = BoxStream<'static, Result<ModelChunk, ModelError>>;

/// A language model.
#[async_trait]
pub trait ModelClient: Send + Sync + 'static {
    /// The model's name in the registry, for logs.
    fn name(&self) -> &str;

    /// What the model is (the provider's model id, the local model's), for the
    /// `model` label of metrics; by default its name.
    fn model_id(&self) -> &str {
        self.name()
    }

    /// Starts a call. The stream yields deltas and ends with `ModelChunk::Done`.
    async fn chat(&self, request: ChatRequest) -> Result<ModelStream, ModelError>;

    /// Tokens the model reads and writes in one call (prompt and reply), if
    /// known: a prompt that would not fit is compacted first.
    fn context_window(&self) -> Option<usize> {
        None
    }
}

/// Models by name, with a default for agents that name none.
#[derive(Clone)]
pub struct ModelRegistry {
    default: Arc<dyn ModelClient>,
    named: HashMap<String, Arc<dyn ModelClient>>,
}

impl ModelRegistry {
    /// A registry whose every lookup falls back to `default`.
    pub fn new(default: Arc<dyn ModelClient>) -> Self {
        Self { default, named: HashMap::new() }
    }

    /// Adds a model under `name`.
    pub fn with(mut self, name: impl Into<String>, model: Arc<dyn ModelClient>) -> Self {
        self.named.insert(name.into(), model);
        self
    }

    /// The same models with `model` as the default.
    pub fn with_default(mut self, model: Arc<dyn ModelClient>) -> Self {
        self.default = model;
        self
    }

    /// The default model.
    pub fn fallback(&self) -> Arc<dyn ModelClient> {
        self.default.clone()
    }

    /// The names of the named models, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.named.keys().cloned().collect();
        names.sort();
        names
    }

    /// The model called `name`, or the default for `None`.
    pub fn get(&self, name: Option<&str>) -> Option<Arc<dyn ModelClient>> {
        match name {
            None => Some(self.default.clone()),
            Some(name) => self.named.get(name).cloned(),
        }
    }
}
