-- The forecast's four triggers (0013, made again by 0015), their state
-- lists written as equalities joined by OR instead of `IN (four states)`:
-- SQLite builds a temporary table for an IN over more than two constants
-- each time the trigger runs (as the CHECK did before 0015), up to four for
-- one changed row (three for a cancel). The group writer runs without
-- triggers; every other connection fires them on each row it changes: a
-- cancel, a move, a bulk operation, a prune. A trigger can be replaced in
-- place: no table is copied. What they count is unchanged (`state` is never
-- NULL, so NOT (a OR b) is NOT IN). Record 40 in docs/bench/history/: a
-- million rows filled through them a third faster, a bulk cancel of
-- 100,000 a fifth.
DROP TRIGGER due_counts_on_insert;
DROP TRIGGER due_counts_on_leave;
DROP TRIGGER due_counts_on_enter;
DROP TRIGGER due_counts_on_delete;

CREATE TRIGGER due_counts_on_insert AFTER INSERT ON tasks
WHEN new.state = 'pending' OR new.state = 'scheduled' OR new.state = 'releasing'
    OR new.state = 'waiting'
BEGIN
    INSERT INTO due_counts (minute_ms, destination, tasks)
    VALUES (new.deliver_at_ms / 60000 * 60000, new.destination, 1)
    ON CONFLICT (minute_ms, destination) DO UPDATE SET tasks = tasks + 1;
END;

-- A change leaves its old minute when the task stops counting or moves.
CREATE TRIGGER due_counts_on_leave AFTER UPDATE OF state, deliver_at_ms, destination ON tasks
WHEN (old.state = 'pending' OR old.state = 'scheduled' OR old.state = 'releasing'
        OR old.state = 'waiting')
    AND (NOT (new.state = 'pending' OR new.state = 'scheduled' OR new.state = 'releasing'
              OR new.state = 'waiting')
         OR old.deliver_at_ms / 60000 <> new.deliver_at_ms / 60000
         OR old.destination <> new.destination)
BEGIN
    UPDATE due_counts SET tasks = tasks - 1
    WHERE minute_ms = old.deliver_at_ms / 60000 * 60000 AND destination = old.destination;
    DELETE FROM due_counts
    WHERE minute_ms = old.deliver_at_ms / 60000 * 60000 AND destination = old.destination
        AND tasks <= 0;
END;

-- And enters its new one when it starts counting or moves.
CREATE TRIGGER due_counts_on_enter AFTER UPDATE OF state, deliver_at_ms, destination ON tasks
WHEN (new.state = 'pending' OR new.state = 'scheduled' OR new.state = 'releasing'
        OR new.state = 'waiting')
    AND (NOT (old.state = 'pending' OR old.state = 'scheduled' OR old.state = 'releasing'
              OR old.state = 'waiting')
         OR old.deliver_at_ms / 60000 <> new.deliver_at_ms / 60000
         OR old.destination <> new.destination)
BEGIN
    INSERT INTO due_counts (minute_ms, destination, tasks)
    VALUES (new.deliver_at_ms / 60000 * 60000, new.destination, 1)
    ON CONFLICT (minute_ms, destination) DO UPDATE SET tasks = tasks + 1;
END;

CREATE TRIGGER due_counts_on_delete AFTER DELETE ON tasks
WHEN old.state = 'pending' OR old.state = 'scheduled' OR old.state = 'releasing'
    OR old.state = 'waiting'
BEGIN
    UPDATE due_counts SET tasks = tasks - 1
    WHERE minute_ms = old.deliver_at_ms / 60000 * 60000 AND destination = old.destination;
    DELETE FROM due_counts
    WHERE minute_ms = old.deliver_at_ms / 60000 * 60000 AND destination = old.destination
        AND tasks <= 0;
END;
