#!/usr/bin/env bash
# redis.sh — the Redis serving comparison: envoyproxy/ratelimit and streamlimit deciding
# in the same Redis (STREAMLIMIT_REDIS_ADDR), in the same run, through bench/serving.sh
# (each server pinned to core 0, the load generator to core 1, rows interleaved round after
# round; SERVING_* pass through), Envoy's gRPC API only:
#
#   null                     the ceiling
#   envoy-ratelimit          envoyproxy/ratelimit with the Redis, its default settings
#   streamlimit-site         the rule with scope: site: every call decided in the Redis
#   streamlimit-kafka-redis  the global rule, publishing to the real broker
#                            (STREAMLIMIT_KAFKA_BROKERS), this site counted in the Redis
#
# envoyproxy/ratelimit is built from its module at ENVOY_RATELIMIT_VERSION with `go
# install`, once, into ${XDG_CACHE_HOME:-~/.cache}/streamlimit/ (nothing of it is in this
# repository); STREAMLIMIT_BENCH_ENVOY_RATELIMIT names a binary to use instead.
# bench/summarize reads the lines (BenchmarkServing/..., under "pkg: .../bench/serving-redis")
# into the "Serving with Redis" table and its targets, each a ratio to envoyproxy/ratelimit
# in the same round.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
: "${STREAMLIMIT_REDIS_ADDR:?redis.sh needs a Redis: STREAMLIMIT_REDIS_ADDR}"
version=${ENVOY_RATELIMIT_VERSION:-v1.4.1-0.20260122083618-3fb702589d36}
envoy=${STREAMLIMIT_BENCH_ENVOY_RATELIMIT:-}
if [ -z "$envoy" ]; then
  dir=${XDG_CACHE_HOME:-$HOME/.cache}/streamlimit/envoy-ratelimit-$version
  envoy=$dir/service_cmd
  if [ ! -x "$envoy" ]; then
    echo "redis: building envoyproxy/ratelimit $version into $dir" >&2
    mkdir -p "$dir"
    # Outside this module, so that its dependencies do not meet ours.
    (cd "$dir" && GOBIN=$dir GOFLAGS=-mod=mod $GO install "github.com/envoyproxy/ratelimit/src/service_cmd@$version") >&2
  fi
fi
STREAMLIMIT_BENCH_ENVOY_RATELIMIT=$envoy SERVING_APIS=grpc \
  SERVING_SERVERS=${REDIS_SERVERS:-null envoy-ratelimit streamlimit-site streamlimit-kafka-redis} \
  GO=$GO bash bench/serving.sh
