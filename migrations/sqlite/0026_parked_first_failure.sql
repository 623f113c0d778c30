-- Parked messages grouped by when their first attempt failed (issue 79):
-- a retried message carries that moment (`x-delayline-first-failed-at-ms`)
-- through its attempts, and its parked row keeps it, so that operators can
-- clear a failure by the hour it began. NULL for a row parked before (its
-- group is the hour it was parked in).
ALTER TABLE parked ADD COLUMN first_failed_at_ms INTEGER;
