-- Deadlines (issue 79): a task may say when it is no longer wanted
-- (`deadline_ms`, epoch milliseconds; NULL: however late). One that could
-- not be published to its destination by then becomes `expired`, a new
-- state, with why in `last_error` and when in `expired_at_ms`; its message
-- goes to `expired_destination` instead, when the task names one.
-- SQLite cannot change a CHECK constraint in place, so the table is rebuilt
-- as in 0018 (once, at the upgrade, in time proportional to the ledger's
-- size); rows stay as they were. Dropping the table drops its indexes and
-- the forecast's triggers: each is made again as it was (an expired task
-- does not count in the forecast, as a cancelled one does not).
CREATE TABLE tasks_new (
    id                 TEXT    PRIMARY KEY,
    idempotency_key    TEXT,
    fingerprint        TEXT,
    destination        TEXT    NOT NULL,
    routing_key        TEXT    NOT NULL,
    delay_ms           INTEGER NOT NULL,
    deliver_at_ms      INTEGER NOT NULL,
    content_type       TEXT    NOT NULL,
    headers            TEXT    NOT NULL,
    payload            BLOB,
    payload_bytes      INTEGER NOT NULL,
    state              TEXT    NOT NULL CHECK (state = 'pending' OR state = 'scheduled'
        OR state = 'releasing' OR state = 'waiting' OR state = 'staged' OR state = 'delivered'
        OR state = 'unroutable' OR state = 'cancelled' OR state = 'failed'
        OR state = 'expired'),
    created_at_ms      INTEGER NOT NULL,
    published_at_ms    INTEGER,
    next_attempt_at_ms INTEGER NOT NULL,
    attempts           INTEGER NOT NULL DEFAULT 0,
    last_error         TEXT,
    publish_alone      INTEGER NOT NULL DEFAULT 0,
    refusals           INTEGER NOT NULL DEFAULT 0,
    revision           INTEGER NOT NULL DEFAULT 1,
    delivered_at_ms    INTEGER,
    cancelled_at_ms    INTEGER,
    client             TEXT,
    properties         BLOB,
    exchange           TEXT,
    held_by            TEXT,
    release_at_ms      INTEGER,
    staged_by          TEXT,
    leased_by          INTEGER,
    leeway_ms          INTEGER NOT NULL DEFAULT 0,
    deadline_ms        INTEGER,
    expired_at_ms      INTEGER,
    expired_destination TEXT
);

INSERT INTO tasks_new (id, idempotency_key, fingerprint, destination, routing_key, delay_ms,
    deliver_at_ms, content_type, headers, payload, payload_bytes, state, created_at_ms,
    published_at_ms, next_attempt_at_ms, attempts, last_error, publish_alone, refusals,
    revision, delivered_at_ms, cancelled_at_ms, client, properties, exchange, held_by,
    release_at_ms, staged_by, leased_by, leeway_ms)
SELECT id, idempotency_key, fingerprint, destination, routing_key, delay_ms,
    deliver_at_ms, content_type, headers, payload, payload_bytes, state, created_at_ms,
    published_at_ms, next_attempt_at_ms, attempts, last_error, publish_alone, refusals,
    revision, delivered_at_ms, cancelled_at_ms, client, properties, exchange, held_by,
    release_at_ms, staged_by, leased_by, leeway_ms
FROM tasks;

DROP TABLE tasks;
ALTER TABLE tasks_new RENAME TO tasks;

CREATE UNIQUE INDEX tasks_by_idempotency_key ON tasks (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX tasks_by_deliver_at ON tasks (deliver_at_ms, client);
CREATE INDEX tasks_by_destination ON tasks (destination, deliver_at_ms);
CREATE INDEX tasks_pending ON tasks (next_attempt_at_ms) WHERE state = 'pending';
CREATE INDEX tasks_withdrawn_by_client ON tasks (client, deliver_at_ms)
    WHERE client IS NOT NULL AND state IN ('cancelled', 'failed');
CREATE INDEX tasks_cancelled ON tasks (deliver_at_ms, id) WHERE state = 'cancelled';
CREATE INDEX tasks_failed ON tasks (deliver_at_ms, id) WHERE state = 'failed';
CREATE INDEX tasks_unroutable ON tasks (deliver_at_ms, id) WHERE state = 'unroutable';
CREATE INDEX tasks_waiting ON tasks (destination, deliver_at_ms, id) WHERE state = 'waiting';
CREATE INDEX tasks_waiting_in_due_order ON tasks (deliver_at_ms, id) WHERE state = 'waiting';
CREATE INDEX tasks_released_by_limiter ON tasks (next_attempt_at_ms)
    WHERE state = 'releasing' AND held_by IS NOT NULL;
CREATE INDEX tasks_released_from_stage ON tasks (next_attempt_at_ms)
    WHERE state = 'releasing' AND release_at_ms IS NOT NULL;
CREATE INDEX tasks_staged ON tasks (release_at_ms, created_at_ms, id) WHERE state = 'staged';
CREATE INDEX tasks_staged_by ON tasks (staged_by, release_at_ms) WHERE state = 'staged';
CREATE INDEX tasks_staged_in_due_order ON tasks (deliver_at_ms, id) WHERE state = 'staged';
-- New: expired tasks listed in due order (a rare state, as failed is), and
-- the waiting tasks whose deadline passes, swept by the limiter.
CREATE INDEX tasks_expired ON tasks (deliver_at_ms, id) WHERE state = 'expired';
CREATE INDEX tasks_waiting_by_deadline ON tasks (deadline_ms)
    WHERE state = 'waiting' AND deadline_ms IS NOT NULL;

CREATE TRIGGER due_counts_on_insert AFTER INSERT ON tasks
WHEN new.state = 'pending' OR new.state = 'scheduled' OR new.state = 'releasing'
    OR new.state = 'waiting' OR new.state = 'staged'
BEGIN
    INSERT INTO due_counts (minute_ms, destination, tasks)
    VALUES (new.deliver_at_ms / 60000 * 60000, new.destination, 1)
    ON CONFLICT (minute_ms, destination) DO UPDATE SET tasks = tasks + 1;
END;

CREATE TRIGGER due_counts_on_leave AFTER UPDATE OF state, deliver_at_ms, destination ON tasks
WHEN (old.state = 'pending' OR old.state = 'scheduled' OR old.state = 'releasing'
        OR old.state = 'waiting' OR old.state = 'staged')
    AND (NOT (new.state = 'pending' OR new.state = 'scheduled' OR new.state = 'releasing'
              OR new.state = 'waiting' OR new.state = 'staged')
         OR old.deliver_at_ms / 60000 <> new.deliver_at_ms / 60000
         OR old.destination <> new.destination)
BEGIN
    UPDATE due_counts SET tasks = tasks - 1
    WHERE minute_ms = old.deliver_at_ms / 60000 * 60000 AND destination = old.destination;
    DELETE FROM due_counts
    WHERE minute_ms = old.deliver_at_ms / 60000 * 60000 AND destination = old.destination
        AND tasks <= 0;
END;

CREATE TRIGGER due_counts_on_enter AFTER UPDATE OF state, deliver_at_ms, destination ON tasks
WHEN (new.state = 'pending' OR new.state = 'scheduled' OR new.state = 'releasing'
        OR new.state = 'waiting' OR new.state = 'staged')
    AND (NOT (old.state = 'pending' OR old.state = 'scheduled' OR old.state = 'releasing'
              OR old.state = 'waiting' OR old.state = 'staged')
         OR old.deliver_at_ms / 60000 <> new.deliver_at_ms / 60000
         OR old.destination <> new.destination)
BEGIN
    INSERT INTO due_counts (minute_ms, destination, tasks)
    VALUES (new.deliver_at_ms / 60000 * 60000, new.destination, 1)
    ON CONFLICT (minute_ms, destination) DO UPDATE SET tasks = tasks + 1;
END;

CREATE TRIGGER due_counts_on_delete AFTER DELETE ON tasks
WHEN old.state = 'pending' OR old.state = 'scheduled' OR old.state = 'releasing'
    OR old.state = 'waiting' OR old.state = 'staged'
BEGIN
    UPDATE due_counts SET tasks = tasks - 1
    WHERE minute_ms = old.deliver_at_ms / 60000 * 60000 AND destination = old.destination;
    DELETE FROM due_counts
    WHERE minute_ms = old.deliver_at_ms / 60000 * 60000 AND destination = old.destination
        AND tasks <= 0;
END;
