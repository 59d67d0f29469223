package sitestore

import (
	"math/bits"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/algo"
)

// This file turns the state a script reports for an op into an algo.Decision with exactly
// algo.Store's arithmetic (integer nanoseconds, exact rationals, the same rounding). The
// script decides Allowed atomically; everything else is computed here, in Go, where
// 128-bit intermediates are cheap, so Lua never needs them.

// opState is what the script reports for one op: whether it fits, and the counter's state
// as that op saw it (after the request's earlier ops), relative to now.
//
//	bucket family: r1, r2 = max(TAT − now, 0) as ns and rem/allowance
//	fixed window:  r1 = count in the current window
//	sliding:       r1, r2 = counts in the current and previous window
//	sliding log:   r1 = live timestamps, r2 = newest − now, r3 = (the j-th oldest) − now
//	               where j = r1 + n − allowance, when denied
type opState struct {
	allowed    bool
	r1, r2, r3 int64
}

func isBucket(a algo.Algorithm) bool {
	return a == algo.TokenBucket || a == algo.LeakyBucket || a == algo.GCRA
}

// decide computes op's Decision at now (unix ns) from st; with commit, an admitted op's
// own take is reflected in Remaining and ResetAfter.
func decide(op *algo.Op, now int64, st opState, commit bool) algo.Decision {
	a, w, n := op.Limit.Allowance(), int64(op.Limit.Window), op.N
	switch op.Algorithm {
	case algo.TokenBucket, algo.LeakyBucket, algo.GCRA:
		c := op.Limit.Capacity()
		if a <= 0 || c <= 0 {
			return algo.Decision{Allowed: n == 0, RetryAfter: neverIf(n > 0)}
		}
		base := rtime{ns: st.r1, rem: st.r2}
		capT := span(c, w, a)
		over := base.add(span(n, w, a), a)
		allowed := n <= c && !capT.less(over)
		var retry time.Duration
		if !allowed {
			if n > c {
				retry = algo.Never
			} else {
				retry = time.Duration(over.sub(capT, a).ceil())
			}
		}
		after := base
		if allowed && commit && n > 0 {
			after = over
		}
		d := algo.Decision{Allowed: allowed, Limit: c, ResetAfter: time.Duration(after.ceil()), RetryAfter: retry}
		d.Remaining = max(c-levelCeil(after, a, w), 0)
		return d
	case algo.FixedWindow:
		ws := floorDiv(now, w) * w
		cur := st.r1
		allowed := n <= a && cur+n <= a
		if allowed && commit && n > 0 {
			cur += n
		}
		d := algo.Decision{Allowed: allowed, Limit: max(a, 0), Remaining: max(a-cur, 0)}
		if cur > 0 {
			d.ResetAfter = time.Duration(ws + w - now)
		}
		if !allowed {
			if n > a {
				d.RetryAfter = algo.Never
			} else {
				d.RetryAfter = time.Duration(ws + w - now)
			}
		}
		return d
	case algo.SlidingLog:
		count, newest := st.r1, st.r2
		allowed := n <= a && count+n <= a
		if allowed && commit && n > 0 {
			count += n
			newest = 0
		}
		d := algo.Decision{Allowed: allowed, Limit: max(a, 0), Remaining: max(a-count, 0)}
		if count > 0 {
			d.ResetAfter = time.Duration(newest + w)
		}
		if !allowed {
			if n > a {
				d.RetryAfter = algo.Never
			} else {
				d.RetryAfter = time.Duration(st.r3 + w)
			}
		}
		return d
	default: // SlidingWindow
		ws := floorDiv(now, w) * w
		cur, prev := st.r1, st.r2
		elapsed := now - ws
		est := cur + weighted(prev, w, elapsed)
		allowed := n <= a && est+n <= a
		if allowed && commit && n > 0 {
			cur += n
			est += n
		}
		d := algo.Decision{Allowed: allowed, Limit: max(a, 0), Remaining: max(a-est, 0)}
		switch {
		case cur > 0:
			d.ResetAfter = time.Duration(ws + 2*w - now)
		case prev > 0:
			d.ResetAfter = time.Duration(ws + w - now)
		}
		if !allowed {
			if n > a {
				d.RetryAfter = algo.Never
			} else {
				var at int64
				if k := a - n - cur; k >= 0 {
					at = ws + firstFit(prev, k, w)
				} else if k := a - n; cur <= k {
					at = ws + w
				} else {
					at = ws + w + firstFit(cur, k, w)
				}
				d.RetryAfter = time.Duration(at - now)
			}
		}
		return d
	}
}

func neverIf(b bool) time.Duration {
	if b {
		return algo.Never
	}
	return 0
}

// The helpers below are algo's own exact arithmetic (package algo keeps them unexported).

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

// rtime is a time in ns plus rem/den of a ns, 0 ≤ rem < den (den = the allowance).
type rtime struct{ ns, rem int64 }

func (t rtime) add(u rtime, den int64) rtime {
	t.ns += u.ns
	t.rem += u.rem
	if t.rem >= den {
		t.ns++
		t.rem -= den
	}
	return t
}

func (t rtime) sub(u rtime, den int64) rtime {
	t.ns -= u.ns
	t.rem -= u.rem
	if t.rem < 0 {
		t.ns--
		t.rem += den
	}
	return t
}

func (t rtime) less(u rtime) bool { return t.ns < u.ns || (t.ns == u.ns && t.rem < u.rem) }

func (t rtime) ceil() int64 {
	if t.rem > 0 {
		return t.ns + 1
	}
	return t.ns
}

func span(n, window, den int64) rtime {
	q, r, ok := mulDiv(uint64(n), uint64(window), uint64(den))
	if !ok || q >= 1<<62 {
		return rtime{ns: 1 << 62}
	}
	return rtime{ns: int64(q), rem: int64(r)}
}

func levelCeil(b rtime, a, w int64) int64 {
	if b.ns < 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(b.ns), uint64(a))
	var carry uint64
	lo, carry = bits.Add64(lo, uint64(b.rem), 0)
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

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func weighted(prev, w, elapsed int64) int64 {
	if prev <= 0 {
		return 0
	}
	q, _, ok := mulDiv(uint64(prev), uint64(w-elapsed), uint64(w))
	if !ok {
		return prev
	}
	return int64(q)
}

func firstFit(prev, k, w int64) int64 {
	q, r, ok := mulDiv(uint64(k+1), uint64(w), uint64(prev))
	if !ok {
		return w
	}
	f := int64(q)
	if r == 0 {
		f--
	}
	return w - f
}
