//! Live event fan-out. Each run with a subscriber has a `broadcast` channel; a
//! session publishes a commit's events after the store has them, never before. A
//! subscription replays from the store and then follows the channel, deduplicating
//! by seq at the seam; a subscriber that lags the channel is served from the store,
//! so a slow client never slows a run and never misses an event. The first events
//! of a run started here are also kept in memory for a while (see
//! [`EventHub::begin`]): a client that submits a run and then follows it is served
//! without reading the store.

use std::collections::VecDeque;
use std::sync::Arc;

use dashmap::DashMap;
use futures::stream::{self, BoxStream};
use tokio::sync::broadcast::{self, error::RecvError};

use crate::protocol::{EventKind, RunEvent, RunId};
use crate::store::{RunStore, StoreError};

/// Events read from the store per round trip while replaying.
const REPLAY_BATCH: usize = 256;

/// How many of a run's first events the hub keeps (see [`EventHub::begin`]): a
/// run of a few turns (tool calls, a streamed answer) that a client follows right
/// after submitting it. A client's request to follow comes a few commits into
/// such a run; with fewer kept, most streams began with a read of the store.
const FIRST_EVENTS: usize = 64;

/// How many events the hub keeps at most, all runs together: runs in flight by
/// the thousand keep only what this allows (the others' streams start from the
/// store), so the memory stays bounded.
const KEPT_EVENTS: usize = 16 * 1024;

/// The per-run live channels. They carry `Arc`s: a slot costs a pointer, not an
/// event, and every subscriber shares one copy of each event.
pub struct EventHub {
    channels: DashMap<RunId, broadcast::Sender<Arc<RunEvent>>>,
    capacity: usize,
    /// Set by `close_all`: nothing will be published any more.
    closed: std::sync::atomic::AtomicBool,
    /// Set when other processes drive runs of the same store (a cluster): a
    /// subscriber whose channel closes before its run ended keeps following it
    /// (another node may drive it now), woken by [`EventHub::nudge`].
    remote: std::sync::atomic::AtomicBool,
    /// The first events of live runs started here, while they are few.
    first: DashMap<RunId, FirstEvents>,
    /// The events `first` holds, all runs together (at most [`KEPT_EVENTS`]).
    kept: Budget,
}

/// A run's events from seq 1 on, every one published so far, and whose run it is.
struct FirstEvents {
    tenant: String,
    events: Vec<Arc<RunEvent>>,
    /// Whether the run is stored ([`EventHub::stored`]): only then are they served.
    stored: bool,
}

impl FirstEvents {
    /// Takes `event` if it is the next one; `false` if it cannot be kept (too
    /// many, or one is missing): the run's streams then start from the store.
    fn keep(&mut self, event: &Arc<RunEvent>, budget: &Budget) -> bool {
        let last = self.events.last().map_or(0, |kept| kept.seq);
        if event.seq <= last {
            // Published again (a restarted session publishes what it read back).
            return true;
        }
        if event.seq != last + 1 || self.events.len() == FIRST_EVENTS || !budget.take(1) {
            return false;
        }
        self.events.push(event.clone());
        true
    }
}

/// The count of events the hub keeps, all runs together.
#[derive(Default)]
struct Budget(std::sync::atomic::AtomicUsize);

impl Budget {
    /// Counts `events` more kept, unless that would pass [`KEPT_EVENTS`].
    fn take(&self, events: usize) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        self.0.fetch_update(Relaxed, Relaxed, |kept| Some(kept + events).filter(|total| *total <= KEPT_EVENTS)).is_ok()
    }

    /// Counts `events` fewer kept.
    fn give_back(&self, events: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        let _ = self.0.fetch_update(Relaxed, Relaxed, |kept| Some(kept.saturating_sub(events)));
    }
}

/// What the hub keeps of a run for a stream that starts now.
enum Kept {
    /// Nothing: the stream starts from the store.
    Nothing,
    /// The run is another tenant's.
    NotOwned,
    /// The kept events after the stream's start (at least one).
    Events(VecDeque<Arc<RunEvent>>),
}

/// The seq of a nudge: not an event, a sign that the store has new ones.
const NUDGE: u64 = u64::MAX;

impl EventHub {
    /// A hub whose channels buffer `capacity` events per run.
    pub fn new(capacity: usize) -> Self {
        Self {
            channels: DashMap::new(),
            capacity: capacity.max(1),
            closed: Default::default(),
            remote: Default::default(),
            first: DashMap::new(),
            kept: Budget::default(),
        }
    }

    /// Keeps the events run `run_id` of `tenant` is created with (from seq 1), and
    /// those published after them up to [`FIRST_EVENTS`], until the run ends. Call
    /// it before the run is stored, then [`stored`](Self::stored) once it is (or
    /// [`forget`](Self::forget) if it could not be): a run ended in between (a
    /// cancel) is closed, and nothing of it is kept. Not done where other
    /// processes drive runs of the store too.
    pub fn begin(&self, run_id: RunId, tenant: &str, events: &[RunEvent]) {
        if self.follows_remote()
            || self.closed.load(std::sync::atomic::Ordering::SeqCst)
            || events.len() > FIRST_EVENTS
            || !events.iter().enumerate().all(|(index, event)| event.seq == index as u64 + 1)
            || !self.kept.take(events.len())
        {
            return;
        }
        let events = events.iter().cloned().map(Arc::new).collect();
        let replaced = self.first.insert(run_id, FirstEvents { tenant: tenant.to_owned(), events, stored: false });
        self.kept.give_back(replaced.map_or(0, |first| first.events.len()));
    }

    /// The run [`begin`](Self::begin) was called for is stored: its kept events
    /// may be served.
    pub fn stored(&self, run_id: RunId) {
        if let Some(mut first) = self.first.get_mut(&run_id) {
            first.stored = true;
        }
    }

    /// Keeps nothing more of the run: its streams start from the store. A session
    /// that loads its run from the store calls it (the session before it may have
    /// committed events it never published); the hub itself calls it when the
    /// run ends or its events stop being kept. Its events no longer count.
    pub fn forget(&self, run_id: RunId) {
        if let Some((_, first)) = self.first.remove(&run_id) {
            self.kept.give_back(first.events.len());
        }
    }

    /// Keeps nothing more of any run.
    fn drop_all_kept(&self) {
        self.first.retain(|_, first| {
            self.kept.give_back(first.events.len());
            false
        });
    }

    /// Whether anyone listens to `run_id` (publishing is free otherwise).
    pub fn has_subscribers(&self, run_id: RunId) -> bool {
        self.channels.get(&run_id).is_some_and(|sender| sender.receiver_count() > 0)
    }

    /// Sends committed events to the run's live subscribers.
    pub fn publish(&self, run_id: RunId, events: Vec<RunEvent>) {
        if !self.first.contains_key(&run_id) {
            self.send(run_id, events.into_iter().map(Arc::new));
            return;
        }
        let events: Vec<Arc<RunEvent>> = events.into_iter().map(Arc::new).collect();
        // Kept before the receivers are counted: a stream subscribes, then looks
        // at what is kept, so it either finds these kept or is counted and sent them.
        let kept = self
            .first
            .get_mut(&run_id)
            .is_none_or(|mut first| events.iter().all(|event| first.keep(event, &self.kept)));
        if !kept {
            self.forget(run_id);
        }
        self.send(run_id, events.into_iter());
    }

    fn send(&self, run_id: RunId, events: impl Iterator<Item = Arc<RunEvent>>) {
        if let Some(sender) = self.channels.get(&run_id).filter(|sender| sender.receiver_count() > 0) {
            for event in events {
                // No receiver is not an error: subscribers come and go.
                let _ = sender.send(event);
            }
        }
    }

    /// What is kept of the run after seq `after`, for a stream of `tenant` (any
    /// tenant's with `None`). Only events: a stream that has them all (or a run
    /// whose events are not kept) starts from the store, which also tells
    /// whether the run has ended.
    fn kept_after(&self, run_id: RunId, after: u64, tenant: Option<&str>) -> Kept {
        let Some(first) = self.first.get(&run_id).filter(|first| first.stored) else { return Kept::Nothing };
        if tenant.is_some_and(|tenant| tenant != first.tenant) {
            return Kept::NotOwned;
        }
        let events: VecDeque<Arc<RunEvent>> = first.events.iter().filter(|event| event.seq > after).cloned().collect();
        if events.is_empty() { Kept::Nothing } else { Kept::Events(events) }
    }

    /// Runs of this store may be driven by other processes (see `remote`).
    pub fn follow_remote_runs(&self) {
        self.remote.store(true, std::sync::atomic::Ordering::SeqCst);
        self.drop_all_kept();
    }

    /// Tells the run's subscribers that the store holds events they have not
    /// seen (committed by another process): each reads them from the store.
    pub fn nudge(&self, run_id: RunId) {
        if let Some(sender) = self.channels.get(&run_id).filter(|sender| sender.receiver_count() > 0) {
            let kind = EventKind::Error { code: String::new(), message: String::new() };
            let _ = sender.send(Arc::new(RunEvent {
                run_id,
                seq: NUDGE,
                ts: chrono::Utc::now(),
                parent_run_id: None,
                kind,
            }));
        }
    }

    /// [`EventHub::nudge`]s every run with a subscriber (notifications may have
    /// been missed).
    pub fn nudge_all(&self) {
        let runs: Vec<RunId> = self.channels.iter().map(|entry| *entry.key()).collect();
        for run_id in runs {
            self.nudge(run_id);
        }
    }

    /// Ends the run's channel: subscribers drain what is buffered, then finish.
    pub fn close(&self, run_id: RunId) {
        self.forget(run_id);
        self.channels.remove(&run_id);
    }

    /// Ends every channel, for good (shutdown, or the supervisor gave up):
    /// subscribers, also later ones, read what the store has and finish instead
    /// of waiting forever.
    pub fn close_all(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        self.drop_all_kept();
        self.channels.clear();
    }

    fn follows_remote(&self) -> bool {
        self.remote.load(std::sync::atomic::Ordering::SeqCst) && !self.closed.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn receiver(&self, run_id: RunId) -> broadcast::Receiver<Arc<RunEvent>> {
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            // Its sender is gone at once: the subscriber reads the store and ends.
            return broadcast::channel(1).1;
        }
        self.channels.entry(run_id).or_insert_with(|| broadcast::channel(self.capacity).0).subscribe()
    }

    fn release(&self, run_id: RunId) {
        self.channels.remove_if(&run_id, |_, sender| sender.receiver_count() == 0);
    }
}

struct Cursor {
    run_id: RunId,
    last: u64,
    backlog: VecDeque<Arc<RunEvent>>,
    receiver: Option<broadcast::Receiver<Arc<RunEvent>>>,
    store: Arc<dyn RunStore>,
    hub: Arc<EventHub>,
    /// Whether the store may hold events the backlog lacks (at the start, after a
    /// lag or a gap). Live events are not read back from the store.
    stale: bool,
    ended: bool,
    /// The first batch, read before the stream started (see [`subscribe_owned`]):
    /// the first refill takes it instead of reading the store.
    prefetched: Option<Vec<RunEvent>>,
}

/// Every event of `run_id` after seq `after`, exactly once and in order: first
/// from the store, then live. The stream ends after the run's `run_end` event.
pub fn subscribe(
    hub: Arc<EventHub>,
    store: Arc<dyn RunStore>,
    run_id: RunId,
    after: u64,
) -> BoxStream<'static, Result<Arc<RunEvent>, StoreError>> {
    let mut cursor = Cursor::new(hub, store, run_id, after);
    if let Kept::Events(events) = cursor.hub.kept_after(run_id, after, None) {
        cursor.start_with(events);
    }
    stream_from(cursor)
}

/// [`subscribe`] for a reader who may follow only `tenant`'s runs: `None` unless
/// the run exists and is `tenant`'s. Whose run it is and the first events come
/// from one read of the store.
pub async fn subscribe_owned(
    hub: Arc<EventHub>,
    store: Arc<dyn RunStore>,
    run_id: RunId,
    tenant: &str,
    after: u64,
) -> Result<Option<BoxStream<'static, Result<Arc<RunEvent>, StoreError>>>, StoreError> {
    let mut cursor = Cursor::new(hub, store, run_id, after);
    match cursor.hub.kept_after(run_id, after, Some(tenant)) {
        Kept::Events(events) => {
            cursor.start_with(events);
            return Ok(Some(stream_from(cursor)));
        }
        Kept::NotOwned => return Ok(None),
        Kept::Nothing => {}
    }
    match cursor.store.tenant_and_events_after(run_id, after, REPLAY_BATCH).await? {
        Some((owner, events)) if owner == tenant => {
            cursor.prefetched = Some(events);
            Ok(Some(stream_from(cursor)))
        }
        // The cursor, dropped, lets its channel go.
        _ => Ok(None),
    }
}

fn stream_from(cursor: Cursor) -> BoxStream<'static, Result<Arc<RunEvent>, StoreError>> {
    Box::pin(stream::unfold(cursor, |mut cursor| async move {
        match cursor.next().await {
            Ok(Some(event)) => Some((Ok(event), cursor)),
            Ok(None) => None,
            Err(error) => {
                cursor.ended = true;
                Some((Err(error), cursor))
            }
        }
    }))
}

impl Cursor {
    fn new(hub: Arc<EventHub>, store: Arc<dyn RunStore>, run_id: RunId, after: u64) -> Self {
        // Subscribed before the first store read, so that nothing committed in
        // between is missed.
        let receiver = Some(hub.receiver(run_id));
        let backlog = VecDeque::new();
        Self { run_id, last: after, backlog, receiver, store, hub, stale: true, ended: false, prefetched: None }
    }

    /// Starts with `events`, the run's events right after the cursor's start
    /// kept by the hub (subscribed before they were looked at): later ones come
    /// from the channel.
    fn start_with(&mut self, events: VecDeque<Arc<RunEvent>>) {
        self.backlog = events;
        self.stale = false;
    }

    async fn next(&mut self) -> Result<Option<Arc<RunEvent>>, StoreError> {
        loop {
            if let Some(event) = self.backlog.pop_front() {
                if event.seq == NUDGE {
                    self.stale = true;
                    continue;
                }
                if event.seq <= self.last {
                    continue;
                }
                if event.seq > self.last + 1 {
                    // A gap: what is missing is in the store.
                    self.backlog.clear();
                    self.stale = true;
                    continue;
                }
                self.last = event.seq;
                if matches!(event.kind, EventKind::RunEnd { .. }) {
                    self.finish();
                }
                return Ok(Some(event));
            }
            if self.ended {
                return Ok(None);
            }
            if self.stale {
                // A batch short of full holds every event committed before it was
                // read; later ones are published to the receiver, which was there
                // before the read. A full batch may have more behind it.
                let (found, full) = self.refill().await?;
                self.stale = full;
                if found {
                    continue;
                }
                if self.run_has_ended().await? {
                    // Nothing is published for an ended run (a late subscriber, a
                    // reconnect). It may have ended after the read above: its status
                    // and `run_end` commit together, so one more read finds every
                    // event up to `run_end`, which finishes the stream.
                    let (found, full) = self.refill().await?;
                    self.stale = full;
                    if !found {
                        self.finish();
                        return Ok(None);
                    }
                    continue;
                }
            }
            let Some(receiver) = self.receiver.as_mut() else {
                if self.hub.follows_remote() {
                    // The session here stopped before the run ended: another
                    // node drives it now (or will), and nudges bring its events.
                    self.receiver = Some(self.hub.receiver(self.run_id));
                    self.stale = true;
                    continue;
                }
                // The channel is gone and the store has nothing more: the run's
                // session stopped (shutdown) before the run ended.
                self.finish();
                return Ok(None);
            };
            match receiver.recv().await {
                Ok(event) => self.backlog.push_back(event),
                Err(RecvError::Lagged(_)) => self.stale = true,
                Err(RecvError::Closed) => {
                    // Whatever the session committed is in the store.
                    self.receiver = None;
                    self.stale = true;
                }
            }
        }
    }

    /// Loads the next batch from the store: whether it held anything new, and
    /// whether it was full (the store may hold more).
    async fn refill(&mut self) -> Result<(bool, bool), StoreError> {
        let batch = match self.prefetched.take() {
            Some(batch) => batch,
            None => self.store.events_after(self.run_id, self.last, REPLAY_BATCH).await?,
        };
        // Only events past the cursor count: a store that answered with older ones
        // must not make the cursor read again and again.
        let found = batch.iter().any(|event| event.seq > self.last);
        let full = found && batch.len() >= REPLAY_BATCH;
        self.backlog.extend(batch.into_iter().map(Arc::new));
        Ok((found, full))
    }

    /// Whether the store has the run ended (or has no such run). A run's status and
    /// its `run_end` event commit together, so once this is true the store holds
    /// every event the run will ever have.
    async fn run_has_ended(&self) -> Result<bool, StoreError> {
        Ok(self.store.get_run(self.run_id).await?.is_none_or(|run| run.status.is_terminal()))
    }

    fn finish(&mut self) {
        self.ended = true;
        self.receiver = None;
        self.hub.release(self.run_id);
    }
}

impl Drop for Cursor {
    fn drop(&mut self) {
        // A stream dropped early (a client went away) leaves no channel behind.
        self.receiver = None;
        self.hub.release(self.run_id);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use async_trait::async_trait;
    use chrono::{DateTime, Utc};
    use futures::StreamExt;

    use super::*;
    use crate::protocol::{Limits, RunStatus};
    use crate::store::{Commit, MemoryStore, RunQuery, RunRecord, RunSnapshot, StoreWrite};

    /// A memory store whose run ends, as its session would end it (the commit,
    /// then its events published and the channel closed), at a chosen moment: right
    /// after a subscriber's first read of events, or when it first asks for the
    /// run's status.
    struct EndsWhenAsked {
        inner: MemoryStore,
        hub: Arc<EventHub>,
        end: Mutex<Option<Commit>>,
        after_first_read: bool,
    }

    impl EndsWhenAsked {
        async fn end_now(&self) -> Result<(), StoreError> {
            let end = self.end.lock().unwrap().take();
            if let Some(end) = end {
                self.inner.commit(&end).await?;
                self.hub.publish(end.run_id, end.events);
                self.hub.close(end.run_id);
            }
            Ok(())
        }
    }

    #[async_trait]
    impl RunStore for EndsWhenAsked {
        async fn create_run(&self, run: RunRecord, events: Vec<RunEvent>) -> Result<(), StoreError> {
            self.inner.create_run(run, events).await
        }
        async fn commit(&self, commit: &Commit) -> Result<(), StoreError> {
            self.inner.commit(commit).await
        }
        async fn get_run(&self, run_id: RunId) -> Result<Option<RunRecord>, StoreError> {
            self.end_now().await?;
            self.inner.get_run(run_id).await
        }
        async fn load(&self, run_id: RunId) -> Result<Option<RunSnapshot>, StoreError> {
            self.inner.load(run_id).await
        }
        async fn events_after(&self, run_id: RunId, after: u64, limit: usize) -> Result<Vec<RunEvent>, StoreError> {
            let events = self.inner.events_after(run_id, after, limit).await;
            if self.after_first_read {
                self.end_now().await?;
            }
            events
        }
        async fn list_runs(&self, query: RunQuery) -> Result<Vec<RunRecord>, StoreError> {
            self.inner.list_runs(query).await
        }
        async fn unfinished_runs(&self) -> Result<Vec<RunId>, StoreError> {
            self.inner.unfinished_runs().await
        }
        async fn tenant_usage(&self, tenant: &str, since: DateTime<Utc>) -> Result<crate::protocol::Usage, StoreError> {
            self.inner.tenant_usage(tenant, since).await
        }
        async fn delete_finished(&self, before: DateTime<Utc>, limit: usize) -> Result<usize, StoreError> {
            self.inner.delete_finished(before, limit).await
        }
        async fn delete_ended(&self, run_id: RunId) -> Result<bool, StoreError> {
            self.inner.delete_ended(run_id).await
        }
        fn threads(&self) -> &dyn crate::store::ThreadStore {
            self.inner.threads()
        }
    }

    fn event(run_id: RunId, seq: u64, kind: EventKind) -> RunEvent {
        RunEvent { run_id, seq, ts: Utc::now(), parent_run_id: None, kind }
    }

    /// The events of a run that ends at the moment `after_first_read` says, for
    /// a subscriber from `after`.
    async fn streamed(after_first_read: bool, after: u64) -> Vec<u64> {
        let run_id = RunId::new();
        let record = RunRecord::accepted(run_id, "t".into(), "a".into(), "hi".into(), Limits::default(), Utc::now());
        let first = event(run_id, 1, EventKind::TurnStart { turn: 1 });
        let end = Commit {
            run_id,
            writes: vec![StoreWrite::Status { status: RunStatus::Succeeded, reason: None }],
            events: vec![
                event(run_id, 2, EventKind::TurnEnd { turn: 1 }),
                event(run_id, 3, EventKind::RunEnd { status: RunStatus::Succeeded, reason: None }),
            ],
        };
        let hub = Arc::new(EventHub::new(16));
        let store =
            EndsWhenAsked { inner: MemoryStore::new(), hub: hub.clone(), end: Mutex::new(Some(end)), after_first_read };
        store.create_run(record, vec![first]).await.unwrap();
        let events = subscribe(hub, Arc::new(store), run_id, after).map(|event| event.unwrap().seq).collect();
        tokio::time::timeout(std::time::Duration::from_secs(10), events).await.expect("the stream ends")
    }

    #[tokio::test]
    async fn a_run_that_ends_right_after_the_replay_is_streamed_to_its_end() {
        assert_eq!(streamed(true, 0).await, vec![1, 2, 3], "the events committed with the end are not lost");
    }

    #[tokio::test]
    async fn a_run_that_ends_when_a_caught_up_subscriber_asks_is_streamed_to_its_end() {
        assert_eq!(streamed(false, 1).await, vec![2, 3], "the events committed with the end are not lost");
    }

    #[tokio::test]
    async fn a_stream_of_a_run_of_another_tenant_or_of_no_run_is_refused_and_holds_no_channel() {
        let run_id = RunId::new();
        let record = RunRecord::accepted(run_id, "t".into(), "a".into(), "hi".into(), Limits::default(), Utc::now());
        let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
        store.create_run(record, vec![event(run_id, 1, EventKind::TurnStart { turn: 1 })]).await.unwrap();
        let hub = Arc::new(EventHub::new(16));
        assert!(subscribe_owned(hub.clone(), store.clone(), run_id, "other", 0).await.unwrap().is_none());
        assert!(subscribe_owned(hub.clone(), store.clone(), RunId::new(), "t", 0).await.unwrap().is_none());
        assert!(hub.channels.is_empty(), "a refused stream leaves no channel behind");

        let mut events = subscribe_owned(hub.clone(), store, run_id, "t", 0).await.unwrap().expect("the tenant's run");
        assert_eq!(events.next().await.unwrap().unwrap().seq, 1, "first what the store has");
        hub.publish(run_id, vec![event(run_id, 2, EventKind::RunEnd { status: RunStatus::Succeeded, reason: None })]);
        assert_eq!(events.next().await.unwrap().unwrap().seq, 2, "then what is published");
        assert!(events.next().await.is_none(), "the stream ends with the run");
    }

    fn turn(run_id: RunId, seq: u64) -> RunEvent {
        event(run_id, seq, EventKind::TurnStart { turn: seq as u32 })
    }

    #[tokio::test]
    async fn a_stream_that_starts_with_its_run_is_served_from_memory() {
        // The store has never heard of the run: what the stream gets is what the
        // hub kept, and what it refuses, the hub refused.
        let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
        let hub = Arc::new(EventHub::new(16));
        let run_id = RunId::new();
        hub.begin(run_id, "t", &[turn(run_id, 1), turn(run_id, 2)]);
        assert!(subscribe_owned(hub.clone(), store.clone(), run_id, "t", 0).await.unwrap().is_none(), "not stored yet");
        hub.stored(run_id);
        hub.publish(run_id, vec![turn(run_id, 3)]);
        assert!(subscribe_owned(hub.clone(), store.clone(), run_id, "other", 0).await.unwrap().is_none());

        let mut events = subscribe_owned(hub.clone(), store.clone(), run_id, "t", 1).await.unwrap().expect("kept");
        assert_eq!(events.next().await.unwrap().unwrap().seq, 2);
        assert_eq!(events.next().await.unwrap().unwrap().seq, 3);
        hub.publish(run_id, vec![event(run_id, 4, EventKind::RunEnd { status: RunStatus::Succeeded, reason: None })]);
        assert_eq!(events.next().await.unwrap().unwrap().seq, 4, "then what is published");
        assert!(events.next().await.is_none(), "the stream ends with the run");

        let mut again = subscribe(hub.clone(), store.clone(), run_id, 0);
        assert_eq!(again.next().await.unwrap().unwrap().seq, 1, "a stream without a tenant is served the same");
        // Kept until the run ends; a stream that has seen all that was kept reads
        // the store (which knows whether the run ended).
        assert!(subscribe_owned(hub.clone(), store.clone(), run_id, "t", 4).await.unwrap().is_none());
        hub.close(run_id);
        assert!(subscribe_owned(hub, store, run_id, "t", 0).await.unwrap().is_none(), "nothing kept after the end");
    }

    #[tokio::test]
    async fn a_run_whose_first_events_cannot_all_be_kept_is_streamed_from_the_store() {
        let run_id = RunId::new();
        let record = RunRecord::accepted(run_id, "t".into(), "a".into(), "hi".into(), Limits::default(), Utc::now());
        let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
        store.create_run(record, vec![turn(run_id, 1)]).await.unwrap();
        for seq in 2..=3 {
            store.commit(&Commit { run_id, writes: vec![], events: vec![turn(run_id, seq)] }).await.unwrap();
        }
        let hub = Arc::new(EventHub::new(16));
        hub.begin(run_id, "t", &[turn(run_id, 1)]);
        hub.stored(run_id);
        hub.publish(run_id, vec![turn(run_id, 3)]);
        let events = subscribe_owned(hub.clone(), store.clone(), run_id, "t", 0).await.unwrap().expect("the run");
        let seqs: Vec<u64> = events.take(3).map(|event| event.unwrap().seq).collect().await;
        assert_eq!(seqs, vec![1, 2, 3], "one missing: the store serves the run");

        // Committed and never published (its session died in between): the
        // session that loads the run again forgets what was kept.
        hub.begin(run_id, "t", &[turn(run_id, 1)]);
        hub.stored(run_id);
        hub.forget(run_id);
        let events = subscribe_owned(hub.clone(), store.clone(), run_id, "t", 0).await.unwrap().expect("the run");
        let seqs: Vec<u64> = events.take(3).map(|event| event.unwrap().seq).collect().await;
        assert_eq!(seqs, vec![1, 2, 3], "forgotten: the store serves the run");

        // Ended (cancelled) before it was known to be stored: nothing is kept.
        let ended = RunId::new();
        hub.begin(ended, "t", &[turn(ended, 1)]);
        hub.close(ended);
        hub.stored(ended);
        assert!(subscribe_owned(hub.clone(), store.clone(), ended, "t", 0).await.unwrap().is_none());

        // More than the hub keeps: a run the store does not have shows it.
        let run_id = RunId::new();
        hub.begin(run_id, "t", &[turn(run_id, 1)]);
        hub.stored(run_id);
        hub.publish(run_id, (2..=FIRST_EVENTS as u64).map(|seq| turn(run_id, seq)).collect());
        assert!(subscribe_owned(hub.clone(), store.clone(), run_id, "t", 0).await.unwrap().is_some(), "all kept");
        hub.publish(run_id, vec![turn(run_id, FIRST_EVENTS as u64 + 1)]);
        assert!(subscribe_owned(hub, store, run_id, "t", 0).await.unwrap().is_none(), "none kept once too many");
    }

    #[tokio::test]
    async fn the_hub_keeps_a_bounded_number_of_events_over_all_runs() {
        let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
        let hub = Arc::new(EventHub::new(16));
        let full_run = |hub: &EventHub| {
            let run_id = RunId::new();
            let events: Vec<RunEvent> = (1..=FIRST_EVENTS as u64).map(|seq| turn(run_id, seq)).collect();
            hub.begin(run_id, "t", &events);
            hub.stored(run_id);
            run_id
        };
        let runs: Vec<RunId> = (0..KEPT_EVENTS / FIRST_EVENTS).map(|_| full_run(&hub)).collect();
        for run_id in &runs {
            assert!(subscribe_owned(hub.clone(), store.clone(), *run_id, "t", 0).await.unwrap().is_some(), "kept");
        }
        let over = full_run(&hub);
        assert!(subscribe_owned(hub.clone(), store.clone(), over, "t", 0).await.unwrap().is_none(), "over the bound");

        // A run that ends gives its share back; so does one whose events stop
        // being kept (one more than a run keeps).
        hub.close(runs[0]);
        let next = full_run(&hub);
        assert!(subscribe_owned(hub.clone(), store.clone(), next, "t", 0).await.unwrap().is_some(), "kept again");
        hub.publish(runs[1], vec![turn(runs[1], FIRST_EVENTS as u64 + 1)]);
        let last = full_run(&hub);
        assert!(subscribe_owned(hub, store, last, "t", 0).await.unwrap().is_some(), "kept again");
    }

    #[tokio::test]
    async fn a_reconnect_after_the_end_gets_nothing_and_ends() {
        let run_id = RunId::new();
        let record = RunRecord::accepted(run_id, "t".into(), "a".into(), "hi".into(), Limits::default(), Utc::now());
        let store = MemoryStore::new();
        store.create_run(record, vec![event(run_id, 1, EventKind::TurnStart { turn: 1 })]).await.unwrap();
        let end = Commit {
            run_id,
            writes: vec![StoreWrite::Status { status: RunStatus::Succeeded, reason: None }],
            events: vec![event(run_id, 2, EventKind::RunEnd { status: RunStatus::Succeeded, reason: None })],
        };
        store.commit(&end).await.unwrap();
        let events = subscribe(Arc::new(EventHub::new(16)), Arc::new(store), run_id, 2).collect::<Vec<_>>();
        let events = tokio::time::timeout(std::time::Duration::from_secs(10), events).await.expect("the stream ends");
        assert!(events.is_empty());
    }
}
