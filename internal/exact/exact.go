// Package exact is the integer arithmetic behind streamlimit's exact rate limiting: 128-bit
// multiply-divide, nanosecond times with an exact fractional part, and the rounding rules
// of the sliding-window counter. The in-process algorithms (enforcer/algo) and their Redis
// twins (enforcer/sitestore) share it, so that both make the same decision to the
// nanosecond.
package exact

import "math/bits"

// MulDiv returns a×b/d as quotient and remainder, exactly, with a 128-bit intermediate.
// ok is false when d is 0 or the quotient does not fit in 64 bits.
func MulDiv(a, b, d uint64) (q, r uint64, ok bool) {
	if d == 0 {
		return 0, 0, false
	}
	hi, lo := bits.Mul64(a, b)
	if hi >= d {
		return 0, 0, false
	}
	q, r = bits.Div64(hi, lo, d)
	return q, r, true
}

// Time is an instant or a duration in nanoseconds plus a fraction Rem/den of a nanosecond,
// 0 ≤ Rem < den, where den is the limit's allowance. It makes the emission interval
// Window/Allowance exact, so that buckets never drift.
type Time struct {
	NS  int64
	Rem int64
}

// Add returns t + u, both with denominator den.
func (t Time) Add(u Time, den int64) Time {
	t.NS += u.NS
	t.Rem += u.Rem
	if t.Rem >= den {
		t.NS++
		t.Rem -= den
	}
	return t
}

// Sub returns t − u, both with denominator den.
func (t Time) Sub(u Time, den int64) Time {
	t.NS -= u.NS
	t.Rem -= u.Rem
	if t.Rem < 0 {
		t.NS--
		t.Rem += den
	}
	return t
}

// Less reports t < u.
func (t Time) Less(u Time) bool { return t.NS < u.NS || (t.NS == u.NS && t.Rem < u.Rem) }

// Ceil returns t rounded up to a whole nanosecond.
func (t Time) Ceil() int64 {
	if t.Rem > 0 {
		return t.NS + 1
	}
	return t.NS
}

// Span returns n × window / den as a Time, saturating at 2⁶² ns on overflow.
func Span(n, window, den int64) Time {
	q, r, ok := MulDiv(uint64(n), uint64(window), uint64(den))
	if !ok || q >= 1<<62 {
		return Time{NS: 1 << 62}
	}
	return Time{NS: int64(q), Rem: int64(r)}
}

// LevelCeil converts a backlog time to requests, rounded up: ⌈backlog × a / w⌉, saturating
// at 2⁶².
func LevelCeil(b Time, a, w int64) int64 {
	if b.NS < 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(b.NS), uint64(a))
	var carry uint64
	lo, carry = bits.Add64(lo, uint64(b.Rem), 0)
	hi += carry
	if hi >= uint64(w) {
		return 1 << 62
	}
	q, r := bits.Div64(hi, lo, uint64(w))
	if r > 0 {
		q++
	}
	return int64(q)
}

// FloorDiv returns ⌊a/b⌋ for b > 0.
func FloorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// Weighted returns ⌊prev × (w − elapsed) / w⌋: the previous window's count weighted by the
// part of it the sliding window still overlaps, rounded down.
func Weighted(prev, w, elapsed int64) int64 {
	if prev <= 0 {
		return 0
	}
	q, _, ok := MulDiv(uint64(prev), uint64(w-elapsed), uint64(w))
	if !ok {
		return prev
	}
	return int64(q)
}

// FirstFit returns the smallest elapsed time e in [0, w] at which
// ⌊prev × (w − e) / w⌋ ≤ k, for 0 ≤ k < prev: prev·(w−e) < (k+1)·w, so
// e = w − ⌊((k+1)·w − 1) / prev⌋.
func FirstFit(prev, k, w int64) int64 {
	q, r, ok := MulDiv(uint64(k+1), uint64(w), uint64(prev))
	if !ok {
		return w
	}
	f := int64(q)
	if r == 0 {
		f--
	}
	return w - f
}
