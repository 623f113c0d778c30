-- Creates the task ledger: one row per accepted task, from acceptance until
-- retention prunes it after delivery. Times are epoch milliseconds (BIGINT)
-- so that both backends share every query.
CREATE TABLE tasks (
    id                 TEXT    PRIMARY KEY,
    -- The client's Idempotency-Key header; NULL when it sent none (a client
    -- `id` is then the key, and the primary key enforces it).
    idempotency_key    TEXT    UNIQUE,
    -- SHA-256 of the canonical request body: tells a replay from a conflict.
    fingerprint        TEXT,
    destination        TEXT    NOT NULL,
    routing_key        TEXT    NOT NULL,
    delay_ms           BIGINT  NOT NULL,
    deliver_at_ms      BIGINT  NOT NULL,
    content_type       TEXT    NOT NULL,
    headers            TEXT    NOT NULL, -- JSON object
    -- The whole payload while pending (the forwarder needs it), then a copy
    -- bounded by store.payload_copy_bytes, or NULL.
    payload            BYTEA,
    payload_bytes      BIGINT  NOT NULL,
    state              TEXT    NOT NULL CHECK (state IN ('pending', 'published')),
    created_at_ms      BIGINT  NOT NULL,
    published_at_ms    BIGINT,
    -- A pending task is only (re)published once this has passed: it is the
    -- lease of whoever is publishing it now, or the forwarder's back-off.
    next_attempt_at_ms BIGINT  NOT NULL,
    attempts           BIGINT  NOT NULL DEFAULT 0,
    last_error         TEXT
);

-- Listing in due order, and retention.
CREATE INDEX tasks_by_deliver_at ON tasks (deliver_at_ms, id);
CREATE INDEX tasks_by_destination ON tasks (destination, deliver_at_ms, id);
-- The forwarder's work list stays small however large the ledger grows.
CREATE INDEX tasks_pending ON tasks (next_attempt_at_ms) WHERE state = 'pending';
