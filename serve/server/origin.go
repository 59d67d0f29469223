package server

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/streamlimit/streamlimit/serve/headers"
)

// browserGuard keeps web pages off the HTTP API and the console. The API trusts its
// callers, and a browser will send a page's requests to it on the user's behalf: a
// cross-origin POST of a "simple" content type (text/plain, a form) reaches /v1/check
// without a preflight and spends anyone's quota, and a name that an attacker's DNS
// points at 127.0.0.1 (DNS rebinding) makes the console and /metrics that page's own
// origin. So:
//
//   - a request whose Host is not in the allow-list, when there is one, is answered 421;
//   - a request whose Origin is not its own host (nor an allowed host) is answered 403:
//     browsers send Origin with every cross-origin POST, and with every POST at all;
//   - a POST with an Origin whose body is not application/json is answered 415: a page's
//     form or text/plain body is not a check request, while clients that are not
//     browsers (curl -d, which sends a form's content type, Envoy, SDKs) send no Origin
//     and are answered as before.
//
// The health probes and the API's description (openPaths) answer any host: orchestrators
// probe by address. /v1/auth is left alone: its request's headers are the original
// request's, copied by nginx or Envoy, Host and Origin included.
type browserGuard struct {
	// hosts are the allowed host names, lower case, without port or brackets; empty: any.
	hosts map[string]bool
}

// newBrowserGuard returns the guard of the allowed hosts (Config.AllowedHosts).
func newBrowserGuard(allowed []string) (browserGuard, error) {
	g := browserGuard{}
	var errs []error
	for _, h := range allowed {
		h = strings.TrimSpace(h)
		if _, _, err := net.SplitHostPort(h); err == nil {
			errs = append(errs, fmt.Errorf("allowed host %q: give the name without a port", h))
			continue
		}
		name := hostName(h)
		if name == "" || strings.ContainsAny(name, "/ ") {
			errs = append(errs, fmt.Errorf("allowed host %q: not a host name or address", h))
			continue
		}
		if g.hosts == nil {
			g.hosts = make(map[string]bool)
		}
		g.hosts[name] = true
	}
	return g, errors.Join(errs...)
}

// hostName returns host (a Host header or URL host, with or without a port) as the
// guard compares names: without port or IPv6 brackets, lower case, without a final dot.
func hostName(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	return strings.TrimSuffix(strings.ToLower(host), ".")
}

// authority returns host (host[:port]) in lower case without the port that scheme
// implies, so that "http://example.com" is the origin of a request to "example.com:80".
func authority(host, scheme string) string {
	host = strings.ToLower(host)
	if h, port, err := net.SplitHostPort(host); err == nil &&
		(scheme == "http" && port == "80" || scheme == "https" && port == "443") {
		if strings.Contains(h, ":") {
			return "[" + h + "]"
		}
		return h
	}
	return host
}

// wrap returns next behind the guard.
func (g browserGuard) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if openPaths[r.URL.Path] || r.URL.Path == "/v1/auth" {
			next.ServeHTTP(w, r)
			return
		}
		if len(g.hosts) > 0 && !g.hosts[hostName(r.Host)] {
			refuse(w, r, http.StatusMisdirectedRequest, "the Host is not one of --allowed-hosts")
			return
		}
		origin := r.Header.Get("Origin")
		if origin == "" {
			next.ServeHTTP(w, r)
			return
		}
		if !g.sameOrigin(origin, r) {
			refuse(w, r, http.StatusForbidden, "cross-origin requests are refused: the Origin is not the request's host")
			return
		}
		if r.Method == http.MethodPost {
			if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
				refuse(w, r, http.StatusUnsupportedMediaType, "a request from a web page must be Content-Type: application/json")
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// sameOrigin reports whether origin, an Origin header, names r's own host, or one of the
// allowed hosts (the name a proxy in front serves the enforcer under, its Host rewritten).
// "null" (a sandboxed page, a file) names none.
func (g browserGuard) sameOrigin(origin string, r *http.Request) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return false
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	if authority(u.Host, u.Scheme) == authority(r.Host, scheme) {
		return true
	}
	return g.hosts[hostName(u.Host)]
}

// refuse answers status with detail, as the endpoint answers its other errors: /json in
// text, as envoyproxy/ratelimit does, the others with a problem.
func refuse(w http.ResponseWriter, r *http.Request, status int, detail string) {
	if r.URL.Path == "/json" {
		http.Error(w, detail, status)
		return
	}
	body := `{"type":"about:blank","title":` + strconv.Quote(http.StatusText(status)) + `,"status":` +
		strconv.Itoa(status) + `,"detail":` + strconv.Quote(detail) + `}`
	w.Header().Set("Content-Type", headers.ProblemContentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body)
}
