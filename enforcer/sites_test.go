package enforcer

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/sitecount"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/topics"
)

// sourceHeartbeat applies an aggregator heartbeat as of now for partition 0 of topic, with
// the sites heard there and the sites that left.
func sourceHeartbeat(t testing.TB, sn *snapshot.Snapshot, clk clock.Clock, topic string, heard, left map[string]int64) {
	t.Helper()
	hb := topics.Heartbeat{Instance: "agg", Topic: topic, Partition: 0, AsOf: clk.Now().UnixMilli(), Sites: heard, Left: left}
	v, err := hb.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if err := sn.Apply([]byte(topics.HeartbeatKey(topic, 0)), v); err != nil {
		t.Fatal(err)
	}
}

// sitesLimiter returns a limiter at site eu, running for longer than any window, over a
// snapshot whose sources are eu's local hits topic and us's replicated one.
func sitesLimiter(t *testing.T, mods ...func(*Config)) (*Engine, *clock.Fake, *snapshot.Snapshot) {
	t.Helper()
	clk := clock.NewFake(t0)
	sn, err := snapshot.NewMemory(snapshot.Config{Site: "eu", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Rules: rules.Static(loadRules(t, globalRules)), Site: "eu", Clock: clk, Snapshot: sn, Registerer: prometheus.NewRegistry()}
	for _, m := range mods {
		m(&cfg)
	}
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l.born = time.Time{}
	return l, clk, sn
}

var req7 = Request{Domain: "api", Descriptors: [][]rules.Entry{desc("user", "7")}}

// A site that left is reserved nothing: its hits still in the window count, the room goes
// to the sites that remain, and a key new to the snapshot is not shared with it.
func TestGlobalLeftSiteHoldsNothing(t *testing.T) {
	l, clk, sn := sitesLimiter(t)
	now := clk.Now().UnixMilli()
	sourceHeartbeat(t, sn, clk, "hits", map[string]int64{"eu": now}, nil)
	sourceHeartbeat(t, sn, clk, "us.hits", nil, map[string]int64{"us": now - 5_000})
	putCount(t, sn, clk, globalKey, map[string]float64{"us": 30}, map[string]float64{"us": 50})
	if got := admitN(l, req42, 200); got != 70 {
		t.Fatalf("admitted %d, want 70 (100 less the 30 that us admitted before it left)", got)
	}
	if got := admitN(l, req7, 200); got != 100 {
		t.Fatalf("a key new to the snapshot: admitted %d, want the whole limit of 100 (us left)", got)
	}
	if res := l.Decide(context.Background(), req7); res.Statuses[0].Fallback {
		t.Fatalf("decision marked Fallback while nothing is degraded: %+v", res.Statuses[0])
	}
	if got := testutil.ToFloat64(l.metrics.reserved); got != 0 {
		t.Fatalf("silent_site_reservations_total = %v, want 0", got)
	}
}

// A silent site is reserved its share only of the keys it served: with us cut off, a key
// that only eu served gets the whole limit at eu.
func TestGlobalSilentSiteHoldsOnlyKeysItServed(t *testing.T) {
	l, clk, sn := sitesLimiter(t)
	now := clk.Now().UnixMilli()
	sourceHeartbeat(t, sn, clk, "hits", map[string]int64{"eu": now}, nil)
	sourceHeartbeat(t, sn, clk, "us.hits", map[string]int64{"us": now - 10_000}, nil)
	putCount(t, sn, clk, globalKey, map[string]float64{"eu": 10}, nil)
	if got := admitN(l, req42, 200); got != 100 {
		t.Fatalf("admitted %d, want 100 (us never served the key; eu's own counter starts empty)", got)
	}
}

// A silent site whose data center still speaks has crashed: its share of the keys it
// served fades over CrashHold, and it gets no share of keys new to the snapshot. One whose
// whole data center is silent is cut off: it keeps its share, and a default share of new
// keys, for as long as the silence lasts.
func TestGlobalCrashedSiteFadesCutSiteHolds(t *testing.T) {
	const hold = 10 * time.Second
	for _, tc := range []struct {
		name       string
		us2        int64 // ms before now that us2, us's neighbour, was heard from
		early, new int   // admitted just after the silence is noticed, and of a new key
		late       int   // admitted once CrashHold has passed
	}{
		// us: 40 of the 80 counted → reserved 50 of the 100; eu may reach 50 of its 40+.
		// A new key is shared with the sites that may spend it: eu and us2 (crashed), and us
		// too (cut).
		{name: "crashed", us2: 0, early: 10, new: 50, late: 20},
		{name: "cut", us2: 10_000, early: 10, new: 33, late: 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, clk, sn := sitesLimiter(t, func(c *Config) { c.CrashHold = hold; c.ShareDamping, c.DemandPrior, c.MinShare = -1, -1, 1e-9 })
			apply := func() {
				now := clk.Now().UnixMilli()
				sourceHeartbeat(t, sn, clk, "hits", map[string]int64{"eu": now}, nil)
				sourceHeartbeat(t, sn, clk, "us.hits", map[string]int64{"us": t0.UnixMilli() - Defaults().SiteStaleAfter.Milliseconds() - 1, "us2": now - tc.us2}, nil)
				putCount(t, sn, clk, globalKey, map[string]float64{"eu": 40, "us": 40}, map[string]float64{"eu": 40, "us": 0})
				// us2 serves another key: a site no count shows serving is given no share
				// (TestGlobalIdleSitesShareNothing).
				putCount(t, sn, clk, "api|user=other#60s", map[string]float64{"us2": 1}, nil)
			}
			apply()
			if _, err := l.cfg.Counter.(*sitecount.Local).Commit(context.Background(), clk.Now().Add(-5*time.Second), []sitecount.Op{{Key: globalKey, Window: time.Minute, N: 40, Cap: 100}}, nil); err != nil {
				t.Fatal(err)
			}
			if got := admitN(l, req42, 200); got != tc.early {
				t.Fatalf("just after the silence: admitted %d, want %d", got, tc.early)
			}
			// The default share is rounded up or down with the key and the second.
			if got := admitN(l, Request{Domain: "api", Descriptors: [][]rules.Entry{desc("user", "100")}}, 200); got != tc.new && got != tc.new+1 {
				t.Fatalf("a key new to the snapshot: admitted %d, want %d or %d", got, tc.new, tc.new+1)
			}
			clk.Advance(hold)
			apply()
			if got := admitN(l, req42, 200); got != tc.late-tc.early {
				t.Fatalf("after CrashHold: admitted %d more, want %d", got, tc.late-tc.early)
			}
		})
	}
}

// A silent site is reserved its share as it was before the silence, not as its count fades
// while its newer hits cannot be seen.
func TestGlobalSilentSiteShareFrozenBeforeTheSilence(t *testing.T) {
	l, clk, sn := sitesLimiter(t, func(c *Config) { c.ShareDamping, c.DemandPrior = -1, -1 })
	// us serves three quarters of the key while both sites are heard from.
	for range 4 {
		now := clk.Now().UnixMilli()
		sourceHeartbeat(t, sn, clk, "hits", map[string]int64{"eu": now}, nil)
		sourceHeartbeat(t, sn, clk, "us.hits", map[string]int64{"us": now}, nil)
		putCount(t, sn, clk, globalKey, map[string]float64{"eu": 10, "us": 30}, nil)
		if admitN(l, req42, 1) != 1 {
			t.Fatal("refused while under the limit")
		}
		clk.Advance(time.Second)
	}
	heardUS := clk.Now().UnixMilli() - 1000
	// us falls silent; its count seems to fall as its hits leave the window unseen.
	clk.Advance(3 * time.Second)
	now := clk.Now().UnixMilli()
	sourceHeartbeat(t, sn, clk, "hits", map[string]int64{"eu": now}, nil)
	sourceHeartbeat(t, sn, clk, "us.hits", map[string]int64{"us": heardUS}, nil)
	putCount(t, sn, clk, globalKey, map[string]float64{"eu": 10, "us": 5}, nil)
	// us is reserved 75 (3/4 of 100, not max(5, 100 × 5/15) = 33); eu may reach 10 + 15,
	// and has admitted 4.
	if got := admitN(l, req42, 200); got != 21 {
		t.Fatalf("admitted %d, want 21 (us reserved 3/4 of the limit, as before the silence)", got)
	}
}

// The hits a restarted process was given from the snapshot leave its count as the snapshot
// sees the real ones leave, not all at once a window after they were given: a client under
// its limit is not refused for the hits its site admitted before the restart. Until the
// snapshot says they are gone, they count.
func TestGlobalRestartedSiteForgetsWhatLeft(t *testing.T) {
	l, clk, sn := sitesLimiter(t)
	l.born = clk.Now() // just started
	sourceHeartbeat(t, sn, clk, "hits", map[string]int64{"eu": clk.Now().UnixMilli()}, nil)
	putCount(t, sn, clk, globalKey, map[string]float64{"eu": 60}, nil)
	if got := admitN(l, req42, 1); got != 1 {
		t.Fatalf("admitted %d of 1", got)
	}
	// 20 s later the snapshot, having heard eu up to now, still counts the 60 and this
	// process's hit: nothing is forgotten, 39 more fit.
	clk.Advance(20 * time.Second)
	sourceHeartbeat(t, sn, clk, "hits", map[string]int64{"eu": clk.Now().UnixMilli()}, nil)
	putCount(t, sn, clk, globalKey, map[string]float64{"eu": 61}, nil)
	if got := admitN(l, req42, 10); got != 10 {
		t.Fatalf("admitted %d of 10, want 10 (61 + 10 of 100)", got)
	}
	// 10 s later the old instance's hits have left the window: the snapshot counts only
	// this process's 11, and so does its counter, with 89 more to admit (before, the 60
	// given at the restart counted until a window after they were given: 29).
	clk.Advance(10 * time.Second)
	sourceHeartbeat(t, sn, clk, "hits", map[string]int64{"eu": clk.Now().UnixMilli()}, nil)
	putCount(t, sn, clk, globalKey, map[string]float64{"eu": 11}, nil)
	if got := admitN(l, req42, 200); got != 89 {
		t.Fatalf("admitted %d, want 89 (the old instance's hits are gone)", got)
	}
}

// The first decision of a restarted process, with another site holding most of the key's
// demand: the hits given from the snapshot are not taken for new hits the other site has
// not seen yet (Engine.finalCap), which lowered the cap by the other data centers'
// share of them and refused it.
func TestGlobalRestartedSiteFirstDecision(t *testing.T) {
	l, clk, sn := sitesLimiter(t, noDamping)
	l.born = clk.Now() // just started
	now := clk.Now().UnixMilli()
	sourceHeartbeat(t, sn, clk, "hits", map[string]int64{"eu": now}, nil)
	sourceHeartbeat(t, sn, clk, "us.hits", map[string]int64{"us": now - 300}, nil)
	putCount(t, sn, clk, globalKey, map[string]float64{"eu": 30, "us": 30}, map[string]float64{"eu": 10, "us": 30})
	// eu holds its 30 and a quarter of the 40 left: 10 more.
	if got := admitN(l, req42, 20); got != 10 {
		t.Fatalf("admitted %d, want 10 (30 + 40/4 of 100)", got)
	}
}

// aheadClock is a clock ahead of another by d: an aggregator whose clock is ahead.
type aheadClock struct {
	c interface{ Now() time.Time }
	d time.Duration
}

func (a aheadClock) Now() time.Time { return a.c.Now().Add(a.d) }

// A restarted process behind its aggregators' clock (within the bound counts are taken
// at) still gets its site's count from before the restart: the count is dated ahead of
// its clock. It was skipped as from the future, and with every process 100 ms behind the
// aggregators the simulator's rolling restarts gave 1.33× the limit.
func TestGlobalRestartedSiteBehindAggregatorKeepsItsCount(t *testing.T) {
	l, clk, sn := sitesLimiter(t)
	l.born = clk.Now() // just started
	agg := aheadClock{clk, 100 * time.Millisecond}
	sourceHeartbeat(t, sn, agg, "hits", map[string]int64{"eu": clk.Now().UnixMilli()}, nil)
	putCount(t, sn, agg, globalKey, map[string]float64{"eu": 60}, nil)
	if got := admitN(l, req42, 200); got != 40 {
		t.Fatalf("admitted %d, want 40 (the 60 the site admitted before its restart count)", got)
	}
}

// A process that restarts under its site's name has lost its count; the snapshot still
// shows it, and the new process does not admit those hits again.
func TestGlobalRestartedSiteKeepsItsCount(t *testing.T) {
	l, clk, sn := sitesLimiter(t)
	l.born = clk.Now() // just started
	now := clk.Now().UnixMilli()
	sourceHeartbeat(t, sn, clk, "hits", map[string]int64{"eu": now}, nil)
	putCount(t, sn, clk, globalKey, map[string]float64{"eu": 60}, nil)
	if got := admitN(l, req42, 200); got != 40 {
		t.Fatalf("admitted %d, want 40 (the 60 the site admitted before its restart count)", got)
	}
	// An Engine that has run for a whole window has seen every hit in it itself.
	clk.Advance(2 * time.Minute)
	putCount(t, sn, clk, "api|user=8#60s", map[string]float64{"eu": 60}, nil)
	sourceHeartbeat(t, sn, clk, "hits", map[string]int64{"eu": clk.Now().UnixMilli()}, nil)
	if got := admitN(l, Request{Domain: "api", Descriptors: [][]rules.Entry{desc("user", "8")}}, 200); got != 100 {
		t.Fatalf("an old limiter admitted %d, want 100 (its own count of the key is 0)", got)
	}
}
