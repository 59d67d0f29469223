#!/usr/bin/env bash
# rlqs.sh — the RLQS serving benchmark: `streamlimit enforcer --rlqs-addr` pinned to core 0
# (taskset, GOMAXPROCS 1), bench/cmd/rlqsload pinned to core 1, as many Envoys as
# RLQS_STREAMS each reporting RLQS_BUCKETS buckets every RLQS_INTERVAL — 5 s, the fixed
# cadence of Envoy's filter, whatever reporting_interval says (phases spread evenly,
# messages encoded once, streams over RLQS_CONNS connections). Each round prints one
# `go test -bench` style line ("BenchmarkRLQS/streams=…/buckets=…/server=… 1 … reports/s
# … offered-reports/s … server-cpu-µs/report … server-cores … server-rss-MiB"), which
# bench/summarize reads: the bucket reports the server handled per second (its
# streamlimit_rlqs_bucket_reports_total) against those offered, and the server process's
# CPU time (user + system, from /proc) per bucket report.
#
# Environment (defaults): RLQS_ROUNDS (3), RLQS_STREAMS (10000), RLQS_BUCKETS (100),
# RLQS_CONNS (100), RLQS_KEYS (10000: distinct bucket ids, so each is held by
# STREAMS × BUCKETS / KEYS streams), RLQS_INTERVAL (5s; 1s for the extra row of a filter
# reporting faster than Envoy does), RLQS_WARMUP (15s), RLQS_DURATION (20s),
# RLQS_SERVERS ("streamlimit": no Kafka, so no counts: a global limit is the server's
# default share and a report's quota skips the share computation; "streamlimit-kafka", the
# path of a deployment: it publishes every report's hits to STREAMLIMIT_KAFKA_BROKERS, and an
# aggregator pinned beside the load generator counts them back into its snapshot, so that
# each report's quota is computed from fresh counts), RLQS_MAX_MEMORY (32GiB: the server's --max-memory),
# GO (go). Every stream comes from one address, so the server's bounds per client address
# are lifted: --rlqs-max-streams-per-addr above RLQS_STREAMS, and a --max-memory whose RLQS
# part's eighth holds them all (1 000 streams of 100 buckets need about 180 MiB of it);
# under the defaults all but 64 streams are refused, and the figures are not of the load.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
rounds=${RLQS_ROUNDS:-3}
streams=${RLQS_STREAMS:-10000}
buckets=${RLQS_BUCKETS:-100}
conns=${RLQS_CONNS:-100}
keys=${RLQS_KEYS:-10000}
warmup=${RLQS_WARMUP:-15s}
duration=${RLQS_DURATION:-20s}
interval=${RLQS_INTERVAL:-5s}
variant="" # Envoy's cadence keeps the name bench/summarize reads
[ "$interval" = 5s ] || variant="/interval=$interval"
servers=${RLQS_SERVERS:-streamlimit}

work=$(mktemp -d)
spid=""
cleanup() {
  [ -z "$spid" ] || kill "$spid" 2>/dev/null || true
  [ -z "${apid:-}" ] || kill "$apid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
log() { echo "rlqs: $*" >&2; }

$GO build -o "$work/streamlimit" ./cmd/streamlimit
$GO build -o "$work/rlqsload" ./bench/cmd/rlqsload
pin_server="" pin_load=""
if [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
  pin_server="taskset -c 0" pin_load="taskset -c 1"
fi
echo "# rlqs: rounds $rounds, streams $streams, buckets $buckets, interval $interval, conns $conns, keys $keys, warmup $warmup, duration $duration, pinned $([ -n "$pin_server" ] && echo yes || echo no)"
cat >"$work/rules.yaml" <<'YAML'
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
YAML
brokers=${STREAMLIMIT_KAFKA_BROKERS:-}
run_id=$$-$RANDOM
apid=""

for round in $(seq "$rounds"); do
  for name in $servers; do
    kafka=(--no-kafka)
    if [ "$name" = streamlimit-kafka ]; then
      [ -n "$brokers" ] || { log "skip $name: STREAMLIMIT_KAFKA_BROKERS unset"; continue; }
      kafka=(--brokers "$brokers" --hits-topic "bench-rlqs-hits-$run_id-$round" --counts-topic "bench-rlqs-counts-$run_id-$round")
      "$work/streamlimit" topics ensure "${kafka[@]}" --replication-factor 1 >"$work/topics-$round.out" 2>&1 ||
        { log "topics: $(cat "$work/topics-$round.out")"; echo "--- FAIL: BenchmarkRLQS/server=$name: topics"; continue; }
      # The aggregator shares the load generator's core: the server's core is measured.
      env -i PATH="$PATH" HOME="$HOME" GOMAXPROCS=1 $pin_load "$work/streamlimit" aggregator "${kafka[@]}" \
        --group "bench-rlqs-$run_id-$round" --admin-listen 127.0.0.1:0 --log-level warn >"$work/aggregator-$round.out" 2>&1 &
      apid=$!
    fi
    out="$work/$name-$round.out"
    # A clean environment: every flag also reads STREAMLIMIT_<FLAG>. Long HTTP timeouts:
    # an overloaded server reaches the metrics request late, and must still answer it.
    env -i PATH="$PATH" HOME="$HOME" GOMAXPROCS=1 $pin_server "$work/streamlimit" enforcer --site bench --rules "$work/rules.yaml" \
      --http-listen 127.0.0.1:0 --grpc-listen off --rlqs-addr 127.0.0.1:0 --rlqs-reporting-interval "$interval" \
      --rlqs-max-streams-per-addr $((streams + 100)) --max-memory "${RLQS_MAX_MEMORY:-32GiB}" \
      --max-conns $((conns + 100)) --read-header-timeout 2m --read-timeout 2m --write-timeout 2m \
      --log-level warn "${kafka[@]}" >"$out" 2>&1 &
    spid=$!
    h="" q=""
    for _ in $(seq 200); do
      if grep -q '^enforcer site' "$out"; then
        h=$(sed -n 's/.*http \([^,]*\),.*/\1/p' "$out" | head -1)
        q=$(sed -n 's/.*rlqs \([^ ,]*\).*/\1/p' "$out" | head -1)
        break
      fi
      sleep 0.05
    done
    if [ -z "$q" ]; then
      log "$name did not start: $(cat "$out")"
      echo "--- FAIL: BenchmarkRLQS/server=$name: did not start"
      kill "$spid" 2>/dev/null || true
      spid=""
      [ -z "$apid" ] || kill "$apid" 2>/dev/null || true
      apid=""
      continue
    fi
    GOMAXPROCS=1 $pin_load "$work/rlqsload" -addr "$q" -metrics "http://$h/metrics" -server-pid "$spid" \
      -streams "$streams" -conns "$conns" -buckets "$buckets" -keys "$keys" -interval "$interval" -warmup "$warmup" -duration "$duration" \
      -bench "RLQS/streams=$streams/buckets=$buckets$variant/server=$name" || echo "--- FAIL: BenchmarkRLQS/server=$name: load generator failed"
    kill "$spid" 2>/dev/null || true
    wait "$spid" 2>/dev/null || true
    spid=""
    if [ -n "$apid" ]; then
      kill "$apid" 2>/dev/null || true
      wait "$apid" 2>/dev/null || true
      apid=""
    fi
  done
done
