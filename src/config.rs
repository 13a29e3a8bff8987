//! The daemon's configuration: `config/default.toml` (embedded in the binary, so
//! it runs from any directory) overlaid with an optional user file. Unknown keys
//! are errors. This module parses; only `main.rs` reads files.

use std::collections::BTreeMap;

use serde::Deserialize;
use troupe_actors::config::{AgentConfig, RuntimeConfig};

use crate::llm::{ModelConfig, ProviderConfig};
use crate::tools::ToolsConfig;

/// The embedded defaults; every key is documented there.
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");

/// The embedded default agent.
pub const DEFAULT_AGENT_TOML: &str = include_str!("../config/agents/default.toml");

/// Everything `troupe` reads from its config file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The actor runtime.
    pub runtime: RuntimeConfig,
    /// OpenAI-compatible providers by name.
    pub providers: BTreeMap<String, ProviderConfig>,
    /// Models by name; agents name them.
    pub models: BTreeMap<String, ModelConfig>,
    /// The model of agents that name none. Without it: the first configured model,
    /// else the `TROUPE_MODEL` quick start, else the offline model.
    pub default_model: Option<String>,
    /// Where runs are kept.
    pub store: StoreConfig,
    /// The built-in tools.
    pub tools: ToolsConfig,
}

/// Where runs are kept, and for how long.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// `sqlite://PATH` or `postgres://…`; `TROUPE_DATABASE_URL` overrides it.
    pub url: String,
    /// Days a finished run is kept before `troupe gc` deletes it.
    pub retention_days: f64,
    /// Runs deleted per statement by `troupe gc`.
    pub gc_batch: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self { url: "sqlite://data/troupe.db".to_owned(), retention_days: 30.0, gc_batch: 500 }
    }
}

/// Why the configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A file is not valid TOML or has unknown or mistyped keys.
    #[error("{origin}: {message}")]
    Invalid {
        /// Which file.
        origin: String,
        /// What is wrong, with the key's position.
        message: String,
    },
}

impl Config {
    /// The defaults overlaid with `overlay` (the text of a user file, if any).
    pub fn parse(overlay: Option<(&str, &str)>) -> Result<Self, ConfigError> {
        let mut merged = parse_table("config/default.toml", DEFAULT_TOML)?;
        if let Some((origin, text)) = overlay {
            merge(&mut merged, parse_table(origin, text)?);
        }
        let origin = overlay.map_or("config/default.toml", |(origin, _)| origin);
        toml::Value::Table(merged).try_into().map_err(|error: toml::de::Error| ConfigError::Invalid {
            origin: origin.to_owned(),
            message: error.to_string(),
        })
    }
}

/// Parses an agent file.
pub fn parse_agent(origin: &str, text: &str) -> Result<AgentConfig, ConfigError> {
    toml::from_str(text).map_err(|error| ConfigError::Invalid { origin: origin.to_owned(), message: error.to_string() })
}

fn parse_table(origin: &str, text: &str) -> Result<toml::Table, ConfigError> {
    text.parse::<toml::Table>()
        .map_err(|error| ConfigError::Invalid { origin: origin.to_owned(), message: error.to_string() })
}

/// Deep-merges `overlay` into `base`: tables merge key by key, anything else replaces.
fn merge(base: &mut toml::Table, overlay: toml::Table) {
    for (key, value) in overlay {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(base_table)), toml::Value::Table(overlay_table)) => {
                merge(base_table, overlay_table)
            }
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_defaults_are_the_code_defaults() {
        assert_eq!(Config::parse(None).unwrap(), Config::default());
    }

    #[test]
    fn a_user_file_overrides_single_keys() {
        let config = Config::parse(Some(("user.toml", "[runtime.tool_pool]\nworkers = 2\n"))).unwrap();
        assert_eq!(config.runtime.tool_pool.workers, 2);
        assert_eq!(config.runtime.tool_pool.queue_limit, 1024);
    }

    #[test]
    fn unknown_keys_are_rejected_with_the_file_and_key() {
        let error = Config::parse(Some(("user.toml", "[runtime]\nmax_active_run = 3\n"))).unwrap_err().to_string();
        assert!(error.starts_with("user.toml:") && error.contains("max_active_run"), "{error}");
    }

    #[test]
    fn the_default_agent_parses() {
        let agent = parse_agent("default.toml", DEFAULT_AGENT_TOML).unwrap();
        assert_eq!(agent.name, "default");
        assert_eq!(agent.tools, vec!["text_stats".to_owned()]);
        assert_eq!(agent.limits.max_turns, 15);
    }
}
