-- Access control: the API client that submitted each task (NULL while the
-- API is open), so that a client sees and changes only its own tasks.
ALTER TABLE tasks ADD COLUMN client TEXT;

-- A client's tasks in due order (listing, and quota counts); only rows that
-- have a client are indexed, so an open API pays nothing for it.
CREATE INDEX tasks_by_client ON tasks (client, deliver_at_ms, id) WHERE client IS NOT NULL;
