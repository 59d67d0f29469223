package rls

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/enforcer/sitestore"
)

// layoutStore is a SiteStore that keeps envoyproxy/ratelimit's layout as a map (what
// sitestore.Store keeps in Redis, tested there), and its own in process.
type layoutStore struct {
	mu     sync.Mutex
	counts map[string]int64
	expiry map[string]time.Duration
	down   bool // IncrEnvoy fails, as with Redis away
	// fallback are FallbackEnvoy's counts, by key
	fallback map[string]int64
	native   int // ops decided by AllowAll
	local    *algo.Store
}

func (f *layoutStore) AllowAll(_ context.Context, now time.Time, ops []algo.Op, out []algo.Decision) (bool, bool) {
	f.mu.Lock()
	f.native += len(ops)
	f.mu.Unlock()
	return f.local.AllowAll(now, ops, out), f.down
}

func (f *layoutStore) CountEnvoy(ctx context.Context, now time.Time, incrs []sitestore.EnvoyIncr, out []int64) bool {
	if err := f.IncrEnvoy(ctx, incrs, out); err != nil {
		f.FallbackEnvoy(now, incrs, out)
		return true
	}
	return false
}

func (f *layoutStore) FallbackEnvoy(_ time.Time, incrs []sitestore.EnvoyIncr, out []int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, in := range incrs {
		f.fallback[in.Key] += in.N
		out[i] = f.fallback[in.Key]
	}
}

func (f *layoutStore) IncrEnvoy(_ context.Context, incrs []sitestore.EnvoyIncr, out []int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return errors.New("redis away")
	}
	for i, in := range incrs {
		f.counts[in.Key] += in.N
		f.expiry[in.Key] = in.Expire
		out[i] = f.counts[in.Key]
	}
	return nil
}

const layoutRules = `
domain: e
compat: envoy
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: path
    value: "/api*"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: a
    descriptors:
      - key: b
        rate_limit: {unit: day, requests_per_unit: 9}
  - key: two
    rate_limits:
      - {unit: minute, requests_per_unit: 5}
      - {unit: hour, requests_per_unit: 50}
`

func layoutServer(t *testing.T, st *layoutStore, prefix string) *Server {
	t.Helper()
	l, err := enforcer.New(enforcer.Config{Tuning: enforcer.Tuning{EnvoyKeyPrefix: prefix}, Rules: rules.Static(loadRules(t, layoutRules)), Site: "t", Clock: clock.NewFake(t0), SiteStore: st})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(l, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// A compat: envoy domain's fixed windows are counted at envoyproxy/ratelimit's keys —
// prefix, domain, each entry's key and value (a share_threshold level's pattern), the
// window's start in Unix seconds — expiring after the unit; a descriptor's own limit of
// the rule's unit shares the rule's key, as there; a rule of two limits (streamlimit's
// extension) keeps streamlimit's layout.
func TestEnvoyRedisLayout(t *testing.T) {
	st := &layoutStore{counts: map[string]int64{}, expiry: map[string]time.Duration{}, local: algo.New(algo.Options{})}
	srv := layoutServer(t, st, "pfx:")
	hour, minute, day := strconv.FormatInt(t0.Unix()/3600*3600, 10), strconv.FormatInt(t0.Unix()/60*60, 10), strconv.FormatInt(t0.Unix()/86400*86400, 10)
	ask := func(req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := srv.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	st.counts["pfx:e_user_42_"+hour] = 2 // counted before, by envoyproxy/ratelimit
	if r := ask(ereq("e", 0, kv("user", "42"))); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("the third of 3 after 2 counted elsewhere: %v", r)
	}
	if r := ask(ereq("e", 0, kv("user", "42"))); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("the fourth of 3: %v", r)
	}
	override := ereq("e", 0, kv("user", "42"))
	override.Descriptors[0].Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 100, Unit: typev3.RateLimitUnit_HOUR}
	if r := ask(override); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 95 {
		t.Fatalf("own limit of 100 on the rule's counter of 4: %v", r)
	}
	ask(ereq("e", 2, kv("path", "/api/v1")))
	ask(ereq("e", 0, kv("path", "/api/v2")))
	ask(ereq("e", 0, kv("a", "1", "b", "2")))
	for key, want := range map[string]int64{
		"pfx:e_user_42_" + hour:      5,
		"pfx:e_path_/api*_" + minute: 3,
		"pfx:e_a_1_b_2_" + day:       1,
	} {
		if st.counts[key] != want {
			t.Errorf("%s: %d, want %d (all: %v)", key, st.counts[key], want, st.counts)
		}
	}
	if st.expiry["pfx:e_user_42_"+hour] != time.Hour || st.expiry["pfx:e_a_1_b_2_"+day] != 24*time.Hour {
		t.Errorf("expiries %v, want the units", st.expiry)
	}
	if st.native != 0 {
		t.Errorf("%d ops in streamlimit's layout, want none", st.native)
	}
	ask(ereq("e", 0, kv("two", "x")))
	if st.native != 2 || len(st.counts) != 3 {
		t.Errorf("a rule of two limits: %d ops in streamlimit's layout, keys %v; want 2 and no new key", st.native, st.counts)
	}
}

// With Redis away, the limits are counted in process at their keys in
// envoyproxy/ratelimit's layout (FallbackEnvoy, which writes them back there), and still
// answered.
func TestEnvoyRedisLayoutDown(t *testing.T) {
	st := &layoutStore{counts: map[string]int64{}, expiry: map[string]time.Duration{}, fallback: map[string]int64{}, local: algo.New(algo.Options{}), down: true}
	srv := layoutServer(t, st, "")
	for i := range 4 {
		resp, err := srv.ShouldRateLimit(context.Background(), ereq("e", 0, kv("user", "7")))
		if err != nil {
			t.Fatal(err)
		}
		if want := i < 3; (resp.OverallCode == rlsv3.RateLimitResponse_OK) != want {
			t.Fatalf("request %d of 3: %v", i+1, resp)
		}
	}
	key := "e_user_7_" + strconv.FormatInt(t0.Unix()/3600*3600, 10)
	if st.native != 0 || len(st.counts) != 0 || st.fallback[key] != 4 {
		t.Errorf("%d ops in streamlimit's layout, keys %v, in process %v; want none, none, 4 at %s", st.native, st.counts, st.fallback, key)
	}
}
