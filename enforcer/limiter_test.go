package enforcer

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/enforcer/rules"
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
	mu     sync.Mutex
	hits   map[string]int
	denied map[string]int
}

func (r *recorder) Hit(key string, _ time.Duration, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.hits == nil {
		r.hits = map[string]int{}
	}
	r.hits[key] += n
}

func (r *recorder) Denied(key string, _ time.Duration, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.denied == nil {
		r.denied = map[string]int{}
	}
	r.denied[key] += n
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

func newLimiter(t testing.TB, yaml string, mod func(*Config)) (*Engine, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(t0)
	cfg := Config{Rules: rules.Static(loadRules(t, yaml)), Site: "eu", Clock: clk}
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

// A request with more than 64 limits, the last of them a shadow limit already over: the
// shadow limit must not deny, however many limits come before it.
func TestShadowModeNeverDeniesPast64Limits(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: many\ndescriptors:\n")
	for i := range 70 {
		fmt.Fprintf(&b, "  - key: k%d\n    rate_limit: {unit: minute, requests_per_unit: 100, scope: local}\n", i)
	}
	b.WriteString("  - key: shadow\n    shadow_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 1, scope: local}\n")
	l, _ := newLimiter(t, b.String(), nil)
	var req Request
	req.Domain = "many"
	for i := range 70 {
		req.Descriptors = append(req.Descriptors, desc(fmt.Sprintf("k%d", i), "x"))
	}
	req.Descriptors = append(req.Descriptors, desc("shadow", "x"))
	for i := range 3 {
		res := l.Decide(context.Background(), req)
		if res.Code != CodeOK {
			t.Fatalf("request %d denied by a shadow limit: %+v", i, res.Statuses[70])
		}
		if i > 0 && !res.Statuses[70].Shadow {
			t.Fatalf("request %d: the shadow limit is over but not reported: %+v", i, res.Statuses[70])
		}
	}
}

// DecideAt decides at the caller's instant, not the Engine's clock: a limit of 3 per
// minute admits 3 at t, denies the 4th at t+59 s, and admits again at t+61 s, while the
// Engine's own clock never moves.
func TestDecideAt(t *testing.T) {
	l, clk := newLimiter(t, localRules, nil)
	req := Request{Domain: "api", Descriptors: [][]rules.Entry{desc("user", "1")}}
	ctx := context.Background()
	var res Result
	at := func(d time.Duration) Code {
		l.DecideAt(ctx, t0.Add(d), req, &res)
		return res.Code
	}
	for i := range 3 {
		if got := at(time.Duration(i) * time.Second); got != CodeOK {
			t.Fatalf("request %d: %v", i, got)
		}
	}
	if got := at(59 * time.Second); got != CodeOverLimit {
		t.Fatalf("at +59 s: %v, want OVER_LIMIT", got)
	}
	if got := at(121 * time.Second); got != CodeOK {
		t.Fatalf("at +121 s: %v, want OK", got)
	}
	if !clk.Now().Equal(t0) {
		t.Fatalf("the Engine's clock moved to %v", clk.Now())
	}
}

// A denied request takes nothing from the limits that passed, and they say so: each
// reports the room it has, not the room it would have had after the request.
func TestDeniedRequestKeepsPassingLimitsRemaining(t *testing.T) {
	for _, scope := range []string{"local", "global"} {
		t.Run(scope, func(t *testing.T) {
			l, _ := newLimiter(t, `
domain: api
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 10, scope: `+scope+`}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 1, scope: local}
`, nil)
			req := Request{Domain: "api", Descriptors: [][]rules.Entry{desc("a", "1"), desc("b", "1")}}
			first := l.Decide(context.Background(), req)
			if first.Code != CodeOK || first.Statuses[0].Remaining != 9 {
				t.Fatalf("first: %v, a remaining %d, want OK and 9", first.Code, first.Statuses[0].Remaining)
			}
			second := l.Decide(context.Background(), req)
			if second.Code != CodeOverLimit || second.Statuses[1].Code != CodeOverLimit {
				t.Fatalf("second: %v, b %v, want b to deny", second.Code, second.Statuses[1].Code)
			}
			if a := second.Statuses[0]; a.Code != CodeOK || a.Remaining != 9 {
				t.Fatalf("second, a: %v remaining %d, want OK and still 9", a.Code, a.Remaining)
			}
		})
	}
}

// storeSite is a SiteStore that keeps the site's counters in one algo.Store of its own,
// as a site of one process would, and counts its calls.
type storeSite struct {
	st    *algo.Store
	calls int
}

func (s *storeSite) AllowAll(_ context.Context, now time.Time, ops []algo.Op, out []algo.Decision) (bool, bool) {
	s.calls++
	return s.st.AllowAll(now, ops, out), false
}

// A request refused by a local limit never reaches the site store: its site limits are
// not reported (they were not asked), where they used to be reported as refusing.
func TestSiteLimitsNotAskedAreNotReported(t *testing.T) {
	site := &storeSite{st: algo.New(algo.Options{})}
	l, _ := newLimiter(t, `
domain: api
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 10, scope: site}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 1, scope: local}
`, func(c *Config) { c.SiteStore = site })
	req := Request{Domain: "api", Descriptors: [][]rules.Entry{desc("a", "1"), desc("b", "1")}}
	if r := l.Decide(context.Background(), req); r.Code != CodeOK || r.Statuses[0].Remaining != 9 {
		t.Fatalf("first: %v, a remaining %d", r.Code, r.Statuses[0].Remaining)
	}
	r := l.Decide(context.Background(), req)
	if r.Code != CodeOverLimit || site.calls != 1 {
		t.Fatalf("second: %v after %d site calls, want denied by b without asking the site", r.Code, site.calls)
	}
	if a := r.Statuses[0]; a.Code != CodeOK || a.RetryAfter != 0 || a.Limit != nil {
		t.Fatalf("second, a: %+v, want OK and not reported", a)
	}
}
