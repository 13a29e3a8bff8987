//! An MCP server's tool list as troupe sees it: the names the model sees
//! (`server__tool`), each tool's definition and compiled `inputSchema`.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;
use troupe_actors::llm::ToolDefinition;

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
