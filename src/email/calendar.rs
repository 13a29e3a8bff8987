//! The mailbox owner's calendar and address book, kept in the mailbox's database
//! (tables `calendar_events` and `contacts`, see `schema.sql`): their types and
//! the JSON lists they are imported from. The built-in samples
//! (`config/email/sample-calendar.json`, `config/email/sample-contacts.json`)
//! go with the sample mailbox: its people, and a week of events dated by day
//! offsets from the import day, as the sample mailbox's emails are.
//!
//! Event times are local wall-clock time with no zone, `YYYY-MM-DDTHH:MM`, as a
//! calendar shows them; so their text order is their time order.

use chrono::{Duration, NaiveDate, NaiveDateTime, NaiveTime};
use serde::{Deserialize, Serialize};

/// The sample address book: the sample mailbox's people.
pub const SAMPLE_CONTACTS: &str = include_str!("../../config/email/sample-contacts.json");

/// The sample calendar (a JSON list with day offsets), built in.
pub const SAMPLE_CALENDAR: &str = include_str!("../../config/email/sample-calendar.json");

/// How event times are written and stored: local time, to the minute.
pub const DATE_TIME_FORMAT: &str = "%Y-%m-%dT%H:%M";

/// Why a JSON list of contacts or events is unusable.
#[derive(Debug, thiserror::Error)]
pub enum RecordsError {
    /// Not a JSON list of such records.
    #[error("not a JSON list of {kind}s: {message}")]
    Json {
        /// `contact` or `calendar event`.
        kind: &'static str,
        /// What the JSON parser said.
        message: String,
    },
    /// A record of the list is unusable.
    #[error("{kind} {index}: {message}")]
    Record {
        /// `contact` or `calendar event`.
        kind: &'static str,
        /// Its position in the list (0-based).
        index: usize,
        /// What is wrong.
        message: String,
    },
}

/// A person the owner knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Contact {
    /// The address, lower-case: the contact's key.
    pub email: String,
    /// The full name.
    pub name: String,
    /// The company they are with, if any.
    pub company: String,
    /// What they are to the owner: `customer`, `supplier`, `colleague`, `family`…
    pub relation: String,
    /// A phone number, as written.
    pub phone: String,
    /// Anything else worth knowing.
    pub notes: String,
}

/// An event of the owner's calendar.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CalendarEvent {
    /// Its id.
    pub id: String,
    /// What it is.
    pub title: String,
    /// When it starts, local time.
    pub starts: NaiveDateTime,
    /// When it ends, local time (after it starts).
    pub ends: NaiveDateTime,
    /// Where, if said.
    pub location: String,
    /// Who else is in it: `Name <address>`, comma-separated.
    pub attendees: String,
}

impl CalendarEvent {
    /// Whether it overlaps the span from `from` to `to` (touching ends do not).
    pub fn overlaps(&self, from: NaiveDateTime, to: NaiveDateTime) -> bool {
        self.starts < to && self.ends > from
    }
}

/// One contact of a JSON list.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonContact {
    /// An address, or `Name <address>`.
    email: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    company: String,
    #[serde(default)]
    relation: String,
    #[serde(default)]
    phone: String,
    #[serde(default)]
    notes: String,
}

/// One event of a JSON list: dated by `day_offset` with `start` and `end`
/// (`HH:MM`), or by `starts` and `ends` (`YYYY-MM-DDTHH:MM`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEvent {
    id: String,
    title: String,
    /// Days from the import day (0 today, 1 tomorrow).
    day_offset: Option<i64>,
    /// `HH:MM`, with `day_offset`.
    start: Option<String>,
    /// `HH:MM`, with `day_offset`.
    end: Option<String>,
    /// `YYYY-MM-DDTHH:MM`, instead of a day offset.
    starts: Option<String>,
    /// `YYYY-MM-DDTHH:MM`, instead of a day offset.
    ends: Option<String>,
    #[serde(default)]
    location: String,
    /// `Name <address>` each.
    #[serde(default)]
    attendees: Vec<String>,
}

/// The address in `text`: `Name <address>` or a bare address, lower-case;
/// `None` when it names no address.
pub fn address_of(text: &str) -> Option<String> {
    let text = text.trim();
    let inner = match (text.rfind('<'), text.rfind('>')) {
        (Some(open), Some(close)) if open < close => &text[open + 1..close],
        _ => text,
    };
    let address = inner.trim();
    let well_formed = address
        .split_once('@')
        .is_some_and(|(local, domain)| !local.is_empty() && !domain.is_empty() && !domain.contains('@'))
        && !address.contains(char::is_whitespace);
    well_formed.then(|| address.to_lowercase())
}

/// Parses a JSON list of contacts.
pub fn parse_contacts(text: &str) -> Result<Vec<Contact>, RecordsError> {
    const KIND: &str = "contact";
    let list: Vec<JsonContact> =
        serde_json::from_str(text).map_err(|error| RecordsError::Json { kind: KIND, message: error.to_string() })?;
    list.into_iter()
        .enumerate()
        .map(|(index, contact)| {
            let email = address_of(&contact.email).ok_or_else(|| RecordsError::Record {
                kind: KIND,
                index,
                message: format!("{:?} is not an email address", contact.email),
            })?;
            Ok(Contact {
                email,
                name: contact.name.trim().to_owned(),
                company: contact.company.trim().to_owned(),
                relation: contact.relation.trim().to_lowercase(),
                phone: contact.phone.trim().to_owned(),
                notes: contact.notes.trim().to_owned(),
            })
        })
        .collect()
}

/// Parses a JSON list of calendar events; `today` anchors day offsets.
pub fn parse_calendar(text: &str, today: NaiveDate) -> Result<Vec<CalendarEvent>, RecordsError> {
    const KIND: &str = "calendar event";
    let list: Vec<JsonEvent> =
        serde_json::from_str(text).map_err(|error| RecordsError::Json { kind: KIND, message: error.to_string() })?;
    list.into_iter()
        .enumerate()
        .map(|(index, event)| {
            json_event(event, today).map_err(|message| RecordsError::Record { kind: KIND, index, message })
        })
        .collect()
}

fn json_event(event: JsonEvent, today: NaiveDate) -> Result<CalendarEvent, String> {
    let (starts, ends) = match (event.day_offset, event.start, event.end, event.starts, event.ends) {
        (Some(offset), Some(start), Some(end), None, None) => {
            let day = today + Duration::days(offset);
            (day.and_time(time(&start)?), day.and_time(time(&end)?))
        }
        (None, None, None, Some(starts), Some(ends)) => (date_time(&starts)?, date_time(&ends)?),
        _ => return Err("give day_offset with start and end (HH:MM), or starts and ends (YYYY-MM-DDTHH:MM)".to_owned()),
    };
    if ends <= starts {
        return Err(format!("it ends ({ends}) before it starts ({starts})"));
    }
    let id = event.id.trim().to_owned();
    if id.is_empty() {
        return Err("the id is empty".to_owned());
    }
    Ok(CalendarEvent {
        id,
        title: event.title.trim().to_owned(),
        starts,
        ends,
        location: event.location.trim().to_owned(),
        attendees: event.attendees.iter().map(|one| one.trim()).collect::<Vec<_>>().join(", "),
    })
}

/// `HH:MM`.
fn time(text: &str) -> Result<NaiveTime, String> {
    NaiveTime::parse_from_str(text.trim(), "%H:%M").map_err(|_| format!("time {text:?} is not HH:MM"))
}

/// `YYYY-MM-DDTHH:MM`.
pub fn date_time(text: &str) -> Result<NaiveDateTime, String> {
    NaiveDateTime::parse_from_str(text.trim(), DATE_TIME_FORMAT)
        .map_err(|_| format!("{text:?} is not a local date and time as YYYY-MM-DDTHH:MM"))
}
