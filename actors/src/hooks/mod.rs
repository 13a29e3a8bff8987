//! The hook chain every tool call goes through, and the per-run ledger the built-in
//! hooks keep.
//!
//! Composition rules (each has a unit test below):
//! 1. `before_call` hooks run in order: validate args → blocked tools → duplicate
//!    calls → seen documents → the application's hooks.
//! 2. The first `Skip` or `Deny` short-circuits: later hooks do not run and the tool
//!    is not called. `Deny` becomes `Skipped{denied}`.
//! 3. `Rewrite(args)` replaces the arguments for every later hook and for the call.
//! 4. `after_call` hooks run in order on the outcome; `Replace` swaps it for the
//!    later hooks and for the model.
//! 5. Bookkeeping (failure strikes, successful-call index, seen documents, the
//!    `ToolExecutionRecord`, metrics) happens after all hooks, for every call,
//!    skipped ones included. It is not a hook, so no hook can switch it off.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::protocol::{CallStatus, Fragment, RunId, SkipReason, ToolCall, ToolExecutionRecord, ToolOutcome};
use crate::tool::RegisteredTool;

/// What a hook decides before a call.
#[derive(Debug, Clone, PartialEq)]
pub enum BeforeCall {
    /// Carry on unchanged.
    Run,
    /// Carry on with these arguments.
    Rewrite(Value),
    /// Do not run; the model sees why.
    Skip {
        /// Why.
        reason: SkipReason,
        /// Detail for the model.
        detail: String,
    },
    /// Refuse the call by policy.
    Deny {
        /// Why, for the model.
        reason: String,
    },
}

/// What a hook decides after a call.
#[derive(Debug, Clone, PartialEq)]
pub enum AfterCall {
    /// Keep the outcome.
    Keep,
    /// Replace it.
    Replace(ToolOutcome),
}

/// What a hook sees of a call's surroundings.
pub struct HookContext<'a> {
    /// The run.
    pub run_id: RunId,
    /// The run's tenant.
    pub tenant: &'a str,
    /// The run's agent.
    pub agent: &'a str,
    /// The turn.
    pub turn: u32,
    /// The tool, if the name is known.
    pub tool: Option<&'a RegisteredTool>,
    /// The run's ledger (failures, successes, seen documents).
    pub ledger: &'a RunLedger,
    /// Hook settings.
    pub config: &'a HookConfig,
}

/// A tool-call hook. Both methods default to doing nothing.
#[async_trait]
pub trait ToolHook: Send + Sync + 'static {
    /// A name for logs.
    fn name(&self) -> &'static str;

    /// Runs before the tool. Default: run unchanged.
    async fn before_call(&self, _context: &HookContext<'_>, _call: &ToolCall) -> BeforeCall {
        BeforeCall::Run
    }

    /// Runs after the tool, before the outcome is recorded. Default: keep.
    async fn after_call(&self, _context: &HookContext<'_>, _call: &ToolCall, _outcome: &ToolOutcome) -> AfterCall {
        AfterCall::Keep
    }
}

/// Settings of the built-in hooks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HookConfig {
    /// Failures of one tool in a run before it is blocked.
    pub failure_threshold: u32,
    /// Turns a blocked tool stays blocked; after that it is offered again, and one
    /// more failure blocks it again (half-open).
    pub cooldown_turns: u32,
    /// How many turns back an earlier success makes a call a duplicate; `None`
    /// means the whole run.
    pub dedupe_window_turns: Option<u32>,
}

impl Default for HookConfig {
    fn default() -> Self {
        Self { failure_threshold: 3, cooldown_turns: 2, dedupe_window_turns: None }
    }
}

/// The JSON text of `value` with object keys sorted at every level, so equal
/// arguments give equal keys whatever order the model wrote them in.
pub fn canonical_json(value: &Value) -> String {
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                Value::Object(entries.into_iter().map(|(k, v)| (k.clone(), sorted(v))).collect())
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(value).to_string()
}

#[derive(Debug, Default)]
struct LedgerState {
    /// Failures per tool since its last success.
    failures: HashMap<String, u32>,
    /// Blocked tools and the turn from which they are offered again.
    blocked_until: HashMap<String, u32>,
    /// (tool, canonical args) of successful calls → (turn, call id) of the first one.
    successes: HashMap<(String, String), (u32, String)>,
    /// Seen documents, in first-seen order.
    seen: Vec<Fragment>,
    seen_ids: HashSet<String>,
}

/// Per-run state of the built-in hooks. It is a cache: [`RunLedger::rebuild`]
/// derives it from the run's stored tool executions and documents.
#[derive(Debug, Default)]
pub struct RunLedger {
    // A std mutex: every critical section is a few map operations, never an await.
    state: Mutex<LedgerState>,
}

impl RunLedger {
    /// An empty ledger for a new run.
    pub fn new() -> Self {
        Self::default()
    }

    /// The ledger of a resumed run, replayed from its records and documents.
    pub fn rebuild(records: &[ToolExecutionRecord], documents: &[Fragment], config: &HookConfig) -> Self {
        let ledger = Self::new();
        for record in records {
            ledger.record_execution(record, config);
        }
        ledger.add_documents(documents);
        ledger
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LedgerState> {
        // Critical sections cannot panic halfway through a change, so a poisoned
        // lock still guards consistent data.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether `tool` is blocked in `turn`.
    pub fn is_blocked(&self, tool: &str, turn: u32) -> bool {
        self.lock().blocked_until.get(tool).is_some_and(|until| turn < *until)
    }

    /// Tools blocked in `turn`, sorted.
    pub fn blocked_tools(&self, turn: u32) -> Vec<String> {
        let mut tools: Vec<String> = self
            .lock()
            .blocked_until
            .iter()
            .filter(|(_, until)| turn < **until)
            .map(|(tool, _)| tool.clone())
            .collect();
        tools.sort();
        tools
    }

    /// The first successful identical call within the window, as (turn, call id).
    pub fn earlier_success(&self, tool: &str, args: &Value, turn: u32, window: Option<u32>) -> Option<(u32, String)> {
        let key = (tool.to_owned(), canonical_json(args));
        let state = self.lock();
        let (earlier_turn, call_id) = state.successes.get(&key)?;
        let in_window = window.is_none_or(|window| turn.saturating_sub(*earlier_turn) <= window);
        in_window.then(|| (*earlier_turn, call_id.clone()))
    }

    /// Books a finished call from its record. Returns true when it blocked the tool.
    pub fn record_execution(&self, record: &ToolExecutionRecord, config: &HookConfig) -> bool {
        self.record(
            record.turn,
            &record.tool,
            &record.call_id,
            record.original_args.as_ref().unwrap_or(&record.args),
            record.status,
            record.error.as_deref(),
            config,
        )
    }

    /// Whether a call of one of `tools` has succeeded in this run.
    pub fn any_success(&self, tools: &[String]) -> bool {
        self.lock().successes.keys().any(|(tool, _)| tools.contains(tool))
    }

    /// Ids of the documents seen so far.
    pub fn seen_ids(&self) -> Vec<String> {
        self.lock().seen.iter().map(|fragment| fragment.id.clone()).collect()
    }

    /// Adds documents; returns the ones not seen before.
    pub fn add_documents(&self, fragments: &[Fragment]) -> Vec<Fragment> {
        let mut state = self.lock();
        let mut added = Vec::new();
        for fragment in fragments {
            if state.seen_ids.insert(fragment.id.clone()) {
                state.seen.push(fragment.clone());
                added.push(fragment.clone());
            }
        }
        added
    }

    /// Seen documents, in first-seen order.
    pub fn documents(&self) -> Vec<Fragment> {
        self.lock().seen.clone()
    }

    /// Books a finished call. Returns true when this call blocked the tool.
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        turn: u32,
        tool: &str,
        call_id: &str,
        args: &Value,
        status: CallStatus,
        error: Option<&str>,
        config: &HookConfig,
    ) -> bool {
        let mut state = self.lock();
        let counts_as_failure = match status {
            CallStatus::Failed => error != Some("cancelled"),
            CallStatus::Skipped => error == Some(SkipReason::InvalidArgs.as_str()),
            _ => false,
        };
        if status == CallStatus::Completed {
            state.failures.remove(tool);
            state
                .successes
                .entry((tool.to_owned(), canonical_json(args)))
                .or_insert_with(|| (turn, call_id.to_owned()));
            return false;
        }
        if !counts_as_failure {
            return false;
        }
        let failures = state.failures.entry(tool.to_owned()).or_insert(0);
        *failures += 1;
        if *failures >= config.failure_threshold {
            let until = turn + 1 + config.cooldown_turns;
            let newly = state.blocked_until.get(tool).is_none_or(|old| turn >= *old);
            state.blocked_until.insert(tool.to_owned(), until);
            return newly;
        }
        false
    }
}

/// Rule 1a: the tool exists and the arguments are a JSON object valid against its schema.
pub struct ValidateArgs;

#[async_trait]
impl ToolHook for ValidateArgs {
    fn name(&self) -> &'static str {
        "validate_args"
    }

    async fn before_call(&self, context: &HookContext<'_>, call: &ToolCall) -> BeforeCall {
        let Some(registered) = context.tool else {
            return BeforeCall::Skip {
                reason: SkipReason::InvalidArgs,
                detail: format!("unknown tool {:?}", call.name),
            };
        };
        let (args, parsed) = match &call.args {
            Value::String(text) => match serde_json::from_str::<Value>(text) {
                Ok(value) => (value, true),
                Err(error) => {
                    return BeforeCall::Skip {
                        reason: SkipReason::InvalidArgs,
                        detail: format!("arguments are not valid JSON: {error}"),
                    };
                }
            },
            Value::Null => (Value::Object(Default::default()), true),
            other => (other.clone(), false),
        };
        if !args.is_object() {
            return BeforeCall::Skip {
                reason: SkipReason::InvalidArgs,
                detail: "arguments must be a JSON object".to_owned(),
            };
        }
        let problems: Vec<String> = registered
            .validator
            .iter_errors(&args)
            .take(5)
            .map(|error| {
                let path = error.instance_path().to_string();
                let path = if path.is_empty() { "/".to_owned() } else { path };
                format!("{path}: {error}")
            })
            .collect();
        if !problems.is_empty() {
            return BeforeCall::Skip {
                reason: SkipReason::InvalidArgs,
                detail: format!("arguments do not match the schema: {}", problems.join("; ")),
            };
        }
        if let Some(placeholder) = placeholder_in(&args) {
            return BeforeCall::Skip {
                reason: SkipReason::InvalidArgs,
                detail: format!("{placeholder} is a placeholder from the tool guide's example: use the real value"),
            };
        }
        if parsed { BeforeCall::Rewrite(args) } else { BeforeCall::Run }
    }
}

/// A string argument that is still a placeholder of the tool guide's examples
/// (`"<an id from search_emails>"`): a model that copies an example calls with it.
fn placeholder_in(args: &Value) -> Option<&str> {
    match args {
        Value::String(text) => {
            let inner = text.strip_prefix('<')?.strip_suffix('>')?;
            let looks_like_one = inner.contains(' ') && !inner.contains(['<', '>']);
            looks_like_one.then_some(text.as_str())
        }
        Value::Array(values) => values.iter().find_map(placeholder_in),
        Value::Object(fields) => fields.values().find_map(placeholder_in),
        _ => None,
    }
}

/// Rule 1b: a tool that failed `failure_threshold` times is skipped while it cools down.
pub struct BlockedTools;

#[async_trait]
impl ToolHook for BlockedTools {
    fn name(&self) -> &'static str {
        "blocked_tools"
    }

    async fn before_call(&self, context: &HookContext<'_>, call: &ToolCall) -> BeforeCall {
        if context.ledger.is_blocked(&call.name, context.turn) {
            return BeforeCall::Skip {
                reason: SkipReason::Blocked,
                detail: format!(
                    "tool {} failed {} times in this run and is blocked for now; use another approach",
                    call.name, context.config.failure_threshold
                ),
            };
        }
        BeforeCall::Run
    }
}

/// Rule 1c: an identical call that already succeeded in this run is not repeated.
pub struct DuplicateCalls;

#[async_trait]
impl ToolHook for DuplicateCalls {
    fn name(&self) -> &'static str {
        "duplicate_calls"
    }

    async fn before_call(&self, context: &HookContext<'_>, call: &ToolCall) -> BeforeCall {
        let window = context.config.dedupe_window_turns;
        match context.ledger.earlier_success(&call.name, &call.args, context.turn, window) {
            Some((turn, call_id)) => BeforeCall::Skip {
                reason: SkipReason::Duplicate,
                detail: format!(
                    "identical call already succeeded as call {call_id} in turn {turn}; use its result above"
                ),
            },
            None => BeforeCall::Run,
        }
    }
}

/// Rule 1d: tools with an `excluded_ids` parameter get the run's seen document ids.
pub struct SeenDocuments;

#[async_trait]
impl ToolHook for SeenDocuments {
    fn name(&self) -> &'static str {
        "seen_documents"
    }

    async fn before_call(&self, context: &HookContext<'_>, call: &ToolCall) -> BeforeCall {
        let accepts = context.tool.is_some_and(|registered| registered.accepts_excluded_ids);
        let seen = context.ledger.seen_ids();
        if !accepts || seen.is_empty() {
            return BeforeCall::Run;
        }
        let mut args = call.args.clone();
        let Some(object) = args.as_object_mut() else {
            return BeforeCall::Run;
        };
        let mut ids: Vec<Value> = object.get("excluded_ids").and_then(Value::as_array).cloned().unwrap_or_default();
        for id in seen {
            let id = Value::String(id);
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        object.insert("excluded_ids".to_owned(), Value::Array(ids));
        BeforeCall::Rewrite(args)
    }
}

/// The ordered hooks of a runtime: built-ins first, then the application's.
#[derive(Clone)]
pub struct HookChain {
    hooks: Vec<Arc<dyn ToolHook>>,
    /// Settings of the built-in hooks.
    pub config: HookConfig,
}

/// The result of the before-hooks.
#[derive(Debug, Clone, PartialEq)]
pub enum HookVerdict {
    /// Run the tool with these arguments.
    Run(Value),
    /// Do not run it; this is the outcome.
    Skip(ToolOutcome),
}

impl HookChain {
    /// The built-in hooks followed by `extra`.
    pub fn new(config: HookConfig, extra: Vec<Arc<dyn ToolHook>>) -> Self {
        let mut hooks: Vec<Arc<dyn ToolHook>> =
            vec![Arc::new(ValidateArgs), Arc::new(BlockedTools), Arc::new(DuplicateCalls), Arc::new(SeenDocuments)];
        hooks.extend(extra);
        Self { hooks, config }
    }

    /// Runs the before-hooks (rules 1-3).
    pub async fn before(&self, context: &HookContext<'_>, call: &ToolCall) -> HookVerdict {
        // The call is copied only when a hook rewrites it.
        let mut current = Cow::Borrowed(call);
        for hook in &self.hooks {
            match hook.before_call(context, &current).await {
                BeforeCall::Run => {}
                BeforeCall::Rewrite(args) => current.to_mut().args = args,
                BeforeCall::Skip { reason, detail } => {
                    return HookVerdict::Skip(ToolOutcome::Skipped { reason, detail });
                }
                BeforeCall::Deny { reason } => {
                    return HookVerdict::Skip(ToolOutcome::Skipped { reason: SkipReason::Denied, detail: reason });
                }
            }
        }
        HookVerdict::Run(current.into_owned().args)
    }

    /// Runs the after-hooks (rule 4).
    pub async fn after(&self, context: &HookContext<'_>, call: &ToolCall, outcome: ToolOutcome) -> ToolOutcome {
        let mut current = outcome;
        for hook in &self.hooks {
            if let AfterCall::Replace(replacement) = hook.after_call(context, call, &current).await {
                current = replacement;
            }
        }
        current
    }
}

#[cfg(test)]
mod tests;
