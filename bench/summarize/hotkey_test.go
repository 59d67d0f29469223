package main

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/algo"
)

// TestExactBoundIsReached: for every algorithm, a load that always has a request waiting
// (one every 10 µs) on a fresh key, decided by package algo over runs that start at
// several offsets into the second, is admitted at most exactBound and within 1% of it:
// the bound is what the algorithm admits, not what it should admit.
func TestExactBoundIsReached(t *testing.T) {
	const a = 100
	for _, alg := range []algo.Algorithm{algo.SlidingWindow, algo.SlidingWindowEstimate, algo.FixedWindow, algo.SlidingLog, algo.TokenBucket, algo.LeakyBucket, algo.GCRA} {
		for _, phase := range []time.Duration{0, 786 * time.Millisecond, 999 * time.Millisecond} {
			start := time.Unix(1_800_000_000, 0).Add(phase)
			end := start.Add(2*time.Second + 3*time.Millisecond)
			st := algo.New(algo.Options{})
			op := algo.Op{Key: "k", Algorithm: alg, Limit: algo.Limit{Requests: a, Window: time.Second}, N: 1}
			var got int64
			for now := start; !now.After(end); now = now.Add(10 * time.Microsecond) {
				if st.Allow(now, op).Allowed {
					got++
				}
			}
			want, ok := exactBound(alg.String(), a, time.Second, start, end)
			if !ok {
				t.Fatalf("%v: no bound", alg)
			}
			if got > want || got < want-want/100 {
				t.Errorf("%v from +%v: admitted %d, bound %d", alg, phase, got, want)
			}
		}
	}
}

// TestHotKeyTableOfRedisDoc: the raw hot-key run that docs/redis.md quotes summarises to
// the figures it quotes (admitted and exact bound per row).
func TestHotKeyTableOfRedisDoc(t *testing.T) {
	f, err := os.Open("../../bench-results/hotkey-2026-11-29-1337.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := &run{}
	if err := parse(f, r); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	writeHotKey(&b, r)
	doc, err := os.ReadFile("../../docs/redis.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range []struct{ table, doc string }{
		{"| site | sliding_window | 32 | 5000 | 5000 |", "| `sliding_window` | 32 | 5 000 | 5 000 | 5 000 | 5 000 | 0 |"},
		{"| site | sliding_window_estimate | 128 | 5800 | 5810 |", "| `sliding_window_estimate` | 128 | 5 800 | 5 810 | 5 320 | 5 320 | 0 |"},
		{"| site | gcra | 128 | 5980 | 6000 |", "| `gcra` | 128 | 5 980 | 6 000 | 5 990 | 6 000 | 0 |"},
		{"| site | fixed_window | 128 | 6000 | 6000 | 1.000 | 0 |", "| `fixed_window` | 128 | 6 000 | 6 000 | 6 000 | 6 000 | 0 |"},
	} {
		if !strings.Contains(b.String(), row.table) {
			t.Errorf("summary of the raw run lacks %q:\n%s", row.table, b.String())
		}
		if !strings.Contains(string(doc), row.doc) {
			t.Errorf("docs/redis.md lacks %q", row.doc)
		}
	}
}
