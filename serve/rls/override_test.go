package rls

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func overridden(d *ratelimitv3.RateLimitDescriptor, n uint32, unit typev3.RateLimitUnit) *ratelimitv3.RateLimitDescriptor {
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: unit}
	return d
}

func request(ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "api", Descriptors: ds}
}

// TestLimitOverrideHonoured: over gRPC, a descriptor whose limit (2/min) is below its
// rule's (3/min) is denied at the override, reports it as its current limit, and leaves
// the rule's own counter untouched.
func TestLimitOverrideHonoured(t *testing.T) {
	f := start(t, testRules, Options{})
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		r := f.call(t, request(overridden(descriptor("user", "o"), 2, typev3.RateLimitUnit_MINUTE)))
		lim := r.GetStatuses()[0].GetCurrentLimit()
		if r.GetOverallCode() != want || lim.GetRequestsPerUnit() != 2 || lim.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || lim.GetName() != "api.user-override-60s" {
			t.Fatalf("request %d: %v, limit %v; want %v at the override", i+1, r.GetOverallCode(), lim, want)
		}
	}
	// The rule's counter is the rule's: its 3 requests are all still there.
	for i := range 3 {
		if r := f.call(t, request(descriptor("user", "o"))); r.GetOverallCode() != rlsv3.RateLimitResponse_OK || r.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 3 {
			t.Fatalf("rule request %d after the override's: %v", i+1, r)
		}
	}
	// Descriptors of different costs are decided in groups; each keeps its override.
	d := overridden(descriptor("user", "g"), 10, typev3.RateLimitUnit_HOUR)
	d.HitsAddend = wrapperspb.UInt64(4)
	r := f.call(t, request(d, descriptor("path", "/g")))
	if lim := r.GetStatuses()[0].GetCurrentLimit(); r.GetOverallCode() != rlsv3.RateLimitResponse_OK || lim.GetRequestsPerUnit() != 10 || r.GetStatuses()[0].GetLimitRemaining() != 6 {
		t.Fatalf("grouped override: %v", r)
	}
	if got := testutil.ToFloat64(f.srv.metrics.overrides); got != 4 {
		t.Fatalf("limit_overrides_total = %v, want 4", got)
	}
}

// TestLimitOverrideIgnored: with IgnoreOverrides the rule decides (3/min), whatever the
// descriptor asks (1000/s, or a unit that would be invalid), and each is counted.
func TestLimitOverrideIgnored(t *testing.T) {
	f := start(t, testRules, Options{Overrides: IgnoreOverrides})
	for i := range 4 {
		unit := typev3.RateLimitUnit_SECOND
		if i == 3 {
			unit = typev3.RateLimitUnit_UNKNOWN
		}
		r := f.call(t, request(overridden(descriptor("user", "o"), 1000, unit)))
		lim := r.GetStatuses()[0].GetCurrentLimit()
		want := rlsv3.RateLimitResponse_OK
		if i == 3 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if r.GetOverallCode() != want || lim.GetRequestsPerUnit() != 3 || lim.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
			t.Fatalf("request %d: %v, limit %v; want %v by the rule", i+1, r.GetOverallCode(), lim, want)
		}
	}
	if got := testutil.ToFloat64(f.srv.metrics.override); got != 4 {
		t.Fatalf("ignored_total{limit_override} = %v, want 4", got)
	}
}

// TestBadLimitOverride: 0 requests with a unit denies every request, for good (as
// envoyproxy/ratelimit does); a unit that is not one of Envoy's, or a multiplier of 0, is
// InvalidArgument naming the field.
func TestBadLimitOverride(t *testing.T) {
	f := start(t, testRules, Options{})
	r := f.call(t, request(overridden(descriptor("user", "z"), 0, typev3.RateLimitUnit_SECOND)))
	if st := r.GetStatuses()[0]; r.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetDurationUntilReset().AsDuration() != 365*24*time.Hour {
		t.Fatalf("0 requests per second: %v", r)
	}
	mult := overridden(descriptor("user", "m"), 5, typev3.RateLimitUnit_SECOND)
	mult.Limit.UnitMultiplier = wrapperspb.UInt32(0)
	for _, c := range []struct {
		d     *ratelimitv3.RateLimitDescriptor
		field string
	}{
		{overridden(descriptor("user", "u"), 5, typev3.RateLimitUnit_UNKNOWN), "descriptors[0].limit.unit: UNKNOWN is not a unit"},
		{overridden(descriptor("user", "u"), 5, typev3.RateLimitUnit(99)), "descriptors[0].limit.unit: 99 is not a unit"},
		{mult, "descriptors[0].limit.unit_multiplier: must be at least 1"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := f.client.ShouldRateLimit(ctx, request(c.d))
		cancel()
		if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), c.field) {
			t.Errorf("%v: %v, want InvalidArgument %q", c.d.GetLimit(), err, c.field)
		}
	}
	// A multiplier multiplies the unit.
	m := overridden(descriptor("user", "w"), 5, typev3.RateLimitUnit_SECOND)
	m.Limit.UnitMultiplier = wrapperspb.UInt32(10)
	if lim := f.call(t, request(m)).GetStatuses()[0].GetCurrentLimit(); lim.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND || lim.GetUnitMultiplier().GetValue() != 10 {
		t.Fatalf("5 per 10 s: %v", lim)
	}
}

// TestJSONLimitOverride: /json honours the override like gRPC (200, 200, 429 at 2/min
// under a 3/min rule) and answers 400 for a bad unit; with IgnoreOverrides the rule
// decides.
func TestJSONLimitOverride(t *testing.T) {
	body := `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"j"}],"limit":{"requestsPerUnit":2,"unit":"MINUTE"}}]}`
	f := start(t, testRules, Options{})
	srv := httptest.NewServer(f.srv.JSONHandler())
	defer srv.Close()
	for i, want := range []int{200, 200, 429} {
		if resp, b := post(t, srv.URL, []byte(body)); resp.StatusCode != want || !strings.Contains(string(b), `"requestsPerUnit":2`) {
			t.Fatalf("request %d: %d %s, want %d at the override", i+1, resp.StatusCode, b, want)
		}
	}
	bad := strings.Replace(body, `"MINUTE"`, `"UNKNOWN"`, 1)
	if resp, b := post(t, srv.URL, []byte(bad)); resp.StatusCode != 400 || !strings.Contains(string(b), "descriptors[0].limit.unit") {
		t.Fatalf("unknown unit: %d %s, want 400 naming the field", resp.StatusCode, b)
	}

	fi := start(t, testRules, Options{Overrides: IgnoreOverrides})
	srvi := httptest.NewServer(fi.srv.JSONHandler())
	defer srvi.Close()
	for i, want := range []int{200, 200, 200, 429} {
		if resp, b := post(t, srvi.URL, []byte(body)); resp.StatusCode != want || !strings.Contains(string(b), `"requestsPerUnit":3`) {
			t.Fatalf("ignored, request %d: %d %s, want %d by the rule", i+1, resp.StatusCode, b, want)
		}
	}
	if got := testutil.ToFloat64(fi.srv.metrics.override); got != 4 {
		t.Fatalf("ignored_total{limit_override} = %v, want 4", got)
	}
}

func TestParseOverrideMode(t *testing.T) {
	for _, m := range []OverrideMode{HonourOverrides, IgnoreOverrides} {
		if got, err := ParseOverrideMode(m.String()); err != nil || got != m {
			t.Errorf("ParseOverrideMode(%q) = %v, %v", m, got, err)
		}
	}
	if _, err := ParseOverrideMode("honor"); err == nil {
		t.Error("honor accepted")
	}
}

// TestLimitOverrideCountedOnlyWhenDecided: an override of a request rejected as invalid,
// or of a refund (not decided), is not counted as honoured.
func TestLimitOverrideCountedOnlyWhenDecided(t *testing.T) {
	f := start(t, testRules, Options{})
	bad := overridden(descriptor("user", "b"), 5, typev3.RateLimitUnit_UNKNOWN)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := f.client.ShouldRateLimit(ctx, request(overridden(descriptor("user", "a"), 5, typev3.RateLimitUnit_SECOND), bad)); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad unit: %v", err)
	}
	refund := overridden(descriptor("user", "r"), 5, typev3.RateLimitUnit_SECOND)
	refund.IsNegativeHits = true
	f.call(t, request(refund, overridden(descriptor("user", "c"), 5, typev3.RateLimitUnit_SECOND)))
	if got := testutil.ToFloat64(f.srv.metrics.overrides); got != 1 {
		t.Fatalf("limit_overrides_total = %v, want 1 (the decided descriptor)", got)
	}
}
