package main

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/internal/testenv"
)

// readmeHTTP and readmeKafka are the addresses the README's commands use: dev's defaults.
const (
	readmeHTTP  = "127.0.0.1:8081"
	readmeKafka = "localhost:9092"
)

// shBlock returns the first sh block of sec, its lines without comments.
func shBlock(t *testing.T, sec string) []string {
	t.Helper()
	_, blk, ok := strings.Cut(sec, "```sh\n")
	if !ok {
		t.Fatal("no sh block")
	}
	blk, _, _ = strings.Cut(blk, "```")
	var lines []string
	for l := range strings.Lines(blk) {
		l, _, _ = strings.Cut(l, "  #")
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// TestREADMEDevCommands runs the README's "Develop against it" commands against
// `streamlimit dev` (its addresses substituted): the check API admits alice, /v1/auth
// answers 204 with the rate-limit fields, and `counts get` finds alice's count, published
// by the enforcer and counted by the aggregator.
func TestREADMEDevCommands(t *testing.T) {
	curl := testenv.Tool(t, "curl", "apt-get install curl")
	sec := docSection(t, "../../README.md", "## Develop against it")
	lines := shBlock(t, sec)
	if len(lines) != 4 || lines[0] != "streamlimit dev" {
		t.Fatalf("README's dev commands %q: want dev, two curl and counts get", lines)
	}
	broker, console := startDev(t, "--port", "0", "--http-listen", "127.0.0.1:0", "--grpc-listen", "off", "--log-level", "error")
	u, err := url.Parse(console)
	if err != nil {
		t.Fatal(err)
	}
	var check []string
	for _, line := range lines[1:] {
		line = strings.ReplaceAll(strings.ReplaceAll(line, readmeHTTP, u.Host), readmeKafka, broker)
		args := shellWords(t, line)
		switch {
		case args[0] == "curl" && strings.Contains(line, "/v1/check"):
			check = args[1:]
			out, err := exec.Command(curl, check...).Output()
			if err != nil || !strings.Contains(string(out), `"overall_code":"OK"`) {
				t.Errorf("%s: %v\n%s", line, err, out)
			}
		case args[0] == "curl" && strings.Contains(line, "/v1/auth"):
			out, err := exec.Command(curl, args[1:]...).Output()
			if err != nil || !strings.Contains(string(out), " 204 ") || !strings.Contains(strings.ToLower(string(out)), "ratelimit-policy:") {
				t.Errorf("%s: %v\n%s", line, err, out)
			}
		case args[0] == "streamlimit" && args[1] == "counts":
			var out string
			testenv.Eventually(t, 60*time.Second, "alice's count in `counts get`", func() bool {
				// Asked again, so that alice's count (of a 5 s window) stays above zero.
				if check != nil {
					if err := exec.Command(curl, check...).Run(); err != nil {
						t.Errorf("check: %v", err)
					}
				}
				out, err = run(t, args[1:]...)
				return err == nil && regexp.MustCompile(`(?m)^dev +[0-9.]+ `).MatchString(out)
			})
			t.Logf("%s:\n%s", line, out)
		default:
			t.Errorf("README dev command %q: not one this test runs", line)
		}
	}
}

// nginxAuth is what an nginx block of the docs asks /v1/auth: the subrequest's URL, the
// header fields it sets, and the variables it copies from the answer.
type nginxAuth struct {
	url     string
	headers map[string]string
	copied  map[string]string // nginx variable → response field
	denied  string            // the status error_page turns into a 429
}

var (
	nginxPass   = regexp.MustCompile(`proxy_pass (http://127\.0\.0\.1:8081/v1/auth\S*);`)
	nginxHeader = regexp.MustCompile(`proxy_set_header (X-[A-Za-z-]+) +\$(\w+);`)
	nginxCopy   = regexp.MustCompile(`auth_request_set (\$\w+) +\$upstream_http_(\w+);`)
	nginxError  = regexp.MustCompile(`error_page (\d+) = @ratelimited;`)
)

// parseNginx reads the nginx block of sec.
func parseNginx(t *testing.T, sec string) nginxAuth {
	t.Helper()
	_, blk, ok := strings.Cut(sec, "```nginx\n")
	if !ok {
		t.Fatal("no nginx block")
	}
	blk, _, _ = strings.Cut(blk, "```")
	var a nginxAuth
	m := nginxPass.FindStringSubmatch(blk)
	e := nginxError.FindStringSubmatch(blk)
	if m == nil || e == nil {
		t.Fatalf("the nginx block has no proxy_pass to /v1/auth or no error_page … = @ratelimited:\n%s", blk)
	}
	a.url, a.denied = m[1], e[1]
	// The values nginx would give the variables for a GET of /articles from 10.1.2.3.
	vars := map[string]string{"request_uri": "/articles", "request_method": "GET", "remote_addr": "10.1.2.3"}
	a.headers = map[string]string{}
	for _, h := range nginxHeader.FindAllStringSubmatch(blk, -1) {
		v, ok := vars[h[2]]
		if !ok {
			t.Fatalf("the nginx block sets %s from $%s, which this test does not know", h[1], h[2])
		}
		a.headers[h[1]] = v
	}
	a.copied = map[string]string{}
	for _, c := range nginxCopy.FindAllStringSubmatch(blk, -1) {
		a.copied[c[1]] = strings.ReplaceAll(c[2], "_", "-")
	}
	if len(a.copied) == 0 {
		t.Fatal("the nginx block copies no field of the answer")
	}
	return a
}

// TestREADMEAskIt runs the README's check API request, and what the nginx blocks of the
// README and of docs/api.md send to /v1/auth, against `streamlimit enforcer` with the
// README's rules (user: two a minute) and a limit on the client address: the check API
// admits user 42 twice and then answers 429; /v1/auth admits the client (X-Real-IP from
// nginx on loopback) twice and then answers the status that error_page turns into a 429,
// with every field that auth_request_set copies.
func TestREADMEAskIt(t *testing.T) {
	curl := testenv.Tool(t, "curl", "apt-get install curl")
	readme := docSection(t, "../../README.md", "## Ask it")
	_, rulesYAML, _ := strings.Cut(readme, "```yaml\n")
	rulesYAML, _, _ = strings.Cut(rulesYAML, "```")
	dir := t.TempDir()
	for name, y := range map[string]string{
		"api.yaml":  rulesYAML,
		"http.yaml": "domain: http\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 2}\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A key prefix of its own: with the suite's Redis (STREAMLIMIT_REDIS_ADDR) the
	// README's user 42 is counted by other tests too.
	prefix := fmt.Sprintf("readme-ask-%d:", time.Now().UnixNano())
	addr := serve(t, "enforcer", "--no-kafka", "--default-share", "1", "--site", "eu", "--rules", dir, "--http-listen", anyPort,
		"--grpc-listen", "off", "--log-level", "warn", "--redis-key-prefix", prefix).addr(t, "http")
	testenv.Eventually(t, 30*time.Second, "the enforcer ready", func() bool {
		r, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == http.StatusOK
	})

	var check string
	for _, l := range shBlock(t, docSection(t, "../../README.md", "### The HTTP check API")) {
		if strings.HasPrefix(l, "curl ") {
			check = l
		}
	}
	if check == "" || !strings.Contains(check, readmeHTTP) {
		t.Fatalf("README's check API section has no curl to %s", readmeHTTP)
	}
	args := append([]string{"-w", "\n%{http_code}"}, shellWords(t, strings.ReplaceAll(check, readmeHTTP, addr))[1:]...)
	for i, want := range []string{`200`, `200`, `429`} {
		out, err := exec.Command(curl, args...).Output()
		body, code, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
		if err != nil || code != want || !strings.Contains(body, `"limit_remaining"`) {
			t.Fatalf("README's check API request %d: %v, status %s, want %s\n%s", i+1, err, code, want, body)
		}
	}

	for _, doc := range []struct{ file, title string }{
		{"../../README.md", "### nginx (`auth_request`)"},
		{"../../docs/api.md", "## nginx in front, streamlimit deciding (`auth_request`)"},
	} {
		a := parseNginx(t, docSection(t, doc.file, doc.title))
		a.headers["X-Real-IP"] = "10.9.9." + map[string]string{"../../README.md": "1", "../../docs/api.md": "2"}[doc.file]
		for i, want := range []string{"204", "204", a.denied} {
			req, _ := http.NewRequest(http.MethodGet, strings.Replace(a.url, readmeHTTP, addr, 1), nil)
			for k, v := range a.headers {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if got := resp.Status[:3]; got != want {
				t.Fatalf("%s: /v1/auth request %d: status %s, want %s", doc.file, i+1, got, want)
			}
			if got := resp.Status[:3]; got != a.denied {
				continue
			}
			for v, field := range a.copied {
				if resp.Header.Get(field) == "" {
					t.Errorf("%s: %s copies %s, which the denial lacks: %v", doc.file, v, field, resp.Header)
				}
			}
		}
	}
}
