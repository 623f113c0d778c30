-- Changes in bulk (issue 41): `POST /v1/tasks/bulk` records an operation
-- here and answers at once; a worker on any replica takes it under a lease
-- and works it in pages of tasks in due order, writing its counts and where
-- it stands (`cursor_at_ms`, `cursor_id`) after each page, so that a
-- replica that dies mid-way leaves the rest to another. `owner` is the
-- client that asked ('' on an open API); one `idempotency_key` per owner is
-- one operation.
CREATE TABLE operations (
    id              TEXT    PRIMARY KEY,
    owner           TEXT    NOT NULL,
    idempotency_key TEXT,
    fingerprint     TEXT    NOT NULL,
    request         TEXT    NOT NULL,
    state           TEXT    NOT NULL CHECK (state IN ('running', 'done', 'failed')),
    matched         BIGINT NOT NULL DEFAULT 0,
    changed         BIGINT NOT NULL DEFAULT 0,
    too_late        BIGINT NOT NULL DEFAULT 0,
    unchanged       BIGINT NOT NULL DEFAULT 0,
    cursor_at_ms    BIGINT NOT NULL,
    cursor_id       TEXT    NOT NULL DEFAULT '',
    leased_until_ms BIGINT NOT NULL DEFAULT 0,
    last_error      TEXT,
    created_at_ms   BIGINT NOT NULL,
    updated_at_ms   BIGINT NOT NULL,
    finished_at_ms  BIGINT
);

CREATE UNIQUE INDEX operations_by_key ON operations (owner, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX operations_running ON operations (created_at_ms) WHERE state = 'running';
