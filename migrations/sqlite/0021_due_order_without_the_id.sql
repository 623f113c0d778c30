-- The two due-order indexes without the task's id (issue 69, record 48).
-- With the spread delays users give, each admission inserts into both at a
-- random leaf, and each leaf a group touches is written whole to the log at
-- its commit and again at the checkpoint: the default path's largest cost
-- after the broker's. SQLite ends every index of a rowid table with the
-- rowid, so the id (36 characters) only ordered tasks due the same
-- millisecond; without it an entry is about a third as long, a leaf holds
-- three times as many, and a group's inserts dirty and split fewer leaves.
-- A read in due order (`ORDER BY deliver_at_ms, id`) still walks the index
-- and sorts only the tasks that share a due time. The client still rides in
-- `tasks_by_deliver_at` (0005), so a client's listing and quota read it alone.
-- Rebuilt in place: about 2 s for a million tasks.
DROP INDEX tasks_by_deliver_at;
CREATE INDEX tasks_by_deliver_at ON tasks (deliver_at_ms, client);
DROP INDEX tasks_by_destination;
CREATE INDEX tasks_by_destination ON tasks (destination, deliver_at_ms);
