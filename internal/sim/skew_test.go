//go:build !race

// Simulations at full size, in make test's race-free pass (their names contain "Sim"); see
// reserve_test.go.

package sim

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/clock"
)

// Clocks off true time, every scenario of `streamlimit sim dc` at full size, seeds 1–3:
// each data center's aggregator and enforcer process off by an offset spread within ±D
// (DCConfig.ClockSkew). The target is every scenario within the bounds it keeps with right
// clocks (1.02, a cut 1.05) with every clock within clock.MaxSkew (±500 ms) of true time.
// It is MISSED: each bound below is the worst of seeds 1–6 as measured, so that none can
// regress (the test runs three of them: three take about two minutes of CPU, all six twice
// that, in a unit tier held to minutes), and docs/operations.md ("Clocks") has the
// figures and their causes. Within ±20 ms every scenario holds 1.06. Within ±500 ms two
// hosts may be a second apart, which records are taken within (clock.MaxAhead): no
// process's CheckClock may fail, or it would be taken out of service and, here, decide
// alone on its own share. The aggregators re-date every site's hits into their own clocks
// by the offsets they estimate (aggregator/skew.go), and each estimate must be within
// maxEstimateErr of the true offset (measured: up to 94 ms at ±20 ms, the jitter scenario's
// ±100 ms links, 65 ms at ±500 ms: the simulator's streams deliver in order, so a heartbeat
// waits behind records whose delay drew more jitter, and the least delays then differ
// between the two directions with their loads); every scenario but the bursty client, seed 1's
// partition and seed 3's crash then holds 1.05. What remains is each data center's
// processes against their aggregator, whose clocks the enforcers decide by. The
// under-limit false 429s are logged, to set beside those without skew
// (TestDCSimulationReserveSeeds).
func TestDCSimulationClockSkewSeeds(t *testing.T) {
	const maxEstimateErr = 100 * time.Millisecond
	for _, tc := range []struct {
		skew   time.Duration
		bounds map[DCScenario]float64
	}{
		{20 * time.Millisecond, map[DCScenario]float64{
			DCMix: 1.03, DCMigrating: 1.02, DCFailover: 1.01, DCPartition: 1.02, DCSkewedCut: 1.04, DCJitter: 1.03,
			DCBursty:  1.04, // target 1.02: MISSED
			DCRolling: 1.06, DCAutoscale: 1.04, DCCrash: 1.04, DCLeave: 1.03, DCRename: 1.05,
		}},
		{500 * time.Millisecond, map[DCScenario]float64{ // target 1.02 (cuts 1.05): MISSED but for skewed-cut
			DCMix: 1.05, DCMigrating: 1.03, DCFailover: 1.02, DCPartition: 1.08, DCSkewedCut: 1.05, DCJitter: 1.03,
			DCBursty: 1.23, DCRolling: 1.05, DCAutoscale: 1.05, DCCrash: 1.06, DCLeave: 1.05, DCRename: 1.05,
		}},
	} {
		worst := map[DCScenario]float64{}
		for seed := uint64(1); seed <= 3; seed++ {
			rs, err := RunDCScenarios(context.Background(), DCConfig{Seed: seed, ClockSkew: tc.skew}, DCScenarios(), runtime.GOMAXPROCS(0))
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rs {
				sc := r.Config.Scenario
				worst[sc] = max(worst[sc], r.MaxRatio)
				t.Logf("±%v seed %d %s: max/limit %.2f, false 429s under limit %.2f%%; %s", tc.skew, seed, sc, r.MaxRatio,
					percentOf(r.UnderFalse, r.UnderRequests), r.clockLine())
				if b, ok := tc.bounds[sc]; !ok {
					t.Fatalf("scenario %s has no bound", sc)
				} else if r.MaxRatio > b+1e-9 {
					t.Errorf("±%v seed %d %s: max/limit %.2f, want ≤ %.2f", tc.skew, seed, sc, r.MaxRatio, b)
				}
				for _, c := range r.Clocks {
					if c.Unready > 0 {
						t.Errorf("±%v seed %d %s: %s (%v off) unready at %d of %d samples, with every clock within ±%v",
							tc.skew, seed, sc, c.Site, c.Offset, c.Unready, c.Checks, clock.MaxSkew)
					}
					// Every aggregator estimates every process's clock (its lowest lag, and for
					// another data center's, the link's delay from the lag reports), and the
					// estimates are what the records are re-dated by.
					if c.Estimated == 0 || c.EstimateErr > maxEstimateErr {
						t.Errorf("±%v seed %d %s: %s (%v off): %d estimates, off by up to %v, want some, within %v",
							tc.skew, seed, sc, c.Site, c.Offset, c.Estimated, c.EstimateErr, maxEstimateErr)
					}
				}
			}
		}
		for _, sc := range DCScenarios() {
			if target := map[bool]float64{false: 1.02, true: 1.05}[sc == DCPartition || sc == DCSkewedCut]; worst[sc] > target {
				t.Logf("±%v %s: max/limit %.2f: target %.2f MISSED", tc.skew, sc, worst[sc], target)
			}
		}
	}
}

// A site whose clock is 2 s off is reported by its own processes' skew meters, and by no
// other process's: 2 s behind, the heartbeats it reads are dated ahead of it (ClockSkew's
// behind); 2 s ahead, the aggregators refuse its heartbeats as dated ahead and it is
// counted but never listed. Either way CheckClock fails, which takes it out of service.
func TestSimClockOffSiteReported(t *testing.T) {
	for _, off := range []time.Duration{-2 * time.Second, 2 * time.Second} {
		r, err := RunDC(context.Background(), DCConfig{Scenario: DCMix, Clients: 300, Windows: 2, Seed: 1,
			ClockOffsets: []time.Duration{0, 0, off}})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("site %v off: %s", off, r.clockLine())
		for _, c := range r.Clocks {
			off := strings.HasPrefix(c.Site, "dc3")
			switch {
			case c.Checks == 0:
				t.Errorf("%s: never sampled", c.Site)
			case off && c.Unready < c.Checks-1:
				t.Errorf("%s, %v off: unready at %d of %d samples, want all (but the first)", c.Site, c.Offset, c.Unready, c.Checks)
			case !off && c.Unready > 0:
				t.Errorf("%s, clock right: unready at %d of %d samples", c.Site, c.Unready, c.Checks)
			}
			if off && c.Offset < 0 && c.Behind < 1900*time.Millisecond {
				t.Errorf("%s, 2 s behind: the meter shows %v behind", c.Site, c.Behind)
			}
		}
	}
}
