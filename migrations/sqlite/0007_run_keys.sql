-- troupe schema v7 (SQLite): every run has an integer key (`run_key`, the rowid of
-- its `runs` row), and the child tables name their run by it instead of by its
-- 36-character id. The child tables' primary keys begin with the run, and the
-- runs in flight all write to the end of their ranges, so every group commit
-- rewrote the index pages holding those ranges: with text ids an entry took about
-- 50 bytes, with integer keys about 12, and a group dirties about a quarter of
-- the index pages. The store's writer allocates the keys (it is the only one that
-- creates runs); existing runs are numbered in the order of their ids (which are
-- time-ordered). The run id stays unique on `runs`: reads find the run by it, and
-- then its rows by the key. SQLite cannot change a primary key, so every table is
-- copied into a new one.

DROP VIEW runs_now;

CREATE TABLE runs_v7 (
    run_key        INTEGER PRIMARY KEY,
    run_id         TEXT NOT NULL UNIQUE,
    tenant         TEXT NOT NULL,
    parent_run_id  TEXT,
    agent          TEXT NOT NULL,
    input          TEXT NOT NULL,
    limits         TEXT NOT NULL,
    status         TEXT NOT NULL,
    reason         TEXT,
    turn           INTEGER NOT NULL,
    usage          TEXT NOT NULL,
    final_output   TEXT,
    last_seq       INTEGER NOT NULL,
    created_at     TEXT NOT NULL,
    updated_at     TEXT NOT NULL,
    message_count  INTEGER NOT NULL DEFAULT 0,
    tool_count     INTEGER NOT NULL DEFAULT 0,
    document_count INTEGER NOT NULL DEFAULT 0,
    ended_at       TEXT
);
INSERT INTO runs_v7 (run_key, run_id, tenant, parent_run_id, agent, input, limits, status, reason, turn, usage,
                     final_output, last_seq, created_at, updated_at, message_count, tool_count, document_count,
                     ended_at)
    SELECT ROW_NUMBER() OVER (ORDER BY run_id), run_id, tenant, parent_run_id, agent, input, limits, status, reason,
           turn, usage, final_output, last_seq, created_at, updated_at, message_count, tool_count, document_count,
           ended_at
    FROM runs;

CREATE TABLE run_events_v7 (
    run_key        INTEGER NOT NULL REFERENCES runs_v7 (run_key) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
    last_seq       INTEGER NOT NULL,
    first_seq      INTEGER NOT NULL,
    tenant         TEXT NOT NULL,
    body           TEXT NOT NULL,
    turn           INTEGER,
    usage          TEXT,
    message_count  INTEGER,
    tool_count     INTEGER,
    document_count INTEGER,
    committed_at   TEXT,
    PRIMARY KEY (run_key, last_seq)
);
INSERT INTO run_events_v7 (run_key, last_seq, first_seq, tenant, body, turn, usage, message_count, tool_count,
                           document_count, committed_at)
    SELECT r.run_key, e.last_seq, e.first_seq, e.tenant, e.body, e.turn, e.usage, e.message_count, e.tool_count,
           e.document_count, e.committed_at
    FROM run_events e JOIN runs_v7 r ON r.run_id = e.run_id;
DROP TABLE run_events;

CREATE TABLE messages_v7 (
    run_key INTEGER NOT NULL REFERENCES runs_v7 (run_key) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
    idx     INTEGER NOT NULL,
    tenant  TEXT NOT NULL,
    turn    INTEGER NOT NULL,
    body    TEXT NOT NULL,
    PRIMARY KEY (run_key, idx)
);
INSERT INTO messages_v7 (run_key, idx, tenant, turn, body)
    SELECT r.run_key, m.idx, m.tenant, m.turn, m.body FROM messages m JOIN runs_v7 r ON r.run_id = m.run_id;
DROP TABLE messages;

CREATE TABLE tool_executions_v7 (
    run_key INTEGER NOT NULL REFERENCES runs_v7 (run_key) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
    turn    INTEGER NOT NULL,
    call_id TEXT NOT NULL,
    idx     INTEGER NOT NULL,
    tenant  TEXT NOT NULL,
    status  TEXT NOT NULL,
    body    TEXT NOT NULL,
    PRIMARY KEY (run_key, turn, call_id)
);
INSERT INTO tool_executions_v7 (run_key, turn, call_id, idx, tenant, status, body)
    SELECT r.run_key, t.turn, t.call_id, t.idx, t.tenant, t.status, t.body
    FROM tool_executions t JOIN runs_v7 r ON r.run_id = t.run_id;
DROP TABLE tool_executions;

CREATE TABLE plans_v7 (
    run_key INTEGER NOT NULL REFERENCES runs_v7 (run_key) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
    version INTEGER NOT NULL,
    tenant  TEXT NOT NULL,
    body    TEXT NOT NULL,
    PRIMARY KEY (run_key, version)
);
INSERT INTO plans_v7 (run_key, version, tenant, body)
    SELECT r.run_key, p.version, p.tenant, p.body FROM plans p JOIN runs_v7 r ON r.run_id = p.run_id;
DROP TABLE plans;

CREATE TABLE reviews_v7 (
    run_key INTEGER NOT NULL REFERENCES runs_v7 (run_key) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
    turn    INTEGER NOT NULL,
    tenant  TEXT NOT NULL,
    body    TEXT NOT NULL,
    PRIMARY KEY (run_key, turn)
);
INSERT INTO reviews_v7 (run_key, turn, tenant, body)
    SELECT r.run_key, v.turn, v.tenant, v.body FROM reviews v JOIN runs_v7 r ON r.run_id = v.run_id;
DROP TABLE reviews;

CREATE TABLE documents_v7 (
    run_key INTEGER NOT NULL REFERENCES runs_v7 (run_key) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
    idx     INTEGER NOT NULL,
    tenant  TEXT NOT NULL,
    body    TEXT NOT NULL,
    PRIMARY KEY (run_key, idx)
);
INSERT INTO documents_v7 (run_key, idx, tenant, body)
    SELECT r.run_key, d.idx, d.tenant, d.body FROM documents d JOIN runs_v7 r ON r.run_id = d.run_id;
DROP TABLE documents;

-- No table refers to the old runs table any more; renaming runs_v7 renames the
-- references to it in the new tables' foreign keys.
DROP TABLE runs;
ALTER TABLE runs_v7 RENAME TO runs;
ALTER TABLE run_events_v7 RENAME TO run_events;
ALTER TABLE messages_v7 RENAME TO messages;
ALTER TABLE tool_executions_v7 RENAME TO tool_executions;
ALTER TABLE plans_v7 RENAME TO plans;
ALTER TABLE reviews_v7 RENAME TO reviews;
ALTER TABLE documents_v7 RENAME TO documents;
CREATE INDEX runs_by_tenant ON runs (tenant, run_id);
CREATE INDEX runs_by_status ON runs (status);
CREATE INDEX runs_by_end ON runs (ended_at) WHERE ended_at IS NOT NULL;

CREATE VIEW runs_now AS
SELECT r.run_key, r.run_id, r.tenant, r.parent_run_id, r.agent, r.input, r.limits, r.status, r.reason,
       COALESCE(e.turn, r.turn) AS turn,
       COALESCE(e.usage, r.usage) AS usage,
       r.final_output,
       COALESCE(e.last_seq, r.last_seq) AS last_seq,
       COALESCE(e.message_count, r.message_count) AS message_count,
       COALESCE(e.tool_count, r.tool_count) AS tool_count,
       COALESCE(e.document_count, r.document_count) AS document_count,
       r.created_at,
       COALESCE(e.committed_at, r.updated_at) AS updated_at,
       r.ended_at
FROM runs r
LEFT JOIN run_events e
    ON e.run_key = r.run_key
   AND e.last_seq = (SELECT MAX(m.last_seq) FROM run_events m WHERE m.run_key = r.run_key)
   AND e.last_seq > r.last_seq
   AND e.committed_at IS NOT NULL;
