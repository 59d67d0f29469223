package server_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit"
	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/serve/httplimit"
	"github.com/streamlimit/streamlimit/serve/server"
)

// schemathesisBin finds schemathesis: in the virtual environment that
// examples/install-test-tools.sh makes ($STREAMLIMIT_TOOLS_VENV, default
// ~/.cache/streamlimit/venv), else on the PATH.
func schemathesisBin(t *testing.T) string {
	t.Helper()
	venv := os.Getenv("STREAMLIMIT_TOOLS_VENV")
	if home, err := os.UserHomeDir(); venv == "" && err == nil {
		venv = filepath.Join(home, ".cache", "streamlimit", "venv")
	}
	if p := filepath.Join(venv, "bin", "schemathesis"); venv != "" && fileExists(p) {
		return p
	}
	return testenv.Tool(t, "schemathesis", "bash examples/install-test-tools.sh (a virtual environment with schemathesis from PyPI)")
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// schemathesisRules give the server limits that a fuzzer does not exhaust within a
// second, so that a request asking to wait for room (max_delay_ms) waits at most that
// long, and a cost larger than a limit is refused at once.
const schemathesisRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000000, scope: local}
  - key: open
    rate_limit: {unlimited: true}
`

// schemathesisConfig turns on every check schemathesis has, and two off for /json:
// protobuf's JSON reader, which /json answers with as envoyproxy/ratelimit does, takes a
// null as the field's default value, so a null where the document wants a value is
// accepted there (negative_data_rejection); and a descriptor's own limit must make a
// window that fits a duration (its unit times unit_multiplier), which the document cannot
// state (positive_data_acceptance).
const schemathesisConfig = `
[checks]
not_a_server_error.enabled = true
status_code_conformance.enabled = true
content_type_conformance.enabled = true
response_headers_conformance.enabled = true
response_schema_conformance.enabled = true
negative_data_rejection.enabled = true
positive_data_acceptance.enabled = true
missing_required_header.enabled = true
unsupported_method.enabled = true
allow_header_conformance.enabled = true
use_after_free.enabled = true
ensure_resource_availability.enabled = true
ignored_auth.enabled = true
object_level_authorization.enabled = true

[[operations]]
include-path = "/json"
checks.negative_data_rejection.enabled = false
checks.positive_data_acceptance.enabled = false
`

// TestSchemathesis runs schemathesis, with every check it has, against a real server
// and the OpenAPI document it serves: its examples, the coverage phase (the boundaries
// and negative values of every parameter and property, and methods the document does not
// list) and a bounded fuzzing phase, with a fixed seed. A finding fails the test with
// schemathesis's report, which gives a curl command that reproduces it.
func TestSchemathesis(t *testing.T) {
	testenv.RealParts(t)
	st := schemathesisBin(t)
	dir := t.TempDir()
	rulesPath, configPath := filepath.Join(dir, "rules.yaml"), filepath.Join(dir, "schemathesis.toml")
	for p, b := range map[string]string{rulesPath: schemathesisRules, configPath: schemathesisConfig} {
		if err := os.WriteFile(p, []byte(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	srv := runServer(t, server.Config{
		Config:   streamlimit.Config{Site: "eu", Rules: rulesPath},
		HTTPAddr: "127.0.0.1:0",
		GRPCAddr: "127.0.0.1:0",
		HTTP: httplimit.Config{Domain: "api", TrustedProxies: []string{"127.0.0.0/8"},
			Descriptors: []httplimit.Descriptor{{Entries: []httplimit.Source{{Type: "remote_address", Key: "user"}}}}},
	})
	base := "http://" + srv.HTTPAddr()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, st, "--config-file", configPath, "--no-color", "run", base+server.OpenAPIPath, "--url", base,
		"--phases", "examples,coverage,fuzzing", "--max-examples", "40", "--seed", "1",
		"--workers", "1", "--request-timeout", "5", "--suppress-health-check", "all")
	// schemathesis keeps its cache in the working directory and under HOME.
	cmd.Dir, cmd.Env = dir, append(os.Environ(), "HOME="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("schemathesis: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
