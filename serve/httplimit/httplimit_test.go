package httplimit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2, scope: local, algorithm: fixed_window}
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 3, scope: local, algorithm: fixed_window}
  - key: route
    rate_limit: {unit: minute, requests_per_unit: 2, scope: local, algorithm: fixed_window}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1, scope: local, algorithm: fixed_window}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, scope: local, algorithm: fixed_window}
  - key: bench
    rate_limit: {unit: second, requests_per_unit: 1000000000000, scope: local, algorithm: fixed_window}
  - key: metered
    rate_limit: {unit: minute, requests_per_unit: 1, soft_percent: 100, scope: local, algorithm: fixed_window}
`

var t0 = time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)

func newLimiter(t testing.TB) (*enforcer.Engine, *clock.Fake) {
	t.Helper()
	rc, err := rules.Parse("rules.yaml", []byte(testRules))
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(t0)
	l, err := enforcer.New(enforcer.Config{Rules: rules.Static(rc), Site: "t", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return l, clk
}

func newMW(t testing.TB, cfg Config, mod func(*Options)) *Middleware {
	t.Helper()
	l, _ := newLimiter(t)
	if cfg.Domain == "" {
		cfg.Domain = "api"
	}
	opts := Options{Config: cfg}
	if mod != nil {
		mod(&opts)
	}
	m, err := New(l, opts)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func one(srcs ...Source) []Descriptor { return []Descriptor{{Entries: srcs}} }

var okHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Handler", "yes")
	io.WriteString(w, "hello")
})

func do(t *testing.T, c *http.Client, method, u string, hdr map[string]string, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// item parses field and returns its only item, checking its name and integer params.
func checkField(t *testing.T, h http.Header, field, name string, params ...any) {
	t.Helper()
	items, err := sftest.ParseList(h.Get(field))
	if err != nil {
		t.Fatalf("%s %q: %v", field, h.Get(field), err)
	}
	if len(items) != 1 || items[0].Value != name {
		t.Fatalf("%s %q: want one item %q", field, h.Get(field), name)
	}
	for i := 0; i+1 < len(params); i += 2 {
		v, ok := items[0].Param(params[i].(string))
		if !ok || v != int64(params[i+1].(int)) {
			t.Errorf("%s %q: %s = %v, want %v", field, h.Get(field), params[i], v, params[i+1])
		}
	}
}

func TestMiddlewareAdmitsThenDenies(t *testing.T) {
	var calls atomic.Int64
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		// The fields are set before the handler runs, in canonical form.
		if r.Header.Get("X-API-Key") != "" && w.Header().Get("RateLimit") == "" {
			t.Error("RateLimit not set before next")
		}
		okHandler(w, r)
	})
	m := newMW(t, Config{Descriptors: one(Source{Type: SourceHeader, Name: "x-api-key", Key: "api_key"})}, nil)
	srv := httptest.NewServer(m.Handler(next))
	defer srv.Close()
	for i := range 3 {
		resp := do(t, srv.Client(), "GET", srv.URL+"/x", map[string]string{"X-API-Key": "k1"}, "")
		if resp.StatusCode != 200 || resp.Header.Get("X-Handler") != "yes" {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
		checkField(t, resp.Header, "RateLimit-Policy", "api.api_key-60s", "q", 3, "w", 60)
		checkField(t, resp.Header, "RateLimit", "api.api_key-60s", "r", 2-i, "t", 60)
		if resp.Header.Get("X-RateLimit-Remaining") != strconv.Itoa(2-i) || resp.Header.Get("X-RateLimit-Limit") != "3" || resp.Header.Get("Retry-After") != "" {
			t.Fatalf("request %d: %v", i, resp.Header)
		}
	}
	resp := do(t, srv.Client(), "GET", srv.URL+"/x", map[string]string{"X-API-Key": "k1"}, "")
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("4th: %d", resp.StatusCode)
	}
	if calls.Load() != 3 {
		t.Fatalf("next called %d times, want 3", calls.Load())
	}
	checkField(t, resp.Header, "RateLimit-Policy", "api.api_key-60s", "q", 3, "w", 60)
	checkField(t, resp.Header, "RateLimit", "api.api_key-60s", "r", 0, "t", 60)
	for k, want := range map[string]string{"Retry-After": "60", "X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "60", "Content-Type": "application/problem+json"} {
		if got := resp.Header.Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	var p map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"type": "about:blank", "title": "Too Many Requests", "status": 429.0, "policy": "api.api_key-60s", "rule": "api.api_key", "limit": 3.0, "window_seconds": 60.0, "retry_after_seconds": 60.0}
	for k, v := range want {
		if p[k] != v {
			t.Errorf("problem %s = %v, want %v", k, p[k], v)
		}
	}
	if d, _ := p["detail"].(string); !strings.Contains(d, `"api.api_key-60s"`) {
		t.Errorf("detail %q does not name the policy", d)
	}
	// Another key, and a request without the header (descriptor skipped), pass.
	if resp := do(t, srv.Client(), "GET", srv.URL+"/x", map[string]string{"X-API-Key": "k2"}, ""); resp.StatusCode != 200 {
		t.Fatalf("other key: %d", resp.StatusCode)
	}
	resp = do(t, srv.Client(), "GET", srv.URL+"/x", nil, "")
	if resp.StatusCode != 200 || resp.Header.Get("RateLimit") != "" {
		t.Fatalf("no header: %d %v", resp.StatusCode, resp.Header)
	}
}

func TestClientIP(t *testing.T) {
	m := newMW(t, Config{Descriptors: one(Source{Type: SourceRemoteAddress}), TrustedProxies: []string{"10.0.0.0/8", "2001:db8:ffff::/48", "192.0.2.1"}}, nil)
	cases := []struct {
		peer string
		hdr  map[string][]string
		want string
	}{
		{"203.0.113.5:1000", map[string][]string{"X-Forwarded-For": {"1.1.1.1"}}, "203.0.113.5"}, // untrusted peer: spoof ignored
		{"10.1.2.3:1000", nil, "10.1.2.3"},
		{"10.1.2.3:1000", map[string][]string{"X-Forwarded-For": {"6.6.6.6, 198.51.100.9, 10.9.9.9"}}, "198.51.100.9"},
		{"10.1.2.3:1000", map[string][]string{"X-Forwarded-For": {"6.6.6.6", "198.51.100.9:443, 192.0.2.1"}}, "198.51.100.9"},
		{"10.1.2.3:1000", map[string][]string{"X-Forwarded-For": {"10.2.2.2, 10.3.3.3"}}, "10.2.2.2"},
		{"10.1.2.3:1000", map[string][]string{"X-Forwarded-For": {"6.6.6.6, garbage, 10.3.3.3"}}, "10.3.3.3"},
		{"[2001:db8:ffff::1]:80", map[string][]string{"X-Forwarded-For": {"2001:db8:1::7"}}, "2001:db8:1::7"},
		// Only the configured header (X-Forwarded-For) counts: Forwarded and X-Real-IP are
		// whatever the client sent.
		{"10.1.2.3:1000", map[string][]string{"Forwarded": {`for=6.6.6.6`}, "X-Real-IP": {"5.5.5.5"}, "X-Forwarded-For": {"7.7.7.7"}}, "7.7.7.7"},
		{"10.1.2.3:1000", map[string][]string{"Forwarded": {`for=6.6.6.6`}, "X-Real-IP": {"5.5.5.5"}}, "10.1.2.3"},
		{"[::ffff:10.1.2.3]:1000", map[string][]string{"X-Forwarded-For": {"::ffff:198.51.100.1"}}, "198.51.100.1"},
	}
	checkClientIPs(t, m, cases)

	fwd := newMW(t, Config{Descriptors: one(Source{Type: SourceRemoteAddress}), TrustedProxies: []string{"10.0.0.0/8", "2001:db8:ffff::/48"}, ForwardedHeader: "forwarded"}, nil)
	checkClientIPs(t, fwd, []struct {
		peer string
		hdr  map[string][]string
		want string
	}{
		{"10.1.2.3:1000", map[string][]string{"Forwarded": {`for=6.6.6.6, for=198.51.100.17;proto=https;by=10.0.0.1, for="[2001:db8:ffff::9]:4711"`}, "X-Forwarded-For": {"7.7.7.7"}}, "198.51.100.17"},
		{"10.1.2.3:1000", map[string][]string{"Forwarded": {`for="[2001:db8:cafe::17]:4711"`}}, "2001:db8:cafe::17"},
		{"10.1.2.3:1000", map[string][]string{"Forwarded": {`for=unknown, for=10.4.4.4`}}, "10.4.4.4"},
		{"10.1.2.3:1000", map[string][]string{"X-Forwarded-For": {"7.7.7.7"}}, "10.1.2.3"},
		{"203.0.113.5:1000", map[string][]string{"Forwarded": {`for=6.6.6.6`}}, "203.0.113.5"},
	})
}

func checkClientIPs(t *testing.T, m *Middleware, cases []struct {
	peer string
	hdr  map[string][]string
	want string
}) {
	t.Helper()
	for _, c := range cases {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = c.peer
		for k, v := range c.hdr {
			r.Header[k] = v
		}
		if got := m.ClientIP(r); got != netip.MustParseAddr(c.want) {
			t.Errorf("peer %s %v: client %v, want %s", c.peer, c.hdr, got, c.want)
		}
	}
}

// TestSpoofedForwardingHeaders plays a client behind a trusted proxy (the test server's
// peer, 127.0.0.1) that sends a new address in every forwarding header it can think of on
// each request, while the proxy appends the address it really saw to X-Forwarded-For. The
// client has 2 requests a minute (remote_address); whatever it sends, it gets 2.
func TestSpoofedForwardingHeaders(t *testing.T) {
	const real = "198.51.100.7"
	attempts := map[string]func(i int) map[string]string{
		"rotating Forwarded": func(i int) map[string]string {
			return map[string]string{"Forwarded": fmt.Sprintf("for=203.0.113.%d", i), "X-Forwarded-For": real}
		},
		"rotating X-Forwarded-For": func(i int) map[string]string {
			return map[string]string{"X-Forwarded-For": fmt.Sprintf("203.0.113.%d, %s", i, real)}
		},
		"rotating X-Real-IP": func(i int) map[string]string {
			return map[string]string{"X-Real-IP": fmt.Sprintf("203.0.113.%d", i), "X-Forwarded-For": real}
		},
		"all at once": func(i int) map[string]string {
			return map[string]string{
				"Forwarded":       fmt.Sprintf(`for="[2001:db8::%d]", for=203.0.113.%d`, i, i),
				"X-Real-IP":       fmt.Sprintf("192.0.2.%d", i),
				"X-Forwarded-For": fmt.Sprintf("10.9.9.%d, 203.0.113.%d, %s", i, i, real),
			}
		},
	}
	for name, hdr := range attempts {
		t.Run(name, func(t *testing.T) {
			m := newMW(t, Config{Descriptors: one(Source{Type: SourceRemoteAddress}), TrustedProxies: []string{"127.0.0.1"}}, nil)
			srv := httptest.NewServer(m.Handler(okHandler))
			defer srv.Close()
			if n := admitted(t, srv.Client(), srv.URL, 6, hdr); n != 2 {
				t.Fatalf("admitted %d of 6, want 2 (the limit)", n)
			}
		})
	}
	t.Run("auth endpoint: X-Real-IP from an untrusted peer", func(t *testing.T) {
		m := newMW(t, Config{Descriptors: one(Source{Type: SourceRemoteAddress}), TrustedProxies: []string{"10.0.0.0/8"}}, nil)
		srv := httptest.NewServer(m.AuthHandler(AuthOptions{}))
		defer srv.Close()
		n := admitted(t, srv.Client(), srv.URL+"/v1/auth", 6, func(i int) map[string]string {
			return map[string]string{"X-Real-IP": fmt.Sprintf("203.0.113.%d", i), "Forwarded": fmt.Sprintf("for=192.0.2.%d", i)}
		})
		if n != 2 {
			t.Fatalf("admitted %d of 6, want 2 (the peer's limit)", n)
		}
	})
	t.Run("auth endpoint: trusted nginx's X-Real-IP is the client", func(t *testing.T) {
		m := newMW(t, Config{Descriptors: one(Source{Type: SourceRemoteAddress}), TrustedProxies: []string{"127.0.0.1"}}, nil)
		srv := httptest.NewServer(m.AuthHandler(AuthOptions{}))
		defer srv.Close()
		n := admitted(t, srv.Client(), srv.URL+"/v1/auth", 6, func(i int) map[string]string {
			return map[string]string{"X-Real-IP": fmt.Sprintf("203.0.113.%d", i)}
		})
		if n != 6 {
			t.Fatalf("admitted %d of 6 distinct clients, want 6", n)
		}
	})
}

// admitted sends n requests with hdr(i) and returns how many were not answered 429.
func admitted(t *testing.T, c *http.Client, u string, n int, hdr func(i int) map[string]string) int {
	t.Helper()
	ok := 0
	for i := range n {
		if resp := do(t, c, "GET", u, hdr(i), ""); resp.StatusCode != http.StatusTooManyRequests {
			ok++
		}
	}
	return ok
}

// The test server's peer is 127.0.0.1: trusted or not by configuration.
func TestForwardingHeadersThroughServer(t *testing.T) {
	run := func(t *testing.T, trusted []string, xffs []string) []int {
		m := newMW(t, Config{Descriptors: one(Source{Type: SourceRemoteAddress}), TrustedProxies: trusted}, nil)
		srv := httptest.NewServer(m.Handler(okHandler))
		defer srv.Close()
		var codes []int
		for _, x := range xffs {
			codes = append(codes, do(t, srv.Client(), "GET", srv.URL, map[string]string{"X-Forwarded-For": x}, "").StatusCode)
		}
		return codes
	}
	t.Run("untrusted peer: spoofed X-Forwarded-For ignored", func(t *testing.T) {
		// Limit 2 per client: three different spoofed addresses still share the peer's counter.
		got := run(t, nil, []string{"1.1.1.1", "2.2.2.2", "3.3.3.3"})
		if got[0] != 200 || got[1] != 200 || got[2] != 429 {
			t.Fatalf("codes %v", got)
		}
	})
	t.Run("trusted peer: right-most untrusted is the client", func(t *testing.T) {
		got := run(t, []string{"127.0.0.0/8"}, []string{"9.9.9.9, 1.1.1.1", "8.8.8.8, 1.1.1.1", "1.1.1.1", "2.2.2.2"})
		if got[0] != 200 || got[1] != 200 || got[2] != 429 || got[3] != 200 {
			t.Fatalf("codes %v", got)
		}
	})
	t.Run("IPv6 grouped by /64", func(t *testing.T) {
		got := run(t, []string{"127.0.0.1"}, []string{"2001:db8:1:2::1", "2001:db8:1:2:ffff:ffff:ffff:9", "2001:db8:1:2::77", "2001:db8:1:3::1"})
		if got[0] != 200 || got[1] != 200 || got[2] != 429 || got[3] != 200 {
			t.Fatalf("codes %v", got)
		}
	})
}

func TestIPv6PrefixValue(t *testing.T) {
	for _, c := range []struct {
		v4, v6 int
		ip     string
		want   string
	}{{0, 0, "2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"}, {0, 48, "2001:db8:1:2::6", "2001:db8:1::/48"}, {0, 128, "2001:db8::6", "2001:db8::6"}, {24, 0, "192.0.2.77", "192.0.2.0/24"}, {0, 0, "192.0.2.77", "192.0.2.77"}} {
		c2, err := compile(Config{Domain: "d", Descriptors: one(Source{Type: SourceRemoteAddress}), IPv4Prefix: c.v4, IPv6Prefix: c.v6})
		if err != nil {
			t.Fatal(err)
		}
		var s state
		c2.build(&s, &view{peer: netip.MustParseAddr(c.ip)})
		if len(s.descs) != 1 || s.descs[0][0] != (rules.Entry{Key: "remote_address", Value: c.want}) {
			t.Errorf("%+v: %v", c, s.descs)
		}
	}
}

func TestExtraction(t *testing.T) {
	c, err := compile(Config{Domain: "d", Descriptors: []Descriptor{
		{Entries: []Source{{Type: SourceGenericKey, Value: "all"}, {Type: SourceMethod}}},
		{Entries: []Source{{Type: SourceHeader, Name: "X-User"}, {Type: SourcePath}}},
		{Entries: []Source{{Type: SourceQuery, Name: "q k"}, {Type: SourceHeader, Name: "X-Opt", SkipIfAbsent: true}}},
		{Entries: []Source{{Type: SourceRoute, Prefixes: []string{"/a", "/a/b"}}}},
		{Entries: []Source{{Type: SourceRoute}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	var s state
	v := &view{method: "PUT", path: "/a/bc", rawQuery: "x=1&q+k=hello%20world&q%20k=2", header: http.Header{"X-User": {"u1"}}}
	c.build(&s, v)
	want := [][]rules.Entry{
		{{Key: "generic_key", Value: "all"}, {Key: "method", Value: "PUT"}},
		{{Key: "X-User", Value: "u1"}, {Key: "path", Value: "/a/bc"}},
		{{Key: "q k", Value: "hello world"}},
		{{Key: "route", Value: "/a"}}, // "/a/b" is not a path-segment prefix of /a/bc
	}
	if !equalDescs(s.descs, want) {
		t.Fatalf("got %v\nwant %v", s.descs, want)
	}
	v.pattern = "PUT /a/{x}"
	c.build(&s, v)
	if got := s.descs[len(s.descs)-1]; got[0].Value != "PUT /a/{x}" || len(s.descs) != 5 {
		t.Fatalf("with pattern: %v", s.descs)
	}
}

func equalDescs(a, b [][]rules.Entry) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if len(a[i]) != len(b[i]) {
			return false
		}
		for j := range a[i] {
			if a[i][j] != b[i][j] {
				return false
			}
		}
	}
	return true
}

func TestRoutePatternFromMux(t *testing.T) {
	cfg := Config{Descriptors: one(Source{Type: SourceRoute})}
	// Middleware on each route: Request.Pattern.
	m := newMW(t, cfg, nil)
	mux := http.NewServeMux()
	mux.Handle("GET /items/{id}", m.Handler(okHandler))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	codes := []int{}
	for _, p := range []string{"/items/1", "/items/2", "/items/3"} {
		codes = append(codes, do(t, srv.Client(), "GET", srv.URL+p, nil, "").StatusCode)
	}
	if codes[2] != 429 || codes[0] != 200 {
		t.Fatalf("per-route: %v", codes)
	}
	// Middleware around the whole mux: Options.Mux.
	mux2 := http.NewServeMux()
	mux2.Handle("GET /items/{id}", okHandler)
	m2 := newMW(t, cfg, func(o *Options) { o.Mux = mux2 })
	srv2 := httptest.NewServer(m2.Handler(mux2))
	defer srv2.Close()
	codes = codes[:0]
	for _, p := range []string{"/items/1", "/items/2", "/items/3"} {
		resp := do(t, srv2.Client(), "GET", srv2.URL+p, nil, "")
		codes = append(codes, resp.StatusCode)
	}
	if codes[2] != 429 || codes[1] != 200 {
		t.Fatalf("around mux: %v", codes)
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func TestShadowModePassesAndLogs(t *testing.T) {
	var logs syncBuf
	m := newMW(t, Config{Descriptors: one(Source{Type: SourceHeader, Name: "X-Trial", Key: "trial"})}, func(o *Options) {
		o.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	})
	srv := httptest.NewServer(m.Handler(okHandler))
	defer srv.Close()
	for i := range 4 {
		resp := do(t, srv.Client(), "GET", srv.URL+"/p", map[string]string{"X-Trial": "t1"}, "")
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
		if resp.Header.Get("RateLimit") != "" || resp.Header.Get("Retry-After") != "" {
			t.Fatalf("shadow rule advertised: %v", resp.Header)
		}
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("want 3 shadow log records (requests 2..4), got %q", logs.String())
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatal(err)
	}
	if rec["rule"] != "api.trial" || rec["level"] != "WARN" || rec["path"] != "/p" || rec["policy"] != "api.trial-60s" {
		t.Fatalf("log record %v", rec)
	}
}

func TestConfigErrors(t *testing.T) {
	l, _ := newLimiter(t)
	for _, c := range []struct {
		cfg   Config
		field string
	}{
		{Config{Descriptors: one(Source{Type: SourceMethod})}, "domain"},
		{Config{Domain: "d"}, "descriptors"},
		{Config{Domain: "d", Descriptors: one(Source{Type: "cookie"})}, "descriptors[0].entries[0].type"},
		{Config{Domain: "d", Descriptors: one(Source{Type: SourceHeader})}, "descriptors[0].entries[0].name"},
		{Config{Domain: "d", Descriptors: one(Source{Type: SourceMethod}), TrustedProxies: []string{"10.0.0.0/33"}}, "trusted_proxies[0]"},
		{Config{Domain: "d", Descriptors: one(Source{Type: SourceMethod}), ForwardedHeader: "X-Forwarded-For, Forwarded"}, "forwarded_header"},
		{Config{Domain: "d", Descriptors: one(Source{Type: SourceMethod}), IPv6Prefix: 129}, "ipv6_prefix"},
		{Config{Domain: "d", Descriptors: one(Source{Type: SourceRoute, Prefixes: []string{"api"}})}, "descriptors[0].entries[0].prefixes"},
	} {
		_, err := New(l, Options{Config: c.cfg})
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field {
			t.Errorf("%+v: err %v, want field %s", c.cfg, err, c.field)
		}
	}
}

func postJSON(t *testing.T, c *http.Client, u, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := c.Post(u, "application/json", strings.NewReader(body))
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

func TestCheckAPI(t *testing.T) {
	l, _ := newLimiter(t)
	mux := http.NewServeMux()
	mux.Handle("/v1/check", NewCheckHandler(l, CheckOptions{MaxBodyBytes: 1024}))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	u := srv.URL + "/v1/check"
	body := `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"42"}]},{"entries":[{"key":"nothing","value":"x"}]}],"hits_addend":1}`
	var last CheckResponse
	for i := range 3 {
		resp, b := postJSON(t, srv.Client(), u, body)
		// Admitted: 200; denied: 429 with the fields as HTTP header fields too.
		wantStatus, wantRetry := 200, ""
		if i == 2 {
			wantStatus, wantRetry = 429, "60"
		}
		if resp.StatusCode != wantStatus || resp.Header.Get("Content-Type") != "application/json" || resp.Header.Get("Retry-After") != wantRetry {
			t.Fatalf("request %d: %d Retry-After %q %s", i, resp.StatusCode, resp.Header.Get("Retry-After"), b)
		}
		last = CheckResponse{}
		if err := json.Unmarshal(b, &last); err != nil {
			t.Fatal(err)
		}
		wantCode := "OK"
		if i == 2 {
			wantCode = "OVER_LIMIT"
		}
		if last.OverallCode != wantCode || len(last.Statuses) != 2 || last.Statuses[0].Code != wantCode {
			t.Fatalf("request %d: %s", i, b)
		}
		if i == 0 {
			want := CheckStatus{Code: "OK", CurrentLimit: &CheckLimit{Name: "api.user-60s", RequestsPerUnit: 2, WindowSeconds: 60, Unit: "MINUTE"}, LimitRemaining: 1, DurationUntilResetMs: 60000, Rule: "api.user"}
			if got := last.Statuses[0]; got.Code != want.Code || *got.CurrentLimit != *want.CurrentLimit || got.LimitRemaining != 1 || got.DurationUntilResetMs != 60000 || got.RetryAfterMs != 0 || got.Rule != "api.user" || got.Shadow || got.Fallback {
				t.Fatalf("status %+v", got)
			}
			// An unmatched descriptor is OK with no limit.
			if got := last.Statuses[1]; got.Code != "OK" || got.CurrentLimit != nil || got.Rule != "" {
				t.Fatalf("unmatched %+v", got)
			}
		}
	}
	st := last.Statuses[0]
	if st.LimitRemaining != 0 || st.RetryAfterMs != 60000 {
		t.Fatalf("over-limit status %+v", st)
	}
	hdr := map[string]string{}
	for _, h := range last.ResponseHeadersToAdd {
		hdr[h.Key] = h.Value
	}
	if hdr["Retry-After"] != "60" || hdr["RateLimit"] != `"api.user-60s";r=0;t=60` || hdr["RateLimit-Policy"] != `"api.user-60s";q=2;w=60` {
		t.Fatalf("headers to add %v", hdr)
	}
	// The other spellings of the cost; hits 2 over a limit of 2 for a new user: OK, then over.
	for i, b := range []string{
		`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"7"}]}],"hits":2}`,
		`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"7"}],"hitsAddend":1}],"hitsAddend":1}`,
	} {
		_, rb := postJSON(t, srv.Client(), u, b)
		var r CheckResponse
		json.Unmarshal(rb, &r)
		if want := []string{"OK", "OVER_LIMIT"}[i]; r.OverallCode != want {
			t.Fatalf("%s: %s", b, rb)
		}
	}

	for _, c := range []struct {
		body   string
		status int
		detail string
	}{
		{`{"domain":`, 400, "malformed JSON"},
		{`{"domain":"api","descriptors":[{"entries":[{"key":"u","value":"1"}]}]} {}`, 400, "data after"},
		{`{"domain":"api","descriptors":[{"entries":[{"key":"u","value":"1"}]}],"extra":1}`, 400, "unknown field"},
		{`{"descriptors":[{"entries":[{"key":"u","value":"1"}]}]}`, 400, "domain"},
		{`{"domain":"api","descriptors":[]}`, 400, "descriptors"},
		{`{"domain":"api","descriptors":[{"entries":[]}]}`, 400, "descriptors[0].entries"},
		{`{"domain":"api","descriptors":[{"entries":[{"key":"","value":"1"}]}]}`, 400, "descriptors[0].entries[0].key"},
		{`{"domain":"api","descriptors":[{"entries":[{"key":"u","value":"1"}]}],"hits_addend":-1}`, 400, "hits_addend"},
		{`{"domain":"api","descriptors":[{"entries":[{"key":"u","value":"1"}]}],"hits_addend":1.5}`, 400, "malformed"},
		{`{"domain":"api","descriptors":[{"entries":[{"key":"u","value":"1"}]}],"hits_addend":99999999999}`, 400, "hits_addend"},
		{`{"domain":"api","descriptors":[{"entries":[{"key":"u","value":"1"}]}],"hits":1,"hits_addend":2}`, 400, "more than one name"},
		{`{"domain":"api","descriptors":[{"entries":[{"key":"u","value":"` + strings.Repeat("x", 2000) + `"}]}]}`, 413, ""},
	} {
		resp, b := postJSON(t, srv.Client(), u, c.body)
		var p map[string]any
		json.Unmarshal(b, &p)
		if resp.StatusCode != c.status || resp.Header.Get("Content-Type") != "application/problem+json" || p["status"] != float64(c.status) || !strings.Contains(p["detail"].(string), c.detail) {
			t.Errorf("%.80s: %d %s", c.body, resp.StatusCode, b)
		}
	}
	resp := do(t, srv.Client(), "GET", u, nil, "")
	if resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" {
		t.Errorf("GET: %d", resp.StatusCode)
	}
}

// TestCheckAPISoft checks the check API's soft field: false within the limit, true for
// the admission past it that soft_percent allows, false again (denied) past the band.
func TestCheckAPISoft(t *testing.T) {
	l, _ := newLimiter(t)
	srv := httptest.NewServer(NewCheckHandler(l, CheckOptions{}))
	defer srv.Close()
	body := `{"domain":"api","descriptors":[{"entries":[{"key":"metered","value":"a"}]}]}`
	for i, want := range []struct {
		status int
		soft   bool
	}{{200, false}, {200, true}, {429, false}} {
		resp, b := postJSON(t, srv.Client(), srv.URL, body)
		var cr CheckResponse
		if err := json.Unmarshal(b, &cr); err != nil || resp.StatusCode != want.status || cr.Statuses[0].Soft != want.soft {
			t.Errorf("request %d: %d %s, want %d with soft %v", i+1, resp.StatusCode, b, want.status, want.soft)
		}
	}
}

func TestAuthEndpoint(t *testing.T) {
	m := newMW(t, Config{Descriptors: []Descriptor{
		{Entries: []Source{{Type: SourceRemoteAddress}}},
		{Entries: []Source{{Type: SourceRoute, Prefixes: []string{"/articles"}}}},
	}, TrustedProxies: []string{"127.0.0.1"}}, nil)
	srv := httptest.NewServer(m.AuthHandler(AuthOptions{}))
	defer srv.Close()
	h := func(ip, method, uri string) map[string]string {
		return map[string]string{"X-Real-IP": ip, "X-Original-Method": method, "X-Original-URI": uri}
	}
	// remote_address: 2 per minute per client, route: 2 per minute.
	resp := do(t, srv.Client(), "GET", srv.URL+"/v1/auth", h("198.51.100.1", "POST", "/articles/1?x=1"), "")
	if resp.StatusCode != 204 {
		t.Fatalf("first: %d", resp.StatusCode)
	}
	// Both policies are advertised; the state is the one closest to exhaustion.
	pol, err := sftest.ParseList(resp.Header.Get("RateLimit-Policy"))
	if err != nil || len(pol) != 2 || pol[0].Value != "api.remote_address-60s" || pol[1].Value != "api.route-60s" {
		t.Fatalf("RateLimit-Policy %q %v", resp.Header.Get("RateLimit-Policy"), err)
	}
	items, err := sftest.ParseList(resp.Header.Get("RateLimit"))
	if err != nil || len(items) != 1 || items[0].Value != "api.remote_address-60s" {
		t.Fatalf("RateLimit %q %v", resp.Header.Get("RateLimit"), err)
	}
	if r, _ := items[0].Param("r"); r != int64(1) {
		t.Fatalf("r = %v", r)
	}
	// Another client, same route: the route's second request.
	if resp := do(t, srv.Client(), "GET", srv.URL+"/v1/auth", h("198.51.100.2", "POST", "/articles/2"), ""); resp.StatusCode != 204 {
		t.Fatalf("second: %d", resp.StatusCode)
	}
	// A third client on the route: denied, 429 by default, 403 on ?status=403.
	resp = do(t, srv.Client(), "GET", srv.URL+"/v1/auth", h("198.51.100.3", "POST", "/articles/3"), "")
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "60" || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("third: %d %v", resp.StatusCode, resp.Header)
	}
	var p Problem
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil || p.Policy != "api.route-60s" || p.Status != 429 || p.RetryAfterSeconds != 60 {
		t.Fatalf("problem %+v %v", p, err)
	}
	resp = do(t, srv.Client(), "GET", srv.URL+"/v1/auth?status=403", h("198.51.100.4", "POST", "/articles/3"), "")
	if resp.StatusCode != 403 || resp.Header.Get("Retry-After") != "60" {
		t.Fatalf("with status=403: %d", resp.StatusCode)
	}
	// Another route is not limited by the route rule; without X-Original-URI the route
	// descriptor is skipped: only the client address counts.
	if resp := do(t, srv.Client(), "GET", srv.URL+"/v1/auth", h("198.51.100.5", "GET", "/users/3"), ""); resp.StatusCode != 204 {
		t.Fatalf("other route: %d", resp.StatusCode)
	}
	if resp := do(t, srv.Client(), "GET", srv.URL+"/v1/auth", map[string]string{"X-Real-IP": "198.51.100.5"}, ""); resp.StatusCode != 204 {
		t.Fatalf("no uri: %d", resp.StatusCode)
	}
	if resp := do(t, srv.Client(), "GET", srv.URL+"/v1/auth", map[string]string{"X-Real-IP": "198.51.100.5"}, ""); resp.StatusCode != 429 {
		t.Fatalf("client over its limit: %d", resp.StatusCode)
	}
}

func TestProxy(t *testing.T) {
	type seen struct {
		method, uri, body, custom, xff, host string
		hdr                                  http.Header
	}
	var (
		mu   sync.Mutex
		got  []seen
		hits atomic.Int64
	)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, seen{r.Method, r.RequestURI, string(b), r.Header.Get("X-Custom"), r.Header.Get("X-Forwarded-For"), r.Host, r.Header.Clone()})
		mu.Unlock()
		w.Header().Set("X-Upstream", "1")
		w.WriteHeader(201)
		io.WriteString(w, "created")
	}))
	defer upstream.Close()
	uu, _ := url.Parse(upstream.URL)
	m := newMW(t, Config{Descriptors: one(Source{Type: SourceHeader, Name: "X-API-Key", Key: "api_key"})}, nil)
	front := httptest.NewServer(NewProxy(uu, m))
	defer front.Close()

	body := "{\"a\":[1,2,3]}\x00\xff binary"
	hdr := map[string]string{"X-API-Key": "k", "X-Custom": "  spaced, value ", "Content-Type": "application/octet-stream", "X-Forwarded-For": "6.6.6.6", "Connection": "X-Drop", "X-Drop": "hop"}
	for i := range 3 {
		resp := do(t, front.Client(), "POST", front.URL+"/v1/items/a%2Fb?q=1&q=2&z=%20x", hdr, body)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 201 || string(b) != "created" || resp.Header.Get("X-Upstream") != "1" || resp.Header.Get("RateLimit") == "" {
			t.Fatalf("request %d: %d %q %v", i, resp.StatusCode, b, resp.Header)
		}
	}
	resp := do(t, front.Client(), "POST", front.URL+"/v1/items/a%2Fb?q=1", hdr, body)
	if resp.StatusCode != 429 {
		t.Fatalf("4th: %d", resp.StatusCode)
	}
	if hits.Load() != 3 {
		t.Fatalf("upstream saw %d requests, want 3: the 429 must not reach it", hits.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	for _, s := range got {
		if s.method != "POST" || s.uri != "/v1/items/a%2Fb?q=1&q=2&z=%20x" || s.body != body || s.custom != "  spaced, value " && s.custom != "spaced, value" {
			t.Fatalf("upstream saw %+v", s)
		}
		if s.hdr.Get("Content-Type") != "application/octet-stream" || s.hdr.Get("X-Api-Key") != "k" || s.hdr.Get("X-Drop") != "" {
			t.Fatalf("upstream headers %v", s.hdr)
		}
		// The client's spoofed X-Forwarded-For is replaced: the peer is not trusted.
		if s.xff != "127.0.0.1" || s.hdr.Get("X-Forwarded-Host") == "" || s.hdr.Get("X-Forwarded-Proto") != "http" || s.host != uu.Host {
			t.Fatalf("forwarding headers %q %v host %q", s.xff, s.hdr, s.host)
		}
	}
}

func TestProxyKeepsTrustedChain(t *testing.T) {
	var xff atomic.Value
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { xff.Store(r.Header.Get("X-Forwarded-For")) }))
	defer upstream.Close()
	uu, _ := url.Parse(upstream.URL)
	m := newMW(t, Config{Descriptors: one(Source{Type: SourceRemoteAddress}), TrustedProxies: []string{"127.0.0.1"}}, nil)
	front := httptest.NewServer(NewProxy(uu, m))
	defer front.Close()
	do(t, front.Client(), "GET", front.URL, map[string]string{"X-Forwarded-For": "198.51.100.1"}, "")
	if got := xff.Load(); got != "198.51.100.1, 127.0.0.1" {
		t.Fatalf("X-Forwarded-For at upstream %q", got)
	}
}

func TestProxyUpstreamDown(t *testing.T) {
	upstream := httptest.NewServer(http.NotFoundHandler())
	uu, _ := url.Parse(upstream.URL)
	upstream.Close()
	m := newMW(t, Config{Descriptors: one(Source{Type: SourceMethod})}, nil)
	front := httptest.NewServer(NewProxy(uu, m))
	defer front.Close()
	if resp := do(t, front.Client(), "GET", front.URL, nil, ""); resp.StatusCode != 502 {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

// benchWriter is a ResponseWriter that keeps nothing, so the benchmark measures the
// middleware, not a recorder.
type benchWriter struct{ h http.Header }

func (w *benchWriter) Header() http.Header         { return w.h }
func (w *benchWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *benchWriter) WriteHeader(int)             {}

func BenchmarkMiddlewareAdmitted(b *testing.B) {
	m := newMW(b, Config{Descriptors: []Descriptor{
		{Entries: []Source{{Type: SourceRemoteAddress, Key: "bench"}}},
		{Entries: []Source{{Type: SourceHeader, Name: "X-API-Key", Key: "bench"}}},
	}}, nil)
	h := m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	r := httptest.NewRequest("GET", "/items/1", nil)
	r.RemoteAddr = "192.0.2.10:5555"
	r.Header.Set("X-API-Key", "key-1")
	w := &benchWriter{h: make(http.Header, 8)}
	b.ReportAllocs()
	for b.Loop() {
		clear(w.h)
		h.ServeHTTP(w, r)
	}
	if w.h.Get("RateLimit") == "" {
		b.Fatal("no RateLimit field")
	}
}
