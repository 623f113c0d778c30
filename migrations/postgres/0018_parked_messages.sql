-- Parked messages (issue 68): a message a retry policy gave up on after its
-- last attempt (`max_attempts`), kept until an operator replays it (a task
-- is made of it, the row deleted) or discards it (the row deleted). It is not
-- a task: it has no due time and nothing delivers it by itself. `properties`
-- is AMQP's own encoding of the message's properties, as the tasks' column.
CREATE TABLE parked (
    id           TEXT    PRIMARY KEY,
    queue        TEXT    NOT NULL,
    policy       TEXT    NOT NULL,
    reason       TEXT    NOT NULL,
    attempts     BIGINT  NOT NULL,
    message_id   TEXT,
    payload      BYTEA   NOT NULL,
    properties   BYTEA   NOT NULL,
    parked_at_ms BIGINT  NOT NULL
);
-- The console and the API read a queue's parked messages newest first, and
-- a replay or a discard by filter in pages.
CREATE INDEX parked_by_queue ON parked (queue, parked_at_ms, id);
CREATE INDEX parked_by_time ON parked (parked_at_ms, id);
