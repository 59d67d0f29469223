package sitestore

import (
	_ "embed"
	"strconv"

	"github.com/streamlimit/streamlimit/enforcer/algo"
)

//go:embed sliding_window_estimate.lua
var slidingWindowEstimateLua string

// slidingWindowEstimateSite is the two-count sliding window estimate in Redis. Its
// weighted estimate is compared exactly in Lua with 24-bit limbs (mulcmp in script.lua).
var slidingWindowEstimateSite = siteAlgorithm{
	lua: "sliding_window_estimate", src: slidingWindowEstimateLua,
	args: func(args []any, now int64, op *algo.Op) []any {
		w := int64(op.Limit.Window)
		ws, _ := algo.FixedBounds(now, op.Limit.Window, algo.Epoch) // the grid algo counts on
		return append(args, strconv.FormatInt(ws, 10), strconv.FormatInt(ws-w, 10), ws+w-now, w, ceilMs(ws+2*w-now))
	},
	check: nsWindow,
	// r1, r2 = counts in the current and previous window
	decide: func(op *algo.Op, now int64, st opState, commit bool) algo.Decision {
		return algo.SlidingDecision(now, st.r1, st.r2, op.Limit, op.N, commit)
	},
}
