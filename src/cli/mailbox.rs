//! `troupe mailbox …`: the mailbox of the email tools, without a runtime.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

use crate::config::Config;
use crate::email::mailbox::{Mailbox, SearchQuery};

/// The tenant's mailbox; `seed_sample: false` keeps an empty one from being
/// seeded with the sample first.
fn mailbox(config: &Config, tenant: &str, seed_sample: bool) -> Mailbox {
    let mut email = config.email.clone();
    email.seed_sample &= seed_sample;
    email.mailbox(&config.data_dir, tenant)
}

/// `troupe mailbox import`: an mbox file or a JSON list of emails (emails already
/// there are skipped).
pub async fn import(config: &Config, tenant: &str, file: &Path) -> anyhow::Result<ExitCode> {
    // Imported mail is the user's own: it must not land next to the sample.
    let mailbox = mailbox(config, tenant, false);
    let text = std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let added = mailbox.import(&text).await?;
    println!("imported {added} new email(s) into {} ({} in all)", mailbox.path().display(), mailbox.count().await?);
    Ok(ExitCode::SUCCESS)
}

/// `troupe mailbox sample`: the built-in sample mailbox, dated relative to now;
/// `reset` deletes every email, draft, outbox message, contact and calendar event first.
pub async fn sample(config: &Config, tenant: &str, reset: bool) -> anyhow::Result<ExitCode> {
    let mailbox = mailbox(config, tenant, false);
    if reset {
        mailbox.clear().await?;
    }
    let added = mailbox.import_sample().await?;
    println!("loaded {added} sample email(s) into {} ({} in all)", mailbox.path().display(), mailbox.count().await?);
    Ok(ExitCode::SUCCESS)
}

/// `troupe mailbox search`: as the `search_emails` tool does, newest first.
pub async fn search(config: &Config, tenant: &str, query: SearchQuery) -> anyhow::Result<ExitCode> {
    for email in mailbox(config, tenant, true).search(&query).await? {
        let date = email.date.format("%Y-%m-%d %H:%M");
        println!("{date}  {:<8} {:<40} {}", email.folder, email.id, email.subject);
    }
    Ok(ExitCode::SUCCESS)
}

/// `troupe mailbox outbox`: what send_email queued, oldest first.
pub async fn outbox(config: &Config, tenant: &str) -> anyhow::Result<ExitCode> {
    for message in mailbox(config, tenant, true).outbox().await? {
        let queued = message.queued_at.format("%Y-%m-%d %H:%M:%S");
        println!("{queued}  to {}  {}\n\n{}\n", message.to, message.subject, message.body);
    }
    Ok(ExitCode::SUCCESS)
}
