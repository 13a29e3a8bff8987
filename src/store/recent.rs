//! The JSON of the events this process committed last, for the event streams
//! that send them: a commit's events are encoded once for their `run_events`
//! row, and a stream that sends one of them right after the commit copies that
//! text (adding the run id the row leaves out) instead of encoding the event
//! again.
//!
//! Only committed events are kept, and a committed event never changes (a seq is
//! written once per run); an entry also names its event's time, which a stream's
//! event must match. Whole commits are kept, the oldest dropped first, up to
//! [`MAX_EVENTS`] events and [`MAX_BYTES`] of text; a stream that comes later, or
//! an event from elsewhere (read back from the store, or never stored), is
//! encoded as before.

use std::collections::{HashMap, VecDeque};
use std::sync::{LazyLock, Mutex};

use chrono::{DateTime, Utc};
use troupe_actors::protocol::{RunEvent, RunId};

use crate::store::encode::{Span, open_with_run};
use crate::store::sql::Text;

/// Events kept at most: streams read an event within moments of its commit, so
/// this covers hundreds of runs in flight.
const MAX_EVENTS: usize = 4096;
/// Text kept at most, in bytes (a commit's whole text counts while any of its
/// events is kept); a commit larger than a quarter of it is not kept.
const MAX_BYTES: usize = 2 << 20;

struct Entry {
    body: Text,
    span: Span,
    ts: DateTime<Utc>,
}

/// A commit kept: its run, its first seq, how many events and bytes.
struct Kept {
    run_id: RunId,
    first: u64,
    events: u64,
    bytes: usize,
}

#[derive(Default)]
struct Recent {
    events: HashMap<(RunId, u64), Entry, foldhash::fast::RandomState>,
    order: VecDeque<Kept>,
    bytes: usize,
}

static RECENT: LazyLock<Mutex<Recent>> = LazyLock::new(Mutex::default);

fn lock() -> std::sync::MutexGuard<'static, Recent> {
    RECENT.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Keeps `events` of run `run_id`, committed as `body` (a batch, each event's
/// object at its span, in order).
pub(super) fn remember(run_id: RunId, events: &[RunEvent], body: &Text, spans: &[Span]) {
    lock().remember(run_id, events, body, spans);
}

/// Appends `event`'s JSON as [`super::event_json`] writes it, from the text its
/// commit wrote, if that is still kept; `false` (and nothing written) if not.
pub(crate) fn write_json(out: &mut Vec<u8>, event: &RunEvent) -> bool {
    lock().write_json(out, event)
}

impl Recent {
    fn remember(&mut self, run_id: RunId, events: &[RunEvent], body: &Text, spans: &[Span]) {
        let (Some(first), true) = (events.first(), body.len() <= MAX_BYTES / 4) else {
            return;
        };
        for (event, span) in events.iter().zip(spans) {
            let entry = Entry { body: body.clone(), span: *span, ts: event.ts };
            self.events.insert((run_id, event.seq), entry);
        }
        self.order.push_back(Kept { run_id, first: first.seq, events: events.len() as u64, bytes: body.len() });
        self.bytes += body.len();
        while self.events.len() > MAX_EVENTS || self.bytes > MAX_BYTES {
            let Some(oldest) = self.order.pop_front() else { break };
            self.bytes -= oldest.bytes;
            for seq in oldest.first..oldest.first + oldest.events {
                self.events.remove(&(oldest.run_id, seq));
            }
        }
    }

    fn write_json(&self, out: &mut Vec<u8>, event: &RunEvent) -> bool {
        let key = (event.run_id, event.seq);
        let Some(entry) = self.events.get(&key).filter(|entry| entry.ts == event.ts) else {
            return false;
        };
        // The stored object starts `{"seq":`; the stream's starts with the run.
        let Some(rest) = entry.body.get(entry.span.start + 1..entry.span.end) else {
            return false;
        };
        open_with_run(out, event.run_id);
        out.extend_from_slice(rest.as_bytes());
        true
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use troupe_actors::protocol::EventKind;

    use super::*;

    fn event(run_id: RunId, seq: u64) -> RunEvent {
        RunEvent { run_id, seq, ts: Utc::now(), parent_run_id: None, kind: EventKind::TurnStart { turn: 1 } }
    }

    /// One event's commit, kept in `recent`.
    fn keep(recent: &mut Recent, event: &RunEvent, padding: usize) {
        let json = serde_json::to_string(event).unwrap();
        let stored = json.replacen(&format!("\"run_id\":\"{}\",", event.run_id), "", 1);
        let body: Text = format!("[{stored}{}]", " ".repeat(padding)).into();
        let span = Span { start: 1, end: 1 + stored.len() };
        recent.remember(event.run_id, std::slice::from_ref(event), &body, &[span]);
    }

    #[test]
    fn an_event_is_sent_as_kept_only_if_it_is_the_one_committed() {
        let mut recent = Recent::default();
        let kept = event(RunId::new(), 3);
        keep(&mut recent, &kept, 0);
        let mut sent = Vec::new();
        assert!(recent.write_json(&mut sent, &kept));
        assert_eq!(String::from_utf8(sent).unwrap(), serde_json::to_string(&kept).unwrap());
        let other_time = RunEvent { ts: kept.ts + chrono::Duration::microseconds(1), ..kept.clone() };
        assert!(!recent.write_json(&mut Vec::new(), &other_time), "same run and seq, another event");
        assert!(!recent.write_json(&mut Vec::new(), &event(kept.run_id, 4)), "never committed");
    }

    #[test]
    fn the_oldest_commits_go_first_and_a_large_commit_is_not_kept() {
        let mut recent = Recent::default();
        let first = event(RunId::new(), 1);
        keep(&mut recent, &first, 0);
        let large = event(RunId::new(), 1);
        keep(&mut recent, &large, MAX_BYTES / 4);
        assert!(!recent.write_json(&mut Vec::new(), &large), "larger than a quarter of the budget");
        for _ in 0..7 {
            keep(&mut recent, &event(RunId::new(), 1), MAX_BYTES / 8);
        }
        assert!(recent.write_json(&mut Vec::new(), &first), "kept while within the budget");
        keep(&mut recent, &event(RunId::new(), 1), MAX_BYTES / 8);
        assert!(!recent.write_json(&mut Vec::new(), &first), "dropped for a newer commit");
        assert!(recent.bytes <= MAX_BYTES);
        for _ in 0..MAX_EVENTS {
            keep(&mut recent, &event(RunId::new(), 1), 0);
        }
        assert_eq!(recent.events.len(), MAX_EVENTS, "at most this many events");
        assert_eq!(recent.order.len(), MAX_EVENTS);
    }
}
