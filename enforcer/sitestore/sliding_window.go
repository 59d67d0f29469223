package sitestore

import (
	_ "embed"
	"time"

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

// decidedAt returns the instant ops, stamped now and admitted with decisions out, were
// counted at, in Redis or in process: now, or, for a sliding window, the start of a later
// sub-bucket a concurrent decision had already started, in which the request was decided
// and counted (algo.SubBuckets.Decides; the decision's ResetAfter tells which). A request
// that waited, e.g. behind a write back, or one decided in process after a call that timed
// out while others were not, is counted that much after its stamp.
func decidedAt(now time.Time, ops []algo.Op, out []algo.Decision) time.Time {
	at := now
	t := now.UnixNano()
	for i := range ops {
		if ops[i].Algorithm != algo.SlidingWindow || !out[i].Allowed || out[i].ResetAfter <= 0 {
			continue
		}
		g := algo.SubBucketsOf(ops[i].Limit.Window)
		// ResetAfter = Leaves(newest) − now, and an admitted request is the newest.
		newest := (t+int64(out[i].ResetAfter)-g.Window)/g.Width - 1
		if d := time.Unix(0, g.Decides(t, newest)); d.After(at) {
			at = d
		}
	}
	return at
}
