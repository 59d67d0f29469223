package algo

import (
	"time"

	"github.com/streamlimit/streamlimit/internal/exact"
)

var slidingWindowImpl = impl{
	name:   "sliding_window_estimate",
	decide: (*entry).sliding,
	undo: func(e *entry, saved entry, _ int64) {
		e.windowState, e.slidingState = saved.windowState, saved.slidingState
	},
}

// slidingState is SlidingWindowEstimate's part of an entry beside windowState, which holds its
// current aligned window.
type slidingState struct {
	prev int64 // count in the previous window
}

// SlidingDecision returns the Decision of a request of n under l for SlidingWindowEstimate at now,
// where cur is the count already taken in the window containing now and prev the count of
// the window before it (windows are aligned to multiples of l.Window since the Unix epoch,
// as FixedBounds(now, l.Window, Epoch) gives them).
//
// The estimate is cur plus prev weighted by the part of the previous window that the
// sliding window ending now still overlaps, rounded down; the request fits when estimate +
// n ≤ l.Allowance(). Remaining is the allowance minus the estimate (after the request,
// with take), at least 0. ResetAfter is the time until the current window's count has
// left the sliding window (the end of the next window), or, when the current window is
// empty, until the previous one's has (the end of this window). RetryAfter is the exact
// first instant, from now, at which the estimate leaves room for n, or Never when n
// exceeds the allowance.
func SlidingDecision(now, cur, prev int64, l Limit, n int64, take bool) Decision {
	return slidingDecision(now, windowStart(now, l.Window), cur, prev, l, n, take)
}

// slidingDecision is SlidingDecision with the window start ws = windowStart(now, l.Window) given.
func slidingDecision(now, ws, cur, prev int64, l Limit, n int64, take bool) Decision {
	a, w := l.Allowance(), int64(l.Window)
	est := cur + exact.Weighted(prev, w, now-ws)
	allowed := n <= a && est+n <= a
	if allowed && take && n > 0 {
		cur += n
		est += n
	}
	d := Decision{Allowed: allowed, Limit: max(a, 0), Remaining: max(a-est, 0)}
	switch {
	case cur > 0:
		d.ResetAfter = time.Duration(ws + 2*w - now)
	case prev > 0:
		d.ResetAfter = time.Duration(ws + w - now)
	}
	if !allowed {
		if n > a {
			d.RetryAfter = Never
		} else {
			var at int64
			if k := a - n - cur; k >= 0 {
				// Fits later in this window, once the previous window's weight has decayed.
				at = ws + exact.FirstFit(prev, k, w)
			} else if k := a - n; cur <= k {
				at = ws + w
			} else {
				// In the next window this window's count becomes the decaying previous one.
				at = ws + w + exact.FirstFit(cur, k, w)
			}
			d.RetryAfter = time.Duration(at - now)
		}
	}
	return d
}

func (e *entry) sliding(now int64, l Limit, n int64, commit bool) Decision {
	w := int64(l.Window)
	ws := windowStart(now, l.Window)
	cur, prev := int64(0), int64(0)
	switch {
	case e.start == ws:
		cur, prev = e.cur, e.prev
	case e.start == ws-w:
		prev = e.cur
	case e.start > ws && e.cur+e.prev > 0:
		// A request stamped before the window a concurrent caller already started (it
		// waited longer on its way here): it counts in that newer window with the previous
		// one weighed whole (the strictest estimate), and never starts an older window
		// over, which would forget the newer one's count.
		d := slidingDecision(e.start, e.start, e.cur, e.prev, l, n, commit)
		if late := time.Duration(e.start - now); d.ResetAfter > 0 || d.RetryAfter > 0 {
			d.ResetAfter += late
			if d.RetryAfter > 0 && d.RetryAfter != Never {
				d.RetryAfter += late
			}
		}
		if d.Allowed && commit && n > 0 {
			e.cur += n
		}
		return d
	}
	d := slidingDecision(now, ws, cur, prev, l, n, commit)
	if d.Allowed && commit && n > 0 {
		e.start, e.cur, e.prev, e.expires = ws, cur+n, prev, ws+2*w
	}
	return d
}
