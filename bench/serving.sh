#!/usr/bin/env bash
# serving.sh — the serving comparison: each server pinned to core 0 (taskset, GOMAXPROCS
# 1), the load generator (bench/cmd/loadgen) pinned to core 1, same load for every row:
#
#   null               bench/cmd/nullserver: answers OK at once (the ceiling)
#   streamlimit        streamlimit enforcer --no-kafka, one global rule
#   streamlimit-kafka  streamlimit enforcer, same rule, its producer publishing every
#                      admitted hit to the real broker (needs STREAMLIMIT_KAFKA_BROKERS)
#   streamlimit-redis  streamlimit enforcer --no-kafka with the site's Redis
#                      (STREAMLIMIT_REDIS_ADDR): for site-scope rules (SERVING_RULES); not
#                      in the default list
#   streamlimit-site   streamlimit enforcer --no-kafka with the site's Redis, the same rule
#                      with scope: site (every call decided in Redis); not in the default list
#   streamlimit-kafka-redis
#                      streamlimit enforcer, the global rule, publishing to the real broker
#                      and counting this site in the site's Redis (sitestore.Counter): a data
#                      center of several enforcers; not in the default list
#   envoy-ratelimit    envoyproxy/ratelimit with Redis, gRPC only: set
#                      STREAMLIMIT_BENCH_ENVOY_RATELIMIT to its binary (built by you from
#                      its source; nothing of it is in this repository) and
#                      STREAMLIMIT_REDIS_ADDR; the row is skipped otherwise
#
# for both APIs (gRPC ShouldRateLimit, HTTP POST /v1/check). Rows are interleaved, round
# after round, so that the machine's noise falls on all of them alike. Every result is one
# `go test -bench` style line on stdout ("BenchmarkServing/api=grpc/server=null 1 … req/s
# … p50-µs … p99-µs … admitted … server-cpu-µs/req"), which bench/summarize reads; progress
# goes to stderr. server-cpu-µs/req is the server process's CPU time (user + system) per
# answered call, from /proc: the cost per call whatever the generator managed;
# broker-cpu-µs/req the Kafka broker's (when STREAMLIMIT_RUN_DIR holds the one
# e2e/services started), which every row pays for, the Kafka row most.
#
# Environment (defaults): SERVING_ROUNDS (3), SERVING_DURATION (10s), SERVING_CALLERS
# (32), SERVING_CONNS (4), SERVING_KEYS (10000), SERVING_APIS ("grpc http"),
# SERVING_SERVERS ("null streamlimit streamlimit-kafka envoy-ratelimit"), SERVING_RULES
# (a rules file for the streamlimit rows, domain "api", descriptor "user"; default one
# global rule high enough to admit everything), SERVING_LOADGEN_FLAGS (more loadgen flags,
# e.g. "-rate-per-key 100" for a paced hot-key table with SERVING_KEYS=10),
# SERVING_WARMUP (2s of unpaced calls on the same keys before each run; 0 for none, as a
# table of limited keys wants), SERVING_PERF (a directory: record each server's CPU profile
# during its run with `perf record -e cpu-clock -g`, into DIR/<api>-<server>-r<round>.data, to
# read with `perf report -i FILE`; the servers need no profiling code), GO (go).
# A hot-key table of a site rule:
#
#   SERVING_SERVERS="null streamlimit-redis" SERVING_KEYS=10 SERVING_RULES=site.yaml \
#     SERVING_WARMUP=0 SERVING_LOADGEN_FLAGS="-rate-per-key 100" bash bench/serving.sh
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
rounds=${SERVING_ROUNDS:-3}
duration=${SERVING_DURATION:-10s}
callers=${SERVING_CALLERS:-32}
conns=${SERVING_CONNS:-4}
keys=${SERVING_KEYS:-10000}
apis=${SERVING_APIS:-grpc http}
servers=${SERVING_SERVERS:-null streamlimit streamlimit-kafka envoy-ratelimit}
warmup=${SERVING_WARMUP:-2s}
perfdir=${SERVING_PERF:-}
if [ -n "$perfdir" ]; then
  command -v perf >/dev/null || { echo "serving: SERVING_PERF needs perf (linux-perf)" >&2; exit 1; }
  mkdir -p "$perfdir"
fi

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
log() { echo "serving: $*" >&2; }

log "building into $work"
$GO build -o "$work/streamlimit" ./cmd/streamlimit
$GO build -o "$work/nullserver" ./bench/cmd/nullserver
$GO build -o "$work/loadgen" ./bench/cmd/loadgen

pin_server="" pin_load=""
if [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
  pin_server="taskset -c 0" pin_load="taskset -c 1"
  log "server pinned to core 0, load generator to core 1 (GOMAXPROCS 1 each)"
else
  log "not pinned: $(nproc) core(s) or no taskset"
fi
echo "# serving: rounds $rounds, duration $duration, callers $callers, conns $conns, keys $keys, pinned $([ -n "$pin_server" ] && echo yes || echo no)"

if [ -n "${SERVING_RULES:-}" ]; then
  cp "$SERVING_RULES" "$work/rules.yaml"
else
  cat >"$work/rules.yaml" <<'YAML'
domain: api
descriptors:
  - key: user
    rate_limit: {name: per-minute, unit: minute, requests_per_unit: 1000000000}
YAML
fi
# The same rule with scope site, for the streamlimit-site row.
sed 's/requests_per_unit: \([0-9]*\)}/requests_per_unit: \1, scope: site}/' "$work/rules.yaml" >"$work/site.yaml"
read -r -a extra <<<"${SERVING_LOADGEN_FLAGS:-}"

brokers=${STREAMLIMIT_KAFKA_BROKERS:-}
run_id=$$-$RANDOM
if [ -n "$brokers" ]; then
  "$work/streamlimit" topics ensure --brokers "$brokers" --hits-topic "bench-hits-$run_id" \
    --counts-topic "bench-counts-$run_id" --hits-partitions 4 --counts-partitions 4 >&2
fi

# envoyproxy/ratelimit's configuration: the same rule, and a limit high enough that every
# call is admitted.
envoy=${STREAMLIMIT_BENCH_ENVOY_RATELIMIT:-}
if [ -n "$envoy" ]; then
  mkdir -p "$work/envoy/config"
  cat >"$work/envoy/config/config.yaml" <<'YAML'
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
YAML
fi

# start NAME API: starts the server for a row, sets $addr (of API) and $spid.
start() {
  local name=$1 api=$2 out="$work/$1.out"
  : >"$out"
  h="" g=""
  case $name in
    null)
      GOMAXPROCS=1 $pin_server "$work/nullserver" -http 127.0.0.1:0 -grpc 127.0.0.1:0 >"$out" 2>&1 &
      spid=$!
      ;;
    streamlimit | streamlimit-kafka | streamlimit-redis | streamlimit-site | streamlimit-kafka-redis)
      local kafka=(--no-kafka) rules="$work/rules.yaml"
      case $name in
        streamlimit-kafka) kafka=(--brokers "$brokers" --hits-topic "bench-hits-$run_id" --counts-topic "bench-counts-$run_id") ;;
        streamlimit-redis) kafka=(--no-kafka --redis-addr "$STREAMLIMIT_REDIS_ADDR") ;;
        streamlimit-site) kafka=(--no-kafka --redis-addr "$STREAMLIMIT_REDIS_ADDR") rules="$work/site.yaml" ;;
        streamlimit-kafka-redis) kafka=(--brokers "$brokers" --hits-topic "bench-hits-$run_id" --counts-topic "bench-counts-$run_id"
          --redis-addr "$STREAMLIMIT_REDIS_ADDR") ;;
      esac
      # A clean environment: every flag of the command also reads STREAMLIMIT_<FLAG>
      # (STREAMLIMIT_REDIS_ADDR would give the server a site Redis).
      env -i PATH="$PATH" HOME="$HOME" GOMAXPROCS=1 $pin_server "$work/streamlimit" enforcer --site bench --rules "$rules" \
        --http-listen 127.0.0.1:0 --grpc-listen 127.0.0.1:0 --log-level warn "${kafka[@]}" >"$out" 2>&1 &
      spid=$!
      ;;
    envoy-ratelimit)
      local port=$((20000 + RANDOM % 20000))
      RUNTIME_ROOT="$work/envoy" RUNTIME_SUBDIRECTORY=. RUNTIME_WATCH_ROOT=false \
        USE_STATSD=false LOG_LEVEL=warn REDIS_SOCKET_TYPE=tcp REDIS_URL="$STREAMLIMIT_REDIS_ADDR" \
        GRPC_HOST=127.0.0.1 GRPC_PORT=$port HOST=127.0.0.1 PORT=$((port + 1)) DEBUG_HOST=127.0.0.1 DEBUG_PORT=$((port + 2)) \
        GOMAXPROCS=1 $pin_server "$envoy" >>"$out" 2>&1 &
      spid=$!
      echo "ADDR - 127.0.0.1:$port" >>"$out"
      ;;
  esac
  pids+=("$spid")
  for _ in $(seq 200); do
    if grep -q '^ADDR ' "$out"; then
      read -r _ h g < <(grep -m1 '^ADDR ' "$out")
      break
    elif grep -q '^enforcer site' "$out"; then
      h=$(sed -n 's/.*http \([^,]*\),.*/\1/p' "$out" | head -1)
      g=$(sed -n 's/.*grpc \([^ ,]*\).*/\1/p' "$out" | head -1)
      break
    fi
    sleep 0.05
  done
  if [ "$api" = http ]; then addr=$h; else addr=$g; fi
  if [ -z "${addr:-}" ] || [ "$addr" = - ]; then
    log "$name did not start: $(cat "$out")"
    return 1
  fi
  # Wait until the port answers (envoy-ratelimit prints nothing when ready).
  for _ in $(seq 200); do
    if (exec 3<>"/dev/tcp/${addr%:*}/${addr##*:}") 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  log "$name: $addr never accepted a connection: $(tail -5 "$out")"
  return 1
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
# The broker's process, when it runs here (e2e/services, as under make bench): its CPU per
# call shows what each row costs Kafka, which shares the machine's cores with the rows.
broker_pid=""
if [ -n "${STREAMLIMIT_RUN_DIR:-}" ] && [ -f "$STREAMLIMIT_RUN_DIR/kafka/kafka.pid" ]; then
  broker_pid=$(cat "$STREAMLIMIT_RUN_DIR/kafka/kafka.pid")
fi

for round in $(seq "$rounds"); do
  for api in $apis; do
    for name in $servers; do
      case $name in
        streamlimit-kafka) [ -n "$brokers" ] || { log "skip $name: STREAMLIMIT_KAFKA_BROKERS unset"; continue; } ;;
        streamlimit-redis | streamlimit-site) [ -n "${STREAMLIMIT_REDIS_ADDR:-}" ] || { log "skip $name: STREAMLIMIT_REDIS_ADDR unset"; continue; } ;;
        streamlimit-kafka-redis)
          [ -n "$brokers" ] && [ -n "${STREAMLIMIT_REDIS_ADDR:-}" ] || { log "skip $name: STREAMLIMIT_KAFKA_BROKERS or STREAMLIMIT_REDIS_ADDR unset"; continue; } ;;
        envoy-ratelimit)
          [ -n "$envoy" ] && [ -n "${STREAMLIMIT_REDIS_ADDR:-}" ] || { [ "$round" = 1 ] && log "skip $name: STREAMLIMIT_BENCH_ENVOY_RATELIMIT or STREAMLIMIT_REDIS_ADDR unset"; continue; }
          [ "$api" = grpc ] || continue
          ;;
      esac
      addr=""
      if ! start "$name" "$api"; then
        echo "--- FAIL: BenchmarkServing/api=$api/server=$name: did not start"
        continue
      fi
      # Warm-up (so the server holds every counter), then the run.
      if [ "$warmup" != 0 ]; then
        GOMAXPROCS=1 $pin_load "$work/loadgen" -api "$api" -addr "$addr" -callers "$callers" -conns "$conns" \
          -keys "$keys" -duration "$warmup" -prefix "r$round-" >/dev/null
      fi
      perfpid=""
      if [ -n "$perfdir" ]; then
        perf record -q -e cpu-clock -F 999 -g -p "$spid" -o "$perfdir/$api-$name-r$round.data" -- sleep "$duration" 2>/dev/null &
        perfpid=$!
      fi
      t0=$(cpu_ticks "$spid")
      b0=0
      [ -z "$broker_pid" ] || b0=$(cpu_ticks "$broker_pid")
      line=$(GOMAXPROCS=1 $pin_load "$work/loadgen" -api "$api" -addr "$addr" -callers "$callers" -conns "$conns" \
        -keys "$keys" -duration "$duration" -prefix "r$round-" "${extra[@]}" -bench "Serving/api=$api/server=$name")
      t1=$(cpu_ticks "$spid")
      b1=0
      [ -z "$broker_pid" ] || b1=$(cpu_ticks "$broker_pid")
      [ -z "$perfpid" ] || wait "$perfpid" || log "perf record failed for $name ($api)"
      calls=$(awk '{for (i = 1; i < NF; i++) if ($(i+1) == "admitted" || $(i+1) == "denied") s += $i} END {print s + 0}' <<<"$line")
      hz=$(getconf CLK_TCK)
      cpu=$(awk -v t="$((t1 - t0))" -v hz="$hz" -v n="$calls" 'BEGIN {if (n > 0) printf "%.2f", t / hz * 1e6 / n; else print 0}')
      bcpu=""
      if [ -n "$broker_pid" ]; then
        bcpu=$(awk -v t="$((b1 - b0))" -v hz="$hz" -v n="$calls" 'BEGIN {if (n > 0) printf "\t%.2f broker-cpu-µs/req", t / hz * 1e6 / n}')
      fi
      echo "$line	$cpu server-cpu-µs/req$bcpu"
      log "round $round: $line $cpu server-cpu-µs/req$bcpu"
      kill "$spid" 2>/dev/null || true
      wait "$spid" 2>/dev/null || true
    done
  done
done
