//! The email assistant's world: a mailbox in SQLite with full-text search
//! (`mailbox.rs`, schema in `schema.sql`), what can be imported into it (`import.rs`:
//! JSON lists and mbox files, `mime.rs`: the MIME they need), the entity extractor
//! (`entities.rs`), and the tools the email agents use (`tools.rs`; the model-backed
//! `analyze_email_content` in `analyze.rs`). The sample mailbox
//! (`config/email/sample-mailbox.json`, built in) fills an empty mailbox on first
//! use, dated relative to that moment, so `config/agents/email-*.toml` work with
//! no setup. Nothing here sends real mail: `send_email` fills an outbox table.

pub mod analyze;
pub mod entities;
pub mod import;
pub mod mailbox;
pub mod mime;
pub mod tools;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use troupe_actors::llm::ModelClient;
use troupe_actors::tool::{RegistryError, Tool, ToolRegistry};

pub use mailbox::{Mailbox, MailboxError, MailboxOptions};

/// `[email]`: the mailbox of the email tools.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmailConfig {
    /// The mailbox's SQLite file; a relative path is under the data dir.
    pub mailbox_path: PathBuf,
    /// Fill an empty mailbox with the built-in sample on first use.
    pub seed_sample: bool,
    /// The address `send_email` sends from.
    pub address: String,
    /// The model `analyze_email_content` asks; `None`: the default model.
    pub model: Option<String>,
}

impl Default for EmailConfig {
    fn default() -> Self {
        Self {
            mailbox_path: PathBuf::from("mailbox.db"),
            seed_sample: true,
            address: "Sam Rivera <sam@brightdesk.example>".to_owned(),
            model: None,
        }
    }
}

impl EmailConfig {
    /// The mailbox these settings describe, with a relative path under `data_dir`.
    pub fn mailbox(&self, data_dir: &Path) -> Mailbox {
        let path =
            if self.mailbox_path.is_absolute() { self.mailbox_path.clone() } else { data_dir.join(&self.mailbox_path) };
        Mailbox::new(MailboxOptions { path, seed_sample: self.seed_sample, address: self.address.clone() })
    }
}

/// The email tools over `mailbox`, `analyze_email_content` asking `model`.
pub fn email_tools(mailbox: Arc<Mailbox>, model: Arc<dyn ModelClient>) -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(tools::SearchEmails { mailbox: mailbox.clone() }),
        Arc::new(tools::GetEmailThread { mailbox: mailbox.clone() }),
        Arc::new(tools::ExtractEntities { mailbox: mailbox.clone() }),
        Arc::new(analyze::AnalyzeEmailContent { mailbox: mailbox.clone(), model }),
        Arc::new(tools::CreateDraft { mailbox: mailbox.clone() }),
        Arc::new(tools::SendEmail { mailbox }),
    ]
}

/// Adds the email tools to `registry`.
pub fn register(
    registry: &mut ToolRegistry,
    mailbox: Arc<Mailbox>,
    model: Arc<dyn ModelClient>,
) -> Result<(), RegistryError> {
    email_tools(mailbox, model).into_iter().try_for_each(|tool| registry.register(tool))
}

#[cfg(test)]
mod tests;
