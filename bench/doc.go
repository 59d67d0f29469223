// Package bench holds streamlimit's cross-package benchmarks, the figures that no single
// package can produce on its own:
//
//   - The serving comparison (serving.sh): the enforcer's Envoy RLS v3 gRPC service and
//     HTTP check API under the load generator (bench/loadgen, bench/cmd/loadgen), against
//     a null server that answers OK at once (bench/cmd/nullserver, the ceiling), with and
//     without Kafka, and envoyproxy/ratelimit when its binary is given. Each server runs
//     pinned to core 0 and the load generator to core 1 (taskset, GOMAXPROCS 1 each).
//   - The Redis serving comparison (redis.sh): envoyproxy/ratelimit, built by the script
//     at a pinned version, against streamlimit's site scope and its global + Kafka + Redis
//     site counter, on one Redis, through serving.sh.
//   - The hot-key table (hotkey.sh): site scope in Redis and in process, set against each
//     algorithm's exact bound.
//   - The RLQS serving benchmark (rlqs.sh): the enforcer's Rate Limit Quota Service
//     pinned to one core under a fleet of Envoys' reports (bench/cmd/rlqsload), its
//     bucket reports served per second and CPU time per report.
//   - BenchmarkPropagation: how long a hit admitted at site A takes to show in site B's
//     snapshot, through the producer, the hits topic on a real broker, the aggregator and
//     the counts topic, with the delay split into its stages.
//
// `make bench` (bench/run.sh) runs every package's benchmarks, then serving.sh, hotkey.sh
// and rlqs.sh, and `go run ./bench/summarize` turns the raw output into
// docs/benchmarks.md, each target with its goal and the baseline it is a ratio of.
package bench
