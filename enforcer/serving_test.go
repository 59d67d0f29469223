package enforcer

import (
	"math"
	"testing"

	"github.com/streamlimit/streamlimit/topics"
)

// A data center a client has left stops being taken to receive this site's rate of the
// key (the surge guard of the room ahead) once the long span shows it served nothing,
// while one that still serves the key at this site's rate counts whole; with ServingSpan
// off both count, as every data center that served the key in the window did before.
func TestServingFollowsTheLongSpan(t *testing.T) {
	const r = 0.005 // requests per ms: half the limit's rate of 100 per 10 s
	steady := r * demandTau
	// As of one second ago: "a" served the client, which has since left it (its demand
	// decayed with no new request); "c" and this site "b" serve it steadily.
	long := []topics.SiteCount{{Site: "a", Count: 40, Demand: steady}, {Site: "b", Count: 20, Demand: steady}, {Site: "c", Count: 20, Demand: steady}}
	now := []siteView{
		{site: "a", count: 40, demand: steady * math.Exp(-1000/demandTau), group: 0},
		{site: "b", count: 20, demand: steady, group: 1},
		{site: "c", count: 20, demand: steady, group: 2},
	}
	for _, tc := range []struct {
		span int64
		want float32
	}{{1000, 1}, {0, 2}} {
		g := sharing{site: "b", minShare: 0.05, damping: 0.15, prior: 0.05, servingSpan: tc.span}
		sites := append([]siteView(nil), now...)
		a := g.allot(sites, 100, 0, false, nil, 0, long, 1000)
		if math.Abs(float64(a.serving-tc.want)) > 1e-6 {
			t.Errorf("ServingSpan %d ms: %v data centers taken to serve the key, want %v", tc.span, a.serving, tc.want)
		}
	}
	// Without a breakdown a span old yet, every data center that served the key counts.
	g := sharing{site: "b", minShare: 0.05, damping: 0.15, prior: 0.05, servingSpan: 1000}
	if a := g.allot(append([]siteView(nil), now...), 100, 0, false, nil, 0, nil, 0); a.serving != 2 {
		t.Errorf("no long breakdown: %v data centers taken to serve the key, want 2", a.serving)
	}
}
