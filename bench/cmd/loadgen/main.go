// Command loadgen drives a rate-limit service with Envoy's RLS v3 gRPC call or
// streamlimit's HTTP check API and prints throughput, p50 and p99 latency and the admitted
// count (package bench/loadgen).
//
//	go run ./bench/cmd/loadgen -api grpc -addr 127.0.0.1:8082 -callers 32 -conns 4 -keys 10000 -duration 10s
//	go run ./bench/cmd/loadgen -api grpc -addr 127.0.0.1:8082 -keys 10 -rate 1000 -per-key   # 10 hot keys, 100/s each
//
// With -bench NAME it prints one line in `go test -bench` format instead
// ("BenchmarkNAME 1 <ns/op> ns/op <req/s> req/s <p50> p50-µs <p99> p99-µs <n> admitted …"),
// which bench/summarize reads; -json prints the whole result as JSON.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/streamlimit/streamlimit/bench/loadgen"
)

func main() {
	var (
		cfg     loadgen.Config
		api     string
		bench   string
		asJSON  bool
		rateKey float64
	)
	flag.StringVar(&api, "api", "grpc", "grpc (Envoy RLS v3 ShouldRateLimit) or http (POST /v1/check)")
	flag.StringVar(&cfg.Addr, "addr", "127.0.0.1:8082", "server host:port")
	flag.IntVar(&cfg.Callers, "callers", 32, "concurrent callers, one call in flight each")
	flag.IntVar(&cfg.Conns, "conns", 4, "connections (gRPC: shared round-robin; HTTP/1.1: the most open)")
	flag.IntVar(&cfg.Keys, "keys", 10_000, "distinct descriptor values, used round-robin")
	flag.StringVar(&cfg.Prefix, "prefix", "", "prefix of every descriptor value")
	flag.IntVar(&cfg.HotKeys, "hot-keys", 0, "the first N keys are hot: -hot-share of the calls go to them")
	flag.Float64Var(&cfg.HotShare, "hot-share", 0, "fraction of calls on the hot keys (default 0.5 with -hot-keys)")
	flag.StringVar(&cfg.Domain, "domain", "api", "rate-limit domain")
	flag.StringVar(&cfg.Descriptor, "descriptor", "user", "descriptor entry key")
	flag.DurationVar(&cfg.Duration, "duration", 0, "measured period (default 10s)")
	flag.DurationVar(&cfg.Warmup, "warmup", 0, "when > 0: one call per key first, then wait this long")
	flag.Float64Var(&cfg.Rate, "rate", 0, "total offered calls/s, paced open-loop (0: closed loop, as fast as answered)")
	flag.Float64Var(&rateKey, "rate-per-key", 0, "offered calls/s per key (sets -rate to this × -keys)")
	flag.BoolVar(&cfg.PerKey, "per-key", false, "report calls and admissions per key")
	flag.StringVar(&bench, "bench", "", "print one go-test-bench line named BenchmarkBENCH")
	flag.BoolVar(&asJSON, "json", false, "print the result as JSON")
	flag.Parse()
	cfg.API = loadgen.API(api)
	if rateKey > 0 {
		keys := cfg.Keys
		if keys == 0 {
			keys = 10_000
		}
		cfg.Rate = rateKey * float64(keys)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r, err := loadgen.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	switch {
	case asJSON:
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(r)
	case bench != "":
		ns := 0.0
		if r.Calls > 0 {
			ns = float64(r.Elapsed.Nanoseconds()) / float64(r.Calls)
		}
		fmt.Printf("Benchmark%s \t%d\t%.0f ns/op\t%.0f req/s\t%.0f p50-µs\t%.0f p99-µs\t%d admitted\t%d denied\t%d errors\t%d start-unix-µs\t%d end-unix-µs\n",
			bench, 1, ns, r.ReqPerSec, float64(r.P50.Microseconds()), float64(r.P99.Microseconds()), r.Admitted, r.Denied, r.Errors,
			r.Start.UnixMicro(), r.End.UnixMicro())
	default:
		fmt.Printf("%s %s: %d calls in %v: %.0f req/s, p50 %v, p99 %v, admitted %d, denied %d, errors %d\n",
			cfg.API, cfg.Addr, r.Calls, r.Elapsed.Round(1e6), r.ReqPerSec, r.P50, r.P99, r.Admitted, r.Denied, r.Errors)
		for _, k := range r.PerKey {
			fmt.Printf("  key %s: %d calls, %d admitted\n", k.Key, k.Calls, k.Admitted)
		}
	}
	if r.FirstError != "" {
		fmt.Fprintln(os.Stderr, "first error:", r.FirstError)
	}
	if r.Errors > 0 && r.Calls == 0 {
		os.Exit(1)
	}
}
