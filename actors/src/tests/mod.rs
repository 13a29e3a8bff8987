//! Actor-tree tests: a real `Runtime` with a scripted model, test tools and the
//! memory store. Each test drives runs and asserts on their committed events.

mod answers;
mod approvals;
mod control;
mod hooks_e2e;
mod promises;
mod reflect;
mod steps;
mod sub_runs;
mod supervision;
mod threads;
mod turn_loop;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;

use crate::config::{AgentConfig, ReviewerKind, RuntimeConfig};
use crate::hooks::ToolHook;
use crate::llm::{ChatRequest, ModelRegistry};
use crate::protocol::{EventKind, Limits, RunEvent, RunId};
use crate::runtime::{Deps, Runtime, SubmitRequest};
use crate::store::{MemoryStore, RunRecord, RunStore, StoreError};
use crate::testing::{EchoTool, FailingTool, LedgerTool, PanickingTool, ScriptedModel, SearchTool, SlowTool};
use crate::tool::{Tool, ToolRegistry};

/// The agent every test uses, with every test tool.
const AGENT: &str = "tester";

struct Harness {
    runtime: Runtime,
    model: Arc<ScriptedModel>,
    ledger: LedgerTool,
}

struct Setup {
    model: ScriptedModel,
    config: RuntimeConfig,
    limits: Limits,
    store: Arc<dyn RunStore>,
    extra_tools: Vec<Arc<dyn Tool>>,
    hooks: Vec<Arc<dyn ToolHook>>,
    /// The agent's tools; all registered ones when `None`.
    agent_tools: Option<Vec<String>>,
    /// The agent's reviewer.
    reviewer: ReviewerKind,
    /// Whether the agent answers only from its tools' results.
    grounded: bool,
    /// Built-ins the agent is not offered.
    without_builtins: Vec<String>,
    /// The agent's steps.
    steps: Vec<crate::steps::AgentStep>,
    /// Whether the agent reflects.
    reflect: bool,
}

impl Setup {
    fn new(model: ScriptedModel) -> Self {
        Self {
            model,
            config: RuntimeConfig::default(),
            limits: Limits::default(),
            store: Arc::new(MemoryStore::new()),
            extra_tools: Vec::new(),
            hooks: Vec::new(),
            agent_tools: None,
            reviewer: ReviewerKind::RuleBased,
            grounded: false,
            without_builtins: Vec::new(),
            steps: Vec::new(),
            reflect: false,
        }
    }

    async fn start(self) -> Harness {
        let ledger = LedgerTool::default();
        let mut tools: Vec<Arc<dyn Tool>> = vec![
            Arc::new(EchoTool),
            Arc::new(FailingTool),
            Arc::new(PanickingTool),
            Arc::new(SearchTool),
            Arc::new(ledger.clone()),
        ];
        if self.extra_tools.is_empty() {
            tools.push(Arc::new(SlowTool { delay: Duration::from_secs(3600), timeout: None }));
        }
        tools.extend(self.extra_tools);
        let mut registry = ToolRegistry::new();
        for tool in tools {
            registry.register(tool).unwrap();
        }
        let tools = self.agent_tools.unwrap_or_else(|| registry.names());
        let mut agent = AgentConfig::new(AGENT, "You are a test agent.", tools);
        agent.limits = self.limits;
        agent.reviewer = self.reviewer;
        agent.grounded = self.grounded;
        agent.without_builtins = self.without_builtins;
        agent.steps = self.steps;
        agent.reflect = self.reflect;
        let model = Arc::new(self.model);
        let deps = Deps {
            store: self.store,
            models: ModelRegistry::new(model.clone()),
            tools: registry,
            hooks: self.hooks,
            agents: vec![agent],
        };
        let runtime = Runtime::start(self.config, deps).await.unwrap();
        Harness { runtime, model, ledger }
    }
}

impl Harness {
    async fn submit(&self, input: &str) -> RunId {
        self.runtime.submit(SubmitRequest::new(AGENT, input)).await.unwrap()
    }

    /// Submits `input` and returns the run's record and all its events once it ends.
    async fn run(&self, input: &str) -> (RunRecord, Vec<Arc<RunEvent>>) {
        let run_id = self.submit(input).await;
        self.finish(run_id).await
    }

    async fn finish(&self, run_id: RunId) -> (RunRecord, Vec<Arc<RunEvent>>) {
        let events = collect(self.runtime.subscribe(run_id, 0)).await;
        let record = self.runtime.get(run_id).await.unwrap().unwrap();
        assert_gap_free(&events);
        (record, events)
    }

    fn requests(&self) -> Vec<ChatRequest> {
        self.model.requests()
    }
}

/// Polls the run's status until it is `wanted`.
async fn wait_status(harness: &Harness, run_id: RunId, wanted: crate::protocol::RunStatus) {
    let what = format!("run {run_id} to become {wanted:?}");
    crate::testing::eventually(Duration::from_secs(10), &what, || async {
        harness.runtime.get(run_id).await.unwrap().unwrap().status == wanted
    })
    .await;
}

/// Every event of a stream, failing the test if it does not end within a minute.
async fn collect(stream: BoxStream<'static, Result<Arc<RunEvent>, StoreError>>) -> Vec<Arc<RunEvent>> {
    let all = stream.map(|event| event.unwrap()).collect::<Vec<_>>();
    tokio::time::timeout(Duration::from_secs(60), all).await.expect("the run did not end")
}

/// Reads `stream` until an event matches; returns it.
async fn wait_for(
    stream: &mut BoxStream<'static, Result<Arc<RunEvent>, StoreError>>,
    wanted: impl Fn(&EventKind) -> bool,
) -> Arc<RunEvent> {
    let find = async {
        while let Some(event) = stream.next().await {
            let event = event.unwrap();
            if wanted(&event.kind) {
                return event;
            }
        }
        panic!("the stream ended before the event came");
    };
    tokio::time::timeout(Duration::from_secs(60), find).await.expect("the event did not come")
}

fn assert_gap_free(events: &[Arc<RunEvent>]) {
    for (index, event) in events.iter().enumerate() {
        assert_eq!(event.seq, index as u64 + 1, "seq gap at {index}: {:?}", event.kind);
    }
    assert!(matches!(events.first().map(|e| &e.kind), Some(EventKind::RunStarted { .. })));
    assert!(matches!(events.last().map(|e| &e.kind), Some(EventKind::RunEnd { .. })));
}

fn kinds(events: &[Arc<RunEvent>]) -> Vec<&'static str> {
    events.iter().map(|event| event.kind.name()).collect()
}

fn count(events: &[Arc<RunEvent>], name: &str) -> usize {
    events.iter().filter(|event| event.kind.name() == name).count()
}

/// Turns that started and turns that were reviewed, each in order.
fn turns_and_reviews(events: &[Arc<RunEvent>]) -> (Vec<u32>, Vec<u32>) {
    let started = events.iter().filter_map(|e| match e.kind {
        EventKind::TurnStart { turn } => Some(turn),
        _ => None,
    });
    let reviewed = events.iter().filter_map(|e| match e.kind {
        EventKind::Review { turn, .. } => Some(turn),
        _ => None,
    });
    (started.collect(), reviewed.collect())
}

/// The tool messages the model saw in `request`.
fn tool_messages(request: &ChatRequest) -> Vec<String> {
    request.messages.iter().filter(|m| m.role == crate::llm::Role::Tool).map(|m| m.content.clone()).collect()
}

fn offered(request: &ChatRequest) -> Vec<String> {
    request.tools.iter().map(|tool| tool.name.clone()).collect()
}
