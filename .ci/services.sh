# Makes sure the services the test suite talks to (RabbitMQ, PostgreSQL) are up. Sourced by .ci/run.

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

ensure_rabbitmq() {
  if ! command -v rabbitmq-server >/dev/null 2>&1; then
    echo "ci: installing RabbitMQ"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null
  fi
  if ! port_open 5672; then
    echo "ci: starting RabbitMQ"
    rabbitmq-server -detached || true
  fi
  for _ in $(seq 1 120); do
    if port_open 5672 && rabbitmqctl -q await_startup >/dev/null 2>&1; then
      # Quorum queues and at-least-once dead-lettering need these on an upgraded node.
      rabbitmqctl -q enable_feature_flag all >/dev/null 2>&1 || true
      echo "ci: RabbitMQ is up ($(rabbitmqctl -q version 2>/dev/null || echo 'version unknown'))"
      return 0
    fi
    sleep 1
  done
  echo "ci: RabbitMQ did not come up on 127.0.0.1:5672" >&2
  return 1
}

# The benchmark's plots link fontconfig and freetype; CI lints the benchmark.
ensure_build_libraries() {
  if ! pkg-config --exists fontconfig freetype2 2>/dev/null; then
    echo "ci: installing fontconfig and freetype development files"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pkg-config libfontconfig1-dev libfreetype-dev >/dev/null
  fi
}

# The ledger's tests run on PostgreSQL as well as SQLite: postgres over TCP on
# 127.0.0.1:5432 with trust authentication, and the database "test".
ensure_postgres() {
  if ! command -v pg_ctlcluster >/dev/null 2>&1; then
    echo "ci: installing PostgreSQL"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql postgresql-client >/dev/null
    local hba
    hba="$(ls /etc/postgresql/*/main/pg_hba.conf | head -n1)"
    sed -i '1i host all all 127.0.0.1/32 trust' "$hba"
  fi
  if ! port_open 5432; then
    echo "ci: starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
  fi
  for _ in $(seq 1 60); do
    if psql "postgresql://postgres@127.0.0.1:5432/postgres" -qAtc 'select 1' >/dev/null 2>&1; then
      if ! psql "postgresql://postgres@127.0.0.1:5432/postgres" -qAtc "select 1 from pg_database where datname = 'test'" | grep -q 1; then
        psql "postgresql://postgres@127.0.0.1:5432/postgres" -qc 'CREATE DATABASE test'
      fi
      echo "ci: PostgreSQL is up ($(psql "postgresql://postgres@127.0.0.1:5432/postgres" -qAtc 'show server_version'))"
      return 0
    fi
    sleep 1
  done
  echo "ci: PostgreSQL did not come up on 127.0.0.1:5432" >&2
  return 1
}

# Tests start RabbitMQ nodes of their own (tests/it/common/nodes.rs) and
# delete them when done; a test killed midway leaves its nodes behind,
# holding memory and ports. The nodes of this run are tagged with
# DLTEST_RUN_ID; at the end, only those are stopped and their directories
# removed: another run's nodes (a developer's, say) are left alone.
export DLTEST_RUN_ID="${DLTEST_RUN_ID:-ci$$x}"
stop_own_test_nodes() {
  local pid node
  for pid in $(pgrep -f beam.smp || true); do
    # A process may be gone by now: no environment to read, nothing to stop.
    node=$(tr '\0' '\n' 2>/dev/null < "/proc/$pid/environ" \
      | sed -n "s/^RABBITMQ_NODENAME=\(dltest-$DLTEST_RUN_ID.*\)$/\1/p") || continue
    if [ -n "$node" ]; then
      echo "ci: stopping test node $node, left by a test of this run"
      rabbitmqctl -q -n "$node" stop >/dev/null 2>&1 || kill "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "${TMPDIR:-/tmp}"/dltest-node-"$DLTEST_RUN_ID"*
  # Nodes from the RabbitMQ 4 folder keep their directories under its /tmp.
  if [ -n "${RABBITMQ4_ROOT:-}" ]; then
    rm -rf "$RABBITMQ4_ROOT"/tmp/dltest-node-"$DLTEST_RUN_ID"*
  fi
}

# Python's packages (pika, schemathesis) are the tests' own business: they
# make a virtual environment under target/ on first use
# (tests/it/common/python.rs).

# Tests delete what they declare on the broker (their names start with
# "dltest-"); anything left afterwards is a test's leak, and fails CI.
# RABBITMQCTL: the command for the broker to look at (default: the machine's).
assert_no_test_objects_left() {
  local ctl=(${RABBITMQCTL:-rabbitmqctl}) left
  left=$( ("${ctl[@]}" -q list_queues name; "${ctl[@]}" -q list_exchanges name; "${ctl[@]}" -q list_users) \
    | grep '^dltest-' || true)
  if [ -n "$left" ]; then
    echo "ci: tests left $(echo "$left" | wc -l) queues, exchanges or users named dltest-* on the broker:" >&2
    echo "$left" | head -20 >&2
    return 1
  fi
  echo "ci: the tests left nothing on the broker"
}

# Whether a broker runs the management plugin, for the log: the suite runs
# against one broker with it and one without.
management_plugin_state() {
  local ctl=(${RABBITMQCTL:-rabbitmqctl})
  if "${ctl[@]}" -q status 2>/dev/null | grep -q rabbitmq_management; then
    echo "with the management plugin"
  else
    echo "without the management plugin"
  fi
}

# Node.js and npm: the OpenAPI linter below, and the tests' amqplib producer
# (tests/it/common/node.rs installs amqplib under target/ on first use).
ensure_node() {
  if command -v node >/dev/null && command -v npm >/dev/null; then
    return 0
  fi
  echo "ci: installing Node.js and npm"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
}

# Debian's Chromium, which the console's browser test drives through
# playwright-core (Playwright's own browser download fails on this network).
ensure_chromium() {
  if [ -x /usr/bin/chromium ]; then
    return 0
  fi
  echo "ci: installing Debian's chromium"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
}

# libfaketime, for the test of a replica whose clocks run ahead of another's.
ensure_faketime() {
  if [ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 ]; then
    return 0
  fi
  echo "ci: installing Debian's faketime"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime >/dev/null
}

# Prometheus and promtool (the alert rules' checks and unit tests), from
# Debian's package; its service is not started.
ensure_prometheus() {
  if command -v promtool >/dev/null && command -v prometheus >/dev/null; then
    return 0
  fi
  echo "ci: installing Debian's prometheus"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
}

# The OpenAPI linter (Redocly CLI, from npm), pinned like the Python tools, in
# a folder of its own outside the checkout.
REDOCLY_VERSION=2.77.0
REDOCLY_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/delayline-ci/redocly-$REDOCLY_VERSION"
ensure_openapi_linter() {
  if [ -x "$REDOCLY_DIR/node_modules/.bin/redocly" ]; then
    return 0
  fi
  echo "ci: installing @redocly/cli $REDOCLY_VERSION"
  mkdir -p "$REDOCLY_DIR"
  (cd "$REDOCLY_DIR" && npm install --no-audit --no-fund --loglevel=error "@redocly/cli@$REDOCLY_VERSION" >/dev/null)
}

# Lints the OpenAPI document the binary serves at /openapi.json.
lint_openapi() {
  local document status
  document="$(mktemp --suffix=.json)"
  cargo run --locked --quiet -- openapi >"$document"
  set +e
  NO_UPDATE_NOTIFIER=1 REDOCLY_TELEMETRY=off "$REDOCLY_DIR/node_modules/.bin/redocly" lint \
    --config .ci/redocly.yaml --format=summary "$document" 2>&1 | grep -v '[║╔╚]'
  status=${PIPESTATUS[0]}
  set -e
  rm -f "$document"
  return "$status"
}
