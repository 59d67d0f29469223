package rls

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/serve/headers"
	"github.com/streamlimit/streamlimit/serve/httplimit"
)

// edgeRules has a ban (envoyproxy/ratelimit's requests_per_unit: 0), a limit of 2 that a
// cost of 5 can never pass, and an unlimited rule.
const edgeRules = `
domain: api
descriptors:
  - key: banned
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, scope: local, algorithm: fixed_window}
  - key: free
    rate_limit: {unlimited: true}
`

// TestNeverAndUnlimitedAgreeEverywhere checks the answers for a request that can never
// pass and for an unlimited rule over gRPC, /json and the check API: the wait is
// headers.MaxRetryAfter everywhere (never negative, never overflowing), and an unlimited
// rule reports headers.UnlimitedRemaining everywhere.
func TestNeverAndUnlimitedAgreeEverywhere(t *testing.T) {
	f := start(t, edgeRules, Options{})
	jsonSrv := httptest.NewServer(f.srv.JSONHandler())
	defer jsonSrv.Close()
	l, err := enforcer.New(enforcer.Config{Rules: rules.Static(loadRules(t, edgeRules)), Site: "t2", Clock: f.clk})
	if err != nil {
		t.Fatal(err)
	}
	checkSrv := httptest.NewServer(httplimit.NewCheckHandler(l, httplimit.CheckOptions{}))
	defer checkSrv.Close()

	never := int64(headers.MaxRetryAfter / time.Millisecond)
	for _, tc := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
	}{
		{"ban", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("banned", "x")}}},
		{"cost above the limit", &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 5, Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("user", "big")}}},
	} {
		r := f.call(t, tc.req)
		st := r.GetStatuses()[0]
		if r.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetDurationUntilReset().AsDuration() != headers.MaxRetryAfter {
			t.Errorf("%s over gRPC: %v, duration_until_reset %v, want OVER_LIMIT and %v", tc.name, r.GetOverallCode(), st.GetDurationUntilReset().AsDuration(), headers.MaxRetryAfter)
		}

		body, err := protojson.Marshal(tc.req)
		if err != nil {
			t.Fatal(err)
		}
		resp, b := post(t, jsonSrv.URL, body)
		var jr rlsv3.RateLimitResponse
		if err := protojson.Unmarshal(b, &jr); err != nil || resp.StatusCode != http.StatusTooManyRequests || jr.GetStatuses()[0].GetDurationUntilReset().AsDuration() != headers.MaxRetryAfter {
			t.Errorf("%s over /json: %d %s (%v)", tc.name, resp.StatusCode, b, err)
		}
		if got := resp.Header.Get("Retry-After"); got != "31536000" {
			t.Errorf("%s over /json: Retry-After %q, want 31536000", tc.name, got)
		}

		body, err = protojson.MarshalOptions{UseProtoNames: true}.Marshal(tc.req)
		if err != nil {
			t.Fatal(err)
		}
		resp, b = post(t, checkSrv.URL, body)
		var cr httplimit.CheckResponse
		if err := json.Unmarshal(b, &cr); err != nil || resp.StatusCode != http.StatusTooManyRequests || cr.Statuses[0].RetryAfterMs != never || cr.Statuses[0].DurationUntilResetMs < 0 {
			t.Errorf("%s over the check API: %d %s (%v), want 429 with retry_after_ms %d", tc.name, resp.StatusCode, b, err, never)
		}
	}

	free := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("free", "x")}}
	if got := f.call(t, free).GetStatuses()[0].GetLimitRemaining(); got != math.MaxUint32 {
		t.Errorf("unlimited over gRPC: limit_remaining %d", got)
	}
	body, _ := protojson.MarshalOptions{UseProtoNames: true}.Marshal(free)
	resp, b := post(t, checkSrv.URL, body)
	var cr httplimit.CheckResponse
	if err := json.Unmarshal(b, &cr); err != nil || resp.StatusCode != 200 || cr.Statuses[0].LimitRemaining != math.MaxUint32 {
		t.Errorf("unlimited over the check API: %d %s (%v), want limit_remaining %d", resp.StatusCode, b, err, uint32(math.MaxUint32))
	}
}

// TestJSONEndpoint checks /json as envoyproxy/ratelimit's clients use it: the request
// in protobuf's JSON mapping, 200 then 429 with the response in the same mapping, 400 for
// a malformed or invalid request.
func TestJSONEndpoint(t *testing.T) {
	f := start(t, edgeRules, Options{})
	srv := httptest.NewServer(f.srv.JSONHandler())
	defer srv.Close()
	req := `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"42"}]}]}`
	for i, want := range []int{200, 200, 429} {
		resp, b := post(t, srv.URL, []byte(req))
		if resp.StatusCode != want || resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("request %d: %d %s, want %d", i, resp.StatusCode, b, want)
		}
		var raw map[string]any
		if err := json.Unmarshal(b, &raw); err != nil {
			t.Fatal(err)
		}
		wantCode := map[int]string{200: "OK", 429: "OVER_LIMIT"}[want]
		st := raw["statuses"].([]any)[0].(map[string]any)
		lim, _ := st["currentLimit"].(map[string]any)
		if raw["overallCode"] != wantCode || st["code"] != wantCode || lim["requestsPerUnit"] != 2.0 || lim["unit"] != "MINUTE" {
			t.Errorf("request %d: body %s", i, b)
		}
		if want == 429 && (st["durationUntilReset"] != "60s" || resp.Header.Get("Retry-After") != "60") {
			t.Errorf("denied: durationUntilReset %v, Retry-After %q", st["durationUntilReset"], resp.Header.Get("Retry-After"))
		}
	}
	for _, bad := range []string{`{"domain":`, `{"domain":"api","descriptors":[],"extra":1}`, `{"domain":"api","descriptors":[]}`} {
		if resp, b := post(t, srv.URL, []byte(bad)); resp.StatusCode != 400 || !strings.Contains(string(b), "descriptors") && !strings.Contains(string(b), "JSON") {
			t.Errorf("%s: %d %s, want 400 with the reason", bad, resp.StatusCode, b)
		}
	}
}

// TestJSONRefusesDuplicateFields: /json refuses an object that gives a member twice,
// under either of its names, 400 naming it, as /v1/check does: protobuf's JSON parser
// keeps no last value. It guards that parser's behaviour, which the check API matches.
func TestJSONRefusesDuplicateFields(t *testing.T) {
	f := start(t, edgeRules, Options{})
	srv := httptest.NewServer(f.srv.JSONHandler())
	defer srv.Close()
	const d = `"descriptors":[{"entries":[{"key":"user","value":"dup"}]}]`
	for _, c := range []struct{ body, field string }{
		{`{"domain":"api","descriptors":[{"entries":[{"key":"user","key":"other","value":"dup"}]}]}`, "key"},
		{`{"domain":"api","domain":"other",` + d + `}`, "domain"},
		{`{"domain":"api",` + d + `,"hitsAddend":1,"hits_addend":5}`, "hits_addend"},
	} {
		resp, b := post(t, srv.URL, []byte(c.body))
		if resp.StatusCode != 400 || !strings.Contains(string(b), "duplicate field") || !strings.Contains(string(b), c.field) {
			t.Errorf("%s: %d %s, want 400 naming %s as a duplicate", c.body, resp.StatusCode, b, c.field)
		}
	}
}

func post(t *testing.T, url string, body []byte) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}
