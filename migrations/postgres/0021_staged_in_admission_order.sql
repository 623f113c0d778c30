-- Staged tasks due at one moment are taken in the order they were admitted
-- (issue 77), not by id. A million tasks due at one instant are staged
-- together; the staged release takes a thousand at a time and marks each
-- delivered, so each take updates its rows twice. Taken by id (a client's
-- ids, or any order at all), a take's rows lay all over the table: on
-- SQLite every row dirtied a page of its own, written to the log twice, and
-- a million-task instant came out at three quarters of the broker's ceiling
-- where 300,000 reached nine tenths. Admitted together, they lie together.
-- The index serves the take's order; ties within one millisecond of
-- admission go by id, as before.
DROP INDEX tasks_staged;
CREATE INDEX tasks_staged ON tasks (release_at_ms, created_at_ms, id) WHERE state = 'staged';
