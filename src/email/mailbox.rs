//! The mailbox: emails in SQLite with an FTS5 full-text index (subject, body,
//! sender, recipients; Porter stemming, so "deliveries" finds "delivery"), threads,
//! drafts and an outbox; and, in the same file, the owner's contacts and calendar
//! (`calendar.rs`). Nothing here speaks SMTP: "sending" puts a message in the
//! outbox table (and a copy in the `sent` folder).
//!
//! The file is opened on first use, not at start, so a daemon whose agents never
//! read mail never creates it; an empty mailbox is filled with the sample mailbox,
//! its contacts and its calendar then, when the configuration asks for it, so the
//! email agents work with no setup. Several processes may share the file (WAL, a
//! busy timeout); side effects carry the tool call's idempotency key, under a
//! unique index, so a call repeated downstream writes once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Local, NaiveDate, NaiveDateTime, TimeZone, Utc};
use serde::Serialize;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow};
use sqlx::{Row, SqlitePool};
use tokio::sync::OnceCell;

use crate::email::calendar::{self, CalendarEvent, Contact, RecordsError};
use crate::email::import::{self, ImportError, NewEmail};
use crate::tools::TenantPath;

/// The sample mailbox (a JSON list with day offsets), built in.
pub const SAMPLE_MAILBOX: &str = include_str!("../../config/email/sample-mailbox.json");

const SCHEMA: &str = include_str!("schema.sql");

/// Folders a search skips unless asked for by name.
const HIDDEN_FOLDERS: [&str; 2] = ["spam", "trash"];

/// By relevance, the weakest match kept, as a share of the best one's score.
const WEAKEST_MATCH: f64 = 0.4;

/// Why a mailbox operation failed.
#[derive(Debug, thiserror::Error)]
pub enum MailboxError {
    /// The database could not be opened or answered with an error.
    #[error("mailbox database error: {0}")]
    Database(String),
    /// No email has that id.
    #[error("no email has the id {0:?}")]
    UnknownEmail(String),
    /// No draft has that id.
    #[error("no draft has the id {0}")]
    UnknownDraft(i64),
    /// The draft was sent already.
    #[error("draft {0} was already sent")]
    AlreadySent(i64),
    /// An imported file is unusable.
    #[error(transparent)]
    Import(#[from] ImportError),
    /// An imported list of contacts or calendar events is unusable.
    #[error(transparent)]
    Records(#[from] RecordsError),
}

impl From<sqlx::Error> for MailboxError {
    fn from(error: sqlx::Error) -> Self {
        Self::Database(error.to_string())
    }
}

/// A stored email.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Email {
    /// Its id (the Message-ID without brackets).
    pub id: String,
    /// Its thread: the id of the thread's first email.
    pub thread_id: String,
    /// Its folder.
    pub folder: String,
    /// Sender.
    pub from: String,
    /// Recipients.
    pub to: String,
    /// Copy recipients.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub cc: String,
    /// Subject.
    pub subject: String,
    /// When it was sent, in local time.
    pub date: DateTime<Local>,
    /// The email it answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_reply_to: Option<String>,
    /// The text.
    pub body: String,
}

/// What to look for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SearchQuery {
    /// Words to find (any of them; emails with more of them rank first when
    /// sorting by relevance). Empty: every email the filters let through.
    pub text: String,
    /// Only emails whose sender contains this (case-insensitive).
    pub from: Option<String>,
    /// Only emails whose recipients contain this.
    pub to: Option<String>,
    /// Only this folder; `all` for every folder. Default: all but spam and trash.
    pub folder: Option<String>,
    /// Sent on or after this local day.
    pub date_from: Option<NaiveDate>,
    /// Sent on or before this local day.
    pub date_to: Option<NaiveDate>,
    /// Best match first instead of newest first.
    pub by_relevance: bool,
    /// At most this many.
    pub limit: u32,
}

/// A draft or a queued message.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Draft {
    /// Its id.
    pub id: i64,
    /// Recipients.
    pub to: String,
    /// Copy recipients.
    pub cc: String,
    /// Subject.
    pub subject: String,
    /// Text.
    pub body: String,
    /// The email it answers.
    pub in_reply_to: Option<String>,
    /// `draft` or `sent`.
    pub status: String,
}

/// A message in the outbox.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutboxMessage {
    /// Its id in the outbox.
    pub id: i64,
    /// The Message-ID it was given.
    pub message_id: String,
    /// The draft it was sent from, if any.
    pub draft_id: Option<i64>,
    /// Sender.
    pub from: String,
    /// Recipients.
    pub to: String,
    /// Subject.
    pub subject: String,
    /// Text.
    pub body: String,
    /// The email it answers.
    pub in_reply_to: Option<String>,
    /// When it was queued.
    pub queued_at: DateTime<Utc>,
}

/// A message to write: to a draft or straight to the outbox.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Compose {
    /// Recipients, comma-separated.
    pub to: String,
    /// Copy recipients.
    pub cc: String,
    /// Subject.
    pub subject: String,
    /// Text.
    pub body: String,
    /// The email it answers (its thread then continues).
    pub in_reply_to: Option<String>,
}

/// Where the mailbox lives and how it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct MailboxOptions {
    /// The SQLite file.
    pub path: PathBuf,
    /// Fill an empty mailbox with the sample on first use.
    pub seed_sample: bool,
    /// The address messages are sent from.
    pub address: String,
}

/// Each tenant's mailbox, a SQLite file of its own (a path template with
/// `{tenant}`), opened on first use and kept open.
pub struct Mailboxes {
    path: TenantPath,
    seed_sample: bool,
    address: String,
    open: Mutex<HashMap<String, Arc<Mailbox>>>,
}

impl Mailboxes {
    /// The mailboxes at `path`, each seeded with the sample if `seed_sample`,
    /// sending from `address`.
    pub fn new(path: TenantPath, seed_sample: bool, address: String) -> Self {
        Self { path, seed_sample, address, open: Mutex::default() }
    }

    /// The mailbox of `tenant`.
    pub fn of(&self, tenant: &str) -> Arc<Mailbox> {
        // A std mutex: the section is one map lookup, never an await.
        let mut open = self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        open.entry(tenant.to_owned()).or_insert_with(|| Arc::new(self.of_new(tenant))).clone()
    }

    /// A new handle on the mailbox of `tenant` (not kept).
    pub fn of_new(&self, tenant: &str) -> Mailbox {
        Mailbox::new(MailboxOptions {
            path: self.path.of(tenant),
            seed_sample: self.seed_sample,
            address: self.address.clone(),
        })
    }
}

/// The mailbox, opened on first use.
pub struct Mailbox {
    options: MailboxOptions,
    pool: OnceCell<SqlitePool>,
}

impl Mailbox {
    /// A mailbox at `options.path`; nothing is opened yet.
    pub fn new(options: MailboxOptions) -> Self {
        Self { options, pool: OnceCell::new() }
    }

    /// The address messages are sent from.
    pub fn address(&self) -> &str {
        &self.options.address
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.options.path
    }

    /// The pool, opening the file (and seeding it) the first time.
    async fn pool(&self) -> Result<&SqlitePool, MailboxError> {
        self.pool.get_or_try_init(|| self.open()).await
    }

    async fn open(&self) -> Result<SqlitePool, MailboxError> {
        if let Some(parent) = self.options.path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .map_err(|error| MailboxError::Database(format!("cannot create {}: {error}", parent.display())))?;
        }
        // The file by name, not through a URL: a tenant's escaped name holds `%`,
        // which a URL would decode.
        let options = SqliteConnectOptions::new()
            .filename(&self.options.path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new().max_connections(4).connect_with(options).await?;
        sqlx::raw_sql(SCHEMA).execute(&pool).await?;
        if self.options.seed_sample && count(&pool).await? == 0 {
            seed(&pool, Local::now()).await?;
            tracing::info!(path = %self.options.path.display(), "mailbox seeded with the sample mailbox");
        }
        Ok(pool)
    }

    /// Imports `text` (a JSON list or an mbox file); returns how many emails were
    /// new (an id already stored is skipped).
    pub async fn import(&self, text: &str) -> Result<usize, MailboxError> {
        let emails = import::parse(text, Local::now())?;
        insert(self.pool().await?, emails).await
    }

    /// Imports the sample mailbox with its contacts and calendar, with dates
    /// relative to now; returns how many emails were new (an email, contact or
    /// event already stored is kept as it is).
    pub async fn import_sample(&self) -> Result<usize, MailboxError> {
        seed(self.pool().await?, Local::now()).await
    }

    /// Imports a JSON list of contacts (the format of
    /// `config/email/sample-contacts.json`); returns how many were new (a known
    /// address is kept as it is).
    pub async fn import_contacts(&self, text: &str) -> Result<usize, MailboxError> {
        let contacts = calendar::parse_contacts(text)?;
        let mut tx = self.pool().await?.begin().await?;
        let added = insert_contacts(&mut tx, &contacts).await?;
        tx.commit().await?;
        Ok(added)
    }

    /// Imports a JSON list of calendar events (the format of
    /// `config/email/sample-calendar.json`, day offsets from today); returns how
    /// many were new (a known id is kept as it is).
    pub async fn import_calendar(&self, text: &str) -> Result<usize, MailboxError> {
        let events = calendar::parse_calendar(text, Local::now().date_naive())?;
        let mut tx = self.pool().await?.begin().await?;
        let added = insert_events(&mut tx, &events).await?;
        tx.commit().await?;
        Ok(added)
    }

    /// Deletes every email, draft, outbox message, contact and calendar event.
    pub async fn clear(&self) -> Result<(), MailboxError> {
        let pool = self.pool().await?;
        sqlx::raw_sql(
            "DELETE FROM emails; DELETE FROM outbox; DELETE FROM drafts; DELETE FROM contacts; \
             DELETE FROM calendar_events;",
        )
        .execute(pool)
        .await?;
        Ok(())
    }

    /// The contact with the address `address` (case does not matter).
    pub async fn contact(&self, address: &str) -> Result<Option<Contact>, MailboxError> {
        let pool = self.pool().await?;
        let row = sqlx::query("SELECT * FROM contacts WHERE email = ?")
            .bind(address.trim().to_lowercase())
            .fetch_optional(pool)
            .await?;
        row.as_ref().map(contact).transpose()
    }

    /// The calendar events overlapping the span from `from` to `to` (local time),
    /// by start time.
    pub async fn events(&self, from: NaiveDateTime, to: NaiveDateTime) -> Result<Vec<CalendarEvent>, MailboxError> {
        let pool = self.pool().await?;
        let rows = sqlx::query("SELECT * FROM calendar_events WHERE starts < ? AND ends > ? ORDER BY starts, ends, id")
            .bind(to.format(calendar::DATE_TIME_FORMAT).to_string())
            .bind(from.format(calendar::DATE_TIME_FORMAT).to_string())
            .fetch_all(pool)
            .await?;
        rows.iter().map(event).collect()
    }

    /// How many emails it holds.
    pub async fn count(&self) -> Result<i64, MailboxError> {
        count(self.pool().await?).await
    }

    /// Emails matching `query`. A query that names emails by their id (a word of
    /// its text is an email's id, with or without `<>`) finds those emails, in
    /// whichever folder they are.
    pub async fn search(&self, query: &SearchQuery) -> Result<Vec<Email>, MailboxError> {
        let pool = self.pool().await?;
        let named = named_emails(pool, &query.text).await?;
        if !named.is_empty() {
            return Ok(named.into_iter().take(query.limit.max(1) as usize).collect());
        }
        let mut terms = fts_terms(&query.text);
        terms.extend(day_terms(&query.text, Local::now().date_naive()));
        let relevance = query.by_relevance && !terms.is_empty();
        let mut sql = String::from(if relevance {
            // Mail filed as spam or trash counts half as relevant as real mail (bm25
            // scores are negative: lower is better).
            "SELECT e.*, bm25(emails_fts, 4.0, 1.0, 2.0, 1.0) \
             * (CASE WHEN e.folder IN ('spam', 'trash') THEN 0.5 ELSE 1.0 END) AS score FROM emails e"
        } else {
            "SELECT e.* FROM emails e"
        });
        let mut binds: Vec<String> = Vec::new();
        let mut conditions: Vec<String> = Vec::new();
        if !terms.is_empty() {
            sql.push_str(" JOIN emails_fts f ON f.rowid = e.rowid");
            conditions.push("emails_fts MATCH ?".to_owned());
            binds.push(terms.join(" OR "));
        }
        if let Some(from) = &query.from {
            conditions.push("e.from_addr LIKE ?".to_owned());
            binds.push(format!("%{from}%"));
        }
        if let Some(to) = &query.to {
            conditions.push("(e.to_addr LIKE ? OR e.cc LIKE ?)".to_owned());
            binds.extend([format!("%{to}%"), format!("%{to}%")]);
        }
        match query.folder.as_deref().map(str::to_lowercase) {
            Some(folder) if folder == "all" => {}
            Some(folder) => {
                conditions.push("e.folder = ?".to_owned());
                binds.push(folder);
            }
            None => conditions.push(format!("e.folder NOT IN ('{}')", HIDDEN_FOLDERS.join("', '"))),
        }
        if let Some(day) = query.date_from {
            conditions.push("e.date >= ?".to_owned());
            binds.push(timestamp(day_start(day)));
        }
        if let Some(day) = query.date_to.and_then(|day| day.succ_opt()) {
            conditions.push("e.date < ?".to_owned());
            binds.push(timestamp(day_start(day)));
        }
        if !conditions.is_empty() {
            sql.push_str(" WHERE ");
            sql.push_str(&conditions.join(" AND "));
        }
        sql.push_str(if relevance { " ORDER BY score" } else { " ORDER BY e.date DESC" });
        sql.push_str(" LIMIT ?");
        // Every value is bound; the text holds only fixed fragments chosen above.
        let mut statement = sqlx::query(sqlx::AssertSqlSafe(sql));
        for bind in binds {
            statement = statement.bind(bind);
        }
        let rows = statement.bind(i64::from(query.limit.max(1))).fetch_all(pool).await?;
        if relevance {
            // By relevance, a match far weaker than the best is left out: it only
            // shares a common word with the request, and would crowd the answer.
            let scores: Vec<f64> = rows.iter().map(|row| row.try_get("score")).collect::<Result<_, _>>()?;
            let best = scores.first().copied().unwrap_or_default();
            return rows
                .iter()
                .zip(scores)
                .filter(|(_, score)| *score <= best * WEAKEST_MATCH)
                .map(|(row, _)| email(row))
                .collect();
        }
        rows.iter().map(email).collect()
    }

    /// The email with `id`.
    pub async fn get(&self, id: &str) -> Result<Email, MailboxError> {
        let pool = self.pool().await?;
        let row = sqlx::query("SELECT * FROM emails WHERE id = ?").bind(id).fetch_optional(pool).await?;
        row.as_ref().map(email).transpose()?.ok_or_else(|| MailboxError::UnknownEmail(id.to_owned()))
    }

    /// Moves the email `id` to `folder` (`needs_review`, say); returns it as filed.
    pub async fn file(&self, id: &str, folder: &str) -> Result<Email, MailboxError> {
        let pool = self.pool().await?;
        let moved =
            sqlx::query("UPDATE emails SET folder = ? WHERE id = ?").bind(folder).bind(id).execute(pool).await?;
        if moved.rows_affected() == 0 {
            return Err(MailboxError::UnknownEmail(id.to_owned()));
        }
        self.get(id).await
    }

    /// The thread of the email `id` (or the thread called `id`), oldest first.
    pub async fn thread(&self, id: &str) -> Result<Vec<Email>, MailboxError> {
        let pool = self.pool().await?;
        let rows = sqlx::query(
            "SELECT * FROM emails WHERE thread_id = COALESCE((SELECT thread_id FROM emails WHERE id = ?1), ?1) \
             ORDER BY date",
        )
        .bind(id)
        .fetch_all(pool)
        .await?;
        if rows.is_empty() {
            return Err(MailboxError::UnknownEmail(id.to_owned()));
        }
        rows.iter().map(email).collect()
    }

    /// Stores a draft; a second call with the same idempotency key returns the
    /// first draft.
    pub async fn create_draft(&self, message: &Compose, key: &str) -> Result<Draft, MailboxError> {
        let pool = self.pool().await?;
        if let Some(reply_to) = &message.in_reply_to {
            self.get(reply_to).await?;
        }
        sqlx::query(
            "INSERT INTO drafts (idempotency_key, to_addr, cc, subject, body, in_reply_to, created_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (idempotency_key) DO NOTHING",
        )
        .bind(key)
        .bind(&message.to)
        .bind(&message.cc)
        .bind(&message.subject)
        .bind(&message.body)
        .bind(&message.in_reply_to)
        .bind(Utc::now().to_rfc3339())
        .execute(pool)
        .await?;
        let row = sqlx::query("SELECT * FROM drafts WHERE idempotency_key = ?").bind(key).fetch_one(pool).await?;
        draft(&row)
    }

    /// The draft `id`.
    pub async fn draft(&self, id: i64) -> Result<Draft, MailboxError> {
        let pool = self.pool().await?;
        let row = sqlx::query("SELECT * FROM drafts WHERE id = ?").bind(id).fetch_optional(pool).await?;
        row.as_ref().map(draft).transpose()?.ok_or(MailboxError::UnknownDraft(id))
    }

    /// Queues a message in the outbox (and files a copy under `sent`, in its
    /// thread), from a draft or composed in place. A second call with the same
    /// idempotency key returns the message the first one queued.
    pub async fn send(
        &self,
        draft_id: Option<i64>,
        message: Option<Compose>,
        key: &str,
    ) -> Result<OutboxMessage, MailboxError> {
        let pool = self.pool().await?;
        if let Some(queued) = self.queued(key).await? {
            return Ok(queued);
        }
        let message = match draft_id {
            Some(id) => {
                let draft = self.draft(id).await?;
                if draft.status == "sent" {
                    return Err(MailboxError::AlreadySent(id));
                }
                Compose {
                    to: draft.to,
                    cc: draft.cc,
                    subject: draft.subject,
                    body: draft.body,
                    in_reply_to: draft.in_reply_to,
                }
            }
            None => message.unwrap_or_default(),
        };
        let parent = match &message.in_reply_to {
            Some(reply_to) => Some(self.get(reply_to).await?),
            None => None,
        };
        let now = Utc::now();
        let message_id = format!("{}@troupe.local", key.replace(':', "."));
        let mut tx = pool.begin().await?;
        sqlx::query(
            "INSERT INTO outbox (idempotency_key, draft_id, message_id, from_addr, to_addr, cc, subject, body, \
             in_reply_to, queued_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(key)
        .bind(draft_id)
        .bind(&message_id)
        .bind(&self.options.address)
        .bind(&message.to)
        .bind(&message.cc)
        .bind(&message.subject)
        .bind(&message.body)
        .bind(&message.in_reply_to)
        .bind(now.to_rfc3339())
        .execute(&mut *tx)
        .await?;
        if let Some(id) = draft_id {
            sqlx::query("UPDATE drafts SET status = 'sent' WHERE id = ?").bind(id).execute(&mut *tx).await?;
        }
        let copy = NewEmail {
            id: message_id.clone(),
            thread_id: parent.as_ref().map(|parent| parent.thread_id.clone()),
            folder: "sent".to_owned(),
            from: self.options.address.clone(),
            to: message.to,
            cc: message.cc,
            subject: message.subject,
            date: now,
            in_reply_to: message.in_reply_to,
            references: Vec::new(),
            body: message.body,
        };
        insert_one(&mut tx, &copy).await?;
        tx.commit().await?;
        self.queued(key).await?.ok_or_else(|| MailboxError::Database("the queued message vanished".to_owned()))
    }

    async fn queued(&self, key: &str) -> Result<Option<OutboxMessage>, MailboxError> {
        let pool = self.pool().await?;
        let row = sqlx::query("SELECT * FROM outbox WHERE idempotency_key = ?").bind(key).fetch_optional(pool).await?;
        row.as_ref().map(outbox_message).transpose()
    }

    /// The outbox, oldest first.
    pub async fn outbox(&self) -> Result<Vec<OutboxMessage>, MailboxError> {
        let pool = self.pool().await?;
        let rows = sqlx::query("SELECT * FROM outbox ORDER BY id").fetch_all(pool).await?;
        rows.iter().map(outbox_message).collect()
    }
}

async fn count(pool: &SqlitePool) -> Result<i64, MailboxError> {
    Ok(sqlx::query_scalar("SELECT COUNT(*) FROM emails").fetch_one(pool).await?)
}

/// Stores the sample mailbox, its contacts and its calendar, dated relative to
/// `now`; returns how many emails were new. Each sample is parsed before anything
/// is written.
async fn seed(pool: &SqlitePool, now: DateTime<Local>) -> Result<usize, MailboxError> {
    let emails = import::parse_json(SAMPLE_MAILBOX, now)?;
    let contacts = calendar::parse_contacts(calendar::SAMPLE_CONTACTS)?;
    let events = calendar::parse_calendar(calendar::SAMPLE_CALENDAR, now.date_naive())?;
    let added = insert(pool, emails).await?;
    let mut tx = pool.begin().await?;
    insert_contacts(&mut tx, &contacts).await?;
    insert_events(&mut tx, &events).await?;
    tx.commit().await?;
    Ok(added)
}

/// Inserts `contacts` (none whose address is known); returns how many were new.
async fn insert_contacts(tx: &mut sqlx::SqliteConnection, contacts: &[Contact]) -> Result<usize, MailboxError> {
    let mut added = 0;
    for contact in contacts {
        let done = sqlx::query(
            "INSERT INTO contacts (email, name, company, relation, phone, notes) VALUES (?, ?, ?, ?, ?, ?) \
             ON CONFLICT (email) DO NOTHING",
        )
        .bind(&contact.email)
        .bind(&contact.name)
        .bind(&contact.company)
        .bind(&contact.relation)
        .bind(&contact.phone)
        .bind(&contact.notes)
        .execute(&mut *tx)
        .await?;
        added += done.rows_affected() as usize;
    }
    Ok(added)
}

/// Inserts `events` (none whose id is known); returns how many were new.
async fn insert_events(tx: &mut sqlx::SqliteConnection, events: &[CalendarEvent]) -> Result<usize, MailboxError> {
    let mut added = 0;
    for event in events {
        let done = sqlx::query(
            "INSERT INTO calendar_events (id, title, starts, ends, location, attendees) VALUES (?, ?, ?, ?, ?, ?) \
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(&event.id)
        .bind(&event.title)
        .bind(event.starts.format(calendar::DATE_TIME_FORMAT).to_string())
        .bind(event.ends.format(calendar::DATE_TIME_FORMAT).to_string())
        .bind(&event.location)
        .bind(&event.attendees)
        .execute(&mut *tx)
        .await?;
        added += done.rows_affected() as usize;
    }
    Ok(added)
}

/// Inserts `emails` oldest first, so a reply finds the thread of what it answers.
async fn insert(pool: &SqlitePool, mut emails: Vec<NewEmail>) -> Result<usize, MailboxError> {
    emails.sort_by_key(|email| email.date);
    let mut tx = pool.begin().await?;
    let mut added = 0;
    for email in &emails {
        added += insert_one(&mut tx, email).await?;
    }
    tx.commit().await?;
    Ok(added)
}

/// Inserts one email (none if its id is known); its thread is the one given, else
/// the thread of the email it answers or of the first known reference, else its own.
async fn insert_one(tx: &mut sqlx::SqliteConnection, email: &NewEmail) -> Result<usize, MailboxError> {
    let mut thread_id = email.thread_id.clone();
    let parents = email.in_reply_to.iter().chain(email.references.iter().rev());
    for parent in parents {
        if thread_id.is_some() {
            break;
        }
        thread_id = sqlx::query_scalar("SELECT thread_id FROM emails WHERE id = ?")
            .bind(parent)
            .fetch_optional(&mut *tx)
            .await?;
    }
    let done = sqlx::query(
        "INSERT INTO emails (id, thread_id, folder, from_addr, to_addr, cc, subject, date, in_reply_to, refs, body) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
    )
    .bind(&email.id)
    .bind(thread_id.unwrap_or_else(|| email.id.clone()))
    .bind(&email.folder)
    .bind(&email.from)
    .bind(&email.to)
    .bind(&email.cc)
    .bind(&email.subject)
    .bind(timestamp(email.date))
    .bind(&email.in_reply_to)
    .bind(email.references.join(" "))
    .bind(&email.body)
    .execute(&mut *tx)
    .await?;
    Ok(done.rows_affected() as usize)
}

/// How dates are stored: UTC, to the second, `Z`; so text order is time order.
fn timestamp(date: DateTime<Utc>) -> String {
    date.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The start of a local day, in UTC.
fn day_start(day: NaiveDate) -> DateTime<Utc> {
    let midnight = day.and_hms_opt(0, 0, 0).unwrap_or_default();
    Local
        .from_local_datetime(&midnight)
        .earliest()
        .map_or_else(|| midnight.and_utc(), |start| start.with_timezone(&Utc))
}

/// The emails whose ids are words of `text`, in the order the text names them.
async fn named_emails(pool: &SqlitePool, text: &str) -> Result<Vec<Email>, MailboxError> {
    let mut found: Vec<Email> = Vec::new();
    let words = text.split_whitespace().map(|word| {
        word.trim_matches(|c: char| matches!(c, '<' | '>' | '"' | '\'' | ',' | '.' | '?' | '!' | ';' | ':' | '(' | ')'))
    });
    for word in words.filter(|word| word.contains('@')) {
        let row = sqlx::query("SELECT * FROM emails WHERE id = ?").bind(word).fetch_optional(pool).await?;
        if let Some(row) = row {
            let named = email(&row)?;
            if !found.iter().any(|earlier| earlier.id == named.id) {
                found.push(named);
            }
        }
    }
    Ok(found)
}

/// Words to stop searching for: they are in nearly every email.
const STOP_WORDS: &[&str] = &[
    "a", "am", "an", "and", "any", "are", "do", "for", "have", "i", "in", "is", "it", "me", "my", "of", "on", "or",
    "the", "to", "what", "whats", "with", "you",
];

/// `text` as FTS5 phrases: each whitespace-separated word quoted (so `A-10482` is
/// the phrase "a 10482" and no character has an FTS meaning), stop words dropped.
fn fts_terms(text: &str) -> Vec<String> {
    text.split_whitespace()
        .map(|word| word.replace('"', ""))
        .filter(|word| word.chars().any(char::is_alphanumeric))
        .filter(|word| {
            let bare: String = word.chars().filter(|c| c.is_alphanumeric()).flat_map(char::to_lowercase).collect();
            !STOP_WORDS.contains(&bare.as_str())
        })
        .map(|word| format!("\"{word}\""))
        .collect()
}

/// A relative day in `text` (`today`, `tomorrow`, `yesterday`) as the phrases mail
/// writes that date in: `Friday, 27 November 2026` and `2026-11-27` (FTS5 phrases
/// of their words), so a question about today finds the emails that name today's
/// date, whenever they were sent.
fn day_terms(text: &str, today: NaiveDate) -> Vec<String> {
    let mut terms = Vec::new();
    for word in text.split(|c: char| !c.is_alphanumeric()) {
        let offset = match word.to_lowercase().as_str() {
            "today" | "tonight" => 0,
            "tomorrow" => 1,
            "yesterday" => -1,
            _ => continue,
        };
        let day = today + chrono::Duration::days(offset);
        for phrase in [day.format("%-d %B %Y").to_string(), day.format("%Y %m %d").to_string()] {
            let phrase = format!("\"{phrase}\"");
            if !terms.contains(&phrase) {
                terms.push(phrase);
            }
        }
    }
    terms
}

#[cfg(test)]
pub(super) fn day_terms_for_test(text: &str, today: NaiveDate) -> Vec<String> {
    day_terms(text, today)
}

fn email(row: &SqliteRow) -> Result<Email, MailboxError> {
    let date: String = row.try_get("date")?;
    let date = DateTime::parse_from_rfc3339(&date)
        .map_err(|error| MailboxError::Database(format!("bad stored date {date:?}: {error}")))?;
    Ok(Email {
        id: row.try_get("id")?,
        thread_id: row.try_get("thread_id")?,
        folder: row.try_get("folder")?,
        from: row.try_get("from_addr")?,
        to: row.try_get("to_addr")?,
        cc: row.try_get("cc")?,
        subject: row.try_get("subject")?,
        date: date.with_timezone(&Local),
        in_reply_to: row.try_get("in_reply_to")?,
        body: row.try_get("body")?,
    })
}

fn draft(row: &SqliteRow) -> Result<Draft, MailboxError> {
    Ok(Draft {
        id: row.try_get("id")?,
        to: row.try_get("to_addr")?,
        cc: row.try_get("cc")?,
        subject: row.try_get("subject")?,
        body: row.try_get("body")?,
        in_reply_to: row.try_get("in_reply_to")?,
        status: row.try_get("status")?,
    })
}

/// A contact from its row.
fn contact(row: &SqliteRow) -> Result<Contact, MailboxError> {
    Ok(Contact {
        email: row.try_get("email")?,
        name: row.try_get("name")?,
        company: row.try_get("company")?,
        relation: row.try_get("relation")?,
        phone: row.try_get("phone")?,
        notes: row.try_get("notes")?,
    })
}

/// A calendar event from its row.
fn event(row: &SqliteRow) -> Result<CalendarEvent, MailboxError> {
    let stored = |column: &str| -> Result<NaiveDateTime, MailboxError> {
        let text: String = row.try_get(column)?;
        calendar::date_time(&text).map_err(|error| MailboxError::Database(format!("bad stored {column}: {error}")))
    };
    Ok(CalendarEvent {
        id: row.try_get("id")?,
        title: row.try_get("title")?,
        starts: stored("starts")?,
        ends: stored("ends")?,
        location: row.try_get("location")?,
        attendees: row.try_get("attendees")?,
    })
}

fn outbox_message(row: &SqliteRow) -> Result<OutboxMessage, MailboxError> {
    let queued_at: String = row.try_get("queued_at")?;
    Ok(OutboxMessage {
        id: row.try_get("id")?,
        message_id: row.try_get("message_id")?,
        draft_id: row.try_get("draft_id")?,
        from: row.try_get("from_addr")?,
        to: row.try_get("to_addr")?,
        subject: row.try_get("subject")?,
        body: row.try_get("body")?,
        in_reply_to: row.try_get("in_reply_to")?,
        queued_at: DateTime::parse_from_rfc3339(&queued_at).map_or_else(|_| Utc::now(), |at| at.with_timezone(&Utc)),
    })
}
