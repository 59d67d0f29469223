#!/usr/bin/env bash
# hotkey.sh — the site-scope hot-key table: 10 hot keys, a rule of 100 per second per key
# with scope site, one enforcer with the site's Redis (STREAMLIMIT_REDIS_ADDR), driven
# closed-loop through Envoy's gRPC API (bench/cmd/loadgen) by HOTKEY_CALLERS callers on 4
# connections for HOTKEY_DURATION, once per site algorithm. Each run prints one go-test
# bench style line that bench/summarize reads:
#
#   BenchmarkHotKey/scope=S/algorithm=A/callers=C 1 … req/s … admitted … start-unix-µs …
#     end-unix-µs … keys … limit/s … fallback
#
# Scope "site" decides in Redis; scope "local" runs the same rule in process, which tells
# what the algorithm itself admits (its own start-up burst, for instance), so that the
# site rows' excess over it is what Redis adds (none is expected).
#
# bench/summarize sets each row against the most the rule's algorithm can admit over the
# run, exactly, from the instants the load began and ended (exactBound in
# bench/summarize/hotkey.go: a sliding window admits a fresh key's whole limit at once,
# then the limit again each time the sub-bucket that held it has left the window); "fallback" is the enforcer's
# streamlimit_redis_fallback_decisions_total after the run, summed over reasons (every
# decision made in process instead of in Redis); a run with fallbacks is followed by a
# "# hotkey fallback reasons, ..." line with the count per reason.
#
# Environment (defaults): HOTKEY_CALLERS ("32 128"), HOTKEY_DURATION (5s), HOTKEY_ALGORITHMS
# ("sliding_window sliding_window_estimate fixed_window sliding_log token_bucket leaky_bucket
# gcra"), HOTKEY_SCOPES
# ("site local"), GO (go).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
callers_list=${HOTKEY_CALLERS:-32 128}
duration=${HOTKEY_DURATION:-5s}
algorithms=${HOTKEY_ALGORITHMS:-sliding_window sliding_window_estimate fixed_window sliding_log token_bucket leaky_bucket gcra}
scopes=${HOTKEY_SCOPES:-site local}
keys=10 limit=100
: "${STREAMLIMIT_REDIS_ADDR:?hotkey.sh needs a Redis: STREAMLIMIT_REDIS_ADDR}"

work=$(mktemp -d)
spid=""
cleanup() {
  [ -n "$spid" ] && kill "$spid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
log() { echo "hotkey: $*" >&2; }

$GO build -o "$work/streamlimit" ./cmd/streamlimit
$GO build -o "$work/loadgen" ./bench/cmd/loadgen
echo "# hotkey: keys $keys, limit $limit/s per key (scopes $scopes; Redis $STREAMLIMIT_REDIS_ADDR), duration $duration, conns 4"

run=0
for alg in $algorithms; do
  for scope in $scopes; do
  for callers in $callers_list; do
    run=$((run + 1))
    cat >"$work/rules.yaml" <<YAML
domain: api
descriptors:
  - key: user
    rate_limit: {requests_per_unit: $limit, unit: second, scope: $scope, algorithm: $alg}
YAML
    out="$work/enforcer.out"
    env -i PATH="$PATH" HOME="$HOME" "$work/streamlimit" enforcer --site bench --rules "$work/rules.yaml" \
      --http-listen 127.0.0.1:0 --grpc-listen 127.0.0.1:0 --log-level warn --no-kafka \
      --redis-addr "$STREAMLIMIT_REDIS_ADDR" >"$out" 2>&1 &
    spid=$!
    h="" g=""
    for _ in $(seq 1200); do # up to a minute on a busy machine
      # Only a whole line counts: the address line is written in pieces.
      line=$(grep -m1 '^enforcer site .*grpc [0-9.:]*$' "$out" || true)
      if [ -n "$line" ]; then
        h=$(sed -n 's/.*http \([^,]*\),.*/\1/p' <<<"$line")
        g=$(sed -n 's/.*grpc \([^ ,]*\).*/\1/p' <<<"$line")
        break
      fi
      sleep 0.05
    done
    if [ -z "$g" ]; then
      log "enforcer did not start: $(cat "$out")"
      exit 1
    fi
    # The address is printed before the listeners serve: wait until the port answers.
    for _ in $(seq 1200); do
      if (exec 3<>"/dev/tcp/${g%:*}/${g##*:}") 2>/dev/null; then break; fi
      sleep 0.05
    done
    line=$("$work/loadgen" -api grpc -addr "$g" -callers "$callers" -conns 4 -keys "$keys" \
      -duration "$duration" -prefix "hot$$-$run-" -bench "HotKey/scope=$scope/algorithm=$alg/callers=$callers")
    curl -fsS "http://$h/metrics" >"$work/metrics"
    fb=$(awk '/^streamlimit_redis_fallback_decisions_total/ {s += $2} END {print s + 0}' "$work/metrics")
    log "$scope $alg, $callers callers: $(grep -E '^streamlimit_redis_(calls_total|fallback_decisions_total|canceled_total)' "$work/metrics" | tr '\n' ' ')"
    kill "$spid" 2>/dev/null || true
    wait "$spid" 2>/dev/null || true
    spid=""
    # bench/summarize computes the most the algorithm can admit (its exact bound) from
    # the run's instants (start-unix-µs, end-unix-µs on the loadgen line), keys and limit.
    echo "$line	$keys keys	$limit limit/s	$fb fallback"
    if [ "$fb" != 0 ]; then
      # Which reasons, so that a record tells a Redis that timed out from one that was
      # writing back (a line bench/summarize skips).
      echo "# hotkey fallback reasons, $scope $alg $callers callers = $(awk '/^streamlimit_redis_fallback_decisions_total/ {
        r = $1; sub(/.*reason="/, "", r); sub(/".*/, "", r); printf "%s %s ", r, $2}' "$work/metrics")"
    fi
    log "$line $fb fallback"
  done
  done
done
