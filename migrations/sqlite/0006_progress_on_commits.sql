-- troupe schema v6 (SQLite): a commit's run_events row also holds what the commit
-- left the run's progress at (turn, usage, the counters that number its messages,
-- tool calls and documents, and the commit's time), so that a commit with events
-- to a running run writes no `runs` row: every group commit rewrote the row of
-- every run it touched, a quarter of the pages it wrote. The `runs` row is still
-- written whole when the status, reason or final output change, and by a commit
-- without events. A run's progress is that of its newest row: the `runs` row
-- unless a run_events row has a higher `last_seq` (`runs_now`, which every read
-- of a run goes through). Rows written before v6 leave these columns NULL; their
-- runs rows were written with every commit, so none of them is newer.
ALTER TABLE run_events ADD COLUMN turn INTEGER;
ALTER TABLE run_events ADD COLUMN usage TEXT;
ALTER TABLE run_events ADD COLUMN message_count INTEGER;
ALTER TABLE run_events ADD COLUMN tool_count INTEGER;
ALTER TABLE run_events ADD COLUMN document_count INTEGER;
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
LEFT JOIN run_events e
    ON e.run_id = r.run_id
   AND e.last_seq = (SELECT MAX(m.last_seq) FROM run_events m WHERE m.run_id = r.run_id)
   AND e.last_seq > r.last_seq
   AND e.committed_at IS NOT NULL;
