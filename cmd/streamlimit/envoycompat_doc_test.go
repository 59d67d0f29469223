package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/internal/testenv"
)

func readEnvoyCompatDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../docs/envoy-compat.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var (
	docFlag    = regexp.MustCompile("`(--[a-z0-9-]+)")
	docEnvName = regexp.MustCompile("`([A-Z][A-Z0-9_]+)`")
)

// TestEnvoyCompatDocSettings keeps docs/envoy-compat.md true to the enforcer: every flag
// it names is one of the enforcer's, and each row of its table of envoyproxy/ratelimit's
// environment variables names variables that set the flags of the row, in order.
func TestEnvoyCompatDocSettings(t *testing.T) {
	doc := readEnvoyCompatDoc(t)
	fs := newEnforcerCmd().Flags()
	for _, m := range docFlag.FindAllStringSubmatch(doc, -1) {
		if fs.Lookup(strings.TrimPrefix(m[1], "--")) == nil {
			t.Errorf("docs/envoy-compat.md names %s, which the enforcer does not have", m[1])
		}
	}
	_, table, _ := strings.Cut(doc, "| envoyproxy/ratelimit | streamlimit enforcer |")
	table, _, _ = strings.Cut(table, "\n\n")
	rows := 0
	for _, line := range strings.Split(table, "\n")[2:] {
		cols := strings.Split(line, "|")
		if len(cols) < 3 {
			continue
		}
		envs, flags := docEnvName.FindAllStringSubmatch(cols[1], -1), docFlag.FindAllStringSubmatch(cols[2], -1)
		if len(envs) != len(flags) || len(envs) == 0 {
			t.Errorf("row %q: %d variables for %d flags", line, len(envs), len(flags))
			continue
		}
		for i := range envs {
			f := fs.Lookup(strings.TrimPrefix(flags[i][1], "--"))
			if f == nil || !strings.Contains(strings.Join(envAliases(f), " "), envs[i][1]) {
				t.Errorf("%s does not read %s", flags[i][1], envs[i][1])
			}
		}
		rows++
	}
	if rows < 10 {
		t.Errorf("read %d rows of the settings table, expected every setting it lists", rows)
	}
	// The aliases belong to the enforcer alone: another command with a --log-level does
	// not read LOG_LEVEL.
	if f := newAggregatorCmd().Flags().Lookup("log-level"); f == nil || len(envAliases(f)) != 0 {
		t.Errorf("the aggregator's --log-level reads %v", envAliases(f))
	}
}

// startEnforcer runs `streamlimit args...` until the test ends, its HTTP API on a port of
// its own, and returns the API's address once it answers.
func startEnforcer(t *testing.T, args []string) string {
	t.Helper()
	addr := serve(t, append(args, "--http-listen", anyPort)...).addr(t, "http")
	testenv.Eventually(t, 30*time.Second, "the enforcer's HTTP API", func() bool {
		r, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			r.Body.Close()
		}
		return err == nil
	})
	return addr
}

// postJSON posts body to the enforcer's /json and returns the status, the header and the
// decoded answer.
func postEnvoyJSON(t *testing.T, httpAddr, body string) (int, http.Header, map[string]any) {
	t.Helper()
	r, err := http.Post("http://"+httpAddr+"/json", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	var out map[string]any
	b, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("/json answered %d %q", r.StatusCode, b)
	}
	return r.StatusCode, r.Header, out
}

// TestEnvoyCompatDocCommands runs the two command lines of docs/envoy-compat.md, with the
// test's rules, Redis and ports substituted: the first answers a file written for
// envoyproxy/ratelimit as it does; the second, configured by its environment variables
// alone, merges a domain of two files and sends its header fields.
func TestEnvoyCompatDocCommands(t *testing.T) {
	doc := readEnvoyCompatDoc(t)
	var cmds []string
	for _, blk := range strings.Split(doc, "```sh\n")[1:] {
		body, _, _ := strings.Cut(blk, "```")
		cmds = append(cmds, strings.TrimSpace(body))
	}
	if len(cmds) != 2 {
		t.Fatalf("docs/envoy-compat.md has %d sh blocks, want the two command lines", len(cmds))
	}
	v := testenv.TopicName(t, "v") // a value of its own: the counts may be in a shared Redis
	const limited = `{"domain":"d","descriptors":[{"entries":[{"key":"%s","value":"%s"}]}]}`

	t.Run("compat", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "d.yaml"), []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		args := shellWords(t, cmds[0])[1:]
		for i := 1; i < len(args); i++ {
			switch args[i-1] {
			case "--rules":
				args[i] = dir
			case "--redis-addr":
				args[i] = testenv.Redis(t)
			}
		}
		httpAddr := startEnforcer(t, append(args, "--no-kafka", "--grpc-listen", anyPort, "--log-level", "warn"))
		body := fmt.Sprintf(limited, "k", v)
		for i, want := range []int{200, 429} {
			code, h, out := postEnvoyJSON(t, httpAddr, body)
			st := out["statuses"].([]any)[0].(map[string]any)
			if code != want || h.Get("Retry-After") != "" || out["responseHeadersToAdd"] != nil || !regexp.MustCompile(`^\d+s$`).MatchString(st["durationUntilReset"].(string)) {
				t.Fatalf("request %d: %d %v %v, want %d, whole seconds and no header fields", i+1, code, h, out, want)
			}
		}
	})

	t.Run("environment", func(t *testing.T) {
		words := shellWords(t, cmds[1])
		i := 0
		for ; strings.Contains(words[i], "="); i++ {
			name, value, _ := strings.Cut(words[i], "=")
			t.Setenv(name, value)
		}
		args := words[i+1:]
		dir := t.TempDir()
		for name, y := range map[string]string{
			"a.yaml": "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 5}\n",
			"b.yaml": "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 7}\n",
		} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(y), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		for j := 1; j < len(args); j++ {
			if args[j-1] == "--rules" {
				args[j] = dir
			}
		}
		httpAddr := startEnforcer(t, append(args, "--no-kafka", "--grpc-listen", anyPort))
		code, _, out := postEnvoyJSON(t, httpAddr, fmt.Sprintf(limited, "b", v))
		hs, _ := json.Marshal(out["responseHeadersToAdd"])
		if code != 200 || string(hs) != `[{"key":"RateLimit-Limit","value":"7"},{"key":"RateLimit-Remaining","value":"6"},{"key":"RateLimit-Reset","value":"`+resetOf(out)+`"}]` {
			t.Fatalf("b from the second file: %d %v, want its limit and the three fields", code, out)
		}
	})
}

// resetOf returns the first status's duration_until_reset in seconds, as the reset field
// states it.
func resetOf(out map[string]any) string {
	d := out["statuses"].([]any)[0].(map[string]any)["durationUntilReset"].(string)
	return strings.TrimSuffix(d, "s")
}

// --log-level takes envoyproxy/ratelimit's LOG_LEVEL names (logrus's) too.
func TestLogLevelNames(t *testing.T) {
	for level, want := range map[string]bool{"WARN": true, "trace": true, "warning": true, "fatal": true, "panic": true, "debug": true, "loud": false} {
		if _, err := newLogger("text", level); (err == nil) != want {
			t.Errorf("log level %q: %v", level, err)
		}
	}
}
