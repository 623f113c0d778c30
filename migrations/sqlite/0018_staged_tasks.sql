-- Staged tasks (issue 67): a task that reaches the release stage well before
-- its time (a burst's, given a lead through the levels) is kept in the ledger
-- alone, in the new state 'staged', until `release_at_ms` (the moment the
-- staging replica's clock releases it, never before `deliver_at_ms`); a
-- ledger-driven release then takes it ('releasing', leased by
-- `next_attempt_at_ms`, `release_at_ms` kept) and delivers it; another
-- process than the one that staged it (`staged_by`) only 10 s after that
-- moment, since its clock may be ahead. A staged task counts in the
-- forecast like any other on its way.
-- SQLite cannot change a CHECK constraint in place, so the table is rebuilt
-- as in 0015 (once, at the upgrade, in time proportional to the ledger's
-- size: about 21 s for a million tasks); rows stay as they were, and the
-- forecast's triggers are made again with the new state in their lists.
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
        OR state = 'unroutable' OR state = 'cancelled' OR state = 'failed'),
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
    staged_by          TEXT
);

INSERT INTO tasks_new (id, idempotency_key, fingerprint, destination, routing_key, delay_ms,
    deliver_at_ms, content_type, headers, payload, payload_bytes, state, created_at_ms,
    published_at_ms, next_attempt_at_ms, attempts, last_error, publish_alone, refusals,
    revision, delivered_at_ms, cancelled_at_ms, client, properties, exchange, held_by)
SELECT id, idempotency_key, fingerprint, destination, routing_key, delay_ms,
    deliver_at_ms, content_type, headers, payload, payload_bytes, state, created_at_ms,
    published_at_ms, next_attempt_at_ms, attempts, last_error, publish_alone, refusals,
    revision, delivered_at_ms, cancelled_at_ms, client, properties, exchange, held_by
FROM tasks;

DROP TABLE tasks;
ALTER TABLE tasks_new RENAME TO tasks;

CREATE UNIQUE INDEX tasks_by_idempotency_key ON tasks (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX tasks_by_destination ON tasks (destination, deliver_at_ms, id);
CREATE INDEX tasks_pending ON tasks (next_attempt_at_ms) WHERE state = 'pending';
CREATE INDEX tasks_by_deliver_at ON tasks (deliver_at_ms, id, client);
CREATE INDEX tasks_withdrawn_by_client ON tasks (client, deliver_at_ms)
    WHERE client IS NOT NULL AND state IN ('cancelled', 'failed');
CREATE INDEX tasks_failed ON tasks (deliver_at_ms, id) WHERE state = 'failed';
CREATE INDEX tasks_unroutable ON tasks (deliver_at_ms, id) WHERE state = 'unroutable';
CREATE INDEX tasks_cancelled ON tasks (deliver_at_ms, id) WHERE state = 'cancelled';
-- The limiter reads waiting tasks per destination in due order; lists read
-- them in due order. Only waiting tasks are in them.
CREATE INDEX tasks_waiting ON tasks (destination, deliver_at_ms, id) WHERE state = 'waiting';
CREATE INDEX tasks_waiting_in_due_order ON tasks (deliver_at_ms, id) WHERE state = 'waiting';
-- Tasks the limiter released, until delivered: a lease that ran out (the
-- replica died) puts them back to waiting.
CREATE INDEX tasks_released_by_limiter ON tasks (next_attempt_at_ms)
    WHERE state = 'releasing' AND held_by IS NOT NULL;

-- The staged release reads staged tasks in release order, and its own
-- (`staged_by`: the process that staged them) apart; lists read them in due
-- order.
CREATE INDEX tasks_staged ON tasks (release_at_ms, id) WHERE state = 'staged';
CREATE INDEX tasks_staged_by ON tasks (staged_by, release_at_ms) WHERE state = 'staged';
CREATE INDEX tasks_staged_in_due_order ON tasks (deliver_at_ms, id) WHERE state = 'staged';
-- Staged tasks being released, until delivered: a lease that ran out (the
-- replica died) stages them again.
CREATE INDEX tasks_released_from_stage ON tasks (next_attempt_at_ms)
    WHERE state = 'releasing' AND release_at_ms IS NOT NULL;

CREATE TRIGGER due_counts_on_insert AFTER INSERT ON tasks
WHEN new.state = 'pending' OR new.state = 'scheduled' OR new.state = 'releasing'
    OR new.state = 'waiting' OR new.state = 'staged'
BEGIN
    INSERT INTO due_counts (minute_ms, destination, tasks)
    VALUES (new.deliver_at_ms / 60000 * 60000, new.destination, 1)
    ON CONFLICT (minute_ms, destination) DO UPDATE SET tasks = tasks + 1;
END;

-- A change leaves its old minute when the task stops counting or moves.
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

-- And enters its new one when it starts counting or moves.
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
