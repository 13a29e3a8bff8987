-- The mailbox (see mailbox.rs). Idempotent: run on every open.
CREATE TABLE IF NOT EXISTS emails (
    id          TEXT PRIMARY KEY,         -- the Message-ID without brackets
    thread_id   TEXT NOT NULL,            -- the id of the thread's first email
    folder      TEXT NOT NULL,            -- inbox, sent, spam, archive, trash…
    from_addr   TEXT NOT NULL,
    to_addr     TEXT NOT NULL,
    cc          TEXT NOT NULL DEFAULT '',
    subject     TEXT NOT NULL,
    date        TEXT NOT NULL,            -- UTC, RFC 3339 with Z: text order is time order
    in_reply_to TEXT,
    refs        TEXT NOT NULL DEFAULT '', -- Message-IDs, space-separated
    body        TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS emails_by_thread ON emails (thread_id, date);
CREATE INDEX IF NOT EXISTS emails_by_date ON emails (date);

-- Full-text index over the emails table (external content, kept by triggers).
CREATE VIRTUAL TABLE IF NOT EXISTS emails_fts USING fts5 (
    subject, body, from_addr, to_addr,
    content = 'emails', content_rowid = 'rowid', tokenize = 'porter unicode61'
);
CREATE TRIGGER IF NOT EXISTS emails_fts_insert AFTER INSERT ON emails BEGIN
    INSERT INTO emails_fts (rowid, subject, body, from_addr, to_addr)
    VALUES (new.rowid, new.subject, new.body, new.from_addr, new.to_addr);
END;
CREATE TRIGGER IF NOT EXISTS emails_fts_delete AFTER DELETE ON emails BEGIN
    INSERT INTO emails_fts (emails_fts, rowid, subject, body, from_addr, to_addr)
    VALUES ('delete', old.rowid, old.subject, old.body, old.from_addr, old.to_addr);
END;
CREATE TRIGGER IF NOT EXISTS emails_fts_update AFTER UPDATE OF subject, body, from_addr, to_addr ON emails BEGIN
    INSERT INTO emails_fts (emails_fts, rowid, subject, body, from_addr, to_addr)
    VALUES ('delete', old.rowid, old.subject, old.body, old.from_addr, old.to_addr);
    INSERT INTO emails_fts (rowid, subject, body, from_addr, to_addr)
    VALUES (new.rowid, new.subject, new.body, new.from_addr, new.to_addr);
END;

CREATE TABLE IF NOT EXISTS drafts (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL UNIQUE, -- the create_draft call's: a repeat writes nothing
    to_addr         TEXT NOT NULL,
    cc              TEXT NOT NULL DEFAULT '',
    subject         TEXT NOT NULL,
    body            TEXT NOT NULL,
    in_reply_to     TEXT,
    created_at      TEXT NOT NULL,
    status          TEXT NOT NULL DEFAULT 'draft' -- draft | sent
);

CREATE TABLE IF NOT EXISTS outbox (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL UNIQUE, -- the send_email call's: sent at most once
    draft_id        INTEGER REFERENCES drafts (id),
    message_id      TEXT NOT NULL,
    from_addr       TEXT NOT NULL,
    to_addr         TEXT NOT NULL,
    cc              TEXT NOT NULL DEFAULT '',
    subject         TEXT NOT NULL,
    body            TEXT NOT NULL,
    in_reply_to     TEXT,
    queued_at       TEXT NOT NULL
);

-- The owner's address book (see calendar.rs), one row per address.
CREATE TABLE IF NOT EXISTS contacts (
    email    TEXT PRIMARY KEY,         -- the address, lower-case
    name     TEXT NOT NULL DEFAULT '',
    company  TEXT NOT NULL DEFAULT '',
    relation TEXT NOT NULL DEFAULT '', -- customer, supplier, colleague, family…
    phone    TEXT NOT NULL DEFAULT '',
    notes    TEXT NOT NULL DEFAULT ''
);

-- The owner's calendar (see calendar.rs).
CREATE TABLE IF NOT EXISTS calendar_events (
    id        TEXT PRIMARY KEY,
    title     TEXT NOT NULL,
    starts    TEXT NOT NULL,            -- local time, YYYY-MM-DDTHH:MM: text order is time order
    ends      TEXT NOT NULL,            -- the same, after starts
    location  TEXT NOT NULL DEFAULT '',
    attendees TEXT NOT NULL DEFAULT ''  -- Name <address>, comma-separated
);
CREATE INDEX IF NOT EXISTS calendar_events_by_start ON calendar_events (starts);
