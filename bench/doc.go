// Package bench holds streamlimit's cross-package benchmarks, the figures that no single
// package can produce on its own:
//
//   - BenchmarkServing: throughput and p50/p99 latency of the HTTP check API
//     (POST /v1/check) and of Envoy's ShouldRateLimit over gRPC, from a load generator on
//     the same machine, against a real enforcer server (enforcer/server) running as a
//     separate process. On a machine with two or more cores the server is pinned to core
//     0 and the generator to core 1 (taskset), so that neither steals the other's CPU.
//   - BenchmarkPropagation: how long a hit admitted at site A takes to show in site B's
//     snapshot, through the producer, the hits topic on a real broker, the aggregator and
//     the counts topic, with the delay split into its stages.
//
// The package has no API: everything is in its _test files. `make bench` runs these with
// every package's benchmarks, and `go run ./bench/summarize` turns the raw output into
// docs/benchmarks.md.
package bench
