package rls

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
	"github.com/streamlimit/streamlimit/serve/httplimit"
)

var t0 = time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)

const testRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {name: per-minute, unit: minute, requests_per_unit: 3, scope: local, algorithm: fixed_window}
  - key: path
    rate_limit: {window: 10m, requests_per_unit: 1, scope: local, algorithm: fixed_window}
  - key: free
    rate_limit: {unlimited: true}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 1, scope: local, algorithm: fixed_window}
    shadow_mode: true
`

func loadRules(t testing.TB, yaml string) *rules.Config {
	t.Helper()
	c, err := rules.Parse("rules.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

type fixture struct {
	srv    *Server
	gs     *grpc.Server
	conn   *grpc.ClientConn
	client rlsv3.RateLimitServiceClient
	clk    *clock.Fake
	reg    *prometheus.Registry
}

// start serves a Server for yaml on a real loopback listener and dials it with a real
// gRPC client. Cleanup closes the client and stops the server gracefully.
func start(t testing.TB, yaml string, opts Options) *fixture {
	t.Helper()
	clk := clock.NewFake(t0)
	l, err := enforcer.New(enforcer.Config{Rules: rules.Static(loadRules(t, yaml)), Site: "t", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if opts.Registerer == nil {
		opts.Registerer = reg
	}
	srv, err := NewServer(l, opts)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	srv.Register(gs)
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		gs.GracefulStop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return &fixture{srv: srv, gs: gs, conn: conn, client: rlsv3.NewRateLimitServiceClient(conn), clk: clk, reg: reg}
}

func descriptor(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func (f *fixture) call(t testing.TB, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := f.client.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	if len(resp.GetStatuses()) != len(req.GetDescriptors()) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.GetStatuses()), len(req.GetDescriptors()))
	}
	return resp
}

func headerMap(resp *rlsv3.RateLimitResponse) map[string]string {
	m := map[string]string{}
	for _, h := range resp.GetResponseHeadersToAdd() {
		m[h.GetKey()] = h.GetValue()
	}
	return m
}

// sfItem parses a one-item structured-field list item such as `"per-minute";q=3;w=60`
// into its string and parameters.
func sfItem(t testing.TB, s string) (string, map[string]string) {
	t.Helper()
	parts := strings.Split(strings.TrimSpace(s), ";")
	name, err := unquote(parts[0])
	if err != nil {
		t.Fatalf("item %q: %v", s, err)
	}
	params := map[string]string{}
	for _, p := range parts[1:] {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			t.Fatalf("item %q: parameter %q has no value", s, p)
		}
		params[k] = v
	}
	return name, params
}

func unquote(s string) (string, error) {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return "", status.Errorf(codes.InvalidArgument, "not an sf-string: %q", s)
	}
	return strings.ReplaceAll(strings.ReplaceAll(s[1:len(s)-1], `\"`, `"`), `\\`, `\`), nil
}

func TestOverLimitStatusesAndHeaders(t *testing.T) {
	f := start(t, testRules, Options{})
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("user", "42")}}

	for i := range 3 {
		resp := f.call(t, req)
		st := resp.GetStatuses()[0]
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || st.GetCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request %d: %v", i, resp)
		}
		if want := uint32(2 - i); st.GetLimitRemaining() != want {
			t.Fatalf("request %d: limit_remaining = %d, want %d", i, st.GetLimitRemaining(), want)
		}
		// Allowed responses carry the RateLimit fields too.
		h := headerMap(resp)
		if got, want := h["X-RateLimit-Remaining"], []string{"2", "1", "0"}[i]; got != want {
			t.Fatalf("request %d: X-RateLimit-Remaining = %q, want %q (headers %v)", i, got, want, h)
		}
		if _, ok := h["Retry-After"]; ok {
			t.Fatalf("request %d: allowed response has Retry-After", i)
		}
	}

	f.clk.Advance(20 * time.Second)
	resp := f.call(t, req)
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("4th request: overall %v, want OVER_LIMIT", resp.GetOverallCode())
	}
	st := resp.GetStatuses()[0]
	if st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("status code %v", st.GetCode())
	}
	lim := st.GetCurrentLimit()
	if lim.GetName() != "per-minute" || lim.GetRequestsPerUnit() != 3 || lim.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || lim.GetUnitMultiplier() != nil {
		t.Fatalf("current_limit = %v", lim)
	}
	if st.GetLimitRemaining() != 0 {
		t.Fatalf("limit_remaining = %d", st.GetLimitRemaining())
	}
	// Fixed window of one minute starting at t0; 20 s in, the window ends in 40 s.
	if got := st.GetDurationUntilReset().AsDuration(); got != 40*time.Second {
		t.Fatalf("duration_until_reset = %v, want 40s", got)
	}

	h := headerMap(resp)
	for name, want := range map[string]string{
		"X-RateLimit-Limit":     "3",
		"X-RateLimit-Remaining": "0",
		"X-RateLimit-Reset":     "40",
		"Retry-After":           "40",
	} {
		if h[name] != want {
			t.Errorf("%s = %q, want %q (headers %v)", name, h[name], want, h)
		}
	}
	name, params := sfItem(t, h["RateLimit-Policy"])
	if name != "per-minute" || params["q"] != "3" || params["w"] != "60" {
		t.Errorf("RateLimit-Policy = %q", h["RateLimit-Policy"])
	}
	name, params = sfItem(t, h["RateLimit"])
	if name != "per-minute" || params["r"] != "0" || params["t"] != "40" {
		t.Errorf("RateLimit = %q", h["RateLimit"])
	}
	if len(resp.GetRequestHeadersToAdd()) != 0 {
		t.Errorf("request_headers_to_add = %v, want empty", resp.GetRequestHeadersToAdd())
	}

	// The next window admits again.
	f.clk.Advance(40 * time.Second)
	if resp := f.call(t, req); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("next window: %v", resp)
	}
	if got := testutil.ToFloat64(f.srv.metrics.overLimit); got != 1 {
		t.Errorf("requests_total{over_limit} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(f.srv.metrics.ok); got != 4 {
		t.Errorf("requests_total{ok} = %v, want 4", got)
	}
}

func TestUnmatchedAndUnlimitedAreOK(t *testing.T) {
	f := start(t, testRules, Options{})
	for range 5 {
		resp := f.call(t, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			descriptor("other", "x"), descriptor("free", "y"),
		}})
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("%v", resp)
		}
		unmatched, unlimited := resp.GetStatuses()[0], resp.GetStatuses()[1]
		if unmatched.GetCode() != rlsv3.RateLimitResponse_OK || unmatched.GetCurrentLimit() != nil || unmatched.GetDurationUntilReset() != nil {
			t.Fatalf("unmatched: %v", unmatched)
		}
		if unlimited.GetCode() != rlsv3.RateLimitResponse_OK || unlimited.GetCurrentLimit() != nil || unlimited.GetLimitRemaining() != math.MaxUint32 {
			t.Fatalf("unlimited: %v", unlimited)
		}
		if len(resp.GetResponseHeadersToAdd()) != 0 {
			t.Fatalf("headers for a request with no limited descriptor: %v", resp.GetResponseHeadersToAdd())
		}
	}
	// An unknown domain limits nothing.
	resp := f.call(t, &rlsv3.RateLimitRequest{Domain: "nope", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("user", "1")}})
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCurrentLimit() != nil {
		t.Fatalf("unknown domain: %v", resp)
	}
}

func TestOneDescriptorOverMakesAllOverAndTakesNothing(t *testing.T) {
	f := start(t, testRules, Options{})
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		descriptor("user", "7"), descriptor("path", "/a"), descriptor("other", "z"),
	}}
	if resp := f.call(t, req); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first: %v", resp)
	}
	resp := f.call(t, req)
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("second: overall %v", resp.GetOverallCode())
	}
	user, path, other := resp.GetStatuses()[0], resp.GetStatuses()[1], resp.GetStatuses()[2]
	// user=7 passed, but the request was denied so it took nothing: 3 − 1 left.
	if user.GetCode() != rlsv3.RateLimitResponse_OK || user.GetLimitRemaining() != 2 {
		t.Fatalf("user status: %v", user)
	}
	if path.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || path.GetLimitRemaining() != 0 {
		t.Fatalf("path status: %v", path)
	}
	pl := path.GetCurrentLimit()
	if pl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || pl.GetUnitMultiplier().GetValue() != 10 || pl.GetRequestsPerUnit() != 1 {
		t.Fatalf("path current_limit: %v", pl)
	}
	if pl.GetName() != "api.path-600s" {
		t.Fatalf("path current_limit name %q, want the policy name", pl.GetName())
	}
	if got := path.GetDurationUntilReset().AsDuration(); got != 10*time.Minute {
		t.Fatalf("path duration_until_reset = %v", got)
	}
	if other.GetCode() != rlsv3.RateLimitResponse_OK || other.GetCurrentLimit() != nil {
		t.Fatalf("other status: %v", other)
	}
	// The denied request took nothing from user=7: one more request alone leaves 1.
	resp = f.call(t, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("user", "7")}})
	if got := resp.GetStatuses()[0].GetLimitRemaining(); got != 1 {
		t.Fatalf("user=7 remaining after a denied request = %d, want 1 (3 − first − this)", got)
	}
	if h := headerMap(resp); h["X-RateLimit-Limit"] != "3" {
		t.Fatalf("headers %v", h)
	}
}

func TestShadowRuleReportsOK(t *testing.T) {
	f := start(t, testRules, Options{})
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("ip", "10.0.0.1")}}
	f.call(t, req)
	resp := f.call(t, req)
	st := resp.GetStatuses()[0]
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || st.GetCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("shadow rule over its limit: %v", resp)
	}
	if st.GetCurrentLimit().GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND || st.GetLimitRemaining() != 0 {
		t.Fatalf("shadow status still reports the limit: %v", st)
	}
	if _, ok := headerMap(resp)["Retry-After"]; ok {
		t.Fatal("Retry-After on an admitted (shadow) request")
	}
}

func TestHitsAddend(t *testing.T) {
	f := start(t, testRules, Options{})
	one := func(hits uint32, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		return f.call(t, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: ds, HitsAddend: hits})
	}
	// Request-level hits_addend.
	if r := one(2, descriptor("user", "a")); r.GetStatuses()[0].GetLimitRemaining() != 1 {
		t.Fatalf("hits_addend 2: %v", r)
	}
	if r := one(2, descriptor("user", "a")); r.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("2+2 > 3 admitted: %v", r)
	}
	// Per-descriptor hits_addend overrides the request's; different costs are decided in
	// groups.
	b := descriptor("user", "b")
	b.HitsAddend = wrapperspb.UInt64(3)
	r := one(1, b, descriptor("user", "c"))
	if r.GetOverallCode() != rlsv3.RateLimitResponse_OK || r.GetStatuses()[0].GetLimitRemaining() != 0 || r.GetStatuses()[1].GetLimitRemaining() != 2 {
		t.Fatalf("per-descriptor hits: %v", r)
	}
	// A denied group stops the request: user=d (cost 1, after the denied cost-3 group)
	// is neither decided nor charged.
	r = one(1, b, descriptor("user", "d"))
	if r.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || r.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("b over: %v", r)
	}
	if d := r.GetStatuses()[1]; d.GetCode() != rlsv3.RateLimitResponse_OK || d.GetCurrentLimit() != nil {
		t.Fatalf("undecided descriptor: %v", d)
	}
	if r := one(1, descriptor("user", "d")); r.GetStatuses()[0].GetLimitRemaining() != 2 {
		t.Fatalf("user=d was charged by a denied request: %v", r)
	}
	// Negative hits (refunds) take nothing and are counted as ignored.
	neg := descriptor("user", "d")
	neg.HitsAddend, neg.IsNegativeHits = wrapperspb.UInt64(1), true
	r = one(1, neg)
	if r.GetOverallCode() != rlsv3.RateLimitResponse_OK || r.GetStatuses()[0].GetCurrentLimit() != nil {
		t.Fatalf("negative hits: %v", r)
	}
	if r := one(1, descriptor("user", "d")); r.GetStatuses()[0].GetLimitRemaining() != 1 {
		t.Fatalf("after a refund: %v", r)
	}
	if got := testutil.ToFloat64(f.srv.metrics.negative); got != 1 {
		t.Fatalf("ignored_total{negative_hits} = %v", got)
	}
}

// TestInvalidRequests checks that the gRPC service rejects what the HTTP check API
// rejects, with the same message: both validate with rules.ValidateRequest.
func TestInvalidRequests(t *testing.T) {
	f := start(t, testRules, Options{})
	l, err := enforcer.New(enforcer.Config{Rules: rules.Static(loadRules(t, testRules)), Site: "t", Clock: f.clk})
	if err != nil {
		t.Fatal(err)
	}
	check := httplimit.NewCheckHandler(l, httplimit.CheckOptions{})
	var many, long []*ratelimitv3.RateLimitDescriptor
	for i := range rules.MaxRequestDescriptors + 1 {
		many = append(many, descriptor("a", strconv.Itoa(i)))
	}
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := range rules.MaxDescriptorEntries + 1 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "k" + strconv.Itoa(i), Value: "v"})
	}
	long = append(long, d)
	cases := []struct {
		name string
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{"empty domain", &rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("user", "1")}}, "domain: required"},
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "api"}, "descriptors: at least one is required"},
		{"too many", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: many}, "descriptors: 65 is more than 64"},
		{"long", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: long}, "descriptors[0].entries: 33 is more than 32"},
		{"no entries", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("user", "1"), {}}}, "descriptors[1].entries: at least one is required"},
		{"empty key", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("user", "1", "", "x")}}, "descriptors[0].entries[1].key: required"},
	}
	for _, tc := range cases {
		_, err := f.client.ShouldRateLimit(context.Background(), tc.req)
		if st := status.Convert(err); st.Code() != codes.InvalidArgument || st.Message() != tc.want {
			t.Errorf("%s over gRPC: %v, want InvalidArgument %q", tc.name, err, tc.want)
		}
		body, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(tc.req)
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		check.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/check", bytes.NewReader(body)))
		var problem struct{ Detail string }
		if err := json.Unmarshal(rec.Body.Bytes(), &problem); err != nil || rec.Code != http.StatusBadRequest || problem.Detail != tc.want {
			t.Errorf("%s over HTTP: %d %s, want 400 with detail %q", tc.name, rec.Code, rec.Body, tc.want)
		}
	}
	if got := testutil.ToFloat64(f.srv.metrics.invalid); got != float64(len(cases)) {
		t.Errorf("requests_total{invalid} = %v, want %d", got, len(cases))
	}
}

func TestHealth(t *testing.T) {
	f := start(t, testRules, Options{})
	hc := healthpb.NewHealthClient(f.conn)
	check := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetStatus()
	}
	if check("") != healthpb.HealthCheckResponse_SERVING || check(ServiceName) != healthpb.HealthCheckResponse_SERVING {
		t.Fatal("not SERVING")
	}
	f.srv.SetServing(false)
	if check("") != healthpb.HealthCheckResponse_NOT_SERVING || check(ServiceName) != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatal("still SERVING after SetServing(false)")
	}
}

func TestUnitOf(t *testing.T) {
	const (
		day = 24 * time.Hour
		U   = rlsv3.RateLimitResponse_RateLimit_UNKNOWN
		S   = rlsv3.RateLimitResponse_RateLimit_SECOND
		M   = rlsv3.RateLimitResponse_RateLimit_MINUTE
		H   = rlsv3.RateLimitResponse_RateLimit_HOUR
		D   = rlsv3.RateLimitResponse_RateLimit_DAY
		W   = rlsv3.RateLimitResponse_RateLimit_WEEK
		Mo  = rlsv3.RateLimitResponse_RateLimit_MONTH
		Y   = rlsv3.RateLimitResponse_RateLimit_YEAR
	)
	for _, c := range []struct {
		w    time.Duration
		unit rlsv3.RateLimitResponse_RateLimit_Unit
		mult uint32 // 0: no multiplier
	}{
		{time.Second, S, 0}, {90 * time.Second, S, 90}, {time.Minute, M, 0}, {10 * time.Minute, M, 10},
		{time.Hour, H, 0}, {3 * time.Hour, H, 3}, {day, D, 0}, {2 * day, D, 2}, {7 * day, W, 0},
		{14 * day, W, 2}, {30 * day, Mo, 0}, {60 * day, Mo, 2}, {365 * day, Y, 0}, {730 * day, Y, 2},
		{1500 * time.Millisecond, U, 0}, {0, U, 0},
	} {
		u, m := unitOf(c.w)
		if u != c.unit || m.GetValue() != c.mult || (c.mult == 0) != (m == nil) {
			t.Errorf("unitOf(%v) = %v×%v, want %v×%d", c.w, u, m, c.unit, c.mult)
		}
	}
}

// TestGracefulStopLeavesNoGoroutines serves real calls, closes the client and stops the
// server, and checks that every goroutine they started ends.
func TestGracefulStopLeavesNoGoroutines(t *testing.T) {
	// A first server and client start gRPC's process-wide goroutines, if any, so that
	// the baseline below includes them.
	warm := func(t *testing.T) {
		f := start(t, testRules, Options{})
		f.call(t, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("user", "1")}})
	}
	t.Run("warm", warm)
	before := runtime.NumGoroutine()
	t.Run("serve", func(t *testing.T) {
		f := start(t, testRules, Options{})
		for i := range 20 {
			f.call(t, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("user", string(rune('a'+i)))}})
		}
		if runtime.NumGoroutine() <= before {
			t.Fatal("a serving server and client started no goroutines; the check below would prove nothing")
		}
	})
	// t.Run's cleanup has closed the client and stopped the server.
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines after GracefulStop, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}
