-- Experiment (issue 69): the due-order indexes without the id: each entry
-- ends in the rowid, which SQLite adds to every index of a rowid table.
DROP INDEX tasks_by_deliver_at;
CREATE INDEX tasks_by_deliver_at ON tasks (deliver_at_ms, client);
DROP INDEX tasks_by_destination;
CREATE INDEX tasks_by_destination ON tasks (destination, deliver_at_ms);
