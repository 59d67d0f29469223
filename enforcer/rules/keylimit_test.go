package rules

import (
	"strings"
	"testing"
	"time"
)

const keyLimitRules = `
domain: "a|p#i"
pools:
  - name: all
    rate_limit: {requests_per_unit: 1000, unit: minute}
descriptors:
  - key: user
    rate_limits:
      - {requests_per_unit: 3, unit: minute}
      - {requests_per_unit: 10, unit: hour, scope: local}
  - key: files
    value: "shared-*"
    share_threshold: true
    rate_limit: {requests_per_unit: 5, window: 1500ms}
  - key: plan
    value: paid
    descriptors:
      - key: "k=ey"
        rate_limit: {requests_per_unit: 7, unit: second, pool: all}
`

// LimitOfKey finds, from each key a request makes, the rule and limit that made it.
func TestLimitOfKeyRoundTrip(t *testing.T) {
	c, err := Parse("keys.yaml", []byte(keyLimitRules))
	if err != nil {
		t.Fatal(err)
	}
	const domain = "a|p#i"
	for _, tc := range []struct {
		entries  []Entry
		requests int64
		window   time.Duration
	}{
		{[]Entry{{Key: "user", Value: "42%|=#é\xff"}}, 3, time.Minute},
		{[]Entry{{Key: "user", Value: ""}}, 3, time.Minute},
		{[]Entry{{Key: "files", Value: "shared-report"}}, 5, 1500 * time.Millisecond},
		{[]Entry{{Key: "plan", Value: "paid"}, {Key: "k=ey", Value: "x"}}, 7, time.Second},
	} {
		r := c.Match(domain, tc.entries)
		if r == nil {
			t.Fatalf("%v matches nothing", tc.entries)
		}
		for i := range r.Limits {
			key := r.Key(tc.entries, i)
			gr, gl, ok := c.LimitOfKey(key)
			if !ok || gr != r || gl != &r.Limits[i] {
				t.Errorf("LimitOfKey(%q) = %v, %+v, %v; want rule %s limit %d", key, gr, gl, ok, r.ID, i)
			}
		}
		if l := r.Limits[0]; l.Requests != tc.requests || l.Window != tc.window {
			t.Errorf("%v: first limit %d/%v, want %d/%v", tc.entries, l.Requests, l.Window, tc.requests, tc.window)
		}
	}
	pl := c.Pools(domain)[0]
	if r, l, ok := c.LimitOfKey(pl.Key); !ok || r != nil || l != &pl.Limit {
		t.Errorf("LimitOfKey(pool key %q) = %v, %v, %v; want the pool's limit", pl.Key, r, l, ok)
	}
	user := c.Match(domain, []Entry{{Key: "user", Value: "1"}})
	long := user.Key([]Entry{{Key: "user", Value: strings.Repeat("v", 2000)}}, 0)
	over := string(AppendOverrideKey(nil, domain, []Entry{{Key: "user", Value: "1"}}, &user.Limits[0]))
	for _, key := range []string{
		long, over,
		"a%7Cp%23i|user=1#30s", // no limit of that window
		"other|user=1#60s",     // no such domain
		"a%7Cp%23i|nobody=1#60s",
		"a%7Cp%23i|pool=none#60s|pool",
		"no-window", "a%7Cp%23i#60s", "a%7Cp%23i|user#60s",
	} {
		if r, l, ok := c.LimitOfKey(key); ok {
			t.Errorf("LimitOfKey(%q) = %v, %+v: want none", key, r, l)
		}
	}
}
