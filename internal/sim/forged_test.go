//go:build !race

// A simulation is one goroutine's computation at scale: -race finds nothing in it and
// makes it ten times slower, so make test runs these tests in its first, race-free pass
// (their names contain "Sim"). sim_test.go keeps the parallel runs under -race.

package sim

import (
	"context"
	"fmt"
	"testing"

	"github.com/streamlimit/streamlimit/topics"
)

// Leave records written in other sites' names, as anyone allowed to write the hits topics
// can, change nothing, through the real aggregator and enforcer code: leave records for
// every real site every 100 ms, from a stranger instance, dated now and 25 s ahead, and
// from the site's own instance dated 25 s ahead. Before, they made each data center take
// the other as gone (the worst client at 1.090× its limit, 1.010 without them).
// Heartbeats of 50 made-up sites every 400 ms in each data center, which no site key
// refuses here (the simulator's aggregator does not sign or verify: the aggregator's
// TestSiteAuthentication refuses them with keys), change nothing either: a site no count
// shows serving is given no share. Before, every made-up site was given an even part of
// its data center's share of each key, and clients under their limit were denied.
func TestSimForgedSiteRecordsChangeNothing(t *testing.T) {
	const simGhosts = 50
	ctx := context.Background()
	base := DCConfig{Scenario: DCMix, DCs: 2, Clients: 300, Windows: 3}
	run := func(name string, forge func(t int64, dc int) []topics.Hit) DCResult {
		t.Helper()
		c := base
		c.forge = forge
		r, err := RunDC(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		if r.SnapshotErrors != 0 {
			t.Fatalf("%s: %d snapshot errors", name, r.SnapshotErrors)
		}
		t.Logf("%s: max/limit %.3f, admitted/oracle %.3f, under-limit clients denied %d of %d requests",
			name, r.MaxRatio, r.Ratio(), r.UnderFalse, r.UnderRequests)
		return r
	}
	startMs := Start().UnixMilli()
	leaves := func(t int64, dc int) []topics.Hit {
		if t%100 != 0 {
			return nil
		}
		site := siteName(dc)
		return []topics.Hit{
			{Key: topics.SiteLeaveKey, Site: site, BucketStart: startMs + t, Instance: "forger"},
			{Key: topics.SiteLeaveKey, Site: site, BucketStart: startMs + t + 25_000, Instance: "forger"},
			// The site's first instance (startProc's naming), dated ahead.
			{Key: topics.SiteLeaveKey, Site: site, BucketStart: startMs + t + 25_000, Instance: fmt.Sprintf("%s#%d", site, dc+1)},
		}
	}
	ghosts := func(t int64, dc int) []topics.Hit {
		if t%400 != 0 {
			return nil
		}
		hs := make([]topics.Hit, 0, simGhosts)
		for k := range simGhosts {
			name := fmt.Sprintf("ghost-%d-%d", dc, k)
			hs = append(hs, topics.Hit{Key: topics.SiteHeartbeatKey, Site: name, BucketStart: startMs + t, Instance: name})
		}
		return hs
	}
	clean := run("no forgery", nil)
	for _, c := range []struct {
		name  string
		forge func(int64, int) []topics.Hit
	}{{"forged leaves", leaves}, {"made-up sites", ghosts}} {
		r := run(c.name, c.forge)
		if r.MaxRatio > 1.02 || r.MaxRatio > clean.MaxRatio+0.005 {
			t.Errorf("%s: max/limit %.3f, want ≤ 1.02 (%.3f without forgery)", c.name, r.MaxRatio, clean.MaxRatio)
		}
		if r.UnderFalse > clean.UnderFalse {
			t.Errorf("%s: %d requests of clients under their limit denied, %d without forgery", c.name, r.UnderFalse, clean.UnderFalse)
		}
	}
}
