#!/usr/bin/env bash
# Issue 69: the ingest phase, the build before and the one after alternating,
# twice each. /tmp/before and /tmp/after each hold a release build of
# delayline and delayline-bench: for record 47, the build before and the same
# with slim-indexes.sql as SQLite migration 0021 (built, then taken out
# again); for record 48, main without and with migration 0021.
# Usage: ingest-runs.sh [OUT_DIR] [BROKER_LABEL] [AMQP_URI]
#   (record 48's 4.3 runs: ... 4.3 amqp://guest:guest@127.0.0.1:5682/%2f)
set -u
out=${1:-/tmp/i69-ingest}
broker=${2:-310}
uri=${3:-amqp://guest:guest@127.0.0.1:5672/%2f}
mkdir -p "$out"
for round in 1 2; do
  for build in before after; do
    /tmp/$build/delayline-bench --phases ingest --stores none,sqlite --seconds 5 \
        --amqp-uri "$uri" \
        --out "$out/$build-$broker-$round" > "$out/$build-$broker-$round.txt" 2>&1
  done
done
echo done
