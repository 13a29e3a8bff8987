//! The commands that talk to a running daemon: `troupe run`, `troupe runs …`,
//! `troupe agents`, `troupe tools`. Each prints JSON with `--json`, else a view
//! for people.

use std::io::IsTerminal;
use std::process::ExitCode;

use troupe_actors::protocol::{RunEvent, RunStatus};

use crate::cli::client::Client;
use crate::cli::view::View;
use crate::reasoning::Block;
use crate::server::api_types::RunView;

/// Where the daemon is.
pub struct Remote {
    /// The daemon's URL.
    pub url: String,
    /// An API token.
    pub token: Option<String>,
    /// Print JSON instead of the human view.
    pub json: bool,
}

impl Remote {
    fn client(&self) -> anyhow::Result<Client> {
        Client::new(&self.url, self.token.clone())
    }
}

/// Exit status for a followed run: 0 succeeded, 1 otherwise, 3 parked on a question.
fn exit_for(status: RunStatus) -> ExitCode {
    match status {
        RunStatus::Succeeded => ExitCode::SUCCESS,
        RunStatus::WaitingInput => ExitCode::from(3),
        _ => ExitCode::FAILURE,
    }
}

/// `troupe run`: starts a run and prints its id, or with `follow` shows it to its end.
pub async fn run(remote: Remote, agent: String, question: String, follow: bool) -> anyhow::Result<ExitCode> {
    let client = remote.client()?;
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

/// `troupe runs list`: the tenant's runs, newest first.
pub async fn list(remote: Remote, status: Option<String>, limit: usize) -> anyhow::Result<ExitCode> {
    let list = remote.client()?.list_runs(status.as_deref(), limit).await?;
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

/// `troupe runs show`: one run; with `follow`, its events to the end; with
/// `reasoning`, every step of its reasoning block (a run still going is read
/// until it ends or waits for a person).
pub async fn show(remote: Remote, id: String, follow: bool, reasoning: bool) -> anyhow::Result<ExitCode> {
    let client = remote.client()?;
    if reasoning {
        let mut lines = Vec::new();
        client.follow(&id, None, &mut lines).await?;
        let events = lines
            .split(|byte| *byte == b'\n')
            .filter(|line| !line.is_empty())
            .map(serde_json::from_slice::<RunEvent>)
            .collect::<Result<Vec<_>, _>>()?;
        let block = Block::of(&events);
        if remote.json {
            println!("{}", serde_json::to_string_pretty(&block)?);
        } else {
            crate::cli::view::expanded(&mut std::io::stdout(), &block)?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    if follow {
        return follow_run(&client, &id, remote.json).await;
    }
    print_run(&client.get_run(&id).await?, remote.json)
}

/// `troupe runs cancel`.
pub async fn cancel(remote: Remote, id: String) -> anyhow::Result<ExitCode> {
    print_run(&remote.client()?.cancel(&id).await?, remote.json)
}

/// `troupe runs approve`: approves (or rejects) a call waiting for approval.
pub async fn approve(
    remote: Remote,
    id: String,
    call_id: String,
    reject: bool,
    reason: Option<String>,
) -> anyhow::Result<ExitCode> {
    print_run(&remote.client()?.approve(&id, Some(&call_id), !reject, reason.as_deref()).await?, remote.json)
}

/// `troupe runs input`: answers a run waiting for input.
pub async fn input(remote: Remote, id: String, text: String) -> anyhow::Result<ExitCode> {
    print_run(&remote.client()?.input(&id, &text).await?, remote.json)
}

/// `troupe agents`.
pub async fn agents(remote: Remote) -> anyhow::Result<ExitCode> {
    let agents = remote.client()?.agents().await?;
    if remote.json {
        println!("{}", serde_json::to_string_pretty(&agents)?);
    } else {
        for agent in agents {
            let model = agent.model.unwrap_or_else(|| "(default model)".to_owned());
            println!("{:<20} {model:<20} tools: {}", agent.name, agent.tools.join(", "));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `troupe tools`.
pub async fn tools(remote: Remote) -> anyhow::Result<ExitCode> {
    let tools = remote.client()?.tools().await?;
    if remote.json {
        println!("{}", serde_json::to_string_pretty(&tools)?);
    } else {
        for tool in tools {
            let summary = tool.description.lines().next().unwrap_or_default().to_owned();
            println!("{:<20} {summary}", tool.name);
        }
    }
    Ok(ExitCode::SUCCESS)
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
