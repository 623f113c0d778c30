-- The task lifecycle: a release stage that looks every due task up, so a
-- task can be cancelled or moved until it is due, and is seen delivered.
--   state      'published' is now 'scheduled' (in the cascade); a task then
--              becomes 'releasing' (taken by the release stage, no longer
--              cancellable), 'delivered', or 'cancelled'.
--   revision   1, plus one per reschedule; every message carries the revision
--              it was published with, and the release stage drops a copy of
--              an older one.
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
    state              TEXT    NOT NULL CHECK (state IN ('pending', 'scheduled', 'releasing',
                                   'delivered', 'cancelled', 'failed')),
    created_at_ms      INTEGER NOT NULL,
    published_at_ms    INTEGER,
    next_attempt_at_ms INTEGER NOT NULL,
    attempts           INTEGER NOT NULL DEFAULT 0,
    last_error         TEXT,
    publish_alone      INTEGER NOT NULL DEFAULT 0,
    refusals           INTEGER NOT NULL DEFAULT 0,
    revision           INTEGER NOT NULL DEFAULT 1,
    delivered_at_ms    INTEGER,
    cancelled_at_ms    INTEGER
);

INSERT INTO tasks_new (id, idempotency_key, fingerprint, destination, routing_key, delay_ms,
    deliver_at_ms, content_type, headers, payload, payload_bytes, state, created_at_ms,
    published_at_ms, next_attempt_at_ms, attempts, last_error, publish_alone, refusals)
SELECT id, idempotency_key, fingerprint, destination, routing_key, delay_ms,
    deliver_at_ms, content_type, headers, payload, payload_bytes,
    CASE state WHEN 'published' THEN 'scheduled' ELSE state END, created_at_ms,
    published_at_ms, next_attempt_at_ms, attempts, last_error, publish_alone, refusals
FROM tasks;

DROP TABLE tasks;
ALTER TABLE tasks_new RENAME TO tasks;

CREATE INDEX tasks_by_deliver_at ON tasks (deliver_at_ms, id);
CREATE INDEX tasks_by_destination ON tasks (destination, deliver_at_ms, id);
CREATE INDEX tasks_pending ON tasks (next_attempt_at_ms) WHERE state = 'pending';

-- Idempotency keys of reschedules (PATCH), which name a change, not a task.
CREATE TABLE task_changes (
    idempotency_key TEXT    PRIMARY KEY,
    task_id         TEXT    NOT NULL,
    fingerprint     TEXT    NOT NULL,
    created_at_ms   INTEGER NOT NULL
);
CREATE INDEX task_changes_by_age ON task_changes (created_at_ms);
