package enforcer

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/sitestore"
)

// envoySite is a storeSite that keeps envoyproxy/ratelimit's layout as a map too (what
// sitestore.Store keeps in Redis, tested there); down counts in fallback instead.
type envoySite struct {
	storeSite
	counts, fallback map[string]int64
	down             bool
}

func (s *envoySite) CountEnvoy(_ context.Context, _ time.Time, incrs []sitestore.EnvoyIncr, out []int64) bool {
	m := s.counts
	if s.down {
		m = s.fallback
	}
	for i, in := range incrs {
		m[in.Key] += in.N
		out[i] = m[in.Key]
	}
	return s.down
}

const envoyLayoutRules = `
domain: e
compat: envoy
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 3}
  - key: two
    rate_limits:
      - {unit: minute, requests_per_unit: 5}
      - {unit: hour, requests_per_unit: 50}
`

// In a compat: envoy domain the Engine — behind the check API, /v1/auth, the middleware
// and the proxy — counts a limit envoyproxy/ratelimit would count at its key in that
// layout (the key package rls counts it at), every request, the refused ones too, and
// refuses past the limit; a rule of two limits (streamlimit's extension) keeps
// streamlimit's layout and all or nothing; with Redis away the count is the fallback's.
func TestLimiterEnvoyLayout(t *testing.T) {
	site := &envoySite{storeSite: storeSite{st: algo.New(algo.Options{})}, counts: map[string]int64{}, fallback: map[string]int64{}}
	l, _ := newLimiter(t, envoyLayoutRules, func(c *Config) { c.SiteStore, c.EnvoyKeyPrefix = site, "pfx:" })
	ctx := context.Background()
	day := strconv.FormatInt(t0.Unix()/86400*86400, 10)
	key := "pfx:e_user_42_" + day
	site.counts[key] = 1 // counted before, through another API or envoyproxy/ratelimit
	req := Request{Domain: "e", Descriptors: [][]rules.Entry{desc("user", "42")}}
	for i, want := range []Code{CodeOK, CodeOK, CodeOverLimit, CodeOverLimit} {
		r := l.Decide(ctx, req)
		if r.Code != want {
			t.Fatalf("request %d after 1 counted elsewhere, limit 3: %v, want %v", i+1, r.Code, want)
		}
		if st := r.Statuses[0]; want == CodeOverLimit && (st.Remaining != 0 || st.RetryAfter != 14*time.Hour || st.Requests != 3) {
			t.Fatalf("refused status %+v, want 0 of 3 remaining, retry at the day's end (14 h)", st)
		}
	}
	if site.counts[key] != 5 || site.calls != 0 {
		t.Fatalf("count %d with %d AllowAll calls, want 5 (the refused counted, as there) and none", site.counts[key], site.calls)
	}
	two := Request{Domain: "e", Descriptors: [][]rules.Entry{desc("two", "x")}}
	if r := l.Decide(ctx, two); r.Code != CodeOK || site.calls != 1 || len(site.counts) != 1 {
		t.Fatalf("a rule of two limits: %v, %d AllowAll calls, keys %v; want OK in streamlimit's layout", r.Code, site.calls, site.counts)
	}
	site.down = true
	other := Request{Domain: "e", Descriptors: [][]rules.Entry{desc("user", "7")}}
	if r := l.Decide(ctx, other); r.Code != CodeOK || !r.Statuses[0].Fallback || site.fallback["pfx:e_user_7_"+day] != 1 {
		t.Fatalf("Redis away: %v fallback %v, in process %v", r.Code, r.Statuses[0].Fallback, site.fallback)
	}
}
