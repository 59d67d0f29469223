package algo

import (
	"time"

	"github.com/streamlimit/streamlimit/internal/exact"
)

// The functions below compute a Decision from a counter's state as it is just before the
// request. They are the only statement of each algorithm's rules: the in-process counters
// (entry) call them on their own state, and package sitestore calls them on the state its
// Redis script reports, so that both decide identically to the nanosecond. They are pure:
// they change nothing, and updating the state when the request is taken is the caller's
// job (take only tells them to describe the state after it).
//
// Times are integer nanoseconds: now is Unix time, and the other times are offsets from
// now. In each, take reports whether an admitted request takes its n (an Allow) rather than
// only asking (a Peek): with take and Allowed, Remaining and ResetAfter describe the
// counter after the request. The Decision's Allowed is the algorithm's own verdict; a
// caller applying several limits at once may override it.

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

// windowStart returns the start of the window of l containing now: the largest multiple
// of l.Window (since the Unix epoch) at or before now.
func windowStart(now int64, l Limit) int64 {
	w := int64(l.Window)
	return exact.FloorDiv(now, w) * w
}

// FixedDecision returns the Decision of a request of n under l for FixedWindow at now,
// where cur is the count already taken in the window containing now (windows are aligned
// to multiples of l.Window since the Unix epoch).
//
// The request fits when cur + n ≤ l.Allowance(). ResetAfter is the time until the window
// ends, or 0 when its count (after the request, with take) is 0; RetryAfter is the time
// until the window ends, or Never when n exceeds the allowance.
func FixedDecision(now, cur int64, l Limit, n int64, take bool) Decision {
	return fixedDecision(now, windowStart(now, l), cur, l, n, take)
}

// fixedDecision is FixedDecision with the window start ws = windowStart(now, l) given.
func fixedDecision(now, ws, cur int64, l Limit, n int64, take bool) Decision {
	a, w := l.Allowance(), int64(l.Window)
	allowed := n <= a && cur+n <= a
	if allowed && take && n > 0 {
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

// SlidingDecision returns the Decision of a request of n under l for SlidingWindow at now,
// where cur is the count already taken in the window containing now and prev the count of
// the window before it (windows are aligned to multiples of l.Window since the Unix
// epoch).
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
	return slidingDecision(now, windowStart(now, l), cur, prev, l, n, take)
}

// slidingDecision is SlidingDecision with the window start ws = windowStart(now, l) given.
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

// SlidingLogDecision returns the Decision of a request of n under l for SlidingLog, where
// count is the number of timestamps in the log still inside the window (now − ts <
// l.Window), newest is the newest of them minus now (≤ 0; read only when count > 0), and
// oldest is the j-th oldest of them minus now, j = count + n − l.Allowance() (read only
// when the request is denied and n ≤ l.Allowance(), which is exactly when 1 ≤ j ≤ count).
//
// The request fits when count + n ≤ l.Allowance(); taking it logs n timestamps at now.
// ResetAfter is the time until the newest timestamp leaves the window (0 when the log is
// empty); RetryAfter is the time until the j oldest have left it, or Never when n exceeds
// the allowance.
func SlidingLogDecision(count, newest, oldest int64, l Limit, n int64, take bool) Decision {
	a, w := l.Allowance(), int64(l.Window)
	allowed := n <= a && count+n <= a
	if allowed && take && n > 0 {
		count += n
		newest = 0
	}
	d := Decision{Allowed: allowed, Limit: max(a, 0), Remaining: max(a-count, 0)}
	if count > 0 {
		d.ResetAfter = time.Duration(newest + w)
	}
	if !allowed {
		if n > a {
			d.RetryAfter = Never
		} else {
			d.RetryAfter = time.Duration(oldest + w)
		}
	}
	return d
}

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

	log   []logEntry // sliding log: ring of admissions, oldest at head
	head  int
	n     int   // entries in the ring
	total int64 // hits the ring's entries hold
	// logDid says what the last committed sliding-log op did to the ring, so that an
	// AllowAll that fails can undo it: logPushed a new entry, or logMerged N into the
	// newest, whose time was logPrevTS before.
	logDid    uint8
	logPrevTS int64

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
	a, c, n := op.Limit.Allowance(), op.Limit.Capacity(), op.N
	if a <= 0 || c <= 0 {
		d, _ := bucketDecision(exact.Time{}, op.Limit, n, false)
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
	d, over := bucketDecision(backlog, op.Limit, n, commit && !shaped)
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

func (e *entry) fixed(now int64, op *Op, commit bool) Decision {
	ws := windowStart(now, op.Limit)
	cur := int64(0)
	if e.start == ws {
		cur = e.cur
	}
	d := fixedDecision(now, ws, cur, op.Limit, op.N, commit)
	if d.Allowed && commit && op.N > 0 {
		e.start, e.cur, e.expires = ws, cur+op.N, ws+int64(op.Limit.Window)
	}
	return d
}

func (e *entry) sliding(now int64, op *Op, commit bool) Decision {
	w := int64(op.Limit.Window)
	ws := windowStart(now, op.Limit)
	cur, prev := int64(0), int64(0)
	switch e.start {
	case ws:
		cur, prev = e.cur, e.prev
	case ws - w:
		prev = e.cur
	}
	d := slidingDecision(now, ws, cur, prev, op.Limit, op.N, commit)
	if d.Allowed && commit && op.N > 0 {
		e.start, e.cur, e.prev, e.expires = ws, cur+op.N, prev, ws+2*w
	}
	return d
}

func (e *entry) slidingLog(now int64, op *Op, commit bool) Decision {
	a, w, n := op.Limit.Allowance(), int64(op.Limit.Window), op.N
	// Drop entries that left the window (now − ts ≥ w); this never changes a decision.
	for e.n > 0 && now-e.log[e.head].ts >= w {
		e.total -= e.log[e.head].n
		e.head++
		if e.head == len(e.log) {
			e.head = 0
		}
		e.n--
	}
	count := e.total
	var newest, oldest int64
	if e.n > 0 {
		newest = e.log[(e.head+e.n-1)%len(e.log)].ts - now
	}
	if j := count + n - a; j >= 1 && j <= count {
		// The time of the j-th oldest hit: walk the entries until they hold j.
		for i, held := 0, int64(0); i < e.n; i++ {
			le := &e.log[(e.head+i)%len(e.log)]
			if held += le.n; held >= j {
				oldest = le.ts - now
				break
			}
		}
	}
	d := SlidingLogDecision(count, newest, oldest, op.Limit, n, commit)
	e.logDid = logNone
	if d.Allowed && commit && n > 0 {
		e.record(now, n, a)
		e.expires = now + w
	}
	return d
}

// MaxLogEntries bounds the entries of one sliding log. Each entry holds the hits admitted
// at one instant, so a log needs one entry per distinct admission time, not per hit; past
// the bound, new hits are added to the newest entry, whose time moves to now. That only
// keeps those hits in the window longer than they would be: coalescing can deny a request
// an exact log would admit, never the reverse. Its cost is a key's memory: at most
// MaxLogEntries × 16 bytes (16 KiB), whatever the limit and the hits per request.
const MaxLogEntries = 1024

// logEntry is n hits admitted at ts (unix ns).
type logEntry struct{ ts, n int64 }

// What the last committed sliding-log op did (entry.logDid).
const (
	logNone uint8 = iota
	logPushed
	logMerged
)

// record logs n hits at now: into the newest entry when it has the same time, or when the
// ring holds MaxLogEntries (coalescing, see MaxLogEntries), else as a new entry. The ring
// grows toward min(a, MaxLogEntries) entries: a log never holds more hits than a.
func (e *entry) record(now, n, a int64) {
	e.total += n
	if e.n > 0 {
		last := &e.log[(e.head+e.n-1)%len(e.log)]
		if last.ts == now || e.n >= MaxLogEntries {
			e.logDid, e.logPrevTS = logMerged, last.ts
			last.ts, last.n = now, last.n+n
			return
		}
	}
	e.push(logEntry{ts: now, n: n}, min(a, MaxLogEntries))
	e.logDid = logPushed
}

// unrecord undoes the last record of n hits, as logDid and logPrevTS describe it.
func (e *entry) unrecord(did uint8, prevTS, n int64) {
	switch did {
	case logPushed:
		e.n--
	case logMerged:
		last := &e.log[(e.head+e.n-1)%len(e.log)]
		last.ts, last.n = prevTS, last.n-n
	default:
		return
	}
	e.total -= n
}

// push appends le to the ring, growing it up to size entries.
func (e *entry) push(le logEntry, size int64) {
	if e.n == len(e.log) {
		grow := max(2*len(e.log), 8)
		if int64(grow) > size {
			grow = int(size)
		}
		if grow <= e.n {
			grow = e.n + 1
		}
		grown := make([]logEntry, grow)
		for i := 0; i < e.n; i++ {
			grown[i] = e.log[(e.head+i)%len(e.log)]
		}
		e.log, e.head = grown, 0
	}
	e.log[(e.head+e.n)%len(e.log)] = le
	e.n++
}
