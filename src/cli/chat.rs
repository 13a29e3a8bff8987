//! `troupe chat`: a conversation with an agent in the terminal, on a thread of a
//! running daemon. Each message is a run of the thread (it sees the earlier
//! exchange); its reasoning shows live and collapses when the answer comes. A
//! question the agent asks and a call waiting for approval are answered inline.
//! `troupe threads …` lists, shows and deletes threads.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use tokio::io::{AsyncBufReadExt, BufReader, Lines, Stdin};
use troupe_actors::protocol::RunStatus;

use crate::cli::client::{Client, Waiting};
use crate::cli::remote::Remote;
use crate::cli::view::View;

/// Lines typed by the user.
type Input = Lines<BufReader<Stdin>>;

/// Prints `prompt` and reads one line; `None` at the end of input.
async fn ask(input: &mut Input, prompt: &str) -> anyhow::Result<Option<String>> {
    print!("{prompt}");
    std::io::stdout().flush()?;
    Ok(input.next_line().await?.map(|line| line.trim().to_owned()))
}

/// `troupe chat`: talks with `agent` on a new thread, or goes on with `thread`.
pub async fn chat(remote: Remote, agent: String, thread: Option<String>) -> anyhow::Result<ExitCode> {
    let client = Client::new(&remote.url, remote.token.clone())?;
    let (thread_id, agent) = match thread {
        Some(id) => {
            let thread = client.get_thread(&id).await?;
            for message in &thread.messages {
                let who = if message.role == "user" { "you" } else { "agent" };
                println!("{who}: {}", message.content);
            }
            (thread.thread.thread_id, thread.thread.agent)
        }
        None => {
            let thread = client.create_thread(&agent).await?;
            (thread.thread_id, thread.agent)
        }
    };
    println!("thread {thread_id} · agent {agent} · an empty line or Ctrl-D ends");
    let mut input = BufReader::new(tokio::io::stdin()).lines();
    let mut status = RunStatus::Succeeded;
    while let Some(message) = ask(&mut input, "› ").await? {
        if message.is_empty() {
            break;
        }
        // A run left waiting for an answer is interrupted by the next message
        // (it would otherwise hold it back).
        let strategy = if status == RunStatus::WaitingInput { "interrupt" } else { "enqueue" };
        let run = client.send_message(&thread_id, &message, strategy).await?;
        status = follow(&client, &run.run_id, remote.json, &mut input).await?;
    }
    println!("go on with: troupe chat --thread {thread_id}");
    Ok(if status == RunStatus::Failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// Shows a run to its end, answering its questions and approvals on the way.
async fn follow(client: &Client, run_id: &str, json: bool, input: &mut Input) -> anyhow::Result<RunStatus> {
    let mut out = std::io::stdout();
    let mut waiting = Waiting::default();
    let mut last = 0;
    // One view for the whole run, across its questions: its durations are the run's.
    let mut view = (!json).then(|| View::new(std::io::stdout().is_terminal()));
    loop {
        let status = client.follow_waiting(run_id, &mut view, &mut out, &mut waiting, &mut last).await?;
        if status != RunStatus::WaitingInput {
            return Ok(status);
        }
        if let Some((call_id, tool, why)) = waiting.approvals.first().cloned() {
            let decision = ask(input, &format!("approve {tool} ({why})? [y/N] ")).await?.unwrap_or_default();
            let approved = matches!(decision.to_lowercase().as_str(), "y" | "yes");
            let reason = if approved { None } else { ask(input, "why not? ").await?.filter(|r| !r.is_empty()) };
            client.approve(run_id, Some(&call_id), approved, reason.as_deref()).await?;
        } else {
            let Some(answer) = ask(input, "answer › ").await?.filter(|answer| !answer.is_empty()) else {
                println!("(left unanswered: your next message interrupts it)");
                return Ok(status);
            };
            client.input(run_id, &answer).await?;
        }
    }
}

/// `troupe threads list`.
pub async fn list(remote: Remote, limit: usize) -> anyhow::Result<ExitCode> {
    let list = Client::new(&remote.url, remote.token.clone())?.list_threads(limit).await?;
    if remote.json {
        println!("{}", serde_json::to_string_pretty(&list)?);
    } else {
        for thread in list.threads {
            let created = thread.created_at.format("%Y-%m-%d %H:%M:%S");
            let metadata =
                if thread.metadata.is_empty() { String::new() } else { serde_json::to_string(&thread.metadata)? };
            println!("{}  {:<12} {created}  {metadata}", thread.thread_id, thread.agent);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `troupe threads show`: the conversation.
pub async fn show(remote: Remote, id: String) -> anyhow::Result<ExitCode> {
    let thread = Client::new(&remote.url, remote.token.clone())?.get_thread(&id).await?;
    if remote.json {
        println!("{}", serde_json::to_string_pretty(&thread)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("thread {} · agent {} · {}", thread.thread.thread_id, thread.thread.agent, thread.status);
    for message in &thread.messages {
        let who = if message.role == "user" { "you" } else { "agent" };
        println!("{who}: {}", message.content);
    }
    Ok(ExitCode::SUCCESS)
}

/// `troupe threads delete`.
pub async fn delete(remote: Remote, id: String) -> anyhow::Result<ExitCode> {
    Client::new(&remote.url, remote.token.clone())?.delete_thread(&id).await?;
    if !remote.json {
        println!("deleted thread {id}");
    }
    Ok(ExitCode::SUCCESS)
}
