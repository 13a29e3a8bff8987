//! `troupe`: an actor-based multi-agent runtime.
//!
//! This is the only place that reads files and the environment: it loads the
//! configuration, builds the adapters and hands them to `troupe_actors::Runtime`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;
use troupe_actors::protocol::RunStatus;

use troupe::config::{Config, DEFAULT_AGENT_TOML, parse_agent};
use troupe::demo;
use troupe::llm::{EnvModel, build_models};
use troupe::store::SqlStore;
use troupe_actors::store::RunStore;

#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// troupe runs LLM agents as a supervised tree of actors.
#[derive(Parser)]
#[command(name = "troupe", version, about)]
struct Cli {
    /// A TOML file overriding keys of config/default.toml.
    #[arg(long, global = true, env = "TROUPE_CONFIG")]
    config: Option<PathBuf>,
    /// A folder of agent files (`*.toml`), added to the built-in `default` agent
    /// (a file defining `default` replaces it).
    #[arg(long, global = true, env = "TROUPE_AGENTS")]
    agents: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one agent run in-process and print its events: on the built-in offline
    /// model, or on the default model when one is configured (or TROUPE_MODEL is set).
    Demo {
        /// The request.
        #[arg(default_value = "Count the words of this sentence and tell me which ones repeat: the cat saw the dog.")]
        question: String,
        /// The agent.
        #[arg(long, default_value = "default")]
        agent: String,
        /// Print each event as one JSON line.
        #[arg(long)]
        json: bool,
    },
    /// Resume the runs a previous process left unfinished in the store, and wait
    /// until they have all ended.
    Resume,
    /// Delete finished runs older than the retention period, in batches.
    Gc {
        /// Override `store.retention_days`.
        #[arg(long)]
        older_than_days: Option<f64>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_env("TROUPE_LOG").unwrap_or_else(|_| EnvFilter::new("warn")))
        .with_writer(std::io::stderr)
        .init();
    match run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("troupe: {error:#}");
            ExitCode::from(2)
        }
    }
}

/// The built-in `default` agent, then the agent files of `folder`, by file name.
fn load_agents(folder: Option<&std::path::Path>) -> anyhow::Result<Vec<troupe_actors::config::AgentConfig>> {
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

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let overlay = match &cli.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
            Some((path.display().to_string(), text))
        }
        None => None,
    };
    let mut config = Config::parse(overlay.as_ref().map(|(origin, text)| (origin.as_str(), text.as_str())))?;
    if let Some(url) = std::env::var("TROUPE_DATABASE_URL").ok().filter(|url| !url.trim().is_empty()) {
        config.store.url = url;
    }
    let agents = load_agents(cli.agents.as_deref())?;
    let tools = troupe::tools::builtin_registry(&config.tools)?;
    let env = EnvModel {
        base_url: std::env::var("OPENAI_BASE_URL").ok(),
        api_key: std::env::var("OPENAI_API_KEY").ok(),
        model: std::env::var("TROUPE_MODEL").ok(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    // Providers build HTTP clients, which want a runtime around them.
    let models = runtime.block_on(async {
        build_models(&config.providers, &config.models, config.default_model.as_deref(), &env, |name| {
            std::env::var(name).ok()
        })
    })?;
    let store = runtime
        .block_on(SqlStore::connect(&config.store.url))
        .with_context(|| format!("cannot open the store at {}", redact_url(&config.store.url)))?;
    match cli.command {
        Command::Demo { question, agent, json } => {
            let args = demo::DemoArgs { agent, question, json };
            let status = runtime.block_on(demo::run(config.runtime, Arc::new(store), models, tools, agents, args))?;
            Ok(if status == RunStatus::Succeeded { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Command::Resume => {
            let ended = runtime.block_on(demo::resume(config.runtime, Arc::new(store), models, tools, agents))?;
            let succeeded = ended.iter().filter(|(_, status)| *status == RunStatus::Succeeded).count();
            println!(
                "resumed {} run(s): {succeeded} succeeded, {} ended otherwise",
                ended.len(),
                ended.len() - succeeded
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Gc { older_than_days } => {
            let days = older_than_days.unwrap_or(config.store.retention_days);
            let age = chrono::Duration::try_seconds((days * 86_400.0) as i64)
                .filter(|_| days.is_finite() && days >= 0.0)
                .context("the retention period must be a non-negative number of days")?;
            let before = chrono::Utc::now()
                .checked_sub_signed(age)
                .context("the retention period reaches past the earliest representable date")?;
            let batch = config.store.gc_batch.max(1);
            let mut deleted = 0;
            loop {
                let count = runtime.block_on(store.delete_finished(before, batch))?;
                deleted += count;
                if count < batch {
                    break;
                }
            }
            println!("deleted {deleted} finished run(s) older than {days} day(s)");
            Ok(ExitCode::SUCCESS)
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
