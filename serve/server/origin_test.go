package server_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/streamlimit/streamlimit"
	"github.com/streamlimit/streamlimit/serve/httplimit"
	"github.com/streamlimit/streamlimit/serve/server"
)

// hostRequest is one request of the browser tests: its Host and Origin (when set) and
// Content-Type, and the status it must get.
type hostRequest struct {
	name, method, path, host, origin, contentType string
	status                                        int
}

// send sends x to the server at addr and checks its status.
func (x hostRequest) send(t *testing.T, addr string) {
	t.Helper()
	var body io.Reader = http.NoBody
	if x.method == "POST" {
		u := strings.ReplaceAll(x.name, " ", "-")
		body = strings.NewReader(`{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"` + u + `"}]}]}`)
	}
	r, err := http.NewRequest(x.method, "http://"+addr+x.path, body)
	if err != nil {
		t.Fatal(err)
	}
	if x.host != "" {
		r.Host = x.host
	}
	if x.origin != "" {
		r.Header.Set("Origin", x.origin)
	}
	if x.contentType != "" {
		r.Header.Set("Content-Type", x.contentType)
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatalf("%s: %v", x.name, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != x.status {
		t.Errorf("%s: %d %s, want %d", x.name, resp.StatusCode, b, x.status)
	}
}

// TestCrossOriginRefused: a web page cannot use the HTTP API or the console through its
// visitor's browser. A POST carrying another site's Origin (which browsers send with every
// cross-origin POST) is 403, whatever its content type; a POST from a page whose body is
// not JSON (a form, text/plain: no preflight) is 415. Clients that are not browsers send
// no Origin and are answered as before: the README's curl -d (a form's content type)
// still gets its decision, and /v1/auth, whose headers are the original request's, is
// left alone. Before, the cross-origin text/plain POST was answered 200 and spent quota.
func TestCrossOriginRefused(t *testing.T) {
	srv := startServer(t, server.Config{GRPCAddr: "127.0.0.1:0",
		HTTP: httplimit.Config{Domain: "api", Descriptors: []httplimit.Descriptor{{Entries: []httplimit.Source{{Type: "remote_address"}}}}}})
	addr := srv.HTTPAddr()
	self := "http://" + addr
	const evil = "http://evil.example"
	const form, text, js = "application/x-www-form-urlencoded", "text/plain;charset=UTF-8", "application/json"
	for _, x := range []hostRequest{
		{name: "curl -d", method: "POST", path: "/v1/check", contentType: form, status: 200},
		{name: "no content type", method: "POST", path: "/v1/check", status: 200},
		{name: "any Host without an allow-list", method: "POST", path: "/v1/check", host: "rebind.example", contentType: js, status: 200},
		{name: "cross-origin text", method: "POST", path: "/v1/check", origin: evil, contentType: text, status: 403},
		{name: "cross-origin form", method: "POST", path: "/v1/check", origin: evil, contentType: form, status: 403},
		{name: "cross-origin json", method: "POST", path: "/v1/check", origin: evil, contentType: js, status: 403},
		{name: "cross-origin other port", method: "POST", path: "/v1/check", origin: "http://127.0.0.1:1", contentType: js, status: 403},
		{name: "origin null", method: "POST", path: "/v1/check", origin: "null", contentType: js, status: 403},
		{name: "cross-origin /json", method: "POST", path: "/json", origin: evil, contentType: text, status: 403},
		{name: "cross-origin console", method: "GET", path: "/ui/", origin: evil, status: 403},
		{name: "cross-origin metrics", method: "GET", path: "/metrics", origin: evil, status: 403},
		{name: "same-origin text", method: "POST", path: "/v1/check", origin: self, contentType: text, status: 415},
		{name: "same-origin multipart", method: "POST", path: "/json", origin: self, contentType: "multipart/form-data; boundary=x", status: 415},
		{name: "same-origin json", method: "POST", path: "/v1/check", origin: self, contentType: "Application/JSON; charset=utf-8", status: 200},
		{name: "same-origin console", method: "GET", path: "/ui/", origin: self, status: 200},
		{name: "healthz from anywhere", method: "GET", path: "/healthz", origin: evil, status: 200},
		{name: "auth with the original Origin", method: "GET", path: "/v1/auth", origin: evil, status: 204},
	} {
		x.send(t, addr)
	}
}

// TestAllowedHosts: with AllowedHosts, a request naming another Host (a name an attacker
// points at the enforcer: DNS rebinding) is 421 on the API, /metrics and the console,
// while the probes answer any Host; an allowed name is matched without port or case,
// and is an accepted Origin too (a proxy in front that rewrites Host). Without it any
// Host is served, as before (TestCrossOriginRefused).
func TestAllowedHosts(t *testing.T) {
	if _, err := server.New(server.Config{
		Config:       streamlimit.Config{Site: "eu", Rules: writeRules(t)},
		GRPCAddr:     "off",
		HTTPAddr:     "127.0.0.1:0",
		AllowedHosts: []string{"enforcer.internal:8081"},
	}); err == nil || !strings.Contains(err.Error(), "without a port") {
		t.Errorf("an allowed host with a port: %v, want an error", err)
	}
	srv := startServer(t, server.Config{AllowedHosts: []string{"enforcer.internal", "127.0.0.1", "[::1]"}})
	addr := srv.HTTPAddr()
	const js = "application/json"
	for _, x := range []hostRequest{
		{name: "rebound check", method: "POST", path: "/v1/check", host: "rebind.example:8081", contentType: js, status: 421},
		{name: "rebound console", method: "GET", path: "/ui/", host: "rebind.example", status: 421},
		{name: "rebound state", method: "GET", path: "/ui/api/state", host: "rebind.example", status: 421},
		{name: "rebound metrics", method: "GET", path: "/metrics", host: "rebind.example", status: 421},
		{name: "rebound healthz", method: "GET", path: "/healthz", host: "rebind.example", status: 200},
		{name: "rebound readyz", method: "GET", path: "/readyz", host: "rebind.example", status: 200},
		{name: "address", method: "POST", path: "/v1/check", contentType: js, status: 200},
		{name: "name", method: "POST", path: "/v1/check", host: "Enforcer.Internal.:8081", contentType: js, status: 200},
		{name: "IPv6", method: "GET", path: "/metrics", host: "[::1]:8081", status: 200},
		{name: "proxied page", method: "POST", path: "/v1/check", origin: "https://enforcer.internal", contentType: js, status: 200},
		{name: "other page", method: "POST", path: "/v1/check", origin: "https://rebind.example", contentType: js, status: 403},
	} {
		x.send(t, addr)
	}
}
