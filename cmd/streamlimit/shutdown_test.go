package main

import (
	"context"
	"encoding/json"
	"io"
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
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // on failure too: the enforcer would run on to the end of the package
	// Port 1 (tcpmux) on loopback: a privileged port nothing here listens on.
	addr, done := runUntilStopped(ctx, t, "enforcer", "--site", "eu", "--rules", rules, "--brokers", "127.0.0.1:1",
		"--http-listen", anyPort, "--grpc-listen", "off", "--shutdown-timeout", "100ms", "--log-level", "warn")
	// Admitted hits of a global limit: the producer holds them for Kafka. The enforcer
	// listens once it has printed its address.
	for range 3 {
		resp, err := http.Post("http://"+addr+"/v1/check", "application/json",
			strings.NewReader(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"1"}]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		var out struct {
			OverallCode string `json:"overall_code"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if out.OverallCode != "OK" {
			t.Fatalf("check answered %d %q, want OK", resp.StatusCode, out.OverallCode)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("enforcer stopped with %v, want a clean exit (status 0)", err)
	}
}

// TestEnforcerStopsCleanWithRequestInFlight stops `streamlimit enforcer` while a check
// request waits for room (max_delay_ms) longer than --shutdown-timeout: the drain runs out
// of time, which is logged, and the command must still return nil (exit status 0). The
// stop comes once the enforcer reports the request waiting, so the timeout decides,
// whatever the machine's speed.
func TestEnforcerStopsCleanWithRequestInFlight(t *testing.T) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	// One request a minute: the second waits for room until its max_delay_ms.
	if err := os.WriteFile(rules, []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1, scope: local, algorithm: token_bucket, burst: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, done := runUntilStopped(ctx, t, "enforcer", "--no-kafka", "--site", "eu", "--rules", rules, "--http-listen", anyPort,
		"--grpc-listen", "off", "--shutdown-timeout", "50ms", "--log-level", "warn")
	check := func(body string) (*http.Response, error) {
		return http.Post("http://"+addr+"/v1/check", "application/json", strings.NewReader(body))
	}
	resp, err := check(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"1"}]}]}`)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	deadline := time.Now().Add(20 * time.Second)
	waiting := make(chan struct{})
	go func() {
		defer close(waiting)
		// Cut off by the stop: an error, or whatever answer got out before.
		if resp, err := check(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"1"}]}],"max_delay_ms":60000}`); err == nil {
			resp.Body.Close()
		}
	}()
	for !strings.Contains(metricsText(t, addr), "streamlimit_enforcer_waiting_requests 1") {
		if time.Now().After(deadline) {
			t.Fatal("the second request never waited")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("enforcer stopped with %v, want a clean exit (status 0)", err)
	}
	select { // cut off by the stop, not left waiting for its minute
	case <-waiting:
	case <-time.After(10 * time.Second):
		t.Fatal("the request in flight was still held 10 s after the enforcer stopped")
	}
}

// metricsText returns the enforcer's /metrics page.
func metricsText(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// runUntilStopped runs the streamlimit command args in process until ctx ends, waits until
// it has printed the address of its http listener (given anyPort), and returns that address
// and the channel that receives the command's result: what its exit status would be.
func runUntilStopped(ctx context.Context, t *testing.T, args ...string) (string, <-chan error) {
	t.Helper()
	out, done := runCommand(ctx, args...)
	addr, ok := waitAddrs(t, args[0], out)["http"]
	if !ok {
		t.Fatalf("%s named no http listener", args[0])
	}
	return addr, done
}
