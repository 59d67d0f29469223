package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/internal/testenv"
	"github.com/streamlimit/streamlimit/serve/server"
)

// TestDocsAPIOpenAPI runs docs/api.md's curl command for the OpenAPI document against
// `streamlimit enforcer` (its address substituted) and checks that it prints the document.
func TestDocsAPIOpenAPI(t *testing.T) {
	curl := testenv.Tool(t, "curl", "apt-get install curl")
	b, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	const docAddr = "127.0.0.1:8081"
	var cmd string
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, "curl ") && strings.Contains(line, server.OpenAPIPath) {
			cmd = strings.TrimSpace(line)
		}
	}
	if cmd == "" || !strings.Contains(cmd, docAddr) {
		t.Fatalf("docs/api.md has no curl command for %s at %s", server.OpenAPIPath, docAddr)
	}
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rules, []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := serve(t, "enforcer", "--no-kafka", "--site", "eu", "--rules", rules, "--http-listen", anyPort, "--grpc-listen", "off", "--log-level", "warn").addr(t, "http")
	args := shellWords(t, strings.ReplaceAll(cmd, docAddr, addr))[1:]
	var out []byte
	testenv.Eventually(t, 30*time.Second, "the enforcer serving "+server.OpenAPIPath, func() bool {
		out, err = exec.Command(curl, args...).Output()
		return err == nil && len(out) > 0
	})
	if !bytes.Equal(out, server.OpenAPI) {
		t.Fatalf("curl printed %d bytes, not the %d of the OpenAPI document", len(out), len(server.OpenAPI))
	}
}
