#!/usr/bin/env bash
# Issue 69: the ingest phase on RabbitMQ 3.10, the build before and the slim
# due-order indexes alternating, twice each. /tmp/before and /tmp/after each
# hold a release build of delayline and delayline-bench: the build before,
# and the same with slim-indexes.sql as SQLite migration 0021 (built, then
# taken out again). Usage: ingest-runs.sh [OUT_DIR]
set -u
out=${1:-/tmp/i69-ingest}
mkdir -p "$out"
for round in 1 2; do
  for build in before after; do
    /tmp/$build/delayline-bench --phases ingest --stores none,sqlite --seconds 5 \
        --out "$out/$build-310-$round" > "$out/$build-310-$round.txt" 2>&1
  done
done
echo done
