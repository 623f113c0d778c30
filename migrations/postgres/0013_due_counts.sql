-- The forecast (issue 41): how many tasks fall due in each minute, per
-- destination, so that a forecast over a day reads at most 1,440 rows a
-- destination instead of counting a million tasks. A task counts while it is
-- on its way (pending, scheduled, releasing, waiting), in the minute of its
-- due time. Counting in place would make every replica's transaction wait
-- on the same hot row (all tasks due in one minute) and could deadlock two
-- groups taking minutes in different orders, so the triggers append +1/-1
-- rows to `due_changes`, which nothing contends for, in the same transaction
-- as the task's change; one replica at a time folds them into `due_counts`
-- (under an advisory lock), and a forecast reads both in one statement.
CREATE TABLE due_counts (
    minute_ms   BIGINT NOT NULL,
    destination TEXT   NOT NULL,
    tasks       BIGINT NOT NULL,
    PRIMARY KEY (minute_ms, destination)
);

CREATE TABLE due_changes (
    minute_ms   BIGINT NOT NULL,
    destination TEXT   NOT NULL,
    delta       BIGINT NOT NULL
);

INSERT INTO due_counts (minute_ms, destination, tasks)
SELECT deliver_at_ms / 60000 * 60000, destination, COUNT(*) FROM tasks
WHERE state IN ('pending', 'scheduled', 'releasing', 'waiting')
GROUP BY deliver_at_ms / 60000, destination;

CREATE FUNCTION due_changes_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        IF OLD.state IN ('pending', 'scheduled', 'releasing', 'waiting') THEN
            INSERT INTO due_changes (minute_ms, destination, delta)
            VALUES (OLD.deliver_at_ms / 60000 * 60000, OLD.destination, -1);
        END IF;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        IF NEW.state IN ('pending', 'scheduled', 'releasing', 'waiting') THEN
            INSERT INTO due_changes (minute_ms, destination, delta)
            VALUES (NEW.deliver_at_ms / 60000 * 60000, NEW.destination, 1);
        END IF;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER due_changes_on_insert AFTER INSERT ON tasks FOR EACH ROW
WHEN (NEW.state IN ('pending', 'scheduled', 'releasing', 'waiting'))
EXECUTE PROCEDURE due_changes_record();

-- Only a change that moves the task in or out of the counts, or to another
-- minute or destination, records anything (pending → scheduled does not).
CREATE TRIGGER due_changes_on_update AFTER UPDATE OF state, deliver_at_ms, destination ON tasks
FOR EACH ROW
WHEN ((OLD.state IN ('pending', 'scheduled', 'releasing', 'waiting'))
        IS DISTINCT FROM (NEW.state IN ('pending', 'scheduled', 'releasing', 'waiting'))
    OR (NEW.state IN ('pending', 'scheduled', 'releasing', 'waiting')
        AND (OLD.deliver_at_ms / 60000 <> NEW.deliver_at_ms / 60000
             OR OLD.destination <> NEW.destination)))
EXECUTE PROCEDURE due_changes_record();

CREATE TRIGGER due_changes_on_delete AFTER DELETE ON tasks FOR EACH ROW
WHEN (OLD.state IN ('pending', 'scheduled', 'releasing', 'waiting'))
EXECUTE PROCEDURE due_changes_record();
