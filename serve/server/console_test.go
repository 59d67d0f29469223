package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/streamlimit/streamlimit"
	"github.com/streamlimit/streamlimit/serve/server"
	"github.com/streamlimit/streamlimit/serve/server/console"
)

// startConsoleServer runs a server without Kafka and with the given tokens, and returns
// its base URL.
func startConsoleServer(t *testing.T, tokens ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(p, []byte(openAPIRules), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := runServer(t, server.Config{Config: streamlimit.Config{Site: "eu", Rules: p}, HTTPAddr: "127.0.0.1:0", GRPCAddr: "off", AuthTokens: tokens})
	return "http://" + srv.HTTPAddr()
}

// consoleGet asks the server for path with the given Authorization (none when empty),
// without following redirects.
func consoleGet(t *testing.T, base, path string, auth func(*http.Request)) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest("GET", base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if auth != nil {
		auth(req)
	}
	cl := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// The console is served at /ui/ with its State; /ui redirects there; without tokens it
// asks for none.
func TestConsoleServed(t *testing.T) {
	base := startConsoleServer(t)
	resp, _ := consoleGet(t, base, server.ConsolePath, nil)
	if resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "ui/" {
		t.Errorf("GET /ui: %s, Location %q; want a redirect to ui/", resp.Status, resp.Header.Get("Location"))
	}
	resp, page := consoleGet(t, base, server.ConsolePath+"/", nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "streamlimit console") {
		t.Fatalf("GET /ui/: %s\n%s", resp.Status, page)
	}
	resp, body := consoleGet(t, base, server.ConsolePath+console.StatePath, nil)
	var st console.State
	if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(body), &st) != nil || st.Site != "eu" || len(st.Rules) == 0 || st.Decisions == nil {
		t.Fatalf("GET state: %s\n%s", resp.Status, body)
	}
}

// With tokens, the console asks for one as /metrics does, and takes it as a bearer token
// or as the password of basic authentication, which browsers ask for themselves.
func TestConsoleBehindTheToken(t *testing.T) {
	base := startConsoleServer(t, "s3cret", "other")
	bearer := func(tok string) func(*http.Request) {
		return func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+tok) }
	}
	basic := func(user, pass string) func(*http.Request) {
		return func(r *http.Request) { r.SetBasicAuth(user, pass) }
	}
	for _, path := range []string{server.ConsolePath, server.ConsolePath + "/", server.ConsolePath + "/console.js", server.ConsolePath + console.StatePath} {
		for name, auth := range map[string]func(*http.Request){"no token": nil, "a wrong bearer token": bearer("nope"),
			"a wrong password": basic("admin", "nope"), "the token as the user name": basic("s3cret", "")} {
			resp, body := consoleGet(t, base, path, auth)
			if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic ") || strings.Contains(body, "streamlimit console<") {
				t.Errorf("GET %s with %s: %s, WWW-Authenticate %q; want 401 asking for basic authentication", path, name, resp.Status, resp.Header.Get("WWW-Authenticate"))
			}
		}
	}
	for name, auth := range map[string]func(*http.Request){"a bearer token": bearer("s3cret"), "the other token as a password": basic("", "other"),
		"the token as a password": basic("anyone", "s3cret")} {
		if resp, body := consoleGet(t, base, server.ConsolePath+console.StatePath, auth); resp.StatusCode != http.StatusOK {
			t.Errorf("GET state with %s: %s\n%s", name, resp.Status, body)
		}
	}
	// The rest of the API still takes bearer tokens only.
	if resp, _ := consoleGet(t, base, "/metrics", basic("", "s3cret")); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /metrics with basic authentication: %s, want 401", resp.Status)
	}
	if resp, _ := consoleGet(t, base, "/metrics", bearer("s3cret")); resp.StatusCode != http.StatusOK {
		t.Errorf("GET /metrics with the bearer token: %s", resp.Status)
	}
}
