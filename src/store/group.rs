//! Group commit, the part that needs no database: a commit encoded once by its
//! caller ([`Job`]), and a group of jobs checked and merged in memory against the
//! rows of the runs they touch ([`plan`]) into the rows one transaction writes
//! ([`GroupWrite`]).
//!
//! Checking before writing is what lets one transaction carry the commits of
//! many runs: a commit that is refused (no such run, run ended, seq conflict)
//! contributes no row, so it cannot fail the others.

use std::collections::hash_map::Entry;

use troupe_actors::protocol::{EventKind, RunEvent, RunId};
use troupe_actors::store::{Commit, RunRecord, StoreError, StoreWrite, check_sequence};

use crate::store::encode::{Span, batch_with_spans, json, run_id as id_text, stamp};
use crate::store::sql::{Map, TERMINAL, Text};

/// The events of one commit, encoded as the one `run_events` row that holds them
/// (a JSON array of the events `first..=last`).
pub(super) struct EncodedEvents {
    first: i64,
    last: i64,
    body: Text,
    /// Where each event lies in `body`.
    spans: Vec<Span>,
}

/// One state change, encoded.
pub(super) enum EncodedWrite {
    Status { status: &'static str, reason: Option<Text> },
    Progress { turn: i64, usage: Text },
    FinalOutput(Text),
    Message { turn: i64, body: Text },
    Plan { version: i64, body: Text },
    ToolExecution { turn: i64, call_id: Text, status: &'static str, body: Text },
    Review { turn: i64, body: Text },
    Documents(Vec<Text>),
}

/// What the writer is asked to do: create a run, or apply a commit. Encoded (JSON
/// bodies serialised) by the caller, so the one writer task only binds and writes.
pub(super) enum Job {
    /// A new run and its first events.
    Create { run_id: RunId, fixed: Box<Fixed>, state: RunState, events: Option<EncodedEvents> },
    /// A commit to an existing run.
    Commit {
        run_id: RunId,
        id: Text,
        /// The seq the events continue from; `None` for a commit without events.
        expected: Option<u64>,
        events: Option<EncodedEvents>,
        writes: Vec<EncodedWrite>,
    },
}

/// The columns of a run that never change after it is created.
#[derive(Clone)]
pub(super) struct Fixed {
    /// The run's id as the store's columns hold it.
    pub run_id: Text,
    pub parent_run_id: Option<Text>,
    pub agent: Text,
    pub input: Text,
    pub limits: Text,
    pub created_at: Text,
    pub thread_id: Option<Text>,
    /// JSON; `None` for no metadata.
    pub metadata: Option<Text>,
    pub idempotency_key: Option<Text>,
    pub request_fingerprint: Option<Text>,
    pub traceparent: Option<Text>,
}

/// The columns of a run that commits change, with the counters that number its
/// messages, tool calls and documents (kept on the row since migration 2, so an
/// insert needs no `MAX(idx)` lookup).
#[derive(Clone)]
pub(super) struct RunState {
    /// The run's integer key (schema v7), which its rows in the child tables
    /// name it by: allocated by the writer when it plans the group that creates
    /// the run (0 in a [`Job::Create`] until then).
    pub key: i64,
    pub tenant: Text,
    pub status: Text,
    pub reason: Option<Text>,
    pub turn: i64,
    pub usage: Text,
    pub final_output: Option<Text>,
    pub last_seq: i64,
    pub message_count: i64,
    pub tool_count: i64,
    pub document_count: i64,
    pub updated_at: Text,
}

impl Job {
    /// Encodes a new run and its first events.
    pub(super) fn create(run: &RunRecord, events: &[RunEvent]) -> Result<Self, StoreError> {
        check_sequence(run.run_id, 0, events)?;
        let fixed = Fixed {
            run_id: id_text(run.run_id),
            parent_run_id: run.parent_run_id.map(|id| id.to_string().into()),
            agent: run.agent.as_str().into(),
            input: run.input.as_str().into(),
            limits: json(&run.limits)?.into(),
            created_at: stamp(run.created_at).into(),
            thread_id: run.thread_id.map(|id| id.to_string().into()),
            metadata: if run.metadata.is_empty() { None } else { Some(json(&run.metadata)?.into()) },
            idempotency_key: run.idempotency.as_ref().map(|idempotency| idempotency.key.as_str().into()),
            request_fingerprint: run.idempotency.as_ref().map(|idempotency| idempotency.fingerprint.as_str().into()),
            traceparent: run.traceparent.as_deref().map(Into::into),
        };
        let state = RunState {
            key: 0,
            tenant: run.tenant.as_str().into(),
            status: run.status.as_str().into(),
            reason: run.reason.as_deref().map(Into::into),
            turn: i64::from(run.turn),
            usage: json(&run.usage)?.into(),
            final_output: run.final_output.as_deref().map(Into::into),
            last_seq: events.len() as i64,
            message_count: 0,
            tool_count: 0,
            document_count: 0,
            updated_at: stamp(run.updated_at).into(),
        };
        Ok(Job::Create { run_id: run.run_id, fixed: Box::new(fixed), state, events: encode_events(events, |_| None)? })
    }

    /// Encodes a commit; its events must be contiguous among themselves (whether
    /// they continue the stored sequence is checked by the writer).
    pub(super) fn commit(commit: &Commit) -> Result<Self, StoreError> {
        let run_id = commit.run_id;
        let expected = commit.events.first().map(|event| event.seq.saturating_sub(1));
        if let Some(expected) = expected {
            check_sequence(run_id, expected, &commit.events)?;
        }
        let writes: Vec<EncodedWrite> = commit.writes.iter().map(encode_write).collect::<Result<_, _>>()?;
        let events = encode_events(&commit.events, |kind| embedded(kind, &commit.writes, &writes))?;
        Ok(Job::Commit { run_id, id: id_text(run_id), expected, events, writes })
    }

    /// The text of the job's events and where each lies in it (for
    /// [`super::recent`], once the job is committed).
    pub(super) fn take_events(&mut self) -> Option<(Text, Vec<Span>)> {
        let (Job::Create { events, .. } | Job::Commit { events, .. }) = self;
        events.as_mut().map(|events| (events.body.clone(), std::mem::take(&mut events.spans)))
    }

    /// The id of the run the job touches, as the store's columns hold it.
    pub(super) fn id(&self) -> &Text {
        match self {
            Job::Create { fixed, .. } => &fixed.run_id,
            Job::Commit { id, .. } => id,
        }
    }

    /// The run the job touches.
    pub(super) fn run_id(&self) -> RunId {
        match self {
            Job::Create { run_id, .. } | Job::Commit { run_id, .. } => *run_id,
        }
    }
}

/// `None` for a commit without events; `embedded` as for [`super::encode::event_batch`].
fn encode_events<'a>(
    events: &[RunEvent],
    embedded: impl Fn(&EventKind) -> Option<&'a str>,
) -> Result<Option<EncodedEvents>, StoreError> {
    let (Some(first), Some(last)) = (events.first(), events.last()) else {
        return Ok(None);
    };
    let (body, spans) = batch_with_spans(events, embedded)?;
    Ok(Some(EncodedEvents { first: first.seq as i64, last: last.seq as i64, body: body.into(), spans }))
}

/// The JSON of the tool record, plan or review an event carries, where one of the
/// commit's `writes` (encoded as `encoded`) holds the same value: a call's
/// `tool_metric` event and its record, a `plan_updated` event and its plan, a
/// `review` event and its review are written both as events and as rows.
fn embedded<'a>(kind: &EventKind, writes: &[StoreWrite], encoded: &'a [EncodedWrite]) -> Option<&'a str> {
    writes.iter().zip(encoded).find_map(|pair| match (kind, pair) {
        (
            EventKind::ToolMetric { record },
            (StoreWrite::ToolExecution(written), EncodedWrite::ToolExecution { body, .. }),
        ) if **record == *written => Some(&**body),
        (EventKind::PlanUpdated { plan }, (StoreWrite::Plan(written), EncodedWrite::Plan { body, .. }))
            if plan == written =>
        {
            Some(&**body)
        }
        // The row holds `[turn, review]`.
        (
            EventKind::Review { turn, review },
            (StoreWrite::Review { turn: written_turn, review: written }, EncodedWrite::Review { body, .. }),
        ) if turn == written_turn && **review == *written => {
            body.split_once(',').and_then(|(_, review)| review.strip_suffix(']'))
        }
        _ => None,
    })
}

fn encode_write(write: &StoreWrite) -> Result<EncodedWrite, StoreError> {
    Ok(match write {
        StoreWrite::Status { status, reason } => {
            EncodedWrite::Status { status: status.as_str(), reason: reason.as_deref().map(Into::into) }
        }
        StoreWrite::Progress { turn, usage } => {
            EncodedWrite::Progress { turn: i64::from(*turn), usage: json(usage)?.into() }
        }
        StoreWrite::FinalOutput(text) => EncodedWrite::FinalOutput(text.as_str().into()),
        StoreWrite::Message(message) => {
            EncodedWrite::Message { turn: i64::from(message.turn), body: json(message)?.into() }
        }
        StoreWrite::Plan(plan) => EncodedWrite::Plan { version: plan.version as i64, body: json(plan)?.into() },
        StoreWrite::ToolExecution(record) => EncodedWrite::ToolExecution {
            turn: i64::from(record.turn),
            call_id: record.call_id.as_str().into(),
            status: record.status.as_str(),
            body: json(record)?.into(),
        },
        StoreWrite::Review { turn, review } => {
            EncodedWrite::Review { turn: i64::from(*turn), body: json(&(*turn, review))?.into() }
        }
        StoreWrite::Documents(fragments) => EncodedWrite::Documents(
            fragments.iter().map(|fragment| Ok(json(fragment)?.into())).collect::<Result<_, _>>()?,
        ),
    })
}

/// A run as the group sees it: its row as read at the start of the transaction
/// (or as created by a job of the group), with the group's changes applied.
pub(super) struct Slot {
    pub state: RunState,
    /// `Some` for a run created by this group (it is inserted, not updated).
    pub created: Option<Fixed>,
    /// Whether a job of the group changed it.
    pub touched: bool,
    /// Whether a job of the group changed its status, reason or final output:
    /// only then is its row written with them (see [`GroupWrite::progressed`]).
    pub full_update: bool,
    /// Whether the last job of the group that changed it had events: its
    /// `run_events` row then holds the run's progress, and the `runs` row needs
    /// no write (see [`GroupWrite::carried`]).
    pub carried: bool,
}

impl Slot {
    /// A run as read from the database (or as the writer last committed it).
    pub(super) fn read(state: RunState) -> Self {
        Self { state, created: None, touched: false, full_update: false, carried: false }
    }
}

/// Every row one group transaction writes. Rows keyed by a primary key that a
/// later write may replace (tool calls, plans, reviews) appear once, with their
/// last value: PostgreSQL refuses a multi-row upsert that hits one row twice.
#[derive(Default)]
pub(super) struct GroupWrite {
    /// Runs created by the group, final state: `(run, fixed columns, state)`.
    pub created: Vec<(RunId, Fixed, RunState)>,
    /// Existing runs whose status, reason or final output the group changed,
    /// final state: every mutable column is written.
    pub updated: Vec<(RunId, RunState)>,
    /// The other existing runs the group changed whose last change in the group
    /// had no events (new rows, turn or usage), final state: only the columns a
    /// commit in flight changes are written, none of them indexed, so that no
    /// index entry of the run moves.
    pub progressed: Vec<(RunId, RunState)>,
    /// The other existing runs the group changed, final state: not written, their
    /// last `run_events` row holds it (schema v6); kept for the writer's cache.
    pub carried: Vec<(RunId, RunState)>,
    /// One row per commit with events, with the run's progress after it.
    pub events: Vec<EventRow>,
    /// `(run key, idx, tenant, turn, body)`.
    pub messages: Vec<(i64, i64, Text, i64, Text)>,
    /// `(run key, turn, call_id, idx, tenant, status, body)`.
    pub tool_executions: Vec<(i64, i64, Text, i64, Text, &'static str, Text)>,
    /// `(run key, version, tenant, body)`.
    pub plans: Vec<(i64, i64, Text, Text)>,
    /// `(run key, turn, tenant, body)`.
    pub reviews: Vec<(i64, i64, Text, Text)>,
    /// `(run key, idx, tenant, body)`.
    pub documents: Vec<(i64, i64, Text, Text)>,
}

/// The `run_events` row of one commit: its events, and the run's progress as the
/// commit left it (`runs_now` takes a run's progress from its newest row).
pub(super) struct EventRow {
    pub last: i64,
    pub first: i64,
    pub body: Text,
    /// The run's progress after the commit.
    pub progress: Progress,
}

/// The columns of a `run_events` row that hold its run's progress after the
/// commit (schema v6), with the run's key and tenant.
pub(super) struct Progress {
    pub key: i64,
    pub tenant: Text,
    pub turn: i64,
    pub usage: Text,
    pub message_count: i64,
    pub tool_count: i64,
    pub document_count: i64,
    /// The commit's time.
    pub updated_at: Text,
}

impl Progress {
    fn of(state: &RunState) -> Self {
        Self {
            key: state.key,
            tenant: state.tenant.clone(),
            turn: state.turn,
            usage: state.usage.clone(),
            message_count: state.message_count,
            tool_count: state.tool_count,
            document_count: state.document_count,
            updated_at: state.updated_at.clone(),
        }
    }
}

/// Where each keyed row sits in a [`GroupWrite`], so a later write replaces it.
#[derive(Default)]
struct Positions {
    tool_executions: Map<(i64, i64, Text), usize>,
    plans: Map<(i64, i64), usize>,
    reviews: Map<(i64, i64), usize>,
}

/// Checks every job in order against `runs` (the group's runs as read, by id) and
/// merges the accepted ones into the rows to write. A refused job changes nothing
/// and gets its error; the others get `Ok` (which holds once the group commits).
/// Each run the group creates takes the key `next_key`, which then goes up by one.
pub(super) fn plan(
    jobs: &[Job],
    mut runs: Map<RunId, Slot>,
    now: &Text,
    next_key: &mut i64,
) -> (GroupWrite, Vec<Result<(), StoreError>>) {
    let mut write = GroupWrite::default();
    let mut positions = Positions::default();
    let outcomes = jobs.iter().map(|job| accept(job, &mut runs, now, next_key, &mut write, &mut positions)).collect();
    for (id, slot) in runs {
        match slot.created {
            Some(fixed) => write.created.push((id, fixed, slot.state)),
            None if slot.full_update => write.updated.push((id, slot.state)),
            None if slot.touched && !slot.carried => write.progressed.push((id, slot.state)),
            None if slot.touched => write.carried.push((id, slot.state)),
            None => {}
        }
    }
    (write, outcomes)
}

fn accept(
    job: &Job,
    runs: &mut Map<RunId, Slot>,
    now: &Text,
    next_key: &mut i64,
    write: &mut GroupWrite,
    positions: &mut Positions,
) -> Result<(), StoreError> {
    match job {
        Job::Create { run_id, fixed, state, events } => {
            let Entry::Vacant(vacant) = runs.entry(*run_id) else {
                return Err(StoreError::Exists(*run_id));
            };
            let key = *next_key;
            *next_key += 1;
            let slot = Slot {
                state: RunState { key, ..state.clone() },
                created: Some(Fixed::clone(fixed)),
                touched: true,
                full_update: true,
                carried: false,
            };
            let slot = vacant.insert(slot);
            push_events(write, &slot.state, events);
            Ok(())
        }
        Job::Commit { run_id, expected, events, writes, .. } => {
            let slot = runs.get_mut(run_id).ok_or(StoreError::NotFound(*run_id))?;
            let state = &mut slot.state;
            if TERMINAL.contains(&&*state.status) {
                return Err(StoreError::Terminal(*run_id));
            }
            if let Some(expected) = *expected
                && state.last_seq != expected as i64
            {
                let got = expected + 1;
                return Err(StoreError::SeqConflict { run_id: *run_id, expected: state.last_seq as u64 + 1, got });
            }
            slot.touched = true;
            slot.full_update |=
                writes.iter().any(|write| matches!(write, EncodedWrite::Status { .. } | EncodedWrite::FinalOutput(_)));
            if let Some(events) = events {
                state.last_seq = events.last;
            }
            state.updated_at = now.clone();
            for change in writes {
                apply(write, positions, state, change);
            }
            push_events(write, state, events);
            slot.carried = events.is_some();
            Ok(())
        }
    }
}

/// The row of a commit's events, with the run's state after the commit.
fn push_events(write: &mut GroupWrite, state: &RunState, events: &Option<EncodedEvents>) {
    if let Some(events) = events {
        let (last, first, body) = (events.last, events.first, events.body.clone());
        write.events.push(EventRow { last, first, body, progress: Progress::of(state) });
    }
}

/// Upserts `row` under `key`: replaces the row already planned with that key.
fn upsert<K: std::hash::Hash + Eq, R>(rows: &mut Vec<R>, positions: &mut Map<K, usize>, key: K, row: R) {
    match positions.entry(key) {
        Entry::Occupied(at) => rows[*at.get()] = row,
        Entry::Vacant(slot) => {
            slot.insert(rows.len());
            rows.push(row);
        }
    }
}

fn apply(write: &mut GroupWrite, positions: &mut Positions, state: &mut RunState, change: &EncodedWrite) {
    let (key, tenant) = (state.key, state.tenant.clone());
    match change {
        EncodedWrite::Status { status, reason } => {
            state.status = (*status).into();
            state.reason = reason.clone();
        }
        EncodedWrite::Progress { turn, usage } => {
            state.turn = *turn;
            state.usage = usage.clone();
        }
        EncodedWrite::FinalOutput(text) => state.final_output = Some(text.clone()),
        EncodedWrite::Message { turn, body } => {
            state.message_count += 1;
            write.messages.push((key, state.message_count, tenant, *turn, body.clone()));
        }
        EncodedWrite::Plan { version, body } => {
            let row = (key, *version, tenant, body.clone());
            upsert(&mut write.plans, &mut positions.plans, (key, *version), row);
        }
        EncodedWrite::ToolExecution { turn, call_id, status, body } => {
            // Every record takes the next number; an update keeps the number of the
            // first insert (in the table, and here for a call written twice in one
            // group), so calls stay in the order they were first recorded.
            state.tool_count += 1;
            let call = (key, *turn, call_id.clone());
            let idx = match positions.tool_executions.get(&call) {
                Some(&at) => write.tool_executions[at].3,
                None => state.tool_count,
            };
            let row = (key, *turn, call_id.clone(), idx, tenant, *status, body.clone());
            upsert(&mut write.tool_executions, &mut positions.tool_executions, call, row);
        }
        EncodedWrite::Review { turn, body } => {
            let row = (key, *turn, tenant, body.clone());
            upsert(&mut write.reviews, &mut positions.reviews, (key, *turn), row);
        }
        EncodedWrite::Documents(bodies) => {
            for body in bodies {
                state.document_count += 1;
                write.documents.push((key, state.document_count, tenant.clone(), body.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests;
