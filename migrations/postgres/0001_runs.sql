-- troupe schema v1 (PostgreSQL). Every row carries its tenant; JSON bodies are TEXT.
CREATE TABLE runs (
    run_id        TEXT PRIMARY KEY,
    tenant        TEXT NOT NULL,
    parent_run_id TEXT,
    agent         TEXT NOT NULL,
    input         TEXT NOT NULL,
    limits        TEXT NOT NULL,
    status        TEXT NOT NULL,
    reason        TEXT,
    turn          BIGINT NOT NULL,
    usage         TEXT NOT NULL,
    final_output  TEXT,
    last_seq      BIGINT NOT NULL,
    created_at    TEXT NOT NULL,
    updated_at    TEXT NOT NULL
);
CREATE INDEX runs_by_tenant ON runs (tenant, run_id);
CREATE INDEX runs_by_status ON runs (status, updated_at);

CREATE TABLE run_events (
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    seq    BIGINT NOT NULL,
    tenant TEXT NOT NULL,
    kind   TEXT NOT NULL,
    body   TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE messages (
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    idx    BIGINT NOT NULL,
    tenant TEXT NOT NULL,
    turn   BIGINT NOT NULL,
    body   TEXT NOT NULL,
    PRIMARY KEY (run_id, idx)
);

CREATE TABLE tool_executions (
    run_id  TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    turn    BIGINT NOT NULL,
    call_id TEXT NOT NULL,
    idx     BIGINT NOT NULL,
    tenant  TEXT NOT NULL,
    status  TEXT NOT NULL,
    body    TEXT NOT NULL,
    PRIMARY KEY (run_id, turn, call_id)
);

CREATE TABLE plans (
    run_id  TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    version BIGINT NOT NULL,
    tenant  TEXT NOT NULL,
    body    TEXT NOT NULL,
    PRIMARY KEY (run_id, version)
);

CREATE TABLE reviews (
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    turn   BIGINT NOT NULL,
    tenant TEXT NOT NULL,
    body   TEXT NOT NULL,
    PRIMARY KEY (run_id, turn)
);

CREATE TABLE documents (
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    idx    BIGINT NOT NULL,
    tenant TEXT NOT NULL,
    body   TEXT NOT NULL,
    PRIMARY KEY (run_id, idx)
);
