package enforcer

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/internal/clock"
	"github.com/streamlimit/streamlimit/topics"
)

var t0 = time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)

func loadRules(t testing.TB, yaml string) *rules.Config {
	t.Helper()
	c, err := rules.Parse("rules.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

type recorder struct {
	mu   sync.Mutex
	hits map[string]int
}

func (r *recorder) Hit(key string, _ time.Duration, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.hits == nil {
		r.hits = map[string]int{}
	}
	r.hits[key] += n
}

func (r *recorder) get(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.hits[key]
}

func desc(kv ...string) []rules.Entry {
	var out []rules.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, rules.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

func newLimiter(t testing.TB, yaml string, mod func(*Config)) (*Limiter, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(t0)
	cfg := Config{Rules: StaticRules(loadRules(t, yaml)), Site: "eu", Clock: clk}
	if mod != nil {
		mod(&cfg)
	}
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l, clk
}

const localRules = `
domain: api
descriptors:
  - key: user
    rate_limits:
      - {unit: minute, requests_per_unit: 3, scope: local, algorithm: fixed_window}
      - {unit: hour, requests_per_unit: 10, scope: local, algorithm: fixed_window}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 1, scope: local}
    shadow_mode: true
`

func TestLocalLimitsAllMustPassAndDeniedConsumesNothing(t *testing.T) {
	l, clk := newLimiter(t, localRules, nil)
	ctx := context.Background()
	req := Request{Domain: "api", Descriptors: [][]rules.Entry{desc("user", "42")}}
	admitted := 0
	// 3 per minute and 10 per hour: over 10 minutes with 5 attempts a minute, exactly
	// 3+3+3+1 pass. If denied attempts consumed the hourly limit it would run out sooner.
	for m := range 10 {
		for range 5 {
			if l.Decide(ctx, req).Code == CodeOK {
				admitted++
			}
		}
		if m < 3 && admitted != 3*(m+1) {
			t.Fatalf("minute %d: admitted %d, want %d", m, admitted, 3*(m+1))
		}
		clk.Advance(time.Minute)
	}
	if admitted != 10 {
		t.Fatalf("admitted %d in 10 minutes, want 10 (the hourly limit)", admitted)
	}
	res := l.Decide(ctx, req)
	st := res.Statuses[0]
	if res.Code != CodeOverLimit || st.Limit.Window != time.Hour || st.Requests != 10 || st.Remaining != 0 {
		t.Fatalf("after 10: %+v", st)
	}
	if want := 50 * time.Minute; st.RetryAfter != want {
		t.Fatalf("RetryAfter = %v, want %v (to the end of the hour window)", st.RetryAfter, want)
	}
}

func TestShadowModeNeverDenies(t *testing.T) {
	reg := prometheus.NewRegistry()
	l, _ := newLimiter(t, localRules, func(c *Config) { c.Registerer = reg })
	ctx := context.Background()
	req := Request{Domain: "api", Descriptors: [][]rules.Entry{desc("ip", "1.2.3.4")}}
	if res := l.Decide(ctx, req); res.Code != CodeOK || res.Statuses[0].Shadow {
		t.Fatalf("first: %+v", res)
	}
	res := l.Decide(ctx, req)
	if res.Code != CodeOK || !res.Statuses[0].Shadow || res.Statuses[0].Code != CodeOK {
		t.Fatalf("second (over the shadow limit): %+v", res)
	}
	if got := testutil.ToFloat64(l.metrics.shadow.WithLabelValues(res.Statuses[0].Rule.ID)); got != 1 {
		t.Fatalf("shadow_denials_total = %v, want 1", got)
	}
	if got := testutil.ToFloat64(l.metrics.decisions.WithLabelValues("api", res.Statuses[0].Rule.ID, "shadow_over_limit")); got != 1 {
		t.Fatalf("decisions_total{shadow_over_limit} = %v", got)
	}
}

func TestUnmatchedDescriptorIsNotLimited(t *testing.T) {
	l, _ := newLimiter(t, localRules, nil)
	res := l.Decide(context.Background(), Request{Domain: "api", Descriptors: [][]rules.Entry{desc("other", "x"), desc("user", "1")}})
	if res.Code != CodeOK || res.Statuses[0].Rule != nil || res.Statuses[0].Limit != nil || res.Statuses[1].Rule == nil {
		t.Fatalf("%+v", res)
	}
	res = l.Decide(context.Background(), Request{Domain: "nope", Descriptors: [][]rules.Entry{desc("user", "1")}})
	if res.Code != CodeOK || res.Statuses[0].Rule != nil {
		t.Fatalf("unknown domain: %+v", res)
	}
}

const globalRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
`

const globalKey = "api|user=42#60s"

// newGlobal returns a limiter with a fresh in-memory snapshot holding, for globalKey, the
// given per-site counts as of now.
func newGlobal(t *testing.T, sites map[string]float64, mods ...func(*Config)) (*Limiter, *clock.Fake, *snapshot.Snapshot, *recorder) {
	t.Helper()
	clk := clock.NewFake(t0)
	sn, err := snapshot.NewMemory(snapshot.Config{Site: "eu", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	heartbeat(t, sn, clk)
	if sites != nil {
		putCount(t, sn, clk, globalKey, sites)
	}
	pub := &recorder{}
	cfg := Config{Rules: StaticRules(loadRules(t, globalRules)), Site: "eu", Clock: clk, Snapshot: sn, Publisher: pub, DefaultShare: 1.0 / 3}
	for _, m := range mods {
		m(&cfg)
	}
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l, clk, sn, pub
}

func heartbeat(t testing.TB, sn *snapshot.Snapshot, clk clock.Clock) {
	t.Helper()
	hb := topics.Heartbeat{Instance: "agg", Topic: "hits", Partition: 0, AsOf: clk.Now().UnixMilli()}
	v, _ := hb.MarshalBinary()
	if err := sn.Apply([]byte(topics.HeartbeatKey("hits", 0)), v); err != nil {
		t.Fatal(err)
	}
}

func putCount(t *testing.T, sn *snapshot.Snapshot, clk clock.Clock, key string, sites map[string]float64) {
	t.Helper()
	c := topics.Count{Key: key, Window: 60000, AsOf: clk.Now().UnixMilli()}
	for _, s := range []string{"ap", "eu", "us"} {
		if v, ok := sites[s]; ok {
			c.Sites = append(c.Sites, topics.SiteCount{Site: s, Count: v})
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

func admitN(l *Limiter, req Request, tries int) int {
	n := 0
	for range tries {
		if l.Decide(context.Background(), req).Code == CodeOK {
			n++
		}
	}
	return n
}

var req42 = Request{Domain: "api", Descriptors: [][]rules.Entry{desc("user", "42")}}

func TestGlobalUsesRemotePlusExactLocal(t *testing.T) {
	// Other sites used 60 of 100; our own snapshot part (10) is replaced by the exact local
	// count, which starts at 0 in this process. With the hot-key rule off (30 of room at a
	// rate of 70/min over 1 ms is plenty), eu may use all the room the others left.
	l, _, _, pub := newGlobal(t, map[string]float64{"us": 40, "ap": 20, "eu": 10}, func(c *Config) {
		c.HotFraction, c.HotHorizon = 1e-9, time.Millisecond
	})
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
}

func TestGlobalHotKeyByDefault(t *testing.T) {
	// With the default HotFraction (1) every key with traffic is hot: eu (10 of 70) may
	// spend its share of the 30 left on top of its own 10. The share is smoothed toward
	// DefaultShare (1/3) with a prior of one limit (shareSmoothing): (10 + 100/3) / (70 +
	// 100) ≈ 0.255, so the cap is about 17.6, rounded to 17 or 18. (Before the smoothing
	// the raw share 1/7 gave 14 or 15.)
	l, _, _, _ := newGlobal(t, map[string]float64{"us": 40, "ap": 20, "eu": 10})
	if got := admitN(l, req42, 100); got != 17 && got != 18 {
		t.Fatalf("admitted %d, want 17 or 18", got)
	}
}

func TestGlobalHotKeySpendsOnlyItsShare(t *testing.T) {
	// 90 of 100 used: eu may spend only its share of the 10 left, (30 + 100/3) / (90 + 100)
	// = 1/3 (smoothed, see shareSmoothing), on top of its 30 in the snapshot: a cap of
	// 33.3, rounded to 33 or 34. The local count starts empty in this process.
	l, _, _, _ := newGlobal(t, map[string]float64{"us": 40, "ap": 20, "eu": 30})
	if got := admitN(l, req42, 100); got != 33 && got != 34 {
		t.Fatalf("admitted %d, want 33 or 34 (own 30 + a third of the 10 left)", got)
	}
}

// siteLimiters returns one Limiter per site of sites, each with its own snapshot holding
// the same count record of globalKey.
func siteLimiters(t *testing.T, clk *clock.Fake, sites map[string]float64) []*Limiter {
	t.Helper()
	var out []*Limiter
	for _, name := range []string{"ap", "eu", "us"} {
		sn, err := snapshot.NewMemory(snapshot.Config{Site: name, Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		heartbeat(t, sn, clk)
		putCount(t, sn, clk, globalKey, sites)
		l, err := New(Config{Rules: StaticRules(loadRules(t, globalRules)), Site: name, Clock: clk, Snapshot: sn, DefaultShare: 1.0 / 3})
		if err != nil {
			t.Fatal(err)
		}
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
		ls := siteLimiters(t, clk, counts)
		sum := 0
		for _, l := range ls {
			// The local counts start empty: each site may admit its count plus its share.
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
	if got := admitN(l, other, 100); got != 33 {
		t.Fatalf("stale, unknown key: admitted %d, want 33", got)
	}
	// Fresh data arrives: the 50 local hits reached the snapshot; remote us = 30 → room 20.
	heartbeat(t, sn, clk)
	putCount(t, sn, clk, globalKey, map[string]float64{"us": 30, "eu": 50})
	res := l.Decide(context.Background(), req42)
	if res.Code != CodeOK || res.Statuses[0].Fallback {
		t.Fatalf("after recovery: %+v", res.Statuses[0])
	}
}

func TestGlobalUnknownKeyGetsDefaultShareAndWindowSlides(t *testing.T) {
	// A key the fresh snapshot does not show may be new at every site: eu spends its
	// default share (a third of 100, dithered) until the pipeline shows the key.
	l, clk, sn, _ := newGlobal(t, nil)
	if got := admitN(l, req42, 150); got != 33 && got != 34 {
		t.Fatalf("admitted %d, want 33 or 34", got)
	}
	// A minute later our own hits have left the window (the local ring is exact).
	clk.Advance(61 * time.Second)
	heartbeat(t, sn, clk)
	if got := admitN(l, req42, 150); got != 33 && got != 34 {
		t.Fatalf("next window: admitted %d, want 33 or 34", got)
	}
	// With one site, the default share is the whole limit.
	l1, _, _, _ := newGlobal(t, nil, func(c *Config) { c.DefaultShare = 1 })
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
	fresh := func(mods ...func(*Config)) (*Limiter, *clock.Fake, *snapshot.Snapshot) {
		l, clk, sn, _ := newGlobal(t, nil, mods...)
		return l, clk, sn
	}
	// A: went through an outage. B: never stale. Both then see the same fresh snapshot:
	// us 45 and eu 5 of a limit of 100 (eu's share of the traffic 1/10).
	a, aclk, asn := fresh(func(c *Config) { c.RecoveryHold = 10 * time.Second })
	aclk.Advance(11 * time.Second)
	a.Decide(context.Background(), Request{Domain: "api", Descriptors: [][]rules.Entry{desc("user", "7")}}) // stale
	heartbeat(t, asn, aclk)
	putCount(t, asn, aclk, globalKey, map[string]float64{"us": 45, "eu": 5})
	b, bclk, bsn := fresh()
	heartbeat(t, bsn, bclk)
	putCount(t, bsn, bclk, globalKey, map[string]float64{"us": 45, "eu": 5})

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
	putCount(t, asn, aclk, globalKey, map[string]float64{"us": 45, "eu": 5 + float64(held)})
	if res := a.Decide(context.Background(), req42); res.Code != CodeOK {
		t.Fatalf("after the hold: %+v", res.Statuses[0])
	}
}
