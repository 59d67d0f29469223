package enforcer

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/sitecount"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/topics"
)

// joinDC is one data center's view in the join tests: the sites of us (us-a and us-b)
// heard on the local hits topic, eu-a on eu's replicated one.
type joinDC struct {
	t   *testing.T
	clk *clock.Fake
	sns []*snapshot.Snapshot
	// left lists the sites that left, with how long ago (ms).
	left map[string]int64
}

// apply gives every snapshot the same records: the sites' heard-from times (ms before
// now), those that left, and key's count and demand per site.
func (d *joinDC) apply(key string, heardAgo map[string]int64, counts, demand map[string]float64) {
	now := d.clk.Now().UnixMilli()
	local, remote, left := map[string]int64{}, map[string]int64{}, map[string]int64{}
	for s, ago := range heardAgo {
		if s == "eu-a" {
			remote[s] = now - ago
		} else {
			local[s] = now - ago
		}
	}
	for s, ago := range d.left {
		left[s] = now - ago
	}
	c := topics.Count{Key: key, Window: 60000, AsOf: now}
	for _, s := range []string{"eu-a", "us-a", "us-b"} {
		if v, ok := counts[s]; ok {
			c.Sites = append(c.Sites, topics.SiteCount{Site: s, Count: v, Demand: demand[s]})
			c.Total += v
		}
	}
	v, err := c.MarshalBinary()
	if err != nil {
		d.t.Fatal(err)
	}
	for _, sn := range d.sns {
		sourceHeartbeat(d.t, sn, d.clk, "hits", local, left)
		sourceHeartbeat(d.t, sn, d.clk, "eu.hits", remote, nil)
		if err := sn.Apply([]byte(key), v); err != nil {
			d.t.Fatal(err)
		}
	}
}

// limiter returns an Engine at site over a snapshot of its own, born at born.
func (d *joinDC) limiter(site string, born time.Time, mods ...func(*Config)) *Engine {
	d.t.Helper()
	sn, err := snapshot.NewMemory(snapshot.Config{Site: site, Clock: d.clk})
	if err != nil {
		d.t.Fatal(err)
	}
	d.sns = append(d.sns, sn)
	cfg := Config{Rules: rules.Static(loadRules(d.t, globalRules)), Site: site, Clock: d.clk, Snapshot: sn, Registerer: prometheus.NewRegistry()}
	for _, m := range mods {
		m(&cfg)
	}
	l, err := New(cfg)
	if err != nil {
		d.t.Fatal(err)
	}
	l.born = born
	return l
}

// A process that comes back under its site's name (after a crash, or a clean stop) is
// fresh to itself at once, while the other sites of its data center take it for crashed,
// or gone, until its heartbeats reach them a pipeline lag later: meanwhile they share its
// data center's whole share of the room among themselves. For a key in demand beyond its
// limit it claims none of the room until its snapshot shows it heard from (the others read
// the same heartbeats), so that the data center does not admit its share and half again;
// then the share is split. A key under its limit is not held back.
func TestGlobalRejoinedSiteWaitsToBeSeen(t *testing.T) {
	for _, tc := range []struct {
		name string
		// heard is how long ago us-a was last heard from (−1: not listed as heard), left
		// how long ago it left (−1: it did not).
		heard, left int64
	}{
		// Crashed 12 s ago: past SiteStaleAfter and CrashHold, us-b reserves nothing for it.
		{name: "crashed", heard: 12_000, left: -1},
		{name: "left", heard: -1, left: 2_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(t0)
			d := &joinDC{t: t, clk: clk, left: map[string]int64{}}
			b := d.limiter("us-b", t0.Add(-time.Hour), noDamping)
			a := d.limiter("us-a", clk.Now(), noDamping) // just started again
			// us-b admitted 60 of the key 10 s ago, which the snapshot shows; eu-a 20. The
			// client is far over its limit, 97% of it at us: the room is 20, us's share of
			// it 19.4.
			if _, err := b.cfg.Counter.(*sitecount.Local).Commit(context.Background(), clk.Now().Add(-10*time.Second),
				[]sitecount.Op{{Key: globalKey, Window: time.Minute, N: 60, Cap: 100}}, nil); err != nil {
				t.Fatal(err)
			}
			counts := map[string]float64{"us-b": 60, "eu-a": 20}
			demand := map[string]float64{"us-b": 300, "eu-a": 10}
			share := 20 * 300.0 / 310
			heard := map[string]int64{"us-b": 0, "eu-a": 0}
			if tc.heard >= 0 {
				heard["us-a"] = tc.heard
			}
			if tc.left >= 0 {
				d.left["us-a"] = tc.left
			}
			d.apply(globalKey, heard, counts, demand)
			na, nb := admitN(a, req42, 50), admitN(b, req42, 50)
			t.Logf("before us-a is seen: us-a admitted %d, us-b %d; us's share of the room %.1f", na, nb, share)
			if float64(na+nb) > math.Ceil(share) {
				t.Fatalf("before us-a is seen: us admitted %d + %d, more than its share of the room (%.1f)", na, nb, share)
			}
			// A client under its limit is not held back meanwhile.
			d.apply("api|user=7#60s", heard, map[string]float64{"us-b": 10}, map[string]float64{"us-b": 1})
			if got := admitN(a, req7, 50); got != 50 {
				t.Fatalf("before us-a is seen: a client under its limit admitted %d of 50", got)
			}
			// Its heartbeats reach both snapshots, and eu-a's hits have left the window:
			// us-a and us-b split us's share of the room.
			clk.Advance(500 * time.Millisecond)
			counts["us-b"] += float64(nb)
			counts["us-a"] = float64(na)
			counts["eu-a"] = 0
			demand["us-a"] = 10
			heard["us-a"] = 0
			delete(d.left, "us-a")
			d.apply(globalKey, heard, counts, demand)
			room := 100 - counts["us-b"] - counts["us-a"]
			na2, nb2 := admitN(a, req42, 50), admitN(b, req42, 50)
			t.Logf("once seen: us-a admitted %d, us-b %d of a room of %.0f", na2, nb2, room)
			if na2 == 0 || nb2 == 0 || float64(na2+nb2) > math.Ceil(room) {
				t.Fatalf("once seen: us-a admitted %d, us-b %d, want both some and together at most the room %.0f", na2, nb2, room)
			}
		})
	}
}
