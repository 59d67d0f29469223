package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/internal/testenv"
)

// TestEnforcerCommand runs `streamlimit enforcer` against the real broker, asks the
// check API until the limit is reached, and stops it with its context.
//
// With STREAMLIMIT_REDIS_ADDR set (as `make test` sets it) the command counts the site in
// that Redis, under the same key prefix in every run, so the user is new in each run: a
// second run within the minute (go test -count 2, or again on long-lived services) would
// otherwise find the user already at its limit.
func TestEnforcerCommand(t *testing.T) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rules, []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	settings := filepath.Join(dir, "enforcer.yaml")
	if err := os.WriteFile(settings, []byte("site: eu\ngrpc-listen: \"off\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := serve(t, "enforcer", "--config", settings, "--rules", rules, "--brokers", testenv.Kafka(t),
		"--hits-topic", testenv.CreateTopic(t, "hits", 1, nil), "--counts-topic", testenv.CreateTopic(t, "counts", 1, nil),
		"--http-listen", anyPort, "--log-level", "warn").addr(t, "http")
	body := fmt.Sprintf(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"%s"}]}]}`, testenv.TopicName(t, "user"))
	var codes []string
	deadline := time.Now().Add(60 * time.Second)
	for len(codes) < 3 {
		resp, err := http.Post("http://"+addr+"/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			if time.Now().After(deadline) {
				t.Fatalf("enforcer never answered: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		var out struct {
			OverallCode string `json:"overall_code"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		codes = append(codes, out.OverallCode)
	}
	if got := strings.Join(codes, ","); got != "OK,OK,OVER_LIMIT" {
		t.Fatalf("decisions %s", got)
	}
}

func TestEnforcerFlagErrors(t *testing.T) {
	_, err := run(t, "enforcer", "--no-kafka", "--upstream", "not a url")
	if err == nil {
		t.Fatal("no error")
	}
	_, err = run(t, "enforcer", "--no-kafka", "--limit-overrides", "honor")
	if err == nil || !strings.Contains(err.Error(), `--limit-overrides: limit overrides "honor": want honour or ignore`) {
		t.Errorf("--limit-overrides honor: error %v", err)
	}
	_, err = run(t, "enforcer", "--no-kafka", "--upstream", "not a url")
	for _, want := range []string{"--site is required", "--rules is required", `--upstream "not a url"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

func TestEnforcerTrustedProxiesFlag(t *testing.T) {
	dir := t.TempDir()
	httpCfg := filepath.Join(dir, "http.yaml")
	if err := os.WriteFile(httpCfg, []byte("domain: api\ndescriptors:\n  - entries: [{type: remote_address}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--http-config", httpCfg, "--trusted-proxies", "10.0.0.0/8"}, "--trusted-proxies applies only without --http-config"},
		{[]string{"--trusted-proxies", "10.0.0.0/33"}, "trusted_proxies[0]"},
	} {
		_, err := run(t, append([]string{"enforcer", "--no-kafka", "--site", "s", "--rules", httpCfg}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want %q", c.args, err, c.want)
		}
	}
}

// TestEnforcerAuthTrustsLoopbackByDefault runs the enforcer as the README's nginx setup
// does (no --http-config): X-Real-IP from a loopback peer names the client.
func TestEnforcerAuthTrustsLoopbackByDefault(t *testing.T) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rules, []byte("domain: http\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 1, scope: local}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := serve(t, "enforcer", "--no-kafka", "--site", "s", "--rules", rules, "--http-listen", anyPort, "--grpc-listen", "off", "--log-level", "warn").addr(t, "http")
	auth := func(ip string) int {
		deadline := time.Now().Add(20 * time.Second)
		for {
			req, _ := http.NewRequest("GET", "http://"+addr+"/v1/auth", nil)
			req.Header.Set("X-Real-IP", ip)
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
				return resp.StatusCode
			}
			if time.Now().After(deadline) {
				t.Fatalf("enforcer never answered: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	got := []int{auth("198.51.100.1"), auth("198.51.100.1"), auth("198.51.100.2")}
	if got[0] != 204 || got[1] != 429 || got[2] != 204 {
		t.Fatalf("codes %v, want [204 429 204]", got)
	}
}

// Kafka and Redis TLS settings that would be ignored are errors; SASL PLAIN in clear warns.
func TestIncompleteTLSFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--kafka-tls-key", "k.pem"}, "--kafka-tls-cert and --kafka-tls-key go together"},
		{[]string{"--kafka-tls", "--kafka-tls-cert", "c.pem"}, "--kafka-tls-cert and --kafka-tls-key go together"},
		{[]string{"--kafka-tls-insecure-skip-verify"}, "--kafka-tls-insecure-skip-verify without TLS"},
		{[]string{"--redis-tls-insecure-skip-verify"}, "--redis-tls-insecure-skip-verify without TLS"},
		{[]string{"--kafka-sasl-user", "u"}, "without a SASL mechanism"},
	} {
		_, err := run(t, append([]string{"topics", "ensure", "--brokers", "127.0.0.1:1"}, c.args...)...)
		if c.args[0] == "--redis-tls-insecure-skip-verify" {
			_, err = run(t, append([]string{"enforcer", "--site", "s", "--rules", "r.yaml"}, c.args...)...)
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want %q", c.args, err, c.want)
		}
	}
	var stderr strings.Builder
	cmd := newRootCmd()
	cmd.SetOut(&strings.Builder{})
	cmd.SetErr(&stderr)
	cmd.SetArgs([]string{"enforcer", "--kafka-sasl-mechanism", "PLAIN", "--kafka-sasl-user", "u", "--kafka-sasl-password", "p",
		"--http-listen", "127.0.0.1:bad-port"})
	_ = cmd.ExecuteContext(context.Background()) // fails for --site and --rules: only the warning matters
	if !strings.Contains(stderr.String(), "SASL PLAIN without TLS") {
		t.Fatalf("no warning for SASL PLAIN in clear; stderr: %s", stderr.String())
	}
}

// --auth-token-file: the check API asks for a bearer token, /healthz does not; a file
// without a token is refused.
func TestEnforcerAuthTokenFile(t *testing.T) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	tokens := filepath.Join(dir, "tokens")
	empty := filepath.Join(dir, "empty")
	for f, b := range map[string]string{
		rules:  "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5, scope: local}\n",
		tokens: "# callers\nt0ken\n",
		empty:  "# none yet\n\n",
	} {
		if err := os.WriteFile(f, []byte(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := run(t, "enforcer", "--no-kafka", "--site", "s", "--rules", rules, "--auth-token-file", empty); err == nil || !strings.Contains(err.Error(), "no token") {
		t.Fatalf("empty token file: %v", err)
	}
	addr := serve(t, "enforcer", "--no-kafka", "--site", "s", "--rules", rules, "--http-listen", anyPort, "--grpc-listen", "off",
		"--auth-token-file", tokens, "--log-level", "warn").addr(t, "http")
	status := func(method, path, token string) int {
		deadline := time.Now().Add(20 * time.Second)
		for {
			req, _ := http.NewRequest(method, "http://"+addr+path, strings.NewReader(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"1"}]}]}`))
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
				return resp.StatusCode
			}
			if time.Now().After(deadline) {
				t.Fatalf("enforcer never answered: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if got := []int{status("GET", "/healthz", ""), status("POST", "/v1/check", ""), status("POST", "/v1/check", "t0ken")}; got[0] != 200 || got[1] != 401 || got[2] != 200 {
		t.Fatalf("healthz, check without and with token: %v, want [200 401 200]", got)
	}
}
