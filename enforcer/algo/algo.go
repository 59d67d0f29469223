// Package algo implements the six local rate-limiting algorithms (token bucket, leaky
// bucket, fixed window, sliding window log, sliding window counter and GCRA) exactly and in
// process, over a bounded, sharded map of counters keyed by counter key.
//
// Everything here is driven by the time the caller passes in, never by the wall clock, so
// that tests and the accuracy simulator control time (docs/architecture.md, invariant 6). Time is kept in
// integer nanoseconds and rates as exact rationals, so a decision, its remaining count and
// its retry-after are exact to the nanosecond (rounded up where a wait is concerned).
package algo

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/streamlimit/streamlimit/internal/exact"
)

// Algorithm names one of the six local algorithms. The zero value is SlidingWindow.
type Algorithm uint8

const (
	// SlidingWindow counts a window as global scope does: the window is split into
	// package window's sub-buckets (window.DefaultSubBuckets of window.Width), a hit counts
	// in the sub-bucket of its time, and every sub-bucket that overlaps the window ending
	// now counts whole (window.Ring.CountHard). No window of length Limit.Window ever holds
	// more than the allowance, a fresh key's first included; a hit keeps counting until
	// its sub-bucket has left the window, at most one sub-bucket width (a 60th of the
	// window) after the hit itself has.
	SlidingWindow Algorithm = iota
	// TokenBucket is a bucket of Limit.Capacity() tokens, initially full, refilled at
	// Limit.Allowance() tokens per Limit.Window; a request of n takes n tokens.
	TokenBucket
	// LeakyBucket is a bucket (queue) of Limit.Capacity() requests that leaks at
	// Limit.Allowance() requests per Limit.Window. As a meter (Allow) a request that would
	// overflow the bucket is rejected, which makes its admissions identical to TokenBucket's;
	// as a shaper (Store.Reserve, Store.Wait) each request is told how long to wait so that
	// requests leave at the constant leak rate.
	LeakyBucket
	// FixedWindow counts requests in windows aligned to multiples of Limit.Window since the
	// Unix epoch; its variants FixedWindowOn(Month) and FixedWindowOn(Year) count in
	// calendar months or years. Up to 2× the allowance can pass in a short span around a
	// window boundary.
	FixedWindow
	// SlidingLog keeps the admissions of the last Limit.Window, each as its time and its
	// number of hits, and admits a request only if no window of length Window ending now
	// would then hold more than the allowance. Exact up to MaxLogEntries admission times
	// per key (16 KiB); past them it coalesces, which can only deny more (see
	// MaxLogEntries).
	SlidingLog
	// GCRA is the generic cell rate algorithm: a theoretical arrival time (TAT) advanced by
	// the emission interval Window/Allowance per request, with a burst tolerance of
	// Capacity()−1 intervals. Its admissions equal a token bucket's of the same capacity
	// and rate (the two are dual views of one model); it needs one timestamp per key.
	GCRA
	// fixedWindowMonth and fixedWindowYear are FixedWindow on calendar months and years
	// (FixedWindowOn). They are algorithms of their own, rather than a field of Limit,
	// because a Limit of more than four fields is no longer kept in registers, which
	// slows every decision by a third.
	fixedWindowMonth
	fixedWindowYear
	// SlidingWindowEstimate is the classic sliding window counter (as Cloudflare describes
	// it): the count of the current aligned window plus the previous window's count
	// weighted by the part of the previous window that the sliding window still overlaps,
	// rounded down (3 + 5×0.7 = 6.5 counts as 6). It keeps two counts per key, the
	// cheapest window state, but takes the previous window's hits as spread evenly: hits
	// bunched at the end of one aligned window can let up to 2× the allowance through in
	// the sliding window that ends just before the next boundary, and a fresh key's first
	// sliding window up to (1 + φ)×, φ the part of its first aligned window gone at its
	// first hit.
	SlidingWindowEstimate
	numAlgorithms
)

// algorithms is the registration table: every Algorithm's name and in-process
// implementation, which lives in one file per algorithm (bucket.go for the TAT family,
// fixed_window.go, sliding_window.go, sliding_window_estimate.go, sliding_log.go). The Store and the parsers find an
// algorithm only through this table; package sitestore keeps the Redis side's.
var algorithms = [numAlgorithms]impl{
	SlidingWindow:         subBucketImpl,
	SlidingWindowEstimate: slidingWindowImpl,
	TokenBucket:           bucketImpl("token_bucket"),
	LeakyBucket:           bucketImpl("leaky_bucket"),
	FixedWindow:           fixedWindowImpl(Epoch),
	SlidingLog:            slidingLogImpl,
	GCRA:                  bucketImpl("gcra"),

	fixedWindowMonth: fixedWindowImpl(Month),
	fixedWindowYear:  fixedWindowImpl(Year),
}

// impl is one algorithm's in-process implementation: its state is a part of entry, and
// these functions are all that the Store knows of it. Called through this table, their
// pointer arguments escape as far as the compiler can tell, so they take the limit and the
// cost by value and only entries that are on the heap already (the Store's, or a shard's
// scratch copy): a decision allocates nothing.
type impl struct {
	// name is the algorithm's configuration name (rules' algorithm:).
	name string
	// bucket marks the TAT family: a request fits only up to Limit.Capacity(), and
	// Store.Reserve shapes with it.
	bucket bool
	// decide evaluates a request of n under l against e at now (unix ns) and, when commit
	// is set and the request fits, takes n. e is already adopted for it.
	decide func(e *entry, now int64, l Limit, n int64, commit bool) Decision
	// keep carries e's state over to l's allowance when only that changed (a rules
	// reload); nil when the state does not depend on the allowance.
	keep func(e *entry, l Limit)
	// undo takes n back out of e after an AllowAll that failed; saved is e as it was
	// before n was taken, with entry.noteUndo's record of what taking it did.
	undo func(e *entry, saved entry, n int64)
}

// String returns the configuration name of a, e.g. "token_bucket".
func (a Algorithm) String() string {
	if a < numAlgorithms {
		return algorithms[a].name
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// Names lists the configuration names of all algorithms, in declaration order (the
// calendar variants of FixedWindow share its name).
func Names() []string {
	var names []string
	for i := range algorithms {
		if !slices.Contains(names, algorithms[i].name) {
			names = append(names, algorithms[i].name)
		}
	}
	return names
}

// Algorithms lists every Algorithm, the calendar variants of FixedWindow included, in
// declaration order.
func Algorithms() []Algorithm {
	all := make([]Algorithm, numAlgorithms)
	for i := range all {
		all[i] = Algorithm(i)
	}
	return all
}

// ParseAlgorithm returns the Algorithm whose configuration name is s.
func ParseAlgorithm(s string) (Algorithm, error) {
	for i := range algorithms {
		if algorithms[i].name == s {
			return Algorithm(i), nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q", s)
}

// bucket reports whether a belongs to the TAT family (token bucket, leaky bucket, GCRA):
// its size is Limit.Capacity() rather than Limit.Allowance(), and it can shape traffic
// (Store.Reserve).
func (a Algorithm) bucket() bool { return a < numAlgorithms && algorithms[a].bucket }

// Never is the RetryAfter of a request that can never be admitted: its size exceeds the
// limit's capacity, or the limit admits nothing (Requests 0).
const Never = time.Duration(math.MaxInt64)

// Limit is one limit: Requests per Window, with the algorithm's parameters.
//
// The allowance actually enforced is Requests raised by SoftPercent (see Allowance); the
// bucket algorithms' capacity is Burst (raised the same way) or, when Burst is 0, the
// allowance (see Capacity).
type Limit struct {
	// Requests is the number of requests admitted per Window. 0 admits nothing.
	Requests int64
	// Window is the period of the limit. It must be positive.
	Window time.Duration
	// Burst is the capacity of TokenBucket, LeakyBucket and GCRA in requests; 0 means the
	// allowance. The window algorithms ignore it.
	Burst int64
	// SoftPercent raises the limit by this percentage, making it a soft limit: 10 admits
	// 110% of Requests. The extra is rounded down (10% of 7 is 0), so a soft limit is never
	// more generous than stated. 0 is a hard limit.
	SoftPercent int
}

// Allowance is the number of requests admitted per Window: Requests plus
// ⌊Requests × SoftPercent / 100⌋.
func (l Limit) Allowance() int64 { return soft(l.Requests, l.SoftPercent) }

// Capacity is the bucket size of TokenBucket, LeakyBucket and GCRA: Burst plus
// ⌊Burst × SoftPercent / 100⌋, or Allowance() when Burst is 0.
func (l Limit) Capacity() int64 {
	if l.Burst > 0 {
		return soft(l.Burst, l.SoftPercent)
	}
	return l.Allowance()
}

func soft(n int64, pct int) int64 {
	if pct <= 0 || n <= 0 {
		return n
	}
	extra := n / 100 * int64(pct)
	extra += n % 100 * int64(pct) / 100
	return n + extra
}

// Validate reports whether l can be enforced: Requests ≥ 0, Window > 0, Burst ≥ 0,
// SoftPercent ≥ 0, and the bucket capacity expressed as time (Capacity × Window /
// Allowance) below 2⁶² ns (about 146 years).
func (l Limit) Validate() error {
	switch {
	case l.Requests < 0:
		return fmt.Errorf("requests %d < 0", l.Requests)
	case l.Window <= 0:
		return fmt.Errorf("window %v ≤ 0", l.Window)
	case l.Burst < 0:
		return fmt.Errorf("burst %d < 0", l.Burst)
	case l.SoftPercent < 0:
		return fmt.Errorf("soft percent %d < 0", l.SoftPercent)
	}
	if a := l.Allowance(); a > 0 {
		if q, _, ok := exact.MulDiv(uint64(l.Capacity()), uint64(l.Window), uint64(a)); !ok || q >= 1<<62 {
			return fmt.Errorf("capacity %d over window %v at %d per window is too long", l.Capacity(), l.Window, a)
		}
	}
	return nil
}

// Op is one counter operation: take N from the counter Key under Limit with Algorithm.
//
// A counter is identified by Key alone: the Store keeps one state per key, and when a key is
// used with another Algorithm or Window its state restarts from empty (this happens only
// when rules change, since the counter keys of package rules include the window).
type Op struct {
	Key       string
	Algorithm Algorithm
	Limit     Limit
	// N is the request's cost in requests; 0 asks without taking anything.
	N int64
}

// Decision is the outcome of one Op.
type Decision struct {
	// Allowed reports whether the request fits. For a Peek it tells whether it would.
	Allowed bool
	// Limit is the number of requests the counter admits: Allowance() for the window
	// algorithms, Capacity() for the bucket algorithms.
	Limit int64
	// Remaining is how many requests of size 1 would still be admitted now, after this
	// request if it was admitted.
	Remaining int64
	// ResetAfter is the time until the counter is back to its empty state (window counters
	// zero, bucket full), assuming no other traffic.
	ResetAfter time.Duration
	// RetryAfter is 0 when Allowed; otherwise the exact time, rounded up to the nanosecond,
	// until a request of the same size would be admitted assuming no other traffic, or
	// Never.
	RetryAfter time.Duration
}
