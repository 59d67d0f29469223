package main

import (
	"fmt"
	"io"
)

// The Redis serving comparison (bench/redis.sh): envoyproxy/ratelimit and streamlimit on
// the same Redis, in the same rounds.
const redisPkg = "bench/serving-redis"

// redisServers are its rows, in table order, with their descriptions.
var redisServers = []struct{ key, what string }{
	{"null", "null server (answers OK at once: the ceiling)"},
	{"envoy-ratelimit", "envoyproxy/ratelimit + Redis (its defaults)"},
	{"streamlimit-site", "streamlimit, `scope: site` (every call decided in Redis)"},
	{"streamlimit-kafka-redis", "streamlimit, global + Kafka + Redis site counter (a data center of several enforcers)"},
}

// ratioTo returns the median and spread over the rounds of server's unit divided by base's
// in the same round, for the gRPC rows of pkg.
func (r *run) ratioTo(pkg, server, base, unit string) (med float64, spread string, ok bool) {
	return roundRatio(r.find(pkg, "BenchmarkServing/api=grpc/server="+server), r.find(pkg, "BenchmarkServing/api=grpc/server="+base), unit)
}

// roundRatio returns the median and spread over the rounds of res's unit divided by base's
// in the same round; ok is false when either is missing or no round has a base above 0.
func roundRatio(res, base *result, unit string) (med float64, spread string, ok bool) {
	if res == nil || base == nil {
		return 0, "", false
	}
	x, y := res.samples[unit], base.samples[unit]
	var ratios []float64
	for i := range min(len(x), len(y)) {
		if y[i] > 0 {
			ratios = append(ratios, x[i]/y[i])
		}
	}
	if len(ratios) == 0 {
		return 0, "", false
	}
	tmp := &result{samples: map[string][]float64{"r": ratios}}
	med, _ = tmp.median("r")
	return med, tmp.spread("r"), true
}

func writeServingRedis(w io.Writer, r *run) {
	if r.find(redisPkg, "BenchmarkServing/api=grpc/server=envoy-ratelimit") == nil {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("## Serving with Redis\n\n")
	p("bench/redis.sh: the serving comparison's setup (server on core 0, load generator on core 1, rows interleaved), "+
		"Envoy's gRPC API, one Redis for every row, envoyproxy/ratelimit built from its module by the script. "+
		"÷ envoy is the median over the rounds of each round's ratio to envoyproxy/ratelimit. Redis is not pinned: it "+
		"shares the two cores with the server and the load generator. %s.\n\n", r.metaValueLast("serving"))
	p("| Server | req/s | p50 µs | p99 µs | req/s ÷ envoy | p99 ÷ envoy | server CPU µs/call |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, sv := range redisServers {
		res := r.find(redisPkg, "BenchmarkServing/api=grpc/server="+sv.key)
		if res == nil {
			continue
		}
		ratio := func(unit string) string {
			if sv.key == "envoy-ratelimit" {
				return "1"
			}
			v, sp, ok := r.ratioTo(redisPkg, sv.key, "envoy-ratelimit", unit)
			if !ok {
				return ""
			}
			return fmt.Sprintf("**%.2f** (%s)", v, sp)
		}
		p("| %s | %s | %s | %s | %s | %s | %s |\n", sv.what, res.cell("req/s"), res.cell("p50-µs"), res.cell("p99-µs"), ratio("req/s"), ratio("p99-µs"), res.cell("server-cpu-µs/req"))
	}
	p("\n")
}

// writeRedisTargets writes the Redis rows' targets into the targets table.
func writeRedisTargets(w io.Writer, r *run, verdict func(ok, met bool) string) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	for _, sv := range redisServers[2:] {
		v, sp, ok := r.ratioTo(redisPkg, sv.key, "envoy-ratelimit", "req/s")
		p("| %s: throughput ÷ envoyproxy/ratelimit + Redis | ≥ 2.50 | %.2f (%s) | %s |\n", sv.what, v, sp, verdict(ok, v >= 2.5))
		v, sp, ok = r.ratioTo(redisPkg, sv.key, "envoy-ratelimit", "p99-µs")
		p("| %s: p99 ÷ envoyproxy/ratelimit's | ≤ 1.00 | %.2f (%s) | %s |\n", sv.what, v, sp, verdict(ok, v <= 1))
	}
}

// metaValueLast is metaValue's last value of key (bench/redis.sh's serving line follows
// bench/serving.sh's).
func (r *run) metaValueLast(key string) string {
	v := ""
	for _, kv := range r.meta {
		if kv[0] == key {
			v = kv[1]
		}
	}
	return v
}
