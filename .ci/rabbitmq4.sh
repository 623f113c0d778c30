# RabbitMQ 4.x beside the machine's own 3.10, for the integration suite.
# Sourced by .ci/run; `bash .ci/rabbitmq4.sh start|stop|status` by hand.
#
# No container registry is reachable here, Debian's archive is: the broker
# comes from Debian's newest suite (forky, RabbitMQ 4.3 with its own Erlang),
# installed by debootstrap into a folder of its own and run there with
# chroot. The machine's packages are not touched. The folder is kept between
# runs (about 400 MB, 3 minutes to make) and reused when it is there.
#
# The node listens on ports of its own, with the management plugin on (the
# machine's 3.10 runs without it, so the suite sees both settings).

RABBITMQ4_ROOT="${RABBITMQ4_ROOT:-/var/tmp/delayline-rabbitmq-4/root}"
RABBITMQ4_NODE="${RABBITMQ4_NODE:-delayline-ci4@localhost}"
RABBITMQ4_PORT="${RABBITMQ4_PORT:-5682}"
RABBITMQ4_MANAGEMENT_PORT="${RABBITMQ4_MANAGEMENT_PORT:-15682}"
RABBITMQ4_DIST_PORT="${RABBITMQ4_DIST_PORT:-25682}"

rmq4_port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

rmq4() { chroot "$RABBITMQ4_ROOT" "$@"; }

rmq4_ctl() { rmq4 rabbitmqctl -q -n "$RABBITMQ4_NODE" "$@"; }

# Makes the folder, once.
rmq4_install() {
  [ -x "$RABBITMQ4_ROOT/usr/sbin/rabbitmq-server" ] && return 0
  echo "ci: installing RabbitMQ 4.x from Debian forky into $RABBITMQ4_ROOT (a few minutes, once)"
  if ! command -v debootstrap >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  fi
  local mirror
  mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)
  mirror="${mirror:-http://deb.debian.org/debian}"
  rm -rf "$RABBITMQ4_ROOT.partial"
  mkdir -p "$(dirname "$RABBITMQ4_ROOT")"
  # debootstrap has no script named forky; sid's fits it.
  debootstrap --variant=minbase --include=rabbitmq-server forky "$RABBITMQ4_ROOT.partial" \
    "$mirror" /usr/share/debootstrap/scripts/sid >"$(dirname "$RABBITMQ4_ROOT")/debootstrap.log" 2>&1 \
    || { echo "ci: debootstrap failed; see $(dirname "$RABBITMQ4_ROOT")/debootstrap.log" >&2; return 1; }
  mv "$RABBITMQ4_ROOT.partial" "$RABBITMQ4_ROOT"
}

rmq4_configure() {
  # The node resolves localhost through the folder's own hosts file.
  cp /etc/hosts "$RABBITMQ4_ROOT/etc/hosts"
  mountpoint -q "$RABBITMQ4_ROOT/proc" || mount -t proc proc "$RABBITMQ4_ROOT/proc"
  cat >"$RABBITMQ4_ROOT/etc/rabbitmq/rabbitmq.conf" <<EOF
listeners.tcp.default = 127.0.0.1:$RABBITMQ4_PORT
management.tcp.port = $RABBITMQ4_MANAGEMENT_PORT
management.tcp.ip = 127.0.0.1
loopback_users = none
EOF
  cat >"$RABBITMQ4_ROOT/etc/rabbitmq/rabbitmq-env.conf" <<EOF
NODENAME=$RABBITMQ4_NODE
DIST_PORT=$RABBITMQ4_DIST_PORT
EOF
  echo '[rabbitmq_management].' >"$RABBITMQ4_ROOT/etc/rabbitmq/enabled_plugins"
}

# Installs (once), configures and starts the node; waits until it answers.
ensure_rabbitmq4() {
  rmq4_install || return 1
  rmq4_configure
  if ! rmq4_port_open "$RABBITMQ4_PORT"; then
    echo "ci: starting RabbitMQ 4 node $RABBITMQ4_NODE on 127.0.0.1:$RABBITMQ4_PORT"
    rmq4 rabbitmq-server -detached >/dev/null 2>&1 || true
    RABBITMQ4_STARTED_HERE=1
  fi
  for _ in $(seq 1 120); do
    if rmq4_port_open "$RABBITMQ4_PORT" && rmq4_ctl await_startup >/dev/null 2>&1; then
      rmq4_ctl enable_feature_flag all >/dev/null 2>&1 || true
      echo "ci: RabbitMQ 4 is up ($(rmq4_ctl version 2>/dev/null || echo 'version unknown')) on 127.0.0.1:$RABBITMQ4_PORT"
      return 0
    fi
    sleep 1
  done
  echo "ci: RabbitMQ 4 did not come up on 127.0.0.1:$RABBITMQ4_PORT" >&2
  return 1
}

# The environment that points the integration tests at this node.
rabbitmq4_test_env() {
  export DLTEST_AMQP_URI="amqp://guest:guest@127.0.0.1:$RABBITMQ4_PORT/%2f"
  export DLTEST_RABBITMQCTL="chroot $RABBITMQ4_ROOT rabbitmqctl -n $RABBITMQ4_NODE"
  export DLTEST_MANAGEMENT_URL="http://guest:guest@127.0.0.1:$RABBITMQ4_MANAGEMENT_PORT"
  # Tests that start nodes of their own start them from this folder too.
  export DLTEST_RABBITMQ_ROOT="$RABBITMQ4_ROOT"
}

# Stops the node if this shell started it (a node that was running before
# is someone else's, and is left alone).
stop_rabbitmq4_if_started() {
  if [ "${RABBITMQ4_STARTED_HERE:-}" = 1 ]; then
    echo "ci: stopping RabbitMQ 4 node $RABBITMQ4_NODE"
    stop_rabbitmq4
  fi
}

stop_rabbitmq4() {
  [ -x "$RABBITMQ4_ROOT/usr/sbin/rabbitmqctl" ] || return 0
  rmq4_ctl stop >/dev/null 2>&1 || true
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  case "${1:-start}" in
    start) ensure_rabbitmq4 ;;
    stop) stop_rabbitmq4 ;;
    status) rmq4_ctl status ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
  esac
fi
