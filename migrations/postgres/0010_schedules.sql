-- Recurring schedules (issue 29). A schedule is its timing (`timing`, the
-- request's JSON: cron or every, time zone, start, end, catch-up) and the
-- content of its occurrences (`template`, a task body without id or delay).
-- `next_at_ms` is the earliest occurrence not yet made a task; the planner
-- finds due schedules by the partial index, so schedules that are paused,
-- finished (NULL) or far from due cost nothing. Each occurrence becomes a
-- task whose id is made of the schedule's id, revision and occurrence time:
-- the tasks table's primary key is what makes an occurrence one task.
CREATE TABLE schedules (
    id                 TEXT    PRIMARY KEY,
    client             TEXT,
    revision           BIGINT  NOT NULL,
    destination        TEXT    NOT NULL,
    timing             TEXT    NOT NULL,
    template           TEXT    NOT NULL,
    paused             INTEGER NOT NULL DEFAULT 0,
    next_at_ms         BIGINT,
    last_occurrence_ms BIGINT,
    occurrences        BIGINT  NOT NULL DEFAULT 0,
    missed             BIGINT  NOT NULL DEFAULT 0,
    created_at_ms      BIGINT  NOT NULL,
    updated_at_ms      BIGINT  NOT NULL
);

CREATE INDEX schedules_due ON schedules (next_at_ms)
    WHERE paused = 0 AND next_at_ms IS NOT NULL;
