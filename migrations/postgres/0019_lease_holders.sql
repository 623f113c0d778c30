-- Who holds a task's lease (issue 76, item 9): a replica that crashed left
-- its leases (a pending task's is `amqp.confirm_timeout_ms` + 2 s) to run
-- out before any other replica took its tasks over. Every statement that
-- leases a task now writes the holder, a random number a ledger handle
-- draws when it opens; the holder keeps a PostgreSQL advisory lock on that
-- number for as long as it lives (a session lock, which PostgreSQL drops
-- the moment the holder's connection ends). Every replica looks once a
-- second for holders whose lock is gone and ends their leases.
ALTER TABLE tasks ADD COLUMN leased_by BIGINT;
CREATE TABLE lease_holders (
    holder   BIGINT PRIMARY KEY,
    since_ms BIGINT NOT NULL
);
