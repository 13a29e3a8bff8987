//! The hook chain's unit tests: composition rules and the built-in hooks.

use super::*;
use serde_json::json;

struct Named(&'static str, BeforeCall);

#[async_trait]
impl ToolHook for Named {
    fn name(&self) -> &'static str {
        self.0
    }
    async fn before_call(&self, _context: &HookContext<'_>, _call: &ToolCall) -> BeforeCall {
        self.1.clone()
    }
    async fn after_call(&self, _context: &HookContext<'_>, _call: &ToolCall, outcome: &ToolOutcome) -> AfterCall {
        match outcome {
            ToolOutcome::Ok { value, .. } if value == &json!(1) => {
                AfterCall::Replace(ToolOutcome::Ok { value: json!(2), fragments: vec![] })
            }
            _ => AfterCall::Keep,
        }
    }
}

fn call(args: Value) -> ToolCall {
    ToolCall { call_id: "c1".into(), name: "nope".into(), args }
}

fn bare_chain(hooks: Vec<Arc<dyn ToolHook>>) -> HookChain {
    HookChain { hooks, config: HookConfig::default() }
}

fn context<'a>(ledger: &'a RunLedger, config: &'a HookConfig) -> HookContext<'a> {
    HookContext { run_id: RunId::new(), tenant: "default", agent: "default", turn: 1, tool: None, ledger, config }
}

#[tokio::test]
async fn deny_short_circuits_later_hooks() {
    let chain = bare_chain(vec![
        Arc::new(Named("deny", BeforeCall::Deny { reason: "policy".into() })),
        Arc::new(Named("skip", BeforeCall::Skip { reason: SkipReason::Blocked, detail: "never".into() })),
    ]);
    let (ledger, config) = (RunLedger::new(), HookConfig::default());
    let admission = chain.before(&context(&ledger, &config), &call(json!({}))).await;
    assert_eq!(admission, HookVerdict::Skip(ToolOutcome::skipped(SkipReason::Denied, "policy")));
}

#[tokio::test]
async fn rewrites_chain_in_order() {
    let chain = bare_chain(vec![
        Arc::new(Named("a", BeforeCall::Rewrite(json!({"a": 1})))),
        Arc::new(Named("run", BeforeCall::Run)),
        Arc::new(Named("b", BeforeCall::Rewrite(json!({"b": 2})))),
    ]);
    let (ledger, config) = (RunLedger::new(), HookConfig::default());
    let admission = chain.before(&context(&ledger, &config), &call(json!({}))).await;
    assert_eq!(admission, HookVerdict::Run(json!({"b": 2})));
}

#[tokio::test]
async fn after_hooks_replace_the_outcome() {
    let chain = bare_chain(vec![Arc::new(Named("r", BeforeCall::Run))]);
    let (ledger, config) = (RunLedger::new(), HookConfig::default());
    let outcome = chain
        .after(&context(&ledger, &config), &call(json!({})), ToolOutcome::Ok { value: json!(1), fragments: vec![] })
        .await;
    assert_eq!(outcome, ToolOutcome::Ok { value: json!(2), fragments: vec![] });
}

#[test]
fn a_placeholder_copied_from_the_guide_is_found_in_the_arguments() {
    assert_eq!(placeholder_in(&json!({"email_id": "<an id from search_emails>"})), Some("<an id from search_emails>"));
    assert_eq!(placeholder_in(&json!({"todos": [{"content": "<first step>"}]})), Some("<first step>"));
    assert_eq!(placeholder_in(&json!({"text": "<b>bold</b> text"})), None);
    assert_eq!(placeholder_in(&json!({"to": "<sam@brightdesk.example>"})), None, "an address in brackets is data");
}

#[tokio::test]
async fn unknown_tool_is_invalid_args() {
    let chain = HookChain::new(HookConfig::default(), vec![]);
    let (ledger, config) = (RunLedger::new(), HookConfig::default());
    let HookVerdict::Skip(ToolOutcome::Skipped { reason, detail }) =
        chain.before(&context(&ledger, &config), &call(json!({}))).await
    else {
        panic!("expected a skip");
    };
    assert_eq!(reason, SkipReason::InvalidArgs);
    assert!(detail.contains("unknown tool"), "{detail}");
}

#[test]
fn canonical_json_ignores_key_order() {
    assert_eq!(
        canonical_json(&json!({"b": 1, "a": {"d": 2, "c": 3}})),
        canonical_json(&json!({"a": {"c": 3, "d": 2}, "b": 1}))
    );
}

#[test]
fn strikes_block_then_cool_down_half_open() {
    let config = HookConfig { failure_threshold: 3, cooldown_turns: 2, dedupe_window_turns: None };
    let ledger = RunLedger::new();
    let args = json!({});
    assert!(!ledger.record(1, "x", "a", &args, CallStatus::Failed, Some("boom"), &config));
    assert!(!ledger.record(1, "x", "b", &args, CallStatus::Failed, Some("boom"), &config));
    assert!(ledger.record(2, "x", "c", &args, CallStatus::Failed, Some("boom"), &config));
    assert!(ledger.is_blocked("x", 3) && ledger.is_blocked("x", 4));
    assert!(!ledger.is_blocked("x", 5), "offered again after the cooldown");
    assert!(ledger.record(5, "x", "d", &args, CallStatus::Failed, Some("boom"), &config), "one more failure re-blocks");
    ledger.record(9, "x", "e", &args, CallStatus::Completed, None, &config);
    assert!(
        !ledger.record(9, "x", "f", &args, CallStatus::Failed, Some("boom"), &config),
        "a success resets the count"
    );
}

#[test]
fn dedupe_window_limits_how_far_back_a_success_counts() {
    let config = HookConfig::default();
    let ledger = RunLedger::new();
    ledger.record(1, "x", "a", &json!({"q": 1}), CallStatus::Completed, None, &config);
    assert_eq!(ledger.earlier_success("x", &json!({"q": 1}), 5, None), Some((1, "a".into())));
    assert_eq!(ledger.earlier_success("x", &json!({"q": 1}), 5, Some(2)), None);
    assert_eq!(ledger.earlier_success("x", &json!({"q": 2}), 1, None), None);
}
