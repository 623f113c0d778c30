-- Schedules at scale (issue 71): the planner takes a page of due schedules
-- under a lease (`planning_until_ms`), so that replicas sharing a ledger plan
-- different pages of a large instant instead of the same one. The page's
-- steps and tasks are written in one transaction, which clears the lease; a
-- replica killed before that commit wrote nothing, and its lease runs out.
ALTER TABLE schedules ADD COLUMN planning_until_ms INTEGER;
