package sitestore

import (
	_ "embed"
	"strconv"

	"github.com/streamlimit/streamlimit/enforcer/algo"
)

//go:embed fixed_window.lua
var fixedWindowLua string

// fixedWindowSite is the fixed window on cal in Redis. The window's bounds (calendar ones
// included) come from algo.FixedBounds, so Lua only compares the start and sets the TTL
// in milliseconds: the counter's hash expires when its window has ended (plus the
// slack). Lua does no arithmetic on the window in nanoseconds, so windows longer than 2^52
// ns (a year) are kept in Redis too.
func fixedWindowSite(cal algo.Calendar) siteAlgorithm {
	return siteAlgorithm{
		lua: "fixed_window", src: fixedWindowLua,
		args: func(args []any, now int64, op *algo.Op) []any {
			ws, end := algo.FixedBounds(now, op.Limit.Window, cal)
			_, next := algo.FixedBounds(end, op.Limit.Window, cal)
			return append(args, strconv.FormatInt(ws, 10), ceilMs(end-now), ceilMs(next-end), 0, 0)
		},
		// r1 = count in the current window
		decide: func(op *algo.Op, now int64, st opState, commit bool) algo.Decision {
			return algo.FixedDecision(now, st.r1, op.Limit, cal, op.N, commit)
		},
	}
}
