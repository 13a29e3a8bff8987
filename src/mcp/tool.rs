//! An MCP server's tool as a troupe [`Tool`]: the name the model sees, argument
//! validation against the server's current `inputSchema`, the call, and its result.
//! The tool holds no connection of its own: each call takes the server's current
//! one, so a reconnection or a refreshed tool list is seen by the next call.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rmcp::ServiceError;
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock};
use serde_json::{Value, json};
use troupe_actors::llm::ToolDefinition;
use troupe_actors::tool::{Tool, ToolContext, ToolError, ToolOutput};

use crate::mcp::supervisor::ServerShared;

/// Between the server's name and the tool's in the name the model sees. OpenAI
/// tool names must match `^[a-zA-Z0-9_-]{1,64}$`, so `.` is not allowed there.
pub const SEPARATOR: &str = "__";

/// The longest tool name OpenAI accepts.
const MAX_NAME_LEN: usize = 64;

/// The name offered to the model for `tool` of `server`: `server__tool`, with
/// every character OpenAI does not allow replaced by `_`. `None` if too long.
pub fn exposed_name(server: &str, tool: &str) -> Option<String> {
    let tool: String =
        tool.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect();
    let name = format!("{server}{SEPARATOR}{tool}");
    (!tool.is_empty() && name.len() <= MAX_NAME_LEN).then_some(name)
}

/// A tool as the server last listed it.
pub struct RemoteTool {
    /// Its name on the server.
    pub remote_name: String,
    /// What the model sees: our name, its description, its `inputSchema`.
    pub definition: Arc<ToolDefinition>,
    /// Its `inputSchema`, compiled offline (no remote `$ref` is fetched); the
    /// compiler's complaint if it does not compile.
    pub validator: Result<jsonschema::Validator, String>,
}

/// A server's tools by the names the model sees.
pub type ToolSet = HashMap<String, Arc<RemoteTool>>;

/// The tool set of one listing. Tools whose name is too long, or collides with
/// another's once made safe, are left out with a warning.
pub fn tool_set(server: &str, tools: Vec<rmcp::model::Tool>) -> ToolSet {
    let mut set = ToolSet::new();
    for tool in tools {
        let Some(name) = exposed_name(server, &tool.name) else {
            tracing::warn!(server, tool = %tool.name, "mcp tool left out: its name is too long for a model tool name");
            continue;
        };
        if let Some(other) = set.get(&name) {
            tracing::warn!(server, tool = %tool.name, other = %other.remote_name, name, "mcp tool left out: its name collides with another's");
            continue;
        }
        let schema = Value::Object((*tool.input_schema).clone());
        let validator = jsonschema::options().offline().build(&schema).map_err(|error| error.to_string());
        let description = tool
            .description
            .as_deref()
            .or(tool.title.as_deref())
            .map(str::to_owned)
            .unwrap_or_else(|| format!("Tool {} of the MCP server {server}.", tool.name));
        let definition = Arc::new(ToolDefinition { name: name.clone(), description, parameters: schema });
        set.insert(name, Arc::new(RemoteTool { remote_name: tool.name.into_owned(), definition, validator }));
    }
    set
}

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
        let params = CallToolRequestParams::new(remote.remote_name.clone()).with_arguments(arguments);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_valid_openai_tool_names() {
        assert_eq!(exposed_name("time", "get_current_time").as_deref(), Some("time__get_current_time"));
        assert_eq!(exposed_name("fs", "files/read.v2").as_deref(), Some("fs__files_read_v2"));
        assert_eq!(exposed_name("x", &"a".repeat(70)), None);
        assert_eq!(exposed_name("x", ""), None);
    }
}
