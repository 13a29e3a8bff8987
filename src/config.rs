//! The daemon's configuration: `config/default.toml` (embedded in the binary, so
//! it runs from any directory) overlaid with an optional user file, then with
//! `TROUPE_*` environment variables. Unknown keys are errors. This module parses;
//! only `main.rs` reads files and the environment.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use troupe_actors::config::{AgentConfig, RuntimeConfig};

use crate::email::EmailConfig;
use crate::llm::local::LocalModelConfig;
use crate::llm::{ModelConfig, ProviderConfig};
use crate::mcp::McpConfig;
use crate::server::{AuthConfig, QuotaConfig, ServerConfig};
use crate::tools::ToolsConfig;

/// The embedded defaults; every key is documented there.
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");

/// The embedded default agent.
pub const DEFAULT_AGENT_TOML: &str = include_str!("../config/agents/default.toml");

/// Everything `troupe` reads from its config file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Where the SQLite store and tool files live, unless they name other places.
    pub data_dir: PathBuf,
    /// The HTTP server of `troupe serve`.
    pub server: ServerConfig,
    /// Who may call the API.
    pub auth: AuthConfig,
    /// The actor runtime.
    pub runtime: RuntimeConfig,
    /// OpenAI-compatible providers by name.
    pub providers: BTreeMap<String, ProviderConfig>,
    /// Models by name; agents name them.
    pub models: BTreeMap<String, ModelConfig>,
    /// The model of agents that name none. Without it: the `TROUPE_MODEL` quick
    /// start, else the first configured model, else the local model.
    pub default_model: Option<String>,
    /// The local model.
    pub local_model: LocalModelConfig,
    /// Where runs are kept.
    pub store: StoreConfig,
    /// The built-in tools.
    pub tools: ToolsConfig,
    /// MCP servers whose tools agents may use.
    pub mcp: McpConfig,
    /// The mailbox of the email tools.
    pub email: EmailConfig,
    /// What a tenant may spend per day.
    pub quotas: QuotaConfig,
    /// Several daemons on one PostgreSQL store.
    pub cluster: ClusterConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("data"),
            server: ServerConfig::default(),
            auth: AuthConfig::default(),
            runtime: RuntimeConfig::default(),
            providers: BTreeMap::new(),
            models: BTreeMap::new(),
            default_model: None,
            local_model: LocalModelConfig::default(),
            store: StoreConfig::default(),
            tools: ToolsConfig::default(),
            mcp: McpConfig::default(),
            email: EmailConfig::default(),
            quotas: QuotaConfig::default(),
            cluster: ClusterConfig::default(),
        }
    }
}

/// Where runs are kept, and for how long.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// `sqlite://PATH` or `postgres://…`; without it, `troupe.db` in the data dir.
    /// `TROUPE_DATABASE_URL` overrides it.
    pub url: Option<String>,
    /// Days a finished run is kept before `troupe gc` deletes it.
    pub retention_days: f64,
    /// Runs deleted per statement by retention.
    pub gc_batch: usize,
    /// Seconds between the daemon's retention sweeps; 0: only `troupe gc`.
    pub gc_interval: f64,
    /// Whether a SQLite store's file is locked to other programs while it is
    /// open (faster); false leaves it open to them (a backup, a replication tool).
    pub sqlite_exclusive: bool,
}

impl StoreConfig {
    /// How a SQLite store shares its file with other programs.
    pub fn sqlite_file(&self) -> crate::store::SqliteFile {
        if self.sqlite_exclusive { crate::store::SqliteFile::Exclusive } else { crate::store::SqliteFile::Shared }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self { url: None, retention_days: 30.0, gc_batch: 500, gc_interval: 3600.0, sqlite_exclusive: true }
    }
}

/// Several daemons sharing one PostgreSQL store, each driving the runs it owns.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// Whether this daemon shares its store with others (PostgreSQL only).
    pub enabled: bool,
    /// Seconds a node holds its runs without renewing: a node that stops is
    /// replaced this long after its last renewal at most.
    pub lease: f64,
    /// Seconds between renewals of the lease.
    pub heartbeat: f64,
    /// Seconds between looks for runs no live node drives.
    pub claim_interval: f64,
    /// The node's name in logs and in `cluster_nodes`; empty: the host name.
    pub node_name: String,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self { enabled: false, lease: 5.0, heartbeat: 1.0, claim_interval: 0.5, node_name: String::new() }
    }
}

impl ClusterConfig {
    /// The lease, the heartbeat and the claim interval, checked: positive, and a
    /// heartbeat of at most a third of the lease (two renewals may fail before
    /// the lease runs out).
    pub fn timing(&self) -> Result<(std::time::Duration, std::time::Duration, std::time::Duration), String> {
        let seconds = |name: &str, value: f64| {
            std::time::Duration::try_from_secs_f64(value)
                .ok()
                .filter(|value| !value.is_zero())
                .ok_or_else(|| format!("cluster.{name} must be a positive number of seconds"))
        };
        let (lease, heartbeat, claim) = (
            seconds("lease", self.lease)?,
            seconds("heartbeat", self.heartbeat)?,
            seconds("claim_interval", self.claim_interval)?,
        );
        if heartbeat * 3 > lease {
            return Err(format!(
                "cluster.heartbeat ({} s) must be at most a third of cluster.lease ({} s)",
                self.heartbeat, self.lease
            ));
        }
        Ok((lease, heartbeat, claim))
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

/// Environment variables that set a key directly, with the key they set.
const ENV_SHORTCUTS: &[(&str, &str)] = &[
    ("TROUPE_BIND", "server.bind"),
    ("TROUPE_DATA_DIR", "data_dir"),
    ("TROUPE_DATABASE_URL", "store.url"),
    ("TROUPE_DEFAULT_MODEL", "default_model"),
];

impl Config {
    /// The defaults overlaid with `overlay` (the text of a user file, if any).
    pub fn parse(overlay: Option<(&str, &str)>) -> Result<Self, ConfigError> {
        Self::load(overlay, std::iter::empty())
    }

    /// The defaults overlaid with `overlay`, then with the `TROUPE_*` variables of
    /// `env`: the shortcuts `TROUPE_BIND`, `TROUPE_DATA_DIR`, `TROUPE_DATABASE_URL`
    /// and `TROUPE_DEFAULT_MODEL`, and any key of a section spelled as its path in
    /// capitals with `__` between levels (`TROUPE_RUNTIME__MAX_ACTIVE_RUNS=8`,
    /// `TROUPE_SERVER__MAX_BODY_BYTES=65536`). A value is read as TOML (a number, a
    /// boolean, an array) when it parses as one, else as a string.
    pub fn load(
        overlay: Option<(&str, &str)>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut merged = parse_table("config/default.toml", DEFAULT_TOML)?;
        let mut origin = "config/default.toml".to_owned();
        if let Some((file, text)) = overlay {
            merge(&mut merged, parse_table(file, text)?);
            file.clone_into(&mut origin);
        }
        let mut from_env = Vec::new();
        for (name, value) in env {
            let Some(path) = env_key(&name) else { continue };
            if value.trim().is_empty() {
                continue;
            }
            // The shortcuts name paths and addresses: always strings.
            let value = if ENV_SHORTCUTS.iter().any(|(var, _)| *var == name) {
                toml::Value::String(value)
            } else {
                env_value(&value)
            };
            set_path(&mut merged, &path, value)
                .map_err(|message| ConfigError::Invalid { origin: format!("environment variable {name}"), message })?;
            from_env.push(name);
        }
        if !from_env.is_empty() {
            origin = format!("{origin} with {}", from_env.join(", "));
        }
        toml::Value::Table(merged)
            .try_into()
            .map_err(|error: toml::de::Error| ConfigError::Invalid { origin, message: error.to_string() })
    }

    /// The store's URL: the configured one, else `troupe.db` in the data dir.
    pub fn store_url(&self) -> String {
        match &self.store.url {
            Some(url) => url.clone(),
            None => format!("sqlite://{}", self.data_dir.join("troupe.db").display()),
        }
    }

    /// `path` if absolute, else under the data dir.
    pub fn in_data_dir(&self, path: &Path) -> PathBuf {
        if path.is_absolute() { path.to_path_buf() } else { self.data_dir.join(path) }
    }
}

/// The config key an environment variable sets, as a path, if it sets one.
fn env_key(name: &str) -> Option<Vec<String>> {
    if let Some((_, key)) = ENV_SHORTCUTS.iter().find(|(var, _)| *var == name) {
        return Some(key.split('.').map(str::to_owned).collect());
    }
    let rest = name.strip_prefix("TROUPE_")?;
    // Only names with a level separator are keys: other TROUPE_ variables (of
    // tests, benchmarks, scripts) are not the config's business.
    if !rest.contains("__") {
        return None;
    }
    Some(rest.split("__").map(str::to_ascii_lowercase).collect())
}

/// An environment value as TOML when it reads as a TOML value, else as a string.
fn env_value(value: &str) -> toml::Value {
    format!("v = {value}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut table| table.remove("v"))
        .unwrap_or_else(|| toml::Value::String(value.to_owned()))
}

/// Sets `path` in `table`, creating tables on the way.
fn set_path(table: &mut toml::Table, path: &[String], value: toml::Value) -> Result<(), String> {
    let Some((last, parents)) = path.split_last() else { return Err("empty key".to_owned()) };
    let mut current = table;
    for key in parents {
        let entry = current.entry(key.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        current = match entry {
            toml::Value::Table(inner) => inner,
            _ => return Err(format!("{key} is not a table")),
        };
    }
    current.insert(last.clone(), value);
    Ok(())
}

/// Parses an agent file.
pub fn parse_agent(origin: &str, text: &str) -> Result<AgentConfig, ConfigError> {
    let agent: AgentConfig = toml::from_str(text)
        .map_err(|error| ConfigError::Invalid { origin: origin.to_owned(), message: error.to_string() })?;
    if let Some(name) = agent.without_builtins.iter().find(|name| !["todo_write", "ask_user"].contains(&name.as_str()))
    {
        let message = format!("without_builtins names {name:?}; only todo_write and ask_user can be left out");
        return Err(ConfigError::Invalid { origin: origin.to_owned(), message });
    }
    troupe_actors::steps::check(&agent.steps, &agent.tools)
        .map_err(|message| ConfigError::Invalid { origin: origin.to_owned(), message })?;
    agent.limits.check().map_err(|message| ConfigError::Invalid {
        origin: origin.to_owned(),
        message: format!("[limits]: {message}"),
    })?;
    if agent.reflect && !agent.steps.is_empty() {
        let message = "reflect and steps do not go together: a reflecting agent decides its own turns".to_owned();
        return Err(ConfigError::Invalid { origin: origin.to_owned(), message });
    }
    Ok(agent)
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

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())).collect()
    }

    #[test]
    fn environment_variables_override_the_file() {
        let file = "[server]\nbind = \"0.0.0.0:1\"\n[runtime]\nmax_active_runs = 3\n";
        let config = Config::load(
            Some(("user.toml", file)),
            env(&[
                ("TROUPE_BIND", "127.0.0.1:9000"),
                ("TROUPE_DATA_DIR", "2024"),
                ("TROUPE_RUNTIME__MAX_ACTIVE_RUNS", "8"),
                ("TROUPE_SERVER__SSE_KEEP_ALIVE", "2.5"),
                ("TROUPE_DEFAULT_MODEL", "offline"),
                ("TROUPE_LOCAL_MODEL__PARALLEL", "3"),
                ("TROUPE_LOG", "debug"),
                ("TROUPE_TEST_PG_URL", "postgres://elsewhere"),
                ("PATH", "/bin"),
            ]),
        )
        .unwrap();
        assert_eq!(config.server.bind, "127.0.0.1:9000");
        assert_eq!(config.runtime.max_active_runs, 8);
        assert_eq!(config.server.sse_keep_alive, 2.5);
        assert_eq!(config.store_url(), "sqlite://2024/troupe.db", "shortcut values are strings");
        assert_eq!(config.default_model.as_deref(), Some("offline"));
        assert_eq!(config.local_model.parallel, 3);
    }

    #[test]
    fn the_daemon_runs_on_one_worker_unless_told_otherwise() {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        assert_eq!(Config::load(None, env(&[])).unwrap().server.workers(), 1);
        let per_core = Config::load(None, env(&[("TROUPE_SERVER__WORKER_THREADS", "0")])).unwrap();
        assert_eq!(per_core.server.workers(), cores);
        let four = Config::load(Some(("user.toml", "[server]\nworker_threads = 4\n")), env(&[])).unwrap();
        assert_eq!(four.server.workers(), 4);
        let error = Config::load(None, env(&[("TROUPE_SERVER__WORKER_THREADS", "-1")])).unwrap_err().to_string();
        assert!(error.contains("TROUPE_SERVER__WORKER_THREADS") || error.contains("worker_threads"), "{error}");
    }

    #[test]
    fn an_unknown_environment_key_is_rejected_by_name() {
        let error = Config::load(None, env(&[("TROUPE_SERVER__BINDD", "x")])).unwrap_err().to_string();
        assert!(error.contains("TROUPE_SERVER__BINDD") && error.contains("bindd"), "{error}");
    }

    #[test]
    fn the_default_agent_parses() {
        let agent = parse_agent("default.toml", DEFAULT_AGENT_TOML).unwrap();
        assert_eq!(agent.name, "default");
        assert_eq!(agent.tools, vec!["text_stats".to_owned(), "calculate".to_owned()]);
        assert_eq!(agent.limits.max_turns, 15);
    }

    #[test]
    fn the_default_agent_routes_measuring_and_arithmetic_to_their_tools() {
        use troupe_actors::steps::{NextStep, next};
        let agent = parse_agent("default.toml", DEFAULT_AGENT_TOML).unwrap();
        let first = |input: &str| match next(&agent.steps, input, &[]) {
            Some(NextStep::Call { tool, .. } | NextStep::Model { tool, .. }) => Some(tool),
            _ => None,
        };
        assert_eq!(first("Count the words of 'the cat saw the dog'").as_deref(), Some("text_stats"));
        assert_eq!(first("How many words are in 'I have 2 cats'?").as_deref(), Some("text_stats"), "measuring first");
        assert_eq!(first("Which word appears most often in: the dog and the cat?").as_deref(), Some("text_stats"));
        for arithmetic in [
            "What is 17 times 23?",
            "What is 7.5% of 1,280?",
            "What is 4567 + 8910?",
            "What is 2 to the power of 10?",
            "What is the average of 12, 15 and 21?",
            "I bought 3 books at $12.50 each. How much did I spend?",
            "How much are 4 tickets for €7.25 apiece?",
        ] {
            assert_eq!(first(arithmetic).as_deref(), Some("calculate"), "{arithmetic}");
        }
        let others = [
            "Translate 'thank you' into French.",
            "What is the capital of France?",
            "Add milk to my list",
            "Translate 'I have 2 cats + 3 dogs' into French.",
            "Write one sentence about cats.",
            "Who is the main character of Hamlet?",
            "Translate the word 'hello' into French.",
            "Write one sentence about the year 1969 and the total eclipse.",
            "What was the average rainfall in 2020?",
            "Give me 3 facts about each planet.",
            "Summarize each of the 2 emails for me.",
        ];
        for other in others {
            assert_eq!(first(other), None, "{other}: the model decides");
        }
    }

    #[test]
    fn a_reflecting_agent_parses_and_refuses_steps() {
        let thinker = "name = \"thinker\"\ntools = [\"text_stats\"]\nreflect = true\n";
        assert!(parse_agent("thinker.toml", thinker).unwrap().reflect);
        let both = format!("{thinker}[[steps]]\ntool = \"text_stats\"\n");
        let error = parse_agent("thinker.toml", &both).unwrap_err().to_string();
        assert!(error.contains("thinker.toml") && error.contains("reflect and steps"), "{error}");
    }

    #[test]
    fn an_agent_with_a_budget_that_cannot_bound_a_run_is_refused() {
        let text = "name = \"spender\"\ninstructions = \"x\"\n[limits]\nmax_cost_usd = -1.0\n";
        let error = parse_agent("agents/spender.toml", text).unwrap_err().to_string();
        assert!(error.contains("agents/spender.toml") && error.contains("max_cost_usd must be a positive"), "{error}");
    }
}
