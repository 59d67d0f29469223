//go:build !race

// A simulation is one goroutine's computation at scale: -race finds nothing in it and
// makes it ten times slower, so make test runs these tests in its first, race-free pass
// (their names contain "Sim"). sim_test.go keeps the parallel runs under -race.

package sim

import (
	"context"
	"testing"
)

// The data-center simulation holds every client near its limit across data centers,
// lets moved clients in at once, and bounds a partition; a partition taken for fresh (a
// site-stale bound longer than the cut) is caught by the same figures.
func TestDCSimulationBounds(t *testing.T) {
	ctx := context.Background()
	run := func(c DCConfig) DCResult {
		t.Helper()
		r, err := RunDC(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		// Across a cut, hits older than the aggregator's lateness when the link heals are
		// refused: that is the only scenario allowed aggregator errors.
		if (r.AggregatorErrors != 0 && c.Scenario != DCPartition) || r.SnapshotErrors != 0 {
			t.Fatalf("%s: %d aggregator and %d snapshot errors", c.Scenario, r.AggregatorErrors, r.SnapshotErrors)
		}
		t.Logf("%s: max %.3f admitted/oracle %.3f false %d behind %d of %d, moves %d", c.Scenario, r.MaxRatio, r.Ratio(), r.FalseLiteral, r.FalseBehind, r.Requests, len(r.MoveDelays))
		return r
	}
	for _, c := range []DCConfig{
		{Scenario: DCMix, Clients: 1000, Windows: 3},
		{Scenario: DCMigrating, Clients: 60, Windows: 3},
		{Scenario: DCBursty},
	} {
		r := run(c)
		if r.MaxRatio > 1.03 || r.Ratio() < 0.95 {
			t.Errorf("%s: max/limit %.3f (want ≤ 1.03), admitted/oracle %.3f (want ≥ 0.95)", c.Scenario, r.MaxRatio, r.Ratio())
		}
		if c.Scenario == DCMigrating {
			if len(r.MoveDelays) == 0 {
				t.Fatalf("migrating: no move measured")
			}
			if p50 := r.MoveDelays[len(r.MoveDelays)/2]; p50 > 300 {
				t.Errorf("migrating: a moved client waits %d ms (median) for its first admission, want ≤ one pipeline lag", p50)
			}
		}
	}
	phases := func(r DCResult) (cut, healed float64) {
		for _, p := range r.Phases {
			switch p.Name {
			case "during the cut":
				cut = p.MaxRatio
			case "after healing":
				healed = p.MaxRatio
			}
		}
		return cut, healed
	}
	part := DCConfig{Scenario: DCPartition, Clients: 40}
	cut, healed := phases(run(part))
	if cut > 1.05 || healed > 1.02 {
		t.Errorf("partition: max/limit %.3f during the cut (want ≤ 1.05), %.3f after healing (want ≤ 1.02)", cut, healed)
	}
	// Control: a cut that the sites cannot notice (their heartbeats still cross it while
	// their hits do not) is taken for idleness, and the bound breaks.
	part.heartbeatsCrossCuts = true
	if blind, _ := phases(run(part)); blind < 1.2 {
		t.Errorf("partition taken for fresh: max/limit %.3f during the cut, want well above the limit (the test would not see a broken bound)", blind)
	}
}

// A global token bucket (or GCRA) of burst B refilled at L per W is counted as at most B in
// any B/rate: with B = L that is the sliding window itself, decision for decision; a
// smaller burst is measured against the exact log of its own, shorter window.
func TestDCSimulationBucketAlgorithms(t *testing.T) {
	ctx := context.Background()
	base := DCConfig{Scenario: DCMigrating, Clients: 30, Windows: 2}
	sw, err := RunDC(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	for _, alg := range []string{"token_bucket", "gcra"} {
		c := base
		c.Algorithm, c.Burst = alg, base.Limit
		if c.Burst == 0 {
			c.Burst = 100
		}
		r, err := RunDC(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		if r.Admitted != sw.Admitted || r.OracleAdmitted != sw.OracleAdmitted || r.MaxRatio != sw.MaxRatio {
			t.Errorf("%s with burst = limit: admitted %d/%d max %.3f, sliding window %d/%d max %.3f", alg,
				r.Admitted, r.OracleAdmitted, r.MaxRatio, sw.Admitted, sw.OracleAdmitted, sw.MaxRatio)
		}
		c.Burst = 30
		small, err := RunDC(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		if small.OracleAdmitted >= sw.OracleAdmitted || small.MaxRatio > 1.5 {
			t.Errorf("%s with burst 30: oracle admitted %d (want fewer than the window's %d), max %.3f", alg, small.OracleAdmitted, sw.OracleAdmitted, small.MaxRatio)
		}
	}
	if _, err := RunDC(ctx, DCConfig{Scenario: DCBursty, Algorithm: "nope", Burst: 5}); err == nil {
		t.Fatal("unknown algorithm accepted")
	}
}
