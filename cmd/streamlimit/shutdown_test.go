package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestEnforcerStopsCleanWithKafkaUnreachable stops `streamlimit enforcer` with hits of a
// global limit that no broker can take (the one named does not listen): the shutdown
// cannot deliver them within --shutdown-timeout, whatever its length, and must still end
// in a nil error (exit status 0), the hits left being logged.
func TestEnforcerStopsCleanWithKafkaUnreachable(t *testing.T) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rules, []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // on failure too: the enforcer would run on to the end of the package
	done := make(chan error, 1)
	go func() {
		cmd := newRootCmd()
		cmd.SetArgs([]string{"enforcer", "--site", "eu", "--rules", rules, "--brokers", freePort(t),
			"--http-listen", addr, "--grpc-listen", "off", "--shutdown-timeout", "100ms", "--log-level", "warn"})
		cmd.SetOut(&strings.Builder{})
		done <- cmd.ExecuteContext(ctx)
	}()
	// Admitted hits of a global limit: the producer holds them for Kafka.
	deadline := time.Now().Add(20 * time.Second)
	for admitted := 0; admitted < 3; {
		resp, err := http.Post("http://"+addr+"/v1/check", "application/json",
			strings.NewReader(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"1"}]}]}`))
		if err != nil {
			if time.Now().After(deadline) {
				t.Fatalf("enforcer never answered: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		var out struct {
			OverallCode string `json:"overall_code"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if out.OverallCode != "OK" {
			t.Fatalf("check answered %d %q, want OK", resp.StatusCode, out.OverallCode)
		}
		admitted++
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("enforcer stopped with %v, want a clean exit (status 0)", err)
	}
}
