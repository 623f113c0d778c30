-- The index of 0004 kept each client's tasks in due order, a fourth B-tree
-- taking every task at a random place (delays are spread), which cost an
-- API with tokens about 14 % of its intake. The client now rides in the
-- due-order index instead: listing by client walks that index and filters
-- on it, and a quota counts from it. Tasks withdrawn before they fell due
-- (cancelled, failed) are few; their own index lets a quota leave them out.
DROP INDEX tasks_by_client;
DROP INDEX tasks_by_deliver_at;
CREATE INDEX tasks_by_deliver_at ON tasks (deliver_at_ms, id) INCLUDE (client);
CREATE INDEX tasks_withdrawn_by_client ON tasks (client, deliver_at_ms)
    WHERE client IS NOT NULL AND state IN ('cancelled', 'failed');
