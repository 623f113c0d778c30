-- Staged tasks (issue 67): a task that reaches the release stage well before
-- its time (a burst's, given a lead through the levels) is kept in the ledger
-- alone, in the new state 'staged', until `release_at_ms` (the moment the
-- staging replica's clock releases it, never before `deliver_at_ms`); a
-- ledger-driven release then takes it ('releasing', leased by
-- `next_attempt_at_ms`, `release_at_ms` kept) and delivers it; another
-- process than the one that staged it (`staged_by`) only 10 s after that
-- moment, since its clock may be ahead. A staged task counts in the
-- forecast like any other on its way.
ALTER TABLE tasks DROP CONSTRAINT tasks_state_check;
ALTER TABLE tasks ADD CONSTRAINT tasks_state_check
    CHECK (state IN ('pending', 'scheduled', 'releasing', 'waiting', 'staged', 'delivered',
                     'unroutable', 'cancelled', 'failed'));
ALTER TABLE tasks ADD COLUMN release_at_ms BIGINT;
ALTER TABLE tasks ADD COLUMN staged_by TEXT;
-- The staged release reads staged tasks in release order, and its own
-- (`staged_by`: the process that staged them) apart; lists read them in due
-- order.
CREATE INDEX tasks_staged ON tasks (release_at_ms, id) WHERE state = 'staged';
CREATE INDEX tasks_staged_by ON tasks (staged_by, release_at_ms) WHERE state = 'staged';
CREATE INDEX tasks_staged_in_due_order ON tasks (deliver_at_ms, id) WHERE state = 'staged';
-- Staged tasks being released, until delivered: a lease that ran out (the
-- replica died) stages them again.
CREATE INDEX tasks_released_from_stage ON tasks (next_attempt_at_ms)
    WHERE state = 'releasing' AND release_at_ms IS NOT NULL;

-- The forecast's function and triggers (0013) with the new state in their lists.
CREATE OR REPLACE FUNCTION due_changes_record() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        IF OLD.state IN ('pending', 'scheduled', 'releasing', 'waiting', 'staged') THEN
            INSERT INTO due_changes (minute_ms, destination, delta)
            VALUES (OLD.deliver_at_ms / 60000 * 60000, OLD.destination, -1);
        END IF;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        IF NEW.state IN ('pending', 'scheduled', 'releasing', 'waiting', 'staged') THEN
            INSERT INTO due_changes (minute_ms, destination, delta)
            VALUES (NEW.deliver_at_ms / 60000 * 60000, NEW.destination, 1);
        END IF;
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER due_changes_on_insert ON tasks;
DROP TRIGGER due_changes_on_update ON tasks;
DROP TRIGGER due_changes_on_delete ON tasks;

CREATE TRIGGER due_changes_on_insert AFTER INSERT ON tasks FOR EACH ROW
WHEN (NEW.state IN ('pending', 'scheduled', 'releasing', 'waiting', 'staged'))
EXECUTE PROCEDURE due_changes_record();

CREATE TRIGGER due_changes_on_update AFTER UPDATE OF state, deliver_at_ms, destination ON tasks
FOR EACH ROW
WHEN ((OLD.state IN ('pending', 'scheduled', 'releasing', 'waiting', 'staged'))
        IS DISTINCT FROM (NEW.state IN ('pending', 'scheduled', 'releasing', 'waiting', 'staged'))
    OR (NEW.state IN ('pending', 'scheduled', 'releasing', 'waiting', 'staged')
        AND (OLD.deliver_at_ms / 60000 <> NEW.deliver_at_ms / 60000
             OR OLD.destination <> NEW.destination)))
EXECUTE PROCEDURE due_changes_record();

CREATE TRIGGER due_changes_on_delete AFTER DELETE ON tasks FOR EACH ROW
WHEN (OLD.state IN ('pending', 'scheduled', 'releasing', 'waiting', 'staged'))
EXECUTE PROCEDURE due_changes_record();
