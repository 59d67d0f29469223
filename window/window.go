// Package window is the sliding-window counting rule that producer, aggregator and
// enforcer share: per counter and per site, a ring of sub-window buckets (Ring; a Counter
// keeps every site's buckets of one counter), the rule that turns the ring into a count at any
// instant (Count, and CountHard, which never counts less than the hits in the window),
// and each site's demand (Decay). It knows nothing of Kafka. NewSpec sizes a ring for a
// window; package internal/windowref states the rule by brute force for tests.
//
// The rule, demand and the bounds, with the formula: docs/counting.md.
package window

import (
	"math"
	"time"
)

// DefaultSubBuckets is the number of sub-window buckets a window is split into unless
// configured otherwise, the same for the producer's bucket boundaries, the aggregator's
// rings and the enforcer's own-site counters. Count records state the number their
// aggregator used, and enforcers refuse counts made on another grid.
const DefaultSubBuckets = 60

// Width returns the sub-bucket width b of a window of w split into n sub-buckets (n < 1
// means DefaultSubBuckets), in milliseconds: ceil(W / n), at least 1. The producer cuts its
// coalescing buckets at multiples of it, so that every hit record lies in one sub-bucket.
func Width(w time.Duration, n int) int64 {
	if n < 1 {
		n = DefaultSubBuckets
	}
	wm := max(w.Milliseconds(), 1)
	return max((wm+int64(n)-1)/int64(n), 1)
}

// Spec is the bucket layout of one window length. Specs are immutable and shared by every
// counter with that window.
type Spec struct {
	// Window is W, in milliseconds (≥ 1).
	Window int64
	// Width is b, the bucket width in milliseconds: ceil(Window / sub-buckets), at least 1.
	Width int64
	// Ahead is how many buckets past the clock's bucket a ring keeps for hits stamped in the
	// aggregator's future.
	Ahead int64
	// Slots is the ring length: ceil(Window/Width) + 1 + Ahead.
	Slots int
	// Tau is the time constant of the sites' demand (Decay), in milliseconds; 0 means
	// Width.
	Tau int64
}

// NewSpec returns the layout for a window of w split into n sub-buckets (n < 1 means 1),
// keeping room for hits up to maxSkew ahead of the clock, at most a quarter of the window
// (and at least one bucket).
func NewSpec(w time.Duration, n int, maxSkew time.Duration) Spec {
	wm := max(w.Milliseconds(), 1)
	n = max(n, 1)
	width := Width(w, n)
	ahead := min(maxSkew.Milliseconds(), wm/4)
	aheadBuckets := max((ahead+width-1)/width, 1)
	inWindow := (wm + width - 1) / width
	return Spec{Window: wm, Width: width, Ahead: aheadBuckets, Slots: int(inWindow + 1 + aheadBuckets)}
}

// Bucket returns the index of the bucket holding instant ms.
func (s *Spec) Bucket(ms int64) int64 { return floorDiv(ms, s.Width) }

// Oldest returns i₀, the index of the bucket that holds the window start t−W, and the
// fraction of it inside the window (t−W, t], in (0, 1].
func (s *Spec) Oldest(t int64) (i0 int64, frac float64) {
	ws := t - s.Window
	i0 = floorDiv(ws, s.Width)
	return i0, float64((i0+1)*s.Width-ws) / float64(s.Width)
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// Ring is one site's buckets of one counter. The zero Ring is empty; Add allocates its
// buckets on first use. Bucket counts are uint32 and saturate at math.MaxUint32 hits per
// (key, site, bucket). A Ring is not safe for concurrent use.
type Ring struct {
	head int64 // index of the newest bucket held; held buckets are (head−Slots, head]
	// c[i mod Slots] is bucket i's count. With spans (UseSpans), c[Slots + i mod Slots] is
	// its span: the offsets of its first and last hit within the bucket, in 1/65535ths of
	// its width (first in the high 16 bits). Counted with spans, the oldest bucket's hits
	// are taken as spread over their span rather than over the whole bucket (CountSpan).
	c []uint32
	// sum is the sum of the counts of every bucket held, kept up to date by each change to
	// a count, so that a count at any instant reads the sum and the few held buckets older
	// than the window's start instead of adding up the whole window (parts); noSum when the
	// ring keeps none, and its counts then add up the buckets. It is 0 while c is nil.
	sum uint32
}

// spans returns the ring's spans, or nil.
func (r *Ring) spans(s *Spec) []uint32 {
	if len(r.c) < 2*s.Slots {
		return nil
	}
	return r.c[s.Slots : 2*s.Slots]
}

// noSum is Ring.sum when the ring keeps no running sum: a view of a Counter's buckets, or a
// ring whose sum reached 2³²−1 (billions of hits, near the largest global limit the rules
// accept) until it is next cleared whole.
const noSum = math.MaxUint32

// fullSpan is the span of a bucket whose hits' times are not known: the whole bucket.
const fullSpan = 0xffff

// UseSpans makes the ring record the span of each bucket's hits, so that CountSpan can use
// them, keeping counts and spans in buf when it holds 2 × s.Slots values (else allocating
// them). Call it before the first Add, instead of UseBuffer; buf must not move or be shared.
func (r *Ring) UseSpans(s *Spec, buf []uint32) {
	if r.c != nil {
		return
	}
	if len(buf) >= 2*s.Slots {
		r.c = buf[:2*s.Slots]
		clear(r.c)
	} else {
		r.c = make([]uint32, 2*s.Slots)
	}
	r.head = math.MinInt64 / 2 // older than any bucket: the first Add starts afresh
}

// UseBuffer makes the ring keep its buckets in buf, which must hold at least s.Slots
// counts, instead of allocating them on the first Add: a caller that embeds the buffer
// next to its other per-key data reads a count from adjacent memory instead of chasing a
// pointer. Call it before the first Add; buf must not move or be shared.
func (r *Ring) UseBuffer(s *Spec, buf []uint32) {
	if r.c == nil && len(buf) >= s.Slots {
		r.c = buf[:s.Slots]
		clear(r.c)
		r.head = math.MinInt64 / 2 // older than any bucket: the first Add starts afresh
	}
}

// Add counts n hits in bucket idx. now is the bucket index of the aggregator's clock; idx
// beyond now+Ahead is clamped there. It reports false, counting nothing, when idx is older
// than every bucket the ring holds (such hits are outside any window the ring can still
// answer for). Hits added without a time widen the bucket's span (UseSpans) to the whole
// bucket; a negative n, which takes hits away, leaves it as it was: it says nothing of when
// the hits that remain were made.
func (r *Ring) Add(s *Spec, now, idx int64, n int64) bool {
	if lim := now + s.Ahead; idx > lim {
		idx = lim
	}
	L := int64(s.Slots)
	if r.c == nil {
		r.c = make([]uint32, s.Slots)
		r.head = idx
	}
	switch {
	case idx > r.head:
		if idx-r.head >= L {
			clear(r.c[:L])
			r.sum = 0
		} else {
			for i := r.head + 1; i <= idx; i++ {
				p := &r.c[mod(i, L)]
				if r.sum != noSum {
					r.sum -= *p
				}
				*p = 0
			}
		}
		r.head = idx
	case idx <= r.head-L:
		return false
	}
	if sp := r.spans(s); sp != nil && n > 0 {
		widen(r.c[mod(idx, L)], &sp[mod(idx, L)], 0, fullSpan)
	}
	p := &r.c[mod(idx, L)]
	old := uint64(*p)
	// A negative n takes hits away; below zero the count wraps around and saturates.
	if v := old + uint64(n); v > math.MaxUint32 || n > math.MaxUint32 {
		*p = math.MaxUint32
	} else {
		*p = uint32(v)
	}
	if r.sum != noSum {
		r.sum = uint32(min(uint64(r.sum)-old+uint64(*p), noSum))
	}
	return true
}

// AddAt counts n hits made at instant ms (unix ms; now is the bucket index of the clock),
// recording their time in the bucket's span when the ring has spans. It is Add otherwise.
func (r *Ring) AddAt(s *Spec, now, ms, n int64) bool {
	idx := s.Bucket(ms)
	if r.spans(s) == nil || idx > now+s.Ahead || n <= 0 {
		return r.Add(s, now, idx, n)
	}
	// Add without spans, then set the span from the hit's offset: afresh when the bucket
	// was empty, else widened.
	c := r.c
	r.c = c[:s.Slots]
	ok := r.Add(s, now, idx, n)
	r.c = c[:2*s.Slots]
	if !ok {
		return false
	}
	off := uint32((ms - idx*s.Width) * fullSpan / s.Width)
	i := mod(idx, int64(s.Slots))
	sp := r.spans(s)
	if int64(r.c[i]) == n {
		sp[i] = off<<16 | off
	} else {
		widen(r.c[i], &sp[i], off, off)
	}
	return true
}

// widen extends span *sp of a bucket of count c to cover [lo, hi]; an empty bucket takes
// it as it is.
func widen(c uint32, sp *uint32, lo, hi uint32) {
	if c == 0 {
		*sp = lo<<16 | hi
		return
	}
	f, l := *sp>>16, *sp&0xffff
	*sp = min(f, lo)<<16 | max(l, hi)
}

// parts returns the whole-bucket sum (buckets after i0) and the count of bucket i0.
//
// The running sum holds every bucket of the ring; the buckets in the window are the sum less
// the held buckets older than i0. With the ring's head at the clock's bucket those are the
// Ahead buckets kept for the future, usually one, next to i0 in memory, so a count reads one
// or two cache lines of the ring instead of all of them. When the ring's newest bucket is far
// behind the window's end, fewer buckets are in the window than before it, and those are
// added up instead.
func (r *Ring) parts(s *Spec, i0 int64) (whole, oldest uint64) {
	if r.c == nil || r.head < i0 {
		return 0, 0
	}
	L := int64(s.Slots)
	tail := r.head - L + 1 // the oldest bucket held
	if r.sum == noSum {
		lo := max(i0, tail)
		whole = sumRun(r.c[:L], mod(lo, L), r.head-lo+1)
		if lo == i0 {
			oldest = uint64(r.c[mod(i0, L)])
			whole -= oldest
		}
		return whole, oldest
	}
	if i0 <= tail { // every bucket held is in the window
		whole = uint64(r.sum)
		if i0 == tail {
			oldest = uint64(r.c[mod(tail, L)])
			whole -= oldest
		}
		return whole, oldest
	}
	// Buckets tail..i0−1 are held but older than the window; i0..head are in it. Both runs
	// sit in the slice from their first bucket mod L, wrapping at most once: summing them
	// directly avoids a division per bucket on the decision path.
	before, in := i0-tail, r.head-i0+1
	start := mod(tail, L)
	o := start + before // i0's position
	if o >= L {
		o -= L
	}
	oldest = uint64(r.c[o])
	if before <= in {
		whole = uint64(r.sum) - oldest - sumRun(r.c[:L], start, before)
	} else {
		whole = sumRun(r.c[:L], o, in) - oldest
	}
	return whole, oldest
}

// sumRun returns the sum of the n values of ring c from position start on, wrapping at most
// once.
func sumRun(c []uint32, start, n int64) uint64 {
	var sum uint64
	first := min(n, int64(len(c))-start)
	for _, v := range c[start : start+first] {
		sum += uint64(v)
	}
	for _, v := range c[:n-first] {
		sum += uint64(v)
	}
	return sum
}

// Count returns the ring's count at instant t (unix ms) by the package's rule.
func (r *Ring) Count(s *Spec, t int64) float64 {
	i0, frac := s.Oldest(t)
	whole, oldest := r.parts(s, i0)
	return combine(whole, oldest, frac)
}

// CountSpan returns the ring's count at instant t with the oldest bucket's hits taken as
// spread evenly over their span instead of the whole bucket: all of them while the window
// starts before the first, none once it starts at or after the last. It is Count for a ring
// without spans. A burst that filled only part of a bucket leaves the window when it does,
// not spread over the bucket.
func (r *Ring) CountSpan(s *Spec, t int64) float64 {
	if r.spans(s) == nil {
		return r.Count(s, t)
	}
	i0, _ := s.Oldest(t)
	whole, oldest := r.parts(s, i0)
	return float64(whole) + float64(oldest)*r.spanFrac(s, i0, t)
}

// CountSince returns the ring's hits after instant t0 (unix ms): the buckets after the one
// holding t0, and the part of that one after t0 (by the span of its hits when the ring has
// spans, else by the fraction of the bucket) — the count of the window that starts at t0.
func (r *Ring) CountSince(s *Spec, t0 int64) float64 { return r.CountSpan(s, t0+s.Window) }

// spanFrac is the fraction of bucket i0's hits still in the window starting at t−W, by its
// span.
func (r *Ring) spanFrac(s *Spec, i0, t int64) float64 {
	if r.c == nil || i0 <= r.head-int64(s.Slots) || i0 > r.head {
		return 1
	}
	sp := r.spans(s)[mod(i0, int64(s.Slots))]
	start := float64(i0 * s.Width)
	first := start + float64(sp>>16)*float64(s.Width)/fullSpan
	last := start + float64(sp&0xffff)*float64(s.Width)/fullSpan
	ws := float64(t - s.Window)
	switch {
	case ws < first:
		return 1
	case ws >= last:
		return 0
	}
	return (last - ws) / (last - first)
}

// CountHard returns the ring's count at instant t with the oldest bucket taken whole: the
// hits of every bucket that still overlaps the window (t−W, t]. It is never less than the
// exact number of hits in the window.
func (r *Ring) CountHard(s *Spec, t int64) float64 {
	i0, _ := s.Oldest(t)
	whole, oldest := r.parts(s, i0)
	return float64(whole + oldest)
}

// Mode is how a count treats the oldest bucket of the window, the one the window's start
// cuts.
type Mode uint8

const (
	// Interpolate counts the oldest bucket by the fraction of it inside the window (Count):
	// the aggregator's rule.
	Interpolate Mode = iota
	// Span counts it by the fraction of its hits' span inside the window (CountSpan).
	Span
	// Hard counts it whole until it has left the window (CountHard): never less than the
	// hits in the window.
	Hard
)

// CountMode returns the count at t by mode.
func (r *Ring) CountMode(s *Spec, t int64, mode Mode) float64 {
	switch mode {
	case Hard:
		return r.CountHard(s, t)
	case Span:
		return r.CountSpan(s, t)
	}
	return r.Count(s, t)
}

// FallsTo returns the earliest instant t' ≥ t (unix ms) at which the ring's count by mode
// is at most target if no hit is added, and false when that never happens (only a target
// below zero). Retry-After comes from it: hits leave the window when their bucket (or their
// span) does, not evenly spread over the window.
func (r *Ring) FallsTo(s *Spec, t int64, target float64, mode Mode) (int64, bool) {
	if r.CountMode(s, t, mode) <= target {
		return t, true
	}
	if r.c == nil || target < 0 {
		return 0, false
	}
	i0, _ := s.Oldest(t)
	// The parts are summed once and then moved bucket by bucket, so that a search over
	// many sub-buckets stays linear in them.
	whole, oldest := r.parts(s, i0)
	sps := r.spans(s)
	L := int64(s.Slots)
	for k := i0; k <= r.head; k++ {
		if k > i0 {
			var c uint64
			if k > r.head-L {
				c = uint64(r.c[mod(k, L)])
			}
			whole, oldest = whole-c, c
		}
		// While bucket k is the oldest, at t' in [k·b+W, (k+1)·b+W), the count is
		// whole_k plus the part of c_k still inside, falling from c_k (hard: staying c_k).
		count := func(at int64) float64 {
			switch {
			case mode == Hard:
				return float64(whole + oldest)
			case mode == Span && sps != nil:
				return combine(whole, oldest, r.spanFrac(s, k, at))
			}
			_, f := s.Oldest(at)
			return combine(whole, oldest, f)
		}
		start := max(k*s.Width+s.Window, t)
		end := (k+1)*s.Width + s.Window // bucket k has wholly left at end
		w, o := float64(whole), float64(oldest)
		if mode != Hard && o > 0 && w < target+1e-9 {
			// The fraction of c_k that may stay inside, and the instant it is reached.
			f := (target - w) / o
			from, to := float64(k*s.Width), float64((k+1)*s.Width)
			if mode == Span && sps != nil {
				sp := sps[mod(k, L)]
				from, to = from+float64(sp>>16)*float64(s.Width)/fullSpan, from+float64(sp&0xffff)*float64(s.Width)/fullSpan
			}
			at := max(int64(math.Ceil(to-f*(to-from)))+s.Window-1, start)
			for range 3 { // the solution is exact up to rounding to the millisecond
				if at >= end || count(at) <= target {
					break
				}
				at++
			}
			if at < end && count(at) <= target {
				return at, true
			}
		}
		if w <= target { // at end, bucket k has left: the count is the buckets after it
			return end, true
		}
	}
	return 0, false
}

func combine(whole, oldest uint64, frac float64) float64 {
	return float64(whole) + float64(oldest)*frac
}

func mod(i, n int64) int64 {
	m := i % n
	if m < 0 {
		m += n
	}
	return m
}

// Decay is a site's demand for a counter: the sum of its requests, each weighted by
// e^(−age/τ). The zero Decay is no demand. Only ratios between sites' demands are used, so
// the weights need no normalising; they underflow to 0 for a site silent for several
// hundred τ, which then counts as having no demand.
type Decay struct {
	v  float64 // value at instant at
	at int64   // ms
}

// Add adds n requests made at instant t (ms) with time constant tau (ms).
func (d *Decay) Add(t int64, n int64, tau int64) {
	if n <= 0 {
		return
	}
	switch {
	case d.v == 0:
		d.v, d.at = float64(n), t
	case t == d.at: // the common case of one bucket's records: e^0 is 1, skip the exponential
		d.v += float64(n)
	case t > d.at:
		d.v = d.v*math.Exp(-float64(t-d.at)/float64(tau)) + float64(n)
		d.at = t
	default: // a late record
		d.v += float64(n) * math.Exp(-float64(d.at-t)/float64(tau))
	}
}

// At returns the demand at instant t (ms) with time constant tau (ms).
func (d Decay) At(t int64, tau int64) float64 {
	if d.v == 0 || t <= d.at {
		return d.v
	}
	return d.v * math.Exp(-float64(t-d.at)/float64(tau))
}

// tau returns s.Tau, or the bucket width when unset.
func (s *Spec) tau() int64 {
	if s.Tau > 0 {
		return s.Tau
	}
	return s.Width
}
