package algo

import (
	"fmt"
	"time"

	"github.com/streamlimit/streamlimit/internal/exact"
)

// fixedWindowImpl registers FixedWindow on cal (its calendar variants share its name).
func fixedWindowImpl(cal Calendar) impl {
	return impl{
		name: "fixed_window",
		decide: func(e *entry, now int64, l Limit, n int64, commit bool) Decision {
			return e.fixed(now, l, cal, n, commit)
		},
		undo: func(e *entry, saved entry, _ int64) { e.windowState = saved.windowState },
	}
}

// windowState is the window algorithms' part of an entry: the count of the window that
// starts at start. (SlidingWindow keeps the previous window's count beside it.)
type windowState struct {
	start int64 // start of the current aligned window, unix ns
	cur   int64 // count in the current window
}

// Calendar says where a fixed window's windows start (FixedWindowOn).
type Calendar uint8

const (
	// Epoch windows start at multiples of Limit.Window since the Unix epoch: for windows of
	// a second, minute, hour or day these are the calendar's boundaries in UTC (a week's
	// start on Thursdays, as the epoch's).
	Epoch Calendar = iota
	// Month windows are the calendar months in UTC, each from the first of the month.
	Month
	// Year windows are the calendar years in UTC, each from January 1st.
	Year
)

var calendarNames = [...]string{Epoch: "epoch", Month: "month", Year: "year"}

// String returns c's name: "epoch", "month" or "year".
func (c Calendar) String() string {
	if int(c) < len(calendarNames) {
		return calendarNames[c]
	}
	return fmt.Sprintf("Calendar(%d)", uint8(c))
}

// FixedWindowOn returns the fixed window algorithm whose windows follow cal: FixedWindow
// for Epoch. Its variants are FixedWindow in every other respect, and named so.
func FixedWindowOn(cal Calendar) Algorithm {
	switch cal {
	case Month:
		return fixedWindowMonth
	case Year:
		return fixedWindowYear
	}
	return FixedWindow
}

// Calendar returns the calendar whose windows a counts in: Month or Year for the
// variants of FixedWindow (FixedWindowOn), else Epoch.
func (a Algorithm) Calendar() Calendar {
	switch a {
	case fixedWindowMonth:
		return Month
	case fixedWindowYear:
		return Year
	}
	return Epoch
}

// FixedBounds returns the start and the end (unix ns) of the fixed window of length w on
// cal that contains now: [k × w, (k+1) × w) since the Unix epoch, or the calendar month or
// year in UTC (w is then only the limit's nominal window).
func FixedBounds(now int64, w time.Duration, cal Calendar) (start, end int64) {
	switch cal {
	case Month, Year:
		t := time.Unix(0, now).UTC()
		y, m := t.Year(), t.Month()
		if cal == Year {
			m = time.January
		}
		first := time.Date(y, m, 1, 0, 0, 0, 0, time.UTC)
		next := first.AddDate(0, 1, 0)
		if cal == Year {
			next = first.AddDate(1, 0, 0)
		}
		return first.UnixNano(), next.UnixNano()
	}
	ws := windowStart(now, w)
	return ws, ws + int64(w)
}

// windowStart returns the start of the aligned window of length w containing now: the
// largest multiple of w (since the Unix epoch) at or before now. Both window algorithms
// count on this grid.
func windowStart(now int64, w time.Duration) int64 {
	return exact.FloorDiv(now, int64(w)) * int64(w)
}

// FixedDecision returns the Decision of a request of n under l for FixedWindow on cal at
// now, where cur is the count already taken in the window containing now (see
// FixedBounds).
//
// The request fits when cur + n ≤ l.Allowance(). ResetAfter is the time until the window
// ends, or 0 when its count (after the request, with take) is 0; RetryAfter is the time
// until the window ends, or Never when n exceeds the allowance.
func FixedDecision(now, cur int64, l Limit, cal Calendar, n int64, take bool) Decision {
	_, end := FixedBounds(now, l.Window, cal)
	return fixedDecision(now, end, cur, l, n, take)
}

// fixedDecision is FixedDecision with the window's end given.
func fixedDecision(now, end, cur int64, l Limit, n int64, take bool) Decision {
	a := l.Allowance()
	allowed := n <= a && cur+n <= a
	if allowed && take && n > 0 {
		cur += n
	}
	d := Decision{Allowed: allowed, Limit: max(a, 0), Remaining: max(a-cur, 0)}
	if cur > 0 {
		d.ResetAfter = time.Duration(end - now)
	}
	if !allowed {
		if n > a {
			d.RetryAfter = Never
		} else {
			d.RetryAfter = time.Duration(end - now)
		}
	}
	return d
}

func (e *entry) fixed(now int64, l Limit, cal Calendar, n int64, commit bool) Decision {
	ws, end := FixedBounds(now, l.Window, cal)
	cur := int64(0)
	switch {
	case e.start == ws:
		cur = e.cur
	case e.start > ws && e.cur > 0:
		// A request stamped before the window a concurrent caller already started (it
		// waited longer on its way here): it counts in that newer window, and never
		// starts the older one over, which would forget the newer one's count.
		ws, cur = e.start, e.cur
		_, end = FixedBounds(ws, l.Window, cal)
	}
	d := fixedDecision(now, end, cur, l, n, commit)
	if d.Allowed && commit && n > 0 {
		e.start, e.cur, e.expires = ws, cur+n, end
	}
	return d
}
