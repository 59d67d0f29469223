// Package breaker is a small circuit breaker for calls to a dependency on the request path
// (Redis in the enforcer), so that a failing dependency costs one fast local decision per
// request instead of one timeout per request (docs/architecture.md, invariant 4).
//
// New makes a Breaker from Options; Allow asks whether a call may go, and Success,
// Failure or Cancel reports its outcome. It opens on an error rate over a window
// (Options.ErrorRate, Options.MinFailures, Options.Window) or on Options.Silence without an
// answer, and closes after Options.ProbeSuccesses successful probes in a row. Why a rate
// and not a run of failures, with the defaults: docs/redis.md, "Timeout and circuit
// breaker".
package breaker

import (
	"sync"
	"time"

	"github.com/streamlimit/streamlimit/clock"
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

// The defaults of Options, stated once.
const (
	DefaultWindow         = 10 * time.Second
	DefaultMinFailures    = 10
	DefaultErrorRate      = 0.5
	DefaultProbeInterval  = time.Second
	DefaultProbeSuccesses = 3
	DefaultSilence        = 500 * time.Millisecond
)

// buckets is the number of parts the error-rate window is kept in: the window slides by
// Window/buckets.
const buckets = 10

// Options configures a Breaker. Zero fields take the Default* constants.
type Options struct {
	// Window is the span over which the error rate is judged. Default DefaultWindow.
	Window time.Duration
	// MinFailures is the fewest failures within Window that can open the breaker.
	// Default DefaultMinFailures.
	MinFailures int
	// ErrorRate, in (0, 1], is the share of failed calls within Window at or above which
	// the breaker opens (given MinFailures). Default DefaultErrorRate.
	ErrorRate float64
	// ProbeInterval is how long the breaker stays open before it lets a probe through,
	// and how long a probe may stay unreported before another is allowed. Default
	// DefaultProbeInterval.
	ProbeInterval time.Duration
	// ProbeSuccesses is the number of successful probes in a row that close the breaker.
	// Default DefaultProbeSuccesses.
	ProbeSuccesses int
	// Silence opens a closed breaker, whatever the error rate, once no call has succeeded
	// for this long and at least MinFailures calls failed since the last success. It
	// should exceed the callers' timeout, so that calls that merely wait out one slow
	// spell do not open it. Default DefaultSilence.
	Silence time.Duration
	// Clock tells time. Default (nil): clock.Real{}.
	Clock clock.Clock
	// OnStateChange, if set, is called with the new state after every transition, with
	// the breaker's lock held: it must be quick and must not call the Breaker.
	OnStateChange func(State)
}

// Breaker is a circuit breaker. Its methods are safe for simultaneous use by multiple
// goroutines. Create it with New.
type Breaker struct {
	width     time.Duration // Window / buckets
	minFail   int
	rate      float64
	interval  time.Duration
	successes int
	silence   time.Duration
	clk       clock.Clock
	onChange  func(State)

	mu      sync.Mutex
	state   State
	ring    [buckets]bucket
	since   time.Time // when the breaker last opened or let a probe through
	probing bool      // a probe is in flight (HalfOpen)
	good    int       // successful probes in a row (HalfOpen)
	// lastOK is when a call last succeeded, or the breaker last closed or was made
	// (Closed); run counts the failures since then.
	lastOK time.Time
	run    int
}

// bucket holds the outcomes of one Window/buckets slice of time, numbered from the epoch.
type bucket struct {
	idx             int64
	calls, failures int
}

// New returns a closed Breaker.
func New(opts Options) *Breaker {
	if opts.Window <= 0 {
		opts.Window = DefaultWindow
	}
	if opts.MinFailures <= 0 {
		opts.MinFailures = DefaultMinFailures
	}
	if opts.ErrorRate <= 0 || opts.ErrorRate > 1 {
		opts.ErrorRate = DefaultErrorRate
	}
	if opts.ProbeInterval <= 0 {
		opts.ProbeInterval = DefaultProbeInterval
	}
	if opts.ProbeSuccesses <= 0 {
		opts.ProbeSuccesses = DefaultProbeSuccesses
	}
	if opts.Silence <= 0 {
		opts.Silence = DefaultSilence
	}
	b := &Breaker{
		width: max(opts.Window/buckets, time.Nanosecond), minFail: opts.MinFailures, rate: opts.ErrorRate,
		interval: opts.ProbeInterval, successes: opts.ProbeSuccesses, silence: opts.Silence, clk: clock.Or(opts.Clock), onChange: opts.OnStateChange,
	}
	b.lastOK = b.clk.Now()
	return b
}

// Allow reports whether a call may go to the dependency now, and whether it is a probe of
// a half-open breaker (a caller with state to restore before trusting the dependency
// again does so in the probe). When ok, the caller must report the call's outcome with
// Success, Failure or Cancel.
func (b *Breaker) Allow() (ok, probe bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case Closed:
		return true, false
	case HalfOpen:
		now := b.clk.Now()
		if b.probing && now.Sub(b.since) < b.interval {
			return false, false
		}
		b.since, b.probing = now, true
		return true, true
	default: // Open
		now := b.clk.Now()
		if now.Sub(b.since) < b.interval {
			return false, false
		}
		b.since, b.probing, b.good = now, true, 0
		b.set(HalfOpen)
		return true, true
	}
}

// Success reports a successful call. A closed breaker records it; a half-open one closes
// after ProbeSuccesses successful probes in a row.
func (b *Breaker) Success() {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case Closed:
		now := b.clk.Now()
		b.cur(now).calls++
		b.lastOK, b.run = now, 0
	case HalfOpen:
		b.probing = false
		b.good++
		if b.good >= b.successes {
			b.ring = [buckets]bucket{}
			b.lastOK, b.run = b.clk.Now(), 0
			b.set(Closed)
		}
	}
}

// Failure reports a failed call (an error or a timeout of the dependency). A closed
// breaker opens when the window's failures reach MinFailures and ErrorRate of its calls,
// or when MinFailures calls failed and none succeeded for Silence; a failed probe opens a
// half-open breaker again.
func (b *Breaker) Failure() {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clk.Now()
	switch b.state {
	case Closed:
		c := b.cur(now)
		c.calls++
		c.failures++
		b.run++
		calls, failures := b.totals(c.idx)
		if failures >= b.minFail && float64(failures) >= b.rate*float64(calls) ||
			b.run >= b.minFail && now.Sub(b.lastOK) >= b.silence {
			b.open(now)
		}
	case HalfOpen:
		b.open(now)
	}
}

// Cancel reports a call whose outcome says nothing about the dependency (the caller gave
// up first). A probe so ended frees its place for the next caller.
func (b *Breaker) Cancel() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == HalfOpen {
		b.probing = false
	}
}

// State returns the current state.
func (b *Breaker) State() State {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

func (b *Breaker) open(now time.Time) {
	b.since, b.probing, b.good = now, false, 0
	b.set(Open)
}

// cur returns the bucket of now, reset if it last held an older slice of time.
func (b *Breaker) cur(now time.Time) *bucket {
	idx := now.UnixNano() / int64(b.width)
	c := &b.ring[(idx%buckets+buckets)%buckets]
	if c.idx != idx {
		*c = bucket{idx: idx}
	}
	return c
}

// totals sums the buckets of the window that ends in bucket idx.
func (b *Breaker) totals(idx int64) (calls, failures int) {
	for i := range b.ring {
		if c := &b.ring[i]; c.idx > idx-buckets && c.idx <= idx {
			calls += c.calls
			failures += c.failures
		}
	}
	return calls, failures
}

func (b *Breaker) set(s State) {
	b.state = s
	if b.onChange != nil {
		b.onChange(s)
	}
}
