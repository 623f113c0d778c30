-- A task's leeway (issue 77): any moment within `leeway_ms` after
-- its due time will do, and `deliver_at_ms` is the moment drawn in it from
-- the task's id. Kept so that a move keeps the window (and the moment in
-- it) and the task shows it; 0 for a task without one.
ALTER TABLE tasks ADD COLUMN leeway_ms BIGINT NOT NULL DEFAULT 0;
