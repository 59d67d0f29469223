#!/usr/bin/env bash
# with-services.sh COMMAND [ARGS...] — start real Kafka and Redis on
# loopback, run COMMAND with their addresses in the environment, and stop
# both afterwards whatever happens (exit, failure, Ctrl-C).
#
# COMMAND sees:
#   STREAMLIMIT_KAFKA_BROKERS  Kafka bootstrap address, 127.0.0.1:PORT
#   STREAMLIMIT_REDIS_ADDR     Redis address, 127.0.0.1:PORT
#   STREAMLIMIT_SERVICES_DIR   run root of both (logs: kafka/server.log,
#                              redis/redis.log); kafka.sh and redis.sh
#                              called by COMMAND act on these instances
#
# The run root is STREAMLIMIT_RUN_DIR when set, else a fresh temporary
# directory (removed at the end), so parallel runs never collide.
# On failure the tail of the Kafka log is printed to stderr.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[[ $# -gt 0 ]] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }

owned_root=0
if [[ -z ${STREAMLIMIT_RUN_DIR:-} ]]; then
  STREAMLIMIT_RUN_DIR=$(mktemp -d /tmp/streamlimit-services.XXXXXX)
  owned_root=1
fi
export STREAMLIMIT_RUN_DIR
export STREAMLIMIT_SERVICES_DIR=$STREAMLIMIT_RUN_DIR

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ $rc -ne 0 && -f $STREAMLIMIT_RUN_DIR/kafka/server.log ]]; then
    echo "---- with-services.sh: exit $rc; last lines of $STREAMLIMIT_RUN_DIR/kafka/server.log ----" >&2
    tail -n 40 "$STREAMLIMIT_RUN_DIR/kafka/server.log" >&2 || true
    echo "---- end of Kafka log ----" >&2
  fi
  bash "$HERE/kafka.sh" stop || true
  bash "$HERE/redis.sh" stop || true
  if [[ $owned_root -eq 1 ]]; then
    rm -rf "$STREAMLIMIT_RUN_DIR"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start=$SECONDS
# Start both at once: Redis is ready long before the JVM.
bash "$HERE/redis.sh" start >"$STREAMLIMIT_RUN_DIR/.redis-addr" &
redis_pid=$!
# kafka.sh chooses the broker's ports just before the JVM binds them; a start that finds
# one taken meanwhile fails with "a port was taken", and a fresh start chooses others.
for attempt in 1 2 3; do
  if out=$(bash "$HERE/kafka.sh" start 2>"$STREAMLIMIT_RUN_DIR/.kafka-start.err"); then
    cat "$STREAMLIMIT_RUN_DIR/.kafka-start.err" >&2
    break
  fi
  cat "$STREAMLIMIT_RUN_DIR/.kafka-start.err" >&2
  if [[ $attempt -eq 3 ]] || ! grep -q "a port was taken" "$STREAMLIMIT_RUN_DIR/.kafka-start.err"; then
    exit 1
  fi
  echo "with-services.sh: a port was taken as Kafka started; starting it again on others" >&2
  bash "$HERE/kafka.sh" stop || true
done
STREAMLIMIT_KAFKA_BROKERS=$(tail -n 1 <<<"$out")
wait "$redis_pid"
STREAMLIMIT_REDIS_ADDR=$(tail -n 1 "$STREAMLIMIT_RUN_DIR/.redis-addr")
export STREAMLIMIT_KAFKA_BROKERS STREAMLIMIT_REDIS_ADDR
echo "with-services.sh: Kafka $STREAMLIMIT_KAFKA_BROKERS, Redis $STREAMLIMIT_REDIS_ADDR" \
  "(ready in $((SECONDS - start))s, run dir $STREAMLIMIT_RUN_DIR)" >&2

"$@"
