-- A task's leeway (issue 77; PostgreSQL's migration 0020 says why).
ALTER TABLE tasks ADD COLUMN leeway_ms INTEGER NOT NULL DEFAULT 0;
