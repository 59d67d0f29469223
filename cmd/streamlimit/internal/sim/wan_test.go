package sim

import (
	"context"
	"strings"
	"testing"
)

// The multi-cluster test's clients on the simulator: the limit holds outside and inside the
// cut, clients under their limit are not refused outside it, and during the cut a client
// at one data center gets about half its limit (each side assumes the other spends its
// share).
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
		if r.Client == "failover-0" && r.Phase == "cut" && (r.Under() < 0.8 || r.Under() > 0.95) {
			t.Errorf("failover-0 in the cut: under %.3f, want about its share (0.8–0.95 with 0.6× offered)", r.Under())
		}
	}
}
