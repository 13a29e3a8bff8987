//! The JSON of the events this process committed last, for the event streams
//! that send them: a commit's events are encoded once for their `run_events`
//! row, and a stream that sends one of them right after the commit copies that
//! text (adding the run id the row leaves out) instead of encoding the event
//! again.
//!
//! Only committed events are kept, and a committed event never changes (a seq is
//! written once per run), so the text kept for a run and seq is always that
//! event's. At most [`CAPACITY`] events are kept, the oldest dropped first; a
//! stream that comes later, or an event from elsewhere (read back from the store,
//! or never stored), is encoded as before.

use std::collections::{HashMap, VecDeque};
use std::sync::{LazyLock, Mutex};

use troupe_actors::protocol::{RunEvent, RunId};

use crate::store::encode::Span;
use crate::store::sql::Text;

/// Events kept: streams read an event within moments of its commit, so this
/// covers hundreds of runs in flight, and holds a few MiB at most.
const CAPACITY: usize = 4096;

#[derive(Default)]
struct Recent {
    events: HashMap<(RunId, u64), (Text, Span), foldhash::fast::RandomState>,
    order: VecDeque<(RunId, u64)>,
}

static RECENT: LazyLock<Mutex<Recent>> = LazyLock::new(Mutex::default);

fn lock() -> std::sync::MutexGuard<'static, Recent> {
    RECENT.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Keeps the events `first..` of run `run_id`, committed as `body` (a batch, each
/// event's object at its span).
pub(super) fn remember(run_id: RunId, first: u64, body: &Text, spans: &[Span]) {
    let mut recent = lock();
    for (seq, span) in (first..).zip(spans) {
        if recent.events.insert((run_id, seq), (body.clone(), *span)).is_none() {
            recent.order.push_back((run_id, seq));
        }
    }
    while recent.order.len() > CAPACITY {
        if let Some(oldest) = recent.order.pop_front() {
            recent.events.remove(&oldest);
        }
    }
}

/// Appends `event`'s JSON as [`super::event_json`] writes it, from the text its
/// commit wrote, if that is still kept; `false` (and nothing written) if not.
pub(crate) fn write_json(out: &mut Vec<u8>, event: &RunEvent) -> bool {
    let recent = lock();
    let Some((body, span)) = recent.events.get(&(event.run_id, event.seq)) else {
        return false;
    };
    // The stored object starts `{"seq":`; the stream's starts with the run.
    let Some(rest) = body.get(span.start + 1..span.end) else {
        return false;
    };
    out.extend_from_slice(b"{\"run_id\":\"");
    out.extend_from_slice(event.run_id.0.hyphenated().encode_lower(&mut uuid::Uuid::encode_buffer()).as_bytes());
    out.extend_from_slice(b"\",");
    out.extend_from_slice(rest.as_bytes());
    true
}
