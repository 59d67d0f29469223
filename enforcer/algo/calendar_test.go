package algo

import (
	"testing"
	"time"
)

func utc(y int, m time.Month, d, h, min, s int) time.Time {
	return time.Date(y, m, d, h, min, s, 0, time.UTC)
}

func TestFixedBounds(t *testing.T) {
	for _, c := range []struct {
		now        time.Time
		w          time.Duration
		cal        Calendar
		start, end time.Time
	}{
		{utc(2026, 1, 31, 23, 59, 59), 30 * 24 * time.Hour, Month, utc(2026, 1, 1, 0, 0, 0), utc(2026, 2, 1, 0, 0, 0)},
		{utc(2028, 2, 29, 12, 0, 0), 30 * 24 * time.Hour, Month, utc(2028, 2, 1, 0, 0, 0), utc(2028, 3, 1, 0, 0, 0)},
		{utc(2026, 12, 31, 23, 0, 0), 365 * 24 * time.Hour, Year, utc(2026, 1, 1, 0, 0, 0), utc(2027, 1, 1, 0, 0, 0)},
		{utc(2026, 11, 21, 13, 45, 10), time.Hour, Epoch, utc(2026, 11, 21, 13, 0, 0), utc(2026, 11, 21, 14, 0, 0)},
		{utc(2026, 11, 21, 13, 45, 10), 24 * time.Hour, Epoch, utc(2026, 11, 21, 0, 0, 0), utc(2026, 11, 22, 0, 0, 0)},
		// envoyproxy/ratelimit's month and year: 30 and 365 days since the epoch.
		{utc(2026, 1, 31, 23, 59, 59), 30 * 24 * time.Hour, Epoch, utc(2026, 1, 7, 0, 0, 0), utc(2026, 2, 6, 0, 0, 0)},
		{utc(2026, 11, 21, 0, 0, 0), 365 * 24 * time.Hour, Epoch, utc(2025, 12, 18, 0, 0, 0), utc(2026, 12, 18, 0, 0, 0)},
		// A week of the epoch starts on a Thursday, as envoyproxy/ratelimit's does.
		{utc(2026, 11, 21, 13, 45, 10), 7 * 24 * time.Hour, Epoch, utc(2026, 11, 19, 0, 0, 0), utc(2026, 11, 26, 0, 0, 0)},
	} {
		s, e := FixedBounds(c.now.UnixNano(), c.w, c.cal)
		if s != c.start.UnixNano() || e != c.end.UnixNano() {
			t.Errorf("FixedBounds(%v, %v %v) = %v … %v, want %v … %v", c.now, c.w, c.cal,
				time.Unix(0, s).UTC(), time.Unix(0, e).UTC(), c.start, c.end)
		}
	}
}

// A calendar month resets on the first of the month, not 30 days after some multiple of
// 30 days since the epoch; Retry-After and the reset are the boundary.
func TestCalendarMonthAcrossTheBoundary(t *testing.T) {
	s := New(Options{})
	l := Limit{Requests: 2, Window: 30 * 24 * time.Hour}
	op := Op{Key: "k", Algorithm: FixedWindowOn(Month), Limit: l, N: 1}
	jan := utc(2026, 1, 31, 23, 59, 58)
	for i := range 2 {
		if d := s.Allow(jan, op); !d.Allowed || d.ResetAfter != 2*time.Second {
			t.Fatalf("request %d on Jan 31st: %+v, want admitted, reset in 2s", i, d)
		}
	}
	d := s.Allow(jan.Add(time.Second), op)
	if d.Allowed || d.RetryAfter != time.Second || d.ResetAfter != time.Second {
		t.Fatalf("3rd in January: %+v, want denied, retry and reset at Feb 1st (1s)", d)
	}
	feb := utc(2026, 2, 1, 0, 0, 0)
	d = s.Allow(feb, op)
	if !d.Allowed || d.Remaining != 1 {
		t.Fatalf("first on Feb 1st: %+v, want admitted with 1 remaining", d)
	}
	if want := 28 * 24 * time.Hour; d.ResetAfter != want {
		t.Fatalf("reset on Feb 1st = %v, want %v (Mar 1st)", d.ResetAfter, want)
	}
	// The same limit on the epoch's grid of 30 days has no boundary there.
	op.Key, op.Algorithm = "e", FixedWindow
	for range 2 {
		s.Allow(jan, op)
	}
	if d := s.Allow(feb, op); d.Allowed {
		t.Fatalf("epoch-aligned 30 days reset at Feb 1st: %+v", d)
	}
}

func TestCalendarYearAcrossTheBoundary(t *testing.T) {
	s := New(Options{})
	op := Op{Key: "k", Algorithm: FixedWindowOn(Year), Limit: Limit{Requests: 1, Window: 365 * 24 * time.Hour}, N: 1}
	if !s.Allow(utc(2027, 12, 31, 23, 0, 0), op).Allowed {
		t.Fatal("first of 2027 denied")
	}
	if d := s.Allow(utc(2027, 12, 31, 23, 30, 0), op); d.Allowed || d.RetryAfter != 30*time.Minute {
		t.Fatalf("second of 2027: %+v, want denied until New Year (30m)", d)
	}
	if !s.Allow(utc(2028, 1, 1, 0, 0, 0), op).Allowed {
		t.Fatal("first of 2028 denied")
	}
}
