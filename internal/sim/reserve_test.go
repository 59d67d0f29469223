//go:build !race

// A simulation is one goroutine's computation at scale: -race finds nothing in it and
// makes it ten times slower, so make test runs these tests in its first, race-free pass
// (their names contain "Sim"). sim_test.go keeps the parallel runs under -race.

package sim

import (
	"context"
	"runtime"
	"testing"
)

// The reserve rule (a site keeps back for the others their spend within the lag, not a
// share of the room) at full size, seeds 1–6, every scenario of `streamlimit sim dc`. The
// targets are max/limit ≤ 1.02 (≤ 1.05 across a cut), false 429s of clients under their
// limit ≤ 0.05% in the mix and in each churn scenario, of migrating clients ≤ 0.5%. Not all
// are met: each bound below is the worst of the six seeds as measured (to the hundredth
// above), so that none can regress, and the target it misses is beside it
// (docs/accuracy.md, "The reserve rule" and "The serving span").
//
// The reserve rule before the serving span (every data center that served a key in the
// window kept this site's rate of it) gave, over the same seeds, under-limit false 429s of
// 0.15–0.24% in the mix, 0.15–0.62% in rolling, 0.12–0.33% in autoscale, 0.04–0.51% in
// crash, 0.12–0.26% in leave and 0.16–0.62% in rename, migrating clients 0.27–0.42% in the
// mix and 2.63–2.97% in the migrating scenario, and rename's worst client 1.03 (1.04 now,
// seed 2). The share rule before that: 0.41–0.64% in the mix, 0.82–1.61% in rolling.
func TestDCSimulationReserveSeeds(t *testing.T) {
	type bound struct {
		max, under, migrating float64 // max/limit, and false 429s in percent (−1: none)
	}
	bounds := map[DCScenario]bound{
		DCMix:       {1.03, 0.20, 0.35}, // targets 1.02, 0.05%, 0.5%: max and under-limit MISSED
		DCMigrating: {1.02, 0.41, 2.89}, // target 0.5% of migrating clients: MISSED
		DCFailover:  {1.02, 0.34, -1},
		DCPartition: {1.02, 0.00, -1}, // across a cut: 1.05
		DCSkewedCut: {1.05, -1, -1},
		DCJitter:    {1.02, 0.13, 0.43},
		DCBursty:    {1.03, -1, -1},
		DCRolling:   {1.05, 0.32, 0.82}, // churn: targets 1.02, 0.05%, 0.5%, all MISSED
		DCAutoscale: {1.05, 0.19, 0.59},
		DCCrash:     {1.04, 0.40, 0.85},
		DCLeave:     {1.04, 0.18, 0.59},
		DCRename:    {1.04, 0.44, 0.69},
	}
	ctx := context.Background()
	for seed := uint64(1); seed <= 6; seed++ {
		rs, err := RunDCScenarios(ctx, DCConfig{Seed: seed}, DCScenarios(), runtime.GOMAXPROCS(0))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			sc := r.Config.Scenario
			b, ok := bounds[sc]
			if !ok {
				t.Fatalf("scenario %s has no bound", sc)
			}
			under, mig := percentOf(r.UnderFalse, r.UnderRequests), percentOf(r.MigratingFalse, r.MigratingRequests)
			t.Logf("seed %d %s: max/limit %.2f, false 429s under limit %.2f%%, migrating %.2f%%", seed, sc, r.MaxRatio, under, mig)
			if r.MaxRatio > b.max+1e-9 {
				t.Errorf("seed %d %s: max/limit %.2f, want ≤ %.2f", seed, sc, r.MaxRatio, b.max)
			}
			if b.under >= 0 && under > b.under {
				t.Errorf("seed %d %s: clients under their limit denied %.2f%% of their requests, want ≤ %.2f%%", seed, sc, under, b.under)
			}
			if b.migrating >= 0 && mig > b.migrating {
				t.Errorf("seed %d %s: migrating clients denied %.2f%% of their requests, want ≤ %.2f%%", seed, sc, mig, b.migrating)
			}
		}
	}
}
