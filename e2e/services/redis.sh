#!/usr/bin/env bash
# redis.sh start|stop|status [NAME] — a throwaway redis-server on a free
# loopback port, for tests and benchmarks. NAME (default "redis") lets several
# instances run side by side, each in <run root>/NAME.
#
#   redis.sh start [NAME]   start (or find running) and print 127.0.0.1:PORT
#   redis.sh stop [NAME]    stop and remove its run dir
#   redis.sh status [NAME]  print the address if running, else exit 1
#
# No persistence (--save '' --appendonly no): every start is empty.
#
# Environment:
#   STREAMLIMIT_RUN_DIR  run root (default $STREAMLIMIT_SERVICES_DIR, else
#                        /tmp/streamlimit-services)
#   STREAMLIMIT_REDIS_PORT the port to listen on (default: a free one; as it
#                        is chosen before redis-server binds it, a start
#                        that finds it taken meanwhile tries other ports)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"

NAME=${2:-redis}
[[ $NAME =~ ^[A-Za-z0-9_.-]+$ && $NAME != kafka ]] || die "bad instance name '$NAME'"
RUN=$(services_root)/$NAME
PIDFILE=$RUN/redis.pid
PORTFILE=$RUN/port
LOGFILE=$RUN/redis.log

ping() {
  [[ $(redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null) == PONG ]]
}

cmd_start() {
  mkdir -p "$RUN"
  if pid_alive "$PIDFILE" && [[ -f $PORTFILE ]] && ping "$(<"$PORTFILE")"; then
    log "$NAME already running at 127.0.0.1:$(<"$PORTFILE")"
    printf '127.0.0.1:%s\n' "$(<"$PORTFILE")"
    return
  fi
  kill_pidfile "$PIDFILE" 10
  need_cmd redis-server redis-server
  need_cmd redis-cli redis-tools

  local port i attempt
  for attempt in 1 2 3 4; do
    port=${STREAMLIMIT_REDIS_PORT:-$(free_ports 1)}
    port_free "$port" || die "port $port is taken"
    printf '%s\n' "$port" >"$PORTFILE"
    : >"$LOGFILE"
    redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
      --daemonize yes --pidfile "$PIDFILE" --logfile "$LOGFILE" --dir "$RUN" \
      >/dev/null
    for ((i = 0; i < 300; i++)); do
      # Taken between the check and the bind: the server has exited.
      if grep -q 'Address already in use' "$LOGFILE" 2>/dev/null; then
        [[ -z ${STREAMLIMIT_REDIS_PORT:-} && $attempt -lt 4 ]] || die "port $port is taken: $(grep -m1 'Address already in use' "$LOGFILE")"
        log "port $port was taken before redis-server bound it; trying another"
        continue 2
      fi
      if ping "$port"; then
        # The pid file is written by the daemon itself; wait for it too.
        for ((i = 0; i < 50; i++)); do
          pid_alive "$PIDFILE" && break
          sleep 0.1
        done
        log "$NAME ready at 127.0.0.1:$port (run dir $RUN)"
        printf '127.0.0.1:%s\n' "$port"
        return
      fi
      sleep 0.1
    done
    break
  done
  log "redis-server did not answer PING; last lines of $LOGFILE:"
  tail -n 30 "$LOGFILE" >&2 || true
  kill_pidfile "$PIDFILE" 5
  die "Redis $NAME not ready on 127.0.0.1:$port after 30s"
}

cmd_stop() {
  kill_pidfile "$PIDFILE" 10
  rm -rf "$RUN"
}

cmd_status() {
  if pid_alive "$PIDFILE" && [[ -f $PORTFILE ]]; then
    printf '127.0.0.1:%s\n' "$(<"$PORTFILE")"
    return
  fi
  log "$NAME not running (run dir $RUN)"
  return 1
}

case ${1:-} in
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
*)
  printf 'usage: %s start|stop|status [NAME]\n' "$0" >&2
  exit 2
  ;;
esac
