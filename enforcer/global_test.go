package enforcer

import (
	"context"
	"maps"
	"math/rand/v2"
	"slices"
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

const globalRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: otp
    rate_limit: {window: 10s, requests_per_unit: 5, hard: true}
`

const globalKey = "api|user=42#60s"

// noDamping turns Config.ShareDamping and Config.DemandPrior off, so that expected caps
// are plain shares of the demand.
func noDamping(c *Config) { c.ShareDamping, c.DemandPrior = -1, -1 }

// newGlobal returns a limiter at site eu with a fresh in-memory snapshot holding, for
// globalKey, the given per-site counts (each site's demand equal to its count) as of now.
func newGlobal(t *testing.T, sites map[string]float64, mods ...func(*Config)) (*Engine, *clock.Fake, *snapshot.Snapshot, *recorder) {
	t.Helper()
	clk := clock.NewFake(t0)
	sn, err := snapshot.NewMemory(snapshot.Config{Site: "eu", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	heartbeat(t, sn, clk)
	if sites != nil {
		putCount(t, sn, clk, globalKey, sites, nil)
	}
	pub := &recorder{}
	cfg := Config{Tuning: Tuning{DefaultShare: 1.0 / 3}, Rules: rules.Static(loadRules(t, globalRules)), Site: "eu", Clock: clk, Snapshot: sn, Publisher: pub}
	for _, m := range mods {
		m(&cfg)
	}
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l.born = time.Time{} // running for longer than the window: its counter starts empty by the test's choice
	return l, clk, sn, pub
}

// heartbeat applies an aggregator heartbeat as of now that lists, when given, the sites'
// heard-from times.
func heartbeat(t testing.TB, sn *snapshot.Snapshot, clk clock.Clock, sites ...map[string]int64) {
	t.Helper()
	hb := topics.Heartbeat{Instance: "agg", Topic: "hits", Partition: 0, AsOf: clk.Now().UnixMilli()}
	if len(sites) > 0 {
		hb.Sites = sites[0]
	}
	v, _ := hb.MarshalBinary()
	if err := sn.Apply([]byte(topics.HeartbeatKey("hits", 0)), v); err != nil {
		t.Fatal(err)
	}
}

// putCount applies a count of key as of now; demand defaults to the counts.
func putCount(t *testing.T, sn *snapshot.Snapshot, clk clock.Clock, key string, sites, demand map[string]float64) {
	t.Helper()
	c := topics.Count{Key: key, Window: 60000, AsOf: clk.Now().UnixMilli()}
	names := slices.Sorted(maps.Keys(sites))
	for s := range demand {
		if _, ok := sites[s]; !ok {
			names = append(names, s)
		}
	}
	slices.Sort(names)
	for _, s := range names {
		v, ok := sites[s]
		d, dok := demand[s]
		if !dok {
			d = v
		}
		if ok || dok {
			c.Sites = append(c.Sites, topics.SiteCount{Site: s, Count: v, Demand: d})
			c.Total += v
		}
	}
	v, err := c.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if err := sn.Apply([]byte(key), v); err != nil {
		t.Fatal(err)
	}
}

func admitN(l *Engine, req Request, tries int) int {
	n := 0
	for range tries {
		if l.Decide(context.Background(), req).Code == CodeOK {
			n++
		}
	}
	return n
}

var req42 = Request{Domain: "api", Descriptors: [][]rules.Entry{desc("user", "42")}}

// The only site with traffic spends all the room the others left: its share is 1.
func TestGlobalAloneSpendsAllTheRoom(t *testing.T) {
	l, _, _, pub := newGlobal(t, map[string]float64{"us": 40, "ap": 20, "eu": 10}, noDamping, func(c *Config) { c.MinShare = 1e-9 })
	// Others hold 60 but have no demand any more: eu's share of the 30 left is 1.
	putCount(t, l.cfg.Snapshot, l.cfg.Clock, globalKey, map[string]float64{"us": 40, "ap": 20, "eu": 10},
		map[string]float64{"us": 0, "ap": 0, "eu": 10})
	if got := admitN(l, req42, 100); got != 40 {
		t.Fatalf("admitted %d, want 40 (100 − 60 remote)", got)
	}
	if got := pub.get(globalKey); got != 40 {
		t.Fatalf("published %d hits, want 40 (one per admitted request)", got)
	}
	res := l.Decide(context.Background(), req42)
	st := res.Statuses[0]
	if res.Code != CodeOverLimit || st.Remaining != 0 || st.RetryAfter <= 0 || st.RetryAfter > time.Minute || st.Fallback {
		t.Fatalf("over limit status: %+v", st)
	}
	pub.mu.Lock()
	defer pub.mu.Unlock()
	if pub.denied[globalKey] != 61 { // 60 of the 100 tries and the one above
		t.Fatalf("published %d denied requests, want 61", pub.denied[globalKey])
	}
}

// Sites share the room by demand: eu with a seventh of the demand gets a seventh of the 30
// left on top of its own 10 (damping off), or less with the default damping.
func TestGlobalSharesTheRoomByDemand(t *testing.T) {
	counts := map[string]float64{"us": 40, "ap": 20, "eu": 10}
	plain, _, _, _ := newGlobal(t, counts, noDamping)
	if got := admitN(plain, req42, 100); got != 14 && got != 15 { // 10 + 30/7 = 14.3
		t.Fatalf("no damping: admitted %d, want 14 or 15", got)
	}
	damped, _, _, _ := newGlobal(t, counts)
	want := 10 + 30*(1.0/7)/(1+Defaults().ShareDamping*6/7)
	if got := admitN(damped, req42, 100); float64(got) < want-1 || float64(got) > want+1 {
		t.Fatalf("default damping: admitted %d, want about %.1f", got, want)
	}
}

// siteLimiters returns one Engine per site, each with its own snapshot holding the same
// count record of globalKey.
func siteLimiters(t *testing.T, clk *clock.Fake, sites map[string]float64, mods ...func(*Config)) []*Engine {
	t.Helper()
	var out []*Engine
	for _, name := range []string{"ap", "eu", "us"} {
		sn, err := snapshot.NewMemory(snapshot.Config{Site: name, Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		heartbeat(t, sn, clk)
		putCount(t, sn, clk, globalKey, sites, nil)
		cfg := Config{Tuning: Tuning{DefaultShare: 1.0 / 3}, Rules: rules.Static(loadRules(t, globalRules)), Site: name, Clock: clk, Snapshot: sn}
		for _, m := range mods {
			m(&cfg)
		}
		l, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		// Each site's count is in the snapshot and the tests start its counter empty: the
		// limiters are taken to have run for longer than the window, not to have just
		// restarted (which Engine.restarted corrects for).
		l.born = time.Time{}
		out = append(out, l)
	}
	return out
}

func TestGlobalSharedCapsAddUpToTheLimit(t *testing.T) {
	// Three sites see the same snapshot, whose fractional caps add up to exactly 100. Each
	// rounds its own cap, yet together they must admit exactly 100, never 101 or 102 as
	// independent rounding would; and each cap must be rounded both ways over snapshots.
	counts := map[string]float64{"ap": 7, "eu": 31, "us": 23}
	clk := clock.NewFake(t0)
	seen := map[string]map[int]bool{}
	for i := range 40 {
		clk.Advance(time.Millisecond * time.Duration(1+i%7))
		ls := siteLimiters(t, clk, counts, noDamping)
		sum := 0
		for _, l := range ls {
			n := admitN(l, req42, 100)
			sum += n
			if seen[l.cfg.Site] == nil {
				seen[l.cfg.Site] = map[int]bool{}
			}
			seen[l.cfg.Site][n] = true
		}
		if sum != 100 {
			t.Fatalf("snapshot %d: the sites admitted %d together, want exactly 100", i, sum)
		}
	}
	for site, ns := range seen {
		if len(ns) != 2 {
			t.Errorf("site %s always admitted %v: its cap is not rounded both ways", site, ns)
		}
	}
	// With damping, they hold part of the room back, never more.
	ls := siteLimiters(t, clk, counts)
	sum := 0
	for _, l := range ls {
		sum += admitN(l, req42, 100)
	}
	if sum > 100 || sum < 61 {
		t.Fatalf("damped: the sites admitted %d together, want 61..100", sum)
	}
}

func TestGlobalOverLimitSnapshotGivesBackTheExcess(t *testing.T) {
	// The snapshot shows 120 of 100 (an earlier overshoot). Each site must give back its
	// share of the 20 too many, not keep all it holds, so that together they hold 100.
	clk := clock.NewFake(t0)
	ls := siteLimiters(t, clk, map[string]float64{"ap": 30, "eu": 50, "us": 40})
	sum := 0
	for _, l := range ls {
		sum += admitN(l, req42, 200)
	}
	if sum != 100 {
		t.Fatalf("the sites admitted %d together from empty local counts, want 100", sum)
	}
}

// A client that moves from us to eu: us still holds its one hit, eu has no history. eu gets
// a small share (MinShare) at once, publishes its denied requests as demand, and as soon as
// a count shows eu's demand and us's faded, eu gets the room left.
func TestGlobalClientMovesSitesIsNotStarved(t *testing.T) {
	rulesYAML := "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {window: 30s, requests_per_unit: 10}\n"
	clk := clock.NewFake(t0)
	sn, err := snapshot.NewMemory(snapshot.Config{Site: "eu", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	heartbeat(t, sn, clk)
	key := "api|user=42#30s"
	put := func(sites, demand map[string]float64) {
		c := topics.Count{Key: key, Window: 30000, AsOf: clk.Now().UnixMilli()}
		for _, s := range []string{"eu", "us"} {
			if v, ok := sites[s]; ok {
				c.Sites = append(c.Sites, topics.SiteCount{Site: s, Count: v, Demand: demand[s]})
				c.Total += v
			}
		}
		v, _ := c.MarshalBinary()
		if err := sn.Apply([]byte(key), v); err != nil {
			t.Fatal(err)
		}
	}
	put(map[string]float64{"us": 1}, map[string]float64{"us": 1})
	pub := &recorder{}
	l, err := New(Config{Rules: rules.Static(loadRules(t, rulesYAML)), Site: "eu", Clock: clk, Snapshot: sn, Publisher: pub})
	if err != nil {
		t.Fatal(err)
	}
	first := admitN(l, req42, 6)
	// eu's share of the 9 left is its part of the demand prior: (0 + 0.05×10/2) / (1 + 0.05×10)
	// = 1/6, damped to 0.148: 1.3 requests, rounded either way.
	if first > 2 {
		t.Fatalf("before the pipeline shows eu's demand, eu admitted %d of 6, want at most its share of the room (≤ 2)", first)
	}
	pub.mu.Lock()
	denied := pub.denied[key]
	pub.mu.Unlock()
	if denied != 6-first {
		t.Fatalf("eu published %d denied requests, want %d", denied, 6-first)
	}
	// One pipeline lag later: eu's demand shows, us's one request a second ago faded.
	clk.Advance(300 * time.Millisecond)
	heartbeat(t, sn, clk)
	put(map[string]float64{"us": 1, "eu": float64(first)}, map[string]float64{"us": 0.5, "eu": 6})
	if got := admitN(l, req42, 20); first+got < 8 {
		t.Fatalf("after one lag eu admitted %d more (%d in all), want the room left: at least 8 of 9", got, first+got)
	}
}

// A site that has not been heard from within SiteStaleAfter, with every other site of its
// data center (here, the only one), is cut off: it is assumed to hold its share of each key
// it served. With eu and us cut off from each other, each keeps to its part and together
// they admit at most the limit, where trusting the decaying counts would let each admit
// nearly all of it. Such a decision is not a fallback; it is counted apart.
func TestGlobalPartitionBounded(t *testing.T) {
	clk := clock.NewFake(t0)
	limiters := map[string]*Engine{}
	reg := prometheus.NewRegistry()
	for _, site := range []string{"eu", "us"} {
		sn, err := snapshot.NewMemory(snapshot.Config{Site: site, Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		// Both sites were heard from 10 s ago; only this site's own aggregator is fresh.
		heartbeat(t, sn, clk, map[string]int64{"eu": t0.UnixMilli() - 10_000, "us": t0.UnixMilli() - 10_000})
		putCount(t, sn, clk, globalKey, map[string]float64{"eu": 10, "us": 10}, nil)
		cfg := Config{Rules: rules.Static(loadRules(t, globalRules)), Site: site, Clock: clk, Snapshot: sn}
		if site == "eu" {
			cfg.Registerer = reg
		}
		l, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		l.born = time.Time{} // its count is in the snapshot; the test starts its counter empty
		limiters[site] = l
	}
	// Each assumes the other holds max(10, 100 × 10/20) = 50 and may reach 50 itself;
	// trusting the other's count of 10 it would reach 90.
	eu, us := admitN(limiters["eu"], req42, 200), admitN(limiters["us"], req42, 200)
	if eu+us > 100 || eu < 45 || us < 45 {
		t.Fatalf("partition: eu admitted %d, us %d; want each about 50 and together at most 100", eu, us)
	}
	res := limiters["eu"].Decide(context.Background(), req42)
	if res.Statuses[0].Fallback {
		t.Fatalf("a decision that reserved room for a silent site is marked Fallback: %+v", res.Statuses[0])
	}
	if got := testutil.ToFloat64(limiters["eu"].metrics.reserved); got < 1 {
		t.Fatalf("silent_site_reservations_total = %v, want > 0", got)
	}
	if got := testutil.ToFloat64(limiters["eu"].metrics.fallback.WithLabelValues("stale")); got != 0 {
		t.Fatalf("fallback_decisions_total{stale} = %v, want 0", got)
	}
}

func TestGlobalStaleFallsBackToLocalShareAndRecovers(t *testing.T) {
	reg := prometheus.NewRegistry()
	l, clk, sn, _ := newGlobal(t, map[string]float64{"us": 30, "eu": 30})
	l.metrics, _ = newMetrics(reg)
	clk.Advance(11 * time.Second) // past the default 10 s staleness bound, no heartbeat
	if !sn.StaleAt(clk.Now()) {
		t.Fatal("snapshot not stale")
	}
	// Stale: eu's share of the key is 30/60 = 1/2 → 50 locally.
	if got := admitN(l, req42, 100); got != 50 {
		t.Fatalf("stale: admitted %d, want 50 (half of 100)", got)
	}
	if res := l.Decide(context.Background(), req42); !res.Statuses[0].Fallback {
		t.Fatalf("stale decision not marked Fallback: %+v", res.Statuses[0])
	}
	if got := testutil.ToFloat64(l.metrics.fallback.WithLabelValues("stale")); got < 1 {
		t.Fatalf("fallback_decisions_total{stale} = %v", got)
	}
	// A key never seen gets DefaultShare (1/3).
	other := Request{Domain: "api", Descriptors: [][]rules.Entry{desc("user", "7")}}
	if got := admitN(l, other, 100); got != 33 && got != 34 {
		t.Fatalf("stale, unknown key: admitted %d, want 33 or 34", got)
	}
	// Fresh data arrives: the 50 local hits reached the snapshot; remote us = 30 → room 20.
	heartbeat(t, sn, clk)
	putCount(t, sn, clk, globalKey, map[string]float64{"us": 30, "eu": 50}, nil)
	res := l.Decide(context.Background(), req42)
	if res.Code != CodeOK || res.Statuses[0].Fallback {
		t.Fatalf("after recovery: %+v", res.Statuses[0])
	}
}

func TestGlobalUnknownKeyGetsDefaultShare(t *testing.T) {
	// A key the fresh snapshot does not show may be new at every site: eu spends its
	// default share (a third of 100, dithered) until the pipeline shows the key.
	l, clk, sn, _ := newGlobal(t, nil)
	if got := admitN(l, req42, 150); got != 33 && got != 34 {
		t.Fatalf("admitted %d, want 33 or 34", got)
	}
	// A minute later our own hits have left the window.
	clk.Advance(61 * time.Second)
	heartbeat(t, sn, clk)
	if got := admitN(l, req42, 150); got != 33 && got != 34 {
		t.Fatalf("next window: admitted %d, want 33 or 34", got)
	}
	// Without DefaultShare, the share is 1/the number of sites the heartbeats list.
	l4, _, sn4, _ := newGlobal(t, nil, func(c *Config) { c.DefaultShare = 0 })
	heartbeat(t, sn4, l4.cfg.Clock, map[string]int64{"eu": t0.UnixMilli(), "us": t0.UnixMilli(), "ap": t0.UnixMilli(), "sa": t0.UnixMilli()})
	if got := admitN(l4, req42, 150); got != 25 {
		t.Fatalf("four sites heard from: admitted %d, want 25", got)
	}
	// With one site (no snapshot), the default share is the whole limit.
	l1, _ := newLimiter(t, globalRules, nil)
	if got := admitN(l1, req42, 150); got != 100 {
		t.Fatalf("one site: admitted %d, want 100", got)
	}
}

func TestDitherRoundsByFraction(t *testing.T) {
	up := 0
	for i := range 10000 {
		switch d := dither(7.3, "k", t0.UnixMilli()+int64(i)); d {
		case 8:
			up++
		case 7:
		default:
			t.Fatalf("dither(7.3) = %v", d)
		}
	}
	if up < 2700 || up > 3300 {
		t.Fatalf("rounded up %d of 10000 times, want about 3000", up)
	}
	if dither(5, "k", 1) != 5 {
		t.Fatal("whole caps must stay")
	}
}

func TestNoSnapshotMeansDefaultShare(t *testing.T) {
	l, _ := newLimiter(t, globalRules, func(c *Config) { c.DefaultShare = 0.25 })
	if got := admitN(l, req42, 100); got != 25 {
		t.Fatalf("admitted %d, want 25", got)
	}
}

// TestGlobalRecoveryHold: right after the snapshot was stale, its fresh counts may still
// miss hits published during the outage; each site keeps to its share of the limit for
// RecoveryHold (bounded by the window) as well.
func TestGlobalRecoveryHold(t *testing.T) {
	fresh := func(mods ...func(*Config)) (*Engine, *clock.Fake, *snapshot.Snapshot) {
		l, clk, sn, _ := newGlobal(t, nil, mods...)
		return l, clk, sn
	}
	// A: went through an outage. B: never stale. Both then see the same fresh snapshot:
	// us 45 and eu 5 of a limit of 100 (eu's share of the traffic 1/10), eu alone in demand.
	demand := map[string]float64{"us": 0, "eu": 5}
	a, aclk, asn := fresh(func(c *Config) { c.RecoveryHold = 10 * time.Second })
	aclk.Advance(11 * time.Second)
	a.Decide(context.Background(), Request{Domain: "api", Descriptors: [][]rules.Entry{desc("user", "7")}}) // stale
	heartbeat(t, asn, aclk)
	putCount(t, asn, aclk, globalKey, map[string]float64{"us": 45, "eu": 5}, demand)
	b, bclk, bsn := fresh()
	heartbeat(t, bsn, bclk)
	putCount(t, bsn, bclk, globalKey, map[string]float64{"us": 45, "eu": 5}, demand)

	held, free := admitN(a, req42, 100), admitN(b, req42, 100)
	if held > 10 {
		t.Fatalf("recovering: admitted %d, want at most eu's share (10)", held)
	}
	if free <= held {
		t.Fatalf("never stale: admitted %d, recovering %d: the hold changed nothing", free, held)
	}
	// Past the hold the snapshot alone decides again.
	aclk.Advance(11 * time.Second)
	heartbeat(t, asn, aclk)
	putCount(t, asn, aclk, globalKey, map[string]float64{"us": 45, "eu": 5 + float64(held)}, demand)
	if res := a.Decide(context.Background(), req42); res.Code != CodeOK {
		t.Fatalf("after the hold: %+v", res.Statuses[0])
	}
}

// A hard limit never admits more than its limit in any window at one site, whatever the
// traffic's shape inside the sub-buckets (checked against every admission's own window).
func TestGlobalHardNeverOverOnOneSite(t *testing.T) {
	l, clk := newLimiter(t, globalRules, nil)
	req := Request{Domain: "api", Descriptors: [][]rules.Entry{desc("otp", "alice")}}
	rng := rand.New(rand.NewPCG(3, 4))
	var admitted []time.Time
	for range 5000 {
		// Bursts inside parts of sub-buckets: the pattern that fools interpolation.
		if rng.IntN(10) == 0 {
			clk.Advance(time.Duration(rng.IntN(3000)) * time.Millisecond)
		} else {
			clk.Advance(time.Duration(rng.IntN(20)) * time.Millisecond)
		}
		if l.Decide(context.Background(), req).Code == CodeOK {
			admitted = append(admitted, clk.Now())
		}
	}
	lo := 0
	for i, at := range admitted {
		for admitted[lo].Add(10*time.Second).Compare(at) <= 0 {
			lo++
		}
		if n := i - lo + 1; n > 5 {
			t.Fatalf("%d admitted in the 10 s window ending %v (limit 5)", n, at.Sub(t0))
		}
	}
	if len(admitted) < 100 {
		t.Fatalf("only %d admitted over the run: the hard count holds back far too much", len(admitted))
	}
}

// Retry-After of a global limit at one site: waiting it and retrying is admitted, and
// admission would not have come more than one sub-bucket earlier.
func TestGlobalRetryAfterIsWhenTheWindowFrees(t *testing.T) {
	for _, hard := range []bool{false, true} {
		l, clk := newLimiter(t, globalRules, nil)
		req := req42
		if hard {
			req = Request{Domain: "api", Descriptors: [][]rules.Entry{desc("otp", "alice")}}
		}
		rng := rand.New(rand.NewPCG(5, 6))
		checks := 0
		for range 3000 {
			clk.Advance(time.Duration(rng.IntN(400)) * time.Millisecond)
			res := l.Decide(context.Background(), req)
			if res.Code == CodeOK {
				continue
			}
			ra := res.Statuses[0].RetryAfter
			w := res.Statuses[0].Window
			sub := w / 60
			if ra <= 0 || ra > w {
				t.Fatalf("hard %v: Retry-After %v outside (0, %v]", hard, ra, w)
			}
			// Probe on a copy of the clock? The limiter has one clock: probe forward at
			// ra − sub (must still deny) only when it does not consume quota, i.e. denied.
			if ra > sub+time.Millisecond {
				clk.Advance(ra - sub - time.Millisecond)
				if l.Decide(context.Background(), req).Code == CodeOK {
					t.Fatalf("hard %v: admitted more than one sub-bucket before Retry-After %v", hard, ra)
				}
				clk.Advance(sub + time.Millisecond)
			} else {
				clk.Advance(ra)
			}
			if got := l.Decide(context.Background(), req); got.Code != CodeOK {
				t.Fatalf("hard %v: denied after waiting Retry-After %v: %+v", hard, ra, got.Statuses[0])
			}
			checks++
		}
		if checks < 20 {
			t.Fatalf("hard %v: only %d denials checked", hard, checks)
		}
	}
}

// A global token bucket of 10 per second with a burst of 20 is counted as at most 20 in
// any 2 s: a burst of 20 at once, then about 10 a second.
func TestGlobalTokenBucket(t *testing.T) {
	l, clk := newLimiter(t, "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 10, burst: 20, algorithm: token_bucket}\n", nil)
	if got := admitN(l, req42, 50); got != 20 {
		t.Fatalf("burst: admitted %d, want 20", got)
	}
	res := l.Decide(context.Background(), req42)
	if st := res.Statuses[0]; st.Requests != 20 || st.Window != 2*time.Second || st.RetryAfter <= 0 {
		t.Fatalf("denied status %+v, want 20 per 2s and a Retry-After", st)
	}
	// Once the burst has left its 2 s, ten seconds at 20 requests a second: about 10 a
	// second get through.
	clk.Advance(2 * time.Second)
	admitted := 0
	for range 200 {
		clk.Advance(50 * time.Millisecond)
		admitted += admitN(l, req42, 1)
	}
	if admitted < 90 || admitted > 110 {
		t.Fatalf("admitted %d in 10 s at 10/s, want about 100", admitted)
	}
}

// The snapshot shows this site as of a local hop ago, the other sites as of a replication
// ago: the room it leaves is partly spent already by what the others cannot see yet. The
// cap counts this site as the others see it (its hits since they were last heard from
// taken out), which moves the cap by (the other data centers' share) × those hits.
func TestGlobalCountsThisSiteAsTheOthersSeeIt(t *testing.T) {
	run := func(othersHeardAgo time.Duration) int {
		clk := clock.NewFake(t0)
		sn, err := snapshot.NewMemory(snapshot.Config{Site: "eu", Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		heartbeat(t, sn, clk)
		l, err := New(Config{
			Tuning:   Tuning{DefaultShare: 1.0 / 3, NewKeyHold: -1, ShareDamping: -1, DemandPrior: -1},
			Rules:    rules.Static(loadRules(t, globalRules)),
			Site:     "eu",
			Clock:    clk,
			Snapshot: sn,
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := admitN(l, req42, 10); got != 10 {
			t.Fatalf("first 10 at eu: admitted %d", got)
		}
		clk.Advance(2 * time.Second)
		if got := admitN(l, req42, 4); got != 4 {
			t.Fatalf("next 4 at eu: admitted %d", got)
		}
		clk.Advance(300 * time.Millisecond)
		now := clk.Now().UnixMilli()
		// eu's hits arrive on its local topic, us's on the replicated one: two data centers.
		sourceHeartbeat(t, sn, clk, "hits", map[string]int64{"eu": now}, nil)
		sourceHeartbeat(t, sn, clk, "us.hits", map[string]int64{"us": now - othersHeardAgo.Milliseconds()}, nil)
		// The snapshot shows all 14 of eu's hits; us holds 20; equal demand: eu's share of
		// the 66 left is one half.
		putCount(t, sn, clk, globalKey, map[string]float64{"eu": 14, "us": 20}, map[string]float64{"eu": 14, "us": 14})
		return admitN(l, req42, 100)
	}
	current := run(0)
	if current < 32 || current > 34 {
		t.Fatalf("us heard up to now: eu admitted %d more, want half the room: 33 ± 1", current)
	}
	// us was last heard 400 ms ago, before eu's last 4 hits: us cannot have seen them, and
	// may spend room they took. eu gives back (1 − 1/2) × 4 = 2.
	behind := run(400 * time.Millisecond)
	if d := current - behind; d < 1 || d > 3 {
		t.Fatalf("us heard 400 ms ago: eu admitted %d more, want 2 ± 1 fewer than the %d when us is current", behind, current)
	}
}

// fellBackCounter is a sitecount.Local that says every Commit came from a fallback, as
// sitestore.Counter does while Redis is away.
type fellBackCounter struct{ *sitecount.Local }

func (c fellBackCounter) CommitReport(ctx context.Context, now time.Time, ops []sitecount.Op, counts []float64) (bool, bool, error) {
	ok, err := c.Commit(ctx, now, ops, counts)
	return ok, true, err
}

// A global decision whose site count came from the counter's fallback is reported as a
// fallback, in the answer and the metrics, on the one-call path (alone, and with a local
// limit) and on the two-call path (with a global shadow limit).
func TestGlobalCounterFallbackReported(t *testing.T) {
	for _, with := range []string{"", "  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 50, scope: local}\n",
		"  - key: tenant\n    shadow_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 50}\n"} {
		reg := prometheus.NewRegistry()
		l, _, _, _ := newGlobal(t, map[string]float64{"eu": 1}, func(c *Config) {
			c.Counter = fellBackCounter{sitecount.NewLocal(sitecount.LocalOptions{})}
			c.Registerer = reg
		})
		req := req42
		if with != "" {
			l.cfg.Rules = rules.Static(loadRules(t, globalRules+with))
			req = Request{Domain: "api", Descriptors: [][]rules.Entry{desc("user", "42"), desc("tenant", "t")}}
		}
		res := l.Decide(context.Background(), req)
		if res.Code != CodeOK || !res.Statuses[0].Fallback {
			t.Fatalf("with %q: %v, status %+v, want admitted and reported as a fallback", with, res.Code, res.Statuses[0])
		}
		if got := testutil.ToFloat64(l.metrics.fallback.WithLabelValues("redis")); got != 1 {
			t.Fatalf("with %q: fallback decisions %v, want 1", with, got)
		}
	}
}

// spendOTP sends requests for otp x (global, 5 per 10 s, this site's default share of it)
// with tenant u until the global limit refuses one, and returns how many were admitted
// (at least one, at most 5) and the refused request's result.
func spendOTP(t *testing.T, l *Engine) (int, Result) {
	t.Helper()
	otp := Request{Domain: "api", Descriptors: [][]rules.Entry{desc("otp", "x"), desc("tenant", "u")}}
	admitted := 0
	res := l.Decide(context.Background(), otp)
	for ; res.Code == CodeOK; res = l.Decide(context.Background(), otp) {
		if admitted++; admitted > 5 {
			t.Fatalf("otp: %d admitted, more than its limit of 5", admitted)
		}
	}
	if admitted == 0 || res.Statuses[0].Code != CodeOverLimit {
		t.Fatalf("otp: %d admitted, then %+v, want some admitted, then refused by the global limit", admitted, res.Statuses[0])
	}
	return admitted, res
}

// callCounter is a sitecount.Local that counts the calls made to it.
type callCounter struct {
	*sitecount.Local
	counts, commits int
}

func (c *callCounter) Counts(ctx context.Context, now time.Time, ops []sitecount.Op, out []float64) error {
	c.counts++
	return c.Local.Counts(ctx, now, ops, out)
}

func (c *callCounter) Commit(ctx context.Context, now time.Time, ops []sitecount.Op, counts []float64) (bool, error) {
	c.commits++
	return c.Local.Commit(ctx, now, ops, counts)
}

// A request with a global and a local limit makes one call of the site counter (a Redis
// round trip when the counter is Redis): its local limit is peeked first, then its global
// limit checked and taken in one Commit, then the local limit taken. Refused by its local
// limit, it asks only for the counts; refused by its global limit, it takes nothing from
// its local limit.
func TestGlobalWithLocalOneCounterCall(t *testing.T) {
	counter := &callCounter{Local: sitecount.NewLocal(sitecount.LocalOptions{})}
	l, _, _, _ := newGlobal(t, map[string]float64{"eu": 1}, func(c *Config) { c.Counter = counter })
	l.cfg.Rules = rules.Static(loadRules(t, globalRules+"  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 3, scope: local}\n"))
	ctx := context.Background()
	req := func(user string) Request {
		return Request{Domain: "api", Descriptors: [][]rules.Entry{desc("user", user), desc("tenant", "t")}}
	}
	for i := range 3 {
		res := l.Decide(ctx, req("42"))
		if res.Code != CodeOK {
			t.Fatalf("request %d: %v, want admitted", i, res.Code)
		}
		if counter.counts != 0 || counter.commits != i+1 {
			t.Fatalf("after %d admitted requests: %d Counts and %d Commit calls, want 0 and %d", i+1, counter.counts, counter.commits, i+1)
		}
		if got, want := res.Statuses[0].Remaining, int64(100-i-1); got != want {
			t.Fatalf("request %d: user remaining %d, want %d", i, got, want)
		}
	}
	// The local limit (3 a minute) is spent: refused in process, one Counts for the report,
	// and the global limit keeps its count.
	res := l.Decide(ctx, req("42"))
	if res.Code != CodeOverLimit || res.Statuses[1].Code != CodeOverLimit {
		t.Fatalf("fourth: %v, tenant %v, want refused by the local limit", res.Code, res.Statuses[1].Code)
	}
	if counter.counts != 1 || counter.commits != 3 {
		t.Fatalf("fourth: %d Counts and %d Commit calls, want 1 and 3", counter.counts, counter.commits)
	}
	if got := res.Statuses[0].Remaining; got != 97 {
		t.Fatalf("fourth: user remaining %d, want 97 (nothing taken)", got)
	}

	// Refused by the global limit (otp, a key new to every site: this site's default share
	// of 5 per 10 s) with local room: the refused request takes nothing from the local limit.
	l.cfg.Rules = rules.Static(loadRules(t, globalRules+"  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 100, scope: local}\n"))
	admitted, res := spendOTP(t, l)
	if got, want := res.Statuses[1].Remaining, int64(100-admitted); got != want {
		t.Fatalf("refused otp: tenant remaining %d, want %d (the refused request took nothing)", got, want)
	}
}
