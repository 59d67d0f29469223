package producer

import (
	"sync/atomic"
	"time"

	"github.com/streamlimit/streamlimit/clock"
)

// msClock tells the Producer's time in unix milliseconds, as Hit needs it on every call.
// With the real clock it reads only the monotonic clock and adds the wall clock's offset
// from it, taken from a full reading at most resyncEvery ago: time.Now reads both clocks,
// and on virtual machines each read costs tens of nanoseconds, half of a Hit. A change of
// the wall clock (a step, or the slewing of time synchronisation) reaches the Producer
// within resyncEvery. Any other clock (a fake one in tests) is read as it is, every time.
type msClock struct {
	c    clock.Clock
	real bool
	base time.Time    // a reading of the real clock, with its monotonic part
	off  atomic.Int64 // unix ns − ns since base, at the last full reading
	at   atomic.Int64 // ns since base of the last full reading
}

// resyncEvery is how old the wall clock's offset may be before Hit reads the wall clock again.
const resyncEvery = 10 * time.Millisecond

// syncTolerance bounds the error of the wall clock's offset: time.Now reads the wall clock
// and then the monotonic one, and a thread descheduled between the two (on a busy machine,
// for milliseconds) pairs a wall time with a later monotonic time. A reading is taken only
// when the monotonic clock read just before it is within syncTolerance of its own.
const syncTolerance = 100 * time.Microsecond

func newMsClock(c clock.Clock) *msClock {
	m := &msClock{c: c}
	if _, ok := c.(clock.Real); ok {
		m.real = true
		m.base = time.Now()
		m.off.Store(m.base.UnixNano())
		m.at.Store(-int64(resyncEvery)) // if sync cannot take a reading, nowMs tries again
		m.sync()
	}
	return m
}

// nowMs returns the current time in unix milliseconds.
func (m *msClock) nowMs() int64 {
	if !m.real {
		return m.c.Now().UnixMilli()
	}
	d := int64(time.Since(m.base))
	if d-m.at.Load() >= int64(resyncEvery) {
		m.sync()
	}
	return floorDivNs(d+m.off.Load(), int64(time.Millisecond))
}

// sync takes the wall clock's offset from a reading of both clocks, trying a few times for
// one whose two parts are close enough (syncTolerance); when none is, the offset stays as it
// was and the next nowMs tries again.
func (m *msClock) sync() {
	for range 3 {
		before := int64(time.Since(m.base))
		t := time.Now()
		after := int64(t.Sub(m.base)) // the monotonic part of the same reading
		if after-before > int64(syncTolerance) {
			continue
		}
		// The wall clock was read between before and after.
		m.off.Store(t.UnixNano() - (before+after)/2)
		m.at.Store(after)
		return
	}
}

// floorDivNs divides rounding toward minus infinity, as UnixMilli does.
func floorDivNs(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
