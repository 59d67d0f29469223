package headers

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/internal/sftest"
)

const testRules = `
domain: api
descriptors:
  - key: user
    rate_limits:
      - {unit: minute, requests_per_unit: 3, scope: local, algorithm: fixed_window}
      - {window: 1h, requests_per_unit: 10, scope: local, algorithm: fixed_window}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 5, scope: local, algorithm: fixed_window, name: "per \"ip\""}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1, scope: local, algorithm: fixed_window}
  - key: free
    rate_limit: {unlimited: true}
`

var t0 = time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)

func newLimiter(t testing.TB) (*enforcer.Engine, *clock.Fake) {
	t.Helper()
	cfg, err := rules.Parse("rules.yaml", []byte(testRules))
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(t0)
	l, err := enforcer.New(enforcer.Config{Rules: rules.Static(cfg), Site: "t", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return l, clk
}

func req(descs ...[]string) enforcer.Request {
	r := enforcer.Request{Domain: "api"}
	for _, d := range descs {
		var es []rules.Entry
		for i := 0; i+1 < len(d); i += 2 {
			es = append(es, rules.Entry{Key: d[i], Value: d[i+1]})
		}
		r.Descriptors = append(r.Descriptors, es)
	}
	return r
}

func fieldMap(fs []Field) map[string]string {
	m := map[string]string{}
	for _, f := range fs {
		if _, dup := m[f.Name]; dup {
			panic("duplicate field " + f.Name)
		}
		m[f.Name] = f.Value
	}
	return m
}

// item checks one parsed list member: its string value and integer parameters.
func checkItem(t *testing.T, field string, it sftest.Item, name string, params ...any) {
	t.Helper()
	if s, ok := it.Value.(string); !ok || s != name {
		t.Errorf("%s: item %#v, want string %q", field, it.Value, name)
	}
	if len(it.Params) != len(params)/2 {
		t.Errorf("%s %q: params %v, want %v", field, name, it.Params, params)
	}
	for i := 0; i+1 < len(params); i += 2 {
		k := params[i].(string)
		v, ok := it.Param(k)
		if !ok || v != int64(params[i+1].(int)) {
			t.Errorf("%s %q: %s = %v (%v), want %v", field, name, k, v, ok, params[i+1])
		}
	}
}

func mustList(t *testing.T, field, v string) []sftest.Item {
	t.Helper()
	items, err := sftest.ParseList(v)
	if err != nil {
		t.Fatalf("%s: %q is not a structured-field list: %v", field, v, err)
	}
	return items
}

func TestAdmittedFields(t *testing.T) {
	l, clk := newLimiter(t)
	clk.Advance(15 * time.Second) // 45 s left in the minute window, 45 min 45 s... of the hour
	res := l.Decide(context.Background(), req([]string{"user", "42"}, []string{"ip", "192.0.2.1"}))
	if res.Code != enforcer.CodeOK {
		t.Fatalf("decision %+v", res)
	}
	f := fieldMap(Append(nil, &res))
	pol := mustList(t, RateLimitPolicy, f[RateLimitPolicy])
	if len(pol) != 3 {
		t.Fatalf("RateLimit-Policy %q: %d items, want every limit that applied (3)", f[RateLimitPolicy], len(pol))
	}
	// Every limit that applied is listed: both of the user rule's, then the ip rule's.
	checkItem(t, RateLimitPolicy, pol[0], "api.user-60s", "q", 3, "w", 60)
	checkItem(t, RateLimitPolicy, pol[1], "api.user-3600s", "q", 10, "w", 3600)
	checkItem(t, RateLimitPolicy, pol[2], `per "ip"`, "q", 5, "w", 1)
	if !strings.Contains(f[RateLimitPolicy], `"per \"ip\""`) {
		t.Errorf("quote not escaped: %q", f[RateLimitPolicy])
	}
	// RateLimit gives the one closest to exhaustion: 2 of 3 left this minute.
	st := mustList(t, RateLimit, f[RateLimit])
	if len(st) != 1 {
		t.Fatalf("RateLimit %q", f[RateLimit])
	}
	checkItem(t, RateLimit, st[0], "api.user-60s", "r", 2, "t", 45)
	// X-RateLimit-* speak for the status with the least remaining: user, 2 left.
	want := map[string]string{XRateLimitLimit: "3", XRateLimitRemain: "2", XRateLimitReset: "45"}
	for k, v := range want {
		if f[k] != v {
			t.Errorf("%s = %q, want %q", k, f[k], v)
		}
	}
	if _, ok := f[RetryAfter]; ok {
		t.Errorf("Retry-After on an admitted request: %q", f[RetryAfter])
	}
	if len(f) != 5 {
		t.Errorf("fields %v", f)
	}
}

func TestDeniedFields(t *testing.T) {
	l, clk := newLimiter(t)
	r := req([]string{"user", "42"})
	for range 3 {
		l.Decide(context.Background(), r)
	}
	clk.Advance(20*time.Second + 300*time.Millisecond)
	res := l.Decide(context.Background(), r)
	if res.Code != enforcer.CodeOverLimit {
		t.Fatalf("decision %+v", res)
	}
	f := fieldMap(Append(nil, &res))
	checkItem(t, RateLimitPolicy, mustList(t, RateLimitPolicy, f[RateLimitPolicy])[0], "api.user-60s", "q", 3, "w", 60)
	// 39.7 s to the end of the minute, rounded up: t and Retry-After name one instant.
	checkItem(t, RateLimit, mustList(t, RateLimit, f[RateLimit])[0], "api.user-60s", "r", 0, "t", 40)
	if f[RetryAfter] != "40" || f[XRateLimitRemain] != "0" || f[XRateLimitLimit] != "3" || f[XRateLimitReset] != "40" {
		t.Errorf("fields %v", f)
	}
}

func TestShadowAndUnlimitedAreNotAdvertised(t *testing.T) {
	l, _ := newLimiter(t)
	r := req([]string{"trial", "x"}, []string{"free", "y"})
	l.Decide(context.Background(), r)
	res := l.Decide(context.Background(), r) // over the shadow limit
	if res.Code != enforcer.CodeOK || !res.Statuses[0].Shadow {
		t.Fatalf("decision %+v", res)
	}
	if f := Append(nil, &res); len(f) != 0 {
		t.Fatalf("shadow/unlimited fields: %v", f)
	}
	if p := Primary(&res); p != nil {
		t.Fatalf("Primary = %+v", p)
	}
}

func TestSamePolicyTwiceIsOneItem(t *testing.T) {
	l, _ := newLimiter(t)
	l.Decide(context.Background(), req([]string{"user", "a"}))
	// Two descriptors of one rule (two users in one request): one item, the worse state.
	res := l.Decide(context.Background(), req([]string{"user", "b"}, []string{"user", "a"}))
	f := fieldMap(Append(nil, &res))
	pol := mustList(t, RateLimitPolicy, f[RateLimitPolicy])
	st := mustList(t, RateLimit, f[RateLimit])
	if len(pol) != 2 || len(st) != 1 {
		t.Fatalf("policy %q, state %q: want the rule's two limits once each, one state", f[RateLimitPolicy], f[RateLimit])
	}
	checkItem(t, RateLimit, st[0], "api.user-60s", "r", 1, "t", 60)
}

func TestSFStringReplacesNonASCII(t *testing.T) {
	var res enforcer.Result
	lim := &rules.Limit{Name: "naïve\\\n", Requests: 1, Window: time.Minute}
	res.Statuses = []enforcer.Status{{Code: enforcer.CodeOK, Limit: lim, Requests: 1, Window: time.Minute, Remaining: 1}}
	res.Code = enforcer.CodeOK
	f := fieldMap(Append(nil, &res))
	items := mustList(t, RateLimitPolicy, f[RateLimitPolicy])
	if got := items[0].Value; got != "na??ve\\?" {
		t.Fatalf("name %q from %q", got, f[RateLimitPolicy])
	}
}

func TestSeconds(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int64
	}{{0, 0}, {-time.Second, 0}, {time.Nanosecond, 1}, {time.Second, 1}, {1001 * time.Millisecond, 2}, {time.Hour, 3600}, {MaxRetryAfter + 1, int64(MaxRetryAfter / time.Second)}, {1<<63 - 1, int64(MaxRetryAfter / time.Second)}} {
		if got := Seconds(c.d); got != c.want {
			t.Errorf("Seconds(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}

// TestReplacedLimitIsNotAdvertised checks that a limit which another matched limit
// replaces (it did not apply) is left out of RateLimit-Policy, and that a request that can
// never pass (a limit of 0) is told MaxRetryAfter, not an overflowing duration.
func TestReplacedLimitIsNotAdvertised(t *testing.T) {
	cfg, err := rules.Parse("rules.yaml", []byte(`
domain: api
descriptors:
  - key: user
    rate_limits:
      - {name: base, unit: minute, requests_per_unit: 5, scope: local, algorithm: fixed_window}
      - {name: daily, unit: day, requests_per_unit: 100, scope: local, algorithm: fixed_window}
  - key: vip
    rate_limit: {name: vip, unit: minute, requests_per_unit: 50, scope: local, algorithm: fixed_window, replaces: [{name: base}]}
  - key: banned
    rate_limit: {unit: minute, requests_per_unit: 0}
`))
	if err != nil {
		t.Fatal(err)
	}
	l, err := enforcer.New(enforcer.Config{Rules: rules.Static(cfg), Site: "t", Clock: clock.NewFake(t0)})
	if err != nil {
		t.Fatal(err)
	}
	res := l.Decide(context.Background(), req([]string{"user", "1"}, []string{"vip", "yes"}))
	f := fieldMap(Append(nil, &res))
	var names []string
	for _, it := range mustList(t, RateLimitPolicy, f[RateLimitPolicy]) {
		names = append(names, fmt.Sprint(it.Value))
	}
	if got := strings.Join(names, ","); got != "daily,vip" {
		t.Errorf("RateLimit-Policy names %s (%q), want daily,vip", got, f[RateLimitPolicy])
	}
	res = l.Decide(context.Background(), req([]string{"banned", "x"}))
	f = fieldMap(Append(nil, &res))
	year := strconv.FormatInt(int64(MaxRetryAfter/time.Second), 10)
	if res.Code != enforcer.CodeOverLimit || f[RetryAfter] != year {
		t.Errorf("never-admitted request: %v, Retry-After %q, want %s", res.Code, f[RetryAfter], year)
	}
	checkItem(t, RateLimit, mustList(t, RateLimit, f[RateLimit])[0], "api.banned-60s", "r", 0, "t", int(MaxRetryAfter/time.Second))
}

// TestSoftParameter checks that RateLimit marks an admission in the soft band with the
// boolean parameter soft, and only then.
func TestSoftParameter(t *testing.T) {
	cfg, err := rules.Parse("rules.yaml", []byte(`
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, soft_percent: 50, scope: local}
`))
	if err != nil {
		t.Fatal(err)
	}
	l, err := enforcer.New(enforcer.Config{Rules: rules.Static(cfg), Site: "t", Clock: clock.NewFake(t0)})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{false, false, true, false} {
		res := l.Decide(context.Background(), req([]string{"user", "1"}))
		f := fieldMap(Append(nil, &res))
		it := mustList(t, RateLimit, f[RateLimit])[0]
		soft, ok := it.Param("soft")
		if ok != want || ok && soft != true {
			t.Errorf("request %d (%v): RateLimit %q, want soft=%v", i+1, res.Code, f[RateLimit], want)
		}
	}
}

func TestRenderDoesNotAllocate(t *testing.T) {
	l, _ := newLimiter(t)
	res := l.Decide(context.Background(), req([]string{"user", "42"}, []string{"ip", "192.0.2.1"}))
	var v Values
	v.Render(&res)
	if a := testing.AllocsPerRun(100, func() { v.Render(&res) }); a != 0 {
		t.Fatalf("Render: %v allocs", a)
	}
}

func TestSFParserRejectsBadSyntax(t *testing.T) {
	for _, s := range []string{`"a";q=1,`, `"a" "b"`, `"a;q=1`, `"a";Q=1`, `"a";q=1;q=2`} {
		if _, err := sftest.ParseList(s); err == nil {
			t.Errorf("%q parsed", s)
		}
	}
}
