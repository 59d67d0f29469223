//go:build !race

// A simulation is one goroutine's computation at scale: -race finds nothing in it and
// makes it ten times slower, so make test runs these tests in its first, race-free pass
// (their names contain "Sim"). sim_test.go keeps the parallel runs under -race.

package sim

import (
	"context"
	"strings"
	"testing"
)

// The multi-cluster test's clients on the simulator: the limit holds outside and inside the
// cut, clients under their limit are not refused outside it, and during the cut a client
// that stays at one data center gets what it asks (the other side reserves for the cut one
// only its share of the keys it served, none of this client's).
func TestWANSimulation(t *testing.T) {
	rows, err := RunWAN(context.Background(), WANConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := WriteWANTable(&b, rows); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + b.String())
	if len(rows) != 7*3 {
		t.Fatalf("%d rows", len(rows))
	}
	for _, r := range rows {
		bound := 1.03
		if r.Phase == "cut" {
			bound = 1.06
		}
		if r.Over > bound {
			t.Errorf("%s, %s: over %.3f, want ≤ %.2f", r.Client, r.Phase, r.Over, bound)
		}
		if r.Phase != "cut" && r.Under() < 0.95 {
			t.Errorf("%s, %s: under %.3f, want ≥ 0.95", r.Client, r.Phase, r.Under())
		}
		if strings.HasPrefix(r.Client, "failover") && r.Phase == "cut" && r.Under() < 0.95 {
			t.Errorf("%s in the cut: under %.3f, want ≥ 0.95 (it stays at one data center, under its limit)", r.Client, r.Under())
		}
	}
}
