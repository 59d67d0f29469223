package enforcer

import (
	"context"
	"testing"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/enforcer/rules"
)

// Status.Remaining has one definition in every scope: the requests of cost 1 the limit
// admits now, after the request when it was admitted and as it was when it was denied
// (a denied request takes nothing). A limit of 10 with 5 taken reports 5 to a request of
// 6, whether the count is in process, in the site's store or a global one.
func TestRemainingIsOneDefinitionInEveryScope(t *testing.T) {
	for _, scope := range []string{"local", "site", "global"} {
		t.Run(scope, func(t *testing.T) {
			site := &storeSite{st: algo.New(algo.Options{})}
			l, _ := newLimiter(t, `
domain: api
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 10, scope: `+scope+`}
`, func(c *Config) { c.SiteStore = site })
			ctx := context.Background()
			req := func(hits int64) Result {
				return l.Decide(ctx, Request{Domain: "api", Descriptors: [][]rules.Entry{desc("a", "1")}, Hits: hits})
			}
			if r := req(5); r.Code != CodeOK || r.Statuses[0].Remaining != 5 {
				t.Fatalf("5 of 10: %v, remaining %d, want OK and 5", r.Code, r.Statuses[0].Remaining)
			}
			r := req(6)
			if r.Code != CodeOverLimit || r.Statuses[0].Remaining != 5 {
				t.Fatalf("6 more: %v, remaining %d, want OVER_LIMIT and 5 (the room it did not take)", r.Code, r.Statuses[0].Remaining)
			}
			if r := req(5); r.Code != CodeOK || r.Statuses[0].Remaining != 0 {
				t.Fatalf("the 5 left: %v, remaining %d, want OK and 0", r.Code, r.Statuses[0].Remaining)
			}
			if r := req(1); r.Code != CodeOverLimit || r.Statuses[0].Remaining != 0 {
				t.Fatalf("one past: %v, remaining %d, want OVER_LIMIT and 0", r.Code, r.Statuses[0].Remaining)
			}
		})
	}
}

// A shadow-mode rule reports the state after the request in every scope: the first hit
// of a limit of 10 leaves 9, and the 11th is reported as over (Shadow) yet admitted.
func TestShadowReportsStateAfterTheHitInEveryScope(t *testing.T) {
	for _, scope := range []string{"local", "site", "global"} {
		t.Run(scope, func(t *testing.T) {
			site := &storeSite{st: algo.New(algo.Options{})}
			l, _ := newLimiter(t, `
domain: api
descriptors:
  - key: a
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 10, scope: `+scope+`}
`, func(c *Config) { c.SiteStore = site })
			ctx := context.Background()
			req := Request{Domain: "api", Descriptors: [][]rules.Entry{desc("a", "1")}}
			for i := range 10 {
				r := l.Decide(ctx, req)
				if st := r.Statuses[0]; r.Code != CodeOK || st.Shadow || st.Remaining != int64(9-i) {
					t.Fatalf("hit %d: %v shadow %v remaining %d, want OK, not shadow, %d", i+1, r.Code, st.Shadow, st.Remaining, 9-i)
				}
			}
			r := l.Decide(ctx, req)
			if st := r.Statuses[0]; r.Code != CodeOK || st.Code != CodeOK || !st.Shadow || st.Remaining != 0 {
				t.Fatalf("hit 11: %v (%v) shadow %v remaining %d, want OK, shadow, 0", r.Code, st.Code, st.Shadow, st.Remaining)
			}
		})
	}
}
