//go:build !race

// A simulation is one goroutine's computation at scale: -race finds nothing in it and
// makes it ten times slower, so make test runs these tests in its first, race-free pass
// (their names contain "Sim"). sim_test.go keeps the parallel runs under -race.

package sim

import (
	"context"
	"encoding/xml"
	"strings"
	"testing"
)

// Under a load ramping past the pool's capacity, the pool is never over its capacity, free
// requests never fill more than their part, clients get elastic room while the pool is
// idle, and free requests are shed before paid ones once it is busy.
func TestTiersSimulation(t *testing.T) {
	c := TiersConfig{Clients: 300, Capacity: 1500, Windows: 6, To: 3}
	r, err := RunTiers(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := WriteTiersTable(&b, r); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + b.String())
	var svg strings.Builder
	if err := WriteTiersSVG(&svg, r); err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal([]byte(svg.String()), new(struct{})); err != nil {
		t.Fatalf("SVG is not well-formed XML: %v", err)
	}
	for _, id := range []string{`id="offered"`, `id="paid"`, `id="free"`, `id="capacity"`} {
		if !strings.Contains(svg.String(), id) {
			t.Errorf("SVG lacks %s", id)
		}
	}
	if len(r.Series) < 100 {
		t.Errorf("%d samples over the run, want one every 250 ms", len(r.Series))
	}
	if r.AggregatorErrors != 0 || r.SnapshotErrors != 0 {
		t.Fatalf("%d aggregator and %d snapshot errors", r.AggregatorErrors, r.SnapshotErrors)
	}
	for i, p := range r.Phases {
		if p.MaxRatio > 1.02 || p.FreeMax > 0.82 {
			t.Errorf("phase %d: pool at %.3f of its capacity (want ≤ 1.02), free at %.3f (want ≤ 0.82)", i, p.MaxRatio, p.FreeMax)
		}
	}
	idle, busy := r.Phases[0], r.Phases[len(r.Phases)-1]
	rate := func(p TierPhase, tier int) float64 {
		return float64(p.Admitted[tier]) / float64(max(p.Offered[tier], 1))
	}
	if rate(idle, 0) < 0.95 || idle.AboveBase == 0 {
		t.Errorf("idle pool: paid admitted %.3f of offered, %d beyond base: want nearly all, with elastic room", rate(idle, 0), idle.AboveBase)
	}
	if rate(busy, 1) > 0.05 || rate(busy, 0) < 0.4 || busy.MaxRatio < 0.9 {
		t.Errorf("busy pool: free admitted %.3f, paid %.3f of offered, pool at %.3f: want free shed first and the pool nearly full", rate(busy, 1), rate(busy, 0), busy.MaxRatio)
	}
}
