package algo

import "math/bits"

// mulDiv returns a×b/d as quotient and remainder, exactly, with a 128-bit intermediate.
// ok is false when d is 0 or the quotient does not fit in 64 bits.
func mulDiv(a, b, d uint64) (q, r uint64, ok bool) {
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

// rtime is an instant or a duration in nanoseconds plus a fraction rem/den of a
// nanosecond, 0 ≤ rem < den, where den is the limit's allowance. It makes the emission
// interval Window/Allowance exact, so buckets never drift.
type rtime struct {
	ns  int64
	rem int64
}

// add returns t + u, both with denominator den.
func (t rtime) add(u rtime, den int64) rtime {
	t.ns += u.ns
	t.rem += u.rem
	if t.rem >= den {
		t.ns++
		t.rem -= den
	}
	return t
}

// sub returns t − u, both with denominator den.
func (t rtime) sub(u rtime, den int64) rtime {
	t.ns -= u.ns
	t.rem -= u.rem
	if t.rem < 0 {
		t.ns--
		t.rem += den
	}
	return t
}

// less reports t < u.
func (t rtime) less(u rtime) bool { return t.ns < u.ns || (t.ns == u.ns && t.rem < u.rem) }

// ceil returns t rounded up to a whole nanosecond.
func (t rtime) ceil() int64 {
	if t.rem > 0 {
		return t.ns + 1
	}
	return t.ns
}

// span returns n × window / den as an rtime, saturating at a very large value on overflow.
func span(n, window, den int64) rtime {
	q, r, ok := mulDiv(uint64(n), uint64(window), uint64(den))
	if !ok || q >= 1<<62 {
		return rtime{ns: 1 << 62}
	}
	return rtime{ns: int64(q), rem: int64(r)}
}

// floorDiv returns ⌊a/b⌋ for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}
