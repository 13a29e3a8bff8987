//! `GET /v1/runs/{id}/events`: a run's events as Server-Sent Events. `id:` is the
//! event's seq and `event:` its kind; a client that reconnects with
//! `Last-Event-ID` (or `?after=`) gets exactly the events after that seq, first
//! from the store and then live, with no gap and no duplicate. A client that
//! reads slower than the run writes is served from the store (the runtime's
//! subscription does that), so it never slows the run. The stream ends after
//! `run_end`, and at shutdown; one the server ends before `run_end` is logged.

use std::sync::Arc;

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use futures::stream::{self, BoxStream};
use futures::{FutureExt, StreamExt};
use serde::Deserialize;
use troupe_actors::protocol::{EventKind, RunEvent, RunId};
use troupe_actors::store::StoreError;
use utoipa::IntoParams;

use super::auth::Tenant;
use super::error::ApiError;
use super::event_stream::{self, Frames};
use super::incidents::{self, ConnectionNote, StreamCut};
use super::slots::StreamSlot;
use super::state::AppState;
use crate::reasoning::{Block, Change};

/// Where to resume.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Send only events with a seq above this (the `Last-Event-ID` header wins
    /// when both are given).
    pub after: Option<u64>,
    /// `block`: after each event that changes the run's reasoning block, also a
    /// `block` frame (no id) with the block as JSON, as the web page shows it.
    pub view: Option<String>,
}

/// Streams a run's events.
#[utoipa::path(
    get,
    path = "/v1/runs/{id}/events",
    tag = "runs",
    params(("id" = String, Path, description = "The run id."), EventsQuery,
        ("Last-Event-ID" = Option<u64>, Header, description = "The seq of the last event received.")),
    responses(
        (status = 200, content_type = "text/event-stream",
            description = "One SSE event per run event: `id` = seq, `event` = kind, `data` = the event as JSON; with `view=block`, also `block` events (no id) carrying the run's reasoning block."),
        (status = 404, body = super::error::ErrorBody, description = "No such run for this tenant."),
        (status = 400, body = super::error::ErrorBody, description = "A Last-Event-ID that is not a seq."),
        (status = 429, body = super::error::ErrorBody, description = "Too many open streams."),
    ),
    security(("bearer" = []))
)]
pub async fn run_events(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    path: Result<Path<String>, axum::extract::rejection::PathRejection>,
    query: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
    note: Option<Extension<Arc<ConnectionNote>>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Path(id) = path?;
    let run_id: RunId = id.parse().map_err(|_| ApiError::run_not_found())?;
    let Query(query) = query?;
    let after = match headers.get("last-event-id") {
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok())
            .ok_or_else(|| ApiError::invalid("Last-Event-ID must be the seq (a number) of an event"))?,
        None => query.after.unwrap_or(0),
    };
    // Seqs are stored as signed 64-bit integers; nothing past that exists.
    if i64::try_from(after).is_err() {
        return Err(ApiError::invalid("Last-Event-ID / after is beyond any event seq"));
    }
    let block = match query.view.as_deref() {
        None => None,
        Some("block") => Some(BlockView::new(after)),
        Some(other) => return Err(ApiError::invalid(format!("unknown view {other:?}: the one view is `block`"))),
    };
    // The block is made from the whole run: its events before `after` are read
    // (and not sent) too.
    let from = if block.is_some() { 0 } else { after };
    // Whose run it is and its first events, in one read.
    let Some(events) = state.inner.runtime.subscribe_owned(run_id, &tenant, from).await? else {
        return Err(ApiError::run_not_found());
    };
    let Some(slot) = state.inner.streams.open(&tenant) else {
        return Err(ApiError::new(StatusCode::TOO_MANY_REQUESTS, "too_many_streams", "too many open event streams")
            .retry_after(state.inner.config.retry_after));
    };
    if let Some(Extension(note)) = note {
        note.streams(&tenant, run_id);
    }
    let keep_alive = state.inner.timing.sse_keep_alive;
    let open = OpenStream { state: state.clone(), tenant, run_id, slot: Some(slot), sent: None, block, pending: None };
    // A batch of resumed events that changed nothing sends nothing.
    let frames = frames(events, open).filter(|frame| std::future::ready(!frame.is_empty()));
    Ok(event_stream::response(frames, keep_alive))
}

/// An event stream being served: what its end is logged with.
struct OpenStream {
    state: AppState,
    tenant: String,
    run_id: RunId,
    /// The place among open streams, held as long as the stream; `None` once the
    /// stream is over.
    slot: Option<StreamSlot>,
    /// Whether the last event sent was `run_end`; `None` before the first.
    sent: Option<bool>,
    /// With `view=block`: the run's block so far.
    block: Option<BlockView>,
    /// What the subscription gave after a batch, to handle next.
    pending: Option<Next>,
}

/// A stream's reasoning block, and the seq after which its events are sent.
struct BlockView {
    block: Block,
    after: u64,
    /// The block changed since the last block frame.
    dirty: bool,
    /// A block frame was sent.
    sent: bool,
}

/// At most this many events that are ready at once go out in one chunk (before
/// one block frame, in the block view).
const READY_BATCH: usize = 256;

impl BlockView {
    fn new(after: u64) -> Self {
        Self { block: Block::new(), after, dirty: false, sent: false }
    }

    /// Applies a batch of events (those that were ready together); the frames to
    /// send: each event after `after`, then the block once, if it changed (the
    /// answer's growth alone is in the events) or none was sent yet, as soon as
    /// the run's events up to `after` are applied (so a resumed client gets the
    /// block even if no event follows).
    fn frames(&mut self, batch: &[Arc<RunEvent>]) -> Frames {
        let mut frames = Frames::new();
        for event in batch {
            let change = self.block.apply(event);
            let resumed = event.seq <= self.after;
            if change == Change::Block || (resumed && change == Change::Answer) {
                self.dirty = true;
            }
            if !resumed {
                frames.push_event(&event.seq, event);
            }
        }
        if self.block.seq >= self.after && (self.dirty || !self.sent) {
            let mut value = serde_json::to_value(&self.block).unwrap_or_default();
            if let Some(object) = value.as_object_mut() {
                object.insert("server_time".into(), serde_json::json!(crate::reasoning::now_text()));
            }
            frames.push(None, BLOCK, &value);
            self.dirty = false;
            self.sent = true;
        }
        frames
    }
}

/// What the subscription gave next.
type Next = Option<Result<Arc<RunEvent>, StoreError>>;

/// `first` and the events ready after it (up to [`READY_BATCH`]); what ended the
/// batch early (an error, the end) comes back to be handled next.
fn ready_batch(
    first: Arc<RunEvent>,
    events: &mut BoxStream<'static, Result<Arc<RunEvent>, StoreError>>,
) -> (Vec<Arc<RunEvent>>, Option<Next>) {
    let mut batch = vec![first];
    while batch.len() < READY_BATCH {
        match events.next().now_or_never() {
            Some(Some(Ok(event))) => batch.push(event),
            Some(other) => return (batch, Some(other)),
            None => break,
        }
    }
    (batch, None)
}

impl OpenStream {
    /// Ends the stream, logging why if the run had not ended.
    fn cut(&mut self, cut: StreamCut, detail: Option<&str>) {
        self.slot = None;
        incidents::log_stream_cut(&self.state, &self.tenant, self.run_id, cut, detail);
    }
}

/// SSE frames of a subscription, until `run_end` or shutdown, in batches (the
/// events ready together, and in the block view their block, in one chunk). A
/// store failure mid-stream sends one `stream_error` event (no id: it is not a
/// run event) and ends the stream; the client reconnects with its last id.
fn frames(
    events: BoxStream<'static, Result<Arc<RunEvent>, StoreError>>,
    open: OpenStream,
) -> impl futures::Stream<Item = Bytes> + Send + 'static {
    stream::unfold((events, open), |(mut events, mut open)| async move {
        open.slot.as_ref()?;
        let shutdown = open.state.inner.shutdown.clone();
        let next = tokio::select! {
            biased;
            () = shutdown.cancelled() => {
                if open.sent != Some(true) {
                    open.cut(StreamCut::Shutdown, None);
                }
                return None;
            }
            next = async {
                match open.pending.take() {
                    Some(next) => next,
                    None => events.next().await,
                }
            } => next,
        };
        match next {
            Some(Ok(event)) => {
                // The events ready together go out as one chunk: one write and
                // one chunk header for a commit's events, not one of each per event.
                let (batch, pending) = ready_batch(event, &mut events);
                open.pending = pending;
                let (frames, last) = match open.block.as_mut() {
                    Some(block) => {
                        // Framed first: an event held once is encoded in place.
                        let frames = block.frames(&batch).into_bytes();
                        (frames, batch.iter().rev().find(|event| event.seq > block.after).cloned())
                    }
                    None => {
                        let mut frames = Frames::new();
                        for event in &batch {
                            frames.push_event(&event.seq, event);
                        }
                        (frames.into_bytes(), batch.last().cloned())
                    }
                };
                if let Some(last) = last {
                    open.sent = Some(matches!(last.kind, EventKind::RunEnd { .. }));
                }
                Some((frames, (events, open)))
            }
            Some(Err(error)) => {
                open.cut(StreamCut::StoreFailed, Some(&error.to_string()));
                let data = serde_json::json!({"code": "store_error", "message": "reading the run's events failed; reconnect with Last-Event-ID"});
                Some((event_stream::frame(None, STREAM_ERROR, &data), (events, open)))
            }
            None => {
                // A subscription ends after `run_end`; one that ends after other
                // events lost its run's session (a client that reconnects after
                // the end gets nothing, and nothing was cut).
                if open.sent == Some(false) {
                    open.cut(StreamCut::SessionStopped, None);
                }
                None
            }
        }
    })
}

/// The SSE event name of a stream failure (run events never use it).
pub const STREAM_ERROR: &str = "stream_error";

/// The SSE event name of a reasoning block frame (`view=block`).
pub const BLOCK: &str = "block";

/// Where a thread stream resumes: `RUN_ID:SEQ`, the id of the last event received.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ThreadEventsQuery {
    /// Send only events after this one (`RUN_ID:SEQ`, an event's `id`); the
    /// `Last-Event-ID` header wins when both are given.
    pub after: Option<String>,
}

/// Streams the events of every run of a thread, run after run, then live (also
/// of runs started later), until the thread is deleted or the server stops.
#[utoipa::path(
    get,
    path = "/v1/threads/{id}/events",
    tag = "threads",
    params(("id" = String, Path, description = "The thread id."), ThreadEventsQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "The id (`RUN_ID:SEQ`) of the last event received.")),
    responses(
        (status = 200, content_type = "text/event-stream",
            description = "One SSE event per run event: `id` = `RUN_ID:SEQ`, `event` = kind, `data` = the event as JSON (with its `run_id`)."),
        (status = 404, body = super::error::ErrorBody, description = "No such thread for this tenant."),
        (status = 400, body = super::error::ErrorBody, description = "A Last-Event-ID that is not `RUN_ID:SEQ`."),
        (status = 429, body = super::error::ErrorBody, description = "Too many open streams."),
    ),
    security(("bearer" = []))
)]
pub async fn thread_events(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    path: Result<Path<String>, axum::extract::rejection::PathRejection>,
    query: Result<Query<ThreadEventsQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Path(id) = path?;
    let thread = super::threads::owned_thread(&state, &tenant, &id).await?;
    let Query(query) = query?;
    let resume =
        headers.get("last-event-id").map(|value| value.to_str().unwrap_or_default().to_owned()).or(query.after);
    let after = match resume.as_deref() {
        Some(text) => Some(thread_cursor(text).ok_or_else(|| {
            ApiError::invalid("Last-Event-ID / after must be the id (RUN_ID:SEQ) of an event of this thread")
        })?),
        None => None,
    };
    let Some(slot) = state.inner.streams.open(&tenant) else {
        return Err(ApiError::new(StatusCode::TOO_MANY_REQUESTS, "too_many_streams", "too many open event streams")
            .retry_after(state.inner.config.retry_after));
    };
    let events = state.inner.runtime.subscribe_thread(thread.thread_id, after);
    let keep_alive = state.inner.timing.sse_keep_alive;
    let shutdown = state.inner.shutdown.clone();
    let frames = stream::unfold((events, Some(slot)), move |(mut events, slot)| {
        let shutdown = shutdown.clone();
        async move {
            slot.as_ref()?;
            let next = tokio::select! {
                biased;
                () = shutdown.cancelled() => return None,
                next = events.next() => next?,
            };
            Some(match next {
                Ok(event) => {
                    let id = format_args!("{}:{}", event.run_id, event.seq);
                    (event_stream::event_frame(&id, &event), (events, slot))
                }
                Err(_) => {
                    let data = serde_json::json!({"code": "store_error", "message": "reading the thread's events failed; reconnect with Last-Event-ID"});
                    (event_stream::frame(None, STREAM_ERROR, &data), (events, None))
                }
            })
        }
    });
    Ok(event_stream::response(frames, keep_alive))
}

/// A thread event's id (`RUN_ID:SEQ`) as a run and a seq.
fn thread_cursor(text: &str) -> Option<(RunId, u64)> {
    let (run, seq) = text.trim().split_once(':')?;
    let seq: u64 = seq.parse().ok()?;
    i64::try_from(seq).ok()?;
    Some((run.parse().ok()?, seq))
}
