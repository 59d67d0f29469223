// Package breaker is a small circuit breaker for calls to a dependency on the request path
// (Redis in the enforcer), so that a failing dependency costs one fast local decision per
// request instead of one timeout per request (DESIGN invariant 4).
//
// The model: Closed lets every call through and counts consecutive failures; after
// Options.FailureThreshold of them, or at once on a failure reported as a trip (a timeout),
// it opens. Open lets nothing through. Once Options.ProbeInterval has passed since it
// opened, the next Allow is let through as a single probe and the breaker is HalfOpen; the
// probe's Success closes it, its Failure opens it again for another interval. A probe whose
// outcome is never reported is replaced by a new one after another ProbeInterval, so a lost
// report cannot wedge the breaker.
package breaker

import (
	"sync"
	"time"

	"github.com/streamlimit/streamlimit/internal/clock"
)

// State is the breaker's state. The numeric values are what the enforcer exports as a gauge.
type State int

const (
	// Closed: calls go through.
	Closed State = 0
	// Open: calls are refused until the probe interval has passed.
	Open State = 1
	// HalfOpen: one probe call is in flight; others are refused.
	HalfOpen State = 2
)

// String returns "closed", "open" or "half-open".
func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half-open"
	}
	return "unknown"
}

// Options configures a Breaker.
type Options struct {
	// FailureThreshold is the number of consecutive failures that opens the breaker.
	// Default (0): 5.
	FailureThreshold int
	// ProbeInterval is how long the breaker stays open before it lets one probe through,
	// and how long a probe may stay unreported before another is allowed. Default (0): 1 s.
	ProbeInterval time.Duration
	// Clock tells time. Default (nil): clock.Real{}.
	Clock clock.Clock
	// OnStateChange, if set, is called with the new state after every transition, with
	// the breaker's lock held: it must be quick and must not call the Breaker.
	OnStateChange func(State)
}

// Breaker is a circuit breaker. Its methods are safe for simultaneous use by multiple
// goroutines. Create it with New.
type Breaker struct {
	threshold int
	interval  time.Duration
	clk       clock.Clock
	onChange  func(State)

	mu       sync.Mutex
	state    State
	failures int       // consecutive failures while Closed
	since    time.Time // when the breaker last opened or let a probe through
}

// New returns a closed Breaker.
func New(opts Options) *Breaker {
	if opts.FailureThreshold <= 0 {
		opts.FailureThreshold = 5
	}
	if opts.ProbeInterval <= 0 {
		opts.ProbeInterval = time.Second
	}
	return &Breaker{threshold: opts.FailureThreshold, interval: opts.ProbeInterval, clk: clock.Or(opts.Clock), onChange: opts.OnStateChange}
}

// Allow reports whether a call may go to the dependency now. When it returns true the
// caller must report the call's outcome with Success or Failure.
func (b *Breaker) Allow() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case Closed:
		return true
	default: // Open, or HalfOpen with a probe that may have been lost
		now := b.clk.Now()
		if now.Sub(b.since) < b.interval {
			return false
		}
		b.since = now
		b.set(HalfOpen)
		return true
	}
}

// Success reports a successful call: the breaker closes and the failure count restarts.
func (b *Breaker) Success() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures = 0
	if b.state != Closed {
		b.set(Closed)
	}
}

// Failure reports a failed call. trip opens the breaker at once (use it for timeouts: a
// dependency that is slow hurts every request); otherwise the breaker opens after
// FailureThreshold consecutive failures. A failed probe reopens it.
func (b *Breaker) Failure(trip bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures++
	if b.state == Closed && !trip && b.failures < b.threshold {
		return
	}
	b.failures = 0
	b.since = b.clk.Now()
	if b.state != Open {
		b.set(Open)
	}
}

// State returns the current state.
func (b *Breaker) State() State {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

func (b *Breaker) set(s State) {
	b.state = s
	if b.onChange != nil {
		b.onChange(s)
	}
}
