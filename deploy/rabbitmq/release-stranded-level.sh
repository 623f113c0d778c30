#!/bin/sh
# Releases the messages a quorum level queue holds for a dead-letter worker
# that is gone: after a cluster node is lost, RabbitMQ's at-least-once
# dead-lettering can leave a queue's expired messages checked out to the lost
# node's worker, neither ready nor delivered, and never retried (seen on
# 3.10; rabbitmq-server issue #16652 reports it on 4.2). Symptom:
# delayline_level_queue_held_seconds grows far past the level's TTL, and
# `rabbitmqctl list_queues name messages_ready messages` shows the level with
# 0 ready but many messages.
#
# Restarting the queue's Raft member on its leader makes it elect again and
# start a new dead-letter worker, which takes the held messages and
# dead-letters them on: nothing is lost (at-least-once), a few may arrive twice.
#
#   release-stranded-level.sh QUEUE [VHOST]    (any rabbitmqctl option may be
#                                              given in RABBITMQCTL_OPTS,
#                                              e.g. "-n rabbit@rabbit2")
set -eu
queue=${1:?usage: release-stranded-level.sh QUEUE [VHOST]}
vhost=${2:-/}
case "$queue$vhost" in
  *\"* | *\\*) echo "queue and vhost names must not hold quotes or backslashes" >&2; exit 2 ;;
esac
# shellcheck disable=SC2086
rabbitmqctl ${RABBITMQCTL_OPTS:-} -q eval "
  {ok, Q} = rabbit_amqqueue:lookup(rabbit_misc:r(<<\"$vhost\">>, queue, <<\"$queue\">>)),
  Member = amqqueue:get_pid(Q),
  ok = ra:stop_server(quorum_queues, Member),
  ok = ra:restart_server(quorum_queues, Member),
  {restarted, Member}."
