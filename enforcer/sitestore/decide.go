package sitestore

import (
	"github.com/streamlimit/streamlimit/enforcer/algo"
)

// The script decides Allowed atomically and reports each op's counter state; its
// algorithm's Go file turns that state into an algo.Decision through the same functions
// algo.Store decides with (algo.BucketDecision and the others), so the rules and their
// arithmetic (integer nanoseconds, exact rationals, the same rounding) are written once,
// in Go, where 128-bit intermediates are cheap, so Lua never needs them.

// opState is what the script reports for one op: whether it fits, and the counter's state
// as that op saw it (after the request's earlier ops), relative to now; what r1, r2 and
// r3 hold is up to the op's algorithm (its Go file's decide says).
type opState struct {
	allowed    bool
	r1, r2, r3 int64
}

// decide computes op's Decision at now (unix ns) from st (see siteAlgorithm.decide).
func decide(op *algo.Op, now int64, st opState, commit bool) algo.Decision {
	return siteAlgorithms[op.Algorithm].decide(op, now, st, commit)
}
