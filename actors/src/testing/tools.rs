//! Test tools: they echo, fail, panic, hang, wait for a gate, write to a
//! ledger, classify, or search with fragments.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};

use crate::protocol::Fragment;
use crate::tool::{Tool, ToolContext, ToolError, ToolOutput};

/// The context of a tool called outside a run: tenant `default`, turn 1, a
/// fresh run id (for calling a tool directly in a test).
pub fn tool_context(agent: &str) -> ToolContext {
    let run_id = crate::protocol::RunId::new();
    ToolContext {
        run_id,
        tenant: "default".into(),
        agent: agent.into(),
        turn: 1,
        call_id: "call".into(),
        idempotency_key: format!("{run_id}:1:0"),
        cancel: tokio_util::sync::CancellationToken::new(),
    }
}

/// Returns its `text` argument. Idempotent.
pub struct EchoTool;

#[async_trait]
impl Tool for EchoTool {
    fn name(&self) -> &str {
        "echo"
    }
    fn description(&self) -> &str {
        "Repeats the text it is given."
    }
    fn parameters(&self) -> Value {
        object_schema(json!({"text": {"type": "string"}}), &["text"])
    }
    fn idempotent(&self) -> bool {
        true
    }
    fn describe_start(&self, args: &Value) -> String {
        format!("Echoing '{}'", args.get("text").and_then(Value::as_str).unwrap_or_default())
    }
    async fn call(&self, _context: ToolContext, args: Value) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::value(args.get("text").cloned().unwrap_or(Value::Null)))
    }
}

/// Always fails with code `boom`.
pub struct FailingTool;

#[async_trait]
impl Tool for FailingTool {
    fn name(&self) -> &str {
        "flaky"
    }
    fn description(&self) -> &str {
        "Always fails."
    }
    fn parameters(&self) -> Value {
        object_schema(json!({}), &[])
    }
    async fn call(&self, _context: ToolContext, _args: Value) -> Result<ToolOutput, ToolError> {
        Err(ToolError::failed("boom", "the service is down"))
    }
}

/// Panics.
pub struct PanickingTool;

#[async_trait]
impl Tool for PanickingTool {
    fn name(&self) -> &str {
        "panics"
    }
    fn description(&self) -> &str {
        "Panics."
    }
    fn parameters(&self) -> Value {
        object_schema(json!({}), &[])
    }
    async fn call(&self, _context: ToolContext, _args: Value) -> Result<ToolOutput, ToolError> {
        panic!("injected tool panic")
    }
}

/// Waits `delay` before answering (use with paused time).
pub struct SlowTool {
    /// How long each call takes.
    pub delay: Duration,
    /// Its own time limit.
    pub timeout: Option<Duration>,
}

#[async_trait]
impl Tool for SlowTool {
    fn name(&self) -> &str {
        "slow"
    }
    fn description(&self) -> &str {
        "Takes a while."
    }
    fn parameters(&self) -> Value {
        object_schema(json!({}), &[])
    }
    fn timeout(&self) -> Option<Duration> {
        self.timeout
    }
    async fn call(&self, _context: ToolContext, _args: Value) -> Result<ToolOutput, ToolError> {
        tokio::time::sleep(self.delay).await;
        Ok(ToolOutput::value(json!("slow result")))
    }
}

/// A side-effecting tool: appends `entry` with the call's idempotency key to a
/// shared ledger. Not idempotent.
#[derive(Default, Clone)]
pub struct LedgerTool {
    /// (idempotency key, entry) lines written so far.
    pub lines: Arc<Mutex<Vec<(String, String)>>>,
}

#[async_trait]
impl Tool for LedgerTool {
    fn name(&self) -> &str {
        "ledger"
    }
    fn description(&self) -> &str {
        "Appends an entry to the ledger."
    }
    fn parameters(&self) -> Value {
        object_schema(json!({"entry": {"type": "string"}}), &["entry"])
    }
    async fn call(&self, context: ToolContext, args: Value) -> Result<ToolOutput, ToolError> {
        let entry = args.get("entry").and_then(Value::as_str).unwrap_or_default().to_owned();
        if let Ok(mut lines) = self.lines.lock() {
            lines.push((context.idempotency_key, entry));
        }
        Ok(ToolOutput::value(json!("written")))
    }
}

/// `pay`: a ledger tool that declares every call needs a human's approval.
#[derive(Default, Clone)]
pub struct GatedTool {
    /// Where its calls write.
    pub ledger: LedgerTool,
    /// If set, each call takes a permit before it writes (a call held running).
    pub hold: Option<Arc<tokio::sync::Semaphore>>,
}

#[async_trait]
impl Tool for GatedTool {
    fn name(&self) -> &str {
        "pay"
    }
    fn description(&self) -> &str {
        "Pays an invoice (a human approves each payment)."
    }
    fn parameters(&self) -> Value {
        object_schema(json!({"entry": {"type": "string"}}), &["entry"])
    }
    fn requires_approval(&self) -> bool {
        true
    }
    async fn call(&self, context: ToolContext, args: Value) -> Result<ToolOutput, ToolError> {
        if let Some(hold) = &self.hold {
            let _permit = hold.acquire().await;
        }
        self.ledger.call(context, args).await
    }
}

/// `classify`: returns `{"classification": label, "confidence": confidence}` from
/// its arguments, which labels the run for the approval policy. Idempotent.
pub struct ClassifierTool;

#[async_trait]
impl Tool for ClassifierTool {
    fn name(&self) -> &str {
        "classify"
    }
    fn description(&self) -> &str {
        "Classifies the request."
    }
    fn parameters(&self) -> Value {
        object_schema(json!({"label": {"type": "string"}, "confidence": {"type": "number"}}), &["label", "confidence"])
    }
    fn idempotent(&self) -> bool {
        true
    }
    async fn call(&self, _context: ToolContext, args: Value) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::value(json!({"classification": args["label"], "confidence": args["confidence"]})))
    }
}

/// Returns two documents per query and honours `excluded_ids`. Idempotent.
pub struct SearchTool;

#[async_trait]
impl Tool for SearchTool {
    fn name(&self) -> &str {
        "search"
    }
    fn description(&self) -> &str {
        "Searches documents."
    }
    fn parameters(&self) -> Value {
        object_schema(
            json!({"query": {"type": "string"}, "excluded_ids": {"type": "array", "items": {"type": "string"}}}),
            &["query"],
        )
    }
    fn idempotent(&self) -> bool {
        true
    }
    fn describe_start(&self, args: &Value) -> String {
        format!("Searching for '{}'", args.get("query").and_then(Value::as_str).unwrap_or_default())
    }
    async fn call(&self, _context: ToolContext, args: Value) -> Result<ToolOutput, ToolError> {
        let query = args.get("query").and_then(Value::as_str).unwrap_or_default();
        let excluded: Vec<&str> = args
            .get("excluded_ids")
            .and_then(Value::as_array)
            .map(|ids| ids.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let fragments: Vec<Fragment> = (1..=2)
            .map(|n| Fragment {
                id: format!("{query}-{n}"),
                source: format!("doc://{query}/{n}"),
                title: format!("{query} {n}"),
                snippet: String::new(),
            })
            .filter(|fragment| !excluded.contains(&fragment.id.as_str()))
            .collect();
        Ok(ToolOutput {
            value: json!({"excluded": excluded, "found": fragments.len()}),
            fragments,
            ..Default::default()
        })
    }
}

/// A JSON schema of an object with `properties`, `required` among them.
fn object_schema(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required})
}
