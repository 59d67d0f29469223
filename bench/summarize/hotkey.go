package main

import (
	"fmt"
	"io"
	"strings"
)

// writeHotKey writes the site-scope hot-key table of bench/hotkey.sh: per scope, algorithm
// and number of callers, what was admitted against what a sliding window of the rule
// allows over the run, and how many decisions were made in process instead of in Redis.
func writeHotKey(w io.Writer, r *run) {
	var rows []*result
	for _, res := range r.results {
		if res.pkg == "bench/hotkey" && strings.HasPrefix(res.name, "BenchmarkHotKey/") {
			rows = append(rows, res)
		}
	}
	if len(rows) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("## Site scope under a hot-key load\n\n")
	p("%s. bench/hotkey.sh: one enforcer, Envoy's gRPC API, closed loop (each caller sends its next call when "+
		"the last one returns), 10 hot keys, a rule of 100 per second per key. *Allowance* is what a sliding 1 s "+
		"window allows over the run (10 × 100 × seconds); *fallback* counts decisions made in process instead of in "+
		"Redis (`streamlimit_redis_fallback_decisions_total`). Scope `local` runs the same rule in process: what the "+
		"algorithm itself admits, e.g. a fresh key's first window or full bucket at the start of the run.\n\n", r.metaValue("hotkey"))
	p("| Scope | Algorithm | Callers | Admitted | Allowance | Admitted ÷ allowance | Fallback decisions | req/s | p99 µs |\n")
	p("|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, res := range rows {
		parts := map[string]string{}
		for _, kv := range strings.Split(strings.TrimPrefix(res.name, "BenchmarkHotKey/"), "/") {
			k, v, _ := strings.Cut(kv, "=")
			parts[k] = v
		}
		adm, _ := res.median("admitted")
		all, _ := res.median("allowance")
		fb, _ := res.median("fallback")
		rps, _ := res.median("req/s")
		p99, _ := res.median("p99-µs")
		ratio := "–"
		if all > 0 {
			ratio = fmt.Sprintf("%.3f", adm/all)
		}
		p("| %s | %s | %s | %.0f | %.0f | %s | %.0f | %.0f | %.0f |\n", parts["scope"], parts["algorithm"], parts["callers"], adm, all, ratio, fb, rps, p99)
	}
	p("\n")
}
