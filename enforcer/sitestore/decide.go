package sitestore

import (
	"time"

	"github.com/streamlimit/streamlimit/enforcer/algo"
)

// This file turns the state a script reports for an op into an algo.Decision through the
// same functions algo.Store decides with (algo.BucketDecision and the others), so the rules
// and their arithmetic (integer nanoseconds, exact rationals, the same rounding) are
// written once. The script decides Allowed atomically; everything else is computed here,
// in Go, where 128-bit intermediates are cheap, so Lua never needs them.

// opState is what the script reports for one op: whether it fits, and the counter's state
// as that op saw it (after the request's earlier ops), relative to now.
//
//	bucket family: r1, r2 = max(TAT − now, 0) as ns and rem/allowance
//	fixed window:  r1 = count in the current window
//	sliding:       r1, r2 = counts in the current and previous window
//	sliding log:   r1 = live timestamps, r2 = newest − now, r3 = (the j-th oldest) − now
//	               where j = r1 + n − allowance, when denied
type opState struct {
	allowed    bool
	r1, r2, r3 int64
}

func isBucket(a algo.Algorithm) bool {
	return a == algo.TokenBucket || a == algo.LeakyBucket || a == algo.GCRA
}

// decide computes op's Decision at now (unix ns) from st with algo's own decision
// functions; with commit, an admitted op's own take is reflected in Remaining and
// ResetAfter.
func decide(op *algo.Op, now int64, st opState, commit bool) algo.Decision {
	switch op.Algorithm {
	case algo.TokenBucket, algo.LeakyBucket, algo.GCRA:
		return algo.BucketDecision(time.Duration(st.r1), st.r2, op.Limit, op.N, commit)
	case algo.FixedWindow:
		return algo.FixedDecision(now, st.r1, op.Limit, op.N, commit)
	case algo.SlidingLog:
		return algo.SlidingLogDecision(st.r1, st.r2, st.r3, op.Limit, op.N, commit)
	default: // SlidingWindow
		return algo.SlidingDecision(now, st.r1, st.r2, op.Limit, op.N, commit)
	}
}
