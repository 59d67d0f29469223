package window_test

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/internal/windowref"
	"github.com/streamlimit/streamlimit/topics"
	"github.com/streamlimit/streamlimit/window"
)

// A Counter counts as the brute-force statement of the rule does, at any instant, over
// random hits: late ones, early ones within Ahead, several sites.
func TestCounterMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, w := range []time.Duration{time.Second, 7 * time.Second, time.Minute} {
		for _, n := range []int{1, 7, 60} {
			s := window.NewSpec(w, n, 5*time.Second)
			var c window.Counter
			var hits []topics.Hit
			now := int64(1_763_740_000_000)
			sites := []string{"eu", "us", "ap"}
			for step := range 400 {
				now += rng.Int64N(s.Width*2 + 1)
				// Hits stamped up to one window late and, within Ahead, a little early.
				bs := now - rng.Int64N(s.Window+s.Width) + rng.Int64N(s.Ahead*s.Width)
				h := topics.Hit{Key: "k", Site: sites[rng.IntN(3)], BucketStart: bs, Count: 1 + rng.Int64N(3)}
				if c.Add(&s, now, h.Site, h.BucketStart, h.Count) {
					hits = append(hits, h)
				} else if bs > now-s.Window {
					t.Fatalf("w=%v n=%d: in-window hit refused", w, n)
				}
				if step%7 != 0 {
					continue
				}
				for _, at := range []int64{now, now + s.Width/2, now + s.Window/3} {
					wantT, wantS := windowref.Reference(s, hits, at)
					got, zero := c.Total(&s, at)
					sitesGot, total2 := c.AppendSites(nil, &s, at)
					if math.Abs(got-wantT) > 1e-9 || math.Abs(total2-wantT) > 1e-9 || zero != (wantT == 0) {
						t.Fatalf("w=%v n=%d at %d: total %v (%v, zero %v), want %v", w, n, at, got, total2, zero, wantT)
					}
					if len(sitesGot) != len(wantS) {
						t.Fatalf("sites %v, want %v", sitesGot, wantS)
					}
					for _, sc := range sitesGot {
						if math.Abs(sc.Count-wantS[sc.Site]) > 1e-9 {
							t.Fatalf("site %s = %v, want %v", sc.Site, sc.Count, wantS[sc.Site])
						}
					}
				}
			}
		}
	}
}
