//! The tool port: what an agent can do. A [`Tool`] declares its name, description,
//! argument schema and effect flags; the [`ToolRegistry`] holds the tools of a
//! runtime with their compiled schema validators. Nothing but a tool worker calls
//! [`Tool::call`], and only after the hook chain let the call through.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::llm::ToolDefinition;
use crate::protocol::{Fragment, RunId, ToolOutcome, Usage};

/// The JSON Schema of a tool's arguments, derived from their type (serde and
/// schemars read the same attributes, so the schema cannot drift from the
/// parsing): an object schema, sub-schemas inlined (some model servers do not
/// follow `$ref`), without the `$schema` and `title` keys model APIs do not want.
pub fn schema_of<T: schemars::JsonSchema>() -> Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12()
        .with(|settings| settings.inline_subschemas = true)
        .for_deserialize()
        .into_generator();
    let mut schema = serde_json::to_value(generator.into_root_schema_for::<T>()).unwrap_or_default();
    if let Some(object) = schema.as_object_mut() {
        object.remove("$schema");
        object.remove("title");
        // The type's own doc comment is for Rust readers; the tool's description
        // says what the arguments are for.
        object.remove("description");
    }
    compact(&mut schema);
    schema
}

/// A schema in fewer tokens, meaning the same to a validator: an array's item
/// type loses its doc comment, and a `oneOf` of documented constants becomes an
/// `enum` of them (every prompt carries the schemas of the tools on offer).
fn compact(schema: &mut Value) {
    let Some(object) = schema.as_object_mut() else { return };
    if let Some(items) = object.get_mut("items").and_then(Value::as_object_mut) {
        items.remove("description");
    }
    let constants: Option<Vec<Value>> = object
        .get("oneOf")
        .and_then(Value::as_array)
        .and_then(|variants| variants.iter().map(|variant| variant.get("const").cloned()).collect());
    if let Some(constants) = constants {
        let all_strings = constants.iter().all(Value::is_string);
        object.remove("oneOf");
        if all_strings {
            object.insert("type".to_owned(), Value::String("string".to_owned()));
        }
        object.insert("enum".to_owned(), Value::Array(constants));
    }
    if let Some(properties) = object.get_mut("properties").and_then(Value::as_object_mut) {
        properties.values_mut().for_each(compact);
    }
    for key in ["items", "additionalProperties"] {
        if let Some(value) = object.get_mut(key) {
            compact(value);
        }
    }
    for key in ["anyOf", "allOf", "oneOf"] {
        if let Some(Value::Array(values)) = object.get_mut(key) {
            values.iter_mut().for_each(compact);
        }
    }
}

/// What a tool learns about the call it serves.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The run.
    pub run_id: RunId,
    /// The run's tenant. A tool that keeps data (a mailbox, a file) keeps each
    /// tenant's apart by it.
    pub tenant: String,
    /// The run's agent.
    pub agent: String,
    /// The turn.
    pub turn: u32,
    /// The model's call id.
    pub call_id: String,
    /// `"{run_id}:{turn}:{index}"`: the same for every execution of this call, also
    /// after a crash, so a side-effecting tool can have its sink deduplicate.
    pub idempotency_key: String,
    /// Cancelled when the run is cancelled; long tools should watch it.
    pub cancel: CancellationToken,
}

/// A tool's successful result.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolOutput {
    /// What the model sees.
    pub value: Value,
    /// Citable documents in the result.
    pub fragments: Vec<Fragment>,
    /// What the call spent: a paid API's price, the tokens and price of a model it
    /// asked. Charged to the run (and to its budget) with the result.
    pub usage: Usage,
}

impl ToolOutput {
    /// A result with a value only.
    pub fn value(value: Value) -> Self {
        Self { value, fragments: Vec::new(), usage: Usage::default() }
    }
}

/// Why a tool failed. Every variant becomes a `Failed` outcome the model sees.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ToolError {
    /// The arguments were well-formed but unusable.
    #[error("invalid arguments: {0}")]
    InvalidArgs(String),
    /// The tool ran and failed.
    #[error("{code}: {message}")]
    Failed {
        /// Stable code.
        code: String,
        /// Detail for the model.
        message: String,
    },
}

impl ToolError {
    /// A failure with a code and a message.
    pub fn failed(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Failed { code: code.into(), message: message.into() }
    }

    /// The outcome the model sees.
    pub fn into_outcome(self) -> ToolOutcome {
        match self {
            Self::InvalidArgs(message) => ToolOutcome::failed("invalid_args", message),
            Self::Failed { code, message } => ToolOutcome::failed(code, message),
        }
    }
}

/// Something an agent can do.
#[async_trait]
pub trait Tool: Send + Sync + 'static {
    /// Unique name, as the model calls it.
    fn name(&self) -> &str;

    /// What it does, for the model.
    fn description(&self) -> &str;

    /// JSON Schema of its arguments (an object schema).
    fn parameters(&self) -> Value;

    /// Whether running it twice with the same idempotency key is harmless. A call
    /// left `started` by a crash is re-run only if this is true.
    fn idempotent(&self) -> bool {
        false
    }

    /// Whether each call waits for a human's approval.
    fn requires_approval(&self) -> bool {
        false
    }

    /// Per-call time limit; `None` uses the pool's default.
    fn timeout(&self) -> Option<Duration> {
        None
    }

    /// A short human line for the `reasoning_step` event when a call starts.
    fn describe_start(&self, _args: &Value) -> String {
        format!("Calling {}", self.name())
    }

    /// A short human line for the `reasoning_step` event when a call ends: by
    /// default what the result says of itself (its `summary`), else what it
    /// holds ("search_emails found 5 emails"), else that it finished.
    fn describe_end(&self, outcome: &ToolOutcome) -> String {
        match outcome {
            ToolOutcome::Ok { value, .. } => describe_value(self.name(), value),
            ToolOutcome::Failed { code, .. } => format!("{} failed ({code})", self.name()),
            ToolOutcome::Skipped { reason, .. } => {
                format!("{} skipped ({})", self.name(), reason.as_str())
            }
            ToolOutcome::Interrupted => format!("{} interrupted", self.name()),
        }
    }

    /// The definition to offer the model now, for a tool whose schema is only known
    /// while the runtime runs (an MCP server's tool, which may change or appear after
    /// startup). `None`, the default: the definition built at registration.
    fn current_definition(&self) -> Option<Arc<ToolDefinition>> {
        None
    }

    /// Where the tool lives, for its calls' telemetry records: `local` (the
    /// default, a tool of this process), `mcp:SERVER`, or the tool's own word.
    fn connector(&self) -> String {
        "local".to_owned()
    }

    /// Runs the call. Failures are values; a panic is caught by the pool.
    async fn call(&self, context: ToolContext, args: Value) -> Result<ToolOutput, ToolError>;
}

/// What a result says of itself, for [`Tool::describe_end`].
fn describe_value(name: &str, value: &Value) -> String {
    let Some(object) = value.as_object() else {
        return match value.as_str().map(str::trim) {
            Some(text) if !text.is_empty() => {
                let first: String = text.lines().next().unwrap_or_default().chars().take(80).collect();
                format!("{name} returned \"{first}\"")
            }
            _ => format!("{name} finished"),
        };
    };
    if let Some(summary) = object.get("summary").and_then(Value::as_str).filter(|text| !text.trim().is_empty()) {
        return summary.trim().to_owned();
    }
    // The first list of the result, unless it is MCP's list of content parts.
    let list = object.iter().find(|(key, value)| value.is_array() && key.as_str() != "content");
    match list {
        Some((key, Value::Array(items))) => {
            let noun = if items.len() == 1 { key.strip_suffix('s').unwrap_or(key) } else { key.as_str() };
            format!("{name} found {} {}", items.len(), noun.replace('_', " "))
        }
        _ => format!("{name} finished"),
    }
}

/// `tool.describe_start(args)`, or a plain line if the tool panics: a description
/// is never worth a crash.
pub fn describe_start(tool: &dyn Tool, args: &Value) -> String {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tool.describe_start(args)))
        .unwrap_or_else(|_| format!("Calling {}", tool.name()))
}

/// `tool.describe_end(outcome)`, or a plain line if the tool panics.
pub fn describe_end(tool: &dyn Tool, outcome: &ToolOutcome) -> String {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tool.describe_end(outcome)))
        .unwrap_or_else(|_| format!("{} finished", tool.name()))
}

/// Why a tool could not be registered.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Two tools share a name.
    #[error("tool {0} is registered twice")]
    Duplicate(String),
    /// The argument schema does not compile.
    #[error("tool {name} has an invalid argument schema: {message}")]
    BadSchema {
        /// The tool.
        name: String,
        /// The compiler's complaint.
        message: String,
    },
}

/// A registered tool with its compiled argument validator.
pub struct RegisteredTool {
    /// The tool.
    pub tool: Arc<dyn Tool>,
    /// The compiled schema; compiled once, at registration.
    pub validator: jsonschema::Validator,
    /// Whether the schema has an `excluded_ids` property (seen-document injection).
    pub accepts_excluded_ids: bool,
    /// The definition offered to the model, built once.
    pub definition: Arc<ToolDefinition>,
}

/// The tools of a runtime, by name.
#[derive(Default, Clone)]
pub struct ToolRegistry {
    tools: HashMap<String, Arc<RegisteredTool>>,
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `tool`, compiling its schema. Remote `$ref`s are never fetched: the
    /// validator is built offline whatever features `jsonschema` was compiled with,
    /// so a schema that names one fails to register.
    pub fn register(&mut self, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        let name = tool.name().to_owned();
        if self.tools.contains_key(&name) {
            return Err(RegistryError::Duplicate(name));
        }
        let schema = tool.parameters();
        let validator = jsonschema::options()
            .offline()
            .build(&schema)
            .map_err(|error| RegistryError::BadSchema { name: name.clone(), message: error.to_string() })?;
        let accepts_excluded_ids = schema.pointer("/properties/excluded_ids").is_some();
        let definition = Arc::new(ToolDefinition {
            name: name.clone(),
            description: tool.description().to_owned(),
            parameters: schema,
        });
        self.tools.insert(name, Arc::new(RegisteredTool { tool, validator, accepts_excluded_ids, definition }));
        Ok(())
    }

    /// Registers `tool`, builder style.
    pub fn with(mut self, tool: Arc<dyn Tool>) -> Result<Self, RegistryError> {
        self.register(tool)?;
        Ok(self)
    }

    /// The tool called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<RegisteredTool>> {
        self.tools.get(name)
    }

    /// Where the tool `name` lives (see [`Tool::connector`]): `builtin` for the
    /// tools the runtime answers itself, `none` for a name nothing answers to.
    pub fn connector(&self, name: &str) -> String {
        match (crate::builtin::BuiltinTool::from_name(name), self.tools.get(name)) {
            (Some(_), _) => "builtin".to_owned(),
            (None, Some(registered)) => registered.tool.connector(),
            (None, None) => "none".to_owned(),
        }
    }

    /// Names of all tools, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.tools.keys().cloned().collect();
        names.sort();
        names
    }

    /// The definition offered to the model for `name`: the tool's current one if it
    /// has one, else the one built at registration.
    pub fn definition(&self, name: &str) -> Option<Arc<ToolDefinition>> {
        self.tools
            .get(name)
            .map(|registered| registered.tool.current_definition().unwrap_or_else(|| registered.definition.clone()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::json;

    use super::*;

    struct SchemaTool(Value);

    #[async_trait]
    impl Tool for SchemaTool {
        fn name(&self) -> &str {
            "schema_tool"
        }
        fn description(&self) -> &str {
            "a tool with a given schema"
        }
        fn parameters(&self) -> Value {
            self.0.clone()
        }
        async fn call(&self, _context: ToolContext, _args: Value) -> Result<ToolOutput, ToolError> {
            Ok(ToolOutput::value(Value::Null))
        }
    }

    #[test]
    fn remote_refs_are_never_fetched() {
        for reference in ["http://127.0.0.1:9/schema.json", "https://example.com/schema.json", "file:///etc/passwd"] {
            let schema = json!({"type": "object", "properties": {"a": {"$ref": reference}}});
            let error = ToolRegistry::new().with(Arc::new(SchemaTool(schema))).err().unwrap();
            assert!(matches!(error, RegistryError::BadSchema { .. }), "{reference}: {error}");
        }
        let local =
            json!({"type": "object", "$defs": {"n": {"type": "number"}}, "properties": {"a": {"$ref": "#/$defs/n"}}});
        let registry = ToolRegistry::new().with(Arc::new(SchemaTool(local))).unwrap();
        let validator = &registry.get("schema_tool").unwrap().validator;
        assert!(validator.is_valid(&json!({"a": 1})) && !validator.is_valid(&json!({"a": "x"})));
    }

    #[test]
    fn a_result_describes_itself_by_its_summary_or_what_it_holds() {
        let line = |value: Value| describe_value("search_emails", &value);
        assert_eq!(line(json!({"summary": "Filed it in archive.", "emails": []})), "Filed it in archive.");
        assert_eq!(line(json!({"count": 5, "emails": [1, 2, 3, 4, 5]})), "search_emails found 5 emails");
        assert_eq!(line(json!({"emails": [1]})), "search_emails found 1 email");
        assert_eq!(line(json!({"content": [{"type": "text"}]})), "search_emails finished");
        assert_eq!(line(json!("12 rows\nmore")), "search_emails returned \"12 rows\"");
        assert_eq!(line(json!({"ok": true})), "search_emails finished");
    }
}
