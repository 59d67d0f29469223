package aggregator

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/streamlimit/streamlimit/topics"
	"github.com/streamlimit/streamlimit/window"
)

// TestEntrySize keeps an entry at 80 bytes: a counter hit once costs its entry, its key and
// its index slot (TestMemoryPerCounter), and a field more would take it past its budget.
func TestEntrySize(t *testing.T) {
	if n := unsafe.Sizeof(entry{}); n != 80 {
		t.Fatalf("entry is %d bytes, want 80", n)
	}
}

// TestCompactCountsLikeCounter adds one or two random records to a counter of the state
// (compact after the first, a window.Counter after the second) and the same records to a
// window.Counter directly, as the state did before it had compact counters, and checks
// that the totals, breakdowns and emptiness agree to the bit at random instants, with the
// site counted now or as of a cut: records early, late, far ahead of the clock (where the
// ring moves the bucket), without hits (demand only), huge (beyond 32 bits), and with a
// τ of its own or the bucket width.
func TestCompactCountsLikeCounter(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	base := int64(1_763_740_000_000)
	for iter := range 20_000 {
		sc := stateConfig{subBuckets: 1 + r.IntN(60), maxSkew: time.Duration(r.IntN(5000)) * time.Millisecond,
			maxKeys: 10, emitInterval: 100, maxSpecs: 16}
		if r.IntN(2) == 0 {
			sc.tau = int64(r.IntN(20_000))
		}
		s := newState(sc)
		w := []int64{1, 999, 10_000, 60_000, 3_600_000}[r.IntN(5)]
		sp := s.spec(w)
		var ref window.Counter
		record := func() topics.Hit {
			h := topics.Hit{Key: "k", Site: []string{"eu", "us"}[r.IntN(2)], Window: w, Count: int64(r.IntN(5))}
			switch r.IntN(10) {
			case 0:
				h.Count = int64(math.MaxUint32) + int64(r.IntN(3)) - 1
			case 1:
				h.Denied = int64(math.MaxUint32) - h.Count + int64(r.IntN(3)) - 1
			case 2, 3:
				h.Denied = int64(r.IntN(3))
			}
			if h.Count == 0 && h.Denied == 0 {
				h.Count = 1
			}
			h.BucketStart = base + int64(r.IntN(4*int(w)+4000)) - 2*w
			return h
		}
		var sites []string
		for n := range 1 + r.IntN(2) {
			h := record()
			now := base + int64(r.IntN(int(w)+2000)) - w/2
			got := s.add(now, 0, &h, "", 0)
			want := ref.AddDenied(sp, now, h.Site, h.BucketStart, h.Count, h.Denied)
			if (got == added) != want {
				t.Fatalf("iter %d record %d %+v: state %v, counter %v", iter, n, h, got, want)
			}
			sites = append(sites, h.Site)
		}
		e := s.get("k", w)
		for range 8 {
			at := countNow
			if r.IntN(2) == 0 {
				cut := base + int64(r.IntN(4*int(w)+4000)) - 2*w
				site := sites[r.IntN(len(sites))]
				at = func(s string) (int64, bool) { return cut, s == site }
			}
			tm := base + int64(r.IntN(4*int(w)+4000)) - w
			gotT, gotZ := s.sumAt(e, tm, at)
			wantT, wantZ := ref.SumAt(sp, tm, at)
			if math.Float64bits(gotT) != math.Float64bits(wantT) || gotZ != wantZ {
				t.Fatalf("iter %d (compact %v): SumAt(%d) = %v %v, want %v %v", iter, e.full == nil, tm, gotT, gotZ, wantT, wantZ)
			}
			gotS, gotTotal := s.appendSitesAt(e, tm, at)
			wantS, wantTotal, _ := ref.AppendSitesAt(nil, sp, tm, at)
			if math.Float64bits(gotTotal) != math.Float64bits(wantTotal) || !slices.Equal(gotS, wantS) {
				t.Fatalf("iter %d (compact %v): AppendSitesAt(%d) = %v %v, want %v %v", iter, e.full == nil, tm, gotS, gotTotal, wantS, wantTotal)
			}
		}
	}
}

// TestCompactUntilSecondRecord checks when a counter is compact: after one record, and not
// after a second one (of the same bucket or another), nor when its one record is past the
// ring's furthest bucket.
func TestCompactUntilSecondRecord(t *testing.T) {
	s := testState(10)
	now := int64(1_763_740_000_000)
	h := topics.Hit{Key: "k", Site: "eu", BucketStart: now, Window: 10_000, Count: 1}
	s.add(now, 0, &h, "", 0)
	if e := s.get("k", 10_000); e.full != nil {
		t.Fatal("a counter hit once is not compact")
	}
	s.add(now, 0, &h, "", 0)
	e := s.get("k", 10_000)
	if e.full == nil {
		t.Fatal("a counter hit twice is still compact")
	}
	if got, _ := s.sumAt(e, now, countNow); got != 2 {
		t.Fatalf("count %v, want 2", got)
	}
	far := topics.Hit{Key: "f", Site: "eu", BucketStart: now + time.Hour.Milliseconds(), Window: 10_000, Count: 1}
	s.add(now, 0, &far, "", 0)
	if e := s.get("f", 10_000); e.full == nil {
		t.Fatal("a record past the ring's end is kept compact")
	}
}
