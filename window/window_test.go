package window

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/topics"
)

func TestSpec(t *testing.T) {
	s := NewSpec(time.Minute, 60, 30*time.Second)
	if s.Window != 60000 || s.Width != 1000 || s.Ahead != 15 || s.Slots != 60+1+15 {
		t.Fatalf("spec = %+v", s)
	}
	// Not divisible: width rounds up so that N buckets cover the window.
	s = NewSpec(1000*time.Millisecond, 60, time.Second)
	if s.Width != 17 || s.Slots != 59+1+int(s.Ahead) {
		t.Fatalf("spec = %+v", s)
	}
}

// The classic worked example: a one-minute window counted in 60 one-second
// buckets; a call at 00:01:43 sees 17/60 of the bucket that holds 00:00:43.
func TestInterpolation(t *testing.T) {
	s := NewSpec(time.Minute, 60, 0)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	var r Ring
	r.Add(&s, s.Bucket(base+50_000), s.Bucket(base+43_000), 10) // bucket [43s, 44s)
	r.Add(&s, s.Bucket(base+50_000), s.Bucket(base+50_000), 5)
	cases := []struct {
		at   int64
		want float64
	}{
		{base + 43_000, 15},        // window start 0:42 − hits all inside
		{base + 103_000, 10 + 5},   // window start exactly 0:43: bucket 43 is i0 with fraction 1
		{base + 103_250, 7.5 + 5},  // three quarters of bucket 43 left
		{base + 103_999, 0.01 + 5}, // one ms of it left
		{base + 104_000, 5},        // bucket 43 gone
		{base + 110_500, 2.5},      // half of bucket 50
		{base + 111_000, 0},        // empty
		{base + 10_000_000, 0},     // far later
		{base + 42_000, 15},        // before the hits: future buckets count fully
	}
	for _, c := range cases {
		if got := r.Count(&s, c.at); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("Count(+%dms) = %v, want %v", c.at-base, got, c.want)
		}
	}
}

func TestRingRotation(t *testing.T) {
	s := NewSpec(10*time.Second, 10, time.Second) // width 1 s, ahead 1, slots 12
	fc := clock.NewFake(time.UnixMilli(1_000_000))
	var r Ring
	now := func() int64 { return s.Bucket(fc.Now().UnixMilli()) }
	for i := range 30 {
		if !r.Add(&s, now(), now(), 1) {
			t.Fatalf("add %d refused", i)
		}
		fc.Advance(time.Second)
	}
	// 30 hits one per second; at the last hit's time + 0 the window holds 10 whole buckets and
	// the oldest (fraction 1).
	at := fc.Now().UnixMilli() - 1000
	if got := r.Count(&s, at); got != 11 {
		t.Fatalf("count = %v, want 11", got)
	}
	// A hit older than the ring is refused and does not disturb it.
	if r.Add(&s, now(), now()-int64(s.Slots)-1, 100) {
		t.Fatal("old hit accepted")
	}
	// A hit far ahead is clamped to now+Ahead.
	r.Add(&s, now(), now()+1000, 7)
	if got := r.Count(&s, (now()+s.Ahead)*s.Width+s.Window); got != 7 {
		t.Fatalf("clamped future hit: count %v in bucket now+Ahead, want 7", got)
	}
	// Jump far ahead: the whole ring clears.
	r.Add(&s, now()+100, now()+100, 1)
	if got := r.Count(&s, (now()+100)*1000); got != 1 {
		t.Fatalf("after jump count = %v", got)
	}
}

func BenchmarkCounterAdd(b *testing.B) {
	s := NewSpec(time.Minute, 60, 30*time.Second)
	cs := make([]Counter, 1024)
	now := int64(1_763_740_000_000)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		cs[i&1023].Add(&s, now+int64(i/1000), "eu-1", now+int64(i/1000), 1)
	}
}

func BenchmarkCounterTotal(b *testing.B) {
	s := NewSpec(time.Minute, 60, 30*time.Second)
	var c Counter
	now := int64(1_763_740_000_000)
	for i := range 120 {
		c.Add(&s, now+int64(i)*500, []string{"eu", "us", "ap"}[i%3], now+int64(i)*500, 1)
	}
	b.ReportAllocs()
	var sink float64
	for i := 0; b.Loop(); i++ {
		v, _ := c.Total(&s, now+60_000+int64(i%1000))
		sink += v
	}
	_ = sink
}

// TestRingUseBufferMatches: a ring keeping its buckets in a caller's buffer counts exactly
// like one that allocates them, through idle gaps, a clock going back, and hits ahead.
func TestRingUseBufferMatches(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		w   time.Duration
		sub int
	}{{time.Minute, 60}, {time.Second, 60}, {7 * time.Second, 3}, {50 * time.Millisecond, 60}} {
		spec := NewSpec(tc.w, tc.sub, time.Second)
		var want, got Ring
		buf := make([]uint32, spec.Slots)
		got.UseBuffer(&spec, buf)
		ms := int64(1_700_000_000_000)
		for step := range 5000 {
			switch rng.IntN(10) {
			case 0:
				ms += rng.Int64N(3 * spec.Window) // idle gap, possibly past the ring
			case 1:
				ms -= rng.Int64N(spec.Width * 2) // the clock went back a little
			default:
				ms += rng.Int64N(spec.Width)
			}
			now := spec.Bucket(ms)
			idx := now + rng.Int64N(3) - 1
			n := rng.Int64N(5)
			if a, b := want.Add(&spec, now, idx, n), got.Add(&spec, now, idx, n); a != b {
				t.Fatalf("step %d: Add %v vs %v", step, a, b)
			}
			for range 3 {
				at := ms + rng.Int64N(2*spec.Window)
				if w, g := want.Count(&spec, at), got.Count(&spec, at); w != g {
					t.Fatalf("window %v sub %d step %d at %d: buffered ring %v, allocating ring %v", tc.w, tc.sub, step, at, g, w)
				}
			}
		}
	}
}

func TestWidth(t *testing.T) {
	for _, c := range []struct {
		w    time.Duration
		n    int
		want int64
	}{
		{time.Minute, 60, 1000},
		{10 * time.Second, 60, 167},
		{time.Millisecond, 60, 1},
		{time.Hour, 0, 60000}, // 0: DefaultSubBuckets
	} {
		if got := Width(c.w, c.n); got != c.want {
			t.Errorf("Width(%v, %d) = %d, want %d", c.w, c.n, got, c.want)
		}
		if c.n > 0 && NewSpec(c.w, c.n, 0).Width != Width(c.w, c.n) {
			t.Errorf("NewSpec(%v, %d).Width disagrees with Width", c.w, c.n)
		}
	}
}

// exactIn counts the hits in (t−W, t] of a list of (ms, n) hits.
func exactIn(hits [][2]int64, w, t int64) float64 {
	var c int64
	for _, h := range hits {
		if h[0] > t-w && h[0] <= t {
			c += h[1]
		}
	}
	return float64(c)
}

// TestCountHardNeverUnder: hard counting never counts fewer hits than lie in the window,
// whatever their spread inside the buckets, and never more than the window's plus one
// bucket's.
func TestCountHardNeverUnder(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for trial := range 200 {
		s := NewSpec(time.Duration(1+r.IntN(20))*time.Second, 1+r.IntN(60), 0)
		base := int64(1_000_000_000)
		var ring Ring
		var hits [][2]int64
		at := base
		for range 300 {
			at += r.Int64N(s.Width * 2)
			n := 1 + r.Int64N(5)
			ring.Add(&s, s.Bucket(at), s.Bucket(at), n)
			hits = append(hits, [2]int64{at, n})
		}
		for q := at; q <= at+s.Window+s.Width; q += 1 + r.Int64N(s.Width) { // after the last hit: no bucket ahead
			exact := exactIn(hits, s.Window, q)
			hard := ring.CountHard(&s, q)
			if hard < exact {
				t.Fatalf("trial %d: CountHard(%d) = %v < exact %v", trial, q, hard, exact)
			}
			i0, _ := s.Oldest(q)
			bucket := exactIn(hits, s.Width, (i0+1)*s.Width-1)
			if hard > exact+bucket {
				t.Fatalf("trial %d: CountHard(%d) = %v > exact %v + oldest bucket %v", trial, q, hard, exact, bucket)
			}
		}
	}
}

// TestFallsTo checks FallsTo against a scan, millisecond by millisecond, of the count it
// inverts, in every mode: the answer is the first instant at which the count is at most the
// target.
func TestFallsTo(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for trial := range 600 {
		s := NewSpec(time.Duration(1+r.IntN(3))*time.Second, 1+r.IntN(30), 0)
		base := int64(2_000_000_000)
		var ring Ring
		mode := Mode(trial % 3)
		if mode == Span {
			ring.UseSpans(&s, nil)
		}
		at := base
		for range 1 + r.IntN(40) {
			at += r.Int64N(s.Width)
			ring.AddAt(&s, s.Bucket(at), at, 1+r.Int64N(4))
		}
		count := func(q int64) float64 { return ring.CountMode(&s, q, mode) }
		from := at - r.Int64N(s.Window)
		target := math.Floor(count(from) * r.Float64())
		got, ok := ring.FallsTo(&s, from, target, mode)
		want := from
		for count(want) > target {
			want++
		}
		if !ok || got != want {
			t.Fatalf("trial %d (mode %d): FallsTo(%d, %v) = %d, %v; the count first reaches it at %d", trial, mode, from-base, target, got-base, ok, want-base)
		}
	}
	var empty Ring
	s := NewSpec(time.Second, 10, 0)
	if got, ok := empty.FallsTo(&s, 5, 0, Interpolate); !ok || got != 5 {
		t.Fatalf("empty ring: %d, %v", got, ok)
	}
	if _, ok := empty.FallsTo(&s, 5, -1, Interpolate); ok {
		t.Fatal("a negative target was reached")
	}
}

// With spans, a bucket whose hits all came at one instant is counted exactly, and a burst
// that filled part of a bucket leaves the window as its hits do; without spans the same
// ring spreads it over the bucket.
func TestCountSpan(t *testing.T) {
	s := NewSpec(10*time.Second, 10, 0) // 1 s buckets
	base := int64(1_000_000_000)        // a bucket boundary
	var withSpans, plain Ring
	withSpans.UseSpans(&s, nil)
	var hits [][2]int64
	for ms := base + 600; ms < base+800; ms += 10 { // 20 hits in [600, 800) ms of the bucket
		withSpans.AddAt(&s, s.Bucket(ms), ms, 1)
		plain.AddAt(&s, s.Bucket(ms), ms, 1)
		hits = append(hits, [2]int64{ms, 1})
	}
	withSpans.AddAt(&s, s.Bucket(base+1500), base+1500, 5) // one instant in the next bucket
	plain.AddAt(&s, s.Bucket(base+1500), base+1500, 5)
	hits = append(hits, [2]int64{base + 1500, 5})
	var worstSpan, worstPlain float64
	for q := base + 10_000; q <= base+11_600; q++ {
		exact := exactIn(hits, s.Window, q)
		worstSpan = max(worstSpan, math.Abs(withSpans.CountSpan(&s, q)-exact))
		worstPlain = max(worstPlain, math.Abs(plain.CountSpan(&s, q)-exact))
		if q >= base+11_000 && withSpans.CountSpan(&s, q) != exact {
			t.Fatalf("at +%d ms: span count %v, exact %v (the 5 hits came at one instant)", q-base, withSpans.CountSpan(&s, q), exact)
		}
	}
	// The burst's hits are 10 ms apart: evenly spread over their span, the span count is
	// off by at most one hit; the plain count by up to 12 (it spreads them over 1 s).
	if worstSpan > 1 || worstPlain < 10 {
		t.Fatalf("worst error: with spans %v, without %v", worstSpan, worstPlain)
	}
}

// Taking hits away (a negative Add) leaves a bucket's span as it was: it says nothing of
// when the hits that remain were made. A span widened to the whole bucket made hits made
// at one instant look spread over it.
func TestAddNegativeKeepsSpan(t *testing.T) {
	s := NewSpec(10*time.Second, 10, 0) // 1 s buckets
	base := int64(1_000_000_000)        // a bucket boundary
	var r Ring
	r.UseSpans(&s, nil)
	r.AddAt(&s, s.Bucket(base+500), base+500, 10) // ten hits at one instant
	r.Add(&s, s.Bucket(base+700), s.Bucket(base+500), -1)
	if got := r.CountSince(&s, base+499); got != 9 {
		t.Fatalf("hits after +499 ms: %v, want the 9 left (all made at +500 ms)", got)
	}
	if got := r.CountSince(&s, base+500); got != 0 {
		t.Fatalf("hits after +500 ms: %v, want 0", got)
	}
}

func TestDecay(t *testing.T) {
	var d Decay
	d.Add(1000, 4, 100)
	d.Add(1100, 2, 100) // 4/e + 2
	if got, want := d.At(1100, 100), 4/math.E+2; math.Abs(got-want) > 1e-9 {
		t.Fatalf("At = %v, want %v", got, want)
	}
	if got, want := d.At(1200, 100), (4/math.E+2)/math.E; math.Abs(got-want) > 1e-9 {
		t.Fatalf("At later = %v, want %v", got, want)
	}
	d.Add(1000, 1, 100) // late: weighted by its age at 1100
	if got, want := d.At(1100, 100), 4/math.E+2+1/math.E; math.Abs(got-want) > 1e-9 {
		t.Fatalf("late add: %v, want %v", got, want)
	}
	// Two sites that stop at the same time keep their ratio however long they are idle.
	var a, b Decay
	a.Add(0, 3, 50)
	b.Add(0, 1, 50)
	if r := a.At(10_000, 50) / b.At(10_000, 50); math.Abs(r-3) > 1e-6 {
		t.Fatalf("ratio after idling: %v", r)
	}
}

// TestAppendSitesAt: a site counted as of the last time it was heard from keeps the hits
// that would otherwise seem to leave the window; a site with only denied requests is
// listed with its demand.
func TestAppendSitesAt(t *testing.T) {
	s := NewSpec(10*time.Second, 10, 0)
	s.Tau = 1000
	var c Counter
	c.AddDenied(&s, 1000, "eu", 1000, 5, 0)
	c.AddDenied(&s, 1000, "us", 1000, 5, 0)
	c.AddDenied(&s, 9000, "ap", 9000, 0, 3)
	heard := map[string]int64{"us": 2000}
	at := func(site string) (int64, bool) { v, ok := heard[site]; return v, ok }
	got, total, zero := c.AppendSitesAt(nil, &s, 11_500, at)
	// At 11.5 s the bucket [1 s, 2 s) is half out: eu counts 2.5; us, last heard at 2 s,
	// still counts 5 and its demand is as of then; ap has no hits but 3 denied requests
	// 2.5 s ago.
	want := []topics.SiteCount{{Site: "ap", Count: 0, Demand: 3 * math.Exp(-2.5)}, {Site: "eu", Count: 2.5, Demand: 5 * math.Exp(-10.5)}, {Site: "us", Count: 5, Demand: 5 * math.Exp(-1)}}
	if zero || math.Abs(total-7.5) > 1e-9 || len(got) != 3 {
		t.Fatalf("got %+v, total %v, zero %v", got, total, zero)
	}
	for i := range want {
		if got[i].Site != want[i].Site || math.Abs(got[i].Count-want[i].Count) > 1e-9 || math.Abs(got[i].Demand-want[i].Demand) > 1e-9 {
			t.Fatalf("site %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	if sum, z := c.SumAt(&s, 11_500, at); sum != total || z {
		t.Fatalf("SumAt = %v, %v", sum, z)
	}
	if _, z := c.SumAt(&s, 60_000, func(string) (int64, bool) { return 0, false }); !z {
		t.Fatal("a counter with nothing left in the window and no demand is not empty")
	}
}

// CountSince counts the hits after an instant: exactly for whole buckets, and for a bucket
// whose hits came at one instant (spans), by their span otherwise.
func TestCountSince(t *testing.T) {
	s := NewSpec(10*time.Second, 10, 0) // 1 s buckets
	base := int64(1_000_000_000)
	var r Ring
	r.UseSpans(&s, nil)
	r.AddAt(&s, s.Bucket(base+200), base+200, 3)
	r.AddAt(&s, s.Bucket(base+1500), base+1500, 4)
	r.AddAt(&s, s.Bucket(base+2100), base+2100, 5)
	for _, c := range []struct {
		t0   int64
		want float64
	}{{0, 12}, {1000, 9}, {1499, 9}, {1500, 5}, {2000, 5}, {2100, 0}, {3000, 0}} {
		if got := r.CountSince(&s, base+c.t0); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("CountSince(+%d) = %v, want %v", c.t0, got, c.want)
		}
	}
}
