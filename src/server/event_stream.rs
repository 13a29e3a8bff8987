//! Server-Sent Events on the wire: each event encoded once, straight into the
//! bytes sent (its JSON written into the frame, no intermediate string), and the
//! response body that sends frames as they come with a keep-alive comment
//! (`:`) whenever none went out for the keep-alive interval.

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt::Display;
use std::io::Write as _;
use std::pin::Pin;
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde::Serialize;
use tokio::time::{Instant, Sleep};
use troupe_actors::protocol::RunEvent;
use troupe_actors::store::StoreError;

/// Bytes reserved for a frame: most events are 100 to 500 bytes of JSON.
const FRAME_CAPACITY: usize = 512;

/// SSE frames being written into one buffer (one or more events).
#[derive(Default)]
pub struct Frames(Vec<u8>);

impl Frames {
    pub fn new() -> Self {
        Self(Vec::with_capacity(FRAME_CAPACITY))
    }

    /// Appends an event: `id: ID` (if any), `event: NAME` and
    /// `data` as one line of JSON. JSON has no raw line breaks (it escapes them),
    /// so the data is one `data:` field, as the event's JSON, byte for byte.
    pub fn push(&mut self, id: Option<&dyn Display>, name: &str, data: &impl Serialize) {
        let start = self.0.len();
        if let Some(id) = id {
            let _ = writeln!(self.0, "id: {id}");
        }
        self.0.extend_from_slice(b"event: ");
        self.0.extend_from_slice(name.as_bytes());
        self.0.extend_from_slice(b"\ndata: ");
        if let Err(error) = serde_json::to_writer(&mut self.0, data) {
            // Events are plain data; this cannot fail, but a frame must be whole.
            self.0.truncate(start);
            let data = serde_json::json!({"code": "encode_error", "message": error.to_string()});
            self.0.extend_from_slice(b"event: stream_error\ndata: ");
            let _ = write!(self.0, "{data}");
        }
        self.0.extend_from_slice(b"\n\n");
    }

    /// Appends a run event with `id`: its kind as the name, and its JSON (written
    /// by hand, as serde writes it) as the data: copied from its commit's text if
    /// the store still keeps it (`store::recent`), else encoded once for every
    /// stream that sends this event ([`shared_json`]).
    pub fn push_event(&mut self, id: &dyn Display, event: &Arc<RunEvent>) {
        let start = self.0.len();
        let _ = write!(self.0, "id: {id}\nevent: {}\ndata: ", event.kind.name());
        #[cfg(debug_assertions)]
        let json_at = self.0.len();
        let encoded = if crate::store::recent_event_json(&mut self.0, event) {
            // Debug builds (the tests) check every copy against a fresh encoding.
            #[cfg(debug_assertions)]
            {
                let mut fresh = Vec::new();
                let _ = crate::store::event_json(&mut fresh, event);
                assert_eq!(
                    String::from_utf8_lossy(&self.0[json_at..]),
                    String::from_utf8_lossy(&fresh),
                    "an event's kept text is its JSON"
                );
            }
            Ok(())
        } else {
            match shared_json(event) {
                Some(json) => json.map(|json| self.0.extend_from_slice(&json)),
                None => crate::store::event_json(&mut self.0, event),
            }
        };
        if encoded.is_err() {
            // The generic path, which says why.
            self.0.truncate(start);
            self.push(Some(id), event.kind.name(), event);
            return;
        }
        self.0.extend_from_slice(b"\n\n");
    }

    pub fn into_bytes(self) -> Bytes {
        Bytes::from(self.0)
    }
}

/// One frame of one event (see [`Frames::push`]).
pub fn frame(id: Option<&dyn Display>, name: &str, data: &impl Serialize) -> Bytes {
    let mut frames = Frames::new();
    frames.push(id, name, data);
    frames.into_bytes()
}

/// One frame of one run event (see [`Frames::push_event`]).
pub fn event_frame(id: &dyn Display, event: &Arc<RunEvent>) -> Bytes {
    let mut frames = Frames::new();
    frames.push_event(id, event);
    frames.into_bytes()
}

/// The JSON of events that more than one stream sends (the subscribers of one
/// run, a run's stream and its thread's), by the address of the event they share:
/// the first stream encodes it, the others copy it. An entry holds its event
/// weakly, which keeps the address from being reused while the entry lives;
/// entries of events no stream holds any more are swept as the table grows.
struct SharedJson {
    entries: HashMap<usize, (Weak<RunEvent>, Arc<[u8]>)>,
    /// The size at which the next sweep runs.
    sweep_at: usize,
}

static SHARED_JSON: LazyLock<Mutex<SharedJson>> =
    LazyLock::new(|| Mutex::new(SharedJson { entries: HashMap::new(), sweep_at: 64 }));

/// The JSON of `event` if another holder may send it too, encoded once for all;
/// `None` for an event only this stream holds (most: a live event reaches one
/// subscriber, and the channel lets go of it once every subscriber has it), which
/// costs no lock.
fn shared_json(event: &Arc<RunEvent>) -> Option<Result<Arc<[u8]>, StoreError>> {
    if Arc::strong_count(event) == 1 && Arc::weak_count(event) == 0 {
        return None;
    }
    let key = Arc::as_ptr(event) as usize;
    let lock = || SHARED_JSON.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, json)) = lock().entries.get(&key) {
        return Some(Ok(json.clone()));
    }
    let mut json = Vec::with_capacity(FRAME_CAPACITY);
    if let Err(error) = crate::store::event_json(&mut json, event) {
        return Some(Err(error));
    }
    let json: Arc<[u8]> = json.into();
    let mut shared = lock();
    if shared.entries.len() >= shared.sweep_at {
        shared.entries.retain(|_, (held, _)| held.strong_count() > 0);
        shared.sweep_at = (shared.entries.len() * 2).max(64);
    }
    shared.entries.insert(key, (Arc::downgrade(event), json.clone()));
    Some(Ok(json))
}

/// The `text/event-stream` response of `frames`, with a keep-alive comment
/// after each `interval` without a frame.
pub fn response(frames: impl Stream<Item = Bytes> + Send + 'static, interval: Duration) -> Response {
    let body = KeepAlive {
        frames: frames.boxed(),
        timer: Box::pin(tokio::time::sleep(interval)),
        interval,
        last: Instant::now(),
    };
    ([(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")], Body::from_stream(body))
        .into_response()
}

/// Frames, and a keep-alive comment when none went out for `interval`. The time
/// of the last frame is noted as it goes; the timer is moved only when it fires
/// (not at every frame).
struct KeepAlive {
    frames: futures::stream::BoxStream<'static, Bytes>,
    timer: Pin<Box<Sleep>>,
    interval: Duration,
    last: Instant,
}

impl Stream for KeepAlive {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.frames.poll_next_unpin(cx) {
            Poll::Ready(Some(frame)) => {
                self.last = Instant::now();
                return Poll::Ready(Some(Ok(frame)));
            }
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => {}
        }
        loop {
            ready!(self.timer.as_mut().poll(cx));
            let now = Instant::now();
            let due = self.last + self.interval;
            if due <= now {
                self.last = now;
                let next = now + self.interval;
                self.timer.as_mut().reset(next);
                return Poll::Ready(Some(Ok(Bytes::from_static(b":\n\n"))));
            }
            self.timer.as_mut().reset(due);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_id_name_and_one_line_of_json() {
        let bytes = frame(Some(&7u64), "assistant_delta", &serde_json::json!({"text": "two\nlines\r"}));
        assert_eq!(&bytes[..], b"id: 7\nevent: assistant_delta\ndata: {\"text\":\"two\\nlines\\r\"}\n\n");
        let mut frames = Frames::new();
        frames.push(None, "block", &serde_json::json!({"a": 1}));
        frames.push(None, "block", &serde_json::json!({"a": 2}));
        assert_eq!(&frames.into_bytes()[..], b"event: block\ndata: {\"a\":1}\n\nevent: block\ndata: {\"a\":2}\n\n");
    }

    #[test]
    fn a_run_event_frame_carries_the_event_as_serde_writes_it() {
        use troupe_actors::protocol::{EventKind, RunId};
        let event = RunEvent {
            run_id: RunId::new(),
            seq: 3,
            ts: chrono::Utc::now(),
            parent_run_id: Some(RunId::new()),
            kind: EventKind::AssistantDelta { turn: 1, text: "say \"hi\"\n".into(), reasoning: true },
        };
        let json = serde_json::to_string(&event).unwrap();
        let event = Arc::new(event);
        assert_eq!(event_frame(&event.seq, &event), format!("id: 3\nevent: assistant_delta\ndata: {json}\n\n"));
        let id = format_args!("{}:{}", event.run_id, event.seq);
        let thread = event_frame(&id, &event);
        assert!(thread.starts_with(format!("id: {}:3\n", event.run_id).as_bytes()));
    }

    #[test]
    fn an_event_two_streams_send_is_encoded_once() {
        use troupe_actors::protocol::{EventKind, RunId};
        let event = Arc::new(RunEvent {
            run_id: RunId::new(),
            seq: 1,
            ts: chrono::Utc::now(),
            parent_run_id: None,
            kind: EventKind::TurnStart { turn: 1 },
        });
        assert!(shared_json(&event).is_none(), "an event one stream holds is encoded in place");
        let other_stream = event.clone();
        let first = shared_json(&event).unwrap().unwrap();
        let second = shared_json(&other_stream).unwrap().unwrap();
        assert!(Arc::ptr_eq(&first, &second), "the second stream copies the first's encoding");
        assert_eq!(&first[..], serde_json::to_string(&*event).unwrap().as_bytes());
        drop(other_stream);
        let late = shared_json(&event).unwrap().unwrap();
        assert!(Arc::ptr_eq(&first, &late), "still shared while the event is held");
        let frame = event_frame(&1u64, &event);
        assert!(frame.ends_with(&[&first[..], b"\n\n"].concat()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_keep_alive_goes_out_only_after_an_interval_without_frames() {
        let (sender, receiver) = futures::channel::mpsc::unbounded::<Bytes>();
        let interval = Duration::from_secs(15);
        let mut body = KeepAlive {
            frames: receiver.boxed(),
            timer: Box::pin(tokio::time::sleep(interval)),
            interval,
            last: Instant::now(),
        };
        tokio::time::advance(Duration::from_secs(10)).await;
        sender.unbounded_send(Bytes::from_static(b"event: a\n\n")).unwrap();
        assert_eq!(body.next().await.unwrap().unwrap(), Bytes::from_static(b"event: a\n\n"));
        // 15 s after the start, but 5 s after the frame: nothing yet.
        let start = Instant::now();
        assert_eq!(body.next().await.unwrap().unwrap(), Bytes::from_static(b":\n\n"));
        assert_eq!(Instant::now() - start, interval, "the keep-alive came an interval after the frame");
        assert_eq!(body.next().await.unwrap().unwrap(), Bytes::from_static(b":\n\n"));
        drop(sender);
        assert!(body.next().await.is_none(), "the body ends with its frames");
    }
}
