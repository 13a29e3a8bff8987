//! Runtime: the API boundary of the core. Callers (the HTTP layer, the CLI, tests)
//! start it with its dependencies and then submit, follow, answer and cancel runs;
//! they never hold a ref to an internal actor.
//!
//! Admission control happens here, before any message is sent: a bounded number of
//! runs have a live session, and a submission beyond it is refused with
//! [`SubmitError::Overloaded`] at once.
//!
//! Files: `mod.rs` (the [`Runtime`] and its API), `request.rs` (submissions and
//! the API's errors), `queue.rs` (starting sessions, and queued runs as slots
//! free), `threads.rs` (one active run per thread).

mod queue;
mod request;
mod threads;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use futures::StreamExt;
use futures::stream::BoxStream;
use ractor::{Actor, ActorRef};
use tracing::{info, warn};

use crate::admission::{Admission, QueueFull, Refusal, RunQueue, Slot};
use crate::builtin::BuiltinTool;
use crate::config::{AgentConfig, RuntimeConfig};
use crate::events::{self, EventHub};
use crate::hooks::{HookChain, ToolHook};
use crate::llm::ModelRegistry;
use crate::metrics;
use crate::protocol::ThreadId;
use crate::protocol::{EventKind, RunEvent, RunId, RunStatus};
use crate::runtime::queue::{dispatch, start_session};
use crate::runtime::threads::{Lines, MAX_WAITING_PER_THREAD};
use crate::session::SessionMsg;
use crate::shared::{Handles, over_budget};
use crate::store::{Idempotency, Metadata, RunRecord, RunSnapshot, RunStore, StoreError, ThreadRecord};
use crate::supervisor::{Supervisor, SupervisorMsg};
use crate::threads::{INTERRUPTED, MultitaskStrategy, ROLLED_BACK};
use crate::tool::ToolRegistry;
use crate::tool_pool::PoolShared;

// Their old paths: these live below the runtime, where sessions use them too.
pub use crate::run_input::{InputError, RunInput};
pub use crate::shared::{RuntimeShared, end_run};
pub use request::{CancelError, RuntimeError, SubmitError, SubmitRequest, Submitted, ThreadRun};
pub use threads::MAX_WAITING_PER_THREAD as MAX_RUNS_WAITING_PER_THREAD;
#[cfg(any(test, feature = "testing"))]
pub(crate) use threads::SUMMARISE;

/// What the runtime is built from.
pub struct Deps {
    /// Where runs live.
    pub store: Arc<dyn RunStore>,
    /// The models.
    pub models: ModelRegistry,
    /// The tools.
    pub tools: ToolRegistry,
    /// The application's tool hooks, run after the built-in ones.
    pub hooks: Vec<Arc<dyn ToolHook>>,
    /// The agents.
    pub agents: Vec<AgentConfig>,
}

/// The running core.
pub struct Runtime {
    shared: Arc<RuntimeShared>,
    supervisor: ActorRef<SupervisorMsg>,
    admission: Arc<Admission>,
    queue: Arc<RunQueue>,
    dispatcher: tokio::task::JoinHandle<()>,
    lines: Arc<Lines>,
    /// Requests under one idempotency key are taken one at a time (striped by key).
    idempotency_locks: Vec<tokio::sync::Mutex<()>>,
}

/// How long an idempotency key is remembered.
pub const IDEMPOTENCY_WINDOW: chrono::TimeDelta = chrono::TimeDelta::hours(24);

impl Runtime {
    /// The tool pool, for tests that look at its queue.
    #[cfg(test)]
    pub(crate) fn tool_pool(&self) -> Option<ActorRef<crate::tool_pool::ToolPoolMsg>> {
        self.shared.handles.tool_pool()
    }

    /// Starts the actor tree and resumes every unfinished run in the store.
    pub async fn start(config: RuntimeConfig, deps: Deps) -> Result<Self, RuntimeError> {
        let agents = check_agents(&deps)?;
        let mut timeouts = HashMap::new();
        for (tool, seconds) in &config.tool_pool.timeouts {
            let limit =
                Duration::try_from_secs_f64(*seconds).ok().filter(|limit| !limit.is_zero()).ok_or_else(|| {
                    RuntimeError::Config(format!("tool_pool.timeouts.{tool} must be a positive number of seconds"))
                })?;
            timeouts.insert(tool.clone(), limit);
        }
        let pool = PoolShared {
            registry: deps.tools,
            chain: HookChain::new(config.hooks.clone(), deps.hooks),
            default_timeout: config.tool_pool.default_timeout,
            timeouts,
        };
        let described_tools = crate::session::prompt::described_tools(&pool.registry, &config.tool_docs);
        let shared = Arc::new(RuntimeShared {
            store: deps.store,
            models: deps.models,
            pool: Arc::new(pool),
            described_tools,
            agents,
            handles: Handles::default(),
            hub: Arc::new(EventHub::new(config.event_buffer)),
            config: config.clone(),
        });
        let supervisor = Supervisor { shared: shared.clone() };
        let (supervisor, _) =
            Actor::spawn(None, supervisor, ()).await.map_err(|error| RuntimeError::Spawn(error.to_string()))?;
        let admission = Arc::new(Admission::new(config.max_active_runs, config.max_active_runs_per_tenant));
        let queue = Arc::new(RunQueue::new(config.max_queued_runs, config.max_queued_runs_per_tenant));
        let dispatcher = tokio::spawn(dispatch(shared.clone(), supervisor.clone(), admission.clone(), queue.clone()));
        let lines = Arc::new(Lines::new(shared.clone(), admission.clone(), queue.clone()));
        let idempotency_locks = (0..64).map(|_| tokio::sync::Mutex::new(())).collect();
        let runtime = Self { shared, supervisor, admission, queue, dispatcher, lines, idempotency_locks };
        runtime.resume_unfinished().await?;
        Ok(runtime)
    }

    /// Resumes the runs the store gives as unfinished: at start, those the last
    /// process left; in a cluster, those this node just claimed (orphaned by a
    /// node that stopped), called again as the node polls for them. They were
    /// admitted before, so they take a slot when one is free and run without one
    /// otherwise.
    pub async fn resume_unfinished(&self) -> Result<(), RuntimeError> {
        if !self.accepting() {
            return Ok(());
        }
        let unfinished = self.shared.store.unfinished_runs().await?;
        if !unfinished.is_empty() {
            info!(runs = unfinished.len(), "resuming unfinished runs");
        }
        for run_id in unfinished {
            // A session still here for a run claimed anew is stale.
            let _ = ractor::call!(self.supervisor, |reply| SupervisorMsg::Discard { run_id, reply });
            let Some(run) = self.shared.store.get_run(run_id).await? else { continue };
            if let Some(thread_id) = run.thread_id {
                // The oldest unfinished run of a thread is its active one; the
                // others wait behind it, in order.
                let line = self.lines.line(thread_id);
                let mut line = line.lock().await;
                if line.active.is_some() {
                    line.waiting.push_back(run_id);
                    continue;
                }
                let queued = (run.status == RunStatus::Queued).then_some(run.tenant.as_str());
                self.lines.activate(&mut line, thread_id, run_id, queued);
                if queued.is_some() {
                    continue;
                }
            }
            if run.status == RunStatus::Queued {
                // It waits its turn again, ahead of anything submitted from now on.
                let _ = self.queue.push(run_id, &run.tenant, true);
                continue;
            }
            // A parked run waits for a human without a slot.
            let slot = (run.status != RunStatus::WaitingInput).then(|| self.admission.readmit(&run.tenant));
            match start_session(&self.supervisor, run_id, slot, None).await {
                Ok(()) => metrics::run_recovered(),
                Err(error) => warn!(run_id = %run_id, %error, "could not resume run"),
            }
        }
        metrics::runs_queued(self.queue.len());
        self.admission.freed().notify_one();
        Ok(())
    }

    /// Accepts a run: admission, the run and its `run_started` event committed,
    /// then its session started. Returns once the run is durable.
    pub async fn submit(&self, request: SubmitRequest) -> Result<RunId, SubmitError> {
        Ok(self.submit_record(request).await?.run_id)
    }

    /// [`Runtime::submit`], returning the run's record as it was created (status
    /// `running` or `queued`) without reading it back from the store.
    pub async fn submit_record(&self, request: SubmitRequest) -> Result<RunRecord, SubmitError> {
        Ok(self.submit_with(request).await?.run)
    }

    /// [`Runtime::submit_record`], and whether the run was created by an earlier
    /// request under the same idempotency key (it is then returned as it is
    /// now, and nothing is created). A run of a thread follows the thread's
    /// runs (see [`SubmitRequest::thread`]).
    pub async fn submit_with(&self, request: SubmitRequest) -> Result<Submitted, SubmitError> {
        let Some(idempotency) = request.idempotency.clone() else {
            return self.submit_new(request).await;
        };
        let _taken = self.idempotency_lock(&request.tenant, &idempotency.key).lock().await;
        let since = Utc::now() - IDEMPOTENCY_WINDOW;
        let earlier =
            self.shared.store.threads().run_by_idempotency_key(&request.tenant, &idempotency.key, since).await?;
        match earlier {
            Some((run, fingerprint)) if fingerprint == idempotency.fingerprint => {
                let run = self.shared.store.get_run(run.run_id).await?.unwrap_or(run);
                Ok(Submitted { run, replayed: true })
            }
            Some(_) => Err(SubmitError::IdempotencyKeyReused),
            None => self.submit_new(request).await,
        }
    }

    /// The lock of the stripe `(tenant, key)` falls in (always the same one).
    fn idempotency_lock(&self, tenant: &str, key: &str) -> &tokio::sync::Mutex<()> {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::hash::DefaultHasher::new();
        (tenant, key).hash(&mut hasher);
        &self.idempotency_locks[(hasher.finish() % self.idempotency_locks.len() as u64) as usize]
    }

    async fn submit_new(&self, request: SubmitRequest) -> Result<Submitted, SubmitError> {
        let run = match request.thread {
            Some(thread) => self.submit_to_thread(request, thread).await?,
            None => self.create(request, false).await?,
        };
        Ok(Submitted { run, replayed: false })
    }

    /// A message to a thread: a run that starts now if the thread has no active
    /// run, and otherwise as `strategy` says.
    async fn submit_to_thread(&self, mut request: SubmitRequest, thread: ThreadRun) -> Result<RunRecord, SubmitError> {
        let thread_id = thread.thread_id;
        let line = self.lines.line(thread_id);
        let mut line = line.lock().await;
        // Read under the line's lock: a thread being deleted holds it until it is gone.
        let stored = self.shared.store.threads().get_thread(thread_id).await?;
        let Some(stored) = stored.filter(|stored| stored.tenant == request.tenant) else {
            return Err(SubmitError::UnknownThread);
        };
        if request.spec.agent.is_empty() {
            request.spec.agent = stored.agent;
        }
        self.lines.start_next(&mut line, thread_id).await;
        let Some(active) = line.active else {
            if self.lines.is_long(thread_id, &request.spec.agent).await {
                // Its history is summarised first, by a model call no request
                // waits for: it waits on the thread until then.
                let run = self.create(request, true).await?;
                line.waiting.push_back(run.run_id);
                drop(line);
                self.lines.announce(thread_id);
                self.lines.start_next_soon(thread_id);
                return Ok(run);
            }
            let run = self.create(request, false).await?;
            if !run.status.is_terminal() {
                self.lines.activate(&mut line, thread_id, run.run_id, None);
            }
            self.lines.announce(thread_id);
            return Ok(run);
        };
        let reason = match thread.strategy {
            MultitaskStrategy::Reject => return Err(SubmitError::ThreadBusy { active_run_id: active }),
            MultitaskStrategy::Enqueue => None,
            MultitaskStrategy::Interrupt => Some(INTERRUPTED),
            MultitaskStrategy::Rollback => Some(ROLLED_BACK),
        };
        if reason.is_none() && line.waiting.len() >= MAX_WAITING_PER_THREAD {
            return Err(SubmitError::ThreadQueueFull { limit: MAX_WAITING_PER_THREAD });
        }
        let run = self.create(request, true).await?;
        // The new run is durable first: if a cancel below is lost, the runs before
        // it finish and it follows them. An interrupting message runs next: the
        // runs waiting before it are cancelled too (before the active one, so that
        // none of them starts), with the same reason.
        if let Some(reason) = reason {
            let ahead: Vec<RunId> = line.waiting.drain(..).collect();
            for run_id in ahead {
                self.cancel_quietly(run_id, reason).await;
            }
        }
        line.waiting.push_back(run.run_id);
        drop(line);
        self.lines.announce(thread_id);
        if let Some(reason) = reason {
            self.cancel_quietly(active, reason).await;
        }
        Ok(run)
    }

    /// Cancels a run of a thread with `reason`; one that has ended already (or is
    /// gone) is left as it is.
    async fn cancel_quietly(&self, run_id: RunId, reason: &str) {
        match self.cancel_because(run_id, reason.to_owned()).await {
            Ok(()) | Err(CancelError::AlreadyEnded(_) | CancelError::NotFound) => {}
            Err(error) => warn!(run_id = %run_id, %error, "could not cancel a run of a thread"),
        }
    }

    /// Creates a run: it starts now (or waits in the run queue for a slot), or,
    /// with `hold`, is stored `queued` and waits on its thread.
    async fn create(&self, request: SubmitRequest, hold: bool) -> Result<RunRecord, SubmitError> {
        let SubmitRequest { spec, tenant, parent_run_id, thread, metadata, idempotency, traceparent } = request;
        let Some(agent) = self.shared.agents.get(&spec.agent) else {
            metrics::admission_rejected("unknown_agent");
            return Err(SubmitError::UnknownAgent(spec.agent));
        };
        let limits = spec.limits.clone().unwrap_or_else(|| agent.limits.clone());
        if limits.max_turns == 0 || limits.max_parallel_tools == 0 {
            return Err(SubmitError::InvalidLimits("max_turns and max_parallel_tools must be at least 1".to_owned()));
        }
        if !self.accepting() {
            return Err(SubmitError::Unavailable);
        }
        let permit = if hold { None } else { self.admit(&tenant)? };
        let run_id = RunId::new();
        let now = Utc::now();
        let mut record =
            RunRecord::accepted(run_id, tenant.clone(), spec.agent.clone(), spec.input.clone(), limits, now);
        record.parent_run_id = parent_run_id;
        record.thread_id = thread.map(|thread| thread.thread_id);
        record.metadata = metadata;
        record.idempotency = idempotency;
        record.traceparent = traceparent;
        if permit.is_none() {
            record.status = RunStatus::Queued;
        }
        let mut events = vec![RunEvent {
            run_id,
            seq: 1,
            ts: now,
            parent_run_id,
            kind: EventKind::RunStarted { agent: spec.agent.clone(), input: spec.input },
        }];
        // A run that starts now starts its first turn in the commit that creates
        // it (unless its budget is spent before it begins: its session then ends
        // it): its session calls the model at once, as it would for a run resumed
        // in a turn whose reply never committed. It is handed to its session as
        // created, since reading it back from the store would only return the same.
        if permit.is_some() && over_budget(&record.limits, &record.usage).is_none() {
            record.turn = 1;
            let kind = EventKind::TurnStart { turn: 1 };
            events.push(RunEvent { run_id, seq: 2, ts: now, parent_run_id, kind });
        }
        let created = permit.as_ref().map(|_| Box::new(RunSnapshot::created(record.clone(), events.len() as u64)));
        let created_record = record.clone();
        // Kept for the streams that follow it (served once it is stored).
        self.shared.hub.begin(run_id, &tenant, &events);
        if let Err(error) = self.shared.store.create_run(record, events).await {
            self.shared.hub.forget(run_id);
            return Err(error.into());
        }
        self.shared.hub.stored(run_id);
        metrics::run_started(&spec.agent);
        let Some(permit) = permit else {
            if hold {
                return Ok(created_record);
            }
            // Stored as queued before it is queued, so the dispatcher always finds
            // it. Concurrent submissions may pass `has_room` together and overfill
            // the queue by at most their number.
            let _ = self.queue.push(run_id, &tenant, true);
            metrics::runs_queued(self.queue.len());
            self.admission.freed().notify_one();
            return Ok(created_record);
        };
        if let Err(error) = start_session(&self.supervisor, run_id, Some(permit), created).await {
            // The run is durable; record that it could not start rather than lose it.
            let _ = end_run(&self.shared, run_id, RunStatus::Failed, "the runtime could not start the run".to_owned())
                .await;
            return Err(error);
        }
        Ok(created_record)
    }

    /// Creates a thread of `tenant` whose runs go to `agent` unless they name
    /// another; with an idempotency key, a request repeated within 24 hours
    /// returns the thread the first created (`true`: replayed).
    pub async fn create_thread(
        &self,
        tenant: String,
        agent: String,
        metadata: Metadata,
        idempotency: Option<Idempotency>,
    ) -> Result<(ThreadRecord, bool), SubmitError> {
        if !self.shared.agents.contains_key(&agent) {
            return Err(SubmitError::UnknownAgent(agent));
        }
        let threads = self.shared.store.threads();
        let _taken = match &idempotency {
            Some(idempotency) => {
                let taken = self.idempotency_lock(&tenant, &idempotency.key).lock().await;
                let since = Utc::now() - IDEMPOTENCY_WINDOW;
                match threads.thread_by_idempotency_key(&tenant, &idempotency.key, since).await? {
                    Some((thread, fingerprint)) if fingerprint == idempotency.fingerprint => {
                        return Ok((thread, true));
                    }
                    Some(_) => return Err(SubmitError::IdempotencyKeyReused),
                    None => Some(taken),
                }
            }
            None => None,
        };
        let now = Utc::now();
        let thread = ThreadRecord {
            thread_id: ThreadId::new(),
            tenant,
            agent,
            metadata,
            created_at: now,
            updated_at: now,
            idempotency,
            summary: None,
        };
        threads.create_thread(thread.clone()).await?;
        Ok((thread, false))
    }

    /// The thread's runs, oldest first.
    pub async fn thread_runs(&self, thread_id: ThreadId) -> Result<Vec<RunRecord>, StoreError> {
        self.lines.runs(thread_id).await
    }

    /// Deletes a thread with its runs: those that have not ended are cancelled
    /// first (the waiting ones before the active one, so none starts). The
    /// thread's line stays locked throughout: a message arriving meanwhile finds
    /// the thread gone.
    pub async fn delete_thread(&self, thread_id: ThreadId) -> Result<(), CancelError> {
        let line = self.lines.line(thread_id);
        let mut guard = line.lock().await;
        let unfinished = self.thread_runs(thread_id).await?.into_iter().filter(|run| !run.status.is_terminal());
        let mut order: Vec<RunId> = guard.waiting.iter().copied().collect();
        for run in unfinished {
            if !order.contains(&run.run_id) {
                order.push(run.run_id);
            }
        }
        // The active run last.
        order.sort_by_key(|run_id| Some(*run_id) == guard.active);
        for run_id in order {
            match self.cancel_because(run_id, "its thread was deleted".to_owned()).await {
                Ok(()) | Err(CancelError::AlreadyEnded(_) | CancelError::NotFound) => {}
                Err(error) => return Err(error),
            }
            guard.waiting.retain(|waiting| *waiting != run_id);
        }
        match self.shared.store.threads().delete_thread(thread_id).await {
            Ok(true) | Err(StoreError::ThreadNotFound(_)) => Ok(()),
            Ok(false) => Err(CancelError::Unavailable),
            Err(error) => Err(error.into()),
        }
    }

    /// Every event of the thread's runs, run after run, from the event after
    /// `after` (a run and a seq; `None`: from the start), then live, also of runs
    /// started later. It ends when the thread is deleted or the runtime stops.
    pub fn subscribe_thread(
        &self,
        thread_id: ThreadId,
        after: Option<(RunId, u64)>,
    ) -> BoxStream<'static, Result<Arc<RunEvent>, StoreError>> {
        let (sender, receiver) = tokio::sync::mpsc::channel(64);
        let lines = self.lines.clone();
        tokio::spawn(async move { lines.follow_thread(thread_id, after, sender).await });
        futures::stream::unfold(
            receiver,
            |mut receiver| async move { receiver.recv().await.map(|event| (event, receiver)) },
        )
        .boxed()
    }

    /// A slot for a run of `tenant` submitted now, or `None` if it is to wait in
    /// the queue (which has room for it); refused if it may do neither.
    fn admit(&self, tenant: &str) -> Result<Option<Slot>, SubmitError> {
        // Runs already waiting go first, unless none of them could take the slot
        // (their tenants are at their own limits): then it is this run's.
        let (permit, tenant_bound) = match self.admission.try_admit(tenant) {
            Ok(slot) if self.queue.is_empty() => (Some(slot), false),
            Ok(slot) if !self.queue.any_admissible(&self.admission) => (Some(slot), false),
            Ok(_) => (None, false),
            Err(refusal) => (None, matches!(refusal, Refusal::Tenant { .. })),
        };
        if permit.is_none() {
            match self.queue.has_room(tenant) {
                Ok(()) => {}
                Err(QueueFull::Tenant { .. }) => return Err(self.refuse_tenant()),
                Err(QueueFull::Global { .. }) if tenant_bound => return Err(self.refuse_tenant()),
                Err(QueueFull::Global { .. }) => {
                    metrics::admission_rejected("overloaded");
                    return Err(SubmitError::Overloaded { limit: self.shared.config.max_active_runs });
                }
            }
        }
        Ok(permit)
    }

    fn refuse_tenant(&self) -> SubmitError {
        metrics::admission_rejected("tenant_overloaded");
        SubmitError::TenantOverloaded { limit: self.shared.config.max_active_runs_per_tenant }
    }

    /// Every event of the run after seq `after`, then live events until `run_end`.
    pub fn subscribe(&self, run_id: RunId, after: u64) -> BoxStream<'static, Result<Arc<RunEvent>, StoreError>> {
        events::subscribe(self.shared.hub.clone(), self.shared.store.clone(), run_id, after)
    }

    /// Deletes a run that has ended, with its events, messages, tool calls, plans,
    /// reviews and documents: `Ok(true)`; `Ok(false)` if it has not ended.
    pub async fn delete(&self, run_id: RunId) -> Result<bool, StoreError> {
        self.shared.store.delete_ended(run_id).await
    }

    /// Waits until the run ends and returns its final record.
    pub async fn wait(&self, run_id: RunId) -> Result<RunRecord, StoreError> {
        let mut events = self.subscribe(run_id, 0);
        while let Some(event) = events.next().await {
            event?;
        }
        self.shared.store.get_run(run_id).await?.ok_or(StoreError::NotFound(run_id))
    }

    /// The run's record.
    pub async fn get(&self, run_id: RunId) -> Result<Option<RunRecord>, StoreError> {
        self.shared.store.get_run(run_id).await
    }

    /// [`subscribe`](Self::subscribe) for a client of `tenant`: `None` unless the
    /// run exists and is `tenant`'s.
    pub async fn subscribe_owned(
        &self,
        run_id: RunId,
        tenant: &str,
        after: u64,
    ) -> Result<Option<BoxStream<'static, Result<Arc<RunEvent>, StoreError>>>, StoreError> {
        events::subscribe_owned(self.shared.hub.clone(), self.shared.store.clone(), run_id, tenant, after).await
    }

    /// Answers a run parked on `ask_user` (`RunInput::Text`) or decides on a call
    /// waiting for approval (`RunInput::Approval`).
    pub async fn input(&self, run_id: RunId, input: impl Into<RunInput>) -> Result<(), InputError> {
        let input = input.into();
        // A run waiting with its parked sub-run passes the input down to it.
        if let Ok(Some(session)) = self.session(run_id).await
            && let Ok(Some(child)) = ractor::call!(session, |reply| SessionMsg::WaitingOn { reply })
        {
            return Box::pin(self.input(child, input)).await;
        }
        let Some(session) = self.session(run_id).await.map_err(|_| InputError::Unavailable)? else {
            return match self.shared.store.get_run(run_id).await? {
                None => Err(InputError::NotFound),
                Some(_) => Err(InputError::NotWaiting),
            };
        };
        // A parked run gave up its slot; it takes one again to go on (never
        // refused: it was admitted before).
        if let Some(run) = self.shared.store.get_run(run_id).await?.filter(|run| run.status == RunStatus::WaitingInput)
        {
            let slot = self.admission.readmit(&run.tenant);
            let _ = self.supervisor.cast(SupervisorMsg::AttachSlot { run_id, slot });
        }
        match ractor::call!(session, |reply| SessionMsg::Input { input, reply }) {
            // A refusal of a parked run's input gives the slot back in the session.
            Ok(result) => result,
            // The session stopped as the input came: the run just ended.
            Err(_) => match self.shared.store.get_run(run_id).await? {
                Some(run) if run.status.is_terminal() => Err(InputError::NotWaiting),
                _ => Err(InputError::Unavailable),
            },
        }
    }

    /// Cancels a run; returns once `run_end` is committed.
    pub async fn cancel(&self, run_id: RunId) -> Result<(), CancelError> {
        self.cancel_because(run_id, "cancelled by the client".to_owned()).await
    }

    /// Cancels a run, its end giving `reason`; returns once `run_end` is committed.
    async fn cancel_because(&self, run_id: RunId, reason: String) -> Result<(), CancelError> {
        if self.queue.remove(run_id) {
            metrics::runs_queued(self.queue.len());
        }
        let Some(run) = self.shared.store.get_run(run_id).await? else {
            return Err(CancelError::NotFound);
        };
        if run.status.is_terminal() {
            return Err(CancelError::AlreadyEnded(run.status));
        }
        match self.session(run_id).await.map_err(|_| CancelError::Unavailable)? {
            Some(session) => match ractor::call!(session, |reply| SessionMsg::Cancel { reason, reply }) {
                Ok(()) => Ok(()),
                // The session stopped as the cancel came: the run just ended.
                Err(_) => match self.shared.store.get_run(run_id).await? {
                    Some(run) if run.status.is_terminal() => Err(CancelError::AlreadyEnded(run.status)),
                    _ => Err(CancelError::Unavailable),
                },
            },
            None => Ok(end_run(&self.shared, run_id, RunStatus::Cancelled, reason).await?),
        }
    }

    pub(crate) async fn session(
        &self,
        run_id: RunId,
    ) -> Result<Option<ActorRef<SessionMsg>>, ractor::RactorErr<SupervisorMsg>> {
        ractor::call!(self.supervisor, |reply| SupervisorMsg::Session { run_id, reply })
    }

    /// Waits until the run ends or parks on a question, and returns its record.
    /// It also returns when the run has no live session here (it cannot move on).
    pub async fn wait_settled(&self, run_id: RunId) -> Result<RunRecord, StoreError> {
        let mut events = self.subscribe(run_id, 0);
        let mut check = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                event = events.next() => match event {
                    None => break,
                    Some(event) => {
                        // A `waiting_input` in the history may have been answered since.
                        if matches!(event?.kind, EventKind::WaitingInput { .. }) && self.is_parked(run_id).await? {
                            break;
                        }
                    }
                },
                _ = check.tick() => {
                    let live = matches!(self.session(run_id).await, Ok(Some(_)));
                    if !live || self.is_parked(run_id).await? {
                        break;
                    }
                }
            }
        }
        self.shared.store.get_run(run_id).await?.ok_or(StoreError::NotFound(run_id))
    }

    async fn is_parked(&self, run_id: RunId) -> Result<bool, StoreError> {
        Ok(self.shared.store.get_run(run_id).await?.is_some_and(|run| run.status == RunStatus::WaitingInput))
    }

    /// Other processes drive runs of the same store (a cluster): streams keep
    /// following a run whose session here stops, woken by [`Runtime::nudge`].
    pub fn follow_remote_runs(&self) {
        self.shared.hub.follow_remote_runs();
    }

    /// The store holds events of `run_id` that another process committed: its
    /// streams here read them.
    pub fn nudge(&self, run_id: RunId) {
        self.shared.hub.nudge(run_id);
    }

    /// [`Runtime::nudge`] for every run followed here.
    pub fn nudge_all(&self) {
        self.shared.hub.nudge_all();
    }

    /// Runs waiting for a slot.
    pub fn queued_runs(&self) -> usize {
        self.queue.len()
    }

    /// Runs with a live session.
    pub async fn active_runs(&self) -> usize {
        ractor::call!(self.supervisor, |reply| SupervisorMsg::ActiveRuns { reply }).unwrap_or(0)
    }

    /// Resolves once the actor tree has stopped: at shutdown, or after a meltdown
    /// of the shared actors, after which this runtime takes no more runs (a daemon
    /// then exits, for its service manager to start a fresh one).
    pub async fn stopped(&self) {
        let _ = self.supervisor.wait(None).await;
    }

    /// Whether the actor tree is up and taking runs.
    pub fn accepting(&self) -> bool {
        // `Starting` lasts until the supervisor's first message; it already serves.
        ractor::ACTIVE_STATES.contains(&self.supervisor.get_status())
    }

    /// One configured agent.
    pub fn agent(&self, name: &str) -> Option<Arc<AgentConfig>> {
        self.shared.agents.get(name).cloned()
    }

    /// The configured agents.
    pub fn agents(&self) -> Vec<AgentConfig> {
        let mut agents: Vec<AgentConfig> = self.shared.agents.values().map(|agent| agent.as_ref().clone()).collect();
        agents.sort_by(|a, b| a.name.cmp(&b.name));
        agents
    }

    /// The definitions of every registered tool, by name (agents choose among them).
    pub fn tools(&self) -> Vec<Arc<crate::llm::ToolDefinition>> {
        let registry = &self.shared.pool.registry;
        let mut names = registry.names();
        names.sort();
        names.iter().filter_map(|name| registry.definition(name)).collect()
    }

    /// The store.
    pub fn store(&self) -> Arc<dyn RunStore> {
        self.shared.store.clone()
    }

    /// Stops every actor within `deadline`. First each run lets its tool calls in
    /// flight end and commits their outcomes (it starts nothing new); then the
    /// actors stop. Runs keep their last commit and resume on the next start; only a
    /// call still running at the deadline is cut off (and resumed as interrupted).
    pub async fn shutdown(&self, deadline: Duration) {
        let started = Instant::now();
        self.shared.handles.begin_shutdown();
        // Queued runs stay `queued` in the store and queue again on the next start.
        self.dispatcher.abort();
        if let Ok(sessions) = ractor::call!(self.supervisor, |reply| SupervisorMsg::Drain { reply }) {
            info!(runs = sessions.len(), "shutting down: runs let their tool calls in flight finish");
            let drained = futures::future::join_all(sessions.iter().map(|session| session.wait(None)));
            if tokio::time::timeout(deadline, drained).await.is_err() {
                warn!("tool calls were still running at the shutdown deadline; they are cut off");
            }
        }
        let rest = deadline.saturating_sub(started.elapsed()).max(Duration::from_secs(1));
        if self.supervisor.stop_and_wait(Some("shutdown".to_owned()), Some(rest)).await.is_err() {
            warn!("actors did not stop in time; killing them");
            self.supervisor.kill();
        }
        // Open streams read what the store has and end.
        self.shared.hub.close_all();
    }
}

/// Agents by name, after checking their tools exist.
fn check_agents(deps: &Deps) -> Result<HashMap<String, Arc<AgentConfig>>, RuntimeError> {
    let mut agents = HashMap::new();
    for agent in &deps.agents {
        for tool in &agent.tools {
            let builtin = BuiltinTool::from_name(tool).is_some_and(BuiltinTool::opt_in);
            if !builtin && deps.tools.get(tool).is_none() {
                return Err(RuntimeError::Config(format!("agent {} names unknown tool {tool}", agent.name)));
            }
        }
        if deps.models.get(agent.model.as_deref()).is_none() {
            return Err(RuntimeError::Config(format!("agent {} names an unknown model", agent.name)));
        }
        if agents.insert(agent.name.clone(), Arc::new(agent.clone())).is_some() {
            return Err(RuntimeError::Config(format!("agent {} is defined twice", agent.name)));
        }
    }
    Ok(agents)
}
