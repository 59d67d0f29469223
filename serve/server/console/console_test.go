package console

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/snapshot"
	"github.com/streamlimit/streamlimit/topics"
)

var t0 = time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)

const consoleRules = `
domain: api
pools:
  - name: all
    rate_limit: {requests_per_unit: 1000, unit: minute}
descriptors:
  - key: user
    rate_limit: {requests_per_unit: 10, unit: minute, soft_percent: 20}
  - key: ip
    rate_limit: {requests_per_unit: 2, unit: second, scope: local}
    shadow_mode: true
  - key: plan
    value: paid
    rate_limit: {requests_per_unit: 100, unit: minute, pool: all}
`

type fixture struct {
	clk *clock.Fake
	sn  *snapshot.Snapshot
	lim *enforcer.Engine
	c   *Console
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{clk: clock.NewFake(t0)}
	var err error
	if f.sn, err = snapshot.NewMemory(snapshot.Config{Site: "eu", Clock: f.clk}); err != nil {
		t.Fatal(err)
	}
	rs, err := rules.Parse("console.yaml", []byte(consoleRules))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if f.lim, err = enforcer.New(enforcer.Config{Rules: rules.Static(rs), Site: "eu", Clock: f.clk, Snapshot: f.sn, Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if f.c, err = New(Options{Limiter: f.lim, Gatherer: reg, TopKeys: 2}); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) apply(t *testing.T, key string, v interface{ MarshalBinary() ([]byte, error) }) {
	t.Helper()
	b, err := v.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.sn.Apply([]byte(key), b); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) count(t *testing.T, key string, sites ...topics.SiteCount) {
	t.Helper()
	c := topics.Count{Key: key, Window: 60_000, AsOf: f.clk.Now().UnixMilli(), Sites: sites}
	for _, s := range sites {
		c.Total += s.Count
	}
	f.apply(t, key, &c)
}

// The State shows what the Limiter, its snapshot, its rules and its registry hold: the
// sites in their states, the top keys with their per-site counts and limits (soft band
// included), the rules and pools, the keys denied and the decision counters.
func TestState(t *testing.T) {
	f := newFixture(t)
	ms := f.clk.Now().UnixMilli()
	hb := topics.Heartbeat{Instance: "agg", Topic: "hits", AsOf: ms,
		Sites: map[string]int64{"eu": ms, "ap": ms - 4_000}, Left: map[string]int64{"us": ms - 1_000}}
	f.apply(t, topics.HeartbeatKey("hits", 0), &hb)
	f.count(t, "api|user=1#60s", topics.SiteCount{Site: "eu", Count: 5, Demand: 6}, topics.SiteCount{Site: "us", Count: 4, Demand: 4})
	f.count(t, "api|user=2#60s", topics.SiteCount{Site: "eu", Count: 3, Demand: 3})
	f.count(t, "api|pool=all#60s|pool", topics.SiteCount{Site: "eu", Count: 1, Demand: 1})
	f.count(t, "api|user=3#60s", topics.SiteCount{Site: "eu", Count: 1, Demand: 1}) // below the top 2

	ctx := context.Background()
	user1 := enforcer.Request{Domain: "api", Descriptors: [][]rules.Entry{{{Key: "user", Value: "1"}}}}
	admitted := 0
	for range 20 {
		if f.lim.Decide(ctx, user1).Code == enforcer.CodeOK {
			admitted++
		}
	}
	if admitted == 0 || admitted == 20 {
		t.Fatalf("user 1 admitted %d of 20: the test wants some admitted and some denied", admitted)
	}

	st := f.c.State(f.clk.Now())
	if st.Site != "eu" || st.Now != ms || st.Snapshot == nil || !st.Snapshot.Ready || st.Snapshot.Keys != 4 {
		t.Errorf("header: site %q now %d snapshot %+v", st.Site, st.Now, st.Snapshot)
	}
	// ap, crashed 4 s ago, keeps a fading reservation until the hold is over.
	if cfg := f.c.opts.Limiter.Config(); st.CrashHoldMs != (cfg.SiteStaleAfter+cfg.CrashHold).Milliseconds() || st.CrashHoldMs <= 4_000 {
		t.Errorf("crash hold %d ms, want SiteStaleAfter %v + CrashHold %v, past ap's 4 s of silence", st.CrashHoldMs, cfg.SiteStaleAfter, cfg.CrashHold)
	}
	wantSites := []Site{
		{Site: "ap", State: "crashed", Heard: ms - 4_000, SilentMs: 4_000, Peer: ms},
		{Site: "eu", State: "fresh", Self: true, Heard: ms, Peer: ms - 4_000},
		{Site: "us", State: "left", Heard: ms - 1_000, Peer: ms},
	}
	if len(st.Sites) != len(wantSites) {
		t.Fatalf("sites %+v, want %+v", st.Sites, wantSites)
	}
	for i, w := range wantSites {
		if st.Sites[i] != w {
			t.Errorf("site %d = %+v, want %+v", i, st.Sites[i], w)
		}
	}

	if len(st.Top) != 2 || st.Top[0].Key != "api|user=1#60s" || st.Top[1].Key != "api|user=2#60s" {
		t.Fatalf("top = %+v, want users 1 and 2", st.Top)
	}
	top := st.Top[0]
	userLimit := Limit{Requests: 12, Hard: 10, WindowMs: 60_000, Scope: "global", Algorithm: "sliding_window", SoftBand: &[2]int64{11, 12}, Line: 8}
	if top.Total != 9 || top.Rule != "api.user" || top.Limit == nil || !sameLimit(*top.Limit, userLimit) ||
		len(top.Sites) != 2 || top.Sites[0] != (SiteCount{Site: "eu", Count: 5, Demand: 6}) || top.Sites[1] != (SiteCount{Site: "us", Count: 4, Demand: 4}) {
		t.Errorf("top key = %+v (limit %+v), want 9 = eu 5 (demand 6) + us 4 of api.user, %+v", top, top.Limit, userLimit)
	}

	byID := map[string]Rule{}
	for _, r := range st.Rules {
		byID[r.ID] = r
	}
	if r := byID["api.user"]; r.Descriptor != "user" || r.File != "console.yaml" || r.Line == 0 || len(r.Limits) != 1 || !sameLimit(r.Limits[0], userLimit) {
		t.Errorf("rule api.user = %+v", r)
	}
	if r := byID["api.ip"]; !r.Shadow || len(r.Limits) != 1 || r.Limits[0].Scope != "local" || r.Limits[0].WindowMs != 1000 || r.Limits[0].SoftBand != nil {
		t.Errorf("rule api.ip = %+v", r)
	}
	if r := byID["api.plan_paid"]; r.Descriptor != "plan=paid" || len(r.Limits) != 1 || r.Limits[0].Pool != "all" {
		t.Errorf("rule api.plan_paid = %+v", r)
	}
	if r := byID["pool all"]; len(r.Limits) != 1 || r.Limits[0].Requests != 1000 {
		t.Errorf("pool all = %+v", r)
	}

	if len(st.Denials) != 1 || st.Denials[0].Key != "api|user=1#60s" || st.Denials[0].Rule != "api.user" ||
		st.Denials[0].Site != "eu" || st.Denials[0].Scope != "global" || st.Denials[0].Time != ms {
		t.Errorf("denials = %+v, want user 1 denied at eu", st.Denials)
	}

	totals := map[string]float64{}
	for _, d := range st.Decisions {
		if d.Domain == "api" && d.Rule == "api.user" {
			totals[d.Result] += d.Total
		}
	}
	if totals["ok"]+totals["soft"] != float64(admitted) || totals["over_limit"] != float64(20-admitted) {
		t.Errorf("decision totals %v, want %d admitted (ok or soft) and %d over_limit", totals, admitted, 20-admitted)
	}
}

func sameLimit(a, b Limit) bool {
	if (a.SoftBand == nil) != (b.SoftBand == nil) || (a.SoftBand != nil && *a.SoftBand != *b.SoftBand) {
		return false
	}
	a.SoftBand, b.SoftBand = nil, nil
	return a == b
}

// The handler serves the page, its script and style, and the State, with headers that
// forbid framing and foreign scripts; the State is made anew only once Refresh has passed.
func TestHandler(t *testing.T) {
	f := newFixture(t)
	srv := httptest.NewServer(http.StripPrefix("/ui", f.c.Handler()))
	t.Cleanup(srv.Close)
	get := func(path string) (*http.Response, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s\n%s", path, resp.Status, b)
		}
		return resp, string(b)
	}
	resp, page := get("/ui/")
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
		t.Errorf("page Content-Type %q", ct)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("page Content-Security-Policy %q", csp)
	}
	for _, ref := range []string{`src="console.js"`, `href="console.css"`} {
		if !strings.Contains(page, ref) {
			t.Errorf("page has no %s", ref)
		}
	}
	for path, ct := range map[string]string{"/ui/console.js": "text/javascript", "/ui/console.css": "text/css"} {
		if resp, body := get(path); !strings.HasPrefix(resp.Header.Get("Content-Type"), ct) || len(body) < 100 {
			t.Errorf("%s: Content-Type %q, %d bytes", path, resp.Header.Get("Content-Type"), len(body))
		}
	}

	state := func() State {
		t.Helper()
		resp, body := get("/ui" + StatePath)
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("state Content-Type %q", ct)
		}
		var st State
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			t.Fatalf("state: %v\n%s", err, body)
		}
		return st
	}
	first := state()
	f.clk.Advance(DefaultRefresh / 2)
	if again := state(); again.Now != first.Now {
		t.Errorf("state made anew after %v, within Refresh", DefaultRefresh/2)
	}
	f.clk.Advance(DefaultRefresh / 2)
	if next := state(); next.Now != first.Now+DefaultRefresh.Milliseconds() {
		t.Errorf("state as of %d after Refresh, want %d", next.Now, first.Now+DefaultRefresh.Milliseconds())
	}
}

// Without a snapshot (no Kafka) the State has this site alone and no keys.
func TestStateWithoutSnapshot(t *testing.T) {
	rs, err := rules.Parse("console.yaml", []byte(consoleRules))
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(t0)
	lim, err := enforcer.New(enforcer.Config{Rules: rules.Static(rs), Site: "eu", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Options{Limiter: lim})
	if err != nil {
		t.Fatal(err)
	}
	st := c.State(clk.Now())
	if st.Snapshot != nil || len(st.Top) != 0 || st.Decisions != nil || len(st.Sites) != 1 || st.Sites[0].Site != "eu" || len(st.Rules) != 4 {
		t.Errorf("State = %+v", st)
	}
	b, err := json.Marshal(st)
	if err != nil || !strings.Contains(string(b), `"top":[]`) || !strings.Contains(string(b), `"snapshot":null`) {
		t.Errorf("encoded %s, %v: want empty lists as [] and no snapshot as null, as the page reads them", b, err)
	}
	if _, err := New(Options{}); err == nil {
		t.Error("New without a Limiter: no error")
	}
}

// Between two passes over the snapshot, which a large snapshot spaces out, the top keys
// keep their places in the list but show their counts as of now; a key that grew in the
// meantime shows up at the next pass.
func TestTopKeysBetweenPasses(t *testing.T) {
	f := newFixture(t)
	f.c.elapsed = func(time.Time) time.Duration { return time.Second } // a pass of 1 s: the next in 20 s
	eu := func(n float64) topics.SiteCount { return topics.SiteCount{Site: "eu", Count: n, Demand: n} }
	f.count(t, "api|user=1#60s", eu(5))
	f.count(t, "api|user=2#60s", eu(3))
	f.count(t, "api|user=3#60s", eu(1))
	keys := func() string {
		var b strings.Builder
		for _, k := range f.c.State(f.clk.Now()).Top {
			fmt.Fprintf(&b, "%s=%v ", k.Key, k.Total)
		}
		return b.String()
	}
	if got, want := keys(), "api|user=1#60s=5 api|user=2#60s=3 "; got != want {
		t.Fatalf("first pass: %q, want %q", got, want)
	}
	f.clk.Advance(time.Second)
	f.count(t, "api|user=2#60s", eu(8))
	f.count(t, "api|user=3#60s", eu(9))
	if got, want := keys(), "api|user=2#60s=8 api|user=1#60s=5 "; got != want {
		t.Fatalf("between passes: %q, want %q (the counts of the keys found, sorted anew)", got, want)
	}
	f.clk.Advance(20 * time.Second)
	if got, want := keys(), "api|user=3#60s=9 api|user=2#60s=8 "; got != want {
		t.Fatalf("next pass: %q, want %q", got, want)
	}
}
