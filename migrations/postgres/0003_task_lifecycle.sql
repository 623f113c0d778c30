-- The task lifecycle: a release stage that looks every due task up, so a
-- task can be cancelled or moved until it is due, and is seen delivered.
--   state      'published' is now 'scheduled' (in the cascade); a task then
--              becomes 'releasing' (taken by the release stage, no longer
--              cancellable), 'delivered', or 'cancelled'.
--   revision   1, plus one per reschedule; every message carries the revision
--              it was published with, and the release stage drops a copy of
--              an older one.
ALTER TABLE tasks DROP CONSTRAINT tasks_state_check;
UPDATE tasks SET state = 'scheduled' WHERE state = 'published';
ALTER TABLE tasks ADD CONSTRAINT tasks_state_check
    CHECK (state IN ('pending', 'scheduled', 'releasing', 'delivered', 'cancelled', 'failed'));
ALTER TABLE tasks
    ADD COLUMN revision        BIGINT NOT NULL DEFAULT 1,
    ADD COLUMN delivered_at_ms BIGINT,
    ADD COLUMN cancelled_at_ms BIGINT;

-- Idempotency keys of reschedules (PATCH), which name a change, not a task.
CREATE TABLE task_changes (
    idempotency_key TEXT   PRIMARY KEY,
    task_id         TEXT   NOT NULL,
    fingerprint     TEXT   NOT NULL,
    created_at_ms   BIGINT NOT NULL
);
CREATE INDEX task_changes_by_age ON task_changes (created_at_ms);
