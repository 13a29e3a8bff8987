//! The text the store writes for times and events, formatted by hand where the
//! generic path was a measurable share of a commit's cost (times through
//! [`troupe_actors::rfc3339`]). The output is byte for byte what the generic path
//! writes (the tests compare them), but for the run id that stored events leave
//! out ([`read_batch`] puts it back), so stored rows read back unchanged.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use troupe_actors::protocol::{EventKind, RunEvent, RunId};
use troupe_actors::rfc3339::{Fraction, push_time};
use troupe_actors::store::StoreError;

use crate::store::sql::{Text, parse};

/// A stored time: RFC 3339 in UTC with a fixed width (microseconds, `Z`), so that
/// comparing the text compares the times (retention relies on it).
pub(super) fn stamp(time: DateTime<Utc>) -> String {
    let mut out = String::with_capacity(27);
    push_time(&mut out, time, Fraction::Micros);
    out
}

/// `value` as JSON into a buffer sized for a typical body, so that it is not
/// grown (reallocated and copied) two or three times as `serde_json::to_string`'s
/// is.
pub(super) fn json<T: Serialize + ?Sized>(value: &T) -> Result<String, StoreError> {
    let mut body = Vec::with_capacity(BODY_CAPACITY);
    serde_json::to_writer(&mut body, value).map_err(cannot_encode)?;
    utf8(body)
}

/// Bytes to reserve for a JSON body: most bodies the store writes are 100 to 500.
const BODY_CAPACITY: usize = 512;

fn cannot_encode(error: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(format!("cannot encode: {error}"))
}

/// serde_json writes UTF-8 only; checking it costs less than growing the buffer.
fn utf8(body: Vec<u8>) -> Result<String, StoreError> {
    String::from_utf8(body).map_err(cannot_encode)
}

/// The events of one commit as one JSON array (what a `run_events` row holds):
/// each as `serde_json::to_string(event)` writes it but without its `run_id`,
/// which is the row's own (see [`push_event`]; [`read_batch`] puts it back).
///
/// `embedded` gives, for a `tool_metric`, `plan_updated` or `review` event, the
/// JSON of its record, plan or review if the commit's writes already hold it (the
/// same value, serialized for its own row), which is then copied instead of
/// serialized again.
#[cfg(test)]
pub(super) fn event_batch<'a>(
    events: &[RunEvent],
    embedded: impl Fn(&EventKind) -> Option<&'a str>,
) -> Result<String, StoreError> {
    batch_with_spans(events, embedded).map(|(body, _)| body)
}

/// [`event_batch`], and where each event's object lies in it (start and end).
pub(super) fn batch_with_spans<'a>(
    events: &[RunEvent],
    embedded: impl Fn(&EventKind) -> Option<&'a str>,
) -> Result<(String, Vec<Span>), StoreError> {
    let mut body = Vec::with_capacity(BODY_CAPACITY * events.len().max(1));
    let mut spans = Vec::with_capacity(events.len());
    body.push(b'[');
    for (index, event) in events.iter().enumerate() {
        if index > 0 {
            body.push(b',');
        }
        let start = body.len();
        push_event(&mut body, event, false, &embedded)?;
        spans.push(Span { start, end: body.len() });
    }
    body.push(b']');
    Ok((utf8(body)?, spans))
}

/// Where one event's JSON object lies in a batch's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub start: usize,
    pub end: usize,
}

/// Appends `event` as JSON exactly as `serde_json::to_writer` writes it (what an
/// event stream sends), its ids and time written by hand.
pub(crate) fn event_json(out: &mut Vec<u8>, event: &RunEvent) -> Result<(), StoreError> {
    push_event(out, event, true, |_| None)
}

/// Appends the start of an event's JSON object that names its run,
/// `{"run_id":"ID",` (the members that follow it start with `"seq"`).
pub(super) fn open_with_run(out: &mut Vec<u8>, run_id: RunId) {
    out.extend_from_slice(b"{\"run_id\":\"");
    out.extend_from_slice(run_id.0.hyphenated().encode_lower(&mut uuid::Uuid::encode_buffer()).as_bytes());
    out.extend_from_slice(b"\",");
}

/// Appends `event` as JSON, as `serde_json::to_string(event)` writes it, without
/// its `run_id` member unless `with_run`, with its ids and time written by hand.
/// `RunEvent` flattens
/// its kind after its own fields, so its JSON is those fields followed by the
/// members of the kind's own JSON object (internally tagged, so never empty): the
/// kind is written after them and its opening brace becomes the separating comma.
fn push_event<'a>(
    body: &mut Vec<u8>,
    event: &RunEvent,
    with_run: bool,
    embedded: impl Fn(&EventKind) -> Option<&'a str>,
) -> Result<(), StoreError> {
    let mut head = String::with_capacity(144);
    if with_run {
        open_with_run(body, event.run_id);
    } else {
        head.push('{');
    }
    head.push_str("\"seq\":");
    head.push_str(itoa(event.seq, &mut [0; 20]));
    head.push_str(",\"ts\":\"");
    push_time(&mut head, event.ts, Fraction::Auto);
    head.push('"');
    if let Some(parent) = event.parent_run_id {
        head.push_str(",\"parent_run_id\":\"");
        head.push_str(parent.0.hyphenated().encode_lower(&mut uuid::Uuid::encode_buffer()));
        head.push('"');
    }
    body.extend_from_slice(head.as_bytes());
    // The members serde writes for these variants: the tag, then the fields in the
    // order they are declared.
    let lead: Option<&[u8]> = match &event.kind {
        EventKind::ToolMetric { .. } => Some(b",\"kind\":\"tool_metric\",\"record\":"),
        EventKind::PlanUpdated { .. } => Some(b",\"kind\":\"plan_updated\",\"plan\":"),
        EventKind::Review { .. } => Some(b",\"kind\":\"review\",\"turn\":"),
        _ => None,
    };
    if let Some(lead) = lead
        && let Some(json) = embedded(&event.kind)
    {
        body.extend_from_slice(lead);
        if let EventKind::Review { turn, .. } = &event.kind {
            body.extend_from_slice(itoa(u64::from(*turn), &mut [0; 20]).as_bytes());
            body.extend_from_slice(b",\"review\":");
        }
        body.extend_from_slice(json.as_bytes());
        body.push(b'}');
        return Ok(());
    }
    let kind_at = body.len();
    serde_json::to_writer(&mut *body, &event.kind).map_err(cannot_encode)?;
    match body.get(kind_at..kind_at + 2) {
        Some([b'{', b'"']) => body[kind_at] = b',',
        _ => return Err(cannot_encode(format_args!("the {} event is not a JSON object", event.kind.name()))),
    }
    Ok(())
}

/// An event as a `run_events` row holds it: without its run (schema v6), or with
/// it (rows written before; the member is then ignored).
#[derive(Deserialize)]
struct StoredEvent {
    seq: u64,
    ts: DateTime<Utc>,
    #[serde(default)]
    parent_run_id: Option<RunId>,
    #[serde(flatten)]
    kind: EventKind,
}

/// The events of a `run_events` row of run `run_id`.
pub(super) fn read_batch(body: &str, run_id: RunId) -> Result<Vec<RunEvent>, StoreError> {
    let events: Vec<StoredEvent> = parse(body)?;
    Ok(events
        .into_iter()
        .map(|StoredEvent { seq, ts, parent_run_id, kind }| RunEvent { run_id, seq, ts, parent_run_id, kind })
        .collect())
}

/// A run id as the store's columns hold it (hyphenated, lowercase), without going
/// through `fmt`.
pub(super) fn run_id(run_id: RunId) -> Text {
    Text::from(&*run_id.0.hyphenated().encode_lower(&mut uuid::Uuid::encode_buffer()))
}

/// `value` in decimal, written into the end of `buffer`.
fn itoa(mut value: u64, buffer: &mut [u8; 20]) -> &str {
    let mut start = buffer.len();
    loop {
        start -= 1;
        buffer[start] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    // Only ASCII digits were written.
    std::str::from_utf8(&buffer[start..]).unwrap_or("0")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use chrono::{NaiveDate, TimeZone};
    use troupe_actors::protocol::{EventKind, RunStatus};

    use super::*;

    /// Times of each fraction width (every width and odd year is covered by
    /// `troupe_actors::rfc3339`'s own tests; these check the event's use of it).
    fn times() -> Vec<DateTime<Utc>> {
        let date = NaiveDate::from_ymd_opt(2016, 12, 31).unwrap();
        let mut times = vec![Utc::now(), DateTime::<Utc>::UNIX_EPOCH];
        for nano in [0, 7_000, 120_000_000, 999_999_999] {
            times.push(Utc.from_utc_datetime(&date.and_hms_nano_opt(23, 59, 59, nano).unwrap()));
        }
        times
    }

    /// serde's JSON of `events` without their runs (object keys keep their order:
    /// the run is the first member, which is cut out of the text).
    fn without_runs(events: &[RunEvent]) -> String {
        let mut json = serde_json::to_string(events).unwrap();
        for event in events {
            json = json.replacen(&format!("\"run_id\":\"{}\",", event.run_id), "", 1);
        }
        json
    }

    #[test]
    fn events_are_written_as_serde_writes_them_without_their_run() {
        let parents = [None, Some(RunId::new())];
        let kinds = [
            EventKind::TurnStart { turn: 1 },
            EventKind::RunStarted { agent: "a\"gent".into(), input: "line\nbreak ✓".into() },
            EventKind::RunEnd { status: RunStatus::Succeeded, reason: None },
            EventKind::InputReceived { text: String::new() },
        ];
        let mut all = Vec::new();
        for (index, time) in times().into_iter().enumerate() {
            for parent_run_id in parents {
                for kind in &kinds {
                    let seq = [0, 1, 9, 10, 12_345, u64::MAX][index % 6];
                    let event = RunEvent { run_id: RunId::new(), seq, ts: time, parent_run_id, kind: kind.clone() };
                    let one = std::slice::from_ref(&event);
                    let written = event_batch(one, |_| None).unwrap();
                    assert_eq!(written, without_runs(one));
                    let mut whole = Vec::new();
                    event_json(&mut whole, &event).unwrap();
                    assert_eq!(String::from_utf8(whole).unwrap(), serde_json::to_string(&event).unwrap());
                    assert_eq!(read_batch(&written, event.run_id).unwrap(), one, "read back with its run");
                    assert_eq!(*run_id(event.run_id), *event.run_id.to_string());
                    all.push(event);
                }
            }
        }
        assert_eq!(event_batch(&all, |_| None).unwrap(), without_runs(&all));
        assert_eq!(event_batch(&[], |_| None).unwrap(), "[]");
    }

    /// Rows written before schema v6 hold each event whole, run included.
    #[test]
    fn events_written_with_their_run_read_back_unchanged() {
        let run = RunId::new();
        let events: Vec<RunEvent> = times()
            .into_iter()
            .zip(1..)
            .map(|(ts, seq)| RunEvent {
                run_id: run,
                seq,
                ts,
                parent_run_id: None,
                kind: EventKind::TurnEnd { turn: 2 },
            })
            .collect();
        assert_eq!(read_batch(&serde_json::to_string(&events).unwrap(), run).unwrap(), events);
        assert!(read_batch("[{\"seq\":1}]", run).is_err(), "an event without a kind is refused");
    }
}
