//go:build !race

// Property runs are one goroutine's computation at scale: -race finds nothing in them and
// makes them ten times slower, so make test runs them in its first, race-free pass.

package algo

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestProperties drives each algorithm with random arrivals and sizes and checks what the
// algorithm promises, plus exact retry-after on every rejection.
func TestProperties(t *testing.T) {
	for _, alg := range all {
		for seed := uint64(1); seed <= 4; seed++ {
			t.Run(fmt.Sprintf("%s/%d", alg, seed), func(t *testing.T) {
				r := rand.New(rand.NewPCG(seed, 99))
				l := Limit{Requests: 3 + r.Int64N(20), Window: time.Duration(1+r.Int64N(10)) * time.Second}
				if seed%2 == 0 {
					l.Window += time.Duration(r.Int64N(1e9)) // not a whole second: rates are fractional
					l.Burst = 1 + r.Int64N(30)
					l.SoftPercent = int(r.Int64N(30))
				}
				checkProperties(t, alg, l, r)
			})
		}
	}
}

// TestSubBucketsOutOfOrder drives SlidingWindow with requests stamped out of order, as
// concurrent callers' requests reach a shared counter: each stamped up to three sub-buckets
// before the newest one. Every admission is logged at the instant it was decided at
// (SubBuckets.Decides, which its ResetAfter tells: the sub-bucket it counts in leaves the
// window then), and no window of length W holds more than the allowance by those
// instants, a fresh key's first included; a request on time is decided at its own stamp.
func TestSubBucketsOutOfOrder(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		r := rand.New(rand.NewPCG(seed, 7))
		l := Limit{Requests: 5 + r.Int64N(200), Window: time.Duration(1+r.Int64N(3000)) * time.Millisecond}
		g := SubBucketsOf(l.Window)
		s := New(Options{})
		a, w := l.Allowance(), int64(l.Window)
		var log []admit
		clock := base.UnixNano() + r.Int64N(w)
		for range 20000 {
			clock += r.Int64N(w/a/4 + 1)
			now := clock
			if r.IntN(3) == 0 {
				now -= r.Int64N(3 * g.Width)
			}
			n := 1 + r.Int64N(2)
			d := s.Allow(time.Unix(0, now), Op{Key: "k", Algorithm: SlidingWindow, Limit: l, N: n})
			if !d.Allowed {
				continue
			}
			at := now + int64(d.ResetAfter) - g.Window - g.Width // the start of its sub-bucket
			decided := max(now, at)
			if now >= at+g.Width {
				t.Fatalf("seed %d: admitted at %d into sub-bucket %d, before its own", seed, now, g.Bucket(at))
			}
			log = append(log, admit{decided, n})
		}
		slices.SortFunc(log, func(x, y admit) int { return cmp.Compare(x.t, y.t) })
		var held int64
		lo := 0
		for _, x := range log {
			held += x.n
			for log[lo].t <= x.t-w {
				held -= log[lo].n
				lo++
			}
			if held > a {
				t.Fatalf("seed %d (%+v): %d admitted in the window ending %d, limit %d", seed, l, held, x.t, a)
			}
		}
		if int64(len(log)) < a {
			t.Fatalf("seed %d: only %d admitted", seed, len(log))
		}
	}
}
