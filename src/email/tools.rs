//! The mailbox tools: `search_emails`, `get_email_thread` and `extract_entities`
//! read (idempotent; their emails are citable fragments, numbered `[n]` in the
//! order the run first sees them); `check_calendar` and `get_contact` read the
//! owner's calendar and address book (idempotent); `create_draft` and
//! `send_email` write (not idempotent; `send_email` always waits for a human's
//! approval). Bad arguments are `invalid_args`; unknown ids are
//! `unknown_email`/`unknown_draft`; an unknown contact is an answer, not a failure.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{Duration, Local, NaiveDate, NaiveDateTime, NaiveTime};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use troupe_actors::protocol::Fragment;
use troupe_actors::tool::{Tool, ToolContext, ToolError, ToolOutput};

use crate::email::calendar::{self, CalendarEvent, Contact};
use crate::email::entities;
use crate::email::mailbox::{Compose, Email, MailboxError, Mailboxes, SearchQuery};
use crate::tools::{parse_args, schema_of};

/// Characters of a body shown in a search result unless bodies are asked for.
const SNIPPET_CHARS: usize = 280;
/// Longest body or text accepted by the writing tools and `extract_entities`.
const MAX_TEXT: usize = 64 * 1024;

/// The failure the model sees for a mailbox error.
pub fn tool_error(error: MailboxError) -> ToolError {
    let code = match &error {
        MailboxError::UnknownEmail(_) => "unknown_email",
        MailboxError::UnknownDraft(_) => "unknown_draft",
        MailboxError::AlreadySent(_) => "already_sent",
        MailboxError::Database(_) | MailboxError::Import(_) | MailboxError::Records(_) => "mailbox_unavailable",
    };
    ToolError::failed(code, error.to_string())
}

/// An email as a citable document.
pub fn fragment(email: &Email) -> Fragment {
    Fragment {
        id: email.id.clone(),
        source: format!("mailbox:{}/{}", email.folder, email.id),
        title: email.subject.clone(),
        snippet: format!("From {}, {}: {}", email.from, email.date.format("%Y-%m-%d %H:%M"), snippet(&email.body, 160)),
    }
}

/// The first `chars` characters of `text`, whitespace collapsed.
fn snippet(text: &str, chars: usize) -> String {
    let collapsed = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match collapsed.char_indices().nth(chars) {
        Some((at, _)) => format!("{}…", &collapsed[..at]),
        None => collapsed,
    }
}

/// An email as the model reads it; with the whole body or a snippet.
fn email_json(email: &Email, full_body: bool) -> Value {
    let mut value = json!({
        "id": email.id,
        "folder": email.folder,
        "from": email.from,
        "to": email.to,
        "date": email.date.format("%Y-%m-%d %H:%M %:z").to_string(),
        "subject": email.subject,
    });
    // A thread of its own is the common case: its id would only repeat the email's.
    if email.thread_id != email.id {
        value["thread_id"] = json!(email.thread_id);
    }
    if email.folder == "spam" {
        value["warning"] = json!("filed as spam: not real mail, most likely a scam");
    }
    if full_body {
        value["body"] = json!(email.body);
    } else {
        value["snippet"] = json!(snippet(&email.body, SNIPPET_CHARS));
    }
    value
}

/// The email `id` (in angle brackets or not) of `tenant`'s mailbox.
pub(super) async fn email_by_id(mailboxes: &Mailboxes, tenant: &str, id: &str) -> Result<Email, ToolError> {
    mailboxes.of(tenant).get(crate::email::mime::strip_brackets(id)).await.map_err(tool_error)
}

fn string_arg<'a>(args: &'a Value, key: &str) -> Option<&'a str> {
    args.get(key).and_then(Value::as_str).map(str::trim).filter(|text| !text.is_empty())
}

/// A text argument trimmed, `None` when left out or blank.
fn present(text: &Option<String>) -> Option<&str> {
    text.as_deref().map(str::trim).filter(|text| !text.is_empty())
}

fn date_arg(text: &Option<String>, key: &str) -> Result<Option<NaiveDate>, ToolError> {
    present(text)
        .map(|text| {
            NaiveDate::parse_from_str(text, "%Y-%m-%d")
                .map_err(|_| ToolError::InvalidArgs(format!("{key} must be a date as YYYY-MM-DD, not {text:?}")))
        })
        .transpose()
}

/// The order of search results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
enum SortOrder {
    /// Newest first.
    Date,
    /// Best match first.
    Relevance,
}

/// Arguments of `search_emails`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    /// Words to find, e.g. "delivery tracking" or an order number; empty for every email the filters allow.
    #[serde(default)]
    #[schemars(length(max = 500))]
    query: Option<String>,
    /// Only emails whose sender contains this (name or address).
    #[serde(default)]
    from: Option<String>,
    /// Only emails whose recipients contain this.
    #[serde(default)]
    to: Option<String>,
    /// inbox, sent, spam, trash, or all; default: every folder but spam and trash.
    #[serde(default)]
    folder: Option<String>,
    /// Sent on or after this day, YYYY-MM-DD.
    #[serde(default)]
    date_from: Option<String>,
    /// Sent on or before this day, YYYY-MM-DD.
    #[serde(default)]
    date_to: Option<String>,
    /// Newest first (date, the default) or best match first (relevance).
    #[serde(default)]
    sort: Option<SortOrder>,
    /// Whole bodies instead of snippets (default false).
    #[serde(default)]
    include_body: Option<bool>,
    /// At most this many (default 10).
    #[serde(default)]
    #[schemars(range(min = 1, max = 50))]
    limit: Option<u32>,
}

/// Arguments of `get_email_thread`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ThreadArgs {
    /// An email id or thread id from search_emails.
    #[schemars(length(min = 1))]
    email_id: String,
}

/// Arguments of `extract_entities` and `analyze_email_content`: exactly one of
/// the two.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct EmailOrText {
    /// An email id from search_emails.
    #[serde(default)]
    pub email_id: Option<String>,
    /// A text, instead of an email.
    #[serde(default)]
    #[schemars(length(max = MAX_TEXT))]
    pub text: Option<String>,
}

/// The message of `create_draft`, and of `send_email` without a draft.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct DraftArgs {
    /// Recipients, comma-separated.
    #[schemars(length(min = 3))]
    to: String,
    /// Copy recipients, comma-separated.
    #[serde(default)]
    cc: Option<String>,
    /// The subject.
    #[schemars(length(max = 300))]
    subject: String,
    /// The body.
    #[schemars(length(min = 1, max = MAX_TEXT))]
    body: String,
    /// The id of the email this answers; the reply joins its thread.
    #[serde(default)]
    in_reply_to: Option<String>,
}

/// Arguments of `send_email`: a draft by id, or a message given in full.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SendArgs {
    /// A draft from create_draft.
    #[serde(default)]
    #[schemars(range(min = 1))]
    draft_id: Option<i64>,
    /// Recipients, comma-separated.
    #[serde(default)]
    to: Option<String>,
    /// Copy recipients, comma-separated.
    #[serde(default)]
    cc: Option<String>,
    /// The subject.
    #[serde(default)]
    #[schemars(length(max = 300))]
    subject: Option<String>,
    /// The body.
    #[serde(default)]
    #[schemars(length(max = MAX_TEXT))]
    body: Option<String>,
    /// The id of the email this answers; the reply joins its thread.
    #[serde(default)]
    in_reply_to: Option<String>,
}

/// Arguments of `check_calendar`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct CalendarArgs {
    /// The day: YYYY-MM-DD, "today" or "tomorrow".
    #[schemars(length(min = 1, max = 40))]
    date: String,
    /// The start of a time slot to check, HH:MM (24-hour clock).
    #[serde(default)]
    start: Option<String>,
    /// The end of that slot, HH:MM; default an hour after start.
    #[serde(default)]
    end: Option<String>,
}

/// Arguments of `get_contact`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ContactArgs {
    /// An email address, or "Name <address>" as an email's from field writes it.
    #[schemars(length(min = 3, max = 320))]
    email: String,
}

/// `search_emails`: full-text search with filters.
pub struct SearchEmails {
    /// Every tenant's mailbox.
    pub mailboxes: Arc<Mailboxes>,
}

#[async_trait]
impl Tool for SearchEmails {
    fn name(&self) -> &str {
        "search_emails"
    }

    fn description(&self) -> &str {
        "Searches the mailbox by words (any of them; stemmed) and filters: sender, recipient, folder, date range. \
         Newest first. Returns each email's id, thread, sender, date, subject and a snippet (or the body), and \
         today's date."
    }

    fn parameters(&self) -> Value {
        schema_of::<SearchArgs>()
    }

    fn idempotent(&self) -> bool {
        true
    }

    fn describe_start(&self, args: &Value) -> String {
        match string_arg(args, "query") {
            Some(query) => format!("Searching emails for '{query}'"),
            None => "Listing emails".to_owned(),
        }
    }

    async fn call(&self, context: ToolContext, args: Value) -> Result<ToolOutput, ToolError> {
        let args: SearchArgs = parse_args(args)?;
        let query = SearchQuery {
            text: present(&args.query).unwrap_or_default().to_owned(),
            from: present(&args.from).map(str::to_owned),
            to: present(&args.to).map(str::to_owned),
            folder: present(&args.folder).map(str::to_owned),
            date_from: date_arg(&args.date_from, "date_from")?,
            date_to: date_arg(&args.date_to, "date_to")?,
            by_relevance: args.sort == Some(SortOrder::Relevance),
            limit: args.limit.unwrap_or(10).clamp(1, 50),
        };
        if let (Some(from), Some(to)) = (query.date_from, query.date_to)
            && from > to
        {
            return Err(ToolError::InvalidArgs(format!("date_from {from} is after date_to {to}")));
        }
        let full_body = args.include_body.unwrap_or(false);
        let emails = self.mailboxes.of(&context.tenant).search(&query).await.map_err(tool_error)?;
        let value = json!({
            "today": Local::now().format("%Y-%m-%d").to_string(),
            "count": emails.len(),
            "emails": emails.iter().map(|email| email_json(email, full_body)).collect::<Vec<_>>(),
        });
        Ok(ToolOutput { value, fragments: emails.iter().map(fragment).collect(), ..Default::default() })
    }
}

/// `get_email_thread`: an email's whole conversation, with bodies.
pub struct GetEmailThread {
    /// Every tenant's mailbox.
    pub mailboxes: Arc<Mailboxes>,
}

#[async_trait]
impl Tool for GetEmailThread {
    fn name(&self) -> &str {
        "get_email_thread"
    }

    fn description(&self) -> &str {
        "Reads an email and its whole thread (every message, oldest first, with full bodies), given an email id or a thread id."
    }

    fn parameters(&self) -> Value {
        schema_of::<ThreadArgs>()
    }

    fn idempotent(&self) -> bool {
        true
    }

    fn describe_start(&self, args: &Value) -> String {
        format!("Reading the thread of {}", string_arg(args, "email_id").unwrap_or("an email"))
    }

    async fn call(&self, context: ToolContext, args: Value) -> Result<ToolOutput, ToolError> {
        let args: ThreadArgs = parse_args(args)?;
        let id = args.email_id.trim();
        if id.is_empty() {
            return Err(ToolError::InvalidArgs("email_id is empty".to_owned()));
        }
        let thread = self
            .mailboxes
            .of(&context.tenant)
            .thread(crate::email::mime::strip_brackets(id))
            .await
            .map_err(tool_error)?;
        let value = json!({
            "thread_id": thread[0].thread_id,
            "subject": thread[0].subject,
            "count": thread.len(),
            "messages": thread.iter().map(|email| email_json(email, true)).collect::<Vec<_>>(),
        });
        Ok(ToolOutput { value, fragments: thread.iter().map(fragment).collect(), ..Default::default() })
    }
}

/// `file_email`'s arguments.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct FileArgs {
    /// The email's id.
    email_id: String,
    /// The folder: lower-case letters, digits and `_` (`needs_review`, `archive`).
    folder: String,
}

/// `file_email`: moves an email to a folder, such as `needs_review` for one a
/// person must look at. Setting the same folder twice changes nothing.
pub struct FileEmail {
    /// Every tenant's mailbox.
    pub mailboxes: Arc<Mailboxes>,
}

#[async_trait]
impl Tool for FileEmail {
    fn name(&self) -> &str {
        "file_email"
    }

    fn description(&self) -> &str {
        "Moves an email (by id) to a folder, e.g. needs_review for one a person must look at, or archive."
    }

    fn parameters(&self) -> Value {
        schema_of::<FileArgs>()
    }

    fn idempotent(&self) -> bool {
        true
    }

    fn describe_start(&self, args: &Value) -> String {
        let folder = string_arg(args, "folder").unwrap_or("a folder");
        format!("Filing {} in {folder}", string_arg(args, "email_id").unwrap_or("an email"))
    }

    async fn call(&self, context: ToolContext, args: Value) -> Result<ToolOutput, ToolError> {
        let FileArgs { email_id, folder } = parse_args(args)?;
        let valid = !folder.is_empty()
            && folder.len() <= 32
            && folder.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !valid {
            return Err(ToolError::InvalidArgs(format!(
                "folder must be 1 to 32 lower-case letters, digits or _, not {folder:?}"
            )));
        }
        let id = crate::email::mime::strip_brackets(email_id.trim());
        let email = self.mailboxes.of(&context.tenant).file(id, &folder).await.map_err(tool_error)?;
        let value = json!({"summary": format!("Filed \"{}\" in {folder}.", email.subject), "email_id": email.id, "folder": folder});
        Ok(ToolOutput { value, fragments: vec![fragment(&email)], ..Default::default() })
    }
}

/// `extract_entities`: deterministic entities of an email or a text.
pub struct ExtractEntities {
    /// Every tenant's mailbox.
    pub mailboxes: Arc<Mailboxes>,
}

#[async_trait]
impl Tool for ExtractEntities {
    fn name(&self) -> &str {
        "extract_entities"
    }

    fn description(&self) -> &str {
        "Finds tracking numbers (with carrier), order numbers, amounts with currency, dates (as YYYY-MM-DD), times \
         of day (as HH:MM), phone numbers, email addresses and URLs in an email (by id) or a text. Exact and \
         deterministic."
    }

    fn parameters(&self) -> Value {
        schema_of::<EmailOrText>()
    }

    fn idempotent(&self) -> bool {
        true
    }

    fn describe_start(&self, args: &Value) -> String {
        match string_arg(args, "email_id") {
            Some(id) => format!("Extracting entities from {id}"),
            None => "Extracting entities from a text".to_owned(),
        }
    }

    async fn call(&self, context: ToolContext, args: Value) -> Result<ToolOutput, ToolError> {
        let args: EmailOrText = parse_args(args)?;
        match (present(&args.email_id), args.text.as_deref()) {
            (Some(id), None) => {
                let email = email_by_id(&self.mailboxes, &context.tenant, id).await?;
                let found = entities::extract(&format!("{}\n{}", email.subject, email.body));
                let value = json!({"email_id": email.id, "subject": email.subject, "entities": found});
                Ok(ToolOutput { value, fragments: vec![fragment(&email)], ..Default::default() })
            }
            (None, Some(text)) => Ok(ToolOutput::value(json!({"entities": entities::extract(text)}))),
            _ => Err(ToolError::InvalidArgs("give exactly one of email_id and text".to_owned())),
        }
    }
}

/// The day `text` names: `YYYY-MM-DD`, `today` or `tomorrow` (from `today`), or
/// the day as emails write it ("Sunday, 29 November 2026", "29 November 2026").
fn day_arg(text: &str, today: NaiveDate) -> Result<NaiveDate, ToolError> {
    let text = text.trim();
    let written = |text: &str| {
        let without_weekday = text.split_once(", ").map_or(text, |(_, rest)| rest);
        ["%d %B %Y", "%B %d %Y", "%B %d, %Y"]
            .iter()
            .find_map(|format| NaiveDate::parse_from_str(without_weekday, format).ok())
    };
    let day = match text.to_lowercase().as_str() {
        "today" => Some(today),
        "tomorrow" => today.succ_opt(),
        other => NaiveDate::parse_from_str(other, "%Y-%m-%d").ok().or_else(|| written(text)),
    };
    day.ok_or_else(|| ToolError::InvalidArgs(format!("date must be YYYY-MM-DD, today or tomorrow, not {text:?}")))
}

/// A time of day `HH:MM` named `key`; `24:00` too when `end_of_day` (the day's
/// end, as the next day's first minute).
fn time_arg(text: &str, key: &str, day: NaiveDate, end_of_day: bool) -> Result<NaiveDateTime, ToolError> {
    let text = text.trim();
    if end_of_day && text == "24:00" {
        return Ok(day.and_time(NaiveTime::MIN) + Duration::days(1));
    }
    NaiveTime::parse_from_str(text, "%H:%M")
        .map(|time| day.and_time(time))
        .map_err(|_| ToolError::InvalidArgs(format!("{key} must be a time as HH:MM, not {text:?}")))
}

/// The slot `start`–`end` of `day` that a `check_calendar` call names, if any.
fn slot_arg(args: &CalendarArgs, day: NaiveDate) -> Result<Option<(NaiveDateTime, NaiveDateTime)>, ToolError> {
    let (start, end) = match (present(&args.start), present(&args.end)) {
        (None, None) => return Ok(None),
        (None, Some(_)) => return Err(ToolError::InvalidArgs("end needs a start".to_owned())),
        (Some(start), end) => (start, end),
    };
    let start = time_arg(start, "start", day, false)?;
    let end = match end {
        Some(end) => time_arg(end, "end", day, true)?,
        None => start + Duration::hours(1),
    };
    if end <= start {
        return Err(ToolError::InvalidArgs(format!(
            "end {} is not after start {}",
            end.format("%H:%M"),
            start.format("%H:%M")
        )));
    }
    Ok(Some((start, end)))
}

/// A time as the summary of `day` shows it: `HH:MM` on that day, with its date
/// on another.
fn clock(time: NaiveDateTime, day: NaiveDate) -> String {
    if time.date() == day { time.format("%H:%M").to_string() } else { time.format("%Y-%m-%d %H:%M").to_string() }
}

/// `start–end` of a span, as the summary of `day` shows it.
fn span(start: NaiveDateTime, end: NaiveDateTime, day: NaiveDate) -> String {
    format!("{}–{}", clock(start, day), clock(end, day))
}

/// An event as the model reads it, its times as the summary of `day` shows them.
fn event_json(event: &CalendarEvent, day: NaiveDate) -> Value {
    json!({
        "title": event.title,
        "start": clock(event.starts, day),
        "end": clock(event.ends, day),
        "location": event.location,
    })
}

/// An event in a sentence: `09:30–09:45 Team stand-up (Brightdesk office)`.
fn event_words(event: &CalendarEvent, day: NaiveDate) -> String {
    let when = span(event.starts, event.ends, day);
    match event.location.as_str() {
        "" => format!("{when} {}", event.title),
        location => format!("{when} {} ({location})", event.title),
    }
}

/// Who the calendar is for, by the first name of the mailbox's address
/// (`Sam Rivera <sam@…>` → `Sam`); `the owner` for a bare address.
fn owner(address: &str) -> String {
    address
        .split_once('<')
        .and_then(|(name, _)| name.trim().trim_matches('"').split_whitespace().next())
        .map_or_else(|| "the owner".to_owned(), str::to_owned)
}

/// The day's events, and the slot's verdict if a slot is named, in words.
fn calendar_summary(
    owner: &str,
    day: NaiveDate,
    events: &[CalendarEvent],
    slot: Option<((NaiveDateTime, NaiveDateTime), &[&CalendarEvent])>,
) -> String {
    let date = day.format("%Y-%m-%d (%A)");
    let mut summary = match events {
        [] => format!("On {date} {owner} has no events."),
        [one] => format!("On {date} {owner} has 1 event: {}.", event_words(one, day)),
        many => {
            let each: Vec<String> = many.iter().map(|event| event_words(event, day)).collect();
            format!("On {date} {owner} has {} events: {}.", many.len(), each.join("; "))
        }
    };
    if let Some(((start, end), conflicts)) = slot {
        let slot = span(start, end, day);
        if conflicts.is_empty() {
            summary.push_str(&format!(" {slot} is free."));
        } else {
            let names: Vec<String> = conflicts
                .iter()
                .map(|event| format!("{} ({})", event.title, span(event.starts, event.ends, day)))
                .collect();
            summary.push_str(&format!(" {slot} is not free: it overlaps {}.", names.join(" and ")));
        }
    }
    summary
}

/// `check_calendar`: one day of the owner's calendar, and whether a slot is free.
pub struct CheckCalendar {
    /// Every tenant's mailbox (which holds its calendar).
    pub mailboxes: Arc<Mailboxes>,
}

#[async_trait]
impl Tool for CheckCalendar {
    fn name(&self) -> &str {
        "check_calendar"
    }

    fn description(&self) -> &str {
        "Reads the mailbox owner's calendar for one day (YYYY-MM-DD, today or tomorrow): each event's title, start, \
         end and location. Given a time slot (start and end as HH:MM), also says whether it is free and which \
         events conflict with it."
    }

    fn parameters(&self) -> Value {
        schema_of::<CalendarArgs>()
    }

    fn idempotent(&self) -> bool {
        true
    }

    fn describe_start(&self, args: &Value) -> String {
        format!("Checking the calendar for {}", string_arg(args, "date").unwrap_or("a day"))
    }

    async fn call(&self, context: ToolContext, args: Value) -> Result<ToolOutput, ToolError> {
        let args: CalendarArgs = parse_args(args)?;
        let day = day_arg(&args.date, Local::now().date_naive())?;
        let slot = slot_arg(&args, day)?;
        let (from, to) = (day.and_time(NaiveTime::MIN), day.and_time(NaiveTime::MIN) + Duration::days(1));
        let mailbox = self.mailboxes.of(&context.tenant);
        let events = mailbox.events(from, to).await.map_err(tool_error)?;
        let conflicts: Vec<&CalendarEvent> = match slot {
            Some((start, end)) => events.iter().filter(|event| event.overlaps(start, end)).collect(),
            None => Vec::new(),
        };
        let summary =
            calendar_summary(&owner(mailbox.address()), day, &events, slot.map(|slot| (slot, conflicts.as_slice())));
        let mut value = json!({
            "summary": summary,
            "date": day.format("%Y-%m-%d").to_string(),
            "events": events.iter().map(|event| event_json(event, day)).collect::<Vec<_>>(),
        });
        if slot.is_some() {
            value["free"] = json!(conflicts.is_empty());
            value["conflicts"] = json!(conflicts.iter().map(|event| event_json(event, day)).collect::<Vec<_>>());
        }
        Ok(ToolOutput::value(value))
    }
}

/// A contact in a sentence or two: who they are, the notes, the phone.
fn contact_summary(contact: &Contact) -> String {
    let mut summary = if contact.name.is_empty() { contact.email.clone() } else { contact.name.clone() };
    match contact.relation.as_str() {
        "" => {}
        "family" => summary.push_str(", family"),
        relation if relation.starts_with(['a', 'e', 'i', 'o', 'u']) => summary.push_str(&format!(", an {relation}")),
        relation => summary.push_str(&format!(", a {relation}")),
    }
    if !contact.company.is_empty() {
        summary.push_str(&format!(" at {}", contact.company));
    }
    summary.push('.');
    if !contact.notes.is_empty() {
        summary.push_str(&format!(" {}", contact.notes.trim_end_matches('.')));
        summary.push('.');
    }
    if !contact.phone.is_empty() {
        summary.push_str(&format!(" Phone {}.", contact.phone));
    }
    summary
}

/// `get_contact`: what the owner's address book knows of an address.
pub struct GetContact {
    /// Every tenant's mailbox (which holds its address book).
    pub mailboxes: Arc<Mailboxes>,
}

#[async_trait]
impl Tool for GetContact {
    fn name(&self) -> &str {
        "get_contact"
    }

    fn description(&self) -> &str {
        "Looks up a person in the mailbox owner's address book by email address (or \"Name <address>\"): name, \
         company, relation (customer, supplier, colleague, family…), phone and notes. An unknown address is \
         found: false."
    }

    fn parameters(&self) -> Value {
        schema_of::<ContactArgs>()
    }

    fn idempotent(&self) -> bool {
        true
    }

    fn describe_start(&self, args: &Value) -> String {
        format!("Looking up the contact {}", string_arg(args, "email").unwrap_or("of an address"))
    }

    async fn call(&self, context: ToolContext, args: Value) -> Result<ToolOutput, ToolError> {
        let args: ContactArgs = parse_args(args)?;
        let address = calendar::address_of(&args.email).ok_or_else(|| {
            ToolError::InvalidArgs(format!(
                "email must be an email address, e.g. name@example.com or \"Name <name@example.com>\", not {:?}",
                args.email
            ))
        })?;
        let found = self.mailboxes.of(&context.tenant).contact(&address).await.map_err(tool_error)?;
        let value = match found {
            Some(contact) => json!({
                "summary": contact_summary(&contact),
                "found": true,
                "email": contact.email,
                "name": contact.name,
                "company": contact.company,
                "relation": contact.relation,
                "phone": contact.phone,
                "notes": contact.notes,
            }),
            None => json!({"found": false, "summary": format!("No contact is known for {address}.")}),
        };
        Ok(ToolOutput::value(value))
    }
}

/// The message a writing tool was asked to compose.
fn compose(args: DraftArgs, need_recipient: bool) -> Result<Compose, ToolError> {
    let message = Compose {
        to: args.to.trim().to_owned(),
        cc: present(&args.cc).unwrap_or_default().to_owned(),
        subject: args.subject.trim().to_owned(),
        in_reply_to: present(&args.in_reply_to).map(|id| crate::email::mime::strip_brackets(id).to_owned()),
        body: args.body,
    };
    if need_recipient && !message.to.contains('@') {
        return Err(ToolError::InvalidArgs(format!("to must name at least one email address, not {:?}", message.to)));
    }
    if message.body.trim().is_empty() {
        return Err(ToolError::InvalidArgs("body is empty".to_owned()));
    }
    Ok(message)
}

/// `create_draft`: stores a draft for later sending.
pub struct CreateDraft {
    /// Every tenant's mailbox.
    pub mailboxes: Arc<Mailboxes>,
}

#[async_trait]
impl Tool for CreateDraft {
    fn name(&self) -> &str {
        "create_draft"
    }

    fn description(&self) -> &str {
        "Saves an email draft (recipients, subject, body, optionally the email it answers). Nothing is sent; \
         send_email sends a draft by its id."
    }

    fn parameters(&self) -> Value {
        schema_of::<DraftArgs>()
    }

    fn describe_start(&self, args: &Value) -> String {
        format!("Drafting an email to {}", string_arg(args, "to").unwrap_or("someone"))
    }

    async fn call(&self, context: ToolContext, args: Value) -> Result<ToolOutput, ToolError> {
        let message = compose(parse_args(args)?, true)?;
        let draft = self
            .mailboxes
            .of(&context.tenant)
            .create_draft(&message, &context.idempotency_key)
            .await
            .map_err(tool_error)?;
        Ok(ToolOutput::value(
            json!({"draft_id": draft.id, "status": draft.status, "to": draft.to, "subject": draft.subject}),
        ))
    }
}

/// `send_email`: queues a draft (or a message given in full) in the outbox. Every
/// call waits for a human's approval.
pub struct SendEmail {
    /// Every tenant's mailbox.
    pub mailboxes: Arc<Mailboxes>,
}

#[async_trait]
impl Tool for SendEmail {
    fn name(&self) -> &str {
        "send_email"
    }

    fn description(&self) -> &str {
        "Sends an email: a draft by draft_id, or a message given in full. Every call waits for a human to approve \
         it; a rejection comes back with the human's reason."
    }

    fn parameters(&self) -> Value {
        schema_of::<SendArgs>()
    }

    fn requires_approval(&self) -> bool {
        true
    }

    fn describe_start(&self, args: &Value) -> String {
        match args.get("draft_id").and_then(Value::as_i64) {
            Some(id) => format!("Sending draft {id}"),
            None => format!("Sending an email to {}", string_arg(args, "to").unwrap_or("someone")),
        }
    }

    async fn call(&self, context: ToolContext, args: Value) -> Result<ToolOutput, ToolError> {
        let args: SendArgs = parse_args(args)?;
        let draft_id = args.draft_id;
        let composed = args.to.is_some()
            || args.subject.is_some()
            || args.body.is_some()
            || args.cc.is_some()
            || args.in_reply_to.is_some();
        let message = match (draft_id, composed) {
            (Some(_), false) => None,
            (None, true) => {
                let draft = DraftArgs {
                    to: args.to.unwrap_or_default(),
                    cc: args.cc,
                    subject: args.subject.unwrap_or_default(),
                    body: args.body.unwrap_or_default(),
                    in_reply_to: args.in_reply_to,
                };
                Some(compose(draft, true)?)
            }
            _ => return Err(ToolError::InvalidArgs("give either draft_id or to, subject and body".to_owned())),
        };
        let sent = self
            .mailboxes
            .of(&context.tenant)
            .send(draft_id, message, &context.idempotency_key)
            .await
            .map_err(tool_error)?;
        Ok(ToolOutput::value(json!({
            "status": "queued",
            "outbox_id": sent.id,
            "message_id": sent.message_id,
            "to": sent.to,
            "subject": sent.subject,
        })))
    }
}
