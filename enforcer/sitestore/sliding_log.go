package sitestore

import (
	_ "embed"
	"fmt"

	"github.com/streamlimit/streamlimit/enforcer/algo"
)

//go:embed sliding_log.lua
var slidingLogLua string

// maxLogAllowance bounds a site sliding log's allowance: Redis keeps one list entry per
// admitted hit.
const maxLogAllowance = 1 << 16

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
	check: func(lim algo.Limit) error {
		if err := nsWindow(lim); err != nil {
			return err
		}
		if a := lim.Allowance(); a > maxLogAllowance {
			return fmt.Errorf("sliding_log allowance %d is over site scope's %d", a, maxLogAllowance)
		}
		return nil
	},
}
