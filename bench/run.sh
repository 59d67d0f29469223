#!/usr/bin/env bash
# run.sh OUT [GO TEST FLAGS...] — the body of `make bench` (run inside
# e2e/services/with-services.sh, which provides Kafka and Redis): run every
# package's benchmarks, this directory's included, then the serving comparison
# (bench/serving.sh; SERVING_* and STREAMLIMIT_BENCH_ENVOY_RATELIMIT pass
# through), the Redis serving comparison against envoyproxy/ratelimit (bench/redis.sh, which
# builds envoyproxy/ratelimit once), the site-scope hot-key table (bench/hotkey.sh;
# HOTKEY_* pass through) and the RLQS serving table (bench/rlqs.sh; RLQS_* pass through),
# write the raw output with
# "# key: value" lines about the machine and the run to OUT, then write the
# Markdown summary to docs/benchmarks.md (SUMMARY overrides the path).
# The exit status is go test's: a failed package still gets its results
# summarised, and the failure listed.
set -uo pipefail
out=$1
shift
GO=${GO:-go}
summary=${SUMMARY:-docs/benchmarks.md}
mkdir -p "$(dirname "$out")" "$(dirname "$summary")"
cmd="$GO test -run '^\$' -bench . -benchmem $* ./..."
{
  echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "# command: make bench (go test -run '^\$' -bench . -benchmem $* ./... under e2e/services/with-services.sh)"
  echo "# cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "# nproc: $(nproc)"
  echo "# go: $($GO version)"
  echo "# commit: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "# loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$out"
echo "bench: $cmd → $out" >&2
start=$SECONDS
$GO test -run '^$' -bench . -benchmem "$@" ./... 2>&1 | tee -a "$out"
rc=${PIPESTATUS[0]}
# The serving comparison: servers and load generator as separate pinned processes.
echo "pkg: github.com/streamlimit/streamlimit/bench/serving" >>"$out"
GO=$GO bash bench/serving.sh | tee -a "$out" || rc=1
# The Redis rows against envoyproxy/ratelimit on the same Redis (bench/redis.sh).
echo "pkg: github.com/streamlimit/streamlimit/bench/serving-redis" >>"$out"
GO=$GO bash bench/redis.sh | tee -a "$out" || rc=1
# Site scope under a hot-key load, in Redis and in process (bench/hotkey.sh).
echo "pkg: github.com/streamlimit/streamlimit/bench/hotkey" >>"$out"
GO=$GO bash bench/hotkey.sh | tee -a "$out" || rc=1
# The RLQS server under a fleet of Envoys' reports (bench/rlqs.sh).
echo "pkg: github.com/streamlimit/streamlimit/bench/rlqs" >>"$out"
GO=$GO bash bench/rlqs.sh | tee -a "$out" || rc=1
{
  echo "# loadavg at end: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# duration: $((SECONDS - start))s"
} >>"$out"
$GO run ./bench/summarize "$out" >"$summary" || rc=1
# Each target's ratio with its goal, on the terminal too.
awk '/^## Targets/{on=1} on && /^## / && !/^## Targets/{exit} on' "$summary"
echo "bench: raw output $out, summary $summary (go test exit $rc)" >&2
exit "$rc"
