-- troupe schema v6 (PostgreSQL), as SQLite's v6: a commit's run_events row also
-- holds what the commit left the run's progress at, so that a commit with events
-- to a running run writes no `runs` row; `runs_now` gives each run's progress from
-- its newest row (the `runs` row unless a run_events row has a higher `last_seq`).
ALTER TABLE run_events ADD COLUMN turn BIGINT;
ALTER TABLE run_events ADD COLUMN usage TEXT;
ALTER TABLE run_events ADD COLUMN message_count BIGINT;
ALTER TABLE run_events ADD COLUMN tool_count BIGINT;
ALTER TABLE run_events ADD COLUMN document_count BIGINT;
ALTER TABLE run_events ADD COLUMN committed_at TEXT;

CREATE VIEW runs_now AS
SELECT r.run_id, r.tenant, r.parent_run_id, r.agent, r.input, r.limits, r.status, r.reason,
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
    WHERE m.run_id = r.run_id
    ORDER BY m.last_seq DESC
    LIMIT 1
) e ON e.last_seq > r.last_seq AND e.committed_at IS NOT NULL;
