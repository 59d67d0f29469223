package window

import (
	"math"
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"
	"time"
	"unsafe"
)

// A Counter's sites hold their buckets as pairs while they have hits in few of them and as a
// ring once in many; through random hits — in order, late, ahead of the clock, after gaps
// past the whole ring, saturating — every site's buckets agree with the brute-force model
// after every hit, in either form, and across the change from one to the other.
func TestCounterPairsAndRingsMatchModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	sites := []string{"ap", "eu", "us"}
	forms := map[bool]int{}
	for trial := range 60 {
		spec := NewSpec(time.Duration(5+rng.IntN(120_000))*time.Millisecond, 1+rng.IntN(60), time.Duration(rng.IntN(3000))*time.Millisecond)
		s := &spec
		var c Counter
		models := map[string]*ringModel{}
		for _, site := range sites {
			models[site] = &ringModel{s: s}
		}
		ms := int64(1_700_000_000_000) + rng.Int64N(1_000_000)
		// Some trials stay sparse (hits on a few buckets), others fill the ring.
		spread := []int64{1, 3, int64(s.Slots)}[trial%3]
		for step := range 400 {
			switch rng.IntN(20) {
			case 0:
				ms += s.Window + rng.Int64N(3*s.Window) // a gap, often past the whole ring
			case 1:
				ms -= rng.Int64N(2 * s.Width) // the clock went back a little
			default:
				ms += rng.Int64N(s.Width*spread/4 + 1)
			}
			now := s.Bucket(ms)
			at := ms - rng.Int64N(int64(s.Slots)*s.Width+s.Width) // late, sometimes older than the ring
			if rng.IntN(10) == 0 {
				at = ms + rng.Int64N(2*int64(s.Ahead+1)*s.Width) // ahead, sometimes past now+Ahead
			}
			n := 1 + rng.Int64N(4)
			if trial%4 == 3 && rng.IntN(5) == 0 {
				n = math.MaxUint32 - rng.Int64N(3)
			}
			site := sites[rng.IntN(len(sites))]
			if got, want := c.Add(s, ms, site, at, n), models[site].add(now, s.Bucket(at), n); got != want {
				t.Fatalf("trial %d step %d: Add at site %s reported %v, model %v", trial, step, site, got, want)
			}
			for k := range c.sites {
				st := &c.sites[k]
				ring, np, room := c.form(k)
				forms[ring]++
				if !ring && (np > room || room > maxPairs(s) || len(c.region(s, k)) != 2*room) {
					t.Fatalf("trial %d step %d: site %s holds %d pairs in room for %d (%d words), limit %d", trial, step, st.site, np, room, len(c.region(s, k)), maxPairs(s))
				}
				m := models[st.site]
				for range 2 {
					q := ms - 2*s.Window + rng.Int64N(3*s.Window)
					i0, _ := s.Oldest(q)
					w, o := c.parts(s, k, i0)
					if mw, mo := m.parts(i0); w != mw || o != mo {
						t.Fatalf("trial %d step %d: site %s (ring %v) parts (%d, %d) at %d, model (%d, %d)", trial, step, st.site, ring, w, o, q, mw, mo)
					}
				}
			}
		}
	}
	if forms[true] == 0 || forms[false] == 0 {
		t.Fatalf("sites seen as pairs %d times and as rings %d times: both forms must be tested", forms[false], forms[true])
	}
}

// counterMemory returns the heap per Counter of 20 000 counters of a one-minute window in
// 60 sub-buckets, each with nsites sites hit in the same buckets, buckets of them.
func counterMemory(nsites, buckets int) float64 {
	s := NewSpec(time.Minute, 60, 30*time.Second)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	cs := make([]Counter, 20_000)
	now := int64(1_763_740_000_000)
	for i := range cs {
		for b := range buckets {
			for k := range nsites {
				cs[i].Add(&s, now+int64(b)*s.Width, []string{"eu", "us", "ap"}[k], now+int64(b)*s.Width, 1)
			}
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(cs)
	// The Counter values themselves (two slice headers each) are not counted: they are part
	// of their owner (the aggregator's entry).
	return float64(after.HeapAlloc-before.HeapAlloc)/float64(len(cs)) - float64(unsafeSizeofCounter)
}

// TestMemoryPerKey measures the heap used by 20 000 counters with one and with three sites,
// hit in one bucket, a few, and every one, and fails if a (key, site) costs more than its
// budget: 64 bytes plus 16 per bucket with hits while they are few (pairs, with room for
// twice as many), and a whole ring's 4 bytes × Slots plus 128 once they are many (the
// budget it always had).
func TestMemoryPerKey(t *testing.T) {
	s := NewSpec(time.Minute, 60, 30*time.Second)
	for _, buckets := range []int{1, 4, 60} {
		one, three := counterMemory(1, buckets), counterMemory(3, buckets)
		perSite := (three - one) / 2
		budget := float64(64 + 16*buckets)
		if buckets > maxPairs(&s) {
			budget = float64(s.Slots*4 + 128)
		}
		t.Logf("window 1m, 60 sub-buckets, %d slots, hits in %d buckets: %.0f B/key with 1 site, %.0f B/key with 3 sites, %.0f B per extra (key, site); budget %.0f",
			s.Slots, buckets, one, three, perSite, budget)
		if one > budget || perSite > budget {
			t.Errorf("hits in %d buckets: %.0f B for a counter with one site, %.0f B per extra (key, site), budget %.0f", buckets, one, perSite, budget)
		}
	}
}

func BenchmarkCounterMemory(b *testing.B) {
	for _, buckets := range []int{1, 60} {
		b.Run("buckets="+strconv.Itoa(buckets), func(b *testing.B) {
			var one, three float64
			for b.Loop() {
				one, three = counterMemory(1, buckets), counterMemory(3, buckets)
			}
			b.ReportMetric(one, "B/counter")
			b.ReportMetric((three-one)/2, "B/key-site")
		})
	}
}

const unsafeSizeofCounter = unsafe.Sizeof(Counter{})
