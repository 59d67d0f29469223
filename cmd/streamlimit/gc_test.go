package main

import "testing"

// The enforcer gives the collector about gcHeadroom bytes of growth: a small live heap gets
// GOGC 400, a large one the default 100, and in between the percent that makes the
// headroom.
func TestGCPercentFor(t *testing.T) {
	for _, c := range []struct {
		live uint64
		want int
	}{
		{0, 400}, {10 << 20, 400}, {32 << 20, 400}, {64 << 20, 200}, {128 << 20, 100}, {1 << 30, 100},
	} {
		if got := gcPercentFor(c.live); got != c.want {
			t.Errorf("gcPercentFor(%d MiB) = %d, want %d", c.live>>20, got, c.want)
		}
	}
}
