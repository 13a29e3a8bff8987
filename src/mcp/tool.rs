//! An MCP server's tool as a troupe [`Tool`]: the name the model sees, argument
//! validation against the server's current `inputSchema`, the call, and its result.
//! The tool holds no connection of its own: each call takes the server's current
//! one, so a reconnection or a refreshed tool list is seen by the next call.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rmcp::ServiceError;
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock};
use serde_json::{Value, json};
use troupe_actors::llm::ToolDefinition;
use troupe_actors::tool::{Tool, ToolContext, ToolError, ToolOutput};

use crate::mcp::listing::RemoteTool;
use crate::mcp::supervisor::ServerShared;

/// One of a server's tools, registered in the runtime's registry under the name
/// the model sees.
pub struct McpTool {
    name: String,
    /// What the registry keeps; the model sees the server's current description
    /// through [`Tool::current_definition`] whenever the server has listed the tool.
    description: String,
    server: Arc<ServerShared>,
}

impl McpTool {
    /// The tool `name` (`server__tool`) of `server`.
    pub(crate) fn new(name: String, server: Arc<ServerShared>) -> Self {
        let description = match server.tools().get(&name) {
            Some(remote) => remote.definition.description.clone(),
            None => format!("A tool of the MCP server {}, which has not listed it (yet).", server.name),
        };
        Self { name, description, server }
    }

    fn failed(&self, code: &str, message: String) -> ToolError {
        ToolError::failed(code, message)
    }
}

#[async_trait]
impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn connector(&self) -> String {
        format!("mcp:{}", self.server.name)
    }

    /// Any object: the arguments are checked in [`McpTool::call`] against the
    /// schema the server lists now, which may change while the daemon runs.
    fn parameters(&self) -> Value {
        json!({"type": "object"})
    }

    fn timeout(&self) -> Option<Duration> {
        Some(self.server.call_timeout)
    }

    fn current_definition(&self) -> Option<Arc<ToolDefinition>> {
        self.server.tools().get(&self.name).map(|remote| remote.definition.clone())
    }

    async fn call(&self, _context: ToolContext, args: Value) -> Result<ToolOutput, ToolError> {
        let server = &self.server.name;
        let connection = self.server.connection().map_err(|why| {
            self.failed("mcp_unavailable", format!("the MCP server {server} is not connected ({why}); retrying"))
        })?;
        let mut tools = self.server.tools();
        if !tools.contains_key(&self.name) {
            tools = self.server.relist(&connection).await;
        }
        let Some(remote) = tools.get(&self.name) else {
            let mut offered: Vec<&str> = tools.keys().map(String::as_str).collect();
            offered.sort_unstable();
            return Err(self.failed(
                "mcp_tool_unavailable",
                format!("the MCP server {server} does not offer {} now (it offers: {})", self.name, offered.join(", ")),
            ));
        };
        let arguments = match args {
            Value::Object(map) => map,
            Value::Null => serde_json::Map::new(),
            _ => return Err(ToolError::InvalidArgs("arguments must be a JSON object".to_owned())),
        };
        validate(remote, &arguments)?;
        let mut params = CallToolRequestParams::new(remote.remote_name.clone()).with_arguments(arguments);
        // The call's span (`execute_tool`) as the parent of the server's work, in
        // the request's `_meta` as MCP carries trace context (stdio and HTTP alike).
        if let Some(traceparent) = crate::otel::traceparent_of(&tracing::Span::current()) {
            rmcp::model::RequestParamsMeta::set_traceparent(&mut params, &traceparent);
        }
        match connection.peer.call_tool(params).await {
            Ok(result) => output(result),
            Err(error) => Err(self.call_failed(&connection, error)),
        }
    }
}

impl McpTool {
    /// A call that did not get a result. A broken transport also tells the
    /// supervisor to reconnect.
    fn call_failed(&self, connection: &crate::mcp::supervisor::Connection, error: ServiceError) -> ToolError {
        let server = &self.server.name;
        match error {
            ServiceError::McpError(error) => self.failed("mcp_error", format!("{server}: {}", error.message)),
            ServiceError::Timeout { timeout } => {
                self.failed("timeout", format!("the MCP server {server} did not answer within {timeout:?}"))
            }
            error @ (ServiceError::TransportSend(_)
            | ServiceError::TransportClosed
            | ServiceError::Cancelled { .. }) => {
                connection.lost.cancel();
                self.failed(
                    "mcp_unavailable",
                    format!("the connection to the MCP server {server} failed ({error}); reconnecting"),
                )
            }
            error => self.failed("mcp_error", format!("{server}: {error}")),
        }
    }
}

fn validate(remote: &RemoteTool, arguments: &serde_json::Map<String, Value>) -> Result<(), ToolError> {
    let validator = remote.validator.as_ref().map_err(|message| {
        ToolError::failed("mcp_bad_schema", format!("the tool's input schema does not compile: {message}"))
    })?;
    let instance = Value::Object(arguments.clone());
    let problems: Vec<String> = validator
        .iter_errors(&instance)
        .take(5)
        .map(|error| {
            let path = error.instance_path().to_string();
            format!("{}: {error}", if path.is_empty() { "/" } else { &path })
        })
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ToolError::InvalidArgs(format!("arguments do not match the schema: {}", problems.join("; "))))
    }
}

/// What the model sees of a result: the structured content if any, else the text
/// blocks joined (other blocks, such as images, are named but not inlined). A
/// result marked `isError` is a tool failure.
fn output(result: CallToolResult) -> Result<ToolOutput, ToolError> {
    let text = result.content.iter().map(block_text).collect::<Vec<_>>().join("\n");
    if result.is_error == Some(true) {
        let message = if text.is_empty() { "the tool reported an error".to_owned() } else { text };
        return Err(ToolError::failed("mcp_tool_error", message));
    }
    Ok(ToolOutput::value(result.structured_content.unwrap_or(Value::String(text))))
}

fn block_text(block: &ContentBlock) -> String {
    match block.as_text() {
        Some(text) => text.text.clone(),
        None => {
            let kind = serde_json::to_value(block)
                .ok()
                .and_then(|value| value.get("type").and_then(Value::as_str).map(str::to_owned))
                .unwrap_or_else(|| "non-text".to_owned());
            format!("[{kind} content omitted]")
        }
    }
}
