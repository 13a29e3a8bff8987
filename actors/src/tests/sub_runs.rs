//! Multi-agent runs: `run_agent` starts a sub-run of another agent, under the
//! caller's tenant and budget, and returns its final answer.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::config::{AgentConfig, RuntimeConfig};
use crate::llm::ModelRegistry;
use crate::protocol::{EventKind, Limits, RunId, RunStatus};
use crate::run_input::RunInput;
use crate::runtime::{Deps, Runtime, SubmitRequest};
use crate::store::{MemoryStore, RunQuery, RunRecord, RunStore};
use crate::testing::{EchoTool, GatedTool, ScriptedModel, Step, calls, eventually, text};
use crate::tests::{collect, tool_messages, wait_for};
use crate::tool::ToolRegistry;

struct Team {
    runtime: Runtime,
    store: Arc<dyn RunStore>,
    boss: Arc<ScriptedModel>,
    helper: Arc<ScriptedModel>,
    /// The helper's `pay` tool (each call waits for a human).
    pay: GatedTool,
}

/// Agents `boss` (may call `run_agent` and `list_agents`) and `helper` (may call
/// `run_agent` and `pay` too), each on its own scripted model.
async fn team(boss: Vec<Step>, helper: Vec<Step>, config: RuntimeConfig, boss_limits: Limits) -> Team {
    team_on(Arc::new(MemoryStore::new()), boss, helper, config, boss_limits).await
}

async fn team_on(
    store: Arc<dyn RunStore>,
    boss: Vec<Step>,
    helper: Vec<Step>,
    config: RuntimeConfig,
    boss_limits: Limits,
) -> Team {
    let (boss, helper) = (Arc::new(ScriptedModel::per_turn(boss)), Arc::new(ScriptedModel::per_turn(helper)));
    let pay = GatedTool::default();
    let tools = ToolRegistry::new().with(Arc::new(EchoTool)).unwrap().with(Arc::new(pay.clone())).unwrap();
    let names = |list: &[&str]| list.iter().map(|name| (*name).to_owned()).collect::<Vec<_>>();
    let mut lead = AgentConfig::new("boss", "You lead.", names(&["run_agent", "list_agents", "echo"]));
    lead.limits = boss_limits;
    let mut aide = AgentConfig::new("helper", "You help with sub-tasks.", names(&["run_agent", "echo", "pay"]));
    aide.model = Some("helper".to_owned());
    let models = ModelRegistry::new(boss.clone()).with("helper", helper.clone());
    let deps = Deps { store: store.clone(), models, tools, hooks: Vec::new(), agents: vec![lead, aide] };
    let runtime = Runtime::start(config, deps).await.unwrap();
    Team { runtime, store, boss, helper, pay }
}

async fn sub_runs_of(store: &Arc<dyn RunStore>, parent: RunId) -> Vec<RunRecord> {
    let all = store.list_runs(RunQuery { limit: 100, ..RunQuery::default() }).await.unwrap();
    all.into_iter().filter(|run| run.parent_run_id == Some(parent)).collect()
}

fn delegate(input: &str) -> Step {
    calls(&[("run_agent", json!({"agent": "helper", "input": input}))])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_run_answers_the_caller_with_its_own_reviewed_run() {
    let team = team(
        vec![delegate("count to three"), text("The helper counted.")],
        vec![text("one two three")],
        RuntimeConfig::default(),
        Limits::default(),
    )
    .await;
    let mut request = SubmitRequest::new("boss", "get a count");
    request.tenant = "acme".to_owned();
    let boss = team.runtime.submit(request).await.unwrap();
    let events = collect(team.runtime.subscribe(boss, 0)).await;
    assert_eq!(team.runtime.get(boss).await.unwrap().unwrap().status, RunStatus::Succeeded);
    assert!(events.iter().any(|e| matches!(&e.kind, EventKind::ToolCallEnd { tool, .. } if tool == "run_agent")));

    let children = sub_runs_of(&team.store, boss).await;
    assert_eq!(children.len(), 1);
    let child = &children[0];
    assert_eq!((child.agent.as_str(), child.tenant.as_str()), ("helper", "acme"), "the caller's tenant");
    assert_eq!(child.status, RunStatus::Succeeded);
    assert_eq!(tool_messages(&team.boss.requests()[1]), vec!["one two three".to_owned()], "its answer is the result");
    let child_events = collect(team.runtime.subscribe(child.run_id, 0)).await;
    assert!(child_events.iter().all(|e| e.parent_run_id == Some(boss)), "sub-run events name their caller");
    assert!(child_events.iter().any(|e| matches!(e.kind, EventKind::Review { .. })), "the sub-run is reviewed");
    assert_eq!(team.helper.request_count(), 1);
    // The caller's usage includes what its sub-run spent.
    let spent = team.runtime.get(boss).await.unwrap().unwrap().usage.total_tokens();
    let own: u64 = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::TokenUsage { usage, .. } => Some(usage.total_tokens()),
            _ => None,
        })
        .sum();
    assert!(child.usage.total_tokens() > 0 && spent == own, "{spent} vs {own}");
    assert_eq!(spent, 3 * child.usage.total_tokens(), "the caller's two model calls plus the sub-run's one");
    let paid = team.runtime.get(boss).await.unwrap().unwrap().usage.cost_usd;
    assert!(child.usage.cost_usd > 0.0 && (paid - 3.0 * child.usage.cost_usd).abs() < 1e-12, "and their cost: {paid}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sub_runs_nest_no_deeper_than_the_limit_and_carve_the_callers_budget() {
    let config = RuntimeConfig { max_agent_depth: 1, ..RuntimeConfig::default() };
    let limits = Limits { max_tokens: Some(5_000), ..Limits::default() };
    let team = team(
        vec![delegate("go deeper"), text("Done.")],
        vec![delegate("deeper still"), text("I could not delegate.")],
        config,
        limits,
    )
    .await;
    let boss = team.runtime.submit(SubmitRequest::new("boss", "start")).await.unwrap();
    collect(team.runtime.subscribe(boss, 0)).await;
    let children = sub_runs_of(&team.store, boss).await;
    assert_eq!(children.len(), 1, "exactly one level of sub-runs");
    let child = &children[0];
    let budget = child.limits.max_tokens.unwrap();
    assert!(budget > 0 && budget <= 5_000, "carved from the caller's 5000: {budget}");
    let told = tool_messages(&team.helper.requests()[1]);
    assert!(told[0].contains("depth_limit"), "{told:?}");
    assert!(sub_runs_of(&team.store, child.run_id).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_caller_cancels_its_sub_run() {
    let team =
        team(vec![delegate("think forever")], vec![Step::Hang], RuntimeConfig::default(), Limits::default()).await;
    let boss = team.runtime.submit(SubmitRequest::new("boss", "start")).await.unwrap();
    let child = eventually(Duration::from_secs(10), "the sub-run to start", || async {
        sub_runs_of(&team.store, boss).await.pop().map(|child| child.run_id)
    })
    .await;
    team.runtime.cancel(boss).await.unwrap();
    eventually(Duration::from_secs(10), "the sub-run to be cancelled", || async {
        team.runtime.get(child).await.unwrap().unwrap().status == RunStatus::Cancelled
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_agents_names_the_configured_agents() {
    let team = team(
        vec![calls(&[("list_agents", json!({}))]), text("Two agents.")],
        vec![],
        RuntimeConfig::default(),
        Limits::default(),
    )
    .await;
    let boss = team.runtime.submit(SubmitRequest::new("boss", "who is there?")).await.unwrap();
    collect(team.runtime.subscribe(boss, 0)).await;
    let listed: serde_json::Value = serde_json::from_str(&tool_messages(&team.boss.requests()[1])[0]).unwrap();
    let names: Vec<&str> = listed.as_array().unwrap().iter().map(|agent| agent["name"].as_str().unwrap()).collect();
    assert_eq!(names, vec!["boss", "helper"]);
    assert_eq!(listed[1]["about"], "You help with sub-tasks.");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_run_cut_by_a_restart_is_followed_again_not_repeated() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let first = team_on(
        store.clone(),
        vec![delegate("take your time"), text("unused")],
        vec![Step::Hang],
        RuntimeConfig::default(),
        Limits::default(),
    )
    .await;
    let boss = first.runtime.submit(SubmitRequest::new("boss", "start")).await.unwrap();
    eventually(Duration::from_secs(10), "the sub-run to start", || async {
        !sub_runs_of(&store, boss).await.is_empty()
    })
    .await;
    first.runtime.shutdown(Duration::from_secs(5)).await;

    // The next process: the helper now answers.
    let second = team_on(
        store.clone(),
        vec![delegate("take your time"), text("The helper finished.")],
        vec![text("finished")],
        RuntimeConfig::default(),
        Limits::default(),
    )
    .await;
    collect(second.runtime.subscribe(boss, 0)).await;
    assert_eq!(second.runtime.get(boss).await.unwrap().unwrap().status, RunStatus::Succeeded);
    let children = sub_runs_of(&store, boss).await;
    assert_eq!(children.len(), 1, "the sub-run was not started twice");
    assert_eq!(children[0].status, RunStatus::Succeeded);
    assert_eq!(tool_messages(&second.boss.requests()[0]), vec!["finished".to_owned()], "its answer reached the caller");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_run_question_reaches_the_callers_client_and_is_answered_through_the_caller() {
    let team = team(
        vec![delegate("find the year"), text("The helper says 2024.")],
        vec![calls(&[("ask_user", json!({"question": "Which year?"}))]), text("2024 it is")],
        RuntimeConfig::default(),
        Limits::default(),
    )
    .await;
    let boss = team.runtime.submit(SubmitRequest::new("boss", "what year?")).await.unwrap();
    let mut events = team.runtime.subscribe(boss, 0);
    let parked = wait_for(&mut events, |kind| matches!(kind, EventKind::WaitingInput { .. })).await;
    let child = sub_runs_of(&team.store, boss).await[0].run_id;
    assert!(
        matches!(&parked.kind, EventKind::WaitingInput { prompt, sub_run } if prompt.contains("Which year?") && *sub_run == Some(child)),
        "{:?}",
        parked.kind
    );
    assert_eq!(team.runtime.get(boss).await.unwrap().unwrap().status, RunStatus::WaitingInput);

    team.runtime.input(boss, "2024").await.unwrap();
    collect(team.runtime.subscribe(boss, 0)).await;
    let record = team.runtime.get(boss).await.unwrap().unwrap();
    assert_eq!((record.status, record.final_output.as_deref()), (RunStatus::Succeeded, Some("The helper says 2024.")));
    assert_eq!(tool_messages(&team.helper.requests()[1]), vec!["2024".to_owned()], "the answer reached the sub-run");
    assert_eq!(tool_messages(&team.boss.requests()[1]), vec!["2024 it is".to_owned()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_run_approval_is_shown_and_decided_through_the_caller() {
    let team = team(
        vec![delegate("pay invoice 7"), text("Paid.")],
        vec![calls(&[("pay", json!({"entry": "invoice 7"}))]), text("paid")],
        RuntimeConfig::default(),
        Limits::default(),
    )
    .await;
    let boss = team.runtime.submit(SubmitRequest::new("boss", "pay it")).await.unwrap();
    let mut events = team.runtime.subscribe(boss, 0);
    let asked = wait_for(&mut events, |kind| matches!(kind, EventKind::ApprovalRequested { .. })).await;
    let child = sub_runs_of(&team.store, boss).await[0].run_id;
    assert!(
        matches!(&asked.kind, EventKind::ApprovalRequested { tool, sub_run, .. } if tool == "pay" && *sub_run == Some(child)),
        "{:?}",
        asked.kind
    );
    wait_for(&mut events, |kind| matches!(kind, EventKind::WaitingInput { sub_run: Some(_), .. })).await;
    assert!(team.pay.ledger.lines.lock().unwrap().is_empty(), "nothing is paid before the decision");

    let approve = RunInput::Approval { call_id: None, approved: true, reason: None };
    team.runtime.input(boss, approve).await.unwrap();
    collect(team.runtime.subscribe(boss, 0)).await;
    assert_eq!(team.runtime.get(boss).await.unwrap().unwrap().status, RunStatus::Succeeded);
    assert_eq!(team.pay.ledger.lines.lock().unwrap().len(), 1, "paid once");
}
