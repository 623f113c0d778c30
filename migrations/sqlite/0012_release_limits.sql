-- Release limits (issue 41). A task due while a limit holds its destination
-- waits in the ledger, in the new state 'waiting', with the name of the limit
-- that held it in `held_by`; the limiter releases it in due order as the
-- limit allows (then 'releasing', leased by `next_attempt_at_ms`).
-- SQLite cannot change a CHECK constraint in place, so the table is rebuilt
-- as in 0009 (once, at the upgrade, in time proportional to the ledger's
-- size); columns, indexes and rows stay as they were.
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
    state              TEXT    NOT NULL CHECK (state IN ('pending', 'scheduled', 'releasing',
                                   'waiting', 'delivered', 'unroutable', 'cancelled', 'failed')),
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
    held_by            TEXT
);

INSERT INTO tasks_new (id, idempotency_key, fingerprint, destination, routing_key, delay_ms,
    deliver_at_ms, content_type, headers, payload, payload_bytes, state, created_at_ms,
    published_at_ms, next_attempt_at_ms, attempts, last_error, publish_alone, refusals,
    revision, delivered_at_ms, cancelled_at_ms, client, properties, exchange)
SELECT id, idempotency_key, fingerprint, destination, routing_key, delay_ms,
    deliver_at_ms, content_type, headers, payload, payload_bytes, state, created_at_ms,
    published_at_ms, next_attempt_at_ms, attempts, last_error, publish_alone, refusals,
    revision, delivered_at_ms, cancelled_at_ms, client, properties, exchange
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

-- A limit: which destinations (a topic pattern), a token bucket shared by
-- every replica (`tokens` as of `tokens_at_ms`), a pause, and a bound on a
-- consumer queue's depth. `released` counts what the limiter let go.
CREATE TABLE limits (
    name            TEXT    PRIMARY KEY,
    destinations    TEXT    NOT NULL,
    rate_per_sec    REAL,
    burst           INTEGER,
    paused          INTEGER NOT NULL DEFAULT 0,
    paused_until_ms INTEGER,
    depth_queue     TEXT,
    depth_messages  INTEGER,
    tokens          REAL    NOT NULL DEFAULT 0,
    tokens_at_ms    INTEGER NOT NULL DEFAULT 0,
    released        INTEGER NOT NULL DEFAULT 0,
    client          TEXT,
    created_at_ms   INTEGER NOT NULL,
    updated_at_ms   INTEGER NOT NULL
);
