//go:build !race

// Allocation counts mean nothing under -race (its instrumentation allocates); make test runs
// the allocation tests in a race-free pass first.

package window

import (
	"testing"
	"time"
)

// TestCounterGrowthAllocs holds a Counter's growth to the allocations it takes: a new
// site's first hit allocates its header and its buckets' room together (two allocations,
// not three), and the growth of its pairs happens in the spare room of the buckets' size
// class where there is some. A key hit ten times in ten buckets from three sites in turn
// (the aggregator's BenchmarkEndToEnd) takes 3 × 2 allocations for its sites and 4 more
// for its pairs; it took 15 when every change of size allocated.
func TestCounterGrowthAllocs(t *testing.T) {
	s := NewSpec(time.Minute, 60, 2*time.Second)
	now := int64(1_763_740_000_000)
	sites := []string{"eu-1", "us-1", "ap-1"}
	first := testing.AllocsPerRun(100, func() {
		var c Counter
		c.Add(&s, now, "eu-1", now, 1)
	})
	if first != 2 {
		t.Errorf("a counter's first hit: %v allocations, want 2 (the site's header, its buckets)", first)
	}
	key := testing.AllocsPerRun(100, func() {
		var c Counter
		for j := range 10 {
			at := now - 27_000 + int64(j)*3000
			c.Add(&s, now, sites[j%3], at, 1)
		}
	})
	if key > 10 {
		t.Errorf("a key hit 10 times from 3 sites: %v allocations, want at most 10", key)
	}
}
