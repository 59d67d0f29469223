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
