package enforcer

import (
	"math"
	"testing"
)

// The idle room of a key served at one data center of three: the part of the room the
// shares give the two others, which show neither a count nor a request of demand, beyond
// MinShare each — never more than the whole room leaves beyond this data center's share;
// a data center that shows a count or a request of demand keeps its share whole.
func TestIdleRoomIsTheIdleDataCentersPrior(t *testing.T) {
	g := sharing{site: "a", minShare: 0.05, damping: 0.15, prior: 0.05}
	const allowance = 1200.0
	views := func(bCount, cDemand float64) []siteView {
		return []siteView{
			{site: "a", count: 500, hold: 500, demand: 96, group: 0},
			{site: "b", count: bCount, hold: bCount, group: 1},
			{site: "c", demand: cDemand, group: 2},
		}
	}
	// The shares as allot documents them: weights by demand plus the prior, at least
	// MinShare, damped.
	share := func(d, total float64) float64 {
		f := (d + g.prior*allowance/3) / (total + g.prior*allowance)
		return f / (1 + g.damping*(1-f))
	}
	room := allowance - 500
	a, idle := g.allot(views(0, 0.5), allowance, 0, false, nil, 0, nil, 0)
	want := 2 * (share(0, 96.5) - g.minShare) * room
	want += (share(0.5, 96.5) - share(0, 96.5)) * room
	if math.Abs(idle-want) > 1e-9 {
		t.Errorf("idle room %.3f, want %.3f", idle, want)
	}
	if idle <= 0 || a.dcTop+idle > a.top+1e-9 {
		t.Errorf("idle room %.3f beside this data center's top %.3f: beyond the whole room's %.3f", idle, a.dcTop, a.top)
	}
	// b has served the key (a count), c asks for a request: neither is idle.
	for _, tc := range []struct {
		name            string
		bCount, cDemand float64
	}{{"b counts one", 1, 0.5}, {"c asks for one", 0, 1}} {
		_, got := g.allot(views(tc.bCount, tc.cDemand), allowance, 0, false, nil, 0, nil, 0)
		if got >= idle-1e-9 || got <= 0 {
			t.Errorf("%s: idle room %.3f, want one data center's part of %.3f", tc.name, got, idle)
		}
	}
	if _, got := g.allot(views(1, 1), allowance, 0, false, nil, 0, nil, 0); got != 0 {
		t.Errorf("no idle data center: idle room %.3f, want 0", got)
	}
}
