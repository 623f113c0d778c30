-- A ledger's identity: a random id made once, when the ledger is created (or
-- upgraded to this version). A chain's release stage may be consumed only by
-- instances that share one ledger, since the stage's verdicts (cancelled,
-- moved, delivered) are the ledger's: delayline records this id on the broker
-- beside the chain and refuses to start against a chain another ledger holds.
-- md5 of random data rather than gen_random_uuid(), which PostgreSQL before
-- 13 lacks.
CREATE TABLE ledger_identity (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    id TEXT NOT NULL
);
INSERT INTO ledger_identity (singleton, id)
    VALUES (1, md5(random()::text || clock_timestamp()::text));
