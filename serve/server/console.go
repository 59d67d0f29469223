package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/streamlimit/streamlimit/serve/server/console"
)

// ConsolePath is where the Handler serves the live console (package console): the page at
// ConsolePath + "/", its State at ConsolePath + console.StatePath.
const ConsolePath = "/ui"

// withConsole returns next with the console mounted at ConsolePath. The console asks for
// the token of the API when Config.AuthTokens are set, as /metrics does, but takes it
// either as a bearer token or as the password of HTTP basic authentication (any user
// name): a browser asks for the latter itself when the page answers 401, and sends it
// again with the page's own requests.
func (s *Server) withConsole(next http.Handler) http.Handler {
	c, err := console.New(console.Options{Limiter: s.lim, Gatherer: s.cfg.Registry})
	if err != nil {
		s.log.Error("console not served", "err", err)
		return next
	}
	ui := http.StripPrefix(ConsolePath, c.Handler())
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		if p != ConsolePath && !strings.HasPrefix(p, ConsolePath+"/") {
			next.ServeHTTP(w, r)
			return
		}
		if !s.tokens.consoleOK(r) {
			h := w.Header()
			h.Set("WWW-Authenticate", `Basic realm="streamlimit console", charset="UTF-8"`)
			h.Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte("the console needs the token of --auth-token-file: give it as the password, any user name\n"))
			return
		}
		if p == ConsolePath {
			// Relative, so that it holds behind a proxy that serves the enforcer under a
			// path of its own.
			w.Header().Set("Location", "ui/")
			w.WriteHeader(http.StatusMovedPermanently)
			return
		}
		ui.ServeHTTP(w, r)
	})
}

// consoleOK reports whether r may see the console: no tokens are set, or r carries one as
// a bearer token or as its basic authentication password.
func (t tokens) consoleOK(r *http.Request) bool {
	if len(t) == 0 || t.ok(r.Header.Get("Authorization")) {
		return true
	}
	_, pass, ok := r.BasicAuth()
	if !ok {
		return false
	}
	h := sha256.Sum256([]byte(strings.TrimSpace(pass)))
	match := 0
	for i := range t {
		match |= subtle.ConstantTimeCompare(h[:], t[i][:])
	}
	return match == 1
}
