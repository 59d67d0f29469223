package main

import (
	"strings"
	"testing"
)

// TestRedisSentinelFlagNeedsAddrs: --redis-sentinel-master without the Sentinels'
// addresses is rejected with the reason.
func TestRedisSentinelFlagNeedsAddrs(t *testing.T) {
	_, err := run(t, "enforcer", "--no-kafka", "--site", "eu", "--rules", "x.yaml", "--redis-sentinel-master", "site")
	if err == nil || !strings.Contains(err.Error(), "--redis-sentinel-master needs --redis-addr") {
		t.Fatalf("error = %v, want the missing Sentinel addresses named", err)
	}
}
