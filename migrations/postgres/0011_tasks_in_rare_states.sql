-- The console's Problems page and `GET /v1/tasks?state=…` list tasks in a
-- rare state (failed, unroutable, cancelled) in due order. Without these,
-- with a million scheduled tasks and none failed, that list read the whole
-- due-order index to find nothing. Each is written only when a task enters
-- its state, so a task that is scheduled and delivered pays nothing for them.
CREATE INDEX tasks_failed ON tasks (deliver_at_ms, id) WHERE state = 'failed';
CREATE INDEX tasks_unroutable ON tasks (deliver_at_ms, id) WHERE state = 'unroutable';
CREATE INDEX tasks_cancelled ON tasks (deliver_at_ms, id) WHERE state = 'cancelled';
