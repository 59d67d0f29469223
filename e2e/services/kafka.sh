#!/usr/bin/env bash
# kafka.sh start|stop|status — a single-node Apache Kafka (KRaft, combined
# broker+controller) on a free loopback port, for tests and benchmarks.
#
#   kafka.sh start              start (or find running) and print 127.0.0.1:PORT
#   kafka.sh stop [--keep-data] stop; without --keep-data the data dir goes too
#   kafka.sh status             print the address if running, else exit 1
#   kafka.sh log                print the path of the broker log
#   kafka.sh acls ARGS...       Kafka's kafka-acls.sh (kafka.admin.AclCommand)
#                               with ARGS, from the same jars
#
# A `start` after `stop --keep-data` reuses the same ports, cluster id and
# data, so tests can stop and restart the broker as a fault.
#
# The ports are chosen free just before the JVM binds them, so another
# process may take one in between: the broker then exits and `start` fails
# with "a port was taken" in its message. A caller may retry: `stop` (which
# forgets the ports) and `start` again choose new ones.
#
# The jars come from Maven Central through the machine's Maven (cached in
# ~/.m2 and in $STREAMLIMIT_CACHE/kafka-$VERSION/libs); no download other
# than Maven's happens.
#
# Environment:
#   STREAMLIMIT_RUN_DIR        run root (default $STREAMLIMIT_SERVICES_DIR,
#                              else /tmp/streamlimit-services); this script
#                              uses <root>/<instance>
#   STREAMLIMIT_KAFKA_INSTANCE instance name (default kafka): several
#                              independent clusters (one per data center)
#                              live side by side under one run root
#   STREAMLIMIT_KAFKA_PORT     the PLAINTEXT port to listen on (default: a
#                              free one; the controller's is always free)
#   STREAMLIMIT_KAFKA_WAN_PORT and STREAMLIMIT_KAFKA_WAN_ADVERTISE
#                              a second listener, WAN, on 127.0.0.1:PORT that
#                              advertises ADVERTISE (host:port): clients in
#                              other data centers reach the broker through a
#                              proxy listening on ADVERTISE, and the metadata
#                              they get back keeps them on the proxy. Both may
#                              be comma-separated lists of the same length:
#                              one WAN listener per other data center (WAN,
#                              WAN2, WAN3, ...), each behind its own proxy, so
#                              that the link between two data centers can be
#                              cut without cutting a third one off
#   STREAMLIMIT_CACHE          jar cache (default $HOME/.cache/streamlimit)
#   STREAMLIMIT_KAFKA_VERSION  Kafka version (default 3.9.1)
#   STREAMLIMIT_KAFKA_AUTO_CREATE  auto.create.topics.enable (default false:
#                              the product creates its topics explicitly,
#                              and tests must too, so a missing EnsureTopics
#                              fails in tests as it would in production)
#   STREAMLIMIT_KAFKA_HEAP     JVM heap (default 512m)
#   STREAMLIMIT_KAFKA_JVM_OPTS more JVM options, after the defaults (which
#                              they override): brokers that live for one test
#                              on a loaded machine start and run cheaper with
#                              "-XX:TieredStopAtLevel=1 -XX:-UseG1GC -XX:+UseSerialGC"
#   STREAMLIMIT_OWNER_PID      when set, the broker is stopped once that process
#                              has exited (see watch_owner in lib.sh)
#   STREAMLIMIT_KAFKA_EXTRA_PROPERTIES  a file of broker settings appended to
#                              the generated server.properties (later
#                              settings win), with @PORT@, @CPORT@ and @XPORT@
#                              replaced by the PLAINTEXT port, the controller
#                              port and a third port chosen with them for an
#                              extra listener (the third field of
#                              <run>/<instance>/ports, kept like the others):
#                              extra
#                              listeners such as SASL_SSL for security tests
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"

VERSION=${STREAMLIMIT_KAFKA_VERSION:-3.9.1}
SCALA=2.13
CACHE=${STREAMLIMIT_CACHE:-$HOME/.cache/streamlimit}/kafka-$VERSION
LIBS=$CACHE/libs
RUN=$(services_root)/${STREAMLIMIT_KAFKA_INSTANCE:-kafka}
DATA=$RUN/data
PIDFILE=$RUN/kafka.pid
PORTFILE=$RUN/ports          # "PORT CPORT XPORT"
CLUSTERFILE=$RUN/cluster-id
LOGFILE=$RUN/server.log      # log4j output
OUTFILE=$RUN/kafka.out       # JVM stdout/stderr
READY_TIMEOUT=${STREAMLIMIT_KAFKA_READY_TIMEOUT:-90}

ensure_jars() {
  fetch_jars kafka "$LIBS" "kafka_$SCALA-$VERSION.jar" "kafka_$SCALA"
}

address() {
  local port
  read -r port _ <"$PORTFILE"
  printf '127.0.0.1:%s\n' "$port"
}

write_config() {
  local port=$1 cport=$2 xport=$3
  local listeners="PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport"
  local advertised="PLAINTEXT://127.0.0.1:$port"
  local protocols="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
  if [[ -n ${STREAMLIMIT_KAFKA_WAN_PORT:-} ]]; then
    [[ -n ${STREAMLIMIT_KAFKA_WAN_ADVERTISE:-} ]] || die "STREAMLIMIT_KAFKA_WAN_PORT needs STREAMLIMIT_KAFKA_WAN_ADVERTISE"
    local -a wan_ports wan_adv
    local i name
    IFS=, read -r -a wan_ports <<<"$STREAMLIMIT_KAFKA_WAN_PORT"
    IFS=, read -r -a wan_adv <<<"$STREAMLIMIT_KAFKA_WAN_ADVERTISE"
    ((${#wan_ports[@]} == ${#wan_adv[@]})) ||
      die "STREAMLIMIT_KAFKA_WAN_PORT and STREAMLIMIT_KAFKA_WAN_ADVERTISE list ${#wan_ports[@]} and ${#wan_adv[@]} listeners"
    for i in "${!wan_ports[@]}"; do
      name=WAN
      ((i == 0)) || name=WAN$((i + 1))
      listeners+=",$name://127.0.0.1:${wan_ports[i]}"
      advertised+=",$name://${wan_adv[i]}"
      protocols+=",$name:PLAINTEXT"
    done
  fi
  cat >"$RUN/server.properties" <<PROPS
# Generated by e2e/services/kafka.sh. Single-node KRaft for tests only.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=$listeners
advertised.listeners=$advertised
listener.security.protocol.map=$protocols
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
log.dirs=$DATA
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
# Fewer internal partitions: faster first group/transaction on 2 cores.
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
group.initial.rebalance.delay.ms=0
# The broker heartbeats its own controller (one process); a machine busy enough to starve the
# JVM past the default 9 s session fenced it from itself, and every partition answered
# NOT_LEADER until it recovered. A test broker rides out such a stall instead.
broker.session.timeout.ms=30000
auto.create.topics.enable=${STREAMLIMIT_KAFKA_AUTO_CREATE:-false}
delete.topic.enable=true
# Compaction and retention act within seconds, so tests can observe them.
log.cleaner.enable=true
log.cleaner.backoff.ms=500
log.cleaner.threads=1
log.cleaner.dedupe.buffer.size=33554432
log.retention.check.interval.ms=1000
log.segment.delete.delay.ms=1000
file.delete.delay.ms=1000
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
PROPS
  write_log4j "$RUN/log4j.properties" "$LOGFILE" kafka.request.logger=WARN \
    state.change.logger=WARN kafka.log.LogCleaner=INFO
  if [[ -n ${STREAMLIMIT_KAFKA_EXTRA_PROPERTIES:-} ]]; then
    [[ -f $STREAMLIMIT_KAFKA_EXTRA_PROPERTIES ]] || die "STREAMLIMIT_KAFKA_EXTRA_PROPERTIES: no file $STREAMLIMIT_KAFKA_EXTRA_PROPERTIES"
    {
      printf '# From %s\n' "$STREAMLIMIT_KAFKA_EXTRA_PROPERTIES"
      sed -e "s/@PORT@/$port/g" -e "s/@CPORT@/$cport/g" -e "s/@XPORT@/$xport/g" "$STREAMLIMIT_KAFKA_EXTRA_PROPERTIES"
    } >>"$RUN/server.properties"
  fi
}

# ready succeeds when a real metadata request to the broker returns it.
ready() {
  local addr=$1
  kcat -L -b "$addr" -m 3 2>/dev/null | grep -q '1 brokers:'
}

print_failure() {
  log "Kafka did not start; last lines of $OUTFILE and $LOGFILE:"
  tail -n 30 "$OUTFILE" >&2 2>/dev/null || true
  tail -n 60 "$LOGFILE" >&2 2>/dev/null || true
}

cmd_start() {
  mkdir -p "$RUN"
  if pid_alive "$PIDFILE" && [[ -f $PORTFILE ]]; then
    local addr
    addr=$(address)
    if ready "$addr"; then
      log "already running at $addr"
      printf '%s\n' "$addr"
      return
    fi
  fi
  kill_pidfile "$PIDFILE" 10
  ensure_jars
  need_cmd kcat kcat

  local port cport xport cluster
  if [[ -f $PORTFILE && -f $DATA/meta.properties && -f $CLUSTERFILE ]]; then
    # Restart after `stop --keep-data`: same ports, same cluster id.
    read -r port cport xport <"$PORTFILE"
    port_free "$port" || die "kept port $port is taken; run '$0 stop' to start afresh"
    port_free "$cport" || die "kept controller port $cport is taken; run '$0 stop' to start afresh"
    log "restarting with kept data on 127.0.0.1:$port"
  else
    rm -rf "$DATA"
    read -r port cport xport < <(free_ports 3 | paste -sd' ')
    if [[ -n ${STREAMLIMIT_KAFKA_PORT:-} ]]; then
      port=$STREAMLIMIT_KAFKA_PORT
      port_free "$port" || die "STREAMLIMIT_KAFKA_PORT $port is taken"
      [[ $cport != "$port" ]] || cport=$(free_ports 1)
      [[ $xport != "$port" ]] || xport=$(free_ports 1)
    fi
    printf '%s %s %s\n' "$port" "$cport" "$xport" >"$PORTFILE"
    # What `kafka-storage random-uuid` prints (base64url of 16 random bytes,
    # never starting with "-"), made without starting a JVM for it.
    cluster=$(python3 -c 'import base64, os
while True:
    u = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
    if not u.startswith("-"):
        print(u)
        break')
    printf '%s\n' "$cluster" >"$CLUSTERFILE"
  fi
  write_config "$port" "$cport" "$xport"
  cluster=$(<"$CLUSTERFILE")
  if [[ ! -f $DATA/meta.properties ]]; then
    if ! java -Dlog4j.configuration="file:$RUN/log4j.properties" -cp "$LIBS/*" \
      kafka.tools.StorageTool format -t "$cluster" -c "$RUN/server.properties" \
      >"$RUN/format.log" 2>&1; then
      cat "$RUN/format.log" >&2
      die "kafka-storage format failed"
    fi
  fi

  : >"$OUTFILE"
  local loglines=0
  [[ ! -f $LOGFILE ]] || loglines=$(wc -l <"$LOGFILE")
  # setsid: the broker outlives this script and the shell that ran it, and a
  # Ctrl-C in that shell does not reach it; `stop` ends it by pid.
  # shellcheck disable=SC2086 # the extra options are words
  setsid nohup java -Xms256m -Xmx"${STREAMLIMIT_KAFKA_HEAP:-512m}" \
    -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
    -Djava.net.preferIPv4Stack=true ${STREAMLIMIT_KAFKA_JVM_OPTS:-} \
    -Dlog4j.configuration="file:$RUN/log4j.properties" \
    -Dkafka.logs.dir="$RUN" \
    -cp "$LIBS/*" kafka.Kafka "$RUN/server.properties" \
    >>"$OUTFILE" 2>&1 </dev/null &
  printf '%s\n' "$!" >"$PIDFILE"
  watch_owner "$PIDFILE" "$RUN/server.properties"

  local addr="127.0.0.1:$port" deadline=$((SECONDS + READY_TIMEOUT))
  until ready "$addr"; do
    if ! pid_alive "$PIDFILE"; then
      print_failure
      local bind # this start's lines only: the log is kept across starts
      bind=$({ tail -n +"$((loglines + 1))" "$LOGFILE"; cat "$OUTFILE"; } 2>/dev/null | grep -m1 'failed to bind' || true)
      [[ -z $bind ]] || die "the Kafka process exited: a port was taken: $bind"
      die "the Kafka process exited"
    fi
    if ((SECONDS >= deadline)); then
      print_failure
      kill_pidfile "$PIDFILE" 10
      die "Kafka not ready at $addr after ${READY_TIMEOUT}s"
    fi
    sleep 0.5
  done
  log "Kafka $VERSION ready at $addr (pid $(<"$PIDFILE"), run dir $RUN)"
  printf '%s\n' "$addr"
}

cmd_stop() {
  local keep=0
  if [[ ${1:-} == --keep-data ]]; then
    keep=1
  elif [[ -n ${1:-} ]]; then
    die "stop: unknown flag $1"
  fi
  kill_pidfile "$PIDFILE" 30
  if [[ $keep -eq 0 ]]; then
    rm -rf "$DATA" "$PORTFILE" "$CLUSTERFILE"
  fi
}

cmd_status() {
  if pid_alive "$PIDFILE" && [[ -f $PORTFILE ]]; then
    address
    return
  fi
  log "not running (run dir $RUN)"
  return 1
}

case ${1:-} in
start) cmd_start ;;
stop) shift; cmd_stop "$@" ;;
status) cmd_status ;;
log) printf '%s\n' "$LOGFILE" ;;
acls)
  shift
  ensure_jars
  exec java -Dlog4j.configuration=file:/dev/null -cp "$LIBS/*" kafka.admin.AclCommand "$@"
  ;;
*)
  printf 'usage: %s start | stop [--keep-data] | status | log | acls ARGS...\n' "$0" >&2
  exit 2
  ;;
esac
