-- troupe schema v9 (PostgreSQL): the W3C trace context a run belongs to (`traceparent`: the
-- span of the request that created it, or of its caller's tool call), so that its
-- spans join the client's trace, also when the run resumes after a restart.

ALTER TABLE runs ADD COLUMN traceparent TEXT;

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
       r.thread_id, r.metadata, r.idempotency_key, r.request_fingerprint, r.traceparent
FROM runs r
LEFT JOIN LATERAL (
    SELECT m.last_seq, m.turn, m.usage, m.message_count, m.tool_count, m.document_count, m.committed_at
    FROM run_events m
    WHERE m.run_key = r.run_key
    ORDER BY m.last_seq DESC
    LIMIT 1
) e ON e.last_seq > r.last_seq AND e.committed_at IS NOT NULL;
