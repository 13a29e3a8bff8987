-- troupe schema v2 (SQLite): counters on the run row that number its messages,
-- tool calls and documents, so that an insert needs no MAX(idx) lookup (the group
-- commit writer reads them with the run). Existing runs start from their rows.
ALTER TABLE runs ADD COLUMN message_count INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN tool_count INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN document_count INTEGER NOT NULL DEFAULT 0;
UPDATE runs SET
    message_count = (SELECT COALESCE(MAX(idx), 0) FROM messages WHERE messages.run_id = runs.run_id),
    tool_count = (SELECT COALESCE(MAX(idx), 0) FROM tool_executions WHERE tool_executions.run_id = runs.run_id),
    document_count = (SELECT COALESCE(MAX(idx), 0) FROM documents WHERE documents.run_id = runs.run_id);
