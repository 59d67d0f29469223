#!/usr/bin/env bash
# mm2.sh start|stop|status|log — Kafka's MirrorMaker 2 (dedicated mode), run
# from Kafka's own jars, for the multi-cluster tests.
#
#   mm2.sh start CONFIG [ARGS...]  start MirrorMaker with the properties file
#                                  CONFIG and MirrorMaker's own arguments
#                                  (e.g. --clusters us: only the flows into
#                                  us), and print its pid
#   mm2.sh stop                    stop it
#   mm2.sh status                  print the pid if running, else exit 1
#   mm2.sh log                     print the path of its log
#
# MirrorMaker has no readiness signal worth trusting: `start` returns once the
# JVM runs, and the caller proves replication by sending a record across.
#
# The jars (connect-mirror and connect-mirror-client of the same Kafka version
# as kafka.sh's broker, and what they need) come from Maven Central through
# the machine's Maven, cached in ~/.m2 and in
# $STREAMLIMIT_CACHE/kafka-$VERSION/mm2-libs.
#
# Environment:
#   STREAMLIMIT_RUN_DIR        run root, as for kafka.sh; this script uses
#                              <root>/<instance>
#   STREAMLIMIT_MM2_INSTANCE   instance name (default mm2), so that one
#                              MirrorMaker per data center can run side by side
#   STREAMLIMIT_CACHE          jar cache (default $HOME/.cache/streamlimit)
#   STREAMLIMIT_KAFKA_VERSION  Kafka version (default 3.9.1)
#   STREAMLIMIT_MM2_HEAP       JVM heap (default 256m)
#   STREAMLIMIT_OWNER_PID      when set, MirrorMaker is stopped once that process
#                              has exited (see watch_owner in lib.sh)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"

VERSION=${STREAMLIMIT_KAFKA_VERSION:-3.9.1}
CACHE=${STREAMLIMIT_CACHE:-$HOME/.cache/streamlimit}/kafka-$VERSION
LIBS=$CACHE/mm2-libs
RUN=$(services_root)/${STREAMLIMIT_MM2_INSTANCE:-mm2}
PIDFILE=$RUN/mm2.pid
LOGFILE=$RUN/mm2.log       # log4j output
OUTFILE=$RUN/mm2.out       # JVM stdout/stderr

ensure_jars() {
  fetch_jars mm2 "$LIBS" "connect-mirror-$VERSION.jar" connect-mirror connect-mirror-client
}

write_log_config() {
  # The clients log every configuration they build, several per connector.
  write_log4j "$RUN/log4j.properties" "$LOGFILE" org.apache.kafka.clients=WARN \
    org.apache.kafka.common.config.AbstractConfig=WARN org.reflections=ERROR
}

cmd_start() {
  local config=${1:-}
  [[ -n $config ]] || die "start: missing the properties file"
  [[ -f $config ]] || die "start: $config: no such file"
  shift
  mkdir -p "$RUN"
  kill_pidfile "$PIDFILE" 10
  ensure_jars
  write_log_config
  cp "$config" "$RUN/mm2.properties"
  : >"$OUTFILE"
  # setsid: MirrorMaker outlives the shell that started it; `stop` ends it by pid.
  setsid nohup java -Xms64m -Xmx"${STREAMLIMIT_MM2_HEAP:-256m}" \
    -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:TieredStopAtLevel=1 \
    -Djava.awt.headless=true -Djava.net.preferIPv4Stack=true \
    -Dlog4j.configuration="file:$RUN/log4j.properties" \
    -cp "$LIBS/*" org.apache.kafka.connect.mirror.MirrorMaker "$RUN/mm2.properties" "$@" \
    >>"$OUTFILE" 2>&1 </dev/null &
  printf '%s\n' "$!" >"$PIDFILE"
  watch_owner "$PIDFILE" "$RUN/mm2.properties"
  sleep 1
  if ! pid_alive "$PIDFILE"; then
    tail -n 30 "$OUTFILE" >&2 || true
    tail -n 60 "$LOGFILE" >&2 2>/dev/null || true
    die "MirrorMaker exited at start"
  fi
  log "MirrorMaker 2 $VERSION started (pid $(<"$PIDFILE"), run dir $RUN)"
  cat "$PIDFILE"
}

cmd_status() {
  if pid_alive "$PIDFILE"; then
    cat "$PIDFILE"
    return
  fi
  log "not running (run dir $RUN)"
  return 1
}

case ${1:-} in
start) shift; cmd_start "$@" ;;
stop) kill_pidfile "$PIDFILE" 30 ;;
status) cmd_status ;;
log) printf '%s\n' "$LOGFILE" ;;
*)
  printf 'usage: %s start CONFIG [ARGS...] | stop | status | log\n' "$0" >&2
  exit 2
  ;;
esac
