-- The idempotency key's uniqueness is a partial index over the tasks that
-- have one, as on SQLite (where it saves a B-tree write per task sent
-- without a key): NULLs are no longer indexed. `ON CONFLICT DO NOTHING`
-- without a target covers a partial unique index as it did the constraint.
-- The index is built inside the migration's transaction, holding the
-- table's lock: writes wait for it, once, at the upgrade.
ALTER TABLE tasks DROP CONSTRAINT tasks_idempotency_key_key;
CREATE UNIQUE INDEX tasks_by_idempotency_key ON tasks (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
