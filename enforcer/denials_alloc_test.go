//go:build !race

// Allocation counts are meaningless under -race (see alloc_test.go).

package enforcer

import (
	"context"
	"testing"
)

// A denied decision allocates nothing, whether RecentDenials records it or not.
func TestDeniedDecisionDoesNotAllocate(t *testing.T) {
	l, clk := newLimiter(t, denialRules, nil)
	ctx := context.Background()
	req := userReq("1")
	var res Result
	l.DecideInto(ctx, req, &res)
	l.DecideInto(ctx, req, &res)
	recorded := func() { clk.Advance(denialSampleGap); l.DecideInto(ctx, req, &res) }
	if a := testing.AllocsPerRun(200, recorded); a != 0 {
		t.Errorf("denied and recorded: %v allocs/op", a)
	}
	if a := testing.AllocsPerRun(200, func() { l.DecideInto(ctx, req, &res) }); a != 0 {
		t.Errorf("denied within the sample gap: %v allocs/op", a)
	}
	if res.Code != CodeOverLimit || len(l.RecentDenials()) != 1 {
		t.Fatalf("code %v, %d recent denials: the test did not deny", res.Code, len(l.RecentDenials()))
	}
}
