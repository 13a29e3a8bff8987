-- troupe schema v4 (PostgreSQL), as SQLite's v4: one run_events row per commit,
-- holding that commit's events (first_seq..=last_seq, gap-free) as a JSON array,
-- keyed by the batch's last seq. Existing events become batches of one.
CREATE TABLE run_events_v4 (
    run_id    TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
    last_seq  BIGINT NOT NULL,
    first_seq BIGINT NOT NULL,
    tenant    TEXT NOT NULL,
    body      TEXT NOT NULL,
    PRIMARY KEY (run_id, last_seq)
);
INSERT INTO run_events_v4 (run_id, last_seq, first_seq, tenant, body)
    SELECT run_id, seq, seq, tenant, '[' || body || ']' FROM run_events;
DROP TABLE run_events;
ALTER TABLE run_events_v4 RENAME TO run_events;
ALTER TABLE run_events RENAME CONSTRAINT run_events_v4_pkey TO run_events_pkey;
ALTER TABLE run_events RENAME CONSTRAINT run_events_v4_run_id_fkey TO run_events_run_id_fkey;
