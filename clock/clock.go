// Package clock provides the time source that every streamlimit component takes, so that
// tests and the accuracy simulator can drive time deterministically through real code paths
// (docs/architecture.md, invariant 6).
package clock

import (
	"sync"
	"time"
)

// Clock tells the current time. Implementations must be safe for simultaneous use by
// multiple goroutines.
type Clock interface {
	Now() time.Time
}

// Real is the wall clock. Its zero value is ready to use.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// Or returns c, or Real{} when c is nil, so that options structs can leave the clock unset.
func Or(c Clock) Clock {
	if c == nil {
		return Real{}
	}
	return c
}

// Fake is a manually driven clock for tests and simulations. Time moves only through Set
// and Advance. A Fake is safe for simultaneous use by multiple goroutines.
type Fake struct {
	mu  sync.Mutex
	now time.Time
}

// NewFake returns a Fake clock that reads t until moved.
func NewFake(t time.Time) *Fake { return &Fake{now: t} }

// Now returns the fake current time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// Set moves the clock to t, which may be earlier than the current fake time.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	f.now = t
	f.mu.Unlock()
}

// Advance moves the clock forward by d and returns the new time.
func (f *Fake) Advance(d time.Duration) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	return f.now
}

// MaxSkew is the most a host's clock may be off true time for streamlimit's limits to
// hold as measured (docs/operations.md, "Clocks"): every host keeps its clock by NTP within
// ± this.
const MaxSkew = 500 * time.Millisecond

// MaxAhead is how far ahead of a reader's clock a record dated by another host's clock may
// be before the reader refuses it: twice MaxSkew, since two hosts each within MaxSkew of
// true time may be that far apart, one ahead and one behind. A record dated further ahead
// was not dated by a host within the bound (a forgery, or a clock that needs fixing),
// and one believed would stay in force until its date comes.
const MaxAhead = 2 * MaxSkew
