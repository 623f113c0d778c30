-- Retry policies set at run time (issue 79): over the API, the CLI or the
-- console, kept here and read by every replica sharing the ledger, beside
-- the `[[retry]]` sections of each replica's configuration file.
-- `settings` is the policy as it was given (the JSON of a `[[retry]]`
-- section), validated again by each replica that reads it.
CREATE TABLE retry_policies (
    name          TEXT    PRIMARY KEY,
    settings      TEXT    NOT NULL,
    changed_by    TEXT,
    created_at_ms BIGINT NOT NULL,
    changed_at_ms BIGINT NOT NULL
);
-- A queue is in one policy at most: its row is the claim, taken in the
-- transaction that sets the policy, so that two replicas setting two
-- policies on one queue at once cannot both succeed.
CREATE TABLE retry_policy_queues (
    queue  TEXT PRIMARY KEY,
    policy TEXT NOT NULL
);
CREATE INDEX retry_policy_queues_by_policy ON retry_policy_queues (policy);
-- Who changed what, and when: one row per change (created, changed,
-- removed), with the policy as it became (none when removed).
CREATE TABLE retry_policy_changes (
    id         BIGSERIAL PRIMARY KEY,
    policy     TEXT    NOT NULL,
    change     TEXT    NOT NULL,
    settings   TEXT,
    changed_by TEXT,
    at_ms      BIGINT NOT NULL
);
