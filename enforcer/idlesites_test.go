package enforcer

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/topics"
)

// idleRules is the idle-site tests' rule: 100 per 10 s on each user, the real-broker
// forgery test's (cmd/streamlimit TestKafkaForgedSiteRecords).
const idleRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {window: 10s, requests_per_unit: 100}
`

// idleDC is one data center in the idle-site tests: sites a and b, each an Engine over a
// snapshot of its own, and made-up sites that only heartbeat, all heard on the hits topic.
type idleDC struct {
	t      *testing.T
	clk    *clock.Fake
	ls     []*Engine
	sns    []*snapshot.Snapshot
	ghosts int
}

// newIdleDC returns a and b (running for longer than any window) beside ghosts made-up
// sites.
func newIdleDC(t *testing.T, ghosts int) *idleDC {
	t.Helper()
	d := &idleDC{t: t, clk: clock.NewFake(t0), ghosts: ghosts}
	for _, site := range []string{"a", "b"} {
		sn, err := snapshot.NewMemory(snapshot.Config{Site: site, Clock: d.clk})
		if err != nil {
			t.Fatal(err)
		}
		l, err := New(Config{Rules: rules.Static(loadRules(t, idleRules)), Site: site, Clock: d.clk, Snapshot: sn, Registerer: prometheus.NewRegistry()})
		if err != nil {
			t.Fatal(err)
		}
		l.born = time.Time{}
		d.ls, d.sns = append(d.ls, l), append(d.sns, sn)
	}
	return d
}

// heartbeat gives both snapshots an aggregator heartbeat as of now that hears a, b and
// the made-up sites now.
func (d *idleDC) heartbeat() {
	now := d.clk.Now().UnixMilli()
	heard := map[string]int64{"a": now, "b": now}
	for k := range d.ghosts {
		heard[fmt.Sprintf("ghost-%d", k)] = now
	}
	for _, sn := range d.sns {
		heartbeat(d.t, sn, d.clk, heard)
	}
}

// serve gives both snapshots a count of a key of no test's that lists sites: they have
// served.
func (d *idleDC) serve(sites ...string) {
	counts := map[string]float64{}
	for _, s := range sites {
		counts[s] = 1
	}
	for _, sn := range d.sns {
		putCount(d.t, sn, d.clk, "api|user=elsewhere#10s", counts, nil)
	}
}

// settle lets SiteStaleAfter pass and heartbeats: a site shown serving takes the sites
// not shown serving as idle only once it has been shown serving that long
// (sharing.selfServed).
func (d *idleDC) settle() {
	d.clk.Advance(Defaults().SiteStaleAfter)
	d.heartbeat()
}

// burst sends n requests of a key new to the snapshots at each site, and returns what
// each admitted.
func (d *idleDC) burst(user string, n int) (a, b int) {
	req := Request{Domain: "api", Descriptors: [][]rules.Entry{desc("user", user)}}
	return admitN(d.ls[0], req, n), admitN(d.ls[1], req, n)
}

// Sites that only heartbeat — made-up names, which anyone allowed to write the hits topic
// can announce without site keys — are given no share once a and b have served: a key
// new to both is split between a and b alone, so a burst at both is admitted up to the
// limit and no more, and a client at 80% of its limit alternating between them is denied
// nothing. Before, each of the 52 sites was given a 52nd of the key: the burst got 4 of
// 100, and the client was denied.
func TestGlobalIdleSitesShareNothing(t *testing.T) {
	d := newIdleDC(t, 50)
	d.heartbeat()
	d.serve("a", "b")
	d.settle()
	a, b := d.burst("42", 150)
	if a+b > 102 || a+b < 98 || a < 49 || b < 49 {
		t.Errorf("burst on a new key with 50 made-up sites heartbeating: admitted %d at a and %d at b, want about 50 each, at most 102 together", a, b)
	}

	// A client at 80% of its limit, 80 requests over one window, alternating; a count of
	// its key, made from what each site had admitted and been asked two requests before
	// (250 ms: a pipeline lag), comes back with each request.
	const key = "api|user=7#10s"
	req := Request{Domain: "api", Descriptors: [][]rules.Entry{desc("user", "7")}}
	var at [2][]time.Time // each site's requests
	var ok [2][]bool      // and whether each was admitted
	denied := 0
	step := 10 * time.Second / 80
	for i := range 80 {
		d.heartbeat()
		if i >= 2 {
			asOf := d.clk.Now().Add(-2 * step)
			counts, demand := map[string]float64{}, map[string]float64{}
			for s, name := range []string{"a", "b"} {
				for j, ts := range at[s] {
					if ts.After(asOf) {
						break
					}
					if ok[s][j] {
						counts[name]++
					}
					demand[name] += math.Exp(-float64(asOf.Sub(ts)) / float64(time.Second))
				}
			}
			if len(demand) > 0 {
				for _, sn := range d.sns {
					putCountAsOf(t, sn, key, 10_000, asOf.UnixMilli(), counts, demand)
				}
			}
		}
		s := i % 2
		res := d.ls[s].Decide(t.Context(), req)
		at[s] = append(at[s], d.clk.Now())
		ok[s] = append(ok[s], res.Code == CodeOK)
		if res.Code != CodeOK {
			denied++
		}
		d.clk.Advance(step)
	}
	if denied != 0 {
		t.Errorf("a client at 80%% of its limit, 50 made-up sites heartbeating: %d of 80 requests denied, want 0", denied)
	}
}

// Two real sites that start serving a key at once each keep to their share, whether both
// have served before, or neither has (a new deployment: each counts every live site,
// made-up ones included, until a count shows it serving). A site that has served gives a
// new one nothing until a count shows the new one serving: a key new at both within that
// lag is admitted up to the limit and the new site's part (1 + 1/n times the limit, n
// the live sites it counts), the bound docs/sites.md gives. Once the new site is shown
// serving, the key is split again.
func TestGlobalSitesStartingAKeyAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ghosts int
		served []string
		// settled: the served sites have been shown serving for SiteStaleAfter.
		settled bool
		// lo and hi bound the total admitted of a burst of 150 at each site.
		lo, hi int
	}{
		{name: "both served", served: []string{"a", "b"}, settled: true, lo: 98, hi: 102},
		{name: "neither served", lo: 98, hi: 102},
		{name: "neither served, made-up sites", ghosts: 8, lo: 18, hi: 24},
		// Both started at once, and a's first count came back before b's: a still counts b.
		{name: "a shown serving a moment before b", served: []string{"a"}, lo: 98, hi: 102},
		// a takes the whole limit, b its half: the bound.
		{name: "only a served", served: []string{"a"}, settled: true, lo: 148, hi: 152},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newIdleDC(t, tc.ghosts)
			d.heartbeat()
			if len(tc.served) > 0 {
				d.serve(tc.served...)
			}
			if tc.settled {
				d.settle()
			}
			a, b := d.burst("42", 150)
			if a+b < tc.lo || a+b > tc.hi {
				t.Errorf("admitted %d at a and %d at b, want %d to %d together", a, b, tc.lo, tc.hi)
			}
			// Once both are shown serving, a key new at both is split between them alone.
			d.clk.Advance(200 * time.Millisecond)
			d.heartbeat()
			d.serve("a", "b")
			d.settle()
			if a, b := d.burst("43", 150); a+b < 98 || a+b > 102 {
				t.Errorf("both shown serving: admitted %d at a and %d at b, want about 100 together", a, b)
			}
		})
	}
}

// A site shown serving by no count within servedSpan is idle again: a site that served an
// hour ago and has only heartbeated since is given no share of a new key.
func TestGlobalSiteIdleAfterServedSpan(t *testing.T) {
	d := newIdleDC(t, 0)
	d.heartbeat()
	d.serve("a", "b")
	d.clk.Advance(servedSpan - time.Minute)
	d.heartbeat()
	d.serve("a") // a goes on serving; b only heartbeats
	d.clk.Advance(2 * time.Minute)
	d.heartbeat()
	d.serve("a")
	req := Request{Domain: "api", Descriptors: [][]rules.Entry{desc("user", "42")}}
	if got := admitN(d.ls[0], req, 150); got != 100 {
		t.Errorf("b idle for longer than servedSpan: a admitted %d of a new key, want 100", got)
	}
}

// putCountAsOf applies a count of key over window (ms) as of asOf (unix ms), with each
// site's count and demand.
func putCountAsOf(t *testing.T, sn *snapshot.Snapshot, key string, window, asOf int64, counts, demand map[string]float64) {
	t.Helper()
	c := topics.Count{Key: key, Window: window, AsOf: asOf}
	for _, s := range slices.Sorted(maps.Keys(demand)) {
		c.Sites = append(c.Sites, topics.SiteCount{Site: s, Count: counts[s], Demand: demand[s]})
		c.Total += counts[s]
	}
	v, err := c.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if err := sn.Apply([]byte(key), v); err != nil {
		t.Fatal(err)
	}
}

// A data center none of whose sites has served (its clients all elsewhere) keeps its
// share: heartbeats cannot make up a data center, whose hits topic is the deployment's,
// and its share is the margin the others keep for the moment its clients arrive. With a
// and b settled serving, eu-a, heard on eu's replicated topic and never shown serving, is
// still given a third of a new key at a.
func TestGlobalUnservedDataCenterKeepsItsShare(t *testing.T) {
	d := newIdleDC(t, 0)
	remote := func() {
		for _, sn := range d.sns {
			sourceHeartbeat(t, sn, d.clk, "eu.hits", map[string]int64{"eu-a": d.clk.Now().UnixMilli()}, nil)
		}
	}
	d.heartbeat()
	remote()
	d.serve("a", "b")
	d.settle()
	remote()
	req := Request{Domain: "api", Descriptors: [][]rules.Entry{desc("user", "42")}}
	if got := admitN(d.ls[0], req, 150); got != 33 && got != 34 {
		t.Errorf("a data center that has not served beside a and b: a admitted %d of a new key, want 33 or 34", got)
	}
}
