package rls

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/streamlimit/streamlimit/enforcer/algo"
	"github.com/streamlimit/streamlimit/enforcer/rules"
)

// envoyRules is a compat: envoy domain; its site limits are counted in process here (no
// SiteStore), as a site of one enforcer counts them.
const envoyRules = `
domain: e
compat: envoy
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: big
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: one
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: local
    rate_limit: {unit: hour, requests_per_unit: 1, scope: local}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 2, scope: global}
  - key: tb
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: token_bucket}
`

func ereq(domain string, hits uint32, descs ...[]string) *rlsv3.RateLimitRequest {
	r := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits}
	for _, kv := range descs {
		r.Descriptors = append(r.Descriptors, descriptor(kv...))
	}
	return r
}

func kv(s ...string) []string { return s }

// envoyStatus is the answer envoyproxy/ratelimit gives for a fixed window of rpu per
// unit at t0 (10:00:00 UTC, the start of an hour).
func envoyStatus(code rlsv3.RateLimitResponse_Code, rpu uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit, remaining uint32, reset int64) *rlsv3.RateLimitResponse_DescriptorStatus {
	return &rlsv3.RateLimitResponse_DescriptorStatus{Code: code, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: rpu, Unit: unit},
		LimitRemaining: remaining, DurationUntilReset: &durationpb.Duration{Seconds: reset}}
}

func wantResp(t *testing.T, what string, got *rlsv3.RateLimitResponse, code rlsv3.RateLimitResponse_Code, sts ...*rlsv3.RateLimitResponse_DescriptorStatus) {
	t.Helper()
	want := &rlsv3.RateLimitResponse{OverallCode: code, Statuses: sts}
	if !proto.Equal(want, got) {
		t.Fatalf("%s:\n got %v\nwant %v", what, got, want)
	}
}

// A compat: envoy domain counts as envoyproxy/ratelimit's INCRBY: a request takes its
// hits over the limit too, so that after 8 + 5 of 10 a request of 1 is over, and a read
// (hits_addend 0) says so; streamlimit's own semantics admit it. Both the site limit
// (in process without a SiteStore) and the local one count so.
func TestEnvoyCountsOverTheLimit(t *testing.T) {
	f := start(t, envoyRules, Options{})
	const hourLeft = 3600
	wantResp(t, "8 of 10", f.call(t, ereq("e", 8, kv("k", "1"))), ok(), envoyStatus(ok(), 10, rlsv3.RateLimitResponse_RateLimit_HOUR, 2, hourLeft))
	wantResp(t, "5 more", f.call(t, ereq("e", 5, kv("k", "1"))), over(), envoyStatus(over(), 10, rlsv3.RateLimitResponse_RateLimit_HOUR, 0, hourLeft))
	wantResp(t, "1 more", f.call(t, ereq("e", 1, kv("k", "1"))), over(), envoyStatus(over(), 10, rlsv3.RateLimitResponse_RateLimit_HOUR, 0, hourLeft))
	read := ereq("e", 1, kv("k", "1"))
	read.Descriptors[0].HitsAddend = wrapperspb.UInt64(0)
	wantResp(t, "a read", f.call(t, read), over(), envoyStatus(over(), 10, rlsv3.RateLimitResponse_RateLimit_HOUR, 0, hourLeft))
	fresh := ereq("e", 1, kv("k", "2"))
	fresh.Descriptors[0].HitsAddend = wrapperspb.UInt64(0)
	wantResp(t, "a read of a fresh key", f.call(t, fresh), ok(), envoyStatus(ok(), 10, rlsv3.RateLimitResponse_RateLimit_HOUR, 10, hourLeft))

	f.clk.Advance(1500 * time.Millisecond)
	wantResp(t, "local, first", f.call(t, ereq("e", 1, kv("local", "1"))), ok(), envoyStatus(ok(), 1, rlsv3.RateLimitResponse_RateLimit_HOUR, 0, hourLeft-1))
	wantResp(t, "local, second", f.call(t, ereq("e", 1, kv("local", "1"))), over(), envoyStatus(over(), 1, rlsv3.RateLimitResponse_RateLimit_HOUR, 0, hourLeft-1))
	if got := testutil.ToFloat64(f.srv.metrics.envoy.WithLabelValues("e", "e.k", "over_limit")); got != 3 {
		t.Fatalf("envoy_decisions_total{over_limit} = %v, want 3", got)
	}
}

func ok() rlsv3.RateLimitResponse_Code   { return rlsv3.RateLimitResponse_OK }
func over() rlsv3.RateLimitResponse_Code { return rlsv3.RateLimitResponse_OVER_LIMIT }

// Every descriptor of a request takes its hits, the over ones too; with
// StopIncrementWhenOverLimit, once a request takes one over, only those it takes over do.
func TestEnvoyStopIncrementWhenOverLimit(t *testing.T) {
	for _, stop := range []bool{false, true} {
		f := start(t, envoyRules, Options{Envoy: EnvoyOptions{StopIncrementWhenOverLimit: stop}})
		req := ereq("e", 1, kv("big", "1"), kv("one", "1"))
		f.call(t, req)
		resp := f.call(t, req)
		wantBig := uint32(18)
		if stop {
			wantBig = 19
		}
		if resp.GetOverallCode() != over() || resp.GetStatuses()[1].GetCode() != over() || resp.GetStatuses()[0].GetLimitRemaining() != wantBig {
			t.Fatalf("stop %v: %v, want OVER_LIMIT with big's remaining %d", stop, resp, wantBig)
		}
	}
}

// Rules that ask for streamlimit's extensions keep them in a compat: envoy domain: a
// global limit is a sliding window, decided by the Limiter, and a token bucket too; their
// answers take envoyproxy/ratelimit's form (whole seconds, no header fields).
func TestEnvoyDomainKeepsExtensions(t *testing.T) {
	f := start(t, envoyRules, Options{})
	for i := range 3 {
		resp := f.call(t, ereq("e", 1, kv("sliding", "1"), kv("tb", "1")))
		if i < 2 {
			wantResp(t, "request "+string(rune('1'+i)), resp, ok(),
				envoyStatus(ok(), 2, rlsv3.RateLimitResponse_RateLimit_MINUTE, uint32(1-i), 60),
				envoyStatus(ok(), 2, rlsv3.RateLimitResponse_RateLimit_MINUTE, uint32(1-i), int64(30*(i+1))))
			continue
		}
		if resp.GetOverallCode() != over() || resp.GetStatuses()[0].GetCode() != over() || len(resp.GetResponseHeadersToAdd()) != 0 {
			t.Fatalf("third: %v, want the global limit over and no header fields", resp)
		}
		if d := resp.GetStatuses()[0].GetDurationUntilReset(); d.GetNanos() != 0 || d.GetSeconds() <= 0 {
			t.Fatalf("third: duration_until_reset %v, want whole seconds", d)
		}
	}
	r := f.srv.rules().Match("e", []rules.Entry{{Key: "sliding", Value: "1"}})
	if l := r.Limits[0]; l.Scope != rules.Global || l.Algorithm != algo.SlidingWindow {
		t.Fatalf("the global limit is %v %v", l.Scope, l.Algorithm)
	}
}

// ResponseHeaders sends envoyproxy/ratelimit's three fields, under the names given, of
// the descriptor closest to its limit, or of the last one over it.
func TestEnvoyResponseHeaders(t *testing.T) {
	f := start(t, envoyRules, Options{Envoy: EnvoyOptions{ResponseHeaders: true, RemainingHeader: "X-Left"}})
	resp := f.call(t, ereq("e", 1, kv("k", "h"), kv("big", "h")))
	got := headerMap(resp)
	if len(got) != 3 || got["RateLimit-Limit"] != "10" || got["X-Left"] != "9" || got["RateLimit-Reset"] != "3600" {
		t.Fatalf("fields %v, want k's (10, 9 left, 3600 s)", got)
	}
	f.call(t, ereq("e", 1, kv("one", "h")))
	got = headerMap(f.call(t, ereq("e", 1, kv("one", "h"), kv("k", "h"))))
	if got["RateLimit-Limit"] != "1" || got["X-Left"] != "0" || got["RateLimit-Reset"] != "60" {
		t.Fatalf("fields %v, want those of one, over its limit", got)
	}
	if resp := f.call(t, ereq("e", 1, kv("none", "h"))); len(resp.GetResponseHeadersToAdd()) != 0 {
		t.Fatalf("no limit in force, yet fields %v", resp.GetResponseHeadersToAdd())
	}
}

// A compat: envoy domain refuses an empty domain and an empty descriptor list as
// envoyproxy/ratelimit does (Unknown, its messages), accepts descriptors without entries
// or with an empty key (no limit applies), and keeps the bounds on a request's size.
// Options.Compat decides for a domain no file configures.
func TestEnvoyRequestErrors(t *testing.T) {
	f := start(t, envoyRules, Options{Compat: rules.CompatEnvoy})
	ctx := context.Background()
	for _, tc := range []struct {
		req  *rlsv3.RateLimitRequest
		code codes.Code
		msg  string
	}{
		{ereq("", 1, kv("k", "1")), codes.Unknown, "rate limit domain must not be empty"},
		{ereq("e", 1), codes.Unknown, "rate limit descriptor list must not be empty"},
		{ereq("elsewhere", 1), codes.Unknown, "rate limit descriptor list must not be empty"},
		{ereq("e", 1, make([][]string, rules.MaxRequestDescriptors+1)...), codes.InvalidArgument, "descriptors: 65 is more than 64"},
	} {
		_, err := f.client.ShouldRateLimit(ctx, tc.req)
		if st := status.Convert(err); st.Code() != tc.code || st.Message() != tc.msg {
			t.Errorf("%v: %v, want %v %q", tc.req, err, tc.code, tc.msg)
		}
	}
	wantResp(t, "no entries and an empty key", f.call(t, ereq("e", 1, kv(), kv("", "v"))), ok(),
		&rlsv3.RateLimitResponse_DescriptorStatus{Code: ok()}, &rlsv3.RateLimitResponse_DescriptorStatus{Code: ok()})

	g := start(t, envoyRules, Options{})
	if _, err := g.client.ShouldRateLimit(ctx, ereq("elsewhere", 1)); status.Code(err) != codes.InvalidArgument {
		t.Errorf("an unconfigured domain without Options.Compat: %v, want streamlimit's InvalidArgument", err)
	}
}

// /json answers a compat: envoy domain as envoyproxy/ratelimit's /json: every refusal 400
// "Bad Request", the decision in JSON only; streamlimit's answers keep their reasons and
// header fields.
func TestEnvoyJSON(t *testing.T) {
	post := func(h http.Handler, body string) *http.Response {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(body)))
		return rec.Result()
	}
	text := func(r *http.Response) string {
		b, _ := io.ReadAll(r.Body)
		return string(b)
	}
	f := start(t, envoyRules, Options{Compat: rules.CompatEnvoy})
	for _, body := range []string{"", "}", `{"domain":"e"}`, `{"descriptors":[{"entries":[{"key":"k"}]}]}`} {
		if r := post(f.srv.JSONHandler(), body); r.StatusCode != 400 || text(r) != "Bad Request\n" {
			t.Errorf("%q: %d, want 400 Bad Request", body, r.StatusCode)
		}
	}
	r := post(f.srv.JSONHandler(), `{"domain":"e","descriptors":[{"entries":[{"key":"k","value":"j"}]}]}`)
	if r.StatusCode != 200 || r.Header.Get("Content-Type") != "application/json" || r.Header.Get("Cache-Control") != "" || !strings.Contains(text(r), `"limitRemaining":9`) {
		t.Errorf("OK: %d %v", r.StatusCode, r.Header)
	}

	g := start(t, testRules, Options{})
	if r := post(g.srv.JSONHandler(), "}"); r.StatusCode != 400 || !strings.HasPrefix(text(r), "malformed RateLimitRequest JSON") {
		t.Errorf("streamlimit's /json: %d, want its reason", r.StatusCode)
	}
}

// A store that answers on a share of the site's limits (sitestore's fallback while Redis
// is away) reports its scaled allowance; the count is compared with the limit scaled alike.
func TestEnvoyCountOfFallback(t *testing.T) {
	l := &rules.Limit{Requests: 10, Window: time.Hour}
	if c, lim := envoyCountOf(algo.Decision{Limit: noCeiling, Remaining: noCeiling - 7}, l); c != 7 || lim != 10 {
		t.Fatalf("count %d of %d, want 7 of 10", c, lim)
	}
	if c, lim := envoyCountOf(algo.Decision{Limit: noCeiling / 2, Remaining: noCeiling/2 - 3}, l); c != 3 || lim != 5 {
		t.Fatalf("half share: count %d of %d, want 3 of 5", c, lim)
	}
}
