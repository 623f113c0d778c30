-- Who holds a task's lease (issue 76, item 9; PostgreSQL's migration 0019
-- says why). SQLite's ledger has one process, which ends every lease left
-- by the one before it at start; the column is written by the statements
-- both backends share.
ALTER TABLE tasks ADD COLUMN leased_by INTEGER;
