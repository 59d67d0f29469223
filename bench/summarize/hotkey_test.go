package main

import (
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
	for _, alg := range []algo.Algorithm{algo.SlidingWindow, algo.FixedWindow, algo.SlidingLog, algo.TokenBucket, algo.LeakyBucket, algo.GCRA} {
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
