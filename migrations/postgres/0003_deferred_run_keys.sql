-- troupe schema v3 (PostgreSQL), as SQLite's v3: the child tables' foreign keys
-- on their run are checked at commit (DEFERRABLE INITIALLY DEFERRED; ON DELETE
-- CASCADE still acts at once).
ALTER TABLE run_events ALTER CONSTRAINT run_events_run_id_fkey DEFERRABLE INITIALLY DEFERRED;
ALTER TABLE messages ALTER CONSTRAINT messages_run_id_fkey DEFERRABLE INITIALLY DEFERRED;
ALTER TABLE tool_executions ALTER CONSTRAINT tool_executions_run_id_fkey DEFERRABLE INITIALLY DEFERRED;
ALTER TABLE plans ALTER CONSTRAINT plans_run_id_fkey DEFERRABLE INITIALLY DEFERRED;
ALTER TABLE reviews ALTER CONSTRAINT reviews_run_id_fkey DEFERRABLE INITIALLY DEFERRED;
ALTER TABLE documents ALTER CONSTRAINT documents_run_id_fkey DEFERRABLE INITIALLY DEFERRED;
