-- troupe schema v7 (PostgreSQL), as SQLite's v7: every run has an integer key
-- (`run_key`), allocated by the store's writer, and the child tables name their
-- run by it instead of by its 36-character id, so the entries of their primary
-- keys (which every group commit adds to, at the end of each running run's range)
-- are a quarter of the size. Existing runs are numbered in the order of their ids
-- (which are time-ordered). `run_id` stays the primary key of `runs`: reads find
-- the run by it, and then its rows by the key.

DROP VIEW runs_now;

ALTER TABLE runs ADD COLUMN run_key BIGINT;
UPDATE runs SET run_key = numbered.run_key
FROM (SELECT run_id, ROW_NUMBER() OVER (ORDER BY run_id) AS run_key FROM runs) numbered
WHERE runs.run_id = numbered.run_id;
ALTER TABLE runs ALTER COLUMN run_key SET NOT NULL;
ALTER TABLE runs ADD CONSTRAINT runs_run_key_key UNIQUE (run_key);

-- Each child table: the key beside the id, filled from the run; then the id goes
-- (and with it the primary key and the foreign key that began with it).
ALTER TABLE run_events ADD COLUMN run_key BIGINT;
UPDATE run_events SET run_key = runs.run_key FROM runs WHERE runs.run_id = run_events.run_id;
ALTER TABLE run_events DROP COLUMN run_id;
ALTER TABLE run_events ALTER COLUMN run_key SET NOT NULL;
ALTER TABLE run_events ADD CONSTRAINT run_events_pkey PRIMARY KEY (run_key, last_seq);
ALTER TABLE run_events ADD CONSTRAINT run_events_run_key_fkey FOREIGN KEY (run_key) REFERENCES runs (run_key)
    ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED;

ALTER TABLE messages ADD COLUMN run_key BIGINT;
UPDATE messages SET run_key = runs.run_key FROM runs WHERE runs.run_id = messages.run_id;
ALTER TABLE messages DROP COLUMN run_id;
ALTER TABLE messages ALTER COLUMN run_key SET NOT NULL;
ALTER TABLE messages ADD CONSTRAINT messages_pkey PRIMARY KEY (run_key, idx);
ALTER TABLE messages ADD CONSTRAINT messages_run_key_fkey FOREIGN KEY (run_key) REFERENCES runs (run_key)
    ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED;

ALTER TABLE tool_executions ADD COLUMN run_key BIGINT;
UPDATE tool_executions SET run_key = runs.run_key FROM runs WHERE runs.run_id = tool_executions.run_id;
ALTER TABLE tool_executions DROP COLUMN run_id;
ALTER TABLE tool_executions ALTER COLUMN run_key SET NOT NULL;
ALTER TABLE tool_executions ADD CONSTRAINT tool_executions_pkey PRIMARY KEY (run_key, turn, call_id);
ALTER TABLE tool_executions ADD CONSTRAINT tool_executions_run_key_fkey FOREIGN KEY (run_key) REFERENCES runs (run_key)
    ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED;

ALTER TABLE plans ADD COLUMN run_key BIGINT;
UPDATE plans SET run_key = runs.run_key FROM runs WHERE runs.run_id = plans.run_id;
ALTER TABLE plans DROP COLUMN run_id;
ALTER TABLE plans ALTER COLUMN run_key SET NOT NULL;
ALTER TABLE plans ADD CONSTRAINT plans_pkey PRIMARY KEY (run_key, version);
ALTER TABLE plans ADD CONSTRAINT plans_run_key_fkey FOREIGN KEY (run_key) REFERENCES runs (run_key)
    ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED;

ALTER TABLE reviews ADD COLUMN run_key BIGINT;
UPDATE reviews SET run_key = runs.run_key FROM runs WHERE runs.run_id = reviews.run_id;
ALTER TABLE reviews DROP COLUMN run_id;
ALTER TABLE reviews ALTER COLUMN run_key SET NOT NULL;
ALTER TABLE reviews ADD CONSTRAINT reviews_pkey PRIMARY KEY (run_key, turn);
ALTER TABLE reviews ADD CONSTRAINT reviews_run_key_fkey FOREIGN KEY (run_key) REFERENCES runs (run_key)
    ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED;

ALTER TABLE documents ADD COLUMN run_key BIGINT;
UPDATE documents SET run_key = runs.run_key FROM runs WHERE runs.run_id = documents.run_id;
ALTER TABLE documents DROP COLUMN run_id;
ALTER TABLE documents ALTER COLUMN run_key SET NOT NULL;
ALTER TABLE documents ADD CONSTRAINT documents_pkey PRIMARY KEY (run_key, idx);
ALTER TABLE documents ADD CONSTRAINT documents_run_key_fkey FOREIGN KEY (run_key) REFERENCES runs (run_key)
    ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED;

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
-- LATERAL: the newest row of each run, found by the key, whatever else is read.
LEFT JOIN LATERAL (
    SELECT m.last_seq, m.turn, m.usage, m.message_count, m.tool_count, m.document_count, m.committed_at
    FROM run_events m
    WHERE m.run_key = r.run_key
    ORDER BY m.last_seq DESC
    LIMIT 1
) e ON e.last_seq > r.last_seq AND e.committed_at IS NOT NULL;
