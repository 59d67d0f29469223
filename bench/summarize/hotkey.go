package main

import (
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/algo"
)

// writeHotKey writes the site-scope hot-key table of bench/hotkey.sh: per scope, algorithm
// and number of callers, what was admitted against the most the algorithm can admit over
// the run (exactBound), and how many decisions were made in process instead of in Redis.
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
		"the last one returns), 10 hot keys, a rule of 100 per second per key, each key fresh at the start. "+
		"*Bound* is the most the rule's algorithm can admit over the run, exactly, from the instants the load "+
		"began and ended (its windows are aligned to the second, so where in the second the run starts matters): "+
		"a sliding window admits a fresh key's whole limit at once and then the limit again each time the "+
		"sub-bucket that held it has left the window; the sliding window estimate up to the limit in each aligned "+
		"second, and in the last, partial one the limit less the previous second's count weighed by the part of "+
		"it still in the window; a fixed window the limit in every aligned second the run touches; a sliding "+
		"log the limit in each window's length; a bucket its size plus the rate times the run. *Fallback* counts "+
		"decisions made in process instead of in Redis (`streamlimit_redis_fallback_decisions_total`). "+
		"Scope `local` runs the same rule in process.\n\n", r.metaValue("hotkey"))
	p("| Scope | Algorithm | Callers | Admitted | Bound | Admitted ÷ bound | Fallback decisions | req/s | p99 µs |\n")
	p("|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, res := range rows {
		parts := hotKeyParts(res.name)
		adm, _ := res.median("admitted")
		bound, ok := hotKeyBound(res, parts["algorithm"])
		fb, _ := res.median("fallback")
		rps, _ := res.median("req/s")
		p99, _ := res.median("p99-µs")
		ratio, cell := "–", "–"
		if ok && bound > 0 {
			ratio, cell = fmt.Sprintf("%.3f", adm/bound), fmt.Sprintf("%.0f", bound)
		}
		p("| %s | %s | %s | %.0f | %s | %s | %.0f | %.0f | %.0f |\n", parts["scope"], parts["algorithm"], parts["callers"], adm, cell, ratio, fb, rps, p99)
	}
	p("\n")
}

func hotKeyParts(name string) map[string]string {
	parts := map[string]string{}
	for _, kv := range strings.Split(strings.TrimPrefix(name, "BenchmarkHotKey/"), "/") {
		k, v, _ := strings.Cut(kv, "=")
		parts[k] = v
	}
	return parts
}

// hotKeyBound returns the median over a row's runs of exactBound for its keys, limit and
// instants, or, for a raw file from before the instants were recorded, its "allowance".
func hotKeyBound(res *result, alg string) (float64, bool) {
	starts, ends := res.samples["start-unix-µs"], res.samples["end-unix-µs"]
	keys, limits := res.samples["keys"], res.samples["limit/s"]
	if len(starts) == 0 || len(starts) != len(ends) || len(keys) != len(starts) || len(limits) != len(starts) {
		return res.median("allowance")
	}
	var b []float64
	for i := range starts {
		s, e := time.UnixMicro(int64(starts[i])), time.UnixMicro(int64(ends[i]))
		n, ok := exactBound(alg, int64(limits[i]), time.Second, s, e)
		if !ok {
			return 0, false
		}
		b = append(b, keys[i]*float64(n))
	}
	tmp := &result{samples: map[string][]float64{"b": b}}
	return tmp.median("b")
}

// exactBound returns the most one fresh key can be admitted, under a limit of a per window
// w with the algorithm alg (windows aligned to multiples of w since the Unix epoch), by
// decisions made at instants in [start, end]: the figure a closed-loop load that always
// has a request waiting reaches, and no correct limiter passes.
//
//   - sliding_window: a at the start, then a again each time the sub-bucket that held
//     the last a has left the window (algo.SubBuckets.Leaves: its end plus w), up to end.
//   - sliding_window_estimate: the first aligned window admits a (the key is fresh: no
//     previous count), each later one a; in the last, at offset φ into it, the estimate
//     weighs the previous window's a by (w − φ)/w, leaving a − ⌊a(w − φ)/w⌋ (a smaller
//     previous count would leave more there but less before, never more in all).
//   - fixed_window: a in every aligned window the run touches.
//   - sliding_log: a in each span of w: a × (⌊(end − start)/w⌋ + 1).
//   - token_bucket, leaky_bucket, gcra: the bucket's a (no burst set) plus a per w over
//     the run: a + ⌊a (end − start)/w⌋.
func exactBound(alg string, a int64, w time.Duration, start, end time.Time) (int64, bool) {
	if end.Before(start) {
		return 0, false
	}
	s, e, wn := start.UnixNano(), end.UnixNano(), int64(w)
	k0, k1 := floorDiv(s, wn), floorDiv(e, wn)
	switch alg {
	case "sliding_window":
		g := algo.SubBucketsOf(w)
		var n int64
		for t := s; t <= e; t = g.Leaves(g.Bucket(t)) {
			n += a
		}
		return n, true
	case "sliding_window_estimate":
		if k0 == k1 {
			return a, true
		}
		phi := e - k1*wn
		last := a - int64(math.Floor(float64(a)*float64(wn-phi)/float64(wn)))
		return a*(k1-k0) + last, true
	case "fixed_window":
		return a * (k1 - k0 + 1), true
	case "sliding_log":
		return a * ((e-s)/wn + 1), true
	case "token_bucket", "leaky_bucket", "gcra":
		return a + int64(math.Floor(float64(a)*float64(e-s)/float64(wn))), true
	}
	return 0, false
}

func floorDiv(x, y int64) int64 {
	q := x / y
	if x%y != 0 && (x < 0) != (y < 0) {
		q--
	}
	return q
}
