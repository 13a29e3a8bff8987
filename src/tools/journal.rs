//! `journal`: appends a line to the agent's journal, a file the operator reads (one
//! line per entry: time, the call's idempotency key, the text), one file per tenant. It has an effect
//! outside the run, so it is not idempotent: after a crash a call left `started`
//! is reported interrupted, never written twice by troupe. The key on each line
//! lets a reader spot a repeat a downstream retry could still cause.

use std::io::Write;

use async_trait::async_trait;
use serde_json::{Value, json};
use troupe_actors::tool::{Tool, ToolContext, ToolError, ToolOutput};

/// Longest entry accepted, in bytes.
const MAX_ENTRY: usize = 4096;

/// Its arguments.
#[derive(serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The entry, on one line.
    #[schemars(length(max = MAX_ENTRY))]
    text: String,
}

/// The tool, writing to the run's tenant's file of `path`.
pub struct Journal {
    /// The journal files (each created with its folder on its first write).
    pub path: crate::tools::TenantPath,
}

#[async_trait]
impl Tool for Journal {
    fn name(&self) -> &str {
        "journal"
    }

    fn description(&self) -> &str {
        "Appends an entry to the agent's journal, which the operator reads. Use it to record a decision or an action taken."
    }

    fn parameters(&self) -> Value {
        troupe_actors::tool::schema_of::<Args>()
    }

    fn describe_start(&self, _args: &Value) -> String {
        "Writing to the journal".to_owned()
    }

    async fn call(&self, context: ToolContext, args: Value) -> Result<ToolOutput, ToolError> {
        let Args { text } = crate::tools::args::parse_args(args)?;
        let text = text.replace(['\n', '\r', '\t'], " ");
        let line = format!("{}\t{}\t{text}\n", chrono::Utc::now().to_rfc3339(), context.idempotency_key);
        let path = self.path.of(&context.tenant);
        let written = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)?;
            }
            let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&path)?;
            file.write_all(line.as_bytes())?;
            file.sync_data()
        })
        .await;
        match written {
            Ok(Ok(())) => Ok(ToolOutput::value(json!("written"))),
            Ok(Err(error)) => {
                Err(ToolError::failed("journal_unwritable", format!("the journal cannot be written: {error}")))
            }
            Err(_) => Err(ToolError::failed("journal_unwritable", "the journal writer stopped")),
        }
    }
}
