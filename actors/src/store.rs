//! The store port: where runs live. Actor state is a cache of what is committed here;
//! a session restarted after a crash rebuilds itself from [`RunStore::load`].
//!
//! Every [`Commit`] is atomic: its state changes and the events that describe them
//! land together or not at all, and its events must continue the run's sequence
//! without a gap. [`MemoryStore`] is the in-process implementation; the SQL
//! implementations live in the `troupe` package.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use dashmap::DashMap;
use serde::{Deserialize, Serialize};

use crate::llm::Message;
use crate::protocol::{
    Fragment, Limits, Plan, Review, RunEvent, RunId, RunStatus, ThreadId, ToolExecutionRecord, Usage,
};

/// A client's labels on a run or a thread: a JSON object, returned as given and
/// filterable in listings.
pub type Metadata = serde_json::Map<String, serde_json::Value>;

/// What makes a creating request safe to retry: the client's `Idempotency-Key`
/// and a fingerprint of what it asked (another request under the same key is
/// refused). Stored with what it created, in the same write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idempotency {
    /// The client's key.
    pub key: String,
    /// A digest of the request (route and body).
    pub fingerprint: String,
}

/// A run as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The id.
    pub run_id: RunId,
    /// The owning tenant; every query is scoped by it.
    pub tenant: String,
    /// The run that started this one, for sub-runs.
    pub parent_run_id: Option<RunId>,
    /// The agent.
    pub agent: String,
    /// The request.
    pub input: String,
    /// The limits in force.
    pub limits: Limits,
    /// Where it stands.
    pub status: RunStatus,
    /// Why it ended, for anything but success.
    pub reason: Option<String>,
    /// The last turn started.
    pub turn: u32,
    /// Tokens and cost so far.
    pub usage: Usage,
    /// The final answer.
    pub final_output: Option<String>,
    /// When it was accepted.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// The thread (conversation) it belongs to, if any.
    #[serde(default)]
    pub thread_id: Option<ThreadId>,
    /// The client's labels.
    #[serde(default)]
    pub metadata: Metadata,
    /// The idempotency key it was created under, if any.
    #[serde(skip)]
    pub idempotency: Option<Idempotency>,
    /// The W3C trace context it belongs to: its spans are children of this one
    /// (the request that created it, or its caller's tool call), if traced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

impl RunRecord {
    /// A run just accepted: `running`, turn 0, nothing spent, created `now`.
    pub fn accepted(
        run_id: RunId,
        tenant: String,
        agent: String,
        input: String,
        limits: Limits,
        now: DateTime<Utc>,
    ) -> Self {
        Self {
            run_id,
            tenant,
            parent_run_id: None,
            agent,
            input,
            limits,
            status: RunStatus::Running,
            reason: None,
            turn: 0,
            usage: Usage::default(),
            final_output: None,
            created_at: now,
            updated_at: now,
            thread_id: None,
            metadata: Metadata::new(),
            idempotency: None,
            traceparent: None,
        }
    }
}

/// A thread as stored: a conversation of one tenant with one agent, whose runs
/// follow each other (each sees the ones before it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadRecord {
    /// The id.
    pub thread_id: ThreadId,
    /// The owning tenant.
    pub tenant: String,
    /// The agent its runs go to unless a run names another.
    pub agent: String,
    /// The client's labels.
    pub metadata: Metadata,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When its metadata last changed.
    pub updated_at: DateTime<Utc>,
    /// The idempotency key it was created under, if any.
    #[serde(skip)]
    pub idempotency: Option<Idempotency>,
    /// What its earlier exchanges were condensed to by the model, if they were.
    #[serde(default)]
    pub summary: Option<ThreadSummary>,
}

/// A thread's earlier exchanges as the model condensed them: the runs up to
/// `through` (included) are read as `text` in the history of later runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadSummary {
    /// The summary.
    pub text: String,
    /// The last run it covers.
    pub through: RunId,
}

/// A thread listing.
#[derive(Debug, Clone, Default)]
pub struct ThreadQuery {
    /// Only this tenant's threads.
    pub tenant: Option<String>,
    /// At most this many, newest first.
    pub limit: usize,
    /// Only threads older than this one (the last of the previous page).
    pub after: Option<ThreadId>,
}

/// A conversation message with the turn it belongs to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredMessage {
    /// The turn (0 for the user's request).
    pub turn: u32,
    /// The message.
    pub message: Message,
}

/// One state change inside a [`Commit`].
#[derive(Debug, Clone, PartialEq)]
pub enum StoreWrite {
    /// The run's status changed.
    Status {
        /// New status.
        status: RunStatus,
        /// Why, for failures and cancels.
        reason: Option<String>,
    },
    /// Turn counter and usage totals.
    Progress {
        /// The last turn started.
        turn: u32,
        /// Usage so far.
        usage: Usage,
    },
    /// A message joins the conversation.
    Message(StoredMessage),
    /// A new plan version.
    Plan(Plan),
    /// A tool call's record, inserted or replaced (keyed by turn and call id).
    ToolExecution(ToolExecutionRecord),
    /// A turn's review.
    Review {
        /// The turn.
        turn: u32,
        /// The verdict.
        review: Review,
    },
    /// Documents first seen by the run (its citable sources), appended in order.
    Documents(Vec<Fragment>),
    /// The final answer.
    FinalOutput(String),
}

/// State changes and their events, committed atomically.
#[derive(Debug, Clone, PartialEq)]
pub struct Commit {
    /// The run.
    pub run_id: RunId,
    /// The changes.
    pub writes: Vec<StoreWrite>,
    /// The events, continuing the run's sequence.
    pub events: Vec<RunEvent>,
}

/// Everything needed to rebuild a run's actors.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSnapshot {
    /// The run.
    pub run: RunRecord,
    /// The conversation, in order.
    pub messages: Vec<StoredMessage>,
    /// The latest plan.
    pub plan: Plan,
    /// The latest record of every tool call, in call order.
    pub tool_executions: Vec<ToolExecutionRecord>,
    /// Reviews by turn, in order.
    pub reviews: Vec<(u32, Review)>,
    /// The run's seen documents, in first-seen order.
    pub documents: Vec<Fragment>,
    /// The seq of the run's last event.
    pub last_seq: u64,
}

impl RunSnapshot {
    /// A run just created with `last_seq` events: no messages, plan, calls,
    /// reviews or documents yet.
    pub fn created(run: RunRecord, last_seq: u64) -> Self {
        Self {
            run,
            messages: Vec::new(),
            plan: Plan::default(),
            tool_executions: Vec::new(),
            reviews: Vec::new(),
            documents: Vec::new(),
            last_seq,
        }
    }
}

/// A listing filter.
#[derive(Debug, Clone, Default)]
pub struct RunQuery {
    /// Only this tenant's runs.
    pub tenant: Option<String>,
    /// Only runs with this status.
    pub status: Option<RunStatus>,
    /// At most this many, newest first.
    pub limit: usize,
    /// Only runs older than this one (the last of the previous page).
    pub after: Option<RunId>,
    /// Only runs of this thread.
    pub thread_id: Option<ThreadId>,
    /// Only runs whose metadata has each of these keys with this string value.
    pub metadata: Vec<(String, String)>,
}

impl RunQuery {
    /// Whether `run` passes every filter but the page (`limit`).
    pub fn admits(&self, run: &RunRecord) -> bool {
        self.tenant.as_ref().is_none_or(|tenant| &run.tenant == tenant)
            && self.status.is_none_or(|status| run.status == status)
            && self.after.is_none_or(|after| run.run_id < after)
            && self.thread_id.is_none_or(|thread| run.thread_id == Some(thread))
            && self
                .metadata
                .iter()
                .all(|(key, value)| run.metadata.get(key).and_then(serde_json::Value::as_str) == Some(value.as_str()))
    }
}

/// Whether a metadata key may be used in a filter: 1 to 64 letters, digits, `_`
/// and `-` (the SQL stores build a JSON path from it).
pub fn filterable_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 64
        && key.bytes().all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-'))
}

/// Why a store call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StoreError {
    /// No such run.
    #[error("run {0} not found")]
    NotFound(RunId),
    /// The run exists already.
    #[error("run {0} already exists")]
    Exists(RunId),
    /// The commit's events do not continue the run's sequence.
    #[error("run {run_id}: expected event seq {expected}, got {got}")]
    SeqConflict {
        /// The run.
        run_id: RunId,
        /// The next seq the store expected.
        expected: u64,
        /// What the commit carried.
        got: u64,
    },
    /// The run has ended; nothing may change it.
    #[error("run {0} has ended")]
    Terminal(RunId),
    /// No such thread.
    #[error("thread {0} not found")]
    ThreadNotFound(ThreadId),
    /// This process no longer owns the run (several daemons share the store and
    /// another one took it over): nothing of the commit was written.
    #[error("run {0} is driven by another node now; this node may no longer write it")]
    Fenced(RunId),
    /// The backend failed.
    #[error("store backend error: {0}")]
    Backend(String),
}

/// Durable storage of runs, events, messages, tool executions, plans and reviews.
#[async_trait]
pub trait RunStore: Send + Sync + 'static {
    /// Stores a new run with its first events.
    async fn create_run(&self, run: RunRecord, events: Vec<RunEvent>) -> Result<(), StoreError>;

    /// Applies a commit atomically. Borrowed: the caller publishes the events after
    /// the commit, and a SQL store only needs to read them.
    async fn commit(&self, commit: &Commit) -> Result<(), StoreError>;

    /// The run's record.
    async fn get_run(&self, run_id: RunId) -> Result<Option<RunRecord>, StoreError>;

    /// The run's tenant and up to `limit` of its events after `after` (as
    /// [`events_after`](Self::events_after) gives them), or `None` if there is no
    /// such run: what a stream of a run reads first, whose run it is and where it
    /// starts (a store may read both at once).
    async fn tenant_and_events_after(
        &self,
        run_id: RunId,
        after: u64,
        limit: usize,
    ) -> Result<Option<(String, Vec<RunEvent>)>, StoreError> {
        let Some(run) = self.get_run(run_id).await? else { return Ok(None) };
        match self.events_after(run_id, after, limit).await {
            Ok(events) => Ok(Some((run.tenant, events))),
            Err(StoreError::NotFound(_)) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Everything needed to resume the run.
    async fn load(&self, run_id: RunId) -> Result<Option<RunSnapshot>, StoreError>;

    /// Up to `limit` events with seq greater than `after`, in order.
    async fn events_after(&self, run_id: RunId, after: u64, limit: usize) -> Result<Vec<RunEvent>, StoreError>;

    /// Runs matching `query`, newest first.
    async fn list_runs(&self, query: RunQuery) -> Result<Vec<RunRecord>, StoreError>;

    /// Ids of runs that have not ended, oldest first: what a restart resumes.
    async fn unfinished_runs(&self) -> Result<Vec<RunId>, StoreError>;

    /// What the runs of `tenant` created at or after `since` spent so far, in all
    /// (a sub-run's spend counts in its caller's, which pays for it): what a
    /// daily quota is checked against.
    async fn tenant_usage(&self, tenant: &str, since: DateTime<Utc>) -> Result<Usage, StoreError>;

    /// Deletes up to `limit` runs that ended before `before`, with everything they
    /// own; returns how many. Retention calls it in batches. A thread ages as a
    /// whole: its runs are deleted once all of them ended before `before`, and a
    /// thread left with no run (and unchanged since `before`) goes too.
    async fn delete_finished(&self, before: DateTime<Utc>, limit: usize) -> Result<usize, StoreError>;

    /// Gives the space of deleted rows back to the system where the backend can
    /// (SQLite: an incremental vacuum), and returns the store's size in bytes,
    /// if the backend knows it. Retention calls it after a sweep.
    async fn compact(&self) -> Result<Option<u64>, StoreError> {
        Ok(None)
    }

    /// Gives back an unfinished run this process stopped driving without ending
    /// it (its session gave up while the store was away), so that it is resumed:
    /// by any node of a cluster, or by this process's next start (a store no
    /// other process drives has nothing to do).
    async fn release(&self, _run_id: RunId) -> Result<(), StoreError> {
        Ok(())
    }

    /// Deletes one run that has ended, with everything it owns (events, messages,
    /// tool calls, plans, reviews, documents): `Ok(true)`; `Ok(false)` if it has
    /// not ended (nothing is deleted); `NotFound` if there is no such run.
    async fn delete_ended(&self, run_id: RunId) -> Result<bool, StoreError>;

    /// Where the store keeps threads and finds runs by idempotency key.
    fn threads(&self) -> &dyn ThreadStore;
}

/// Threads, and what a retried request is recognised by: the part of a store
/// beyond runs (a wrapper of a store hands out its inner store's).
#[async_trait]
pub trait ThreadStore: Send + Sync + 'static {
    /// The run `tenant` created under idempotency `key` at or after `since`, with
    /// its request's fingerprint.
    async fn run_by_idempotency_key(
        &self,
        tenant: &str,
        key: &str,
        since: DateTime<Utc>,
    ) -> Result<Option<(RunRecord, String)>, StoreError>;

    /// Stores a new thread.
    async fn create_thread(&self, thread: ThreadRecord) -> Result<(), StoreError>;

    /// The thread's record.
    async fn get_thread(&self, thread_id: ThreadId) -> Result<Option<ThreadRecord>, StoreError>;

    /// The thread `tenant` created under idempotency `key` at or after `since`,
    /// with its request's fingerprint.
    async fn thread_by_idempotency_key(
        &self,
        tenant: &str,
        key: &str,
        since: DateTime<Utc>,
    ) -> Result<Option<(ThreadRecord, String)>, StoreError>;

    /// Threads matching `query`, newest first.
    async fn list_threads(&self, query: ThreadQuery) -> Result<Vec<ThreadRecord>, StoreError>;

    /// Replaces the thread's metadata; the thread as updated, `None` if there is
    /// no such thread.
    async fn update_thread(
        &self,
        thread_id: ThreadId,
        metadata: Metadata,
        now: DateTime<Utc>,
    ) -> Result<Option<ThreadRecord>, StoreError>;

    /// Sets the thread's summary; `false` if there is no such thread.
    async fn set_thread_summary(&self, thread_id: ThreadId, summary: ThreadSummary) -> Result<bool, StoreError>;

    /// Deletes a thread and its runs (with everything they own): `Ok(true)`;
    /// `Ok(false)` if one of its runs has not ended (nothing is deleted);
    /// `ThreadNotFound` if there is no such thread.
    async fn delete_thread(&self, thread_id: ThreadId) -> Result<bool, StoreError>;
}

/// Checks that `events` continue after `last_seq` with no gap.
pub fn check_sequence(run_id: RunId, last_seq: u64, events: &[RunEvent]) -> Result<(), StoreError> {
    for (offset, event) in events.iter().enumerate() {
        let expected = last_seq + 1 + offset as u64;
        if event.seq != expected || event.run_id != run_id {
            return Err(StoreError::SeqConflict { run_id, expected, got: event.seq });
        }
    }
    Ok(())
}

/// Applies `write` to `snapshot`: the one definition of what each write means,
/// shared by every store that keeps snapshots in memory.
pub fn apply_write(snapshot: &mut RunSnapshot, write: StoreWrite, now: DateTime<Utc>) {
    let run = &mut snapshot.run;
    run.updated_at = now;
    match write {
        StoreWrite::Status { status, reason } => {
            run.status = status;
            run.reason = reason;
        }
        StoreWrite::Progress { turn, usage } => {
            run.turn = turn;
            run.usage = usage;
        }
        StoreWrite::Message(message) => snapshot.messages.push(message),
        StoreWrite::Plan(plan) => snapshot.plan = plan,
        StoreWrite::ToolExecution(record) => {
            let existing = snapshot
                .tool_executions
                .iter_mut()
                .find(|old| old.turn == record.turn && old.call_id == record.call_id);
            match existing {
                Some(old) => *old = record,
                None => snapshot.tool_executions.push(record),
            }
        }
        StoreWrite::Review { turn, review } => snapshot.reviews.push((turn, review)),
        StoreWrite::Documents(fragments) => snapshot.documents.extend(fragments),
        StoreWrite::FinalOutput(text) => run.final_output = Some(text),
    }
}

struct MemoryRun {
    snapshot: RunSnapshot,
    events: Vec<RunEvent>,
}

/// An in-process store. Nothing survives the process; use it for tests, benches
/// and embedded runtimes that need no durability. Runs live in a sharded map, so
/// sessions committing to different runs rarely wait for each other.
pub struct MemoryStore {
    runs: DashMap<RunId, MemoryRun>,
    threads: DashMap<ThreadId, ThreadRecord>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self { runs: DashMap::with_shard_amount(64), threads: DashMap::new() }
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl RunStore for MemoryStore {
    async fn create_run(&self, run: RunRecord, events: Vec<RunEvent>) -> Result<(), StoreError> {
        let run_id = run.run_id;
        check_sequence(run_id, 0, &events)?;
        let snapshot = RunSnapshot::created(run, events.len() as u64);
        match self.runs.entry(run_id) {
            dashmap::Entry::Occupied(_) => Err(StoreError::Exists(run_id)),
            dashmap::Entry::Vacant(slot) => {
                slot.insert(MemoryRun { snapshot, events });
                Ok(())
            }
        }
    }

    async fn commit(&self, commit: &Commit) -> Result<(), StoreError> {
        let run_id = commit.run_id;
        let mut entry = self.runs.get_mut(&run_id).ok_or(StoreError::NotFound(run_id))?;
        let MemoryRun { snapshot, events } = &mut *entry;
        if snapshot.run.status.is_terminal() {
            return Err(StoreError::Terminal(run_id));
        }
        // Validation comes before any change, so a rejected commit changes nothing.
        check_sequence(run_id, snapshot.last_seq, &commit.events)?;
        let now = Utc::now();
        for write in &commit.writes {
            apply_write(snapshot, write.clone(), now);
        }
        snapshot.last_seq += commit.events.len() as u64;
        events.extend(commit.events.iter().cloned());
        Ok(())
    }

    async fn get_run(&self, run_id: RunId) -> Result<Option<RunRecord>, StoreError> {
        Ok(self.runs.get(&run_id).map(|entry| entry.snapshot.run.clone()))
    }

    async fn load(&self, run_id: RunId) -> Result<Option<RunSnapshot>, StoreError> {
        Ok(self.runs.get(&run_id).map(|entry| entry.snapshot.clone()))
    }

    async fn events_after(&self, run_id: RunId, after: u64, limit: usize) -> Result<Vec<RunEvent>, StoreError> {
        let entry = self.runs.get(&run_id).ok_or(StoreError::NotFound(run_id))?;
        // Seqs start at 1 and are dense, so seq n sits at index n - 1.
        let start = (after as usize).min(entry.events.len());
        Ok(entry.events[start..].iter().take(limit).cloned().collect())
    }

    async fn list_runs(&self, query: RunQuery) -> Result<Vec<RunRecord>, StoreError> {
        let mut records: Vec<RunRecord> = self
            .runs
            .iter()
            .filter(|entry| query.admits(&entry.snapshot.run))
            .map(|entry| entry.snapshot.run.clone())
            .collect();
        records.sort_by_key(|run| std::cmp::Reverse(run.run_id));
        records.truncate(query.limit);
        Ok(records)
    }

    async fn tenant_usage(&self, tenant: &str, since: DateTime<Utc>) -> Result<Usage, StoreError> {
        let mut total = Usage::default();
        for entry in self.runs.iter() {
            let run = &entry.snapshot.run;
            if run.tenant == tenant && run.parent_run_id.is_none() && run.created_at >= since {
                total.add(&run.usage);
            }
        }
        Ok(total)
    }

    async fn unfinished_runs(&self) -> Result<Vec<RunId>, StoreError> {
        let mut ids: Vec<RunId> = self
            .runs
            .iter()
            .filter(|entry| !entry.snapshot.run.status.is_terminal())
            .map(|entry| *entry.key())
            .collect();
        ids.sort();
        Ok(ids)
    }

    async fn delete_finished(&self, before: DateTime<Utc>, limit: usize) -> Result<usize, StoreError> {
        // An ended run takes no more writes, so its last update is when it ended.
        let aged = |run: &RunRecord| run.status.is_terminal() && run.updated_at < before;
        // A thread ages as a whole: its runs go once all of them have aged.
        let young_threads: std::collections::HashSet<ThreadId> = self
            .runs
            .iter()
            .filter(|entry| !aged(&entry.snapshot.run))
            .filter_map(|entry| entry.snapshot.run.thread_id)
            .collect();
        let doomed: Vec<RunId> = self
            .runs
            .iter()
            .filter(|entry| aged(&entry.snapshot.run))
            .filter(|entry| entry.snapshot.run.thread_id.is_none_or(|thread| !young_threads.contains(&thread)))
            .map(|entry| *entry.key())
            .take(limit)
            .collect();
        for run_id in &doomed {
            self.runs.remove(run_id);
        }
        let with_runs: std::collections::HashSet<ThreadId> =
            self.runs.iter().filter_map(|entry| entry.snapshot.run.thread_id).collect();
        self.threads.retain(|thread_id, thread| thread.updated_at >= before || with_runs.contains(thread_id));
        Ok(doomed.len())
    }

    async fn delete_ended(&self, run_id: RunId) -> Result<bool, StoreError> {
        match self.runs.remove_if(&run_id, |_, run| run.snapshot.run.status.is_terminal()) {
            Some(_) => Ok(true),
            None if self.runs.contains_key(&run_id) => Ok(false),
            None => Err(StoreError::NotFound(run_id)),
        }
    }

    fn threads(&self) -> &dyn ThreadStore {
        self
    }
}

#[async_trait]
impl ThreadStore for MemoryStore {
    async fn run_by_idempotency_key(
        &self,
        tenant: &str,
        key: &str,
        since: DateTime<Utc>,
    ) -> Result<Option<(RunRecord, String)>, StoreError> {
        let found = self
            .runs
            .iter()
            .filter(|entry| entry.snapshot.run.tenant == tenant && entry.snapshot.run.created_at >= since)
            .filter_map(|entry| {
                let run = &entry.snapshot.run;
                let idempotency = run.idempotency.as_ref().filter(|idempotency| idempotency.key == key)?;
                Some((run.clone(), idempotency.fingerprint.clone()))
            })
            .max_by_key(|(run, _)| run.run_id);
        Ok(found)
    }

    async fn create_thread(&self, thread: ThreadRecord) -> Result<(), StoreError> {
        match self.threads.entry(thread.thread_id) {
            dashmap::Entry::Occupied(_) => {
                Err(StoreError::Backend(format!("thread {} already exists", thread.thread_id)))
            }
            dashmap::Entry::Vacant(slot) => {
                slot.insert(thread);
                Ok(())
            }
        }
    }

    async fn get_thread(&self, thread_id: ThreadId) -> Result<Option<ThreadRecord>, StoreError> {
        Ok(self.threads.get(&thread_id).map(|entry| entry.clone()))
    }

    async fn thread_by_idempotency_key(
        &self,
        tenant: &str,
        key: &str,
        since: DateTime<Utc>,
    ) -> Result<Option<(ThreadRecord, String)>, StoreError> {
        let found = self
            .threads
            .iter()
            .filter(|thread| thread.tenant == tenant && thread.created_at >= since)
            .filter_map(|thread| {
                let idempotency = thread.idempotency.as_ref().filter(|idempotency| idempotency.key == key)?;
                Some((thread.clone(), idempotency.fingerprint.clone()))
            })
            .max_by_key(|(thread, _)| thread.thread_id);
        Ok(found)
    }

    async fn list_threads(&self, query: ThreadQuery) -> Result<Vec<ThreadRecord>, StoreError> {
        let mut threads: Vec<ThreadRecord> = self
            .threads
            .iter()
            .filter(|thread| query.tenant.as_ref().is_none_or(|tenant| &thread.tenant == tenant))
            .filter(|thread| query.after.is_none_or(|after| thread.thread_id < after))
            .map(|thread| thread.clone())
            .collect();
        threads.sort_by_key(|thread| std::cmp::Reverse(thread.thread_id));
        threads.truncate(query.limit);
        Ok(threads)
    }

    async fn update_thread(
        &self,
        thread_id: ThreadId,
        metadata: Metadata,
        now: DateTime<Utc>,
    ) -> Result<Option<ThreadRecord>, StoreError> {
        Ok(self.threads.get_mut(&thread_id).map(|mut thread| {
            thread.metadata = metadata;
            thread.updated_at = now;
            thread.clone()
        }))
    }

    async fn set_thread_summary(&self, thread_id: ThreadId, summary: ThreadSummary) -> Result<bool, StoreError> {
        Ok(self.threads.get_mut(&thread_id).map(|mut thread| thread.summary = Some(summary)).is_some())
    }

    async fn delete_thread(&self, thread_id: ThreadId) -> Result<bool, StoreError> {
        if !self.threads.contains_key(&thread_id) {
            return Err(StoreError::ThreadNotFound(thread_id));
        }
        let runs: Vec<(RunId, bool)> = self
            .runs
            .iter()
            .filter(|entry| entry.snapshot.run.thread_id == Some(thread_id))
            .map(|entry| (*entry.key(), entry.snapshot.run.status.is_terminal()))
            .collect();
        if runs.iter().any(|(_, ended)| !ended) {
            return Ok(false);
        }
        for (run_id, _) in runs {
            self.runs.remove(&run_id);
        }
        self.threads.remove(&thread_id);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::EventKind;

    fn record(run_id: RunId) -> RunRecord {
        RunRecord::accepted(run_id, "t".into(), "a".into(), "i".into(), Limits::default(), Utc::now())
    }

    fn event(run_id: RunId, seq: u64, kind: EventKind) -> RunEvent {
        RunEvent { run_id, seq, ts: Utc::now(), parent_run_id: None, kind }
    }

    #[tokio::test]
    async fn a_commit_with_a_seq_gap_is_refused_and_changes_nothing() {
        let store = MemoryStore::new();
        let run_id = RunId::new();
        store.create_run(record(run_id), vec![event(run_id, 1, EventKind::TurnStart { turn: 1 })]).await.unwrap();
        let gap = Commit {
            run_id,
            writes: vec![StoreWrite::FinalOutput("x".into())],
            events: vec![event(run_id, 3, EventKind::TurnEnd { turn: 1 })],
        };
        assert_eq!(store.commit(&gap).await, Err(StoreError::SeqConflict { run_id, expected: 2, got: 3 }));
        let snapshot = store.load(run_id).await.unwrap().unwrap();
        assert_eq!((snapshot.last_seq, snapshot.run.final_output), (1, None));
    }

    #[tokio::test]
    async fn an_ended_run_takes_no_more_commits() {
        let store = MemoryStore::new();
        let run_id = RunId::new();
        store.create_run(record(run_id), vec![]).await.unwrap();
        let end = |seq, status| Commit {
            run_id,
            writes: vec![StoreWrite::Status { status, reason: None }],
            events: vec![event(run_id, seq, EventKind::RunEnd { status, reason: None })],
        };
        store.commit(&end(1, RunStatus::Cancelled)).await.unwrap();
        assert_eq!(store.commit(&end(2, RunStatus::Succeeded)).await, Err(StoreError::Terminal(run_id)));
        assert_eq!(store.events_after(run_id, 0, 10).await.unwrap().len(), 1);
        assert!(store.unfinished_runs().await.unwrap().is_empty());
    }
}
