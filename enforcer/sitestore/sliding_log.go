package sitestore

import (
	_ "embed"

	"github.com/streamlimit/streamlimit/enforcer/algo"
)

//go:embed sliding_log.lua
var slidingLogLua string

// slidingLogSite is the sliding window log in Redis: a list of admission times, each with
// its number of hits, beside the counter's hash (sliding_log.lua says how they are kept).
// It keeps at most algo.MaxLogEntries entries and coalesces past them as the in-process
// log does, so that both stores decide alike.
var slidingLogSite = siteAlgorithm{
	lua: "sliding_log", src: slidingLogLua,
	args: func(args []any, _ int64, op *algo.Op) []any {
		w := int64(op.Limit.Window)
		return append(args, w, ceilMs(w), algo.MaxLogEntries, 0, 0)
	},
	// r1 = hits in the window, r2 = newest − now, r3 = (the j-th oldest) − now where j = r1 + n −
	// allowance, when denied
	decide: func(op *algo.Op, _ int64, st opState, commit bool) algo.Decision {
		return algo.SlidingLogDecision(st.r1, st.r2, st.r3, op.Limit, op.N, commit)
	},
	// Its entries, not its allowance, bound a log's size: any allowance in the shared
	// range is kept in Redis.
	check: nsWindow,
}
