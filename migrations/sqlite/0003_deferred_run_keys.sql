-- troupe schema v3 (SQLite): the child tables' foreign keys on their run are
-- checked at commit (DEFERRABLE INITIALLY DEFERRED; ON DELETE CASCADE still acts
-- at once). Same tables, columns and keys. An immediate foreign key makes every
-- multi-row INSERT keep a statement journal (a copy of each page it changes, to
-- undo that one statement); the writer writes only multi-row statements, and
-- writes them OR FAIL so that NOT NULL and key checks need no journal either. A
-- failure still fails the group's transaction, which is rolled back and written
-- again commit by commit. SQLite cannot alter a constraint, so each table is
-- copied into a new one. (WITHOUT ROWID tables were measured too and cost more
-- instructions: their rows, 120 to 550 bytes, split pages in mid-tree.)

CREATE TABLE run_events_v3 (
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
    seq    INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    kind   TEXT NOT NULL,
    body   TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
INSERT INTO run_events_v3 (run_id, seq, tenant, kind, body) SELECT run_id, seq, tenant, kind, body FROM run_events;
DROP TABLE run_events;
ALTER TABLE run_events_v3 RENAME TO run_events;

CREATE TABLE messages_v3 (
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
    idx    INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    turn   INTEGER NOT NULL,
    body   TEXT NOT NULL,
    PRIMARY KEY (run_id, idx)
);
INSERT INTO messages_v3 (run_id, idx, tenant, turn, body) SELECT run_id, idx, tenant, turn, body FROM messages;
DROP TABLE messages;
ALTER TABLE messages_v3 RENAME TO messages;

CREATE TABLE tool_executions_v3 (
    run_id  TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
    turn    INTEGER NOT NULL,
    call_id TEXT NOT NULL,
    idx     INTEGER NOT NULL,
    tenant  TEXT NOT NULL,
    status  TEXT NOT NULL,
    body    TEXT NOT NULL,
    PRIMARY KEY (run_id, turn, call_id)
);
INSERT INTO tool_executions_v3 (run_id, turn, call_id, idx, tenant, status, body) SELECT run_id, turn, call_id, idx, tenant, status, body FROM tool_executions;
DROP TABLE tool_executions;
ALTER TABLE tool_executions_v3 RENAME TO tool_executions;

CREATE TABLE plans_v3 (
    run_id  TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
    version INTEGER NOT NULL,
    tenant  TEXT NOT NULL,
    body    TEXT NOT NULL,
    PRIMARY KEY (run_id, version)
);
INSERT INTO plans_v3 (run_id, version, tenant, body) SELECT run_id, version, tenant, body FROM plans;
DROP TABLE plans;
ALTER TABLE plans_v3 RENAME TO plans;

CREATE TABLE reviews_v3 (
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
    turn   INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    body   TEXT NOT NULL,
    PRIMARY KEY (run_id, turn)
);
INSERT INTO reviews_v3 (run_id, turn, tenant, body) SELECT run_id, turn, tenant, body FROM reviews;
DROP TABLE reviews;
ALTER TABLE reviews_v3 RENAME TO reviews;

CREATE TABLE documents_v3 (
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
    idx    INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    body   TEXT NOT NULL,
    PRIMARY KEY (run_id, idx)
);
INSERT INTO documents_v3 (run_id, idx, tenant, body) SELECT run_id, idx, tenant, body FROM documents;
DROP TABLE documents;
ALTER TABLE documents_v3 RENAME TO documents;
