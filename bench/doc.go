// Package bench holds streamlimit's cross-package benchmarks, the figures that no single
// package can produce on its own (BenchmarkPropagation: how long a hit admitted at site A
// takes to show in site B's snapshot, split into its stages), beside the scripts and
// commands of the serving, Redis, hot-key and RLQS benchmarks. `make bench` runs them all
// and `go run ./bench/summarize` writes docs/benchmarks.md; what each script measures and
// the current figures: docs/performance.md.
package bench
