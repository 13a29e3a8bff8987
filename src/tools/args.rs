//! A tool call's arguments: parsed from the call's JSON into the tool's type.

use troupe_actors::tool::ToolError;

/// Arguments of type `T` from a call's JSON, or the reason they do not fit.
pub fn parse_args<T: serde::de::DeserializeOwned>(args: serde_json::Value) -> Result<T, ToolError> {
    serde_json::from_value(args).map_err(|error| ToolError::InvalidArgs(error.to_string()))
}
