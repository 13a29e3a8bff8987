//! Built-in tools of the `troupe` binary.

mod args;
mod calculate;
pub mod guide;
mod http_fetch;
mod journal;
pub mod tenant;
mod text_stats;

use std::sync::Arc;

use serde::Deserialize;
use troupe_actors::tool::{RegistryError, ToolRegistry};

pub use calculate::Calculate;
pub use http_fetch::{HttpFetch, HttpFetchConfig};
pub use journal::Journal;
pub use tenant::TenantPath;
pub use text_stats::TextStats;

/// Settings of the built-in tools.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolsConfig {
    /// The file the `journal` tool appends to, one per tenant (the path holds
    /// `{tenant}`); a relative path is under the data dir.
    pub journal_path: TenantPath,
    /// A tool guide of your own (the format of `config/tools.md`, which is built
    /// in), replacing the built-in one.
    pub guide_path: Option<std::path::PathBuf>,
    /// The `http_fetch` tool: limits and the allow-list over its SSRF denials.
    pub http_fetch: HttpFetchConfig,
}

impl Default for ToolsConfig {
    fn default() -> Self {
        Self {
            journal_path: TenantPath::builtin("tenants/{tenant}/journal.log"),
            guide_path: None,
            http_fetch: HttpFetchConfig::default(),
        }
    }
}

pub use args::parse_args;
pub use troupe_actors::tool::schema_of;

/// The registry of built-in tools.
pub fn builtin_registry(config: &ToolsConfig) -> Result<ToolRegistry, RegistryError> {
    ToolRegistry::new()
        .with(Arc::new(TextStats))?
        .with(Arc::new(Calculate))?
        .with(Arc::new(Journal { path: config.journal_path.clone() }))?
        .with(Arc::new(HttpFetch::new(config.http_fetch.clone())))
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use troupe_actors::tool::Tool;

    use super::*;

    #[test]
    fn argument_schemas_are_derived_from_the_argument_types() {
        let schema = TextStats.parameters();
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["additionalProperties"], false, "unknown arguments are refused");
        assert_eq!(schema["required"], json!(["text"]));
        assert_eq!(
            (schema["properties"]["top"]["minimum"].as_u64(), schema["properties"]["top"]["maximum"].as_u64()),
            (Some(1), Some(20))
        );
        assert_eq!(schema["properties"]["text"]["description"], "The text to measure.");
        assert!(schema.get("$schema").is_none() && schema.get("title").is_none());
        let journal = Journal { path: ToolsConfig::default().journal_path }.parameters();
        assert_eq!(journal["properties"]["text"]["maxLength"], 4096);
    }
}
