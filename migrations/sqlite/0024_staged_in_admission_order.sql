-- Staged tasks due at one moment are taken in the order they were admitted
-- (issue 77; PostgreSQL's migration 0021 says why): on SQLite a take's rows
-- then share the table's pages, each dirtied once a take instead of once a
-- row.
DROP INDEX tasks_staged;
CREATE INDEX tasks_staged ON tasks (release_at_ms, created_at_ms, id) WHERE state = 'staged';
