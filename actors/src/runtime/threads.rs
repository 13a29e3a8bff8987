//! One active run per thread. Each live thread has a [`Line`]: the run that is
//! active (started, or waiting for a slot in the run queue) and the runs waiting
//! behind it, in order. The line's lock is held while a message is taken (its
//! run created) and while the line moves on, so two messages arriving together
//! are ordered and never both start.
//!
//! The store is the durable queue: a run waiting on its thread is stored
//! `queued` and is in no run queue; a restart rebuilds every line from the
//! unfinished runs, oldest first (the first of a thread is active, the rest
//! wait). A watcher follows the active run's events to its end, then the line
//! moves on: the next run that has not ended joins the run queue and becomes
//! active.
//!
//! Before a run of a thread starts, a history that takes more than half of its
//! model's context window is summarised by that model (all but the last
//! exchanges, with the summary before them), and the summary stored on the
//! thread: later runs read it in place of the runs it covers.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use tracing::warn;

use crate::admission::{Admission, RunQueue};
use crate::events;
use crate::llm::{ChatRequest, Message, ModelChunk, Role, ToolChoice};
use crate::metrics;
use crate::protocol::{EventKind, RunEvent, RunId, ThreadId};
use crate::shared::RuntimeShared;
use crate::store::{RunQuery, RunRecord, StoreError, ThreadSummary};

/// Where a thread's event stream sends: an event, or the store's failure (the
/// last item).
pub(crate) type ThreadEvents = tokio::sync::mpsc::Sender<Result<Arc<RunEvent>, StoreError>>;

/// Exchanges at the end of a thread's history that a summary leaves verbatim.
const KEEP_VERBATIM: usize = 2;

/// What the model is told when it summarises a thread.
pub(crate) const SUMMARISE: &str = "You condense conversations. Summarise the conversation below between a user and an \
    assistant in at most 120 words: keep names, numbers, dates, amounts, decisions and what is still open. Write \
    plain sentences, no preamble.";

/// A thread whose history is to be summarised, with what summarising it needs.
struct Long {
    model: Arc<dyn crate::llm::ModelClient>,
    window: usize,
    thread: crate::store::ThreadRecord,
    ended: Vec<RunRecord>,
}

/// How often an idle thread stream checks that its thread still exists.
const IDLE_CHECK: Duration = Duration::from_secs(15);

/// Runs that may wait behind a thread's active run.
pub const MAX_WAITING_PER_THREAD: usize = 64;

/// A thread's runs that have not ended: the active one, then those waiting.
#[derive(Debug, Default)]
pub(crate) struct Line {
    pub active: Option<RunId>,
    pub waiting: VecDeque<RunId>,
}

/// What moving a line on needs: the store, and the run queue a run joins when its
/// turn comes.
pub(crate) struct Lines {
    pub shared: Arc<RuntimeShared>,
    pub admission: Arc<Admission>,
    pub queue: Arc<RunQueue>,
    lines: Mutex<HashMap<ThreadId, Arc<tokio::sync::Mutex<Line>>>>,
    /// Told of every run created in a thread, for the thread's event streams.
    created: tokio::sync::broadcast::Sender<ThreadId>,
}

impl Lines {
    pub fn new(shared: Arc<RuntimeShared>, admission: Arc<Admission>, queue: Arc<RunQueue>) -> Self {
        let (created, _) = tokio::sync::broadcast::channel(256);
        Self { shared, admission, queue, lines: Mutex::default(), created }
    }

    /// Tells the thread's event streams that it has a new run.
    pub fn announce(&self, thread_id: ThreadId) {
        let _ = self.created.send(thread_id);
    }

    /// The thread's runs, oldest first.
    pub async fn runs(&self, thread_id: ThreadId) -> Result<Vec<RunRecord>, StoreError> {
        let query = RunQuery { thread_id: Some(thread_id), limit: usize::MAX, ..RunQuery::default() };
        let mut runs = self.shared.store.list_runs(query).await?;
        runs.reverse();
        Ok(runs)
    }

    /// Sends the events of the thread's runs after `cursor` (a run and the seq
    /// of the last event the client has), run after run, then waits for new
    /// runs; until the thread is deleted, the runtime stops or the receiver
    /// goes away.
    pub async fn follow_thread(&self, thread_id: ThreadId, mut cursor: Option<(RunId, u64)>, sender: ThreadEvents) {
        // Subscribed before the first listing: a run created after it is announced here.
        let mut created = self.created.subscribe();
        loop {
            let runs = match self.runs(thread_id).await {
                Ok(runs) => runs,
                Err(error) => {
                    let _ = sender.send(Err(error)).await;
                    return;
                }
            };
            let mut cut = false;
            for run in runs {
                let after = match cursor {
                    Some((last, seq)) if last == run.run_id => seq,
                    Some((last, _)) if run.run_id < last => continue,
                    _ => 0,
                };
                let mut ended = false;
                let mut events =
                    events::subscribe(self.shared.hub.clone(), self.shared.store.clone(), run.run_id, after);
                loop {
                    // A client that goes away while the run is quiet (parked for
                    // hours) ends this at once, not at the run's next event.
                    let event = tokio::select! {
                        () = sender.closed() => return,
                        event = events.next() => event,
                    };
                    let Some(event) = event else { break };
                    let event = match event {
                        Ok(event) => event,
                        Err(error) => {
                            let _ = sender.send(Err(error)).await;
                            return;
                        }
                    };
                    cursor = Some((event.run_id, event.seq));
                    ended = matches!(event.kind, EventKind::RunEnd { .. });
                    if sender.send(Ok(event)).await.is_err() {
                        return;
                    }
                }
                let already_ended = after > 0 && run.status.is_terminal();
                if !ended && !already_ended {
                    // The subscription stopped before the run's end (the runtime
                    // stops, or the run's session did): list again.
                    cut = true;
                    break;
                }
            }
            if self.shared.handles.shutting_down() {
                return;
            }
            if cut {
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            // Every run is sent to its end: wait for the next one, checking that
            // the thread still exists every `IDLE_CHECK` (announcements of other
            // threads do not put the check off).
            let mut check = tokio::time::interval(IDLE_CHECK);
            check.tick().await;
            loop {
                tokio::select! {
                    () = sender.closed() => return,
                    announced = created.recv() => match announced {
                        Ok(announced) if announced != thread_id => continue,
                        // Ours, or announcements were missed: list again.
                        _ => break,
                    },
                    _ = check.tick() => {
                        let exists = self.shared.store.threads().get_thread(thread_id).await;
                        if self.shared.handles.shutting_down() || matches!(exists, Ok(None)) {
                            return;
                        }
                    }
                }
            }
        }
    }

    /// The thread's line (created empty if it has none).
    pub fn line(&self, thread_id: ThreadId) -> Arc<tokio::sync::Mutex<Line>> {
        let mut lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        lines.entry(thread_id).or_default().clone()
    }

    /// Forgets the thread's line if it is empty and no one else holds it.
    fn forget_if_idle(&self, thread_id: ThreadId) {
        let mut lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        let idle = lines.get(&thread_id).is_some_and(|line| {
            // Only the map holds it, so no one can be about to lock it.
            Arc::strong_count(line) == 1
                && line.try_lock().is_ok_and(|line| line.active.is_none() && line.waiting.is_empty())
        });
        if idle {
            lines.remove(&thread_id);
        }
    }

    /// If the history a run of `agent` would start from takes more than half of
    /// its model's context window, has the model summarise all but its last
    /// exchanges (with the summary before them) and stores the summary. On any
    /// failure the history stays as it is (compaction still fits the prompt).
    pub async fn summarise_if_long(&self, thread_id: ThreadId, agent: &str) {
        let Some(Long { model, window, thread, ended }) = self.long_history(thread_id, agent).await else { return };
        let uncovered: Vec<RunRecord> = ended
            .into_iter()
            .filter(|run| thread.summary.as_ref().is_none_or(|summary| run.run_id > summary.through))
            .filter(|run| !crate::threads::rolled_back(run))
            .collect();
        let Some(fold) = uncovered.len().checked_sub(KEEP_VERBATIM).filter(|fold| *fold > 0) else { return };
        let mut lines: Vec<String> = crate::threads::messages(&uncovered[..fold])
            .into_iter()
            .map(|message| {
                let who = if message.role == Role::User { "User" } else { "Assistant" };
                format!("{who}: {}", message.content)
            })
            .collect();
        // The request itself must fit the window: the oldest lines go first.
        let room = window * 3 / 4;
        while lines.len() > 1 && crate::session::compact::total(&[Message::text(Role::User, lines.join("\n"))]) > room {
            lines.remove(0);
        }
        let mut transcript = String::new();
        if let Some(summary) = &thread.summary {
            transcript.push_str(&format!("(Earlier: {})\n", summary.text));
        }
        transcript.push_str(&lines.join("\n"));
        let request = ChatRequest {
            messages: vec![Message::text(Role::System, SUMMARISE), Message::text(Role::User, transcript)],
            tools: Vec::new(),
            tool_choice: ToolChoice::None,
            max_tokens: Some(256),
            temperature: Some(0.0),
        };
        let call = async {
            let mut stream = model.chat(request).await.ok()?;
            while let Some(chunk) = stream.next().await {
                if let Ok(ModelChunk::Done(reply)) = chunk {
                    return Some(reply.content);
                }
                chunk.ok()?;
            }
            None
        };
        let text = tokio::time::timeout(self.shared.config.model_timeout, call).await.ok().flatten();
        let Some(text) = text.map(|text| text.trim().to_owned()).filter(|text| !text.is_empty()) else {
            warn!(thread_id = %thread_id, "the model gave no summary of a long thread; its history is compacted instead");
            return;
        };
        let summary = ThreadSummary { text, through: uncovered[fold - 1].run_id };
        if let Err(error) = self.shared.store.threads().set_thread_summary(thread_id, summary).await {
            warn!(thread_id = %thread_id, %error, "cannot store a thread's summary");
        }
    }

    /// What summarising the thread's history needs, if a run of `agent` would
    /// start from a history over half of its model's context window.
    async fn long_history(&self, thread_id: ThreadId, agent: &str) -> Option<Long> {
        let agent = self.shared.agents.get(agent)?;
        let model = self.shared.models.get(agent.model.as_deref())?;
        let window = model.context_window()?;
        let thread = self.shared.store.threads().get_thread(thread_id).await.ok()??;
        let runs = self.runs(thread_id).await.ok()?;
        let ended: Vec<RunRecord> = runs.into_iter().filter(|run| run.status.is_terminal()).collect();
        let history = crate::threads::history(&ended, thread.summary.as_ref());
        (crate::session::compact::total(&history) > window / 2).then_some(Long { model, window, thread, ended })
    }

    /// Whether a run of `agent` would start from a history to summarise first.
    pub async fn is_long(&self, thread_id: ThreadId, agent: &str) -> bool {
        self.long_history(thread_id, agent).await.is_some()
    }

    /// Moves the line on in a task of its own (a summary to make first takes a
    /// model call, which no request waits for).
    pub fn start_next_soon(self: &Arc<Self>, thread_id: ThreadId) {
        let lines = self.clone();
        tokio::spawn(async move {
            let line = lines.line(thread_id);
            let mut guard = line.lock().await;
            lines.start_next(&mut guard, thread_id).await;
            drop(guard);
            drop(line);
            lines.forget_if_idle(thread_id);
        });
    }

    /// Makes `run_id` the thread's active run: it joins the run queue if `queue`
    /// (a run created to start now is started by its submission instead), and a
    /// watcher moves the line on when it ends.
    pub fn activate(self: &Arc<Self>, line: &mut Line, thread_id: ThreadId, run_id: RunId, tenant: Option<&str>) {
        line.active = Some(run_id);
        if let Some(tenant) = tenant {
            let _ = self.queue.push(run_id, tenant, true);
            metrics::runs_queued(self.queue.len());
            self.admission.freed().notify_one();
        }
        let lines = self.clone();
        tokio::spawn(async move {
            if lines.wait_for_end(run_id).await {
                lines.advance(thread_id, run_id).await;
            }
        });
    }

    /// Waits until the run has ended (or is gone): true; false if the runtime
    /// shuts down first (the line is rebuilt on the next start).
    async fn wait_for_end(&self, run_id: RunId) -> bool {
        loop {
            let mut events = events::subscribe(self.shared.hub.clone(), self.shared.store.clone(), run_id, 0);
            while let Some(event) = events.next().await {
                if event.is_err() {
                    break;
                }
            }
            match self.shared.store.get_run(run_id).await {
                Ok(Some(run)) if !run.status.is_terminal() => {}
                Ok(_) => return true,
                Err(error) => warn!(run_id = %run_id, %error, "cannot read a thread's active run"),
            }
            if self.shared.handles.shutting_down() {
                return false;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// The thread's active run `ended` has ended: the next run waiting becomes
    /// active.
    async fn advance(self: &Arc<Self>, thread_id: ThreadId, ended: RunId) {
        let line = self.line(thread_id);
        let mut guard = line.lock().await;
        if guard.active == Some(ended) {
            guard.active = None;
            self.start_next(&mut guard, thread_id).await;
        }
        drop(guard);
        drop(line);
        self.forget_if_idle(thread_id);
    }

    /// If the line has no active run (or its active run has ended), makes the
    /// first waiting run that has not ended active.
    pub async fn start_next(self: &Arc<Self>, line: &mut Line, thread_id: ThreadId) {
        if let Some(active) = line.active {
            match self.shared.store.get_run(active).await {
                Ok(Some(run)) if !run.status.is_terminal() => return,
                Err(_) => return,
                // Its watcher finds the line moved on and leaves it.
                Ok(_) => line.active = None,
            }
        }
        while let Some(next) = line.waiting.pop_front() {
            match self.shared.store.get_run(next).await {
                Ok(Some(run)) if !run.status.is_terminal() => {
                    self.summarise_if_long(thread_id, &run.agent).await;
                    self.activate(line, thread_id, next, Some(&run.tenant));
                    return;
                }
                // Cancelled (or deleted) while it waited.
                Ok(_) => {}
                Err(error) => {
                    // It waits at the front; the next message or end moves the line.
                    warn!(run_id = %next, %error, "cannot read a thread's next run");
                    line.waiting.push_front(next);
                    return;
                }
            }
        }
    }
}
