-- The forecast (issue 41): how many tasks fall due in each minute, per
-- destination, kept by triggers in the same transaction as the change to the
-- task, so that a forecast over a day reads at most 1,440 rows a destination
-- instead of counting a million tasks. A task counts while it is on its way
-- (pending, scheduled, releasing, waiting), in the minute of its due time.
-- `due_changes` is where PostgreSQL's triggers write (+1/-1 rows that no two
-- transactions contend for, folded into `due_counts` by one replica at a
-- time); SQLite has one writer, so its triggers count in place and
-- `due_changes` stays empty. Both are read by the same statement.
CREATE TABLE due_counts (
    minute_ms   INTEGER NOT NULL,
    destination TEXT    NOT NULL,
    tasks       INTEGER NOT NULL,
    PRIMARY KEY (minute_ms, destination)
) WITHOUT ROWID;

CREATE TABLE due_changes (
    minute_ms   INTEGER NOT NULL,
    destination TEXT    NOT NULL,
    delta       INTEGER NOT NULL
);

INSERT INTO due_counts (minute_ms, destination, tasks)
SELECT deliver_at_ms / 60000 * 60000, destination, COUNT(*) FROM tasks
WHERE state IN ('pending', 'scheduled', 'releasing', 'waiting')
GROUP BY deliver_at_ms / 60000, destination;

CREATE TRIGGER due_counts_on_insert AFTER INSERT ON tasks
WHEN new.state IN ('pending', 'scheduled', 'releasing', 'waiting')
BEGIN
    INSERT INTO due_counts (minute_ms, destination, tasks)
    VALUES (new.deliver_at_ms / 60000 * 60000, new.destination, 1)
    ON CONFLICT (minute_ms, destination) DO UPDATE SET tasks = tasks + 1;
END;

-- A change leaves its old minute when the task stops counting or moves.
CREATE TRIGGER due_counts_on_leave AFTER UPDATE OF state, deliver_at_ms, destination ON tasks
WHEN old.state IN ('pending', 'scheduled', 'releasing', 'waiting')
    AND (new.state NOT IN ('pending', 'scheduled', 'releasing', 'waiting')
         OR old.deliver_at_ms / 60000 <> new.deliver_at_ms / 60000
         OR old.destination <> new.destination)
BEGIN
    UPDATE due_counts SET tasks = tasks - 1
    WHERE minute_ms = old.deliver_at_ms / 60000 * 60000 AND destination = old.destination;
    DELETE FROM due_counts
    WHERE minute_ms = old.deliver_at_ms / 60000 * 60000 AND destination = old.destination
        AND tasks <= 0;
END;

-- ... and enters its new one when it starts counting or moved.
CREATE TRIGGER due_counts_on_enter AFTER UPDATE OF state, deliver_at_ms, destination ON tasks
WHEN new.state IN ('pending', 'scheduled', 'releasing', 'waiting')
    AND (old.state NOT IN ('pending', 'scheduled', 'releasing', 'waiting')
         OR old.deliver_at_ms / 60000 <> new.deliver_at_ms / 60000
         OR old.destination <> new.destination)
BEGIN
    INSERT INTO due_counts (minute_ms, destination, tasks)
    VALUES (new.deliver_at_ms / 60000 * 60000, new.destination, 1)
    ON CONFLICT (minute_ms, destination) DO UPDATE SET tasks = tasks + 1;
END;

CREATE TRIGGER due_counts_on_delete AFTER DELETE ON tasks
WHEN old.state IN ('pending', 'scheduled', 'releasing', 'waiting')
BEGIN
    UPDATE due_counts SET tasks = tasks - 1
    WHERE minute_ms = old.deliver_at_ms / 60000 * 60000 AND destination = old.destination;
    DELETE FROM due_counts
    WHERE minute_ms = old.deliver_at_ms / 60000 * 60000 AND destination = old.destination
        AND tasks <= 0;
END;
