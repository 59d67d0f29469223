package algo

import (
	"time"

	"github.com/streamlimit/streamlimit/internal/exact"
)

// The TAT family: TokenBucket, LeakyBucket and GCRA share one state and one exact
// implementation (their admissions as meters are identical; LeakyBucket differs as a
// shaper, through Store.Reserve).

// bucketImpl registers the TAT family under name.
func bucketImpl(name string) impl {
	return impl{
		name: name, bucket: true,
		decide: func(e *entry, now int64, l Limit, n int64, commit bool) Decision {
			d, _ := e.bucket(now, l, n, commit, -1)
			return d
		},
		keep: keepBucket,
		undo: func(e *entry, saved entry, _ int64) { e.tat = saved.tat },
	}
}

// bucketState is the TAT family's part of an entry.
type bucketState struct {
	den int64      // allowance the rem of tat is expressed in
	tat exact.Time // when the bucket is full again (token) / empty (leaky)
}

// keepBucket keeps the TAT when only the allowance changed, rescaling its fraction of a
// nanosecond to the new allowance.
func keepBucket(e *entry, l Limit) {
	if a := l.Allowance(); a > 0 && a != e.den {
		if e.den > 0 {
			q, _, _ := exact.MulDiv(uint64(e.tat.Rem), uint64(a), uint64(e.den))
			e.tat.Rem = int64(q)
		} else {
			e.tat.Rem = 0
		}
		e.den = a
	}
}

// BucketDecision returns the Decision of a request of n under l for TokenBucket,
// LeakyBucket or GCRA used as a meter. The counter's state is its backlog: the time from
// now until the bucket is full again (the TAT minus now, or 0 once the TAT has passed),
// which is backlog + rem/l.Allowance() ns with backlog ≥ 0 and 0 ≤ rem < l.Allowance().
//
// The request fits when n ≤ l.Capacity() and the backlog after it, backlog + n ×
// l.Window / l.Allowance(), is at most the capacity as time, l.Capacity() × l.Window /
// l.Allowance(). RetryAfter is the excess over the capacity, rounded up, or Never when n
// exceeds the capacity; ResetAfter is the backlog rounded up; Remaining is the capacity
// minus the backlog in requests, rounded up, and at least 0. A limit with no allowance or
// no capacity admits only n = 0 and reports Limit 0 and (for n > 0) RetryAfter Never.
func BucketDecision(backlog time.Duration, rem int64, l Limit, n int64, take bool) Decision {
	d, _ := bucketDecision(exact.Time{NS: int64(backlog), Rem: rem}, l, n, take)
	return d
}

// bucketDecision is BucketDecision; it also returns the backlog after the request,
// whether or not it fits.
func bucketDecision(backlog exact.Time, l Limit, n int64, take bool) (Decision, exact.Time) {
	a, c, w := l.Allowance(), l.Capacity(), int64(l.Window)
	if a <= 0 || c <= 0 {
		return Decision{Allowed: n == 0, RetryAfter: neverIf(n > 0)}, backlog
	}
	capT := exact.Span(c, w, a)
	over := backlog.Add(exact.Span(n, w, a), a)
	allowed := n <= c && !capT.Less(over)
	var retry time.Duration
	if !allowed {
		if n > c {
			retry = Never
		} else {
			retry = time.Duration(over.Sub(capT, a).Ceil())
		}
	}
	after := backlog
	if allowed && take && n > 0 {
		after = over
	}
	d := Decision{Allowed: allowed, Limit: c, ResetAfter: time.Duration(after.Ceil()), RetryAfter: retry}
	d.Remaining = max(c-exact.LevelCeil(after, a, w), 0)
	return d, over
}

func neverIf(b bool) time.Duration {
	if b {
		return Never
	}
	return 0
}

// bucket decides op on e. With maxDelay < 0 it is a meter: the request fits when the
// bucket level after it stays within capacity. With maxDelay ≥ 0 it is a shaper as well:
// the request also needs its start delay (the time until the bucket has drained what was
// queued before it) to be at most maxDelay; the delay is returned.
func (e *entry) bucket(now int64, l Limit, n int64, commit bool, maxDelay time.Duration) (Decision, time.Duration) {
	a, c := l.Allowance(), l.Capacity()
	if a <= 0 || c <= 0 {
		d, _ := bucketDecision(exact.Time{}, l, n, false)
		return d, 0
	}
	if e.den == 0 {
		e.den = a
	}
	nowR := exact.Time{NS: now}
	var backlog exact.Time
	if nowR.Less(e.tat) {
		backlog = e.tat.Sub(nowR, a)
	}
	delay := time.Duration(backlog.Ceil())
	shaped := maxDelay >= 0 && delay > maxDelay
	d, over := bucketDecision(backlog, l, n, commit && !shaped)
	if shaped {
		d.Allowed = false
		if r := delay - maxDelay; r > d.RetryAfter {
			d.RetryAfter = r
		}
	} else if d.Allowed && commit && n > 0 {
		e.tat = nowR.Add(over, a)
		e.expires = e.tat.Ceil()
	}
	return d, delay
}
