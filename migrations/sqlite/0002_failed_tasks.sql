-- Quarantine: a task whose publishing keeps failing for a reason of its own
-- ends in the state 'failed' (with the reason in last_error) instead of being
-- retried forever. Two columns track the suspicion:
--   publish_alone  1 once the task was in flight when its channel or
--                  connection failed: it is then retried alone, on a
--                  connection of its own, so it cannot harm other tasks;
--   refusals       how often the broker refused it while it was sent alone.
-- SQLite cannot change a CHECK constraint in place, so the table is rebuilt.
CREATE TABLE tasks_new (
    id                 TEXT    PRIMARY KEY,
    idempotency_key    TEXT    UNIQUE,
    fingerprint        TEXT,
    destination        TEXT    NOT NULL,
    routing_key        TEXT    NOT NULL,
    delay_ms           INTEGER NOT NULL,
    deliver_at_ms      INTEGER NOT NULL,
    content_type       TEXT    NOT NULL,
    headers            TEXT    NOT NULL,
    payload            BLOB,
    payload_bytes      INTEGER NOT NULL,
    state              TEXT    NOT NULL CHECK (state IN ('pending', 'published', 'failed')),
    created_at_ms      INTEGER NOT NULL,
    published_at_ms    INTEGER,
    next_attempt_at_ms INTEGER NOT NULL,
    attempts           INTEGER NOT NULL DEFAULT 0,
    last_error         TEXT,
    publish_alone      INTEGER NOT NULL DEFAULT 0,
    refusals           INTEGER NOT NULL DEFAULT 0
);

INSERT INTO tasks_new (id, idempotency_key, fingerprint, destination, routing_key, delay_ms,
    deliver_at_ms, content_type, headers, payload, payload_bytes, state, created_at_ms,
    published_at_ms, next_attempt_at_ms, attempts, last_error)
SELECT id, idempotency_key, fingerprint, destination, routing_key, delay_ms,
    deliver_at_ms, content_type, headers, payload, payload_bytes, state, created_at_ms,
    published_at_ms, next_attempt_at_ms, attempts, last_error
FROM tasks;

DROP TABLE tasks;
ALTER TABLE tasks_new RENAME TO tasks;

CREATE INDEX tasks_by_deliver_at ON tasks (deliver_at_ms, id);
CREATE INDEX tasks_by_destination ON tasks (destination, deliver_at_ms, id);
CREATE INDEX tasks_pending ON tasks (next_attempt_at_ms) WHERE state = 'pending';
