# shellcheck shell=bash
# Shared helpers for the real-services scripts (kafka.sh, redis.sh,
# with-services.sh). Sourced, never run: it only defines functions.

# services_root prints the directory under which each service keeps its run
# directory. STREAMLIMIT_RUN_DIR wins; STREAMLIMIT_SERVICES_DIR (exported by
# with-services.sh for the tests it runs) comes next, so a test that restarts
# Kafka with kafka.sh reaches the instance the harness started.
services_root() {
  printf '%s\n' "${STREAMLIMIT_RUN_DIR:-${STREAMLIMIT_SERVICES_DIR:-/tmp/streamlimit-services}}"
}

die() {
  printf '%s: %s\n' "$(basename "$0")" "$*" >&2
  exit 1
}

log() {
  printf '%s: %s\n' "$(basename "$0")" "$*" >&2
}

# apt_install installs Debian packages when running as root; otherwise it
# names what is missing and fails. apt-get update runs at most once per
# script run.
APT_UPDATED=0
apt_install() {
  if [[ $(id -u) -ne 0 ]]; then
    die "missing $*; install it (apt-get install -y $*) and retry"
  fi
  if [[ $APT_UPDATED -eq 0 ]]; then
    log "apt-get update"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || die "apt-get update failed"
    APT_UPDATED=1
  fi
  log "apt-get install -y $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2 ||
    die "apt-get install $* failed"
}

# need_cmd CMD PKG installs PKG when CMD is not on PATH.
need_cmd() {
  command -v "$1" >/dev/null 2>&1 || apt_install "$2"
  command -v "$1" >/dev/null 2>&1 || die "$1 still missing after installing $2"
}

# free_ports N prints N distinct loopback TCP ports that were free a moment
# ago. All sockets are held open until every port is chosen, so the N ports
# differ from each other.
free_ports() {
  python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    socks.append(s)
for s in socks:
    print(s.getsockname()[1])
    s.close()
PY
}

# port_free PORT succeeds when nothing listens on 127.0.0.1:PORT.
port_free() {
  python3 - "$1" <<'PY'
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
finally:
    s.close()
PY
}

# pid_alive PIDFILE succeeds when the file names a live process.
pid_alive() {
  local pid
  [[ -s $1 ]] || return 1
  pid=$(<"$1")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null
}

# kill_pidfile PIDFILE SECONDS sends SIGTERM, waits up to SECONDS for the
# process to exit, then sends SIGKILL. It removes the pid file.
kill_pidfile() {
  local pidfile=$1 wait_s=$2 pid i
  if pid_alive "$pidfile"; then
    pid=$(<"$pidfile")
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < wait_s * 10; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "pid $pid did not stop after ${wait_s}s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      for ((i = 0; i < 50; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
      done
    fi
  fi
  rm -f "$pidfile"
}

# watch_owner PIDFILE MARK: when STREAMLIMIT_OWNER_PID is set, a detached watcher stops
# the process named by PIDFILE once the owner process has exited, so that a service never
# outlives the test binary that started it when the binary dies without running its
# cleanup (a panic, a test timeout, SIGKILL). The watcher ends with the service, and kills
# only a process whose command line still holds MARK (the run directory), never a
# process that reused the pid.
watch_owner() {
  local owner=${STREAMLIMIT_OWNER_PID:-} pid
  [[ -n $owner ]] || return 0
  pid=$(<"$1")
  setsid nohup bash -c '
    owner=$1 pid=$2 mark=$3
    ours() { tr "\0" " " <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$mark"; }
    while kill -0 "$owner" 2>/dev/null && kill -0 "$pid" 2>/dev/null; do sleep 1; done
    ours || exit 0
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 300); do ours || exit 0; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
  ' watch_owner "$owner" "$pid" "$2" >/dev/null 2>&1 </dev/null &
}

# The logging binding Kafka 3.9's own distribution ships (libs/ of the tgz), for every JVM
# these scripts run from Maven's jars.
SLF4J_VERSION=1.7.36
RELOAD4J_VERSION=1.2.25

# write_log4j FILE LOGFILE [LOGGER=LEVEL...]: writes a log4j 1 configuration to FILE that
# appends everything at INFO to LOGFILE, with each LOGGER set to LEVEL (the broker and
# MirrorMaker quiet different chatter).
write_log4j() {
  local file=$1 logfile=$2
  shift 2
  {
    echo "log4j.rootLogger=INFO, file"
    echo "log4j.appender.file=org.apache.log4j.FileAppender"
    echo "log4j.appender.file.File=$logfile"
    echo "log4j.appender.file.Append=true"
    echo "log4j.appender.file.layout=org.apache.log4j.PatternLayout"
    echo "log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n"
    local kv
    for kv in "$@"; do
      echo "log4j.logger.$kv"
    done
  } >"$file"
}

# fetch_jars NAME LIBS CHECK_JAR ARTIFACT...: has Maven copy org.apache.kafka:ARTIFACT of
# $VERSION (each), the logging binding and their runtime dependencies into LIBS, once
# (LIBS/.complete marks a finished copy), using $CACHE for the POM and Maven's log.
# CHECK_JAR must be among the copied files.
fetch_jars() {
  local name=$1 libs=$2 check=$3
  shift 3
  if [[ -f $libs/.complete ]]; then
    return
  fi
  need_cmd java default-jre-headless
  need_cmd mvn maven
  mkdir -p "$CACHE"
  local pom=$CACHE/$name-pom.xml mvnlog=$CACHE/$name-mvn.log deps="" a
  for a in "$@"; do
    deps+="    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>$a</artifactId>
      <version>$VERSION</version>
    </dependency>
"
  done
  cat >"$pom" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>streamlimit.testenv</groupId>
  <artifactId>$name-runtime</artifactId>
  <version>$VERSION</version>
  <packaging>pom</packaging>
  <dependencies>
$deps    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-reload4j</artifactId>
      <version>$SLF4J_VERSION</version>
    </dependency>
    <dependency>
      <groupId>ch.qos.reload4j</groupId>
      <artifactId>reload4j</artifactId>
      <version>$RELOAD4J_VERSION</version>
    </dependency>
  </dependencies>
</project>
POM
  log "fetching $name ($VERSION) jars with Maven into $libs"
  rm -rf "$libs"
  if ! mvn -q -B -f "$pom" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$libs" >"$mvnlog" 2>&1; then
    tail -n 40 "$mvnlog" >&2
    die "mvn could not fetch org.apache.kafka:{$*}:$VERSION (log: $mvnlog)"
  fi
  [[ -f $libs/$check ]] || die "$check missing from $libs"
  touch "$libs/.complete"
}
