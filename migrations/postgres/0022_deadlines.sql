-- Deadlines (issue 79): a task may say when it is no longer wanted
-- (`deadline_ms`, epoch milliseconds; NULL: however late). One that could
-- not be published to its destination by then becomes `expired`, a new
-- state, with why in `last_error` and when in `expired_at_ms`; its message
-- goes to `expired_destination` instead, when the task names one. An expired
-- task does not count in the forecast (the triggers' lists of counted
-- states leave it out, as they leave out a cancelled one).
ALTER TABLE tasks DROP CONSTRAINT tasks_state_check;
ALTER TABLE tasks ADD CONSTRAINT tasks_state_check
    CHECK (state IN ('pending', 'scheduled', 'releasing', 'waiting', 'staged', 'delivered',
                     'unroutable', 'cancelled', 'failed', 'expired'));
ALTER TABLE tasks ADD COLUMN deadline_ms BIGINT;
ALTER TABLE tasks ADD COLUMN expired_at_ms BIGINT;
ALTER TABLE tasks ADD COLUMN expired_destination TEXT;
-- Expired tasks listed in due order (a rare state, as failed is), and the
-- waiting tasks whose deadline passes, swept by the limiter.
CREATE INDEX tasks_expired ON tasks (deliver_at_ms, id) WHERE state = 'expired';
CREATE INDEX tasks_waiting_by_deadline ON tasks (deadline_ms)
    WHERE state = 'waiting' AND deadline_ms IS NOT NULL;
