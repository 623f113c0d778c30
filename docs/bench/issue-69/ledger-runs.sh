#!/usr/bin/env bash
# Issue 69's first measurement, the ledger alone: the same writes (admission,
# scheduled mark, claim, delivered mark; 100,000 tasks at 16 and 256
# callers, 10,000 at one) with today's due-order indexes, with every task
# given the same delay (the bound: every insert an append), and with other
# index shapes tried through --ledger-sql. Alternating, ROUNDS times.
# Usage: ledger-runs.sh OUT_DIR [ROUNDS]
set -euo pipefail
out=$1
rounds=${2:-2}
bench=${BENCH:-target/release/delayline-bench}
mkdir -p "$out"

bucket_sql() { # $1: bucket width in ms
    echo "ALTER TABLE tasks ADD COLUMN due_bucket INTEGER GENERATED ALWAYS AS (deliver_at_ms / $1) VIRTUAL;
DROP INDEX tasks_by_deliver_at; DROP INDEX tasks_by_destination;
CREATE INDEX tasks_by_due_bucket ON tasks (due_bucket);
CREATE INDEX tasks_by_destination ON tasks (destination, due_bucket);
CREATE INDEX tasks_by_client ON tasks (client, due_bucket) WHERE client IS NOT NULL;"
}
slim_sql="DROP INDEX tasks_by_deliver_at; DROP INDEX tasks_by_destination;
CREATE INDEX tasks_by_deliver_at ON tasks (deliver_at_ms);
CREATE INDEX tasks_by_destination ON tasks (destination, deliver_at_ms);
CREATE INDEX tasks_by_client ON tasks (client, deliver_at_ms) WHERE client IS NOT NULL;"

for round in $(seq 1 "$rounds"); do
    "$bench" --phases ledger --out "$out/today-$round" > "$out/today-$round.txt" 2>&1
    "$bench" --phases ledger --ledger-same-delay --out "$out/same-$round" > "$out/same-$round.txt" 2>&1
    "$bench" --phases ledger --ledger-sql "$(bucket_sql 60000)" --ledger-label minute \
        --out "$out/minute-$round" > "$out/minute-$round.txt" 2>&1
    "$bench" --phases ledger --ledger-sql "$(bucket_sql 10000)" --ledger-label 10s \
        --out "$out/10s-$round" > "$out/10s-$round.txt" 2>&1
    "$bench" --phases ledger --ledger-sql "$(bucket_sql 1000)" --ledger-label second \
        --out "$out/second-$round" > "$out/second-$round.txt" 2>&1
    "$bench" --phases ledger --ledger-sql "$slim_sql" --ledger-label slim \
        --out "$out/slim-$round" > "$out/slim-$round.txt" 2>&1
done
grep -h "^sqlite" "$out"/*.txt | sort
