-- troupe schema v4 (SQLite): one run_events row per commit, holding that commit's
-- events (first_seq..=last_seq, gap-free) as a JSON array, instead of one row per
-- event: a turn writes three or four rows of events instead of about eleven. The
-- key is the batch's last seq, so the rows after a seq start at the one that holds
-- the next event. Existing events become batches of one.
CREATE TABLE run_events_v4 (
    run_id    TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
    last_seq  INTEGER NOT NULL,
    first_seq INTEGER NOT NULL,
    tenant    TEXT NOT NULL,
    body      TEXT NOT NULL,
    PRIMARY KEY (run_id, last_seq)
);
INSERT INTO run_events_v4 (run_id, last_seq, first_seq, tenant, body)
    SELECT run_id, seq, seq, tenant, '[' || body || ']' FROM run_events;
DROP TABLE run_events;
ALTER TABLE run_events_v4 RENAME TO run_events;
