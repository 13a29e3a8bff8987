//! The composition root: [`App::build`] turns the loaded [`Config`] and the
//! process's [`Environment`] into the adapters a command runs on (store, models,
//! tools, agents, auth, MCP servers). It reads the agent files and the tool
//! guide the config names; nothing below it reads files or the environment for
//! its settings.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use troupe_actors::config::AgentConfig;
use troupe_actors::llm::{ModelClient, ModelRegistry};
use troupe_actors::tool::ToolRegistry;

use crate::config::{Config, DEFAULT_AGENT_TOML, parse_agent};
use crate::env::Environment;
use crate::llm::local as local_model;
use crate::llm::{LOCAL, OFFLINE, build_models};
use crate::mcp::McpHub;
use crate::server::Auth;
use crate::store::{ClusterOptions, SqlStore};

/// The command an [`App`] is built for: what it needs differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// `troupe serve`: the daemon, with its auth (open with `--insecure-no-auth`).
    Serve {
        /// Every request acts as tenant `default`.
        insecure_no_auth: bool,
    },
    /// `troupe demo`: one run in-process; falls back to the offline model while
    /// the local one is not downloaded.
    Demo,
    /// `troupe resume`: the unfinished runs in-process.
    Resume,
    /// `troupe eval`: a task file's runs in-process, on the configured models.
    Eval,
    /// `troupe config check`: nothing runs; problems are reported, not logged.
    Check,
    /// `troupe gc`: the store only (no MCP server is started).
    Gc,
}

/// What a command that runs the runtime in this process runs on.
pub struct App {
    /// The configuration, with the tool guide parsed into `runtime.tool_docs`.
    pub config: Config,
    /// The built-in `default` agent and the agent files.
    pub agents: Vec<AgentConfig>,
    /// Every configured model, with the default one.
    pub models: ModelRegistry,
    /// Built-in, email and MCP tools.
    pub tools: ToolRegistry,
    /// Who may call (`serve` only).
    pub auth: Option<Auth>,
    /// The run store.
    pub store: SqlStore,
    /// The MCP servers' supervisors; [`McpHub::shutdown`] them once done.
    pub mcp: McpHub,
}

impl App {
    /// Builds the adapters of `purpose` from `config` and `env`, with the agent
    /// files of `agents_dir`.
    pub async fn build(
        mut config: Config,
        env: &Environment,
        purpose: Purpose,
        agents_dir: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let Parts { agents, guide, models, mut tools } = parts(&config, env, purpose, agents_dir)?;
        config.runtime.tool_docs = Arc::new(crate::tools::guide::parse(&guide));
        // Checked before the store is opened, so a daemon without tokens fails at once.
        let auth = match purpose {
            Purpose::Serve { insecure_no_auth: true } => Some(Auth::open()),
            Purpose::Serve { .. } => Some(Auth::new(&config.auth, env.api_tokens.as_deref())?),
            _ => None,
        };
        let store_url = config.store_url();
        let store = match purpose {
            Purpose::Serve { .. } if config.cluster.enabled => {
                let (lease, heartbeat, _) = config.cluster.timing().map_err(anyhow::Error::msg)?;
                let node_name = match config.cluster.node_name.trim() {
                    "" => host_name(),
                    name => name.to_owned(),
                };
                let options = ClusterOptions { node_name, lease };
                SqlStore::connect_cluster(&store_url, &options, heartbeat).await
            }
            _ => SqlStore::connect_with(&store_url, config.store.sqlite_file()).await,
        }
        .with_context(|| format!("cannot open the store at {}", redact_url(&store_url)))?;
        // MCP servers start once this process owns the store (a refused start spawns none).
        let mcp = match purpose {
            Purpose::Gc => McpHub::empty(),
            _ => McpHub::start(&config.mcp, |name| env.var(name)).await?,
        };
        mcp.register(&mut tools, &agents)?;
        Ok(Self { config, agents, models, tools, auth, store, mcp })
    }
}

/// What `build` and `check` both make of a configuration.
struct Parts {
    agents: Vec<AgentConfig>,
    /// The tool guide's text.
    guide: String,
    models: ModelRegistry,
    /// The built-in and email tools (MCP servers' come once they start).
    tools: ToolRegistry,
}

/// The agents (with the files of `agents_dir`), the tool guide, the models and
/// the built-in and email tools of `config`.
fn parts(config: &Config, env: &Environment, purpose: Purpose, agents_dir: Option<&Path>) -> anyhow::Result<Parts> {
    let agents = load_agents(agents_dir)?;
    let guide = match &config.tools.guide_path {
        Some(path) => {
            std::fs::read_to_string(path).with_context(|| format!("cannot read the tool guide {}", path.display()))?
        }
        None => crate::tools::guide::DEFAULT_GUIDE.to_owned(),
    };
    let models = build_model_registry(config, env, purpose)?;
    let mut tools = crate::tools::builtin_registry(&config.tools)?;
    let analysis_model = match &config.email.model {
        Some(name) => models.get(Some(name)).with_context(|| format!("email.model names an unknown model {name:?}"))?,
        None => models.fallback(),
    };
    crate::email::register(&mut tools, Arc::new(config.email.mailboxes(&config.data_dir)), analysis_model)?;
    Ok(Parts { agents, guide, models, tools })
}

/// What `troupe config check` found in a configuration that loads.
pub struct Checked {
    /// The agents, by name.
    pub agents: Vec<String>,
    /// The models, by name, and the default.
    pub models: Vec<String>,
    /// The default model.
    pub default_model: String,
    /// The tools.
    pub tools: usize,
    /// The MCP servers configured.
    pub mcp_servers: usize,
    /// Where runs are kept (password hidden).
    pub store: String,
    /// What `troupe serve` would still refuse or warn about (no API token, the
    /// local model not downloaded), though the configuration is valid.
    pub warnings: Vec<String>,
}

impl App {
    /// Checks `config` as `build` would for `serve`, without opening the store or
    /// starting MCP servers: agents, the tool guide, models, tools, the email
    /// tools' model, `[server]`, `[auth]`, `[mcp]`, the store's URL.
    pub fn check(config: &Config, env: &Environment, agents_dir: Option<&Path>) -> anyhow::Result<Checked> {
        let Parts { agents, models, tools, .. } = parts(config, env, Purpose::Check, agents_dir)?;
        config.server.connection_timeouts()?;
        crate::server::check_config(&config.server)?;
        config.quotas.check().map_err(anyhow::Error::msg)?;
        config.cluster.timing().map_err(anyhow::Error::msg)?;
        let mcp_servers = config.mcp.servers(|name| env.var(name))?.len();
        let store_url = config.store_url();
        if !["sqlite:", "postgres:", "postgresql:"].iter().any(|scheme| store_url.starts_with(scheme)) {
            anyhow::bail!("store.url {} is neither sqlite: nor postgres:", redact_url(&store_url));
        }
        if store_url.starts_with("sqlite:") && crate::store::in_memory(&store_url) {
            anyhow::bail!(
                "store.url {store_url} is an in-memory SQLite database: a store must be a file (sqlite://PATH)"
            );
        }
        if config.cluster.enabled && store_url.starts_with("sqlite:") {
            anyhow::bail!("cluster.enabled needs a PostgreSQL store: SQLite is single-node");
        }
        let mut warnings = Vec::new();
        if let Err(error) = Auth::new(&config.auth, env.api_tokens.as_deref()) {
            warnings.push(format!("troupe serve would refuse to start: {error}"));
        }
        if models.fallback().name() == LOCAL
            && let Some(problem) = local_model::file_problem(
                local_model::build(&config.local_model, &config.data_dir).map_err(anyhow::Error::msg)?.settings(),
            )
        {
            warnings.push(format!("{problem}; until then runs on the default model fail"));
        }
        Ok(Checked {
            agents: agents.iter().map(|agent| agent.name.clone()).collect(),
            models: models.names(),
            default_model: models.fallback().name().to_owned(),
            tools: tools.names().len(),
            mcp_servers,
            store: redact_url(&store_url),
            warnings,
        })
    }
}

/// The configured models, the environment's, and the local one; the default is
/// the offline model for a demo while the local one is not downloaded.
fn build_model_registry(config: &Config, env: &Environment, purpose: Purpose) -> anyhow::Result<ModelRegistry> {
    let local = local_model::build(&config.local_model, &config.data_dir).map_err(anyhow::Error::msg)?;
    let local_problem = local_model::file_problem(local.settings());
    let local_client: Option<Arc<dyn ModelClient>> =
        cfg!(feature = "local-model").then(|| local.clone() as Arc<dyn ModelClient>);
    // Providers build HTTP clients, which want a runtime around them (this runs in one).
    let mut models = build_models(
        &config.providers,
        &config.models,
        config.default_model.as_deref(),
        &env.model(),
        local_client,
        |name| env.var(name),
    )?;
    if models.fallback().name() == LOCAL
        && let Some(problem) = &local_problem
    {
        if purpose == Purpose::Demo {
            eprintln!("troupe: {problem}; this demo runs on the built-in offline model instead");
            if let Some(offline) = models.get(Some(OFFLINE)) {
                models = models.with_default(offline);
            }
        } else if purpose != Purpose::Check {
            tracing::warn!("{problem}; until then runs on the default model fail (model_unavailable)");
        }
    }
    Ok(models)
}

/// The built-in `default` agent, then the agent files of `folder`, by file name.
pub fn load_agents(folder: Option<&Path>) -> anyhow::Result<Vec<AgentConfig>> {
    let mut agents = vec![parse_agent("config/agents/default.toml", DEFAULT_AGENT_TOML)?];
    let Some(folder) = folder else { return Ok(agents) };
    let mut files: Vec<PathBuf> = std::fs::read_dir(folder)
        .with_context(|| format!("cannot read the agents folder {}", folder.display()))?
        .map(|entry| entry.map(|entry| entry.path()))
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("cannot list the agents folder {}", folder.display()))?
        .into_iter()
        .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
        .collect();
    files.sort();
    for path in files {
        let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let agent = parse_agent(&path.display().to_string(), &text)?;
        if agent.name != "default" && agents.iter().any(|known| known.name == agent.name) {
            anyhow::bail!("agent {} is defined twice (again in {})", agent.name, path.display());
        }
        agents.retain(|known| known.name != agent.name);
        agents.push(agent);
    }
    Ok(agents)
}

/// `url` without its password (in the authority or a `password=` parameter), for
/// messages.
/// The machine's host name (a node's default name), or `troupe` if it has none.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "troupe".to_owned())
}

fn redact_url(url: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, None), |(base, query)| (base, Some(query)));
    let base = match (base.find("://"), base.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let user = base[scheme + 3..at].split(':').next().unwrap_or_default();
            format!("{}{user}:***{}", &base[..scheme + 3], &base[at..])
        }
        _ => base.to_owned(),
    };
    match query {
        None => base,
        Some(query) => {
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((key, _)) if key.eq_ignore_ascii_case("password") => format!("{key}=***"),
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{base}?{}", pairs.join("&"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_are_masked_in_the_authority_and_the_query() {
        assert_eq!(redact_url("postgres://app:s3cret@db:5432/runs"), "postgres://app:***@db:5432/runs");
        assert_eq!(
            redact_url("postgres://db/runs?sslmode=require&password=s3cret"),
            "postgres://db/runs?sslmode=require&password=***"
        );
        assert_eq!(redact_url("sqlite://data/troupe.db"), "sqlite://data/troupe.db");
    }
}
