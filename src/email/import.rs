//! What can be imported into a mailbox: a JSON list of emails (the sample mailbox's
//! format) or an mbox file (Gmail Takeout, Thunderbird, `mutt`). Both become
//! [`NewEmail`]s; the mailbox threads and stores them. JSON emails may give their
//! date as a day offset from the import time, and their text may use date
//! templates, so a sample stays current whenever it is imported:
//! `{{date+1}}` → `Thursday, 15 May 2025`, `{{isodate-2}}` → `2025-05-12`,
//! `{{weekday+3}}` → `Saturday`.

use chrono::{DateTime, Duration, Local, NaiveTime, TimeZone, Utc};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::email::mime;

/// An email ready to be stored.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEmail {
    /// The Message-ID without angle brackets: the email's id in the mailbox.
    pub id: String,
    /// A thread id given by the source; else threads come from the reply headers.
    pub thread_id: Option<String>,
    /// `inbox`, `sent`, `spam`, `archive`, `trash`…
    pub folder: String,
    /// `Name <address>`.
    pub from: String,
    /// Recipients, comma-separated.
    pub to: String,
    /// Copy recipients, comma-separated.
    pub cc: String,
    /// The subject.
    pub subject: String,
    /// When it was sent.
    pub date: DateTime<Utc>,
    /// The Message-ID it answers.
    pub in_reply_to: Option<String>,
    /// The Message-IDs of its thread, oldest first.
    pub references: Vec<String>,
    /// The plain-text body.
    pub body: String,
}

/// Why a file could not be imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// Not a JSON list of emails.
    #[error("not a JSON list of emails: {0}")]
    Json(String),
    /// An email of the list is unusable.
    #[error("email {index}: {message}")]
    Email {
        /// Its position in the list (0-based).
        index: usize,
        /// What is wrong.
        message: String,
    },
    /// The text is neither a JSON list nor an mbox file.
    #[error("the file is neither a JSON list of emails nor an mbox file (which starts with a \"From \" line)")]
    UnknownFormat,
}

/// One email of a JSON list.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEmail {
    #[serde(alias = "message_id")]
    id: Option<String>,
    thread_id: Option<String>,
    folder: Option<String>,
    from: String,
    #[serde(default)]
    to: Recipients,
    #[serde(default)]
    cc: Recipients,
    #[serde(default)]
    subject: String,
    /// RFC 3339 or RFC 2822.
    date: Option<String>,
    /// Days from the import day (0 today, -1 yesterday), with `time`.
    day_offset: Option<i64>,
    /// `HH:MM` local time, with `day_offset` (default 09:00).
    time: Option<String>,
    in_reply_to: Option<String>,
    #[serde(default)]
    references: Vec<String>,
    #[serde(default)]
    body: String,
}

/// One address or a list of them.
#[derive(Debug, Default, Deserialize)]
#[serde(untagged)]
enum Recipients {
    #[default]
    None,
    One(String),
    Many(Vec<String>),
}

impl Recipients {
    fn joined(self) -> String {
        match self {
            Self::None => String::new(),
            Self::One(one) => one,
            Self::Many(many) => many.join(", "),
        }
    }
}

/// Parses `text` as a JSON list or as an mbox file, whichever it is. `now` anchors
/// day offsets and date templates.
pub fn parse(text: &str, now: DateTime<Local>) -> Result<Vec<NewEmail>, ImportError> {
    let start = text.trim_start();
    if start.starts_with('[') {
        parse_json(text, now)
    } else if start.starts_with("From ") {
        Ok(parse_mbox(text))
    } else {
        Err(ImportError::UnknownFormat)
    }
}

/// Parses a JSON list of emails.
pub fn parse_json(text: &str, now: DateTime<Local>) -> Result<Vec<NewEmail>, ImportError> {
    let list: Vec<JsonEmail> = serde_json::from_str(text).map_err(|error| ImportError::Json(error.to_string()))?;
    list.into_iter()
        .enumerate()
        .map(|(index, email)| json_email(email, now).map_err(|message| ImportError::Email { index, message }))
        .collect()
}

fn json_email(email: JsonEmail, now: DateTime<Local>) -> Result<NewEmail, String> {
    let date = match (&email.date, email.day_offset) {
        (Some(date), _) => DateTime::parse_from_rfc3339(date)
            .or_else(|_| DateTime::parse_from_rfc2822(date))
            .map(|date| date.with_timezone(&Utc))
            .map_err(|error| format!("date {date:?}: {error}"))?,
        (None, Some(offset)) => relative_date(now, offset, email.time.as_deref())?,
        (None, None) => return Err("needs a date or a day_offset".to_owned()),
    };
    let subject = render_templates(&email.subject, now);
    let body = render_templates(&email.body, now);
    let from = email.from;
    let id = match email.id {
        Some(id) => mime::strip_brackets(&id).to_owned(),
        None => synthetic_id(&from, &date, &subject),
    };
    Ok(NewEmail {
        id,
        thread_id: email.thread_id,
        folder: email.folder.unwrap_or_else(|| "inbox".to_owned()).to_lowercase(),
        from,
        to: email.to.joined(),
        cc: email.cc.joined(),
        subject,
        date,
        in_reply_to: email.in_reply_to.map(|id| mime::strip_brackets(&id).to_owned()),
        references: email.references.iter().map(|id| mime::strip_brackets(id).to_owned()).collect(),
        body,
    })
}

/// `now`'s day moved by `offset` days, at `time` (local), in UTC.
fn relative_date(now: DateTime<Local>, offset: i64, time: Option<&str>) -> Result<DateTime<Utc>, String> {
    let time = match time {
        Some(time) => NaiveTime::parse_from_str(time, "%H:%M").map_err(|_| format!("time {time:?} is not HH:MM"))?,
        None => NaiveTime::from_hms_opt(9, 0, 0).unwrap_or_default(),
    };
    let day = now.date_naive() + Duration::days(offset);
    let date = Local
        .from_local_datetime(&day.and_time(time))
        .earliest()
        .map(|date| date.with_timezone(&Utc))
        .ok_or_else(|| format!("{day} {time} does not exist in the local time zone"))?;
    let now = now.with_timezone(&Utc);
    if date <= now {
        return Ok(date);
    }
    // Mail from later today has not arrived yet: it is pulled back to just before
    // now, by a hundredth of its distance to the end of the day (so at most 15
    // minutes), keeping its order among today's emails; and by less just after
    // midnight, so that it keeps its day too.
    let local_day = |offset: i64| {
        Local
            .from_local_datetime(
                &(now.with_timezone(&Local).date_naive() + Duration::days(offset)).and_time(NaiveTime::MIN),
            )
            .earliest()
            .map(|midnight| midnight.with_timezone(&Utc))
    };
    let end_of_day = local_day(1).unwrap_or(now + Duration::days(1)).max(date);
    let start_of_day = local_day(0).unwrap_or(now - Duration::days(1)).min(now);
    let nanos = |span: Duration| i128::from(span.num_nanoseconds().unwrap_or(i64::MAX));
    let (distance, room, widest) = (nanos(end_of_day - date), nanos(now - start_of_day), nanos(end_of_day - now));
    // The widest distance (mail due just after now) is pulled back by at most half
    // the time since midnight.
    let pull = (distance / 100).min(room * distance / (2 * widest).max(1));
    Ok(now - Duration::nanoseconds(i64::try_from(pull).unwrap_or(0)))
}

/// An id for an email that has none: a hash of what identifies it.
fn synthetic_id(from: &str, date: &DateTime<Utc>, subject: &str) -> String {
    let digest = Sha256::digest(format!("{from}\n{}\n{subject}", date.to_rfc3339()));
    let hex: String = digest.iter().take(8).map(|byte| format!("{byte:02x}")).collect();
    format!("{hex}@troupe.local")
}

/// Replaces `{{date±N}}`, `{{isodate±N}}` and `{{weekday±N}}` with the date `N`
/// days from `now`. Anything else between braces is left as it is.
pub fn render_templates(text: &str, now: DateTime<Local>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            out.push_str(&rest[start..]);
            return out;
        };
        match render_one(&after[..end], now) {
            Some(rendered) => out.push_str(&rendered),
            None => out.push_str(&rest[start..start + end + 4]),
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

fn render_one(template: &str, now: DateTime<Local>) -> Option<String> {
    let split = template.find(['+', '-'])?;
    let (kind, offset) = template.split_at(split);
    let offset: i64 = offset.trim_start_matches('+').parse().ok()?;
    let day = now.date_naive() + Duration::days(offset);
    let format = match kind.trim() {
        "date" => "%A, %-d %B %Y",
        "isodate" => "%Y-%m-%d",
        "weekday" => "%A",
        _ => return None,
    };
    Some(day.format(format).to_string())
}

/// Parses an mbox file: messages start at lines beginning `From `; `>From ` lines
/// of a body are unescaped. Messages without a usable date get the Unix epoch.
pub fn parse_mbox(text: &str) -> Vec<NewEmail> {
    let mut emails = Vec::new();
    let mut current = String::new();
    let mut started = false;
    for line in text.split_inclusive('\n') {
        if line.starts_with("From ") {
            if started {
                emails.push(mbox_message(&current));
            }
            current.clear();
            started = true;
            continue;
        }
        if started {
            current.push_str(line.strip_prefix('>').filter(|rest| rest.starts_with("From ")).unwrap_or(line));
        }
    }
    if started {
        emails.push(mbox_message(&current));
    }
    emails
}

fn mbox_message(raw: &str) -> NewEmail {
    let message = mime::parse_message(raw);
    let header = |name: &str| message.header(name).map(mime::decode_words).unwrap_or_default();
    let date = message
        .header("date")
        .and_then(|date| DateTime::parse_from_rfc2822(date.trim()).ok())
        .map_or(DateTime::<Utc>::UNIX_EPOCH, |date| date.with_timezone(&Utc));
    let subject = header("subject");
    let from = header("from");
    let labels = header("x-gmail-labels").to_lowercase();
    let folder = if labels.contains("spam") {
        "spam"
    } else if labels.contains("sent") {
        "sent"
    } else if labels.contains("trash") {
        "trash"
    } else {
        "inbox"
    };
    let id = message
        .header("message-id")
        .map(|id| mime::strip_brackets(id.trim()).to_owned())
        .filter(|id| !id.is_empty())
        .unwrap_or_else(|| synthetic_id(&from, &date, &subject));
    NewEmail {
        id,
        thread_id: message.header("x-gm-thrid").map(|id| id.trim().to_owned()),
        folder: folder.to_owned(),
        from,
        to: header("to"),
        cc: header("cc"),
        subject,
        date,
        in_reply_to: message.header("in-reply-to").and_then(|ids| mime::message_ids(ids).into_iter().next()),
        references: message.header("references").map(mime::message_ids).unwrap_or_default(),
        body: message.text_body(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Local> {
        Local.with_ymd_and_hms(2025, 5, 14, 12, 0, 0).unwrap()
    }

    #[test]
    fn templates_render_dates_relative_to_now() {
        let text = render_templates("Due {{date+1}} ({{isodate-2}}, a {{weekday+3}}); {{other}} {{date+x}}", now());
        assert_eq!(text, "Due Thursday, 15 May 2025 (2025-05-12, a Saturday); {{other}} {{date+x}}");
    }

    #[test]
    fn json_emails_take_day_offsets_and_need_a_date() {
        let json = r#"[{"id": "<a@x>", "from": "A <a@x>", "to": ["b@y", "c@y"], "subject": "Hi {{isodate+0}}",
            "day_offset": -1, "time": "08:30", "body": "b", "in_reply_to": "<z@x>"}]"#;
        let emails = parse(json, now()).unwrap();
        assert_eq!(emails[0].id, "a@x");
        assert_eq!(emails[0].to, "b@y, c@y");
        assert_eq!(emails[0].subject, "Hi 2025-05-14");
        assert_eq!(emails[0].in_reply_to.as_deref(), Some("z@x"));
        assert_eq!(emails[0].date.with_timezone(&Local).format("%Y-%m-%d %H:%M").to_string(), "2025-05-13 08:30");
        let later = |time: &str| relative_date(now(), 0, Some(time)).unwrap();
        let (earlier, afternoon, evening) = (later("11:00"), later("15:00"), later("21:00"));
        assert!(
            earlier < afternoon && afternoon < evening && evening < now(),
            "mail from later today arrived just now"
        );
        assert_eq!(evening.with_timezone(&Local).date_naive(), now().date_naive());
        // Just after midnight, mail due later that day stays on that day, in order.
        let midnight = Local.with_ymd_and_hms(2025, 5, 14, 0, 5, 0).unwrap();
        let due = |time: &str| relative_date(midnight, 0, Some(time)).unwrap();
        let (morning, noon, night) = (due("09:00"), due("12:00"), due("23:59"));
        assert!(morning < noon && noon < night && night < midnight, "{morning} {noon} {night}");
        assert_eq!(morning.with_timezone(&Local).date_naive(), midnight.date_naive(), "{morning}");
        let error = parse(r#"[{"from": "a"}]"#, now()).unwrap_err().to_string();
        assert_eq!(error, "email 0: needs a date or a day_offset");
        assert!(matches!(parse("hello", now()), Err(ImportError::UnknownFormat)));
    }

    #[test]
    fn mbox_messages_are_split_unescaped_and_threaded_by_headers() {
        let mbox = "From a@x Thu May  1 10:00:00 2025\nMessage-ID: <one@x>\nFrom: A <a@x>\nTo: me@y\n\
            Subject: =?UTF-8?Q?Caf=C3=A9?= plans\nDate: Thu, 01 May 2025 10:00:00 +0000\n\nHello\n>From the start\n\n\
            From b@x Thu May  1 11:00:00 2025\nMessage-ID: <two@x>\nFrom: B <b@x>\nSubject: Re: plans\n\
            In-Reply-To: <one@x>\nReferences: <one@x>\nDate: Thu, 01 May 2025 11:00:00 +0000\n\nSure\n";
        let emails = parse(mbox, now()).unwrap();
        assert_eq!(emails.len(), 2);
        assert_eq!(emails[0].subject, "Café plans");
        assert_eq!(emails[0].body.trim_end(), "Hello\nFrom the start");
        assert_eq!(emails[1].in_reply_to.as_deref(), Some("one@x"));
        assert_eq!(emails[1].references, vec!["one@x"]);
        assert_eq!(emails[1].date.to_rfc3339(), "2025-05-01T11:00:00+00:00");
    }
}
