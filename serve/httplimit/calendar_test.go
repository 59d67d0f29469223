package httplimit

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/clock"
	"github.com/streamlimit/streamlimit/enforcer"
	"github.com/streamlimit/streamlimit/enforcer/rules"
)

// A limit with align: calendar resets at the calendar boundary, and the reset and
// Retry-After fields a client reads are the time until that boundary.
func TestCalendarResetHeaders(t *testing.T) {
	rc, err := rules.Parse("rules.yaml", []byte(`
domain: api
descriptors:
  - key: api_key
    rate_limit: {unit: month, requests_per_unit: 1, scope: local, align: calendar}
`))
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Date(2026, 1, 31, 23, 0, 0, 0, time.UTC)) // one hour before February
	l, err := enforcer.New(enforcer.Config{Rules: rules.Static(rc), Site: "t", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(l, Options{Config: Config{Domain: "api", Descriptors: one(Source{Type: SourceHeader, Name: "x-api-key", Key: "api_key"})}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.Handler(okHandler))
	defer srv.Close()
	get := func() *http.Response {
		return do(t, srv.Client(), "GET", srv.URL+"/x", map[string]string{"X-API-Key": "k"}, "")
	}
	resp := get()
	if resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Reset") != "3600" {
		t.Fatalf("first in January: %d, X-RateLimit-Reset %q, want 200 and 3600", resp.StatusCode, resp.Header.Get("X-RateLimit-Reset"))
	}
	checkField(t, resp.Header, "RateLimit", "api.api_key-2592000s", "r", 0, "t", 3600)
	clk.Advance(30 * time.Minute)
	resp = get()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1800" || resp.Header.Get("X-RateLimit-Reset") != "1800" {
		t.Fatalf("second in January: %d, Retry-After %q, X-RateLimit-Reset %q; want 429, 1800, 1800",
			resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("X-RateLimit-Reset"))
	}
	clk.Advance(30 * time.Minute) // Feb 1st, 00:00 UTC
	resp = get()
	if want := "2419200"; resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Reset") != want { // 28 days, to Mar 1st
		t.Fatalf("first in February: %d, X-RateLimit-Reset %q, want 200 and %s", resp.StatusCode, resp.Header.Get("X-RateLimit-Reset"), want)
	}
}
