-- troupe schema v5: when a run ended (`ended_at`, set with its terminal status),
-- which retention ages runs by, and `runs_by_status` on the status alone. A commit
-- to a running run sets none of the indexed columns (its `updated_at` was in
-- `runs_by_status`, so every commit moved the run's entry in that index); only the
-- commit that changes a run's status writes `status` and `ended_at`.
ALTER TABLE runs ADD COLUMN ended_at TEXT;
UPDATE runs SET ended_at = updated_at WHERE status IN ('succeeded', 'failed', 'cancelled');
DROP INDEX runs_by_status;
CREATE INDEX runs_by_status ON runs (status);
CREATE INDEX runs_by_end ON runs (ended_at) WHERE ended_at IS NOT NULL;
