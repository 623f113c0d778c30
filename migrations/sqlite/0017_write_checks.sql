-- Readiness asks whether the ledger can write (issue 70): a row of about a
-- task's size is written here and removed again in one transaction, so that
-- a full disk (or SQLite's page limit) turns `/readyz` to 503 with the
-- database's words, and back to 200 once a write goes through again.
CREATE TABLE write_checks (
    id     INTEGER PRIMARY KEY,
    filler BLOB    NOT NULL
);
