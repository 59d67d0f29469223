package window

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// ringModel is the brute-force statement of what a Ring holds: a map from bucket index to
// count, with the ring's bounds (the newest bucket held, the Slots buckets up to it, hits
// ahead clamped to now+Ahead) and its saturating arithmetic stated on whole integers.
type ringModel struct {
	s       *Spec
	started bool
	head    int64
	c       map[int64]int64
}

// add is Ring.Add on the model.
func (m *ringModel) add(now, idx, n int64) bool {
	idx = min(idx, now+m.s.Ahead)
	L := int64(m.s.Slots)
	if !m.started {
		m.started, m.head, m.c = true, idx, map[int64]int64{}
	}
	switch {
	case idx > m.head:
		m.head = idx
		for i := range m.c {
			if i <= m.head-L {
				delete(m.c, i)
			}
		}
	case idx <= m.head-L:
		return false
	}
	v := m.c[idx] + n
	if n > math.MaxUint32 || v > math.MaxUint32 || v < 0 {
		v = math.MaxUint32
	}
	m.c[idx] = v
	return true
}

// parts adds up, one by one, the buckets after i0 and bucket i0.
func (m *ringModel) parts(i0 int64) (whole, oldest uint64) {
	for i, v := range m.c {
		switch {
		case i > i0:
			whole += uint64(v)
		case i == i0:
			oldest = uint64(v)
		}
	}
	return whole, oldest
}

// count is the count at t by mode, from the model's sums; r gives the oldest bucket's span
// (which the running sum does not touch).
func (m *ringModel) count(r *Ring, t int64, mode Mode) float64 {
	i0, frac := m.s.Oldest(t)
	whole, oldest := m.parts(i0)
	switch {
	case mode == Hard:
		return float64(whole + oldest)
	case mode == Span && r.spans(m.s) != nil:
		return float64(whole) + float64(oldest)*r.spanFrac(m.s, i0, t)
	}
	return combine(whole, oldest, frac)
}

// TestRingRunningSumMatchesBruteForce drives rings of every kind (allocating on the first
// Add, in a buffer, with spans) and a Counter (whose rings keep no running sum, as a ring
// whose sum reached 2³²−1 does not) with random hits at random times — small steps,
// a clock going back, gaps past the whole ring, buckets out of order within it, hits far
// ahead, hits taken away, counts saturating at the uint32 bound — and after every step
// compares each count (Count, CountSpan, CountHard, CountMode, FallsTo, the Counter's
// Total) with one computed from the buckets added up one by one. A mutation that does not
// keep the running sum up to date makes the counts after it disagree.
func TestRingRunningSumMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for trial := range 36 {
		spec := NewSpec(time.Duration(5+rng.IntN(150))*time.Millisecond, 1+rng.IntN(12), time.Duration(rng.IntN(60))*time.Millisecond)
		s := &spec
		var r Ring
		kind := trial % 3
		switch kind {
		case 1:
			r.UseBuffer(s, make([]uint32, s.Slots))
		case 2:
			r.UseSpans(s, nil)
		}
		m := ringModel{s: s}
		var counter Counter
		cm := ringModel{s: s} // the Counter's site "b", fed the hits it counts (n > 0)
		saturating := trial%4 == 3
		ms := int64(1_700_000_000_000) + rng.Int64N(1000)
		for step := range 200 {
			switch rng.IntN(12) {
			case 0:
				ms += s.Window + rng.Int64N(4*s.Window) // a gap, often past the whole ring
			case 1:
				ms -= rng.Int64N(2 * s.Width) // the clock went back a little
			default:
				ms += rng.Int64N(s.Width + 1)
			}
			now := s.Bucket(ms)
			at := ms - rng.Int64N(int64(s.Slots)*s.Width+s.Width) // out of order, sometimes older than the ring
			if rng.IntN(10) == 0 {
				at = ms + rng.Int64N(10*s.Window) // ahead, often past now+Ahead
			}
			n := 1 + rng.Int64N(4)
			switch rng.IntN(10) {
			case 0:
				n = -rng.Int64N(3) // hits taken away, below zero sometimes
			case 1:
				if saturating {
					n = math.MaxUint32 - rng.Int64N(3)
				}
			}
			var ok bool
			if kind == 2 && rng.IntN(2) == 0 {
				ok = r.AddAt(s, now, at, n)
			} else {
				ok = r.Add(s, now, s.Bucket(at), n)
			}
			if want := m.add(now, s.Bucket(at), n); ok != want {
				t.Fatalf("trial %d step %d: Add reported %v, want %v", trial, step, ok, want)
			}
			if n > 0 {
				counter.Add(s, ms, "b", at, n)
				cm.add(now, s.Bucket(at), n)
			}
			if step%3 == 0 {
				counter.Add(s, ms, "a", ms, 1) // a second site beside it, not compared
			}
			for range 3 {
				q := ms - 2*s.Window + rng.Int64N(4*s.Window)
				checkCounts(t, trial, step, &r, &m, q, rng)
				i0, frac := s.Oldest(q)
				var sw, so uint64
				for k := range counter.sites {
					w, o := counter.parts(s, k, i0)
					if counter.sites[k].site == "b" {
						cw, co := cm.parts(i0)
						if w != cw || o != co {
							t.Fatalf("trial %d step %d: Counter site b has parts (%d, %d) at %d, brute force (%d, %d)", trial, step, w, o, q, cw, co)
						}
					}
					sw, so = sw+w, so+o
				}
				if got, _ := counter.Total(s, q); got != combine(sw, so, frac) {
					t.Fatalf("trial %d step %d: Counter.Total %v, from its sites' parts %v", trial, step, got, combine(sw, so, frac))
				}
			}
		}
	}
}

// checkCounts compares every count of r at q with the model's.
func checkCounts(t *testing.T, trial, step int, r *Ring, m *ringModel, q int64, rng *rand.Rand) {
	t.Helper()
	s := m.s
	for _, c := range []struct {
		name string
		got  float64
		mode Mode
	}{
		{"Count", r.Count(s, q), Interpolate},
		{"CountSpan", r.CountSpan(s, q), Span},
		{"CountHard", r.CountHard(s, q), Hard},
		{"CountMode(Interpolate)", r.CountMode(s, q, Interpolate), Interpolate},
		{"CountMode(Span)", r.CountMode(s, q, Span), Span},
		{"CountMode(Hard)", r.CountMode(s, q, Hard), Hard},
	} {
		if want := m.count(r, q, c.mode); c.got != want {
			t.Fatalf("trial %d step %d: %s at %d = %v, brute force %v", trial, step, c.name, q, c.got, want)
		}
	}
	mode := Mode(rng.IntN(3))
	cur := m.count(r, q, mode)
	target := math.Floor(cur * rng.Float64())
	if rng.IntN(8) == 0 {
		target = -1
	}
	got, ok := r.FallsTo(s, q, target, mode)
	if target < 0 {
		if ok {
			t.Fatalf("trial %d step %d: FallsTo reached the negative target at %d", trial, step, got)
		}
		return
	}
	want := q
	for m.count(r, want, mode) > target {
		want++
	}
	if !ok || got != want {
		t.Fatalf("trial %d step %d: FallsTo(%d, %v, mode %d) = %d, %v; brute force %d", trial, step, q, target, mode, got, ok, want)
	}
}

// BenchmarkRingCountSpanCold measures a decision's use of this site's ring: the count at
// now and one hit added, over 100k rings visited in a scattered order, so that each ring's
// memory is cold as with many keys in real traffic. The rings are laid out as the enforcer
// keeps them: a header, then an inline buffer of counts and spans.
func BenchmarkRingCountSpanCold(b *testing.B) {
	type entry struct {
		spec Spec
		ring Ring
		buf  [128]uint32
	}
	const keys = 100_000
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	es := make([]*entry, keys)
	for i := range es {
		e := &entry{spec: NewSpec(time.Minute, 60, 0)}
		e.ring.UseSpans(&e.spec, e.buf[:])
		for j := range int64(60) { // one hit a second over the last minute
			ms := t0 - 60_000 + j*1000 + int64(i%1000)
			e.ring.AddAt(&e.spec, e.spec.Bucket(ms), ms, 1)
		}
		es[i] = e
	}
	var sink float64
	k := 0
	for b.Loop() {
		e := es[k*7919%keys] // a stride prime to keys: every ring once per round, far apart
		sink += e.ring.CountSpan(&e.spec, t0)
		e.ring.AddAt(&e.spec, e.spec.Bucket(t0), t0, 1)
		if k++; k == keys {
			k = 0
		}
	}
	if sink == 0 {
		b.Fatal("no count")
	}
}
