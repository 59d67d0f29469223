package server_test

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/streamlimit/streamlimit"
	"github.com/streamlimit/streamlimit/serve/server"
)

// TestMaxMemoryBoundsStructures runs an enforcer (no Kafka) with a 1 MiB memory target and
// sends it 3000 new users: this site's global counters keep within their part of the
// budget (a quarter of the target), evicting, and the memory gauges report what each
// structure holds.
func TestMaxMemoryBoundsStructures(t *testing.T) {
	const target = 1 << 20
	srv := startServer(t, server.Config{Config: streamlimit.Config{MaxMemory: target}})
	base := "http://" + srv.HTTPAddr()
	waitFor(t, func() bool { code, _ := get(t, base+"/readyz"); return code == 200 })
	for i := range 3000 {
		if got := check(t, srv.HTTPAddr(), strconv.Itoa(i)); got != "OK" {
			t.Fatalf("user %d: %s", i, got)
		}
	}
	_, body := get(t, base+"/metrics")
	gauge := func(name string) float64 {
		m := regexp.MustCompile("(?m)^" + name + " (\\S+)$").FindStringSubmatch(body)
		if m == nil {
			t.Fatalf("/metrics lacks %s", name)
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		return v
	}
	if b, keys := gauge("streamlimit_enforcer_global_bytes"), gauge("streamlimit_enforcer_global_keys"); b > target/4 || b == 0 || keys >= 3000 {
		t.Errorf("global counters: %v bytes (bound %d), %v keys of 3000", b, target/4, keys)
	}
	if b := gauge("streamlimit_enforcer_key_cache_bytes"); b > target/16 || b == 0 {
		t.Errorf("key cache: %v bytes, bound %d", b, target/16)
	}
	if gauge("streamlimit_enforcer_global_evicted_total") == 0 {
		t.Error("no global counter evicted")
	}
	_ = gauge("streamlimit_enforcer_local_bytes")
}
