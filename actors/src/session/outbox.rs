//! What a turn commits and when. The [`Outbox`] gathers the events and store
//! writes of what the session did since the last commit; `flush` commits them in
//! one store commit and only then publishes the events. When the session flushes
//! is its commit points (see the module doc of `session`): before the model is
//! called, before a call is sent, as results arrive, and with the review.

use chrono::Utc;

use crate::protocol::{EventKind, RunEvent, RunId, ToolExecutionRecord};
use crate::shared::RuntimeShared;
use crate::store::{Commit, StoreError, StoreWrite};
use crate::tool_pool::WorkItem;

/// Events and writes waiting for the next commit.
pub(super) struct Outbox {
    pub(super) run_id: RunId,
    pub(super) parent_run_id: Option<RunId>,
    pub(super) next_seq: u64,
    pub(super) events: Vec<RunEvent>,
    pub(super) writes: Vec<StoreWrite>,
}

impl Outbox {
    /// Adds an event of kind `kind`, numbered next.
    pub(super) fn emit(&mut self, kind: EventKind) {
        let event = RunEvent {
            run_id: self.run_id,
            seq: self.next_seq,
            ts: Utc::now(),
            parent_run_id: self.parent_run_id,
            kind,
        };
        self.next_seq += 1;
        self.events.push(event);
    }

    /// Adds a store write.
    pub(super) fn write(&mut self, write: StoreWrite) {
        self.writes.push(write);
    }

    /// Commits what waits, then publishes its events.
    pub(super) async fn flush(&mut self, shared: &RuntimeShared) -> Result<(), StoreError> {
        if self.events.is_empty() && self.writes.is_empty() {
            return Ok(());
        }
        let run_id = self.run_id;
        let events = std::mem::take(&mut self.events);
        let writes = std::mem::take(&mut self.writes);
        let commit = Commit { run_id, writes, events };
        shared.store.commit(&commit).await?;
        // Whether anyone listens is decided after the commit: a subscriber that
        // arrived during it has read the store before this commit landed.
        shared.hub.publish(run_id, commit.events);
        Ok(())
    }
}

/// The record of a call committed as `started` before it runs.
pub(super) fn started_record(shared: &RuntimeShared, work: &WorkItem) -> ToolExecutionRecord {
    let connector = shared.pool.registry.connector(&work.call.name);
    ToolExecutionRecord::started(work.run_id, &work.agent, connector, work.turn, &work.call)
}
