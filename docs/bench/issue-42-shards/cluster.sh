#!/usr/bin/env bash
# The shards phase on a three-node RabbitMQ 3.10 cluster on this machine
# (../shared/notes/rabbitmq-nodes.md): three nodes beside the machine's own
# broker, joined, the benchmark pointed at the first; every node stopped and
# its directory removed at the end, whatever happens.
# Usage: docs/bench/issue-42-shards/cluster.sh OUT.txt [extra bench args]
set -euo pipefail
out=$1; shift
base=/tmp/dl-bench-cluster
nodes=(dl-bench1 dl-bench2 dl-bench3)
stop_all() {
  for n in "${nodes[@]}"; do rabbitmqctl -n "$n@localhost" stop >/dev/null 2>&1 || true; done
  rm -rf "$base"
}
trap stop_all EXIT
for i in 0 1 2; do
  n=${nodes[$i]}; dir=$base/$n; port=$((5701 + i))
  mkdir -p "$dir/mnesia" "$dir/log"
  echo "listeners.tcp.local = 127.0.0.1:$port" > "$dir/rabbitmq.conf"
  echo "[]." > "$dir/enabled_plugins"
  chown -R rabbitmq:rabbitmq "$base"
  RABBITMQ_NODENAME=$n@localhost RABBITMQ_NODE_PORT=$port RABBITMQ_DIST_PORT=$((25701 + i)) \
    RABBITMQ_MNESIA_BASE=$dir/mnesia RABBITMQ_LOG_BASE=$dir/log RABBITMQ_PID_FILE=$dir/pid \
    RABBITMQ_ENABLED_PLUGINS_FILE=$dir/enabled_plugins RABBITMQ_CONFIG_FILE=$dir/rabbitmq.conf \
    rabbitmq-server -detached
done
for n in "${nodes[@]}"; do rabbitmqctl -n "$n@localhost" wait "$base/$n/pid" --timeout 120; done
for n in dl-bench2 dl-bench3; do
  rabbitmqctl -n "$n@localhost" stop_app
  rabbitmqctl -n "$n@localhost" reset
  rabbitmqctl -n "$n@localhost" join_cluster dl-bench1@localhost
  rabbitmqctl -n "$n@localhost" start_app
  rabbitmqctl -n "$n@localhost" await_startup
done
rabbitmqctl -n dl-bench1@localhost cluster_status | head -12
RABBITMQCTL="rabbitmqctl -n dl-bench1@localhost" target/release/delayline-bench \
  --amqp-uri 'amqp://guest:guest@127.0.0.1:5701/%2f' --phases shards "$@" > "$out" 2>&1
grep '^shards:' "$out"
