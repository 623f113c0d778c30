-- Release limits (issue 41). A task due while a limit holds its destination
-- waits in the ledger, in the new state 'waiting', with the name of the limit
-- that held it in `held_by`; the limiter releases it in due order as the
-- limit allows (then 'releasing', leased by `next_attempt_at_ms`).
ALTER TABLE tasks DROP CONSTRAINT tasks_state_check;
ALTER TABLE tasks ADD CONSTRAINT tasks_state_check
    CHECK (state IN ('pending', 'scheduled', 'releasing', 'waiting', 'delivered', 'unroutable',
                     'cancelled', 'failed'));
ALTER TABLE tasks ADD COLUMN held_by TEXT;
-- The limiter reads waiting tasks per destination in due order; lists read
-- them in due order. Only waiting tasks are in them.
CREATE INDEX tasks_waiting ON tasks (destination, deliver_at_ms, id) WHERE state = 'waiting';
CREATE INDEX tasks_waiting_in_due_order ON tasks (deliver_at_ms, id) WHERE state = 'waiting';
-- Tasks the limiter released, until delivered: a lease that ran out (the
-- replica died) puts them back to waiting.
CREATE INDEX tasks_released_by_limiter ON tasks (next_attempt_at_ms)
    WHERE state = 'releasing' AND held_by IS NOT NULL;

-- A limit: which destinations (a topic pattern), a token bucket shared by
-- every replica (`tokens` as of `tokens_at_ms`), a pause, and a bound on a
-- consumer queue's depth. `released` counts what the limiter let go.
CREATE TABLE limits (
    name            TEXT    PRIMARY KEY,
    destinations    TEXT    NOT NULL,
    rate_per_sec    DOUBLE PRECISION,
    burst           BIGINT,
    paused          BIGINT  NOT NULL DEFAULT 0,
    paused_until_ms BIGINT,
    depth_queue     TEXT,
    depth_messages  BIGINT,
    tokens          DOUBLE PRECISION NOT NULL DEFAULT 0,
    tokens_at_ms    BIGINT  NOT NULL DEFAULT 0,
    released        BIGINT  NOT NULL DEFAULT 0,
    client          TEXT,
    created_at_ms   BIGINT  NOT NULL,
    updated_at_ms   BIGINT  NOT NULL
);
