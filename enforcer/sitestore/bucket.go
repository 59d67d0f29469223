package sitestore

import (
	_ "embed"
	"fmt"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/internal/exact"
)

//go:embed bucket.lua
var bucketLua string

// bucketSite is the TAT family (token bucket, leaky bucket, GCRA) in Redis. The spans
// Capacity×Window/Allowance and N×Window/Allowance are computed here, exactly, so that
// Lua only adds and compares them.
var bucketSite = siteAlgorithm{
	lua: "bucket", src: bucketLua,
	args: func(args []any, _ int64, op *algo.Op) []any {
		a, c, w := op.Limit.Allowance(), op.Limit.Capacity(), int64(op.Limit.Window)
		var capT, sp exact.Time
		if a > 0 && c > 0 {
			capT, sp = exact.Span(c, w, a), exact.Span(op.N, w, a)
		}
		return append(args, capT.NS, capT.Rem, sp.NS, sp.Rem, 0)
	},
	// r1, r2 = max(TAT − now, 0) as ns and rem/allowance
	decide: func(op *algo.Op, _ int64, st opState, commit bool) algo.Decision {
		return algo.BucketDecision(time.Duration(st.r1), st.r2, op.Limit, op.N, commit)
	},
	check: func(lim algo.Limit) error {
		if err := nsWindow(lim); err != nil {
			return err
		}
		a, c := lim.Allowance(), lim.Capacity()
		if a > 0 && c > 0 && exact.Span(c, int64(lim.Window), a).NS >= maxExact {
			return fmt.Errorf("bucket capacity %d at %d per %v lasts longer than 2^52 ns", c, a, lim.Window)
		}
		return nil
	},
}
