package sitestore

import (
	_ "embed"

	"github.com/streamlimit/streamlimit/enforcer/algo"
)

//go:embed sliding_window.lua
var slidingWindowLua string

// slidingWindowSite is the sub-bucket sliding window in Redis: algo.SubBuckets' grid,
// whose indices (unix ms over a sub-bucket's width, below 2^53) Go computes, so that Lua
// only compares, adds and keeps the sub-buckets with hits.
var slidingWindowSite = siteAlgorithm{
	lua: "sliding_window", src: slidingWindowLua,
	args: func(args []any, now int64, op *algo.Op) []any {
		g := algo.SubBucketsOf(op.Limit.Window)
		ic := g.Bucket(now)
		return append(args, ic, g.Oldest(now), g.Width/1e6, ceilMs(g.Leaves(ic)-now), g.Slots-1)
	},
	check: nsWindow,
	// r1 = the count, r2 and r3 = the newest sub-bucket with hits and the one the count
	// holds count + n − allowance hits by, as offsets from the one holding now
	decide: func(op *algo.Op, now int64, st opState, commit bool) algo.Decision {
		g := algo.SubBucketsOf(op.Limit.Window)
		ic := g.Bucket(now)
		at := ic
		if st.r1 > 0 {
			at = max(ic, ic+st.r2)
		}
		return algo.SubBucketDecision(g, now, st.r1, ic+st.r2, ic+st.r3, at, op.Limit, op.N, commit)
	},
}
