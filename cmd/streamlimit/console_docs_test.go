package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/serve/server"
	"github.com/streamlimit/streamlimit/serve/server/console"
)

// docSection returns the part of a Markdown file from the heading title to the next heading
// of its level.
func docSection(t *testing.T, file, title string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "\n"+title+"\n")
	if i < 0 {
		t.Fatalf("%s has no %q", file, title)
	}
	s = s[i+len(title)+2:]
	level := title[:strings.IndexByte(title, ' ')+1]
	if j := strings.Index(s, "\n"+level); j >= 0 {
		s = s[:j]
	}
	return s
}

// TestDocsConsole holds the README's sentence and docs/operations.md's Console section to
// what the console does: its address, the figures they give (each the constant it
// documents; those of the record of denials are held by package enforcer's
// TestDocsDenials), and their commands, run against `streamlimit enforcer` with
// --auth-token-file: the page with a token as a basic-authentication password, a 401
// asking for one without, and the curl command for the State.
func TestDocsConsole(t *testing.T) {
	readme := docSection(t, "../../README.md", "## Develop against it")
	ops := strings.Join(strings.Fields(docSection(t, "../../docs/operations.md", "## Console")), " ")
	const docAddr = "127.0.0.1:8081"
	url := "http://" + docAddr + server.ConsolePath + "/"
	if server.DefaultHTTPAddr != docAddr || !strings.Contains(readme, url) || !strings.Contains(ops, url) {
		t.Errorf("README and docs/operations.md give the console as %s; the enforcer serves it at http://%s%s/", url, server.DefaultHTTPAddr, server.ConsolePath)
	}
	for _, fact := range []string{
		fmt.Sprintf("the %d keys of the counts topic", console.DefaultTopKeys),
		fmt.Sprintf("at most %s a second", map[time.Duration]string{500 * time.Millisecond: "twice", time.Second: "once"}[console.DefaultRefresh]),
		fmt.Sprintf("within %d%% of one core", int(console.TopCPUShare*100)),
	} {
		if !strings.Contains(ops, fact) {
			t.Errorf("docs/operations.md does not say %q", fact)
		}
	}

	testenv.Tool(t, "curl", "apt-get install curl")
	var cmdLine string
	for line := range strings.Lines(docSection(t, "../../docs/operations.md", "## Console")) {
		if strings.HasPrefix(line, "curl ") && strings.Contains(line, console.StatePath) {
			cmdLine = strings.TrimSpace(line)
		}
	}
	if cmdLine == "" {
		t.Fatal("docs/operations.md has no curl command for the State")
	}

	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	tokens := filepath.Join(dir, "tokens")
	const token = "t0ken-for-the-console"
	if err := os.WriteFile(rules, []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1, soft_percent: 100}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokens, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := serve(t, "enforcer", "--no-kafka", "--site", "eu", "--rules", rules, "--http-listen", anyPort, "--grpc-listen", "off",
		"--auth-token-file", tokens, "--log-level", "warn").addr(t, "http")
	page := strings.Replace(url, docAddr, addr, 1)
	get := func(user, pass string) (*http.Response, string) {
		req, _ := http.NewRequest("GET", page, nil)
		if pass != "" {
			req.SetBasicAuth(user, pass)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	testenv.Eventually(t, 30*time.Second, "the enforcer serving the console", func() bool {
		resp, _ := get("", "")
		return resp != nil
	})
	if resp, _ := get("", ""); resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic ") {
		t.Errorf("the console without the token: %s, WWW-Authenticate %q; want 401 asking for a password", resp.Status, resp.Header.Get("WWW-Authenticate"))
	}
	if resp, body := get("any user name", token); resp.StatusCode != http.StatusOK || !strings.Contains(body, "<title>streamlimit console</title>") {
		t.Errorf("the console with the token as the password: %s\n%s", resp.Status, body)
	}

	// As a shell runs it, with $TOKEN set.
	cmd := exec.Command("sh", "-c", strings.Replace(cmdLine, docAddr, addr, 1))
	cmd.Env = append(os.Environ(), "TOKEN="+token)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v", cmdLine, err)
	}
	var st console.State
	if err := json.Unmarshal(out, &st); err != nil || st.Site != "eu" || len(st.Rules) != 1 || st.Rules[0].Limits[0].SoftBand == nil {
		t.Fatalf("%s printed %s (%v); want the State of site eu with its rule and soft band", cmdLine, out, err)
	}
}
