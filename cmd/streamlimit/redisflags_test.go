package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRedisSentinelFlagNeedsAddrs: --redis-sentinel-master without the Sentinels'
// addresses is rejected with the reason.
func TestRedisSentinelFlagNeedsAddrs(t *testing.T) {
	t.Setenv("STREAMLIMIT_REDIS_ADDR", "") // every flag also reads its environment variable
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rules, []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {requests_per_unit: 1, unit: second, scope: site}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := run(t, "enforcer", "--no-kafka", "--site", "eu", "--rules", rules, "--redis-sentinel-master", "site")
	if err == nil || !strings.Contains(err.Error(), "--redis-sentinel-master needs --redis-addr") {
		t.Fatalf("error = %v, want the missing Sentinel addresses named", err)
	}
}
