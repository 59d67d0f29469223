package aggregator

import (
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/topics"
)

// backlogState returns a state holding n counters of window w (ms) in sub buckets, all due
// at now, as a partition's counters are when its replay ends: every third one hit from
// three sites (a window.Counter), the others once (compact), with counts 1 to 97.
func backlogState(n int, now, w int64, sub int) *state {
	s := newState(stateConfig{subBuckets: sub, tau: 1_000, siteForget: 60_000, maxSkew: time.Second,
		maxKeys: n, emitInterval: 100, maxSpecs: 16})
	sites := [3]string{"eu", "us", "ap"}
	for i := range n {
		h := topics.Hit{Key: "key-" + strconv.Itoa(i), Window: w, Count: int64(1 + i%97)}
		for j := range 1 + 2*min(1, i%3) {
			h.Site, h.BucketStart = sites[j], now-int64(j)*1_000
			s.add(now, 0, &h, "", 0)
		}
	}
	return s
}

// drain runs emission rounds every 100 ms from now, budget records each, until a round
// publishes nothing, and returns the records published and the rounds run.
func drain(s *state, now int64, budget int) (records, rounds int) {
	var cands []candidate
	var out []emission
	for {
		cands, out = s.collect(now, budget, cands, out[:0])
		if len(out) == 0 {
			return records, rounds
		}
		records += len(out)
		rounds++
		now += 100
	}
}

// BenchmarkEmitBacklog drains n counters that are due at once with the default budget
// (DefaultMaxEmitPerSecond × DefaultEmitInterval = 5 000 a round): what an aggregator
// does when a partition's replay ends. ns/counter stays flat in n when draining is linear.
func BenchmarkEmitBacklog(b *testing.B) {
	const budget = 5_000
	for _, n := range []int{25_000, 100_000} {
		b.Run("keys="+strconv.Itoa(n), func(b *testing.B) {
			now := int64(1_763_740_000_000)
			var rounds int
			for range b.N {
				b.StopTimer()
				s := backlogState(n, now, 60_000, 60)
				b.StartTimer()
				var records int
				records, rounds = drain(s, now, budget)
				if records != n {
					b.Fatalf("published %d of %d", records, n)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/counter")
			b.ReportMetric(float64(rounds), "rounds")
		})
	}
}

// TestBacklogDrainsLinearly drains n and 4n counters due at once, a budget of 500 a round,
// in a window whose buckets (a minute) outlast the drain, so that no published counter is
// due again for its decay before the drain ends, and holds the counters' values computed to three per counter (ranked, out, breakdown):
// were every waiting counter evaluated again in every round, as it once was, that would be
// n/1 000 + 1 per counter, 21 and 81 here. It also holds the rule: every counter published
// once, at most the budget a round, no round with a count larger than one of an earlier
// round (the counts do not change during the drain).
func TestBacklogDrainsLinearly(t *testing.T) {
	const budget = 500
	for _, n := range []int{20_000, 80_000} {
		now := int64(1_763_740_000_000)
		s := backlogState(n, now, 600_000, 10)
		var cands []candidate
		var out []emission
		seen := map[string]bool{}
		last := math.Inf(1)
		for round := 0; ; round++ {
			cands, out = s.collect(now+int64(round)*100, budget, cands, out[:0])
			if len(out) == 0 {
				break
			}
			if len(out) > budget {
				t.Fatalf("n=%d: round %d published %d, budget %d", n, round, len(out), budget)
			}
			for _, e := range out {
				if e.count == nil || seen[e.key] {
					t.Fatalf("n=%d: %q published twice or as a tombstone", n, e.key)
				}
				seen[e.key] = true
				if e.count.Total > last {
					t.Fatalf("n=%d: round %d published %q (%v) after a round's count of %v", n, round, e.key, e.count.Total, last)
				}
			}
			for _, e := range out {
				last = min(last, e.count.Total)
			}
		}
		if len(seen) != n {
			t.Fatalf("n=%d: published %d counters", n, len(seen))
		}
		if per := float64(s.evals) / float64(n); per > 3 {
			t.Fatalf("n=%d: %.2f values computed per counter, want at most 3", n, per)
		} else {
			t.Logf("n=%d: %.2f values computed per counter", n, per)
		}
		if len(s.backlog) != 0 {
			t.Fatalf("n=%d: backlog of %d left", n, len(s.backlog))
		}
	}
}
