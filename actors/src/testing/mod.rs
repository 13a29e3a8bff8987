//! Test support (feature `testing`): a scripted model, tools that echo, fail,
//! panic, hang or write to a ledger, a store that panics on demand, and a metrics
//! recorder. They stand in for the network and the world in tests and benches;
//! none of them is used by the product. [`eventually`] waits for a condition.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use serde_json::{Value, json};

use crate::llm::{ChatRequest, ModelChunk, ModelClient, ModelDelta, ModelError, ModelReply, ModelStream, Role};
use crate::protocol::{Fragment, RunId, ToolCall, Usage};
use crate::store::{Commit, MemoryStore, RunQuery, RunRecord, RunSnapshot, RunStore, StoreError};
use crate::tool::{Tool, ToolContext, ToolError, ToolOutput};

mod eventually;

pub use eventually::{Holds, eventually};

/// One scripted model answer.
#[derive(Debug, Clone)]
pub enum Step {
    /// Stream the reply's text as one delta, then the reply.
    Reply(ModelReply),
    /// Fail the call.
    Fail(ModelError),
    /// Never answer (until the call is dropped).
    Hang,
    /// Panic inside the model client.
    Panic,
    /// Stream `deltas` one by one, then the reply. With `hold`: wait for a permit
    /// of `hold.resume` before the second delta; once every delta was taken (the
    /// stream is polled past the last one), tell `hold.streamed` and wait for a
    /// permit of `hold.finish` before the reply.
    Streamed {
        /// The pieces, in order.
        deltas: Vec<ModelDelta>,
        /// The reply that ends the stream.
        reply: ModelReply,
        /// Where the stream stops before its reply.
        hold: Option<Arc<StreamHold>>,
    },
}

/// Where a [`Step::Streamed`] stream waits before its reply.
#[derive(Debug)]
pub struct StreamHold {
    /// The deltas after the first come after a permit is added here.
    pub resume: tokio::sync::Semaphore,
    /// Told once every delta was taken.
    pub streamed: tokio::sync::Notify,
    /// The reply comes after a permit is added here.
    pub finish: tokio::sync::Semaphore,
}

impl Default for StreamHold {
    fn default() -> Self {
        let (resume, finish) = (tokio::sync::Semaphore::new(0), tokio::sync::Semaphore::new(0));
        Self { resume, streamed: tokio::sync::Notify::new(), finish }
    }
}

/// Takes one permit of `semaphore` for good (none if it was closed).
async fn take_permit(semaphore: &tokio::sync::Semaphore) {
    if let Ok(permit) = semaphore.acquire().await {
        permit.forget();
    }
}

/// A reply with text only (a final answer).
pub fn text(content: &str) -> Step {
    Step::Reply(ModelReply { content: content.to_owned(), usage: usage(), ..Default::default() })
}

/// A reply calling `calls` as (tool, args); call ids are `{tool}_{index}`.
pub fn calls(calls: &[(&str, Value)]) -> Step {
    let tool_calls = calls
        .iter()
        .enumerate()
        .map(|(index, (name, args))| ToolCall {
            call_id: format!("{name}_{index}"),
            name: (*name).to_owned(),
            args: args.clone(),
        })
        .collect();
    Step::Reply(ModelReply { tool_calls, usage: usage(), ..Default::default() })
}

/// A `todo_write` call with `(id, content, status)` tasks.
pub fn todo(tasks: &[(&str, &str, &str)]) -> Value {
    let todos: Vec<Value> =
        tasks.iter().map(|(id, content, status)| json!({"id": id, "content": content, "status": status})).collect();
    json!({ "todos": todos })
}

fn usage() -> Usage {
    Usage { input_tokens: 100, output_tokens: 20, cost_usd: 0.0001 }
}

enum Script {
    /// Answers in order, whatever the run.
    Queue(VecDeque<Step>),
    /// Answers by turn: the request's turn is its assistant messages + 1. Runs that
    /// interleave each get their own sequence.
    PerTurn(Vec<Step>),
}

/// A model that answers from a script and keeps every request it got.
pub struct ScriptedModel {
    name: String,
    script: Mutex<Script>,
    /// Answer once the script is exhausted.
    fallback: Step,
    requests: Mutex<Vec<ChatRequest>>,
    count: AtomicUsize,
    /// Streams text deltas and keeps requests; off for benchmarks.
    verbose: bool,
}

impl ScriptedModel {
    /// Answers `steps` in order, then "done".
    pub fn queue(steps: Vec<Step>) -> Self {
        Self::new(Script::Queue(steps.into()))
    }

    /// Answers step N to every run's turn N, then "done".
    pub fn per_turn(steps: Vec<Step>) -> Self {
        Self::new(Script::PerTurn(steps))
    }

    fn new(script: Script) -> Self {
        Self {
            name: "scripted".to_owned(),
            script: Mutex::new(script),
            fallback: text("done"),
            requests: Mutex::new(Vec::new()),
            count: AtomicUsize::new(0),
            verbose: true,
        }
    }

    /// Keeps no requests and streams no deltas (benchmarks).
    pub fn quiet(mut self) -> Self {
        self.verbose = false;
        self
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<ChatRequest> {
        self.requests.lock().map(|requests| requests.clone()).unwrap_or_default()
    }

    /// How many requests came.
    pub fn request_count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    fn next_step(&self, request: &ChatRequest) -> Step {
        let Ok(mut script) = self.script.lock() else {
            return self.fallback.clone();
        };
        match &mut *script {
            Script::Queue(steps) => steps.pop_front(),
            Script::PerTurn(steps) => {
                let turn = request.messages.iter().filter(|m| m.role == Role::Assistant).count();
                steps.get(turn).cloned()
            }
        }
        .unwrap_or_else(|| self.fallback.clone())
    }
}

#[async_trait]
impl ModelClient for ScriptedModel {
    fn name(&self) -> &str {
        &self.name
    }

    async fn chat(&self, request: ChatRequest) -> Result<ModelStream, ModelError> {
        let step = self.next_step(&request);
        self.count.fetch_add(1, Ordering::SeqCst);
        if self.verbose
            && let Ok(mut requests) = self.requests.lock()
        {
            requests.push(request);
        }
        match step {
            Step::Reply(reply) => {
                let mut chunks = Vec::with_capacity(2);
                if self.verbose && !reply.content.is_empty() {
                    chunks.push(Ok(ModelChunk::Delta(ModelDelta::Text(reply.content.clone()))));
                }
                chunks.push(Ok(ModelChunk::Done(reply)));
                Ok(Box::pin(stream::iter(chunks)))
            }
            Step::Fail(error) => Err(error),
            Step::Hang => Ok(Box::pin(stream::pending())),
            Step::Streamed { deltas, reply, hold } => {
                let start = (0, deltas.into_iter(), Some(reply), hold);
                let chunks = stream::unfold(start, |(index, mut deltas, reply, hold)| async move {
                    if let Some(delta) = deltas.next() {
                        if let (1, Some(hold)) = (index, &hold) {
                            take_permit(&hold.resume).await;
                        }
                        return Some((Ok(ModelChunk::Delta(delta)), (index + 1, deltas, reply, hold)));
                    }
                    let reply = reply?;
                    if let Some(hold) = &hold {
                        hold.streamed.notify_one();
                        take_permit(&hold.finish).await;
                    }
                    Some((Ok(ModelChunk::Done(reply)), (index, deltas, None, hold)))
                });
                Ok(Box::pin(chunks))
            }
            Step::Panic => panic!("injected model client panic"),
        }
    }
}

fn object_schema(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required})
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
        Ok(ToolOutput { value: json!({"excluded": excluded, "found": fragments.len()}), fragments, cost_usd: 0.0 })
    }
}

/// A memory store that runs a hook before every commit and waits for the future
/// it returns: a test makes a commit panic there (the caller's actor crashes
/// mid-turn as on a real fault), looks at it, or holds it.
pub struct FaultyStore {
    inner: MemoryStore,
    before_commit: CommitHook,
}

type CommitHook = Box<dyn Fn(&Commit) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

impl FaultyStore {
    /// Panics on the first `times` commits for which `predicate` holds.
    pub fn new(times: usize, predicate: impl Fn(&Commit) -> bool + Send + Sync + 'static) -> Self {
        let remaining = AtomicUsize::new(times);
        Self::before_commit(move |commit| {
            if predicate(commit)
                && remaining.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| left.checked_sub(1)).is_ok()
            {
                panic!("injected store fault");
            }
            Box::pin(async {})
        })
    }

    /// Calls `hook` before each commit, and writes the commit once the future it
    /// returns is done.
    pub fn before_commit(
        hook: impl Fn(&Commit) -> futures::future::BoxFuture<'static, ()> + Send + Sync + 'static,
    ) -> Self {
        Self { inner: MemoryStore::new(), before_commit: Box::new(hook) }
    }
}

#[async_trait]
impl RunStore for FaultyStore {
    async fn create_run(&self, run: RunRecord, events: Vec<crate::protocol::RunEvent>) -> Result<(), StoreError> {
        self.inner.create_run(run, events).await
    }
    async fn commit(&self, commit: &Commit) -> Result<(), StoreError> {
        (self.before_commit)(commit).await;
        self.inner.commit(commit).await
    }
    async fn get_run(&self, run_id: RunId) -> Result<Option<RunRecord>, StoreError> {
        self.inner.get_run(run_id).await
    }
    async fn load(&self, run_id: RunId) -> Result<Option<RunSnapshot>, StoreError> {
        self.inner.load(run_id).await
    }
    async fn events_after(
        &self,
        run_id: RunId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<crate::protocol::RunEvent>, StoreError> {
        self.inner.events_after(run_id, after, limit).await
    }
    async fn list_runs(&self, query: RunQuery) -> Result<Vec<RunRecord>, StoreError> {
        self.inner.list_runs(query).await
    }
    async fn unfinished_runs(&self) -> Result<Vec<RunId>, StoreError> {
        self.inner.unfinished_runs().await
    }
    async fn delete_finished(&self, before: chrono::DateTime<chrono::Utc>, limit: usize) -> Result<usize, StoreError> {
        self.inner.delete_finished(before, limit).await
    }
}

struct Capture {
    snapshotter: Snapshotter,
    totals: Mutex<HashMap<String, u64>>,
}

static CAPTURE: OnceLock<Option<Capture>> = OnceLock::new();

/// Installs a process-wide recorder (once) so tests can read counters.
pub fn capture_metrics() {
    CAPTURE.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().ok().map(|()| Capture { snapshotter, totals: Mutex::new(HashMap::new()) })
    });
}

/// The total of counter `name` with exactly `labels` since [`capture_metrics`].
pub fn counter(name: &str, labels: &[(&str, &str)]) -> u64 {
    let Some(Some(capture)) = CAPTURE.get() else {
        return 0;
    };
    let Ok(mut totals) = capture.totals.lock() else {
        return 0;
    };
    // Snapshots drain counters, so they are folded into running totals.
    for (key, _, _, value) in capture.snapshotter.snapshot().into_vec() {
        if let DebugValue::Counter(value) = value {
            let mut labels: Vec<String> = key.key().labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
            labels.sort();
            *totals.entry(format!("{}{{{}}}", key.key().name(), labels.join(","))).or_insert(0) += value;
        }
    }
    let mut wanted: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    wanted.sort();
    totals.get(&format!("{name}{{{}}}", wanted.join(","))).copied().unwrap_or(0)
}

/// The benchmark workload, shared by the in-process and the durability benches.
pub mod bench {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use serde_json::json;

    use super::{EchoTool, ScriptedModel, calls, text, todo};
    use crate::config::{AgentConfig, RuntimeConfig};
    use crate::llm::ModelRegistry;
    use crate::protocol::CallStatus;
    use crate::protocol::RunStatus;
    use crate::runtime::{Deps, Runtime, SubmitRequest};
    use crate::store::RunStore;
    use crate::tool::ToolRegistry;
    use crate::tool_pool::ToolPoolConfig;

    /// Turns of every benchmark run: a `todo_write`, two parallel tool calls, an answer.
    pub const TURNS_PER_RUN: u64 = 3;

    /// Tool calls of every benchmark run that go through the tool pool (the two
    /// `echo` calls; `todo_write` is the planner's).
    const CALLS_PER_RUN: usize = 2;

    /// A runtime on `store` with the benchmark agent, its model answering at once.
    pub async fn start(
        store: Arc<dyn RunStore>,
        model: ScriptedModel,
        max_active_runs: usize,
    ) -> Result<Runtime, String> {
        let tools = ToolRegistry::new().with(Arc::new(EchoTool)).map_err(|error| error.to_string())?;
        let agent = AgentConfig::new("bench", "You are a benchmark.", vec!["echo".into()]);
        // The scripted answer leaves a task open; no reflection turn, so every run
        // has exactly three turns. Room in the tool queue for both calls of every
        // run: a full queue fails calls at once (`pool_overloaded`), which would
        // make the work measured depend on timing.
        let config = RuntimeConfig {
            max_active_runs,
            max_active_runs_per_tenant: 0,
            max_reflections: 0,
            tool_pool: ToolPoolConfig { queue_limit: CALLS_PER_RUN * max_active_runs, ..ToolPoolConfig::default() },
            ..RuntimeConfig::default()
        };
        let deps =
            Deps { store, models: ModelRegistry::new(Arc::new(model)), tools, hooks: Vec::new(), agents: vec![agent] };
        Runtime::start(config, deps).await.map_err(|error| error.to_string())
    }

    /// Turns per second and CPU microseconds per turn of `runs` concurrent runs on
    /// `store`. `followed`: every run has a live subscriber reading all its events
    /// (as an SSE client would); otherwise their end is noticed by polling.
    pub async fn throughput(store: Arc<dyn RunStore>, runs: usize, followed: bool) -> Result<(f64, f64), String> {
        let model = ScriptedModel::per_turn(vec![
            calls(&[("todo_write", todo(&[("1", "echo", "in_progress"), ("2", "answer", "pending")]))]),
            calls(&[("echo", json!({"text": "a"})), ("echo", json!({"text": "b"}))]),
            text("done"),
        ])
        .quiet();
        let runtime = Arc::new(start(store.clone(), model, runs.max(1)).await?);
        let cpu_before = cpu_time();
        let clock = Instant::now();
        let mut handles = Vec::with_capacity(runs);
        for index in 0..runs {
            let runtime = runtime.clone();
            handles.push(tokio::spawn(async move {
                let run_id = runtime.submit(SubmitRequest::new("bench", format!("run {index}"))).await;
                let run_id = run_id.map_err(|error| error.to_string())?;
                if followed {
                    runtime.wait(run_id).await.map_err(|error| error.to_string())?;
                }
                Ok::<_, String>(run_id)
            }));
        }
        let mut run_ids = Vec::with_capacity(runs);
        for handle in handles {
            run_ids.push(handle.await.map_err(|error| error.to_string())??);
        }
        while runtime.active_runs().await > 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let wall = clock.elapsed();
        let cpu = cpu_time().saturating_sub(cpu_before);
        for run_id in run_ids {
            let snapshot = store.load(run_id).await.map_err(|error| error.to_string())?.ok_or("a run vanished")?;
            let record = &snapshot.run;
            if record.status != RunStatus::Succeeded || u64::from(record.turn) != TURNS_PER_RUN {
                return Err(format!("run {run_id} ended {:?} after {} turns", record.status, record.turn));
            }
            let calls = &snapshot.tool_executions;
            let completed = calls.iter().filter(|call| call.tool == "echo" && call.status == CallStatus::Completed);
            if completed.count() != CALLS_PER_RUN {
                let outcomes: Vec<_> = calls.iter().map(|call| (&call.tool, call.status, &call.error)).collect();
                return Err(format!("run {run_id}: its echo calls did not all complete: {outcomes:?}"));
            }
        }
        let turns = runs as u64 * TURNS_PER_RUN;
        Ok((turns as f64 / wall.as_secs_f64(), cpu.as_secs_f64() * 1e6 / turns as f64))
    }

    /// User plus system CPU time of this process, from /proc (Linux).
    pub fn cpu_time() -> Duration {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // Fields after the command name (which is in parentheses and may hold spaces).
        let fields: Vec<&str> =
            stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
        let ticks: u64 = fields.get(11).and_then(|f| f.parse().ok()).unwrap_or(0)
            + fields.get(12).and_then(|f| f.parse().ok()).unwrap_or(0);
        // The kernel's USER_HZ is 100 on every mainstream Linux build.
        Duration::from_millis(ticks * 10)
    }
}
