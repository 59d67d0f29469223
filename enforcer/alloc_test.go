//go:build !race

// Allocation counts are meaningless under -race, where sync.Pool drops items on purpose;
// make test runs this file in its first, race-free pass.

package enforcer

import (
	"context"
	"testing"
)

func TestDecideIntoDoesNotAllocate(t *testing.T) {
	l, _, _, _ := newGlobal(t, map[string]float64{"us": 1})
	l2, _ := newLimiter(t, localRules, nil)
	var res Result
	ctx := context.Background()
	l.DecideInto(ctx, req42, &res)
	l2.DecideInto(ctx, req42, &res)
	if a := testing.AllocsPerRun(200, func() { l.DecideInto(ctx, req42, &res) }); a != 0 {
		t.Errorf("global DecideInto: %v allocs/op", a)
	}
	if a := testing.AllocsPerRun(200, func() { l2.DecideInto(ctx, req42, &res) }); a != 0 {
		t.Errorf("local DecideInto: %v allocs/op", a)
	}
}
