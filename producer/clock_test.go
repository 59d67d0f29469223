package producer

import (
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/clock"
)

// With the real clock, nowMs tells the wall clock's time from the monotonic clock: not
// earlier than a reading of the wall clock before it, nor later than one after it, but for
// the offset's error (under syncTolerance, so at most a millisecond once rounded), and it
// reads the wall clock again once its reading is resyncEvery old.
func TestMsClockFollowsWallClock(t *testing.T) {
	m := newMsClock(clock.Real{})
	if !m.real {
		t.Fatal("the real clock is not read through the monotonic clock")
	}
	for range 3 {
		synced := m.at.Load()
		for range 1000 {
			before := time.Now().UnixMilli()
			got := m.nowMs()
			after := time.Now().UnixMilli()
			if got < before-1 || got > after+1 {
				t.Fatalf("nowMs = %d, outside the wall clock's [%d, %d]", got, before, after)
			}
		}
		time.Sleep(resyncEvery)
		m.nowMs()
		if m.at.Load() == synced {
			t.Fatalf("no new reading of the wall clock after %v", resyncEvery)
		}
	}
}

// Any other clock is read as it is.
func TestMsClockReadsFakeClock(t *testing.T) {
	clk := clock.NewFake(time.UnixMilli(1_763_740_000_123))
	m := newMsClock(clk)
	if got := m.nowMs(); got != 1_763_740_000_123 {
		t.Fatalf("nowMs = %d", got)
	}
	clk.Advance(-2 * time.Hour)
	if got, want := m.nowMs(), clk.Now().UnixMilli(); got != want {
		t.Fatalf("nowMs = %d after a step back, want %d", got, want)
	}
	if floorDivNs(-1, 1_000_000) != -1 || floorDivNs(-1_000_000, 1_000_000) != -1 || floorDivNs(1_999_999, 1_000_000) != 1 {
		t.Fatal("floorDivNs does not round toward minus infinity")
	}
}
