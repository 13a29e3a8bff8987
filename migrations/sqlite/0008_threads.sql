-- troupe schema v8 (SQLite): threads (conversations whose runs follow each
-- other), a run's thread and metadata, and the idempotency keys that runs and
-- threads were created under (with a fingerprint of the request, so that a retry
-- is told from another request under the same key).

ALTER TABLE runs ADD COLUMN thread_id TEXT;
ALTER TABLE runs ADD COLUMN metadata TEXT;
ALTER TABLE runs ADD COLUMN idempotency_key TEXT;
ALTER TABLE runs ADD COLUMN request_fingerprint TEXT;
CREATE INDEX runs_by_thread ON runs (thread_id, run_id) WHERE thread_id IS NOT NULL;
CREATE INDEX runs_by_idempotency_key ON runs (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL;

CREATE TABLE threads (
    thread_id           TEXT PRIMARY KEY,
    tenant              TEXT NOT NULL,
    agent               TEXT NOT NULL,
    metadata            TEXT,
    idempotency_key     TEXT,
    request_fingerprint TEXT,
    summary             TEXT,
    summary_through     TEXT,
    created_at          TEXT NOT NULL,
    updated_at          TEXT NOT NULL
);
CREATE INDEX threads_by_tenant ON threads (tenant, thread_id);
CREATE INDEX threads_by_idempotency_key ON threads (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL;

DROP VIEW runs_now;
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
       r.ended_at,
       r.thread_id, r.metadata, r.idempotency_key, r.request_fingerprint
FROM runs r
LEFT JOIN run_events e
    ON e.run_key = r.run_key
   AND e.last_seq = (SELECT MAX(m.last_seq) FROM run_events m WHERE m.run_key = r.run_key)
   AND e.last_seq > r.last_seq
   AND e.committed_at IS NOT NULL;
