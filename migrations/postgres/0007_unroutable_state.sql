-- A released task whose message no queue took (the business exchange's
-- alternate exchange parked it in the unroutable queue) is 'unroutable', not
-- 'delivered'.
ALTER TABLE tasks DROP CONSTRAINT tasks_state_check;
ALTER TABLE tasks ADD CONSTRAINT tasks_state_check
    CHECK (state IN ('pending', 'scheduled', 'releasing', 'delivered', 'unroutable',
                     'cancelled', 'failed'));
