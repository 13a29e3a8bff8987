-- troupe schema v10 (PostgreSQL): several daemons on one database. A run is driven
-- by the node that owns it (`owner`, a node id) under an `epoch` that grows with
-- each claim; a node holds its runs while its row in `cluster_nodes` has a lease
-- in the future (on the database's clock). Run keys come from a sequence, in
-- blocks of 1,024 (one block per group commit that creates runs), so that nodes
-- never allocate the same key.

ALTER TABLE runs ADD COLUMN owner TEXT;
ALTER TABLE runs ADD COLUMN epoch BIGINT NOT NULL DEFAULT 0;
CREATE INDEX runs_unfinished ON runs (run_key) WHERE status IN ('queued', 'running', 'waiting_input');

CREATE TABLE cluster_nodes (
    node_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    lease_until TIMESTAMPTZ NOT NULL
);

CREATE SEQUENCE run_keys INCREMENT BY 1024;
SELECT setval('run_keys', COALESCE((SELECT MAX(run_key) FROM runs), 0) + 1, false);

-- Input, approvals and cancels sent to a node that does not drive their run: the
-- owner takes them (`taken_by`), applies them, and answers in `outcome`.
CREATE TABLE run_commands (
    id BIGSERIAL PRIMARY KEY,
    run_id TEXT NOT NULL,
    body TEXT NOT NULL,
    taken_by TEXT,
    outcome TEXT,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX run_commands_open ON run_commands (run_id) WHERE taken_by IS NULL;
