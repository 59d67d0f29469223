package sitestore

import (
	"time"

	"github.com/streamlimit/streamlimit/internal/exact"

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
		base := exact.Time{NS: st.r1, Rem: st.r2}
		capT := exact.Span(c, w, a)
		over := base.Add(exact.Span(n, w, a), a)
		allowed := n <= c && !capT.Less(over)
		var retry time.Duration
		if !allowed {
			if n > c {
				retry = algo.Never
			} else {
				retry = time.Duration(over.Sub(capT, a).Ceil())
			}
		}
		after := base
		if allowed && commit && n > 0 {
			after = over
		}
		d := algo.Decision{Allowed: allowed, Limit: c, ResetAfter: time.Duration(after.Ceil()), RetryAfter: retry}
		d.Remaining = max(c-exact.LevelCeil(after, a, w), 0)
		return d
	case algo.FixedWindow:
		ws := exact.FloorDiv(now, w) * w
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
		ws := exact.FloorDiv(now, w) * w
		cur, prev := st.r1, st.r2
		elapsed := now - ws
		est := cur + exact.Weighted(prev, w, elapsed)
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
					at = ws + exact.FirstFit(prev, k, w)
				} else if k := a - n; cur <= k {
					at = ws + w
				} else {
					at = ws + w + exact.FirstFit(cur, k, w)
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
