package enforcer

import (
	"context"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/rules"
)

const overrideRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {requests_per_unit: 5, unit: minute, scope: local, algorithm: fixed_window}
  - key: shadowed
    rate_limit: {requests_per_unit: 1, unit: minute}
    shadow_mode: true
`

// TestOverrideLimitsInsteadOfRule: a descriptor with an override is limited by it, in the
// rule's scope and algorithm, on a counter of its own; the rule's count is untouched.
func TestOverrideLimitsInsteadOfRule(t *testing.T) {
	pub := &recorder{}
	l, _ := newLimiter(t, overrideRules, func(c *Config) { c.Publisher = pub })
	ctx := context.Background()
	over := Request{Domain: "api", Descriptors: [][]rules.Entry{desc("user", "42")}, Overrides: []Override{{Requests: 2, Window: time.Minute}}}
	for i, want := range []Code{CodeOK, CodeOK, CodeOverLimit} {
		res := l.Decide(ctx, over)
		if res.Code != want {
			t.Fatalf("override request %d: %v, want %v", i+1, res.Code, want)
		}
		st := res.Statuses[0]
		if st.Limit == nil || st.Requests != 2 || st.Key != "api|user=42#60s|override" || st.Rule != nil {
			t.Fatalf("override status %d: limit %v requests %d key %q rule %v", i+1, st.Limit, st.Requests, st.Key, st.Rule)
		}
		if st.Limit.Scope.String() != "local" || st.Limit.Algorithm.String() != "fixed_window" || st.Limit.Name != "api.user-override-60s" {
			t.Fatalf("override limit: scope %v algorithm %v name %q, want the rule's local fixed_window", st.Limit.Scope, st.Limit.Algorithm, st.Limit.Name)
		}
	}
	// The rule's own counter took nothing: 5 more pass without the override.
	plain := Request{Domain: "api", Descriptors: over.Descriptors}
	for i := range 5 {
		if res := l.Decide(ctx, plain); res.Code != CodeOK || res.Statuses[0].Key != "api|user=42#60s" {
			t.Fatalf("rule request %d: %v key %q", i+1, res.Code, res.Statuses[0].Key)
		}
	}
	if res := l.Decide(ctx, plain); res.Code != CodeOverLimit {
		t.Fatalf("6th rule request: %v, want OVER_LIMIT", res.Code)
	}
}

// TestOverrideEdges: zero requests deny; a shadow-mode rule's override still denies; no
// rule matched means a global limit; an unknown domain limits nothing.
func TestOverrideEdges(t *testing.T) {
	pub := &recorder{}
	l, _ := newLimiter(t, overrideRules, func(c *Config) { c.Publisher = pub })
	ctx := context.Background()
	one := func(domain, key string, o Override) Result {
		return l.Decide(ctx, Request{Domain: domain, Descriptors: [][]rules.Entry{desc(key, "x")}, Overrides: []Override{o}})
	}
	if res := one("api", "user", Override{Requests: 0, Window: time.Second}); res.Code != CodeOverLimit || res.Statuses[0].RetryAfter < 365*24*time.Hour {
		t.Fatalf("0 requests: %v retry %v, want OVER_LIMIT, never", res.Code, res.Statuses[0].RetryAfter)
	}
	one("api", "shadowed", Override{Requests: 1, Window: time.Minute})
	if res := one("api", "shadowed", Override{Requests: 1, Window: time.Minute}); res.Code != CodeOverLimit || res.Statuses[0].Shadow {
		t.Fatalf("override of a shadow-mode rule: %v shadow %v, want OVER_LIMIT", res.Code, res.Statuses[0].Shadow)
	}
	res := one("api", "nomatch", Override{Requests: 3, Window: time.Hour})
	if st := res.Statuses[0]; res.Code != CodeOK || st.Limit == nil || st.Limit.Scope.String() != "global" || st.Limit.Algorithm.String() != "sliding_window" {
		t.Fatalf("no rule matched: %v %+v, want a global sliding_window limit", res.Code, st.Limit)
	}
	if pub.get("api|nomatch=x#3600s|override") != 1 {
		t.Fatalf("global override hit not published under its key: %v", pub.hits)
	}
	if res := one("other", "user", Override{Requests: 0, Window: time.Second}); res.Code != CodeOK || res.Statuses[0].Limit != nil {
		t.Fatalf("unknown domain: %v %+v, want OK with no limit", res.Code, res.Statuses[0])
	}
}
