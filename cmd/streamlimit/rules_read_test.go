//go:build unix

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/streamlimit/streamlimit/internal/safefile/safefiletest"
)

// runBounded is runSplit that fails the test, instead of hanging it, when the command
// has not returned in 10 s (before, a rules path that was a FIFO blocked for ever).
func runBounded(t *testing.T, args ...string) (string, error) {
	t.Helper()
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, _, err := runSplit(t, args...)
		done <- result{out, err}
	}()
	select {
	case r := <-done:
		return r.out, r.err
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: still running after 10s", strings.Join(args, " "))
		return "", nil
	}
}

// `rules check` and the enforcer refuse, at once and with a clear error, a rules path
// that is a FIFO or a device, and a file over --rules-max-bytes; the bound is the flag's.
func TestRulesPathRefused(t *testing.T) {
	dir := t.TempDir()
	fifo, big := safefiletest.Hostile(t, dir, ".yaml")
	good := filepath.Join(dir, "good.yaml")
	rules := "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"
	if err := os.WriteFile(good, []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	enforcer := []string{"enforcer", "--site", "eu", "--no-kafka", "--http-listen", "127.0.0.1:0", "--grpc-listen", "off"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"rules", "check", fifo}, fifo + ": not a regular file (named pipe)"},
		{[]string{"rules", "check", "/dev/zero"}, "/dev/zero: not a regular file (character device)"},
		{[]string{"rules", "check", big}, big + ": 286.1MiB exceeds the limit of 16MiB (--rules-max-bytes)"},
		{[]string{"rules", "check", "--rules-max-bytes", "64B", good}, good + ": 92 bytes exceeds the limit of 64 bytes (--rules-max-bytes)"},
		{append(enforcer, "--rules", fifo), fifo + ": not a regular file (named pipe)"},
		{append(enforcer, "--rules", big), big + ": 286.1MiB exceeds the limit of 16MiB (--rules-max-bytes)"},
		{append(enforcer, "--rules", good, "--rules-max-bytes", "64B"), good + ": 92 bytes exceeds the limit of 64 bytes (--rules-max-bytes)"},
		// The token file is read the same way.
		{append(enforcer, "--rules", good, "--auth-token-file", fifo), "--auth-token-file " + fifo + ": not a regular file (named pipe)"},
	} {
		out, err := runBounded(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v (output %q), want %q", strings.Join(c.args, " "), err, out, c.want)
		}
	}
	if _, err := runBounded(t, "rules", "check", "--rules-max-bytes", "92B", good); err != nil {
		t.Errorf("rules check of a file of exactly --rules-max-bytes: %v", err)
	}
}
