//! `troupe eval FILE`: runs a task file through the runtime in this process and
//! reports each task's result (see [`crate::eval`]). The runs, the mailbox and
//! the journal live in a scratch folder made for the eval, so every eval starts
//! from the sample mailbox and leaves the user's data alone; the models are the
//! configured ones.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use troupe_actors::{Deps, Runtime};

use crate::app::App;
use crate::config::Config;
use crate::eval::{EvalOptions, Task, TaskFile};
use crate::tools::TenantPath;

/// What `troupe eval` was asked.
#[derive(Debug, Clone)]
pub struct EvalArgs {
    /// The task file.
    pub file: PathBuf,
    /// Only tasks with this tag.
    pub tag: Option<String>,
    /// Only these tasks (all when empty).
    pub tasks: Vec<String>,
    /// The report as one JSON document instead of lines.
    pub json: bool,
    /// A task's time limit unless it sets its own.
    pub timeout: Duration,
    /// The share of tasks that must pass for the command to succeed.
    pub min_pass: f64,
}

/// The tasks `args` selects, checked before anything starts.
pub fn select(args: &EvalArgs) -> anyhow::Result<Vec<Task>> {
    let tasks = TaskFile::load(&args.file)?.select(args.tag.as_deref(), &args.tasks);
    if tasks.is_empty() {
        anyhow::bail!("{} has no task to run (check --tag and --task)", args.file.display());
    }
    Ok(tasks)
}

/// Points the runs, the mailbox and the journal of `config` into a new scratch
/// folder, which it returns; the models stay where the data dir has them.
pub fn scratch(config: &mut Config) -> anyhow::Result<PathBuf> {
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%S%.3f");
    let dir = std::env::temp_dir().join(format!("troupe-eval-{stamp}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    config.store.url = Some(format!("sqlite://{}", dir.join("troupe.db").display()));
    config.email.mailbox_path =
        TenantPath::new(dir.join("{tenant}/mailbox.db").display().to_string()).map_err(anyhow::Error::msg)?;
    config.tools.journal_path =
        TenantPath::new(dir.join("{tenant}/journal.log").display().to_string()).map_err(anyhow::Error::msg)?;
    Ok(dir)
}

/// Runs `tasks` on `app` and prints the report; the exit code says whether the
/// pass rate reached `--min-pass`.
pub async fn run(app: App, tasks: Vec<Task>, args: &EvalArgs) -> anyhow::Result<ExitCode> {
    let App { config, agents, models, tools, store, mcp, .. } = app;
    let deps = Deps { store: Arc::new(store), models, tools, hooks: Vec::new(), agents };
    let runtime = Runtime::start(config.runtime, deps).await?;
    let options = EvalOptions { timeout: args.timeout };
    let json = args.json;
    let report = crate::eval::run(&runtime, &tasks, &options, |result| {
        if !json {
            println!("{}", result.line());
        }
    })
    .await;
    runtime.shutdown(Duration::from_secs(5)).await;
    mcp.shutdown().await;
    let mut out = std::io::stdout().lock();
    if json {
        report.write_json(&mut out)?;
    } else {
        report.write_summary(&mut out)?;
    }
    out.flush()?;
    Ok(if report.pass_rate() + 1e-9 >= args.min_pass { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
