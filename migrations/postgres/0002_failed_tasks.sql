-- Quarantine: a task whose publishing keeps failing for a reason of its own
-- ends in the state 'failed' (with the reason in last_error) instead of being
-- retried forever. Two columns track the suspicion:
--   publish_alone  1 once the task was in flight when its channel or
--                  connection failed: it is then retried alone, on a
--                  connection of its own, so it cannot harm other tasks;
--   refusals       how often the broker refused it while it was sent alone.
ALTER TABLE tasks DROP CONSTRAINT tasks_state_check;
ALTER TABLE tasks ADD CONSTRAINT tasks_state_check
    CHECK (state IN ('pending', 'published', 'failed'));
ALTER TABLE tasks
    ADD COLUMN publish_alone BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN refusals      BIGINT NOT NULL DEFAULT 0;
