-- One B-tree fewer per task sent without an idempotency key: the key's
-- uniqueness is a partial index over the tasks that have one,
-- where the column's UNIQUE constraint also indexed every NULL. A lookup by
-- key (`idempotency_key = ?`) uses the partial index. Measured in
-- BENCHMARKS.md (issue 28), beside a WITHOUT ROWID table, which saved no CPU
-- and was not kept. SQLite cannot drop a column's UNIQUE in place, so the
-- table is rebuilt, as in 0007 (once, at the upgrade, in time proportional
-- to the ledger's size); columns, the other indexes and rows stay as they were.
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
                                   'delivered', 'unroutable', 'cancelled', 'failed')),
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
    exchange           TEXT
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
