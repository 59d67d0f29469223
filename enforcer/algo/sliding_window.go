package algo

import (
	"time"

	"github.com/streamlimit/streamlimit/internal/exact"
	"github.com/streamlimit/streamlimit/window"
)

// subBucketImpl is SlidingWindow. Its state is logState's ring, holding one entry per
// sub-bucket with hits: ts the sub-bucket's index (SubBuckets.Bucket), n its hits, oldest
// first.
var subBucketImpl = impl{
	name:   "sliding_window",
	decide: (*entry).subBuckets,
	// Dropping the sub-buckets no later decision counts (Keeps) changes none; undo what
	// the op recorded.
	undo: func(e *entry, saved entry, n int64) { e.unrecord(saved.logDid, saved.logPrevTS, n) },
}

// SubBuckets is SlidingWindow's grid for one window: the window is split as global scope
// splits it (window.DefaultSubBuckets sub-buckets of window.Width, whole milliseconds),
// sub-bucket i being [i × Width, (i+1) × Width) in unix ns.
type SubBuckets struct {
	// Window is the window, in ns.
	Window int64
	// Width is a sub-bucket's width, in ns (a whole number of milliseconds).
	Width int64
	// Slots is the most sub-buckets a window overlaps: ceil(Window/Width) + 1.
	Slots int64
}

// SubBucketsOf returns the grid of window w.
func SubBucketsOf(w time.Duration) SubBuckets {
	b := window.Width(w, window.DefaultSubBuckets) * int64(time.Millisecond)
	return SubBuckets{Window: int64(w), Width: b, Slots: (int64(w)+b-1)/b + 1}
}

// Bucket returns the index of the sub-bucket holding instant t (unix ns).
func (g SubBuckets) Bucket(t int64) int64 { return exact.FloorDiv(t, g.Width) }

// Oldest returns the oldest sub-bucket the window ending at now overlaps: the one holding
// now − Window. Every hit of the window (now − Window, now] lies in it or after it.
func (g SubBuckets) Oldest(now int64) int64 { return g.Bucket(now - g.Window) }

// Leaves returns the first instant (unix ns) at which sub-bucket i no longer counts: when
// the window's start has passed its end.
func (g SubBuckets) Leaves(i int64) int64 { return (i+1)*g.Width + g.Window }

// Decides returns the instant a request stamped now is decided at, when the newest
// sub-bucket holding hits is newest: now, or the start of newest when now is before it (a
// request stamped before a sub-bucket a concurrent caller already started is decided, and
// counted, in that one). The window ending there holds every hit admitted in any earlier
// decision whose own instant lies in it, which is what bounds every window's hits by the
// allowance whatever order stamped requests arrive in: hits are dropped only once they are
// older than every window a later decision can end at (Keeps).
func (g SubBuckets) Decides(now, newest int64) int64 { return max(now, newest*g.Width) }

// Keeps returns the oldest sub-bucket a counter whose newest sub-bucket with hits is
// newest must keep: the oldest that the window ending at newest's start overlaps. No
// later decision counts an older one.
func (g SubBuckets) Keeps(newest int64) int64 { return g.Oldest(newest * g.Width) }

// SubBucketDecision returns the Decision of a request of n under l for SlidingWindow at
// now (unix ns), where count is the hits of the sub-buckets from the oldest that the
// window ending at the decision's instant (Decides) overlaps on,
// newest the newest of them holding hits (read only when count > 0), and oldest the
// sub-bucket by which they hold, counted from the oldest, count + n − l.Allowance() hits
// (read only when the request is denied and n ≤ l.Allowance(), which is exactly when that
// is between 1 and count). A take counts in sub-bucket at (g.Bucket(now), or newest when
// that is later: a request stamped before a sub-bucket a concurrent caller already
// started counts in that one).
//
// The request fits when count + n ≤ l.Allowance(). Remaining is the allowance minus the
// count (after the request, with take), at least 0. ResetAfter is the time until the
// newest sub-bucket with hits leaves the window; RetryAfter the time until sub-bucket
// oldest has, or Never when n exceeds the allowance.
func SubBucketDecision(g SubBuckets, now, count, newest, oldest, at int64, l Limit, n int64, take bool) Decision {
	a := l.Allowance()
	allowed := n <= a && count+n <= a
	if allowed && take && n > 0 {
		count += n
		newest = at
	}
	d := Decision{Allowed: allowed, Limit: max(a, 0), Remaining: max(a-count, 0)}
	if count > 0 {
		d.ResetAfter = time.Duration(g.Leaves(newest) - now)
	}
	if !allowed {
		if n > a {
			d.RetryAfter = Never
		} else {
			d.RetryAfter = time.Duration(g.Leaves(oldest) - now)
		}
	}
	return d
}

func (e *entry) subBuckets(now int64, l Limit, n int64, commit bool) Decision {
	g := SubBucketsOf(l.Window)
	ic := g.Bucket(now)
	count, at, i0 := int64(0), ic, g.Oldest(now)
	var newest, oldest int64
	if e.n > 0 {
		newest = e.log[(e.head+e.n-1)%len(e.log)].ts
		// Drop the sub-buckets no decision counts any more; this changes none.
		for keep := g.Keeps(newest); e.log[e.head].ts < keep; {
			e.total -= e.log[e.head].n
			e.head++
			if e.head == len(e.log) {
				e.head = 0
			}
			e.n--
		}
		at = max(ic, newest)
		i0 = g.Oldest(g.Decides(now, newest))
		count = e.total
		for i := 0; i < e.n; i++ {
			le := &e.log[(e.head+i)%len(e.log)]
			if le.ts >= i0 {
				break
			}
			count -= le.n
		}
	}
	if j := count + n - l.Allowance(); j >= 1 && j <= count {
		for i, held := 0, int64(0); i < e.n; i++ {
			le := &e.log[(e.head+i)%len(e.log)]
			if le.ts < i0 {
				continue
			}
			if held += le.n; held >= j {
				oldest = le.ts
				break
			}
		}
	}
	d := SubBucketDecision(g, now, count, newest, oldest, at, l, n, commit)
	e.logDid = logNone
	if d.Allowed && commit && n > 0 {
		e.record(at, n, g.Slots)
		e.expires = g.Leaves(at)
	}
	return d
}
