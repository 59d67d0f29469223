package algo

import (
	"time"

	"github.com/streamlimit/streamlimit/internal/exact"
)

// entry is the state of one counter. Which fields are used depends on alg; one struct for
// all six keeps the map monomorphic and lets a key change algorithm on a rules reload.
type entry struct {
	alg    Algorithm
	window int64 // ns
	den    int64 // allowance the rem of tat is expressed in (bucket family)

	tat exact.Time // bucket family: when the bucket is full again (token) / empty (leaky)

	start int64 // window algorithms: start of the current aligned window, unix ns
	cur   int64 // window algorithms: count in the current window
	prev  int64 // sliding window: count in the previous window

	log  []int64 // sliding log: ring of admitted timestamps, unix ns, oldest at head
	head int
	n    int

	// expires is the instant from which the entry is indistinguishable from a new one, so
	// removing it then changes no decision.
	expires int64
	busy    bool // held by an AllowAll in progress; never evicted then
}

// adopt makes e fit op: a new key, or a key reused with another algorithm or window
// (a rules reload), starts empty; a bucket whose allowance changed keeps its TAT.
func (e *entry) adopt(op *Op) {
	w := int64(op.Limit.Window)
	if e.alg == op.Algorithm && e.window == w && e.window != 0 {
		if e.alg.bucket() {
			if a := op.Limit.Allowance(); a > 0 && a != e.den {
				if e.den > 0 {
					q, _, _ := exact.MulDiv(uint64(e.tat.Rem), uint64(a), uint64(e.den))
					e.tat.Rem = int64(q)
				} else {
					e.tat.Rem = 0
				}
				e.den = a
			}
		}
		return
	}
	log := e.log[:0]
	busy := e.busy
	*e = entry{alg: op.Algorithm, window: w, den: op.Limit.Allowance(), log: log, busy: busy}
}

// decide evaluates op against e at now (unix ns) and, when commit is set and the request
// fits, takes op.N. e must already be adopted for op.
func (e *entry) decide(now int64, op *Op, commit bool) Decision {
	switch op.Algorithm {
	case TokenBucket, LeakyBucket, GCRA:
		d, _ := e.bucket(now, op, commit, -1)
		return d
	case FixedWindow:
		return e.fixed(now, op, commit)
	case SlidingLog:
		return e.slidingLog(now, op, commit)
	default:
		return e.sliding(now, op, commit)
	}
}

// bucket implements the TAT family. With maxDelay < 0 it is a meter: the request fits when
// the bucket level after it stays within capacity. With maxDelay ≥ 0 it is a shaper as well:
// the request also needs its start delay (the time until the bucket has drained what was
// queued before it) to be at most maxDelay; the delay is returned.
func (e *entry) bucket(now int64, op *Op, commit bool, maxDelay time.Duration) (Decision, time.Duration) {
	a, c, w, n := op.Limit.Allowance(), op.Limit.Capacity(), int64(op.Limit.Window), op.N
	if a <= 0 || c <= 0 {
		return Decision{Allowed: n == 0, Limit: 0, RetryAfter: neverIf(n > 0)}, 0
	}
	if e.den == 0 {
		e.den = a
	}
	nowR := exact.Time{NS: now}
	base := e.tat
	if base.Less(nowR) {
		base = nowR
	}
	capT := exact.Span(c, w, a)
	newTat := base.Add(exact.Span(n, w, a), a)
	over := newTat.Sub(nowR, a) // bucket level after the request, as time
	delay := time.Duration(base.Sub(nowR, a).Ceil())
	allowed := n <= c && !capT.Less(over)
	var retry time.Duration
	if !allowed {
		if n > c {
			retry = Never
		} else {
			retry = time.Duration(over.Sub(capT, a).Ceil())
		}
	}
	if maxDelay >= 0 && delay > maxDelay {
		allowed = false
		if r := delay - maxDelay; r > retry {
			retry = r
		}
	}
	after := base
	if allowed && commit && n > 0 {
		e.tat = newTat
		e.expires = newTat.Ceil()
		after = newTat
	}
	backlog := after.Sub(nowR, a)
	d := Decision{Allowed: allowed, Limit: c, ResetAfter: time.Duration(backlog.Ceil()), RetryAfter: retry}
	d.Remaining = c - exact.LevelCeil(backlog, a, w)
	if d.Remaining < 0 {
		d.Remaining = 0
	}
	return d, delay
}

func neverIf(b bool) time.Duration {
	if b {
		return Never
	}
	return 0
}

func (e *entry) fixed(now int64, op *Op, commit bool) Decision {
	a, w, n := op.Limit.Allowance(), int64(op.Limit.Window), op.N
	ws := exact.FloorDiv(now, w) * w
	cur := int64(0)
	if e.start == ws {
		cur = e.cur
	}
	allowed := n <= a && cur+n <= a
	if allowed && commit && n > 0 {
		e.start, e.cur, e.expires = ws, cur+n, ws+w
		cur += n
	}
	d := Decision{Allowed: allowed, Limit: max(a, 0), Remaining: max(a-cur, 0)}
	if cur > 0 {
		d.ResetAfter = time.Duration(ws + w - now)
	}
	if !allowed {
		if n > a {
			d.RetryAfter = Never
		} else {
			d.RetryAfter = time.Duration(ws + w - now)
		}
	}
	return d
}

func (e *entry) sliding(now int64, op *Op, commit bool) Decision {
	a, w, n := op.Limit.Allowance(), int64(op.Limit.Window), op.N
	ws := exact.FloorDiv(now, w) * w
	cur, prev := int64(0), int64(0)
	switch e.start {
	case ws:
		cur, prev = e.cur, e.prev
	case ws - w:
		prev = e.cur
	}
	elapsed := now - ws
	est := cur + exact.Weighted(prev, w, elapsed)
	allowed := n <= a && est+n <= a
	if allowed && commit && n > 0 {
		cur += n
		est += n
		e.start, e.cur, e.prev, e.expires = ws, cur, prev, ws+2*w
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

func (e *entry) slidingLog(now int64, op *Op, commit bool) Decision {
	a, w, n := op.Limit.Allowance(), int64(op.Limit.Window), op.N
	// Drop timestamps that left the window (now − ts ≥ w); this never changes a decision.
	for e.n > 0 && now-e.log[e.head] >= w {
		e.head++
		if e.head == len(e.log) {
			e.head = 0
		}
		e.n--
	}
	count := int64(e.n)
	allowed := n <= a && count+n <= a
	if allowed && commit && n > 0 {
		for i := int64(0); i < n; i++ {
			e.push(now, a)
		}
		count += n
		e.expires = now + w
	}
	d := Decision{Allowed: allowed, Limit: max(a, 0), Remaining: max(a-count, 0)}
	if e.n > 0 {
		newest := e.log[(e.head+e.n-1)%len(e.log)]
		d.ResetAfter = time.Duration(newest + w - now)
	}
	if !allowed {
		if n > a {
			d.RetryAfter = Never
		} else {
			// The j oldest timestamps must leave the window before n more fit.
			j := int(count + n - a)
			ts := e.log[(e.head+j-1)%len(e.log)]
			d.RetryAfter = time.Duration(ts + w - now)
		}
	}
	return d
}

// push appends ts to the ring, growing it up to a entries.
func (e *entry) push(ts, a int64) {
	if e.n == len(e.log) {
		size := max(2*len(e.log), 8)
		if int64(size) > a {
			size = int(a)
		}
		if size <= e.n {
			size = e.n + 1
		}
		grown := make([]int64, size)
		for i := 0; i < e.n; i++ {
			grown[i] = e.log[(e.head+i)%len(e.log)]
		}
		e.log, e.head = grown, 0
	}
	e.log[(e.head+e.n)%len(e.log)] = ts
	e.n++
}
