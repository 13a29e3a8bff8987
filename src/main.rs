//! `troupe`: an actor-based multi-agent runtime.
//!
//! This is the only place that reads files and the environment: it loads the
//! configuration, builds the adapters and hands them to `troupe_actors::Runtime`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;
use troupe_actors::protocol::RunStatus;

use troupe::config::{Config, DEFAULT_AGENT_TOML, parse_agent};
use troupe::demo;
use troupe::llm::{EnvModel, build_models};

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

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let overlay = match &cli.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
            Some((path.display().to_string(), text))
        }
        None => None,
    };
    let config = Config::parse(overlay.as_ref().map(|(origin, text)| (origin.as_str(), text.as_str())))?;
    let agents = vec![parse_agent("config/agents/default.toml", DEFAULT_AGENT_TOML)?];
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
    match cli.command {
        Command::Demo { question, agent, json } => {
            let args = demo::DemoArgs { agent, question, json };
            let status = runtime.block_on(demo::run(config.runtime, models, agents, args))?;
            Ok(if status == RunStatus::Succeeded { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
    }
}
