//! The email assistant's world: a mailbox in SQLite with full-text search
//! (`mailbox.rs`, schema in `schema.sql`), the owner's contacts and calendar in
//! the same file (`calendar.rs`), what can be imported into it (`import.rs`: JSON
//! lists and mbox files, `mime.rs`: the MIME they need), the entity extractor
//! (`entities.rs`), and the tools the email agents use (`tools.rs`; the
//! model-backed `analyze_email_content` in `analyze.rs`). The sample mailbox
//! (`config/email/sample-mailbox.json`, built in) fills an empty mailbox on first
//! use, dated relative to that moment, with its contacts and calendar
//! (`sample-contacts.json`, `sample-calendar.json`), so `config/agents/email-*.toml`
//! work with no setup. Nothing here sends real mail: `send_email` fills an outbox
//! table.

pub mod analyze;
pub mod calendar;
pub mod entities;
pub mod import;
pub mod mailbox;
pub mod mime;
pub mod tools;

use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use troupe_actors::llm::ModelClient;
use troupe_actors::tool::{RegistryError, Tool, ToolRegistry};

use crate::tools::TenantPath;

pub use mailbox::{Mailbox, MailboxError, MailboxOptions, Mailboxes};

/// `[email]`: the mailbox of the email tools.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmailConfig {
    /// The mailbox's SQLite file, one per tenant (the path holds `{tenant}`); a
    /// relative path is under the data dir.
    pub mailbox_path: TenantPath,
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
            mailbox_path: TenantPath::builtin("tenants/{tenant}/mailbox.db"),
            seed_sample: true,
            address: "Sam Rivera <sam@brightdesk.example>".to_owned(),
            model: None,
        }
    }
}

impl EmailConfig {
    /// Every tenant's mailbox as these settings describe it, a relative path under
    /// `data_dir`.
    pub fn mailboxes(&self, data_dir: &Path) -> Mailboxes {
        Mailboxes::new(self.mailbox_path.under(data_dir), self.seed_sample, self.address.clone())
    }

    /// The mailbox of `tenant`, a relative path under `data_dir`.
    pub fn mailbox(&self, data_dir: &Path, tenant: &str) -> Mailbox {
        self.mailboxes(data_dir).of_new(tenant)
    }
}

/// The email tools over `mailboxes` (each call uses its run's tenant's),
/// `analyze_email_content` asking `model`.
pub fn email_tools(mailboxes: Arc<Mailboxes>, model: Arc<dyn ModelClient>) -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(tools::SearchEmails { mailboxes: mailboxes.clone() }),
        Arc::new(tools::GetEmailThread { mailboxes: mailboxes.clone() }),
        Arc::new(tools::ExtractEntities { mailboxes: mailboxes.clone() }),
        Arc::new(tools::CheckCalendar { mailboxes: mailboxes.clone() }),
        Arc::new(tools::GetContact { mailboxes: mailboxes.clone() }),
        Arc::new(tools::FileEmail { mailboxes: mailboxes.clone() }),
        Arc::new(analyze::AnalyzeEmailContent { mailboxes: mailboxes.clone(), model }),
        Arc::new(tools::CreateDraft { mailboxes: mailboxes.clone() }),
        Arc::new(tools::SendEmail { mailboxes }),
    ]
}

/// Adds the email tools over `mailboxes` to `registry`.
pub fn register(
    registry: &mut ToolRegistry,
    mailboxes: Arc<Mailboxes>,
    model: Arc<dyn ModelClient>,
) -> Result<(), RegistryError> {
    email_tools(mailboxes, model).into_iter().try_for_each(|tool| registry.register(tool))
}

#[cfg(test)]
mod tests;
